//! The span exporter: a thread of its own (with its own single-threaded runtime) that batches
//! finished spans and sends them to the collector over OTLP. The request path only queues: a
//! full queue drops spans (counted), and a slow or dead collector only ever slows this thread.

use super::{settings::Protocol, settings::Settings, SpanData};
use crate::metrics::{Counter, Metrics};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

enum Msg {
    Spans(Vec<SpanData>),
    /// Export what is queued, then answer.
    Flush(mpsc::Sender<()>),
}

/// The request path's handle on the exporter thread.
pub struct Exporter {
    tx: mpsc::Sender<Msg>,
    /// Spans sent to the thread and not yet taken into a batch.
    queued: Arc<AtomicUsize>,
    max_queue: usize,
    dropped_full: Arc<Counter>,
}

/// What the exporter counts on `/metrics` (`tollgate_otlp_spans_total{outcome}`).
struct Counts {
    exported: Arc<Counter>,
    failed: Arc<Counter>,
}

impl Exporter {
    pub fn start(settings: &Settings, metrics: &Metrics) -> Result<Exporter, String> {
        let (tx, rx) = mpsc::channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let counts = Counts {
            exported: metrics.counter("tollgate_otlp_spans_total", &[("outcome", "exported")]),
            failed: metrics.counter("tollgate_otlp_spans_total", &[("outcome", "export_failed")]),
        };
        let dropped_full = metrics.counter("tollgate_otlp_spans_total", &[("outcome", "dropped_queue_full")]);
        let sender = Sender::new(settings)?;
        let (batch, delay) = (settings.max_export_batch, settings.schedule_delay);
        let taken = queued.clone();
        std::thread::Builder::new()
            .name("otlp-export".into())
            .spawn(move || run(rx, taken, sender, counts, batch, delay))
            .map_err(|e| format!("telemetry.otlp: could not start the exporter thread: {e}"))?;
        Ok(Exporter { tx, queued, max_queue: settings.max_queue, dropped_full })
    }

    /// Queue a request's spans, or drop them when the queue is full. Never blocks.
    pub fn submit(&self, spans: Vec<SpanData>) {
        let n = spans.len();
        if self.queued.fetch_add(n, Ordering::Relaxed) + n > self.max_queue {
            self.queued.fetch_sub(n, Ordering::Relaxed);
            self.dropped_full.add(n as u64);
            return;
        }
        if self.tx.send(Msg::Spans(spans)).is_err() {
            self.queued.fetch_sub(n, Ordering::Relaxed);
            self.dropped_full.add(n as u64);
        }
    }

    /// Export everything queued so far; waits at most `wait` (at shutdown).
    pub fn flush(&self, wait: Duration) -> bool {
        let (done, answered) = mpsc::channel();
        self.tx.send(Msg::Flush(done)).is_ok() && answered.recv_timeout(wait).is_ok()
    }
}

fn run(rx: mpsc::Receiver<Msg>, queued: Arc<AtomicUsize>, sender: Sender, counts: Counts, max_batch: usize, delay: Duration) {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            log::error!("telemetry.otlp: the exporter's runtime did not start ({e}); no spans are exported");
            return;
        }
    };
    let mut batch: Vec<SpanData> = Vec::with_capacity(max_batch);
    let mut due = Instant::now() + delay;
    loop {
        let msg = rx.recv_timeout(due.saturating_duration_since(Instant::now()));
        let flush = match msg {
            Ok(Msg::Spans(spans)) => {
                queued.fetch_sub(spans.len(), Ordering::Relaxed);
                batch.extend(spans);
                if batch.len() < max_batch {
                    continue;
                }
                None
            }
            Ok(Msg::Flush(done)) => Some(done),
            Err(mpsc::RecvTimeoutError::Timeout) => None,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                runtime.block_on(export(&sender, &counts, &mut batch));
                return;
            }
        };
        if let Some(done) = flush {
            // Everything queued before the flush is in the channel ahead of it.
            while let Ok(Msg::Spans(spans)) = rx.try_recv() {
                queued.fetch_sub(spans.len(), Ordering::Relaxed);
                batch.extend(spans);
            }
            while !batch.is_empty() {
                runtime.block_on(export(&sender, &counts, &mut batch));
            }
            let _ = done.send(());
        } else {
            runtime.block_on(export(&sender, &counts, &mut batch));
        }
        due = Instant::now() + delay;
    }
}

