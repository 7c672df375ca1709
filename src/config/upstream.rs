//! `providers`, `groups`, `forward_headers`, `forward_response_headers`, `retry` and
//! `routing`: the upstreams, who may call them, what is relayed, and how requests are spread
//! and retried.

use super::cloud::{Cloud, ProviderKind, RawAws, RawCloud, RawEntra};
use super::{err, secret, ConfigError, Protocol};
use serde::Deserialize;
use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;

/// `providers:`: names unique, a base URL without the protocol's version segment, one or
/// more upstream keys (literal or from the environment), and models to serve.
pub(super) fn providers(raw: Vec<RawProvider>, env: &dyn Fn(&str) -> Option<String>) -> Result<Vec<ProviderConfig>, ConfigError> {
    let mut providers = Vec::with_capacity(raw.len());
    let mut names = HashSet::new();
    for (i, mut p) in raw.into_iter().enumerate() {
        let at = format!("providers[{i}]");
        if p.name.trim().is_empty() {
            return err(format!("{at}.name: must not be empty"));
        }
        if !names.insert(p.name.clone()) {
            return err(format!("{at}.name: '{}' is used twice", p.name));
        }
        let raw_cloud = RawCloud {
            region: p.region.take(),
            endpoint_url: p.endpoint_url.take(),
            aws: p.aws.take(),
            project: p.project.take(),
            location: p.location.take(),
            credentials_file: p.credentials_file.take(),
            api_version: p.api_version.take(),
            entra: p.entra.take(),
        };
        let url_key = if p.protocol == ProviderKind::Bedrock { "endpoint_url" } else { "base_url" };
        let (cloud, url) = super::cloud::cloud(&at, p.protocol, raw_cloud, p.base_url.take(), env)?;
        let base_url = BaseUrl::parse(&url).map_err(|e| ConfigError(format!("{at}.{url_key}: {e}")))?;
        version_segment_refused(&at, &url, &base_url, p.protocol)?;
        // Bedrock and Vertex sign in with their own credentials; Azure with Entra ID or a key.
        let keyless =
            matches!(cloud, Some(Cloud::Bedrock(_) | Cloud::Vertex(_) | Cloud::Azure(super::cloud::Azure { entra: Some(_), .. })));
        let api_keys = if keyless {
            if p.api_key.is_some() || p.api_key_env.is_some() || p.api_keys.is_some() || p.api_keys_env.is_some() {
                return err(format!("{at}.api_key: not used by this provider (it signs in with its {} credentials)", p.protocol.as_str()));
            }
            Vec::new()
        } else {
            upstream_keys(&at, p.api_key.take(), p.api_key_env.take(), p.api_keys.take(), p.api_keys_env.take(), env)?
        };
        provider_bounds(&at, &p)?;
        let (models, upstream_names) = model_names(&at, std::mem::take(&mut p.models))?;
        let ca = match &p.ca_file {
            Some(path) if base_url.tls => {
                Some(crate::base::tls::load_ca_bundle(path).map_err(|e| ConfigError(format!("{at}.ca_file: {e}")))?)
            }
            Some(_) => return err(format!("{at}.ca_file: only for an https base_url")),
            None => None,
        };
        let rewrite =
            super::rewrite::rules(&format!("providers.{}", p.name), std::mem::take(&mut p.rewrite), super::rewrite::Owner::Provider)?;
        providers.push(ProviderConfig {
            rewrite: rewrite.into(),
            ca,
            name: p.name,
            protocol: p.protocol.protocol(),
            kind: p.protocol,
            cloud,
            upstream_names,
            base_url,
            api_keys,
            priority: p.priority.unwrap_or(0),
            weight: p.weight.unwrap_or(1),
            cooldown: std::time::Duration::from_secs(p.cooldown_secs.unwrap_or(30)),
            failures_before_cooldown: p.failures_before_cooldown.unwrap_or(3),
            models,
            anthropic_version: p.anthropic_version.unwrap_or_else(|| DEFAULT_ANTHROPIC_VERSION.to_string()),
            connect_timeout_ms: p.connect_timeout_ms.unwrap_or(10_000),
            read_timeout_secs: p.read_timeout_secs.unwrap_or(600),
            responses: p.responses.unwrap_or(true),
        });
    }
    Ok(providers)
}

