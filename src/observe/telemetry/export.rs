//! The span exporter: a thread of its own (with its own single-threaded runtime) that batches
//! finished spans and sends them to the collector over OTLP. The request path only queues: a
//! full queue drops spans (counted), and a slow or dead collector only ever slows this thread.

use super::otlp;
use crate::config::telemetry::{Settings, Transport};
use crate::observe::metrics::{Counter, Metrics};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Encoded spans one after another (as `otlp::Spans` writes them), and where each ends.
#[derive(Default)]
struct Batch {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl Batch {
    fn len(&self) -> usize {
        self.ends.len()
    }

    /// Move the first `n` spans onto the end of `into`.
    fn move_front(&mut self, n: usize, into: &mut Batch) {
        if n == 0 {
            return;
        }
        if n == self.len() && into.len() == 0 {
            // All of them: the buffers change hands (each side keeps the other's capacity).
            std::mem::swap(self, into);
            return;
        }
        let end = self.ends[n - 1];
        let base = into.bytes.len();
        into.bytes.extend_from_slice(&self.bytes[..end]);
        into.ends.extend(self.ends[..n].iter().map(|e| base + e));
        self.bytes.drain(..end);
        self.ends.drain(..n);
        self.ends.iter_mut().for_each(|e| *e -= end);
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
    }
}

/// The spans waiting for the exporter thread, shared with the request path.
#[derive(Default)]
struct Queue {
    spans: Batch,
    /// Flushes asked for (at shutdown): answered once what was queued before is sent.
    flushes: Vec<mpsc::Sender<()>>,
    closed: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    /// Wakes the thread: a full batch, a flush, or the end.
    wake: Condvar,
}

/// The request path's handle on the exporter thread.
///
/// A request only appends its spans under a short lock: the thread is woken when a batch is
/// full (or by its own timer), not per request — a wake-up per request costs a system call
/// and a context switch, more than the spans themselves.
pub struct Exporter {
    shared: Arc<Shared>,
    max_queue: usize,
    max_queue_bytes: usize,
    max_batch: usize,
    dropped_full: Arc<Counter>,
}

/// What the exporter counts on `/metrics` (`tollgate_otlp_spans_total{outcome}`).
struct Counts {
    exported: Arc<Counter>,
    failed: Arc<Counter>,
}

impl Exporter {
    pub fn start(settings: &Settings, metrics: &Metrics) -> Result<Exporter, String> {
        let shared = Arc::new(Shared { queue: Mutex::new(Queue::default()), wake: Condvar::new() });
        let counts = Counts {
            exported: metrics.counter("tollgate_otlp_spans_total", &[("outcome", "exported")]),
            failed: metrics.counter("tollgate_otlp_spans_total", &[("outcome", "export_failed")]),
        };
        let dropped_full = metrics.counter("tollgate_otlp_spans_total", &[("outcome", "dropped_queue_full")]);
        let sender = Sender::new(settings)?;
        let (delay, thread_shared) = (settings.schedule_delay, shared.clone());
        std::thread::Builder::new()
            .name("otlp-export".into())
            .spawn(move || run(&thread_shared, sender, counts, delay))
            .map_err(|e| format!("telemetry.otlp: could not start the exporter thread: {e}"))?;
        Ok(Exporter {
            shared,
            max_queue: settings.max_queue,
            max_queue_bytes: settings.max_queue_bytes,
            max_batch: settings.max_export_batch,
            dropped_full,
        })
    }

