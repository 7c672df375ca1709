//! The fleet's money: balances shared by every node, exact across nodes, with the database off
//! the request path in the common case.
//!
//! Table `accounts` has each key's `balance` and `leased` (the sum of its live leases); table
//! `leases` has, per key and node, the `amount` that node may spend on its own and when the
//! lease `expires_at` (by the database's clock). A node:
//!
//! * **holds** locally against its lease while the lease covers the hold and is still fresh
//!   (see fencing); otherwise it leases more in one transaction that checks
//!   `balance − leased ≥ amount` under the row's lock. It asks for a chunk — an eighth of what
//!   is free, at most [`LEASE_CHUNK`], never less than the hold — while the key has room for
//!   [`SPLIT_ROOM`] such holds, and for exactly the hold below that: a small key goes through
//!   the database per request, exactly, and what is left of its lease goes back at the next
//!   sync (so no money is stranded in fragments on several nodes). Once less than half of its
//!   last chunk is free, the next chunk is **refilled** in the background
//!   ([`FleetAccounts::refill`]), so a steady key's requests do not wait for the database;

//! * **settles** locally (the hold released, the cost added to what it owes) and writes the
//!   usage record to its journal; the journal is **booked** in batches ([`FleetAccounts::book`]):
//!   one transaction stores the records and debits their costs from the balances and this
//!   node's leases. A record is known by its journal and number (and the journal's mark), so
//!   a batch retried after a lost reply debits nothing twice, and money and records can never
//!   disagree. A cost above
//!   its hold (the upstream counted more than the estimate) is debited all the same: that, and
//!   only that, takes a balance below zero;
//! * **renews** its leases (and, while at it, reclaims every node's expired ones: their money
//!   goes back to `balance − leased`). A node that dies leaves its leases to expire after
//!   `lease_secs`;
//! * **fences** itself: a lease is spent locally only until half its lifetime after the
//!   renewal (or grant) statement that extended it was *sent*, measured on the node's monotonic
//!   clock. A node that cannot reach the database therefore stops spending its leases well
//!   before the database can hand their money to others: money returned is never spent twice.
//!
//! Bounds: money stranded by a dead node is at most its leases, for at most `lease_secs` (a
//! node's lease of one key is at most one and a half chunks: a refill is asked for below half a
//! chunk); a request refused while money sits in other nodes' leases sees at most the sum of
//! their unspent leases (each chunk at most an eighth of what was free when taken, and at most
//! [`LEASE_CHUNK`], and only while the key still had room for [`SPLIT_ROOM`] holds); overdraft
//! comes only from costs above their holds, and from what a node spent but had not booked when
//! its lease expired (the database was out of its reach for over half a lease: at most what it
//! had in flight and in its journal then).
//!
//! **Lock order.** Every transaction here takes its row locks in one order, so that none can
//! wait on another in a circle (PostgreSQL's `deadlock detected`, 40P01): first the `accounts`
//! rows it needs, by `key_id`, then the `leases` rows, by `key_id`. A lease taken
//! (`lease_more`), a booking (`book`), a release (`release_unused`), a renewal (`renew`) and a
//! prune (`prune_windows`) all lock `accounts` before `leases`, and several keys in key order.

use super::usage::Journaled;
use super::{Pg, PgError};
/// A refusal: the key's money (free in the database plus this node's lease) does not cover it.
pub use crate::records::purse::Insufficient;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The largest lease taken at once (nano-USD): $1.
pub const LEASE_CHUNK: i64 = 1_000_000_000;

/// What this node holds of one key's money.
#[derive(Debug, Default, Clone)]
struct Local {
    /// This node's lease (the database's `leases.amount`, less nothing until a flush).
    lease: i64,
    /// Held by requests in flight.
    held: i64,
    /// Spent (settled) and not yet booked into the database.
    owed: i64,
    /// Until when the lease may be spent locally (fencing).
    fresh_until: Option<Instant>,
    /// The last hold made against this key here.
    last_used: Option<Instant>,
    /// The last chunk leased, 0 after an exact lease (the key is too small to split: what is
    /// left of it goes back at the next sync instead of waiting for the key to go quiet). Once
    /// less than half of a chunk is free, a refill is asked for in the background.
    chunk: i64,
    /// The size of the hold that took the last lease: a refill asks for room for it.
    hold_size: i64,
    /// A refill is asked for or under way.
    refilling: bool,
    /// How far below zero the purse may go (a spend window's cap), as its last hold said.
    credit: i64,
    /// The purses whose spend and leases count against its credit too (a rolling window's
    /// earlier buckets), as its last lease said.
    linked: Vec<String>,
}

