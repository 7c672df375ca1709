//! The response cache: a call answered again from the gateway, whole or streamed as the model
//! streamed it. What identifies a call that may be answered again ([`key`]) and what its client
//! asks of the cache ([`directive`]); whether and how a call uses the cache ([`Cache::consult`]:
//! the nearest `cache:` entry of its key, account or group, or its request's `ttl=`); the answer
//! kept as it goes to the client ([`capture`]), stored ([`entry`]; in the store's
//! `CacheStore`: sled on one node, the shared database in a fleet), and replayed with a fresh
//! id ([`replay`]). A hit is a kind of call on the charge path like any other: the edge admits,
//! holds and settles it (`edge::gateway::cached`).

pub mod capture;
pub mod directive;
pub mod entry;
pub mod key;
pub mod replay;

use crate::config::cache::CacheConfig;
use crate::observe::metrics::Metrics;
use crate::policy::cache::{CachePolicy, CacheScope};
use crate::store::{CacheFilter, CacheMeta, CacheStore, StoreError};
use std::sync::Arc;

/// The cache of one gateway: its store, its defaults, its counters.
pub struct Cache {
    store: Arc<dyn CacheStore>,
    pub config: CacheConfig,
    /// `tollgate_cache_lookups_total` by result, `tollgate_cache_stores_total` by outcome: made
    /// once, not looked up per call.
    lookups: [Arc<crate::observe::metrics::Counter>; 4],
    stores: [Arc<crate::observe::metrics::Counter>; 3],
}

/// The results a lookup is counted under, in `Cache::lookups`' order.
const RESULTS: [&str; 4] = ["hit", "miss", "refresh", "bypass"];
const OUTCOMES: [&str; 3] = ["kept", "too_large", "failed"];

/// A call that may be answered from the cache, as the edge describes it.
pub struct Call<'a> {
    pub protocol: &'a str,
    pub route: &'a str,
    pub model: &'a str,
    pub stream: bool,
    /// The route never answers the same twice on its own (`false` for embeddings: they do).
    pub samples: bool,
    /// The route stores what it answers unless told not to (the responses API's `store`).
    pub stores_by_default: bool,
    pub body: &'a [u8],
    pub key_id: &'a str,
    pub account: Option<&'a str>,
    pub group: &'a str,
}

/// How a call uses the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Use {
    pub key: String,
    pub ttl_secs: u64,
    pub max_entry_bytes: u64,
    /// A kept answer may be served to it (not `refresh`).
    pub reads: bool,
    /// Its answer is kept (not `no-store`).
    pub keeps: bool,
    pub scope: CacheScope,
}

/// Why a call that asked for the cache does not use it (the answer's `x-tollgate-cache: bypass`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bypass {
    NotCacheable(key::NotCacheable),
    /// A stream, where its entry keeps none (`streams: false`).
    Stream,
}

impl Cache {
    pub fn new(store: Arc<dyn CacheStore>, config: CacheConfig, metrics: Arc<Metrics>) -> Cache {
        let lookups = RESULTS.map(|r| metrics.counter("tollgate_cache_lookups_total", &[("result", r)]));
        let stores = OUTCOMES.map(|o| metrics.counter("tollgate_cache_stores_total", &[("outcome", o)]));
        Cache { store, config, lookups, stores }
    }

    /// The cache `config` asks for, on `store` (None: no `cache:` section).
    pub fn open(
        config: Option<&CacheConfig>,
        store: &dyn crate::store::Store,
        metrics: &Arc<Metrics>,
    ) -> Result<Option<Arc<Cache>>, String> {
        let Some(config) = config else { return Ok(None) };
        let kept = store.cache(config.max_bytes).map_err(|e| format!("cache: the store could not be opened: {e}"))?;
        Ok(Some(Arc::new(Cache::new(kept, config.clone(), metrics.clone()))))
    }