    /// Queue a request's spans (encoded, see `otlp::Spans`), or drop them when the queue is
    /// full. Never blocks on the collector.
    pub fn submit(&self, spans: &[u8]) {
        let mut q = self.shared.queue.lock().unwrap_or_else(|p| p.into_inner());
        let (before, base) = (q.spans.len(), q.spans.bytes.len());
        q.spans.ends.extend(otlp::span_ends(spans).map(|end| base + end));
        let n = q.spans.len() - before;
        if n == 0 {
            return;
        }
        // Bounded in count and in bytes: a slow collector holds at most both.
        let whole = q.spans.ends[q.spans.len() - 1] - base;
        if q.spans.len() > self.max_queue || base + whole > self.max_queue_bytes {
            q.spans.ends.truncate(before);
            drop(q);
            self.dropped_full.add(n as u64);
            return;
        }
        // Whole spans only (`span_ends` stops at one cut short).
        q.spans.bytes.extend_from_slice(&spans[..whole]);
        let full = before < self.max_batch && q.spans.len() >= self.max_batch;
        drop(q);
        if full {
            self.shared.wake.notify_one();
        }
    }

    /// Export everything queued so far; waits at most `wait` (at shutdown).
    pub fn flush(&self, wait: Duration) -> bool {
        let (done, answered) = mpsc::channel();
        self.shared.queue.lock().unwrap_or_else(|p| p.into_inner()).flushes.push(done);
        self.shared.wake.notify_one();
        answered.recv_timeout(wait).is_ok()
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.shared.queue.lock().unwrap_or_else(|p| p.into_inner()).closed = true;
        self.shared.wake.notify_one();
    }
}

fn run(shared: &Shared, sender: Sender, counts: Counts, delay: Duration) {
    crate::store::commit::lower_priority("otlp exporter");
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            log::error!("telemetry.otlp: the exporter's runtime did not start ({e}); no spans are exported");
            return;
        }
    };
    let mut due = Instant::now() + delay;
    // The spans taken from the queue; its buffers go back and forth with the queue's.
    let mut batch = Batch::default();
    loop {
        let (flushes, closed) = {
            let mut q = shared.queue.lock().unwrap_or_else(|p| p.into_inner());
            while q.spans.len() < sender.max_batch && q.flushes.is_empty() && !q.closed {
                let now = Instant::now();
                if now >= due {
                    break;
                }
                q = shared.wake.wait_timeout(q, due - now).unwrap_or_else(|p| p.into_inner()).0;
            }
            let take = if q.flushes.is_empty() && !q.closed { q.spans.len().min(sender.max_batch) } else { q.spans.len() };
            q.spans.move_front(take, &mut batch);
            (std::mem::take(&mut q.flushes), q.closed)
        };
        // At most a batch's worth of spans per export.
        let (mut sent, mut from) = (0, 0);
        while sent < batch.len() {
            let upto = (sent + sender.max_batch).min(batch.len());
            let end = batch.ends[upto - 1];
            runtime.block_on(export(&sender, &counts, &batch.bytes[from..end], upto - sent));
            (sent, from) = (upto, end);
        }
        batch.clear();
        for done in flushes {
            let _ = done.send(());
        }
        if closed {
            return;
        }
        if Instant::now() >= due {
            due = Instant::now() + delay;
        }
    }
}

/// Send `n` spans (`spans`, encoded).
async fn export(sender: &Sender, counts: &Counts, spans: &[u8], n: usize) {
    let body = otlp::export_request(&sender.resource, crate::VERSION, spans);
    match sender.send(body).await {
        Ok(()) => counts.exported.add(n as u64),
        Err(e) => {
            counts.failed.add(n as u64);
            log::warn!("telemetry.otlp: {n} span(s) not exported: {e}");
        }
    }
}

/// The collector's address and how to speak to it.
struct Sender {
    client: reqwest::Client,
    url: String,
    /// `url` as logged (no credentials).
    shown: String,
    protocol: Transport,
    headers: Vec<(String, String)>,
    resource: Vec<(String, String)>,
    max_batch: usize,
}

/// Sends of one batch before it is given up (the collector said try again, or did not answer).
const SENDS: u32 = 3;

