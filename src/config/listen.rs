//! `listen`, `tls`, `admin`, `metrics`, the request-body bounds (`max_body_bytes`,
//! `max_buffered_body_bytes`, `body_read_timeout_secs`), `limits` and `trusted_proxies`: where
//! tollgate listens and what a client connection may do.

use super::{err, ConfigError};
use crate::policy::Cidr;
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The public listeners and the bounds of a request body.
pub(super) struct Front {
    pub listen: Option<SocketAddr>,
    pub tls: Option<TlsConfig>,
    pub max_body_bytes: usize,
    pub max_buffered_body_bytes: usize,
    pub body_read_timeout: Duration,
}

/// `listen`, `tls` and the body bounds; at least one listener is required.
pub(super) fn front(
    listen: Option<&str>,
    tls: Option<RawTls>,
    max_body_bytes: Option<usize>,
    max_buffered_body_bytes: Option<usize>,
    body_read_timeout_secs: Option<u64>,
) -> Result<Front, ConfigError> {
    let listen = listen.map(|s| parse_addr("listen", s)).transpose()?;
    let tls = match tls {
        Some(t) => {
            // Checked now so that a bad file is refused at start and on reload.
            crate::base::tls::ReloadableCert::load(&t.cert, &t.key).map_err(ConfigError)?;
            Some(TlsConfig { listen: parse_addr("tls.listen", &t.listen)?, cert: t.cert, key: t.key })
        }
        None => None,
    };
    if listen.is_none() && tls.is_none() {
        return err("listen: at least one of listen or tls.listen is required");
    }
    let max_body_bytes = max_body_bytes.unwrap_or(DEFAULT_MAX_BODY_BYTES);
    if max_body_bytes == 0 {
        return err("max_body_bytes: must be greater than 0");
    }
    let max_buffered_body_bytes = match max_buffered_body_bytes {
        Some(n) if n < max_body_bytes => {
            return err(format!(
            "max_buffered_body_bytes: must be at least max_body_bytes ({max_body_bytes}), or no request of the largest size could be read"
        ))
        }
        Some(n) => n,
        None => default_budget(max_body_bytes),
    };
    let body_read_timeout = match body_read_timeout_secs.unwrap_or(DEFAULT_BODY_READ_TIMEOUT_SECS) {
        0 => return err("body_read_timeout_secs: must be greater than 0"),
        n => Duration::from_secs(n),
    };
    Ok(Front { listen, tls, max_body_bytes, max_buffered_body_bytes, body_read_timeout })
}

/// `admin:`: loopback only, with a token long enough and not a placeholder.
pub(super) fn admin(raw: Option<RawAdmin>, env: &dyn Fn(&str) -> Option<String>) -> Result<Option<AdminConfig>, ConfigError> {
    let Some(a) = raw else { return Ok(None) };
    let listen = parse_addr("admin.listen", &a.listen)?;
    if !listen.ip().is_loopback() {
        return err(format!("admin.listen: {listen} is not a loopback address; the admin API listens on 127.0.0.1 or ::1 only"));
    }
    let token_env = a.token_env.clone();
    let token = match (a.token, a.token_env) {
        (Some(_), Some(_)) => return err("admin.token: give either token or token_env, not both"),
        (Some(t), None) => Some(t),
        // Unset: the token in data_dir/admin-token (generated there once).
        (None, Some(name)) => env(&name).filter(|v| !v.is_empty()),
        (None, None) => None,
    };
    if let Some(token) = &token {
        if token.chars().count() < MIN_ADMIN_TOKEN_LEN {
            return err(format!(
                "admin.token: at least {MIN_ADMIN_TOKEN_LEN} characters (an empty or short token would leave the admin API open to guessing)"
            ));
        }
        if is_placeholder_token(token) {
            return err("admin.token: this is a placeholder from the documentation, not a secret; set a long random token (admin.token_env), or set none to have one generated in data_dir/admin-token");
        }
    }
    let mut hosts = Vec::with_capacity(a.hosts.len());
    for (i, h) in a.hosts.iter().enumerate() {
        let name = h.trim().to_ascii_lowercase();
        if name.is_empty() || name.contains(|c: char| c == '/' || c == ':' || c.is_whitespace()) {
            return err(format!("admin.hosts[{i}]: '{h}' is not a host name (no scheme, port or path)"));
        }
        hosts.push(name);
    }
    Ok(Some(AdminConfig { listen, token, token_env, hosts }))
}

