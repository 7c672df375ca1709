//! Keys and shared accounts as persisted, and what a lookup of a key finds. Their policy
//! (expiry, model rules, addresses, budgets) is `policy`'s; the index and the stores that
//! keep them are `store`'s.

use crate::policy::budget::Budgets;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// What an authentication finds in the key index.
#[derive(Debug, Clone, PartialEq)]
pub enum KeyLookup {
    Found(Arc<KeyRecord>),
    Unknown,
    /// The index is older than the staleness bound (a fleet node cut off from its database):
    /// refuse (503) rather than guess whether the key was revoked meanwhile.
    Stale,
}

/// One API key as persisted.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct KeyRecord {
    pub id: String,
    pub name: String,
    pub group: String,
    /// Hex SHA-256 of the secret.
    pub key_hash: String,
    #[serde(default)]
    pub rpm: Option<u32>,
    #[serde(default)]
    pub tpm: Option<u64>,
    pub enabled: bool,
    pub created_at: u64,
    /// Requests of this key in flight at once (None: no cap).
    #[serde(default)]
    pub max_concurrent: Option<u32>,
    /// Where the key comes from: the configuration file or the admin API.
    #[serde(default)]
    pub origin: KeyOrigin,
    /// For a key from the file: a digest of the file entry last applied. While the entry is
    /// unchanged, changes made through the admin API stand; None once the file dropped the key.
    #[serde(default)]
    pub seed_digest: Option<String>,
    /// Revoked by the operator at this unix time (`DELETE /admin/keys/{id}`): refused from then
    /// on, for good (the file and `PATCH` cannot enable it again); its records are kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<u64>,
    /// The secret this key had before its last rotation, still accepted until a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotated: Option<Rotation>,
    /// Expiry, model rules, address allowlist (see `policy`).
    #[serde(default, skip_serializing_if = "crate::policy::KeyPolicy::is_empty")]
    pub policy: crate::policy::KeyPolicy,
    /// The person (the identity provider's subject) a key belongs to: their own keys, made by
    /// them in the console or at their first call with a token; None for keys made by an
    /// operator or the configuration file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// A member's key (a person's, on a team): its own balance is a personal allowance that
    /// bounds it, set by a team admin. Without one it draws on the team's account alone (its
    /// balance then counts what it spent, below zero).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allowance_cap: bool,
    /// The plan the key subscribes to (its credit is granted to the key's balance).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<crate::policy::plan::PlanRef>,
}

/// The previous secret of a rotated key and the end of its grace period.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Rotation {
    /// Hex SHA-256 of the previous secret.
    pub previous_hash: String,
    /// Unix time (seconds) until which the previous secret is accepted.
    pub until: u64,
}

impl KeyRecord {
    /// A key of `origin`, made now: enabled, with no limits, policy, owner or rotation — what
    /// each maker sets on it (`KeyRecord { rpm, policy, ..KeyRecord::new(..) }`).
    pub fn new(
        id: impl Into<String>,
        name: impl Into<String>,
        group: impl Into<String>,
        key_hash: impl Into<String>,
        origin: KeyOrigin,
    ) -> KeyRecord {
        KeyRecord {
            id: id.into(),
            name: name.into(),
            group: group.into(),
            key_hash: key_hash.into(),
            rpm: None,
            tpm: None,
            enabled: true,
            created_at: crate::base::clock::now_unix(),
            max_concurrent: None,
            origin,
            seed_digest: None,
            revoked_at: None,
            rotated: None,
            policy: crate::policy::KeyPolicy::default(),
            owner: None,
            allowance_cap: false,
            plan: None,
        }
    }

    /// The team a member's key draws on: a person's key on an account.
    pub fn member_of(&self) -> Option<&str> {
        self.owner.as_ref().and(self.policy.account.as_deref())
    }

    /// A member's key without an allowance: its own balance bounds nothing (it counts what the
    /// key spent); its team's account is what it spends.
    pub fn spends_team_alone(&self) -> bool {
        self.member_of().is_some() && !self.allowance_cap
    }

