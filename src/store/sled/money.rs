//! Money on one node: trees `balances`, `usage_records` and `response_owners`.
//!
//! The in-memory account (balance and what is held) is the authoritative one while the process
//! runs; every admission decision and every debit is made under one lock. A booking queues its
//! usage record to the one writer (`commit`), which makes it durable within
//! `billing.commit_interval_ms` (or before the booking returns when it waits).
//!
//! No sled transaction or batch is used anywhere: in sled 0.34 either switches the whole
//! database to a lock mode in which a concurrent `flush` can deadlock (seen under load).
//! Instead every booking takes a persistent sequence number and writes one usage record that
//! carries it and the balance after it (the records of one key committed in one batch share
//! a sled entry, a JSON array keyed by the first one's time and sequence); the balance entry
//! `(balance, seq)` is written only by top-ups and repairs. Loading an account takes the newer
//! of the balance entry and the key's newest record, so a booking is one insert and can never
//! be half done.

use crate::records::audit::AuditEntry;
use crate::records::purse::{Insufficient, Purse};
use crate::records::usage::{Grouping, ResponseOwner, Totals, UsageRecord};
use crate::store::ForwardBookings;
use crate::store::{DbSlot, MoneyStore, StoreError};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Debug, Default, Clone, Copy)]
struct Account {
    balance: i64,
    held: i64,
    /// When the rolling window bucket it is stops being its window's current one (0: not a
    /// rolling bucket, or not known yet); read from its id once, when it is loaded.
    turns_at: u64,
}

/// [`Account::turns_at`] of the purse `id`.
fn turns_at(id: &str) -> u64 {
    match id.starts_with("win:") {
        true => crate::policy::budget::rolling_current_until(id).unwrap_or(0),
        false => 0,
    }
}

impl Account {
    /// Whether `balance + credit − held` covers `amount` (a positive amount needs a positive
    /// remainder). A purse in debt (negative remainder) is refused even what holds nothing,
    /// until topped up (or its window ends).
    fn covers(&self, amount: i64, credit: i64) -> Result<(), Insufficient> {
        let available = self.balance.saturating_add(credit).saturating_sub(self.held);
        if available < amount || (amount > 0 && available <= 0) || available < 0 {
            return Err(Insufficient { available, needed: amount });
        }
        Ok(())
    }
}

use crate::store::usage_codec::decode_records;

/// The in-memory accounts by purse id (a key id, an account's or a window's name).
type Purses = HashMap<String, Account, ahash::RandomState>;

/// Outcome of the locked part of a booking.
enum Queued {
    /// The purse at this index of the check does not cover the cost.
    Refused(usize, Insufficient),
    /// The database belongs to the new process: forward the booking.
    HandedOver(Box<UsageRecord>),
    /// The new balance, and the waiter when the booking waits for the disk.
    Booked(i64, Option<crate::store::commit::Waiter>),
}

/// A balance entry: the balance and the sequence number of the booking that set it.
pub(crate) fn encode_balance(balance: i64, seq: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&balance.to_be_bytes());
    out[8..].copy_from_slice(&seq.to_be_bytes());
    out
}

pub(crate) fn decode_balance(bytes: &[u8]) -> Result<(i64, u64), StoreError> {
    let corrupt = || StoreError::Corrupt("balance entry is not 16 bytes".into());
    let balance: [u8; 8] = bytes.get(..8).and_then(|b| b.try_into().ok()).ok_or_else(corrupt)?;
    let seq: [u8; 8] = bytes.get(8..16).and_then(|b| b.try_into().ok()).ok_or_else(corrupt)?;
    Ok((i64::from_be_bytes(balance), u64::from_be_bytes(seq)))
}

