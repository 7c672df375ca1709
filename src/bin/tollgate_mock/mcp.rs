//! An MCP server, as the mock serves it at `…/mcp` (Streamable HTTP, the handshake revisions
//! 2025-03-26 to 2025-11-25): `initialize` (a `Mcp-Session-Id` per session; every later request
//! must carry a live one, else 404), `notifications/*` acknowledged 202, `ping`, `tools/list`
//! and `tools/call` (`echo`, `add`, `count` — which sends one `notifications/progress` per step
//! over SSE when the call carries a progress token —, `fail`, a tool error), `resources/list`
//! and `resources/read` (`mock://readme`), `prompts/list` and `prompts/get` (`greet`),
//! `DELETE` ending a session. `server/discover` (the 2026-07-28 probe) is answered "method not
//! found", so clients fall back to the handshake. Answers are JSON unless progress is streamed.

use crate::wire::*;
use bytes::Bytes;
use pingora_error::Result;
use pingora_http::{RequestHeader, ResponseHeader};
use pingora_proxy::Session;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::sync::Mutex;

const VERSIONS: [&str; 3] = ["2025-03-26", "2025-06-18", "2025-11-25"];

/// Whether `path` is an MCP endpoint of the mock.
pub(crate) fn is_mcp(path: &str) -> bool {
    path == "/mcp" || path.ends_with("/mcp")
}

#[derive(Default)]
pub(crate) struct McpMock {
    sessions: Mutex<HashSet<String>>,
}

