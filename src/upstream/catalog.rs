//! The provider catalog: which providers serve a model (by protocol), which protocols each
//! group may call, the order a request tries them in (tiers, smooth weighted round-robin,
//! conversation affinity), peers built from pre-resolved addresses, and the background DNS
//! refresh.

use super::affinity::rendezvous_score;
use super::seam::Seam;
use crate::config::{Config, Group, Platform, Protocol, ProviderConfig};
use crate::protocol::ModelEntry;
use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use pingora_core::upstreams::peer::HttpPeer;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// A configured provider with its resolved addresses.
pub struct Upstream {
    pub config: ProviderConfig,
    addrs: ArcSwap<Vec<SocketAddr>>,
    pool_key: u64,
    /// What its kind does differently: its protocol, paths and authentication.
    pub seam: Box<dyn Seam>,
    /// Cooldowns, probes and the key rotation (kept across reloads).
    pub health: Arc<crate::upstream::health::ProviderHealth>,
    /// The `Host` header's value, built once.
    pub(super) host_value: http::HeaderValue,
    /// Its attributes on an attempt's client span, encoded once.
    pub span_attrs: crate::observe::telemetry::Attrs,
}

impl Upstream {
    fn new(config: ProviderConfig, health: Arc<crate::upstream::health::ProviderHealth>) -> Self {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        config.name.hash(&mut h);
        let seam = super::seam::for_provider(&config);
        let host_value = http::HeaderValue::from_str(&config.base_url.host_header()).unwrap_or_else(|_| http::HeaderValue::from_static(""));
        let span_attrs = crate::observe::telemetry::Upstream {
            gen_ai_provider: crate::observe::metrics::gen_ai_provider(config.kind),
            name: &config.name,
            host: &config.base_url.host,
            port: config.base_url.port,
        }
        .attrs();
        Upstream { pool_key: h.finish(), config, addrs: ArcSwap::from_pointee(Vec::new()), seam, health, host_value, span_attrs }
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
    /// Some group has rewrite rules (none: no request looks its group's up).
    group_rewrites: bool,
}

impl Catalog {
    pub fn new(config: &Config, created: u64, health: &crate::upstream::health::HealthBook) -> Catalog {
        let mut by_model: HashMap<String, [Vec<usize>; 3], ahash::RandomState> = HashMap::default();
        for (i, p) in config.providers.iter().enumerate() {
            for m in &p.models {
                let entry = &mut by_model.entry(m.clone()).or_default()[p.wire(m).index()];
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
            group_rewrites: config.groups.values().any(|g| !g.rewrite.is_empty()),
        }
    }

    /// The rewrite rules of `group` (`groups.<g>.rewrite`).
    pub fn group_rewrite(&self, group: &str) -> Option<&Arc<[crate::config::rewrite::RewriteRule]>> {
        self.groups.get(group).filter(|_| self.group_rewrites).map(|g| &g.rewrite).filter(|rules| !rules.is_empty())
    }

    /// Every group, by name.
    pub fn groups(&self) -> &BTreeMap<String, Group> {
        &self.groups
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
    /// The name clients call a model by, given either that name or a provider's own id for it
    /// (`models: [{name, upstream}]`): what a Bedrock- or Vertex-format path names.
    pub fn client_name(&self, id: &str) -> Option<String> {
        if self.by_model.contains_key(id) {
            return Some(id.to_string());
        }
        self.upstreams.iter().find_map(|u| u.config.upstream_names.iter().find(|(_, up)| up.as_str() == id).map(|(name, _)| name.clone()))
    }

    pub fn models_for(&self, group: &str, only: Option<Protocol>) -> Vec<ModelEntry> {
        let mut out: Vec<ModelEntry> = Vec::new();
        let translates = self.group_translates(group);
        for u in &self.upstreams {
            for m in &u.config.models {
                let p = u.config.wire(m);
                let reachable = match only {
                    Some(endpoint) if translates => self.group_allows(group, endpoint),
                    Some(endpoint) => endpoint == p && self.group_allows(group, p),
                    None if translates => Protocol::ALL.into_iter().any(|e| self.group_allows(group, e)),
                    None => self.group_allows(group, p),
                };
                if reachable && !out.iter().any(|e| &e.id == m) {
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
    pub routing: Arc<ArcSwap<crate::upstream::Routing>>,
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
                    let at = crate::upstream::affinity::first_within_bound(
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
    ) -> Option<(usize, crate::upstream::health::Admission)> {
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
