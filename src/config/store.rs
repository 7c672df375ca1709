//! `store:`: the local sled database (the default, nothing to set) or a PostgreSQL database
//! shared by a fleet of nodes, with this node's name, its leases and its sync period.

use super::{err, ConfigError};
use serde::Deserialize;
use std::path::PathBuf;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStore {
    #[serde(default)]
    postgres: Option<RawPostgres>,
    #[serde(default)]
    node_id: Option<String>,
    #[serde(default)]
    lease_secs: Option<u64>,
    #[serde(default)]
    sync_ms: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPostgres {
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    url_env: Option<String>,
    #[serde(default)]
    pool_size: Option<usize>,
    #[serde(default)]
    ca_file: Option<PathBuf>,
}

/// `store:` for a fleet of nodes on one PostgreSQL database.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    pub postgres: PgSettings,
    /// This node's name in the database (leases, claims, record numbers); unique per node.
    pub node_id: String,
    /// How long a node's leases and claims outlive its last renewal.
    pub lease: std::time::Duration,
    /// How often a node syncs with the database (and the bound on a key change reaching it).
    pub sync: std::time::Duration,
}

/// The host name, for `store.node_id`'s default.
fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
}

pub(super) fn fleet_config(raw: Option<RawStore>, env: &dyn Fn(&str) -> Option<String>) -> Result<Option<FleetConfig>, ConfigError> {
    let Some(raw) = raw else { return Ok(None) };
    let Some(pg) = raw.postgres else {
        if raw.node_id.is_some() || raw.lease_secs.is_some() || raw.sync_ms.is_some() {
            return err(
                "store: node_id, lease_secs and sync_ms apply to a shared store; add store.postgres (or remove store: for the local one)",
            );
        }
        return Ok(None);
    };
    let url = match (pg.url, pg.url_env) {
        (Some(_), Some(_)) => return err("store.postgres: give either url or url_env, not both"),
        (Some(url), None) => url,
        (None, Some(name)) => match env(&name) {
            Some(v) if !v.is_empty() => v,
            _ => return err(format!("store.postgres.url_env: the environment variable {name} is not set")),
        },
        (None, None) => return err("store.postgres: url or url_env is required"),
    };
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return err("store.postgres.url: must start with postgres:// (postgres://user:password@host:5432/database)");
    }
    let pool_size = pg.pool_size.unwrap_or(16);
    if !(1..=512).contains(&pool_size) {
        return err("store.postgres.pool_size: 1 to 512");
    }
    let ca_pem = match pg.ca_file {
        Some(path) => Some(
            std::fs::read_to_string(&path)
                .map_err(|e| ConfigError(format!("store.postgres.ca_file: cannot read {}: {e}", path.display())))?,
        ),
        None => None,
    };
    // Both are checked now so that a typo is one line at start, not a retry loop; the
    // database itself is opened by the store.
    url.parse::<tokio_postgres::Config>().map_err(|e| ConfigError(format!("store.postgres.url: {e}")))?;
    if let Some(pem) = &ca_pem {
        crate::base::tls::pem_certificates(pem, "ca_file").map_err(|e| ConfigError(format!("store.postgres.{e}")))?;
    }
    let postgres = PgSettings { url, pool_size, ca_pem };
    let node_id = match raw.node_id {
        Some(id) => id,
        None => host_name().ok_or_else(|| ConfigError("store.node_id: the host name is unknown; set a node_id".into()))?,
    };
    if node_id.is_empty() || node_id.len() > 128 || !node_id.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
        return err(format!("store.node_id: '{node_id}' must be 1 to 128 letters, digits, '-', '_' or '.'"));
    }
    let lease_secs = raw.lease_secs.unwrap_or(30);
    if !(4..=3600).contains(&lease_secs) {
        return err("store.lease_secs: 4 to 3600");
    }
    let sync_ms = raw.sync_ms.unwrap_or(1000);
    if !(50..=60_000).contains(&sync_ms) {
        return err("store.sync_ms: 50 to 60000");
    }
    if sync_ms * 2 >= lease_secs * 1000 {
        return err("store.sync_ms: must be under half of store.lease_secs (leases are renewed every sync)");
    }
    Ok(Some(FleetConfig {
        postgres,
        node_id,
        lease: std::time::Duration::from_secs(lease_secs),
        sync: std::time::Duration::from_millis(sync_ms),
    }))
}

/// How to reach the database.
#[derive(Clone)]
pub struct PgSettings {
    /// `postgres://user[:password]@host[:port]/database[?sslmode=disable|prefer|require]`.
    pub url: String,
    pub pool_size: usize,
    /// PEM text of extra CA certificates (`store.postgres.ca_file`).
    pub ca_pem: Option<String>,
}

impl std::fmt::Debug for PgSettings {
    /// The URL may carry a password: never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgSettings").field("url", &"<redacted>").field("pool_size", &self.pool_size).finish()
    }
}
