//! Redemption codes: batches an operator makes (`POST /admin/codes`), each code shown once and
//! kept only as its SHA-256; a key redeems one (`POST /v1/redeem`, the console's `/console/me`)
//! into its account — or itself, when it has none — once, whatever the nodes, retries or
//! restarts: the credit, its audit entry and the code's mark (with the account's use of the
//! batch, when `max_uses_per_account` bounds it) are one write of the money store
//! (`Ledger::top_up_once`). Guessing is throttled per key and per client address
//! (`base::throttle`); a batch is disabled by a mark, which every node reads.
//!
//! A code is `tgc_<batch>_<24 base-62 characters>` (about 143 bits): the batch id finds the
//! batch's record (a row of the job store, kind [`KIND`], read once per node), whose hashes say
//! whether the code is one of it.

use crate::access::auth::{hash_key, hex, KeyIndex};
use crate::base::throttle::Throttle;
use crate::billing::ledger::Ledger;
use crate::charge::plans::PlanClock;
use crate::records::key::KeyRecord;
use crate::store::{JobRow, JobStore, StoreError};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The job store's kind of a batch of codes.
pub const KIND: &str = "codes";
/// The owner the batches are listed under.
const OWNER: &str = "operator";
/// The most codes one batch makes.
pub const MAX_COUNT: u32 = 10_000;
/// The longest note.
pub const MAX_NOTE: usize = 200;
/// A code is never longer than this; anything longer is not looked at.
const MAX_CODE_LEN: usize = 64;
/// Wrong codes from one client address before its pauses begin (several keys behind one
/// address guess together; one key's own pauses begin after `base::throttle::FREE_FAILURES`).
pub const ADDRESS_FREE_FAILURES: u32 = 10;
/// Batches read and kept in memory at most (the stalest forgotten first).
const MAX_CACHED: usize = 1024;

/// A batch as stored: what each of its codes grants, and the codes' hashes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Batch {
    pub id: String,
    pub created_at: u64,
    pub count: u32,
    /// Nano-USD each code credits (0 for a plan code).
    #[serde(default)]
    pub amount: i64,
    /// The plan each code subscribes its holder to.
    #[serde(default)]
    pub plan: Option<String>,
    /// Unix seconds after which its codes are refused.
    #[serde(default)]
    pub expires_at: Option<u64>,
    /// How many codes of this batch one account may redeem (0: any number).
    #[serde(default)]
    pub max_uses_per_account: u32,
    #[serde(default)]
    pub note: String,
    /// Hex SHA-256 of each code.
    pub hashes: Vec<String>,
}

/// A batch read back, with its hashes as a set.
struct Known {
    batch: Batch,
    hashes: HashSet<String>,
    read: Instant,
}

/// `POST /admin/codes` as checked.
#[derive(Debug, Clone)]
pub struct NewBatch {
    pub count: u32,
    pub amount: i64,
    pub plan: Option<String>,
    pub expires_at: Option<u64>,
    pub max_uses_per_account: u32,
    pub note: String,
}

/// A batch as listed: no hashes, what was redeemed of it and whether it is disabled.
#[derive(Debug, Clone, Serialize)]
pub struct Listed {
    pub id: String,
    pub created_at: u64,
    pub count: u32,
    pub amount: i64,
    pub plan: Option<String>,
    pub expires_at: Option<u64>,
    pub max_uses_per_account: u32,
    pub note: String,
    pub redeemed: u64,
    pub disabled: bool,
}

/// What a redemption did.
#[derive(Debug, Clone)]
pub struct Redeemed {
    /// The purse credited: the key's id or `acct:<name>`.
    pub holder: String,
    pub amount: i64,
    pub plan: Option<String>,
    pub balance_after: i64,
}

#[derive(Debug)]
pub enum CodeError {
    /// Too many wrong codes from this key or address: seconds to wait.
    Throttled(u64),
    /// No such code (or not a code at all).
    Unknown,
    Expired,
    Disabled,
    /// This code was redeemed before.
    Used,
    /// The account redeemed as many codes of this batch as it may.
    LimitReached(u32),
    /// The key belongs to an account this node does not know (yet).
    NoAccount,
    /// A batch that cannot be made as asked.
    Invalid(String),
    Store(StoreError),
}

impl From<StoreError> for CodeError {
    fn from(e: StoreError) -> Self {
        CodeError::Store(e)
    }
}

impl std::fmt::Display for CodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CodeError::Throttled(s) => write!(f, "Too many wrong codes; try again in {s} s."),
            CodeError::Unknown => f.write_str("This code is not valid."),
            CodeError::Expired => f.write_str("This code has expired."),
            CodeError::Disabled => f.write_str("This code was withdrawn."),
            CodeError::Used => f.write_str("This code was already redeemed."),
            CodeError::LimitReached(n) => write!(f, "This account already redeemed {n} code(s) of this kind, the most it may."),
            CodeError::NoAccount => f.write_str("The key's account cannot be read now; try again."),
            CodeError::Invalid(m) => f.write_str(m),
            CodeError::Store(e) => write!(f, "store: {e}"),
        }
    }
}

