//! The fleet's keys: one table every node reads, and changes (a key created, disabled,
//! re-grouped, its limits changed) that reach every node within `store.sync_ms`.
//!
//! A write ([`FleetKeys::put`]) stores the record and a row in `key_changes` in one
//! transaction and sends `NOTIFY tollgate_keys` (delivered at commit). Each node keeps the
//! whole index in memory (authentication reads only memory) and refreshes it:
//!
//! * on a notification, at once;
//! * every `sync_ms` regardless, from the change log, so changes whose notification was lost
//!   (the listening connection dropped, the node was away) still arrive. The log is read from
//!   the database time of the previous read less [`OVERLAP`], which covers transactions that
//!   committed after a later one (their rows carry their start time); reading a change twice
//!   is harmless.
//!
//! A node whose index has not been refreshed for [`FleetKeys::stale_after`] refuses to
//! authenticate ([`KeyLookup::Stale`]): it cannot know that a key was not revoked meanwhile. A
//! gateway node sets it to half of `store.lease_secs` (15 s by default), the time it also
//! keeps spending its leases without the database: while the database is down for every node
//! nothing can be revoked, and a node cut off alone stops serving within that bound.

use super::{Pg, PgError};
use crate::records::key::{AccountRecord, KeyRecord};
use arc_swap::ArcSwap;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The notification channel.
pub const CHANNEL: &str = "tollgate_keys";
/// How far back each read of the change log reaches past the previous one.
pub const OVERLAP: Duration = Duration::from_secs(5);

/// The in-memory index: key hash → record (keyed as authentication computes the hash, so a
/// lookup neither formats nor hashes text).
type Index = crate::store::KeyHashIndex;

fn index_record(index: &mut Index, record: KeyRecord) {
    crate::store::index_key(index, Arc::new(record));
}

pub use crate::records::key::KeyLookup;

pub struct FleetKeys {
    pg: Pg,
    sync_every: Duration,
    /// How old the index may get before lookups are refused.
    stale_after: Duration,
    index: ArcSwap<Index>,
    /// Shared accounts by name.
    accounts: ArcSwap<HashMap<String, Arc<AccountRecord>, ahash::RandomState>>,
    /// When the index was last known current (local monotonic clock), and the database time
    /// of that read.
    synced: std::sync::Mutex<Option<(Instant, f64)>>,
}

impl FleetKeys {
    pub fn new(pg: Pg, sync_every: Duration) -> Self {
        let stale_after = (sync_every * 3).max(Duration::from_secs(5));
        FleetKeys {
            pg,
            sync_every,
            stale_after,
            index: ArcSwap::from_pointee(Index::default()),
            accounts: ArcSwap::from_pointee(HashMap::default()),
            synced: std::sync::Mutex::new(None),
        }
    }

    /// Refuse lookups once the index is older than `bound` (instead of 3 × `sync_ms`, at least
    /// 5 s).
    pub fn with_staleness(mut self, bound: Duration) -> Self {
        self.stale_after = bound;
        self
    }

    /// The staleness bound.
    pub fn stale_after(&self) -> Duration {
        self.stale_after
    }

    fn synced(&self) -> std::sync::MutexGuard<'_, Option<(Instant, f64)>> {
        self.synced.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Store `record` (new or changed) for every node, and tell them.
    pub async fn put(&self, record: &KeyRecord) -> Result<(), PgError> {
        let text = serde_json::to_string(record).map_err(|e| PgError::Query(format!("key record: {e}")))?;
        let mut client = self.pg.client().await?;
        let tx = client.transaction().await?;
        tx.execute(
            "INSERT INTO keys (id, key_hash, record) VALUES ($1, $2, $3)
             ON CONFLICT (id) DO UPDATE SET key_hash = EXCLUDED.key_hash, record = EXCLUDED.record, updated_at = now()",
            &[&record.id, &record.key_hash, &text],
        )
        .await?;
        tx.execute("INSERT INTO key_changes (key_id) VALUES ($1)", &[&record.id]).await?;
        tx.execute(&format!("NOTIFY {CHANNEL}"), &[]).await?;
        tx.commit().await?;
        self.pg.count(3);
        Ok(())
    }