    /// The hashes a secret of this key may have now: the current one, and the previous one
    /// while its grace period lasts.
    pub fn hashes(&self, now: u64) -> impl Iterator<Item = &str> {
        let previous = self.rotated.as_ref().filter(|r| now < r.until).map(|r| r.previous_hash.as_str());
        std::iter::once(self.key_hash.as_str()).chain(previous)
    }
}

/// Where a key record comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyOrigin {
    /// Written before origins were recorded: the file never disables it.
    #[default]
    Unknown,
    /// Seeded from `keys:` in the configuration file.
    Config,
    /// Created through the admin API; the file never changes it.
    Admin,
    /// A person's key, made when they first called with the identity provider's token; found
    /// by their subject, not by a secret.
    Identity,
    /// An account made for a person who signed up (`identity.signup`).
    Signup,
}

/// A shared account: keys that name it draw on its balance and its windows as well as their
/// own. Its balance is in the money store ([`crate::policy::budget::account_purse`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountRecord {
    pub name: String,
    #[serde(default, skip_serializing_if = "Budgets::is_empty")]
    pub budgets: Budgets,
    pub created_at: u64,
    /// Where it comes from: the configuration file or the admin API.
    #[serde(default)]
    pub origin: KeyOrigin,
    /// For an account from the file: a digest of the entry last applied (as for keys).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed_digest: Option<String>,
    /// The most an operator lets the team's admins allow their members' keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_limit: Option<Ceiling>,
    /// What the team's admins allow their members' keys (within `member_limit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_policy: Option<Ceiling>,
    /// People an operator put in the team, by the provider's subject or by email (lowercase; it
    /// matches only an email the provider verified), with their role here (`member`,
    /// `team_admin`, `operator`): besides the provider's claims.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub people: std::collections::BTreeMap<String, String>,
    /// Guardrails (by name) every call of its keys goes through (`accounts[].guardrails`, or
    /// the admin API).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub guardrails: Vec<String>,
    /// Requests and tokens per minute and requests in flight of all its keys together.
    #[serde(default, flatten)]
    pub rates: crate::policy::limits::RateLimits,
    /// What its keys are charged of the price table, before their group's multiplier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price_multiplier: Option<crate::base::money::Multiplier>,
    /// The plan the account subscribes to (its credit is granted to the account's balance).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<crate::policy::plan::PlanRef>,
    /// Claude Code's managed settings of the team, set in the console or the admin API: merged
    /// over the file's `identity.claude_code.settings` (default, then the team's) for its people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claude_code: Option<serde_json::Map<String, serde_json::Value>>,
    /// Its keys' response-cache entry (before their group's; a key's own comes first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<crate::policy::cache::CachePolicy>,
}

impl AccountRecord {
    /// The role an operator gave the person with `subject` and `verified_email` (an email their
    /// provider vouches for, never a name they chose) here, if any.
    pub fn role_of(&self, subject: &str, verified_email: Option<&str>) -> Option<&str> {
        self.people.get(subject).or_else(|| verified_email.and_then(|e| self.people.get(&e.to_ascii_lowercase()))).map(String::as_str)
    }
}

/// The most a team's members' keys may do: the models they may call, their rates, their spend
/// per window and how long they live. A field left out sets no bound.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ceiling {
    /// Model names or prefixes ending in `*`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rpm: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpm: Option<u64>,
    /// Spend per window (nano-USD).
    #[serde(default, skip_serializing_if = "Budgets::is_empty")]
    pub budgets: Budgets,
    /// The longest a member's key lives, in days.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_days: Option<u32>,
}

/// Whether model pattern `pattern` (a name, or a prefix ending in `*`) covers every model
/// `wanted` (the same kind) names.
fn covers(pattern: &str, wanted: &str) -> bool {
    match (pattern.strip_suffix('*'), wanted.strip_suffix('*')) {
        (Some(p), Some(w)) => w.starts_with(p),
        (Some(p), None) => wanted.starts_with(p),
        (None, _) => pattern == wanted,
    }
}

