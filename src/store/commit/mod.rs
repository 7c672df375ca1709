//! Group commit: the one writer of the ledger's database entries.
//!
//! A booking changes the in-memory balance at once (under the ledger's lock, which is where
//! every admission decision is made) and queues its usage record here; the response never
//! waits for the disk. The writer, a thread of its own, takes everything queued within one
//! commit window (`billing.commit_interval_ms`, counted from the first write of a batch),
//! makes it durable with a single sync and inserts it in queue order. A kill -9 therefore
//! loses at most the writes of the window being gathered plus the one being synced.
//!
//! A write can carry a waiter, answered once the write is on disk: `billing.sync_commit: true`
//! makes every booking wait (a record is durable before its response ends), and writes that
//! must never be lost on acknowledgement (top-ups, bookings handed over by an old process,
//! video charges) always wait. A barrier waits for everything queued before it, which is how a
//! graceful stop and an upgrade hand-over lose nothing.
//!
//! A batch is made durable by appending it to the data directory's journal and `fdatasync`ing
//! that file on this thread, before it is inserted into sled; sled itself is flushed once per
//! checkpoint, about a second apart (see [`journal`] for why, and for the recovery after a
//! crash). A database opened without a journal (tests, tools) is flushed for every batch.
//!
//! Only plain inserts and sled's `flush` are used (no sled batch or transaction: see `ledger`).

pub mod journal;

use crate::store::db::{DbSlot, StoreError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Longest span of `at_ms` one group entry covers.
pub const GROUP_SPAN_MS: u64 = 1000;

/// A group entry being gathered.
struct GroupEntry {
    tree: TreeName,
    group: Vec<u8>,
    key: Vec<u8>,
    first_at: u64,
    value: Vec<u8>,
}

/// The sled tree a write goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TreeName {
    UsageRecords,
    Balances,
    ResponseOwners,
    /// A fleet node's records on their way to the shared database (`store::fleet`).
    FleetJournal,
    /// Balance moves by an administrator (`ledger::AuditEntry`), by time.
    Audit,
    /// The request log (`request_log`), by time.
    RequestLog,
    /// Marks of what was done once (a plan's grant): name → value.
    Marks,
}

impl TreeName {
    const ALL: [TreeName; 7] = [
        TreeName::UsageRecords,
        TreeName::Balances,
        TreeName::ResponseOwners,
        TreeName::FleetJournal,
        TreeName::Audit,
        TreeName::RequestLog,
        TreeName::Marks,
    ];

    /// The tree's number in the journal (never reused: a journal outlives the process).
    fn id(self) -> u8 {
        match self {
            TreeName::UsageRecords => 1,
            TreeName::Balances => 2,
            TreeName::ResponseOwners => 3,
            TreeName::FleetJournal => 4,
            TreeName::Audit => 5,
            TreeName::RequestLog => 6,
            TreeName::Marks => 7,
        }
    }

    fn from_id(id: u8) -> Option<TreeName> {
        TreeName::ALL.into_iter().find(|t| t.id() == id)
    }

    fn as_str(self) -> &'static str {
        match self {
            TreeName::UsageRecords => "usage_records",
            TreeName::Balances => "balances",
            TreeName::ResponseOwners => RESPONSE_OWNERS,
            TreeName::FleetJournal => FLEET_JOURNAL,
            TreeName::Audit => AUDIT,
            TreeName::RequestLog => REQUEST_LOG,
            TreeName::Marks => MARKS,
        }
    }
}

/// The tree of marks of what was done once (`MoneyStore::top_up_once`).
pub const MARKS: &str = "marks";

/// The tree of a fleet node's journal (usage records on their way to the shared database).
pub const FLEET_JOURNAL: &str = "fleet_journal";
/// The tree of the request log (a fleet node's outbox).
pub const REQUEST_LOG: &str = "request_log";

/// The tree of audit entries: unix ms and a sequence number (big-endian) → JSON.
pub const AUDIT: &str = "audit";

/// The tree of stored-response owners (see `ledger::ResponseOwner`).
pub const RESPONSE_OWNERS: &str = "response_owners";

type Ack = oneshot::Sender<Result<(), StoreError>>;

