//! A node of a fleet: the parts of [`super::postgres`] put together for the gateway, on a
//! runtime of their own, with the node's journal.
//!
//! Every connection to the database is made, and every background loop runs, on the fleet's
//! own runtime (one thread, `tollgate-store`), so that connections outlive any one Pingora
//! service and never run on the threads that relay requests. The request path touches the
//! database only when a lease runs out; otherwise it reads memory.
//!
//! **The journal.** Every usage record is first written to a sled tree of the node
//! (`fleet_journal`, group commit as on a single node: one entry per commit batch) and booked into the database with its
//! money by the sync loop every `store.sync_ms` (and at once when `/v1/usage` or a stop asks).
//! While the database is unreachable the journal grows and nothing is lost; once it is back
//! the journal is booked, each record exactly once (see
//! [`super::postgres::accounts::FleetAccounts::book`]). The journal's id (`node_id/` and a
//! random id kept in the data directory) names the records in the database, so a node whose
//! data directory was replaced never collides with its own older records.

use super::postgres::accounts::FleetAccounts;
use super::postgres::accounts::FleetHold;
use super::postgres::jobs::FleetJobs;
use super::postgres::keys::FleetKeys;
use super::postgres::rates::{FleetRates, FleetSlots};
use super::postgres::tasks::FleetTasks;
use super::postgres::usage::FleetRecords;
use super::postgres::usage::Journaled;
use super::postgres::{Pg, PgError};
use super::{DbSlot, JobStore, KeyStore, MoneyStore, Store, StoreError, TaskStore};
use crate::config::FleetConfig;
use crate::records::audit::AuditEntry;
use crate::records::purse::{Insufficient, Purse};
use crate::records::usage::{Grouping, ResponseOwner, Totals, UsageRecord};
use crate::store::ForwardBookings;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The journal's tree and the key of the journal's id in the `meta` tree.
pub const JOURNAL: &str = crate::store::commit::FLEET_JOURNAL;
const JOURNAL_ID: &[u8] = b"fleet_journal_id";
/// Records booked per transaction, about (whole journal entries are taken, counted by size).
const BOOK_BATCH: usize = 2000;

pub struct Fleet {
    pub pg: Pg,
    pub node: String,
    pub accounts: FleetAccounts,
    pub keys: Arc<FleetKeys>,
    pub records: FleetRecords,
    pub rates: FleetRates,
    pub slots: FleetSlots,
    pub tasks: Arc<FleetTasks>,
    pub jobs: Arc<FleetJobs>,
    pub sync: Duration,
    pub lease: Duration,
    runtime: tokio::runtime::Runtime,
    /// When a sync round last reached the database (for `/readyz`).
    reached: std::sync::Mutex<Option<Instant>>,
    /// Booking the journal is one at a time.
    booking: tokio::sync::Mutex<()>,
}

impl From<PgError> for StoreError {
    fn from(e: PgError) -> Self {
        StoreError::Shared(e.to_string())
    }
}

