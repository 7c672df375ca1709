//! `/mcp` (a stage-2 answer): the MCP servers of `mcp:` as one Streamable HTTP endpoint for the
//! calling key, in the handshake revisions (2024-11-05 to 2025-11-25: `initialize`, then
//! `Mcp-Session-Id`) and the stateless 2026-07-28 (`server/discover`, then requests that carry
//! their envelope in `_meta` and no session: a key's such requests share its sessions at the
//! servers, which are spoken to in a handshake revision, the envelope taken off).
//!
//! * `initialize` is answered here (a session of the key's, its sessions at the servers made at
//!   once; the union of what they can do);
//!   `tools/list` is the union of the servers' tools the key may see, `server__tool`;
//!   `prompts/*` (`server__prompt`, under the key's `tools` rules as tools are) and
//!   `resources/*` (of the servers the key's rules give it whole: `server__*`) pass through.
//! * `tools/call` goes to the tool's server with the server's credentials: refused with the
//!   protocol's error when the key's `tools` or the server's `tools` exclude it, counted against
//!   the key's `tool_rpm` and `max_concurrent`, its server's `per_call` price held and booked
//!   once the server answered (a failure to answer is not billed). Progress notifications come
//!   to the client as they arrive when it asked for them (a progress token) and takes SSE.
//! * Each tool call is a request-log entry (server, tool, duration, status, bytes — never
//!   arguments or results), a span with MCP's attributes, and metrics per server and tool.

use super::super::admit::Caller;
use super::super::{Gateway, Outcome, RequestCtx};
use crate::charge::{Bucket, Payer, Used};
use crate::checks::{Kind, Subject, Text};
use crate::mcp::hub::{Hub, Session as McpSession};
use crate::mcp::upstream::McpError;
use crate::protocol::response::LocalResponse;
use crate::protocol::{header_str, ApiError, ErrorKind};
use crate::records::key::KeyRecord;
use crate::upstream::Routing;
use bytes::Bytes;
use pingora_http::ResponseHeader;
use pingora_proxy::Session;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;

/// JSON-RPC's codes, and the one MCP servers use for a refusal of their own.
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;
const SERVER_ERROR: i64 = -32000;
const UNSUPPORTED_VERSION: i64 = -32022;
/// Why a tool call outside the key's or its server's rules was refused (`tollgate_refusals_total`,
/// the logs).
const UNKNOWN_TOOL: &str = "unknown_tool";
use crate::protocol::mcp::MODERN_VERSION;

/// `/mcp`: each tool call checked, counted, held and settled at its server's price.
pub(in crate::edge::gateway) struct Mcp;

#[async_trait::async_trait]
impl super::Answered for Mcp {
    fn platform(&self) -> Option<crate::config::Platform> {
        None
    }

    fn entry(&self) -> crate::charge::Entry {
        // Every MCP request counts against `rpm` and needs a key that is not below zero; tool
        // calls are counted again on their own (`tool_rpm`, `max_concurrent` while a tool runs).
        crate::charge::Entry { count: Some(crate::charge::Bucket::Requests), solvent: true, slot: false }
    }

    async fn run(
        &self,
        gw: &Gateway,
        session: &mut Session,
        ctx: &mut RequestCtx,
        caller: &Caller,
    ) -> std::result::Result<Outcome, ApiError> {
        mcp_route(gw, session, ctx, &caller.key, &caller.routing).await
    }
}

/// What a tool call came to, for the request log, the access log and the trace.
#[derive(Debug, Default)]
pub struct ToolCallFacts {
    pub server: String,
    /// The prefixed name (`server__tool`).
    pub name: String,
    /// In HTTP's terms: 200 answered, 402/403/429 refused here, 502/504 the server failed.
    pub status: u16,
    /// `ok`, `tool_error` (answered with `isError`), `rpc_error`, `unreachable`, `refused`.
    pub outcome: &'static str,
    pub cost_nanos: i64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// What the key's guardrails did to its arguments and its result.
    pub guardrail: Vec<crate::checks::guard::Noted>,
}

/// A JSON-RPC error answer (its message bounded: it may quote what the client sent).
fn rpc_error(id: &Value, code: i64, message: &str, data: Option<Value>) -> Value {
    let message = crate::base::text::clip(message, crate::base::text::MAX_ERROR_MESSAGE);
    let mut error = json!({"code": code, "message": message});
    if let Some(d) = data {
        error["data"] = d;
    }
    json!({"jsonrpc": "2.0", "id": id, "error": error})
}

