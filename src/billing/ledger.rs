//! Money: prices, holds, settlement and usage records — the rules, whatever the store.
//!
//! Balances are integers in nano-USD (1e-9 USD); no float touches a balance. A relayed
//! request first takes a *hold* (its estimated cost); it is admitted only while
//! `balance − held ≥ estimate`. When the response ends the hold is released and the real cost
//! is debited with its usage record, durable within `billing.commit_interval_ms`; with
//! `billing.sync_commit: true` the booking waits until its record is durable. Top-ups, video
//! charges and refunds, and bookings handed over by an old process always wait.
//!
//! Where money is kept is the [`MoneyStore`]'s business (`store::sled::money` on one node:
//! in-memory accounts, group commit into sled; `store::fleet` in a fleet: leases from the
//! shared database, a journal booked by the sync round).
//!
//! Invariant: a balance can fall below zero only through requests whose real cost exceeded
//! their hold, and by at most the sum of those overruns. The hold prices the request's full
//! output allowance (`max_tokens`, or the configured default) and its input at one token per
//! three bytes, so an overrun needs an upstream that exceeds `max_tokens` or a tokenizer that
//! packs more than one token in three bytes.

use crate::base::money::{usd, Multiplier};
use crate::records::audit::AuditEntry;
use crate::records::purse::{charged, Insufficient, Purse, PurseKind};
use crate::records::usage::{Grouping, ResponseOwner, Totals, UsageRecord};
use crate::store::ForwardBookings;
use crate::store::{MoneyStore, StoreError};
use std::collections::BTreeMap;

pub use super::prices::{PriceBook, TokenPrice};
use std::sync::Arc;

pub struct Ledger {
    money: Arc<dyn MoneyStore>,
    /// Bookings of relayed requests wait until their record is durable (`billing.sync_commit`).
    sync: bool,
}

/// A hold or a charge refused by the first purse that does not cover it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub kind: PurseKind,
    pub short: Insufficient,
    /// The purses it was asked of, given back (to be asked again for less).
    pub purses: Vec<Purse>,
}

impl Refused {
    /// The client's answer: 429 `budget_exceeded` with `Retry-After` (seconds to the window's
    /// end) for a window, 402 for a balance. `what` names the thing being paid for.
    pub fn to_api_error(&self, what: &str, now: u64) -> crate::protocol::ApiError {
        use crate::protocol::{ApiError, ErrorKind};
        let left = |s: &Insufficient| usd(s.available.max(0));
        match &self.kind {
            // A plan's spend never refuses (it is counted, not capped).
            PurseKind::Key | PurseKind::PlanSpend => self.short.to_api_error(what),
            PurseKind::Account(name) => ApiError::new(
                ErrorKind::InsufficientBalance,
                format!(
                    "Insufficient balance: {what} ${:.6}, the account '{name}' has ${:.6} available.",
                    usd(self.short.needed),
                    left(&self.short)
                ),
            ),
            PurseKind::Window { whose, window, end } => {
                let whose = whose.as_deref().unwrap_or("this API key");
                let mut e = ApiError::new(
                    ErrorKind::BudgetExceeded,
                    format!(
                        "The {} budget of {whose} is spent: {what} ${:.6}, ${:.6} is left until the window ends at {}.",
                        window.as_str(),
                        usd(self.short.needed),
                        left(&self.short),
                        crate::protocol::rfc3339(*end)
                    ),
                );
                e.retry_after = Some(end.saturating_sub(now).max(1));
                e
            }
            PurseKind::Rolling { whose, secs, frees_at, .. } => {
                let whose = whose.as_deref().unwrap_or("this API key");
                let label = crate::policy::budget::Rolling { secs: *secs, cap: 0 }.label();
                let when = frees_at.unwrap_or(now + 1).max(now + 1);
                let mut e = ApiError::new(
                    ErrorKind::BudgetExceeded,
                    format!(
                        "The rolling {label} budget of {whose} is spent: {what} ${:.6}, ${:.6} is left; enough of its spend ages out at {}.",
                        usd(self.short.needed),
                        left(&self.short),
                        crate::protocol::rfc3339(when)
                    ),
                );
                e.retry_after = Some(when - now);
                e
            }
        }
    }
}

/// Reserved money for one in-flight request, in every purse it is paid from. Dropped
/// unsettled, it is released untouched.
pub struct Hold {
    ledger: Arc<Ledger>,
    purses: Vec<Purse>,
    /// What is held: `list` at `rate`.
    amount: i64,
    /// What the call may cost at the price table.
    list: i64,
    /// The price multiplier it was admitted at (what its settlement charges).
    rate: Multiplier,
    done: bool,
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hold").field("purses", &self.purses).field("amount", &self.amount).finish()
    }
}

impl Hold {
    /// The money held, in nano-USD.
    pub fn amount(&self) -> i64 {
        self.amount
    }

    /// What the call may cost at the price table (the amount held before its multiplier).
    pub fn list(&self) -> i64 {
        self.list
    }

    /// The price multiplier the call was admitted at.
    pub fn rate(&self) -> Multiplier {
        self.rate
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if !self.done {
            self.ledger.money.release(&self.purses, self.amount);
        }
    }
}

impl Ledger {
    /// The ledger on a money store; `sync`: bookings of relayed requests wait for the disk.
    pub fn new(money: Arc<dyn MoneyStore>, sync: bool) -> Self {
        Ledger { money, sync }
    }

    /// A single node's ledger on a sled database, with the default commit policy.
    pub fn open(db: impl Into<crate::store::DbSlot>) -> Result<Self, StoreError> {
        Self::open_with(db, crate::config::CommitPolicy::default())
    }