impl Fleet {
    /// Connect, migrate the schema and load the keys; fails when the database cannot be
    /// reached (a node does not start blind).
    pub fn connect(conf: &FleetConfig) -> Result<Arc<Fleet>, PgError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("tollgate-store")
            .enable_all()
            .build()
            .map_err(|e| PgError::Config(format!("cannot start the store's runtime: {e}")))?;
        let pg = Pg::new(&conf.postgres)?.on(runtime.handle().clone());
        // Leases and claims belong to this process, not only to the node: in an upgrade the old
        // and the new process serve side by side for a moment, and must never spend one lease
        // twice. A restarted process leaves its predecessor's leases to expire.
        let holder = format!("{}#{}", conf.node_id, std::process::id());
        let fleet = Fleet {
            accounts: FleetAccounts::new(pg.clone(), &holder, conf.lease),
            keys: Arc::new(FleetKeys::new(pg.clone(), conf.sync).with_staleness((conf.lease / 2).max(conf.sync * 3))),
            records: FleetRecords::new(pg.clone()),
            rates: FleetRates::new(pg.clone()),
            slots: FleetSlots::new(pg.clone(), &holder, conf.lease),
            tasks: Arc::new(FleetTasks::new(pg.clone(), &holder, conf.lease)),
            jobs: Arc::new(FleetJobs::new(pg.clone(), &holder, conf.lease)),
            pg,
            node: conf.node_id.clone(),
            sync: conf.sync,
            lease: conf.lease,
            runtime,
            reached: std::sync::Mutex::new(None),
            booking: tokio::sync::Mutex::new(()),
        };
        let version = fleet.block_on(fleet.pg.migrate())?;
        fleet.block_on(fleet.keys.sync())?;
        *fleet.reached_at() = Some(Instant::now());
        log::info!("store: PostgreSQL schema version {version}; node '{}'", fleet.node);
        Ok(Arc::new(fleet))
    }

    /// Run `fut` to completion on the store's runtime, from outside any runtime (start-up).
    pub fn block_on<F: std::future::Future>(&self, fut: F) -> F::Output {
        self.runtime.block_on(fut)
    }

    /// Spawn `fut` on the store's runtime.
    pub fn spawn<F: std::future::Future<Output = ()> + Send + 'static>(&self, fut: F) {
        self.runtime.spawn(fut);
    }

    fn reached_at(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.reached.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The database as `/readyz` reports it: Ok while a sync round reached it within the last
    /// three rounds (at least a second).
    pub fn readiness(&self) -> Result<(), String> {
        let bound = (self.sync * 3).max(Duration::from_secs(1));
        if self.pg.unreachable() {
            return Err("PostgreSQL unreachable (a connection failed since the last sync round)".into());
        }
        match *self.reached_at() {
            Some(at) if at.elapsed() <= bound => Ok(()),
            Some(at) => Err(format!("PostgreSQL not reached for {} s", at.elapsed().as_secs())),
            None => Err("PostgreSQL not reached yet".into()),
        }
    }

    /// The journal's id: `node_id/` and a random id created with the data directory.
    pub fn journal_id(&self, db: &DbSlot) -> Result<String, StoreError> {
        let meta = db.tree("meta")?;
        let id = match meta.get(JOURNAL_ID)? {
            Some(v) => String::from_utf8_lossy(&v).into_owned(),
            None => {
                let fresh = crate::base::secrets::random_base62(16);
                meta.insert(JOURNAL_ID, fresh.as_bytes())?;
                db.db()?.flush()?;
                fresh
            }
        };
        Ok(format!("{}/{id}", self.node))
    }

    /// Book what the journal holds when called into the database, oldest first; records numbered
    /// from `owed_from` on were settled by this process. Returns how many were booked.
    pub async fn book_journal(&self, db: &DbSlot, journal_id: &str, owed_from: u64) -> Result<usize, StoreError> {
        let _turn = self.booking.lock().await;
        let tree = db.tree(JOURNAL)?;
        let mut booked = 0;
        // What the journal holds now, not what arrives meanwhile: that waits for the next
        // round, so a round under load books full batches instead of chasing the writer with
        // small ones (a transaction's fixed cost per handful of records).
        let Some((last, _)) = tree.last()? else { return Ok(0) };
        loop {
            // The entries, then their records read in place (an entry that an earlier version
            // wrote in JSON is read whole and stored in today's form).
            let (mut keys, mut values, mut count) = (Vec::new(), Vec::new(), 0);
            for item in tree.range(..=last.clone()) {
                let (k, v) = item?;
                // About this many records (a stored record takes about 90 bytes): BOOK_BATCH
                // bounds a transaction's size, not exactly.
                count += v.len() / 64 + 1;
                keys.push(k);
                values.push(v);
                if count >= BOOK_BATCH {
                    break;
                }
            }
            if keys.is_empty() {
                return Ok(booked);
            }
            let mut batch = Vec::with_capacity(count);
            for v in &values {
                let read = match super::usage_codec::stored_forms(v) {
                    Ok(Some(forms)) => forms.into_iter().map(|f| Journaled::read(f, owed_from)).collect::<Option<Vec<_>>>(),
                    Ok(None) => super::usage_codec::decode_records(v).ok().map(|records| {
                        records.iter().map(|r| Journaled::of(i64::try_from(r.seq).unwrap_or(i64::MAX), r, r.seq >= owed_from)).collect()
                    }),
                    Err(_) => None,
                };
                match read {
                    Some(records) => batch.extend(records),
                    // Kept out of the database, and out of the way: logged once, removed.
                    None => log::error!("store: an unreadable journal entry was dropped"),
                }
            }
            let new = self.accounts.book(journal_id, &batch).await?;
            log::debug!("store: booked {new} of {} journaled record(s) as {journal_id}", batch.len());
            // Removed together (sled applies a batch atomically): a crash cannot leave part of a
            // booked round in the journal (its marks would keep it from counting twice anyway).
            let mut done = sled::Batch::default();
            keys.iter().for_each(|k| done.remove(k));
            tree.apply_batch(done)?;
            booked += batch.len();
        }
    }

    /// One sync round: book the journal, renew and give back leases, flush token counts,
    /// renew request slots.
    pub async fn round(&self, db: &DbSlot, journal_id: &str, owed_from: u64) -> Result<(), StoreError> {
        // After an upgrade's hand-over the journal is the new process's to book; this one keeps
        // renewing its leases while it finishes its requests.
        if !db.is_released() {
            self.book_journal(db, journal_id, owed_from).await?;
        }
        self.accounts.round().await?;
        self.rates.flush().await?;
        self.slots.renew().await?;
        *self.reached_at() = Some(Instant::now());
        self.pg.reached();
        Ok(())
    }

    /// Statements sent to the database since start.
    pub fn statements(&self) -> u64 {
        self.pg.statements()
    }
}