fn rpc_result(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// A JSON-RPC answer in a 200.
fn answered(message: &Value) -> Outcome {
    Outcome::Respond(LocalResponse::json(200, message))
}

/// The error a server's failure is answered with.
fn upstream_error(id: &Value, server: &str, e: &McpError) -> Value {
    match e {
        McpError::Rpc { code, message } => rpc_error(id, *code, message, None),
        other => {
            log::warn!("MCP server '{server}': {other}");
            rpc_error(id, SERVER_ERROR, &format!("MCP server '{server}': {}", other.for_client()), Some(json!({"server": server})))
        }
    }
}

pub(super) async fn mcp_route(
    gw: &Gateway,
    session: &mut Session,
    ctx: &mut RequestCtx,
    key: &Arc<KeyRecord>,
    routing: &Arc<Routing>,
) -> std::result::Result<Outcome, ApiError> {
    let Some(hub) = gw.mcp.as_ref() else {
        return Err(ApiError::new(ErrorKind::NotFound, "No MCP servers are configured on this gateway."));
    };
    let req = session.req_header();
    // A browser page of an origin the operator did not name is refused before anything is read
    // (the transport specification's defence against DNS rebinding); clients that send no
    // `Origin` (SDKs, CLIs) are not browsers.
    if !hub.origin_allowed(req.headers.get(http::header::ORIGIN).map(http::HeaderValue::as_bytes)) {
        let e = rpc_error(&Value::Null, INVALID_REQUEST, "Forbidden: this origin may not call /mcp (mcp.allowed_origins).", None);
        return Ok(Outcome::Respond(LocalResponse::json(403, &e)));
    }
    let session_id = header_str(req, "mcp-session-id").map(str::to_string);
    match req.method.as_str() {
        "POST" => {}
        "DELETE" => {
            let closed = match &session_id {
                Some(id) => hub.close(id, &key.id).await,
                None => false,
            };
            return Ok(Outcome::Respond(LocalResponse::json(if closed { 200 } else { 404 }, &json!({}))));
        }
        "GET" => return Ok(client_stream(hub, session, key, session_id.as_deref()).await),
        _ => {
            let mut r =
                LocalResponse::json(405, &rpc_error(&Value::Null, INVALID_REQUEST, "Method not allowed: GET, POST or DELETE.", None));
            r.headers.push(("allow", "GET, POST, DELETE".into()));
            return Ok(Outcome::Respond(r));
        }
    }
    let accepts_sse = header_str(req, "accept").is_some_and(|a| a.contains("text/event-stream"));
    let body = crate::edge::body::read(session, &gw.body).await?.bytes;
    let message: Value = match serde_json::from_slice(&body) {
        Ok(m) => m,
        Err(_) => {
            return Ok(Outcome::Respond(LocalResponse::json(
                400,
                &rpc_error(&Value::Null, PARSE_ERROR, "Parse error: the body is not JSON.", None),
            )))
        }
    };
    if message.is_array() {
        let e = rpc_error(&Value::Null, INVALID_REQUEST, "JSON-RPC batches are not accepted: send one message per request.", None);
        return Ok(Outcome::Respond(LocalResponse::json(400, &e)));
    }
    if message.get("method").is_none() && message.get("id").is_some() && (message.get("result").is_some() || message.get("error").is_some())
    {
        return Ok(client_answer(hub, &key.id, session_id.as_deref(), &message).await);
    }
    let (Some(method), Some(id)) = (message.get("method").and_then(Value::as_str), message.get("id")) else {
        // A notification: nothing to answer.
        return Ok(Outcome::Respond(LocalResponse {
            status: 202,
            body: Bytes::new(),
            content_type: "application/json",
            headers: Vec::new(),
        }));
    };
    let id = id.clone();
    let params = message.get("params").cloned().unwrap_or_else(|| json!({}));
    let (s, modern) = match session_for(hub, &key.id, session_id, method, &id, &params).await {
        Ok(found) => found,
        Err(answer) => return Ok(answer),
    };
    let params = crate::protocol::mcp::without_envelope(&params);
    let allows = |name: &str| key.policy.allows_tool(name);
    let reply = match method {
        "ping" => rpc_result(&id, json!({})),
        "logging/setLevel" => match hub.set_level(&s, &params).await {
            Ok(()) => rpc_result(&id, json!({})),
            Err(servers) => rpc_error(&id, SERVER_ERROR, &format!("MCP servers that could not set the level: {servers}"), None),
        },
        "completion/complete" => match hub.complete(&s, &params, &allows).await {
            Ok(v) => rpc_result(&id, v),
            Err((Some(i), e)) => upstream_error(&id, &hub.upstreams[i].config.name, &e),
            Err((None, e)) => upstream_error(&id, "-", &e),
        },
        "tools/list" => rpc_result(&id, json!({"tools": hub.tools(&s, &allows).await})),
        "tools/call" => {
            let call = ToolCall {
                hub,
                session: &s,
                key,
                routing,
                id: &id,
                params: &params,
                bytes_in: body.len() as u64,
                sse: accepts_sse,
                modern,
            };
            return tool_call(gw, session, ctx, call).await;
        }
        "prompts/list" => rpc_result(&id, json!({"prompts": hub.prompts(&s, &allows).await})),
        "prompts/get" => {
            let name = params.get("name").and_then(Value::as_str).unwrap_or_default();
            match hub.prompt(name, &allows) {
                Ok((i, _)) => match s.server(i).request(method, hub.own_params(i, &params, "name"), &mut |_| {}).await {
                    Ok(v) => rpc_result(&id, v),
                    Err(e) => upstream_error(&id, &hub.upstreams[i].config.name, &e),
                },
                Err(u) => rpc_error(&id, INVALID_PARAMS, &u.0, None),
            }
        }
        "resources/list" => rpc_result(&id, json!({"resources": hub.resources(&s, method, "resources", &allows).await})),
        "resources/templates/list" => {
            rpc_result(&id, json!({"resourceTemplates": hub.resources(&s, method, "resourceTemplates", &allows).await}))
        }
        "resources/read" | "resources/subscribe" | "resources/unsubscribe" => match hub.resource(&s, method, params, &allows).await {
            Ok(v) => rpc_result(&id, v),
            Err(e @ McpError::Rpc { .. }) => upstream_error(&id, "-", &e),
            Err(e) => {
                log::warn!("MCP: {method}: {e}");
                rpc_error(&id, SERVER_ERROR, &format!("{method} failed: {}", e.for_client()), None)
            }
        },
        _ => rpc_error(&id, METHOD_NOT_FOUND, &format!("Method not found: {method}"), None),
    };
    Ok(answered(&shaped(reply, method, modern)))
}

/// `tools/call`: checked, counted, held, sent to its server, answered (as SSE with the
/// server's progress when the client asked for progress and takes SSE), booked.
async fn tool_call(
    gw: &Gateway,
    session: &mut Session,
    ctx: &mut RequestCtx,
    call: ToolCall<'_>,
) -> std::result::Result<Outcome, ApiError> {
    let ToolCall { hub, session: s, key, routing, id, params, bytes_in, sse, modern } = call;
    let name = params.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
    ctx.route = "mcp_tool_call";
    ctx.model_asked = Some(name.clone());
    let mut facts = ToolCallFacts { name: name.clone(), bytes_in, status: 403, outcome: "refused", ..Default::default() };
    let (i, tool) = match hub.tool(&name, &|n| key.policy.allows_tool(n)) {
        Ok(found) => found,
        Err(unknown) => {
            // Refused like a model the key may not call: counted and logged with why.
            gw.note_refusal(ctx, UNKNOWN_TOOL);
            ctx.mcp = Some(Box::new(facts));
            return Ok(answered(&rpc_error(id, INVALID_PARAMS, &unknown.0, None)));
        }
    };
    let upstream = &hub.upstreams[i];
    let tool = tool.to_string();
    facts.server = upstream.config.name.clone();
    // Counted, then held: a refusal here is the protocol's error, with why in `data`.
    let refused = |facts: ToolCallFacts, ctx: &mut RequestCtx, e: ApiError| {
        let data = json!({"type": e.kind.reason(), "retry_after": e.retry_after});
        gw.note_refusal(ctx, e.kind.reason());
        ctx.mcp = Some(Box::new(ToolCallFacts { status: e.status(), ..facts }));
        Ok(answered(&rpc_error(id, SERVER_ERROR, &e.message, Some(data))))
    };
    // The checks that read a call's text see the tool's arguments.
    let arguments = params.get("arguments").unwrap_or(&Value::Null);
    if let Err(e) = gw.checks.vet(&Subject::new(Kind::ToolCall, &key.policy).text(Text::Value(arguments))) {
        return refused(facts, ctx, e);
    }
    // The key's guardrails read the arguments (masked in place, or refused) and the result.
    let guards = super::super::guarded::applying(gw, routing, key);
    let mut arguments = arguments.clone();
    let guard_price = match guard_tool(gw, (&guards, key), &name, &mut arguments, false, &mut facts.guardrail).await {
        Ok(price) => price,
        Err(e) => return refused(facts, ctx, e),
    };
    if let Err(e) = gw.charge.count(key, Bucket::ToolCalls).await {
        return refused(facts, ctx, e);
    }
    let _slot = match gw.charge.enter(key).await {
        Ok(slot) => slot,
        Err(e) => return refused(facts, ctx, e),
    };
    let price = upstream.config.per_call_nanos.saturating_add(guard_price);
    let purses = gw.charge.purses(key, &routing.calendar)?;
    let hold = match gw.charge.hold(purses, price, gw.charge.rate(key)).await? {
        Ok(hold) => hold,
        Err(r) => return refused(facts, ctx, r.to_api_error("this tool call costs", crate::base::clock::now_unix())),
    };
    let started = Instant::now();
    let mut upstream_params = hub.own_params(i, params, "name");
    if guards.input() && params.get("arguments").is_some() {
        upstream_params["arguments"] = arguments;
    }
    let (answer, streamed) = tool_call_relayed(session, (s, i), upstream_params, sse).await;
    let took = started.elapsed();
    let mut answer = answer;
    let blocked = match answer.as_mut() {
        Ok(result) => guard_tool(gw, (&guards, key), &name, result, true, &mut facts.guardrail).await.err(),
        Err(_) => None,
    };
    let (reply, outcome, status) = match &answer {
        // The tool ran (and is billed); its result is not the client's.
        _ if blocked.is_some() => {
            let e = blocked.unwrap_or_else(|| ApiError::new(ErrorKind::ContentPolicy, ""));
            (rpc_error(id, SERVER_ERROR, &e.message, Some(json!({"type": e.kind.reason()}))), "blocked", 200)
        }
        Ok(result) if result.get("isError").and_then(Value::as_bool) == Some(true) => (rpc_result(id, result.clone()), "tool_error", 200),
        Ok(result) => (rpc_result(id, result.clone()), "ok", 200),
        Err(e @ McpError::Rpc { .. }) => (upstream_error(id, &facts.server, e), "rpc_error", 200),
        Err(e) => (upstream_error(id, &facts.server, e), "unreachable", 502),
    };
    facts.outcome = outcome;
    facts.status = status;
    if let Some(trace) = ctx.trace.as_deref_mut() {
        let sid = s.server(i).session_id();
        let error = matches!(outcome, "rpc_error" | "unreachable").then_some(outcome);
        trace.tool_call(&crate::observe::telemetry::ToolCall {
            server: &facts.server,
            tool: &tool,
            session: sid.as_deref(),
            version: s.version,
            host: &upstream.host,
            port: upstream.port,
            started,
            error,
        });
    }
    gw.metrics.tool_call(&facts.server, hub.tool_label(i, &tool), outcome, took);
    // Billed once the server answered the call (its tool ran, even when it reports an
    // error); a call it never answered is not.
    if answer.is_ok() {
        let rate = hold.rate();
        facts.cost_nanos = rate.apply(price);
        let payer = Payer { key_id: &key.id, tags: &key.policy.tags, model: &name, protocol: "mcp", route: "mcp_tool_call", rate };
        let used = Used { latency_ms: took.as_millis() as u64, provider: Some(facts.server.clone()), ..Used::cost(price) };
        if let Err(e) = gw.charge.books().settle(hold, &payer, used).await {
            log::error!("ledger: could not book a tool call of key {}: {e}", key.name);
        }
    } else {
        drop(hold);
    }
    let text = shaped(reply, "tools/call", modern).to_string();
    facts.bytes_out = text.len() as u64;
    ctx.mcp = Some(Box::new(facts));
    if let Some(present) = streamed {
        // The header went out with the first notification: the answer is the stream's last.
        if present {
            let _ = session.write_response_body(Some(sse_event(&text)), true).await;
        }
        return Ok(Outcome::Done);
    }
    Ok(Outcome::Respond(LocalResponse { status: 200, body: Bytes::from(text), content_type: "application/json", headers: Vec::new() }))
}

/// A tool call's arguments (`output` false) or result read by the key's guardrails of that
/// phase: what they cost, or the refusal (a blocked result is answered as the tool's error).
async fn guard_tool(
    gw: &Gateway,
    (guards, key): (&crate::checks::guard::Applied, &KeyRecord),
    name: &str,
    value: &mut Value,
    output: bool,
    noted: &mut Vec<crate::checks::guard::Noted>,
) -> std::result::Result<i64, ApiError> {
    if (output && !guards.output()) || (!output && !guards.input()) {
        return Ok(0);
    }
    let call =
        crate::checks::guard::Call { protocol: "mcp", route: "mcp_tool_call", model: Some(name), key_id: &key.id, tags: &key.policy.tags };
    super::super::guarded::screen_value(gw, guards, &call, value, output, noted).await
}

/// `GET /mcp`: the client's own stream (one per session), what its servers send outside
/// answers, as it comes: change notices (`notifications/*/list_changed`), log messages, updates
/// of subscribed resources of the servers the key has whole, and requests (relayed as in a call:
/// [`relay_message`]). A comment every 25 s finds a client that left; it ends when the client
/// leaves.
async fn client_stream(hub: &Hub, session: &mut Session, key: &Arc<KeyRecord>, session_id: Option<&str>) -> Outcome {
    let Some(s) = session_id.and_then(|sid| hub.session(sid, &key.id)) else {
        let e = rpc_error(&Value::Null, INVALID_REQUEST, "Bad Request: GET /mcp needs the Mcp-Session-Id of a session of this key.", None);
        return Outcome::Respond(LocalResponse::json(400, &e));
    };
    let Some(mut open) = s.open_stream() else {
        let e = rpc_error(&Value::Null, INVALID_REQUEST, "This session's stream is open already.", None);
        return Outcome::Respond(LocalResponse::json(409, &e));
    };
    let allows = |name: &str| key.policy.allows_tool(name);
    // The header goes out at once, so the client knows the stream is open.
    match ResponseHeader::build(200, Some(3)) {
        Ok(mut header) => {
            let _ = header.insert_header(http::header::CONTENT_TYPE, "text/event-stream");
            let _ = header.insert_header(http::header::CACHE_CONTROL, "no-cache");
            if session.write_response_header(Box::new(header), false).await.is_err() {
                return Outcome::Done;
            }
        }
        Err(_) => return Outcome::Done,
    }
    let mut streamed = Some(true);
    let mut beat = tokio::time::interval(std::time::Duration::from_secs(25));
    beat.tick().await;
    loop {
        let (i, message) = tokio::select! {
            m = open.rx.recv() => match m {
                Some(m) => m,
                None => return Outcome::Done,
            },
            // The session ended (DELETE, forgotten): so does its stream.
            () = s.over() => return Outcome::Done,
            _ = beat.tick() => {
                if session.write_response_body(Some(Bytes::from_static(b": keep-alive\n\n")), false).await.is_err() {
                    return Outcome::Done;
                }
                continue;
            }
        };
        let method = message.get("method").and_then(Value::as_str).unwrap_or_default();
        let passes = match method {
            // A request (a response to nothing of the client's is not passed on).
            "" => false,
            _ if message.get("id").is_some() => true,
            "notifications/tools/list_changed" | "notifications/prompts/list_changed" | "notifications/resources/list_changed" => true,
            "notifications/message" => true,
            "notifications/resources/updated" => hub.whole_server(i, &allows),
            _ => false,
        };
        if !passes {
            continue;
        }
        streamed = relay_message(session, (&s, i), streamed, message, true).await;
        if streamed == Some(false) {
            return Outcome::Done;
        }
    }
}

/// A client's answer to a request a server asked through tollgate (sampling, elicitation,
/// roots): sent to the server that asked, under its own id; 202. One tollgate did not pass on
/// (another session's, answered already, made up) is 400.
async fn client_answer(hub: &Hub, key_id: &str, session_id: Option<&str>, message: &Value) -> Outcome {
    let id = message.get("id").unwrap_or(&Value::Null);
    let Some((s, (i, theirs))) = session_id.and_then(|sid| hub.session(sid, key_id)).and_then(|s| s.answered(id).map(|a| (s, a))) else {
        let e = rpc_error(&Value::Null, INVALID_REQUEST, "No request of this session's servers awaits an answer with this id.", None);
        return Outcome::Respond(LocalResponse::json(400, &e));
    };
    let mut answer = message.clone();
    answer["id"] = theirs;
    if let Err(e) = s.server(i).respond(&answer).await {
        log::warn!("MCP server '{}': the client's answer could not be passed on: {e}", hub.upstreams[i].config.name);
        let e = rpc_error(
            &Value::Null,
            SERVER_ERROR,
            &format!("MCP server '{}' did not take the answer: {}", hub.upstreams[i].config.name, e.for_client()),
            None,
        );
        return Outcome::Respond(LocalResponse::json(502, &e));
    }
    Outcome::Respond(LocalResponse { status: 202, body: Bytes::new(), content_type: "application/json", headers: Vec::new() })
}

/// A tool call relayed: answered as JSON when the server sends nothing before its answer;
/// when it does (progress the client asked for, log messages at the level it set) and the
/// client takes SSE (`sse`), as SSE from the first notification on, each as it comes. The
/// answer, and whether it went as SSE (`Some`) with the client still there to be given the
/// rest. A client that leaves does not end the call: the server's answer is awaited all the
/// same (and billed), as the tool runs on whether or not anyone reads.
async fn tool_call_relayed(
    session: &mut Session,
    (s, i): (&Arc<McpSession>, usize),
    params: Value,
    sse: bool,
) -> (Result<Value, McpError>, Option<bool>) {
    let server = s.server(i);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, Value)>();
    // Requests a server sends on its own stream while the call runs come here too.
    let _calling = s.calling(tx.clone());
    let mut notify = move |n: &Value| {
        let _ = tx.send((i, n.clone()));
    };
    let call = server.request("tools/call", params, &mut notify);
    tokio::pin!(call);
    let mut streamed: Option<bool> = None;
    loop {
        tokio::select! {
            answer = &mut call => {
                // Notifications sent before the answer go first.
                while let Ok((j, n)) = rx.try_recv() {
                    streamed = relay_message(session, (s, j), streamed, n, sse).await;
                }
                return (answer, streamed);
            }
            Some((j, n)) = rx.recv() => {
                streamed = relay_message(session, (s, j), streamed, n, sse).await;
            }
        }
    }
}

