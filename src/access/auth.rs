//! Who is calling: key extraction from headers, the query-parameter ban, and the in-memory
//! key index (SHA-256 of the secret → record) that makes a lookup touch no disk.

use crate::base::clock::now_unix;
use crate::base::text::decode_component;
use crate::config::KeyConfig;
use crate::protocol::{ApiError, ErrorKind};
use crate::records::key::{KeyLookup, KeyOrigin, KeyRecord};
use crate::store::{KeyStore, StoreError};
use http::HeaderMap;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Arc;

/// Headers a client key may arrive in; all are removed before anything goes upstream.
pub use crate::protocol::KEY_HEADERS;

/// Query parameter names that carry a key; any of them makes the request a 400.
const KEY_PARAMS: [&str; 9] = ["key", "api_key", "apikey", "api-key", "access_token", "token", "auth", "x-api-key", "x-goog-api-key"];

pub type KeyHash = [u8; 32];

pub fn hash_key(secret: &str) -> KeyHash {
    Sha256::digest(secret.as_bytes()).into()
}

pub use crate::base::text::hex;

/// The key parameter the query string names, if any. Names are compared percent-decoded and
/// case-insensitively (`?%6Bey=` is `key`).
pub fn query_carries_key(query: Option<&str>) -> Option<String> {
    let query = query?;
    query.split('&').map(|pair| pair.split_once('=').map_or(pair, |(name, _)| name)).map(decode_component).find(|name| {
        let name = name.trim();
        KEY_PARAMS.iter().any(|k| k.eq_ignore_ascii_case(name))
    })
}

/// The key a request carries, from the first key header present.
pub fn extract_key(headers: &HeaderMap) -> Option<&str> {
    for name in KEY_HEADERS {
        let Some(value) = headers.get(name).and_then(|v| v.to_str().ok()) else {
            continue;
        };
        let value = value.trim();
        let key = if name == "authorization" {
            match value.split_once(' ') {
                Some((scheme, rest)) if scheme.eq_ignore_ascii_case("bearer") => rest.trim(),
                _ => continue,
            }
        } else {
            value
        };
        if !key.is_empty() {
            return Some(key);
        }
    }
    // A WebSocket client that cannot set a header (a browser) offers the key as a subprotocol.
    let offered = headers.get(http::header::SEC_WEBSOCKET_PROTOCOL).and_then(|v| v.to_str().ok())?;
    offered.split(',').map(str::trim).find_map(|p| p.strip_prefix(crate::protocol::realtime::KEY_SUBPROTOCOL)).filter(|k| !k.is_empty())
}

/// A holder's plan as the file names it: the one it has when the name is the same (its periods
/// go on), else the named one from now.
fn same_plan(had: Option<&crate::policy::plan::PlanRef>, named: Option<&str>) -> Option<crate::policy::plan::PlanRef> {
    match (had, named) {
        (Some(had), Some(name)) if had.name == name => Some(had.clone()),
        (_, Some(name)) => Some(crate::policy::plan::PlanRef { name: name.to_string(), since: now_unix() }),
        (_, None) => None,
    }
}

/// Digest of a configuration-file key entry (balance aside: it applies only at creation).
fn seed_digest(seed: &KeyConfig) -> String {
    let mut text = serde_json::json!([seed.name, seed.group, seed.rpm, seed.tpm, seed.enabled, seed.max_concurrent]).to_string();
    // A policy joins the digest only when set, so entries written before it keep their digest.
    if !seed.policy.is_empty() {
        text.push_str(&serde_json::to_string(&seed.policy).unwrap_or_default());
    }
    // And a plan.
    if let Some(plan) = &seed.plan {
        text.push_str("\nplan:");
        text.push_str(plan);
    }
    hex(&Sha256::digest(text.as_bytes())[..16])
}

/// The id of a key seeded from the configuration (stable across restarts).
pub fn seed_key_id(secret: &str) -> String {
    format!("key_{}", &hex(&hash_key(secret))[..16])
}

/// The keys the gateway authenticates against: the store's records and in-memory index
/// ([`KeyStore`]), and the rules by which the configuration file's `keys:` change them.
pub struct KeyIndex {
    store: Arc<dyn KeyStore>,
    /// `tag_limits`: what the keys carrying a tag value share (set from the file at start and
    /// at each reload).
    tag_limits: arc_swap::ArcSwap<crate::policy::limits::TagLimits>,
    /// `groups.<g>.price_multiplier`, of the groups that have one other than 1 (set from the
    /// file at start and at each reload).
    group_multipliers: arc_swap::ArcSwap<HashMap<String, crate::base::money::Multiplier>>,
    /// `plans:` (set from the file at start and at each reload).
    plans: arc_swap::ArcSwap<crate::policy::plan::Plans>,
}