/// The answer to a request this node cannot serve while the shared database is out of reach
/// (503, retry shortly); `what` names what could not be checked.
pub fn unavailable(what: &str) -> crate::protocol::ApiError {
    let mut e = crate::protocol::ApiError::new(
        crate::protocol::ErrorKind::StoreUnavailable,
        format!("The gateway cannot reach its database to check {what}; retry shortly."),
    );
    e.retry_after = Some(5);
    e
}

/// `tollgate -t`: reach the database and read its schema version (nothing is written).
pub fn check(conf: &FleetConfig) -> Result<i32, PgError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| PgError::Config(format!("cannot start a runtime: {e}")))?;
    let pg = Pg::new(&conf.postgres)?;
    runtime.block_on(pg.version()).map_err(|e| match e {
        // Which server it tried: an operator reads the file's URL, not the pool's.
        PgError::Unavailable(why) => PgError::Unavailable(format!("{} ({why})", super::postgres::servers(&conf.postgres.url))),
        other => other,
    })
}

/// Start the node's loops on the store's runtime: the key index follows the database
/// (notifications and the change log), leases running low are refilled, and every
/// `store.sync_ms` a sync round books the journal, renews leases and flushes counters. They
/// run until the process ends; a stop books the journal itself (`MoneyStore::leave`).
pub fn start(store: &FleetStore) {
    let (fleet, money) = (&store.fleet, store.money.clone());
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let follower = fleet.clone();
    fleet.spawn(async move {
        // Kept for as long as the loop runs: dropping the sender would read as a stop.
        let _stop_tx = stop_tx;
        follower.keys.follow(stop).await;
    });
    if let Some(mut refills) = fleet.accounts.take_refills() {
        let refiller = fleet.clone();
        fleet.spawn(async move {
            while let Some(key_id) = refills.recv().await {
                if let Err(e) = refiller.accounts.refill(&key_id).await {
                    log::debug!("store: refill of {key_id} failed (its requests lease themselves): {e}");
                }
            }
        });
    }
    let every = fleet.sync;
    fleet.spawn(async move {
        loop {
            if let Err(e) = money.sync_round().await {
                log::warn!("store: sync with PostgreSQL failed, retrying in {every:?}: {e}");
            }
            tokio::time::sleep(every).await;
        }
    });
}

/// A node of a fleet as the one store interface: keys and tasks in the shared database,
/// money through [`FleetMoney`].
pub struct FleetStore {
    pub fleet: Arc<Fleet>,
    pub money: Arc<FleetMoney>,
}

impl FleetStore {
    /// The node's store: the fleet's database, and the node's journal in `db` (its sled
    /// database), bookings committed to the journal by `policy`.
    pub fn new(fleet: Arc<Fleet>, db: &DbSlot, policy: crate::config::CommitPolicy) -> Result<FleetStore, StoreError> {
        Ok(FleetStore { money: Arc::new(FleetMoney::open(fleet.clone(), db, policy)?), fleet })
    }
}

#[async_trait::async_trait]
impl super::RequestLogStore for FleetMoney {
    /// To the node's own tree first (the sync round ships it).
    fn append(&self, entry: crate::records::log::LogLine<'_>) {
        if let Err(e) = super::sled::requests::append(&self.slot, &self.writer, entry) {
            log::warn!("request log: an entry was not written: {e}");
        }
    }

