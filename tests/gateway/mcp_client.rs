//! The gateway's MCP client (`tollgate::mcp::upstream::Server`) against the mock's MCP server:
//! the handshake, tools listed, a call with its progress notifications handed over as they
//! come, a tool error and an unknown tool, and a session the server forgot (the mock
//! restarted) made again without the caller seeing it.

use crate::common::*;
use serde_json::{json, Value};
use std::time::Duration;
use tollgate::mcp::upstream::{McpError, Server};

#[tokio::test]
async fn the_client_lists_and_calls_with_progress_and_survives_a_forgotten_session() {
    let mut mock = start_mock();
    let server = Server::new(&mock.url("/tools/mcp"), vec![], Duration::from_secs(10)).unwrap();
    let tools = server.tools().await.unwrap();
    let names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(names, ["echo", "add", "count", "fail"]);
    let mut progress = Vec::new();
    let counted = server
        .request("tools/call", json!({"name": "count", "arguments": {"n": 3}, "_meta": {"progressToken": "p1"}}), &mut |n: &Value| {
            progress.push(n["params"]["progress"].as_i64().unwrap_or(-1))
        })
        .await
        .unwrap();
    assert_eq!(counted["content"][0]["text"], "counted to 3");
    assert_eq!(progress, [1, 2, 3]);
    let failed = server.request("tools/call", json!({"name": "fail", "arguments": {}}), &mut |_| {}).await.unwrap();
    assert_eq!(failed["isError"], true);
    match server.request("tools/call", json!({"name": "nope", "arguments": {}}), &mut |_| {}).await {
        Err(McpError::Rpc { code, .. }) => assert_eq!(code, -32602),
        other => panic!("an unknown tool: {other:?}"),
    }
    // The server restarts and forgets every session: the next request makes a new one.
    let _ = mock.child.kill();
    let _ = mock.child.wait();
    mock.child = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate-mock"))
        .args(["--listen", &format!("127.0.0.1:{}", mock.port), "--key", UPSTREAM_KEY])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_listening(mock.port, &mut mock.child, "tollgate-mock");
    // A listing is sent again on a connection the restart broke; the session is made again.
    assert_eq!(server.tools().await.unwrap().len(), 4);
    let added = server.request("tools/call", json!({"name": "add", "arguments": {"a": 40, "b": 2}}), &mut |_| {}).await.unwrap();
    assert_eq!(added["structuredContent"]["result"], 42);
    // Its credentials and session headers are what reached the server.
    let recorded: Vec<Value> = client().get(mock.url("/__mock/requests")).send().await.unwrap().json().await.unwrap();
    let inits = recorded.iter().filter(|r| r["body"].as_str().is_some_and(|b| b.contains("\"initialize\""))).count();
    assert_eq!(inits, 1, "the restarted mock saw one new handshake");
    server.close().await;
}

/// `/mcp`'s wire at its edges, against the mock's MCP server: what is not a single JSON-RPC
/// request (GET, a batch, not JSON, a notification), a request outside a session, a revision
/// it does not speak, an endpoint of a gateway without servers, and the access log's line of a
/// tool call (its tool, server, cost; not its arguments).
#[tokio::test]
async fn the_mcp_endpoint_answers_what_is_not_a_request_and_logs_each_tool_call() {
    let mock = start_mock();
    let gw = start_gateway_logged(&format!(
        "{}mcp:\n  servers:\n    - {{ name: mock, url: \"{}\", prices: {{ per_call: 0.25 }} }}\n",
        standard_config(mock.port),
        mock.url("/mcp")
    ));
    let c = client();
    let post = |body: Value, session: Option<&str>| {
        let mut req = c.post(gw.url("/mcp")).bearer_auth(CLIENT_KEY).header("accept", "application/json, text/event-stream").json(&body);
        if let Some(s) = session {
            req = req.header("mcp-session-id", s);
        }
        req.send()
    };
    // The client's own stream needs a session of its key; other methods are not allowed.
    let got = c.get(gw.url("/mcp")).bearer_auth(CLIENT_KEY).send().await.unwrap();
    assert_eq!(got.status().as_u16(), 400);
    assert!(got.json::<Value>().await.unwrap()["error"]["message"].as_str().unwrap().contains("Mcp-Session-Id"));
    let put = c.put(gw.url("/mcp")).bearer_auth(CLIENT_KEY).send().await.unwrap();
    assert_eq!((put.status().as_u16(), put.headers()["allow"].to_str().unwrap()), (405, "GET, POST, DELETE"));
    let batch = post(json!([{"jsonrpc": "2.0", "id": 1, "method": "ping"}]), None).await.unwrap();
    assert_eq!(batch.status().as_u16(), 400);
    let not_json = c.post(gw.url("/mcp")).bearer_auth(CLIENT_KEY).body("{nope").send().await.unwrap();
    assert_eq!(not_json.status().as_u16(), 400);
    assert_eq!(not_json.json::<Value>().await.unwrap()["error"]["code"], -32700);
    let note = post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}), None).await.unwrap();
    assert_eq!(note.status().as_u16(), 202);
    let outside = post(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}), None).await.unwrap();
    assert_eq!(outside.status().as_u16(), 400, "no session, no envelope");
    let unknown = post(json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"}), Some("not-a-session")).await.unwrap();
    assert_eq!(unknown.status().as_u16(), 404);
    let future = post(json!({"jsonrpc": "2.0", "id": 4, "method": "tools/list", "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": "2099-01-01"}}}), None)
        .await
        .unwrap();
    assert_eq!(future.status().as_u16(), 400);
    let e: Value = future.json().await.unwrap();
    assert_eq!((e["error"]["code"].as_i64(), &e["error"]["data"]["supported"]), (Some(-32022), &json!(["2026-07-28"])));
    // A session, a call, its line in the access log.
    let init = post(json!({"jsonrpc": "2.0", "id": 5, "method": "initialize", "params": {"protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}), None)
        .await
        .unwrap();
    let session = init.headers()["mcp-session-id"].to_str().unwrap().to_string();
    assert_eq!(init.json::<Value>().await.unwrap()["result"]["protocolVersion"], "2025-03-26");
    let call = post(json!({"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"name": "mock__echo", "arguments": {"text": "the-secret-argument"}}}), Some(&session))
        .await
        .unwrap();
    assert_eq!(call.json::<Value>().await.unwrap()["result"]["content"][0]["text"], "the-secret-argument");
    let closed = c.delete(gw.url("/mcp")).bearer_auth(CLIENT_KEY).header("mcp-session-id", &session).send().await.unwrap();
    assert_eq!(closed.status().as_u16(), 200);
    let after = post(json!({"jsonrpc": "2.0", "id": 7, "method": "tools/list"}), Some(&session)).await.unwrap();
    assert_eq!(after.status().as_u16(), 404, "a closed session is gone");
    until("the tool call's access line", || async { gw.log().contains("route=mcp_tool_call") }).await;
    let log = gw.log();
    let line = log.lines().find(|l| l.contains("route=mcp_tool_call")).unwrap();
    assert!(line.contains("model=\"mock__echo\"") && line.contains("provider=\"mock\"") && line.contains("cost_usd=0.250000000"), "{line}");
    assert!(!log.contains("the-secret-argument"), "arguments never reach the log");
    // A gateway without servers: the endpoint is not there.
    let bare = start_gateway(&standard_config(mock.port));
    let none =
        c.post(bare.url("/mcp")).bearer_auth(CLIENT_KEY).json(&json!({"jsonrpc": "2.0", "id": 1, "method": "ping"})).send().await.unwrap();
    assert_eq!(none.status().as_u16(), 404);
}