/// `metrics:`: off loopback it needs a token or an allowlist; its address is its own.
pub(super) fn metrics(
    raw: Option<RawMetrics>,
    env: &dyn Fn(&str) -> Option<String>,
    admin: Option<&AdminConfig>,
    public: Option<SocketAddr>,
) -> Result<Option<MetricsConfig>, ConfigError> {
    let Some(m) = raw else { return Ok(None) };
    let listen = parse_addr("metrics.listen", &m.listen)?;
    let token = match m.token_env {
        Some(name) => {
            let token = env(&name)
                .filter(|v| !v.is_empty())
                .ok_or_else(|| ConfigError(format!("metrics.token_env: the variable {name} is not set (or empty)")))?;
            if token.chars().count() < MIN_ADMIN_TOKEN_LEN || is_placeholder_token(&token) {
                return err(format!("metrics.token_env: {name} must hold a random token of at least {MIN_ADMIN_TOKEN_LEN} characters"));
            }
            Some(token)
        }
        None => None,
    };
    let allow = m
        .allow
        .iter()
        .enumerate()
        .map(|(i, c)| Cidr::parse(c).map_err(|e| ConfigError(format!("metrics.allow[{i}]: {e}"))))
        .collect::<Result<Vec<_>, _>>()?;
    if !listen.ip().is_loopback() && token.is_none() && allow.is_empty() {
        return err(format!(
            "metrics.listen: {listen} is reachable from other hosts; set metrics.token_env (a bearer token) or metrics.allow (the scrapers' addresses)"
        ));
    }
    if admin.is_some_and(|a| a.listen == listen) || Some(listen) == public {
        return err(format!("metrics.listen: {listen} is already another listener's address"));
    }
    Ok(Some(MetricsConfig { listen, token, allow }))
}

/// `trusted_proxies:`, as address blocks.
pub(super) fn trusted_proxies(list: &[String]) -> Result<Vec<Cidr>, ConfigError> {
    list.iter().enumerate().map(|(i, c)| Cidr::parse(c).map_err(|e| ConfigError(format!("trusted_proxies[{i}]: {e}")))).collect()
}

/// `limits:`: the largest stream event a translated relay holds, and the connection bounds.
pub(super) fn limits(raw: Option<RawLimits>) -> Result<(usize, Uploads, Realtime, ConnLimits, u64), ConfigError> {
    let max_event_bytes = raw.as_ref().and_then(|l| l.max_event_bytes).unwrap_or(DEFAULT_MAX_EVENT_BYTES);
    if !(1 << 16..=1 << 30).contains(&max_event_bytes) {
        return err("limits.max_event_bytes: 65536 to 1073741824");
    }
    let max_upload_bytes = raw.as_ref().and_then(|l| l.max_upload_bytes).unwrap_or(DEFAULT_MAX_UPLOAD_BYTES);
    if !(1 << 10..=1 << 32).contains(&max_upload_bytes) {
        return err("limits.max_upload_bytes: 1024 to 4294967296");
    }
    let max_spooled_bytes = raw.as_ref().and_then(|l| l.max_spooled_bytes).unwrap_or(DEFAULT_MAX_SPOOLED_BYTES.max(max_upload_bytes));
    if max_spooled_bytes < max_upload_bytes {
        return err(format!(
            "limits.max_spooled_bytes: must be at least limits.max_upload_bytes ({max_upload_bytes}), or no upload of the largest size could be taken"
        ));
    }
    let get = |f: fn(&RawLimits) -> Option<u64>, default: u64| raw.as_ref().and_then(f).unwrap_or(default);
    let realtime = Realtime {
        max_secs: get(|l| l.realtime_max_secs, 3600),
        idle_secs: get(|l| l.realtime_idle_secs, 300),
        max_frame_bytes: get(|l| l.realtime_max_frame_bytes, 16 << 20),
        sessions_per_key: get(|l| l.realtime_sessions_per_key, 8),
    };
    if !(1..=100_000).contains(&realtime.sessions_per_key) {
        return err("limits.realtime_sessions_per_key: 1 to 100000");
    }
    if !(1..=86_400).contains(&realtime.max_secs) {
        return err("limits.realtime_max_secs: 1 to 86400");
    }
    if !(1..=86_400).contains(&realtime.idle_secs) {
        return err("limits.realtime_idle_secs: 1 to 86400");
    }
    if !(1 << 10..=1 << 30).contains(&realtime.max_frame_bytes) {
        return err("limits.realtime_max_frame_bytes: 1024 to 1073741824");
    }
    let batch_poll_secs = get(|l| l.batch_poll_secs, 30);
    if !(1..=3600).contains(&batch_poll_secs) {
        return err("limits.batch_poll_secs: 1 to 3600");
    }
    let file_quota_bytes = raw.as_ref().and_then(|l| l.file_quota_bytes).unwrap_or(DEFAULT_FILE_QUOTA_BYTES.max(max_upload_bytes));
    if file_quota_bytes < max_upload_bytes {
        return err(format!("limits.file_quota_bytes: must be at least limits.max_upload_bytes ({max_upload_bytes})"));
    }
    Ok((max_event_bytes, Uploads { max_upload_bytes, max_spooled_bytes, file_quota_bytes }, realtime, conn_limits(raw)?, batch_poll_secs))
}

