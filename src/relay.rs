//! Everything about sending a request on to an upstream: the provider catalog (which providers
//! serve a model, which models a group sees), the request-body fields routing needs, the upstream
//! request rewrite (credentials, host, path), peers built from pre-resolved addresses, and the
//! background DNS refresh.

use crate::auth::KEY_HEADERS;
use crate::config::{Config, ProviderConfig, Protocol};
use crate::protocol::{ApiError, ErrorKind, ModelEntry};
use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_http::RequestHeader;
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// A configured provider with its resolved addresses.
pub struct Upstream {
    pub config: ProviderConfig,
    addrs: ArcSwap<Vec<SocketAddr>>,
    pool_key: u64,
}

impl Upstream {
    fn new(config: ProviderConfig) -> Self {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        config.name.hash(&mut h);
        Upstream { pool_key: h.finish(), config, addrs: ArcSwap::from_pointee(Vec::new()) }
    }

    /// A peer for this upstream, or None while its host does not resolve.
    pub fn peer(&self, attempt: usize) -> Option<HttpPeer> {
        let addrs = self.addrs.load();
        if addrs.is_empty() {
            return None;
        }
        let addr = addrs[attempt % addrs.len()];
        let base = &self.config.base_url;
        let mut peer = HttpPeer::new(addr, base.tls, base.host.clone());
        peer.options.connection_timeout = Some(Duration::from_millis(self.config.connect_timeout_ms));
        peer.options.read_timeout = Some(Duration::from_secs(self.config.read_timeout_secs));
        peer.options.write_timeout = Some(Duration::from_secs(self.config.read_timeout_secs));
        peer.options.idle_timeout = Some(Duration::from_secs(60));
        // Connections are pooled per provider: two providers on one host with different CA
        // settings never share a connection verified under the other's.
        peer.group_key = self.pool_key;
        if base.tls {
            peer.options.verify_cert = true;
            peer.options.verify_hostname = true;
            peer.options.ca = self.config.ca.clone();
        }
        Some(peer)
    }

    /// Whether the host currently has addresses.
    pub fn is_resolved(&self) -> bool {
        !self.addrs.load().is_empty()
    }

    /// Resolve the host now (blocking: call at start-up or from a blocking task).
    fn resolve_blocking(&self) -> std::io::Result<()> {
        use std::net::ToSocketAddrs;
        let base = &self.config.base_url;
        let found: Vec<SocketAddr> = (base.host.as_str(), base.port).to_socket_addrs()?.collect();
        if found.is_empty() {
            return Err(std::io::Error::other("no addresses"));
        }
        self.addrs.store(Arc::new(found));
        Ok(())
    }
}

/// Providers by protocol and model, and which protocols each group may call.
pub struct Catalog {
    pub upstreams: Vec<Arc<Upstream>>,
    by_model: HashMap<(Protocol, String), Vec<usize>>,
    groups: BTreeMap<String, Vec<Protocol>>,
    /// Unix time shown as the models' creation time.
    created: u64,
}

impl Catalog {
    pub fn new(config: &Config, created: u64) -> Catalog {
        let mut by_model: HashMap<(Protocol, String), Vec<usize>> = HashMap::new();
        for (i, p) in config.providers.iter().enumerate() {
            for m in &p.models {
                let entry = by_model.entry((p.protocol, m.clone())).or_default();
                if !entry.contains(&i) {
                    entry.push(i);
                }
            }
        }
        Catalog {
            upstreams: config.providers.iter().cloned().map(|p| Arc::new(Upstream::new(p))).collect(),
            by_model,
            groups: config.groups.clone(),
            created,
        }
    }

    pub fn has_group(&self, group: &str) -> bool {
        self.groups.contains_key(group)
    }

    /// Whether a key of `group` may call `protocol`.
    pub fn group_allows(&self, group: &str, protocol: Protocol) -> bool {
        self.groups.get(group).is_some_and(|p| p.contains(&protocol))
    }

    /// Provider indexes serving `model` over `protocol`, in configuration order.
    pub fn candidates(&self, protocol: Protocol, model: &str) -> Option<&[usize]> {
        self.by_model
            .get(&(protocol, model.to_string()))
            .map(Vec::as_slice)
            .filter(|c| !c.is_empty())
    }