impl Sender {
    fn new(settings: &Settings) -> Result<Sender, String> {
        let client = crate::base::outbound::Outbound {
            total: Some(settings.timeout),
            idle_per_host: Some(2),
            h2_prior_knowledge: settings.protocol == Transport::Grpc && settings.endpoint.starts_with("http://"),
            ..Default::default()
        }
        .client()
        .map_err(|e| format!("telemetry.otlp: {e}"))?;
        let url = match settings.protocol {
            Transport::Grpc => {
                format!("{}/opentelemetry.proto.collector.trace.v1.TraceService/Export", settings.endpoint.trim_end_matches('/'))
            }
            Transport::HttpProtobuf => settings.endpoint.clone(),
        };
        Ok(Sender {
            client,
            shown: crate::base::text::redact_url(&url),
            url,
            protocol: settings.protocol,
            headers: settings.headers.clone(),
            resource: settings.resource.clone(),
            max_batch: settings.max_export_batch,
        })
    }

    async fn send(&self, body: Vec<u8>) -> Result<(), String> {
        let body = bytes::Bytes::from(match self.protocol {
            // gRPC's length-prefixed message: uncompressed flag, then the length (big endian).
            Transport::Grpc => {
                let mut framed = Vec::with_capacity(body.len() + 5);
                framed.push(0);
                framed.extend_from_slice(&(body.len() as u32).to_be_bytes());
                framed.extend_from_slice(&body);
                framed
            }
            Transport::HttpProtobuf => body,
        });
        let mut pause = Duration::from_millis(200);
        let mut last = String::new();
        for n in 1..=SENDS {
            match self.send_once(body.clone()).await {
                Ok(()) => return Ok(()),
                Err((retry, e)) => {
                    last = e;
                    if !retry || n == SENDS {
                        break;
                    }
                }
            }
            tokio::time::sleep(pause).await;
            pause *= 2;
        }
        Err(last)
    }

    /// One send; on failure, whether it is worth another and why it failed.
    async fn send_once(&self, body: bytes::Bytes) -> Result<(), (bool, String)> {
        let mut req = self.client.post(&self.url);
        req = match self.protocol {
            Transport::Grpc => req.header("content-type", "application/grpc").header("te", "trailers"),
            Transport::HttpProtobuf => req.header("content-type", "application/x-protobuf"),
        };
        for (name, value) in &self.headers {
            req = req.header(name.as_str(), value.as_str());
        }
        let resp = req.body(body).send().await.map_err(|e| (true, format!("collector {} unreachable: {}", self.shown, e.without_url())))?;
        let status = resp.status().as_u16();
        match self.protocol {
            Transport::HttpProtobuf => {
                if (200..300).contains(&status) {
                    return Ok(());
                }
                // OTLP/HTTP: 429, 502, 503 and 504 are worth another try.
                Err((matches!(status, 429 | 502 | 503 | 504), format!("collector {} answered HTTP {status}", self.shown)))
            }
            Transport::Grpc => {
                if status != 200 {
                    return Err((matches!(status, 429 | 502 | 503 | 504), format!("collector {} answered HTTP {status}", self.shown)));
                }
                // The status comes in the header (an error without a message) or the trailers.
                let in_header = grpc_status(resp.headers());
                let code = match in_header {
                    Some(code) => Some(code),
                    None => {
                        use http_body_util::BodyExt;
                        let body: reqwest::Body = http::Response::from(resp).into_body();
                        let collected = body.collect().await.map_err(|e| (true, format!("collector {}: {e}", self.shown)))?;
                        collected.trailers().and_then(grpc_status)
                    }
                };
                match code {
                    Some(0) => Ok(()),
                    // UNAVAILABLE, RESOURCE_EXHAUSTED, ABORTED, DEADLINE_EXCEEDED… are transient.
                    Some(code) => Err((
                        matches!(code, 1 | 4 | 8 | 10 | 11 | 14 | 15),
                        format!("collector {} answered gRPC status {code}", self.shown),
                    )),
                    None => Err((false, format!("collector {} sent no gRPC status", self.shown))),
                }
            }
        }
    }
}