enum Job {
    Insert {
        tree: TreeName,
        key: Vec<u8>,
        value: Vec<u8>,
        ack: Option<Ack>,
    },
    /// One value of a group: the group's values of one batch are stored as one entry,
    /// `[v1,v2,…]`, under the key of its first value (see [`Writer::insert_grouped`]).
    Grouped {
        tree: TreeName,
        group: Vec<u8>,
        at_ms: u64,
        key: Vec<u8>,
        value: Vec<u8>,
        ack: Option<Ack>,
    },
    /// Several inserts into one tree, queued at once (a booking's purse entries).
    Inserts {
        tree: TreeName,
        entries: Vec<(Vec<u8>, Vec<u8>)>,
    },
    /// Inserts into several trees that go into the same batch, never split (an audited top-up
    /// and its mark).
    Together {
        entries: Vec<(TreeName, Vec<u8>, Vec<u8>)>,
        ack: Option<Ack>,
    },
    /// Answered once everything queued before it is on disk.
    Barrier(Ack),
    /// A barrier that also checkpoints: answered once everything queued before it is in the
    /// database's own files and the journal is empty (a clean stop, a hand-over).
    Checkpoint(Ack),
}

/// Counters of the writer, for `/metrics` and the tests.
#[derive(Default)]
pub struct CommitStats {
    /// Writes queued so far.
    pub queued: AtomicU64,
    /// Writes on disk so far.
    pub committed: AtomicU64,
    /// Batches made durable (a journal sync, or a sled flush without a journal).
    pub flushes: AtomicU64,
    /// Writes that could not be stored (logged at ERROR).
    pub failed: AtomicU64,
}

/// The jobs waiting for the writer.
#[derive(Default)]
struct Queue {
    jobs: Vec<Job>,
    /// A job somebody waits for is queued: commit without waiting for the window to end.
    urgent: bool,
    /// No more jobs will come (the handle is being dropped).
    closed: bool,
    /// The writer waits on the condition variable: only then does a new job need to wake it
    /// (a notify is a system call even when nobody waits; with `sync_commit` every booking
    /// would make one while the writer is busy flushing).
    sleeping: bool,
    /// Jobs somebody waits for, queued.
    waiting: usize,
    /// The writer gathers waited-for jobs (see [`GATHER`]): only this many of them wake it.
    gathering: Option<usize>,
}

struct Shared {
    queue: std::sync::Mutex<Queue>,
    wake: std::sync::Condvar,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The writer sleeps while `more` holds, until `deadline` or the queue is closed.
    fn sleep_while<'a>(
        &self,
        mut q: std::sync::MutexGuard<'a, Queue>,
        deadline: Instant,
        more: impl Fn(&Queue) -> bool,
    ) -> std::sync::MutexGuard<'a, Queue> {
        while more(&q) && !q.closed {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            q.sleeping = true;
            q = self.wake.wait_timeout(q, left).unwrap_or_else(|p| p.into_inner()).0;
            q.sleeping = false;
        }
        q
    }
}

/// Handle to the writer thread. Dropping it ends the thread after it committed what was
/// queued.
pub struct Writer {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
    pub stats: Arc<CommitStats>,
    /// The writer thread's id, once it has set its priority.
    #[cfg(test)]
    tid: i32,
}

impl Writer {
    /// Start the writer for `db`, committing at most `window` after the first write of a batch.
    /// A `background` writer (nobody's response waits for it) runs at a lower CPU priority, so
    /// its batches never preempt the threads relaying requests.
    pub fn start(db: DbSlot, window: Duration, background: bool) -> std::io::Result<Writer> {
        Writer::start_gathering(db, window, background, GATHER)
    }

    fn start_gathering(db: DbSlot, window: Duration, background: bool, gather: Gather) -> std::io::Result<Writer> {
        let shared = Arc::new(Shared { queue: std::sync::Mutex::new(Queue::default()), wake: std::sync::Condvar::new() });
        let stats = Arc::new(CommitStats::default());
        let (thread_shared, thread_stats) = (shared.clone(), stats.clone());
        let journal = db.take_journal();
        #[cfg(test)]
        let (tid_tx, tid_rx) = std::sync::mpsc::sync_channel(1);
        let thread = std::thread::Builder::new().name("tollgate-commit".into()).spawn(move || {
            if background {
                lower_priority("commit writer");
            }
            // SAFETY: gettid has no preconditions and cannot fail.
            #[cfg(test)]
            #[allow(unsafe_code)]
            let _ = tid_tx.send(unsafe { libc::gettid() });
            run(db, journal, window, gather, &thread_shared, &thread_stats)
        })?;
        Ok(Writer {
            shared,
            thread: Some(thread),
            stats,
            #[cfg(test)]
            tid: tid_rx.recv().unwrap_or(0),
        })
    }

    /// Queue a job. The writer is woken only when the queue was empty or the job is urgent:
    /// writes that join a gathering batch cost no wake-up.
    fn send(&self, job: Job) -> Result<(), StoreError> {
        let urgent = !matches!(
            job,
            Job::Insert { ack: None, .. } | Job::Grouped { ack: None, .. } | Job::Inserts { .. } | Job::Together { ack: None, .. }
        );
        let wake = {
            let mut q = self.shared.lock();
            if q.closed {
                return Err(StoreError::Corrupt("the commit writer has stopped".into()));
            }
            let was_empty = q.jobs.is_empty();
            q.jobs.push(job);
            q.urgent |= urgent;
            q.waiting += usize::from(urgent);
            q.sleeping
                && match q.gathering {
                    Some(max) => q.waiting >= max,
                    None => was_empty || urgent,
                }
        };
        if wake {
            self.shared.wake.notify_one();
        }
        Ok(())
    }