    /// Models a group may call, optionally restricted to one protocol; first occurrence wins.
    pub fn models_for(&self, group: &str, only: Option<Protocol>) -> Vec<ModelEntry> {
        let mut out: Vec<ModelEntry> = Vec::new();
        for u in &self.upstreams {
            let p = u.config.protocol;
            if only.is_some_and(|o| o != p) || !self.group_allows(group, p) {
                continue;
            }
            for m in &u.config.models {
                if !out.iter().any(|e| &e.id == m) {
                    out.push(ModelEntry { id: m.clone(), created: self.created, owned_by: p.as_str() });
                }
            }
        }
        out
    }

    /// Resolve every upstream host; failures are logged and retried by [`DnsRefresh`].
    pub fn resolve_all_blocking(&self) {
        for u in &self.upstreams {
            if let Err(e) = u.resolve_blocking() {
                log::warn!("provider {}: cannot resolve {}: {e}", u.config.name, u.config.base_url.host);
            }
        }
    }
}

/// Re-resolves upstream hosts on a timer so `upstream_peer` never does DNS.
pub struct DnsRefresh {
    pub routing: Arc<ArcSwap<crate::gateway::Routing>>,
    pub every: Duration,
}

#[async_trait]
impl BackgroundService for DnsRefresh {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(self.every) => {}
            }
            let routing = self.routing.load_full();
            for u in &routing.catalog.upstreams {
                let u = u.clone();
                let result = tokio::task::spawn_blocking(move || {
                    let r = u.resolve_blocking();
                    (u, r)
                })
                .await;
                if let Ok((u, Err(e))) = result {
                    log::warn!("provider {}: DNS refresh failed, keeping old addresses: {e}", u.config.name);
                }
            }
        }
    }
}

/// The request-body fields tollgate reads; everything else is skipped without allocation.
#[derive(Debug, Default, Deserialize)]
pub struct BodyFields {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub stream: Option<bool>,
    /// Chat completions (legacy name) and messages.
    #[serde(default)]
    pub max_tokens: Option<u64>,
    #[serde(default)]
    pub max_completion_tokens: Option<u64>,
    /// Responses.
    #[serde(default)]
    pub max_output_tokens: Option<u64>,
    #[serde(default, rename = "generationConfig")]
    pub generation_config: Option<GenerationConfig>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
}

#[derive(Debug, Default, Deserialize)]
pub struct GenerationConfig {
    #[serde(default, rename = "maxOutputTokens")]
    pub max_output_tokens: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

impl BodyFields {
    /// The most output tokens the request allows, if it says.
    pub fn max_output(&self) -> Option<u64> {
        self.max_completion_tokens
            .or(self.max_tokens)
            .or(self.max_output_tokens)
            .or(self.generation_config.as_ref().and_then(|g| g.max_output_tokens))
    }
}

/// A streaming chat-completions body with `stream_options.include_usage` set, so that usage is
/// reported; None when the body cannot be rewritten.
pub fn with_include_usage(body: &[u8]) -> Option<bytes::Bytes> {
    let mut v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let obj = v.as_object_mut()?;
    let opts = obj.entry("stream_options").or_insert_with(|| serde_json::json!({}));
    opts.as_object_mut()?.insert("include_usage".into(), serde_json::Value::Bool(true));
    serde_json::to_vec(&v).ok().map(bytes::Bytes::from)
}

/// Parse the fields routing needs from a JSON request body.
pub fn body_fields(body: &[u8]) -> Result<BodyFields, ApiError> {
    if body.is_empty() {
        return Err(ApiError::new(ErrorKind::BadRequest, "The request body is empty; send a JSON object."));
    }
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::new(ErrorKind::BadRequest, "The request body must be a JSON object."));
    }
    serde_json::from_slice::<BodyFields>(body).map_err(|e| {
        ApiError::new(ErrorKind::BadRequest, format!("The request body is not valid JSON: {e}"))
    })
}

