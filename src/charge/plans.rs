//! Plans' periods: each holder's credit granted at the start of every period and the period
//! closed once it is over (what was not spent expires, or rolls over up to the plan's cap) —
//! each exactly once, whatever the nodes of a fleet or the restarts, through the ledger's
//! marked top-ups (`Ledger::top_up_once`).
//!
//! How the money moves: the grant credits the holder's balance, so during the period the
//! holder has its balance and what is left of the credit, spent first (calls are debited from
//! the balance as always, and counted in the period's spend purse, `policy::plan::credit_purse`).
//! When the period has been over for [`CLOSE_GRACE_SECS`] (the calls admitted in it have
//! settled, and in a fleet every node has booked them), it is closed: of the credit available
//! in it (its grant and what rolled into it), what was not spent is taken back from the
//! balance, less what rolls over. So whatever the holder spent beyond the credit came out of
//! its balance, and nothing else did.

use crate::access::auth::KeyIndex;
use crate::base::money::usd;
use crate::billing::ledger::Ledger;
use crate::policy::budget::Calendar;
use crate::policy::plan::{close_mark, credit_purse, grant_mark, Plan, PlanRef};
use crate::store::StoreError;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// How long after a period ends it is closed.
pub const CLOSE_GRACE_SECS: u64 = 300;
/// The clock looks at least this often (and at every period's start and close).
const TICK_SECS: u64 = 15;

/// One holder of a plan: the purse its credit goes to (a key id or `acct:<name>`).
struct Holder {
    purse: String,
    plan: Arc<Plan>,
    since: u64,
}

/// Grants and closes the periods of every plan's holders.
pub struct PlanClock {
    keys: Arc<KeyIndex>,
    ledger: Arc<Ledger>,
    calendar: Box<dyn Fn() -> Calendar + Send + Sync>,
    /// Marks known written (no store round trip for them again).
    done: Mutex<HashSet<String>>,
    /// The values of marks read (a mark never changes once written).
    values: Mutex<std::collections::HashMap<String, i64>>,
}

/// The period before the one starting at `start`, if the holder had the plan then.
fn previous(plan: &Plan, since: u64, start: u64, calendar: &Calendar) -> Option<(u64, u64)> {
    (start > since).then(|| plan.period.at(since, start - 1, calendar)).filter(|(s, _)| *s < start)
}

impl PlanClock {
    pub fn new(keys: Arc<KeyIndex>, ledger: Arc<Ledger>, calendar: Box<dyn Fn() -> Calendar + Send + Sync>) -> PlanClock {
        PlanClock { keys, ledger, calendar, done: Mutex::new(HashSet::new()), values: Mutex::new(Default::default()) }
    }

    /// The value written with `mark`, if it was (read from the store once).
    async fn mark(&self, mark: &str) -> Result<Option<i64>, StoreError> {
        if let Some(v) = self.values.lock().unwrap_or_else(|p| p.into_inner()).get(mark) {
            return Ok(Some(*v));
        }
        let value = self.ledger.mark(mark).await?;
        if let Some(v) = value {
            self.values.lock().unwrap_or_else(|p| p.into_inner()).insert(mark.to_string(), v);
        }
        Ok(value)
    }

    fn known(&self, mark: &str) -> bool {
        self.done.lock().unwrap_or_else(|p| p.into_inner()).contains(mark)
    }

    fn remember(&self, mark: String) {
        self.done.lock().unwrap_or_else(|p| p.into_inner()).insert(mark);
    }

