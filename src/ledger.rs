//! Money: prices, balances, holds, settlement and usage records.
//!
//! Balances are integers in nano-USD (1e-9 USD) in the sled tree `balances`; no float touches
//! a balance. A relayed request first takes a *hold* (its estimated cost, in memory); it is
//! admitted only while `balance − held ≥ estimate`. When the response ends the hold is
//! released and the real cost is debited in memory at once (the in-memory balance is the
//! authoritative one while the process runs) and the usage record is queued to the one writer
//! (`commit`), which makes it durable within `billing.commit_interval_ms`; with
//! `billing.sync_commit: true` the booking waits until its record is on disk. Top-ups, video
//! charges and refunds, and bookings handed over by an old process always wait.
//!
//! No sled transaction or batch is used anywhere: in sled 0.34 either switches the whole
//! database to a lock mode in which a concurrent `flush` can deadlock (seen under load).
//! Instead every booking takes a persistent sequence number and writes one usage record that
//! carries it and the balance after it (the records of one key committed in one batch share
//! a sled entry, a JSON array keyed by the first one's time and sequence); the balance entry
//! `(balance, seq)` is written only by top-ups and repairs. Loading an account takes the newer of the balance entry and the key's
//! newest record, so a booking is one insert and can never be half done.
//!
//! Invariant: a balance can fall below zero only through requests whose real cost exceeded
//! their hold, and by at most the sum of those overruns. The hold prices the request's full
//! output allowance (`max_tokens`, or the configured default) and its input at one token per
//! three bytes, so an overrun needs an upstream that exceeds `max_tokens` or a tokenizer that
//! packs more than one token in three bytes.

use crate::config::Price;
use crate::meter::Usage;
use crate::store::StoreError;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub const NANOS_PER_USD: i64 = 1_000_000_000;

/// nano-USD per one million tokens, and the model's output limit.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TokenPrice {
    pub input: i64,
    pub cached_input: i64,
    pub cache_write_input: i64,
    pub output: i64,
    pub max_output_tokens: Option<u64>,
}

impl TokenPrice {
    /// The highest price an input token can have (plain, cache read or cache write): what the
    /// hold charges for the input it estimates.
    pub fn dearest_input(&self) -> i64 {
        self.input.max(self.cached_input).max(self.cache_write_input)
    }
}

/// Token prices by model.
#[derive(Debug, Default)]
pub struct PriceBook {
    tokens: HashMap<String, TokenPrice>,
}

fn per_million(usd: f64) -> i64 {
    (usd * NANOS_PER_USD as f64).round() as i64
}

fn times(tokens: u64, nanos_per_million: i64) -> i128 {
    let v = i128::from(tokens).saturating_mul(i128::from(nanos_per_million));
    // Round half up to the nano-dollar.
    v.saturating_add(500_000) / 1_000_000
}

/// A sum of terms in nano-USD, saturated to the `i64` range.
fn saturate(v: i128) -> i64 {
    v.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

impl PriceBook {
    pub fn new(prices: &BTreeMap<String, Price>) -> Self {
        let tokens = prices
            .iter()
            .map(|(model, p)| {
                let input = per_million(p.input);
                let cached_input = p.cached_input.map_or(input, per_million);
                let cache_write_input = p.cache_write_input.map_or(input, per_million);
                let price = TokenPrice {
                    input,
                    cached_input,
                    cache_write_input,
                    output: per_million(p.output),
                    max_output_tokens: p.max_output_tokens,
                };
                (model.clone(), price)
            })
            .collect();
        PriceBook { tokens }
    }

    /// The model's prices. Configuration validation makes every served model priced; a model
    /// missing here is refused by [`PriceBook::hold_cost`].
    pub fn price(&self, model: &str) -> Option<TokenPrice> {
        self.tokens.get(model).copied()
    }

    /// Cost of `usage` on `model` in nano-USD (saturating). Zero for an unpriced model.
    pub fn cost(&self, model: &str, usage: Usage) -> i64 {
        let p = self.price(model).unwrap_or_default();
        saturate(
            times(usage.input, p.input)
                .saturating_add(times(usage.cached, p.cached_input))
                .saturating_add(times(usage.cache_write, p.cache_write_input))
                .saturating_add(times(usage.output, p.output)),
        )
    }

    /// The most a request can cost: `input_tokens` at the dearest input price plus
    /// `output_tokens` (all choices together) at the output price. None for an unpriced model.
    pub fn hold_cost(&self, model: &str, input_tokens: u64, output_tokens: u64) -> Option<i64> {
        let p = self.price(model)?;
        Some(saturate(times(input_tokens, p.dearest_input()).saturating_add(times(output_tokens, p.output))))
    }
}

/// One billed event, as stored and summed by `/v1/usage`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UsageRecord {
    /// Unix milliseconds.
    pub time_ms: u64,
    pub key_id: String,
    pub model: String,
    /// `openai`, `anthropic`, `gemini` or `video`.
    pub protocol: String,
    pub route: String,
    pub input_tokens: u64,
    pub cached_tokens: u64,
    /// Prompt-cache writes (priced at `cache_write_input`).
    #[serde(default)]
    pub cache_write_tokens: u64,
    pub output_tokens: u64,
    /// nano-USD; negative for a refund.
    pub cost_nanos: i64,
    pub status: u16,
    pub latency_ms: u64,
    /// Usage was estimated (no usage report seen).
    pub estimated: bool,
    /// Booking sequence number (set by the ledger).
    #[serde(default)]
    pub seq: u64,
    /// The key's balance after this record (set by the ledger).
    #[serde(default)]
    pub balance_after: i64,
    /// The provider that served the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Requests sent upstream for it (more than 1: retried before the first byte).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attempts: u32,
    /// The stored response the request created (responses API): booking the record makes the
    /// key its owner (see [`ResponseOwner`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_id: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Who created a stored response, and where it is stored: tree `response_owners`, keyed by the
/// response id, written in the same commit as the usage record that created it and pruned with
/// it. Only its owner may read, cancel or delete the response, or continue from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResponseOwner {
    pub key_id: String,
    pub provider: String,
    pub model: String,
    pub time_ms: u64,
    /// The conversation's size as of this response: its input (cache reads and writes
    /// included) and output tokens. A turn that continues it is held for them as input.
    #[serde(default)]
    pub context_tokens: u64,
}

