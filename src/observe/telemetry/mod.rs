//! OpenTelemetry traces: a server span per request and a client span per upstream attempt,
//! named and attributed by the GenAI semantic conventions, exported over OTLP off the request
//! path (see `export`). A client's W3C trace is continued and carried upstream.
//!
//! * [`crate::config::telemetry`]: `telemetry.otlp` and the `OTEL_*` variables.
//! * [`context`]: `traceparent` / `tracestate`.
//! * `otlp`: the protobuf the collector receives; `export`: the batching thread.
//!
//! What a span says is decided here, in [`Trace::finish`], from the facts the gateway hands
//! over ([`RequestFacts`]). No prompt, no answer, no secret is ever among them.

pub mod context;
mod export;
mod otlp;

use crate::base::usage::Answer;
use context::{SpanId, TraceId};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use crate::config::telemetry::Settings;
pub use otlp::{Attrs, Value};
use otlp::{Opening, Spans};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Server,
    Client,
}

/// Traces on: the sampler and the exporter.
pub struct Tracer {
    /// A new trace is recorded when its id's last eight bytes are below this.
    ratio_bound: u64,
    always: bool,
    exporter: export::Exporter,
    describe: String,
}

impl Tracer {
    pub fn start(settings: &Settings, metrics: &crate::observe::metrics::Metrics) -> Result<Tracer, String> {
        let exporter = export::Exporter::start(settings, metrics)?;
        let protocol = match settings.protocol {
            crate::config::telemetry::Transport::Grpc => "grpc",
            crate::config::telemetry::Transport::HttpProtobuf => "http/protobuf",
        };
        Ok(Tracer {
            ratio_bound: (settings.sample_ratio * u64::MAX as f64) as u64,
            always: settings.sample_ratio >= 1.0,
            exporter,
            describe: format!(
                "traces to {} ({protocol}, sample ratio {})",
                crate::base::text::redact_url(&settings.endpoint),
                settings.sample_ratio
            ),
        })
    }

    /// For the start-up line.
    pub fn describe(&self) -> &str {
        &self.describe
    }

    /// A request arrived: continue the client's trace (and its sampling decision) or start one.
    pub fn begin(&self, traceparent: Option<&str>, tracestate: Option<&str>) -> Trace {
        let parent = traceparent.and_then(|tp| context::parse(tp, tracestate));
        let trace_id = parent.as_ref().map_or_else(context::new_trace_id, |p| p.trace_id);
        let sampled = match &parent {
            Some(p) => p.sampled,
            None => self.always || u64::from_be_bytes(last8(&trace_id)) < self.ratio_bound,
        };
        Trace {
            trace_id,
            server_span: context::new_span_id(),
            parent: parent.as_ref().map(|p| p.span_id),
            state: parent.and_then(|p| p.state),
            sampled,
            start_ns: unix_ns(),
            start: Instant::now(),
            spans: Spans::default(),
            attempt: None,
            answer: None,
            carried: None,
        }
    }

    /// The request ended: its spans go to the exporter (when it was sampled).
    pub fn finish(&self, trace: Trace, facts: &RequestFacts<'_>) {
        if trace.sampled {
            self.exporter.submit(trace.finish(facts).bytes());
        }
    }

    /// Export what is queued (at shutdown), waiting at most `wait`.
    pub fn flush(&self, wait: Duration) -> bool {
        self.exporter.flush(wait)
    }
}

fn last8(id: &TraceId) -> [u8; 8] {
    let mut out = [0u8; 8];
    out.copy_from_slice(&id[8..]);
    out
}

fn unix_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// One request's trace while it is served.
pub struct Trace {
    pub trace_id: TraceId,
    server_span: SpanId,
    /// The client's span, when the client sent a trace.
    parent: Option<SpanId>,
    state: Option<String>,
    pub sampled: bool,
    start_ns: u64,
    start: Instant,
    /// The spans written so far (a sampled request's): the upstream attempts that ended, then
    /// the one under way, open.
    spans: Spans,
    /// The upstream attempt under way, or the one that answered (ended with the request).
    attempt: Option<Attempt>,
    /// What the answer said of itself (see [`Answer`]).
    pub answer: Option<Answer>,
    /// The `traceparent` of the latest upstream attempt.
    carried: Option<context::Traceparent>,
}