    /// Whether and how `call` uses the cache: the nearest `cache:` entry (`policy`), else a
    /// request's `ttl=` alone (key scope); a request's `ttl=` sets its own time either way.
    /// None: the cache does not apply (neither asked for it); `Err`: it was asked for and the
    /// call cannot use it.
    pub fn consult(&self, call: &Call<'_>, policy: Option<&CachePolicy>, asked: directive::Directive) -> Option<Result<Use, Bypass>> {
        if asked.no_store && policy.is_none() {
            return None;
        }
        let default_policy = CachePolicy { enabled: true, ttl: None, scope: CacheScope::Key, max_entry_bytes: None, streams: true };
        let policy = match (policy, asked.ttl_secs.is_some() || asked.refresh) {
            (Some(p), _) => p,
            (None, true) => &default_policy,
            (None, false) => return None,
        };
        if call.stream && !policy.streams {
            return Some(Err(Bypass::Stream));
        }
        let body: serde_json::Value = match serde_json::from_slice(call.body) {
            Ok(v) => v,
            Err(_) => return Some(Err(Bypass::NotCacheable(key::NotCacheable::NotJson))),
        };
        let stored_default = call.stores_by_default && body.get("store").and_then(serde_json::Value::as_bool) != Some(false);
        if stored_default {
            return Some(Err(Bypass::NotCacheable(key::NotCacheable::Stored)));
        }
        if let Err(e) = key::cacheable(&body, self.config.any_temperature || !call.samples) {
            return Some(Err(Bypass::NotCacheable(e)));
        }
        // A scope the key is not in (no account) is its own.
        let (scope, owner) = match (policy.scope, call.account) {
            (CacheScope::Account, Some(account)) => (CacheScope::Account, key::Scope::Account(account)),
            (CacheScope::Group, _) => (CacheScope::Group, key::Scope::Group(call.group)),
            _ => (CacheScope::Key, key::Scope::Key(call.key_id)),
        };
        Some(Ok(Use {
            key: key::key(call.protocol, call.route, call.model, call.stream, owner, &body),
            ttl_secs: asked.ttl_secs.or(policy.ttl).unwrap_or(self.config.ttl_secs),
            max_entry_bytes: policy.max_entry_bytes.unwrap_or(self.config.max_entry_bytes),
            reads: asked.reads(),
            keeps: asked.keeps(),
            scope,
        }))
    }

    /// The answer kept for `key` at `now_ms`, counted in `tollgate_cache_lookups_total`. A store
    /// that cannot be read is a miss (logged): the call goes upstream.
    pub async fn get(&self, key: &str, now_ms: u64) -> Option<entry::Entry> {
        let found = match self.store.get(key, now_ms).await {
            Ok(found) => found.and_then(|stored| entry::Entry::decode(&stored)),
            Err(e) => {
                log::warn!("response cache: could not be read ({e}); the call goes upstream");
                None
            }
        };
        self.count(if found.is_some() { "hit" } else { "miss" });
        found
    }

    /// Count a lookup's result (`hit`, `miss`, `refresh`, `bypass`).
    pub fn count(&self, result: &'static str) {
        if let Some(i) = RESULTS.iter().position(|r| *r == result) {
            self.lookups[i].add(1);
        }
    }

    /// Keep `entry` under `key` for the key `key_id`; a store that cannot be written is logged.
    pub async fn keep(&self, key: &str, key_id: &str, entry: &entry::Entry) {
        let meta = CacheMeta { key_id, model: &entry.model, expires_ms: entry.expires_ms };
        match self.store.put(key, meta, &entry.encode()).await {
            Ok(true) => self.stores[0].add(1),
            Ok(false) => self.stores[1].add(1),
            Err(e) => {
                self.stores[2].add(1);
                log::warn!("response cache: an answer could not be kept: {e}");
            }
        }
    }

    /// Remove what `filter` picks (`DELETE /admin/cache`).
    pub async fn clear(&self, filter: &CacheFilter) -> Result<usize, StoreError> {
        self.store.clear(filter).await
    }

    /// Bytes of answers kept (`tollgate_cache_bytes`).
    pub async fn bytes(&self) -> Result<u64, StoreError> {
        self.store.bytes().await
    }

    /// Remove expired answers; how many.
    pub async fn sweep(&self, now_ms: u64) -> Result<usize, StoreError> {
        self.store.sweep(now_ms).await
    }
}

/// The background sweep of expired answers, every `cache.sweep_secs`.
pub struct Sweeper(pub Arc<Cache>);