#[derive(Debug, Default, Clone, Copy)]
struct Account {
    balance: i64,
    held: i64,
}

impl Account {
    /// Whether `balance − held` covers `amount` (a positive amount needs a positive remainder).
    /// A key in debt (negative remainder) is refused even what holds nothing, until topped up.
    fn covers(&self, amount: i64) -> Result<(), Insufficient> {
        let available = self.balance.saturating_sub(self.held);
        if available < amount || (amount > 0 && available <= 0) || available < 0 {
            return Err(Insufficient { available, needed: amount });
        }
        Ok(())
    }
}

/// The balance was too low for the hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insufficient {
    pub available: i64,
    pub needed: i64,
}

impl Insufficient {
    /// The client's 402; `what` names the thing being paid for ("this request may cost up to").
    pub fn to_api_error(self, what: &str) -> crate::protocol::ApiError {
        crate::protocol::ApiError::new(
            crate::protocol::ErrorKind::InsufficientBalance,
            format!(
                "Insufficient balance: {what} ${:.6}, the key has ${:.6} available.",
                self.needed as f64 / NANOS_PER_USD as f64,
                self.available.max(0) as f64 / NANOS_PER_USD as f64
            ),
        )
    }
}

pub struct Ledger {
    slot: crate::store::DbSlot,
    /// The one writer of balance entries and usage records.
    writer: crate::commit::Writer,
    /// Bookings of relayed requests wait until their record is on disk.
    sync: bool,
    /// Set (under the accounts lock) once the database is being handed to a new process:
    /// every later booking goes through the hand-over socket.
    handing_over: std::sync::atomic::AtomicBool,
    accounts: Mutex<HashMap<String, Account>>,
    seq: AtomicU64,
    /// Where bookings go once the database was handed over (upgrade); injected at start.
    handover: std::sync::OnceLock<Arc<dyn ForwardBookings>>,
    /// In a fleet: balances live in the shared database, records go through the journal.
    fleet: Option<FleetLedger>,
}

/// The ledger's part in a fleet (see `store::fleet`).
struct FleetLedger {
    fleet: Arc<crate::store::fleet::Fleet>,
    journal_id: String,
    /// Journal numbers from here on were settled by this process.
    owed_from: u64,
}

/// Books a record in the process that has the database now (after an upgrade hand-over);
/// returns once it is durable there. Implemented by `handover`.
#[async_trait::async_trait]
pub trait ForwardBookings: Send + Sync {
    async fn forward_booking(&self, record: &UsageRecord) -> Result<(), StoreError>;
}

/// The records of one entry of the `usage_records` tree: a JSON array (the records of one key
/// committed in one batch) or, as written before batches were grouped, one JSON object.
pub(crate) fn decode_records(v: &[u8]) -> Result<Vec<UsageRecord>, StoreError> {
    let corrupt = |e: serde_json::Error| StoreError::Corrupt(format!("usage record: {e}"));
    match v.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'[') => serde_json::from_slice(v).map_err(corrupt),
        _ => serde_json::from_slice(v).map(|r| vec![r]).map_err(corrupt),
    }
}

/// Outcome of the locked part of a booking.
enum Queued {
    Refused(Insufficient),
    /// The database belongs to the new process: forward the booking.
    HandedOver,
    /// The new balance, and the waiter when the booking waits for the disk.
    Booked(i64, Option<crate::commit::Waiter>),
}

/// Reserved money for one in-flight request. Dropped unsettled, it is released untouched.
pub struct Hold {
    ledger: Arc<Ledger>,
    key_id: String,
    amount: i64,
    done: bool,
}