/// A provider's upstream keys: exactly one of `api_key`, `api_key_env`, `api_keys`,
/// `api_keys_env` (a list split on commas and spaces), each printable ASCII.
fn upstream_keys(
    at: &str,
    api_key: Option<String>,
    api_key_env: Option<String>,
    api_keys: Option<Vec<String>>,
    api_keys_env: Option<String>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<String>, ConfigError> {
    let single = secret(&format!("{at}.api_key"), api_key, api_key_env, env)?;
    let pool_env = match api_keys_env {
        Some(name) => match env(&name) {
            Some(v) if !v.trim().is_empty() => {
                Some(v.split(|c: char| c == ',' || c.is_whitespace()).filter(|k| !k.is_empty()).map(str::to_string).collect())
            }
            _ => return err(format!("{at}.api_keys_env: environment variable {name} is not set")),
        },
        None => None,
    };
    let keys: Vec<String> = match (single, api_keys, pool_env) {
        (Some(k), None, None) => vec![k],
        (None, Some(pool), None) | (None, None, Some(pool)) if !pool.is_empty() => pool,
        (None, Some(_), None) | (None, None, Some(_)) => return err(format!("{at}.api_keys: list at least one key")),
        (None, None, None) => return err(format!("{at}.api_key: required (or api_key_env, api_keys, api_keys_env)")),
        _ => return err(format!("{at}: give one of api_key, api_key_env, api_keys, api_keys_env")),
    };
    if keys.iter().any(|k| k.is_empty() || !k.bytes().all(|b| b.is_ascii_graphic())) {
        return err(format!("{at}.api_key: must be printable ASCII without spaces (it is sent as a header)"));
    }
    Ok(keys)
}

/// A provider's numbers, models and protocol-only settings.
fn provider_bounds(at: &str, p: &RawProvider) -> Result<(), ConfigError> {
    if p.weight.is_some_and(|w| w == 0 || w > 1000) {
        return err(format!("{at}.weight: 1 to 1000"));
    }
    if p.cooldown_secs.is_some_and(|c| c > 86_400) {
        return err(format!("{at}.cooldown_secs: at most 86400"));
    }
    if p.failures_before_cooldown == Some(0) {
        return err(format!("{at}.failures_before_cooldown: at least 1"));
    }
    if p.models.is_empty() {
        return err(format!("{at}.models: list at least one model"));
    }
    if p.anthropic_version.is_some() && p.protocol != ProviderKind::Anthropic {
        return err(format!("{at}.anthropic_version: only for protocol anthropic"));
    }
    if p.responses.is_some() && !matches!(p.protocol, ProviderKind::Openai | ProviderKind::AzureOpenai) {
        return err(format!("{at}.responses: only for protocol openai or azure-openai"));
    }
    Ok(())
}

/// A provider's `models:`, each a name (`gpt-x`) or a name with the upstream's own
/// (`{ name: gpt-x, upstream: my-deployment }`): the names clients call and are billed by, and
/// the upstream's names where they differ.
fn model_names(at: &str, raw: Vec<RawModel>) -> Result<(Vec<String>, BTreeMap<String, String>), ConfigError> {
    let mut names = Vec::with_capacity(raw.len());
    let mut upstream = BTreeMap::new();
    for m in raw {
        let (name, theirs) = match m {
            RawModel::Name(name) => (name, None),
            RawModel::Alias { name, upstream } => (name, Some(upstream)),
        };
        if name.trim().is_empty() || name.contains('/') {
            return err(format!("{at}.models: '{name}' is not a valid model id"));
        }
        if let Some(theirs) = theirs.filter(|t| *t != name) {
            if theirs.trim().is_empty() || theirs.contains(['/', '?', '#', ' ']) {
                return err(format!("{at}.models: upstream name '{theirs}' of '{name}' is not a valid model id"));
            }
            upstream.insert(name.clone(), theirs);
        }
        names.push(name);
    }
    Ok((names, upstream))
}

/// One entry of a provider's `models:`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum RawModel {
    Name(String),
    Alias { name: String, upstream: String },
}