fn grpc_status(headers: &http::HeaderMap) -> Option<u32> {
    headers.get("grpc-status")?.to_str().ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::telemetry::{Kind, Value};

    /// `n` spans of a request, encoded, each named by its number.
    fn request(n: usize) -> otlp::Spans {
        let mut spans = otlp::Spans::default();
        for i in 0..n {
            let number = i.to_string();
            spans.open(&otlp::Opening {
                trace_id: &[1; 16],
                span_id: &[2; 8],
                parent: None,
                remote_parent: false,
                state: None,
                name: ["span", &number],
                kind: Kind::Server,
                start_ns: 1,
            });
            spans.add("i", Value::Int(i as i64));
            spans.close(2, None);
        }
        spans
    }

    fn names(bytes: &[u8]) -> Vec<String> {
        otlp::decode::spans(bytes).into_iter().map(|s| s.name).collect()
    }

    #[test]
    fn the_queue_keeps_whole_spans_in_order_and_drops_what_does_not_fit() {
        let shared = Arc::new(Shared { queue: Mutex::new(Queue::default()), wake: Condvar::new() });
        let dropped = Arc::new(Counter::default());
        let exporter =
            Exporter { shared: shared.clone(), max_queue: 5, max_queue_bytes: usize::MAX, max_batch: 2, dropped_full: dropped.clone() };
        exporter.submit(request(2).bytes());
        exporter.submit(request(0).bytes());
        exporter.submit(request(3).bytes());
        // A request's spans are kept or dropped together.
        exporter.submit(request(1).bytes());
        assert_eq!(dropped.get(), 1);
        let mut q = shared.queue.lock().unwrap();
        assert_eq!(q.spans.len(), 5);
        assert_eq!(names(&q.spans.bytes), ["span 0", "span 1", "span 0", "span 1", "span 2"]);
        // Taken a batch at a time: the first spans move, the rest stay whole.
        let mut batch = Batch::default();
        q.spans.move_front(2, &mut batch);
        assert_eq!((batch.len(), names(&batch.bytes)), (2, vec!["span 0".to_string(), "span 1".to_string()]));
        assert_eq!(batch.ends.last().copied(), Some(batch.bytes.len()));
        assert_eq!(names(&q.spans.bytes), ["span 0", "span 1", "span 2"]);
        assert_eq!(q.spans.ends.last().copied(), Some(q.spans.bytes.len()));
        q.spans.move_front(3, &mut batch);
        assert_eq!(names(&batch.bytes), ["span 0", "span 1", "span 0", "span 1", "span 2"]);
        assert_eq!(batch.ends.iter().map(|end| names(&batch.bytes[..*end]).len()).collect::<Vec<_>>(), [1, 2, 3, 4, 5]);
        assert_eq!((q.spans.len(), q.spans.bytes.len()), (0, 0));
        // All of them into an empty batch: the buffers change hands.
        batch.clear();
        drop(q);
        exporter.submit(request(2).bytes());
        let mut q = shared.queue.lock().unwrap();
        q.spans.move_front(2, &mut batch);
        assert_eq!((names(&batch.bytes), q.spans.len()), (vec!["span 0".to_string(), "span 1".to_string()], 0));
    }

    #[test]
    fn the_queue_is_bounded_in_bytes_too() {
        let shared = Arc::new(Shared { queue: Mutex::new(Queue::default()), wake: Condvar::new() });
        let dropped = Arc::new(Counter::default());
        let one = request(2).bytes().len();
        let exporter =
            Exporter { shared: shared.clone(), max_queue: 1000, max_queue_bytes: one * 2, max_batch: 1000, dropped_full: dropped.clone() };
        for _ in 0..5 {
            exporter.submit(request(2).bytes());
        }
        // Two requests' spans fit the bytes; the other three are dropped and counted.
        assert_eq!(dropped.get(), 6);
        let q = shared.queue.lock().unwrap();
        assert_eq!((q.spans.len(), q.spans.bytes.len()), (4, one * 2));
    }
}
