//! Alerts before money runs out (`notifications:`): what is alert-worthy is looked at every few
//! seconds on every node ([`watch`]: spend windows and plan credits crossing thresholds, low and
//! spent balances, keys about to expire, plans renewed), each alert decided once per receiver
//! into a durable outbox ([`outbox`]) and sent from there as a signed webhook (Standard
//! Webhooks), at least once, with retries for a day. Nothing of it is on the request path.

pub mod outbox;
pub mod watch;

use crate::access::auth::KeyIndex;
use crate::billing::ledger::Ledger;
use crate::charge::plans::PlanClock;
use crate::config::notifications::NotificationConfig;
use crate::policy::budget::{Calendar, Owner};
use crate::store::StoreError;
use outbox::{Delivery, Outbox};
use serde_json::json;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use watch::Event;

/// How often what is alert-worthy is looked at, and the outbox sent from.
const EVERY: std::time::Duration = std::time::Duration::from_secs(5);

pub struct Notifier {
    receivers: Vec<NotificationConfig>,
    keys: Arc<KeyIndex>,
    ledger: Arc<Ledger>,
    plans: Arc<PlanClock>,
    outbox: Outbox,
    calendar: Box<dyn Fn() -> Calendar + Send + Sync>,
    /// Alerts known to be in the outbox (no store read for them again); emptied at each prune.
    decided: Mutex<HashSet<String>>,
    /// When the outbox was last pruned (unix s).
    pruned_at: std::sync::atomic::AtomicU64,
}

/// How often the outbox is pruned of old alerts.
const PRUNE_EVERY_SECS: u64 = 3_600;

impl Notifier {
    pub fn new(
        receivers: Vec<NotificationConfig>,
        (keys, ledger, plans): (Arc<KeyIndex>, Arc<Ledger>, Arc<PlanClock>),
        jobs: Arc<dyn crate::store::JobStore>,
        calendar: Box<dyn Fn() -> Calendar + Send + Sync>,
    ) -> Notifier {
        Notifier {
            receivers,
            keys,
            ledger,
            plans,
            outbox: Outbox::new(jobs),
            calendar,
            decided: Mutex::new(HashSet::new()),
            pruned_at: Default::default(),
        }
    }

    pub fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// Every alert-worthy thing now, for receiver `n`.
    async fn scan(&self, n: &NotificationConfig, now: u64) -> Result<Vec<Event>, StoreError> {
        let calendar = (self.calendar)();
        let day = crate::base::clock::date_in(now, &jiff::tz::TimeZone::UTC);
        let mut out = Vec::new();
        for key in self.keys.all_keys().await? {
            if !key.enabled || key.revoked_at.is_some() {
                continue;
            }
            let whose = json!({"key_id": key.id, "key_name": key.name, "account": key.policy.account});
            let me = (key.id.as_str(), &whose);
            if !key.policy.budgets.is_empty() {
                let report = crate::billing::ledger::window_report(
                    &self.ledger,
                    crate::records::purse::window_owner(&key),
                    &key.policy.budgets,
                    &calendar,
                )
                .await?;
                watch::windows(n, me, &report, &day, &mut out);
            }
            let own = self.ledger.balance(&key.id).await?;
            let account = match key.policy.account.as_deref() {
                Some(name) => Some(self.ledger.balance(&crate::policy::budget::account_purse(name)).await?),
                None => None,
            };
            // A member's key without an allowance spends its team's account alone.
            let shown = if key.spends_team_alone() { account.unwrap_or(own) } else { own };
            let exhausted = (!key.spends_team_alone() && own <= 0) || account.is_some_and(|b| b <= 0);
            watch::balance(n, me, shown, exhausted, &day, &mut out);
            watch::expiry(n, me, key.policy.expires_at, now, &mut out);
            if let Some(r) = &key.plan {
                if let Some(standing) = self.plans.standing(&key.id, r, now).await? {
                    watch::plan(n, me, &standing, &mut out);
                }
            }
        }
        for account in self.keys.all_accounts().await? {
            let purse = crate::policy::budget::account_purse(&account.name);
            let whose = json!({"account": account.name});
            let it = (purse.as_str(), &whose);
            if !account.budgets.is_empty() {
                let report =
                    crate::billing::ledger::window_report(&self.ledger, Owner::Account(&account.name), &account.budgets, &calendar).await?;
                watch::windows(n, it, &report, &day, &mut out);
            }
            // An account's balance is low; "exhausted" is said of its keys.
            watch::balance(n, it, self.ledger.balance(&purse).await?, false, &day, &mut out);
            if let Some(r) = &account.plan {
                if let Some(standing) = self.plans.standing(&purse, r, now).await? {
                    watch::plan(n, it, &standing, &mut out);
                }
            }
        }
        Ok(out)
    }