/// A plan that applies to a call: the plan, as its holder took it, and the holder — the key
/// itself, or its account (`account`) — whose purse its credit is granted to.
#[derive(Debug, Clone)]
pub struct Subscribed {
    pub plan: Arc<crate::policy::plan::Plan>,
    pub since: u64,
    pub account: Option<Arc<crate::records::key::AccountRecord>>,
}

impl Subscribed {
    /// The holder's purse: the key's id, or `acct:<name>`.
    pub fn holder<'k>(&self, key: &'k KeyRecord) -> std::borrow::Cow<'k, str> {
        match &self.account {
            None => std::borrow::Cow::Borrowed(&key.id),
            Some(a) => std::borrow::Cow::Owned(crate::policy::budget::account_purse(&a.name)),
        }
    }

    /// Whose it is, in a refusal ("the plan 'pro' of the account 'research'").
    pub fn whose(&self) -> String {
        match &self.account {
            None => format!("the plan '{}' of this API key", self.plan.name),
            Some(a) => format!("the plan '{}' of the account '{}'", self.plan.name, a.name),
        }
    }
}

/// The key records to write so that the store follows the configuration file's keys:
///
/// * A new entry creates its key. An entry that changed since it was last applied sets the
///   key's name, group, limits and enabled flag; an unchanged entry leaves the key as the
///   admin API last set it (a key disabled there stays disabled).
/// * A key that came from the file and is no longer named there is disabled (once: the
///   admin API may enable it again).
/// * Keys created through the admin API are never touched by the file.
fn seed_changes(existing: Vec<KeyRecord>, seeds: &[KeyConfig]) -> Vec<KeyRecord> {
    let existing: HashMap<String, KeyRecord> = existing.into_iter().map(|r| (r.key_hash.clone(), r)).collect();
    let mut out = Vec::new();
    let mut named = std::collections::HashSet::new();
    for seed in seeds {
        let hash = hex(&hash_key(&seed.key));
        named.insert(hash.clone());
        let digest = seed_digest(seed);
        let from_file = |base: KeyRecord| KeyRecord {
            name: seed.name.clone(),
            group: seed.group.clone(),
            rpm: seed.rpm,
            tpm: seed.tpm,
            enabled: seed.enabled,
            max_concurrent: seed.max_concurrent,
            origin: KeyOrigin::Config,
            seed_digest: Some(digest.clone()),
            policy: seed.policy.clone(),
            plan: same_plan(base.plan.as_ref(), seed.plan.as_deref()),
            ..base
        };
        let rec = match existing.get(&hash) {
            Some(old) if old.revoked_at.is_some() => {
                log::warn!("keys: '{}' names a revoked key; it stays revoked (remove the entry)", seed.name);
                continue;
            }
            Some(old) if old.origin == KeyOrigin::Admin => {
                log::warn!("keys: '{}' names a key created through the admin API; the file entry is ignored", seed.name);
                continue;
            }
            Some(old) if old.origin == KeyOrigin::Config && old.seed_digest.as_deref() == Some(digest.as_str()) => continue,
            Some(old) => from_file(old.clone()),
            None => from_file(KeyRecord::new(seed_key_id(&seed.key), "", "", hash.clone(), KeyOrigin::Config)),
        };
        out.push(rec);
    }
    for (hash, old) in &existing {
        if old.origin == KeyOrigin::Config && old.seed_digest.is_some() && !named.contains(hash) {
            log::info!("key '{}' ({}) is no longer in the configuration file: disabled", old.name, old.id);
            out.push(KeyRecord { enabled: false, seed_digest: None, ..old.clone() });
        }
    }
    out
}

impl KeyIndex {
    /// Apply the configuration file's keys to `store` ([`KeyIndex::seed`]), then authenticate
    /// from its index.
    pub async fn load(store: Arc<dyn KeyStore>, seeds: &[KeyConfig]) -> Result<KeyIndex, StoreError> {
        let index = KeyIndex::new(store);
        index.seed(seeds).await?;
        Ok(index)
    }

