//! Everything about sending a request on to an upstream: the provider catalog (which providers
//! serve a model, which models a group sees), the request-body fields routing needs, the upstream
//! request rewrite (credentials, host, path), peers built from pre-resolved addresses, and the
//! background DNS refresh.

use crate::affinity::rendezvous_score;
use crate::config::{Config, Group, MediaAllowance, Platform, Protocol, ProviderConfig};
use crate::protocol::{ApiError, ErrorKind, ModelEntry};
use crate::route::Route;

pub mod output;
use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_http::RequestHeader;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// A configured provider with its resolved addresses.
pub struct Upstream {
    pub config: ProviderConfig,
    addrs: ArcSwap<Vec<SocketAddr>>,
    pool_key: u64,
    /// The credential header's value per key of the pool (`Bearer <key>` for
    /// chat-completions), built once.
    auth_values: Vec<http::HeaderValue>,
    /// Cooldowns, probes and the key rotation (kept across reloads).
    pub health: Arc<crate::health::ProviderHealth>,
    /// The `Host` header's value, built once.
    host_value: http::HeaderValue,
    /// Its attributes on an attempt's client span, encoded once.
    pub span_attrs: crate::telemetry::Attrs,
}

impl Upstream {
    fn new(config: ProviderConfig, health: Arc<crate::health::ProviderHealth>) -> Self {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        config.name.hash(&mut h);
        let auth_values = config
            .api_keys
            .iter()
            .map(|key| {
                let auth = match config.protocol {
                    Protocol::Openai => format!("Bearer {key}"),
                    Protocol::Anthropic | Protocol::Gemini => key.clone(),
                };
                // Validated when the configuration was loaded; an unusable value sends no credential.
                let mut value = http::HeaderValue::from_str(&auth).unwrap_or_else(|_| http::HeaderValue::from_static(""));
                value.set_sensitive(true);
                value
            })
            .collect();
        let host_value = http::HeaderValue::from_str(&config.base_url.host_header()).unwrap_or_else(|_| http::HeaderValue::from_static(""));
        let span_attrs = crate::telemetry::Upstream {
            gen_ai_provider: crate::metrics::gen_ai_provider(config.protocol),
            name: &config.name,
            host: &config.base_url.host,
            port: config.base_url.port,
        }
        .attrs();
        Upstream { pool_key: h.finish(), config, addrs: ArcSwap::from_pointee(Vec::new()), auth_values, health, host_value, span_attrs }
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
    /// Each model's providers, by protocol ([`Protocol::index`]). Looked up on every request
    /// by a model name the client sent: keyed by the name alone, so a lookup builds no key.
    by_model: HashMap<String, [Vec<usize>; 3], ahash::RandomState>,
    groups: BTreeMap<String, Group>,
    /// Unix time shown as the models' creation time.
    created: u64,
    /// Smooth weighted round-robin state per tier (its providers' indexes): each provider's
    /// current weight.
    rotation: std::sync::Mutex<HashMap<Vec<usize>, Vec<i64>>>,
    /// ε of conversation affinity's bounded load (`routing.balance_factor`).
    balance_factor: f64,
}

impl Catalog {
    pub fn new(config: &Config, created: u64, health: &crate::health::HealthBook) -> Catalog {
        let mut by_model: HashMap<String, [Vec<usize>; 3], ahash::RandomState> = HashMap::default();
        for (i, p) in config.providers.iter().enumerate() {
            for m in &p.models {
                let entry = &mut by_model.entry(m.clone()).or_default()[p.protocol.index()];
                if !entry.contains(&i) {
                    entry.push(i);
                }
            }
        }
        Catalog {
            upstreams: config.providers.iter().map(|p| Arc::new(Upstream::new(p.clone(), health.provider(p)))).collect(),
            by_model,
            groups: config.groups.clone(),
            created,
            rotation: std::sync::Mutex::new(HashMap::new()),
            balance_factor: config.balance_factor,
        }
    }

    pub fn has_group(&self, group: &str) -> bool {
        self.groups.contains_key(group)
    }

    /// Whether a key of `group` may call `platform` (a model protocol or video).
    pub fn group_allows(&self, group: &str, platform: impl Into<Platform>) -> bool {
        let platform = platform.into();
        self.groups.get(group).is_some_and(|g| g.platforms.contains(&platform))
    }

    /// Whether a key of `group` may call models of providers of another protocol (translated).
    pub fn group_translates(&self, group: &str) -> bool {
        self.groups.get(group).is_some_and(|g| g.translate)
    }

    /// The protocol and providers of `model` when no provider of `protocol` serves it: the first
    /// protocol (chat completions, messages, generate-content) whose providers do.
    pub fn served_elsewhere(&self, protocol: Protocol, model: &str) -> Option<(Protocol, &[usize])> {
        Protocol::ALL.into_iter().filter(|p| *p != protocol).find_map(|p| self.candidates(p, model).map(|c| (p, c)))
    }

    /// Provider indexes serving `model` over `protocol`, in configuration order.
    pub fn candidates(&self, protocol: Protocol, model: &str) -> Option<&[usize]> {
        self.by_model.get(model).map(|by| by[protocol.index()].as_slice()).filter(|c| !c.is_empty())
    }

