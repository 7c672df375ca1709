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
//!   is free, at most [`LEASE_CHUNK`], never less than the hold — and, refused that, for exactly
//!   the hold: a key too small to split goes through the database per request, exactly;
//! * **settles** locally (the hold released, the cost added to what it owes) and **flushes**
//!   what it owes in batches: one transaction per key debits the balance and shrinks the lease
//!   and `leased` by what came out of the lease. A cost above its hold (the upstream counted
//!   more than the estimate) is debited all the same: that, and only that, takes a balance
//!   below zero. Batches are numbered per node and recorded, so a batch retried after a lost
//!   reply is applied once;
//! * **renews** its leases (and, while at it, reclaims every node's expired ones: their money
//!   goes back to `balance − leased`). A node that dies leaves its leases to expire after
//!   `lease_secs`;
//! * **fences** itself: a lease is spent locally only until half its lifetime after the
//!   renewal (or grant) statement that extended it was *sent*, measured on the node's monotonic
//!   clock. A node that cannot reach the database therefore stops spending its leases well
//!   before the database can hand their money to others: money returned is never spent twice.
//!
//! Bounds: money stranded by a dead node is at most its leases, for at most `lease_secs`; a
//! request refused while money sits in other nodes' leases sees at most the sum of their
//! unspent leases (each at most an eighth of what was free when taken, and at most
//! [`LEASE_CHUNK`]); overdraft comes only from costs above their holds, and from what a node
//! spent but had not flushed when its lease expired (at most one flush window of its spending).

use super::{Pg, PgError};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The largest lease taken at once (nano-USD): $1.
pub const LEASE_CHUNK: i64 = 1_000_000_000;

/// What this node holds of one key's money.
#[derive(Debug, Default, Clone, Copy)]
struct Local {
    /// This node's lease (the database's `leases.amount`, less nothing until a flush).
    lease: i64,
    /// Held by requests in flight.
    held: i64,
    /// Spent (settled) and not yet flushed to the database.
    owed: i64,
    /// Until when the lease may be spent locally (fencing).
    fresh_until: Option<Instant>,
    /// A batch of `owed` on its way to the database: (batch number, amount). Retried with the
    /// same number until it is known applied, so a lost reply never debits twice.
    pending: Option<(i64, i64)>,
    /// The last hold made against this key here.
    last_used: Option<Instant>,
}

impl Local {
    fn free(&self) -> i64 {
        self.lease - self.held - self.owed.max(0)
    }
}

/// A refusal: the key's money (free in the database plus this node's lease) does not cover it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insufficient {
    pub needed: i64,
}

/// Money held for one request; give it to [`FleetAccounts::settle`].
#[derive(Debug)]
#[must_use]
pub struct FleetHold {
    pub key_id: String,
    pub amount: i64,
}

/// One node's view of the fleet's accounts.
pub struct FleetAccounts {
    pg: Pg,
    node: String,
    lease_for: Duration,
    state: tokio::sync::Mutex<State>,
}

struct State {
    keys: HashMap<String, Local>,
    /// Settlement batch numbers: from the start time in ms × 65536, so a restarted node (same
    /// `node_id`) never reuses one.
    next_batch: i64,
}