    /// Authenticate from `store`'s index, as it is.
    pub fn new(store: Arc<dyn KeyStore>) -> KeyIndex {
        KeyIndex { store, tag_limits: Default::default(), group_multipliers: Default::default(), plans: Default::default() }
    }

    /// The limits of tag values (`tag_limits`).
    pub fn tag_limits(&self) -> Arc<crate::policy::limits::TagLimits> {
        self.tag_limits.load_full()
    }

    /// Set the limits of tag values (the file's, at start and at each reload).
    pub fn set_tag_limits(&self, limits: crate::policy::limits::TagLimits) {
        self.tag_limits.store(Arc::new(limits));
    }

    /// The price multiplier of `group` (1 when it sets none).
    pub fn group_multiplier(&self, group: &str) -> crate::base::money::Multiplier {
        let all = self.group_multipliers.load();
        match all.is_empty() {
            true => crate::base::money::Multiplier::ONE,
            false => all.get(group).copied().unwrap_or_default(),
        }
    }

    /// The plans (`plans:`).
    pub fn plans(&self) -> Arc<crate::policy::plan::Plans> {
        self.plans.load_full()
    }

    /// Set the plans (the file's, at start and at each reload).
    pub fn set_plans(&self, plans: crate::policy::plan::Plans) {
        self.plans.store(Arc::new(plans));
    }

    /// The plans a call of `key` is under: the key's own, then its account's (`account`, as
    /// the caller looked it up; a plan no longer in the file applies no more). Nothing to look
    /// up, and nothing allocated, while neither has a plan.
    pub fn subscribed(&self, key: &KeyRecord, account: Option<&Arc<crate::records::key::AccountRecord>>) -> Vec<Subscribed> {
        let account_plan = account.and_then(|a| a.plan.as_ref());
        if key.plan.is_none() && account_plan.is_none() {
            return Vec::new();
        }
        let plans = self.plans.load();
        let mut out = Vec::new();
        if let Some(p) = key.plan.as_ref() {
            if let Some(plan) = plans.get(&p.name) {
                out.push(Subscribed { plan: plan.clone(), since: p.since, account: None });
            }
        }
        if let (Some(a), Some(p)) = (account, account_plan) {
            if let Some(plan) = plans.get(&p.name) {
                out.push(Subscribed { plan: plan.clone(), since: p.since, account: Some(a.clone()) });
            }
        }
        out
    }

    /// The account of `key`, if it has one this node knows.
    pub fn account_of(&self, key: &KeyRecord) -> Option<Arc<crate::records::key::AccountRecord>> {
        key.policy.account.as_deref().and_then(|name| self.account(name))
    }

    /// The price multiplier a call of `key` is charged at, and whose it is: its plan's
    /// (`plan`: the key's, else its account's), else its account's (`account`), else its
    /// group's (`group`), else 1 (`none`). They do not compound.
    pub fn price_multiplier(&self, key: &KeyRecord) -> (crate::base::money::Multiplier, &'static str) {
        let account = self.account_of(key);
        let plans = self.subscribed(key, account.as_ref());
        self.multiplier_of(key, account.as_ref(), &plans)
    }

    /// [`KeyIndex::price_multiplier`] of a key whose account and plans were looked up.
    pub fn multiplier_of(
        &self,
        key: &KeyRecord,
        account: Option<&Arc<crate::records::key::AccountRecord>>,
        plans: &[Subscribed],
    ) -> (crate::base::money::Multiplier, &'static str) {
        if let Some(m) = plans.iter().find_map(|s| s.plan.price_multiplier) {
            return (m, "plan");
        }
        match account.and_then(|a| a.price_multiplier) {
            Some(m) => (m, "account"),
            None => match self.group_multiplier(&key.group) {
                m if m.is_one() => (m, "none"),
                m => (m, "group"),
            },
        }
    }

    /// Set the groups' price multipliers (the file's, at start and at each reload).
    pub fn set_group_multipliers(&self, groups: &std::collections::BTreeMap<String, crate::config::Group>) {
        let set = groups.iter().filter(|(_, g)| !g.price_multiplier.is_one()).map(|(n, g)| (n.clone(), g.price_multiplier)).collect();
        self.group_multipliers.store(Arc::new(set));
    }

    /// The shared account named `name`, from memory.
    pub fn account(&self, name: &str) -> Option<Arc<crate::records::key::AccountRecord>> {
        self.store.account(name)
    }

