//! The balances a request is paid from (purses) and what a refusal found short. Which
//! purses a key's request draws on is decided here, from its record, its account and the
//! calendar; how a purse is held and debited is the money store's.

use crate::base::money::usd;
use crate::policy::budget::{account_purse, window_purse, Budgets, Calendar, Owner};
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
}

/// What a purse is, to say why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PurseKind {
    Key,
    Account(Arc<str>),
    /// A spend window of the key (`account: None`) or of its account, ending at `end` (unix s).
    Window {
        account: Option<Arc<str>>,
        window: crate::policy::budget::Window,
        end: u64,
    },
}

impl Purse {
    /// A key's own balance, alone.
    pub fn key(key_id: &str) -> Purse {
        Purse { id: key_id.to_string(), credit: 0, kind: PurseKind::Key }
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

/// Every balance a request of this key is paid from, in the order they are checked: the
/// key's windows, the account's windows, the key's balance, the account's balance.
pub fn purses(key: &KeyRecord, account: Option<&AccountRecord>, calendar: &Calendar, now: u64) -> Vec<Purse> {
    let account_windows = account.map_or(0, |a| a.budgets.caps().count());
    let mut out = Vec::with_capacity(key.policy.budgets.caps().count() + account_windows + 2);
    let name: Option<std::sync::Arc<str>> = account.map(|a| a.name.as_str().into());
    let mut windows = |owner: Owner<'_>, budgets: &Budgets| {
        for (window, cap) in budgets.caps() {
            let (start, end) = calendar.window(window, now);
            let of = match owner {
                Owner::Key(_) => None,
                Owner::Account(_) => name.clone(),
            };
            out.push(Purse { id: window_purse(&owner, window, start), credit: cap, kind: PurseKind::Window { account: of, window, end } });
        }
    };
    windows(Owner::Key(&key.id), &key.policy.budgets);
    if let Some(a) = account {
        windows(Owner::Account(&a.name), &a.budgets);
    }
    out.push(Purse { id: key.id.clone(), credit: 0, kind: PurseKind::Key });
    if let (Some(a), Some(name)) = (account, name) {
        out.push(Purse { id: account_purse(&a.name), credit: 0, kind: PurseKind::Account(name) });
    }
    out
}