    /// Queue an insert; with `wait`, the returned waiter answers once it is on disk.
    /// Writes are applied in the order they are queued.
    pub fn insert(&self, tree: TreeName, key: Vec<u8>, value: Vec<u8>, wait: bool) -> Result<Option<Waiter>, StoreError> {
        let (ack, waiter) = ack_pair(wait);
        self.stats.queued.fetch_add(1, Ordering::SeqCst);
        self.send(Job::Insert { tree, key, value, ack })?;
        Ok(waiter)
    }

    /// Queue several inserts into one tree as one job (nobody waits for them alone).
    pub fn insert_all(&self, tree: TreeName, entries: Vec<(Vec<u8>, Vec<u8>)>) -> Result<(), StoreError> {
        if entries.is_empty() {
            return Ok(());
        }
        self.stats.queued.fetch_add(entries.len() as u64, Ordering::SeqCst);
        self.send(Job::Inserts { tree, entries })
    }

    /// Queue inserts into several trees that land in the same batch (so in the database and
    /// after a crash, all or none); with `wait`, the returned waiter answers once they are on
    /// disk.
    pub fn insert_together(&self, entries: Vec<(TreeName, Vec<u8>, Vec<u8>)>, wait: bool) -> Result<Option<Waiter>, StoreError> {
        let (ack, waiter) = ack_pair(wait);
        self.stats.queued.fetch_add(entries.len() as u64, Ordering::SeqCst);
        self.send(Job::Together { entries, ack })?;
        Ok(waiter)
    }

    /// Queue a value that is stored together with the other values of its `group` queued in
    /// the same batch: one sled entry, keyed by the first value's `key`, holding `[v1,v2,…]`
    /// in queue order (a JSON array when the values are JSON; binary values frame themselves):
    /// one insert instead of one per value, and the inserts are most of the writer's cost. A
    /// group entry spans at most [`GROUP_SPAN_MS`] of `at_ms`, so a reader looking for times
    /// from `t` starts at `t - GROUP_SPAN_MS`.
    pub fn insert_grouped(
        &self,
        tree: TreeName,
        group: Vec<u8>,
        at_ms: u64,
        key: Vec<u8>,
        value: Vec<u8>,
        wait: bool,
    ) -> Result<Option<Waiter>, StoreError> {
        let (ack, waiter) = ack_pair(wait);
        self.stats.queued.fetch_add(1, Ordering::SeqCst);
        self.send(Job::Grouped { tree, group, at_ms, key, value, ack })?;
        Ok(waiter)
    }

    /// Everything queued before this call is in the database's files, and the journal empty,
    /// when the returned waiter answers: the next start has nothing to apply again.
    pub fn checkpoint(&self) -> Result<Waiter, StoreError> {
        let (tx, rx) = oneshot::channel();
        self.send(Job::Checkpoint(tx))?;
        Ok(Waiter(rx))
    }

    /// Everything queued before this call is on disk when the returned waiter answers.
    pub fn barrier(&self) -> Result<Waiter, StoreError> {
        let (tx, rx) = oneshot::channel();
        self.send(Job::Barrier(tx))?;
        Ok(Waiter(rx))
    }

    /// Return once everything queued before this call is on disk; no flush when nothing is
    /// outstanding (every write queued so far is committed or failed).
    pub async fn settled(&self) -> Result<(), StoreError> {
        let queued = self.stats.queued.load(Ordering::SeqCst);
        if self.stats.committed.load(Ordering::SeqCst) + self.stats.failed.load(Ordering::SeqCst) >= queued {
            return Ok(());
        }
        self.barrier()?.wait().await
    }
}

impl Drop for Writer {
    /// Commits what is queued, then ends the thread.
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The acknowledgement sender and its waiter, when somebody waits.
fn ack_pair(wait: bool) -> (Option<Ack>, Option<Waiter>) {
    if !wait {
        return (None, None);
    }
    let (tx, rx) = oneshot::channel();
    (Some(tx), Some(Waiter(rx)))
}

/// Answers once a write (or everything before a barrier) is durable.
pub struct Waiter(oneshot::Receiver<Result<(), StoreError>>);

impl Waiter {
    pub async fn wait(self) -> Result<(), StoreError> {
        self.0.await.map_err(|_| StoreError::Corrupt("the commit writer stopped before answering".into()))?
    }