    /// A single node's ledger on a sled database.
    pub fn open_with(db: impl Into<crate::store::DbSlot>, policy: crate::config::CommitPolicy) -> Result<Self, StoreError> {
        let money = crate::store::sled::money::SledMoney::open(&db.into(), policy)?;
        Ok(Self::new(Arc::new(money), policy.sync))
    }

    /// The store the money is kept in.
    pub fn money(&self) -> &Arc<dyn MoneyStore> {
        &self.money
    }

    /// A graceful stop: in a fleet, what is pending is booked and the leases are given back,
    /// so nothing waits for `lease_secs`. Nothing on a single node.
    pub async fn leave(&self) {
        self.money.leave().await
    }

    /// After the database is handed over, bookings go to `to` (the new process).
    pub fn set_handover(&self, to: Arc<dyn ForwardBookings>) {
        self.money.set_handover(to)
    }

    /// Give a new key its opening balance; an existing balance is kept. True if created.
    pub async fn open_account(&self, key_id: &str, initial: i64) -> Result<bool, StoreError> {
        self.money.open_account(key_id, initial).await
    }

    /// The durable balance (holds not subtracted). In a fleet: the database's, less what this
    /// node settled and has not booked yet.
    pub async fn balance(&self, key_id: &str) -> Result<i64, StoreError> {
        self.money.balance(key_id).await
    }

    /// What requests in flight on this node hold of a purse.
    pub fn held(&self, id: &str) -> i64 {
        self.money.held(id)
    }

    /// Reserve `amount` of the key's own balance alone if `balance − held` covers it.
    pub async fn hold(self: &Arc<Self>, key_id: &str, amount: i64) -> Result<Result<Hold, Insufficient>, StoreError> {
        Ok(self.hold_from(vec![Purse::key(key_id)], amount).await?.map_err(|r| r.short))
    }

    /// Reserve `amount` in every purse if each covers it (`balance + credit − held`), or in
    /// none: the first that does not answers (in a fleet: this node's leases, or more leased
    /// from the database).
    pub async fn hold_from(self: &Arc<Self>, purses: Vec<Purse>, amount: i64) -> Result<Result<Hold, Refused>, StoreError> {
        self.hold_priced(purses, amount, Multiplier::ONE).await
    }

    /// Reserve what a call of list cost `list` is charged at `rate` ([`Ledger::hold_from`]):
    /// a refusal's amounts are in charged money.
    pub async fn hold_priced(
        self: &Arc<Self>,
        purses: Vec<Purse>,
        list: i64,
        rate: Multiplier,
    ) -> Result<Result<Hold, Refused>, StoreError> {
        let list = list.max(0);
        let amount = rate.apply(list);
        Ok(match self.money.hold(&purses, amount).await? {
            Ok(()) => Ok(Hold { ledger: self.clone(), purses, amount, list, rate, done: false }),
            Err((i, short)) => {
                let mut refused = self.refused(&purses, i, short).await;
                refused.purses = purses;
                Err(refused)
            }
        })
    }

    /// The refusal of the purse `i` of `purses`: a rolling window's says when enough of its
    /// spend ages out (its buckets read oldest first, each freeing what it spent and holds at
    /// the time it stops counting).
    async fn refused(&self, purses: &[Purse], i: usize, short: Insufficient) -> Refused {
        let Some(purse) = purses.get(i) else { return Refused { kind: PurseKind::Key, short, purses: Vec::new() } };
        let mut kind = purse.kind.clone();
        if let PurseKind::Rolling { frees_at, .. } = &mut kind {
            let need = short.needed.saturating_sub(short.available);
            let mut freed = 0i64;
            for id in purse.linked().iter().rev().chain(std::iter::once(&purse.id)) {
                let spent = self.money.balance(id).await.unwrap_or(0).saturating_neg().saturating_add(self.money.held(id));
                freed = freed.saturating_add(spent.max(0));
                if freed >= need {
                    *frees_at = crate::policy::budget::window_start(id);
                    break;
                }
            }
        }
        Refused { kind, short, purses: Vec::new() }
    }

    /// Debit `record.cost_nanos` (a credit when negative) from its key and the purses it was
    /// `charged`, and store its record; with `wait`, return once the record is durable.
    /// Returns the key's new balance.
    async fn book(&self, record: UsageRecord, release: i64, wait: bool) -> Result<i64, StoreError> {
        match self.money.book(record, release, None, wait).await? {
            Ok(balance) => Ok(balance),
            // Unchecked bookings are never refused.
            Err(short) => Err(StoreError::Corrupt(format!("unchecked booking refused: {short:?}"))),
        }
    }

    /// Book a record forwarded by a process that handed its database over to this one
    /// (durable before it is acknowledged).
    pub async fn book_forwarded(&self, record: UsageRecord) -> Result<i64, StoreError> {
        self.book(record, 0, true).await
    }

    /// Release the hold and charge the real cost, with its record (durable within the commit
    /// window, or before this returns with `sync_commit`).
    pub async fn settle(&self, mut hold: Hold, mut record: UsageRecord) -> Result<i64, StoreError> {
        hold.done = true;
        record.charged = std::mem::take(&mut hold.purses).into_iter().filter(|p| p.kind != PurseKind::Key).map(|p| p.id).collect();
        // Where the hold was made (in a fleet, the node whose leases hold it).
        let ledger = hold.ledger.clone();
        ledger.book(record, hold.amount, ledger.sync).await
    }

    /// Charge a price at once (video submission) to the key alone when `balance − held`
    /// covers it: the check and the debit are one step. Durable before this returns.
    pub async fn charge(&self, record: UsageRecord) -> Result<Result<i64, Insufficient>, StoreError> {
        let purses = [Purse::key(&record.key_id)];
        Ok(self.charge_from(record, &purses).await?.map_err(|r| r.short))
    }

