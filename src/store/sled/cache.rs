//! The response cache on one node: tree `response_cache`, each entry its cache key → the unix
//! millisecond it expires (8 bytes, big-endian), the key id and model it is of (each
//! length-prefixed), and the answer (opaque here: `cache::entry`'s stored form). At most
//! `max_bytes` of answers are kept: the least recently used go first (an index in memory,
//! rebuilt from the tree when it is opened, which also answers a miss without reading the
//! tree); an expired entry is never returned, and is removed when read or swept.

use crate::base::codec::{put_str, Reader};
use crate::store::{CacheFilter, CacheMeta, CacheStore, DbSlot, StoreError};
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

pub const TREE: &str = "response_cache";

/// What the index knows of an entry.
struct Slot {
    /// When it was last used (a tick of the index's clock).
    used: u64,
    bytes: u64,
    expires_ms: u64,
}

#[derive(Default)]
struct Index {
    entries: HashMap<Vec<u8>, Slot>,
    /// Tick → key: the least recently used first.
    order: BTreeMap<u64, Vec<u8>>,
    tick: u64,
    bytes: u64,
}

impl Index {
    /// `key` was used now; `kept`: it was (re)written, this many bytes, expiring then.
    fn touch(&mut self, key: &[u8], kept: Option<(u64, u64)>) {
        self.tick += 1;
        let tick = self.tick;
        match self.entries.get_mut(key) {
            Some(slot) => {
                self.order.remove(&slot.used);
                slot.used = tick;
                if let Some((b, expires_ms)) = kept {
                    self.bytes = self.bytes - slot.bytes + b;
                    slot.bytes = b;
                    slot.expires_ms = expires_ms;
                }
            }
            None => {
                let (b, expires_ms) = kept.unwrap_or((0, 0));
                self.entries.insert(key.to_vec(), Slot { used: tick, bytes: b, expires_ms });
                self.bytes += b;
            }
        }
        self.order.insert(tick, key.to_vec());
    }

    /// The keys expired by `now_ms`.
    fn expired(&self, now_ms: u64) -> Vec<Vec<u8>> {
        self.entries.iter().filter(|(_, s)| s.expires_ms <= now_ms).map(|(k, _)| k.clone()).collect()
    }

    /// Whether `key` is kept and unexpired at `now_ms` (None: not kept at all).
    fn live(&self, key: &[u8], now_ms: u64) -> Option<bool> {
        self.entries.get(key).map(|s| s.expires_ms > now_ms)
    }

    fn forget(&mut self, key: &[u8]) {
        if let Some(slot) = self.entries.remove(key) {
            self.order.remove(&slot.used);
            self.bytes -= slot.bytes;
        }
    }

    /// The least recently used key, while more than `max` bytes are held.
    fn over(&self, max: u64) -> Option<Vec<u8>> {
        (self.bytes > max).then(|| self.order.values().next().cloned()).flatten()
    }
}

pub struct SledCache {
    /// The database, reached per operation (an upgrade lets go of it: see `DbSlot`).
    slot: DbSlot,
    max_bytes: u64,
    index: Mutex<Index>,
}

/// A stored entry's parts: when it expires, whose and of which model, the answer.
struct Stored<'a> {
    expires_ms: u64,
    key_id: String,
    model: String,
    value: &'a [u8],
}

fn split(stored: &[u8]) -> Option<Stored<'_>> {
    let expires_ms = u64::from_be_bytes(stored.get(..8)?.try_into().ok()?);
    let mut r = Reader(stored.get(8..)?);
    let (key_id, model) = (r.string()??, r.string()??);
    Some(Stored { expires_ms, key_id, model, value: r.0 })
}

impl SledCache {
    /// The cache of `slot`'s database, at most `max_bytes` of answers.
    pub fn open(slot: &DbSlot, max_bytes: u64) -> Result<SledCache, StoreError> {
        let tree = slot.tree(TREE)?;
        let mut index = Index::default();
        for item in tree.iter() {
            let (k, v) = item?;
            index.touch(&k, Some(split(&v).map_or((0, 0), |s| (s.value.len() as u64, s.expires_ms))));
        }
        let cache = SledCache { slot: slot.clone(), max_bytes, index: Mutex::new(index) };
        cache.evict()?;
        Ok(cache)
    }

