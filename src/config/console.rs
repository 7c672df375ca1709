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
    /// The console's own listener (beyond the admin listener's loopback).
    #[serde(default)]
    listen: Option<String>,
    #[serde(default)]
    public_url: Option<String>,
    #[serde(default)]
    tls: Option<RawConsoleTls>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConsoleTls {
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
}

/// `console: { listen, public_url, tls }`: a listener of its own for the console, which may
/// face a network (not only loopback) once people sign in with the identity provider and TLS
/// is on; the admin API never answers there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleListen {
    pub listen: std::net::SocketAddr,
    /// The address people reach it at (its origin is the one forms may come from, and the
    /// sign-in's redirect URL is under it).
    pub public_url: String,
    pub tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

/// The console's own listener, if `console.listen` names one. Off loopback it needs people to
/// sign in with the identity provider (`identity.oidc`) and TLS (`console.tls`): `-t` refuses
/// otherwise, saying which is missing.
pub(super) fn console_listen(raw: Option<&RawConsole>, oidc: bool) -> Result<Option<ConsoleListen>, ConfigError> {
    let Some(c) = raw else { return Ok(None) };
    let Some(listen) = &c.listen else {
        if c.public_url.is_some() || c.tls.is_some() {
            return err("console.public_url and console.tls belong to console.listen, which is not set");
        }
        return Ok(None);
    };
    let listen: std::net::SocketAddr =
        listen.parse().map_err(|e| super::ConfigError(format!("console.listen: '{listen}' is not an address:port ({e})")))?;
    let tls = c.tls.as_ref().map(|t| (t.cert.clone(), t.key.clone()));
    if !listen.ip().is_loopback() {
        match (oidc, tls.is_some()) {
            (true, true) => {}
            (false, _) => return err(format!(
                "console.listen: {listen} is not a loopback address; the console may face a network only when people sign in with an identity provider (identity.oidc) — the admin token alone would be a password on the network"
            )),
            (true, false) => return err(format!(
                "console.listen: {listen} is not a loopback address; set console.tls (cert, key): sessions and sign-in codes must not cross the network in clear"
            )),
        }
    }
    let scheme = if tls.is_some() { "https" } else { "http" };
    let public_url = match &c.public_url {
        Some(u) => u.trim_end_matches('/').to_string(),
        None if listen.ip().is_loopback() => format!("{scheme}://{listen}"),
        None => return err("console.public_url: required off loopback (the URL people open, e.g. https://console.example.com)"),
    };
    let uri: http::Uri = public_url.parse().map_err(|e| super::ConfigError(format!("console.public_url: not a URL ({e})")))?;
    if uri.scheme_str() != Some(scheme) || uri.host().is_none() || uri.path().len() > 1 || uri.query().is_some() {
        return err(format!("console.public_url: {scheme}://host[:port] (the console's origin, no path; {scheme} as its listener serves)"));
    }
    Ok(Some(ConsoleListen { listen, public_url, tls }))
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