    /// Every shared account.
    pub async fn all_accounts(&self) -> Result<Vec<crate::records::key::AccountRecord>, StoreError> {
        self.store.accounts().await
    }

    pub async fn put_account(&self, account: &crate::records::key::AccountRecord) -> Result<(), StoreError> {
        self.store.put_account(account).await
    }

    /// Follow the configuration file's `accounts:` as keys follow `keys:`: a new entry creates
    /// its account, a changed entry sets its budgets, an unchanged one leaves what the admin
    /// API set; accounts created through the admin API are left alone.
    pub async fn seed_accounts(&self, seeds: &[crate::config::AccountConfig]) -> Result<(), StoreError> {
        let existing: HashMap<String, crate::records::key::AccountRecord> =
            self.store.accounts().await?.into_iter().map(|a| (a.name.clone(), a)).collect();
        for seed in seeds {
            // The guardrails are in the digest only when the entry names some: an entry written
            // before they existed is not applied again.
            let mut entry = format!("{}\n{}", seed.name, serde_json::to_string(&seed.budgets).unwrap_or_default());
            if !seed.guardrails.is_empty() {
                entry.push('\n');
                entry.push_str(&seed.guardrails.join(","));
            }
            // The same for its rate limits.
            if !seed.rates.is_empty() {
                entry.push('\n');
                entry.push_str(&serde_json::to_string(&seed.rates).unwrap_or_default());
            }
            // And its price multiplier and plan.
            if let Some(m) = seed.price_multiplier {
                entry.push_str(&format!("\nx{}", m.as_f64()));
            }
            if let Some(plan) = &seed.plan {
                entry.push_str(&format!("\nplan:{plan}"));
            }
            if let Some(cache) = &seed.cache {
                entry.push_str(&format!("\ncache:{}", serde_json::to_string(cache).unwrap_or_default()));
            }
            let digest = hex(&Sha256::digest(entry.as_bytes())[..16]);
            let record = match existing.get(&seed.name) {
                Some(old) if old.origin == KeyOrigin::Admin => {
                    log::warn!("accounts: '{}' names an account created through the admin API; the file entry is ignored", seed.name);
                    continue;
                }
                Some(old) if old.seed_digest.as_deref() == Some(digest.as_str()) => continue,
                Some(old) => crate::records::key::AccountRecord {
                    budgets: seed.budgets.clone(),
                    guardrails: seed.guardrails.clone(),
                    rates: seed.rates,
                    price_multiplier: seed.price_multiplier,
                    plan: same_plan(old.plan.as_ref(), seed.plan.as_deref()),
                    cache: seed.cache.clone(),
                    seed_digest: Some(digest),
                    origin: KeyOrigin::Config,
                    ..old.clone()
                },
                None => crate::records::key::AccountRecord {
                    name: seed.name.clone(),
                    budgets: seed.budgets.clone(),
                    created_at: now_unix(),
                    origin: KeyOrigin::Config,
                    seed_digest: Some(digest),
                    member_limit: None,
                    member_policy: None,
                    people: Default::default(),
                    guardrails: seed.guardrails.clone(),
                    rates: seed.rates,
                    price_multiplier: seed.price_multiplier,
                    plan: same_plan(None, seed.plan.as_deref()),
                    claude_code: None,
                    cache: seed.cache.clone(),
                },
            };
            self.store.put_account(&record).await?;
        }
        Ok(())
    }

    /// Every key record.
    pub async fn all_keys(&self) -> Result<Vec<KeyRecord>, StoreError> {
        self.store.all().await
    }

    /// Store a new or changed key; it is in force here when this returns (on the other nodes
    /// of a fleet within `store.sync_ms`).
    pub async fn put_key(&self, rec: &KeyRecord) -> Result<(), StoreError> {
        self.store.put(std::slice::from_ref(rec)).await
    }

    /// Apply the configuration file's keys to the store (`seed_changes`), durably, and bring
    /// the index up to date. Used at start, on reload and after an upgrade.
    pub async fn seed(&self, seeds: &[KeyConfig]) -> Result<(), StoreError> {
        let changes = seed_changes(self.store.all().await?, seeds);
        self.store.put(&changes).await
    }

    /// The record a secret's hash finds, as the index holds it (no check of its state).
    pub fn lookup(&self, secret: &str) -> KeyLookup {
        self.store.lookup(&hash_key(secret))
    }