    /// Charge a price at once to every purse (the key's first among them) when each covers it;
    /// the checks and the debits are one step. The record says which purses it was charged
    /// (`charged`): a refund of it credits the same. Durable before this returns.
    pub async fn charge_from(&self, mut record: UsageRecord, purses: &[Purse]) -> Result<Result<i64, Refused>, StoreError> {
        record.charged = charged(purses);
        let booked = self.money.book(record, 0, Some(purses), true).await?;
        self.money.publish().await;
        Ok(match booked {
            Ok(balance) => Ok(balance),
            Err((i, short)) => Err(self.refused(purses, i, short).await),
        })
    }

    /// Credit (refund, top-up) or debit without a hold; the record says why. Durable before
    /// this returns.
    pub async fn adjust(&self, record: UsageRecord) -> Result<i64, StoreError> {
        let balance = self.book(record, 0, true).await?;
        self.money.publish().await;
        Ok(balance)
    }

    /// Balance change by an administrator: no usage record. Durable before this returns.
    pub async fn top_up(&self, key_id: &str, delta: i64) -> Result<i64, StoreError> {
        Ok(self.top_up_because(key_id, delta, None).await?.balance_after)
    }

    /// Balance change of a key or an account (`acct:<name>`) by an administrator, with its
    /// audit entry, written together. Durable before this returns.
    pub async fn top_up_because(&self, id: &str, delta: i64, reason: Option<&str>) -> Result<AuditEntry, StoreError> {
        self.money.top_up(id, delta, reason).await
    }

    /// [`Ledger::top_up_because`] once for `marks` (each with a value kept beside it),
    /// whatever the nodes, restarts or retries; None when any of them was made before.
    pub async fn top_up_once(&self, id: &str, delta: i64, reason: &str, marks: &[(&str, i64)]) -> Result<Option<AuditEntry>, StoreError> {
        self.money.top_up_once(id, delta, reason, marks).await
    }

    /// Write `mark` alone (no money moves); false when it was written before.
    pub async fn put_mark(&self, mark: &str, value: i64) -> Result<bool, StoreError> {
        self.money.put_mark(mark, value).await
    }

    /// How many marks begin with `prefix`.
    pub async fn count_marks(&self, prefix: &str) -> Result<u64, StoreError> {
        self.money.count_marks(prefix).await
    }

    /// The value kept with `mark`, if [`Ledger::top_up_once`] made it.
    pub async fn mark(&self, mark: &str) -> Result<Option<i64>, StoreError> {
        self.money.mark(mark).await
    }

    /// The audit trail, newest first: at most `limit` entries before `before` (a page's last
    /// entry's position).
    pub async fn audit(&self, limit: usize, before: Option<crate::records::log::Cursor>) -> Result<Vec<AuditEntry>, StoreError> {
        self.money.audit(limit, before).await
    }

    /// Return once every booking made before this call is durable (read-your-writes for
    /// `/v1/usage`; a graceful stop).
    pub async fn commit_now(&self) -> Result<(), StoreError> {
        self.money.commit().await
    }

    /// A clean stop or a hand-over: everything booked is durable and in the database's own
    /// files (the commit journal empty: nothing to apply again at the next start).
    pub async fn checkpoint(&self) -> Result<(), StoreError> {
        self.money.checkpoint().await
    }

    /// Before the database is released to a new process: from now on bookings go through the
    /// hand-over socket; returns once everything booked before is on disk.
    pub async fn hand_over(&self) -> Result<(), StoreError> {
        self.money.hand_over().await
    }

    /// The writer's counters (queued, committed, flushes, failed).
    pub fn commit_stats(&self) -> &crate::store::commit::CommitStats {
        self.money.commit_stats()
    }

    /// Totals and per-model rows of a key's records with `start_ms <= time_ms < end_ms`, every
    /// node's in a fleet.
    pub async fn usage_summary(&self, key_id: &str, start_ms: u64, end_ms: u64) -> Result<(Totals, BTreeMap<String, Totals>), StoreError> {
        self.money.usage_summary(key_id, start_ms, end_ms, &Grouping::Model).await
    }

    /// Totals and rows by `by` (a model, or a tag's value) of a key's records in the window.
    pub async fn usage_grouped(
        &self,
        key_id: &str,
        start_ms: u64,
        end_ms: u64,
        by: &Grouping,
    ) -> Result<(Totals, BTreeMap<String, Totals>), StoreError> {
        self.money.usage_summary(key_id, start_ms, end_ms, by).await
    }

    /// A key's usage report (`/v1/usage`, and `GET /admin/keys/{id}/usage`): its records in
    /// `[start_ms, end_ms)` by `by`, its balance (a member's key without an allowance: its
    /// team's account's) and its spend windows. What was booked before
    /// is committed first (read your writes).
    pub async fn key_usage(
        &self,
        key: &crate::records::key::KeyRecord,
        start_ms: u64,
        end_ms: u64,
        by: &Grouping,
        calendar: &crate::policy::budget::Calendar,
    ) -> Result<serde_json::Value, StoreError> {
        self.commit_now().await?;
        let (total, rows) = self.usage_grouped(&key.id, start_ms, end_ms, by).await?;
        // A member's key without an allowance spends its team's account: that is its balance.
        let balance = match key.member_of().filter(|_| key.spends_team_alone()) {
            Some(team) => self.balance(&crate::policy::budget::account_purse(team)).await?,
            None => self.balance(&key.id).await?,
        };
        let budgets = window_report(self, crate::records::purse::window_owner(key), &key.policy.budgets, calendar).await?;
        Ok(usage_report(key, balance, &total, &rows, by, budgets))
    }