impl Ceiling {
    /// Within `limit`: every bound `limit` sets is set here no higher (the field that is not is
    /// named).
    pub fn within(&self, limit: &Ceiling) -> Result<(), String> {
        if let Some(allowed) = &limit.models {
            match &self.models {
                None => return Err(format!("models: the team may allow at most {}", allowed.join(", "))),
                Some(mine) => {
                    if let Some(m) = mine.iter().find(|m| !allowed.iter().any(|a| covers(a, m))) {
                        return Err(format!("models: '{m}' is beyond what the team may allow ({})", allowed.join(", ")));
                    }
                }
            }
        }
        fn bound<T: PartialOrd + std::fmt::Display + Copy>(name: &str, mine: Option<T>, limit: Option<T>) -> Result<(), String> {
            match (mine, limit) {
                (_, None) => Ok(()),
                (Some(m), Some(l)) if m <= l => Ok(()),
                (_, Some(l)) => Err(format!("{name}: at most {l}")),
            }
        }
        bound("rpm", self.rpm, limit.rpm)?;
        bound("tpm", self.tpm, limit.tpm)?;
        bound("max_days", self.max_days, limit.max_days)?;
        for (name, mine, lim) in [
            ("budgets.day", self.budgets.day, limit.budgets.day),
            ("budgets.week", self.budgets.week, limit.budgets.week),
            ("budgets.month", self.budgets.month, limit.budgets.month),
        ] {
            if let (Some(l), m) = (lim, mine) {
                if m.is_none_or(|m| m > l) {
                    return Err(format!("{name}: at most {:.2} USD", l as f64 / 1e9));
                }
            }
        }
        Ok(())
    }

    /// Bring a member's key within this ceiling: each bound it sets, the key's own limit no
    /// higher (a lower one it has is kept).
    pub fn apply(&self, key: &mut KeyRecord) {
        if let Some(models) = &self.models {
            key.policy.models = Some(crate::policy::ModelRules { allow: Some(models.clone()), deny: Vec::new() });
        }
        fn lower<T: Ord + Copy>(slot: &mut Option<T>, cap: Option<T>) {
            if let Some(cap) = cap {
                *slot = Some(slot.map_or(cap, |v| v.min(cap)));
            }
        }
        lower(&mut key.rpm, self.rpm);
        lower(&mut key.tpm, self.tpm);
        lower(&mut key.policy.budgets.day, self.budgets.day);
        lower(&mut key.policy.budgets.week, self.budgets.week);
        lower(&mut key.policy.budgets.month, self.budgets.month);
        lower(&mut key.policy.expires_at, self.max_days.map(|d| key.created_at.saturating_add(u64::from(d) * 86_400)));
    }
}

#[cfg(test)]
mod ceiling_tests {
    use super::*;

    #[test]
    fn a_team_policy_stays_within_its_limit_and_lowers_a_members_key() {
        let limit = Ceiling {
            models: Some(vec!["alpha-*".into()]),
            rpm: Some(60),
            budgets: Budgets { day: Some(5_000_000_000), ..Default::default() },
            ..Default::default()
        };
        let ok = Ceiling {
            models: Some(vec!["alpha-5.5".into(), "alpha-5*".into()]),
            rpm: Some(10),
            budgets: Budgets { day: Some(1_000_000_000), ..Default::default() },
            max_days: Some(30),
            ..Default::default()
        };
        assert_eq!(ok.within(&limit), Ok(()));
        for (bad, field) in [
            (Ceiling { models: Some(vec!["beta-x".into()]), ..ok.clone() }, "models"),
            (Ceiling { models: None, ..ok.clone() }, "models"),
            (Ceiling { rpm: Some(61), ..ok.clone() }, "rpm"),
            (Ceiling { rpm: None, ..ok.clone() }, "rpm"),
            (Ceiling { budgets: Budgets::default(), ..ok.clone() }, "budgets.day"),
        ] {
            assert!(bad.within(&limit).expect_err(field).starts_with(field), "{field}");
        }
        let mut key = KeyRecord {
            rpm: Some(5),
            created_at: 1_000,
            owner: Some("sub".into()),
            ..KeyRecord::new("k", "n", "default", String::new(), KeyOrigin::Admin)
        };
        ok.apply(&mut key);
        assert_eq!((key.rpm, key.policy.budgets.day, key.policy.expires_at), (Some(5), Some(1_000_000_000), Some(1_000 + 30 * 86_400)));
        assert!(key.policy.allows_model("alpha-5.4") && !key.policy.allows_model("beta-opus"));
    }
}
