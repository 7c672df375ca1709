//! Admission: a call is counted, takes its slot and reserves its tokens, and what it may cost
//! is held in every purse of its key.

use super::Books;
use crate::access::auth::KeyIndex;
use crate::access::limits::{Limited, Limits, Slot, TokenReservation};
use crate::base::money::Multiplier;
use crate::billing::ledger::{Hold, Refused};
use crate::policy::budget::Calendar;
use crate::protocol::{ApiError, ErrorKind};
use crate::records::key::KeyRecord;
use crate::records::purse::Purse;
use crate::store::StoreError;
use std::sync::Arc;

/// Which count a call is admitted against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bucket {
    /// The key's `rpm` (and a spent `tpm` refuses it): every request, a realtime turn.
    Requests,
    /// The key's `tool_rpm`: an MCP tool call.
    ToolCalls,
}

/// What a kind of call is admitted with before it runs.
#[derive(Debug, Clone, Copy, Default)]
pub struct Entry {
    /// Counted in this bucket first.
    pub count: Option<Bucket>,
    /// Then refused while the key (or its account, a window) is below zero.
    pub solvent: bool,
    /// Then takes one of the key's `max_concurrent` slots while it runs.
    pub slot: bool,
}

impl Entry {
    /// A call answered here for a key in good standing (video, files, batches): counted,
    /// refused below zero, in a slot while it runs.
    pub const KEYED: Entry = Entry { count: Some(Bucket::Requests), solvent: true, slot: true };
    /// A read answered here (`/v1/usage`, the key page's data): counted, in a slot.
    pub const READ: Entry = Entry { count: Some(Bucket::Requests), solvent: false, slot: true };
}