    /// Decide what is alert-worthy now into the outbox: how many alerts were new.
    pub async fn decide(&self, now: u64) -> Result<usize, StoreError> {
        let mut new = 0;
        for n in &self.receivers {
            for event in self.scan(n, now).await? {
                let id = Delivery::id_of(&n.name, &event.about);
                if self.decided.lock().unwrap_or_else(|p| p.into_inner()).contains(&id) {
                    continue;
                }
                let payload =
                    json!({"type": event.kind.as_str(), "timestamp": crate::protocol::rfc3339(now), "data": event.data}).to_string();
                let d = Delivery {
                    id: id.clone(),
                    notification: n.name.clone(),
                    event: event.about,
                    kind: event.kind.as_str().to_string(),
                    owner: event.owner,
                    payload,
                    created_at: now,
                    attempts: 0,
                    next_at: now,
                    status: "pending".into(),
                    last_error: None,
                    delivered_at: None,
                };
                if self.outbox.enqueue(&d).await? {
                    log::info!("notifications: {} decided for {} ({})", d.kind, n.name, d.event);
                    new += 1;
                }
                self.decided.lock().unwrap_or_else(|p| p.into_inner()).insert(id);
            }
        }
        Ok(new)
    }

    /// Decide, then send what is due (at `first`: everything pending, a restart often follows
    /// an outage).
    pub async fn round(&self, now: u64, first: bool) -> Result<(), StoreError> {
        self.decide(now).await?;
        self.outbox.deliver(&self.receivers, now, first).await?;
        self.prune(now).await
    }

    /// Once an hour, forget old alerts (`outbox::KEPT_SECS`) and what this process remembers
    /// deciding (the outbox answers for it again).
    async fn prune(&self, now: u64) -> Result<(), StoreError> {
        use std::sync::atomic::Ordering;
        if now.saturating_sub(self.pruned_at.load(Ordering::Relaxed)) < PRUNE_EVERY_SECS {
            return Ok(());
        }
        self.pruned_at.store(now, Ordering::Relaxed);
        let n = self.outbox.prune(now).await?;
        if n > 0 {
            log::info!("notifications: {n} alerts older than {} days forgotten", outbox::KEPT_SECS / 86_400);
        }
        self.decided.lock().unwrap_or_else(|p| p.into_inner()).clear();
        Ok(())
    }
}

/// The notifier as a background service.
pub struct NotifyService(pub Arc<Notifier>);

#[async_trait::async_trait]
impl pingora_core::services::background::BackgroundService for NotifyService {
    async fn start(&self, mut shutdown: pingora_core::server::ShutdownWatch) {
        let mut first = true;
        loop {
            if let Err(e) = self.0.round(crate::base::clock::now_unix(), first).await {
                log::warn!("notifications: {e}; trying again shortly");
            } else {
                first = false;
            }
            tokio::select! {
                _ = tokio::time::sleep(EVERY) => {}
                _ = shutdown.changed() => return,
            }
        }
    }
}
