//! `cache:`: the response cache's store — how much it keeps (`max_bytes`, least recently used
//! evicted), the largest answer by default (`max_entry_bytes`), whether calls that sample may
//! be answered again (`any_temperature`), how often expired entries are swept. Without it
//! there is no cache: nothing is looked up or kept, whatever a key, an account, a group or a
//! request asks. Who is answered from it is each key's, account's or group's `cache:` entry
//! (`crate::policy::cache`), or a request's `x-tollgate-cache: ttl=`.

use super::{err, ConfigError};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCache {
    #[serde(default)]
    max_bytes: Option<u64>,
    #[serde(default)]
    max_entry_bytes: Option<u64>,
    #[serde(default)]
    any_temperature: bool,
    #[serde(default)]
    ttl: Option<u64>,
    #[serde(default)]
    sweep_secs: Option<u64>,
}

/// The response cache's store and defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheConfig {
    /// The most bytes of answers kept (on one node; in a fleet, in the shared database).
    pub max_bytes: u64,
    /// The largest answer kept when a `cache:` entry sets none.
    pub max_entry_bytes: u64,
    /// Calls that sample (a temperature above 0, no seed) are answered again too.
    pub any_temperature: bool,
    /// How long an answer is kept when neither its entry nor its request says (seconds).
    pub ttl_secs: u64,
    /// How often expired answers are removed.
    pub sweep_secs: u64,
}

pub const DEFAULT_MAX_BYTES: u64 = 256 << 20;
pub const DEFAULT_MAX_ENTRY_BYTES: u64 = 1 << 20;
pub const DEFAULT_TTL_SECS: u64 = 3600;
pub const DEFAULT_SWEEP_SECS: u64 = 60;

pub(super) fn cache(raw: Option<RawCache>) -> Result<Option<CacheConfig>, ConfigError> {
    let Some(raw) = raw else { return Ok(None) };
    let max_bytes = raw.max_bytes.unwrap_or(DEFAULT_MAX_BYTES);
    if max_bytes == 0 {
        return err("cache.max_bytes: at least 1 (leave the cache section out to have no cache)");
    }
    let max_entry_bytes = raw.max_entry_bytes.unwrap_or(DEFAULT_MAX_ENTRY_BYTES.min(max_bytes));
    if max_entry_bytes == 0 || max_entry_bytes > crate::policy::cache::MAX_ENTRY_BYTES || max_entry_bytes > max_bytes {
        return err(format!(
            "cache.max_entry_bytes: 1 to {} bytes, and no more than cache.max_bytes",
            crate::policy::cache::MAX_ENTRY_BYTES
        ));
    }
    let ttl_secs = raw.ttl.unwrap_or(DEFAULT_TTL_SECS);
    if ttl_secs == 0 || ttl_secs > crate::policy::cache::MAX_TTL_SECS {
        return err(format!("cache.ttl: 1 to {} seconds", crate::policy::cache::MAX_TTL_SECS));
    }
    let sweep_secs = raw.sweep_secs.unwrap_or(DEFAULT_SWEEP_SECS);
    if sweep_secs == 0 || sweep_secs > 86_400 {
        return err("cache.sweep_secs: 1 to 86400");
    }
    Ok(Some(CacheConfig { max_bytes, max_entry_bytes, any_temperature: raw.any_temperature, ttl_secs, sweep_secs }))
}

/// A `cache:` entry on a group, an account or a key of the file while the file has no `cache:`
/// section: it would do nothing, so it is refused.
pub(super) fn check_entries(config: &super::Config) -> Result<(), ConfigError> {
    if config.cache.is_some() {
        return Ok(());
    }
    let named = config
        .groups
        .iter()
        .find_map(|(name, g)| g.cache.as_ref().map(|_| format!("groups.{name}.cache")))
        .or_else(|| config.accounts.iter().enumerate().find_map(|(i, a)| a.cache.as_ref().map(|_| format!("accounts[{i}].cache"))))
        .or_else(|| config.keys.iter().enumerate().find_map(|(i, k)| k.policy.cache.as_ref().map(|_| format!("keys[{i}].cache"))));
    match named {
        Some(at) => err(format!("{at}: the response cache is off; add a top-level cache: section (cache: {{}} for its defaults)")),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<Option<CacheConfig>, ConfigError> {
        cache(serde_yaml::from_str(yaml).expect("yaml"))
    }

    #[test]
    fn the_section_reads_with_its_defaults_and_bad_values_are_named() {
        assert_eq!(parse("null").expect("none"), None);
        let c = parse("{}").expect("ok").expect("some");
        assert_eq!(
            c,
            CacheConfig {
                max_bytes: DEFAULT_MAX_BYTES,
                max_entry_bytes: DEFAULT_MAX_ENTRY_BYTES,
                any_temperature: false,
                ttl_secs: 3600,
                sweep_secs: 60
            }
        );
        let small = parse("{max_bytes: 1000}").expect("ok").expect("some");
        assert_eq!(small.max_entry_bytes, 1000, "an entry no larger than the whole");
        for (bad, says) in [
            ("{max_bytes: 0}", "cache.max_bytes"),
            ("{max_bytes: 10, max_entry_bytes: 11}", "cache.max_entry_bytes"),
            ("{ttl: 0}", "cache.ttl"),
            ("{sweep_secs: 0}", "cache.sweep_secs"),
        ] {
            let e = parse(bad).expect_err(bad);
            assert!(e.0.starts_with(says), "{bad}: {e}");
        }
        assert!(serde_yaml::from_str::<RawCache>("{max_byte: 1}").is_err(), "an unknown field is refused");
    }
}
