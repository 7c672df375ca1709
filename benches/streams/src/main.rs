//! streams-client: holds many slow SSE streams open through a proxy at once and reports what
//! they cost it (issue 53). One process, one thread: each stream is a task with a 2 KiB read
//! buffer, so 100,000 of them fit in a few hundred MiB here while the proxy holds its share.
//!
//! streams-client ADDR STREAMS [--pid PID] [--path P] [--key K] [--deltas D] [--interval-ms I]
//!                [--sources N] [--batch B] [--batch-gap-ms G] [--concurrency C] [--stall-ms S] [--header H] [--pause-ms P]
//!
//! Every stream is a `POST` of a streamed chat completion with `x-mock-deltas: D` and
//! `x-mock-interval-ms: I` (tollgate-mock trickles D events I ms apart). Streams start in
//! batches of B at once (1,000: the first batch's simultaneous starts are the ones whose time to
//! first event is reported; later batches follow every G ms, 50); the memory per stream holds
//! only when `ended_before_sample` is 0 (streams outlast the ramp);
//! with `--sources N` they leave from 127.0.0.1 … 127.0.0.N, so more than one source port range
//! of streams can be open. With `--pid`, the proxy's resident memory is read before and while
//! every stream is open, and its CPU time across the run. With `--concurrency C` the streams run
//! C at a time instead (each of C workers starts its next stream when the last ends), and every
//! stream's time to first event is reported. A stream *stalls* when a gap between its events
//! exceeds `--stall-ms` (default twice the interval) or it ends without `[DONE]` (or a messages
//! stream's `message_stop`): `stalled`
//! counts them (the public board's rule for a stall-free stream). Prints one JSON object.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Args {
    addr: std::net::SocketAddr,
    streams: usize,
    pid: Option<u32>,
    path: String,
    key: String,
    deltas: u32,
    interval_ms: u64,
    sources: u8,
    batch: usize,
    batch_gap_ms: u64,
    concurrency: Option<usize>,
    stall_us: u32,
    /// `--header 'Name: value'`, any number: sent with every stream (a peer gateway's routing).
    headers: String,
    /// `--pause-ms P`: each worker waits P ms between its streams.
    pause_ms: u64,
}

fn args() -> Args {
    let a: Vec<String> = std::env::args().collect();
    let flag = |name: &str| a.iter().position(|x| x == name).and_then(|i| a.get(i + 1)).cloned();
    let (Some(addr), Some(streams)) = (a.get(1).and_then(|s| s.parse().ok()), a.get(2).and_then(|s| s.parse().ok())) else {
        eprintln!("usage: streams-client ADDR STREAMS [--pid PID] [--path P] [--key K] [--deltas D] [--interval-ms I] [--sources N] [--batch B] [--batch-gap-ms G] [--concurrency C] [--stall-ms S] [--header H] [--pause-ms P]");
        std::process::exit(2);
    };
    Args {
        addr,
        streams,
        pid: flag("--pid").and_then(|p| p.parse().ok()),
        path: flag("--path").unwrap_or_else(|| "/v1/chat/completions".into()),
        key: flag("--key").unwrap_or_default(),
        deltas: flag("--deltas").and_then(|d| d.parse().ok()).unwrap_or(20),
        interval_ms: flag("--interval-ms").and_then(|d| d.parse().ok()).unwrap_or(100),
        sources: flag("--sources").and_then(|d| d.parse().ok()).unwrap_or(1).max(1),
        batch: flag("--batch").and_then(|d| d.parse().ok()).unwrap_or(1000).max(1),
        batch_gap_ms: flag("--batch-gap-ms").and_then(|d| d.parse().ok()).unwrap_or(50),
        headers: a
            .windows(2)
            .filter(|w| w[0] == "--header")
            .map(|w| format!("{}\r\n", w[1].replace(['\r', '\n'], "")))
            .collect(),
        pause_ms: flag("--pause-ms").and_then(|d| d.parse().ok()).unwrap_or(0),
        concurrency: flag("--concurrency").and_then(|d| d.parse().ok()).filter(|c| *c > 0),
        stall_us: flag("--stall-ms")
            .and_then(|d| d.parse::<u32>().ok())
            .map_or_else(
                || {
                    let interval = flag("--interval-ms").and_then(|d| d.parse::<u32>().ok()).unwrap_or(100);
                    interval.saturating_mul(2000)
                },
                |ms| ms.saturating_mul(1000),
            ),
    }
}

/// The proxy's resident memory (KiB) and CPU time (user + system, in clock ticks).
fn proc_stat(pid: u32) -> (u64, u64) {
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .unwrap_or(0);
    let cpu = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let f: Vec<&str> = s.rsplit_once(')')?.1.split_whitespace().collect();
            Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
        })
        .unwrap_or(0);
    (rss, cpu)
}

