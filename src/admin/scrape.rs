//! What Prometheus scrapes: the `/metrics` text (every family with its `# HELP`), served by the
//! admin listener and, with `metrics: { listen, token_env, allow }`, by a listener of its own
//! that answers `/metrics` alone and may bind a non-loopback address — so a Prometheus on
//! another host can scrape without reaching the admin API. That listener wants the bearer
//! token (`token_env`), or a client address in `allow`, or both; a non-loopback one with
//! neither is refused by the configuration check.

use crate::observe::metrics::Metrics;
use crate::protocol::response::LocalResponse;
use crate::protocol::{ApiError, ErrorKind};
use crate::store::sled::SledDb;
use crate::store::Store;
use async_trait::async_trait;
use pingora_proxy::Session;
use std::fmt::Write;
use std::sync::Arc;

/// What the `/metrics` text is read from.
pub struct Scrape {
    pub metrics: Arc<Metrics>,
    pub keys: Arc<crate::access::auth::KeyIndex>,
    /// This node's sled database (its size).
    pub local: SledDb,
    pub store: Arc<dyn Store>,
    pub health: Arc<crate::upstream::health::HealthBook>,
    pub video: Option<Arc<crate::video::VideoService>>,
    /// The response cache (the bytes it keeps).
    pub cache: Option<Arc<crate::cache::Cache>>,
}

/// Every metric family tollgate exposes, with its help text (the `# HELP` line).
const HELP: &[(&str, &str)] = &[
    ("tollgate_requests_total", "Client requests answered, by route, model and status."),
    ("tollgate_tokens_total", "Tokens billed, by model and kind (input, output)."),
    ("tollgate_cost_usd_total", "USD charged, by model."),
    ("tollgate_cache_lookups_total", "Response cache lookups, by result (hit, miss, refresh, bypass)."),
    ("tollgate_cache_stores_total", "Answers offered to the response cache, by outcome (kept, too_large, failed)."),
    ("tollgate_cache_saved_usd_total", "USD the response cache saved (the original answers' list cost less the hit price), by model."),
    ("tollgate_cache_bytes", "Bytes of answers the response cache keeps."),
    ("tollgate_estimated_bills_total", "Requests billed from an estimate (the upstream reported no usage), by model."),
    ("gen_ai_client_token_usage", "Tokens per relayed model call (OpenTelemetry GenAI), by operation, provider, model and token type."),
    ("gen_ai_server_request_duration", "Seconds per relayed model call (OpenTelemetry GenAI)."),
    ("gen_ai_server_time_to_first_token", "Seconds to a streamed call's first token (OpenTelemetry GenAI)."),
    ("tollgate_upstream_seconds", "Seconds from a request's start to its upstream's response header, by protocol."),
    ("tollgate_first_byte_seconds", "Seconds from a request's start to the first byte of its answer, by protocol."),
    ("tollgate_in_flight_requests", "Client requests being served now."),
    ("tollgate_open_streams", "Streamed answers open now."),
    ("tollgate_client_connections", "Client connections open now."),
    ("tollgate_keys", "API keys known to this node."),
    ("tollgate_database_bytes", "Size of this node's database on disk, in bytes."),
    ("tollgate_video_tasks_open", "Video tasks not yet finished."),
    ("tollgate_video_poller_lag_seconds", "Age of the oldest unpolled video task, in seconds."),
    ("tollgate_video_tasks", "Open video tasks, by status."),
    ("tollgate_video_tasks_finished_total", "Video tasks finished since start, by status."),
    ("tollgate_video_tasks_total", "Video tasks created, by model."),
    ("tollgate_provider_state", "A provider's state: 0 serving, 1 resting after failures or a 429, 2 without a resolved address."),
    ("tollgate_provider_key_state", "A provider key's state: 0 serving, 1 resting after a 429 or an auth failure."),
    ("tollgate_provider_cooldowns_total", "Times a provider was rested, by provider."),
    ("tollgate_provider_key_cooldowns_total", "Times a provider key was rested, by provider and key."),
    ("tollgate_provider_retries_total", "Requests sent again to another provider, by provider."),
    ("tollgate_upstream_responses_total", "Upstream responses, by provider and status."),
    ("tollgate_affinity_overflow_total", "Conversations sent past their home provider because it was above its share, by provider."),
    ("tollgate_refusals_total", "Requests refused by tollgate, by code."),
    ("tollgate_keyless_refusals_total", "Refusals without a known key, by whether they were logged."),
    ("tollgate_mcp_tool_calls_total", "MCP tool calls, by server, tool and outcome (ok, tool_error, rpc_error, unreachable)."),
    ("tollgate_mcp_tool_call_seconds", "Time from an MCP tool call's start to its server's answer, by server and tool."),
    (
        "tollgate_guardrail_actions_total",
        "What guardrails did, by guardrail, phase (input, output) and action (block, mask, monitor, error, allow); never what they found.",
    ),
    ("tollgate_guardrail_seconds", "Time a guardrail took to check a call (a webhook's round trip included), by guardrail."),
    ("tollgate_admin_refused_total", "Admin API and console requests refused, by reason."),
    ("tollgate_connections_refused_total", "Client connections closed at once by a connection cap, by reason."),
    ("tollgate_request_headers_refused_total", "Request headers refused before Pingora read them, by reason."),
    ("tollgate_drained_responses_total", "Answers read to their end after the client left, by outcome."),
    ("tollgate_otlp_spans_total", "Trace spans, by outcome (exported, export failed, dropped)."),
    ("tollgate_store_statements_total", "Statements sent to the shared database."),
    ("tollgate_store_statements_per_request", "Statements sent to the shared database per client request."),
];

