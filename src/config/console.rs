//! `console` and `log`: the request log behind the console, and the format of the process
//! log.

use super::{err, ConfigError};
use serde::Deserialize;

/// `log.format` (text by default).
pub(super) fn log_format(raw: Option<RawLog>) -> LogFormat {
    raw.and_then(|l| l.format).unwrap_or_default()
}

/// `console:` (every key optional).
pub(super) fn console(raw: Option<RawConsole>) -> Result<ConsoleConfig, ConfigError> {
    let defaults = ConsoleConfig::default();
    let console = match raw {
        Some(c) => ConsoleConfig {
            request_log: c.request_log.unwrap_or(defaults.request_log),
            request_log_days: c.request_log_days.unwrap_or(defaults.request_log_days),
            request_log_max: c.request_log_max.unwrap_or(defaults.request_log_max),
            key_page: c.key_page.unwrap_or(defaults.key_page),
        },
        None => defaults,
    };
    if !(1..=3650).contains(&console.request_log_days) {
        return err("console.request_log_days: 1 to 3650");
    }
    if !(1000..=100_000_000).contains(&console.request_log_max) {
        return err("console.request_log_max: 1000 to 100000000");
    }
    Ok(console)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConsole {
    #[serde(default)]
    request_log: Option<bool>,
    #[serde(default)]
    request_log_days: Option<u64>,
    #[serde(default)]
    request_log_max: Option<usize>,
    #[serde(default)]
    key_page: Option<bool>,
}

/// `console:`: the request log's retention and bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsoleConfig {
    /// Whether requests are logged at all (`console.request_log`, on by default).
    pub request_log: bool,
    /// Entries older than this many days are deleted (hourly).
    pub request_log_days: u64,
    /// At most this many entries are kept (the oldest go first).
    pub request_log_max: usize,
    /// The key holder's page, `/me` on the public listener (`console.key_page`, off by default).
    pub key_page: bool,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        ConsoleConfig { request_log: true, request_log_days: 7, request_log_max: 1_000_000, key_page: false }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLog {
    #[serde(default)]
    format: Option<LogFormat>,
}

/// How log lines are written (`log.format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// `[time LEVEL target] message`, the access line as `name=value` pairs.
    #[default]
    Text,
    /// One JSON object per line: `ts`, `level`, `target`, and `message` or the access line's fields.
    Json,
}