/// The refusal a client (or the admin API) gets.
impl From<CodeError> for crate::protocol::ApiError {
    fn from(e: CodeError) -> Self {
        use crate::protocol::{ApiError, ErrorKind};
        let kind = match &e {
            CodeError::Throttled(secs) => {
                return ApiError { retry_after: Some(*secs), ..ApiError::new(ErrorKind::RateLimited, e.to_string()) };
            }
            CodeError::Unknown | CodeError::Invalid(_) => ErrorKind::BadRequest,
            CodeError::Expired | CodeError::Disabled => ErrorKind::Gone,
            CodeError::Used | CodeError::LimitReached(_) => ErrorKind::Conflict,
            CodeError::NoAccount => ErrorKind::StoreUnavailable,
            CodeError::Store(StoreError::Shared(m)) => {
                log::warn!("codes: {m}");
                return crate::store::fleet::unavailable("the codes");
            }
            CodeError::Store(inner) => {
                log::error!("codes: {inner}");
                return ApiError::new(ErrorKind::Internal, "Internal error while redeeming the code.");
            }
        };
        let param = match &e {
            CodeError::Invalid(m) => m.split(':').next().unwrap_or("code").to_string(),
            _ => "code".to_string(),
        };
        ApiError::new(kind, e.to_string()).with_param(&param)
    }
}

/// Whom a redemption credits.
pub enum Holder {
    /// A key without an account: itself.
    Key(Arc<KeyRecord>),
    /// An account (a key's, or a team a person tops up in the console).
    Account(Arc<crate::records::key::AccountRecord>),
}

impl Holder {
    /// Its purse: the key's id or `acct:<name>`.
    fn purse(&self) -> String {
        match self {
            Holder::Key(k) => k.id.clone(),
            Holder::Account(a) => crate::policy::budget::account_purse(&a.name),
        }
    }
}

/// The codes of every batch, and who is guessing.
pub struct Codes {
    jobs: Arc<dyn JobStore>,
    ledger: Arc<Ledger>,
    keys: Arc<KeyIndex>,
    plans: Arc<PlanClock>,
    batches: Mutex<HashMap<String, Arc<Known>>>,
    by_key: Throttle<String>,
    by_address: Throttle<IpAddr>,
}

/// The mark of a redeemed code (its batch first, so a batch's redemptions are counted by prefix).
fn used_mark(batch: &str, hash: &str) -> String {
    format!("code:{batch}:{hash}")
}

/// The mark of a holder's `n`th redemption of a batch's codes.
fn slot_mark(batch: &str, holder: &str, n: u32) -> String {
    format!("codeuse:{batch}:{holder}:{n}")
}

fn disabled_mark(batch: &str) -> String {
    format!("codeoff:{batch}")
}

/// The batch id a code names, if it is shaped like one.
fn batch_of(code: &str) -> Option<&str> {
    let rest = code.strip_prefix("tgc_")?;
    let (batch, secret) = rest.split_once('_')?;
    let ok = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_alphanumeric());
    (ok(batch, 12) && ok(secret, 24)).then_some(batch)
}

impl Codes {
    pub fn new(jobs: Arc<dyn JobStore>, ledger: Arc<Ledger>, keys: Arc<KeyIndex>, plans: Arc<PlanClock>) -> Codes {
        Codes {
            jobs,
            ledger,
            keys,
            plans,
            batches: Mutex::new(HashMap::new()),
            by_key: Throttle::default(),
            by_address: Throttle::with_free(ADDRESS_FREE_FAILURES),
        }
    }