/// The help of family `name`, if tollgate knows it.
pub fn help_of(name: &str) -> Option<&'static str> {
    HELP.iter().find(|(n, _)| *n == name).map(|(_, h)| *h)
}

/// `text` with a `# HELP` line before every `# TYPE` line. A family without a help text here
/// gets its name as help (and a test fails: every family must have one).
pub fn with_help(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 4);
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let name = rest.split_whitespace().next().unwrap_or_default();
            let _ = writeln!(out, "# HELP {name} {}", help_of(name).unwrap_or(name));
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

impl Scrape {
    /// The Prometheus text of this node.
    pub async fn text(&self) -> std::result::Result<String, ApiError> {
        let keys = match self.keys.all_keys().await {
            Ok(keys) => keys.len() as f64,
            Err(e) => {
                log::error!("metrics: {e}");
                return Err(ApiError::new(ErrorKind::Internal, "Internal error while reading the keys."));
            }
        };
        let db_bytes = self.local.size_on_disk() as f64;
        let (by_status, lag) = match &self.video {
            Some(v) => v.open_stats().await,
            None => (Default::default(), 0),
        };
        let (completed, failed) = self.video.as_ref().map_or((0, 0), |v| v.finished_counts());
        let open: usize = by_status.values().sum();
        let cache_bytes = match &self.cache {
            Some(c) => c.bytes().await.map_or_else(
                |e| {
                    log::warn!("metrics: the response cache's size could not be read: {e}");
                    None
                },
                Some,
            ),
            None => None,
        };
        let mut text = self.metrics.render(&[
            ("tollgate_cache_bytes", cache_bytes.unwrap_or(0) as f64),
            ("tollgate_keys", keys),
            ("tollgate_database_bytes", db_bytes),
            ("tollgate_video_tasks_open", open as f64),
            ("tollgate_video_poller_lag_seconds", lag as f64),
        ]);
        text.push_str(&self.health.render());
        if let Some(statements) = self.store.statements() {
            // How far leases and batches keep the shared database off the request path.
            let requests = self.metrics.total_requests();
            let _ = write!(
                text,
                "# TYPE tollgate_store_statements_total counter\ntollgate_store_statements_total {statements}\n# TYPE tollgate_store_statements_per_request gauge\ntollgate_store_statements_per_request {}\n",
                if requests == 0 { 0.0 } else { statements as f64 / requests as f64 }
            );
        }
        text.push_str("# TYPE tollgate_video_tasks gauge\n");
        for status in ["queued", "in_progress"] {
            let _ = writeln!(text, "tollgate_video_tasks{{status=\"{status}\"}} {}", by_status.get(status).copied().unwrap_or(0));
        }
        let _ = write!(
            text,
            "# TYPE tollgate_video_tasks_finished_total counter\ntollgate_video_tasks_finished_total{{status=\"completed\"}} {completed}\ntollgate_video_tasks_finished_total{{status=\"failed\"}} {failed}\n"
        );
        Ok(with_help(&text))
    }