/// What server `i` sent while a call runs, relayed: a notification to a client that takes SSE
/// (else dropped); a request (sampling, elicitation, roots) to a client that takes SSE and
/// declared what it asks for, under an id of tollgate's (its answer comes back in a POST of
/// its own: [`client_answer`]) — else answered at once with the protocol's error, so the
/// server never waits for what cannot come. Whether the answer now goes as SSE, with the client
/// still there.
async fn relay_message(
    session: &mut Session,
    (s, i): (&McpSession, usize),
    streamed: Option<bool>,
    mut n: Value,
    sse: bool,
) -> Option<bool> {
    let Some(theirs) = n.get("id").cloned() else {
        return match sse {
            true => Some(relay_notification(session, streamed, &n).await),
            false => streamed,
        };
    };
    let method = n.get("method").and_then(Value::as_str).unwrap_or_default();
    let wanted = crate::mcp::hub::asks_for(method);
    if sse && wanted.is_some_and(|c| s.declares(c)) {
        n["id"] = Value::String(s.ask(i, &theirs));
        return Some(relay_notification(session, streamed, &n).await);
    }
    let why = match wanted {
        Some(c) if sse => format!("The client did not declare the '{c}' capability."),
        Some(_) => "The client takes no event stream on which a request could reach it.".to_string(),
        None => format!(
            "Method not found: {} (tollgate passes sampling, elicitation and roots requests on).",
            crate::base::text::clip(method, 64)
        ),
    };
    if let Err(e) = s.server(i).respond(&rpc_error(&theirs, METHOD_NOT_FOUND, &why, None)).await {
        log::warn!("MCP: a server's request could not be refused: {e}");
    }
    streamed
}

