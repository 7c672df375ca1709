//! The store: everything tollgate persists, behind one interface ([`Store`]) with two
//! backends, each in its own folder.
//!
//! * [`sled`]: the embedded default for one node. Everything lives in one sled database in
//!   `data_dir` (one file lock, opened once, trees by concern).
//! * [`postgres`] with [`fleet`]: a node of a fleet (`store.postgres`). Keys, money, usage
//!   records, response owners and video tasks live in the PostgreSQL database every node
//!   shares; only the node's journal (records on their way there) stays in sled.
//! * [`objects`]: S3-compatible object storage (video results, uploaded inputs, files), when
//!   `storage.s3` is configured.
//! * [`usage_codec`]: the stored form of a usage record (binary; older JSON entries read alike),
//!   the same in both backends.
//!
//! The interface has four parts, one per concern, each a trait defined here:
//!
//! * [`KeyStore`]: key records, and the in-memory index authentication reads.
//! * [`MoneyStore`]: accounts and balances, holds (leases in a fleet), bookings with their
//!   usage records, usage queries, retention, and stored-response owners.
//! * [`TaskStore`]: video tasks, the poller's claims on them, and idempotency keys.
//! * [`JobStore`]: other long-lived work (batches), claimed by one node at a time.
//!
//! The rules that are the same whatever the backend (pricing, what a hold covers, which key
//! file entries change which records, the video task's life) stay with their modules
//! (`ledger`, `auth`, `video`), which are built on `Arc<dyn …Store>`. [`copy`] moves data
//! between the two backends.
//!
//! `keys`: key id → [`KeyRecord`] (JSON). Secrets are never stored, only their SHA-256.
//! Balances live in the money store, not in the key record.

pub mod commit;
pub mod copy;
pub mod db;
pub mod fleet;
pub mod objects;
pub mod postgres;
pub mod sled;
pub mod snapshot;
pub mod usage_codec;