/// An upstream attempt's client span, open (last in [`Trace::spans`]).
struct Attempt {
    status: Option<u16>,
}

/// Who an upstream attempt goes to: its attributes, encoded once per provider
/// ([`Upstream::attrs`]) and copied onto each attempt's span.
pub struct Upstream<'a> {
    /// `gen_ai.provider.name` of its protocol.
    pub gen_ai_provider: &'static str,
    /// The provider's name in the configuration.
    pub name: &'a str,
    pub host: &'a str,
    pub port: u16,
}

impl Upstream<'_> {
    pub fn attrs(&self) -> Attrs {
        let mut attrs = Attrs::default();
        attrs.add("gen_ai.provider.name", Value::Str(self.gen_ai_provider));
        // The name older GenAI conventions (and the backends still on them) read.
        attrs.add("gen_ai.system", Value::Str(self.gen_ai_provider));
        attrs.add("server.address", Value::Str(self.host));
        attrs.add("server.port", Value::Int(i64::from(self.port)));
        attrs.add("tollgate.provider", Value::Str(self.name));
        attrs
    }
}

/// An MCP tool call, for its span ([`Trace::tool_call`]).
pub struct ToolCall<'a> {
    /// The server's name in the configuration.
    pub server: &'a str,
    /// The tool, as the server names it.
    pub tool: &'a str,
    /// The gateway's session with the server, when it gave one.
    pub session: Option<&'a str>,
    pub version: &'a str,
    pub host: &'a str,
    pub port: u16,
    pub started: std::time::Instant,
    /// Why it failed (`error.type`); None when the server answered it.
    pub error: Option<&'a str>,
}

/// What the gateway knows of a request when it ends, borrowed for [`Trace::finish`].
#[derive(Default)]
pub struct RequestFacts<'a> {
    /// See [`method_name`].
    pub method: &'static str,
    pub route: &'static str,
    /// `gen_ai.operation.name` of a model call.
    pub operation: Option<&'static str>,
    pub model: Option<&'a str>,
    /// The status the client got.
    pub status: u16,
    pub key_name: Option<&'a str>,
    /// The key's tags, as `name=value` in `tollgate.key.tags`.
    pub tags: Option<&'a std::collections::BTreeMap<String, String>>,
    pub refusal: Option<&'a str>,
    pub request_id: Option<&'a str>,
    /// `gen_ai.provider.name` of the provider that answered.
    pub provider: Option<&'static str>,
    pub usage: Option<crate::base::usage::Usage>,
    pub cost_nanos: Option<i64>,
    pub estimated: bool,
    pub first_byte: Option<Duration>,
    /// What guardrails did (`name:phase:action[:categories]`, comma-separated), never what
    /// they found: `tollgate.guardrail.actions`.
    pub guardrail: Option<&'a str>,
    /// The models a call left for the next before its first byte, and why (`model:reason`,
    /// comma-separated): `tollgate.fallbacks`; the model asked for: `tollgate.requested_model`.
    pub fallbacks: Option<&'a str>,
    pub requested_model: Option<&'a str>,
    /// The rewrite rules its upstream request was made with (ids, comma-separated): `tollgate.rewrites`.
    pub rewrites: Option<&'a str>,
}

impl Trace {
    /// The time since the request began, on the span clock.
    fn now_ns(&self) -> u64 {
        self.start_ns + self.start.elapsed().as_nanos() as u64
    }

    /// An upstream attempt starts: its span opens, and the `traceparent` it carries names it
    /// (for an unsampled request, the trace and the decision are carried on all the same).
    pub fn begin_attempt(&mut self, to: &Attrs, operation: Option<&'static str>, model: &str) {
        self.end_attempt(None);
        let span_id = context::new_span_id();
        self.carried = Some(context::traceparent(&self.trace_id, &span_id, self.sampled));
        if self.sampled {
            let start_ns = self.now_ns();
            self.open_client(&span_id, [operation.unwrap_or("upstream"), model], start_ns);
            if let Some(op) = operation {
                self.spans.add("gen_ai.operation.name", Value::Str(op));
            }
            self.spans.add("gen_ai.request.model", Value::Str(model));
            self.spans.append(to);
            self.attempt = Some(Attempt { status: None });
        }
    }