/// `groups:`; without any, one group `default` that may call everything.
pub(super) fn groups(raw: BTreeMap<String, RawGroup>) -> Result<BTreeMap<String, Group>, ConfigError> {
    let mut groups = BTreeMap::new();
    for (name, g) in raw {
        let price_multiplier =
            super::keys::multiplier(g.price_multiplier).map_err(|e| ConfigError(format!("groups.{name}.{e}")))?.unwrap_or_default();
        let rewrite = super::rewrite::rules(&format!("groups.{name}"), g.rewrite, super::rewrite::Owner::Group)?.into();
        if let Some(c) = &g.cache {
            c.validate().map_err(|e| ConfigError(format!("groups.{name}.{e}")))?;
        }
        let (platforms, translate, guardrails, cache) = (g.platforms, g.translate, g.guardrails, g.cache);
        groups.insert(name, Group { platforms, translate, guardrails, price_multiplier, rewrite, cache });
    }
    if groups.is_empty() {
        let platforms = vec![Platform::Openai, Platform::Anthropic, Platform::Gemini, Platform::Video];
        groups.insert(
            "default".to_string(),
            Group {
                platforms,
                translate: false,
                guardrails: Vec::new(),
                price_multiplier: Default::default(),
                rewrite: Default::default(),
                cache: None,
            },
        );
    }
    Ok(groups)
}

/// `forward_headers` and `forward_response_headers`: never a credential, a header tollgate
/// sets, a cookie or a connection header.
pub(super) fn forwarded_headers(requests: &[String], responses: &[String]) -> Result<(Vec<String>, Vec<String>), ConfigError> {
    let forward = header_patterns("forward_headers", requests, &|bare| {
        crate::protocol::never_forwarded(bare).then_some("carries credentials or is set by tollgate; it is never forwarded")
    })?;
    let back = header_patterns("forward_response_headers", responses, &|bare| {
        ("set-cookie".starts_with(bare) || ["connection", "keep-alive", "proxy-connection", "upgrade"].contains(&bare))
            .then_some("would relay cookies or connection headers; it is never relayed")
    })?;
    Ok((forward, back))
}

/// `retry:`.
pub(super) fn retry(raw: Option<RawRetry>) -> Result<RetryPolicy, ConfigError> {
    let mut retry = RetryPolicy::default();
    let Some(r) = raw else { return Ok(retry) };
    if let Some(attempts) = r.attempts {
        if attempts == 0 || attempts > MAX_ATTEMPTS {
            return err(format!("retry.attempts: 1 to {MAX_ATTEMPTS} (1: never retry)"));
        }
        retry.attempts = attempts;
    }
    if let Some(on_status) = r.on_status {
        if let Some(bad) = on_status.iter().find(|s| !(400..=599).contains(*s)) {
            return err(format!("retry.on_status: {bad} is not an error status (400 to 599)"));
        }
        retry.on_status = on_status;
    }
    if let Some(secs) = r.deadline_secs {
        if secs == 0 {
            return err("retry.deadline_secs: must be greater than 0 (leave it out for no deadline)");
        }
        retry.deadline = Some(std::time::Duration::from_secs(secs));
    }
    Ok(retry)
}

/// `routing.balance_factor`.
pub(super) fn balance_factor(raw: Option<&RawRouting>) -> Result<f64, ConfigError> {
    let balance_factor = raw.and_then(|r| r.balance_factor).unwrap_or(DEFAULT_BALANCE_FACTOR);
    if !(0.0..=MAX_BALANCE_FACTOR).contains(&balance_factor) {
        return err(format!(
            "routing.balance_factor: 0 to {MAX_BALANCE_FACTOR} (a provider may take up to 1 + this times its weighted share of a tier's traffic before a conversation goes on to the next; 0.25 by default)"
        ));
    }
    Ok(balance_factor)
}