use crate::records::audit::AuditEntry;
use crate::records::key::{AccountRecord, KeyLookup, KeyRecord};
use crate::records::purse::{Insufficient, Purse};
use crate::records::task::Task;
use crate::records::usage::{Grouping, ResponseOwner, Totals, UsageRecord};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Everything persisted, through one handle: the gateway opens one (by the configuration:
/// [`sled::SledStore`] or [`fleet::FleetStore`]) and builds its key index, ledger and video
/// store on its parts.
pub trait Store: Send + Sync {
    /// `sled` or `postgres`.
    fn backend(&self) -> &'static str;
    fn keys(&self) -> Arc<dyn KeyStore>;
    fn money(&self) -> Arc<dyn MoneyStore>;
    fn tasks(&self) -> Arc<dyn TaskStore>;
    fn jobs(&self) -> Arc<dyn JobStore>;
    fn requests(&self) -> Arc<dyn RequestLogStore>;
    /// The response cache, keeping at most `max_bytes` of answers (on one node in sled, in a
    /// fleet in the shared database, so every node serves what one kept).
    fn cache(&self, max_bytes: u64) -> Result<Arc<dyn CacheStore>, StoreError>;
    /// Whether the shared database is reachable (`/readyz`); always Ok for one node.
    fn readiness(&self) -> Result<(), String> {
        Ok(())
    }
    /// Statements sent to a shared database since start (None for one node).
    fn statements(&self) -> Option<u64> {
        None
    }
}

/// Key records. Authentication reads only the in-memory index ([`KeyStore::lookup`]).
#[async_trait::async_trait]
pub trait KeyStore: Send + Sync {
    /// Every key record.
    async fn all(&self) -> Result<Vec<KeyRecord>, StoreError>;
    /// Store new or changed records durably and bring the index up to date: they are in force
    /// on this node when this returns (on the other nodes of a fleet within `store.sync_ms`).
    /// With no records, only the index is refreshed.
    async fn put(&self, records: &[KeyRecord]) -> Result<(), StoreError>;
    /// The record whose secret hashes (SHA-256) to `hash`.
    fn lookup(&self, hash: &[u8; 32]) -> KeyLookup;
    /// Every shared account (its balance is in the money store).
    async fn accounts(&self) -> Result<Vec<AccountRecord>, StoreError>;
    /// Store a new or changed account; in force here when this returns (as for keys).
    async fn put_account(&self, account: &AccountRecord) -> Result<(), StoreError>;
    /// The account named `name`, from memory.
    fn account(&self, name: &str) -> Option<Arc<AccountRecord>>;
}

pub use db::{DbSlot, Durable, StoreError};

/// Accounts, holds, bookings, usage records and response owners. Amounts are nano-USD.
#[async_trait::async_trait]
pub trait MoneyStore: Send + Sync {
    /// Give a new key its opening balance; an existing balance is kept. True if created.
    async fn open_account(&self, key_id: &str, initial: i64) -> Result<bool, StoreError>;
    /// The durable balance of a key or any other purse (holds not subtracted).
    async fn balance(&self, key_id: &str) -> Result<i64, StoreError>;
    /// What is held in flight against a purse here (on this node).
    fn held(&self, id: &str) -> i64;
    /// Reserve `amount` (≥ 0) in every purse if what each has available
    /// (`balance + credit − held`) covers it, else in none: Err names the first purse (its
    /// index) that does not.
    async fn hold(&self, purses: &[Purse], amount: i64) -> Result<Result<(), (usize, Insufficient)>, StoreError>;
    /// Give back a hold that ends without a booking (a request that failed before it cost).
    fn release(&self, purses: &[Purse], amount: i64);
    /// Debit `record.cost_nanos` (a credit when negative) from the key's balance and from each
    /// purse the record was `charged`, release `release` of their holds and store the record;
    /// with `check` (the same purses, key first among them, with their credits), only when each
    /// covers the cost, decided atomically with the debit; with `wait`, return once the record
    /// is durable. Returns the key's new balance where it is known here (a fleet node answers 0).
    async fn book(
        &self,
        record: UsageRecord,
        release: i64,
        check: Option<&[Purse]>,
        wait: bool,
    ) -> Result<Result<i64, (usize, Insufficient)>, StoreError>;
    /// After a booking that must not wait for the next sync (a charge, a refund): pass it on
    /// to where every node sees it, if the backend has such a place.
    async fn publish(&self) {}
    /// Balance change by an administrator, without a usage record, and its audit entry
    /// (written with it; returned). Durable before this returns.
    async fn top_up(&self, id: &str, delta: i64, reason: Option<&str>) -> Result<AuditEntry, StoreError>;
    /// [`MoneyStore::top_up`] made once for `marks` whatever the nodes, restarts or retries:
    /// the change, its audit entry and every mark (each with its value) are written together,
    /// durable before this returns. None (and nothing changed) when any of the marks was
    /// written before.
    async fn top_up_once(&self, id: &str, delta: i64, reason: &str, marks: &[(&str, i64)]) -> Result<Option<AuditEntry>, StoreError>;
    /// The value written with `mark` by [`MoneyStore::top_up_once`] or
    /// [`MoneyStore::put_mark`], if it was.
    async fn mark(&self, mark: &str) -> Result<Option<i64>, StoreError>;
    /// Write `mark` alone (no money moves), durable before this returns; false when it was
    /// written before (its value is kept).
    async fn put_mark(&self, mark: &str, value: i64) -> Result<bool, StoreError>;
    /// How many marks begin with `prefix`.
    async fn count_marks(&self, prefix: &str) -> Result<u64, StoreError>;
    /// Audit entries before the position `before` (all when None), newest first, at most
    /// `limit`, each with its number.
    async fn audit(&self, limit: usize, before: Option<crate::records::log::Cursor>) -> Result<Vec<AuditEntry>, StoreError>;
    /// Return once every booking made before this call is durable (and, in a fleet, booked
    /// into the shared database).
    async fn commit(&self) -> Result<(), StoreError>;
    /// A clean stop or a hand-over: everything committed, and the commit journal emptied into
    /// the database's own files, so the next start has nothing to apply again.
    async fn checkpoint(&self) -> Result<(), StoreError>;
    /// Totals and rows (per model, or per value of a tag) of a key's records with
    /// `start_ms <= time_ms < end_ms`.
    async fn usage_summary(
        &self,
        key_id: &str,
        start_ms: u64,
        end_ms: u64,
        by: &Grouping,
    ) -> Result<(Totals, BTreeMap<String, Totals>), StoreError>;
    /// Delete records (and response owners) older than `before_ms`; how many records.
    async fn prune(&self, before_ms: u64) -> Result<usize, StoreError>;
    /// Who created the stored response `id`, as far as records already stored say.
    async fn response_owner(&self, id: &str) -> Result<Option<ResponseOwner>, StoreError>;
    /// The response `id` was deleted upstream: forget its owner.
    async fn forget_response(&self, id: &str) -> Result<(), StoreError>;
    /// Before the local database is released to a new process (upgrade): from now on
    /// bookings go to `set_handover`'s target; returns once everything before is on disk.
    async fn hand_over(&self) -> Result<(), StoreError>;
    /// Where bookings go once the local database was handed over.
    fn set_handover(&self, to: Arc<dyn crate::store::ForwardBookings>);
    /// The local group-commit writer's counters.
    fn commit_stats(&self) -> &crate::store::commit::CommitStats;
    /// One sync round with the shared database (nothing on one node).
    async fn sync_round(&self) -> Result<(), StoreError> {
        Ok(())
    }
    /// A graceful stop: book what is pending and give back what is leased (nothing on one node).
    async fn leave(&self) {}
}

/// The request log (see `request_log`): entries queued as requests end, written with the
/// commit writer's batches; in a fleet shipped to the shared database by the sync round.
#[async_trait::async_trait]
pub trait RequestLogStore: Send + Sync {
    /// Queue an entry; never waits (a failure is logged: the log never fails a request).
    fn append(&self, entry: crate::records::log::LogLine<'_>);
    /// Matching entries, newest first, and where the next page starts.
    async fn query(&self, filter: &crate::records::log::Filter) -> Result<crate::records::log::Page, StoreError>;
    /// Delete entries older than `before_ms`, then the oldest beyond `max`. How many.
    async fn prune_log(&self, before_ms: u64, max: usize) -> Result<usize, StoreError>;
}

/// What the response cache keeps beside an answer's bytes: the key that made it and its model
/// (what `DELETE /admin/cache` picks by), and when it stops being served (unix ms).
#[derive(Debug, Clone, Copy)]
pub struct CacheMeta<'a> {
    pub key_id: &'a str,
    pub model: &'a str,
    pub expires_ms: u64,
}

/// Which answers `DELETE /admin/cache` removes: all, or those of a key, of a model, or both.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheFilter {
    pub key_id: Option<String>,
    pub model: Option<String>,
}

