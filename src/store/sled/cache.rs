//! The response cache on one node (issue 70, not yet wired): tree `response_cache`, each entry
//! its key → the unix millisecond it expires (8 bytes, big-endian) and the value (opaque here:
//! `cache::entry`'s stored form). At most `max_bytes` of values are kept: the least recently
//! used go first (an index in memory, rebuilt from the tree when it is opened); an expired
//! entry is never returned, and is removed when read or swept.

use crate::store::{DbSlot, StoreError};
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

pub const TREE: &str = "response_cache";

/// What the index knows of an entry.
struct Slot {
    /// When it was last used (a tick of the index's clock).
    used: u64,
    bytes: u64,
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
    fn touch(&mut self, key: &[u8], bytes: Option<u64>) {
        self.tick += 1;
        let tick = self.tick;
        match self.entries.get_mut(key) {
            Some(slot) => {
                self.order.remove(&slot.used);
                slot.used = tick;
                if let Some(b) = bytes {
                    self.bytes = self.bytes - slot.bytes + b;
                    slot.bytes = b;
                }
            }
            None => {
                let b = bytes.unwrap_or(0);
                self.entries.insert(key.to_vec(), Slot { used: tick, bytes: b });
                self.bytes += b;
            }
        }
        self.order.insert(tick, key.to_vec());
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
    tree: sled::Tree,
    max_bytes: u64,
    index: Mutex<Index>,
}

impl SledCache {
    /// The cache of `slot`'s database, at most `max_bytes` of values.
    pub fn open(slot: &DbSlot, max_bytes: u64) -> Result<SledCache, StoreError> {
        let tree = slot.tree(TREE)?;
        let mut index = Index::default();
        for item in tree.iter() {
            let (k, v) = item?;
            index.touch(&k, Some(v.len().saturating_sub(8) as u64));
        }
        let cache = SledCache { tree, max_bytes, index: Mutex::new(index) };
        cache.evict()?;
        Ok(cache)
    }

    fn index(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The value kept for `key`, unless it expired by `now_ms` (then it is removed).
    pub fn get(&self, key: &[u8], now_ms: u64) -> Result<Option<Vec<u8>>, StoreError> {
        let Some(stored) = self.tree.get(key)? else { return Ok(None) };
        let expires = stored.get(..8).and_then(|b| b.try_into().ok()).map(u64::from_be_bytes);
        if expires.is_none_or(|e| e <= now_ms) {
            self.remove(key)?;
            return Ok(None);
        }
        self.index().touch(key, None);
        Ok(Some(stored[8..].to_vec()))
    }

    /// Keep `value` for `key` until `expires_ms`; the least recently used entries go while more
    /// than the bound is held (a value larger than the bound is not kept).
    pub fn put(&self, key: &[u8], value: &[u8], expires_ms: u64) -> Result<bool, StoreError> {
        if value.len() as u64 > self.max_bytes {
            return Ok(false);
        }
        let mut stored = Vec::with_capacity(8 + value.len());
        stored.extend_from_slice(&expires_ms.to_be_bytes());
        stored.extend_from_slice(value);
        self.tree.insert(key, stored)?;
        self.index().touch(key, Some(value.len() as u64));
        self.evict()?;
        Ok(true)
    }

    pub fn remove(&self, key: &[u8]) -> Result<(), StoreError> {
        self.tree.remove(key)?;
        self.index().forget(key);
        Ok(())
    }

    /// Remove every entry expired by `now_ms`; how many.
    pub fn sweep(&self, now_ms: u64) -> Result<usize, StoreError> {
        let mut gone = 0;
        for item in self.tree.iter() {
            let (k, v) = item?;
            let expires = v.get(..8).and_then(|b| b.try_into().ok()).map(u64::from_be_bytes);
            if expires.is_none_or(|e| e <= now_ms) {
                self.remove(&k)?;
                gone += 1;
            }
        }
        Ok(gone)
    }

    /// Remove everything; how many entries were kept.
    pub fn clear(&self) -> Result<usize, StoreError> {
        let n = self.tree.len();
        self.tree.clear()?;
        *self.index() = Index::default();
        Ok(n)
    }

    /// The bytes of values kept.
    pub fn bytes(&self) -> u64 {
        self.index().bytes
    }

    fn evict(&self) -> Result<(), StoreError> {
        loop {
            let Some(oldest) = self.index().over(self.max_bytes) else { return Ok(()) };
            self.remove(&oldest)?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_expire_the_least_recently_used_go_at_the_bound_and_the_index_survives_a_reopen() {
        let dir = tempfile::tempdir().expect("dir");
        let slot = DbSlot::new(sled::open(dir.path()).expect("db"));
        let cache = SledCache::open(&slot, 100).expect("open");
        assert!(cache.put(b"a", &[1; 40], 1_000).expect("put"));
        assert!(cache.put(b"b", &[2; 40], 2_000).expect("put"));
        assert_eq!(cache.get(b"a", 500).expect("get"), Some(vec![1; 40]), "a is now the most recently used");
        assert!(cache.put(b"c", &[3; 40], 2_000).expect("put"));
        // 120 bytes over a bound of 100: b, the least recently used, went.
        assert_eq!(cache.get(b"b", 500).expect("get"), None);
        assert_eq!(cache.bytes(), 80);
        // Expired: never returned, and removed.
        assert_eq!(cache.get(b"a", 1_000).expect("get"), None);
        assert_eq!(cache.bytes(), 40);
        // Larger than the bound: not kept.
        assert!(!cache.put(b"big", &[0; 101], 9_000).expect("put"));
        // The sweep removes what expired; a reopened cache knows what is kept.
        assert!(cache.put(b"d", &[4; 10], 3_000).expect("put"));
        assert_eq!(cache.sweep(2_500).expect("sweep"), 1, "c expired at 2,000");
        drop(cache);
        let again = SledCache::open(&slot, 100).expect("reopen");
        assert_eq!(again.bytes(), 10);
        assert_eq!(again.get(b"d", 2_600).expect("get"), Some(vec![4; 10]));
        assert_eq!(again.clear().expect("clear"), 1);
        assert_eq!((again.bytes(), again.get(b"d", 2_600).expect("get")), (0, None));
    }
}