/// The money of one node.
pub struct SledMoney {
    slot: DbSlot,
    /// The one writer of balance entries and usage records.
    writer: crate::store::commit::Writer,
    /// Set (under the accounts lock) once the database is being handed to a new process:
    /// every later booking goes through the hand-over socket.
    handing_over: std::sync::atomic::AtomicBool,
    accounts: Mutex<Purses>,
    seq: AtomicU64,
    /// Where bookings go once the database was handed over (upgrade); injected at start.
    handover: std::sync::OnceLock<Arc<dyn ForwardBookings>>,
    /// What a rolling window's earlier buckets spent and hold, by its current bucket, and the
    /// [`Self::earlier_epoch`] it was summed at (read and written under the accounts lock).
    earlier_sums: Mutex<HashMap<String, (i64, u64), ahash::RandomState>>,
    /// Moved (under the accounts lock) whenever a bucket that is no longer the current one of
    /// its window changes — a call held before its bucket turned, settling after — so no sum
    /// above is used stale. The current bucket's own change is read as it is, never summed.
    earlier_epoch: AtomicU64,
    /// The marks this process wrote ([`MoneyStore::top_up_once`]), read and written under the
    /// accounts lock: a mark queued to the writer counts before it reaches the tree.
    marks: Mutex<HashMap<String, i64>>,
}

impl SledMoney {
    pub fn open(slot: &DbSlot, policy: crate::config::CommitPolicy) -> Result<Self, StoreError> {
        slot.tree("balances")?;
        slot.tree("usage_records")?;
        let writer = crate::store::commit::Writer::start(slot.clone(), policy.interval, !policy.sync)
            .map_err(|e| StoreError::Corrupt(format!("cannot start the commit writer: {e}")))?;
        Ok(SledMoney {
            writer,
            handing_over: std::sync::atomic::AtomicBool::new(false),
            slot: slot.clone(),
            accounts: Mutex::new(Purses::default()),
            seq: AtomicU64::new(0),
            handover: std::sync::OnceLock::new(),
            earlier_sums: Mutex::default(),
            earlier_epoch: AtomicU64::new(0),
            marks: Mutex::new(HashMap::new()),
        })
    }

    fn balances(&self) -> Result<sled::Tree, StoreError> {
        self.slot.tree("balances")
    }

    fn records_tree(&self) -> Result<sled::Tree, StoreError> {
        self.slot.tree("usage_records")
    }

    fn accounts(&self) -> std::sync::MutexGuard<'_, Purses> {
        self.accounts.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn load(&self, map: &mut Purses, key_id: &str) -> Result<Account, StoreError> {
        self.with(map, key_id, |a| *a)
    }

    /// A top-up and its audit entry, durable before this returns; with a mark, only when the
    /// mark was never written (None: it was), the mark written in the same commit.
    async fn top_up_marked(
        &self,
        id: &str,
        delta: i64,
        reason: Option<&str>,
        marks: &[(&str, i64)],
    ) -> Result<Option<AuditEntry>, StoreError> {
        use crate::store::commit::TreeName;
        let (entry, waiter) = {
            let mut map = self.accounts();
            if !marks.is_empty() {
                let mut written = self.marks.lock().unwrap_or_else(|p| p.into_inner());
                let tree = self.slot.tree(crate::store::commit::MARKS)?;
                for (mark, _) in marks {
                    if written.contains_key(*mark) || tree.contains_key(mark.as_bytes())? {
                        return Ok(None);
                    }
                }
                written.extend(marks.iter().map(|(m, v)| (m.to_string(), *v)));
            }
            let mut acc = self.load(&mut map, id)?;
            acc.balance = acc.balance.saturating_add(delta);
            self.changed(id);
            let seq = self.slot.db()?.generate_id()? + 1;
            let entry = AuditEntry::new(id, delta, acc.balance, reason);
            let mut audit_key = entry.time_ms.to_be_bytes().to_vec();
            audit_key.extend_from_slice(&seq.to_be_bytes());
            let value = serde_json::to_vec(&entry).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            // The audit entry, the balance and the mark: in one batch, all or none.
            let mut entries = vec![
                (TreeName::Audit, audit_key, value),
                (TreeName::Balances, id.as_bytes().to_vec(), encode_balance(acc.balance, seq).to_vec()),
            ];
            for (mark, value) in marks {
                entries.push((TreeName::Marks, mark.as_bytes().to_vec(), value.to_be_bytes().to_vec()));
            }
            let waiter = self.writer.insert_together(entries, true)?;
            map.insert(id.to_string(), acc);
            (entry, waiter)
        };
        if let Some(waiter) = waiter {
            waiter.wait().await?;
        }
        Ok(Some(entry))
    }

