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
