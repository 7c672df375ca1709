//! Open sign-up (`identity.signup`): a person who signs in with the identity provider and
//! belongs to no team of this gateway gets an account of their own — named after their
//! subject, with them as its team admin, the plan the file names, and the sign-up credit,
//! granted once per person whatever the nodes or sign-ins (a mark written with it). Closing
//! sign-up (`open: false`, a reload) stops new accounts; the ones made keep working. Throttled
//! per client address; limited to verified email domains when the file lists some.

use crate::access::auth::{hash_key, hex, KeyIndex};
use crate::billing::ledger::Ledger;
use crate::charge::plans::PlanClock;
use crate::config::identity::SignupConfig;
use crate::identity::Person;
use crate::records::key::{AccountRecord, KeyOrigin};
use crate::store::StoreError;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// Addresses remembered at once.
const MAX_ADDRESSES: usize = 16_384;

/// What a sign-in did about sign-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Enrolled {
    /// They belong to a team already (theirs from an earlier sign-up among them).
    Member,
    /// An account was made for them now.
    Made(String),
    /// Sign-up is closed.
    Closed,
    /// Their verified email is not of an allowed domain (or they have none).
    Domain,
    /// Too many accounts were made from their address this hour.
    Throttled,
}

pub struct Signup {
    keys: Arc<KeyIndex>,
    ledger: Arc<Ledger>,
    plans: Arc<PlanClock>,
    /// Address → (the hour, accounts made in it).
    made: Mutex<HashMap<IpAddr, (u64, u32)>>,
}

/// The account a person signs up to: theirs for good (their subject's digest).
pub fn account_name(subject: &str) -> String {
    format!("u-{}", &hex(&hash_key(subject))[..16])
}

impl Signup {
    pub fn new(keys: Arc<KeyIndex>, ledger: Arc<Ledger>, plans: Arc<PlanClock>) -> Signup {
        Signup { keys, ledger, plans, made: Mutex::new(HashMap::new()) }
    }

    /// Whether `from` may make one more account this hour (counted when it may).
    fn admit(&self, from: Option<IpAddr>, limit: u32, now: u64) -> bool {
        let Some(ip) = from else { return true };
        let hour = now / 3600;
        let mut map = self.made.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= MAX_ADDRESSES {
            map.retain(|_, (h, _)| *h == hour);
        }
        let entry = map.entry(ip).or_insert((hour, 0));
        if entry.0 != hour {
            *entry = (hour, 0);
        }
        if entry.1 >= limit {
            return false;
        }
        entry.1 += 1;
        true
    }

    /// A person signed in (from `from`): their own account made when they have no team here
    /// and sign-up is open; `person` then names it as a team they run.
    pub async fn enroll(&self, cfg: &SignupConfig, person: &mut Person, from: Option<IpAddr>) -> Result<Enrolled, StoreError> {
        if person.teams.iter().any(|t| self.keys.account(t).is_some()) {
            return Ok(Enrolled::Member);
        }
        let name = account_name(&person.subject);
        if self.keys.account(&name).is_some() {
            person.assign(&name, "team_admin");
            return Ok(Enrolled::Member);
        }
        if !cfg.open {
            return Ok(Enrolled::Closed);
        }
        if !cfg.allowed_domains.is_empty() {
            let domain = person.email.as_deref().and_then(|e| e.rsplit_once('@')).map(|(_, d)| d);
            if !domain.is_some_and(|d| cfg.allowed_domains.iter().any(|a| a == d)) {
                return Ok(Enrolled::Domain);
            }
        }
        let now = crate::base::clock::now_unix();
        if !self.admit(from, cfg.per_address_per_hour, now) {
            return Ok(Enrolled::Throttled);
        }
        let account = AccountRecord {
            name: name.clone(),
            budgets: Default::default(),
            created_at: now,
            origin: KeyOrigin::Signup,
            seed_digest: None,
            member_limit: None,
            member_policy: None,
            people: [(person.subject.clone(), "team_admin".to_string())].into_iter().collect(),
            guardrails: Vec::new(),
            rates: Default::default(),
            price_multiplier: None,
            plan: cfg
                .plan
                .clone()
                .filter(|p| self.keys.plans().get(p).is_some())
                .map(|name| crate::policy::plan::PlanRef { name, since: now }),
            claude_code: None,
            cache: None,
        };
        let purse = crate::policy::budget::account_purse(&name);
        self.ledger.open_account(&purse, 0).await?;
        self.keys.put_account(&account).await?;
        // The credit once per person, whatever the nodes and sign-ins.
        let reason = format!("sign-up credit of {} for {}", person.label(), name);
        let mark = format!("signup:{}", person.subject);
        let credited = self.ledger.top_up_once(&purse, cfg.credit_nanos, &reason, &[(&mark, cfg.credit_nanos)]).await?;
        if account.plan.is_some() {
            self.plans.tick(now).await?;
        }
        log::info!(
            "signup: {} signed up: account {name}{}",
            person.label(),
            if credited.is_some() { " with the sign-up credit" } else { "" }
        );
        person.assign(&name, "team_admin");
        Ok(Enrolled::Made(name))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_persons_account_name_is_theirs_for_good_and_a_valid_name() {
        let a = super::account_name("248289761001");
        assert_eq!(a, super::account_name("248289761001"));
        assert_ne!(a, super::account_name("248289761002"));
        assert!(crate::policy::budget::valid_account_name(&a).is_ok() && a.len() == 18, "{a}");
    }
}
