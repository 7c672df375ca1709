//! Prometheus counters, rendered as text on the admin listener's `/metrics`.
//!
//! The request path touches only atomics: a series is resolved once into a handle (per
//! protocol at start, per model on its first request) and counted with `fetch_add`. Lookups of
//! a model's handles take a read lock and allocate nothing; a write lock is taken only when a
//! series is seen for the first time.

use crate::protocol::Protocol;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

/// Histogram bucket upper bounds, in seconds.
const BUCKETS: [f64; 14] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// A monotonically increasing count; rendered as `value × unit`.
#[derive(Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// Observations in seconds, with cumulative buckets.
#[derive(Default)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let seconds = d.as_secs_f64();
        if let Some(first) = BUCKETS.iter().position(|b| seconds <= *b) {
            for c in &self.counts[first..] {
                c.fetch_add(1, Relaxed);
            }
        }
        self.count.fetch_add(1, Relaxed);
        self.sum_nanos.fetch_add(d.as_nanos().min(u64::MAX as u128) as u64, Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        for (i, bound) in BUCKETS.iter().enumerate() {
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {}", self.counts[i].load(Relaxed));
        }
        let count = self.count.load(Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", crate::base::money::usd(self.sum_nanos.load(Relaxed) as i64));
        let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
    }
}

/// OpenTelemetry's advised bucket bounds for the GenAI histograms: tokens, request duration
/// (seconds) and time to first token (seconds).
const TOKEN_BUCKETS: [f64; 14] =
    [1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0, 16777216.0, 67108864.0];
const DURATION_BUCKETS: [f64; 14] = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92];
const TTFT_BUCKETS: [f64; 16] = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0];

