//! What is alert-worthy now: the spend windows, balances, expiries and plans of every key and
//! account, looked at every few seconds (nothing on the request path). Each alert is named by
//! what it is about so that it is decided once: a window's threshold once per window (a rolling
//! window: once per day), a low or spent balance once per day while it lasts, an expiry once
//! per date, a plan's renewal once per period.

use crate::config::notifications::{EventKind, NotificationConfig};
use crate::policy::budget::Owner;
use serde_json::{json, Value};

/// One alert as decided: what it is, what it is about (its name, see the module doc), whose it
/// is (a key id or `acct:<name>`), and what the receiver is told.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub kind: EventKind,
    pub about: String,
    pub owner: String,
    pub data: Value,
}

/// The thresholds of `n` that `spent` of `cap` reached, as (millionths, label).
fn reached(n: &NotificationConfig, spent: i64, cap: i64) -> impl Iterator<Item = u32> + '_ {
    n.thresholds.iter().copied().filter(move |t| cap > 0 && i128::from(spent) * 1_000_000 >= i128::from(cap) * i128::from(*t))
}

fn nanos(v: &Value) -> i64 {
    v.as_f64().map_or(0, crate::base::money::usd_to_nanos)
}

/// The thresholds crossed by the windows of a report (`billing::ledger::window_report`'s) of
/// `owner` (named `whose` to the receiver); `day` names a rolling window's once-per-day.
pub fn windows(n: &NotificationConfig, (owner, whose): (&str, &Value), report: &Value, day: &str, out: &mut Vec<Event>) {
    if !n.wants(EventKind::BudgetThreshold) {
        return;
    }
    let Some(windows) = report.as_object() else { return };
    for (name, w) in windows {
        let (cap, spent) = (nanos(&w["cap"]), nanos(&w["spent"]));
        let period = w["start"].as_str().unwrap_or(day);
        for t in reached(n, spent, cap) {
            out.push(Event {
                kind: EventKind::BudgetThreshold,
                about: format!("budget.threshold:{owner}:{name}:{period}:{t}"),
                owner: owner.to_string(),
                data: json!({
                    "whose": whose, "window": name, "threshold": f64::from(t) / 1e6,
                    "cap": w["cap"], "spent": w["spent"], "start": w["start"], "end": w["end"],
                }),
            });
        }
    }
}

/// A plan's credit: its thresholds, and its renewal (the standing of `charge::plans`).
pub fn plan(n: &NotificationConfig, (owner, whose): (&str, &Value), standing: &Value, out: &mut Vec<Event>) {
    let Some(name) = standing["name"].as_str() else { return };
    let period = standing["period_start"].as_str().unwrap_or_default();
    if n.wants(EventKind::PlanRenewed) && standing["granted"] == true {
        out.push(Event {
            kind: EventKind::PlanRenewed,
            about: format!("plan.renewed:{owner}:{name}:{period}"),
            owner: owner.to_string(),
            data: json!({"whose": whose, "plan": name, "credit": standing["credit"], "carried_over": standing["carried_over"],
                         "period_start": period, "renews_at": standing["renews_at"]}),
        });
    }
    if n.wants(EventKind::BudgetThreshold) && standing["granted"] == true {
        let available = nanos(&standing["left"]).saturating_add(nanos(&standing["spent"]));
        for t in reached(n, nanos(&standing["spent"]), available) {
            out.push(Event {
                kind: EventKind::BudgetThreshold,
                about: format!("budget.threshold:{owner}:plan:{name}:{period}:{t}"),
                owner: owner.to_string(),
                data: json!({"whose": whose, "plan": name, "threshold": f64::from(t) / 1e6, "credit": standing["credit"],
                             "spent": standing["spent"], "left": standing["left"], "renews_at": standing["renews_at"]}),
            });
        }
    }
}