    /// Store an account for every node, and tell them (its change is `acct:<name>`).
    pub async fn put_account(&self, account: &AccountRecord) -> Result<(), PgError> {
        let text = serde_json::to_string(account).map_err(|e| PgError::Query(format!("account record: {e}")))?;
        let mut client = self.pg.client().await?;
        let tx = client.transaction().await?;
        tx.execute(
            "INSERT INTO key_accounts (name, record) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET record = EXCLUDED.record",
            &[&account.name, &text],
        )
        .await?;
        tx.execute("INSERT INTO key_changes (key_id) VALUES ($1)", &[&crate::policy::budget::account_purse(&account.name)]).await?;
        tx.execute(&format!("NOTIFY {CHANNEL}"), &[]).await?;
        tx.commit().await?;
        self.pg.count(3);
        Ok(())
    }

    /// Every account, as the database has it now.
    pub async fn all_accounts(&self) -> Result<Vec<AccountRecord>, PgError> {
        let client = self.pg.client().await?;
        let rows = client.query("SELECT record FROM key_accounts ORDER BY name", &[]).await?;
        self.pg.count(1);
        rows.iter()
            .map(|row| {
                let text: String = row.get(0);
                serde_json::from_str(&text).map_err(|e| PgError::Query(format!("account record: {e}")))
            })
            .collect()
    }

    /// Every key record, as the database has it now.
    pub async fn all(&self) -> Result<Vec<KeyRecord>, PgError> {
        let client = self.pg.client().await?;
        let rows = client.query("SELECT record FROM keys ORDER BY id", &[]).await?;
        self.pg.count(1);
        rows.iter()
            .map(|row| {
                let text: String = row.get(0);
                serde_json::from_str(&text).map_err(|e| PgError::Query(format!("key record: {e}")))
            })
            .collect()
    }

    /// Refresh the index: everything the first time, then the keys the change log names since
    /// the previous read (less [`OVERLAP`]).
    pub async fn sync(&self) -> Result<usize, PgError> {
        let started = Instant::now();
        let since = self.synced().map(|(_, db_time)| db_time - OVERLAP.as_secs_f64());
        let client = self.pg.client().await?;
        let now: f64 = client.query_one("SELECT extract(epoch FROM now())::float8", &[]).await?.get(0);
        let rows = match since {
            None => client.query("SELECT record FROM keys", &[]).await?,
            Some(since) => {
                client
                    .query(
                        "SELECT record FROM keys WHERE id IN
                           (SELECT key_id FROM key_changes WHERE at >= to_timestamp($1))",
                        &[&since],
                    )
                    .await?
            }
        };
        let accounts = match since {
            None => client.query("SELECT record FROM key_accounts", &[]).await?,
            Some(since) => {
                client
                    .query(
                        "SELECT record FROM key_accounts WHERE 'acct:' || name IN
                           (SELECT key_id FROM key_changes WHERE at >= to_timestamp($1))",
                        &[&since],
                    )
                    .await?
            }
        };
        self.pg.count(3);
        if since.is_none() || !accounts.is_empty() {
            let mut map: HashMap<String, Arc<AccountRecord>, ahash::RandomState> =
                if since.is_none() { HashMap::default() } else { (**self.accounts.load()).clone() };
            for row in &accounts {
                let text: String = row.get(0);
                match serde_json::from_str::<AccountRecord>(&text) {
                    Ok(a) => {
                        map.insert(a.name.clone(), Arc::new(a));
                    }
                    Err(e) => log::error!("store: an unreadable account record was skipped: {e}"),
                }
            }
            self.accounts.store(Arc::new(map));
        }
        let mut changed = Vec::with_capacity(rows.len());
        for row in &rows {
            let text: String = row.get(0);
            match serde_json::from_str::<KeyRecord>(&text) {
                Ok(record) => changed.push(record),
                Err(e) => log::error!("store: an unreadable key record was skipped: {e}"),
            }
        }
        let n = changed.len();
        if since.is_none() {
            let mut index = Index::default();
            changed.into_iter().for_each(|r| index_record(&mut index, r));
            self.index.store(Arc::new(index));
        } else if n > 0 {
            let mut index: Index = (**self.index.load()).clone();
            for record in changed {
                // A re-keyed record (rotation) drops its old hash.
                index.retain(|_, r| r.id != record.id);
                index_record(&mut index, record);
            }
            self.index.store(Arc::new(index));
        }
        *self.synced() = Some((started, now));
        Ok(n)
    }

