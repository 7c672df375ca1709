//! Issue 23, tried as an attacker would: the header phase (a header that never ends, one too
//! large, connection caps, idle keep-alive), bills that follow the upstream's (a client that
//! leaves before the usage event, input by reference), overdraft, the admin token and the
//! admin API's Host and Origin, response headers, private files and generate-content's proto
//! field names.

use crate::common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const ADMIN_TOKEN: &str = "admin-token-security-01";

fn with_admin(config: &str, admin_port: u16) -> String {
    format!("{config}admin: {{ listen: 127.0.0.1:{admin_port}, token: {ADMIN_TOKEN} }}\n")
}

async fn metrics(admin_port: u16) -> String {
    admin_metrics(admin_port, ADMIN_TOKEN).await
}

/// Resident memory of a process, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kb * 1024
}

/// Everything the peer sends until it closes the connection (or 30 s pass).
async fn read_to_close(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut out)).await.expect("the gateway closes the connection");
    if let Err(e) = read {
        // A reset after the answer is still an answer read.
        assert!(!out.is_empty() || e.kind() == std::io::ErrorKind::ConnectionReset, "{e}");
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A connection from the loopback address `source` (127.0.0.0/8 all reach the gateway).
async fn connect_from(source: [u8; 4], port: u16) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.bind((std::net::Ipv4Addr::from(source), 0).into()).expect("bind the source address");
    socket.connect(([127, 0, 0, 1], port).into()).await.expect("connect")
}

/// One keep-alive request on `s` (GET /v1/models), read to the end of its answer.
async fn models_request(s: &mut TcpStream) -> String {
    s.write_all(format!("GET /v1/models HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {CLIENT_KEY}\r\n\r\n").as_bytes())
        .await
        .expect("request");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).await.expect("answer head");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap_or(0)))
        .expect("a sized answer");
    let mut body = vec![0u8; length];
    s.read_exact(&mut body).await.expect("answer body");
    head
}

// ------------------------------------------------------------------ 1. the header phase

#[tokio::test]
async fn three_hundred_unfinished_headers_hold_little_memory_are_cut_at_the_deadline_and_real_requests_are_served() {
    let mock = start_mock();
    let gw = start_gateway(&format!("limits: {{ header_timeout_secs: 4, max_connections_per_ip: 1000 }}\n{}", standard_config(mock.port)));
    assert_eq!(post_chat(&gw, CLIENT_KEY).await.status(), 200);
    let idle = rss(gw.proc.child.id());

    // Each: just under the 64 KiB header limit, never finished.
    let pad = "a".repeat(60_000);
    let mut held = Vec::new();
    for _ in 0..300 {
        let mut s = TcpStream::connect(("127.0.0.1", gw.proc.port)).await.expect("connect");
        s.write_all(format!("POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nX-Pad: {pad}").as_bytes()).await.expect("header bytes");
        held.push(s);
    }
    let sent = Instant::now();
    // Meanwhile every legitimate request is served.
    for _ in 0..10 {
        assert_eq!(post_chat(&gw, CLIENT_KEY).await.status(), 200);
    }
    let loaded = rss(gw.proc.child.id());
    let added = loaded.saturating_sub(idle);
    eprintln!("resident memory: idle {} MB, with 300 held headers {} MB (+{} MB)", idle >> 20, loaded >> 20, added >> 20);
    assert!(added < 64 << 20, "300 unfinished headers added {} MB", added >> 20);
    assert!(sent.elapsed() < Duration::from_secs(4), "the memory was measured before the deadline");

    // Each is answered 408 at its deadline (counted from its first byte) and closed.
    let answers = futures_util::future::join_all(held.iter_mut().map(read_to_close)).await;
    for answer in &answers {
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("request_header_timeout"), "{answer}");
    }
    assert_eq!(post_chat(&gw, CLIENT_KEY).await.status(), 200);
}

