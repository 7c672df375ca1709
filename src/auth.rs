//! Who is calling: key extraction from headers, the query-parameter ban, and the in-memory
//! key index (SHA-256 of the secret → record) that makes a lookup touch no disk.

use crate::config::KeyConfig;
use crate::protocol::{ApiError, ErrorKind};
use crate::store::{KeyRecord, Store, StoreError};
use arc_swap::ArcSwap;
use http::HeaderMap;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Arc;

/// Headers a client key may arrive in; all are removed before anything goes upstream.
pub const KEY_HEADERS: [&str; 4] = ["authorization", "x-api-key", "x-goog-api-key", "x-alt-api-key"];

/// Query parameter names that carry a key; any of them makes the request a 400.
const KEY_PARAMS: [&str; 9] = [
    "key", "api_key", "apikey", "api-key", "access_token", "token", "auth", "x-api-key", "x-goog-api-key",
];

pub type KeyHash = [u8; 32];

pub fn hash_key(secret: &str) -> KeyHash {
    Sha256::digest(secret.as_bytes()).into()
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// True when the query string names a key parameter.
pub fn query_carries_key(query: Option<&str>) -> Option<String> {
    let query = query?;
    query
        .split('&')
        .map(|pair| pair.split_once('=').map_or(pair, |(name, _)| name))
        .find(|name| KEY_PARAMS.iter().any(|k| k.eq_ignore_ascii_case(name)))
        .map(str::to_string)
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
    None
}

/// The id of a key seeded from the configuration (stable across restarts).
pub fn seed_key_id(secret: &str) -> String {
    format!("key_{}", &hex(&hash_key(secret))[..16])
}

/// Lock-free map of key hash → record; replaced whole on every change.
pub struct KeyIndex {
    by_hash: ArcSwap<HashMap<KeyHash, Arc<KeyRecord>>>,
}

fn parse_hash(hex_str: &str) -> Option<KeyHash> {
    if hex_str.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex_str.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// USD → nano-USD, rounded.
pub fn usd_to_nanos(usd: f64) -> i64 {
    (usd * 1e9).round() as i64
}

impl KeyIndex {
    /// Seed the configured keys (an existing one takes name, group, limits and enabled from the
    /// file; balances are the ledger's), then load all.
    pub fn load(store: &Store, seeds: &[KeyConfig]) -> Result<KeyIndex, StoreError> {
        let index = KeyIndex { by_hash: ArcSwap::from_pointee(HashMap::new()) };
        index.seed(store, seeds)?;
        Ok(index)
    }

    /// Apply the configured keys to the store (new ones created, existing ones updated), then
    /// reload the index. Used at start and on configuration reload.
    pub fn seed(&self, store: &Store, seeds: &[KeyConfig]) -> Result<(), StoreError> {
        let existing: HashMap<String, KeyRecord> =
            store.all_keys()?.into_iter().map(|r| (r.key_hash.clone(), r)).collect();
        for seed in seeds {
            let hash = hex(&hash_key(&seed.key));
            let rec = match existing.get(&hash) {
                Some(old) => KeyRecord {
                    name: seed.name.clone(),
                    group: seed.group.clone(),
                    rpm: seed.rpm,
                    tpm: seed.tpm,
                    enabled: seed.enabled,
                    ..old.clone()
                },
                None => KeyRecord {
                    id: seed_key_id(&seed.key),
                    name: seed.name.clone(),
                    group: seed.group.clone(),
                    key_hash: hash.clone(),
                    rpm: seed.rpm,
                    tpm: seed.tpm,
                    enabled: seed.enabled,
                    created_at: now_unix(),
                },
            };
            if existing.get(&hash) != Some(&rec) {
                store.put_key(&rec)?;
            }
        }
        self.reload(store)
    }

    /// Re-read every record from the store.
    pub fn reload(&self, store: &Store) -> Result<(), StoreError> {
        let mut map = HashMap::new();
        for rec in store.all_keys()? {
            match parse_hash(&rec.key_hash) {
                Some(h) => {
                    map.insert(h, Arc::new(rec));
                }
                None => log::warn!("key {} has an unreadable hash; ignored", rec.id),
            }
        }
        self.by_hash.store(Arc::new(map));
        Ok(())
    }

    /// Authenticate: the record for this secret, or the 401 to send.
    pub fn authenticate(&self, secret: Option<&str>) -> Result<Arc<KeyRecord>, ApiError> {
        let secret = secret.ok_or_else(|| {
            ApiError::new(
                ErrorKind::Unauthorized,
                "Missing API key. Send it as 'Authorization: Bearer <key>', 'x-api-key' or 'x-goog-api-key'.",
            )
        })?;
        let rec = self
            .by_hash
            .load()
            .get(&hash_key(secret))
            .cloned()
            .ok_or_else(|| ApiError::new(ErrorKind::Unauthorized, "Invalid API key."))?;
        if !rec.enabled {
            return Err(ApiError::new(ErrorKind::Unauthorized, "This API key is disabled."));
        }
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
    }

    #[test]
    fn seeded_keys_are_hashed_and_balance_kept_on_reseed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path()).expect("open");
        let seed = KeyConfig {
            key: "sk-demo-0001".into(),
            name: "demo".into(),
            group: "default".into(),
            balance: 5.0,
            rpm: None,
            tpm: None,
            enabled: true,
        };
        let index = KeyIndex::load(&store, std::slice::from_ref(&seed)).expect("load");
        let rec = index.authenticate(Some("sk-demo-0001")).expect("known");
        assert_eq!(rec.id, seed_key_id("sk-demo-0001"));
        let raw = format!("{:?}", store.all_keys().expect("all"));
        assert!(!raw.contains("sk-demo-0001"), "secret stored in clear: {raw}");

        // Re-seeding applies the file's `enabled` and keeps the id.
        let seed2 = KeyConfig { balance: 100.0, enabled: false, ..seed };
        let index = KeyIndex::load(&store, &[seed2]).expect("reload");
        let e = index.authenticate(Some("sk-demo-0001")).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Unauthorized);
        assert!(e.message.contains("disabled"));
        assert_eq!(store.all_keys().expect("all")[0].id, rec.id);
    }

    #[test]
    fn unknown_and_missing_keys_are_401() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path()).expect("open");
        let index = KeyIndex::load(&store, &[]).expect("load");
        assert_eq!(index.authenticate(None).unwrap_err().status(), 401);
        assert_eq!(index.authenticate(Some("sk-nope")).unwrap_err().status(), 401);
    }
}