/// What a group may call: one of the three model protocols, or the video task API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Platform {
    Openai,
    Anthropic,
    Gemini,
    Video,
}

impl From<Protocol> for Platform {
    fn from(p: Protocol) -> Self {
        match p {
            Protocol::Openai => Platform::Openai,
            Protocol::Anthropic => Platform::Anthropic,
            Protocol::Gemini => Platform::Gemini,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawProvider {
    name: String,
    protocol: ProviderKind,
    #[serde(default)]
    base_url: Option<String>,
    // The cloud kinds' settings (see `cloud`).
    #[serde(default)]
    region: Option<String>,
    #[serde(default)]
    endpoint_url: Option<String>,
    #[serde(default)]
    aws: Option<RawAws>,
    #[serde(default)]
    project: Option<String>,
    #[serde(default)]
    location: Option<String>,
    #[serde(default)]
    credentials_file: Option<PathBuf>,
    #[serde(default)]
    api_version: Option<String>,
    #[serde(default)]
    entra: Option<RawEntra>,
    #[serde(default)]
    api_key: Option<String>,
    #[serde(default)]
    api_key_env: Option<String>,
    /// A pool of upstream keys, used in turn (instead of `api_key`).
    #[serde(default)]
    api_keys: Option<Vec<String>>,
    /// An environment variable holding the pool, separated by commas or whitespace.
    #[serde(default)]
    api_keys_env: Option<String>,
    /// Lower tiers are used first; a tier only when every provider before it is out.
    #[serde(default)]
    priority: Option<u32>,
    /// Share of its tier's traffic.
    #[serde(default)]
    weight: Option<u32>,
    /// How long the provider rests after a 429 without `Retry-After`, or after failing
    /// `failures_before_cooldown` times in a row.
    #[serde(default)]
    cooldown_secs: Option<u64>,
    #[serde(default)]
    failures_before_cooldown: Option<u32>,
    #[serde(default)]
    models: Vec<RawModel>,
    /// `anthropic-version` sent when the client sends none (anthropic only).
    #[serde(default)]
    anthropic_version: Option<String>,
    #[serde(default)]
    connect_timeout_ms: Option<u64>,
    /// Longest silence while reading the upstream's response.
    #[serde(default)]
    read_timeout_secs: Option<u64>,
    /// PEM CA bundle to verify an https upstream with (default: the system roots).
    #[serde(default)]
    ca_file: Option<PathBuf>,
    /// `false`: an `openai` provider that serves chat completions only (most OpenAI-compatible
    /// servers); responses-API requests for its models are translated to chat completions.
    #[serde(default)]
    responses: Option<bool>,
    /// What it is sent, fixed for its quirks (see `rewrite`).
    #[serde(default)]
    rewrite: Vec<super::rewrite::RawRule>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGroup {
    platforms: Vec<Platform>,
    #[serde(default)]
    translate: bool,
    #[serde(default)]
    guardrails: Vec<String>,
    #[serde(default)]
    price_multiplier: Option<f64>,
    #[serde(default)]
    rewrite: Vec<super::rewrite::RawRule>,
    #[serde(default)]
    cache: Option<crate::policy::cache::CachePolicy>,
}

/// What a group's keys may call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// The endpoints (model protocols, video) open to them.
    pub platforms: Vec<Platform>,
    /// Through each endpoint open to them, every model a provider serves, whatever protocol
    /// the provider speaks (`translate`); without it, only the models of providers of the
    /// endpoint's own protocol.
    pub translate: bool,
    /// Guardrails (by name) every call of its keys goes through.
    pub guardrails: Vec<String>,
    /// What its keys are charged of the price table, unless their account says otherwise.
    pub price_multiplier: crate::base::money::Multiplier,
    /// Its clients' requests fixed before the hold (see `rewrite`).
    pub rewrite: std::sync::Arc<[super::rewrite::RewriteRule]>,
    /// Its keys' response-cache entry (after their own and their account's).
    pub cache: Option<crate::policy::cache::CachePolicy>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRouting {
    #[serde(default)]
    balance_factor: Option<f64>,
    #[serde(default)]
    pub(super) fallbacks: Option<BTreeMap<String, super::fallbacks::RawChain>>,
    #[serde(default)]
    pub(super) max_attempts: Option<u32>,
    #[serde(default)]
    pub(super) max_fallback_secs: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRetry {
    #[serde(default)]
    attempts: Option<u32>,
    #[serde(default)]
    on_status: Option<Vec<u16>>,
    #[serde(default)]
    deadline_secs: Option<u64>,
}

/// `retry: {attempts, on_status, deadline_secs}`: how many times a request may be sent upstream
/// (connect failures, which send nothing, do not count), which upstream statuses are retried
/// (besides timeouts before the response header), and the most time all attempts together may
/// take to a response header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    pub attempts: u32,
    pub on_status: Vec<u16>,
    /// From the first attempt: no retry starts after it, and an attempt waits for its response
    /// header at most until it. None: each attempt waits its provider's `read_timeout_secs`.
    pub deadline: Option<std::time::Duration>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { attempts: 2, on_status: vec![429, 500, 502, 503, 504], deadline: None }
    }
}

/// An upstream base address split into its parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseUrl {
    pub tls: bool,
    pub host: String,
    pub port: u16,
    /// Path prefix without a trailing slash ("" for none).
    pub prefix: String,
}

/// A provider's `base_url` ending in its protocol's version segment (`…/v1`, as the `openai`
/// SDK and other gateways write it; `…/v1beta` for generate-content) would reach the upstream
/// as `/v1/v1/…`: refused, with the URL to write instead.
fn version_segment_refused(at: &str, given: &str, url: &BaseUrl, kind: ProviderKind) -> Result<(), ConfigError> {
    let last = url.prefix.rsplit('/').next().unwrap_or_default();
    if kind == ProviderKind::AzureOpenai && (url.prefix.ends_with("/openai") || url.prefix.ends_with("/openai/v1")) {
        let root = given.trim_end_matches('/').trim_end_matches("/v1").trim_end_matches("/openai");
        return err(format!(
            "{at}.base_url: ends in {}, which tollgate adds itself; write base_url: {root}",
            &url.prefix[url.prefix.find("/openai").unwrap_or(0)..]
        ));
    }
    let versioned =
        last == "v1" || (matches!(kind, ProviderKind::Gemini | ProviderKind::Vertex) && (last == "v1beta" || last == "v1alpha"));
    if !versioned {
        return Ok(());
    }
    let root = given.trim_end_matches('/');
    let root = root.strip_suffix(last).unwrap_or(root).trim_end_matches('/');
    err(format!("{at}.base_url: ends in /{last}, which tollgate adds to every upstream path itself (/{last}/…); write base_url: {root}"))
}

impl BaseUrl {
    /// Parse `scheme://host[:port][/path-prefix]` (http or https only).
    pub fn parse(s: &str) -> Result<BaseUrl, String> {
        let uri: http::Uri = s.parse().map_err(|e| format!("not a URL ({e})"))?;
        let tls = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            Some(other) => return Err(format!("scheme must be http or https, not {other}")),
            None => return Err("missing scheme (http:// or https://)".into()),
        };
        let authority = uri.authority().ok_or("missing host")?;
        if authority.as_str().contains('@') {
            return Err("credentials in the URL are not allowed".into());
        }
        if uri.query().is_some() {
            return Err("a query string is not allowed".into());
        }
        let host = authority.host().trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err("missing host".into());
        }
        let port = authority.port_u16().unwrap_or(if tls { 443 } else { 80 });
        let prefix = uri.path().trim_end_matches('/').to_string();
        Ok(BaseUrl { tls, host: host.to_string(), port, prefix })
    }

