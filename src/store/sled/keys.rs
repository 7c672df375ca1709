//! Keys on one node: tree `keys` (key id → [`KeyRecord`] as JSON) and a lock-free index of
//! key hash → record, replaced whole after every change; tree `key_accounts` (name →
//! [`AccountRecord`]) and its index by name likewise.

use crate::records::key::{AccountRecord, KeyLookup, KeyRecord};
use crate::store::{DbSlot, Durable, KeyStore, StoreError};
use arc_swap::ArcSwap;
use std::collections::HashMap;
use std::sync::Arc;

pub struct SledKeys {
    slot: DbSlot,
    /// Writes are made durable through the store's one-flush-at-a-time group commit.
    durable: Durable,
    by_hash: ArcSwap<crate::store::KeyHashIndex>,
    accounts: ArcSwap<HashMap<String, Arc<AccountRecord>, ahash::RandomState>>,
}

const ACCOUNTS: &str = "key_accounts";

impl SledKeys {
    /// The keys of `slot`, index loaded.
    pub fn new(slot: &DbSlot) -> Result<SledKeys, StoreError> {
        slot.tree("keys")?;
        slot.tree(ACCOUNTS)?;
        let keys = SledKeys {
            slot: slot.clone(),
            durable: Durable::new(slot),
            by_hash: ArcSwap::from_pointee(HashMap::default()),
            accounts: ArcSwap::from_pointee(HashMap::default()),
        };
        keys.reload()?;
        keys.reload_accounts()?;
        Ok(keys)
    }

    /// Every key record, read from the tree.
    pub fn read_all(&self) -> Result<Vec<KeyRecord>, StoreError> {
        let mut out = Vec::new();
        for item in self.slot.tree("keys")?.iter() {
            let (id, value) = item?;
            let rec: KeyRecord =
                serde_json::from_slice(&value).map_err(|e| StoreError::Corrupt(format!("key {}: {e}", String::from_utf8_lossy(&id))))?;
            out.push(rec);
        }
        Ok(out)
    }

    /// Write a record (not yet durable, index not reloaded).
    pub fn write(&self, rec: &KeyRecord) -> Result<(), StoreError> {
        let value = serde_json::to_vec(rec).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        self.slot.tree("keys")?.insert(rec.id.as_bytes(), value)?;
        Ok(())
    }

    /// Every account, read from the tree.
    fn read_accounts(&self) -> Result<Vec<AccountRecord>, StoreError> {
        let mut out = Vec::new();
        for item in self.slot.tree(ACCOUNTS)?.iter() {
            let (name, value) = item?;
            let rec: AccountRecord = serde_json::from_slice(&value)
                .map_err(|e| StoreError::Corrupt(format!("account {}: {e}", String::from_utf8_lossy(&name))))?;
            out.push(rec);
        }
        Ok(out)
    }

    fn reload_accounts(&self) -> Result<(), StoreError> {
        let map = self.read_accounts()?.into_iter().map(|a| (a.name.clone(), Arc::new(a))).collect();
        self.accounts.store(Arc::new(map));
        Ok(())
    }

    /// Re-read every record into the index.
    fn reload(&self) -> Result<(), StoreError> {
        let mut map = crate::store::KeyHashIndex::default();
        for rec in self.read_all()? {
            crate::store::index_key(&mut map, Arc::new(rec));
        }
        self.by_hash.store(Arc::new(map));
        Ok(())
    }
}

#[async_trait::async_trait]
impl KeyStore for SledKeys {
    async fn all(&self) -> Result<Vec<KeyRecord>, StoreError> {
        self.read_all()
    }

    async fn put(&self, records: &[KeyRecord]) -> Result<(), StoreError> {
        for rec in records {
            self.write(rec)?;
        }
        if !records.is_empty() {
            self.durable.flush().await?;
        }
        self.reload()
    }

    fn lookup(&self, hash: &[u8; 32]) -> KeyLookup {
        match self.by_hash.load().get(hash) {
            Some(rec) => KeyLookup::Found(rec.clone()),
            None => KeyLookup::Unknown,
        }
    }

    async fn accounts(&self) -> Result<Vec<AccountRecord>, StoreError> {
        self.read_accounts()
    }

    async fn put_account(&self, account: &AccountRecord) -> Result<(), StoreError> {
        let value = serde_json::to_vec(account).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        self.slot.tree(ACCOUNTS)?.insert(account.name.as_bytes(), value)?;
        self.durable.flush().await?;
        self.reload_accounts()
    }

    fn account(&self, name: &str) -> Option<Arc<AccountRecord>> {
        self.accounts.load().get(name).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::key::KeyOrigin;
    use crate::store::sled::SledDb;

    #[tokio::test]
    async fn keys_round_trip_across_reopen_and_are_found_by_hash() {
        let dir = tempfile::tempdir().expect("tempdir");
        let hash = crate::access::auth::hash_key("sk-round-trip");
        let rec = KeyRecord {
            rpm: Some(60),
            created_at: 1,
            ..KeyRecord::new("key_1", "demo", "default", crate::access::auth::hex(&hash), KeyOrigin::Admin)
        };
        {
            let db = SledDb::open(dir.path()).expect("open");
            let keys = SledKeys::new(db.db()).expect("keys");
            assert_eq!(keys.lookup(&hash), KeyLookup::Unknown);
            keys.put(std::slice::from_ref(&rec)).await.expect("put");
            assert_eq!(keys.lookup(&hash), KeyLookup::Found(Arc::new(rec.clone())), "in force when put returns");
        }
        let db = SledDb::open_waiting(dir.path(), std::time::Duration::from_secs(20)).expect("reopen");
        let keys = SledKeys::new(db.db()).expect("keys");
        assert_eq!(keys.all().await.expect("read"), vec![rec.clone()]);
        assert_eq!(keys.lookup(&hash), KeyLookup::Found(Arc::new(rec)), "the index is loaded on open");
    }
}
