//! Who may be answered from the response cache, and for how long: a `cache:` entry on a key,
//! an account or a group (the nearest wins, whole: a key's `{ enabled: false }` turns its
//! group's off). Parsed and validated here; the cache itself is the `cache` module's.

use super::PolicyError;
use serde::{Deserialize, Serialize};

/// Whom a cached answer may be served to: the key that made it (the default), every key of its
/// account, or every key of its group.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheScope {
    #[default]
    Key,
    Account,
    Group,
}

impl CacheScope {
    pub fn as_str(self) -> &'static str {
        match self {
            CacheScope::Key => "key",
            CacheScope::Account => "account",
            CacheScope::Group => "group",
        }
    }
}

/// The longest an answer is kept (30 days).
pub const MAX_TTL_SECS: u64 = 30 * 24 * 3600;

/// The largest answer a policy may keep (64 MiB).
pub const MAX_ENTRY_BYTES: u64 = 64 << 20;

fn yes() -> bool {
    true
}

/// A `cache:` entry as written and stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CachePolicy {
    /// `false` turns off what a wider entry (the account's, the group's) turned on.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// How long an answer is served again, in seconds (a request's `x-tollgate-cache: ttl=`
    /// sets its own).
    #[serde(default)]
    pub ttl: Option<u64>,
    #[serde(default)]
    pub scope: CacheScope,
    /// The largest answer kept (default: the top-level `cache.max_entry_bytes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_entry_bytes: Option<u64>,
    /// Streamed answers are kept too (their events, replayed at once).
    #[serde(default = "yes")]
    pub streams: bool,
}

impl CachePolicy {
    /// Refused naming the field (`cache.ttl`).
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.ttl.is_some_and(|t| t == 0 || t > MAX_TTL_SECS) {
            return Err(PolicyError::new("cache.ttl", format!("1 to {MAX_TTL_SECS} seconds")));
        }
        if self.max_entry_bytes.is_some_and(|b| b == 0 || b > MAX_ENTRY_BYTES) {
            return Err(PolicyError::new("cache.max_entry_bytes", format!("1 to {MAX_ENTRY_BYTES} bytes")));
        }
        Ok(())
    }

    /// The entry that applies of a key's, its account's and its group's: the nearest given.
    pub fn nearest<'a>(
        key: Option<&'a CachePolicy>,
        account: Option<&'a CachePolicy>,
        group: Option<&'a CachePolicy>,
    ) -> Option<&'a CachePolicy> {
        key.or(account).or(group).filter(|p| p.enabled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_reads_with_its_defaults_and_a_bad_one_is_named() {
        let p: CachePolicy = serde_json::from_str(r#"{"ttl": 60}"#).expect("json");
        assert_eq!(p, CachePolicy { enabled: true, ttl: Some(60), scope: CacheScope::Key, max_entry_bytes: None, streams: true });
        assert_eq!(p.validate(), Ok(()));
        let a: CachePolicy = serde_json::from_str(r#"{"ttl": 5, "scope": "account", "streams": false}"#).expect("json");
        assert_eq!((a.scope, a.streams), (CacheScope::Account, false));
        assert!(serde_json::from_str::<CachePolicy>(r#"{"ttl": 5, "scope": "world"}"#).is_err());
        assert!(serde_json::from_str::<CachePolicy>(r#"{"tll": 5}"#).is_err(), "an unknown field is refused");
        let zero = CachePolicy { ttl: Some(0), ..p.clone() };
        assert_eq!(zero.validate().map_err(|e| e.field), Err("cache.ttl".to_string()));
        let huge = CachePolicy { max_entry_bytes: Some(MAX_ENTRY_BYTES + 1), ..p.clone() };
        assert_eq!(huge.validate().map_err(|e| e.field), Err("cache.max_entry_bytes".to_string()));
    }

    #[test]
    fn the_nearest_entry_wins_whole_and_a_disabled_one_turns_the_cache_off() {
        let on = |ttl| CachePolicy { enabled: true, ttl: Some(ttl), scope: CacheScope::Key, max_entry_bytes: None, streams: true };
        let (k, a, g) = (on(1), on(2), on(3));
        assert_eq!(CachePolicy::nearest(Some(&k), Some(&a), Some(&g)).and_then(|p| p.ttl), Some(1));
        assert_eq!(CachePolicy::nearest(None, Some(&a), Some(&g)).and_then(|p| p.ttl), Some(2));
        assert_eq!(CachePolicy::nearest(None, None, Some(&g)).and_then(|p| p.ttl), Some(3));
        let off = CachePolicy { enabled: false, ..on(9) };
        assert_eq!(CachePolicy::nearest(Some(&off), None, Some(&g)), None, "a key's off turns its group's off");
        assert_eq!(CachePolicy::nearest(None, None, None), None);
    }
}