    fn index(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn tree(&self) -> Result<sled::Tree, StoreError> {
        self.slot.tree(TREE)
    }

    fn remove(&self, key: &[u8]) -> Result<(), StoreError> {
        self.tree()?.remove(key)?;
        self.index().forget(key);
        Ok(())
    }

    /// Remove every entry `gone` picks; how many.
    fn remove_where(&self, gone: impl Fn(Option<&Stored<'_>>) -> bool) -> Result<usize, StoreError> {
        let mut n = 0;
        for item in self.tree()?.iter() {
            let (k, v) = item?;
            if gone(split(&v).as_ref()) {
                self.remove(&k)?;
                n += 1;
            }
        }
        Ok(n)
    }

    fn evict(&self) -> Result<(), StoreError> {
        loop {
            let Some(oldest) = self.index().over(self.max_bytes) else { return Ok(()) };
            self.remove(&oldest)?;
        }
    }
}

#[async_trait::async_trait]
impl CacheStore for SledCache {
    async fn get(&self, key: &str, now_ms: u64) -> Result<Option<Vec<u8>>, StoreError> {
        // A miss (or an expired answer) is told by the index, without reading the tree.
        let live = self.index().live(key.as_bytes(), now_ms);
        match live {
            None => return Ok(None),
            Some(false) => {
                self.remove(key.as_bytes())?;
                return Ok(None);
            }
            Some(true) => {}
        }
        let Some(stored) = self.tree()?.get(key)? else { return Ok(None) };
        match split(&stored) {
            Some(s) if s.expires_ms > now_ms => {
                self.index().touch(key.as_bytes(), None);
                Ok(Some(s.value.to_vec()))
            }
            _ => {
                self.remove(key.as_bytes())?;
                Ok(None)
            }
        }
    }

    async fn put(&self, key: &str, meta: CacheMeta<'_>, value: &[u8]) -> Result<bool, StoreError> {
        if value.len() as u64 > self.max_bytes {
            return Ok(false);
        }
        let mut stored = Vec::with_capacity(8 + meta.key_id.len() + meta.model.len() + 4 + value.len());
        stored.extend_from_slice(&meta.expires_ms.to_be_bytes());
        put_str(&mut stored, Some(meta.key_id));
        put_str(&mut stored, Some(meta.model));
        stored.extend_from_slice(value);
        self.tree()?.insert(key, stored)?;
        self.index().touch(key.as_bytes(), Some((value.len() as u64, meta.expires_ms)));
        self.evict()?;
        Ok(true)
    }

    async fn clear(&self, filter: &CacheFilter) -> Result<usize, StoreError> {
        if *filter == CacheFilter::default() {
            let tree = self.tree()?;
            let n = tree.len();
            tree.clear()?;
            *self.index() = Index::default();
            return Ok(n);
        }
        self.remove_where(|s| s.is_none_or(|s| filter.matches(&s.key_id, &s.model)))
    }

    /// From the index (every entry's expiry is there): the tree is not read.
    async fn sweep(&self, now_ms: u64) -> Result<usize, StoreError> {
        let expired = self.index().expired(now_ms);
        for key in &expired {
            self.remove(key)?;
        }
        Ok(expired.len())
    }

    async fn bytes(&self) -> Result<u64, StoreError> {
        Ok(self.index().bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(key_id: &'static str, model: &'static str, expires_ms: u64) -> CacheMeta<'static> {
        CacheMeta { key_id, model, expires_ms }
    }

    #[tokio::test]
    async fn entries_expire_the_least_recently_used_go_at_the_bound_and_the_index_survives_a_reopen() {
        let dir = tempfile::tempdir().expect("dir");
        let slot = DbSlot::new(sled::open(dir.path()).expect("db"));
        let cache = SledCache::open(&slot, 100).expect("open");
        assert!(cache.put("a", meta("k1", "m1", 1_000), &[1; 40]).await.expect("put"));
        assert!(cache.put("b", meta("k1", "m2", 2_000), &[2; 40]).await.expect("put"));
        assert_eq!(cache.get("a", 500).await.expect("get"), Some(vec![1; 40]), "a is now the most recently used");
        assert!(cache.put("c", meta("k2", "m1", 2_000), &[3; 40]).await.expect("put"));
        // 120 bytes over a bound of 100: b, the least recently used, went.
        assert_eq!(cache.get("b", 500).await.expect("get"), None);
        assert_eq!(cache.bytes().await.expect("bytes"), 80);
        // Expired: never returned, and removed.
        assert_eq!(cache.get("a", 1_000).await.expect("get"), None);
        assert_eq!(cache.bytes().await.expect("bytes"), 40);
        // Larger than the bound: not kept.
        assert!(!cache.put("big", meta("k1", "m1", 9_000), &[0; 101]).await.expect("put"));
        // The sweep removes what expired; a reopened cache knows what is kept.
        assert!(cache.put("d", meta("k1", "m1", 3_000), &[4; 10]).await.expect("put"));
        assert_eq!(cache.sweep(2_500).await.expect("sweep"), 1, "c expired at 2,000");
        drop(cache);
        let again = SledCache::open(&slot, 100).expect("reopen");
        assert_eq!(again.bytes().await.expect("bytes"), 10);
        assert_eq!(again.get("d", 2_600).await.expect("get"), Some(vec![4; 10]));
        // Cleared by key, by model, or all.
        assert!(again.put("e", meta("k2", "m2", 9_000), &[5; 10]).await.expect("put"));
        assert!(again.put("f", meta("k2", "m1", 9_000), &[6; 10]).await.expect("put"));
        let by = |k: Option<&str>, m: Option<&str>| CacheFilter { key_id: k.map(str::to_string), model: m.map(str::to_string) };
        assert_eq!(again.clear(&by(Some("k2"), Some("m1"))).await.expect("clear"), 1);
        assert_eq!(again.get("f", 2_600).await.expect("get"), None);
        assert_eq!(again.clear(&by(Some("k1"), None)).await.expect("clear"), 1, "d");
        assert_eq!(again.clear(&CacheFilter::default()).await.expect("clear"), 1, "e");
        assert_eq!((again.bytes().await.expect("bytes"), again.get("e", 2_600).await.expect("get")), (0, None));
    }
}