/// Rewrite the request for `upstream`: strip every client credential, set the provider's,
/// set `Host`, prefix the path, and fix the body headers for the preset body.
pub fn rewrite_request(
    req: &mut RequestHeader,
    upstream: &Upstream,
    client_version: Option<&str>,
    body_len: usize,
) -> pingora_error::Result<()> {
    for name in KEY_HEADERS {
        req.remove_header(name);
    }
    for name in ["proxy-authorization", "compat-version", "anthropic-version", "cookie"] {
        req.remove_header(name);
    }
    // The usage scanner needs plain bytes: ask the upstream not to compress.
    req.remove_header("accept-encoding");
    req.remove_header("transfer-encoding");
    // The whole body is already here: the upstream need not confirm it wants it.
    req.remove_header("expect");
    req.insert_header("content-length", body_len.to_string())?;

    let cfg = &upstream.config;
    match cfg.protocol {
        Protocol::Openai => {
            req.insert_header("authorization", format!("Bearer {}", cfg.api_key))?;
        }
        Protocol::Anthropic => {
            req.insert_header("x-api-key", cfg.api_key.as_str())?;
            req.insert_header("anthropic-version", client_version.unwrap_or(&cfg.anthropic_version))?;
        }
        Protocol::Gemini => {
            req.insert_header("x-goog-api-key", cfg.api_key.as_str())?;
        }
    }
    req.insert_header("host", cfg.base_url.host_header())?;

    let path = upstream_path(req.uri.path(), &cfg.base_url.prefix);
    let path_and_query = match req.uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path,
    };
    let uri = http::Uri::builder()
        .path_and_query(path_and_query)
        .build()
        .map_err(|e| pingora_error::Error::because(pingora_error::ErrorType::InternalError, "upstream uri", e))?;
    req.set_uri(uri);
    Ok(())
}