    /// Delete records older than `before_ms`, and the response owners they made. Returns how
    /// many records. Pruning never changes a balance.
    pub async fn prune(&self, before_ms: u64) -> Result<usize, StoreError> {
        self.money.prune(before_ms).await
    }

    /// Who created the stored response `id` (None: nobody known, or the record expired).
    /// Bookings not yet committed are committed first when it is not found.
    pub async fn response_owner(&self, id: &str) -> Result<Option<ResponseOwner>, StoreError> {
        if let Some(found) = self.money.response_owner(id).await? {
            return Ok(Some(found));
        }
        self.commit_now().await?;
        self.money.response_owner(id).await
    }

    /// The response `id` was deleted upstream: forget its owner.
    pub async fn forget_response(&self, id: &str) -> Result<(), StoreError> {
        self.money.forget_response(id).await
    }
}

/// `start` and `end` (unix seconds) of a usage query string, as a millisecond window
/// (`start <= time_ms < end`; the whole history by default), and its `group_by` (`model` by
/// default, or `tag:<name>`).
pub fn usage_window(query: Option<&str>) -> Result<(u64, u64), crate::protocol::ApiError> {
    let (mut start, mut end) = (0u64, u64::MAX);
    for pair in query.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let parse = || {
            value.parse::<u64>().map_err(|_| {
                crate::protocol::ApiError::new(crate::protocol::ErrorKind::BadRequest, format!("{name}: must be a unix time in seconds"))
                    .with_param(name)
            })
        };
        match name {
            "start" => start = parse()?.saturating_mul(1000),
            "end" => end = parse()?.saturating_mul(1000),
            _ => {}
        }
    }
    Ok((start, end))
}

/// A usage query's `group_by`: `model` (the default), `route` or `tag:<name>`; the 400 otherwise.
pub fn usage_grouping(query: Option<&str>) -> Result<Grouping, crate::protocol::ApiError> {
    match query.unwrap_or_default().split('&').find_map(|p| p.strip_prefix("group_by=")) {
        None => Ok(Grouping::Model),
        Some(text) => Grouping::parse(text).ok_or_else(|| {
            crate::protocol::ApiError::new(
                crate::protocol::ErrorKind::BadRequest,
                format!("group_by: model, route or tag:<name>, not '{text}'"),
            )
            .with_param("group_by")
        }),
    }
}

/// The body of a key's usage report (see [`Ledger::key_usage`]): rows per model (`models`) or
/// per value of a tag (`tags`, `value` null for records without it), and the key's spend
/// windows.
fn usage_report(
    key: &crate::records::key::KeyRecord,
    balance: i64,
    total: &Totals,
    rows: &BTreeMap<String, Totals>,
    by: &Grouping,
    budgets: serde_json::Value,
) -> serde_json::Value {
    let row = |label: &str, t: &Totals| {
        let mut row = t.to_json();
        match by {
            Grouping::Model => row["model"] = serde_json::json!(label),
            Grouping::Route => row["route"] = serde_json::json!(label),
            Grouping::Provider => row["provider"] = serde_json::json!(label),
            Grouping::Day(_) => row["day"] = serde_json::json!(label),
            Grouping::Charged(..) => row["line"] = serde_json::json!(label),
            Grouping::Tag(name) => {
                row["tag"] = serde_json::json!(name);
                row["value"] = if label.is_empty() { serde_json::Value::Null } else { serde_json::json!(label) };
            }
        }
        row
    };
    let rows: Vec<serde_json::Value> = rows.iter().map(|(label, t)| row(label, t)).collect();
    let mut report = serde_json::json!({
        "object": "usage",
        "key": {"name": key.name, "group": key.group},
        "balance": usd(balance),
        "total": total.to_json(),
        "budgets": budgets,
    });
    match by {
        Grouping::Model => report["models"] = serde_json::json!(rows),
        Grouping::Route => report["routes"] = serde_json::json!(rows),
        Grouping::Provider => report["providers"] = serde_json::json!(rows),
        Grouping::Day(_) => report["days"] = serde_json::json!(rows),
        Grouping::Charged(..) => report["lines"] = serde_json::json!(rows),
        Grouping::Tag(name) => {
            report["group_by"] = serde_json::json!(format!("tag:{name}"));
            report["tags"] = serde_json::json!(rows);
        }
    }
    report
}