/// A histogram over fixed bounds: one atomic per observation (its bucket), cumulated when
/// rendered. The sum is kept in millionths.
pub struct Distribution {
    bounds: &'static [f64],
    counts: Box<[AtomicU64]>,
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Distribution {
    fn new(bounds: &'static [f64]) -> Self {
        Distribution {
            bounds,
            counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_micros: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, value: f64) {
        if let Some(i) = self.bounds.iter().position(|b| value <= *b) {
            self.counts[i].fetch_add(1, Relaxed);
        }
        self.count.fetch_add(1, Relaxed);
        self.sum_micros.fetch_add((value.max(0.0) * 1e6) as u64, Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (i, bound) in self.bounds.iter().enumerate() {
            cumulative += self.counts[i].load(Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {cumulative}");
        }
        let count = self.count.load(Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum_micros.load(Relaxed) as f64 / 1e6);
        let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
    }
}

/// The OpenTelemetry GenAI metrics of one operation, provider and model.
pub struct GenAiSeries {
    pub input_tokens: Distribution,
    pub output_tokens: Distribution,
    /// From the request's start to its end (seconds).
    pub duration: Distribution,
    /// From the request's start to the first byte of the answer's body (seconds).
    pub time_to_first_token: Distribution,
}

impl Default for GenAiSeries {
    fn default() -> Self {
        GenAiSeries {
            input_tokens: Distribution::new(&TOKEN_BUCKETS),
            output_tokens: Distribution::new(&TOKEN_BUCKETS),
            duration: Distribution::new(&DURATION_BUCKETS),
            time_to_first_token: Distribution::new(&TTFT_BUCKETS),
        }
    }
}

/// Series labelled by protocol.
#[derive(Default)]
pub struct ProtocolSeries {
    /// Time to the upstream's response header.
    pub upstream_seconds: Histogram,
    /// Time to the first body byte.
    pub first_byte_seconds: Histogram,
}

/// Series labelled by model (`-` for requests that named none).
#[derive(Default)]
pub struct ModelSeries {
    pub input_tokens: Counter,
    pub output_tokens: Counter,
    pub cost_nanos: Counter,
    /// Answers billed from an estimate (no upstream usage).
    pub estimated_bills: Counter,
    /// What answers from the response cache saved (nano-USD at the price table).
    pub cache_saved_nanos: Counter,
    /// Requests by route label and status.
    requests: Keyed<(&'static str, u16), Counter>,
    /// GenAI series by operation and provider name.
    gen_ai: Keyed<(&'static str, &'static str), GenAiSeries>,
}

/// Series by a small key, few enough to be found by a scan.
type Keyed<K, V> = RwLock<Vec<(K, Arc<V>)>>;

/// The series under `key`, made on its first use: a read lock when it exists (no allocation),
/// the write lock only the first time.
fn series<K: PartialEq + Copy, V: Default>(all: &Keyed<K, V>, key: K) -> Arc<V> {
    let find = |v: &Vec<(K, Arc<V>)>| v.iter().find(|(k, _)| *k == key).map(|e| e.1.clone());
    if let Some(s) = find(&all.read().unwrap_or_else(|p| p.into_inner())) {
        return s;
    }
    let mut all = all.write().unwrap_or_else(|p| p.into_inner());
    if let Some(s) = find(&all) {
        return s;
    }
    let s = Arc::new(V::default());
    all.push((key, s.clone()));
    s
}

impl ModelSeries {
    /// The request counter for a route and status.
    pub fn requests(&self, route: &'static str, status: u16) -> Arc<Counter> {
        series(&self.requests, (route, status))
    }

    /// The GenAI series of an operation (`chat`, `embeddings`, …) served by a provider
    /// (`openai`, `anthropic`, `gcp.gemini`).
    pub fn gen_ai(&self, operation: &'static str, provider: &'static str) -> Arc<GenAiSeries> {
        series(&self.gen_ai, (operation, provider))
    }
}

/// A series' name and labels.
type SeriesKey = (&'static str, Vec<(&'static str, String)>);

/// Counters and histograms, and live gauges.
#[derive(Default)]
pub struct Metrics {
    protocols: [ProtocolSeries; 3],
    models: RwLock<HashMap<String, Arc<ModelSeries>, ahash::RandomState>>,
    /// Series outside the request path (rare events), by name and labels.
    other: Mutex<BTreeMap<SeriesKey, Arc<Counter>>>,
    /// MCP tool calls' durations by server and tool.
    tool_seconds: Mutex<BTreeMap<(String, String), Arc<Histogram>>>,
    /// Guardrails' checks' durations by guardrail.
    guardrail_seconds: Mutex<BTreeMap<String, Arc<Histogram>>>,
    /// Requests being processed.
    pub in_flight: AtomicI64,
    /// Event streams open to clients.
    pub open_streams: AtomicI64,
    /// Client connections open on the public listeners.
    pub connections: AtomicI64,
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// A live gauge counted by [`Live`] guards.
#[derive(Debug, Clone, Copy)]
pub enum Gauge {
    /// `tollgate_in_flight_requests`
    InFlight,
    /// `tollgate_open_streams`
    OpenStreams,
    /// `tollgate_client_connections`
    Connections,
}

/// Counts one in a live gauge for as long as it lives.
pub struct Live {
    metrics: Arc<Metrics>,
    gauge: Gauge,
}

impl Live {
    pub fn new(metrics: &Arc<Metrics>, gauge: Gauge) -> Self {
        metrics.gauge(gauge).fetch_add(1, Relaxed);
        Live { metrics: metrics.clone(), gauge }
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.metrics.gauge(self.gauge).fetch_sub(1, Relaxed);
    }
}

impl Metrics {
    fn gauge(&self, gauge: Gauge) -> &AtomicI64 {
        match gauge {
            Gauge::InFlight => &self.in_flight,
            Gauge::OpenStreams => &self.open_streams,
            Gauge::Connections => &self.connections,
        }
    }

    pub fn protocol(&self, p: Protocol) -> &ProtocolSeries {
        &self.protocols[p.index()]
    }

    /// The model's series (created on first use).
    pub fn model(&self, model: &str) -> Arc<ModelSeries> {
        if let Some(s) = self.models.read().unwrap_or_else(|p| p.into_inner()).get(model) {
            return s.clone();
        }
        self.models.write().unwrap_or_else(|p| p.into_inner()).entry(model.to_string()).or_default().clone()
    }

    /// Count a finished client request; the model's series, for what else the request adds.
    pub fn request(&self, route: &'static str, model: &str, status: u16) -> Arc<ModelSeries> {
        let series = self.model(model);
        series.requests(route, status).add(1);
        series
    }

    /// A counter outside the request path.
    pub fn counter(&self, name: &'static str, labels: &[(&'static str, &str)]) -> Arc<Counter> {
        let key = (name, labels.iter().map(|(k, v)| (*k, v.to_string())).collect());
        self.other.lock().unwrap_or_else(|p| p.into_inner()).entry(key).or_default().clone()
    }

    /// An MCP tool call that ended: `tollgate_mcp_tool_calls_total{server,tool,outcome}` and
    /// `tollgate_mcp_tool_call_seconds{server,tool}`.
    pub fn tool_call(&self, server: &str, tool: &str, outcome: &str, took: Duration) {
        self.counter("tollgate_mcp_tool_calls_total", &[("server", server), ("tool", tool), ("outcome", outcome)]).add(1);
        let h =
            self.tool_seconds.lock().unwrap_or_else(|p| p.into_inner()).entry((server.to_string(), tool.to_string())).or_default().clone();
        h.observe(took);
    }

    /// A guardrail checked a call: `tollgate_guardrail_actions_total{guardrail,phase,action}` and
    /// `tollgate_guardrail_seconds{guardrail}` (the names are the operator's, never a client's).
    pub fn guardrail(&self, guardrail: &str, phase: &str, action: &str, took: Duration) {
        self.counter("tollgate_guardrail_actions_total", &[("guardrail", guardrail), ("phase", phase), ("action", action)]).add(1);
        let h = self.guardrail_seconds.lock().unwrap_or_else(|p| p.into_inner()).entry(guardrail.to_string()).or_default().clone();
        h.observe(took);
    }

    /// Prometheus text format; `extra` lines (gauges computed at scrape time) are appended.
    /// Every request counted in `tollgate_requests_total`.
    pub fn total_requests(&self) -> u64 {
        let models = self.models.read().unwrap_or_else(|p| p.into_inner());
        models.values().map(|s| s.requests.read().unwrap_or_else(|p| p.into_inner()).iter().map(|(_, c)| c.get()).sum::<u64>()).sum()
    }

    pub fn render(&self, extra: &[(&str, f64)]) -> String {
        let mut out = String::new();
        let models: BTreeMap<String, Arc<ModelSeries>> =
            self.models.read().unwrap_or_else(|p| p.into_inner()).iter().map(|(k, v)| (k.clone(), v.clone())).collect();

        let _ = writeln!(out, "# TYPE tollgate_requests_total counter");
        for (model, s) in &models {
            let mut rows: Vec<(&'static str, u16, u64)> =
                s.requests.read().unwrap_or_else(|p| p.into_inner()).iter().map(|((r, st), c)| (*r, *st, c.get())).collect();
            rows.sort_unstable();
            for (route, status, n) in rows {
                let _ = writeln!(out, "tollgate_requests_total{{route=\"{route}\",model=\"{}\",status=\"{status}\"}} {n}", escape(model));
            }
        }
        let priced: Vec<_> = models.iter().filter(|(m, _)| m.as_str() != "-").collect();
        let _ = writeln!(out, "# TYPE tollgate_tokens_total counter");
        for (model, s) in &priced {
            let m = escape(model);
            let _ = writeln!(out, "tollgate_tokens_total{{model=\"{m}\",kind=\"input\"}} {}", s.input_tokens.get());
            let _ = writeln!(out, "tollgate_tokens_total{{model=\"{m}\",kind=\"output\"}} {}", s.output_tokens.get());
        }
        let _ = writeln!(out, "# TYPE tollgate_cost_usd_total counter");
        for (model, s) in &priced {
            let _ = writeln!(
                out,
                "tollgate_cost_usd_total{{model=\"{}\"}} {}",
                escape(model),
                crate::base::money::usd(s.cost_nanos.get() as i64)
            );
        }
        let saved: Vec<_> = priced.iter().filter(|(_, s)| s.cache_saved_nanos.get() > 0).collect();
        if !saved.is_empty() {
            let _ = writeln!(out, "# TYPE tollgate_cache_saved_usd_total counter");
        }
        for (model, s) in saved {
            let usd = crate::base::money::usd(s.cache_saved_nanos.get() as i64);
            let _ = writeln!(out, "tollgate_cache_saved_usd_total{{model=\"{}\"}} {usd}", escape(model));
        }
        let _ = writeln!(out, "# TYPE tollgate_estimated_bills_total counter");
        for (model, s) in &priced {
            let _ = writeln!(out, "tollgate_estimated_bills_total{{model=\"{}\"}} {}", escape(model), s.estimated_bills.get());
        }
        render_gen_ai(&mut out, &priced);
        for (name, pick) in [
            ("tollgate_upstream_seconds", (|s: &ProtocolSeries| &s.upstream_seconds) as fn(&ProtocolSeries) -> &Histogram),
            ("tollgate_first_byte_seconds", |s: &ProtocolSeries| &s.first_byte_seconds),
        ] {
            let _ = writeln!(out, "# TYPE {name} histogram");
            for p in Protocol::ALL {
                pick(self.protocol(p)).render(&mut out, name, &format!("protocol=\"{}\"", p.as_str()));
            }
        }
        let other = self.other.lock().unwrap_or_else(|p| p.into_inner());
        let mut last = "";
        for ((name, labels), c) in other.iter() {
            if *name != last {
                let _ = writeln!(out, "# TYPE {name} counter");
                last = name;
            }
            let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
            let _ = writeln!(out, "{name}{{{}}} {}", labels.join(","), c.get());
        }
        drop(other);
        let tools = self.tool_seconds.lock().unwrap_or_else(|p| p.into_inner());
        if !tools.is_empty() {
            let _ = writeln!(out, "# TYPE tollgate_mcp_tool_call_seconds histogram");
        }
        for ((server, tool), h) in tools.iter() {
            h.render(&mut out, "tollgate_mcp_tool_call_seconds", &format!("server=\"{}\",tool=\"{}\"", escape(server), escape(tool)));
        }
        drop(tools);
        let guards = self.guardrail_seconds.lock().unwrap_or_else(|p| p.into_inner());
        if !guards.is_empty() {
            let _ = writeln!(out, "# TYPE tollgate_guardrail_seconds histogram");
        }
        for (guardrail, h) in guards.iter() {
            h.render(&mut out, "tollgate_guardrail_seconds", &format!("guardrail=\"{}\"", escape(guardrail)));
        }
        drop(guards);
        let live = [
            ("tollgate_in_flight_requests", self.in_flight.load(Relaxed) as f64),
            ("tollgate_open_streams", self.open_streams.load(Relaxed) as f64),
            ("tollgate_client_connections", self.connections.load(Relaxed) as f64),
        ];
        for (name, value) in live.iter().chain(extra.iter()) {
            let _ = writeln!(out, "# TYPE {name} gauge\n{name} {value}");
        }
        out
    }
}

/// The GenAI operation name of a relayed route (by its label); None for routes that are not
/// one (token counting, stored responses, video).
pub fn gen_ai_operation(route: &str) -> Option<&'static str> {
    match route {
        "chat_completions" | "messages" | "responses" | "responses_compact" => Some("chat"),
        "generate_content" | "stream_generate_content" => Some("generate_content"),
        "embeddings" | "embed_content" | "batch_embed_contents" => Some("embeddings"),
        "mcp_tool_call" => Some("execute_tool"),
        _ => None,
    }
}

/// The GenAI provider name of a provider's protocol.
pub fn gen_ai_provider(kind: crate::config::ProviderKind) -> &'static str {
    use crate::config::ProviderKind;
    match kind {
        ProviderKind::Openai => "openai",
        ProviderKind::Anthropic => "anthropic",
        ProviderKind::Gemini => "gcp.gemini",
        ProviderKind::Bedrock => "aws.bedrock",
        ProviderKind::Vertex => "gcp.vertex_ai",
        ProviderKind::AzureOpenai => "az.ai.openai",
    }
}

/// `gen_ai_client_token_usage` (by `gen_ai_token_type`), `gen_ai_server_request_duration` and
/// `gen_ai_server_time_to_first_token` (seconds), labelled as OpenTelemetry's GenAI semantic
/// conventions name them.
fn render_gen_ai(out: &mut String, models: &[(&String, &Arc<ModelSeries>)]) {
    let mut series = Vec::new();
    for (model, s) in models {
        let mut all: Vec<((&'static str, &'static str), Arc<GenAiSeries>)> = s.gen_ai.read().unwrap_or_else(|p| p.into_inner()).clone();
        all.sort_by_key(|(k, _)| *k);
        for ((operation, provider), g) in all {
            let labels = format!(
                "gen_ai_operation_name=\"{operation}\",gen_ai_provider_name=\"{provider}\",gen_ai_request_model=\"{}\"",
                escape(model)
            );
            series.push((labels, g));
        }
    }
    let _ = writeln!(out, "# TYPE gen_ai_client_token_usage histogram");
    for (labels, g) in &series {
        g.input_tokens.render(out, "gen_ai_client_token_usage", &format!("{labels},gen_ai_token_type=\"input\""));
        g.output_tokens.render(out, "gen_ai_client_token_usage", &format!("{labels},gen_ai_token_type=\"output\""));
    }
    let _ = writeln!(out, "# TYPE gen_ai_server_request_duration histogram");
    for (labels, g) in &series {
        g.duration.render(out, "gen_ai_server_request_duration", labels);
    }
    let _ = writeln!(out, "# TYPE gen_ai_server_time_to_first_token histogram");
    for (labels, g) in &series {
        g.time_to_first_token.render(out, "gen_ai_server_time_to_first_token", labels);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gen_ai_names_follow_the_semantic_conventions() {
        assert_eq!(gen_ai_operation("chat_completions"), Some("chat"));
        assert_eq!(gen_ai_operation("stream_generate_content"), Some("generate_content"));
        assert_eq!(gen_ai_operation("batch_embed_contents"), Some("embeddings"));
        assert_eq!(gen_ai_operation("count_tokens"), None);
        assert_eq!(gen_ai_provider(crate::config::ProviderKind::Gemini), "gcp.gemini");
        assert_eq!(gen_ai_provider(crate::config::ProviderKind::Bedrock), "aws.bedrock");
    }

    #[test]
    fn renders_prometheus_text() {
        let m = Arc::new(Metrics::default());
        m.request("chat", "alpha", 200);
        m.request("chat", "alpha", 200);
        m.request("models", "-", 200);
        let s = m.model("a\"b");
        s.input_tokens.add(5);
        s.cost_nanos.add(1_500_000_000);
        m.counter("tollgate_video_tasks_total", &[("state", "ok")]).add(3);
        let text = m.render(&[("tollgate_keys", 3.0)]);
        assert!(text.contains("tollgate_requests_total{route=\"chat\",model=\"alpha\",status=\"200\"} 2"), "{text}");
        assert!(text.contains("tollgate_requests_total{route=\"models\",model=\"-\",status=\"200\"} 1"), "{text}");
        assert!(text.contains("tollgate_tokens_total{model=\"a\\\"b\",kind=\"input\"} 5"), "{text}");
        assert!(text.contains("tollgate_cost_usd_total{model=\"a\\\"b\"} 1.5"), "{text}");
        assert!(!text.contains("tollgate_tokens_total{model=\"-\""), "{text}");
        assert!(text.contains("tollgate_video_tasks_total{state=\"ok\"} 3"), "{text}");
        assert!(text.contains("# TYPE tollgate_keys gauge\ntollgate_keys 3"), "{text}");
        assert_eq!(m.model("alpha").requests("chat", 200).get(), 2);
        let openai = m.protocol(Protocol::Openai);
        openai.upstream_seconds.observe(Duration::from_millis(3));
        openai.upstream_seconds.observe(Duration::from_millis(200));
        let text = m.render(&[]);
        assert!(text.contains("tollgate_upstream_seconds_bucket{protocol=\"openai\",le=\"0.005\"} 1"), "{text}");
        assert!(text.contains("tollgate_upstream_seconds_bucket{protocol=\"openai\",le=\"0.25\"} 2"), "{text}");
        assert!(text.contains("tollgate_upstream_seconds_bucket{protocol=\"openai\",le=\"+Inf\"} 2"), "{text}");
        assert!(text.contains("tollgate_upstream_seconds_count{protocol=\"openai\"} 2"), "{text}");
        assert!(text.contains("tollgate_upstream_seconds_sum{protocol=\"openai\"} 0.203"), "{text}");
        let g = m.model("alpha").gen_ai("chat", "openai");
        g.input_tokens.observe(12.0);
        g.input_tokens.observe(300.0);
        g.output_tokens.observe(7.0);
        g.duration.observe(0.015);
        g.time_to_first_token.observe(0.003);
        assert!(Arc::ptr_eq(&g, &m.model("alpha").gen_ai("chat", "openai")));
        let text = m.render(&[]);
        let labels = "gen_ai_operation_name=\"chat\",gen_ai_provider_name=\"openai\",gen_ai_request_model=\"alpha\"";
        assert!(text.contains(&format!("gen_ai_client_token_usage_bucket{{{labels},gen_ai_token_type=\"input\",le=\"16\"}} 1")), "{text}");
        assert!(
            text.contains(&format!("gen_ai_client_token_usage_bucket{{{labels},gen_ai_token_type=\"input\",le=\"1024\"}} 2")),
            "{text}"
        );
        assert!(text.contains(&format!("gen_ai_client_token_usage_sum{{{labels},gen_ai_token_type=\"input\"}} 312")), "{text}");
        assert!(text.contains(&format!("gen_ai_client_token_usage_count{{{labels},gen_ai_token_type=\"output\"}} 1")), "{text}");
        assert!(text.contains(&format!("gen_ai_server_request_duration_bucket{{{labels},le=\"0.02\"}} 1")), "{text}");
        assert!(text.contains(&format!("gen_ai_server_time_to_first_token_bucket{{{labels},le=\"0.001\"}} 0")), "{text}");
        assert!(text.contains(&format!("gen_ai_server_time_to_first_token_bucket{{{labels},le=\"0.005\"}} 1")), "{text}");
        let stream = Live::new(&m, Gauge::OpenStreams);
        assert!(m.render(&[]).contains("tollgate_open_streams 1"));
        drop(stream);
        assert!(m.render(&[]).contains("tollgate_open_streams 0"));
    }
}