    /// Every holder of a plan the file still has.
    async fn holders(&self) -> Result<Vec<Holder>, StoreError> {
        let plans = self.keys.plans();
        if plans.is_empty() {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        let mut add = |purse: String, r: &PlanRef| {
            if let Some(plan) = plans.get(&r.name) {
                out.push(Holder { purse, plan: plan.clone(), since: r.since });
            }
        };
        for key in self.keys.all_keys().await? {
            if let (Some(r), true) = (&key.plan, key.revoked_at.is_none()) {
                add(key.id.clone(), r);
            }
        }
        for account in self.keys.all_accounts().await? {
            if let Some(r) = &account.plan {
                add(crate::policy::budget::account_purse(&account.name), r);
            }
        }
        Ok(out)
    }

    /// Grant what is due and close what is over, for every holder; the time of the next
    /// start or close.
    pub async fn tick(&self, now: u64) -> Result<u64, StoreError> {
        let calendar = (self.calendar)();
        let mut next = now + TICK_SECS;
        for h in self.holders().await? {
            let (start, end) = h.plan.period.at(h.since, now, &calendar);
            self.grant(&h, start).await?;
            if let Some((prev, prev_end)) = previous(&h.plan, h.since, start, &calendar) {
                match now >= prev_end + CLOSE_GRACE_SECS {
                    true => self.close(&h, prev, &calendar, false).await?,
                    false => next = next.min(prev_end + CLOSE_GRACE_SECS),
                }
            }
            next = next.min(end);
        }
        Ok(next.max(now + 1))
    }

    /// Grant the period starting at `start` its credit, once.
    async fn grant(&self, h: &Holder, start: u64) -> Result<(), StoreError> {
        let mark = grant_mark(&h.purse, &h.plan.name, start);
        if self.known(&mark) {
            return Ok(());
        }
        let when = crate::protocol::rfc3339(start);
        let reason =
            format!("plan {}: credit ${:.6} for the {} period from {when}", h.plan.name, usd(h.plan.credit), h.plan.period.label());
        if self.ledger.top_up_once(&h.purse, h.plan.credit, &reason, &[(&mark, h.plan.credit)]).await?.is_some() {
            log::info!("plan {}: {} granted ${:.6} for the period from {when}", h.plan.name, h.purse, usd(h.plan.credit));
        }
        self.remember(mark);
        Ok(())
    }

    /// Close the period starting at `start` once: what of its credit was not spent expires,
    /// less what rolls over (`early`: the holder left the plan; nothing rolls over).
    async fn close(&self, h: &Holder, start: u64, calendar: &Calendar, early: bool) -> Result<(), StoreError> {
        let mark = close_mark(&h.purse, &h.plan.name, start);
        if self.known(&mark) {
            return Ok(());
        }
        let Some(granted) = self.mark(&grant_mark(&h.purse, &h.plan.name, start)).await? else {
            // Nothing was granted in it (no node ran through it): nothing to close.
            self.remember(mark);
            return Ok(());
        };
        // What rolled into it: what the close of the period before kept.
        let carried = match previous(&h.plan, h.since, start, calendar) {
            Some((before, _)) => self.mark(&close_mark(&h.purse, &h.plan.name, before)).await?.unwrap_or(0),
            None => 0,
        };
        let spent_purse = credit_purse(&h.purse, start);
        let spent = self.ledger.balance(&spent_purse).await?.saturating_neg().saturating_add(self.ledger.held(&spent_purse));
        let mut closing = h.plan.close(granted.saturating_add(carried), spent);
        if early {
            closing.expired = closing.unused;
            closing.kept = 0;
        }
        let reason = format!(
            "plan {}: period from {} closed: ${:.6} of ${:.6} spent, ${:.6} rolls over, ${:.6} expires",
            h.plan.name,
            crate::protocol::rfc3339(start),
            usd(spent.max(0)),
            usd(granted.saturating_add(carried)),
            usd(closing.kept),
            usd(closing.expired)
        );
        self.ledger.top_up_once(&h.purse, -closing.expired, &reason, &[(&mark, closing.kept)]).await?;
        self.remember(mark);
        Ok(())
    }

    /// A holder leaves a plan (another plan assigned, or none): its current period is closed
    /// at once, its unused credit expiring (nothing rolls over into another plan).
    pub async fn leave(&self, purse: &str, old: &PlanRef, now: u64) -> Result<(), StoreError> {
        let Some(plan) = self.keys.plans().get(&old.name).cloned() else { return Ok(()) };
        let calendar = (self.calendar)();
        let h = Holder { purse: purse.to_string(), plan, since: old.since };
        let (start, _) = h.plan.period.at(h.since, now, &calendar);
        if let Some((prev, _)) = previous(&h.plan, h.since, start, &calendar) {
            self.close(&h, prev, &calendar, false).await?;
        }
        self.close(&h, start, &calendar, true).await
    }

    /// A holder's plan set from `current` to `to` (a plan the file has, or none) by `via`
    /// ("the admin API", "a redemption code"): the old one left, the change audited on the
    /// holder's purse. The caller stores the holder's record with `current` as changed. False
    /// when it already had that plan.
    pub async fn switch(
        &self,
        purse: &str,
        who: &str,
        current: &mut Option<PlanRef>,
        to: Option<String>,
        via: &str,
    ) -> Result<bool, StoreError> {
        if current.as_ref().map(|p| &p.name) == to.as_ref() {
            return Ok(false);
        }
        let now = crate::base::clock::now_unix();
        if let Some(old) = current.as_ref() {
            self.leave(purse, old, now).await?;
        }
        *current = to.map(|name| PlanRef { name, since: now });
        let why = format!("plan of {who} set to {} through {via}", current.as_ref().map_or("none", |p| p.name.as_str()));
        self.ledger.top_up_because(purse, 0, Some(&why)).await?;
        Ok(true)
    }

    /// Where a holder stands in its plan now: the period, what was granted and carried into
    /// it, what it spent of it and what is left (the plan's part of `/v1/usage`).
    pub async fn standing(&self, purse: &str, r: &PlanRef, now: u64) -> Result<Option<serde_json::Value>, StoreError> {
        let Some(plan) = self.keys.plans().get(&r.name).cloned() else { return Ok(None) };
        let calendar = (self.calendar)();
        let (start, end) = plan.period.at(r.since, now, &calendar);
        let granted = self.mark(&grant_mark(purse, &plan.name, start)).await?;
        let carried = match previous(&plan, r.since, start, &calendar) {
            Some((before, _)) => self.mark(&close_mark(purse, &plan.name, before)).await?.unwrap_or(0),
            None => 0,
        };
        let spent_purse = credit_purse(purse, start);
        let spent = self.ledger.balance(&spent_purse).await?.saturating_neg().max(0);
        let available = granted.unwrap_or(0).saturating_add(carried);
        Ok(Some(serde_json::json!({
            "name": plan.name,
            "period": plan.period.label(),
            "period_start": crate::protocol::rfc3339(start),
            "renews_at": crate::protocol::rfc3339(end),
            "credit": usd(plan.credit),
            "granted": granted.is_some(),
            "carried_over": usd(carried),
            "spent": usd(spent),
            "left": usd(available.saturating_sub(spent).max(0)),
        })))
    }
}

/// The clock as a background service: a tick at start (a node that was down at a boundary
/// grants what is due), then at every start and close, and every few seconds.
pub struct PlanService(pub Arc<PlanClock>);

#[async_trait::async_trait]
impl pingora_core::services::background::BackgroundService for PlanService {
    async fn start(&self, shutdown: pingora_core::server::ShutdownWatch) {
        run(self.0.clone(), shutdown).await
    }
}

async fn run(clock: Arc<PlanClock>, mut shutdown: pingora_core::server::ShutdownWatch) {
    loop {
        let now = crate::base::clock::now_unix();
        let next = match clock.tick(now).await {
            Ok(next) => next,
            Err(e) => {
                log::warn!("plans: {e}; trying again shortly");
                now + TICK_SECS
            }
        };
        let wait = std::time::Duration::from_secs(next.saturating_sub(crate::base::clock::now_unix()).clamp(1, TICK_SECS));
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::budget::Window;
    use crate::policy::plan::{Period, Rollover};

    #[test]
    fn the_period_before_is_the_holders_only_when_it_had_the_plan_then() {
        let calendar = Calendar::new("UTC").expect("utc");
        let plan = |period| Plan {
            name: "p".into(),
            credit: 1,
            period,
            rollover: Rollover::None,
            budgets: Default::default(),
            rates: Default::default(),
            models: None,
            price_multiplier: None,
        };
        let day = plan(Period::Calendar(Window::Day));
        let since = 86_400 * 10 + 3_600;
        assert_eq!(previous(&day, since, 86_400 * 11, &calendar), Some((86_400 * 10, 86_400 * 11)));
        assert_eq!(previous(&day, since, 86_400 * 10, &calendar), None, "taken during the period: none before");
        let every = plan(Period::Every(86_400 * 30));
        assert_eq!(previous(&every, since, since, &calendar), None);
        assert_eq!(previous(&every, since, since + 86_400 * 30, &calendar), Some((since, since + 86_400 * 30)));
    }
}