/// Each spend window with a cap: the cap, what the window has spent so far, what requests in
/// flight on this node hold of it, and when it started and ends (`billing.timezone`); a
/// rolling window, when its oldest spend next ages out.
pub async fn window_report(
    ledger: &Ledger,
    owner: crate::policy::budget::Owner<'_>,
    budgets: &crate::policy::budget::Budgets,
    calendar: &crate::policy::budget::Calendar,
) -> Result<serde_json::Value, StoreError> {
    let now = crate::base::clock::now_unix();
    let mut out = serde_json::Map::new();
    for (window, cap) in budgets.caps() {
        let (start, end) = calendar.window(window, now);
        let id = crate::policy::budget::window_purse(&owner, window, start);
        let spent = ledger.balance(&id).await?.saturating_neg();
        out.insert(
            window.as_str().to_string(),
            serde_json::json!({
                "cap": usd(cap), "spent": usd(spent), "held": usd(ledger.held(&id)),
                "start": crate::protocol::rfc3339(start), "end": crate::protocol::rfc3339(end),
                "timezone": calendar.name(),
            }),
        );
    }
    for rolling in &budgets.rolling {
        // Oldest bucket first: the first with spend is what ages out next.
        let mut buckets: Vec<(u64, u64)> = rolling.buckets(now).collect();
        buckets.reverse();
        let (mut spent, mut held, mut next) = (0i64, 0i64, None);
        for (_, until) in buckets {
            let id = crate::policy::budget::rolling_purse(&owner, rolling.secs, until);
            let (s, h) = (ledger.balance(&id).await?.saturating_neg(), ledger.held(&id));
            if next.is_none() && s.saturating_add(h) > 0 {
                next = Some(until);
            }
            spent = spent.saturating_add(s);
            held = held.saturating_add(h);
        }
        out.insert(
            rolling.label(),
            serde_json::json!({
                "cap": usd(rolling.cap), "spent": usd(spent), "held": usd(held), "rolling": true,
                "bucket_secs": rolling.bucket(),
                "next_frees_at": next.map(crate::protocol::rfc3339),
            }),
        );
    }
    Ok(serde_json::Value::Object(out))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::base::usage::Usage;
    use crate::config::Price;

    /// Every record of a key in a single node's database, read from its tree.
    pub(crate) fn records(db: &sled::Db, key_id: &str) -> Result<Vec<UsageRecord>, StoreError> {
        let mut prefix = key_id.as_bytes().to_vec();
        prefix.push(0);
        let mut out = Vec::new();
        for item in db.open_tree("usage_records")?.scan_prefix(prefix) {
            let (_, v) = item?;
            out.extend(crate::store::usage_codec::decode_records(&v)?);
        }
        Ok(out)
    }

    /// A usage record for tests (also the hand-over tests').
    pub(crate) fn record(key: &str, model: &str, cost: i64, t: u64) -> UsageRecord {
        UsageRecord {
            time_ms: t,
            input_tokens: 10,
            cached_tokens: 2,
            output_tokens: 5,
            cost_nanos: cost,
            latency_ms: 1,
            attempts: 0,
            ..UsageRecord::new(key, model, "openai", "chat_completions")
        }
    }

    #[tokio::test]
    async fn a_rolling_window_counts_its_earlier_buckets_and_says_when_enough_ages_out() {
        use crate::policy::budget::{Budgets, Calendar, Rolling};
        use crate::records::key::{KeyOrigin, KeyRecord};
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("open");
        let ledger = Arc::new(Ledger::open(&db).expect("ledger"));
        ledger.open_account("k", 100_000).await.expect("open");
        // 5 hours, $0.000010: 10-minute buckets, 30 earlier ones.
        let rolling = Rolling { secs: 5 * 3600, cap: 10_000 };
        assert_eq!((rolling.bucket(), rolling.earlier()), (600, 30));
        let mut key = KeyRecord::new("k", "k", "default", String::new(), KeyOrigin::Config);
        key.policy.budgets = Budgets { rolling: vec![rolling], ..Default::default() };
        let calendar = Calendar::default();
        let t0: u64 = 1_799_999_400; // a 10-minute bucket starts
        assert_eq!(t0 % 600, 0);
        let purses_at = |t: u64| crate::records::purse::purses(&key, None, (&[], &[]), &calendar, t);
        // Spent 6,000 in the first bucket.
        let hold = ledger.hold_from(purses_at(t0 + 5), 6_000).await.expect("db").expect("held");
        ledger.settle(hold, record("k", "m", 6_000, t0 * 1000)).await.expect("settle");
        // Two hours later, in another bucket: 4,000 left; 5,000 is refused until the first
        // bucket ages out, 5 hours and one bucket after it began.
        let later = t0 + 7_200;
        assert!(ledger.hold_from(purses_at(later), 4_000).await.expect("db").is_ok());
        let refused = ledger.hold_from(purses_at(later), 5_000).await.expect("db").expect_err("over the cap");
        let PurseKind::Rolling { frees_at, secs, .. } = refused.kind else { panic!("{refused:?}") };
        assert_eq!((secs, frees_at), (5 * 3600, Some(t0 + 5 * 3600 + 600)));
        let e = refused.to_api_error("this request may cost up to", later);
        assert_eq!(e.retry_after, Some(5 * 3600 + 600 - 7_200));
        // Held in parallel: the holds in flight count too (none admitted past the cap).
        let mut admitted = Vec::new();
        for _ in 0..10 {
            if let Ok(h) = ledger.hold_from(purses_at(later), 1_000).await.expect("db") {
                admitted.push(h);
            }
        }
        assert_eq!(admitted.len(), 4);
        drop(admitted);
        // Past it, the first bucket no longer counts.
        let aged = t0 + 5 * 3600 + 600;
        assert!(ledger.hold_from(purses_at(aged), 10_000).await.expect("db").is_ok());
        assert!(ledger.hold_from(purses_at(aged - 1), 10_000).await.expect("db").is_err());
    }

    #[tokio::test]
    async fn a_call_settled_after_its_bucket_turned_is_seen_by_the_next_hold() {
        use crate::policy::budget::{Budgets, Calendar, Rolling};
        use crate::records::key::{KeyOrigin, KeyRecord};
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("open");
        let ledger = Arc::new(Ledger::open(&db).expect("ledger"));
        ledger.open_account("k", 100_000).await.expect("open");
        let mut key = KeyRecord::new("k", "k", "default", String::new(), KeyOrigin::Config);
        key.policy.budgets = Budgets { rolling: vec![Rolling { secs: 5 * 3600, cap: 10_000 }], ..Default::default() };
        let calendar = Calendar::default();
        let purses_at = |t: u64| crate::records::purse::purses(&key, None, (&[], &[]), &calendar, t);
        // Held in the bucket before this one (10-minute buckets), still in flight.
        let now = crate::base::clock::now_unix();
        let early = ledger.hold_from(purses_at(now - 600), 8_000).await.expect("db").expect("held");
        // The current bucket sees it: 2,000 left (and keeps the earlier buckets' sum).
        assert!(ledger.hold_from(purses_at(now), 3_000).await.expect("db").is_err());
        // It settles for 1,000: the next hold sees the 7,000 given back.
        ledger.settle(early, record("k", "m", 1_000, (now - 600) * 1000)).await.expect("settle");
        assert!(ledger.hold_from(purses_at(now), 3_000).await.expect("db").is_ok());
    }

    #[tokio::test]
    async fn the_balance_is_rebuilt_from_the_newest_record() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let db = sled::open(dir.path()).expect("open");
            let ledger = Arc::new(Ledger::open(&db).expect("ledger"));
            ledger.open_account("k", 1000).await.expect("open");
            ledger.settle(ledger.hold("k", 0).await.expect("db").expect("ok"), record("k", "m", 100, 1)).await.expect("settle");
            // Bookings do not rewrite the balance entry: it still says 1000.
            assert_eq!(
                crate::store::sled::money::decode_balance(&db.open_tree("balances").expect("tree").get("k").expect("get").expect("entry"))
                    .expect("decode")
                    .0,
                1000
            );
            db.flush().expect("flush");
        }
        let db = crate::store::db::reopen(dir.path());
        let ledger = Ledger::open(&db).expect("ledger");
        assert_eq!(ledger.balance("k").await.expect("balance"), 900);
    }

    #[tokio::test]
    async fn bookings_reach_the_disk_within_the_window_or_before_settle_returns_with_sync_commit() {
        use crate::config::CommitPolicy;
        use std::time::Duration;
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("open");
        // Default mode, with a window long enough to look inside it.
        let ledger = Arc::new(Ledger::open_with(&db, CommitPolicy { interval: Duration::from_secs(3600), sync: false }).expect("ledger"));
        ledger.open_account("k", 1000).await.expect("open");
        let balance = ledger.settle(ledger.hold("k", 100).await.expect("db").expect("ok"), record("k", "m", 100, 1)).await.expect("settle");
        // The balance moved at once; the record is queued, not yet written.
        assert_eq!(balance, 900);
        assert_eq!(ledger.balance("k").await.expect("balance"), 900);
        assert_eq!(ledger.commit_stats().committed.load(std::sync::atomic::Ordering::SeqCst), 0);
        assert!(records(&db, "k").expect("records").is_empty());
        // A top-up waits for the disk, and so for everything queued before it.
        assert_eq!(ledger.top_up("k", 50).await.expect("top up"), 950);
        assert_eq!(records(&db, "k").expect("records").len(), 1);
        drop(ledger);

        let ledger = Arc::new(Ledger::open_with(&db, CommitPolicy { interval: Duration::from_secs(3600), sync: true }).expect("ledger"));
        ledger.settle(ledger.hold("k", 100).await.expect("db").expect("ok"), record("k", "m", 100, 2)).await.expect("settle");
        assert_eq!(
            ledger.commit_stats().committed.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "sync_commit: on disk before settle returns"
        );
        assert_eq!(records(&db, "k").expect("records").len(), 2);
        assert_eq!(ledger.balance("k").await.expect("balance"), 850);
    }

    /// Records written one per entry (before batches were grouped) and grouped entries are
    /// read alike: balance, summary windows, pruning.
    #[tokio::test]
    async fn single_record_entries_and_grouped_entries_read_alike() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("open");
        {
            // An entry as older versions wrote it: one JSON object, balance 900 after seq 5.
            let mut old = record("k", "a", 100, 1_000);
            old.seq = 5;
            old.balance_after = 900;
            let mut key = b"k\0".to_vec();
            key.extend_from_slice(&1_000u64.to_be_bytes());
            key.extend_from_slice(&0u64.to_be_bytes());
            db.open_tree("usage_records").expect("tree").insert(key, serde_json::to_vec(&old).expect("json")).expect("insert");
            db.open_tree("balances").expect("tree").insert("k", &crate::store::sled::money::encode_balance(1_000, 1)[..]).expect("insert");
        }
        let ledger = Arc::new(Ledger::open(&db).expect("ledger"));
        assert_eq!(ledger.balance("k").await.expect("balance"), 900, "the old record is the newest booking");
        for t in [2_000u64, 2_500, 3_000] {
            ledger.settle(ledger.hold("k", 0).await.expect("db").expect("ok"), record("k", "b", 10, t)).await.expect("settle");
        }
        ledger.commit_now().await.expect("commit");
        assert_eq!(db.open_tree("usage_records").expect("tree").len(), 2, "the three new records share one entry");
        let (all, _) = ledger.usage_summary("k", 0, u64::MAX).await.expect("summary");
        assert_eq!((all.requests, all.cost_nanos), (4, 130));
        let (window, by_model) = ledger.usage_summary("k", 2_400, 3_000).await.expect("summary");
        assert_eq!((window.requests, by_model.len()), (1, 1), "records inside a grouped entry are filtered by time");
        assert_eq!(ledger.prune(2_600).await.expect("prune"), 1, "only the old entry: the grouped one still has a newer record");
        assert_eq!(ledger.prune(5_000).await.expect("prune"), 3);
        drop(ledger);
        assert_eq!(Ledger::open(&db).expect("ledger").balance("k").await.expect("balance"), 870);
    }

    #[tokio::test]
    async fn a_hand_over_commits_what_was_queued_and_forwards_what_comes_after() {
        use crate::config::CommitPolicy;
        use std::time::Duration;
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("open");
        let ledger = Arc::new(Ledger::open_with(&db, CommitPolicy { interval: Duration::from_secs(3600), sync: false }).expect("ledger"));
        ledger.open_account("k", 1000).await.expect("open");
        ledger.settle(ledger.hold("k", 0).await.expect("db").expect("ok"), record("k", "m", 10, 1)).await.expect("settle");
        ledger.hand_over().await.expect("hand over");
        assert_eq!(records(&db, "k").expect("records").len(), 1, "queued before the hand-over: committed");
        // After it, bookings go to the new process; with no socket configured they fail
        // loudly instead of writing to a database this process no longer owns.
        let after = ledger.settle(ledger.hold("k", 0).await.expect("db").expect("ok"), record("k", "m", 10, 2)).await;
        assert!(matches!(after, Err(StoreError::Released)), "{after:?}");
        assert_eq!(records(&db, "k").expect("records").len(), 1);
    }

    #[test]
    fn prices_are_exact_integers() {
        let mut p = BTreeMap::new();
        p.insert("m".to_string(), Price { input: 1.25, output: 10.0, cached_input: Some(0.125), ..Price::default() });
        let book = PriceBook::new(&p);
        // USD 1.25 per 1M tokens is 1250 nano-USD a token.
        assert_eq!(book.cost("m", Usage { input: 1000, cached: 100, output: 50, ..Usage::default() }), 1_250_000 + 12_500 + 500_000);
        // Rounding to the nano-dollar: 3 tokens at USD 0.1234567/M = 370.37 → 370.
        p.insert("r".to_string(), Price { input: 0.1234567, output: 0.0, ..Price::default() });
        assert_eq!(PriceBook::new(&p).cost("r", Usage { input: 3, ..Usage::default() }), 370);
        assert_eq!(book.cost("m", Usage { input: 1_000_000, output: 1_000_000, ..Usage::default() }), 11_250_000_000);
        assert_eq!(book.cost("free", Usage { input: 5, output: 5, ..Usage::default() }), 0);
    }

    #[tokio::test]
    async fn a_booked_response_has_an_owner_until_deleted_or_pruned() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("open");
        let ledger = Arc::new(Ledger::open(&db).expect("ledger"));
        ledger.open_account("k", 1000).await.expect("open");
        let booked = |id: &str, t| UsageRecord { provider: Some("p1".into()), response_id: Some(id.into()), ..record("k", "m", 1, t) };
        for (id, t) in [("resp_old", 1_000), ("resp_new", 5_000), ("resp_gone", 5_000)] {
            ledger.settle(ledger.hold("k", 1).await.expect("db").expect("ok"), booked(id, t)).await.expect("settle");
        }
        // Queued, not yet committed: the lookup commits first.
        let owner = ledger.response_owner("resp_new").await.expect("read").expect("owner");
        assert_eq!(owner.key_id, "k");
        assert_eq!((owner.provider.as_str(), owner.model.as_str(), owner.time_ms), ("p1", "m", 5_000));
        let r = record("k", "m", 1, 5_000);
        assert_eq!(owner.context_tokens, r.input_tokens + r.cached_tokens + r.cache_write_tokens + r.output_tokens);
        assert_eq!(ledger.response_owner("resp_unknown").await.expect("read"), None);
        ledger.forget_response("resp_gone").await.expect("forget");
        assert_eq!(ledger.response_owner("resp_gone").await.expect("read"), None);
        ledger.prune(2_000).await.expect("prune");
        assert_eq!(ledger.response_owner("resp_old").await.expect("read"), None, "expires with its usage record");
        assert!(ledger.response_owner("resp_new").await.expect("read").is_some());
        // A record without a response id makes no owner.
        assert_eq!(records(&db, "k").expect("records").iter().filter(|r| r.response_id.is_some()).count(), 2);
    }

    #[tokio::test]
    async fn holds_settle_and_release() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("open");
        let ledger = Arc::new(Ledger::open(&db).expect("ledger"));
        assert!(ledger.open_account("k", 1000).await.expect("open"));
        assert!(!ledger.open_account("k", 5).await.expect("again"), "existing balance kept");
        let h1 = ledger.hold("k", 600).await.expect("db").expect("covered");
        assert_eq!(ledger.hold("k", 600).await.expect("db").unwrap_err(), Insufficient { available: 400, needed: 600 });
        drop(h1);
        let h2 = ledger.hold("k", 600).await.expect("db").expect("released hold frees the money");
        let bal = ledger.settle(h2, record("k", "m", 250, 5)).await.expect("settle");
        assert_eq!(bal, 750);
        assert_eq!(ledger.balance("k").await.expect("bal"), 750);
        // A zero-cost hold on an empty key is fine; a priced one is not.
        ledger.open_account("empty", 0).await.expect("open");
        assert!(ledger.hold("empty", 0).await.expect("db").is_ok());
        assert!(ledger.hold("empty", 1).await.expect("db").is_err());
    }

    #[tokio::test]
    async fn balances_and_records_survive_reopen_and_summaries_filter_by_time() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let db = sled::open(dir.path()).expect("open");
            let ledger = Arc::new(Ledger::open(&db).expect("ledger"));
            ledger.open_account("k", 10_000).await.expect("open");
            for (i, model) in ["a", "b", "a"].iter().enumerate() {
                let h = ledger.hold("k", 100).await.expect("db").expect("ok");
                ledger.settle(h, record("k", model, 100, 1000 * (i as u64 + 1))).await.expect("settle");
            }
            ledger.adjust(record("k", "a", -50, 4000)).await.expect("refund");
            ledger.settle(ledger.hold("other", 0).await.expect("db").expect("ok"), record("other", "a", 0, 1500)).await.expect("other");
        }
        let db = crate::store::db::reopen(dir.path());
        let ledger = Ledger::open(&db).expect("ledger");
        assert_eq!(ledger.balance("k").await.expect("bal"), 10_000 - 300 + 50);
        let (total, by_model) = ledger.usage_summary("k", 0, u64::MAX).await.expect("summary");
        assert_eq!(total.requests, 3, "a refund is not a request");
        assert_eq!(total.cost_nanos, 250);
        assert_eq!(total.input_tokens, 4 * 12);
        assert_eq!(by_model["a"].cost_nanos, 150);
        assert_eq!(by_model["b"].requests, 1);
        let (window, _) = ledger.usage_summary("k", 1500, 3500).await.expect("window");
        assert_eq!(window.requests, 2);
        assert_eq!(ledger.prune(2500).await.expect("prune"), 3, "two of k, one of other");
        assert_eq!(records(&db, "k").expect("records").len(), 2);
    }

    /// Retention never changes a balance: every record of a key pruned, the store reopened,
    /// the balance is the same.
    #[tokio::test]
    async fn pruning_every_record_keeps_the_balance() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let db = sled::open(dir.path()).expect("open");
            let ledger = Arc::new(Ledger::open(&db).expect("ledger"));
            ledger.open_account("k", 10_000).await.expect("open");
            for t in 1..=20u64 {
                let h = ledger.hold("k", 100).await.expect("db").expect("ok");
                ledger.settle(h, record("k", "m", 100, t)).await.expect("settle");
            }
            assert_eq!(ledger.balance("k").await.expect("bal"), 8_000);
            assert_eq!(ledger.prune(u64::MAX).await.expect("prune"), 20);
            assert!(records(&db, "k").expect("records").is_empty());
            db.flush().expect("flush");
        }
        let db = crate::store::db::reopen(dir.path());
        let ledger = Arc::new(Ledger::open(&db).expect("ledger"));
        assert_eq!(ledger.balance("k").await.expect("balance"), 8_000, "the spending is not given back");
        // Bookings after the checkpoint still win over it.
        ledger.settle(ledger.hold("k", 0).await.expect("db").expect("ok"), record("k", "m", 500, 30)).await.expect("settle");
        drop(ledger);
        drop(db);
        let db = crate::store::db::reopen(dir.path());
        assert_eq!(Ledger::open(&db).expect("ledger").balance("k").await.expect("balance"), 7_500);
    }

    /// `charge` checks and debits under one lock: of many concurrent charges that each fit
    /// the balance alone, only as many as it covers succeed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_charges_never_overdraw() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("open");
        let ledger = Arc::new(Ledger::open(&db).expect("ledger"));
        ledger.open_account("v", 1_000).await.expect("open");
        let tasks: Vec<_> = (0..32)
            .map(|i| {
                let l = ledger.clone();
                tokio::spawn(async move { l.charge(record("v", "genq", 300, i)).await.expect("db").is_ok() })
            })
            .collect();
        let mut charged = 0;
        for t in tasks {
            charged += usize::from(t.await.expect("join"));
        }
        assert_eq!(charged, 3);
        assert_eq!(ledger.balance("v").await.expect("bal"), 100);
    }

    #[test]
    fn money_arithmetic_saturates_and_cache_writes_are_priced_apart() {
        let mut p = BTreeMap::new();
        p.insert(
            "m".to_string(),
            Price { input: 3.0, output: 15.0, cached_input: Some(0.3), cache_write_input: Some(3.75), ..Price::default() },
        );
        p.insert("dear".to_string(), Price { input: 1e6, output: 1e6, ..Price::default() });
        let book = PriceBook::new(&p);
        let u = Usage { input: 1_000_000, cached: 1_000_000, cache_write: 1_000_000, output: 1_000_000 };
        assert_eq!(book.cost("m", u), 3_000_000_000 + 300_000_000 + 3_750_000_000 + 15_000_000_000);
        let huge = Usage { input: u64::MAX, cached: u64::MAX, cache_write: u64::MAX, output: u64::MAX };
        assert_eq!(book.cost("dear", huge), i64::MAX);
        assert_eq!(book.hold_cost("dear", u64::MAX, u64::MAX), Some(i64::MAX));
        assert_eq!(book.hold_cost("m", 1_000_000, 0), Some(3_750_000_000), "input held at the dearest input price");
        assert_eq!(book.hold_cost("unpriced", 1, 1), None);
    }

    /// Property: the hold of a request never falls below the cost of any answer its limits
    /// allow (input up to the hold's estimate, split any way between plain, cached and
    /// cache-write tokens; output up to the allowance).
    #[test]
    fn the_hold_covers_every_answer_the_limits_allow() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for _ in 0..5_000 {
            let price = |rng: &mut rand::rngs::StdRng| (rng.gen_range(0..=200_000) as f64) / 1000.0;
            let mut p = BTreeMap::new();
            let cached = rng.gen_bool(0.5).then(|| price(&mut rng));
            let write = rng.gen_bool(0.5).then(|| price(&mut rng));
            p.insert(
                "m".to_string(),
                Price {
                    input: price(&mut rng),
                    output: price(&mut rng),
                    cached_input: cached,
                    cache_write_input: write,
                    ..Price::default()
                },
            );
            let book = PriceBook::new(&p);
            let body_len = rng.gen_range(0..40_000_000usize);
            let allowance = rng.gen_range(0..=crate::base::usage::MAX_OUTPUT_ALLOWANCE) * rng.gen_range(1..=128);
            let input_max = crate::billing::hold_input_tokens(body_len);
            let hold = book.hold_cost("m", input_max, allowance).expect("priced");
            let plain = rng.gen_range(0..=input_max);
            let cached_n = rng.gen_range(0..=input_max - plain);
            let write_n = input_max - plain - cached_n;
            let usage = Usage { input: plain, cached: cached_n, cache_write: write_n, output: rng.gen_range(0..=allowance) };
            // Each term is rounded apart: allow one nano-dollar of rounding per term.
            assert!(book.cost("m", usage) <= hold + 3, "{usage:?} costs more than the hold {hold}");
        }
    }
}
