//! Abusive clients: a body sent too slowly (408, connection closed), more buffered body bytes
//! than the process-wide budget (503 with Retry-After, then served again), and JSON bombs
//! (memory stays proportional to bytes; later requests are served).

use crate::common::*;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Send a request head with `Expect: 100-continue`, wait for the gateway's `100 Continue`
/// (sent once it has checked the request and reserved its body), then send the first `first`
/// bytes of a body of `declared` bytes, without finishing it.
fn start_slow_request(port: u16, tag: &str, declared: usize, first: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).expect("timeout");
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {CLIENT_KEY}\r\nx-test-tag: {tag}\r\n\
         Content-Type: application/json\r\nContent-Length: {declared}\r\nExpect: 100-continue\r\n\r\n"
    )
    .expect("head");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).expect("100 Continue");
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 100"), "{}", String::from_utf8_lossy(&head));
    s.write_all(first).expect("first bytes");
    s
}

/// Read until the peer closes the connection.
fn read_to_close(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    s.read_to_end(&mut out).expect("read until the gateway closes the connection");
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn a_body_sent_too_slowly_is_answered_408_and_the_connection_closed() {
    let mock = start_mock();
    let gw = start_gateway(&format!("body_read_timeout_secs: 1\n{}", standard_config(mock.port)));
    let before = balance(&gw, CLIENT_KEY).await;
    let (port, tag) = (gw.proc.port, format!("slow-{}", std::process::id()));
    let tag_c = tag.clone();
    let answer = tokio::task::spawn_blocking(move || {
        let mut s = start_slow_request(port, &tag_c, 200, br#"{"model":"alpha-5.5","#);
        // One more byte a while later: a trickle does not extend the deadline.
        std::thread::sleep(Duration::from_millis(300));
        let _ = s.write_all(b" ");
        read_to_close(&mut s)
    })
    .await
    .expect("client");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    let body = &answer[answer.find("\r\n\r\n").expect("head") + 4..];
    let v: Value = serde_json::from_str(body).expect("an OpenAI-shaped error");
    assert_eq!(v["error"]["code"], "request_timeout", "{v}");
    // Nothing was relayed, held or billed; the gateway serves the next request.
    assert!(mock_requests(&mock, &tag).await.is_empty());
    assert_eq!(balance(&gw, CLIENT_KEY).await, before);
    assert_eq!(post_chat(&gw, CLIENT_KEY).await.status(), 200);
}

#[tokio::test]
async fn past_the_buffered_body_budget_requests_get_503_with_retry_after_until_room_returns() {
    let mock = start_mock();
    let gw = start_gateway(&format!("max_body_bytes: 65536\nmax_buffered_body_bytes: 65536\n{}", standard_config(mock.port)));
    // A body of 64 KiB being sent holds the whole budget.
    let body =
        serde_json::to_vec(&json!({"model": "alpha-5.5", "messages": [{"role": "user", "content": "x".repeat(65_000)}]})).expect("body");
    let mut pad = body.clone();
    pad.resize(65536, b' ');
    let port = gw.proc.port;
    let (first, rest) = pad.split_at(100);
    let (first, rest) = (first.to_vec(), rest.to_vec());
    let mut slow = tokio::task::spawn_blocking(move || start_slow_request(port, "budget", 65536, &first)).await.expect("slow client");
    let r = post_chat(&gw, CLIENT_KEY).await;
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["error"]["code"], "overloaded", "{v}");
    // The held body completes and is served; its budget comes back.
    let answer = tokio::task::spawn_blocking(move || {
        slow.write_all(&rest).expect("rest of the body");
        let mut buf = [0u8; 12];
        slow.read_exact(&mut buf).expect("status line");
        String::from_utf8_lossy(&buf).into_owned()
    })
    .await
    .expect("slow client");
    assert_eq!(answer, "HTTP/1.1 200");
    assert_eq!(post_chat(&gw, CLIENT_KEY).await.status(), 200);
}

/// Peak resident memory of a process (VmHWM), in KiB.
fn peak_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()).expect("VmHWM")
}