    /// Every node's entries: this node's are shipped first.
    async fn query(&self, filter: &crate::records::log::Filter) -> Result<crate::records::log::Page, StoreError> {
        self.ship_log().await?;
        Ok(super::postgres::requests::query(&self.fleet.pg, filter).await?)
    }

    async fn prune_log(&self, before_ms: u64, max: usize) -> Result<usize, StoreError> {
        Ok(super::postgres::requests::prune(&self.fleet.pg, before_ms, max).await? as usize)
    }
}

impl Store for FleetStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }
    fn keys(&self) -> Arc<dyn KeyStore> {
        self.fleet.keys.clone()
    }
    fn money(&self) -> Arc<dyn MoneyStore> {
        self.money.clone()
    }
    fn tasks(&self) -> Arc<dyn TaskStore> {
        self.fleet.tasks.clone()
    }
    fn jobs(&self) -> Arc<dyn JobStore> {
        self.fleet.jobs.clone()
    }
    fn requests(&self) -> Arc<dyn super::RequestLogStore> {
        self.money.clone()
    }
    fn cache(&self, max_bytes: u64) -> Result<Arc<dyn super::CacheStore>, StoreError> {
        Ok(Arc::new(super::postgres::cache::FleetCache::new(self.fleet.pg.clone(), max_bytes)))
    }
    fn readiness(&self) -> Result<(), String> {
        self.fleet.readiness()
    }
    fn statements(&self) -> Option<u64> {
        Some(self.fleet.statements())
    }
}

/// Money on a node of a fleet: balances in the shared database, holds against this node's
/// leases, every record written first to the node's journal (group commit as on one node) and
/// booked into the database with its money by the sync round.
pub struct FleetMoney {
    fleet: Arc<Fleet>,
    slot: DbSlot,
    writer: crate::store::commit::Writer,
    journal_id: String,
    /// Journal numbers from here on were settled by this process.
    owed_from: u64,
    /// After an upgrade's hand-over the journal is the new process's: what this process still
    /// settles is booked straight into the database under this journal of its own (a random
    /// name, so its numbers never meet another journal's marks), numbered by `drained`.
    drain_journal: String,
    drained: std::sync::atomic::AtomicU64,
}