impl Hold {
    fn fleet_hold(&self) -> crate::store::postgres::accounts::FleetHold {
        crate::store::postgres::accounts::FleetHold { key_id: self.key_id.clone(), amount: self.amount }
    }
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hold").field("key_id", &self.key_id).field("amount", &self.amount).finish()
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        match self.ledger.fleet() {
            Some(fleet) => {
                let (fleet, hold) = (fleet.clone(), self.fleet_hold());
                fleet.clone().spawn(async move { fleet.accounts.settle(hold, 0).await });
            }
            None => self.ledger.release(&self.key_id, self.amount),
        }
    }
}

/// A balance entry: the balance and the sequence number of the booking that set it.
fn encode_balance(balance: i64, seq: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&balance.to_be_bytes());
    out[8..].copy_from_slice(&seq.to_be_bytes());
    out
}

fn decode_balance(bytes: &[u8]) -> Result<(i64, u64), StoreError> {
    let corrupt = || StoreError::Corrupt("balance entry is not 16 bytes".into());
    let balance: [u8; 8] = bytes.get(..8).and_then(|b| b.try_into().ok()).ok_or_else(corrupt)?;
    let seq: [u8; 8] = bytes.get(8..16).and_then(|b| b.try_into().ok()).ok_or_else(corrupt)?;
    Ok((i64::from_be_bytes(balance), u64::from_be_bytes(seq)))
}

/// Counters of `/v1/usage`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Totals {
    pub requests: u64,
    pub input_tokens: u64,
    pub cached_input_tokens: u64,
    pub cache_write_input_tokens: u64,
    pub output_tokens: u64,
    pub cost_nanos: i64,
}

impl UsageRecord {
    /// The owner of the stored response this record created, if it created one.
    pub fn owner(&self) -> Option<ResponseOwner> {
        self.response_id.as_ref()?;
        Some(ResponseOwner {
            key_id: self.key_id.clone(),
            provider: self.provider.clone()?,
            model: self.model.clone(),
            time_ms: self.time_ms,
            context_tokens: self.input_total().saturating_add(self.output_tokens),
        })
    }

    /// All input: plain, cache reads and cache writes.
    pub fn input_total(&self) -> u64 {
        self.input_tokens.saturating_add(self.cached_tokens).saturating_add(self.cache_write_tokens)
    }
}

impl Totals {
    /// Count one record (a negative cost is an adjustment: money, not a request).
    pub fn add(&mut self, r: &UsageRecord) {
        if r.cost_nanos >= 0 {
            self.requests += 1;
        }
        self.input_tokens = self.input_tokens.saturating_add(r.input_total());
        self.cached_input_tokens = self.cached_input_tokens.saturating_add(r.cached_tokens);
        self.cache_write_input_tokens = self.cache_write_input_tokens.saturating_add(r.cache_write_tokens);
        self.output_tokens = self.output_tokens.saturating_add(r.output_tokens);
        self.cost_nanos = self.cost_nanos.saturating_add(r.cost_nanos);
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "requests": self.requests,
            "input_tokens": self.input_tokens,
            "cached_input_tokens": self.cached_input_tokens,
            "cache_write_input_tokens": self.cache_write_input_tokens,
            "output_tokens": self.output_tokens,
            "cost": self.cost_nanos as f64 / NANOS_PER_USD as f64,
        })
    }
}

impl Ledger {
    /// The ledger with the default commit policy.
    pub fn open(db: impl Into<crate::store::DbSlot>) -> Result<Self, StoreError> {
        Self::open_with(db, crate::config::CommitPolicy::default())
    }

    pub fn open_with(db: impl Into<crate::store::DbSlot>, policy: crate::config::CommitPolicy) -> Result<Self, StoreError> {
        let slot: crate::store::DbSlot = db.into();
        slot.tree("balances")?;
        slot.tree("usage_records")?;
        let writer = crate::commit::Writer::start(slot.clone(), policy.interval, !policy.sync)
            .map_err(|e| StoreError::Corrupt(format!("cannot start the commit writer: {e}")))?;
        Ok(Ledger {
            writer,
            sync: policy.sync,
            handing_over: std::sync::atomic::AtomicBool::new(false),
            slot,
            accounts: Mutex::new(HashMap::new()),
            seq: AtomicU64::new(0),
            handover: std::sync::OnceLock::new(),
            fleet: None,
        })
    }

    /// Keep balances in the fleet's database and book records through this node's journal.
    pub fn with_fleet(mut self, fleet: Arc<crate::store::fleet::Fleet>) -> Result<Self, StoreError> {
        self.slot.tree(crate::store::fleet::JOURNAL)?;
        let journal_id = fleet.journal_id(&self.slot)?;
        let owed_from = self.slot.db()?.generate_id()?;
        self.fleet = Some(FleetLedger { fleet, journal_id, owed_from });
        Ok(self)
    }

    /// The fleet this ledger belongs to, if any.
    pub fn fleet(&self) -> Option<&Arc<crate::store::fleet::Fleet>> {
        self.fleet.as_ref().map(|f| &f.fleet)
    }