    /// What a purse may go below zero: its credit, less what its linked purses (a rolling
    /// window's earlier buckets) spent and hold — read under the caller's lock.
    /// The earlier buckets' sum is kept per current bucket and summed again only after one of
    /// them changed.
    fn credit(&self, map: &mut Purses, purse: &Purse) -> Result<i64, StoreError> {
        if purse.linked().is_empty() {
            return Ok(purse.credit);
        }
        let epoch = self.earlier_epoch.load(Ordering::Acquire);
        let mut sums = self.earlier_sums.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&(sum, at)) = sums.get(&purse.id) {
            if at == epoch {
                return Ok(purse.credit.saturating_add(sum));
            }
        }
        let mut sum = 0i64;
        for id in purse.linked() {
            let acc = self.load(map, id)?;
            sum = sum.saturating_add(acc.balance).saturating_sub(acc.held);
        }
        // Sums of buckets that turned are dropped now and then.
        if sums.len() >= 4096 {
            sums.clear();
        }
        sums.insert(purse.id.clone(), (sum, epoch));
        Ok(purse.credit.saturating_add(sum))
    }

    /// `id` changed: when it is a rolling window's bucket that is no longer the current one,
    /// the kept sums of earlier buckets are stale.
    fn changed(&self, id: &str) {
        let at = turns_at(id);
        let earlier = at != 0 && at <= crate::base::clock::now_unix();
        if earlier {
            self.earlier_epoch.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Apply `f` to the purse's account, loaded first if this process has not seen it yet
    /// (one map lookup when it has).
    fn with<R>(&self, map: &mut Purses, id: &str, f: impl FnOnce(&mut Account) -> R) -> Result<R, StoreError> {
        if let Some(a) = map.get_mut(id) {
            return Ok(f(a));
        }
        let mut a = self.read_account(id)?;
        let r = f(&mut a);
        map.insert(id.to_string(), a);
        Ok(r)
    }

    /// A purse's balance as the database has it.
    fn read_account(&self, key_id: &str) -> Result<Account, StoreError> {
        let (mut balance, seq) = match self.balances()?.get(key_id.as_bytes())? {
            Some(b) => decode_balance(&b)?,
            None => (0, 0),
        };
        // A record newer than the balance entry means the process stopped between the two
        // writes of a booking: the record's balance is the right one.
        if let Some(newest) = self.newest_record(key_id)? {
            if newest.seq > seq {
                balance = newest.balance_after;
            }
        }
        Ok(Account { balance, held: 0, turns_at: turns_at(key_id) })
    }

    /// The key's record with the highest sequence number among its latest few.
    fn newest_record(&self, key_id: &str) -> Result<Option<UsageRecord>, StoreError> {
        let mut prefix = key_id.as_bytes().to_vec();
        prefix.push(0);
        let mut newest: Option<UsageRecord> = None;
        for item in self.records_tree()?.scan_prefix(prefix).rev().take(16) {
            let (_, v) = item?;
            for r in decode_records(&v)? {
                if newest.as_ref().is_none_or(|n| r.seq > n.seq) {
                    newest = Some(r);
                }
            }
        }
        Ok(newest)
    }

    fn record_key(&self, r: &UsageRecord) -> Vec<u8> {
        let mut k = r.key_id.as_bytes().to_vec();
        k.push(0);
        k.extend_from_slice(&r.time_ms.to_be_bytes());
        k.extend_from_slice(&self.seq.fetch_add(1, Ordering::Relaxed).to_be_bytes());
        k
    }

    /// The synchronous part of a booking, under the accounts lock.
    ///
    /// The purses a record was `charged` besides its key (an account, spend windows) have no
    /// records of their own: their balance entries are rewritten, queued before the record.
    /// sled recovers a prefix of its log, so a crash inside the commit window can lose the
    /// record after its purses were debited (a cap reached a little early), never the reverse.
    fn queue_booking(&self, mut record: UsageRecord, release: i64, check: Option<&[Purse]>, wait: bool) -> Result<Queued, StoreError> {
        let mut map = self.accounts();
        let cost = record.cost_nanos;
        if self.handing_over.load(Ordering::SeqCst) || self.slot.is_released() {
            for (i, p) in check.unwrap_or_default().iter().enumerate() {
                let acc = map.get(&p.id).copied().unwrap_or_default();
                let linked: i64 = p.linked().iter().filter_map(|id| map.get(id)).map(|a| a.balance - a.held).sum();
                if let Err(short) = acc.covers(cost, p.credit.saturating_add(linked)) {
                    return Ok(Queued::Refused(i, short));
                }
            }
            return Ok(Queued::HandedOver(Box::new(record)));
        }
        let mut acc = self.load(&mut map, &record.key_id)?;
        for (i, p) in check.unwrap_or_default().iter().enumerate() {
            let credit = self.credit(&mut map, p)?;
            if let Err(short) = self.load(&mut map, &p.id)?.covers(cost, credit) {
                return Ok(Queued::Refused(i, short));
            }
        }
        let new_balance = acc.balance.saturating_sub(cost);
        let seq = self.slot.db()?.generate_id()? + 1;
        // The purses' entries are written: the stored record names again only its account
        // (an account's statement reads its records by it), not its windows.
        let charged = std::mem::take(&mut record.charged);
        let mut entries = Vec::with_capacity(charged.len());
        let now = crate::base::clock::now_unix();
        for id in charged {
            if id.starts_with("acct:") {
                record.charged.push(id.clone());
            }
            let (balance, turned) = self.with(&mut map, &id, |purse| {
                purse.balance = purse.balance.saturating_sub(cost);
                purse.held -= release;
                (purse.balance, purse.turns_at != 0 && purse.turns_at <= now)
            })?;
            // A bucket that is no longer its window's current one: the kept sums are stale.
            if turned {
                self.earlier_epoch.fetch_add(1, Ordering::AcqRel);
            }
            entries.push((id.into_bytes(), encode_balance(balance, seq).to_vec()));
        }
        self.writer.insert_all(crate::store::commit::TreeName::Balances, entries)?;
        record.seq = seq;
        record.balance_after = new_balance;
        let value = crate::store::usage_codec::value(&record);
        // The record alone carries the key's new balance (`balance_after`, newer `seq` than the
        // balance entry), so the key's balance entry is not rewritten per booking: one insert.
        let mut group = record.key_id.as_bytes().to_vec();
        group.push(0);
        if let (Some(id), Some(owner)) = (&record.response_id, record.owner()) {
            let owner = serde_json::to_vec(&owner).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            // Queued before the record: its waiter covers both.
            self.writer.insert(crate::store::commit::TreeName::ResponseOwners, id.as_bytes().to_vec(), owner, false)?;
        }
        let waiter = self.writer.insert_grouped(
            crate::store::commit::TreeName::UsageRecords,
            group,
            record.time_ms,
            self.record_key(&record),
            value,
            wait,
        )?;
        acc.balance = new_balance;
        acc.held -= release;
        match map.get_mut(&record.key_id) {
            Some(slot) => *slot = acc,
            None => {
                map.insert(record.key_id, acc);
            }
        }
        Ok(Queued::Booked(new_balance, waiter))
    }

    /// The database belongs to the new process now: it books the record; this process keeps
    /// its in-memory view (balance estimate, released hold) for the requests it still finishes.
    async fn forward(&self, record: &UsageRecord, release: i64) -> Result<i64, StoreError> {
        self.handover.get().ok_or(StoreError::Released)?.forward_booking(record).await?;
        let mut map = self.accounts();
        for id in &record.charged {
            let purse = map.entry(id.clone()).or_insert_with(|| Account { turns_at: turns_at(id), ..Account::default() });
            purse.balance -= record.cost_nanos;
            purse.held -= release;
            self.changed(id);
        }
        let acc = map.entry(record.key_id.clone()).or_default();
        acc.balance -= record.cost_nanos;
        acc.held -= release;
        Ok(acc.balance)
    }

    /// Every usage record and every response owner of this node's sled store (`store copy`).
    pub fn export(&self) -> Result<LedgerExport, StoreError> {
        let mut records = Vec::new();
        for item in self.records_tree()?.iter() {
            let (_, v) = item?;
            records.extend(decode_records(&v)?);
        }
        let mut owners = Vec::new();
        for item in self.slot.tree(crate::store::commit::RESPONSE_OWNERS)?.iter() {
            let (k, v) = item?;
            let owner = serde_json::from_slice(&v).map_err(|e| StoreError::Corrupt(format!("response owner: {e}")))?;
            owners.push((String::from_utf8_lossy(&k).into_owned(), owner));
        }
        Ok((records, owners))
    }

    /// The id of every balance entry: keys', accounts' and spend windows' (`store copy`).
    pub fn balance_ids(&self) -> Result<Vec<String>, StoreError> {
        self.balances()?.iter().keys().map(|k| Ok(String::from_utf8_lossy(&k?).into_owned())).collect()
    }

    /// Every audit entry, oldest first (`store copy`).
    pub fn export_audit(&self) -> Result<Vec<AuditEntry>, StoreError> {
        let mut out = Vec::new();
        for item in self.slot.tree(crate::store::commit::AUDIT)?.iter() {
            let (_, v) = item?;
            out.push(serde_json::from_slice(&v).map_err(|e| StoreError::Corrupt(format!("audit entry: {e}")))?);
        }
        Ok(out)
    }

    /// Write copied audit entries into this (empty) store.
    pub fn import_audit(&self, entries: &[AuditEntry]) -> Result<(), StoreError> {
        let tree = self.slot.tree(crate::store::commit::AUDIT)?;
        for (i, e) in entries.iter().enumerate() {
            let mut k = e.time_ms.to_be_bytes().to_vec();
            k.extend_from_slice(&(i as u64).to_be_bytes());
            tree.insert(k, serde_json::to_vec(e).map_err(|e| StoreError::Corrupt(e.to_string()))?)?;
        }
        Ok(())
    }

    /// Write copied records and owners into this (empty) sled store as history: the records
    /// carry no balance (sequence 0), so the balances stay those the copy opened.
    pub fn import(&self, records: &[UsageRecord], owners: &[(String, ResponseOwner)]) -> Result<(), StoreError> {
        let tree = self.records_tree()?;
        for r in records {
            let record = UsageRecord { seq: 0, balance_after: 0, ..r.clone() };
            tree.insert(self.record_key(&record), crate::store::usage_codec::entry(&record))?;
        }
        let tree = self.slot.tree(crate::store::commit::RESPONSE_OWNERS)?;
        for (id, owner) in owners {
            tree.insert(id.as_bytes(), serde_json::to_vec(owner).map_err(|e| StoreError::Corrupt(e.to_string()))?)?;
        }
        self.slot.db()?.flush()?;
        Ok(())
    }

    /// Delete records older than `before_ms` (a batch entry once all its records are). Returns
    /// how many records.
    ///
    /// A key's balance may live only in its newest record (bookings do not rewrite the balance
    /// entry), so before any record of a key goes, the key's balance is checkpointed into its
    /// balance entry under a fresh sequence number: pruning never changes a balance.
    async fn prune_records(&self, before_ms: u64) -> Result<usize, StoreError> {
        // Queued records first, so that every record older than the cut is seen.
        self.writer.settled().await?;
        let records = self.records_tree()?;
        let mut old_keys: Vec<sled::IVec> = Vec::new();
        let mut pruned = 0usize;
        let mut key_ids: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
        for item in records.iter() {
            let (k, v) = item?;
            match decode_records(&v) {
                // An entry goes when every record in it is older than the cut.
                Ok(rs) if !rs.is_empty() && rs.iter().all(|r| r.time_ms < before_ms) => {
                    pruned += rs.len();
                    key_ids.extend(rs.into_iter().map(|r| r.key_id));
                    old_keys.push(k);
                }
                Ok(_) => {}
                Err(e) => log::warn!("ledger: unreadable usage record kept: {e}"),
            }
        }
        self.prune_owners(before_ms)?;
        self.prune_windows(before_ms)?;
        if old_keys.is_empty() {
            return Ok(0);
        }
        for key_id in &key_ids {
            self.checkpoint(key_id)?;
        }
        // The checkpoints are on disk before the records they replace are deleted.
        self.slot.db()?.flush()?;
        for k in &old_keys {
            records.remove(k)?;
        }
        Ok(pruned)
    }

    /// Forget the balances of spend windows that ended before `before_ms` (none is checked
    /// again), unless a request in flight still holds against one.
    fn prune_windows(&self, before_ms: u64) -> Result<usize, StoreError> {
        let cut = (before_ms / 1000).saturating_sub(crate::policy::budget::WINDOW_KEPT_SECS);
        let balances = self.balances()?;
        let mut map = self.accounts();
        let mut n = 0;
        for item in balances.scan_prefix(b"win:") {
            let (k, _) = item?;
            let id = String::from_utf8_lossy(&k).into_owned();
            let ended = crate::policy::budget::window_start(&id).is_some_and(|start| start < cut);
            if ended && map.get(&id).is_none_or(|a| a.held == 0) {
                balances.remove(&k)?;
                map.remove(&id);
                n += 1;
            }
        }
        // A rolling window's buckets that no longer count leave memory (what one spent stays
        // stored until the cut above): the retention runs hourly, so a key's rolling window
        // keeps at most its buckets and an hour's more in memory.
        let now = crate::base::clock::now_unix();
        map.retain(|id, a| a.held != 0 || crate::policy::budget::rolling_until(id).is_none_or(|until| until > now));
        Ok(n)
    }

    /// Forget the owners of responses created before `before_ms` (with their usage records).
    fn prune_owners(&self, before_ms: u64) -> Result<usize, StoreError> {
        let owners = self.slot.tree(crate::store::commit::RESPONSE_OWNERS)?;
        let mut old = Vec::new();
        for item in owners.iter() {
            let (k, v) = item?;
            match serde_json::from_slice::<ResponseOwner>(&v) {
                Ok(o) if o.time_ms < before_ms => old.push(k),
                Ok(_) => {}
                Err(e) => log::warn!("ledger: unreadable response owner kept: {e}"),
            }
        }
        for k in &old {
            owners.remove(k)?;
        }
        Ok(old.len())
    }

    /// Write the key's current balance into its balance entry with a new sequence number.
    fn checkpoint(&self, key_id: &str) -> Result<(), StoreError> {
        let mut map = self.accounts();
        let acc = self.load(&mut map, key_id)?;
        let seq = self.slot.db()?.generate_id()? + 1;
        self.balances()?.insert(key_id.as_bytes(), &encode_balance(acc.balance, seq)[..])?;
        Ok(())
    }
}

/// Totals and per-model rows of a key's records with `start_ms <= time_ms < end_ms` (run on
/// a blocking thread: a long history is a long read).
fn summary_in(
    slot: &DbSlot,
    key_id: &str,
    start_ms: u64,
    end_ms: u64,
    by: &Grouping,
) -> Result<(Totals, BTreeMap<String, Totals>), StoreError> {
    let mut lo = key_id.as_bytes().to_vec();
    lo.push(0);
    let mut hi = lo.clone();
    // An entry is keyed by its first record's time and spans at most GROUP_SPAN_MS.
    lo.extend_from_slice(&start_ms.saturating_sub(crate::store::commit::GROUP_SPAN_MS).to_be_bytes());
    hi.extend_from_slice(&end_ms.to_be_bytes());
    let mut total = Totals::default();
    let mut by_model: BTreeMap<String, Totals> = BTreeMap::new();
    for item in slot.tree("usage_records")?.range(lo..hi) {
        let (_, v) = item?;
        for r in decode_records(&v)?.into_iter().filter(|r| r.time_ms >= start_ms && r.time_ms < end_ms) {
            total.add(&r);
            by_model.entry(by.label(&r).into_owned()).or_default().add(&r);
        }
    }
    Ok((total, by_model))
}

/// A sled ledger's records and response owners (id, owner), for `store copy`.
pub type LedgerExport = (Vec<UsageRecord>, Vec<(String, ResponseOwner)>);

#[async_trait::async_trait]
impl MoneyStore for SledMoney {
    async fn open_account(&self, key_id: &str, initial: i64) -> Result<bool, StoreError> {
        let created =
            self.balances()?.compare_and_swap(key_id.as_bytes(), None as Option<&[u8]>, Some(&encode_balance(initial, 0)[..]))?.is_ok();
        Ok(created)
    }

    async fn balance(&self, key_id: &str) -> Result<i64, StoreError> {
        let mut map = self.accounts();
        Ok(self.load(&mut map, key_id)?.balance)
    }

    fn held(&self, id: &str) -> i64 {
        self.accounts().get(id).map_or(0, |a| a.held)
    }

    /// Every purse is checked, then every purse holds, under one lock.
    async fn hold(&self, purses: &[Purse], amount: i64) -> Result<Result<(), (usize, Insufficient)>, StoreError> {
        let now = crate::base::clock::now_unix();
        let mut map = self.accounts();
        for (i, p) in purses.iter().enumerate() {
            let credit = self.credit(&mut map, p)?;
            let held = self.with(&mut map, &p.id, |acc| {
                acc.covers(amount, credit)?;
                acc.held = acc.held.saturating_add(amount);
                Ok(())
            });
            let refused = match held {
                Ok(Ok(())) => {
                    if p.turned(now) {
                        self.earlier_epoch.fetch_add(1, Ordering::AcqRel);
                    }
                    continue;
                }
                Ok(Err(short)) => Ok(Err((i, short))),
                Err(e) => Err(e),
            };
            // Give back what the purses before it held.
            for before in &purses[..i] {
                if let Some(acc) = map.get_mut(&before.id) {
                    acc.held -= amount;
                    if before.turned(now) {
                        self.earlier_epoch.fetch_add(1, Ordering::AcqRel);
                    }
                }
            }
            return refused;
        }
        Ok(Ok(()))
    }

    fn release(&self, purses: &[Purse], amount: i64) {
        let now = crate::base::clock::now_unix();
        let mut map = self.accounts();
        for p in purses {
            if let Some(acc) = map.get_mut(&p.id) {
                acc.held -= amount;
                if p.turned(now) {
                    self.earlier_epoch.fetch_add(1, Ordering::AcqRel);
                }
            }
        }
    }

    /// The record is queued under the accounts lock, so records reach the disk in the order
    /// their balances were computed, and a hand-over (which sets its flag under the same lock,
    /// then waits for the queue) misses none.
    async fn book(
        &self,
        record: UsageRecord,
        release: i64,
        check: Option<&[Purse]>,
        wait: bool,
    ) -> Result<Result<i64, (usize, Insufficient)>, StoreError> {
        let (balance, waiter) = match self.queue_booking(record, release, check, wait)? {
            Queued::Refused(i, short) => return Ok(Err((i, short))),
            Queued::HandedOver(record) => return self.forward(&record, release).await.map(Ok),
            Queued::Booked(balance, waiter) => (balance, waiter),
        };
        if let Some(waiter) = waiter {
            waiter.wait().await?;
        }
        Ok(Ok(balance))
    }

    /// The audit entry is queued before the balance entry, in one batch: sled recovers a
    /// prefix of its log, so no balance move is ever without its entry.
    async fn top_up(&self, id: &str, delta: i64, reason: Option<&str>) -> Result<AuditEntry, StoreError> {
        self.top_up_marked(id, delta, reason, &[]).await?.ok_or_else(|| StoreError::Corrupt("a top-up without a mark was skipped".into()))
    }

    async fn top_up_once(&self, id: &str, delta: i64, reason: &str, marks: &[(&str, i64)]) -> Result<Option<AuditEntry>, StoreError> {
        self.top_up_marked(id, delta, Some(reason), marks).await
    }

    async fn put_mark(&self, mark: &str, value: i64) -> Result<bool, StoreError> {
        use crate::store::commit::TreeName;
        let waiter = {
            let mut written = self.marks.lock().unwrap_or_else(|p| p.into_inner());
            if written.contains_key(mark) || self.slot.tree(crate::store::commit::MARKS)?.contains_key(mark.as_bytes())? {
                return Ok(false);
            }
            written.insert(mark.to_string(), value);
            self.writer.insert_together(vec![(TreeName::Marks, mark.as_bytes().to_vec(), value.to_be_bytes().to_vec())], true)?
        };
        if let Some(waiter) = waiter {
            waiter.wait().await?;
        }
        Ok(true)
    }

    async fn count_marks(&self, prefix: &str) -> Result<u64, StoreError> {
        // Those written by this process and those on disk, each once.
        let mut seen: std::collections::HashSet<Vec<u8>> = self
            .marks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .filter(|m| m.starts_with(prefix))
            .map(|m| m.as_bytes().to_vec())
            .collect();
        for item in self.slot.tree(crate::store::commit::MARKS)?.scan_prefix(prefix.as_bytes()) {
            let (k, _) = item?;
            seen.insert(k.to_vec());
        }
        Ok(seen.len() as u64)
    }

    async fn mark(&self, mark: &str) -> Result<Option<i64>, StoreError> {
        if let Some(v) = self.marks.lock().unwrap_or_else(|p| p.into_inner()).get(mark) {
            return Ok(Some(*v));
        }
        Ok(self
            .slot
            .tree(crate::store::commit::MARKS)?
            .get(mark.as_bytes())?
            .and_then(|v| v.as_ref().try_into().ok())
            .map(i64::from_be_bytes))
    }

    async fn audit(&self, limit: usize, before: Option<crate::records::log::Cursor>) -> Result<Vec<AuditEntry>, StoreError> {
        let mut upto = vec![0xff; 16];
        if let Some(c) = before {
            upto = c.time_ms.to_be_bytes().to_vec();
            upto.extend_from_slice(&c.seq.to_be_bytes());
        }
        let mut out = Vec::new();
        for item in self.slot.tree(crate::store::commit::AUDIT)?.range(..upto).rev().take(limit) {
            let (k, v) = item?;
            let mut entry: AuditEntry = serde_json::from_slice(&v).map_err(|e| StoreError::Corrupt(format!("audit entry: {e}")))?;
            entry.seq = k.get(8..16).and_then(|b| b.try_into().ok()).map_or(0, u64::from_be_bytes);
            out.push(entry);
        }
        Ok(out)
    }

    async fn commit(&self) -> Result<(), StoreError> {
        self.writer.settled().await
    }

    async fn checkpoint(&self) -> Result<(), StoreError> {
        self.writer.checkpoint()?.wait().await
    }

    async fn usage_summary(
        &self,
        key_id: &str,
        start_ms: u64,
        end_ms: u64,
        by: &Grouping,
    ) -> Result<(Totals, BTreeMap<String, Totals>), StoreError> {
        // A long history is read on a blocking thread, on its own handle of the trees.
        let (slot, key_id, by) = (self.slot.clone(), key_id.to_string(), by.clone());
        tokio::task::spawn_blocking(move || summary_in(&slot, &key_id, start_ms, end_ms, &by))
            .await
            .map_err(|e| StoreError::Corrupt(format!("usage query task: {e}")))?
    }

    async fn prune(&self, before_ms: u64) -> Result<usize, StoreError> {
        self.prune_records(before_ms).await
    }

    async fn response_owner(&self, id: &str) -> Result<Option<ResponseOwner>, StoreError> {
        match self.slot.tree(crate::store::commit::RESPONSE_OWNERS)?.get(id.as_bytes())? {
            Some(v) => serde_json::from_slice(&v).map(Some).map_err(|e| StoreError::Corrupt(format!("response owner {id}: {e}"))),
            None => Ok(None),
        }
    }

    async fn forget_response(&self, id: &str) -> Result<(), StoreError> {
        self.slot.tree(crate::store::commit::RESPONSE_OWNERS)?.remove(id.as_bytes())?;
        Ok(())
    }

    async fn hand_over(&self) -> Result<(), StoreError> {
        {
            let _map = self.accounts();
            self.handing_over.store(true, Ordering::SeqCst);
        }
        self.writer.settled().await
    }

    fn set_handover(&self, to: Arc<dyn ForwardBookings>) {
        let _ = self.handover.set(to);
    }

    fn commit_stats(&self) -> &crate::store::commit::CommitStats {
        &self.writer.stats
    }
}

#[async_trait::async_trait]
impl crate::store::RequestLogStore for SledMoney {
    fn append(&self, entry: crate::records::log::LogLine<'_>) {
        if let Err(e) = super::requests::append(&self.slot, &self.writer, entry) {
            log::warn!("request log: an entry was not written: {e}");
        }
    }

    async fn query(&self, filter: &crate::records::log::Filter) -> Result<crate::records::log::Page, StoreError> {
        let (slot, filter) = (self.slot.clone(), filter.clone());
        self.writer.settled().await?;
        tokio::task::spawn_blocking(move || super::requests::query(&slot, &filter))
            .await
            .map_err(|e| StoreError::Corrupt(format!("request log query task: {e}")))?
    }

    async fn prune_log(&self, before_ms: u64, max: usize) -> Result<usize, StoreError> {
        let slot = self.slot.clone();
        tokio::task::spawn_blocking(move || super::requests::prune(&slot, before_ms, max))
            .await
            .map_err(|e| StoreError::Corrupt(format!("request log prune task: {e}")))?
    }
}