/// What one stream saw: its time to first event, the gaps between later reads carrying events
/// (µs), and its events.
struct Seen {
    first_us: Option<u32>,
    gaps_us: Vec<u32>,
    events: u32,
    done: bool,
}

/// `started` counts the streams that got their first event or ended without one (so no wait
/// for the rest of a batch hangs on a stream that failed); `ended` the streams over.
async fn one(a: Arc<Args>, i: usize, started: Arc<AtomicUsize>, ended: Arc<AtomicUsize>) -> Seen {
    let seen = stream(&a, i, &started).await;
    if seen.first_us.is_none() {
        started.fetch_add(1, Ordering::Relaxed);
    }
    ended.fetch_add(1, Ordering::Relaxed);
    seen
}

async fn stream(a: &Args, i: usize, started: &AtomicUsize) -> Seen {
    let mut seen = Seen { first_us: None, gaps_us: Vec::new(), events: 0, done: false };
    let t0 = Instant::now();
    let Ok(sock) = tokio::net::TcpSocket::new_v4() else { return seen };
    let source = std::net::Ipv4Addr::new(127, 0, 0, 1 + (i % a.sources as usize) as u8);
    if sock.bind((source, 0).into()).is_err() {
        return seen;
    }
    let Ok(mut conn) = sock.connect(a.addr).await else { return seen };
    let body = r#"{"model":"alpha-5.5","stream":true,"max_tokens":64,"messages":[{"role":"user","content":"hold"}]}"#;
    let req = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nx-mock-deltas: {}\r\nx-mock-interval-ms: {}\r\n{}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        a.path,
        a.addr,
        a.key,
        a.deltas,
        a.interval_ms,
        a.headers,
        body.len()
    );
    if conn.write_all(req.as_bytes()).await.is_err() {
        return seen;
    }
    let mut buf = [0u8; 2048];
    let mut last = Instant::now();
    loop {
        let n = match conn.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let now = Instant::now();
        let chunk = &buf[..n];
        let events = chunk.windows(5).filter(|w| w == b"data:").count() as u32;
        if events > 0 {
            match seen.first_us {
                None => {
                    seen.first_us = Some(now.duration_since(t0).as_micros().min(u32::MAX as u128) as u32);
                    started.fetch_add(1, Ordering::Relaxed);
                }
                Some(_) => seen.gaps_us.push(now.duration_since(last).as_micros().min(u32::MAX as u128) as u32),
            }
            last = now;
            seen.events += events;
        }
        // Chat completions ends with `[DONE]`, the messages protocol with `message_stop`.
        if chunk.windows(6).any(|w| w == b"[DONE]") || chunk.windows(12).any(|w| w == b"message_stop") {
            seen.done = true;
        }
    }
    seen
}

fn pct(v: &mut [u32], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_unstable();
    v[((v.len() - 1) as f64 * q).round() as usize] as f64 / 1000.0
}

/// `--concurrency C`: C workers, each starting its next stream when the last ends, until every
/// stream has run; every stream's time to first event counts.
async fn closed_loop(a: Arc<Args>, c: usize) -> Vec<Seen> {
    let next = Arc::new(AtomicUsize::new(0));
    let (started, ended) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let workers: Vec<_> = (0..c.min(a.streams))
        .map(|_| {
            let (a, next, started, ended) = (a.clone(), next.clone(), started.clone(), ended.clone());
            tokio::spawn(async move {
                let mut seen = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= a.streams {
                        break seen;
                    }
                    seen.push(one(a.clone(), i, started.clone(), ended.clone()).await);
                    if a.pause_ms > 0 {
                        tokio::time::sleep(Duration::from_millis(a.pause_ms)).await;
                    }
                }
            })
        })
        .collect();
    let mut all = Vec::with_capacity(a.streams);
    for w in workers {
        all.extend(w.await.unwrap_or_default());
    }
    all
}

/// `--concurrency C`: every stream's time to first event, the gaps, the stalls and the proxy's
/// CPU per event, as one JSON object.
async fn closed_loop_report(a: Arc<Args>, c: usize) {
    let t0 = Instant::now();
    let (_, cpu0) = a.pid.map_or((0, 0), proc_stat);
    let all = closed_loop(a.clone(), c).await;
    let (_, cpu1) = a.pid.map_or((0, 0), proc_stat);
    let secs = t0.elapsed().as_secs_f64();
    let mut first: Vec<u32> = all.iter().filter_map(|s| s.first_us).collect();
    let mut gaps: Vec<u32> = all.iter().flat_map(|s| s.gaps_us.iter().copied()).collect();
    let done = all.iter().filter(|s| s.done).count();
    let stalls = all.iter().filter(|s| stalled(s, a.stall_us)).count();
    let events: u64 = all.iter().map(|s| u64::from(s.events)).sum();
    let cpu_ms = cpu_ms(cpu0, cpu1);
    println!(
        "{{\"streams\":{},\"concurrency\":{c},\"completed\":{done},\"failed\":{},\"stalled\":{stalls},\"events\":{events},\"events_per_s\":{:.0},\"ttft_ms\":{{\"p50\":{:.3},\"p99\":{:.3}}},\"gap_ms\":{{\"p50\":{:.3},\"p99\":{:.3},\"max\":{:.3}}},\"cpu_ms\":{cpu_ms:.0},\"cpu_us_per_event\":{:.2}}}",
        a.streams,
        a.streams - done,
        events as f64 / secs,
        pct(&mut first, 0.5),
        pct(&mut first, 0.99),
        pct(&mut gaps, 0.5),
        pct(&mut gaps, 0.99),
        pct(&mut gaps, 1.0),
        per_event(cpu_ms, events),
    );
}