/// The bounds of a realtime session (`limits.realtime_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Realtime {
    /// The longest a session may last (default an hour).
    pub max_secs: u64,
    /// The longest a session may pass without a frame either way (default 5 minutes).
    pub idle_secs: u64,
    /// The largest frame either side may send (default 16 MiB), and the largest message a
    /// client sends in fragments.
    pub max_frame_bytes: u64,
    /// Sessions one key may hold open at once (default 8).
    pub sessions_per_key: u64,
}

/// `limits.max_upload_bytes` and `limits.max_spooled_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Uploads {
    pub max_upload_bytes: u64,
    pub max_spooled_bytes: u64,
    /// The bytes of files one key may keep (`/v1/files`, batches' outputs included).
    pub file_quota_bytes: u64,
}

/// Default `limits.file_quota_bytes`.
pub const DEFAULT_FILE_QUOTA_BYTES: u64 = 1 << 30;

/// Default `limits.max_spooled_bytes`: the disk all uploads in flight may take together.
pub const DEFAULT_MAX_SPOOLED_BYTES: u64 = 1 << 30;

/// Default `limits.max_upload_bytes`: the OpenAI API's own bound on an audio upload (25 MiB).
pub const DEFAULT_MAX_UPLOAD_BYTES: u64 = 25 << 20;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    listen: String,
    cert: PathBuf,
    key: PathBuf,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAdmin {
    listen: String,
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    token_env: Option<String>,
    /// Host names (besides localhost and loopback literals) the admin API answers to.
    #[serde(default)]
    hosts: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMetrics {
    listen: String,
    #[serde(default)]
    token_env: Option<String>,
    /// Client address blocks that may scrape.
    #[serde(default)]
    allow: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimits {
    #[serde(default)]
    header_timeout_secs: Option<u64>,
    #[serde(default)]
    max_header_bytes: Option<usize>,
    #[serde(default)]
    max_connections: Option<usize>,
    #[serde(default)]
    max_connections_per_ip: Option<usize>,
    #[serde(default)]
    keepalive_timeout_secs: Option<u64>,
    /// The largest upstream stream event a translated relay holds while it is incomplete.
    #[serde(default)]
    max_event_bytes: Option<usize>,
    /// The largest multipart upload (an audio file, images to edit), spooled to disk.
    #[serde(default)]
    max_upload_bytes: Option<u64>,
    /// The most bytes every upload in flight may hold on disk together.
    #[serde(default)]
    max_spooled_bytes: Option<u64>,
    #[serde(default)]
    realtime_max_secs: Option<u64>,
    #[serde(default)]
    realtime_idle_secs: Option<u64>,
    #[serde(default)]
    realtime_max_frame_bytes: Option<u64>,
    #[serde(default)]
    realtime_sessions_per_key: Option<u64>,
    /// The bytes of files one key may keep.
    #[serde(default)]
    file_quota_bytes: Option<u64>,
    /// How often an open batch is asked about at its provider (default 30 s).
    #[serde(default)]
    batch_poll_secs: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct TlsConfig {
    pub listen: SocketAddr,
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Debug, Clone)]
pub struct AdminConfig {
    pub listen: SocketAddr,
    /// None: neither set nor in its environment variable; the one in `data_dir/admin-token`
    /// is used (generated there at the first such start).
    pub token: Option<String>,
    /// The variable `admin.token_env` names, for messages about it.
    pub token_env: Option<String>,
    /// Extra `Host` names accepted (lower case, without port).
    pub hosts: Vec<String>,
}

/// `metrics:`: a listener for `/metrics` alone.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsConfig {
    pub listen: SocketAddr,
    /// The bearer token a scrape presents (`token_env`'s variable); None: none asked.
    pub token: Option<String>,
    /// Client addresses that may scrape; empty: any (then a token is required off loopback).
    pub allow: Vec<Cidr>,
}

/// Whether `token` is a documentation placeholder rather than a secret.
pub fn is_placeholder_token(token: &str) -> bool {
    let lower = token.to_ascii_lowercase();
    PLACEHOLDER_TOKEN_MARKS.iter().any(|m| lower.contains(m))
}

/// Largest `limits.max_header_bytes` (Pingora's own limit).
pub const MAX_HEADER_BYTES_LIMIT: usize = 1_048_575;

fn conn_limits(raw: Option<RawLimits>) -> Result<ConnLimits, ConfigError> {
    let mut limits = ConnLimits::default();
    let Some(raw) = raw else { return Ok(limits) };
    if let Some(secs) = raw.header_timeout_secs {
        if !(1..=60).contains(&secs) {
            return err("limits.header_timeout_secs: 1 to 60 (the time a whole request header may take, from its first byte)");
        }
        limits.header_timeout = std::time::Duration::from_secs(secs);
    }
    if let Some(bytes) = raw.max_header_bytes {
        if !(1024..=MAX_HEADER_BYTES_LIMIT).contains(&bytes) {
            return err(format!("limits.max_header_bytes: 1024 to {MAX_HEADER_BYTES_LIMIT}"));
        }
        limits.max_header_bytes = bytes;
    }
    if let Some(secs) = raw.keepalive_timeout_secs {
        if !(1..=MAX_KEEPALIVE_TIMEOUT_SECS).contains(&secs) {
            return err(format!("limits.keepalive_timeout_secs: 1 to {MAX_KEEPALIVE_TIMEOUT_SECS}"));
        }
        limits.keepalive_timeout = std::time::Duration::from_secs(secs);
    }
    if let Some(n) = raw.max_connections {
        limits.max_connections = n;
    }
    if let Some(n) = raw.max_connections_per_ip {
        limits.max_connections_per_ip = n;
    }
    Ok(limits)
}

/// The connection and header-phase bounds (`limits:` in the configuration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnLimits {
    /// From a request header's first byte to its blank line.
    pub header_timeout: Duration,
    /// Largest request header (request line and fields).
    pub max_header_bytes: usize,
    /// Client connections open at once, all addresses together (0: no cap).
    pub max_connections: usize,
    /// Client connections open at once from one address (0: no cap).
    pub max_connections_per_ip: usize,
    /// How long a connection may wait, idle, for its next request.
    pub keepalive_timeout: Duration,
}