/// The upstream path: root aliases gain `/v1`, then the base-URL prefix goes in front.
pub fn upstream_path(client_path: &str, prefix: &str) -> String {
    let versioned = if client_path.starts_with("/v1/") || client_path.starts_with("/v1beta/") {
        client_path.to_string()
    } else {
        format!("/v1{client_path}")
    };
    format!("{prefix}{versioned}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        let text = r#"
listen: 127.0.0.1:8080
providers:
  - { name: a, protocol: openai, base_url: "http://127.0.0.1:1/p", api_key: up-a, models: [alpha-5.5, alpha-4o-mini] }
  - { name: b, protocol: openai, base_url: "http://127.0.0.1:2", api_key: up-b, models: [alpha-5.5] }
  - { name: c, protocol: anthropic, base_url: "https://api.example.com", api_key: up-c, models: [beta-opus-4-7] }
  - { name: d, protocol: gemini, base_url: "http://127.0.0.1:3", api_key: up-d, models: [gamma-3.5-flash] }
groups:
  default: { platforms: [openai, anthropic, gemini] }
  chat: { platforms: [openai] }
"#;
        Config::parse(text, &|_| None).expect("valid")
    }

    #[test]
    fn candidates_in_config_order_per_protocol() {
        let c = Catalog::new(&config(), 0);
        assert_eq!(c.candidates(Protocol::Openai, "alpha-5.5"), Some(&[0usize, 1][..]));
        assert_eq!(c.candidates(Protocol::Openai, "alpha-4o-mini"), Some(&[0usize][..]));
        assert_eq!(c.candidates(Protocol::Anthropic, "alpha-5.5"), None);
        assert_eq!(c.candidates(Protocol::Openai, "nope"), None);
    }

    #[test]
    fn models_filtered_by_group() {
        let c = Catalog::new(&config(), 0);
        let ids = |g, p| c.models_for(g, p).into_iter().map(|m| m.id).collect::<Vec<_>>();
        assert_eq!(ids("default", None), ["alpha-5.5", "alpha-4o-mini", "beta-opus-4-7", "gamma-3.5-flash"]);
        assert_eq!(ids("chat", None), ["alpha-5.5", "alpha-4o-mini"]);
        assert!(ids("chat", Some(Protocol::Gemini)).is_empty());
        assert_eq!(ids("default", Some(Protocol::Gemini)), ["gamma-3.5-flash"]);
        assert!(ids("missing-group", None).is_empty());
    }

    #[test]
    fn body_fields_with_model_last_in_a_large_body() {
        let filler = "x".repeat(1 << 20);
        let body = format!(r#"{{"messages":[{{"role":"user","content":"{filler}"}}],"stream":true,"model":"alpha-5.5"}}"#);
        let f = body_fields(body.as_bytes()).expect("parse");
        assert_eq!(f.model.as_deref(), Some("alpha-5.5"));
        assert_eq!(f.stream, Some(true));
        assert_eq!(body_fields(b"{").unwrap_err().status(), 400);
        assert_eq!(body_fields(b"").unwrap_err().status(), 400);
        assert_eq!(body_fields(b"[1]").unwrap_err().status(), 400);
        assert_eq!(body_fields(br#"["alpha-5.5"]"#).unwrap_err().status(), 400);
        assert_eq!(body_fields(b"{}").expect("empty object").model, None);
    }

    #[test]
    fn max_output_and_include_usage() {
        let f = body_fields(br#"{"model":"m","max_tokens":7}"#).expect("parse");
        assert_eq!(f.max_output(), Some(7));
        let f = body_fields(br#"{"model":"m","max_completion_tokens":9,"max_tokens":7}"#).expect("parse");
        assert_eq!(f.max_output(), Some(9));
        let f = body_fields(br#"{"generationConfig":{"maxOutputTokens":11,"temperature":1}}"#).expect("parse");
        assert_eq!(f.max_output(), Some(11));
        let f = body_fields(br#"{"model":"m","stream_options":{"include_usage":true}}"#).expect("parse");
        assert_eq!(f.stream_options.and_then(|o| o.include_usage), Some(true));
        let rewritten = with_include_usage(br#"{"model":"m","stream":true,"stream_options":{"x":1}}"#).expect("rewrite");
        let v: serde_json::Value = serde_json::from_slice(&rewritten).expect("json");
        assert_eq!(v["stream_options"], serde_json::json!({"x": 1, "include_usage": true}));
        assert_eq!(v["model"], "m");
    }

    #[test]
    fn rewrite_strips_client_keys_and_sets_provider_credentials() {
        let c = Catalog::new(&config(), 0);
        let mut req = RequestHeader::build("POST", b"/messages?beta=true", None).expect("req");
        for (k, v) in [
            ("authorization", "Bearer sk-client"),
            ("x-api-key", "sk-client"),
            ("x-goog-api-key", "sk-client"),
            ("x-alt-api-key", "sk-client"),
            ("compat-version", "2024-01-01"),
            ("accept-encoding", "gzip"),
            ("host", "gateway.local"),
        ] {
            req.insert_header(k, v).expect("hdr");
        }
        rewrite_request(&mut req, &c.upstreams[2], Some("2024-01-01"), 12).expect("rewrite");
        let wire = format!("{:?}", req.headers);
        assert!(!wire.contains("sk-client"), "{wire}");
        assert_eq!(req.headers["x-api-key"], "up-c");
        assert_eq!(req.headers["anthropic-version"], "2024-01-01");
        assert_eq!(req.headers["host"], "api.example.com");
        assert_eq!(req.headers["content-length"], "12");
        assert!(req.headers.get("compat-version").is_none());
        assert!(req.headers.get("accept-encoding").is_none());
        assert_eq!(req.uri.to_string(), "/v1/messages?beta=true");

        let mut req = RequestHeader::build("POST", b"/v1/chat/completions", None).expect("req");
        req.insert_header("x-api-key", "sk-client").expect("hdr");
        rewrite_request(&mut req, &c.upstreams[0], None, 0).expect("rewrite");
        assert_eq!(req.headers["authorization"], "Bearer up-a");
        assert!(req.headers.get("x-api-key").is_none());
        assert_eq!(req.headers["host"], "127.0.0.1:1");
        assert_eq!(req.uri.path(), "/p/v1/chat/completions");
    }

    #[test]
    fn anthropic_version_defaults_and_paths() {
        let c = Catalog::new(&config(), 0);
        let mut req = RequestHeader::build("POST", b"/v1/messages", None).expect("req");
        rewrite_request(&mut req, &c.upstreams[2], None, 0).expect("rewrite");
        assert_eq!(req.headers["anthropic-version"], crate::config::DEFAULT_ANTHROPIC_VERSION);
        assert_eq!(upstream_path("/v1beta/models/g:generateContent", ""), "/v1beta/models/g:generateContent");
        assert_eq!(upstream_path("/embeddings", "/x"), "/x/v1/embeddings");
    }
}