    /// Blocking form, for code outside the runtime.
    pub fn wait_blocking(self) -> Result<(), StoreError> {
        self.0.blocking_recv().map_err(|_| StoreError::Corrupt("the commit writer stopped before answering".into()))?
    }
}

/// How much lower a background writer's priority is than the process's (nice steps).
const BACKGROUND_NICE_STEPS: i32 = 10;

/// Lower the calling thread's CPU priority by [`BACKGROUND_NICE_STEPS`] (on Linux, nice is per
/// thread). Failure only costs latency, so it is logged, not returned. Also the span exporter's
/// (`telemetry::export`): both are batch work the requests should never wait behind.
pub(crate) fn lower_priority(thread: &str) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: getpriority/setpriority with PRIO_PROCESS and who = 0 read and change only
        // the calling thread's nice value; no memory of ours is involved.
        #[allow(unsafe_code)]
        let rc = unsafe {
            let current = libc::getpriority(libc::PRIO_PROCESS, 0);
            libc::setpriority(libc::PRIO_PROCESS, 0, (current + BACKGROUND_NICE_STEPS).min(19))
        };
        if rc != 0 {
            log::info!("{thread}: could not lower its priority: {}", std::io::Error::last_os_error());
        }
    }
}

/// How a batch of waited-for writes is gathered.
#[derive(Clone, Copy)]
struct Gather {
    /// Longest wait for more waited-for writes after the first.
    wait: Duration,
    /// Waited-for writes that end the wait at once.
    max: usize,
}

/// With `billing.sync_commit`, every batch costs a sync and the wake-ups of the writer and of
/// the requests' threads; committing as soon as one request waits made batches of a few
/// requests and those costs took a third of the CPU at 64 concurrent requests. So once the
/// previous batch had several waiters (requests overlap), the writer, woken by a waited-for
/// write, waits up to 500 µs for more of them (or until 48 are queued). With one request at a
/// time nobody else could join, and its write is committed at once.
const GATHER: Gather = Gather { wait: Duration::from_micros(500), max: 48 };

fn run(db: DbSlot, mut journal: Option<journal::Journal>, window: Duration, gather: Gather, shared: &Shared, stats: &CommitStats) {
    let mut last_waiting = 0;
    loop {
        let batch = {
            let mut q = shared.lock();
            while q.jobs.is_empty() && !q.closed {
                q.sleeping = true;
                // While the journal holds writes, an idle writer wakes for its checkpoint.
                match journal.as_ref().filter(|j| !j.is_empty()) {
                    Some(_) => {
                        let (guard, timeout) = shared.wake.wait_timeout(q, journal::CHECKPOINT_EVERY).unwrap_or_else(|p| p.into_inner());
                        q = guard;
                        if timeout.timed_out() && q.jobs.is_empty() {
                            q.sleeping = false;
                            drop(q);
                            checkpoint(&db, &mut journal);
                            q = shared.lock();
                        }
                    }
                    None => q = shared.wake.wait(q).unwrap_or_else(|p| p.into_inner()),
                }
                q.sleeping = false;
            }
            if q.jobs.is_empty() {
                drop(q);
                // Closed, nothing left: a clean stop leaves nothing to apply again.
                checkpoint(&db, &mut journal);
                return;
            }
            // The first write of a batch opens the window; writes that nobody waits for join
            // it until it ends. An urgent job (a waiter, a barrier) or closing ends it at once.
            q = shared.sleep_while(q, Instant::now() + window, |q| !q.urgent);
            if q.urgent && last_waiting >= 2 {
                q.gathering = Some(gather.max);
                q = shared.sleep_while(q, Instant::now() + gather.wait, |q| q.waiting < gather.max);
                q.gathering = None;
            }
            last_waiting = q.waiting;
            q.waiting = 0;
            q.urgent = false;
            std::mem::take(&mut q.jobs)
        };
        commit(&db, &mut journal, batch, stats);
    }
}

/// Flush sled and empty the journal, when it holds anything and the database is still ours.
/// A failure is logged; the journal then keeps its records (applying them again is harmless).
fn checkpoint(db: &DbSlot, journal: &mut Option<journal::Journal>) {
    let Some(j) = journal.as_mut().filter(|j| !j.is_empty()) else { return };
    let Ok(sled) = db.db() else { return };
    if let Err(e) = flush_and_clear(&sled, j) {
        log::error!("ledger: checkpoint of the commit journal failed (it is kept and applied again at the next start): {e}");
    }
}

/// A checkpoint: flush sled, then start the journal over (everything in it is in sled's files).
fn flush_and_clear(sled: &sled::Db, j: &mut journal::Journal) -> Result<(), StoreError> {
    sled.flush()?;
    j.clear()?;
    Ok(())
}

