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
}