impl FleetMoney {
    pub fn open(fleet: Arc<Fleet>, db: &DbSlot, policy: crate::config::CommitPolicy) -> Result<FleetMoney, StoreError> {
        db.tree(JOURNAL)?;
        let journal_id = fleet.journal_id(db)?;
        let owed_from = db.db()?.generate_id()?;
        let writer = crate::store::commit::Writer::start(db.clone(), policy.interval, !policy.sync)
            .map_err(|e| StoreError::Corrupt(format!("cannot start the commit writer: {e}")))?;
        let drain_journal = format!("{journal_id}/drain-{}", crate::base::secrets::random_base62(12));
        Ok(FleetMoney {
            fleet,
            slot: db.clone(),
            writer,
            journal_id,
            owed_from,
            drain_journal,
            drained: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// A booking once the journal was handed over (an upgrade: this process finishes the
    /// requests it had begun while the new one serves): settled against this process's lease
    /// and booked into the database at once, each record exactly once (its own journal's mark).
    /// If the database cannot be reached then, the record is lost, and said so.
    async fn book_direct(&self, record: &UsageRecord, holds: Vec<FleetHold>) -> Result<Result<i64, (usize, Insufficient)>, StoreError> {
        let seq = self.drained.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        let record = UsageRecord { seq, ..record.clone() };
        for hold in holds {
            self.fleet.accounts.settle(hold, record.cost_nanos).await;
        }
        let booked = Journaled::of(i64::try_from(seq).unwrap_or(i64::MAX), &record, true);
        if let Err(e) = self.fleet.accounts.book(&self.drain_journal, std::slice::from_ref(&booked)).await {
            log::error!(
                "store: a usage record of key {} (cost {} nano-USD) finished after the hand-over could not be booked: {e}",
                record.key_id,
                record.cost_nanos
            );
            return Err(e.into());
        }
        Ok(Ok(0))
    }

    /// Hold `amount` in each purse in turn; the first that does not cover it answers, and
    /// what the ones before it held is given back. Returns the amount held.
    async fn hold_all(&self, purses: &[Purse], amount: i64) -> Result<Result<i64, (usize, Insufficient)>, StoreError> {
        let accounts = &self.fleet.accounts;
        let amount = amount.max(0);
        for (i, p) in purses.iter().enumerate() {
            let refused = match accounts.hold_within(&p.id, amount, p.credit, p.linked()).await {
                Ok(Ok(_)) => continue,
                Ok(Err(short)) => Ok(Err((i, short))),
                Err(e) => Err(StoreError::from(e)),
            };
            for before in &purses[..i] {
                accounts.settle(FleetHold { key_id: before.id.clone(), amount }, 0).await;
            }
            return refused;
        }
        Ok(Ok(amount))
    }

    /// Ship this node's request-log entries to the shared database, oldest first.
    async fn ship_log(&self) -> Result<(), StoreError> {
        if self.slot.is_released() {
            return Ok(());
        }
        // What is queued goes now too (a commit window at most).
        self.writer.settled().await?;
        loop {
            let slot = self.slot.clone();
            let (keys, batches) = tokio::task::spawn_blocking(move || super::sled::requests::oldest(&slot, 1000))
                .await
                .map_err(|e| StoreError::Corrupt(format!("request log task: {e}")))??;
            if keys.is_empty() {
                return Ok(());
            }
            let (_, shipped) = super::postgres::requests::ship(&self.fleet.pg, &self.journal_id, &batches).await?;
            super::sled::requests::remove(&self.slot, &keys)?;
            if shipped < 1000 {
                return Ok(());
            }
        }
    }

    async fn book_journal(&self) -> Result<usize, StoreError> {
        self.fleet.book_journal(&self.slot, &self.journal_id, self.owed_from).await
    }
}

#[async_trait::async_trait]
impl MoneyStore for FleetMoney {
    async fn open_account(&self, key_id: &str, initial: i64) -> Result<bool, StoreError> {
        Ok(self.fleet.accounts.open_account(key_id, initial).await?)
    }

    /// The database's balance, less what this node settled and has not booked yet.
    async fn balance(&self, key_id: &str) -> Result<i64, StoreError> {
        let (balance, _leased) = self.fleet.accounts.balance(key_id).await?;
        Ok(balance.saturating_sub(self.fleet.accounts.owed(key_id).await))
    }

    fn held(&self, id: &str) -> i64 {
        self.fleet.accounts.held(id)
    }

    /// Against this node's lease of each purse, or more leased from the database; a purse
    /// that does not cover it gives back what the ones before it held.
    async fn hold(&self, purses: &[Purse], amount: i64) -> Result<Result<(), (usize, Insufficient)>, StoreError> {
        Ok(self.hold_all(purses, amount).await?.map(|_| ()))
    }

    fn release(&self, purses: &[Purse], amount: i64) {
        let fleet = self.fleet.clone();
        let ids: Vec<String> = purses.iter().map(|p| p.id.clone()).collect();
        self.fleet.spawn(async move {
            for key_id in ids {
                fleet.accounts.settle(FleetHold { key_id, amount }, 0).await;
            }
        });
    }

    /// The money settled against this node's leases (a checked booking holds its cost first,
    /// so the fleet's balances decide), the record written to the journal. Answers 0: the new
    /// balance is the database's, known once the journal is booked.
    async fn book(
        &self,
        mut record: UsageRecord,
        release: i64,
        check: Option<&[Purse]>,
        wait: bool,
    ) -> Result<Result<i64, (usize, Insufficient)>, StoreError> {
        let accounts = &self.fleet.accounts;
        let held = match check {
            Some(purses) => match self.hold_all(purses, record.cost_nanos).await? {
                Ok(amount) => amount,
                Err(refused) => return Ok(Err(refused)),
            },
            None => release,
        };
        let holds = || {
            std::iter::once(&record.key_id)
                .chain(&record.charged)
                .map(|id| FleetHold { key_id: id.clone(), amount: held })
                .collect::<Vec<_>>()
        };
        if self.slot.is_released() {
            let holds = holds();
            return self.book_direct(&record, holds).await;
        }
        let seq = self.slot.db()?.generate_id()?;
        let holds = holds();
        record.seq = seq;
        let value = super::usage_codec::value(&record);
        // One journal entry per commit batch (its records, keyed by the first one's number): an
        // insert per record would be most of the writer's work.
        let waiter = self.writer.insert_grouped(
            crate::store::commit::TreeName::FleetJournal,
            b"journal".to_vec(),
            record.time_ms,
            seq.to_be_bytes().to_vec(),
            value,
            wait,
        );
        for hold in holds {
            accounts.settle(hold, record.cost_nanos).await;
        }
        if let Some(waiter) = waiter? {
            waiter.wait().await?;
        }
        Ok(Ok(0))
    }

    /// Book the journal at once: a charge or refund reaches the shared database before it is
    /// acknowledged, so a node that dies after it loses nothing of it. When the database cannot
    /// be reached, the journal keeps it for the sync round.
    async fn publish(&self) {
        if self.slot.is_released() {
            // Booked directly (see `book_direct`): nothing of this process is in the journal.
            return;
        }
        if let Err(e) = self.book_journal().await {
            log::warn!("store: a charge stays in this node's journal until the database is back: {e}");
        }
    }

    async fn top_up(&self, id: &str, delta: i64, reason: Option<&str>) -> Result<AuditEntry, StoreError> {
        Ok(self.fleet.accounts.top_up(id, delta, reason).await?)
    }

    async fn audit(&self, limit: usize, before: Option<crate::records::log::Cursor>) -> Result<Vec<AuditEntry>, StoreError> {
        Ok(self.fleet.accounts.audit(limit, before).await?)
    }

    async fn top_up_once(&self, id: &str, delta: i64, reason: &str, marks: &[(&str, i64)]) -> Result<Option<AuditEntry>, StoreError> {
        Ok(self.fleet.accounts.top_up_once(id, delta, reason, marks).await?)
    }

    async fn put_mark(&self, mark: &str, value: i64) -> Result<bool, StoreError> {
        Ok(self.fleet.accounts.put_mark(mark, value).await?)
    }

    async fn count_marks(&self, prefix: &str) -> Result<u64, StoreError> {
        Ok(self.fleet.accounts.count_marks(prefix).await?)
    }

    async fn mark(&self, mark: &str) -> Result<Option<i64>, StoreError> {
        Ok(self.fleet.accounts.mark(mark).await?)
    }

    async fn commit(&self) -> Result<(), StoreError> {
        if self.slot.is_released() {
            return Ok(());
        }
        self.writer.settled().await?;
        self.book_journal().await?;
        Ok(())
    }

    async fn checkpoint(&self) -> Result<(), StoreError> {
        self.commit().await?;
        if self.slot.is_released() {
            return Ok(());
        }
        self.writer.checkpoint()?.wait().await
    }

    async fn usage_summary(
        &self,
        key_id: &str,
        start_ms: u64,
        end_ms: u64,
        by: &Grouping,
    ) -> Result<(Totals, BTreeMap<String, Totals>), StoreError> {
        Ok(self.fleet.records.summary(key_id, start_ms, end_ms, by).await?)
    }

    async fn prune(&self, before_ms: u64) -> Result<usize, StoreError> {
        let pruned = self.fleet.records.prune(before_ms).await? as usize;
        self.fleet.accounts.prune_windows(before_ms).await?;
        Ok(pruned)
    }

    async fn response_owner(&self, id: &str) -> Result<Option<ResponseOwner>, StoreError> {
        Ok(self.fleet.records.owner(id).await?)
    }

    async fn forget_response(&self, id: &str) -> Result<(), StoreError> {
        Ok(self.fleet.records.forget_owner(id).await?)
    }

    /// The journal is the node's sled database: what was queued is committed before it goes to
    /// the new process, which books it.
    async fn hand_over(&self) -> Result<(), StoreError> {
        self.writer.settled().await
    }

    /// Bookings after a hand-over are not forwarded in a fleet: they go to the shared database
    /// directly (`book_direct`).
    fn set_handover(&self, _to: Arc<dyn ForwardBookings>) {}

    fn commit_stats(&self) -> &crate::store::commit::CommitStats {
        &self.writer.stats
    }

    async fn sync_round(&self) -> Result<(), StoreError> {
        self.fleet.round(&self.slot, &self.journal_id, self.owed_from).await?;
        self.ship_log().await
    }

    /// What the journal holds is booked and the leases are given back, so nothing waits for
    /// `lease_secs`.
    async fn leave(&self) {
        // After an upgrade's hand-over the journal is the new process's to book.
        let booked = if self.slot.is_released() { Ok(0) } else { self.book_journal().await };
        if let Err(e) = booked {
            log::error!("store: the journal could not be booked before stopping (it will be when this node starts again): {e}");
        }
        match self.fleet.accounts.release_all().await {
            Ok(back) => log::info!("store: {back} nano-USD of leases given back"),
            Err(e) => log::warn!("store: leases not given back (they expire after lease_secs): {e}"),
        }
    }
}