/// A balance below the receiver's `balance_below` (once per day while it lasts), and a key that
/// can spend no more (`exhausted`: its balance, or its account's, at or below zero).
pub fn balance(n: &NotificationConfig, (owner, whose): (&str, &Value), balance: i64, exhausted: bool, day: &str, out: &mut Vec<Event>) {
    if n.wants(EventKind::BalanceLow) && balance < n.balance_below {
        out.push(Event {
            kind: EventKind::BalanceLow,
            about: format!("balance.low:{owner}:{day}"),
            owner: owner.to_string(),
            data: json!({"whose": whose, "balance": crate::base::money::usd(balance), "below": crate::base::money::usd(n.balance_below)}),
        });
    }
    if n.wants(EventKind::KeyExhausted) && exhausted {
        out.push(Event {
            kind: EventKind::KeyExhausted,
            about: format!("key.exhausted:{owner}:{day}"),
            owner: owner.to_string(),
            data: json!({"whose": whose, "balance": crate::base::money::usd(balance)}),
        });
    }
}

/// A key that expires within the receiver's `expiring_days`.
pub fn expiry(n: &NotificationConfig, (owner, whose): (&str, &Value), expires_at: Option<u64>, now: u64, out: &mut Vec<Event>) {
    let Some(at) = expires_at.filter(|at| *at > now && at - now <= u64::from(n.expiring_days) * 86_400) else { return };
    if n.wants(EventKind::KeyExpiring) {
        out.push(Event {
            kind: EventKind::KeyExpiring,
            about: format!("key.expiring:{owner}:{at}"),
            owner: owner.to_string(),
            data: json!({"whose": whose, "expires_at": crate::protocol::rfc3339(at), "days_left": (at - now).div_ceil(86_400)}),
        });
    }
}

/// The owner string of a window owner, for alerts' names.
pub fn owner_name(owner: &Owner<'_>) -> String {
    match owner {
        Owner::Key(id) => (*id).to_string(),
        Owner::Account(name) => crate::policy::budget::account_purse(name),
        Owner::Person(s) => format!("person:{s}"),
        Owner::Tag(t) => format!("tag:{t}"),
        Owner::Plan(h) => format!("plan:{h}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receiver(events: Vec<EventKind>) -> NotificationConfig {
        NotificationConfig {
            name: "ops".into(),
            url: "http://127.0.0.1:1/".into(),
            secret: b"0123456789abcdef".to_vec(),
            events,
            thresholds: vec![800_000, 900_000, 1_000_000],
            balance_below: 1_000_000_000,
            expiring_days: 7,
        }
    }

    #[test]
    fn a_windows_thresholds_are_each_decided_once_per_window() {
        let n = receiver(vec![EventKind::BudgetThreshold]);
        let report =
            json!({"day": {"cap": 10.0, "spent": 9.0, "start": "2026-12-01T00:00:00Z"}, "5h": {"cap": 2.0, "spent": 1.0, "rolling": true}});
        let mut out = Vec::new();
        windows(&n, ("key_1", &json!({"key": "key_1"})), &report, "2026-12-01", &mut out);
        let names: Vec<&str> = out.iter().map(|e| e.about.as_str()).collect();
        assert_eq!(
            names,
            ["budget.threshold:key_1:day:2026-12-01T00:00:00Z:800000", "budget.threshold:key_1:day:2026-12-01T00:00:00Z:900000"]
        );
        // Not asked for: nothing.
        let mut none = Vec::new();
        windows(&receiver(vec![EventKind::BalanceLow]), ("key_1", &Value::Null), &report, "d", &mut none);
        assert!(none.is_empty());
    }

    #[test]
    fn balances_and_expiries_are_named_by_day_and_date() {
        let n = receiver(EventKind::ALL.to_vec());
        let mut out = Vec::new();
        balance(&n, ("key_1", &Value::Null), 500_000_000, false, "2026-12-01", &mut out);
        balance(&n, ("key_2", &Value::Null), 0, true, "2026-12-01", &mut out);
        expiry(&n, ("key_1", &Value::Null), Some(1_000 + 3 * 86_400), 1_000, &mut out);
        expiry(&n, ("key_1", &Value::Null), Some(1_000 + 30 * 86_400), 1_000, &mut out);
        let names: Vec<&str> = out.iter().map(|e| e.about.as_str()).collect();
        assert_eq!(
            names,
            ["balance.low:key_1:2026-12-01", "balance.low:key_2:2026-12-01", "key.exhausted:key_2:2026-12-01", "key.expiring:key_1:260200"]
        );
    }
}
