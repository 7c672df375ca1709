//! Issue 62, security round 3, the points reproduced through the gateway's own endpoints: MCP
//! servers' secrets never echoed or logged, every MCP request rate-limited and a key's
//! sessions capped within the key, a key below zero refused files and MCP, client strings
//! bounded before every sink (access log, request log, error echo), tool names as metric
//! labels only when a server listed them.

use crate::common::*;
use serde_json::{json, Value};

const ADMIN: &str = "round3-admin-token-0123456789abcdef";
const RPM_KEY: &str = "sk-round3-rpm-0000000001";
const OTHER_KEY: &str = "sk-round3-other-00000001";
const DEBT_KEY: &str = "sk-round3-debt-000000001";

/// The standard gateway with an MCP server at `url`, an admin listener and the round's keys.
fn config(mock_port: u16, admin_port: u16, url: &str) -> String {
    let mut c = standard_config(mock_port);
    for key in [
        format!("{{ key: {RPM_KEY}, name: rpm, group: default, balance: 1.0, rpm: 5 }}"),
        format!("{{ key: {OTHER_KEY}, name: other, group: default, balance: 1.0 }}"),
        format!("{{ key: {DEBT_KEY}, name: debt, group: default, balance: 0.5 }}"),
    ] {
        c = with_key(&c, &key);
    }
    format!(
        "{c}admin: {{ listen: 127.0.0.1:{admin_port}, token: {ADMIN} }}\nmcp:\n  servers:\n    - {{ name: mock, url: \"{url}\", prices: {{ per_call: 0.001 }} }}\n"
    )
}

struct Mcp<'a> {
    gw: &'a Gateway,
    key: &'a str,
    session: Option<String>,
}