#[async_trait::async_trait]
impl pingora_core::services::background::BackgroundService for Sweeper {
    async fn start(&self, mut shutdown: pingora_core::server::ShutdownWatch) {
        let every = std::time::Duration::from_secs(self.0.config.sweep_secs);
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(every) => {}
            }
            match self.0.sweep(crate::base::clock::now_ms()).await {
                Ok(0) => {}
                Ok(n) => log::debug!("response cache: {n} expired answers removed"),
                Err(e) => log::warn!("response cache: the sweep failed: {e}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use directive::Directive;

    fn cache() -> Cache {
        let dir = tempfile::tempdir().expect("dir");
        let slot = crate::store::DbSlot::new(sled::open(dir.path()).expect("db"));
        let store = Arc::new(crate::store::sled::cache::SledCache::open(&slot, 1 << 20).expect("open"));
        let config = crate::config::cache::CacheConfig {
            max_bytes: 1 << 20,
            max_entry_bytes: 1 << 10,
            any_temperature: false,
            ttl_secs: 300,
            sweep_secs: 60,
        };
        Cache::new(store, config, Arc::new(Metrics::default()))
    }

    fn call<'a>(body: &'a str, key_id: &'a str, account: Option<&'a str>) -> Call<'a> {
        Call {
            protocol: "openai",
            route: "chat_completions",
            model: "m",
            stream: false,
            samples: true,
            stores_by_default: false,
            body: body.as_bytes(),
            key_id,
            account,
            group: "g",
        }
    }

    const BODY: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0}"#;

    #[test]
    fn a_call_uses_the_cache_only_when_asked_and_only_in_its_scope() {
        let c = cache();
        let none = Directive::default();
        assert_eq!(c.consult(&call(BODY, "k1", None), None, none), None, "off by default");
        let by_key = CachePolicy { enabled: true, ttl: Some(60), scope: CacheScope::Key, max_entry_bytes: None, streams: false };
        let used = c.consult(&call(BODY, "k1", Some("acme")), Some(&by_key), none).expect("asked").expect("cacheable");
        assert_eq!((used.ttl_secs, used.max_entry_bytes, used.reads, used.keeps), (60, 1 << 10, true, true));
        let other = c.consult(&call(BODY, "k2", Some("acme")), Some(&by_key), none).expect("asked").expect("cacheable");
        assert_ne!(used.key, other.key, "key scope: another key never shares");
        let by_account = CachePolicy { scope: CacheScope::Account, ..by_key.clone() };
        let a1 = c.consult(&call(BODY, "k1", Some("acme")), Some(&by_account), none).expect("asked").expect("ok");
        let a2 = c.consult(&call(BODY, "k2", Some("acme")), Some(&by_account), none).expect("asked").expect("ok");
        assert_eq!((a1.key == a2.key, a1.scope), (true, CacheScope::Account), "account scope: its keys share");
        let lone = c.consult(&call(BODY, "k3", None), Some(&by_account), none).expect("asked").expect("ok");
        assert_eq!(lone.scope, CacheScope::Key, "a key in no account keeps its own");
        // A request's ttl opens it alone (key scope), and sets its own time under an entry.
        let ttl = Directive::parse("ttl=5").expect("ok");
        let asked = c.consult(&call(BODY, "k1", None), None, ttl).expect("asked").expect("ok");
        assert_eq!((asked.ttl_secs, asked.scope), (5, CacheScope::Key));
        assert_eq!(c.consult(&call(BODY, "k1", None), Some(&by_key), ttl).expect("asked").expect("ok").ttl_secs, 5);
        let refresh = c.consult(&call(BODY, "k1", None), Some(&by_key), Directive::parse("refresh").expect("ok")).expect("a").expect("ok");
        assert_eq!((refresh.reads, refresh.keeps), (false, true));
        let no_store =
            c.consult(&call(BODY, "k1", None), Some(&by_key), Directive::parse("no-store").expect("ok")).expect("a").expect("ok");
        assert_eq!((no_store.reads, no_store.keeps), (false, false));
        // What cannot be cached says why.
        let stream = Call { stream: true, ..call(BODY, "k1", None) };
        assert_eq!(c.consult(&stream, Some(&by_key), none), Some(Err(Bypass::Stream)));
        let sampled = r#"{"messages":[],"temperature":0.7}"#;
        assert_eq!(c.consult(&call(sampled, "k1", None), Some(&by_key), none), Some(Err(Bypass::NotCacheable(key::NotCacheable::Sampled))));
        let embeds = Call { samples: false, ..call(r#"{"input":"x"}"#, "k1", None) };
        assert!(c.consult(&embeds, Some(&by_key), none).expect("asked").is_ok(), "embeddings do not sample");
        let responses = Call { stores_by_default: true, ..call(BODY, "k1", None) };
        assert_eq!(c.consult(&responses, Some(&by_key), none), Some(Err(Bypass::NotCacheable(key::NotCacheable::Stored))));
        let unstored = r#"{"input":"hi","temperature":0,"store":false}"#;
        assert!(c.consult(&Call { stores_by_default: true, ..call(unstored, "k1", None) }, Some(&by_key), none).expect("a").is_ok());
    }
}