/// What a hold from memory found.
#[derive(Debug, PartialEq, Eq)]
enum LocalHold {
    Held,
    /// Held, and less than half the last chunk is free now: a refill should be asked for.
    HeldRunningLow,
    NotCovered,
}

impl Local {
    fn free(&self) -> i64 {
        self.lease - self.held - self.owed.max(0)
    }
}

/// The largest lease is a chunk only while the key has room for this many holds of the size
/// asked; below, leases are exactly the hold, so no money is stranded in fragments.
pub const SPLIT_ROOM: i64 = 64;

/// Money held for one request; give it to [`FleetAccounts::settle`].
#[derive(Debug)]
#[must_use]
pub struct FleetHold {
    pub key_id: String,
    pub amount: i64,
}

/// Keys waiting for a refill at most (more are refilled when a request needs it).
const REFILL_QUEUE: usize = 1024;

/// One node's view of the fleet's accounts.
pub struct FleetAccounts {
    pg: Pg,
    node: String,
    lease_for: Duration,
    /// This node's view, locked only for memory work (never across a database call).
    state: std::sync::Mutex<State>,
    /// Lease requests one at a time.
    leasing: tokio::sync::Mutex<()>,
    /// Keys whose lease runs low, for the refiller (see [`FleetAccounts::take_refills`]).
    refills: tokio::sync::mpsc::Sender<String>,
    refills_rx: std::sync::Mutex<Option<tokio::sync::mpsc::Receiver<String>>>,
    /// Bookings, renewals and give-backs one at a time, so that their local updates (made
    /// after their transactions, without holding up requests) apply in commit order. A grant
    /// writes the lease the database returned (after a stale spell, what the database still
    /// has is all there is); a booking subtracts what it took, so a grant written meanwhile is
    /// at most understated by that. A renewal writes every lease whole and takes `leasing` too,
    /// so no grant falls between its read and its write (a grant lost that way left the lease
    /// at 0 here: a false 503 in an outage).
    maintenance: tokio::sync::Mutex<()>,
}

struct State {
    keys: HashMap<String, Local, ahash::RandomState>,
}

impl FleetAccounts {
    /// `node` must differ between nodes; `lease_for` is `store.lease_secs`.
    pub fn new(pg: Pg, node: &str, lease_for: Duration) -> Self {
        let state = State { keys: HashMap::default() };
        let (refills, refills_rx) = tokio::sync::mpsc::channel(REFILL_QUEUE);
        FleetAccounts {
            refills,
            refills_rx: std::sync::Mutex::new(Some(refills_rx)),
            pg,
            node: node.to_string(),
            lease_for,
            state: std::sync::Mutex::new(state),
            leasing: tokio::sync::Mutex::new(()),
            maintenance: tokio::sync::Mutex::new(()),
        }
    }

    /// Create the key's account with `initial` if it has none; whether it was created.
    pub async fn open_account(&self, key_id: &str, initial: i64) -> Result<bool, PgError> {
        let client = self.pg.client().await?;
        let n = client
            .execute("INSERT INTO accounts (key_id, balance) VALUES ($1, $2) ON CONFLICT (key_id) DO NOTHING", &[&key_id, &initial])
            .await?;
        self.pg.count(1);
        Ok(n == 1)
    }

    /// The key's balance and what all nodes have leased of it, as the database has them.
    pub async fn balance(&self, key_id: &str) -> Result<(i64, i64), PgError> {
        let client = self.pg.client().await?;
        let row = client.query_opt("SELECT balance, leased FROM accounts WHERE key_id = $1", &[&key_id]).await?;
        self.pg.count(1);
        Ok(row.map_or((0, 0), |r| (r.get(0), r.get(1))))
    }

    /// Hold `amount` of a key's balance for a request (see [`Self::hold_within`]).
    pub async fn hold(&self, key_id: &str, amount: i64) -> Result<Result<FleetHold, Insufficient>, PgError> {
        self.hold_within(key_id, amount, 0, &[]).await
    }