    /// The key with this secret's hash (hex), from memory; `Stale` when the index is too old.
    pub fn lookup(&self, key_hash: &str) -> KeyLookup {
        match crate::base::codec::parse_key_hash(key_hash) {
            Some(hash) => self.find(&hash),
            None if self.is_fresh() => KeyLookup::Unknown,
            None => KeyLookup::Stale,
        }
    }

    fn is_fresh(&self) -> bool {
        self.synced().is_some_and(|(at, _)| at.elapsed() <= self.stale_after())
    }

    /// The key with this secret's hash, from memory; `Stale` when the index is too old.
    pub fn find(&self, hash: &[u8; 32]) -> KeyLookup {
        if !self.is_fresh() {
            return KeyLookup::Stale;
        }
        match self.index.load().get(hash) {
            Some(record) => KeyLookup::Found(record.clone()),
            None => KeyLookup::Unknown,
        }
    }

    /// Keep the index current until `stop` is set: listen for notifications (reconnecting
    /// when the listening connection drops) and read the change log every `sync_ms`.
    pub async fn follow(&self, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut listener: Option<(tokio_postgres::Client, tokio::sync::mpsc::UnboundedReceiver<tokio_postgres::Notification>)> = None;
        loop {
            if listener.is_none() {
                match self.pg.listen(CHANNEL).await {
                    Ok(l) => listener = Some(l),
                    Err(e) => log::warn!("store: cannot listen for key changes (polling every {:?}): {e}", self.sync_every),
                }
            }
            if let Err(e) = self.sync().await {
                log::warn!("store: key sync failed: {e}");
            }
            let notified = async {
                match listener.as_mut() {
                    Some((_, rx)) => rx.recv().await.is_some(),
                    None => std::future::pending().await,
                }
            };
            let lost = tokio::select! {
                _ = stop.changed() => return,
                got = notified => !got,
                _ = tokio::time::sleep(self.sync_every) => false,
            };
            if lost {
                // The listening connection ended: reconnect next round.
                listener = None;
            }
        }
    }
}

/// The fleet's side of the one store interface.
#[async_trait::async_trait]
impl crate::store::KeyStore for FleetKeys {
    async fn all(&self) -> Result<Vec<KeyRecord>, crate::store::StoreError> {
        Ok(FleetKeys::all(self).await?)
    }

    /// Each record with its change-log row, then this node's index re-read (the other nodes
    /// follow within `store.sync_ms`).
    async fn put(&self, records: &[KeyRecord]) -> Result<(), crate::store::StoreError> {
        for record in records {
            FleetKeys::put(self, record).await?;
        }
        self.sync().await?;
        Ok(())
    }

    fn lookup(&self, hash: &[u8; 32]) -> KeyLookup {
        self.find(hash)
    }

    async fn accounts(&self) -> Result<Vec<AccountRecord>, crate::store::StoreError> {
        Ok(self.all_accounts().await?)
    }

    async fn put_account(&self, account: &AccountRecord) -> Result<(), crate::store::StoreError> {
        FleetKeys::put_account(self, account).await?;
        self.sync().await?;
        Ok(())
    }

    fn account(&self, name: &str) -> Option<Arc<AccountRecord>> {
        self.accounts.load().get(name).cloned()
    }
}