/// `{"model":…, <fields>, "<bomb_field>": [0,0,0,…]}` of about `size` bytes.
fn bomb(prefix: &str, size: usize) -> Vec<u8> {
    let mut b = prefix.as_bytes().to_vec();
    b.push(b'[');
    while b.len() < size {
        b.extend_from_slice(b"0,");
    }
    b.extend_from_slice(b"0]}");
    b
}

#[tokio::test]
async fn six_json_bombs_at_once_stay_proportional_to_their_bytes() {
    let mock = start_mock();
    // A key rich enough for the hold of a 12 MiB prompt.
    const RICH: &str = "sk-rich-test-key-0001";
    let config = with_key(&standard_config(mock.port), &format!("{{ key: {RICH}, name: rich, group: default, balance: 1000.0 }}"));
    let gw = start_gateway(&format!("{config}{}", video_section(mock.port)));
    // Warm up (first requests allocate pools and caches), then take the baseline.
    assert_eq!(post_chat(&gw, CLIENT_KEY).await.status(), 200);
    let pid = gw.proc.child.id();
    let baseline = peak_kib(pid);
    const SIZE: usize = 12 << 20;
    // {"model":…,"metadata":{"Bomb":[0,0,…]}}
    let mut video = bomb(r#"{"model":"genq3-pro","prompt":"p","metadata":{"Bomb":"#, SIZE);
    video.push(b'}');
    let chat = bomb(r#"{"model":"alpha-5.5","stream":true,"messages":[],"bomb":"#, SIZE);
    let c = client();
    let sends = (0..6).map(|i| {
        let (c, url, body) = if i % 2 == 0 {
            (c.clone(), gw.url("/v1/videos"), video.clone())
        } else {
            (c.clone(), gw.url("/v1/chat/completions"), chat.clone())
        };
        async move {
            let r = c.post(url).bearer_auth(RICH).header("content-type", "application/json").body(body).send().await.expect("send");
            let status = r.status().as_u16();
            let text = r.text().await.expect("body");
            (i, status, text)
        }
    });
    let answers = futures_util::future::join_all(sends).await;
    let grown_mib = (peak_kib(pid).saturating_sub(baseline)) / 1024;
    eprintln!("six 12 MiB JSON bombs: peak resident memory +{grown_mib} MiB");
    for (i, status, text) in answers {
        if i % 2 == 0 {
            // The video bomb is refused: too many values in metadata, not expanded into memory.
            assert_eq!(status, 400, "{text}");
            assert!(text.contains("metadata"), "{text}");
        } else {
            // The chat bomb is relayed as bytes (the upstream decides what it means).
            assert_eq!(status, 200, "{}", &text[..text.len().min(300)]);
        }
    }
    assert!(grown_mib < 400, "peak resident memory grew by {grown_mib} MiB for 72 MiB of bombs");
    assert_eq!(post_chat(&gw, CLIENT_KEY).await.status(), 200);
}

/// `/v1/usage` is rate-limited like any call (its summaries run on a blocking thread, one at
/// a time, so a burst of them cannot occupy the threads that relay requests).
#[tokio::test]
async fn usage_queries_are_rate_limited_like_any_call() {
    let mock = start_mock();
    const LIMITED: &str = "sk-limited-test-key-0001";
    let gw = start_gateway(&with_key(
        &standard_config(mock.port),
        &format!("{{ key: {LIMITED}, name: limited, group: default, balance: 5.0, rpm: 3 }}"),
    ));
    let c = client();
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let r = c.get(gw.url("/v1/usage")).bearer_auth(LIMITED).send().await.expect("usage");
        statuses.push((r.status().as_u16(), r.headers().contains_key("retry-after")));
    }
    assert_eq!(statuses, [(200, false), (200, false), (200, false), (429, true)]);
    // Another key is not affected.
    assert_eq!(usage(&gw, CLIENT_KEY).await["object"], "usage");
}
