//! board-mock: the upstream of the public board's method (onthebench.ai, `GetBusbar/benchmarking`),
//! written here for tollgate's benches (issue 71).
//!
//! board-mock ADDR [--delay-ms D] [--chunks N] [--interval-ms I] [--threads T]
//!
//! Answers every `POST` (any path) on kept-alive HTTP/1.1 connections. A body with
//! `"stream":true` gets an OpenAI chat-completions SSE stream: a role chunk and the first content
//! delta at once, N content deltas in all I ms apart, then a finish chunk with usage and
//! `[DONE]`. Any other body gets one chat completion with usage after D ms. Credentials are not
//! checked: every gateway measured sends its own.

use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Clone, Copy)]
struct Shape {
    delay: Duration,
    chunks: u32,
    interval: Duration,
}

const WHOLE: &str = r#"{"id":"chatcmpl-board","object":"chat.completion","created":1700000000,"model":"alpha","choices":[{"index":0,"message":{"role":"assistant","content":"Hello from the board's mock."},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":7,"total_tokens":19}}"#;
const ROLE: &str = r#"{"id":"chatcmpl-board","object":"chat.completion.chunk","created":1700000000,"model":"alpha","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}"#;
const DELTA: &str = r#"{"id":"chatcmpl-board","object":"chat.completion.chunk","created":1700000000,"model":"alpha","choices":[{"index":0,"delta":{"content":"token "},"finish_reason":null}]}"#;
const FINISH: &str = r#"{"id":"chatcmpl-board","object":"chat.completion.chunk","created":1700000000,"model":"alpha","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":64,"total_tokens":76}}"#;

fn flag(args: &[String], name: &str) -> Option<u64> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(addr) = args.get(1).cloned() else {
        eprintln!("usage: board-mock ADDR [--delay-ms D] [--chunks N] [--interval-ms I] [--threads T]");
        std::process::exit(2);
    };
    let shape = Shape {
        delay: Duration::from_millis(flag(&args, "--delay-ms").unwrap_or(0)),
        chunks: flag(&args, "--chunks").unwrap_or(64) as u32,
        interval: Duration::from_millis(flag(&args, "--interval-ms").unwrap_or(20)),
    };
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let Some(t) = flag(&args, "--threads") {
        rt.worker_threads(t.max(1) as usize);
    }
    let Ok(rt) = rt.enable_all().build() else {
        eprintln!("board-mock: no runtime");
        std::process::exit(1);
    };
    rt.block_on(async move {
        let listener = match TcpListener::bind(&addr).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("board-mock: {addr}: {e}");
                std::process::exit(1);
            }
        };
        loop {
            if let Ok((conn, _)) = listener.accept().await {
                let _ = conn.set_nodelay(true);
                tokio::spawn(serve(conn, shape));
            }
        }
    });
}

/// One connection's requests, one after another, until the peer closes or sends what is not
/// a request this mock reads.
async fn serve(mut conn: TcpStream, shape: Shape) {
    let mut buf: Vec<u8> = Vec::with_capacity(8192);
    loop {
        let Some((head_end, body_len, close)) = read_head(&mut conn, &mut buf).await else { return };
        while buf.len() < head_end + body_len {
            let mut chunk = [0u8; 8192];
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let body = &buf[head_end..head_end + body_len];
        let streamed = find(body, b"\"stream\":true").is_some() || find(body, b"\"stream\": true").is_some();
        let ok = if streamed { stream(&mut conn, shape).await } else { whole(&mut conn, shape, close).await };
        buf.drain(..head_end + body_len);
        if !ok || close {
            return;
        }
    }
}

/// Reads until the request's head is in `buf`: where the body starts, its length, and whether
/// the client asked to close.
async fn read_head(conn: &mut TcpStream, buf: &mut Vec<u8>) -> Option<(usize, usize, bool)> {
    loop {
        if let Some(end) = find(buf, b"\r\n\r\n") {
            let head = std::str::from_utf8(&buf[..end]).ok()?.to_ascii_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            let close = head.lines().any(|l| l.starts_with("connection:") && l.contains("close"));
            return Some((end + 4, len, close));
        }
        if buf.len() > 64 * 1024 {
            return None;
        }
        let mut chunk = [0u8; 8192];
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

async fn whole(conn: &mut TcpStream, shape: Shape, close: bool) -> bool {
    if !shape.delay.is_zero() {
        tokio::time::sleep(shape.delay).await;
    }
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{}\r\n",
        WHOLE.len(),
        if close { "connection: close\r\n" } else { "" }
    );
    let mut out = Vec::with_capacity(head.len() + WHOLE.len());
    out.extend_from_slice(head.as_bytes());
    out.extend_from_slice(WHOLE.as_bytes());
    conn.write_all(&out).await.is_ok()
}

/// One SSE event as an HTTP/1.1 chunk.
fn chunk(out: &mut Vec<u8>, data: &str) {
    let event = format!("data: {data}\n\n");
    out.extend_from_slice(format!("{:X}\r\n", event.len()).as_bytes());
    out.extend_from_slice(event.as_bytes());
    out.extend_from_slice(b"\r\n");
}

async fn stream(conn: &mut TcpStream, shape: Shape) -> bool {
    let mut out = Vec::with_capacity(1024);
    out.extend_from_slice(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n");
    chunk(&mut out, ROLE);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + shape.interval, shape.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    for i in 0..shape.chunks {
        if i > 0 {
            tick.tick().await;
        }
        chunk(&mut out, DELTA);
        if i + 1 == shape.chunks {
            chunk(&mut out, FINISH);
            chunk(&mut out, "[DONE]");
            out.extend_from_slice(b"0\r\n\r\n");
        }
        if conn.write_all(&out).await.is_err() {
            return false;
        }
        out.clear();
    }
    if shape.chunks == 0 {
        chunk(&mut out, FINISH);
        chunk(&mut out, "[DONE]");
        out.extend_from_slice(b"0\r\n\r\n");
        return conn.write_all(&out).await.is_ok();
    }
    true
}