impl Mcp<'_> {
    async fn post(&self, body: Value) -> reqwest::Response {
        let mut req =
            client().post(self.gw.url("/mcp")).bearer_auth(self.key).header("accept", "application/json, text/event-stream").json(&body);
        if let Some(s) = &self.session {
            req = req.header("mcp-session-id", s);
        }
        req.send().await.unwrap()
    }

    /// `initialize`: the session id, or the refusal's status.
    async fn initialize(&self) -> Result<String, u16> {
        let r = self
            .post(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                         "params": {"protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}))
            .await;
        match r.headers().get("mcp-session-id") {
            Some(id) => Ok(id.to_str().unwrap().to_string()),
            None => Err(r.status().as_u16()),
        }
    }

    async fn call(&self, id: u64, method: &str, params: Value) -> (u16, String) {
        let r = self.post(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).await;
        (r.status().as_u16(), r.text().await.unwrap())
    }
}

#[tokio::test]
async fn an_mcp_servers_credentials_never_reach_a_client_or_a_log() {
    let mut mock = start_mock();
    let admin_port = free_port();
    let url = format!("http://user:pw-SECRET-A@127.0.0.1:{}/mcp?api_key=SECRET-B", mock.port);
    let gw = start_gateway_logged(&config(mock.port, admin_port, &url));
    let mut mcp = Mcp { gw: &gw, key: CLIENT_KEY, session: None };
    mcp.session = Some(mcp.initialize().await.expect("a session"));
    let (_, tools) = mcp.call(2, "tools/list", json!({})).await;
    assert!(tools.contains("mock__echo"), "{tools}");
    // The server goes away: the call fails on its way there.
    let _ = mock.child.kill();
    let _ = mock.child.wait();
    let (_, answer) = mcp.call(3, "tools/call", json!({"name": "mock__echo", "arguments": {"text": "hi"}})).await;
    assert!(answer.contains("MCP server 'mock'") && answer.contains("-32000"), "the server is named: {answer}");
    for secret in ["SECRET-A", "SECRET-B", "127.0.0.1"] {
        assert!(!answer.contains(secret), "{secret} in the client's answer: {answer}");
    }
    let (_, read) = mcp.call(4, "resources/read", json!({"uri": "mock://nothing"})).await;
    assert!(!read.contains("SECRET"), "{read}");
    until("the failure logged", || async { gw.log().contains("MCP server") }).await;
    let log = gw.log();
    assert!(!log.contains("SECRET-A") && !log.contains("SECRET-B"), "a credential in the log");
}

#[tokio::test]
async fn every_mcp_request_counts_against_rpm_and_a_keys_sessions_are_capped_within_the_key() {
    let mock = start_mock();
    let admin_port = free_port();
    let gw = start_gateway(&config(mock.port, admin_port, &mock.url("/mcp")));
    // rpm 5: the sixth handshake of the minute is refused.
    let limited = Mcp { gw: &gw, key: RPM_KEY, session: None };
    for _ in 0..5 {
        limited.initialize().await.expect("within rpm");
    }
    assert_eq!(limited.initialize().await, Err(429));
    // Another key's session is never what a busy key's new sessions push out.
    let mut other = Mcp { gw: &gw, key: OTHER_KEY, session: None };
    other.session = Some(other.initialize().await.unwrap());
    let mut busy = Mcp { gw: &gw, key: CLIENT_KEY, session: None };
    let first = busy.initialize().await.unwrap();
    for _ in 0..tollgate::mcp::hub::MAX_SESSIONS_PER_KEY {
        busy.initialize().await.unwrap();
    }
    busy.session = Some(first);
    assert_eq!(busy.call(2, "tools/list", json!({})).await.0, 404, "the busy key's oldest session was forgotten");
    assert_eq!(other.call(2, "tools/list", json!({})).await.0, 200, "another key's session stays");
}

#[tokio::test]
async fn a_key_below_zero_is_refused_files_batches_and_mcp() {
    let mock = start_mock();
    let admin_port = free_port();
    let gw = start_gateway(&config(mock.port, admin_port, &mock.url("/mcp")));
    let keys: Value =
        client().get(format!("http://127.0.0.1:{admin_port}/admin/keys")).bearer_auth(ADMIN).send().await.unwrap().json().await.unwrap();
    let id = keys["data"].as_array().unwrap().iter().find(|k| k["name"] == "debt").unwrap()["id"].as_str().unwrap().to_string();
    let r = client()
        .patch(format!("http://127.0.0.1:{admin_port}/admin/keys/{id}"))
        .bearer_auth(ADMIN)
        .json(&json!({"balance_delta": -1.0}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(balance(&gw, DEBT_KEY).await < 0);
    let (ct, body) = form(&[("purpose", "batch")], &[("file", "in.jsonl", "application/jsonl", b"{}\n".to_vec())]);
    let upload = client().post(gw.url("/v1/files")).bearer_auth(DEBT_KEY).header("content-type", ct).body(body).send().await.unwrap();
    assert_eq!(upload.status(), 402);
    let listed = client().get(gw.url("/v1/batches")).bearer_auth(DEBT_KEY).send().await.unwrap();
    assert_eq!(listed.status(), 402);
    assert_eq!(Mcp { gw: &gw, key: DEBT_KEY, session: None }.initialize().await, Err(402));
    // A key with money is not affected.
    assert!(Mcp { gw: &gw, key: OTHER_KEY, session: None }.initialize().await.is_ok());
}

#[tokio::test]
async fn a_clients_strings_are_bounded_in_every_sink_and_tool_labels_are_the_servers_own() {
    let mock = start_mock();
    let admin_port = free_port();
    let gw = start_gateway_logged(&config(mock.port, admin_port, &mock.url("/mcp")));
    let mut mcp = Mcp { gw: &gw, key: CLIENT_KEY, session: None };
    mcp.session = Some(mcp.initialize().await.unwrap());
    let _ = mcp.call(2, "tools/list", json!({})).await;
    // A tool name of 1 MiB: refused without being quoted back, logged cut short.
    let huge = format!("mock__{}", "x".repeat(1 << 20));
    let (_, answer) = mcp.call(3, "tools/call", json!({"name": huge, "arguments": {}})).await;
    assert!(answer.len() < 4096, "the answer quotes the name: {} bytes", answer.len());
    // Names the server never listed: sent on (the server answers), one metric series for all.
    for i in 0..30 {
        let (status, _) =
            mcp.call(10 + i, "tools/call", json!({"name": format!("mock__made-up-{i}-{}", "y".repeat(100)), "arguments": {}})).await;
        assert_eq!(status, 200);
    }
    let (status, _) = mcp.call(99, "tools/call", json!({"name": "mock__echo", "arguments": {"text": "hi"}})).await;
    assert_eq!(status, 200);
    let metrics = admin_metrics(admin_port, ADMIN).await;
    assert!(!metrics.contains("made-up"), "a client's tool name became a label");
    assert!(metrics.contains("tool=\"other\"") && metrics.contains("tool=\"echo\""), "{metrics}");
    // A model name of 1 MiB on a relayed route: refused, the answer and every log bounded.
    let long_model = "m".repeat(1 << 20);
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(CLIENT_KEY)
        .json(&json!({"model": long_model, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_client_error());
    assert!(r.text().await.unwrap().len() < 8192);
    // A multipart part named at length: the error's `param` is bounded.
    let long_part = "p".repeat(100_000);
    let (ct, body) = form(&[("model", "alpha-whisper-1"), (long_part.as_str(), "v")], &[("file", "a.wav", "audio/wav", vec![0; 64])]);
    let r = client()
        .post(gw.url("/v1/audio/transcriptions"))
        .bearer_auth(CLIENT_KEY)
        .header("content-type", ct)
        .body(body)
        .send()
        .await
        .unwrap();
    let text = r.text().await.unwrap();
    assert!(text.len() < 8192, "{} bytes of error", text.len());
    until("the calls logged", || async { gw.log().matches("route=mcp_tool_call").count() >= 32 }).await;
    let log = gw.log();
    assert!(log.len() < 512 << 10, "the log took {} bytes", log.len());
    let requests: Value = client()
        .get(format!("http://127.0.0.1:{admin_port}/admin/requests?limit=100"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(requests.to_string().len() < 256 << 10, "the request log holds {} bytes", requests.to_string().len());
}

#[tokio::test]
async fn a_generate_content_answer_under_an_alias_names_the_model_as_the_client_does() {
    let mock = start_mock();
    let c = standard_config(mock.port).replace(
        "      models: [gamma-3.5-flash] }",
        "      models: [gamma-3.5-flash, { name: gamma-alias, upstream: gamma-3.5-flash }] }",
    );
    let c = c.replace("prices:\n", "prices:\n  gamma-alias: { input: 0.5, output: 1.5 }\n");
    assert!(c.contains("gamma-alias, upstream"), "{c}");
    let gw = start_gateway(&c);
    let body = json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]});
    let whole: Value = client()
        .post(gw.url("/v1beta/models/gamma-alias:generateContent"))
        .header("x-goog-api-key", CLIENT_KEY)
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(whole["modelVersion"], "gamma-alias", "{whole}");
    let streamed = client()
        .post(gw.url("/v1beta/models/gamma-alias:streamGenerateContent?alt=sse"))
        .header("x-goog-api-key", CLIENT_KEY)
        .json(&body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(streamed.contains("\"modelVersion\":\"gamma-alias\"") && !streamed.contains("gamma-3.5-flash"), "{streamed}");
}

/// A raw upload to `/v1/files` of `key`: its header (declaring `declared` bytes) and the
/// first `sent` bytes of a form whose file part holds the rest; the connection stays open.
async fn begin_upload(gw: &Gateway, key: &str, declared: usize, sent: &[u8]) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", gw.proc.port)).await.unwrap();
    let head = format!(
        "POST /v1/files HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: multipart/form-data; boundary=XyZ\r\nContent-Length: {declared}\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(sent).await.unwrap();
    s.flush().await.unwrap();
    s
}

fn form_start() -> Vec<u8> {
    b"--XyZ\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.jsonl\"\r\n\r\n".to_vec()
}

async fn upload_small(gw: &Gateway, key: &str, bytes: usize) -> u16 {
    let (ct, body) = form(&[("purpose", "batch")], &[("file", "in.jsonl", "application/jsonl", vec![b'{'; bytes])]);
    client().post(gw.url("/v1/files")).bearer_auth(key).header("content-type", ct).body(body).send().await.unwrap().status().as_u16()
}

#[tokio::test]
async fn a_declared_length_holds_no_spool_and_a_key_holds_at_most_its_share() {
    // 4 MiB of spool, uploads of 1 MiB at most: a key's share is 1 MiB.
    let mock = start_mock();
    let c = format!(
        "limits: {{ max_upload_bytes: 1048576, max_spooled_bytes: 4194304 }}\n{}",
        config(mock.port, free_port(), &mock.url("/mcp"))
    );
    let gw = start_gateway(&c);
    // Six uploads that declare 1 MiB each and send nothing more: nothing is held for them.
    let mut stalled = Vec::new();
    for _ in 0..6 {
        stalled.push(begin_upload(&gw, RPM_KEY, 1 << 20, &form_start()).await);
    }
    assert_eq!(upload_small(&gw, OTHER_KEY, 1000).await, 200, "another tenant's upload is not held off");
    // A key that holds 900 KiB of one upload cannot start another past its share …
    let mut big = form_start();
    big.extend(std::iter::repeat_n(b'x', 900 << 10));
    let _holding = begin_upload(&gw, CLIENT_KEY, 1 << 20, &big).await;
    // Probed until the 900 KiB count (20 s at most); what each probe got is kept for a failure.
    let seen = std::sync::Mutex::new(Vec::new());
    let probed = tokio::time::timeout(std::time::Duration::from_secs(20), async {
        loop {
            let (ct, body) = form(&[("purpose", "batch")], &[("file", "in.jsonl", "application/jsonl", vec![b'{'; 200 << 10])]);
            let status = client()
                .post(gw.url("/v1/files"))
                .bearer_auth(CLIENT_KEY)
                .header("content-type", ct)
                .body(body)
                .send()
                .await
                .map(|r| r.status().as_u16());
            let refused = matches!(status, Ok(503));
            seen.lock().unwrap().push(format!("{status:?}"));
            if refused {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(probed.is_ok(), "timed out waiting for the 900 KiB spooled; the probes got {:?}\n{}", seen.lock().unwrap(), gw.log());
    // … while another key can.
    assert_eq!(upload_small(&gw, OTHER_KEY, 200 << 10).await, 200);
    drop(stalled);
}

#[tokio::test]
async fn a_part_header_past_the_bound_is_refused_before_it_is_held() {
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port, free_port(), &mock.url("/mcp")));
    let mut body = b"--XyZ\r\nContent-Disposition: form-data; name=\"purpose\"\r\nX-Pad: ".to_vec();
    body.extend(std::iter::repeat_n(b'a', 4 << 20));
    body.extend_from_slice(b"\r\n\r\nbatch\r\n--XyZ--\r\n");
    // Refused as soon as the bound is passed: the gateway answers and closes while the client
    // is still sending, so the answer is read from the raw connection.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = begin_upload(&gw, CLIENT_KEY, body.len(), &[]).await;
    let (mut read, mut write) = s.into_split();
    let sender = tokio::spawn(async move {
        let _ = write.write_all(&body).await;
    });
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(20), read.read_to_end(&mut answer)).await;
    sender.abort();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 400") && answer.contains("a part's headers"), "{answer}");
}

#[tokio::test]
async fn a_key_keeps_files_within_its_quota_and_each_file_has_a_lifetime() {
    let mock = start_mock();
    let c =
        format!("limits: {{ max_upload_bytes: 100000, file_quota_bytes: 150000 }}\n{}", config(mock.port, free_port(), &mock.url("/mcp")));
    let gw = start_gateway(&c);
    let upload = |fields: Vec<(&'static str, &'static str)>, bytes: usize| {
        let gw = &gw;
        async move {
            let mut all = vec![("purpose", "user_data")];
            all.extend(fields);
            let (ct, body) = form(&all, &[("file", "f.bin", "application/octet-stream", vec![b'z'; bytes])]);
            let r = client().post(gw.url("/v1/files")).bearer_auth(CLIENT_KEY).header("content-type", ct).body(body).send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let (status, first) = upload(vec![], 90_000).await;
    assert_eq!(status, 200, "{first}");
    let created = first["created_at"].as_u64().unwrap();
    assert_eq!(first["expires_at"].as_u64(), Some(created + 30 * 86_400), "the default lifetime");
    let (status, refused) = upload(vec![], 90_000).await;
    assert_eq!(status, 413, "past the key's quota: {refused}");
    // Another key has a quota of its own.
    let (ct, body) = form(&[("purpose", "user_data")], &[("file", "f.bin", "application/octet-stream", vec![b'z'; 90_000])]);
    let r = client().post(gw.url("/v1/files")).bearer_auth(OTHER_KEY).header("content-type", ct).body(body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    // Deleted, its bytes count no more.
    let id = first["id"].as_str().unwrap();
    let r = client().delete(gw.url(&format!("/v1/files/{id}"))).bearer_auth(CLIENT_KEY).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let (status, short) = upload(vec![("expires_after[anchor]", "created_at"), ("expires_after[seconds]", "3600")], 90_000).await;
    assert_eq!(status, 200, "{short}");
    assert_eq!(short["expires_at"].as_u64(), Some(short["created_at"].as_u64().unwrap() + 3600));
    let (status, bad) = upload(vec![("expires_after[anchor]", "created_at"), ("expires_after[seconds]", "60")], 10).await;
    assert_eq!((status, bad["error"]["param"].as_str()), (400, Some("expires_after[seconds]")));
}
