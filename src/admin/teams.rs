//! What a team is besides its account's money: the people an operator put in it with their
//! roles, and the ceilings on its members' keys (the operator's `member_limit`, the team
//! admin's `member_policy`), as the admin API and the console take and show them.

use crate::admin::refusal::{bad, policy_error};
use crate::base::money::usd;
use crate::protocol::ApiError;
use serde::Deserialize;
use serde_json::{json, Value};

/// The most people an account lists.
const MAX_PEOPLE: usize = 10_000;

/// Set or remove people of `account` (email or subject → role, `None` removes).
pub(crate) fn set_people(
    account: &mut crate::records::key::AccountRecord,
    changes: std::collections::BTreeMap<String, Option<String>>,
) -> std::result::Result<(), ApiError> {
    for (who, role) in changes {
        let who = who.trim().to_string();
        if who.is_empty() || who.len() > 255 || who.chars().any(char::is_control) {
            return Err(bad("people: each person is an email or the provider's subject (1 to 255 characters)").with_param("people"));
        }
        let who = if who.contains('@') { who.to_ascii_lowercase() } else { who };
        match role {
            None => {
                account.people.remove(&who);
            }
            Some(role) if crate::identity::Role::parse(&role).is_some() => {
                account.people.insert(who, role);
            }
            Some(role) => return Err(bad(format!("people: '{role}' is not a role (member, team_admin, operator)")).with_param("people")),
        }
    }
    if account.people.len() > MAX_PEOPLE {
        return Err(bad(format!("people: at most {MAX_PEOPLE} per account")).with_param("people"));
    }
    Ok(())
}

/// A ceiling as the admin API and the console take it: budgets in USD.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct CeilingInput {
    #[serde(default)]
    pub models: Option<Vec<String>>,
    #[serde(default)]
    pub rpm: Option<u32>,
    #[serde(default)]
    pub tpm: Option<u64>,
    #[serde(default)]
    pub budgets: Option<crate::policy::budget::BudgetsInput>,
    #[serde(default)]
    pub max_days: Option<u32>,
}

impl CeilingInput {
    /// The ceiling, or the refusal naming its field.
    pub(crate) fn parse(self) -> std::result::Result<crate::records::key::Ceiling, ApiError> {
        if let Some(models) = &self.models {
            crate::policy::ModelRules { allow: Some(models.clone()), deny: Vec::new() }
                .validate()
                .map_err(|e| bad(e.to_string()).with_param("models"))?;
        }
        if self.max_days == Some(0) || self.rpm == Some(0) || self.tpm == Some(0) {
            return Err(bad("rpm, tpm and max_days: at least 1 (leave one out for no bound)"));
        }
        let budgets =
            self.budgets.as_ref().map(crate::policy::budget::Budgets::parse).transpose().map_err(policy_error)?.unwrap_or_default();
        if let Some(r) = budgets.rolling.first() {
            // A ceiling bounds each member key's calendar windows; a rolling one is not one of them.
            return Err(bad(format!("budgets.{}: a member ceiling takes day, week and month", r.label()))
                .with_param(&format!("budgets.{}", r.label())));
        }
        Ok(crate::records::key::Ceiling { models: self.models, rpm: self.rpm, tpm: self.tpm, budgets, max_days: self.max_days })
    }
}

/// A ceiling as the admin API shows it: budgets in USD.
pub(crate) fn ceiling_view(c: &crate::records::key::Ceiling) -> Value {
    let b = |v: Option<i64>| v.map(usd);
    json!({"models": c.models, "rpm": c.rpm, "tpm": c.tpm, "max_days": c.max_days,
           "budgets": {"day": b(c.budgets.day), "week": b(c.budgets.week), "month": b(c.budgets.month)}})
}