pub const DEFAULT_HEADER_TIMEOUT_SECS: u64 = 10;

pub const DEFAULT_MAX_HEADER_BYTES: usize = 64 * 1024;

pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;

pub const DEFAULT_MAX_CONNECTIONS_PER_IP: usize = 256;

pub const DEFAULT_KEEPALIVE_TIMEOUT_SECS: u64 = 30;

/// Pingora itself closes a connection that waits longer than this for a request.
pub const MAX_KEEPALIVE_TIMEOUT_SECS: u64 = 60;

impl Default for ConnLimits {
    fn default() -> Self {
        ConnLimits {
            header_timeout: Duration::from_secs(DEFAULT_HEADER_TIMEOUT_SECS),
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_ip: DEFAULT_MAX_CONNECTIONS_PER_IP,
            keepalive_timeout: Duration::from_secs(DEFAULT_KEEPALIVE_TIMEOUT_SECS),
        }
    }
}

/// The default budget: an eighth of the host's memory, and room for at least two bodies of the
/// largest size.
pub fn default_budget(max_body_bytes: usize) -> usize {
    (total_memory_bytes() / 8).max(max_body_bytes.saturating_mul(2))
}

/// The host's memory (`MemTotal`), 8 GiB when it cannot be read.
fn total_memory_bytes() -> usize {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines().find_map(|l| {
                let kib = l.strip_prefix("MemTotal:")?.trim().strip_suffix("kB")?.trim().parse::<usize>().ok()?;
                kib.checked_mul(1024)
            })
        })
        .unwrap_or(8 << 30)
}

/// Admin tokens that documentation and sample files show: refused, since anyone who read the
/// same page knows them.
const PLACEHOLDER_TOKEN_MARKS: [&str; 8] =
    ["change-me", "changeme", "change_me", "replace-me", "replace_me", "placeholder", "example", "your-admin-token"];

fn parse_addr(key_path: &str, s: &str) -> Result<SocketAddr, ConfigError> {
    s.parse().map_err(|_| ConfigError(format!("{key_path}: '{s}' is not an address like 127.0.0.1:8080")))
}

/// Default cap on a request body (32 MiB).
pub const DEFAULT_MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// Seconds a client has to send its whole request body.
pub const DEFAULT_BODY_READ_TIMEOUT_SECS: u64 = 60;

/// Shortest admin token accepted.
pub const MIN_ADMIN_TOKEN_LEN: usize = 16;

/// `limits.max_event_bytes` when not set: the most bytes of one upstream stream event (its
/// incomplete line and the data lines gathered before its closing blank line) a translated
/// relay holds; more is an error in the stream.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 16 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_budget_leaves_room_for_two_of_the_largest_bodies() {
        assert!(default_budget(32 << 20) >= 64 << 20);
        assert!(default_budget(usize::MAX / 2) >= usize::MAX / 2);
    }
}