    /// Models a group may call, optionally through one protocol's endpoints only; first
    /// occurrence wins. A translating group calls every provider's models through every
    /// endpoint open to it.
    pub fn models_for(&self, group: &str, only: Option<Protocol>) -> Vec<ModelEntry> {
        let mut out: Vec<ModelEntry> = Vec::new();
        let translates = self.group_translates(group);
        for u in &self.upstreams {
            let p = u.config.protocol;
            let reachable = match only {
                Some(endpoint) if translates => self.group_allows(group, endpoint),
                Some(endpoint) => endpoint == p && self.group_allows(group, p),
                None if translates => Protocol::ALL.into_iter().any(|e| self.group_allows(group, e)),
                None => self.group_allows(group, p),
            };
            if !reachable {
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
    pub routing: Arc<ArcSwap<crate::relay::Routing>>,
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

pub use crate::protocol::{body_fields, BodyFields};

/// Client headers relayed upstream, besides the operator's `forward_headers`. Everything else
/// a client sends is dropped: credentials, account selectors (`OpenAI-Organization`,
/// `OpenAI-Project`, `x-goog-user-project`), response shaping (`X-Goog-FieldMask`), cookies.
const COMMON_HEADERS: [&str; 3] = ["content-type", "accept", "user-agent"];
/// Header-name prefixes relayed for every protocol: the official SDKs' platform and retry
/// headers.
const COMMON_PREFIXES: [&str; 1] = ["x-stainless-"];
/// Whether a client header (lower-case name) may go to an upstream of `protocol`.
pub fn header_allowed(name: &str, protocol: Protocol, forward: &[String]) -> bool {
    if crate::protocol::never_forwarded(name) {
        return false;
    }
    COMMON_HEADERS.contains(&name)
        || protocol.relayed_headers().contains(&name)
        || COMMON_PREFIXES.iter().any(|p| name.starts_with(p))
        || listed(name, forward)
}

/// Whether `name` is one of the operator's header patterns (a trailing `*` makes a prefix).
fn listed(name: &str, patterns: &[String]) -> bool {
    patterns.iter().any(|f| match f.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => f == name,
    })
}

/// Upstream response headers every client gets: framing and content (Pingora re-frames the
/// body, see `gateway::prepare_response_header`), caching, and when to retry. Everything else
/// an upstream sends is dropped unless allowlisted for its protocol or by the operator
/// (`forward_response_headers`): the operator's account identifiers (`openai-organization`,
/// `openai-project`, `anthropic-organization-id`), account-wide rate limits
/// (`x-ratelimit-*`, `anthropic-ratelimit-*`), cookies and the service's internal headers.
const COMMON_RESPONSE_HEADERS: [&str; 10] = [
    "content-type",
    "content-length",
    "transfer-encoding",
    "content-encoding",
    "content-disposition",
    "cache-control",
    "date",
    "retry-after",
    // The official SDKs' retry hints.
    "retry-after-ms",
    "x-should-retry",
];

/// Whether an upstream response header (lower-case name) may reach a client of `protocol`.
pub fn response_header_allowed(name: &str, protocol: Protocol, forward: &[String]) -> bool {
    if name == "set-cookie" {
        return false;
    }
    COMMON_RESPONSE_HEADERS.contains(&name) || protocol.response_headers().contains(&name) || listed(name, forward)
}

/// Query parameters a route relays: `alt` (stream framing) for generate-content, `beta`
/// (the beta messages API the `anthropic` SDK and Claude Code call) for messages; nothing
/// elsewhere, so no client can shape the answer (`fields`, `$fields`, `prettyPrint`…).
fn query_allowlist(route: &Route) -> &'static [&'static str] {
    match route {
        Route::GenerateContent { .. } => &["alt"],
        Route::Messages => &["beta"],
        // Reading a stored response: which extra fields, and resuming its stream.
        Route::StoredResponse { op: crate::route::ResponseOp::Get, .. } => {
            &["include", "include[]", "stream", "starting_after", "include_obfuscation"]
        }
        // Paging through its input items.
        Route::StoredResponse { op: crate::route::ResponseOp::InputItems, .. } => {
            &["after", "before", "limit", "order", "include", "include[]"]
        }
        _ => &[],
    }
}

/// The query string relayed upstream: only the allowed parameters, as the client wrote them.
pub fn upstream_query(query: Option<&str>, route: &Route) -> Option<String> {
    let allowed = query_allowlist(route);
    let kept: Vec<&str> = query?
        .split('&')
        .filter(|pair| {
            let name = pair.split_once('=').map_or(*pair, |(n, _)| n);
            let name = crate::base::text::decode_component(name);
            allowed.iter().any(|a| a.eq_ignore_ascii_case(&name))
        })
        .collect();
    (!kept.is_empty()).then(|| kept.join("&"))
}

/// The part of the configuration a reload replaces: providers, models, groups, prices.
/// A request keeps the snapshot it started with.
pub struct Routing {
    pub catalog: Arc<Catalog>,
    pub prices: Arc<crate::ledger::PriceBook>,
    /// Output tokens held (and asked for) per choice for a request that names no maximum, when
    /// neither its key nor its model sets one (`billing.default_output_tokens`).
    pub default_output_tokens: u64,
    /// The fewest output tokens a request that names no maximum is lowered to when its key
    /// cannot afford the default (`billing.min_output_tokens`); below, 402.
    pub min_output_tokens: u64,
    /// The largest upstream event a translated stream holds (`limits.max_event_bytes`).
    pub max_event_bytes: usize,
    /// Extra client headers relayed upstream (`forward_headers`).
    pub forward_headers: Vec<String>,
    /// Extra upstream response headers relayed to clients (`forward_response_headers`).
    pub forward_response_headers: Vec<String>,
    /// Proxies whose `X-Forwarded-For` is believed (`trusted_proxies`).
    pub trusted_proxies: Vec<crate::policy::Cidr>,
    /// Spend windows' calendar (`billing.timezone`).
    pub calendar: crate::policy::budget::Calendar,
    /// Whether `/me`, the key holder's page, is served (`console.key_page`).
    pub key_page: bool,
    /// Retries before the first byte.
    pub retry: crate::config::RetryPolicy,
    /// Input tokens held per referenced image and per file (`billing.image_input_tokens`,
    /// `billing.file_input_tokens`).
    pub media_allowance: MediaAllowance,
}

/// The output tokens a request may produce, all choices together: the per-choice maximum it
/// names in its route's own field (refused above the model's `max_output_tokens`, or above
/// [`crate::base::usage::MAX_OUTPUT_ALLOWANCE`]), else the default allowance (see
/// [`output::default_allowance`]); times `n` / `candidateCount`. Returns the per-choice figure
/// and whether the request named it.
fn output_allowance(
    route: &Route,
    fields: &BodyFields<'_>,
    routing: &Routing,
    model: &str,
    policy: &crate::policy::KeyPolicy,
) -> Result<(u64, bool), ApiError> {
    let price = routing.prices.price(model);
    let model_limit = price.and_then(|p| p.max_output_tokens);
    let asked = output::asked(route, fields)?;
    // The key's cap refuses a larger maximum (400 naming the field used).
    policy.check_output_tokens(asked, output::named_field(route, fields))?;
    Ok(match asked {
        Some(asked) => {
            let limit = model_limit.unwrap_or(crate::base::usage::MAX_OUTPUT_ALLOWANCE);
            if asked > limit {
                return Err(ApiError::new(
                    ErrorKind::BadRequest,
                    format!("The maximum output of {asked} tokens is more than the model '{model}' can produce ({limit})."),
                )
                .with_param(output::named_field(route, fields)));
            }
            (asked, true)
        }
        None => (
            output::default_allowance(
                price.and_then(|p| p.default_output_tokens),
                model_limit,
                policy.default_output_tokens,
                policy.max_output_tokens,
                routing.default_output_tokens,
            ),
            false,
        ),
    })
}

/// What a relayed request will do, decided from the routing snapshot, its route, its key's
/// group and its body alone: no I/O, no balance, no limit (those are the caller's).
#[derive(Debug)]
pub struct Draft {
    pub model: String,
    /// Indexes into the catalog's upstreams, in the order to try them.
    pub candidates: Vec<usize>,
    /// The most the request can cost, in nano-USD: held before anything is sent.
    pub hold_nanos: i64,
    /// The input it may be billed (see [`crate::billing::InputEstimate`]).
    pub input: crate::billing::InputEstimate,
    /// The output tokens held, all choices together.
    pub output_allowance: u64,
    /// The request named its output maximum itself: it is not lowered to what the key can
    /// afford (see [`Draft::lower_output`]).
    output_named: bool,
    /// How many answers the request asks for (`n`, `candidateCount`).
    pub choices: u64,
    /// The field that names the request's output maximum (the one it used, else the one to set).
    pub output_field: &'static str,
    /// The body to send (the client's, with usage asked for, with the output maximum).
    pub body: bytes::Bytes,
    /// The client's body: what the body to send is made from (again, by [`Draft::lower_output`]).
    base_body: bytes::Bytes,
    /// The client's body's part of the rewrite (stream usage asked for), joined with the output
    /// maximum into one edit: the body is copied once at most.
    usage_edit: crate::protocol::BodyEdit,
    pub client_body_len: usize,
    /// tollgate asked for stream usage; the usage chunk is not the client's to see.
    pub withhold_usage: bool,
    /// The stored response this turn continues (responses API): the caller must own it, and
    /// its provider serves the turn.
    pub previous_response_id: Option<String>,
    /// The model is served over another protocol than the client's: `body` is the provider's.
    pub translation: Option<crate::translate::Translation>,
}

/// Order the providers of a model for one request: by tier (`priority`, lower first); within a
/// tier, a conversation's own order, or without a conversation the next provider of the tier's
/// smooth weighted round-robin first (then the others in file order). A conversation's order is
/// weighted rendezvous hashing on the providers' names: every turn puts the same provider first
/// while the tier is unchanged, each provider comes first for a share of conversations in
/// proportion to its `weight`, and a provider that is out hands only its own conversations on.
pub fn order_providers(catalog: &Catalog, candidates: &mut [usize], conversation: Option<u64>) {
    let cfg = |i: usize| &catalog.upstreams[i].config;
    candidates.sort_by_key(|&i| cfg(i).priority);
    let mut start = 0;
    while start < candidates.len() {
        let tier = cfg(candidates[start]).priority;
        let end = start + candidates[start..].iter().take_while(|&&i| cfg(i).priority == tier).count();
        let members = &mut candidates[start..end];
        if members.len() > 1 {
            match conversation {
                Some(conversation) => {
                    members.sort_by(|&a, &b| {
                        rendezvous_score(conversation, &cfg(b).name, cfg(b).weight).total_cmp(&rendezvous_score(
                            conversation,
                            &cfg(a).name,
                            cfg(a).weight,
                        ))
                    });
                    // Bounded load: the first in the conversation's order within its bound takes
                    // it; those passed over stay next in line (see `affinity`).
                    let health = |j: usize| &catalog.upstreams[members[j]].health;
                    let at = crate::affinity::first_within_bound(
                        members.len(),
                        |j| (health(j).load.get(), cfg(members[j]).weight),
                        catalog.balance_factor,
                    );
                    if at > 0 {
                        (0..at).for_each(|j| health(j).overflows.add(1));
                        members[..=at].rotate_right(1);
                    }
                }
                None => {
                    let first = catalog.next_in_rotation(members);
                    if let Some(at) = members.iter().position(|&i| i == first) {
                        members[..=at].rotate_right(1);
                    }
                }
            }
        }
        start = end;
    }
}

impl Catalog {
    /// The provider to try next for a request whose providers are `candidates` (in the plan's
    /// order), admitted by its health at `now`: the first not yet `tried` (sent to) nor `dead`
    /// (unreachable) that is not resting; else, for a retry with no other provider left, one
    /// already tried that still takes requests; else, while nothing was sent yet, the reachable
    /// one whose rest ends first (every provider rests: try rather than fail without trying).
    pub fn next_provider(
        &self,
        candidates: &[usize],
        tried: &[usize],
        dead: &[usize],
        now: std::time::Instant,
    ) -> Option<(usize, crate::health::Admission)> {
        let admit = |i: usize, force| self.upstreams[i].health.admit(now, force).map(|a| (i, a));
        let alive = || candidates.iter().copied().filter(|i| !dead.contains(i));
        if let Some(found) = alive().filter(|i| !tried.contains(i)).find_map(|i| admit(i, false)) {
            return Some(found);
        }
        if let Some(found) = alive().filter(|i| tried.contains(i)).find_map(|i| admit(i, false)) {
            return Some(found);
        }
        if tried.is_empty() {
            let first_free = alive().min_by_key(|&i| self.upstreams[i].health.free_at(now))?;
            return admit(first_free, true);
        }
        None
    }

    /// Smooth weighted round-robin over one tier: the provider whose turn it is.
    fn next_in_rotation(&self, members: &[usize]) -> usize {
        let mut key = members.to_vec();
        key.sort_unstable();
        let mut all = self.rotation.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let current = all.entry(key.clone()).or_insert_with(|| vec![0; key.len()]);
        let weights: Vec<i64> = key.iter().map(|&i| i64::from(self.upstreams[i].config.weight)).collect();
        let total: i64 = weights.iter().sum();
        for (c, w) in current.iter_mut().zip(&weights) {
            *c += w;
        }
        let best = (0..key.len()).max_by_key(|&j| (current[j], std::cmp::Reverse(j))).unwrap_or(0);
        current[best] -= total;
        key[best]
    }
}

/// Put the provider named `provider` first, if it serves this request (a conversation that
/// continues a stored response goes where that response is stored).
pub fn prefer_provider(catalog: &Catalog, candidates: &mut [usize], provider: &str) {
    if let Some(at) = candidates.iter().position(|&i| catalog.upstreams[i].config.name == provider) {
        candidates[..=at].rotate_right(1);
    }
}

/// Plan a request on a stored response (read, cancel, delete, list its input items): it goes
/// to the provider that stored it, unbilled. None when that provider is no longer configured.
pub fn stored_draft(routing: &Routing, owner: &crate::records::usage::ResponseOwner, client_body: bytes::Bytes) -> Option<Draft> {
    let index = routing.catalog.upstreams.iter().position(|u| u.config.name == owner.provider)?;
    Some(Draft {
        model: owner.model.clone(),
        candidates: vec![index],
        hold_nanos: 0,
        input: crate::billing::InputEstimate::default(),
        output_allowance: 0,
        output_named: true,
        choices: 1,
        output_field: "max_tokens",
        client_body_len: client_body.len(),
        base_body: client_body.clone(),
        usage_edit: crate::protocol::BodyEdit::default(),
        body: client_body,
        withhold_usage: false,
        previous_response_id: None,
        translation: None,
    })
}

/// Plan a relayed request: the model (from the body, or the path for generate-content), the
/// providers serving it to this group, the hold (input at one token per three bytes plus the
/// output allowance of every choice), and the body to send. A streamed chat completion reports
/// usage only when asked: whatever the client sent in `stream_options`, ask, and withhold the
/// usage chunk from a client that did not (one splice; the body is parsed once).
pub fn draft(
    routing: &Routing,
    route: &Route,
    protocol: Protocol,
    group: &str,
    policy: &crate::policy::KeyPolicy,
    client_body: bytes::Bytes,
) -> Result<Draft, ApiError> {
    let catalog = &routing.catalog;
    let fields = match route {
        Route::GenerateContent { .. } | Route::GeminiCountTokens { .. } | Route::GeminiEmbed { .. } if client_body.is_empty() => {
            BodyFields::default()
        }
        _ => body_fields(&client_body)?,
    };
    let model = match route {
        Route::GenerateContent { model, .. } | Route::GeminiCountTokens { model } | Route::GeminiEmbed { model, .. } => model.clone(),
        _ => fields
            .model
            .clone()
            .filter(|m| !m.is_empty())
            .ok_or_else(|| ApiError::new(ErrorKind::BadRequest, "The 'model' field is required.").with_param("model"))?,
    };
    crate::protocol::check_model_name(&model)?;
    if fields.background == Some(true) {
        return Err(ApiError::new(
            ErrorKind::BadRequest,
            "Background responses are not available through this gateway: their usage is only known after the request ends. Send the request without 'background', streamed if it runs long.",
        )
        .with_param("background"));
    }
    let client = crate::translate::client_dialect(route);
    let allowed = catalog.candidates(protocol, &model).filter(|_| catalog.group_allows(group, protocol));
    // A responses-API request goes to the providers of its model that serve that API; when none
    // does (`responses: false`), it is translated to their chat completions.
    let (native, chat_only) = match allowed {
        Some(all) if *route == Route::Responses => {
            let serving: Vec<usize> = all.iter().copied().filter(|&i| catalog.upstreams[i].config.responses).collect();
            if serving.is_empty() {
                (None, Some((Protocol::Openai, all)))
            } else {
                (Some(serving), None)
            }
        }
        other => (other.map(<[usize]>::to_vec), None),
    };
    // Not served over the client's protocol: a translating group reaches it through another.
    let translated = match (&native, client) {
        (None, Some(_)) if chat_only.is_some() => chat_only,
        (None, Some(_)) if catalog.group_translates(group) && catalog.group_allows(group, protocol) => {
            catalog.served_elsewhere(protocol, &model)
        }
        _ => None,
    };
    let mut candidates = native.or(translated.map(|(_, c)| c.to_vec())).ok_or_else(|| {
        ApiError::new(
            ErrorKind::ModelNotFound,
            format!("The model '{model}' does not exist or is not available to this key. See the model list."),
        )
        .with_param("model")
    })?;
    // The key's model rules before its output limits (the documented order).
    policy.check_model(&model)?;
    // The output held per choice: the request's own maximum (within the key's and the model's
    // limits), else the default allowance, which the upstream is then told.
    let choices = if route.embeds() || !route.billed() { 1 } else { protocol.choices(&fields)? };
    let (per_choice, output_named) =
        if route.embeds() || !route.billed() { (0, true) } else { output_allowance(route, &fields, routing, &model, policy)? };
    let output_allowance = per_choice.saturating_mul(choices);
    let output_field = output::named_field(route, &fields);
    let input = crate::billing::InputEstimate {
        body_tokens: crate::billing::hold_input_tokens(client_body.len()),
        media_tokens: if route.billed() { routing.media_allowance.tokens(fields.media) } else { 0 },
        referenced_tokens: 0,
    };
    let hold_nanos = if !route.billed() { 0 } else { hold_cost(routing, &model, input, output_allowance)? };
    if candidates.len() > 1 {
        // Embeddings are not conversations: they only spread by weight.
        let conversation = if route.embeds() { None } else { crate::protocol::conversation_key(&fields) };
        order_providers(catalog, &mut candidates, conversation);
    }
    // The provider chosen is that provider's load from now on (counted at once, so requests
    // deciding at the same moment see each other); a request sent elsewhere after all (its
    // provider rests or fails) is counted where it goes (the gateway's attempt loop).
    if let Some(&first) = candidates.first() {
        catalog.upstreams[first].health.load.add();
    }
    let previous_response_id = match route {
        Route::Responses | Route::ResponsesCompact | Route::ResponsesInputTokens => fields.previous_response_id.clone(),
        _ => None,
    };
    let (usage_edit, withhold_usage, translation) = match (translated, client) {
        (Some((upstream, _)), Some(client)) => {
            let translation = crate::translate::Translation {
                client,
                upstream,
                model: model.clone(),
                stream: match route {
                    Route::GenerateContent { stream, .. } => *stream,
                    _ if crate::translate::counts(route) => false,
                    _ => fields.stream == Some(true),
                },
                client_wants_usage: crate::protocol::openai::client_wants_usage(&fields),
                gemini_sse: false,
                input_estimate: input.tokens(),
                count: crate::translate::counts(route),
                max_event_bytes: routing.max_event_bytes,
            };
            drop(fields);
            (crate::protocol::BodyEdit::default(), false, Some(translation))
        }
        _ => {
            let withhold =
                *route == Route::ChatCompletions && fields.stream == Some(true) && !crate::protocol::openai::client_wants_usage(&fields);
            let edit = if withhold { crate::protocol::openai::include_usage(&client_body, &fields)? } else { Default::default() };
            (edit, withhold, None)
        }
    };
    let mut draft = Draft {
        model,
        candidates,
        hold_nanos,
        input,
        output_allowance,
        output_named,
        choices,
        output_field,
        body: bytes::Bytes::new(),
        client_body_len: client_body.len(),
        base_body: client_body,
        usage_edit,
        withhold_usage,
        previous_response_id,
        translation,
    };
    draft.body = draft.upstream_body(route, per_choice)?;
    Ok(draft)
}

/// The hold for `input` and `output` tokens of `model`; a model without a price is refused.
fn hold_cost(routing: &Routing, model: &str, input: crate::billing::InputEstimate, output: u64) -> Result<i64, ApiError> {
    routing.prices.hold_cost(model, input.tokens(), output).ok_or_else(|| {
        log::error!("model {model} is served without a price; refused");
        ApiError::new(ErrorKind::Internal, format!("The model '{model}' is not priced on this gateway and cannot be served."))
    })
}

impl Draft {
    /// The body the upstream gets for `per_choice` output tokens: a translated request is
    /// encoded with it; a native one carries it in its route's own field unless the client
    /// named its maximum there itself, with stream usage asked for in the same copy.
    fn upstream_body(&self, route: &Route, per_choice: u64) -> Result<bytes::Bytes, ApiError> {
        if let Some(t) = &self.translation {
            return crate::translate::request(t, &self.base_body, per_choice);
        }
        let mut edit = self.usage_edit.clone();
        if !self.output_named {
            match output::maximum_member(route, per_choice) {
                Some(member) => edit.first.insert(0, member),
                // Generate-content's maximum sits inside `generationConfig` (and its requests
                // carry no usage edit): written by re-encoding the body.
                None => return output::with_maximum(route, &self.base_body, per_choice),
            }
        }
        if edit.is_empty() {
            Ok(self.base_body.clone())
        } else {
            edit.apply(&self.base_body)
        }
    }

    /// Hold and ask for at most `per_choice` output tokens: the one rule for every limit a
    /// request that named no maximum is fitted to (a balance, a spend window, `max_request_cost`,
    /// `tpm`). Lowered only when that is less than its allowance and not below
    /// `billing.min_output_tokens`; a request that named its own maximum is never changed.
    /// Whether it was lowered.
    pub fn lower_output(&mut self, routing: &Routing, route: &Route, per_choice: u64) -> Result<bool, ApiError> {
        let choices = self.choices.max(1);
        if self.output_named || per_choice < routing.min_output_tokens || per_choice >= self.output_allowance / choices {
            return Ok(false);
        }
        self.output_allowance = per_choice.saturating_mul(choices);
        self.hold_nanos = hold_cost(routing, &self.model, self.input, self.output_allowance)?;
        self.body = self.upstream_body(route, per_choice)?;
        Ok(true)
    }

    /// How many output tokens `available` nano-USD covers beside this request's input (all
    /// choices together), for a refusal's message.
    pub fn output_covered(&self, routing: &Routing, available: i64) -> u64 {
        routing.prices.output_within(&self.model, self.input.tokens(), available).unwrap_or(0) / self.choices.max(1)
    }

    /// The turn continues a stored conversation of `context_tokens` (its recorded input and
    /// output): the upstream counts them again as input, so they are held (and estimated) too.
    pub fn continues(&mut self, routing: &Routing, route: &Route, context_tokens: u64) -> Result<(), ApiError> {
        if !route.billed() {
            return Ok(());
        }
        self.input.referenced_tokens = context_tokens;
        self.hold_nanos = hold_cost(routing, &self.model, self.input, self.output_allowance)?;
        Ok(())
    }
}

/// Where a request goes upstream.
#[derive(Debug, Clone, Copy)]
pub enum Destination<'a> {
    /// The client's own path (a route of the provider's protocol), with its allowed query.
    Relayed(&'a Route),
    /// The provider's endpoint for a translated request.
    Translated(&'a crate::translate::Translation),
}

/// The request header sent to `upstream`, built from the client's: only allowlisted client
/// headers are copied (credentials, account selectors and answer shaping never reach the
/// operator's upstream account; also dropped: accept-encoding, since the usage scanner needs
/// plain bytes, and expect, since the whole body is already here), the provider's credential,
/// `Host` and the body length are set, the path gets the provider's prefix and only
/// allowlisted query parameters. Always HTTP/1.1 (an HTTP/2 client's request included).
pub fn upstream_request(
    client: &RequestHeader,
    upstream: &Upstream,
    key: usize,
    to: Destination<'_>,
    client_version: Option<&str>,
    body_len: usize,
    forward: &[String],
) -> pingora_error::Result<RequestHeader> {
    let cfg = &upstream.config;
    let protocol = cfg.protocol;
    let path_and_query = match to {
        // A translated request goes to the provider's own endpoint (no client query parameter).
        Destination::Translated(t) => t.upstream_path(&cfg.base_url.prefix),
        Destination::Relayed(route) => {
            let path = upstream_path(client.uri.path(), &cfg.base_url.prefix);
            match upstream_query(client.uri.query(), route) {
                Some(q) => format!("{path}?{q}"),
                None => path,
            }
        }
    };
    let mut req = RequestHeader::build(client.method.clone(), path_and_query.as_bytes(), Some(client.headers.len() + 4))?;
    for (name, value) in client.headers.iter() {
        if header_allowed(name.as_str(), protocol, forward) {
            req.append_header(name.clone(), value.clone())?;
        }
    }
    req.insert_header(http::header::CONTENT_LENGTH, body_len)?;
    let credential =
        upstream.auth_values.get(key).or(upstream.auth_values.first()).cloned().unwrap_or_else(|| http::HeaderValue::from_static(""));
    req.insert_header(protocol.credential_header(), credential)?;
    if protocol == Protocol::Anthropic {
        req.insert_header(crate::protocol::anthropic::VERSION_HEADER, client_version.unwrap_or(&cfg.anthropic_version))?;
    }
    req.insert_header(http::header::HOST, upstream.host_value.clone())?;
    Ok(req)
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
prices:
  alpha-5.5: { input: 1, output: 2 }
  alpha-4o-mini: { input: 1, output: 2 }
  beta-opus-4-7: { input: 1, output: 2 }
  gamma-3.5-flash: { input: 0, output: 0 }
"#;
        Config::parse(text, &|_| None).expect("valid")
    }

    fn routing() -> Routing {
        let config = config();
        Routing {
            catalog: Arc::new(Catalog::new(&config, 0, &health())),
            prices: Arc::new(crate::ledger::PriceBook::new(&config.prices)),
            default_output_tokens: 100,
            min_output_tokens: 10,
            max_event_bytes: crate::config::listen::DEFAULT_MAX_EVENT_BYTES,
            forward_headers: Vec::new(),
            forward_response_headers: Vec::new(),
            trusted_proxies: Vec::new(),
            calendar: Default::default(),
            key_page: false,
            retry: crate::config::RetryPolicy::default(),
            media_allowance: MediaAllowance::default(),
        }
    }

    fn health() -> crate::health::HealthBook {
        crate::health::HealthBook::new(Arc::new(crate::metrics::Metrics::default()))
    }

    fn body(v: serde_json::Value) -> bytes::Bytes {
        bytes::Bytes::from(serde_json::to_vec(&v).expect("json"))
    }

    #[test]
    fn a_draft_names_the_model_its_providers_the_hold_and_the_body() {
        let r = routing();
        // 1 USD per 1M input tokens = 1,000 nano-USD a token; 2 USD per 1M output tokens.
        let chat = body(serde_json::json!({"model": "alpha-5.5", "messages": [], "max_tokens": 10, "n": 3}));
        let d = draft(&r, &Route::ChatCompletions, Protocol::Openai, "default", &crate::policy::KeyPolicy::default(), chat.clone())
            .expect("draft");
        assert_eq!(d.model, "alpha-5.5");
        assert_eq!(d.candidates, vec![0, 1], "both providers of the model, in file order");
        let input = crate::billing::hold_input_tokens(chat.len()) as i64;
        assert_eq!(d.hold_nanos, input * 1_000 + 3 * 10 * 2_000, "input + every choice's allowance");
        assert_eq!(d.body, chat, "a request that is not a stream is sent as it came");
        assert!(!d.withhold_usage);

        // No maximum named: the default allowance is held. Embeddings hold no output.
        let d = draft(
            &r,
            &Route::ChatCompletions,
            Protocol::Openai,
            "chat",
            &crate::policy::KeyPolicy::default(),
            body(serde_json::json!({"model": "alpha-4o-mini"})),
        )
        .expect("draft");
        assert_eq!(d.hold_nanos % 1_000, 0);
        assert!(d.hold_nanos >= 100 * 2_000);
        let e = draft(
            &r,
            &Route::Embeddings,
            Protocol::Openai,
            "default",
            &crate::policy::KeyPolicy::default(),
            body(serde_json::json!({"model": "alpha-5.5", "input": "x"})),
        )
        .expect("draft");
        assert!(e.hold_nanos < 100 * 2_000);

        // A stream that did not ask for usage: asked for, and withheld from the client.
        let stream = body(serde_json::json!({"model": "alpha-5.5", "stream": true, "stream_options": null}));
        let d = draft(&r, &Route::ChatCompletions, Protocol::Openai, "default", &crate::policy::KeyPolicy::default(), stream.clone())
            .expect("draft");
        assert!(d.withhold_usage);
        assert_eq!(d.client_body_len, stream.len());
        let sent: serde_json::Value = serde_json::from_slice(&d.body).expect("json");
        assert_eq!(sent["stream_options"]["include_usage"], true);
        // Naming no maximum either: both written in the one copy, the client's members kept.
        assert_eq!(sent["max_completion_tokens"], 100, "the default allowance");
        assert_eq!((sent["model"].as_str(), sent["stream"].as_bool()), (Some("alpha-5.5"), Some(true)));
        let plain = body(serde_json::json!({"model": "alpha-5.5", "stream": true}));
        let d =
            draft(&r, &Route::ChatCompletions, Protocol::Openai, "default", &crate::policy::KeyPolicy::default(), plain).expect("draft");
        let sent: serde_json::Value = serde_json::from_slice(&d.body).expect("json");
        assert_eq!(
            (sent["max_completion_tokens"].as_u64(), &sent["stream_options"]),
            (Some(100), &serde_json::json!({"include_usage": true}))
        );

        // The one lowering rule: a request that named no maximum is lowered, never below the
        // floor (10 here) nor above what it had; one that named its maximum never.
        let mut d = draft(
            &r,
            &Route::ChatCompletions,
            Protocol::Openai,
            "default",
            &crate::policy::KeyPolicy::default(),
            body(serde_json::json!({"model": "alpha-5.5", "n": 2})),
        )
        .expect("draft");
        assert!(!d.lower_output(&r, &Route::ChatCompletions, 9).expect("rule"), "below the floor");
        assert!(!d.lower_output(&r, &Route::ChatCompletions, 100).expect("rule"), "not less than it had");
        assert!(d.lower_output(&r, &Route::ChatCompletions, 40).expect("rule"));
        assert_eq!(d.output_allowance, 80, "every choice");
        assert_eq!(serde_json::from_slice::<serde_json::Value>(&d.body).expect("json")["max_completion_tokens"], 40, "and asked for");
        let mut named = draft(&r, &Route::ChatCompletions, Protocol::Openai, "default", &crate::policy::KeyPolicy::default(), chat.clone())
            .expect("draft");
        assert!(!named.lower_output(&r, &Route::ChatCompletions, 5).expect("rule"));
        assert_eq!(named.body, chat);

        // Generate-content takes the model from the path; an empty body is allowed.
        let gen = Route::GenerateContent { model: "gamma-3.5-flash".into(), stream: false };
        let d = draft(&r, &gen, Protocol::Gemini, "default", &crate::policy::KeyPolicy::default(), bytes::Bytes::new()).expect("draft");
        assert_eq!((d.model.as_str(), d.candidates.as_slice(), d.hold_nanos), ("gamma-3.5-flash", &[3usize][..], 0));
    }

    #[test]
    fn a_draft_refuses_what_cannot_be_relayed() {
        let r = routing();
        let refuse = |route: Route, protocol: Protocol, group: &str, v: serde_json::Value| {
            draft(&r, &route, protocol, group, &crate::policy::KeyPolicy::default(), body(v)).expect_err("refused").status()
        };
        assert_eq!(refuse(Route::ChatCompletions, Protocol::Openai, "default", serde_json::json!({"messages": []})), 400, "no model");
        assert_eq!(refuse(Route::ChatCompletions, Protocol::Openai, "default", serde_json::json!({"model": ""})), 400, "empty model");
        assert_eq!(refuse(Route::ChatCompletions, Protocol::Openai, "default", serde_json::json!({"model": "nope"})), 404);
        assert_eq!(refuse(Route::Messages, Protocol::Anthropic, "chat", serde_json::json!({"model": "beta-opus-4-7"})), 404, "group");
        assert_eq!(
            refuse(
                Route::ChatCompletions,
                Protocol::Openai,
                "default",
                serde_json::json!({"model": "alpha-5.5", "max_tokens": 1u64 << 40})
            ),
            400,
            "beyond any output limit"
        );
        assert_eq!(
            draft(
                &r,
                &Route::ChatCompletions,
                Protocol::Openai,
                "default",
                &crate::policy::KeyPolicy::default(),
                bytes::Bytes::from_static(b"{not json")
            )
            .expect_err("bad")
            .status(),
            400
        );
        // The key's model rules come before its output limits (issue 46: the documented order).
        let policy = crate::policy::KeyPolicy {
            models: Some(crate::policy::ModelRules { allow: None, deny: vec!["alpha-5.5".into()] }),
            max_output_tokens: Some(10),
            ..crate::policy::KeyPolicy::default()
        };
        let both = body(serde_json::json!({"model": "alpha-5.5", "max_tokens": 1000}));
        let e = draft(&r, &Route::ChatCompletions, Protocol::Openai, "default", &policy, both).expect_err("refused");
        assert_eq!(e.kind, ErrorKind::ModelNotAllowed, "{}", e.message);
        let other = body(serde_json::json!({"model": "alpha-4o-mini", "max_tokens": 1000}));
        let e = draft(&r, &Route::ChatCompletions, Protocol::Openai, "default", &policy, other).expect_err("refused");
        assert_eq!((e.status(), e.param.as_deref()), (400, Some("max_tokens")), "{}", e.message);
    }

    fn weighted() -> Catalog {
        let text = r#"
listen: 127.0.0.1:8080
providers:
  - { name: heavy, protocol: openai, base_url: "http://127.0.0.1:1", api_key: k, models: [m], weight: 3 }
  - { name: light, protocol: openai, base_url: "http://127.0.0.1:2", api_key: k, models: [m] }
  - { name: backup, protocol: openai, base_url: "http://127.0.0.1:3", api_key: k, models: [m], priority: 1 }
prices:
  m: { input: 1, output: 1 }
"#;
        Catalog::new(&Config::parse(text, &|_| None).expect("valid"), 0, &health())
    }

    #[test]
    fn tiers_come_in_priority_order_and_weights_split_a_tier() {
        let c = weighted();
        let mut firsts = [0usize; 3];
        for _ in 0..200 {
            let mut order = vec![2, 1, 0];
            order_providers(&c, &mut order, None);
            assert_eq!(order[2], 2, "the backup tier comes last: {order:?}");
            firsts[order[0]] += 1;
        }
        assert_eq!(firsts, [150, 50, 0], "smooth weighted round-robin is exact");

        // Conversations: each keeps its order; over many, the split follows the weights.
        let mut firsts = [0usize; 3];
        for conversation in 0..20_000u64 {
            let mut order = vec![0, 1, 2];
            order_providers(&c, &mut order, Some(conversation));
            let mut again = vec![2, 0, 1];
            order_providers(&c, &mut again, Some(conversation));
            assert_eq!(order, again, "the same order from any starting order");
            assert_eq!(order[2], 2);
            firsts[order[0]] += 1;
        }
        let heavy = firsts[0] as f64 / 20_000.0;
        assert!((heavy - 0.75).abs() < 0.02, "weight 3 of 4: {heavy}");
    }

    #[test]
    fn the_next_provider_skips_the_resting_and_the_tried() {
        use crate::health::Verdict;
        let c = weighted();
        let now = std::time::Instant::now();
        let order = [0, 1, 2];
        let next = |tried: &[usize], dead: &[usize]| c.next_provider(&order, tried, dead, now).map(|(i, _)| i);
        assert_eq!(next(&[], &[]), Some(0));
        assert_eq!(next(&[0], &[]), Some(1), "another provider first");
        assert_eq!(next(&[0, 1, 2], &[]), Some(0), "then one already tried that takes requests");
        assert_eq!(next(&[], &[0, 1, 2]), None, "none reachable");
        // Provider 0 answered 429 for 60 s: skipped, even for a retry.
        let (_, a) = c.next_provider(&[0], &[], &[], now).expect("admitted");
        a.report_at(Verdict::Throttled(Some(std::time::Duration::from_secs(60))), now);
        assert_eq!(next(&[], &[]), Some(1));
        assert_eq!(next(&[1, 2], &[]), Some(1), "a retry never goes to a resting provider");
        // Every provider rests: the first free is tried, but only before anything was sent.
        for i in [1, 2] {
            let (_, a) = c.next_provider(&[i], &[], &[], now).expect("admitted");
            a.report_at(Verdict::Throttled(Some(std::time::Duration::from_secs(10 * i as u64))), now);
        }
        assert_eq!(next(&[], &[]), Some(1), "the one whose rest ends first (10 s)");
        assert_eq!(next(&[], &[1]), Some(2), "of those reachable");
        assert_eq!(next(&[1], &[]), None, "no retry into a rest");
    }

    #[test]
    fn candidates_in_config_order_per_protocol() {
        let c = Catalog::new(&config(), 0, &health());
        assert_eq!(c.candidates(Protocol::Openai, "alpha-5.5"), Some(&[0usize, 1][..]));
        assert_eq!(c.candidates(Protocol::Openai, "alpha-4o-mini"), Some(&[0usize][..]));
        assert_eq!(c.candidates(Protocol::Anthropic, "alpha-5.5"), None);
        assert_eq!(c.candidates(Protocol::Openai, "nope"), None);
    }

    #[test]
    fn models_filtered_by_group() {
        let c = Catalog::new(&config(), 0, &health());
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
    fn choices_are_read_per_protocol() {
        use crate::protocol::openai::client_wants_usage;
        // The proto field names the service also accepts are held alike.
        let f = body_fields(br#"{"generation_config":{"max_output_tokens":13,"candidate_count":4}}"#).expect("parse");
        assert_eq!(Protocol::Gemini.choices(&f).ok(), Some(4));
        let f = body_fields(br#"{"generationConfig":{"max_output_tokens":13,"candidateCount":2}}"#).expect("parse");
        assert_eq!(Protocol::Gemini.choices(&f).ok(), Some(2));
        let both = br#"{"generationConfig":{"maxOutputTokens":1},"generation_config":{"max_output_tokens":100000}}"#;
        assert_eq!(body_fields(both).unwrap_err().status(), 400, "two spellings of one field: refused, not guessed");
        let both = br#"{"generationConfig":{"maxOutputTokens":1,"max_output_tokens":100000}}"#;
        assert_eq!(body_fields(both).unwrap_err().status(), 400);
        let f = body_fields(br#"{"model":"m","stream_options":{"include_usage":true}}"#).expect("parse");
        assert!(client_wants_usage(&f));
        let f = body_fields(br#"{"model":"m","n":4,"max_tokens":10}"#).expect("parse");
        assert_eq!(Protocol::Openai.choices(&f).expect("n"), 4);
        assert_eq!(Protocol::Anthropic.choices(&f).expect("one"), 1, "messages has no n");
        let f = body_fields(br#"{"generationConfig":{"candidateCount":3}}"#).expect("parse");
        assert_eq!(Protocol::Gemini.choices(&f).expect("candidateCount"), 3);
        let f = body_fields(br#"{"model":"m","n":129}"#).expect("parse");
        assert_eq!(Protocol::Openai.choices(&f).unwrap_err().status(), 400);
        assert_eq!(body_fields(br#"{"model":"m","max_tokens":1e15}"#).unwrap_err().status(), 400, "not an integer");
        assert_eq!(body_fields(br#"{"model":"m","max_tokens":-1}"#).unwrap_err().status(), 400);
    }

    /// Whatever `stream_options` holds, the rewrite asks for usage, keeps every other byte of
    /// the body, and keeps the client's other options.
    #[test]
    fn include_usage_is_set_whatever_stream_options_holds() {
        let cases: [(&str, serde_json::Value); 9] = [
            (r#"{"model":"m","stream":true}"#, serde_json::json!({"include_usage": true})),
            (r#"{"model":"m","stream":true,"stream_options":null}"#, serde_json::json!({"include_usage": true})),
            (r#"{"model":"m","stream":true,"stream_options":"yes"}"#, serde_json::json!({"include_usage": true})),
            (r#"{"model":"m","stream":true,"stream_options":[1,{"a":2}]}"#, serde_json::json!({"include_usage": true})),
            (r#"{"model":"m","stream":true,"stream_options":7}"#, serde_json::json!({"include_usage": true})),
            (r#"{"model":"m","stream":true,"stream_options":{"include_usage":false}}"#, serde_json::json!({"include_usage": true})),
            (
                r#"{"model":"m","stream":true,"stream_options":{"include_usage":null,"x":1}}"#,
                serde_json::json!({"include_usage": true, "x": 1}),
            ),
            (r#"{"model":"m","stream":true,"stream_options":{}}"#, serde_json::json!({"include_usage": true})),
            (r#"  { "stream_options" : { "x" : "}" } , "model":"m","stream":true}"#, serde_json::json!({"include_usage": true, "x": "}"})),
        ];
        for (body, want) in cases {
            let f = body_fields(body.as_bytes()).expect("parse");
            assert!(!crate::protocol::openai::client_wants_usage(&f), "{body}");
            let rewritten = crate::protocol::openai::with_include_usage(body.as_bytes(), &f).expect("rewrite");
            let v: serde_json::Value = serde_json::from_slice(&rewritten).unwrap_or_else(|e| panic!("{body}: {e}"));
            assert_eq!(v["stream_options"], want, "{body}");
            assert_eq!((v["model"].as_str(), v["stream"].as_bool()), (Some("m"), Some(true)), "{body}");
            let f2 = body_fields(&rewritten).expect("reparse");
            assert!(crate::protocol::openai::client_wants_usage(&f2), "{body}");
        }
        // A duplicate stream_options is ambiguous: refused, never rewritten into two.
        assert_eq!(
            body_fields(br#"{"model":"m","stream_options":null,"stream_options":{"include_usage":true}}"#).unwrap_err().status(),
            400
        );
    }

    #[test]
    fn only_allowlisted_response_headers_reach_a_client() {
        let none: &[String] = &[];
        for name in ["content-type", "retry-after", "x-should-retry", "x-request-id", "openai-processing-ms"] {
            assert!(response_header_allowed(name, Protocol::Openai, none), "{name}");
        }
        assert!(response_header_allowed("request-id", Protocol::Anthropic, none));
        for name in ["openai-organization", "openai-project", "x-ratelimit-remaining-requests", "set-cookie", "connection", "x-internal"] {
            assert!(!response_header_allowed(name, Protocol::Openai, none), "{name}");
        }
        assert!(!response_header_allowed("anthropic-ratelimit-tokens-remaining", Protocol::Anthropic, none));
        assert!(!response_header_allowed("request-id", Protocol::Openai, none), "the allowlist is the protocol's");
        let forward = ["x-ratelimit-*".to_string(), "openai-project".to_string()];
        assert!(response_header_allowed("x-ratelimit-remaining-requests", Protocol::Openai, &forward));
        assert!(response_header_allowed("openai-project", Protocol::Openai, &forward));
        assert!(!response_header_allowed("set-cookie", Protocol::Openai, &["set-*".to_string()]), "cookies never");
    }

    #[test]
    fn only_allowlisted_query_parameters_and_headers_go_upstream() {
        let gen = Route::GenerateContent { model: "g".into(), stream: true };
        assert_eq!(upstream_query(Some("alt=sse&fields=candidates&%24fields=x&prettyPrint=false"), &gen).as_deref(), Some("alt=sse"));
        assert_eq!(upstream_query(Some("%61lt=sse"), &gen).as_deref(), Some("%61lt=sse"));
        assert_eq!(upstream_query(Some("fields=candidates"), &gen), None);
        assert_eq!(upstream_query(Some("beta=true&x=1"), &Route::Messages).as_deref(), Some("beta=true"));
        assert_eq!(upstream_query(Some("alt=sse"), &Route::ChatCompletions), None);
        for h in [
            "openai-organization",
            "openai-project",
            "x-goog-fieldmask",
            "x-goog-user-project",
            "cookie",
            "authorization",
            "x-forwarded-for",
            "x-mock-status",
        ] {
            for p in [Protocol::Openai, Protocol::Anthropic, Protocol::Gemini] {
                assert!(!header_allowed(h, p, &[]), "{h} to {p:?}");
            }
        }
        assert!(header_allowed("x-stainless-lang", Protocol::Openai, &[]));
        assert!(header_allowed("anthropic-beta", Protocol::Anthropic, &[]));
        assert!(!header_allowed("anthropic-beta", Protocol::Openai, &[]));
        assert!(header_allowed("x-goog-api-client", Protocol::Gemini, &[]));
        let forward = vec!["x-mock-*".to_string(), "x-test-tag".to_string()];
        assert!(header_allowed("x-mock-status", Protocol::Gemini, &forward));
        assert!(header_allowed("x-test-tag", Protocol::Gemini, &forward));
        assert!(!header_allowed("x-test-tagged", Protocol::Gemini, &forward));
    }

    #[test]
    fn rewrite_strips_client_keys_and_sets_provider_credentials() {
        let c = Catalog::new(&config(), 0, &health());
        let mut req = RequestHeader::build("POST", b"/messages?beta=true&fields=x", None).expect("req");
        for (k, v) in [
            ("authorization", "Bearer sk-client"),
            ("x-api-key", "sk-client"),
            ("x-goog-api-key", "sk-client"),
            ("x-alt-api-key", "sk-client"),
            ("compat-version", "2024-01-01"),
            ("accept-encoding", "gzip"),
            ("host", "gateway.local"),
            ("anthropic-beta", "tools-1"),
            ("openai-organization", "org-x"),
        ] {
            req.insert_header(k, v).expect("hdr");
        }
        let req = upstream_request(&req, &c.upstreams[2], 0, Destination::Relayed(&Route::Messages), Some("2024-01-01"), 12, &[])
            .expect("rewrite");
        assert_eq!(req.headers["anthropic-beta"], "tools-1");
        assert!(req.headers.get("openai-organization").is_none());
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
        req.set_version(http::Version::HTTP_2);
        let req = upstream_request(&req, &c.upstreams[0], 0, Destination::Relayed(&Route::ChatCompletions), None, 0, &[]).expect("rewrite");
        assert_eq!(req.headers["authorization"], "Bearer up-a");
        assert!(req.headers.get("x-api-key").is_none());
        assert_eq!(req.headers["host"], "127.0.0.1:1");
        assert_eq!(req.uri.path(), "/p/v1/chat/completions");
        assert_eq!(req.version, http::Version::HTTP_11);
    }

    #[test]
    fn anthropic_version_defaults_and_paths() {
        let c = Catalog::new(&config(), 0, &health());
        let req = RequestHeader::build("POST", b"/v1/messages", None).expect("req");
        let req = upstream_request(&req, &c.upstreams[2], 0, Destination::Relayed(&Route::Messages), None, 0, &[]).expect("rewrite");
        assert_eq!(req.headers["anthropic-version"], crate::config::upstream::DEFAULT_ANTHROPIC_VERSION);
        assert_eq!(upstream_path("/v1beta/models/g:generateContent", ""), "/v1beta/models/g:generateContent");
        assert_eq!(upstream_path("/embeddings", "/x"), "/x/v1/embeddings");
    }
}
