//! `notifications:`: where alerts go (signed webhooks) and which.

use super::{err, ConfigError};
use serde::Deserialize;

/// At most this many notifications.
const MAX_NOTIFICATIONS: usize = 16;
/// At most this many thresholds each.
const MAX_THRESHOLDS: usize = 10;

/// What an alert is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// A spend window (a key's, an account's, a plan's) or a plan's credit crossed a threshold.
    BudgetThreshold,
    /// A balance (a key's, an account's) fell below `balance_below`.
    BalanceLow,
    /// A key can spend no more: its balance, or its account's, is at or below zero.
    KeyExhausted,
    /// A key expires within `expiring_days`.
    KeyExpiring,
    /// A plan's credit was granted for a new period.
    PlanRenewed,
}

impl EventKind {
    pub const ALL: [EventKind; 5] =
        [EventKind::BudgetThreshold, EventKind::BalanceLow, EventKind::KeyExhausted, EventKind::KeyExpiring, EventKind::PlanRenewed];

    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::BudgetThreshold => "budget.threshold",
            EventKind::BalanceLow => "balance.low",
            EventKind::KeyExhausted => "key.exhausted",
            EventKind::KeyExpiring => "key.expiring",
            EventKind::PlanRenewed => "plan.renewed",
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNotification {
    name: String,
    url: String,
    secret_env: String,
    events: Vec<String>,
    #[serde(default)]
    thresholds: Option<Vec<f64>>,
    /// USD.
    #[serde(default)]
    balance_below: Option<f64>,
    #[serde(default)]
    expiring_days: Option<u32>,
}

/// One notification: its receiver, the Standard Webhooks secret it signs with, what it is sent.
#[derive(Debug, Clone, PartialEq)]
pub struct NotificationConfig {
    pub name: String,
    pub url: String,
    pub secret: Vec<u8>,
    pub events: Vec<EventKind>,
    /// Fractions of a cap, in millionths, ascending (80 %: 800_000).
    pub thresholds: Vec<u32>,
    /// nano-USD.
    pub balance_below: i64,
    pub expiring_days: u32,
}

impl NotificationConfig {
    pub fn wants(&self, kind: EventKind) -> bool {
        self.events.contains(&kind)
    }
}

pub(super) fn notifications(
    raw: Vec<RawNotification>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<NotificationConfig>, ConfigError> {
    if raw.len() > MAX_NOTIFICATIONS {
        return err(format!("notifications: at most {MAX_NOTIFICATIONS}"));
    }
    let mut out: Vec<NotificationConfig> = Vec::with_capacity(raw.len());
    for (i, n) in raw.into_iter().enumerate() {
        let at = format!("notifications[{i}]");
        if !((1..=64).contains(&n.name.len()) && n.name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')) {
            return err(format!("{at}.name: 1 to 64 letters, digits, '-' or '_'"));
        }
        if out.iter().any(|o| o.name == n.name) {
            return err(format!("{at}.name: '{}' is listed twice", n.name));
        }
        let uri: http::Uri = n.url.parse().map_err(|e| ConfigError(format!("{at}.url: not a URL ({e})")))?;
        if !matches!((uri.scheme_str(), uri.host()), (Some("http" | "https"), Some(_))) {
            return err(format!("{at}.url: an http:// or https:// URL"));
        }
        let secret = env(&n.secret_env)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| ConfigError(format!("{at}.secret_env: environment variable {} is not set", n.secret_env)))?;
        let secret = crate::base::secrets::webhook_secret(&secret).map_err(|e| ConfigError(format!("{at}.secret_env: {e}")))?;
        if n.events.is_empty() {
            return err(format!("{at}.events: name at least one"));
        }
        let mut events = Vec::new();
        for e in &n.events {
            let kind = EventKind::ALL.into_iter().find(|k| k.as_str() == e).ok_or_else(|| {
                ConfigError(format!(
                    "{at}.events: '{e}' is not one of budget.threshold, balance.low, key.exhausted, key.expiring, plan.renewed"
                ))
            })?;
            if !events.contains(&kind) {
                events.push(kind);
            }
        }
        let given = n.thresholds.unwrap_or_else(|| vec![0.8, 0.9, 1.0]);
        if given.is_empty() || given.len() > MAX_THRESHOLDS || given.iter().any(|t| !(t.is_finite() && *t > 0.0 && *t <= 1.0)) {
            return err(format!("{at}.thresholds: 1 to {MAX_THRESHOLDS} fractions above 0 and at most 1 (0.8 is 80 %)"));
        }
        let mut thresholds: Vec<u32> = given.iter().map(|t| (t * 1e6).round() as u32).collect();
        thresholds.sort_unstable();
        thresholds.dedup();
        let balance_below = n.balance_below.unwrap_or(1.0);
        if !(balance_below.is_finite() && (0.0..=1e9).contains(&balance_below)) {
            return err(format!("{at}.balance_below: a non-negative amount in USD"));
        }
        let expiring_days = n.expiring_days.unwrap_or(7);
        if !(1..=365).contains(&expiring_days) {
            return err(format!("{at}.expiring_days: 1 to 365"));
        }
        out.push(NotificationConfig {
            name: n.name,
            url: n.url,
            secret,
            events,
            thresholds,
            balance_below: crate::base::money::usd_to_nanos(balance_below),
            expiring_days,
        });
    }
    Ok(out)
}
