//! The balances a request is paid from (purses) and what a refusal found short. Which
//! purses a key's request draws on is decided here, from its record, its account and the
//! calendar; how a purse is held and debited is the money store's.

use crate::base::money::usd;
use crate::policy::budget::{account_purse, rolling_purse, window_purse, Budgets, Calendar, Owner};
use crate::policy::limits::TagLimit;
use crate::records::key::{AccountRecord, KeyRecord};
use std::sync::Arc;

/// One balance a request is paid from: its key's, its shared account's, or a spend window's
/// (see `policy::budget`). `credit` is what the purse may go below zero (a window's cap:
/// its balance is minus what it spent); a hold is admitted while `balance + credit − held`
/// covers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Purse {
    /// Its name in the money store: a key id, `acct:<name>` or `win:<owner>:<window>:<start>`.
    pub id: String,
    pub credit: i64,
    pub kind: PurseKind,
    /// Purses whose spend and holds count against this one's credit too (a rolling window's
    /// earlier buckets), read under the same lock as it.
    pub linked: Option<Arc<[String]>>,
}

/// What a purse is, to say why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PurseKind {
    Key,
    Account(Arc<str>),
    /// A spend window of the key (`whose: None`), or of its account or a tag value it carries
    /// (`whose` names it: "the account 'research'"), ending at `end` (unix s).
    Window {
        whose: Option<Arc<str>>,
        window: crate::policy::budget::Window,
        end: u64,
    },
    /// A rolling window of the key or its account: `secs` long; `frees_at`, when a refusal
    /// found it, the first time enough of its spend ages out to admit the call.
    Rolling {
        whose: Option<Arc<str>>,
        secs: u64,
        frees_at: Option<u64>,
        /// When this bucket stops being its window's current one.
        turns_at: u64,
    },
    /// What a plan's holder spent in the plan's period (it never refuses: the credit is in the
    /// holder's balance; it is read when the period closes).
    PlanSpend,
}

/// A plan a call is under, as the purses of a call see it: the plan, its holder's purse (a key
/// id, or `acct:<name>`), when the holder took it, and whose it is (in a refusal).
#[derive(Debug, Clone, Copy)]
pub struct PlanOf<'a> {
    pub plan: &'a crate::policy::plan::Plan,
    pub holder: &'a str,
    pub since: u64,
    pub whose: &'a str,
}

impl Purse {
    /// The purses whose spend counts against this one's credit too.
    pub fn linked(&self) -> &[String] {
        self.linked.as_deref().unwrap_or_default()
    }

    /// A rolling window's bucket that is no longer its window's current one at `now` (its
    /// change makes the window's kept sums stale).
    pub fn turned(&self, now: u64) -> bool {
        matches!(self.kind, PurseKind::Rolling { turns_at, .. } if turns_at <= now)
    }

    /// A key's own balance, alone.
    pub fn key(key_id: &str) -> Purse {
        Purse { id: key_id.to_string(), credit: 0, kind: PurseKind::Key, linked: None }
    }
}

/// The ids of the purses a booking debits besides its key's own (a record's `charged`).
pub fn charged(purses: &[Purse]) -> Vec<String> {
    purses.iter().filter(|p| p.kind != PurseKind::Key).map(|p| p.id.clone()).collect()
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
            format!("Insufficient balance: {what} ${:.6}, the key has ${:.6} available.", usd(self.needed), usd(self.available.max(0))),
        )
    }
}

/// What a member's key without an allowance may go below zero: no bound of its own (its team's
/// account is what pays, and bounds it).
const UNBOUNDED: i64 = i64::MAX / 4;

/// Whose windows a key's own budgets are: a person's key on a team (a member's key) shares them
/// with the person's other keys there; any other key has its own.
pub fn window_owner(key: &KeyRecord) -> Owner<'_> {
    match (&key.owner, key.member_of()) {
        (Some(person), Some(_)) => Owner::Person(person),
        _ => Owner::Key(&key.id),
    }
}