/// What a call counts against (see [`Charge::limited`]).
enum Subjects<'k> {
    One([Limited<'k>; 1]),
    Many(Vec<Limited<'k>>),
}

impl<'k> Subjects<'k> {
    fn all(&self) -> &[Limited<'k>] {
        match self {
            Subjects::One(one) => one,
            Subjects::Many(all) => all,
        }
    }
}

/// What a call of a key is under beyond the key itself: its account, the plans it and its
/// account subscribe to, the limits of its tag values, and the price multiplier that follows
/// from them — looked up once per call ([`Charge::under`]) and carried through its stages. A
/// key under none of them (the common case) allocates nothing.
#[derive(Clone, Default)]
pub struct Under {
    account: Option<Arc<crate::records::key::AccountRecord>>,
    plans: Vec<crate::access::auth::Subscribed>,
    tags: Option<Arc<crate::policy::limits::TagLimits>>,
    rate: Multiplier,
}

impl Under {
    /// The shared account the key draws on, if any.
    pub fn account(&self) -> Option<&crate::records::key::AccountRecord> {
        self.account.as_deref()
    }

    /// The price multiplier a call of the key is charged at (`KeyIndex::price_multiplier`).
    pub fn rate(&self) -> Multiplier {
        self.rate
    }
}

/// A key's purse list as last made, kept while nothing it was made from changed: the same
/// records (held here, so an address seen again is the same record, never a new one at a
/// freed address), the same calendar, and every window, bucket and plan period in it still
/// the current one.
struct Kept {
    key: Arc<KeyRecord>,
    account: Option<Arc<crate::records::key::AccountRecord>>,
    plans: Vec<(Arc<crate::policy::plan::Plan>, u64)>,
    tags: Option<Arc<crate::policy::limits::TagLimits>>,
    calendar: String,
    /// Kept while the clock is before this (unix s).
    until: u64,
    purses: Arc<[Purse]>,
}

impl Kept {
    fn holds(&self, key: &Arc<KeyRecord>, under: &Under, calendar: &Calendar, now: u64) -> bool {
        let same = |a: Option<&Arc<crate::records::key::AccountRecord>>, b: Option<&Arc<crate::records::key::AccountRecord>>| match (a, b) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        now < self.until
            && Arc::ptr_eq(&self.key, key)
            && same(self.account.as_ref(), under.account.as_ref())
            && self.plans.len() == under.plans.len()
            && self.plans.iter().zip(&under.plans).all(|((p, since), s)| Arc::ptr_eq(p, &s.plan) && *since == s.since)
            && match (&self.tags, &under.tags) {
                (None, None) => true,
                (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                _ => false,
            }
            && self.calendar == calendar.name()
    }
}

/// Most purse lists kept (past it, they are all made again).
const MAX_KEPT: usize = 10_000;

/// The money of every call: admission here, settlement in [`Books`].
pub struct Charge {
    books: Books,
    limits: Arc<Limits>,
    keys: Arc<KeyIndex>,
    plans: Option<Arc<super::plans::PlanClock>>,
    /// Purse lists of keys under windows, an account or a plan, by key id (see [`Kept`]).
    kept: std::sync::Mutex<std::collections::HashMap<String, Kept, ahash::RandomState>>,
}

impl Charge {
    pub fn new(books: Books, limits: Arc<Limits>, keys: Arc<KeyIndex>) -> Self {
        Charge { books, limits, keys, plans: None, kept: Default::default() }
    }

    /// With the plans' clock (where a key's plan stands, for its usage view).
    pub fn with_plans(mut self, plans: Arc<super::plans::PlanClock>) -> Self {
        self.plans = Some(plans);
        self
    }

    /// Where the plans `key` is under stand now (the `plans` of `/v1/usage`): the key's own,
    /// its account's.
    pub async fn plan_standing(&self, key: &KeyRecord) -> Result<Vec<serde_json::Value>, crate::store::StoreError> {
        let Some(clock) = &self.plans else { return Ok(Vec::new()) };
        let now = crate::base::clock::now_unix();
        let mut out = Vec::new();
        if let Some(r) = &key.plan {
            out.extend(clock.standing(&key.id, r, now).await?);
        }
        if let Some(account) = key.policy.account.as_deref().and_then(|n| self.keys.account(n)) {
            if let Some(r) = &account.plan {
                let mut v = clock.standing(&crate::policy::budget::account_purse(&account.name), r, now).await?;
                if let Some(v) = v.as_mut() {
                    v["account"] = serde_json::json!(account.name);
                }
                out.extend(v);
            }
        }
        Ok(out)
    }

    /// Where calls are settled.
    pub fn books(&self) -> &Books {
        &self.books
    }

    /// What a call of `key` is under, looked up now (see [`Under`]).
    pub fn under(&self, key: &KeyRecord) -> Under {
        if key.policy.account.is_none() && key.plan.is_none() && key.policy.tags.is_empty() {
            return Under { rate: self.keys.group_multiplier(&key.group), ..Under::default() };
        }
        let account = self.keys.account_of(key);
        let plans = self.keys.subscribed(key, account.as_ref());
        let tags = (!key.policy.tags.is_empty()).then(|| self.keys.tag_limits());
        let (rate, _) = self.keys.multiplier_of(key, account.as_ref(), &plans);
        Under { account, plans, tags, rate }
    }

    /// Admit a call of `key` as `entry` says: counted, solvent, in a slot (held while the
    /// returned slot lives).
    pub async fn admit(&self, key: &KeyRecord, calendar: &Calendar, entry: Entry) -> Result<Option<Slot>, ApiError> {
        let under = self.under(key);
        if let Some(bucket) = entry.count {
            self.count_under(key, &under, bucket).await?;
        }
        if entry.solvent {
            self.covers_under(key, &under, calendar, 0, "this call needs").await?;
        }
        match entry.slot {
            true => self.enter_under(key, &under).await,
            false => Ok(None),
        }
    }

    /// What a call of `key` counts against, in the order they are checked: the key, its
    /// account, the tag values it carries that have limits (`policy::limits`), its plans. A key
    /// under none (the common case) allocates nothing.
    fn limited<'k>(&self, key: &'k KeyRecord, under: &'k Under) -> Subjects<'k> {
        let account = under.account.as_ref().filter(|a| !a.rates.is_empty());
        let tags = under.tags.as_ref().filter(|t| t.of(&key.policy.tags).any(|t| !t.rates.is_empty()));
        let plans = || under.plans.iter().filter(|s| !s.plan.rates.is_empty());
        if account.is_none() && tags.is_none() && plans().next().is_none() {
            return Subjects::One([Limited::key(key)]);
        }
        let mut all = vec![Limited::key(key)];
        if let Some(account) = account {
            all.push(Limited {
                id: crate::policy::budget::account_purse(&account.name).into(),
                rates: account.rates,
                whose: format!("the account '{}'", account.name).into(),
            });
        }
        for tag in tags.iter().flat_map(|t| t.of(&key.policy.tags)).filter(|t| !t.rates.is_empty()) {
            all.push(Limited { id: tag.id().into(), rates: tag.rates, whose: tag.whose().into() });
        }
        for s in plans() {
            all.push(Limited { id: format!("plan:{}", s.holder(key)).into(), rates: s.plan.rates, whose: s.whose().into() });
        }
        Subjects::Many(all)
    }

    /// Count a call of `key` in `bucket`: 429 with `Retry-After` past its limit (a request: the
    /// key's, its account's, its tag values').
    pub async fn count(&self, key: &KeyRecord, bucket: Bucket) -> Result<(), ApiError> {
        self.count_under(key, &self.under(key), bucket).await
    }

    /// [`Charge::count`] for a call whose [`Under`] is known.
    pub async fn count_under(&self, key: &KeyRecord, under: &Under, bucket: Bucket) -> Result<(), ApiError> {
        match bucket {
            Bucket::Requests => self.limits.admit_all(self.limited(key, under).all()).await,
            Bucket::ToolCalls => self.limits.admit_tool_call(key).await,
        }
    }

    /// The call counts against every `max_concurrent` it is under while the slot lives (None:
    /// no cap).
    pub async fn enter(&self, key: &KeyRecord) -> Result<Option<Slot>, ApiError> {
        self.enter_under(key, &self.under(key)).await
    }

    /// [`Charge::enter`] for a call whose [`Under`] is known.
    pub async fn enter_under(&self, key: &KeyRecord, under: &Under) -> Result<Option<Slot>, ApiError> {
        self.limits.enter_all(self.limited(key, under).all()).await
    }

    /// Reserve the tokens a call is held for under every `tpm` it is under until it settles
    /// (None: no `tpm`).
    pub fn reserve_tokens(&self, key: &KeyRecord, under: &Under, tokens: u64) -> Result<Option<TokenReservation>, ApiError> {
        self.limits.reserve_tokens_all(self.limited(key, under).all(), tokens)
    }

    /// Count the tokens a finished call used under every `tpm` it is under.
    pub async fn spend_tokens(&self, key: &KeyRecord, tokens: u64) {
        self.spend_tokens_under(key, &self.under(key), tokens).await
    }

    /// [`Charge::spend_tokens`] for a call whose [`Under`] is known.
    pub async fn spend_tokens_under(&self, key: &KeyRecord, under: &Under, tokens: u64) {
        self.limits.spend_tokens_all(self.limited(key, under).all(), tokens).await
    }

    /// What a call of `key` is paid from, in the order of checks: its spend windows, its
    /// account's, its tag values', its plans' (and what it spends in their periods), its
    /// balance, its account's balance. A key whose account this node does not know (yet) is
    /// refused for now.
    pub fn purses(&self, key: &KeyRecord, calendar: &Calendar) -> Result<Vec<Purse>, ApiError> {
        self.purses_under(key, &self.under(key), calendar)
    }

    /// [`Charge::purses`] for a call whose [`Under`] is known.
    pub fn purses_under(&self, key: &KeyRecord, under: &Under, calendar: &Calendar) -> Result<Vec<Purse>, ApiError> {
        let tags: Vec<&crate::policy::limits::TagLimit> =
            under.tags.iter().flat_map(|t| t.of(&key.policy.tags)).filter(|t| !t.budgets.is_empty()).collect();
        if key.policy.account.is_none() && key.policy.budgets.is_empty() && tags.is_empty() && under.plans.is_empty() {
            return Ok(vec![Purse::key(&key.id)]);
        }
        if key.policy.account.is_some() && under.account.is_none() {
            return Err(crate::store::fleet::unavailable("the key's account"));
        }
        // Whose a plan is, only for a plan with windows (what their refusal names).
        let named: Vec<(std::borrow::Cow<'_, str>, String)> =
            under.plans.iter().map(|s| (s.holder(key), if s.plan.budgets.is_empty() { String::new() } else { s.whose() })).collect();
        let plans: Vec<crate::records::purse::PlanOf<'_>> = under
            .plans
            .iter()
            .zip(&named)
            .map(|(s, (holder, whose))| crate::records::purse::PlanOf { plan: &s.plan, holder, since: s.since, whose })
            .collect();
        Ok(crate::records::purse::purses(key, under.account.as_deref(), (&tags, &plans), calendar, crate::base::clock::now_unix()))
    }

    /// [`Charge::purses_under`], the list kept from the key's last call while nothing it was
    /// made from changed (a model call's: see [`Kept`]).
    pub fn purses_kept(&self, key: &Arc<KeyRecord>, under: &Under, calendar: &Calendar) -> Result<Vec<Purse>, ApiError> {
        // A key alone pays from its balance: nothing to keep.
        if key.policy.account.is_none() && key.policy.budgets.is_empty() && under.plans.is_empty() && under.tags.is_none() {
            return Ok(vec![Purse::key(&key.id)]);
        }
        let now = crate::base::clock::now_unix();
        // Copied out of the lock.
        let found = self
            .kept
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key.id)
            .filter(|k| k.holds(key, under, calendar, now))
            .map(|k| k.purses.clone());
        if let Some(purses) = found {
            return Ok(purses.to_vec());
        }
        let purses = self.purses_under(key, under, calendar)?;
        // Kept until the first window, bucket or plan period in it turns.
        let mut until = u64::MAX;
        for p in &purses {
            match p.kind {
                crate::records::purse::PurseKind::Window { end, .. } => until = until.min(end),
                crate::records::purse::PurseKind::Rolling { turns_at, .. } => until = until.min(turns_at),
                _ => {}
            }
        }
        for s in &under.plans {
            until = until.min(s.plan.period.at(s.since, now, calendar).1);
        }
        let kept = Kept {
            key: key.clone(),
            account: under.account.clone(),
            plans: under.plans.iter().map(|s| (s.plan.clone(), s.since)).collect(),
            tags: under.tags.clone(),
            calendar: calendar.name().to_string(),
            until,
            purses: purses.as_slice().into(),
        };
        let mut all = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        if all.len() >= MAX_KEPT {
            all.clear();
        }
        all.insert(key.id.clone(), kept);
        Ok(purses)
    }

    /// The price multiplier a call of `key` is charged at (`KeyIndex::price_multiplier`).
    pub fn rate(&self, key: &KeyRecord) -> Multiplier {
        self.under(key).rate
    }

    /// What a call of `key` pays from and at which multiplier (a kind that charges up front).
    pub fn payment(&self, key: &KeyRecord, calendar: &Calendar) -> Result<super::Payment, ApiError> {
        let under = self.under(key);
        Ok(super::Payment {
            purses: self.purses_under(key, &under, calendar)?,
            rate: under.rate,
            plan_models: self.plan_models_under(key, &under),
        })
    }

    /// The model rules of the plans a call of `key` is under (`checks::Subject::plans`).
    pub fn plan_models(&self, key: &KeyRecord) -> Vec<crate::policy::plan::PlanModels> {
        if key.plan.is_none() && key.policy.account.is_none() {
            return Vec::new();
        }
        self.plan_models_under(key, &self.under(key))
    }

    /// [`Charge::plan_models`] for a call whose [`Under`] is known.
    pub fn plan_models_under(&self, _key: &KeyRecord, under: &Under) -> Vec<crate::policy::plan::PlanModels> {
        under
            .plans
            .iter()
            .filter_map(|s| Some(crate::policy::plan::PlanModels { rules: s.plan.models.clone()?, whose: s.whose() }))
            .collect()
    }

    /// Hold what a call of list cost `list` is charged at `rate` (its key's [`Charge::rate`])
    /// in every purse, or in none: `Ok(Err(refused))` names the purse that does not cover it
    /// (in charged money). A store that cannot answer is the client's 503 (a fleet's database
    /// out of reach) or 500.
    pub async fn hold(&self, purses: Vec<Purse>, list: i64, rate: Multiplier) -> Result<Result<Hold, Refused>, ApiError> {
        self.books.ledger.hold_priced(purses, list, rate).await.map_err(|e| match e {
            StoreError::Shared(e) => {
                log::warn!("ledger: {e}");
                crate::store::fleet::unavailable("the key's balance")
            }
            e => {
                log::error!("ledger: {e}");
                ApiError::new(ErrorKind::Internal, "Internal error while checking the balance.")
            }
        })
    }

    /// Whether every purse of `key` covers `amount` now (held and given back at once); the 402
    /// says `what` it was for.
    pub async fn covers(&self, key: &KeyRecord, calendar: &Calendar, amount: i64, what: &str) -> Result<(), ApiError> {
        self.covers_under(key, &self.under(key), calendar, amount, what).await
    }

    async fn covers_under(&self, key: &KeyRecord, under: &Under, calendar: &Calendar, amount: i64, what: &str) -> Result<(), ApiError> {
        match self.hold(self.purses_under(key, under, calendar)?, amount, under.rate).await? {
            Ok(_released) => Ok(()),
            Err(refused) => Err(refused.to_api_error(what, crate::base::clock::now_unix())),
        }
    }

    /// Refuse (402) a key — or its account — whose balance is below zero: a negative key is
    /// refused everything that needs a key, for the calls that hold nothing themselves (files,
    /// batches' reads, MCP handshakes and listings).
    pub async fn solvent(&self, key: &KeyRecord, calendar: &Calendar) -> Result<(), ApiError> {
        self.covers(key, calendar, 0, "this call needs").await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::budget::{Budgets, Rolling};
    use crate::records::key::KeyOrigin;

    #[test]
    fn a_kept_purse_list_holds_only_for_the_same_records_calendar_and_current_windows() {
        let mut record = KeyRecord::new("k", "k", "default", String::new(), KeyOrigin::Config);
        record.policy.budgets = Budgets { rolling: vec![Rolling { secs: 5 * 3600, cap: 10_000 }], ..Default::default() };
        let key = Arc::new(record);
        let calendar = Calendar::default();
        let now = 1_800_000_000;
        let purses: Arc<[Purse]> = crate::records::purse::purses(&key, None, (&[], &[]), &calendar, now).into();
        let turns_at = purses
            .iter()
            .find_map(|p| match p.kind {
                crate::records::purse::PurseKind::Rolling { turns_at, .. } => Some(turns_at),
                _ => None,
            })
            .expect("a rolling bucket");
        let kept = Kept {
            key: key.clone(),
            account: None,
            plans: Vec::new(),
            tags: None,
            calendar: calendar.name().to_string(),
            until: turns_at,
            purses,
        };
        let under = Under::default();
        assert!(kept.holds(&key, &under, &calendar, now));
        // Its bucket turned: made again.
        assert!(!kept.holds(&key, &under, &calendar, turns_at));
        // The same content in another record (the key was written again): made again.
        let again = Arc::new((*key).clone());
        assert!(!kept.holds(&again, &under, &calendar, now));
        // Under an account now, or another calendar: made again.
        let account = Arc::new(crate::records::key::AccountRecord {
            name: "team".into(),
            budgets: Budgets::default(),
            created_at: 0,
            origin: KeyOrigin::Config,
            seed_digest: None,
            member_limit: None,
            member_policy: None,
            people: Default::default(),
            guardrails: Vec::new(),
            rates: Default::default(),
            price_multiplier: None,
            plan: None,
            claude_code: None,
            cache: None,
        });
        assert!(!kept.holds(&key, &Under { account: Some(account), ..Under::default() }, &calendar, now));
        assert!(!kept.holds(&key, &under, &Calendar::new("Asia/Tokyo").expect("zone"), now));
    }
}