impl CacheFilter {
    pub fn matches(&self, key_id: &str, model: &str) -> bool {
        self.key_id.as_deref().is_none_or(|k| k == key_id) && self.model.as_deref().is_none_or(|m| m == model)
    }
}

/// The response cache's answers, by cache key (the cache module's `key`), each opaque here
/// (its `entry`'s stored form). Bounded by bytes: the least recently used go first;
/// an expired answer is never returned.
#[async_trait::async_trait]
pub trait CacheStore: Send + Sync {
    /// The answer kept for `key`, unless it expired by `now_ms`.
    async fn get(&self, key: &str, now_ms: u64) -> Result<Option<Vec<u8>>, StoreError>;
    /// Keep `value` for `key` (replacing what was), then evict down to the bound. False when
    /// it is larger than the whole bound (not kept).
    async fn put(&self, key: &str, meta: CacheMeta<'_>, value: &[u8]) -> Result<bool, StoreError>;
    /// Remove what `filter` picks; how many.
    async fn clear(&self, filter: &CacheFilter) -> Result<usize, StoreError>;
    /// Remove what expired by `now_ms`; how many.
    async fn sweep(&self, now_ms: u64) -> Result<usize, StoreError>;
    /// Bytes of answers kept.
    async fn bytes(&self) -> Result<u64, StoreError>;
}

/// Video tasks, the poller's work lists and idempotency keys.
/// One row of long-lived work other than video tasks (a batch): its state as JSON text, the
/// key it belongs to, when it was created and whether it is still to be worked on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRow {
    /// What kind of work (`batch`): each kind its own list.
    pub kind: &'static str,
    pub id: String,
    pub owner: String,
    /// Unix seconds; a key's list is in this order.
    pub created_at: u64,
    pub open: bool,
    pub record: String,
}