#[tokio::test]
async fn a_trickled_header_is_cut_at_its_deadline_whatever_arrives_in_between() {
    let mock = start_mock();
    let gw = start_gateway(&format!("limits: {{ header_timeout_secs: 2 }}\n{}", standard_config(mock.port)));
    let mut s = TcpStream::connect(("127.0.0.1", gw.proc.port)).await.expect("connect");
    s.write_all(b"GET /v1/models HTTP/1.1\r\nHost: gw\r\n").await.expect("first line");
    let started = Instant::now();
    // One header line every 250 ms, for up to 40 lines (10 s): never a blank line.
    let mut lines_sent = 0;
    let (mut reader, mut writer) = s.into_split();
    let answer = tokio::spawn(async move {
        let mut out = Vec::new();
        let _ = reader.read_to_end(&mut out).await;
        String::from_utf8_lossy(&out).into_owned()
    });
    while lines_sent < 40 && !answer.is_finished() {
        if writer.write_all(format!("X-Line-{lines_sent}: still coming\r\n").as_bytes()).await.is_err() {
            break;
        }
        lines_sent += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let answer = answer.await.expect("reader");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(lines_sent < 40, "the trickle ran its whole course ({:?}): no deadline", started.elapsed());
}

#[tokio::test]
async fn an_oversized_header_gets_431_and_a_large_legal_one_is_served() {
    let mock = start_mock();
    let gw = start_gateway(&standard_config(mock.port));
    let mut s = TcpStream::connect(("127.0.0.1", gw.proc.port)).await.expect("connect");
    let pad = "b".repeat(70_000);
    s.write_all(format!("GET /v1/models HTTP/1.1\r\nHost: gw\r\nX-Pad: {pad}\r\n\r\n").as_bytes()).await.expect("write");
    let answer = read_to_close(&mut s).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{}", &answer[..answer.len().min(200)]);
    let body: Value = serde_json::from_str(&answer[answer.find("\r\n\r\n").expect("head") + 4..]).expect("json error");
    assert_eq!(body["error"]["code"], "request_header_too_large");

    let r = client().get(gw.url("/v1/models")).bearer_auth(CLIENT_KEY).header("x-pad", "c".repeat(60_000)).send().await.expect("send");
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn connections_past_the_caps_are_closed_at_once_and_counted() {
    let mock = start_mock();
    let admin_port = free_port();
    let gw = start_gateway(&with_admin(
        &format!("limits: {{ max_connections: 6, max_connections_per_ip: 4 }}\n{}", standard_config(mock.port)),
        admin_port,
    ));
    let port = gw.proc.port;
    // Four kept-alive connections from 127.0.0.1, each served once.
    let mut from_one = Vec::new();
    for _ in 0..4 {
        let mut s = connect_from([127, 0, 0, 1], port).await;
        assert!(models_request(&mut s).await.starts_with("HTTP/1.1 200"));
        from_one.push(s);
    }
    // A fifth from the same address: closed without an answer.
    let mut fifth = connect_from([127, 0, 0, 1], port).await;
    let _ = fifth.write_all(format!("GET /v1/models HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {CLIENT_KEY}\r\n\r\n").as_bytes()).await;
    assert_eq!(read_to_close(&mut fifth).await, "", "refused per address");
    // Two more from another address fill the overall cap; a third address is refused.
    let mut from_two = Vec::new();
    for _ in 0..2 {
        let mut s = connect_from([127, 0, 0, 2], port).await;
        assert!(models_request(&mut s).await.starts_with("HTTP/1.1 200"));
        from_two.push(s);
    }
    let mut over = connect_from([127, 0, 0, 3], port).await;
    assert_eq!(read_to_close(&mut over).await, "", "refused overall");
    let m = metrics(admin_port).await;
    assert_eq!(metric(&m, "tollgate_connections_refused_total{reason=\"max_connections_per_ip\"}"), 1.0, "{m}");
    assert_eq!(metric(&m, "tollgate_connections_refused_total{reason=\"max_connections\"}"), 1.0, "{m}");
    assert_eq!(metric(&m, "tollgate_client_connections"), 6.0, "{m}");

    // A closed connection gives its place back.
    drop(from_one.pop());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut s = connect_from([127, 0, 0, 1], port).await;
        let _ = s
            .write_all(
                format!("GET /v1/models HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {CLIENT_KEY}\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .await;
        let answer = read_to_close(&mut s).await;
        if answer.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(Instant::now() < deadline, "the place of the closed connection never came back");
    }
}

#[tokio::test]
async fn an_idle_keepalive_connection_is_closed_after_its_timeout() {
    let mock = start_mock();
    let gw = start_gateway(&format!("limits: {{ keepalive_timeout_secs: 1 }}\n{}", standard_config(mock.port)));
    let mut s = TcpStream::connect(("127.0.0.1", gw.proc.port)).await.expect("connect");
    assert!(models_request(&mut s).await.starts_with("HTTP/1.1 200"));
    let idle = Instant::now();
    assert_eq!(read_to_close(&mut s).await, "", "closed without another answer");
    assert!(idle.elapsed() < Duration::from_secs(30));
    // A connection that never sends a byte is closed the same way.
    let mut silent = TcpStream::connect(("127.0.0.1", gw.proc.port)).await.expect("connect");
    assert_eq!(read_to_close(&mut silent).await, "");
}

// ------------------------------------------------------------------ 2. bills follow the upstream's

#[tokio::test]
async fn a_client_that_leaves_before_the_usage_event_is_billed_what_the_upstream_reports() {
    let mock = start_mock();
    let admin_port = free_port();
    let gw = start_gateway(&with_admin(&standard_config(mock.port), admin_port));
    let before = balance(&gw, CLIENT_KEY).await;
    // 200,000 input tokens the body does not show (as a long stored conversation costs).
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(CLIENT_KEY)
        .header("x-mock-usage", "200000,40")
        .header("x-mock-deltas", "40")
        .header("x-mock-interval-ms", "50")
        .json(&json!({"model": "alpha-5.5", "stream": true, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
    let mut stream = r.bytes_stream();
    let first = futures_util::StreamExt::next(&mut stream).await.expect("a first event").expect("bytes");
    assert!(!first.is_empty());
    drop(stream); // the client goes away long before the usage chunk

    let u = wait_requests(&gw, CLIENT_KEY, 1).await;
    assert_eq!(u["total"]["input_tokens"], 200_000, "{u}");
    assert_eq!(u["total"]["output_tokens"], 40, "{u}");
    assert_eq!(before - balance(&gw, CLIENT_KEY).await, cost_nanos("alpha-5.5", 200_000, 40));
    let m = metrics(admin_port).await;
    assert_eq!(metric(&m, "tollgate_drained_responses_total{outcome=\"complete\"}"), 1.0, "the rest was read after the client left: {m}");
    assert_eq!(metric(&m, "tollgate_estimated_bills_total{model=\"alpha-5.5\"}"), 0.0, "{m}");
}

#[tokio::test]
async fn an_answer_without_usage_is_billed_its_input_by_reference_fail_closed() {
    let mock = start_mock();
    let gw = start_gateway(&format!("billing: {{ image_input_tokens: 3000 }}\n{}", standard_config(mock.port)));
    // Two images by URL: their tokens are nowhere in the body.
    let body = json!({"model": "alpha-5.5", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "compare"},
        {"type": "image_url", "image_url": {"url": "https://example.invalid/a.png"}},
        {"type": "image_url", "image_url": {"url": "https://example.invalid/b.png"}}]}]});
    let len = serde_json::to_vec(&body).expect("json").len() as u64;
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(CLIENT_KEY)
        .header("x-mock-no-usage", "1")
        .json(&body)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
    r.bytes().await.expect("body");
    let u = wait_requests(&gw, CLIENT_KEY, 1).await;
    assert_eq!(u["total"]["input_tokens"].as_u64(), Some(len.div_ceil(3) + 2 * 3000), "{u}");
}

// ------------------------------------------------------------------ 3. overdraft

#[tokio::test]
async fn a_continued_conversation_is_held_at_its_size_so_concurrent_turns_cannot_overdraw() {
    let mock = start_mock();
    let admin_port = free_port();
    let key = "sk-client-small-balance-0001";
    let gw = start_gateway(&with_admin(
        &with_key(&standard_config(mock.port), &format!("{{ key: {key}, name: small, group: default, balance: 1.0 }}")),
        admin_port,
    ));
    // A stored response whose conversation is 200,000 input tokens (+10 output).
    let first: Value = client()
        .post(gw.url("/v1/responses"))
        .bearer_auth(key)
        .header("x-mock-usage", "200000,10")
        .json(&json!({"model": "alpha-5.5", "input": "hi"}))
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    let id = first["id"].as_str().expect("id").to_string();
    let after_first = balance(&gw, key).await;
    assert_eq!(nanos(&json!(1.0)) - after_first, cost_nanos("alpha-5.5", 200_000, 10));

    // 20 turns at once continuing it, each asking for one output token; each really costs the
    // whole conversation again.
    let turns = (0..20).map(|_| {
        let url = gw.url("/v1/responses");
        let id = id.clone();
        async move {
            client()
                .post(url)
                .bearer_auth(key)
                .header("x-mock-usage", "200000,1")
                .json(&json!({"model": "alpha-5.5", "input": "more", "previous_response_id": id, "max_output_tokens": 1}))
                .send()
                .await
                .expect("send")
                .status()
                .as_u16()
        }
    });
    let statuses = futures_util::future::join_all(turns).await;
    let served = statuses.iter().filter(|s| **s == 200).count();
    assert!(statuses.iter().all(|s| *s == 200 || *s == 402), "{statuses:?}");
    // $0.60 left holds one turn of ~$0.40 at a time: at most one is admitted.
    assert_eq!(served, 1, "{statuses:?}");
    let end = balance(&gw, key).await;
    assert!(end >= 0, "the balance went negative: {end}");
    assert_eq!(after_first - end, cost_nanos("alpha-5.5", 200_000, 1));

    // A key pushed below zero (an estimate the upstream exceeded, an admin correction) is
    // refused everything billed or not until topped up.
    let patch = client()
        .patch(format!("http://127.0.0.1:{admin_port}/admin/keys/{}", key_id(admin_port, "small").await))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"balance_delta": -1.0}))
        .send()
        .await
        .expect("patch");
    assert_eq!(patch.status(), 200);
    let r = client()
        .post(gw.url("/v1/messages/count_tokens"))
        .bearer_auth(key)
        .json(&json!({"model": "beta-opus-4-7", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 402, "an unbilled call of a key in debt");
    assert_eq!(post_chat(&gw, key).await.status(), 402);
}

async fn key_id(admin_port: u16, name: &str) -> String {
    let keys: Value = client()
        .get(format!("http://127.0.0.1:{admin_port}/admin/keys"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("keys")
        .json()
        .await
        .expect("json");
    let list = keys["data"].as_array().expect("a key list").clone();
    list.iter().find(|k| k["name"] == name).and_then(|k| k["id"].as_str()).expect("the key").to_string()
}

// ------------------------------------------------------------------ 4. the admin token and API

#[test]
fn a_placeholder_admin_token_is_refused_by_t_and_at_start() {
    let (dir, path, _) = write_config(&format!(
        "{}admin: {{ listen: 127.0.0.1:{}, token: change-me-to-a-long-random-secret }}\n",
        standard_config(1),
        free_port()
    ));
    let (code, out) = run_tollgate(&["-t", "-c", path.to_str().expect("path")], &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("admin.token: this is a placeholder"), "{out}");
    let (code, out) = run_tollgate(&["-c", path.to_str().expect("path")], &[]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("placeholder"), "{out}");
    drop(dir);
    // The bundled configurations carry no token of their own.
    for bundled in ["conf/tollgate.yaml", "conf/demo.yaml"] {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/").to_string() + bundled).expect("bundled config");
        assert!(text.contains("token_env: TOLLGATE_ADMIN_TOKEN"), "{bundled}");
        assert!(!text.lines().any(|l| l.trim_start().starts_with("token:")), "{bundled} has a literal token");
    }
}

/// Issue 46, point 7: a token the configuration does not set is generated once into
/// `data_dir/admin-token` (0600) and kept across restarts; the log names the file and the
/// missing variable, never the token.
#[tokio::test]
async fn an_unset_admin_token_is_generated_into_a_private_file_never_into_the_log() {
    use std::os::unix::fs::PermissionsExt;
    let mock = start_mock();
    let admin_port = free_port();
    let mut gw = start_gateway_logged(&format!(
        "{}admin: {{ listen: 127.0.0.1:{admin_port}, token_env: TOLLGATE_TEST_UNSET_TOKEN_VAR }}\nlog: {{ format: json }}\n",
        standard_config(mock.port)
    ));
    let url = format!("http://127.0.0.1:{admin_port}/admin/keys");
    let file = gw.dir.path().join("data").join("admin-token");
    let token = std::fs::read_to_string(&file).expect("the token file").trim().to_string();
    assert!(token.len() >= 32, "{token}");
    assert_eq!(std::fs::metadata(&file).expect("meta").permissions().mode() & 0o777, 0o600);
    assert_eq!(client().get(&url).bearer_auth(&token).send().await.expect("keys").status(), 200);
    assert_eq!(client().get(&url).bearer_auth("admin-token-security-01").send().await.expect("keys").status(), 401);
    let log = gw.log();
    assert!(log.contains("TOLLGATE_TEST_UNSET_TOKEN_VAR, which is not set") && log.contains("admin-token"), "{log}");
    // A restart keeps it (and says where it is).
    gw.signal("TERM");
    wait_exit(&mut gw.proc.child, Duration::from_secs(20), "the gateway").await;
    gw.start_again();
    assert_eq!(client().get(&url).bearer_auth(&token).send().await.expect("keys").status(), 200);
    assert_eq!(std::fs::read_to_string(&file).expect("file").trim(), token);
    assert!(!gw.log().contains(&token), "the token is in the log");
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[tokio::test]
async fn the_admin_api_refuses_a_rebound_host_and_a_foreign_origin() {
    let mock = start_mock();
    let admin_port = free_port();
    let gw = start_gateway(&with_admin(&standard_config(mock.port), admin_port));
    let url = format!("http://127.0.0.1:{admin_port}/admin/keys");
    let mint = json!({"name": "evil", "group": "default", "balance": 1000000.0});
    let rebound = client()
        .post(&url)
        .bearer_auth(ADMIN_TOKEN)
        .header("host", format!("rebind.evil.example:{admin_port}"))
        .json(&mint)
        .send()
        .await
        .expect("post");
    assert_eq!(rebound.status(), 403);
    let foreign =
        client().post(&url).bearer_auth(ADMIN_TOKEN).header("origin", "http://rebind.evil.example").json(&mint).send().await.expect("post");
    assert_eq!(foreign.status(), 403);
    let keys: Value = client().get(&url).bearer_auth(ADMIN_TOKEN).send().await.expect("keys").json().await.expect("json");
    assert!(!keys.to_string().contains("\"evil\""), "a key was minted: {keys}");
    // Its own origin and a localhost Host are answered.
    let own = client()
        .get(&url)
        .bearer_auth(ADMIN_TOKEN)
        .header("host", format!("localhost:{admin_port}"))
        .header("origin", format!("http://localhost:{admin_port}"))
        .send()
        .await
        .expect("get");
    assert_eq!(own.status(), 200);
    // The console's pages, served by the same listener, refuse them alike.
    let login = format!("http://127.0.0.1:{admin_port}/console/login");
    let rebound = client().get(&login).header("host", format!("rebind.evil.example:{admin_port}")).send().await.expect("get");
    assert_eq!(rebound.status(), 403);
    let foreign = client()
        .post(&login)
        .header("origin", "http://rebind.evil.example")
        .form(&[("token", ADMIN_TOKEN), ("next", "/console")])
        .send()
        .await
        .expect("post");
    assert_eq!(foreign.status(), 403);
    assert!(foreign.headers().get("set-cookie").is_none(), "a foreign page signed in");
    let own = client().get(&login).header("host", format!("localhost:{admin_port}")).send().await.expect("get");
    assert_eq!(own.status(), 200);
    drop(gw);
}

// ------------------------------------------------------------------ 5. response headers

#[tokio::test]
async fn the_operators_account_headers_never_reach_a_client() {
    let mock = start_mock();
    let gw = start_gateway(&standard_config(mock.port));
    let account = [
        "openai-organization",
        "openai-project",
        "x-ratelimit-remaining-requests",
        "anthropic-ratelimit-tokens-remaining",
        "anthropic-organization-id",
        "set-cookie",
        "x-envoy-upstream-service-time",
    ];
    let chat = post_chat(&gw, CLIENT_KEY).await;
    assert_eq!(chat.status(), 200);
    for name in account {
        assert!(chat.headers().get(name).is_none(), "{name} reached the client");
    }
    for name in ["x-request-id", "openai-processing-ms", "x-should-retry", "content-type"] {
        assert!(chat.headers().get(name).is_some(), "{name} is what SDKs read");
    }
    let stream = client()
        .post(gw.url("/v1/messages"))
        .bearer_auth(CLIENT_KEY)
        .json(&json!({"model": "beta-opus-4-7", "max_tokens": 8, "stream": true, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("send");
    assert_eq!(stream.status(), 200);
    for name in account {
        assert!(stream.headers().get(name).is_none(), "{name} reached a messages client");
    }
    assert!(stream.headers().get("request-id").is_some());
    // An error answer is filtered too.
    let failed = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(CLIENT_KEY)
        .header("x-mock-status", "400")
        .json(&json!({"model": "alpha-5.5", "messages": []}))
        .send()
        .await
        .expect("send");
    assert_eq!(failed.status(), 400);
    assert!(failed.headers().get("set-cookie").is_none() && failed.headers().get("openai-organization").is_none());

    // The operator may relay more.
    let mock2 = start_mock();
    let gw2 = start_gateway(&format!("forward_response_headers: [\"x-ratelimit-*\"]\n{}", standard_config(mock2.port)));
    let chat = post_chat(&gw2, CLIENT_KEY).await;
    assert!(chat.headers().get("x-ratelimit-remaining-requests").is_some());
    assert!(chat.headers().get("openai-organization").is_none());
}

// ------------------------------------------------------------------ 7. private files

#[tokio::test]
async fn the_database_is_private_and_short_configured_keys_are_warned_about() {
    use std::os::unix::fs::PermissionsExt;
    let mock = start_mock();
    let gw = start_gateway_logged(&standard_config(mock.port));
    assert_eq!(post_chat(&gw, CLIENT_KEY).await.status(), 200);
    let data = gw.dir.path().join("data");
    assert_eq!(std::fs::metadata(&data).expect("data dir").permissions().mode() & 0o777, 0o700);
    let files = walk(&data);
    assert!(!files.is_empty());
    for f in files {
        let mode = std::fs::metadata(&f).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode & 0o077, 0, "{} is {mode:o}", f.display());
    }
    let log = gw.log();
    assert!(log.contains("keys[0] (tester): shorter than 32 characters"), "{log}");

    // An existing world-readable directory is tightened at start.
    let mut gw = gw;
    gw.kill_hard();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    gw.start_again();
    assert_eq!(std::fs::metadata(&data).expect("data dir").permissions().mode() & 0o777, 0o700);
    let unit = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/systemd/tollgate.service")).expect("unit");
    assert!(unit.lines().any(|l| l.trim() == "UMask=0077"));
}

// ------------------------------------------------------------------ 8. generate-content's proto names

#[tokio::test]
async fn generate_content_proto_field_names_are_held_like_the_json_ones() {
    let mock = start_mock();
    let key = "sk-client-gamma-small-0001";
    let gw =
        start_gateway(&with_key(&standard_config(mock.port), &format!("{{ key: {key}, name: gsmall, group: default, balance: 0.1 }}")));
    let url = gw.url("/v1beta/models/gamma-3.5-flash:generateContent");
    let contents = json!([{"role": "user", "parts": [{"text": "hi"}]}]);
    // 4 × 100,000 output tokens at $1.5/M = $0.60 > $0.10, in either spelling.
    for config in [
        json!({"contents": contents, "generationConfig": {"candidateCount": 4, "maxOutputTokens": 100000}}),
        json!({"contents": contents, "generation_config": {"candidate_count": 4, "max_output_tokens": 100000}}),
    ] {
        let r = client().post(&url).header("x-goog-api-key", key).json(&config).send().await.expect("send");
        assert_eq!(r.status(), 402, "{config}");
    }
    // The output-limit check reads both spellings too (more than 128 candidates).
    let r = client()
        .post(&url)
        .header("x-goog-api-key", key)
        .json(&json!({"contents": contents, "generation_config": {"candidate_count": 500}}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 400);
    let small = json!({"contents": contents, "generation_config": {"max_output_tokens": 16}});
    assert_eq!(client().post(&url).header("x-goog-api-key", key).json(&small).send().await.expect("send").status(), 200);
}

// ------------------------------------------------------------------ 6. video reads

#[tokio::test]
async fn video_reads_are_rate_limited_like_every_call() {
    let mock = start_mock();
    let admin_port = free_port();
    let key = "sk-client-video-limited-0001";
    let base = with_key(&standard_config(mock.port), &format!("{{ key: {key}, name: vlimited, group: default, balance: 5.0 }}"));
    let gw = start_gateway(&format!("{}{}", with_admin(&base, admin_port), video_section(mock.port)));
    let created: Value = client()
        .post(gw.url("/v1/videos"))
        .bearer_auth(key)
        .json(&json!({"model": "genq3-pro", "prompt": "a limited read", "duration": "5"}))
        .send()
        .await
        .expect("create")
        .json()
        .await
        .expect("json");
    let id = created["id"].as_str().expect("id").to_string();
    poll_task(&gw, key, &id, |t| t["status"] == "completed").await;
    let first = client().get(gw.url(&format!("/v1/videos/{id}/content"))).bearer_auth(key).send().await.expect("content");
    assert_eq!(first.status(), 200);

    // Now two requests a minute: 40 downloads at once get two answers at most, the rest 429.
    let patch = client()
        .patch(format!("http://127.0.0.1:{admin_port}/admin/keys/{}", key_id(admin_port, "vlimited").await))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"rpm": 2}))
        .send()
        .await
        .expect("patch");
    assert_eq!(patch.status(), 200);
    let downloads = (0..40).map(|_| {
        let url = gw.url(&format!("/v1/videos/{id}/content"));
        async move {
            let r = client().get(url).bearer_auth(key).send().await.expect("content");
            let status = r.status().as_u16();
            let retry_after = r.headers().contains_key("retry-after");
            let _ = r.bytes().await;
            (status, retry_after)
        }
    });
    let outcomes = futures_util::future::join_all(downloads).await;
    let served = outcomes.iter().filter(|(s, _)| *s == 200).count();
    let limited = outcomes.iter().filter(|(s, r)| *s == 429 && *r).count();
    assert!(served <= 2, "{outcomes:?}");
    assert_eq!(served + limited, 40, "{outcomes:?}");
    let (status, _) = {
        let r = client().get(gw.url(&format!("/v1/videos/{id}"))).bearer_auth(key).send().await.expect("get");
        (r.status().as_u16(), ())
    };
    assert_eq!(status, 429, "a task read is limited too");
}