    /// Hold `amount` of a purse that may go `credit` below zero (a spend window: its cap), for
    /// a request: from this node's fresh lease when it covers it, else by leasing more from the
    /// database, where what is free is `balance + credit − leased`.
    pub async fn hold_within(
        &self,
        key_id: &str,
        amount: i64,
        credit: i64,
        linked: &[String],
    ) -> Result<Result<FleetHold, Insufficient>, PgError> {
        let amount = amount.max(0);
        let held = || FleetHold { key_id: key_id.to_string(), amount };
        match self.hold_locally(key_id, amount) {
            LocalHold::Held => return Ok(Ok(held())),
            LocalHold::HeldRunningLow => {
                self.ask_refill(key_id);
                return Ok(Ok(held()));
            }
            LocalHold::NotCovered => {}
        }
        // One lease request at a time on this node; the others keep holding from memory.
        let _leasing = self.leasing.lock().await;
        // Another request may have leased meanwhile. What a fresh lease still covers is set
        // aside for this request; a stale lease is not spent, what it covers is asked again.
        let covered = {
            let mut state = self.lock_state();
            let local = state.keys.entry(key_id.to_string()).or_default();
            // A key's first hold comes this way: it is in use from now (a sync round gives
            // back the whole lease of a key it finds quiet).
            local.last_used = Some(Instant::now());
            local.credit = credit;
            if local.linked != linked {
                local.linked = linked.to_vec();
            }
            let fresh = local.fresh_until.is_some_and(|t| Instant::now() < t);
            if fresh && local.free() >= amount && (amount > 0 || local.free() >= 0) {
                local.held += amount;
                return Ok(Ok(held()));
            }
            let covered = if fresh { local.free().max(0).min(amount) } else { 0 };
            local.held += covered;
            covered
        };
        let short = amount - covered;
        let sent = Instant::now();
        let leased = self.lease_more(key_id, short, credit, linked, false).await;
        let mut state = self.lock_state();
        let local = state.keys.entry(key_id.to_string()).or_default();
        let (granted, total) = match leased {
            Ok(Ok(grant)) => grant,
            Ok(Err(free)) => {
                local.held -= covered;
                return Ok(Err(Insufficient { needed: amount, available: free.max(0).saturating_add(covered) }));
            }
            Err(e) => {
                local.held -= covered;
                return Err(e);
            }
        };
        log::debug!("lease of {key_id}: +{granted} nano-USD, {total} now");
        local.chunk = if granted == short { 0 } else { granted };
        local.hold_size = amount;
        local.lease = total;
        local.fresh_until = Some(sent + self.lease_for / 2);
        local.held += short;
        Ok(Ok(held()))
    }

    /// Hold `amount` from this node's fresh lease, in memory.
    fn hold_locally(&self, key_id: &str, amount: i64) -> LocalHold {
        let mut state = self.lock_state();
        let Some(local) = state.keys.get_mut(key_id) else { return LocalHold::NotCovered };
        let now = Instant::now();
        local.last_used = Some(now);
        let fresh = local.fresh_until.is_some_and(|t| now < t);
        if fresh && local.free() >= amount && (amount > 0 || local.free() >= 0) {
            local.held += amount;
            if local.chunk > 0 && !local.refilling && local.free() < local.chunk / 2 {
                local.refilling = true;
                return LocalHold::HeldRunningLow;
            }
            return LocalHold::Held;
        }
        LocalHold::NotCovered
    }

    /// Queue `key_id` for the refiller; when the queue is full (or nobody refills), the next
    /// request that finds the lease short leases itself.
    fn ask_refill(&self, key_id: &str) {
        if self.refills.try_send(key_id.to_string()).is_err() {
            if let Some(local) = self.lock_state().keys.get_mut(key_id) {
                local.refilling = false;
            }
        }
    }

    /// The keys whose lease runs low, to give to [`Self::refill`] one by one (once: the
    /// fleet's refiller takes it at start).
    pub fn take_refills(&self) -> Option<tokio::sync::mpsc::Receiver<String>> {
        self.refills_rx.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take()
    }