    /// The value for the `Host` header.
    pub fn host_header(&self) -> String {
        let default_port = if self.tls { 443 } else { 80 };
        let host = if self.host.contains(':') { format!("[{}]", self.host) } else { self.host.clone() };
        if self.port == default_port {
            host
        } else {
            format!("{host}:{}", self.port)
        }
    }
}

#[derive(Debug, Clone)]
pub struct ProviderConfig {
    pub name: String,
    /// The wire protocol of its requests (a Vertex provider's Anthropic models: see [`ProviderConfig::wire`]).
    pub protocol: Protocol,
    /// What `protocol:` named: a wire protocol with a static key, or a cloud.
    pub kind: ProviderKind,
    /// A cloud provider's settings and credentials.
    pub cloud: Option<Cloud>,
    /// The upstream's own name of each model whose client-visible name differs from it.
    pub upstream_names: BTreeMap<String, String>,
    pub base_url: BaseUrl,
    /// The upstream keys (one, or a pool used in turn).
    pub api_keys: Vec<String>,
    /// Tier: lower first (default 0).
    pub priority: u32,
    /// Share of its tier's traffic (default 1).
    pub weight: u32,
    pub cooldown: std::time::Duration,
    /// Failures in a row that start a cooldown.
    pub failures_before_cooldown: u32,
    pub models: Vec<String>,
    pub anthropic_version: String,
    pub connect_timeout_ms: u64,
    pub read_timeout_secs: u64,
    /// It serves the responses API (`openai` providers; default true).
    pub responses: bool,
    /// CA certificates for an https upstream (None: the system roots).
    pub ca: Option<std::sync::Arc<[pingora_core::utils::tls::WrappedX509]>>,
    /// What it is sent, fixed for its quirks (see `rewrite`).
    pub rewrite: std::sync::Arc<[super::rewrite::RewriteRule]>,
}