impl FleetAccounts {
    /// `node` must differ between nodes; `lease_for` is `store.lease_secs`.
    pub fn new(pg: Pg, node: &str, lease_for: Duration) -> Self {
        let start_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
        let state = State { keys: HashMap::new(), next_batch: start_ms.saturating_mul(65_536) };
        FleetAccounts { pg, node: node.to_string(), lease_for, state: tokio::sync::Mutex::new(state) }
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

    /// Hold `amount` for a request: from this node's fresh lease when it covers it, else by
    /// leasing more from the database.
    pub async fn hold(&self, key_id: &str, amount: i64) -> Result<Result<FleetHold, Insufficient>, PgError> {
        let amount = amount.max(0);
        let mut state = self.state.lock().await;
        let local = state.keys.entry(key_id.to_string()).or_default();
        let fresh = local.fresh_until.is_some_and(|t| Instant::now() < t);
        local.last_used = Some(Instant::now());
        if fresh && local.free() >= amount && (amount > 0 || local.free() >= 0) {
            local.held += amount;
            return Ok(Ok(FleetHold { key_id: key_id.to_string(), amount }));
        }
        // A stale lease is not spent: what it still covers is asked for again.
        let covered = if fresh { local.free().max(0) } else { 0 };
        let short = amount - covered;
        let sent = Instant::now();
        let granted = self.lease_more(key_id, short).await?;
        let Some((granted, total)) = granted else { return Ok(Err(Insufficient { needed: amount })) };
        let local = state.keys.entry(key_id.to_string()).or_default();
        log::debug!("lease of {key_id}: +{granted} nano-USD, {total} now");
        local.lease = total;
        local.fresh_until = Some(sent + self.lease_for / 2);
        local.held += amount;
        Ok(Ok(FleetHold { key_id: key_id.to_string(), amount }))
    }

    /// Lease at least `short` more of the key's money: a chunk if the key has room, else
    /// exactly `short`; the lease's new total. None when `balance − leased` is below `short`
    /// (or the balance is negative).
    async fn lease_more(&self, key_id: &str, short: i64) -> Result<Option<(i64, i64)>, PgError> {
        let mut client = self.pg.client().await?;
        let tx = client.transaction().await?;
        let row = tx.query_opt("SELECT balance, leased FROM accounts WHERE key_id = $1 FOR UPDATE", &[&key_id]).await?;
        let Some(row) = row else {
            self.pg.count(1);
            return Ok(None);
        };
        let (balance, leased): (i64, i64) = (row.get(0), row.get(1));
        let free = balance - leased;
        if free < short || (short >= 0 && balance < 0) {
            self.pg.count(1);
            return Ok(None);
        }
        let grant = (free / 8).min(LEASE_CHUNK).max(short).max(0);
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
        Ok(Some((grant, total)))
    }

    /// A request ended: its hold is released and `cost` is owed (flushed by [`Self::flush`]).
    pub async fn settle(&self, hold: FleetHold, cost: i64) {
        let mut state = self.state.lock().await;
        let local = state.keys.entry(hold.key_id).or_default();
        local.held -= hold.amount;
        local.owed += cost;
    }

    /// Write what this node owes to the database: per key, one transaction debits the balance
    /// and takes what it can out of this node's lease. Returns the keys flushed. On an error
    /// the batch stays pending and is retried, under the same number, by the next flush.
    pub async fn flush(&self) -> Result<usize, PgError> {
        let mut state = self.state.lock().await;
        let mut batches = Vec::new();
        let mut next = state.next_batch;
        for (key_id, local) in state.keys.iter_mut() {
            if local.pending.is_none() && local.owed != 0 {
                local.pending = Some((next, local.owed));
                next += 1;
            }
            if let Some(batch) = local.pending {
                batches.push((key_id.clone(), batch));
            }
        }
        state.next_batch = next;
        let mut flushed = 0;
        for (key_id, (batch, amount)) in batches {
            let lease_left = self.apply(&key_id, amount, batch).await?;
            if let Some(local) = state.keys.get_mut(&key_id) {
                local.owed -= amount;
                local.pending = None;
                local.lease = lease_left;
            }
            flushed += 1;
        }
        Ok(flushed)
    }

    /// Debit `amount` owed on `key_id` as batch `batch` of this node, once; the lease left.
    async fn apply(&self, key_id: &str, amount: i64, batch: i64) -> Result<i64, PgError> {
        let mut client = self.pg.client().await?;
        let tx = client.transaction().await?;
        let fresh =
            tx.execute("INSERT INTO settlements (node_id, batch) VALUES ($1, $2) ON CONFLICT DO NOTHING", &[&self.node, &batch]).await?;
        let lease: Option<i64> = tx
            .query_opt("SELECT amount FROM leases WHERE key_id = $1 AND node_id = $2 FOR UPDATE", &[&key_id, &self.node])
            .await?
            .map(|r| r.get(0));
        if fresh == 1 {
            let from_lease = lease.unwrap_or(0).min(amount.max(0));
            tx.execute(
                "UPDATE accounts SET balance = balance - $2, leased = leased - $3 WHERE key_id = $1",
                &[&key_id, &amount, &from_lease],
            )
            .await?;
            tx.execute("UPDATE leases SET amount = amount - $3 WHERE key_id = $1 AND node_id = $2", &[&key_id, &self.node, &from_lease])
                .await?;
            tx.commit().await?;
            self.pg.count(6);
            return Ok(lease.unwrap_or(0) - from_lease);
        }
        tx.commit().await?;
        self.pg.count(3);
        Ok(lease.unwrap_or(0))
    }

    /// Give back what this node's lease of `key_id` does not need now (nothing held or owed
    /// against it).
    pub async fn release_unused(&self, key_id: &str) -> Result<i64, PgError> {
        let mut state = self.state.lock().await;
        let Some(local) = state.keys.get(key_id).copied() else { return Ok(0) };
        let unused = local.free().max(0);
        if unused == 0 {
            return Ok(0);
        }
        let mut client = self.pg.client().await?;
        let tx = client.transaction().await?;
        let lease: Option<i64> = tx
            .query_opt("SELECT amount FROM leases WHERE key_id = $1 AND node_id = $2 FOR UPDATE", &[&key_id, &self.node])
            .await?
            .map(|r| r.get(0));
        let back = lease.unwrap_or(0).min(unused);
        tx.execute("UPDATE leases SET amount = amount - $3 WHERE key_id = $1 AND node_id = $2", &[&key_id, &self.node, &back]).await?;
        tx.execute("UPDATE accounts SET leased = leased - $2 WHERE key_id = $1", &[&key_id, &back]).await?;
        tx.commit().await?;
        self.pg.count(4);
        if let Some(local) = state.keys.get_mut(key_id) {
            local.lease = lease.unwrap_or(0) - back;
        }
        Ok(back)
    }

    /// Extend this node's leases by `lease_secs` from now (the database's clock), and reclaim
    /// every node's expired leases. Keeps the local view in step: a lease the database let
    /// expire (this node was fenced) is gone here too. Returns the money reclaimed.
    pub async fn renew(&self) -> Result<i64, PgError> {
        let sent = Instant::now();
        let lease_ms = i64::try_from(self.lease_for.as_millis()).unwrap_or(i64::MAX) as f64;
        let mut client = self.pg.client().await?;
        let tx = client.transaction().await?;
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
        // Settlement numbers are kept long enough for any retry.
        tx.execute("DELETE FROM settlements WHERE node_id = $1 AND applied_at < now() - interval '1 day'", &[&self.node]).await?;
        let mine = tx
            .query(
                "UPDATE leases SET expires_at = now() + $2 * interval '1 millisecond' WHERE node_id = $1 RETURNING key_id, amount",
                &[&self.node, &lease_ms],
            )
            .await?;
        tx.commit().await?;
        self.pg.count(5);
        let mine: HashMap<String, i64> = mine.iter().map(|r| (r.get(0), r.get(1))).collect();
        let mut state = self.state.lock().await;
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

    /// Keep this node's share of the accounts in step until `stop` is set: every `every`
    /// (`store.sync_ms`), flush what is owed, renew the leases (reclaiming expired ones) and
    /// give back the leases of keys unused for half a lease. A failed round is logged and the
    /// next one retries it; meanwhile leases go stale at half their lifetime (fencing).
    pub async fn maintain(&self, every: Duration, mut stop: tokio::sync::watch::Receiver<bool>) {
        loop {
            if let Err(e) = self.round().await {
                log::warn!("store: accounts sync failed, retrying in {every:?}: {e}");
            }
            tokio::select! {
                _ = stop.changed() => {
                    if let Err(e) = self.flush().await {
                        log::error!("store: final flush of what this node owes failed: {e}");
                    }
                    return;
                }
                _ = tokio::time::sleep(every) => {}
            }
        }
    }

    async fn round(&self) -> Result<(), PgError> {
        self.flush().await?;
        self.renew().await?;
        let idle: Vec<String> = {
            let state = self.state.lock().await;
            // Unused for half a lease: its money goes back to the fleet.
            let quiet = |l: &Local| l.last_used.is_none_or(|t| t.elapsed() >= self.lease_for / 2);
            state.keys.iter().filter(|(_, l)| l.held == 0 && l.owed == 0 && l.lease > 0 && quiet(l)).map(|(k, _)| k.clone()).collect()
        };
        for key_id in idle {
            self.release_unused(&key_id).await?;
        }
        Ok(())
    }
}