    /// Lease another chunk of `key_id` ahead of need, off the request path, while less than
    /// half of the last chunk is free; what the key can spare decides as for a request's
    /// lease. A key too small to split is not refilled (its requests lease exactly).
    pub async fn refill(&self, key_id: &str) -> Result<(), PgError> {
        let _leasing = self.leasing.lock().await;
        let low = |l: &Local| l.fresh_until.is_some_and(|t| Instant::now() < t) && l.chunk > 0 && l.free() < l.chunk / 2;
        let size = {
            let mut state = self.lock_state();
            let Some(local) = state.keys.get_mut(key_id) else { return Ok(()) };
            if !low(local) {
                local.refilling = false;
                return Ok(());
            }
            (local.hold_size.max(1), local.credit, local.linked.clone())
        };
        let (size, credit, linked) = size;
        let sent = Instant::now();
        let leased = self.lease_more(key_id, size, credit, &linked, true).await;
        let mut state = self.lock_state();
        let local = state.keys.entry(key_id.to_string()).or_default();
        local.refilling = false;
        if let Ok((granted, total)) = leased? {
            log::debug!("refill of {key_id}: +{granted} nano-USD, {total} now");
            local.chunk = granted;
            local.lease = total;
            local.fresh_until = Some(sent + self.lease_for / 2);
        }
        Ok(())
    }

    fn lock_state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Lease at least `short` more of the key's money: a chunk if the key has room for many
    /// such holds, else exactly `short` (with `chunk_only`, nothing); (granted, the lease's new
    /// total). Err(what is free) when `balance − leased` is below `short` (or the balance is
    /// negative).
    async fn lease_more(
        &self,
        key_id: &str,
        short: i64,
        credit: i64,
        linked: &[String],
        chunk_only: bool,
    ) -> Result<Result<(i64, i64), i64>, PgError> {
        let mut client = self.pg.client().await?;
        let tx = client.transaction().await?;
        // A rolling window's earlier buckets: what they spent and what nodes lease of them is
        // taken from the credit. Read-locked first — their ids sort before the current
        // bucket's, and rows are locked in key order here as everywhere — so no lease of one
        // of them is granted meanwhile.
        let mut earlier = 0i64;
        if !linked.is_empty() {
            let rows =
                tx.query("SELECT balance, leased FROM accounts WHERE key_id = ANY($1) ORDER BY key_id FOR SHARE", &[&linked]).await?;
            self.pg.count(1);
            for r in rows {
                let (b, l): (i64, i64) = (r.get(0), r.get(1));
                earlier = earlier.saturating_add(b).saturating_sub(l);
            }
        }
        if credit > 0 {
            // A purse with credit (a new spend window) starts at zero, made on first use.
            tx.execute("INSERT INTO accounts (key_id, balance) VALUES ($1, 0) ON CONFLICT (key_id) DO NOTHING", &[&key_id]).await?;
            self.pg.count(1);
        }
        let row = tx.query_opt("SELECT balance, leased FROM accounts WHERE key_id = $1 FOR UPDATE", &[&key_id]).await?;
        let Some(row) = row else {
            self.pg.count(1);
            return Ok(Err(0));
        };
        let (balance, leased): (i64, i64) = (row.get(0), row.get(1));
        let balance = balance.saturating_add(credit).saturating_add(earlier);
        let free = balance - leased;
        if free < short || (short >= 0 && balance < 0) {
            self.pg.count(1);
            return Ok(Err(free));
        }
        let roomy = short > 0 && free / SPLIT_ROOM >= short;
        if chunk_only && !roomy {
            self.pg.count(1);
            return Ok(Err(free));
        }
        let grant = if roomy { (free / 8).min(LEASE_CHUNK).max(short) } else { short.max(0) };
        let lease_ms = i64::try_from(self.lease_for.as_millis()).unwrap_or(i64::MAX);
        tx.execute("UPDATE accounts SET leased = leased + $2 WHERE key_id = $1", &[&key_id, &grant]).await?;
        let total: i64 = tx
            .query_one(
                "INSERT INTO leases (key_id, node_id, amount, expires_at) VALUES ($1, $2, $3, now() + $4 * interval '1 millisecond')
                 ON CONFLICT (key_id, node_id) DO UPDATE SET amount = leases.amount + EXCLUDED.amount, expires_at = EXCLUDED.expires_at
                 RETURNING amount",
                &[&key_id, &self.node, &grant, &(lease_ms as f64)],
            )
            .await?
            .get(0);
        tx.commit().await?;
        self.pg.count(4);
        Ok(Ok((grant, total)))
    }