/// Where each (tree, key) was first inserted in a batch, by a hash of the pair: the key is
/// compared against the queued entry itself, so remembering it costs no copy.
#[derive(Default)]
struct Firsts {
    hasher: ahash::RandomState,
    at: std::collections::HashMap<u64, usize, BuildIdentity>,
}

/// The map's keys are already hashes.
#[derive(Default, Clone, Copy)]
struct BuildIdentity;

struct Identity(u64);

impl std::hash::Hasher for Identity {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

impl std::hash::BuildHasher for BuildIdentity {
    type Hasher = Identity;
    fn build_hasher(&self) -> Identity {
        Identity(0)
    }
}

/// Queue an insert of a batch, or give an entry inserted earlier in the batch its new value.
fn replace_or_push(inserts: &mut Vec<(TreeName, Vec<u8>, Vec<u8>)>, first: &mut Firsts, tree: TreeName, key: Vec<u8>, value: Vec<u8>) {
    let hash = first.hasher.hash_one((tree, key.as_slice()));
    match first.at.entry(hash) {
        std::collections::hash_map::Entry::Occupied(at) => match inserts.get_mut(*at.get()) {
            Some(entry) if entry.0 == tree && entry.1 == key => entry.2 = value,
            // Two keys with one hash (never seen in practice): the later one is written as it
            // came, after the other; order is kept, only the saving is lost.
            _ => inserts.push((tree, key, value)),
        },
        std::collections::hash_map::Entry::Vacant(slot) => {
            slot.insert(inserts.len());
            inserts.push((tree, key, value));
        }
    }
}

/// Insert a batch in order (grouped values as one entry per group), flush once, then answer
/// its waiters.
fn commit(db: &DbSlot, journal: &mut Option<journal::Journal>, batch: Vec<Job>, stats: &CommitStats) {
    let mut acks = Vec::new();
    let mut writes = 0u64;
    let mut inserts: Vec<(TreeName, Vec<u8>, Vec<u8>)> = Vec::with_capacity(4);
    // Where each (tree, key) was first inserted in this batch: a later value for it replaces
    // that one in place (one sled insert per entry and batch; a purse's balance is rewritten
    // by every booking). It is written at its first position, so an entry never lands after
    // a write that was queued after its first value.
    let mut first = Firsts::default();
    let mut groups: Vec<GroupEntry> = Vec::new();
    let mut checkpoint_after = false;
    for job in batch {
        match job {
            Job::Insert { tree, key, value, ack } => {
                acks.extend(ack);
                writes += 1;
                replace_or_push(&mut inserts, &mut first, tree, key, value);
            }
            Job::Inserts { tree, entries } => {
                writes += entries.len() as u64;
                for (key, value) in entries {
                    replace_or_push(&mut inserts, &mut first, tree, key, value);
                }
            }
            Job::Together { entries, ack } => {
                acks.extend(ack);
                writes += entries.len() as u64;
                for (tree, key, value) in entries {
                    replace_or_push(&mut inserts, &mut first, tree, key, value);
                }
            }
            Job::Grouped { tree, group, at_ms, key, value, ack } => {
                acks.extend(ack);
                writes += 1;
                match groups.iter_mut().rev().find(|g| g.tree == tree && g.group == group) {
                    Some(g) if at_ms.saturating_sub(g.first_at) <= GROUP_SPAN_MS => {
                        g.value.push(b',');
                        g.value.extend_from_slice(&value);
                    }
                    _ => {
                        let mut v = Vec::with_capacity(value.len() * 8 + 2);
                        v.push(b'[');
                        v.extend_from_slice(&value);
                        groups.push(GroupEntry { tree, group, key, first_at: at_ms, value: v });
                    }
                }
            }
            Job::Barrier(ack) => acks.push(ack),
            Job::Checkpoint(ack) => {
                acks.push(ack);
                checkpoint_after = true;
            }
        }
    }
    for mut g in groups {
        g.value.push(b']');
        inserts.push((g.tree, g.key, g.value));
    }
    let mut result = durable(db, journal, &inserts);
    if checkpoint_after && result.is_ok() {
        if let (Some(j), Ok(sled)) = (journal.as_mut(), db.db()) {
            result = flush_and_clear(&sled, j);
        }
    }
    stats.flushes.fetch_add(1, Ordering::Relaxed);
    match &result {
        Ok(()) => {
            stats.committed.fetch_add(writes, Ordering::SeqCst);
        }
        Err(e) => {
            stats.failed.fetch_add(writes, Ordering::SeqCst);
            log::error!("ledger: committing {writes} write(s) failed: {e}");
        }
    }
    for ack in acks {
        let _ = ack.send(result.clone());
    }
}

/// Make a batch's inserts durable and apply them to sled: through the journal when there is
/// one (sled is flushed at checkpoints), else with a sled flush.
fn durable(db: &DbSlot, journal: &mut Option<journal::Journal>, inserts: &[(TreeName, Vec<u8>, Vec<u8>)]) -> Result<(), StoreError> {
    // Held until the batch is in: the database stays open (and its file lock held) meanwhile, so
    // a process it was handed over to cannot be reading the journal.
    let sled = db.db()?;
    let Some(j) = journal.as_mut() else {
        apply(&sled, inserts)?;
        sled.flush()?;
        return Ok(());
    };
    if let Err(e) = j.append(inserts) {
        // The batch goes to sled and sled is flushed; the journal, now behind sled, must not be
        // applied again later: it is emptied, or given up if even that fails.
        log::error!("ledger: {e}; this batch is flushed into the database directly");
        apply(&sled, inserts)?;
        sled.flush()?;
        if let Err(e) = j.clear() {
            log::error!("ledger: {e}; the commit journal is no longer used, and must be deleted before the next start");
            *journal = None;
        }
        return Ok(());
    }
    apply(&sled, inserts)?;
    if j.due() {
        // The batch is durable in the journal already: a failed checkpoint is retried later.
        if let Err(e) = flush_and_clear(&sled, j) {
            log::error!("ledger: checkpoint of the commit journal failed (retried with the next batch): {e}");
        }
    }
    Ok(())
}

/// Insert in order, each tree opened once.
fn apply(sled: &sled::Db, inserts: &[(TreeName, Vec<u8>, Vec<u8>)]) -> Result<(), StoreError> {
    let mut trees = Vec::with_capacity(2);
    for (tree, key, value) in inserts {
        tree_of(sled, &mut trees, *tree)?.insert(key.as_slice(), value.as_slice())?;
    }
    Ok(())
}

/// The tree `name` of `db`, opened once per batch (or replay) and kept in `trees`.
fn tree_of<'a>(db: &sled::Db, trees: &'a mut Vec<(TreeName, sled::Tree)>, name: TreeName) -> Result<&'a sled::Tree, sled::Error> {
    let at = match trees.iter().position(|(n, _)| *n == name) {
        Some(at) => at,
        None => {
            trees.push((name, db.open_tree(name.as_str())?));
            trees.len() - 1
        }
    };
    Ok(&trees[at].1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db() -> (tempfile::TempDir, DbSlot) {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("sled");
        (dir, DbSlot::new(db))
    }

    /// A thread's nice value, from /proc (the field after the parenthesised name, 17th).
    fn nice_of(tid: i32) -> i32 {
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).expect("stat");
        let after_name = &stat[stat.rfind(')').expect("name") + 1..];
        after_name.split_whitespace().nth(16).and_then(|n| n.parse().ok()).expect("nice")
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_background_writer_runs_below_the_process_priority_and_a_waited_for_one_does_not() {
        let (_dir, slot) = db();
        // SAFETY: gettid has no preconditions and cannot fail.
        #[allow(unsafe_code)]
        let own = nice_of(unsafe { libc::gettid() });
        let background = Writer::start(slot.clone(), Duration::from_millis(10), true).expect("writer");
        let waited_for = Writer::start(slot, Duration::from_millis(10), false).expect("writer");
        assert_eq!(nice_of(background.tid), (own + BACKGROUND_NICE_STEPS).min(19));
        assert_eq!(nice_of(waited_for.tid), own);
    }

    #[test]
    fn a_key_written_twice_in_a_batch_is_inserted_once_at_its_first_place_with_its_last_value() {
        let (mut inserts, mut first) = (Vec::new(), Firsts::default());
        let put = |inserts: &mut Vec<_>, first: &mut Firsts, tree, key: &[u8], value: &[u8]| {
            replace_or_push(inserts, first, tree, key.to_vec(), value.to_vec())
        };
        put(&mut inserts, &mut first, TreeName::Balances, b"a", b"1");
        put(&mut inserts, &mut first, TreeName::Balances, b"b", b"1");
        put(&mut inserts, &mut first, TreeName::Balances, b"a", b"2");
        // Same key, another tree: another entry.
        put(&mut inserts, &mut first, TreeName::Audit, b"a", b"9");
        put(&mut inserts, &mut first, TreeName::Balances, b"a", b"3");
        let got: Vec<(TreeName, &[u8], &[u8])> = inserts.iter().map(|(t, k, v)| (*t, k.as_slice(), v.as_slice())).collect();
        assert_eq!(got, vec![(TreeName::Balances, &b"a"[..], &b"3"[..]), (TreeName::Balances, b"b", b"1"), (TreeName::Audit, b"a", b"9")]);
    }

    #[test]
    fn writes_are_committed_in_order_within_the_window_and_barriers_wait_for_them() {
        let (_dir, slot) = db();
        // A long window: only the barrier can close the batch early.
        let writer = Writer::start(slot.clone(), Duration::from_secs(3600), false).expect("writer");
        for i in 0..100u32 {
            let waiter = writer.insert(TreeName::UsageRecords, i.to_be_bytes().to_vec(), vec![1], false).expect("queue");
            assert!(waiter.is_none());
        }
        // The same key twice: the later write wins (queue order).
        writer.insert(TreeName::Balances, b"k".to_vec(), b"first".to_vec(), false).expect("queue");
        writer.insert(TreeName::Balances, b"k".to_vec(), b"second".to_vec(), false).expect("queue");
        writer.barrier().expect("barrier").wait_blocking().expect("committed");
        assert_eq!(writer.stats.committed.load(Ordering::Relaxed), 102);
        assert_eq!(slot.tree("usage_records").expect("tree").len(), 100);
        assert_eq!(slot.tree("balances").expect("tree").get(b"k").expect("get").as_deref(), Some(&b"second"[..]));
    }

    #[test]
    fn grouped_values_of_a_batch_become_one_entry_per_group_and_span() {
        let (_dir, slot) = db();
        let writer = Writer::start(slot.clone(), Duration::from_secs(3600), false).expect("writer");
        let put = |group: &str, at: u64, n: u32| {
            writer
                .insert_grouped(
                    TreeName::UsageRecords,
                    group.into(),
                    at,
                    format!("{group}-{at}-{n}").into_bytes(),
                    n.to_string().into_bytes(),
                    false,
                )
                .expect("queue");
        };
        put("a", 10, 1);
        put("b", 11, 2);
        put("a", 12, 3);
        put("a", 10 + GROUP_SPAN_MS + 1, 4); // beyond the span: a new entry
        writer.barrier().expect("barrier").wait_blocking().expect("committed");
        let tree = slot.tree("usage_records").expect("tree");
        let entries: Vec<(String, String)> = tree
            .iter()
            .map(|kv| kv.map(|(k, v)| (String::from_utf8_lossy(&k).into_owned(), String::from_utf8_lossy(&v).into_owned())).expect("entry"))
            .collect();
        assert_eq!(entries, vec![("a-10-1".into(), "[1,3]".into()), ("a-1011-4".into(), "[4]".into()), ("b-11-2".into(), "[2]".into())]);
        assert_eq!(writer.stats.committed.load(Ordering::Relaxed), 4, "four writes, three entries");
    }

    #[test]
    fn a_write_without_a_waiter_is_committed_once_the_window_ends() {
        let (_dir, slot) = db();
        let writer = Writer::start(slot.clone(), Duration::from_millis(20), false).expect("writer");
        writer.insert(TreeName::UsageRecords, b"a".to_vec(), b"1".to_vec(), false).expect("queue");
        // Nobody waits and no barrier comes: the window alone must commit it.
        let deadline = Instant::now() + Duration::from_secs(30);
        while writer.stats.committed.load(Ordering::Relaxed) < 1 {
            assert!(Instant::now() < deadline, "the window never closed");
            std::thread::yield_now();
        }
        assert!(slot.tree("usage_records").expect("tree").contains_key(b"a").expect("get"));
    }

    #[test]
    fn a_waited_write_is_answered_after_its_flush_and_failures_reach_the_waiter() {
        let (_dir, slot) = db();
        let writer = Writer::start(slot.clone(), Duration::from_secs(3600), false).expect("writer");
        let waiter = writer.insert(TreeName::UsageRecords, b"a".to_vec(), b"1".to_vec(), true).expect("queue").expect("waiter");
        waiter.wait_blocking().expect("durable");
        assert_eq!(writer.stats.flushes.load(Ordering::Relaxed), 1);
        slot.release();
        let waiter = writer.insert(TreeName::UsageRecords, b"b".to_vec(), b"1".to_vec(), true).expect("queue").expect("waiter");
        assert!(waiter.wait_blocking().is_err(), "a released database cannot take writes");
        assert_eq!(writer.stats.failed.load(Ordering::Relaxed), 1);
    }

    /// Answers of waiters, each once its write is durable (or failed).
    fn answered(waiters: Vec<Waiter>) -> std::sync::mpsc::Receiver<Result<(), StoreError>> {
        let (tx, rx) = std::sync::mpsc::channel();
        for w in waiters {
            let tx = tx.clone();
            std::thread::spawn(move || tx.send(w.wait_blocking()));
        }
        rx
    }

    #[test]
    fn a_waited_write_is_gathered_with_others_only_once_requests_overlap() {
        let (_dir, slot) = db();
        // A gathering wait far longer than the test: only a full batch can end it.
        let gather = Gather { wait: Duration::from_secs(3600), max: 3 };
        let writer = Writer::start_gathering(slot.clone(), Duration::from_secs(3600), false, gather).expect("writer");
        let flushes = || writer.stats.flushes.load(Ordering::SeqCst);
        let waited =
            |key: &str| writer.insert(TreeName::UsageRecords, key.as_bytes().to_vec(), vec![1], true).expect("queue").expect("waiter");
        // One request at a time: each write is committed at once, alone.
        for key in ["a", "b"] {
            answered(vec![waited(key)]).recv_timeout(Duration::from_secs(60)).expect("committed without gathering").expect("durable");
        }
        assert_eq!(flushes(), 2);
        // Two requests overlap: both are queued before the writer looks.
        let (w1, w2) = {
            let mut q = writer.shared.lock();
            let mut push = |key: &[u8]| {
                let (ack, waiter) = ack_pair(true);
                q.jobs.push(Job::Insert { tree: TreeName::UsageRecords, key: key.to_vec(), value: vec![1], ack });
                waiter.expect("waiter")
            };
            let pair = (push(b"c"), push(b"d"));
            q.urgent = true;
            q.waiting += 2;
            pair
        };
        writer.shared.wake.notify_one();
        let both = answered(vec![w1, w2]);
        for _ in 0..2 {
            both.recv_timeout(Duration::from_secs(60)).expect("committed").expect("durable");
        }
        assert_eq!(flushes(), 3, "one batch of two");
        // The next waited write waits for company: it is not committed alone...
        let third = answered(vec![waited("e")]);
        assert!(third.recv_timeout(Duration::from_millis(300)).is_err(), "committed alone although requests overlap");
        assert_eq!(flushes(), 3);
        // ...and the batch is committed as soon as it is full.
        let rest = answered(vec![waited("f"), waited("g")]);
        third.recv_timeout(Duration::from_secs(60)).expect("committed once the batch was full").expect("durable");
        for _ in 0..2 {
            rest.recv_timeout(Duration::from_secs(60)).expect("committed").expect("durable");
        }
        assert_eq!(flushes(), 4, "three waited writes, one batch");
        assert_eq!(slot.tree("usage_records").expect("tree").len(), 7);
    }

    /// Every file under `from`, copied to `to`: what a crash at this moment leaves on disk.
    fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
        std::fs::create_dir_all(to).expect("mkdir");
        for entry in std::fs::read_dir(from).expect("read_dir") {
            let entry = entry.expect("entry");
            let target = to.join(entry.file_name());
            if entry.file_type().expect("type").is_dir() {
                copy_dir(&entry.path(), &target);
            } else {
                std::fs::copy(entry.path(), target).expect("copy");
            }
        }
    }

    #[test]
    fn a_waited_write_survives_a_crash_through_the_journal_before_sled_is_flushed() {
        let dir = tempfile::tempdir().expect("tempdir");
        // No background flusher: sled's files change only when it is flushed.
        let db = sled::Config::new().path(dir.path()).flush_every_ms(None).open().expect("sled");
        let (journal, _) = journal::Journal::open(dir.path(), &db).expect("journal");
        let slot = DbSlot::with_journal(db, journal);
        let writer = Writer::start(slot.clone(), Duration::from_secs(3600), false).expect("writer");
        let waiter = writer.insert(TreeName::Balances, b"k".to_vec(), b"after".to_vec(), true).expect("queue").expect("waiter");
        waiter.wait_blocking().expect("durable");
        // The process dies now: only what is in the files survives.
        let crashed = tempfile::tempdir().expect("tempdir");
        copy_dir(dir.path(), &crashed.path().join("plain"));
        copy_dir(dir.path(), &crashed.path().join("journaled"));
        let plain = sled::open(crashed.path().join("plain")).expect("sled copy");
        let sled_alone = plain.open_tree("balances").expect("tree").get(b"k").expect("get").is_some();
        let reopened = sled::open(crashed.path().join("journaled")).expect("sled copy");
        let (_journal, recovered) = journal::Journal::open(&crashed.path().join("journaled"), &reopened).expect("journal");
        assert_eq!(reopened.open_tree("balances").expect("tree").get(b"k").expect("get").as_deref(), Some(&b"after"[..]));
        // Unless a checkpoint came first (a slow machine: a second between the journal's
        // opening and this write), the journal alone had it: sled's files did not.
        assert!(
            recovered.records == 1 && !sled_alone || recovered.records == 0 && sled_alone,
            "{recovered:?}, in sled's files: {sled_alone}"
        );
        drop(writer);
    }
}