/// One notification to a client answered as SSE, the header first when none went yet
/// (`streamed` None); whether the client is still there.
async fn relay_notification(session: &mut Session, streamed: Option<bool>, n: &Value) -> bool {
    let present = match streamed {
        Some(present) => present,
        None => match ResponseHeader::build(200, Some(3)) {
            Ok(mut header) => {
                let _ = header.insert_header(http::header::CONTENT_TYPE, "text/event-stream");
                let _ = header.insert_header(http::header::CACHE_CONTROL, "no-cache");
                session.write_response_header(Box::new(header), false).await.is_ok()
            }
            Err(_) => false,
        },
    };
    present && session.write_response_body(Some(sse_event(n)), false).await.is_ok()
}

/// One message as an SSE event.
fn sse_event(message: &impl std::fmt::Display) -> Bytes {
    Bytes::from(format!("event: message\ndata: {message}\n\n"))
}

/// The session a request is served in: a new one for `initialize` (answered here, as is
/// `server/discover`: `Err` holds such answers and refusals), the key's stateless one for a
/// request of the stateless revision, else the one its `Mcp-Session-Id` names; and whether the
/// request is of the stateless revision.
async fn session_for(
    hub: &Hub,
    key_id: &str,
    session_id: Option<String>,
    method: &str,
    id: &Value,
    params: &Value,
) -> Result<(Arc<McpSession>, bool), Outcome> {
    if method == "initialize" {
        let asked = params.get("protocolVersion").and_then(Value::as_str).unwrap_or_default();
        let version = crate::protocol::mcp::negotiate(asked);
        let s = hub.open(key_id, version, crate::mcp::hub::declared_by_client(params.get("capabilities")));
        // A client that may be asked: servers that ask on their own stream are heard from now.
        if ["sampling", "elicitation", "roots"].iter().any(|c| s.declares(c)) {
            s.listen();
        }
        let result = json!({
            "protocolVersion": version,
            "capabilities": hub.capabilities(&s).await,
            "serverInfo": {"name": "tollgate", "version": crate::VERSION},
            "instructions": hub.instructions(),
        });
        let mut r = LocalResponse::json(200, &rpc_result(id, result));
        r.headers.push(("mcp-session-id", s.id.clone()));
        return Err(Outcome::Respond(r));
    }
    // The stateless revision: a request that names it in its envelope and carries no session.
    let envelope = crate::protocol::mcp::envelope_version(params).filter(|_| session_id.is_none()).map(str::to_string);
    if let Some(v) = envelope.as_deref().filter(|v| *v != MODERN_VERSION) {
        let data = json!({"supported": [MODERN_VERSION], "requested": v});
        return Err(Outcome::Respond(LocalResponse::json(
            400,
            &rpc_error(id, UNSUPPORTED_VERSION, "Unsupported protocol version.", Some(data)),
        )));
    }
    let modern = envelope.is_some();
    if method == "server/discover" {
        if !modern {
            return Err(answered(&rpc_error(id, INVALID_REQUEST, "server/discover names its protocol version in _meta.", None)));
        }
        let caps = hub.capabilities(&hub.stateless(key_id, MODERN_VERSION)).await;
        let mut result = json!({"supportedVersions": [MODERN_VERSION], "capabilities": caps, "instructions": hub.instructions(),
            "_meta": {"io.modelcontextprotocol/serverInfo": {"name": "tollgate", "version": crate::VERSION}}});
        crate::protocol::mcp::modern_result(method, &mut result);
        return Err(answered(&rpc_result(id, result)));
    }
    let s = if modern {
        hub.stateless(key_id, MODERN_VERSION)
    } else {
        let Some(id_given) = session_id else {
            let e = rpc_error(id, INVALID_REQUEST, "Bad Request: no Mcp-Session-Id; send initialize first.", None);
            return Err(Outcome::Respond(LocalResponse::json(400, &e)));
        };
        let Some(s) = hub.session(&id_given, key_id) else {
            let e = rpc_error(id, -32001, "Session not found: start a new one with initialize.", None);
            return Err(Outcome::Respond(LocalResponse::json(404, &e)));
        };
        s
    };
    Ok((s, modern))
}

/// What `tool_call` is given.
struct ToolCall<'a> {
    hub: &'a Hub,
    session: &'a Arc<McpSession>,
    key: &'a Arc<KeyRecord>,
    routing: &'a Arc<Routing>,
    id: &'a Value,
    params: &'a Value,
    bytes_in: u64,
    sse: bool,
    /// The stateless revision: its results shaped as it defines them.
    modern: bool,
}

/// An answer as the client's revision shapes it.
fn shaped(mut reply: Value, method: &str, modern: bool) -> Value {
    if modern {
        if let Some(result) = reply.get_mut("result") {
            crate::protocol::mcp::modern_result(method, result);
        }
    }
    reply
}