    /// A graceful stop in a fleet: what the journal holds is booked and the leases are given
    /// back, so nothing waits for `lease_secs`. Nothing on a single node.
    pub async fn leave_fleet(&self) {
        let Some(f) = &self.fleet else { return };
        // After an upgrade's hand-over the journal is the new process's to book.
        let booked = if self.slot.is_released() { Ok(0) } else { f.fleet.book_journal(&self.slot, &f.journal_id, f.owed_from).await };
        if let Err(e) = booked {
            log::error!("store: the journal could not be booked before stopping (it will be when this node starts again): {e}");
        }
        match f.fleet.accounts.release_all().await {
            Ok(back) => log::info!("store: {back} nano-USD of leases given back"),
            Err(e) => log::warn!("store: leases not given back (they expire after lease_secs): {e}"),
        }
    }

    /// One sync round of the fleet (journal booked, leases renewed); nothing on a single node.
    pub async fn sync_round(&self) -> Result<(), StoreError> {
        match &self.fleet {
            Some(f) => f.fleet.round(&self.slot, &f.journal_id, f.owed_from).await,
            None => Ok(()),
        }
    }

    /// After the database is handed over, bookings go to `to` (the new process).
    pub fn set_handover(&self, to: Arc<dyn ForwardBookings>) {
        let _ = self.handover.set(to);
    }

    fn balances(&self) -> Result<sled::Tree, StoreError> {
        self.slot.tree("balances")
    }

    fn records_tree(&self) -> Result<sled::Tree, StoreError> {
        self.slot.tree("usage_records")
    }

