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

/// The money of every call: admission here, settlement in [`Books`].
pub struct Charge {
    books: Books,
    limits: Arc<Limits>,
    keys: Arc<KeyIndex>,
    plans: Option<Arc<super::plans::PlanClock>>,
}

impl Charge {
    pub fn new(books: Books, limits: Arc<Limits>, keys: Arc<KeyIndex>) -> Self {
        Charge { books, limits, keys, plans: None }
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

    /// Admit a call of `key` as `entry` says: counted, solvent, in a slot (held while the
    /// returned slot lives).
    pub async fn admit(&self, key: &KeyRecord, calendar: &Calendar, entry: Entry) -> Result<Option<Slot>, ApiError> {
        if let Some(bucket) = entry.count {
            self.count(key, bucket).await?;
        }
        if entry.solvent {
            self.solvent(key, calendar).await?;
        }
        match entry.slot {
            true => self.enter(key).await,
            false => Ok(None),
        }
    }

    /// What a call of `key` counts against, in the order they are checked: the key, its
    /// account, the tag values it carries that have limits (`policy::limits`), its plans. A key
    /// under none (the common case) allocates nothing.
    fn limited<'k>(&self, key: &'k KeyRecord) -> Subjects<'k> {
        let found = self.keys.account_of(key);
        let tags = match key.policy.tags.is_empty() {
            true => None,
            false => Some(self.keys.tag_limits()).filter(|t| t.of(&key.policy.tags).any(|t| !t.rates.is_empty())),
        };
        let mut plans = self.keys.subscribed(key, found.as_ref());
        plans.retain(|s| !s.plan.rates.is_empty());
        let account = found.filter(|a| !a.rates.is_empty());
        if account.is_none() && tags.is_none() && plans.is_empty() {
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
        for s in plans {
            all.push(Limited { id: format!("plan:{}", s.holder(key)).into(), rates: s.plan.rates, whose: s.whose().into() });
        }
        Subjects::Many(all)
    }

    /// Count a call of `key` in `bucket`: 429 with `Retry-After` past its limit (a request: the
    /// key's, its account's, its tag values').
    pub async fn count(&self, key: &KeyRecord, bucket: Bucket) -> Result<(), ApiError> {
        match bucket {
            Bucket::Requests => self.limits.admit_all(self.limited(key).all()).await,
            Bucket::ToolCalls => self.limits.admit_tool_call(key).await,
        }
    }

    /// The call counts against every `max_concurrent` it is under while the slot lives (None:
    /// no cap).
    pub async fn enter(&self, key: &KeyRecord) -> Result<Option<Slot>, ApiError> {
        self.limits.enter_all(self.limited(key).all()).await
    }

    /// Reserve the tokens a call is held for under every `tpm` it is under until it settles
    /// (None: no `tpm`).
    pub fn reserve_tokens(&self, key: &KeyRecord, tokens: u64) -> Result<Option<TokenReservation>, ApiError> {
        self.limits.reserve_tokens_all(self.limited(key).all(), tokens)
    }

    /// Count the tokens a finished call used under every `tpm` it is under.
    pub async fn spend_tokens(&self, key: &KeyRecord, tokens: u64) {
        self.limits.spend_tokens_all(self.limited(key).all(), tokens).await
    }

    /// What a call of `key` is paid from, in the order of checks: its spend windows, its
    /// account's, its tag values', its plans' (and what it spends in their periods), its
    /// balance, its account's balance. A key whose account this node does not know (yet) is
    /// refused for now.
    pub fn purses(&self, key: &KeyRecord, calendar: &Calendar) -> Result<Vec<Purse>, ApiError> {
        // Only a key with tags loads the tag limits.
        let tag_limits = (!key.policy.tags.is_empty()).then(|| self.keys.tag_limits());
        let tags: Vec<&crate::policy::limits::TagLimit> =
            tag_limits.iter().flat_map(|t| t.of(&key.policy.tags)).filter(|t| !t.budgets.is_empty()).collect();
        if key.policy.account.is_none() && key.policy.budgets.is_empty() && tags.is_empty() && key.plan.is_none() {
            return Ok(vec![Purse::key(&key.id)]);
        }
        let account = match &key.policy.account {
            Some(name) => Some(self.keys.account(name).ok_or_else(|| crate::store::fleet::unavailable("the key's account"))?),
            None => None,
        };
        let subscribed = self.keys.subscribed(key, account.as_ref());
        // Whose a plan is, only for a plan with windows (what their refusal names).
        let named: Vec<(std::borrow::Cow<'_, str>, String)> =
            subscribed.iter().map(|s| (s.holder(key), if s.plan.budgets.is_empty() { String::new() } else { s.whose() })).collect();
        let plans: Vec<crate::records::purse::PlanOf<'_>> = subscribed
            .iter()
            .zip(&named)
            .map(|(s, (holder, whose))| crate::records::purse::PlanOf { plan: &s.plan, holder, since: s.since, whose })
            .collect();
        Ok(crate::records::purse::purses(key, account.as_deref(), (&tags, &plans), calendar, crate::base::clock::now_unix()))
    }

    /// The price multiplier a call of `key` is charged at (`KeyIndex::price_multiplier`).
    pub fn rate(&self, key: &KeyRecord) -> Multiplier {
        self.keys.price_multiplier(key).0
    }

    /// What a call of `key` pays from and at which multiplier (a kind that charges up front).
    pub fn payment(&self, key: &KeyRecord, calendar: &Calendar) -> Result<super::Payment, ApiError> {
        Ok(super::Payment { purses: self.purses(key, calendar)?, rate: self.rate(key), plan_models: self.plan_models(key) })
    }

    /// The model rules of the plans a call of `key` is under (`checks::Subject::plans`).
    pub fn plan_models(&self, key: &KeyRecord) -> Vec<crate::policy::plan::PlanModels> {
        if key.plan.is_none() && key.policy.account.is_none() {
            return Vec::new();
        }
        let subscribed = self.keys.subscribed(key, self.keys.account_of(key).as_ref());
        subscribed
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
        match self.hold(self.purses(key, calendar)?, amount, self.rate(key)).await? {
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