/// Long-lived jobs (batches): kept as JSON text, each of one key, worked on by one node at a
/// time. On one node in sled (`store::sled::jobs`); in a fleet in the shared database
/// (`store::postgres::jobs`), where a node works on a job only while it holds its claim, a
/// dead node's open jobs are claimed by another once its claims lapse, and every write is
/// fenced by the claim (a refused write is [`StoreError::Shared`]).
#[async_trait::async_trait]
pub trait JobStore: Send + Sync {
    /// Several nodes share these jobs.
    fn shared(&self) -> bool;
    /// A job's state, whoever's it is (callers check the owner).
    async fn get(&self, id: &str) -> Result<Option<String>, StoreError>;
    /// Write a job (durable before this returns); a new one is this node's to work on.
    async fn put(&self, row: &JobRow) -> Result<(), StoreError>;
    /// The open jobs of `kind` this node is to work on now (in a fleet: those it holds, and
    /// those whose claim lapsed, claimed now).
    async fn open(&self, kind: &'static str) -> Result<Vec<String>, StoreError>;
    /// A key's jobs of `kind`, newest first, after the job `after` in that order, at most `limit`.
    async fn of_owner(&self, kind: &'static str, owner: &str, after: Option<&str>, limit: usize) -> Result<Vec<String>, StoreError>;
    /// Forget at most `max` closed jobs of `kind` created before `created_before` (unix s):
    /// how many were forgotten. Open jobs are kept whatever their age.
    async fn prune_closed(&self, kind: &'static str, created_before: u64, max: usize) -> Result<usize, StoreError>;
}

#[async_trait::async_trait]
pub trait TaskStore: Send + Sync {
    /// Whether tasks are shared with other nodes.
    fn shared(&self) -> bool;
    async fn get(&self, id: &str) -> Result<Option<Task>, StoreError>;
    /// Write the task (durable before this returns).
    async fn put(&self, task: &Task) -> Result<(), StoreError>;
    /// Drop an open-list entry whose task is finished or gone (after a crash between writes).
    fn drop_open(&self, id: &str) -> Result<(), StoreError>;
    /// Drop a copy-list entry whose task needs no copy or is gone.
    fn drop_copy(&self, id: &str) -> Result<(), StoreError>;
    /// Remove a task that never became visible (lost an idempotency race).
    async fn discard(&self, id: &str) -> Result<(), StoreError>;
    /// Ids of unfinished tasks this node polls (in a fleet: those it holds the claim of,
    /// claiming the ones whose claim lapsed — a dead node's).
    async fn open_ids(&self) -> Result<Vec<String>, StoreError>;
    /// Unfinished tasks, for metrics (in a fleet: those this node holds; nothing is claimed).
    async fn open_tasks(&self) -> Result<Vec<Task>, StoreError>;
    /// The `limit` most recently updated tasks, whatever their status, newest first (the
    /// console; in a fleet: of every node).
    async fn recent(&self, limit: usize) -> Result<Vec<Task>, StoreError>;
    /// The tasks of `owner`, newest first (or oldest first), after the task `after` in that
    /// order, at most `limit` (`GET /v1/videos`).
    async fn of_owner(&self, owner: &str, after: Option<&str>, limit: usize, newest_first: bool) -> Result<Vec<Task>, StoreError>;
    /// Delete a finished task (`DELETE /v1/videos/{id}`): it is gone for its owner too.
    async fn delete(&self, task: &Task) -> Result<(), StoreError>;
    /// Ids of completed tasks whose copy to object storage is still to be done.
    async fn copy_pending_ids(&self) -> Result<Vec<String>, StoreError>;
    /// The task an Idempotency-Key of `owner` already names (within the window), if any.
    async fn idempotent_task(&self, owner: &str, key: &str, now: u64) -> Result<Option<String>, StoreError>;
    /// Claim `key` for `task_id`. Returns the task id that holds it: ours, or an earlier one.
    async fn claim_idempotency(&self, owner: &str, key: &str, task_id: &str, now: u64) -> Result<String, StoreError>;
    /// Where task writes go once the local database was handed over (upgrade).
    fn set_handover(&self, _to: Arc<dyn crate::store::ForwardTasks>) {}
}

/// The index authentication reads: a secret's SHA-256 → its key's record.
pub type KeyHashIndex = std::collections::HashMap<[u8; 32], Arc<KeyRecord>, ahash::RandomState>;

/// Index `record` by its secret's hash, and a rotated key by its previous one too
/// (authentication checks the grace period); a hash that does not read is logged and left out.
pub fn index_key(index: &mut KeyHashIndex, record: Arc<KeyRecord>) {
    let previous = record.rotated.as_ref().map(|r| r.previous_hash.as_str());
    for hash in std::iter::once(record.key_hash.as_str()).chain(previous) {
        match crate::base::codec::parse_key_hash(hash) {
            Some(h) => {
                index.insert(h, record.clone());
            }
            None => log::warn!("key {} has an unreadable hash; ignored", record.id),
        }
    }
}

/// Writes a task in the process that has the database now (after an upgrade hand-over);
/// returns once it is durable there. Implemented by `handover`.
#[async_trait::async_trait]
pub trait ForwardTasks: Send + Sync {
    async fn forward_task(&self, task: &Task) -> Result<(), StoreError>;
}

/// Books a record in the process that has the database now (after an upgrade hand-over);
/// returns once it is durable there. Implemented by `handover`.
#[async_trait::async_trait]
pub trait ForwardBookings: Send + Sync {
    async fn forward_booking(&self, record: &UsageRecord) -> Result<(), StoreError>;
}