    /// Make a batch: its record stored (durable before this returns), its codes returned —
    /// the only time they are ever seen.
    pub async fn create(&self, new: NewBatch) -> Result<(Listed, Vec<String>), CodeError> {
        if new.count == 0 || new.count > MAX_COUNT {
            return Err(CodeError::Invalid(format!("count: 1 to {MAX_COUNT}")));
        }
        match (&new.plan, new.amount) {
            (Some(_), a) if a != 0 => return Err(CodeError::Invalid("give either amount or plan, not both".into())),
            (None, a) if a <= 0 => return Err(CodeError::Invalid("amount: a positive number of USD (or a plan)".into())),
            (Some(p), _) if self.keys.plans().get(p).is_none() => return Err(CodeError::Invalid(format!("plan: no plan named '{p}'"))),
            _ => {}
        }
        if new.note.chars().count() > MAX_NOTE {
            return Err(CodeError::Invalid(format!("note: at most {MAX_NOTE} characters")));
        }
        let id = crate::base::secrets::random_base62(12);
        let codes: Vec<String> = (0..new.count).map(|_| format!("tgc_{id}_{}", crate::base::secrets::random_base62(24))).collect();
        let batch = Batch {
            id: id.clone(),
            created_at: crate::base::clock::now_unix(),
            count: new.count,
            amount: new.amount,
            plan: new.plan,
            expires_at: new.expires_at,
            max_uses_per_account: new.max_uses_per_account,
            note: new.note,
            hashes: codes.iter().map(|c| hex(&hash_key(c))).collect(),
        };
        let record = serde_json::to_string(&batch).map_err(|e| CodeError::Invalid(format!("batch: {e}")))?;
        self.jobs
            .put(&JobRow { kind: KIND, id: format!("codes_{id}"), owner: OWNER.into(), created_at: batch.created_at, open: false, record })
            .await?;
        Ok((listed(&batch, 0, false), codes))
    }