/// CPU time between two readings of [`proc_stat`] (clock ticks of USER_HZ, 100 on Linux), in ms.
fn cpu_ms(before: u64, after: u64) -> f64 {
    after.saturating_sub(before) as f64 * 10.0
}

/// Microseconds of CPU per relayed event.
fn per_event(cpu_ms: f64, events: u64) -> f64 {
    if events > 0 {
        cpu_ms * 1000.0 / events as f64
    } else {
        f64::NAN
    }
}

/// A stream that ended without `[DONE]`, or waited longer than the stall bound between events.
fn stalled(s: &Seen, stall_us: u32) -> bool {
    !s.done || s.gaps_us.iter().any(|g| *g > stall_us)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let a = Arc::new(args());
    if let Some(c) = a.concurrency {
        return closed_loop_report(a, c).await;
    }
    let (rss_idle, cpu0) = a.pid.map_or((0, 0), proc_stat);
    let started = Arc::new(AtomicUsize::new(0));
    let ended = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::with_capacity(a.streams);
    let t0 = Instant::now();
    for i in 0..a.streams {
        tasks.push(tokio::spawn(one(a.clone(), i, started.clone(), ended.clone())));
        if (i + 1) % a.batch == 0 {
            if i + 1 == a.batch {
                // The first batch's starts go out together and are timed alone: the rest wait
                // until they are under way, then follow a batch every `--batch-gap-ms`.
                while started.load(Ordering::Relaxed) < a.batch * 9 / 10 && t0.elapsed() < Duration::from_secs(60) {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            } else {
                tokio::time::sleep(Duration::from_millis(a.batch_gap_ms)).await;
            }
        }
    }
    // Every stream open (its first event came, or it failed): the proxy's memory then.
    let deadline = Instant::now() + Duration::from_secs(120);
    while started.load(Ordering::Relaxed) < a.streams && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let open_at = t0.elapsed();
    tokio::time::sleep(Duration::from_millis(a.interval_ms * 2)).await;
    let (rss_open, _) = a.pid.map_or((0, 0), proc_stat);
    // Streams already over when the memory was read: the figure holds only when none were (the
    // streams must last longer than the ramp).
    let ended_before_sample = ended.load(Ordering::Relaxed);
    let mut first = Vec::new();
    let mut gaps = Vec::new();
    let (mut events, mut done, mut failed, mut stalls) = (0u64, 0usize, 0usize, 0usize);
    for t in tasks {
        match t.await {
            Ok(s) => {
                events += u64::from(s.events);
                done += usize::from(s.done);
                failed += usize::from(!s.done);
                stalls += usize::from(stalled(&s, a.stall_us));
                // The first batch's starts: the simultaneous ones.
                if first.len() < a.batch {
                    first.extend(s.first_us);
                }
                gaps.extend(s.gaps_us);
            }
            Err(_) => failed += 1,
        }
    }
    let (_, cpu1) = a.pid.map_or((0, 0), proc_stat);
    let cpu_ms = cpu_ms(cpu0, cpu1);
    let per_stream = rss_open.saturating_sub(rss_idle) as f64 / a.streams.max(1) as f64;
    let interval = a.interval_ms as f64;
    println!(
        "{{\"streams\":{},\"completed\":{done},\"failed\":{failed},\"stalled\":{stalls},\"events\":{events},\"all_open_after_ms\":{},\"ended_before_sample\":{ended_before_sample},\"rss_idle_kib\":{rss_idle},\"rss_open_kib\":{rss_open},\"kib_per_stream\":{per_stream:.1},\"ttft_ms\":{{\"p50\":{:.3},\"p99\":{:.3}}},\"gap_ms\":{{\"p50\":{:.3},\"p99\":{:.3},\"max\":{:.3}}},\"gap_added_p99_ms\":{:.3},\"cpu_ms\":{cpu_ms:.0},\"cpu_us_per_event\":{:.2}}}",
        a.streams,
        open_at.as_millis(),
        pct(&mut first, 0.5),
        pct(&mut first, 0.99),
        pct(&mut gaps, 0.5),
        pct(&mut gaps, 0.99),
        pct(&mut gaps, 1.0),
        pct(&mut gaps, 0.99) - interval,
        per_event(cpu_ms, events),
    );
}