    /// A realtime turn that ended: a client span under the session's, from `started` until now,
    /// named `realtime <model>`, with the provider's attributes and the turn's usage.
    pub fn turn(&mut self, to: &Attrs, model: &str, started: std::time::Instant, usage: (u64, u64), estimated: bool) {
        if !self.sampled {
            return;
        }
        self.end_attempt(None);
        let end_ns = self.now_ns();
        let start_ns = end_ns.saturating_sub(started.elapsed().as_nanos() as u64);
        self.open_client(&context::new_span_id(), ["realtime", model], start_ns);
        self.spans.add("gen_ai.request.model", Value::Str(model));
        self.spans.add("gen_ai.usage.input_tokens", Value::Int(i64::try_from(usage.0).unwrap_or(i64::MAX)));
        self.spans.add("gen_ai.usage.output_tokens", Value::Int(i64::try_from(usage.1).unwrap_or(i64::MAX)));
        self.spans.add("tollgate.estimated", Value::Bool(estimated));
        self.spans.append(to);
        self.spans.close(end_ns, None);
    }

    /// An MCP tool call that ended: a client span under the request's, from `call.started`
    /// until now, named `tools/call <tool>`, with MCP's semantic attributes.
    pub fn tool_call(&mut self, call: &ToolCall<'_>) {
        if !self.sampled {
            return;
        }
        self.end_attempt(None);
        let end_ns = self.now_ns();
        let start_ns = end_ns.saturating_sub(call.started.elapsed().as_nanos() as u64);
        self.open_client(&context::new_span_id(), ["tools/call", call.tool], start_ns);
        self.spans.add("mcp.method.name", Value::Str("tools/call"));
        self.spans.add("gen_ai.operation.name", Value::Str("execute_tool"));
        self.spans.add("gen_ai.tool.name", Value::Str(call.tool));
        self.spans.add("mcp.protocol.version", Value::Str(call.version));
        if let Some(id) = call.session {
            self.spans.add("mcp.session.id", Value::Str(id));
        }
        self.spans.add("server.address", Value::Str(call.host));
        self.spans.add("server.port", Value::Int(i64::from(call.port)));
        self.spans.add("tollgate.mcp.server", Value::Str(call.server));
        if let Some(kind) = call.error {
            self.spans.add("error.type", Value::Str(kind));
        }
        self.spans.close(end_ns, call.error);
    }

    /// Open a client span under the request's server span.
    fn open_client(&mut self, span_id: &context::SpanId, name: [&str; 2], start_ns: u64) {
        self.spans.open(&Opening {
            trace_id: &self.trace_id,
            span_id,
            parent: Some(&self.server_span),
            remote_parent: false,
            state: self.state.as_deref(),
            name,
            kind: Kind::Client,
            start_ns,
        });
    }

    /// The `traceparent` the upstream attempt under way carries (see [`Self::begin_attempt`]).
    pub fn traceparent(&self) -> Option<&str> {
        self.carried.as_ref().map(context::Traceparent::as_str)
    }

    /// The `tracestate` carried upstream: the client's, unchanged.
    pub fn state(&self) -> Option<&str> {
        self.state.as_deref()
    }

    /// The attempt under way got its response header.
    pub fn attempt_answered(&mut self, status: u16) {
        if let Some(a) = &mut self.attempt {
            a.status = Some(status);
        }
    }

    /// The attempt under way ended without the answer the client gets: failed before a header
    /// (`error`, the failure's kind) or answered with a status that is retried.
    pub fn end_attempt(&mut self, error: Option<&str>) {
        let Some(a) = self.attempt.take() else { return };
        let end_ns = self.now_ns();
        let status_text;
        let error = match (error, a.status) {
            (Some(kind), _) => Some(kind),
            (None, Some(status)) if status >= 400 => {
                status_text = status.to_string();
                Some(status_text.as_str())
            }
            _ => None,
        };
        if let Some(status) = a.status {
            self.spans.add("http.response.status_code", Value::Int(i64::from(status)));
        }
        if let Some(kind) = error {
            self.spans.add("error.type", Value::Str(kind));
        }
        self.spans.close(end_ns, error);
    }