fn rpc_error(id: &Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

fn tools() -> Value {
    let object = |props: Value, required: Value| json!({"type": "object", "properties": props, "required": required});
    json!([
        {"name": "echo", "description": "Echo the text back.", "inputSchema": object(json!({"text": {"type": "string"}}), json!(["text"]))},
        {"name": "add", "description": "Add two integers.", "inputSchema": object(json!({"a": {"type": "integer"}, "b": {"type": "integer"}}), json!(["a", "b"]))},
        {"name": "count", "description": "Count to n, reporting progress.", "inputSchema": object(json!({"n": {"type": "integer"}}), json!(["n"]))},
        {"name": "fail", "description": "Always fails.", "inputSchema": object(json!({}), json!([]))},
    ])
}

fn text(t: String) -> Value {
    json!({"content": [{"type": "text", "text": t}], "isError": false})
}

impl McpMock {
    pub(crate) async fn answer(&self, session: &mut Session, req: &RequestHeader, body: &[u8]) -> Result<()> {
        let sid = header(req, "mcp-session-id").map(str::to_string);
        match req.method.as_str() {
            "DELETE" => {
                let known = sid.is_some_and(|s| self.sessions.lock().unwrap().remove(&s));
                return send(session, if known { 200 } else { 404 }, "application/json", Bytes::new(), &[]).await;
            }
            "POST" => {}
            _ => return send(session, 405, "application/json", Bytes::from_static(b"{}"), &[("allow", "POST, DELETE")]).await,
        }
        let Ok(msg) = serde_json::from_slice::<Value>(body) else {
            let e = rpc_error(&Value::Null, -32700, "Parse error");
            return send(session, 400, "application/json", e.to_string().into(), &[]).await;
        };
        let method = msg.get("method").and_then(Value::as_str).unwrap_or_default().to_string();
        let Some(id) = msg.get("id").cloned() else {
            // A notification (or a response to a server request): accepted.
            return send(session, 202, "application/json", Bytes::new(), &[]).await;
        };
        if method == "initialize" {
            let asked = msg.pointer("/params/protocolVersion").and_then(Value::as_str).unwrap_or_default();
            let version = VERSIONS.iter().find(|v| **v == asked).copied().unwrap_or(VERSIONS[2]);
            let new_sid = format!("mock-{}", tollgate::base::secrets::random_base62(24));
            self.sessions.lock().unwrap().insert(new_sid.clone());
            let result = json!({"jsonrpc": "2.0", "id": id, "result": {
                "protocolVersion": version,
                "capabilities": {"tools": {"listChanged": false}, "resources": {}, "prompts": {}},
                "serverInfo": {"name": "tollgate-mock-mcp", "version": tollgate::VERSION},
            }});
            return send(session, 200, "application/json", result.to_string().into(), &[("mcp-session-id", &new_sid)]).await;
        }
        if method == "server/discover" {
            let e = rpc_error(&id, -32601, "Method not found: this server speaks the initialize handshake");
            return send(session, 200, "application/json", e.to_string().into(), &[]).await;
        }
        if !sid.is_some_and(|s| self.sessions.lock().unwrap().contains(&s)) {
            let e = rpc_error(&id, -32001, "Session not found");
            return send(session, 404, "application/json", e.to_string().into(), &[]).await;
        }
        let params = msg.get("params").cloned().unwrap_or(Value::Null);
        let result = match method.as_str() {
            "ping" => Ok(json!({})),
            "tools/list" => Ok(json!({"tools": tools()})),
            "tools/call" => return self.call(session, &id, &params).await,
            "resources/list" => Ok(json!({"resources": [{"uri": "mock://readme", "name": "readme", "mimeType": "text/plain"}]})),
            "resources/read" => match params.get("uri").and_then(Value::as_str) {
                Some("mock://readme") => {
                    Ok(json!({"contents": [{"uri": "mock://readme", "mimeType": "text/plain", "text": "The mock's readme."}]}))
                }
                _ => Err((-32002, "Resource not found")),
            },
            "prompts/list" => Ok(json!({"prompts": [{"name": "greet", "arguments": [{"name": "name", "required": true}]}]})),
            "prompts/get" => {
                let name = params.pointer("/arguments/name").and_then(Value::as_str).unwrap_or("you");
                Ok(json!({"messages": [{"role": "user", "content": {"type": "text", "text": format!("Say hello to {name}.")}}]}))
            }
            _ => Err((-32601, "Method not found")),
        };
        let answer = match result {
            Ok(r) => json!({"jsonrpc": "2.0", "id": id, "result": r}),
            Err((code, message)) => rpc_error(&id, code, message),
        };
        send(session, 200, "application/json", answer.to_string().into(), &[]).await
    }

    async fn call(&self, session: &mut Session, id: &Value, params: &Value) -> Result<()> {
        let args = params.get("arguments").cloned().unwrap_or(Value::Null);
        let int = |name: &str| args.get(name).and_then(Value::as_i64);
        let result = match params.get("name").and_then(Value::as_str).unwrap_or_default() {
            "echo" => text(args.get("text").and_then(Value::as_str).unwrap_or_default().to_string()),
            "add" => match (int("a"), int("b")) {
                (Some(a), Some(b)) => {
                    let mut r = text((a + b).to_string());
                    r["structuredContent"] = json!({"result": a + b});
                    r
                }
                _ => json!({"content": [{"type": "text", "text": "a and b must be integers"}], "isError": true}),
            },
            "count" => {
                let n = int("n").unwrap_or(3).clamp(0, 100);
                let token = params.pointer("/_meta/progressToken").cloned();
                if let Some(token) = token {
                    return self.count_streamed(session, id, n, token).await;
                }
                text(format!("counted to {n}"))
            }
            "fail" => json!({"content": [{"type": "text", "text": "the mock's tool failed"}], "isError": true}),
            _ => {
                let e = rpc_error(id, -32602, "Unknown tool");
                return send(session, 200, "application/json", e.to_string().into(), &[]).await;
            }
        };
        let answer = json!({"jsonrpc": "2.0", "id": id, "result": result});
        send(session, 200, "application/json", answer.to_string().into(), &[]).await
    }

    /// `count` with progress: one progress notification per step, then the result, over SSE.
    async fn count_streamed(&self, session: &mut Session, id: &Value, n: i64, token: Value) -> Result<()> {
        let mut h = ResponseHeader::build(200, Some(4))?;
        h.insert_header("content-type", "text/event-stream")?;
        h.insert_header("cache-control", "no-cache")?;
        service_headers(&mut h)?;
        session.write_response_header(Box::new(h), false).await?;
        let event = |v: Value| Bytes::from(format!("event: message\ndata: {v}\n\n"));
        for i in 1..=n {
            let note = json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": token, "progress": i, "total": n}});
            session.write_response_body(Some(event(note)), false).await?;
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let answer = json!({"jsonrpc": "2.0", "id": id, "result": text(format!("counted to {n}"))});
        session.write_response_body(Some(event(answer)), false).await?;
        session.write_response_body(None, true).await
    }
}