    /// Authenticate: the record for this secret, or the 401 to send (in a fleet whose index is
    /// stale, a 503: a revocation may not have arrived).
    pub fn authenticate(&self, secret: Option<&str>) -> Result<Arc<KeyRecord>, ApiError> {
        let secret = secret.ok_or_else(|| {
            ApiError::new(
                ErrorKind::Unauthorized,
                "Missing API key. Send it as 'Authorization: Bearer <key>', 'x-api-key' or 'x-goog-api-key'.",
            )
        })?;
        let invalid = || ApiError::new(ErrorKind::Unauthorized, "Invalid API key.");
        let hash = hash_key(secret);
        let rec = match self.store.lookup(&hash) {
            KeyLookup::Found(rec) => rec,
            KeyLookup::Unknown => return Err(invalid()),
            KeyLookup::Stale => return Err(crate::store::fleet::unavailable("the key list")),
        };
        if rec.revoked_at.is_some() {
            return Err(ApiError::new(ErrorKind::Unauthorized, "This API key was revoked."));
        }
        if rec.rotated.is_some() {
            // Found by its previous secret: only during the grace period.
            let presented = hex(&hash);
            if !rec.hashes(now_unix()).any(|h| h == presented) {
                return Err(ApiError::new(
                    ErrorKind::Unauthorized,
                    "This API key was rotated and its grace period is over; use the new key.",
                ));
            }
        }
        if !rec.enabled {
            return Err(ApiError::new(ErrorKind::Unauthorized, "This API key is disabled."));
        }
        rec.policy.check_expiry(now_unix())?;
        Ok(rec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, http::HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn every_key_header_is_accepted() {
        assert_eq!(extract_key(&headers(&[("authorization", "Bearer sk-1")])), Some("sk-1"));
        assert_eq!(extract_key(&headers(&[("authorization", "bearer  sk-1 ")])), Some("sk-1"));
        assert_eq!(extract_key(&headers(&[("x-api-key", "sk-2")])), Some("sk-2"));
        assert_eq!(extract_key(&headers(&[("x-goog-api-key", "sk-3")])), Some("sk-3"));
        assert_eq!(extract_key(&headers(&[("x-alt-api-key", "sk-4")])), Some("sk-4"));
        assert_eq!(extract_key(&headers(&[("authorization", "Basic abc")])), None);
        assert_eq!(extract_key(&headers(&[("authorization", "Basic abc"), ("x-api-key", "sk-5")])), Some("sk-5"));
        assert_eq!(extract_key(&headers(&[])), None);
    }

    #[test]
    fn key_in_query_is_detected() {
        assert_eq!(query_carries_key(Some("alt=sse&key=abc")), Some("key".into()));
        assert_eq!(query_carries_key(Some("API_KEY=abc")), Some("API_KEY".into()));
        assert_eq!(query_carries_key(Some("access_token")), Some("access_token".into()));
        assert_eq!(query_carries_key(Some("alt=sse&pageSize=50")), None);
        assert_eq!(query_carries_key(Some("keys=1")), None);
        assert_eq!(query_carries_key(None), None);
        // Names are compared percent-decoded and case-insensitively.
        assert_eq!(query_carries_key(Some("%6Bey=abc")), Some("key".into()));
        assert_eq!(query_carries_key(Some("alt=sse&%4B%45%59=abc")), Some("KEY".into()));
        assert_eq!(query_carries_key(Some("api%5Fkey=abc")), Some("api_key".into()));
        assert_eq!(query_carries_key(Some("access%5ftoken")), Some("access_token".into()));
        assert_eq!(query_carries_key(Some("%6B%65%79%20=abc")), Some("key ".into()));
        assert_eq!(query_carries_key(Some("%zz=1&%6=2&%")), None);
        assert_eq!(decode_component("a%2Bb+c%"), "a+b c%");
    }

    fn seed(key: &str, enabled: bool) -> KeyConfig {
        KeyConfig {
            key: key.into(),
            name: format!("n-{key}"),
            group: "default".into(),
            balance: 1.0,
            rpm: None,
            tpm: None,
            enabled,
            max_concurrent: None,
            policy: Default::default(),
            plan: None,
        }
    }

    /// Revocation sticks: a key the file drops is disabled; an admin change to a seeded key
    /// lasts until the file changes that key's entry; admin-created keys are left alone.
    #[tokio::test]
    async fn the_file_revokes_and_admin_changes_stick() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = crate::store::sled::SledDb::open(dir.path()).expect("open");
        let store = Arc::new(crate::store::sled::keys::SledKeys::new(db.db()).expect("keys"));
        let admin = KeyRecord {
            created_at: 1,
            ..KeyRecord::new("key_admin", "made-by-admin", "default", hex(&hash_key("sk-admin-made-0001")), KeyOrigin::Admin)
        };
        store.put(std::slice::from_ref(&admin)).await.expect("put");
        let index = KeyIndex::load(store.clone(), &[seed("sk-file-a-0001", true), seed("sk-file-b-0001", true)]).await.expect("load");
        assert!(index.authenticate(Some("sk-file-b-0001")).is_ok());

        // The admin API disables a: the same file loaded again keeps it disabled.
        let mut a = store.all().await.expect("all").into_iter().find(|r| r.name == "n-sk-file-a-0001").expect("a");
        a.enabled = false;
        store.put(std::slice::from_ref(&a)).await.expect("put");
        index.seed(&[seed("sk-file-a-0001", true), seed("sk-file-b-0001", true)]).await.expect("reseed");
        assert!(index.authenticate(Some("sk-file-a-0001")).is_err(), "admin change survives a reload of an unchanged entry");

        // The file drops b: disabled. The admin key is untouched throughout.
        index.seed(&[seed("sk-file-a-0001", true)]).await.expect("reseed");
        assert!(index.authenticate(Some("sk-file-b-0001")).unwrap_err().message.contains("disabled"));
        assert!(index.authenticate(Some("sk-admin-made-0001")).is_ok());

        // Changing a's entry in the file applies the file again; re-adding b enables it.
        let changed = KeyConfig { rpm: Some(5), ..seed("sk-file-a-0001", true) };
        index.seed(&[changed, seed("sk-file-b-0001", true)]).await.expect("reseed");
        assert_eq!(index.authenticate(Some("sk-file-a-0001")).expect("enabled by the file").rpm, Some(5));
        assert!(index.authenticate(Some("sk-file-b-0001")).is_ok());

        // A restart (a new index on the same store) changes nothing.
        let store = Arc::new(crate::store::sled::keys::SledKeys::new(db.db()).expect("keys"));
        let again = KeyIndex::load(store.clone(), &[seed("sk-file-b-0001", true)]).await.expect("restart");
        assert!(again.authenticate(Some("sk-file-a-0001")).is_err(), "dropped from the file: disabled");
        assert!(again.authenticate(Some("sk-admin-made-0001")).is_ok());
    }

    #[tokio::test]
    async fn seeded_keys_are_hashed_and_balance_kept_on_reseed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = crate::store::sled::SledDb::open(dir.path()).expect("open");
        let store = Arc::new(crate::store::sled::keys::SledKeys::new(db.db()).expect("keys"));
        let seed = KeyConfig {
            key: "sk-demo-0001".into(),
            name: "demo".into(),
            group: "default".into(),
            balance: 5.0,
            rpm: None,
            tpm: None,
            enabled: true,
            max_concurrent: None,
            policy: Default::default(),
            plan: None,
        };
        let index = KeyIndex::load(store.clone(), std::slice::from_ref(&seed)).await.expect("load");
        let rec = index.authenticate(Some("sk-demo-0001")).expect("known");
        assert_eq!(rec.id, seed_key_id("sk-demo-0001"));
        let raw = format!("{:?}", store.all().await.expect("all"));
        assert!(!raw.contains("sk-demo-0001"), "secret stored in clear: {raw}");

        // Re-seeding applies the file's `enabled` and keeps the id.
        let seed2 = KeyConfig { balance: 100.0, enabled: false, ..seed };
        let index = KeyIndex::load(store.clone(), &[seed2]).await.expect("reload");
        let e = index.authenticate(Some("sk-demo-0001")).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Unauthorized);
        assert!(e.message.contains("disabled"));
        assert_eq!(store.all().await.expect("all")[0].id, rec.id);
    }

    #[tokio::test]
    async fn unknown_and_missing_keys_are_401() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = crate::store::sled::SledDb::open(dir.path()).expect("open");
        let store = Arc::new(crate::store::sled::keys::SledKeys::new(db.db()).expect("keys"));
        let index = KeyIndex::load(store.clone(), &[]).await.expect("load");
        assert_eq!(index.authenticate(None).unwrap_err().status(), 401);
        assert_eq!(index.authenticate(Some("sk-nope")).unwrap_err().status(), 401);
    }
}
