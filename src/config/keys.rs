//! `keys` and `accounts`: the client keys the file seeds (with their policy) and the shared
//! accounts they may draw on.

use super::{err, ConfigError, Group};
use crate::policy::budget::{Budgets, BudgetsInput};
use crate::policy::KeyPolicy;
use serde::Deserialize;
use std::collections::{BTreeMap, HashSet};

/// `accounts:`: valid names, each once, with a non-negative balance.
pub(super) fn accounts(raw: Vec<RawAccount>) -> Result<Vec<AccountConfig>, ConfigError> {
    let mut accounts: Vec<AccountConfig> = Vec::with_capacity(raw.len());
    for (i, a) in raw.into_iter().enumerate() {
        let at = format!("accounts[{i}]");
        crate::policy::budget::valid_account_name(&a.name).map_err(|e| ConfigError(format!("{at}.name: {e}")))?;
        if accounts.iter().any(|b| b.name == a.name) {
            return err(format!("{at}.name: the account '{}' is listed twice", a.name));
        }
        if !(a.balance.is_finite() && a.balance >= 0.0) {
            return err(format!("{at}.balance: must be a non-negative number"));
        }
        let budgets = a.budgets.as_ref().map(Budgets::parse).transpose().map_err(|e| ConfigError(format!("{at}.{e}")))?;
        let rates = crate::policy::limits::RateLimits { rpm: a.rpm, tpm: a.tpm, max_concurrent: a.max_concurrent };
        rates.validate().map_err(|e| ConfigError(format!("{at}.{e}")))?;
        let price_multiplier = multiplier(a.price_multiplier).map_err(|e| ConfigError(format!("{at}.{e}")))?;
        if let Some(c) = &a.cache {
            c.validate().map_err(|e| ConfigError(format!("{at}.{e}")))?;
        }
        accounts.push(AccountConfig {
            cache: a.cache,
            name: a.name,
            balance: a.balance,
            budgets: budgets.unwrap_or_default(),
            guardrails: a.guardrails,
            rates,
            price_multiplier,
            plan: a.plan,
        });
    }
    Ok(accounts)
}

/// A `price_multiplier` as written: above 0, at most 1000.
pub(super) fn multiplier(m: Option<f64>) -> Result<Option<crate::base::money::Multiplier>, ConfigError> {
    m.map(|m| {
        crate::base::money::Multiplier::new(m)
            .ok_or_else(|| ConfigError(format!("price_multiplier: a number above 0 and at most 1000, not {m}")))
    })
    .transpose()
}

/// `keys:`: each secret once, in a group that exists, with its policy and an account that
/// exists.
pub(super) fn keys(raw: Vec<RawKey>, groups: &BTreeMap<String, Group>, accounts: &[AccountConfig]) -> Result<Vec<KeyConfig>, ConfigError> {
    let mut keys = Vec::with_capacity(raw.len());
    let mut seen = HashSet::new();
    for (i, mut k) in raw.into_iter().enumerate() {
        let at = format!("keys[{i}]");
        if k.key.len() < 8 || k.key.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return err(format!("{at}.key: at least 8 characters, no spaces"));
        }
        if !seen.insert(k.key.clone()) {
            return err(format!("{at}.key: the same key is listed twice"));
        }
        if !groups.contains_key(&k.group) {
            return err(format!("{at}.group: no group named '{}'", k.group));
        }
        if !(k.balance.is_finite() && k.balance >= 0.0) {
            return err(format!("{at}.balance: must be a non-negative number"));
        }
        let input = k.policy_input();
        // Checked against no clock: an expiry that has passed is a warning (`expired_keys`),
        // never an error, or a date would take the gateway down at its next start or reload.
        let policy = KeyPolicy::parse(input, 0).map_err(|e| ConfigError(format!("{at}.{e}")))?;
        if let Some(name) = policy.account.as_ref().filter(|n| !accounts.iter().any(|a| &a.name == *n)) {
            return err(format!("{at}.account: no account named '{name}' in accounts"));
        }
        if k.max_concurrent == Some(0) {
            return err(format!("{at}.max_concurrent: at least 1 (disable the key instead)"));
        }
        keys.push(KeyConfig {
            key: k.key,
            name: k.name,
            group: k.group,
            balance: k.balance,
            rpm: k.rpm,
            tpm: k.tpm,
            enabled: k.enabled,
            max_concurrent: k.max_concurrent,
            policy,
            plan: k.plan,
        });
    }
    Ok(keys)
}

crate::with_key_policy! { input
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub(super) struct RawKey {
        key: String,
        name: String,
        /// `default` when left out, as in the admin API.
        #[serde(default = "default_group")]
        group: String,
        #[serde(default)]
        balance: f64,
        #[serde(default)]
        rpm: Option<u32>,
        #[serde(default)]
        tpm: Option<u64>,
        #[serde(default = "yes")]
        enabled: bool,
        #[serde(default)]
        max_concurrent: Option<u32>,
        /// The plan the key subscribes to (`plans[].name`).
        #[serde(default)]
        plan: Option<String>,
    }
}

fn default_group() -> String {
    "default".to_string()
}

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAccount {
    name: String,
    /// USD; applied only when the account is first created.
    #[serde(default)]
    balance: f64,
    #[serde(default)]
    budgets: Option<BudgetsInput>,
    #[serde(default)]
    guardrails: Vec<String>,
    /// Requests and tokens per minute and requests in flight of all its keys together.
    #[serde(default)]
    rpm: Option<u32>,
    #[serde(default)]
    tpm: Option<u64>,
    #[serde(default)]
    max_concurrent: Option<u32>,
    /// What its keys are charged of the price table (1.25: a quarter more).
    #[serde(default)]
    price_multiplier: Option<f64>,
    /// The plan the account subscribes to (`plans[].name`).
    #[serde(default)]
    plan: Option<String>,
    /// Its keys' response-cache entry.
    #[serde(default)]
    cache: Option<crate::policy::cache::CachePolicy>,
}

/// A shared account of the configuration file.
#[derive(Debug, Clone, PartialEq)]
pub struct AccountConfig {
    pub name: String,
    /// USD; applied only when the account is first created.
    pub balance: f64,
    pub budgets: Budgets,
    /// Guardrails (by name) every call of its keys goes through.
    pub guardrails: Vec<String>,
    /// What all its keys together may ask per minute and have in flight.
    pub rates: crate::policy::limits::RateLimits,
    /// What its keys are charged of the price table (before their group's).
    pub price_multiplier: Option<crate::base::money::Multiplier>,
    /// The plan it subscribes to.
    pub plan: Option<String>,
    /// Its keys' response-cache entry.
    pub cache: Option<crate::policy::cache::CachePolicy>,
}

#[derive(Debug, Clone)]
pub struct KeyConfig {
    pub key: String,
    pub name: String,
    pub group: String,
    /// USD; applied only when the key is first created.
    pub balance: f64,
    pub rpm: Option<u32>,
    pub tpm: Option<u64>,
    pub enabled: bool,
    /// Requests of this key in flight at once.
    pub max_concurrent: Option<u32>,
    /// Expiry, model rules, address allowlist.
    pub policy: KeyPolicy,
    /// The plan it subscribes to.
    pub plan: Option<String>,
}

/// A configured client key shorter than this gets a warning at start.
pub const MIN_STRONG_KEY_LEN: usize = 32;