impl ProviderConfig {
    /// The name the upstream knows `model` (a client-visible name) by.
    pub fn upstream_model<'a>(&'a self, model: &'a str) -> &'a str {
        self.upstream_names.get(model).map_or(model, String::as_str)
    }

    /// How many credentials it rotates through: its keys, or the one a cloud signs in with.
    pub fn credentials(&self) -> usize {
        self.api_keys.len().max(1)
    }

    /// The wire protocol its requests for `model` are written in.
    pub fn wire(&self, model: &str) -> Protocol {
        Cloud::wire_of(self.cloud.as_ref(), self.protocol, self.upstream_model(model))
    }
}

/// A list of header names (a trailing `*` makes a prefix), lower-cased; `refused` says why a
/// name may not be listed.
fn header_patterns(key: &str, list: &[String], refused: &dyn Fn(&str) -> Option<&'static str>) -> Result<Vec<String>, ConfigError> {
    let mut names = Vec::with_capacity(list.len());
    for (i, h) in list.iter().enumerate() {
        let name = h.trim().to_ascii_lowercase();
        let bare = name.strip_suffix('*').unwrap_or(&name);
        if bare.is_empty() || http::HeaderName::from_bytes(bare.as_bytes()).is_err() {
            return err(format!("{key}[{i}]: '{h}' is not a header name (a trailing * makes it a prefix)"));
        }
        if let Some(why) = refused(bare) {
            return err(format!("{key}[{i}]: '{h}' {why}"));
        }
        names.push(name);
    }
    Ok(names)
}

/// The default `routing.balance_factor` (ε).
pub const DEFAULT_BALANCE_FACTOR: f64 = 0.25;

/// Largest `routing.balance_factor`: at 100 a provider may take 101 times its share, which
/// is affinity without a bound in practice.
const MAX_BALANCE_FACTOR: f64 = 100.0;

/// Most attempts `retry.attempts` may allow.
pub const MAX_ATTEMPTS: u32 = 10;

/// `anthropic-version` sent upstream when the client sends none.
pub const DEFAULT_ANTHROPIC_VERSION: &str = "2023-06-01";