    /// The `/metrics` answer.
    pub async fn response(&self) -> std::result::Result<LocalResponse, ApiError> {
        let mut resp = LocalResponse::json(200, &serde_json::Value::Null);
        resp.body = self.text().await?.into();
        resp.content_type = "text/plain; version=0.0.4";
        Ok(resp)
    }
}

/// The `metrics.listen` listener: `GET /metrics` alone, behind a token or an address allowlist.
pub struct MetricsListener {
    pub scrape: Arc<Scrape>,
    pub token: Option<String>,
    pub allow: Vec<crate::policy::Cidr>,
}

impl MetricsListener {
    async fn respond(&self, session: &Session) -> std::result::Result<LocalResponse, ApiError> {
        let req = session.req_header();
        if !self.allow.is_empty() {
            let peer = session.client_addr().and_then(|a| a.as_inet()).map(|a| crate::policy::normalize(a.ip()));
            if !peer.is_some_and(|ip| self.allow.iter().any(|c| c.contains(ip))) {
                self.scrape.metrics.counter("tollgate_admin_refused_total", &[("reason", "metrics_address")]).add(1);
                return Err(ApiError::new(ErrorKind::Forbidden, "This address may not read the metrics."));
            }
        }
        if let Some(token) = &self.token {
            let presented = req
                .headers
                .get(http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .unwrap_or_default();
            if !crate::base::secrets::token_matches(presented, token) {
                self.scrape.metrics.counter("tollgate_admin_refused_total", &[("reason", "metrics_token")]).add(1);
                return Err(ApiError::new(ErrorKind::Unauthorized, "Missing or wrong metrics token."));
            }
        }
        match (req.method.as_str(), req.uri.path()) {
            ("GET", "/metrics") => self.scrape.response().await,
            _ => Err(ApiError::new(ErrorKind::NotFound, "This listener serves GET /metrics only.")),
        }
    }
}

#[async_trait]
impl crate::edge::local::Answer for MetricsListener {
    async fn answer(&self, session: &mut Session) -> std::result::Result<LocalResponse, ApiError> {
        self.respond(session).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_line_gets_its_help() {
        let text =
            "# TYPE tollgate_keys gauge\ntollgate_keys 3\n# TYPE tollgate_refusals_total counter\ntollgate_refusals_total{code=\"x\"} 1\n";
        let out = with_help(text);
        assert!(out.starts_with("# HELP tollgate_keys API keys known to this node.\n# TYPE tollgate_keys gauge\n"), "{out}");
        assert!(
            out.contains("# HELP tollgate_refusals_total Requests refused by tollgate, by code.\n# TYPE tollgate_refusals_total counter")
        );
        assert_eq!(out.lines().filter(|l| l.starts_with("# HELP")).count(), 2);
    }

    #[test]
    fn every_family_the_code_names_has_a_help() {
        // Every metric name written as a literal anywhere in the sources.
        let sources = [
            include_str!("../observe/metrics.rs"),
            include_str!("../upstream/health.rs"),
            include_str!("scrape.rs"),
            include_str!("../edge/gateway/mod.rs"),
            include_str!("../edge/gateway/report.rs"),
            include_str!("../edge/gateway/stream.rs"),
            include_str!("console/mod.rs"),
            include_str!("../edge/listener.rs"),
            include_str!("../observe/telemetry/export.rs"),
            include_str!("api.rs"),
            include_str!("../checks/guard/mod.rs"),
        ];
        for source in sources {
            for piece in source.split('"').skip(1).step_by(2) {
                let name = piece.split(['{', ' ']).next().unwrap_or_default();
                let family = name.trim_end_matches("_bucket").trim_end_matches("_sum").trim_end_matches("_count");
                if (family.starts_with("tollgate_") || family.starts_with("gen_ai_"))
                    && family.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
                {
                    assert!(help_of(family).is_some(), "no # HELP for {family}");
                }
            }
        }
    }
}