    /// Every batch, newest first, with how many of its codes were redeemed.
    pub async fn list(&self) -> Result<Vec<Listed>, CodeError> {
        let mut out = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let rows = self.jobs.of_owner(KIND, OWNER, after.as_deref(), 200).await?;
            let Some(last) = rows.last() else { break };
            let last: Batch = serde_json::from_str(last).map_err(|e| StoreError::Corrupt(format!("a batch of codes: {e}")))?;
            after = Some(format!("codes_{}", last.id));
            for row in &rows {
                let batch: Batch = serde_json::from_str(row).map_err(|e| StoreError::Corrupt(format!("a batch of codes: {e}")))?;
                let redeemed = self.ledger.count_marks(&format!("code:{}:", batch.id)).await?;
                let disabled = self.ledger.mark(&disabled_mark(&batch.id)).await?.is_some();
                out.push(listed(&batch, redeemed, disabled));
            }
            if rows.len() < 200 {
                break;
            }
        }
        Ok(out)
    }

    /// Withdraw a batch: none of its codes is redeemed from now on, on any node. False when
    /// there is no such batch.
    pub async fn disable(&self, id: &str) -> Result<bool, CodeError> {
        if self.batch(id).await?.is_none() {
            return Ok(false);
        }
        self.ledger.put_mark(&disabled_mark(id), i64::try_from(crate::base::clock::now_unix()).unwrap_or(i64::MAX)).await?;
        Ok(true)
    }

    /// A batch's record, read once per node (a batch never changes; its withdrawal is a mark).
    async fn batch(&self, id: &str) -> Result<Option<Arc<Known>>, StoreError> {
        if let Some(k) = self.batches.lock().unwrap_or_else(|p| p.into_inner()).get(id) {
            return Ok(Some(k.clone()));
        }
        let Some(row) = self.jobs.get(&format!("codes_{id}")).await? else { return Ok(None) };
        let batch: Batch = serde_json::from_str(&row).map_err(|e| StoreError::Corrupt(format!("a batch of codes: {e}")))?;
        let hashes = batch.hashes.iter().cloned().collect();
        let known = Arc::new(Known { batch, hashes, read: Instant::now() });
        let mut map = self.batches.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= MAX_CACHED {
            if let Some(stalest) = map.iter().min_by_key(|(_, k)| k.read).map(|(k, _)| k.clone()) {
                map.remove(&stalest);
            }
        }
        map.insert(id.to_string(), known.clone());
        Ok(Some(known))
    }

    /// Who a key's redemption credits: its account, or the key itself when it has none.
    pub fn holder_of(&self, key: &Arc<KeyRecord>) -> Result<Holder, CodeError> {
        match key.policy.account.as_deref() {
            None => Ok(Holder::Key(key.clone())),
            Some(name) => Ok(Holder::Account(self.keys.account(name).ok_or(CodeError::NoAccount)?)),
        }
    }

    /// `by` (a key's id, a person's label: who is throttled and named in the audit trail)
    /// redeems `code`, sent from `from`, for `holder`: credited the batch's amount, or
    /// subscribed to its plan — once.
    pub async fn redeem(&self, holder: Holder, by: &str, code: &str, from: Option<IpAddr>) -> Result<Redeemed, CodeError> {
        let now = Instant::now();
        let by = crate::base::text::clip(by, 200).into_owned();
        self.by_key.admit(&by, now).map_err(CodeError::Throttled)?;
        if let Some(ip) = &from {
            self.by_address.admit(ip, now).map_err(CodeError::Throttled)?;
        }
        let code = code.trim();
        let found = match batch_of(code).filter(|_| code.len() <= MAX_CODE_LEN) {
            Some(id) => self.batch(id).await?.filter(|k| k.hashes.contains(&hex(&hash_key(code)))),
            None => None,
        };
        let Some(known) = found else {
            self.by_key.failed(&by, now);
            if let Some(ip) = &from {
                self.by_address.failed(ip, now);
            }
            return Err(CodeError::Unknown);
        };
        self.by_key.succeeded(&by);
        if let Some(ip) = &from {
            self.by_address.succeeded(ip);
        }
        let batch = &known.batch;
        if batch.expires_at.is_some_and(|t| crate::base::clock::now_unix() >= t) {
            return Err(CodeError::Expired);
        }
        if self.ledger.mark(&disabled_mark(&batch.id)).await?.is_some() {
            return Err(CodeError::Disabled);
        }
        let purse = holder.purse();
        let used = used_mark(&batch.id, &hex(&hash_key(code)));
        let when = i64::try_from(crate::base::clock::now_unix()).unwrap_or(i64::MAX);
        let what = match &batch.plan {
            Some(p) => format!("plan {p}"),
            None => format!("{:.2} USD", crate::base::money::usd(batch.amount)),
        };
        let note = crate::base::text::clip(&batch.note, MAX_NOTE);
        let reason = format!(
            "code of batch {} redeemed by {by} for {what}{}",
            batch.id,
            if note.is_empty() { String::new() } else { format!(" ({note})") }
        );
        // The first of the holder's uses of this batch not yet taken; one taken meanwhile by
        // a concurrent redemption moves on to the next.
        let slots = batch.max_uses_per_account;
        let mut n = 0;
        let entry = loop {
            if self.ledger.mark(&used).await?.is_some() {
                return Err(CodeError::Used);
            }
            let slot = (slots > 0).then(|| slot_mark(&batch.id, &purse, n));
            if let Some(s) = &slot {
                if n >= slots {
                    return Err(CodeError::LimitReached(slots));
                }
                if self.ledger.mark(s).await?.is_some() {
                    n += 1;
                    continue;
                }
            }
            let mut marks = vec![(used.as_str(), when)];
            if let Some(s) = &slot {
                marks.push((s.as_str(), when));
            }
            match self.ledger.top_up_once(&purse, batch.amount, &reason, &marks).await? {
                Some(entry) => break entry,
                None if slot.is_none() => return Err(CodeError::Used),
                None => n += 1,
            }
        };
        if let Some(plan) = &batch.plan {
            self.subscribe(holder, &purse, plan).await?;
        }
        Ok(Redeemed { holder: purse, amount: batch.amount, plan: batch.plan.clone(), balance_after: entry.balance_after })
    }

    /// A plan code redeemed: its holder subscribed (a plan no longer in the file: nothing).
    async fn subscribe(&self, holder: Holder, purse: &str, plan: &str) -> Result<(), StoreError> {
        if self.keys.plans().get(plan).is_none() {
            log::warn!("codes: a code for the plan '{plan}' was redeemed, but the file has no such plan now");
            return Ok(());
        }
        let via = "a redemption code";
        match holder {
            Holder::Account(a) => {
                let mut a = (*a).clone();
                if self.plans.switch(purse, &format!("account {}", a.name), &mut a.plan, Some(plan.to_string()), via).await? {
                    self.keys.put_account(&a).await?;
                }
            }
            Holder::Key(k) => {
                let mut k = (*k).clone();
                if self.plans.switch(purse, &format!("key {}", k.id), &mut k.plan, Some(plan.to_string()), via).await? {
                    self.keys.put_key(&k).await?;
                }
            }
        }
        // Its first period's credit now, not at the clock's next round.
        self.plans.tick(crate::base::clock::now_unix()).await?;
        Ok(())
    }
}

fn listed(b: &Batch, redeemed: u64, disabled: bool) -> Listed {
    Listed {
        id: b.id.clone(),
        created_at: b.created_at,
        count: b.count,
        amount: b.amount,
        plan: b.plan.clone(),
        expires_at: b.expires_at,
        max_uses_per_account: b.max_uses_per_account,
        note: b.note.clone(),
        redeemed,
        disabled,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_code_shaped_string_names_a_batch() {
        let code = format!("tgc_{}_{}", "A".repeat(12), "b".repeat(24));
        assert_eq!(batch_of(&code), Some("AAAAAAAAAAAA"));
        for bad in ["", "tgc_", "tgc_AAAAAAAAAAAA", "tgc_AAAAAAAAAAA_bbbbbbbbbbbbbbbbbbbbbbbb", "xgc_AAAAAAAAAAAA_bbbbbbbbbbbbbbbbbbbbbbbb"]
        {
            assert_eq!(batch_of(bad), None, "{bad}");
        }
        assert_eq!(batch_of(&format!("tgc_{}_{}", "A".repeat(12), "b/".repeat(12))), None);
        assert_eq!(batch_of(&format!("tgc_{}_{}", "A".repeat(12), "b".repeat(25))), None);
    }
}