    /// The request ended: the attempt that answered closes with what the answer carried, then
    /// the server span is written. Gives every span of the request, encoded.
    pub fn finish(mut self, facts: &RequestFacts<'_>) -> Spans {
        let answer = self.answer.take().unwrap_or_default();
        // What the answer carried goes on the attempt that answered and on the request: written
        // once, onto the attempt, and copied.
        let on_attempt = self.attempt.is_some().then(|| {
            let from = self.spans.mark();
            answered(&mut self.spans, &answer, facts.usage);
            from..self.spans.mark()
        });
        self.end_attempt(None);
        let name = match (facts.operation, facts.model) {
            (Some(op), Some(model)) => [op, model],
            _ => [facts.method, facts.route],
        };
        let spans = &mut self.spans;
        spans.open(&Opening {
            trace_id: &self.trace_id,
            span_id: &self.server_span,
            parent: self.parent.as_ref(),
            remote_parent: self.parent.is_some(),
            state: self.state.as_deref(),
            name,
            kind: Kind::Server,
            start_ns: self.start_ns,
        });
        spans.add("http.request.method", Value::Str(facts.method));
        spans.add("http.route", Value::Str(facts.route));
        spans.add("http.response.status_code", Value::Int(i64::from(facts.status)));
        if let Some(op) = facts.operation {
            spans.add("gen_ai.operation.name", Value::Str(op));
        }
        if let Some(p) = facts.provider {
            spans.add("gen_ai.provider.name", Value::Str(p));
        }
        if let Some(m) = facts.model {
            spans.add("gen_ai.request.model", Value::Str(m));
        }
        match on_attempt {
            Some(written) => spans.copy(written),
            None => answered(spans, &answer, facts.usage),
        }
        if let Some(name) = facts.key_name {
            spans.add("tollgate.key.name", Value::Str(name));
        }
        if let Some(tags) = facts.tags.filter(|t| !t.is_empty()) {
            let tags: Vec<String> = tags.iter().map(|(k, v)| format!("{k}={v}")).collect();
            spans.add("tollgate.key.tags", Value::Strs(&tags));
        }
        if let Some(cost) = facts.cost_nanos {
            spans.add("tollgate.cost_usd", Value::Double(crate::base::money::usd(cost)));
            spans.add("tollgate.estimated", Value::Bool(facts.estimated));
        }
        if let Some(first) = facts.first_byte {
            spans.add("tollgate.time_to_first_byte_ms", Value::Double(first.as_secs_f64() * 1000.0));
        }
        if let Some(id) = facts.request_id {
            spans.add("tollgate.request_id", Value::Str(id));
        }
        let error_type = match (facts.refusal, facts.status) {
            (Some(code), _) => Some(code.to_string()),
            (None, s) if s >= 400 || s == 0 => Some(if s == 0 { "no_response".to_string() } else { s.to_string() }),
            _ => None,
        };
        if let Some(code) = facts.refusal {
            spans.add("tollgate.refusal", Value::Str(code));
        }
        if let (Some(fell), Some(asked)) = (facts.fallbacks, facts.requested_model) {
            spans.add("tollgate.requested_model", Value::Str(asked));
            spans.add("tollgate.fallbacks", Value::Str(fell));
        }
        if let Some(ids) = facts.rewrites {
            spans.add("tollgate.rewrites", Value::Str(ids));
        }
        if let Some(actions) = facts.guardrail {
            spans.add("tollgate.guardrail.actions", Value::Str(actions));
        }
        if let Some(kind) = &error_type {
            spans.add("error.type", Value::Str(kind));
        }
        let end_ns = self.start_ns + self.start.elapsed().as_nanos() as u64;
        // A server span is in error for the server's failures, not the client's (4xx).
        let error = (facts.status >= 500 || facts.status == 0).then(|| error_type.as_deref().unwrap_or_default());
        spans.close(end_ns, error);
        self.spans
    }
}

/// What the answer said of itself and the tokens it was billed for, as attributes.
fn answered(spans: &mut Spans, answer: &Answer, usage: Option<crate::base::usage::Usage>) {
    if let Some(m) = &answer.model {
        spans.add("gen_ai.response.model", Value::Str(m));
    }
    if !answer.finish_reasons.is_empty() {
        spans.add("gen_ai.response.finish_reasons", Value::Strs(&answer.finish_reasons));
    }
    if let Some(u) = usage {
        spans.add("gen_ai.usage.input_tokens", Value::Int(u.input_total() as i64));
        spans.add("gen_ai.usage.output_tokens", Value::Int(u.output as i64));
        // Cache counts only when there were any (most answers have none).
        if u.cached > 0 {
            spans.add("gen_ai.usage.cache_read.input_tokens", Value::Int(u.cached as i64));
        }
        if u.cache_write > 0 {
            spans.add("gen_ai.usage.cache_creation.input_tokens", Value::Int(u.cache_write as i64));
        }
    }
}