/// Send up to one batch's worth of `batch` (what is sent or given up on leaves it).
async fn export(sender: &Sender, counts: &Counts, batch: &mut Vec<SpanData>) {
    if batch.is_empty() {
        return;
    }
    let n = batch.len().min(sender.max_batch);
    let spans: Vec<SpanData> = batch.drain(..n).collect();
    let body = super::otlp::export_request(&sender.resource, crate::VERSION, &spans);
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
    protocol: Protocol,
    headers: Vec<(String, String)>,
    resource: Vec<(String, String)>,
    max_batch: usize,
}

/// Sends of one batch before it is given up (the collector said try again, or did not answer).
const SENDS: u32 = 3;

impl Sender {
    fn new(settings: &Settings) -> Result<Sender, String> {
        let mut builder = reqwest::Client::builder().timeout(settings.timeout).pool_max_idle_per_host(2);
        if settings.protocol == Protocol::Grpc && settings.endpoint.starts_with("http://") {
            builder = builder.http2_prior_knowledge();
        }
        let client = builder.build().map_err(|e| format!("telemetry.otlp: {e}"))?;
        let url = match settings.protocol {
            Protocol::Grpc => {
                format!("{}/opentelemetry.proto.collector.trace.v1.TraceService/Export", settings.endpoint.trim_end_matches('/'))
            }
            Protocol::HttpProtobuf => settings.endpoint.clone(),
        };
        Ok(Sender {
            client,
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
            Protocol::Grpc => {
                let mut framed = Vec::with_capacity(body.len() + 5);
                framed.push(0);
                framed.extend_from_slice(&(body.len() as u32).to_be_bytes());
                framed.extend_from_slice(&body);
                framed
            }
            Protocol::HttpProtobuf => body,
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
            Protocol::Grpc => req.header("content-type", "application/grpc").header("te", "trailers"),
            Protocol::HttpProtobuf => req.header("content-type", "application/x-protobuf"),
        };
        for (name, value) in &self.headers {
            req = req.header(name.as_str(), value.as_str());
        }
        let resp = req.body(body).send().await.map_err(|e| (true, format!("collector {} unreachable: {e}", self.url)))?;
        let status = resp.status().as_u16();
        match self.protocol {
            Protocol::HttpProtobuf => {
                if (200..300).contains(&status) {
                    return Ok(());
                }
                // OTLP/HTTP: 429, 502, 503 and 504 are worth another try.
                Err((matches!(status, 429 | 502 | 503 | 504), format!("collector {} answered HTTP {status}", self.url)))
            }
            Protocol::Grpc => {
                if status != 200 {
                    return Err((matches!(status, 429 | 502 | 503 | 504), format!("collector {} answered HTTP {status}", self.url)));
                }
                // The status comes in the header (an error without a message) or the trailers.
                let in_header = grpc_status(resp.headers());
                let code = match in_header {
                    Some(code) => Some(code),
                    None => {
                        use http_body_util::BodyExt;
                        let body: reqwest::Body = http::Response::from(resp).into_body();
                        let collected = body.collect().await.map_err(|e| (true, format!("collector {}: {e}", self.url)))?;
                        collected.trailers().and_then(grpc_status)
                    }
                };
                match code {
                    Some(0) => Ok(()),
                    // UNAVAILABLE, RESOURCE_EXHAUSTED, ABORTED, DEADLINE_EXCEEDED… are transient.
                    Some(code) => {
                        Err((matches!(code, 1 | 4 | 8 | 10 | 11 | 14 | 15), format!("collector {} answered gRPC status {code}", self.url)))
                    }
                    None => Err((false, format!("collector {} sent no gRPC status", self.url))),
                }
            }
        }
    }
}

fn grpc_status(headers: &http::HeaderMap) -> Option<u32> {
    headers.get("grpc-status")?.to_str().ok()?.trim().parse().ok()
}