    fn accounts(&self) -> std::sync::MutexGuard<'_, HashMap<String, Account>> {
        self.accounts.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn load(&self, map: &mut HashMap<String, Account>, key_id: &str) -> Result<Account, StoreError> {
        if let Some(a) = map.get(key_id) {
            return Ok(*a);
        }
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
        let a = Account { balance, held: 0 };
        map.insert(key_id.to_string(), a);
        Ok(a)
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

    /// Give a new key its opening balance; an existing balance is kept. True if created.
    pub async fn open_account(&self, key_id: &str, initial: i64) -> Result<bool, StoreError> {
        if let Some(f) = &self.fleet {
            return Ok(f.fleet.accounts.open_account(key_id, initial).await?);
        }
        let created =
            self.balances()?.compare_and_swap(key_id.as_bytes(), None as Option<&[u8]>, Some(&encode_balance(initial, 0)[..]))?.is_ok();
        Ok(created)
    }

    /// The durable balance (holds not subtracted). In a fleet: the database's, less what this
    /// node settled and has not booked yet.
    pub async fn balance(&self, key_id: &str) -> Result<i64, StoreError> {
        if let Some(f) = &self.fleet {
            let (balance, _leased) = f.fleet.accounts.balance(key_id).await?;
            return Ok(balance.saturating_sub(f.fleet.accounts.owed(key_id).await));
        }
        let mut map = self.accounts();
        Ok(self.load(&mut map, key_id)?.balance)
    }

    /// Reserve `amount` if `balance − held` covers it (in a fleet: this node's lease, or more
    /// leased from the database).
    pub async fn hold(self: &Arc<Self>, key_id: &str, amount: i64) -> Result<Result<Hold, Insufficient>, StoreError> {
        let amount = amount.max(0);
        if let Some(f) = &self.fleet {
            return Ok(match f.fleet.accounts.hold(key_id, amount).await? {
                Ok(_) => Ok(Hold { ledger: self.clone(), key_id: key_id.to_string(), amount, done: false }),
                Err(short) => Err(short),
            });
        }
        let mut map = self.accounts();
        let mut acc = self.load(&mut map, key_id)?;
        if let Err(short) = acc.covers(amount) {
            return Ok(Err(short));
        }
        acc.held = acc.held.saturating_add(amount);
        map.insert(key_id.to_string(), acc);
        Ok(Ok(Hold { ledger: self.clone(), key_id: key_id.to_string(), amount, done: false }))
    }

    fn release(&self, key_id: &str, amount: i64) {
        let mut map = self.accounts();
        if let Some(acc) = map.get_mut(key_id) {
            acc.held -= amount;
        }
    }

    fn record_key(&self, r: &UsageRecord) -> Vec<u8> {
        let mut k = r.key_id.as_bytes().to_vec();
        k.push(0);
        k.extend_from_slice(&r.time_ms.to_be_bytes());
        k.extend_from_slice(&self.seq.fetch_add(1, Ordering::Relaxed).to_be_bytes());
        k
    }

    /// Debit `record.cost_nanos` (a credit when negative) and queue its record; with `wait`,
    /// return once the record is on disk. Returns the new balance.
    async fn book(&self, record: &UsageRecord, release: i64, wait: bool) -> Result<i64, StoreError> {
        match self.book_if(record, release, false, wait).await? {
            Ok(balance) => Ok(balance),
            // Unchecked bookings are never refused.
            Err(short) => Err(StoreError::Corrupt(format!("unchecked booking refused: {short:?}"))),
        }
    }

    /// [`Ledger::book`]; with `check`, only when `balance − held` covers the cost, decided
    /// under the same lock as the debit (two concurrent charges cannot both pass one check).
    ///
    /// The record is queued under the accounts lock, so records reach the disk in the order
    /// their balances were computed, and a hand-over (which sets its flag under the same lock,
    /// then waits for the queue) misses none.
    async fn book_if(&self, record: &UsageRecord, release: i64, check: bool, wait: bool) -> Result<Result<i64, Insufficient>, StoreError> {
        if let Some(f) = &self.fleet {
            return self.book_in_fleet(f, record, release, check, wait).await;
        }
        let queued = self.queue_booking(record, release, check, wait)?;
        let (balance, waiter) = match queued {
            Queued::Refused(short) => return Ok(Err(short)),
            Queued::HandedOver => return self.forward(record, release).await.map(Ok),
            Queued::Booked(balance, waiter) => (balance, waiter),
        };
        if let Some(waiter) = waiter {
            waiter.wait().await?;
        }
        Ok(Ok(balance))
    }

    /// A booking in a fleet: the money settled against this node's lease (a checked one holds
    /// its cost first, so the fleet's balance decides), the record written to the journal.
    /// Returns 0: the new balance is the database's, known once the journal is booked.
    async fn book_in_fleet(
        &self,
        f: &FleetLedger,
        record: &UsageRecord,
        release: i64,
        check: bool,
        wait: bool,
    ) -> Result<Result<i64, Insufficient>, StoreError> {
        let accounts = &f.fleet.accounts;
        let held = if check {
            match accounts.hold(&record.key_id, record.cost_nanos).await? {
                Ok(hold) => hold.amount,
                Err(short) => return Ok(Err(short)),
            }
        } else {
            release
        };
        let hold = crate::store::postgres::accounts::FleetHold { key_id: record.key_id.clone(), amount: held };
        let seq = self.slot.db()?.generate_id()?;
        let mut record = record.clone();
        record.seq = seq;
        let value = serde_json::to_vec(&record).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        // One journal entry per commit batch (a JSON array keyed by its first record's number):
        // an insert per record would be most of the writer's work.
        let waiter = self.writer.insert_grouped(
            crate::commit::TreeName::FleetJournal,
            b"journal".to_vec(),
            record.time_ms,
            seq.to_be_bytes().to_vec(),
            value,
            wait,
        );
        accounts.settle(hold, record.cost_nanos).await;
        if let Some(waiter) = waiter? {
            waiter.wait().await?;
        }
        // The fleet's balance is the database's once the journal is booked: not known here.
        Ok(Ok(0))
    }

    /// The synchronous part of a booking, under the accounts lock.
    fn queue_booking(&self, record: &UsageRecord, release: i64, check: bool, wait: bool) -> Result<Queued, StoreError> {
        {
            let mut map = self.accounts();
            if self.handing_over.load(Ordering::SeqCst) || self.slot.is_released() {
                if check {
                    let acc = map.get(&record.key_id).copied().unwrap_or_default();
                    if let Err(short) = acc.covers(record.cost_nanos) {
                        return Ok(Queued::Refused(short));
                    }
                }
                return Ok(Queued::HandedOver);
            }
            let mut acc = self.load(&mut map, &record.key_id)?;
            if check {
                if let Err(short) = acc.covers(record.cost_nanos) {
                    return Ok(Queued::Refused(short));
                }
            }
            let new_balance = acc.balance.saturating_sub(record.cost_nanos);
            let seq = self.slot.db()?.generate_id()? + 1;
            let mut record = record.clone();
            record.seq = seq;
            record.balance_after = new_balance;
            let value = serde_json::to_vec(&record).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            // The record alone carries the new balance (`balance_after`, newer `seq` than the
            // balance entry), so the balance entry is not rewritten per booking: one insert.
            let mut group = record.key_id.as_bytes().to_vec();
            group.push(0);
            if let (Some(id), Some(owner)) = (&record.response_id, record.owner()) {
                let owner = serde_json::to_vec(&owner).map_err(|e| StoreError::Corrupt(e.to_string()))?;
                // Queued before the record: its waiter covers both.
                self.writer.insert(crate::commit::TreeName::ResponseOwners, id.as_bytes().to_vec(), owner, false)?;
            }
            let waiter = self.writer.insert_grouped(
                crate::commit::TreeName::UsageRecords,
                group,
                record.time_ms,
                self.record_key(&record),
                value,
                wait,
            )?;
            acc.balance = new_balance;
            acc.held -= release;
            map.insert(record.key_id.clone(), acc);
            Ok(Queued::Booked(new_balance, waiter))
        }
    }

    /// The database belongs to the new process now: it books the record; this process keeps
    /// its in-memory view (balance estimate, released hold) for the requests it still finishes.
    async fn forward(&self, record: &UsageRecord, release: i64) -> Result<i64, StoreError> {
        self.handover.get().ok_or(StoreError::Released)?.forward_booking(record).await?;
        let mut map = self.accounts();
        let acc = map.entry(record.key_id.clone()).or_default();
        acc.balance -= record.cost_nanos;
        acc.held -= release;
        Ok(acc.balance)
    }

    /// Book a record forwarded by a process that handed its database over to this one
    /// (durable before it is acknowledged).
    pub async fn book_forwarded(&self, record: UsageRecord) -> Result<i64, StoreError> {
        self.book(&record, 0, true).await
    }

    /// Release the hold and charge the real cost, with its record (durable within the commit
    /// window, or before this returns with `sync_commit`).
    pub async fn settle(&self, mut hold: Hold, record: UsageRecord) -> Result<i64, StoreError> {
        hold.done = true;
        self.book(&record, hold.amount, self.sync).await
    }

    /// Charge a price at once (video submission) when `balance − held` covers it: the check
    /// and the debit happen under one lock. Durable before this returns.
    pub async fn charge(&self, record: UsageRecord) -> Result<Result<i64, Insufficient>, StoreError> {
        let charged = self.book_if(&record, 0, true, true).await?;
        self.book_fleet_now().await;
        Ok(charged)
    }

    /// In a fleet, book the journal at once (a charge or refund reaches the shared database
    /// before it is acknowledged, so a node that dies after it loses nothing of it). When the
    /// database cannot be reached, the journal keeps it for the sync loop.
    async fn book_fleet_now(&self) {
        if let Some(f) = &self.fleet {
            if let Err(e) = f.fleet.book_journal(&self.slot, &f.journal_id, f.owed_from).await {
                log::warn!("store: a charge stays in this node's journal until the database is back: {e}");
            }
        }
    }

    /// Credit (refund, top-up) or debit without a hold; the record says why. Durable before
    /// this returns.
    pub async fn adjust(&self, record: UsageRecord) -> Result<i64, StoreError> {
        let balance = self.book(&record, 0, true).await?;
        self.book_fleet_now().await;
        Ok(balance)
    }

    /// Balance change by an administrator: no usage record. Durable before this returns.
    pub async fn top_up(&self, key_id: &str, delta: i64) -> Result<i64, StoreError> {
        if let Some(f) = &self.fleet {
            return Ok(f.fleet.accounts.top_up(key_id, delta).await?);
        }
        let (balance, waiter) = {
            let mut map = self.accounts();
            let mut acc = self.load(&mut map, key_id)?;
            acc.balance += delta;
            let seq = self.slot.db()?.generate_id()? + 1;
            let waiter = self.writer.insert(
                crate::commit::TreeName::Balances,
                key_id.as_bytes().to_vec(),
                encode_balance(acc.balance, seq).to_vec(),
                true,
            )?;
            map.insert(key_id.to_string(), acc);
            (acc.balance, waiter)
        };
        if let Some(waiter) = waiter {
            waiter.wait().await?;
        }
        Ok(balance)
    }

    /// Return once every booking made before this call is on disk (read-your-writes for
    /// `/v1/usage`; a graceful stop).
    pub async fn commit_now(&self) -> Result<(), StoreError> {
        self.commit_local().await?;
        if let Some(f) = &self.fleet {
            f.fleet.book_journal(&self.slot, &f.journal_id, f.owed_from).await?;
        }
        Ok(())
    }

    /// Return once every booking made before this call is on this node's disk.
    async fn commit_local(&self) -> Result<(), StoreError> {
        // Nothing outstanding (every write queued so far is committed or failed): no flush.
        let stats = &self.writer.stats;
        let queued = stats.queued.load(Ordering::SeqCst);
        if stats.committed.load(Ordering::SeqCst) + stats.failed.load(Ordering::SeqCst) >= queued {
            return Ok(());
        }
        self.writer.barrier()?.wait().await
    }

    /// Before the database is released to a new process: from now on bookings go through the
    /// hand-over socket; returns once everything booked before is on disk.
    pub async fn hand_over(&self) -> Result<(), StoreError> {
        {
            let _map = self.accounts();
            self.handing_over.store(true, Ordering::SeqCst);
        }
        self.commit_local().await
    }

    /// The writer's counters (queued, committed, flushes, failed).
    pub fn commit_stats(&self) -> &crate::commit::CommitStats {
        &self.writer.stats
    }

    /// Totals and per-model rows of a key's records with `start_ms <= time_ms < end_ms`, every
    /// node's in a fleet; reading a long history on a single node runs on a blocking thread.
    pub async fn usage_summary(
        self: &Arc<Self>,
        key_id: &str,
        start_ms: u64,
        end_ms: u64,
    ) -> Result<(Totals, BTreeMap<String, Totals>), StoreError> {
        if let Some(f) = &self.fleet {
            return Ok(f.fleet.records.summary(key_id, start_ms, end_ms).await?);
        }
        let (ledger, key_id) = (self.clone(), key_id.to_string());
        tokio::task::spawn_blocking(move || ledger.summary(&key_id, start_ms, end_ms))
            .await
            .map_err(|e| StoreError::Corrupt(format!("usage query task: {e}")))?
    }

    /// Totals and per-model rows of a key's records with `start_ms <= time_ms < end_ms`.
    pub fn summary(&self, key_id: &str, start_ms: u64, end_ms: u64) -> Result<(Totals, BTreeMap<String, Totals>), StoreError> {
        let mut lo = key_id.as_bytes().to_vec();
        lo.push(0);
        let mut hi = lo.clone();
        // An entry is keyed by its first record's time and spans at most GROUP_SPAN_MS.
        lo.extend_from_slice(&start_ms.saturating_sub(crate::commit::GROUP_SPAN_MS).to_be_bytes());
        hi.extend_from_slice(&end_ms.to_be_bytes());
        let mut total = Totals::default();
        let mut by_model: BTreeMap<String, Totals> = BTreeMap::new();
        for item in self.records_tree()?.range(lo..hi) {
            let (_, v) = item?;
            for r in decode_records(&v)?.into_iter().filter(|r| r.time_ms >= start_ms && r.time_ms < end_ms) {
                total.add(&r);
                by_model.entry(r.model.clone()).or_default().add(&r);
            }
        }
        Ok((total, by_model))
    }

    /// Every record of a key.
    #[cfg(test)]
    pub fn records(&self, key_id: &str) -> Result<Vec<UsageRecord>, StoreError> {
        let mut prefix = key_id.as_bytes().to_vec();
        prefix.push(0);
        let mut out = Vec::new();
        for item in self.records_tree()?.scan_prefix(prefix) {
            let (_, v) = item?;
            out.extend(decode_records(&v)?);
        }
        Ok(out)
    }

    /// Every usage record and every response owner of this node's sled store (`store copy`).
    pub fn export(&self) -> Result<LedgerExport, StoreError> {
        let mut records = Vec::new();
        for item in self.records_tree()?.iter() {
            let (_, v) = item?;
            records.extend(decode_records(&v)?);
        }
        let mut owners = Vec::new();
        for item in self.slot.tree(crate::commit::RESPONSE_OWNERS)?.iter() {
            let (k, v) = item?;
            let owner = serde_json::from_slice(&v).map_err(|e| StoreError::Corrupt(format!("response owner: {e}")))?;
            owners.push((String::from_utf8_lossy(&k).into_owned(), owner));
        }
        Ok((records, owners))
    }

    /// Write copied records and owners into this (empty) sled store as history: the records
    /// carry no balance (sequence 0), so the balances stay those the copy opened.
    pub fn import(&self, records: &[UsageRecord], owners: &[(String, ResponseOwner)]) -> Result<(), StoreError> {
        let tree = self.records_tree()?;
        for r in records {
            let record = UsageRecord { seq: 0, balance_after: 0, ..r.clone() };
            let value = serde_json::to_vec(&record).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            tree.insert(self.record_key(&record), value)?;
        }
        let tree = self.slot.tree(crate::commit::RESPONSE_OWNERS)?;
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
    pub async fn prune(&self, before_ms: u64) -> Result<usize, StoreError> {
        if let Some(f) = &self.fleet {
            return Ok(f.fleet.records.prune(before_ms).await? as usize);
        }
        // Queued records first, so that every record older than the cut is seen.
        self.commit_now().await?;
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

    /// Who created the stored response `id` (None: nobody known, or the record expired).
    /// Bookings still queued are committed first when it is not found.
    pub async fn response_owner(&self, id: &str) -> Result<Option<ResponseOwner>, StoreError> {
        if let Some(f) = &self.fleet {
            if let Some(found) = f.fleet.records.owner(id).await? {
                return Ok(Some(found));
            }
            self.commit_now().await?;
            return Ok(f.fleet.records.owner(id).await?);
        }
        if let Some(found) = self.read_owner(id)? {
            return Ok(Some(found));
        }
        self.commit_now().await?;
        self.read_owner(id)
    }

    fn read_owner(&self, id: &str) -> Result<Option<ResponseOwner>, StoreError> {
        match self.slot.tree(crate::commit::RESPONSE_OWNERS)?.get(id.as_bytes())? {
            Some(v) => serde_json::from_slice(&v).map(Some).map_err(|e| StoreError::Corrupt(format!("response owner {id}: {e}"))),
            None => Ok(None),
        }
    }

    /// The response `id` was deleted upstream: forget its owner.
    pub async fn forget_response(&self, id: &str) -> Result<(), StoreError> {
        if let Some(f) = &self.fleet {
            return Ok(f.fleet.records.forget_owner(id).await?);
        }
        self.slot.tree(crate::commit::RESPONSE_OWNERS)?.remove(id.as_bytes())?;
        Ok(())
    }

    /// Forget the owners of responses created before `before_ms` (with their usage records).
    fn prune_owners(&self, before_ms: u64) -> Result<usize, StoreError> {
        let owners = self.slot.tree(crate::commit::RESPONSE_OWNERS)?;
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

/// A sled ledger's records and response owners (id, owner), for `store copy`.
pub type LedgerExport = (Vec<UsageRecord>, Vec<(String, ResponseOwner)>);

pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A usage record for tests (also the hand-over tests').
    pub(crate) fn record(key: &str, model: &str, cost: i64, t: u64) -> UsageRecord {
        UsageRecord {
            time_ms: t,
            key_id: key.into(),
            model: model.into(),
            protocol: "openai".into(),
            route: "chat_completions".into(),
            input_tokens: 10,
            cached_tokens: 2,
            cache_write_tokens: 0,
            output_tokens: 5,
            cost_nanos: cost,
            status: 200,
            latency_ms: 1,
            estimated: false,
            seq: 0,
            balance_after: 0,
            provider: None,
            attempts: 0,
            response_id: None,
        }
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
            assert_eq!(decode_balance(&ledger.balances().expect("tree").get("k").expect("get").expect("entry")).expect("decode").0, 1000);
            db.flush().expect("flush");
        }
        let db = crate::store::reopen(dir.path());
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
        assert_eq!(ledger.commit_stats().committed.load(Ordering::SeqCst), 0);
        assert!(ledger.records("k").expect("records").is_empty());
        // A top-up waits for the disk, and so for everything queued before it.
        assert_eq!(ledger.top_up("k", 50).await.expect("top up"), 950);
        assert_eq!(ledger.records("k").expect("records").len(), 1);
        drop(ledger);

        let ledger = Arc::new(Ledger::open_with(&db, CommitPolicy { interval: Duration::from_secs(3600), sync: true }).expect("ledger"));
        ledger.settle(ledger.hold("k", 100).await.expect("db").expect("ok"), record("k", "m", 100, 2)).await.expect("settle");
        assert_eq!(ledger.commit_stats().committed.load(Ordering::SeqCst), 1, "sync_commit: on disk before settle returns");
        assert_eq!(ledger.records("k").expect("records").len(), 2);
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
            db.open_tree("balances").expect("tree").insert("k", &encode_balance(1_000, 1)[..]).expect("insert");
        }
        let ledger = Arc::new(Ledger::open(&db).expect("ledger"));
        assert_eq!(ledger.balance("k").await.expect("balance"), 900, "the old record is the newest booking");
        for t in [2_000u64, 2_500, 3_000] {
            ledger.settle(ledger.hold("k", 0).await.expect("db").expect("ok"), record("k", "b", 10, t)).await.expect("settle");
        }
        ledger.commit_now().await.expect("commit");
        assert_eq!(ledger.records_tree().expect("tree").len(), 2, "the three new records share one entry");
        let (all, _) = ledger.summary("k", 0, u64::MAX).expect("summary");
        assert_eq!((all.requests, all.cost_nanos), (4, 130));
        let (window, by_model) = ledger.summary("k", 2_400, 3_000).expect("summary");
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
        assert_eq!(ledger.records("k").expect("records").len(), 1, "queued before the hand-over: committed");
        // After it, bookings go to the new process; with no socket configured they fail
        // loudly instead of writing to a database this process no longer owns.
        let after = ledger.settle(ledger.hold("k", 0).await.expect("db").expect("ok"), record("k", "m", 10, 2)).await;
        assert!(matches!(after, Err(StoreError::Released)), "{after:?}");
        assert_eq!(ledger.records("k").expect("records").len(), 1);
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
        assert_eq!(ledger.records("k").expect("records").iter().filter(|r| r.response_id.is_some()).count(), 2);
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
        let db = crate::store::reopen(dir.path());
        let ledger = Ledger::open(&db).expect("ledger");
        assert_eq!(ledger.balance("k").await.expect("bal"), 10_000 - 300 + 50);
        let (total, by_model) = ledger.summary("k", 0, u64::MAX).expect("summary");
        assert_eq!(total.requests, 3, "a refund is not a request");
        assert_eq!(total.cost_nanos, 250);
        assert_eq!(total.input_tokens, 4 * 12);
        assert_eq!(by_model["a"].cost_nanos, 150);
        assert_eq!(by_model["b"].requests, 1);
        let (window, _) = ledger.summary("k", 1500, 3500).expect("window");
        assert_eq!(window.requests, 2);
        assert_eq!(ledger.prune(2500).await.expect("prune"), 3, "two of k, one of other");
        assert_eq!(ledger.records("k").expect("records").len(), 2);
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
            assert!(ledger.records("k").expect("records").is_empty());
            db.flush().expect("flush");
        }
        let db = crate::store::reopen(dir.path());
        let ledger = Arc::new(Ledger::open(&db).expect("ledger"));
        assert_eq!(ledger.balance("k").await.expect("balance"), 8_000, "the spending is not given back");
        // Bookings after the checkpoint still win over it.
        ledger.settle(ledger.hold("k", 0).await.expect("db").expect("ok"), record("k", "m", 500, 30)).await.expect("settle");
        drop(ledger);
        drop(db);
        let db = crate::store::reopen(dir.path());
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
            let allowance = rng.gen_range(0..=crate::config::MAX_OUTPUT_ALLOWANCE) * rng.gen_range(1..=128);
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