    /// A request ended: its hold is released and `cost` is owed (booked with its record by [`Self::book`]).
    pub async fn settle(&self, hold: FleetHold, cost: i64) {
        let mut state = self.lock_state();
        let local = state.keys.entry(hold.key_id).or_default();
        local.held -= hold.amount;
        local.owed += cost;
    }

    /// Book journaled usage records in one transaction: every record new to the database is
    /// stored (with the owner of the response it created) and its cost debited from its key's
    /// balance, taken first out of this node's lease. A record already there (a batch retried
    /// after a lost reply) adds nothing, so no cost is ever debited twice; a cost above its hold
    /// is debited all the same, which, and only which, takes a balance below zero. `journal`
    /// names the node's journal (node id and journal incarnation) in `usage_records`.
    pub async fn book(&self, journal: &str, batch: &[Journaled<'_>]) -> Result<usize, PgError> {
        if batch.is_empty() {
            return Ok(0);
        }
        // The transaction runs without the node's lock: requests keep being held meanwhile.
        let _turn = self.maintenance.lock().await;
        let mut client = self.pg.client().await?;
        let tx = client.transaction().await?;
        let (new, mut statements) = super::usage::insert(&tx, journal, batch.iter()).await?;
        // Sorted and searched: a hash set's hashing per record was a tenth of what booking cost.
        let mut new = new;
        new.sort_unstable();
        let is_new = |j: &&Journaled<'_>| new.binary_search(&j.seq).is_ok();
        // Each record debits its key and every purse it was charged besides (an account, spend
        // windows); by key, the order the rows are locked in.
        let mut spent: std::collections::BTreeMap<&str, i64> = std::collections::BTreeMap::new();
        for j in batch.iter().filter(is_new) {
            for id in j.purses() {
                *spent.entry(id).or_default() += j.head.cost_nanos;
            }
        }
        statements += super::usage::insert_owners(&tx, batch.iter().filter(is_new).filter_map(|j| j.owner.as_ref())).await?;
        // Locks in the one global order (the module's lock order): the purses' account rows, by key,
        // then this node's lease rows, by key.
        let keys: Vec<&str> = spent.keys().copied().collect();
        // One statement makes and locks the rows, in key order: a purse that has none yet (a
        // window first charged by a checked booking on a node that had never held against it)
        // is made at zero; an existing row is locked by its no-op update.
        tx.execute(
            "INSERT INTO accounts (key_id, balance) SELECT k, 0 FROM unnest($1::text[]) AS k ORDER BY k
             ON CONFLICT (key_id) DO UPDATE SET balance = accounts.balance",
            &[&keys],
        )
        .await?;
        let leases: HashMap<String, i64> = tx
            .query(
                "SELECT key_id, amount FROM leases WHERE node_id = $2 AND key_id = ANY($1) ORDER BY key_id FOR UPDATE",
                &[&keys, &self.node],
            )
            .await?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        statements += 2;
        let mut from_leases: HashMap<&str, i64> = HashMap::new();
        for key_id in keys {
            let amount = spent.get(key_id).copied().unwrap_or(0);
            let lease = leases.get(key_id).copied();
            let from_lease = lease.unwrap_or(0).min(amount.max(0));
            tx.execute(
                "UPDATE accounts SET balance = balance - $2, leased = leased - $3 WHERE key_id = $1",
                &[&key_id, &amount, &from_lease],
            )
            .await?;
            statements += 1;
            if from_lease > 0 {
                tx.execute(
                    "UPDATE leases SET amount = amount - $3 WHERE key_id = $1 AND node_id = $2",
                    &[&key_id, &self.node, &from_lease],
                )
                .await?;
                statements += 1;
            }
            if lease.is_some() {
                from_leases.insert(key_id, from_lease);
            }
        }
        tx.commit().await?;
        self.pg.count(statements + 2);
        // What came out of this node's lease is subtracted: a grant written here meanwhile
        // (the database's newer total) is understated by at most that until the next renewal.
        let mut state = self.lock_state();
        for j in batch.iter().filter(|j| j.owed_here) {
            for id in j.purses() {
                if let Some(local) = state.keys.get_mut(id) {
                    local.owed -= j.head.cost_nanos;
                }
            }
        }
        for (key_id, from_lease) in from_leases {
            if let Some(local) = state.keys.get_mut(key_id) {
                local.lease -= from_lease;
            }
        }
        Ok(new.len())
    }

    /// Add `delta` to the balance of `key_id` (a key or `acct:<name>`: an administrator's
    /// top-up), with its audit entry, in one transaction.
    pub async fn top_up(&self, key_id: &str, delta: i64, reason: Option<&str>) -> Result<crate::records::audit::AuditEntry, PgError> {
        let entry = self.top_up_marked(key_id, delta, reason, &[]).await?;
        entry.ok_or_else(|| PgError::Query("a top-up without a mark was skipped".into()))
    }

    /// [`Self::top_up`] once for `marks`: the marks, the balance change and its audit entry in
    /// one transaction; None (nothing changed) when another node or an earlier run wrote any
    /// of the marks (a concurrent writer of the same mark waits on its row, then finds it).
    pub async fn top_up_once(
        &self,
        key_id: &str,
        delta: i64,
        reason: &str,
        marks: &[(&str, i64)],
    ) -> Result<Option<crate::records::audit::AuditEntry>, PgError> {
        self.top_up_marked(key_id, delta, Some(reason), marks).await
    }

    /// The balance change and its audit entry, with the marks first (None: one of them was
    /// written before, nothing changed).
    async fn top_up_marked(
        &self,
        key_id: &str,
        delta: i64,
        reason: Option<&str>,
        marks: &[(&str, i64)],
    ) -> Result<Option<crate::records::audit::AuditEntry>, PgError> {
        let mut client = self.pg.client().await?;
        let tx = client.transaction().await?;
        let now = i64::try_from(crate::base::clock::now_ms()).unwrap_or(i64::MAX);
        for (mark, value) in marks {
            let marked = tx
                .execute("INSERT INTO marks (id, value, time_ms) VALUES ($1, $2, $3) ON CONFLICT (id) DO NOTHING", &[mark, value, &now])
                .await?;
            self.pg.count(1);
            if marked == 0 {
                tx.rollback().await?;
                return Ok(None);
            }
        }
        let balance: i64 = tx
            .query_one(
                "INSERT INTO accounts (key_id, balance) VALUES ($1, $2)
                 ON CONFLICT (key_id) DO UPDATE SET balance = accounts.balance + EXCLUDED.balance RETURNING balance",
                &[&key_id, &delta],
            )
            .await?
            .get(0);
        let entry = crate::records::audit::AuditEntry::new(key_id, delta, balance, reason);
        let text = serde_json::to_string(&entry).map_err(|e| PgError::Query(format!("audit entry: {e}")))?;
        tx.execute("INSERT INTO audit_log (time_ms, record) VALUES ($1, $2)", &[&i64::try_from(entry.time_ms).unwrap_or(i64::MAX), &text])
            .await?;
        tx.commit().await?;
        self.pg.count(4);
        Ok(Some(entry))
    }

    /// Write `mark` alone; false when it was written before.
    pub async fn put_mark(&self, mark: &str, value: i64) -> Result<bool, PgError> {
        let client = self.pg.client().await?;
        let now = i64::try_from(crate::base::clock::now_ms()).unwrap_or(i64::MAX);
        let n = client
            .execute("INSERT INTO marks (id, value, time_ms) VALUES ($1, $2, $3) ON CONFLICT (id) DO NOTHING", &[&mark, &value, &now])
            .await?;
        self.pg.count(1);
        Ok(n == 1)
    }

    /// How many marks begin with `prefix` (compared as bytes, so `_` and `%` are no patterns).
    pub async fn count_marks(&self, prefix: &str) -> Result<u64, PgError> {
        let client = self.pg.client().await?;
        let n: i64 =
            client.query_one("SELECT count(*) FROM marks WHERE left(id, char_length($1::text)) = $1::text", &[&prefix]).await?.get(0);
        self.pg.count(1);
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// The value written with `mark`, if it was.
    pub async fn mark(&self, mark: &str) -> Result<Option<i64>, PgError> {
        let client = self.pg.client().await?;
        let row = client.query_opt("SELECT value FROM marks WHERE id = $1", &[&mark]).await?;
        self.pg.count(1);
        Ok(row.map(|r| r.get(0)))
    }

    /// Forget the balances of spend windows that ended before `before_ms` (see
    /// `policy::budget::WINDOW_KEPT_SECS`) and that no node leases; how many.
    pub async fn prune_windows(&self, before_ms: u64) -> Result<u64, PgError> {
        let cut = i64::try_from((before_ms / 1000).saturating_sub(crate::policy::budget::WINDOW_KEPT_SECS)).unwrap_or(i64::MAX);
        let mut client = self.pg.client().await?;
        let tx = client.transaction().await?;
        let ended = "a.key_id LIKE 'win:%' AND a.leased = 0 AND reverse(split_part(reverse(a.key_id), ':', 1))::BIGINT < $1";
        // Account rows before lease rows, by key (the module's lock order).
        tx.query(&format!("SELECT a.key_id FROM accounts a WHERE {ended} ORDER BY a.key_id FOR UPDATE"), &[&cut]).await?;
        tx.execute(&format!("DELETE FROM leases l USING accounts a WHERE l.key_id = a.key_id AND {ended}"), &[&cut]).await?;
        let n = tx.execute(&format!("DELETE FROM accounts a WHERE {ended}"), &[&cut]).await?;
        tx.commit().await?;
        self.pg.count(5);
        Ok(n)
    }

    /// Audit entries before the position `before`, newest first, each with its number.
    pub async fn audit(
        &self,
        limit: usize,
        before: Option<crate::records::log::Cursor>,
    ) -> Result<Vec<crate::records::audit::AuditEntry>, PgError> {
        let client = self.pg.client().await?;
        let (t, n) = before
            .map_or((i64::MAX, i64::MAX), |c| (i64::try_from(c.time_ms).unwrap_or(i64::MAX), i64::try_from(c.seq).unwrap_or(i64::MAX)));
        let rows = client
            .query(
                "SELECT record, seq FROM audit_log WHERE (time_ms, seq) < ($1, $2) ORDER BY time_ms DESC, seq DESC LIMIT $3",
                &[&t, &n, &i64::try_from(limit).unwrap_or(i64::MAX)],
            )
            .await?;
        self.pg.count(1);
        rows.iter()
            .map(|r| {
                let text: String = r.get(0);
                let mut entry: crate::records::audit::AuditEntry =
                    serde_json::from_str(&text).map_err(|e| PgError::Query(format!("audit entry: {e}")))?;
                entry.seq = u64::try_from(r.get::<_, i64>(1)).unwrap_or(0);
                Ok(entry)
            })
            .collect()
    }

    /// What requests in flight on this node hold of `key_id`.
    pub fn held(&self, key_id: &str) -> i64 {
        self.lock_state().keys.get(key_id).map_or(0, |l| l.held)
    }

    /// What this node has settled and not yet booked, for `key_id`.
    pub async fn owed(&self, key_id: &str) -> i64 {
        self.lock_state().keys.get(key_id).map_or(0, |l| l.owed)
    }

    /// Give back what this node's lease of `key_id` does not need now (nothing held or owed
    /// against it).
    pub async fn release_unused(&self, key_id: &str) -> Result<i64, PgError> {
        // Set aside first, under the lock, so no hold can take what is on its way back; the
        // database is then written without holding up this node's other requests. Whatever
        // happens, the local lease stays at most what the database has (the next renewal
        // reads it back).
        let _turn = self.maintenance.lock().await;
        let unused = {
            let mut state = self.lock_state();
            let Some(local) = state.keys.get_mut(key_id) else { return Ok(0) };
            let unused = local.free().max(0);
            local.lease -= unused;
            unused
        };
        if unused == 0 {
            return Ok(0);
        }
        let mut client = self.pg.client().await?;
        let tx = client.transaction().await?;
        // The account row before the lease row (the module's lock order).
        tx.query_opt("SELECT leased FROM accounts WHERE key_id = $1 FOR UPDATE", &[&key_id]).await?;
        let lease: Option<i64> = tx
            .query_opt("SELECT amount FROM leases WHERE key_id = $1 AND node_id = $2 FOR UPDATE", &[&key_id, &self.node])
            .await?
            .map(|r| r.get(0));
        let back = lease.unwrap_or(0).min(unused);
        tx.execute("UPDATE leases SET amount = amount - $3 WHERE key_id = $1 AND node_id = $2", &[&key_id, &self.node, &back]).await?;
        tx.execute("UPDATE accounts SET leased = leased - $2 WHERE key_id = $1", &[&key_id, &back]).await?;
        tx.commit().await?;
        self.pg.count(5);
        Ok(back)
    }

    /// Give back everything this node leased and does not hold (a graceful stop).
    pub async fn release_all(&self) -> Result<i64, PgError> {
        let keys: Vec<String> = self.lock_state().keys.keys().cloned().collect();
        let mut back = 0;
        for key_id in keys {
            back += self.release_unused(&key_id).await?;
        }
        Ok(back)
    }

    /// Extend this node's leases by `lease_secs` from now (the database's clock), and reclaim
    /// every node's expired leases. Keeps the local view in step: a lease the database let
    /// expire (this node was fenced) is gone here too. Returns the money reclaimed.
    pub async fn renew(&self) -> Result<i64, PgError> {
        let _turn = self.maintenance.lock().await;
        // No grant between this renewal's read of the leases and its writing them here: the
        // values it writes are absolute, a grant's are added.
        let _leasing = self.leasing.lock().await;
        let sent = Instant::now();
        let lease_ms = i64::try_from(self.lease_for.as_millis()).unwrap_or(i64::MAX) as f64;
        let mut client = self.pg.client().await?;
        let tx = client.transaction().await?;
        // The account rows of the expired leases first, by key (the module's lock order); `now()` is the
        // transaction's, so the statement below finds the same leases.
        tx.query(
            "SELECT key_id FROM accounts WHERE key_id IN (SELECT key_id FROM leases WHERE expires_at < now()) ORDER BY key_id FOR UPDATE",
            &[],
        )
        .await?;
        let reclaimed: i64 = tx
            .query_one(
                "WITH expired AS (DELETE FROM leases WHERE expires_at < now() RETURNING key_id, amount),
                      per_key AS (SELECT key_id, SUM(amount)::BIGINT AS total FROM expired GROUP BY key_id),
                      back AS (UPDATE accounts a SET leased = a.leased - p.total FROM per_key p WHERE a.key_id = p.key_id RETURNING p.total)
                 SELECT COALESCE(SUM(total), 0)::BIGINT FROM back",
                &[],
            )
            .await?
            .get(0);
        let mine = tx
            .query(
                "UPDATE leases SET expires_at = now() + $2 * interval '1 millisecond' WHERE node_id = $1 RETURNING key_id, amount",
                &[&self.node, &lease_ms],
            )
            .await?;
        tx.commit().await?;
        self.pg.count(5);
        let mine: HashMap<String, i64> = mine.iter().map(|r| (r.get(0), r.get(1))).collect();
        let mut state = self.lock_state();
        for (key_id, local) in state.keys.iter_mut() {
            match mine.get(key_id) {
                Some(amount) => {
                    local.lease = *amount;
                    local.fresh_until = Some(sent + self.lease_for / 2);
                }
                None => {
                    local.lease = 0;
                    local.fresh_until = None;
                }
            }
        }
        if reclaimed > 0 {
            log::info!("reclaimed {reclaimed} nano-USD of expired leases");
        }
        Ok(reclaimed)
    }

    /// One sync round (every `store.sync_ms`, after the journal was booked): renew the leases
    /// (reclaiming expired ones) and give back what is not needed — the whole unused lease of
    /// a key unused for half a lease, and what is left of an exact lease once nothing is held
    /// against it. A failed round is retried by the next; meanwhile leases go stale at half
    /// their lifetime (fencing).
    pub async fn round(&self) -> Result<(), PgError> {
        self.renew().await?;
        let idle: Vec<String> = {
            let state = self.lock_state();
            let quiet = |l: &Local| l.last_used.is_none_or(|t| t.elapsed() >= self.lease_for / 2);
            state
                .keys
                .iter()
                .filter(|(_, l)| l.held == 0 && l.owed <= 0 && l.lease > 0 && (l.chunk == 0 || quiet(l)))
                .map(|(k, _)| k.clone())
                .collect()
        };
        for key_id in idle {
            self.release_unused(&key_id).await?;
        }
        // Forget what this node neither leases, holds nor owes and has not used for half a
        // lease: spend windows add a purse per key and period, and an ended one is never used
        // again. A purse used later starts afresh (its first hold leases).
        let mut state = self.lock_state();
        let quiet = |l: &Local| l.last_used.is_none_or(|t| t.elapsed() >= self.lease_for / 2);
        state.keys.retain(|_, l| !(l.lease == 0 && l.held == 0 && l.owed == 0 && !l.refilling && quiet(l)));
        Ok(())
    }

    /// How many purses this node keeps state for.
    pub fn tracked(&self) -> usize {
        self.lock_state().keys.len()
    }
}