/// Every balance a request of this key is paid from, in the order they are checked: the
/// key's windows (a member's: the person's, summed over their keys), the account's windows, the
/// windows of the tag values it carries (`tags`: their limits), the key's balance, the
/// account's balance. A member's key (a person's key on a team) draws on the team's account:
/// its own balance bounds it only when a team admin set it an allowance.
pub fn purses(
    key: &KeyRecord,
    account: Option<&AccountRecord>,
    (tags, plans): (&[&TagLimit], &[PlanOf<'_>]),
    calendar: &Calendar,
    now: u64,
) -> Vec<Purse> {
    let count = |b: &Budgets| b.caps().count() + b.rolling.len();
    let shared = account.map_or(0, |a| count(&a.budgets))
        + tags.iter().map(|t| count(&t.budgets)).sum::<usize>()
        + plans.iter().map(|p| count(&p.plan.budgets) + 1).sum::<usize>();
    let mut out = Vec::with_capacity(count(&key.policy.budgets) + shared + 2);
    let name: Option<Arc<str>> = account.map(|a| a.name.as_str().into());
    let mut windows = |owner: Owner<'_>, whose: Option<Arc<str>>, budgets: &Budgets| {
        for (window, cap) in budgets.caps() {
            let (start, end) = calendar.window(window, now);
            out.push(Purse {
                id: window_purse(&owner, window, start),
                credit: cap,
                kind: PurseKind::Window { whose: whose.clone(), window, end },
                linked: None,
            });
        }
        for rolling in &budgets.rolling {
            let mut buckets = rolling.buckets(now).map(|(_, until)| until);
            let turns_at = now - now % rolling.bucket() + rolling.bucket();
            let Some(current) = buckets.next().map(|until| rolling_purse(&owner, rolling.secs, until)) else { continue };
            // The same list for every call until the bucket turns: made once, then shared.
            let linked =
                calendar.earlier_buckets(&current, now, || buckets.map(|until| rolling_purse(&owner, rolling.secs, until)).collect());
            out.push(Purse {
                id: current,
                credit: rolling.cap,
                kind: PurseKind::Rolling { whose: whose.clone(), secs: rolling.secs, frees_at: None, turns_at },
                linked: Some(linked),
            });
        }
    };
    windows(window_owner(key), None, &key.policy.budgets);
    if let Some(a) = account.filter(|a| !a.budgets.is_empty()) {
        windows(Owner::Account(&a.name), Some(format!("the account '{}'", a.name).into()), &a.budgets);
    }
    for tag in tags.iter().filter(|t| !t.budgets.is_empty()) {
        let id = format!("{}={}", tag.tag, tag.value);
        windows(Owner::Tag(&id), Some(tag.whose().into()), &tag.budgets);
    }
    for p in plans {
        windows(Owner::Plan(p.holder), Some(p.whose.into()), &p.plan.budgets);
    }
    for p in plans {
        let (start, _) = p.plan.period.at(p.since, now, calendar);
        let id = crate::policy::plan::credit_purse(p.holder, start);
        out.push(Purse { id, credit: UNBOUNDED, kind: PurseKind::PlanSpend, linked: None });
    }
    let credit = if key.spends_team_alone() && account.is_some() { UNBOUNDED } else { 0 };
    out.push(Purse { id: key.id.clone(), credit, kind: PurseKind::Key, linked: None });
    if let (Some(a), Some(name)) = (account, name) {
        out.push(Purse { id: account_purse(&a.name), credit: 0, kind: PurseKind::Account(name), linked: None });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::budget::Window;

    fn key(id: &str, owner: Option<&str>, account: Option<&str>, capped: bool) -> KeyRecord {
        let mut policy = crate::policy::KeyPolicy { account: account.map(str::to_string), ..Default::default() };
        policy.budgets.day = Some(1_000);
        KeyRecord {
            created_at: 0,
            policy,
            owner: owner.map(str::to_string),
            allowance_cap: capped,
            ..KeyRecord::new(id, id, "default", String::new(), crate::records::key::KeyOrigin::Identity)
        }
    }

    fn team() -> AccountRecord {
        AccountRecord {
            guardrails: Vec::new(),
            rates: Default::default(),
            price_multiplier: None,
            plan: None,
            name: "research".into(),
            budgets: Budgets::default(),
            created_at: 0,
            origin: crate::records::key::KeyOrigin::Config,
            seed_digest: None,
            member_limit: None,
            member_policy: None,
            people: Default::default(),
            claude_code: None,
            cache: None,
        }
    }

    #[test]
    fn a_members_keys_draw_on_the_team_and_share_the_persons_windows() {
        let calendar = Calendar::new("UTC").unwrap();
        let (team, now) = (team(), 86_400 * 100);
        let purse_of = |k: &KeyRecord| purses(k, Some(&team), (&[], &[]), &calendar, now);
        let (a, b) = (key("k1", Some("ada"), Some("research"), false), key("k2", Some("ada"), Some("research"), false));
        let (pa, pb) = (purse_of(&a), purse_of(&b));
        // Uncapped: the key's own purse never refuses; the team's account does.
        let own = pa.iter().find(|p| p.kind == PurseKind::Key).unwrap();
        assert!(own.credit >= i64::MAX / 8);
        assert!(pa.iter().any(|p| p.id == "acct:research" && p.credit == 0));
        // The person's day window is one purse for both keys.
        let day = |ps: &[Purse]| ps.iter().find(|p| matches!(p.kind, PurseKind::Window { window: Window::Day, .. })).unwrap().id.clone();
        assert_eq!(day(&pa), day(&pb));
        assert!(day(&pa).starts_with("win:person:ada:"));
        // An allowance set by a team admin bounds the key again; a key of nobody's keeps its own.
        let capped = purse_of(&key("k3", Some("ada"), Some("research"), true));
        assert_eq!(capped.iter().find(|p| p.kind == PurseKind::Key).unwrap().credit, 0);
        let plain = purses(&key("k4", None, Some("research"), false), Some(&team), (&[], &[]), &calendar, now);
        assert_eq!(plain.iter().find(|p| p.kind == PurseKind::Key).unwrap().credit, 0);
        assert!(day(&plain).starts_with("win:k4:"));
    }
}