/// `http.request.method`: the method's name when it is a known one, else `_OTHER` (as the
/// HTTP semantic conventions ask: a client's made-up methods do not become attribute values).
pub fn method_name(method: &http::Method) -> &'static str {
    const KNOWN: [&str; 9] = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "CONNECT", "TRACE"];
    KNOWN.into_iter().find(|m| *m == method.as_str()).unwrap_or("_OTHER")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(s: &otlp::decode::Span, key: &str) -> Option<otlp::Decoded> {
        s.attrs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
    }

    #[test]
    fn a_retried_request_has_two_sibling_client_spans_under_its_server_span() {
        let mut t = Trace {
            trace_id: [7; 16],
            server_span: [1; 8],
            parent: Some([9; 8]),
            state: Some("k=v".into()),
            sampled: true,
            start_ns: 1_000,
            start: Instant::now(),
            spans: Spans::default(),
            attempt: None,
            carried: None,
            answer: Some(Answer { model: Some("alpha-5.5-0401".into()), finish_reasons: vec!["stop".into()] }),
        };
        let to = Upstream { gen_ai_provider: "openai", name: "oa", host: "127.0.0.1", port: 9 }.attrs();
        t.begin_attempt(&to, Some("chat"), "alpha-5.5");
        let first = t.traceparent().unwrap().to_string();
        t.attempt_answered(500);
        t.end_attempt(None);
        t.begin_attempt(&to, Some("chat"), "alpha-5.5");
        let second = t.traceparent().unwrap().to_string();
        assert_ne!(first, second);
        assert!(second.starts_with("00-07070707070707070707070707070707-") && second.ends_with("-01"));
        t.attempt_answered(200);
        let usage = crate::base::usage::Usage { input: 10, cached: 2, cache_write: 0, output: 5 };
        let facts = RequestFacts {
            method: "POST",
            route: "chat_completions",
            operation: Some("chat"),
            model: Some("alpha-5.5"),
            status: 200,
            key_name: Some("team-a"),
            usage: Some(usage),
            cost_nanos: Some(1500),
            ..Default::default()
        };
        let spans = otlp::decode::spans(t.finish(&facts).bytes());
        assert_eq!(spans.len(), 3);
        let (retried, answered, server) = (&spans[0], &spans[1], &spans[2]);
        // Server 2, client 3; flags: sampled, and whether the parent is remote (0x100), and it is (0x200).
        assert_eq!((server.kind, server.parent.as_deref(), server.flags), (2, Some(&[9u8; 8][..]), 0x301));
        assert_eq!((server.name.as_str(), server.start_ns, server.state.as_deref()), ("chat alpha-5.5", 1_000, Some("k=v")));
        assert!(server.end_ns >= server.start_ns);
        for client in [retried, answered] {
            assert_eq!((client.kind, client.parent.as_deref(), client.name.as_str()), (3, Some(&[1u8; 8][..]), "chat alpha-5.5"));
            assert_eq!((client.trace_id.as_slice(), client.flags, client.state.as_deref()), (&[7u8; 16][..], 0x101, Some("k=v")));
            assert_eq!(attr(client, "gen_ai.provider.name"), Some(otlp::Decoded::Str("openai".into())));
            assert_eq!(attr(client, "server.port"), Some(otlp::Decoded::Int(9)));
        }
        assert_ne!(retried.span_id, answered.span_id);
        assert!(first.contains(&retried.span_id.iter().map(|b| format!("{b:02x}")).collect::<String>()));
        assert_eq!(attr(retried, "error.type"), Some(otlp::Decoded::Str("500".into())));
        assert_eq!(retried.status, Some(("500".into(), 2)));
        assert_eq!(attr(retried, "gen_ai.usage.input_tokens"), None);
        assert_eq!(attr(answered, "error.type"), None);
        assert_eq!(attr(answered, "http.response.status_code"), Some(otlp::Decoded::Int(200)));
        assert_eq!(attr(answered, "gen_ai.usage.input_tokens"), Some(otlp::Decoded::Int(12)));
        assert_eq!(attr(answered, "gen_ai.usage.cache_read.input_tokens"), Some(otlp::Decoded::Int(2)));
        assert_eq!(attr(answered, "gen_ai.response.finish_reasons"), Some(otlp::Decoded::Strs(vec!["stop".into()])));
        // What the answer carried is on the server span too, once.
        for key in ["gen_ai.response.model", "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "gen_ai.response.finish_reasons"] {
            assert_eq!(server.attrs.iter().filter(|(k, _)| k == key).count(), 1, "{key}");
            assert_eq!(attr(server, key), attr(answered, key), "{key}");
        }
        assert_eq!(attr(server, "gen_ai.response.model"), Some(otlp::Decoded::Str("alpha-5.5-0401".into())));
        assert_eq!(attr(server, "tollgate.cost_usd"), Some(otlp::Decoded::Double(1.5e-6)));
        assert_eq!(attr(server, "tollgate.estimated"), Some(otlp::Decoded::Bool(false)));
        assert_eq!(attr(server, "tollgate.key.name"), Some(otlp::Decoded::Str("team-a".into())));
        assert_eq!(server.status, None);
    }

    #[test]
    fn a_request_without_an_upstream_attempt_has_its_server_span_alone() {
        let t = Trace {
            trace_id: [3; 16],
            server_span: [4; 8],
            parent: None,
            state: None,
            sampled: true,
            start_ns: 5,
            start: Instant::now(),
            spans: Spans::default(),
            attempt: None,
            carried: None,
            answer: None,
        };
        let facts = RequestFacts {
            method: "POST",
            route: "chat_completions",
            status: 502,
            refusal: Some("no_upstream"),
            guardrail: Some("secrets:input:mask:aws_key"),
            requested_model: Some("alpha-4o-mini"),
            fallbacks: Some("alpha-4o-mini:context_window"),
            rewrites: Some("no-betas,effort"),
            ..Default::default()
        };
        let spans = otlp::decode::spans(t.finish(&facts).bytes());
        assert_eq!(spans.len(), 1);
        let server = &spans[0];
        assert_eq!((server.kind, server.parent.as_ref(), server.flags, server.name.as_str()), (2, None, 0x101, "POST chat_completions"));
        assert_eq!(attr(server, "tollgate.refusal"), Some(otlp::Decoded::Str("no_upstream".into())));
        // What a guardrail did, never what it found.
        assert_eq!(attr(server, "tollgate.guardrail.actions"), Some(otlp::Decoded::Str("secrets:input:mask:aws_key".into())));
        // The model asked for and each one left, and the rewrite rules applied (issue 69).
        assert_eq!(attr(server, "tollgate.requested_model"), Some(otlp::Decoded::Str("alpha-4o-mini".into())));
        assert_eq!(attr(server, "tollgate.fallbacks"), Some(otlp::Decoded::Str("alpha-4o-mini:context_window".into())));
        assert_eq!(attr(server, "tollgate.rewrites"), Some(otlp::Decoded::Str("no-betas,effort".into())));
        assert_eq!(server.status, Some(("no_upstream".into(), 2)));
    }

    #[test]
    fn an_unsampled_request_carries_its_trace_on_and_records_nothing() {
        let settings = crate::config::telemetry::resolve(
            Some(&crate::config::telemetry::RawOtlp { sample_ratio: Some(0.0), ..Default::default() }),
            &|_| None,
        )
        .unwrap()
        .unwrap();
        let metrics = crate::observe::metrics::Metrics::default();
        let tracer = Tracer::start(&settings, &metrics).unwrap();
        let mut t = tracer.begin(None, None);
        assert!(!t.sampled);
        t.begin_attempt(&Upstream { gen_ai_provider: "openai", name: "oa", host: "h", port: 1 }.attrs(), None, "m");
        assert!(t.traceparent().unwrap().ends_with("-00"));
        assert!(otlp::decode::spans(t.finish(&RequestFacts::default()).bytes()).iter().all(|s| s.kind == 2));
        // The client's decision wins over the ratio.
        let continued = tracer.begin(Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"), None);
        assert!(continued.sampled);
    }
}
