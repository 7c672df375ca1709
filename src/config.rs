//! The configuration file: YAML → typed, validated [`Config`].
//!
//! Every rule about what a valid configuration is lives here. Unknown keys are rejected,
//! secrets given as `*_env` are read from the environment at load time (a missing variable
//! is named), and every error message names the offending key.

use serde::Deserialize;
use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Default cap on a request body (32 MiB).
pub const DEFAULT_MAX_BODY_BYTES: usize = 32 * 1024 * 1024;
/// Seconds a client has to send its whole request body.
pub const DEFAULT_BODY_READ_TIMEOUT_SECS: u64 = 60;
/// `anthropic-version` sent upstream when the client sends none.
pub const DEFAULT_ANTHROPIC_VERSION: &str = "2023-06-01";

/// A configuration error; the message names the key at fault.
#[derive(Debug)]
pub struct ConfigError(pub String);

/// Every API model the video service knows (§4.2), in the spec's order.
pub const VIDEO_MODELS: [&str; 7] = ["genq3-pro", "genq3-turbo", "genq3-pro-fast", "genq2-pro", "genq2-turbo", "genq2-pro-fast", "genq2"];

/// Default `billing.drain_secs`.
pub const DEFAULT_DRAIN_SECS: u64 = 30;
/// Default `billing.commit_interval_ms`.
pub const DEFAULT_COMMIT_INTERVAL_MS: u64 = 10;
/// Largest `billing.commit_interval_ms` accepted.
pub const MAX_COMMIT_INTERVAL_MS: u64 = 1000;

/// Group commit of usage records: the writer commits what was booked at most `interval` after
/// the first booking of a batch; with `sync`, every booking waits until its record is on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitPolicy {
    pub interval: std::time::Duration,
    pub sync: bool,
}

impl Default for CommitPolicy {
    fn default() -> Self {
        CommitPolicy { interval: std::time::Duration::from_millis(DEFAULT_COMMIT_INTERVAL_MS), sync: false }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

fn err<T>(msg: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError(msg.into()))
}

use crate::base::usage::MAX_OUTPUT_ALLOWANCE;
pub use crate::protocol::Protocol;

/// What a group may call: one of the three model protocols, or the video task API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Platform {
    Openai,
    Anthropic,
    Gemini,
    Video,
}

impl From<Protocol> for Platform {
    fn from(p: Protocol) -> Self {
        match p {
            Protocol::Openai => Platform::Openai,
            Protocol::Anthropic => Platform::Anthropic,
            Protocol::Gemini => Platform::Gemini,
        }
    }
}

/// A configured client key shorter than this gets a warning at start.
pub const MIN_STRONG_KEY_LEN: usize = 32;
/// Shortest admin token accepted.
pub const MIN_ADMIN_TOKEN_LEN: usize = 16;
/// `billing.default_output_tokens` when not set.
pub const DEFAULT_OUTPUT_TOKENS: u64 = 4096;
/// `billing.min_output_tokens` when not set.
pub const DEFAULT_MIN_OUTPUT_TOKENS: u64 = 256;
/// `limits.max_event_bytes` when not set: the most bytes of one upstream stream event (its
/// incomplete line and the data lines gathered before its closing blank line) a translated
/// relay holds; more is an error in the stream.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 16 << 20;

// ---------------------------------------------------------------- raw file shape

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    pingora: Option<serde_yaml::Value>,
    #[serde(default)]
    listen: Option<String>,
    #[serde(default)]
    tls: Option<RawTls>,
    #[serde(default)]
    data_dir: Option<PathBuf>,
    #[serde(default)]
    max_body_bytes: Option<usize>,
    #[serde(default)]
    max_buffered_body_bytes: Option<usize>,
    #[serde(default)]
    body_read_timeout_secs: Option<u64>,
    #[serde(default)]
    admin: Option<RawAdmin>,
    /// `metrics: { listen, token_env, allow }`: `/metrics` on a listener of its own.
    #[serde(default)]
    metrics: Option<RawMetrics>,
    #[serde(default)]
    providers: Vec<RawProvider>,
    #[serde(default)]
    groups: BTreeMap<String, RawGroup>,
    #[serde(default)]
    prices: BTreeMap<String, Price>,
    #[serde(default)]
    keys: Vec<RawKey>,
    /// Shared accounts keys may draw on (`keys[].account`).
    #[serde(default)]
    accounts: Vec<RawAccount>,
    #[serde(default)]
    billing: Option<RawBilling>,
    #[serde(default)]
    video: Option<RawVideo>,
    #[serde(default)]
    storage: Option<RawStorage>,
    /// Extra client headers relayed upstream, beyond each protocol's allowlist.
    #[serde(default)]
    forward_headers: Vec<String>,
    /// Extra upstream response headers relayed to clients, beyond each protocol's allowlist.
    #[serde(default)]
    forward_response_headers: Vec<String>,
    /// Proxies in front of tollgate whose `X-Forwarded-For` is believed (CIDR blocks).
    #[serde(default)]
    trusted_proxies: Vec<String>,
    #[serde(default)]
    retry: Option<RawRetry>,
    /// How providers of one tier share the traffic.
    #[serde(default)]
    routing: Option<RawRouting>,
    /// `log: { format: text | json }`.
    #[serde(default)]
    log: Option<RawLog>,
    /// The request log and the console (`console:`).
    #[serde(default)]
    console: Option<RawConsole>,
    /// Client connections and request headers (see `listener`).
    #[serde(default)]
    limits: Option<RawLimits>,
    /// `telemetry: { otlp: … }` (see `telemetry::settings`).
    #[serde(default)]
    telemetry: Option<crate::telemetry::settings::RawTelemetry>,
    /// Where keys, money, records and tasks are kept: the local sled database (default) or a
    /// PostgreSQL server shared by several nodes.
    #[serde(default)]
    store: Option<RawStore>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStore {
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
struct RawPostgres {
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    url_env: Option<String>,
    #[serde(default)]
    pool_size: Option<usize>,
    #[serde(default)]
    ca_file: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
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
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConsole {
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
struct RawLog {
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRouting {
    #[serde(default)]
    balance_factor: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRetry {
    #[serde(default)]
    attempts: Option<u32>,
    #[serde(default)]
    on_status: Option<Vec<u16>>,
    #[serde(default)]
    deadline_secs: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStorage {
    s3: RawS3,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawS3 {
    #[serde(default)]
    endpoint: Option<String>,
    region: String,
    bucket: String,
    #[serde(default)]
    access_key: Option<String>,
    #[serde(default)]
    access_key_env: Option<String>,
    #[serde(default)]
    secret_key: Option<String>,
    #[serde(default)]
    secret_key_env: Option<String>,
    #[serde(default)]
    force_path_style: Option<bool>,
    #[serde(default)]
    url_ttl_secs: Option<u64>,
    /// Serve results as `public_base_url/<key>` instead of presigned URLs.
    #[serde(default)]
    public_base_url: Option<String>,
    /// PEM CA bundle for an https endpoint (added to the system roots).
    #[serde(default)]
    ca_file: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBilling {
    /// Also read under its former name, `default_max_output_tokens`.
    #[serde(default, alias = "default_max_output_tokens")]
    default_output_tokens: Option<u64>,
    #[serde(default)]
    min_output_tokens: Option<u64>,

    #[serde(default)]
    usage_retention_days: Option<u64>,
    /// The IANA time zone of spend windows (`budgets`); UTC by default.
    #[serde(default)]
    timezone: Option<String>,
    #[serde(default)]
    commit_interval_ms: Option<u64>,
    #[serde(default)]
    sync_commit: Option<bool>,
    /// How long a response whose client left is still read for its usage.
    #[serde(default)]
    drain_secs: Option<u64>,
    #[serde(default)]
    image_input_tokens: Option<u64>,
    #[serde(default)]
    file_input_tokens: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawVideo {
    upstream: RawVideoUpstream,
    #[serde(default)]
    poll_interval_secs: Option<u64>,
    #[serde(default)]
    poll_concurrency: Option<usize>,
    #[serde(default)]
    prices: BTreeMap<String, f64>,
    /// API models enabled; all known models when absent.
    #[serde(default)]
    models: Option<Vec<String>>,
    /// How long a normal (not off-peak) task is polled before it fails.
    #[serde(default)]
    max_task_hours: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawVideoUpstream {
    base_url: String,
    #[serde(default)]
    secret_id: Option<String>,
    #[serde(default)]
    secret_id_env: Option<String>,
    #[serde(default)]
    secret_key: Option<String>,
    #[serde(default)]
    secret_key_env: Option<String>,
    region: String,
    version: String,
    #[serde(default)]
    brand: Option<String>,
    #[serde(default)]
    timeout_secs: Option<u64>,
    /// Requests per second toward the video service, over all tasks.
    #[serde(default)]
    rate_per_sec: Option<u32>,
    /// PEM CA bundle for an https video service (default: the system roots).
    #[serde(default)]
    ca_file: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    listen: String,
    cert: PathBuf,
    key: PathBuf,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMetrics {
    listen: String,
    #[serde(default)]
    token_env: Option<String>,
    /// Client address blocks that may scrape.
    #[serde(default)]
    allow: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAdmin {
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
struct RawProvider {
    name: String,
    protocol: Protocol,
    base_url: String,
    #[serde(default)]
    api_key: Option<String>,
    #[serde(default)]
    api_key_env: Option<String>,
    /// A pool of upstream keys, used in turn (instead of `api_key`).
    #[serde(default)]
    api_keys: Option<Vec<String>>,
    /// An environment variable holding the pool, separated by commas or whitespace.
    #[serde(default)]
    api_keys_env: Option<String>,
    /// Lower tiers are used first; a tier only when every provider before it is out.
    #[serde(default)]
    priority: Option<u32>,
    /// Share of its tier's traffic.
    #[serde(default)]
    weight: Option<u32>,
    /// How long the provider rests after a 429 without `Retry-After`, or after failing
    /// `failures_before_cooldown` times in a row.
    #[serde(default)]
    cooldown_secs: Option<u64>,
    #[serde(default)]
    failures_before_cooldown: Option<u32>,
    #[serde(default)]
    models: Vec<String>,
    /// `anthropic-version` sent when the client sends none (anthropic only).
    #[serde(default)]
    anthropic_version: Option<String>,
    #[serde(default)]
    connect_timeout_ms: Option<u64>,
    /// Longest silence while reading the upstream's response.
    #[serde(default)]
    read_timeout_secs: Option<u64>,
    /// PEM CA bundle to verify an https upstream with (default: the system roots).
    #[serde(default)]
    ca_file: Option<PathBuf>,
    /// `false`: an `openai` provider that serves chat completions only (most OpenAI-compatible
    /// servers); responses-API requests for its models are translated to chat completions.
    #[serde(default)]
    responses: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGroup {
    platforms: Vec<Platform>,
    #[serde(default)]
    translate: bool,
}

/// What a group's keys may call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// The endpoints (model protocols, video) open to them.
    pub platforms: Vec<Platform>,
    /// Through each endpoint open to them, every model a provider serves, whatever protocol
    /// the provider speaks (`translate`); without it, only the models of providers of the
    /// endpoint's own protocol.
    pub translate: bool,
}

/// USD per one million tokens, and the model's output limit.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub input: f64,
    pub output: f64,
    /// Cache reads (default: `input`).
    #[serde(default)]
    pub cached_input: Option<f64>,
    /// Cache writes (messages' `cache_creation_input_tokens`; default: `input`).
    #[serde(default)]
    pub cache_write_input: Option<f64>,
    /// The most output tokens one answer of this model can have; the hold of a request that
    /// names no maximum, and the largest maximum a request may name.
    #[serde(default)]
    pub max_output_tokens: Option<u64>,
    /// The output tokens held and asked for when a request names no maximum (at most
    /// `max_output_tokens`); `billing.default_output_tokens` when absent.
    #[serde(default)]
    pub default_output_tokens: Option<u64>,
}

fn default_group() -> String {
    "default".to_string()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKey {
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
    /// RFC 3339; refused once past.
    #[serde(default)]
    expires_at: Option<String>,
    #[serde(default)]
    models: Option<crate::policy::ModelRules>,
    #[serde(default)]
    ip_allow: Option<Vec<String>>,
    /// USD.
    #[serde(default)]
    max_request_cost: Option<f64>,
    #[serde(default)]
    max_output_tokens: Option<u64>,
    #[serde(default)]
    default_output_tokens: Option<u64>,
    #[serde(default)]
    budgets: Option<crate::policy::budget::BudgetsInput>,
    #[serde(default)]
    account: Option<String>,
    #[serde(default)]
    tags: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAccount {
    name: String,
    /// USD; applied only when the account is first created.
    #[serde(default)]
    balance: f64,
    #[serde(default)]
    budgets: Option<crate::policy::budget::BudgetsInput>,
}

fn yes() -> bool {
    true
}

// ---------------------------------------------------------------- validated shape

/// The validated configuration.
#[derive(Debug)]
pub struct Config {
    /// The `pingora:` section, handed to Pingora's `ServerConf` unchanged.
    pub pingora: Option<serde_yaml::Value>,
    pub listen: Option<SocketAddr>,
    pub tls: Option<TlsConfig>,
    pub data_dir: PathBuf,
    pub max_body_bytes: usize,
    /// Request-body bytes buffered at once, across all requests (503 beyond).
    pub max_buffered_body_bytes: usize,
    /// Time a client has to send its whole request body (408 after).
    pub body_read_timeout: std::time::Duration,
    pub admin: Option<AdminConfig>,
    /// `metrics:` (see `scrape`); None: `/metrics` on the admin listener only.
    pub metrics: Option<MetricsConfig>,
    pub providers: Vec<ProviderConfig>,
    pub groups: BTreeMap<String, Group>,
    pub prices: BTreeMap<String, Price>,
    /// Extra client headers relayed upstream (lower case; a trailing `*` is a prefix).
    pub forward_headers: Vec<String>,
    /// Extra upstream response headers relayed to clients (lower case; a trailing `*` is a prefix).
    pub forward_response_headers: Vec<String>,
    /// Proxies whose `X-Forwarded-For` and `Forwarded` are believed (see `policy::forwarded`).
    pub trusted_proxies: Vec<crate::policy::Cidr>,
    pub keys: Vec<KeyConfig>,
    /// `accounts:`.
    pub accounts: Vec<AccountConfig>,
    /// Spend windows' calendar (`billing.timezone`).
    pub calendar: crate::policy::budget::Calendar,
    /// `console:`.
    pub console: ConsoleConfig,
    /// Output tokens held and asked for, per choice, when a request names no maximum and
    /// neither its key nor its model sets one (`billing.default_output_tokens`).
    pub default_output_tokens: u64,
    /// The fewest output tokens such a request is lowered to when its key cannot afford the
    /// default (`billing.min_output_tokens`).
    pub min_output_tokens: u64,
    /// The largest upstream event a translated stream holds (`limits.max_event_bytes`).
    pub max_event_bytes: usize,
    /// Usage records older than this are deleted.
    pub usage_retention_days: u64,
    /// How usage records reach the disk (`billing.commit_interval_ms`, `billing.sync_commit`).
    pub commit: CommitPolicy,
    pub video: Option<VideoConfig>,
    pub storage: Option<S3Config>,
    /// Retries before the first byte (`retry:`).
    pub retry: RetryPolicy,
    /// ε of conversation affinity's bounded load (`routing.balance_factor`): a provider takes
    /// a conversation's request only while its share of its tier's recent traffic is within
    /// `1 + ε` times its weighted share.
    pub balance_factor: f64,
    /// `log.format`.
    pub log_format: LogFormat,
    /// Client connections and request headers (`limits:`).
    pub connections: crate::listener::ConnLimits,
    /// How long a response whose client left is still read for its usage (`billing.drain_secs`).
    pub drain: std::time::Duration,
    /// Input tokens held per referenced image and file.
    pub media_allowance: crate::relay::MediaAllowance,
    /// `store:` with `postgres:` — the store several nodes share. None: the local sled store.
    pub fleet: Option<FleetConfig>,
    /// OpenTelemetry traces (`telemetry.otlp` and the `OTEL_*` variables); None: off.
    pub otlp: Option<crate::telemetry::Settings>,
}

/// `store:` for a fleet of nodes on one PostgreSQL database.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    pub postgres: crate::store::postgres::PgSettings,
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

fn fleet_config(raw: Option<RawStore>, env: &dyn Fn(&str) -> Option<String>) -> Result<Option<FleetConfig>, ConfigError> {
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
    let postgres = crate::store::postgres::PgSettings { url, pool_size, ca_pem };
    // The URL is checked now so that a typo is one line at start, not a retry loop.
    crate::store::postgres::Pg::new(&postgres).map_err(|e| ConfigError(e.to_string()))?;
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

/// `retry: {attempts, on_status, deadline_secs}`: how many times a request may be sent upstream
/// (connect failures, which send nothing, do not count), which upstream statuses are retried
/// (besides timeouts before the response header), and the most time all attempts together may
/// take to a response header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    pub attempts: u32,
    pub on_status: Vec<u16>,
    /// From the first attempt: no retry starts after it, and an attempt waits for its response
    /// header at most until it. None: each attempt waits its provider's `read_timeout_secs`.
    pub deadline: Option<std::time::Duration>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { attempts: 2, on_status: vec![429, 500, 502, 503, 504], deadline: None }
    }
}

/// Largest `routing.balance_factor`: at 100 a provider may take 101 times its share, which
/// is affinity without a bound in practice.
const MAX_BALANCE_FACTOR: f64 = 100.0;

/// Most attempts `retry.attempts` may allow.
pub const MAX_ATTEMPTS: u32 = 10;

/// S3-compatible object storage for result videos and base64 inputs.
#[derive(Debug, Clone)]
pub struct S3Config {
    /// None: the AWS endpoint for the region.
    pub endpoint: Option<String>,
    pub region: String,
    pub bucket: String,
    pub access_key: String,
    pub secret_key: String,
    pub force_path_style: bool,
    pub url_ttl_secs: u64,
    pub public_base_url: Option<String>,
    /// PEM text of extra CA certificates for the endpoint.
    pub ca_pem: Option<String>,
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

/// The client listener's address as the file writes it, for clash checks (None when unset or bad:
/// `listen` itself reports that).
fn listen_addr_of(text: &Option<String>) -> Option<SocketAddr> {
    text.as_deref().and_then(|t| t.parse().ok())
}

/// `metrics:`: a listener for `/metrics` alone.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsConfig {
    pub listen: SocketAddr,
    /// The bearer token a scrape presents (`token_env`'s variable); None: none asked.
    pub token: Option<String>,
    /// Client addresses that may scrape; empty: any (then a token is required off loopback).
    pub allow: Vec<crate::policy::Cidr>,
}

/// Admin tokens that documentation and sample files show: refused, since anyone who read the
/// same page knows them.
const PLACEHOLDER_TOKEN_MARKS: [&str; 8] =
    ["change-me", "changeme", "change_me", "replace-me", "replace_me", "placeholder", "example", "your-admin-token"];

/// Whether `token` is a documentation placeholder rather than a secret.
pub fn is_placeholder_token(token: &str) -> bool {
    let lower = token.to_ascii_lowercase();
    PLACEHOLDER_TOKEN_MARKS.iter().any(|m| lower.contains(m))
}

/// An upstream base address split into its parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseUrl {
    pub tls: bool,
    pub host: String,
    pub port: u16,
    /// Path prefix without a trailing slash ("" for none).
    pub prefix: String,
}

/// A provider's `base_url` ending in its protocol's version segment (`…/v1`, as the `openai`
/// SDK and other gateways write it; `…/v1beta` for generate-content) would reach the upstream
/// as `/v1/v1/…`: refused, with the URL to write instead.
fn version_segment_refused(at: &str, given: &str, url: &BaseUrl, protocol: Protocol) -> Result<(), ConfigError> {
    let last = url.prefix.rsplit('/').next().unwrap_or_default();
    let versioned = last == "v1" || (protocol == Protocol::Gemini && (last == "v1beta" || last == "v1alpha"));
    if !versioned {
        return Ok(());
    }
    let root = given.trim_end_matches('/');
    let root = root.strip_suffix(last).unwrap_or(root).trim_end_matches('/');
    err(format!("{at}.base_url: ends in /{last}, which tollgate adds to every upstream path itself (/{last}/…); write base_url: {root}"))
}

impl BaseUrl {
    /// Parse `scheme://host[:port][/path-prefix]` (http or https only).
    pub fn parse(s: &str) -> Result<BaseUrl, String> {
        let uri: http::Uri = s.parse().map_err(|e| format!("not a URL ({e})"))?;
        let tls = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            Some(other) => return Err(format!("scheme must be http or https, not {other}")),
            None => return Err("missing scheme (http:// or https://)".into()),
        };
        let authority = uri.authority().ok_or("missing host")?;
        if authority.as_str().contains('@') {
            return Err("credentials in the URL are not allowed".into());
        }
        if uri.query().is_some() {
            return Err("a query string is not allowed".into());
        }
        let host = authority.host().trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err("missing host".into());
        }
        let port = authority.port_u16().unwrap_or(if tls { 443 } else { 80 });
        let prefix = uri.path().trim_end_matches('/').to_string();
        Ok(BaseUrl { tls, host: host.to_string(), port, prefix })
    }

    /// The value for the `Host` header.
    pub fn host_header(&self) -> String {
        let default_port = if self.tls { 443 } else { 80 };
        let host = if self.host.contains(':') { format!("[{}]", self.host) } else { self.host.clone() };
        if self.port == default_port {
            host
        } else {
            format!("{host}:{}", self.port)
        }
    }
}

#[derive(Debug, Clone)]
pub struct ProviderConfig {
    pub name: String,
    pub protocol: Protocol,
    pub base_url: BaseUrl,
    /// The upstream keys (one, or a pool used in turn).
    pub api_keys: Vec<String>,
    /// Tier: lower first (default 0).
    pub priority: u32,
    /// Share of its tier's traffic (default 1).
    pub weight: u32,
    pub cooldown: std::time::Duration,
    /// Failures in a row that start a cooldown.
    pub failures_before_cooldown: u32,
    pub models: Vec<String>,
    pub anthropic_version: String,
    pub connect_timeout_ms: u64,
    pub read_timeout_secs: u64,
    /// It serves the responses API (`openai` providers; default true).
    pub responses: bool,
    /// CA certificates for an https upstream (None: the system roots).
    pub ca: Option<std::sync::Arc<[pingora_core::utils::tls::WrappedX509]>>,
}

/// The video-task service and its Tencent-Cloud-API-3.0-style upstream.
#[derive(Debug, Clone)]
pub struct VideoConfig {
    pub base_url: BaseUrl,
    pub secret_id: String,
    pub secret_key: String,
    pub region: String,
    pub version: String,
    /// Actions are `Submit<Capability><brand>Job` / `Describe<Capability><brand>Job`.
    pub brand: String,
    pub timeout_secs: u64,
    pub rate_per_sec: u32,
    /// PEM text of extra CA certificates for the video service.
    pub ca_pem: Option<String>,
    pub poll_interval_secs: u64,
    pub poll_concurrency: usize,
    /// USD per second of video, by API model.
    pub prices: BTreeMap<String, f64>,
    /// Enabled API models.
    pub models: Vec<String>,
    pub max_task_hours: u64,
}

/// A shared account of the configuration file.
#[derive(Debug, Clone, PartialEq)]
pub struct AccountConfig {
    pub name: String,
    /// USD; applied only when the account is first created.
    pub balance: f64,
    pub budgets: crate::policy::budget::Budgets,
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
    pub policy: crate::policy::KeyPolicy,
}

/// Reads a secret given either literally or through an environment variable.
fn secret(
    key_path: &str,
    literal: Option<String>,
    env_name: Option<String>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<String>, ConfigError> {
    match (literal, env_name) {
        (Some(_), Some(_)) => err(format!("{key_path}: give either the literal or the _env variant, not both")),
        (Some(v), None) => Ok(Some(v)),
        (None, Some(name)) => match env(&name) {
            Some(v) if !v.is_empty() => Ok(Some(v)),
            _ => err(format!("{key_path}_env: environment variable {name} is not set")),
        },
        (None, None) => Ok(None),
    }
}

fn parse_addr(key_path: &str, s: &str) -> Result<SocketAddr, ConfigError> {
    s.parse().map_err(|_| ConfigError(format!("{key_path}: '{s}' is not an address like 127.0.0.1:8080")))
}

impl Config {
    /// Load and validate the file at `path`, reading `*_env` secrets from the process environment.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError(format!("cannot read {}: {e}", path.display())))?;
        Config::parse(&text, &|name| std::env::var(name).ok()).map_err(|e| ConfigError(format!("{}: {}", path.display(), e.0)))
    }

    /// The file's keys whose `expires_at` has passed at `now`: each a warning for `-t`, start
    /// and reload (the key is refused 401 `key_expired`; nothing else is affected).
    pub fn expired_keys(&self, now: u64) -> Vec<String> {
        self.keys
            .iter()
            .enumerate()
            .filter_map(|(i, k)| {
                let at = k.policy.expires_at.filter(|at| *at <= now)?;
                Some(format!(
                    "keys[{i}] ({}): expired at {}; it is refused (401 key_expired) until expires_at is moved or removed",
                    k.name,
                    crate::protocol::rfc3339(at)
                ))
            })
            .collect()
    }

    /// Parse and validate YAML text; `env` looks up environment variables.
    pub fn parse(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let raw: RawConfig = serde_yaml::from_str(text).map_err(|e| ConfigError(e.to_string()))?;

        let listen = raw.listen.as_deref().map(|s| parse_addr("listen", s)).transpose()?;
        let tls = match raw.tls {
            Some(t) => {
                // Checked now so that a bad file is refused at start and on reload.
                crate::tls::ReloadableCert::load(&t.cert, &t.key).map_err(ConfigError)?;
                Some(TlsConfig { listen: parse_addr("tls.listen", &t.listen)?, cert: t.cert, key: t.key })
            }
            None => None,
        };
        if listen.is_none() && tls.is_none() {
            return err("listen: at least one of listen or tls.listen is required");
        }
        let max_body_bytes = raw.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY_BYTES);
        if max_body_bytes == 0 {
            return err("max_body_bytes: must be greater than 0");
        }
        let max_buffered_body_bytes = match raw.max_buffered_body_bytes {
            Some(n) if n < max_body_bytes => {
                return err(format!(
                    "max_buffered_body_bytes: must be at least max_body_bytes ({max_body_bytes}), or no request of the largest size could be read"
                ))
            }
            Some(n) => n,
            None => crate::body::default_budget(max_body_bytes),
        };
        let body_read_timeout = match raw.body_read_timeout_secs.unwrap_or(DEFAULT_BODY_READ_TIMEOUT_SECS) {
            0 => return err("body_read_timeout_secs: must be greater than 0"),
            n => std::time::Duration::from_secs(n),
        };

        let admin = match raw.admin {
            Some(a) => {
                let listen = parse_addr("admin.listen", &a.listen)?;
                if !listen.ip().is_loopback() {
                    return err(format!(
                        "admin.listen: {listen} is not a loopback address; the admin API listens on 127.0.0.1 or ::1 only"
                    ));
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
                Some(AdminConfig { listen, token, token_env, hosts })
            }
            None => None,
        };
        let metrics = match raw.metrics {
            Some(m) => {
                let listen = parse_addr("metrics.listen", &m.listen)?;
                let token = match m.token_env {
                    Some(name) => {
                        let token = env(&name)
                            .filter(|v| !v.is_empty())
                            .ok_or_else(|| ConfigError(format!("metrics.token_env: the variable {name} is not set (or empty)")))?;
                        if token.chars().count() < MIN_ADMIN_TOKEN_LEN || is_placeholder_token(&token) {
                            return err(format!(
                                "metrics.token_env: {name} must hold a random token of at least {MIN_ADMIN_TOKEN_LEN} characters"
                            ));
                        }
                        Some(token)
                    }
                    None => None,
                };
                let allow = m
                    .allow
                    .iter()
                    .enumerate()
                    .map(|(i, c)| crate::policy::Cidr::parse(c).map_err(|e| ConfigError(format!("metrics.allow[{i}]: {e}"))))
                    .collect::<Result<Vec<_>, _>>()?;
                if !listen.ip().is_loopback() && token.is_none() && allow.is_empty() {
                    return err(format!(
                        "metrics.listen: {listen} is reachable from other hosts; set metrics.token_env (a bearer token) or metrics.allow (the scrapers' addresses)"
                    ));
                }
                if admin.as_ref().is_some_and(|a| a.listen == listen) || Some(listen) == listen_addr_of(&raw.listen) {
                    return err(format!("metrics.listen: {listen} is already another listener's address"));
                }
                Some(MetricsConfig { listen, token, allow })
            }
            None => None,
        };

        let mut providers = Vec::with_capacity(raw.providers.len());
        let mut names = HashSet::new();
        for (i, p) in raw.providers.into_iter().enumerate() {
            let at = format!("providers[{i}]");
            if p.name.trim().is_empty() {
                return err(format!("{at}.name: must not be empty"));
            }
            if !names.insert(p.name.clone()) {
                return err(format!("{at}.name: '{}' is used twice", p.name));
            }
            let base_url = BaseUrl::parse(&p.base_url).map_err(|e| ConfigError(format!("{at}.base_url: {e}")))?;
            version_segment_refused(&at, &p.base_url, &base_url, p.protocol)?;
            let single = secret(&format!("{at}.api_key"), p.api_key, p.api_key_env, env)?;
            let pool_env = match p.api_keys_env {
                Some(name) => match env(&name) {
                    Some(v) if !v.trim().is_empty() => {
                        Some(v.split(|c: char| c == ',' || c.is_whitespace()).filter(|k| !k.is_empty()).map(str::to_string).collect())
                    }
                    _ => return err(format!("{at}.api_keys_env: environment variable {name} is not set")),
                },
                None => None,
            };
            let api_keys: Vec<String> = match (single, p.api_keys, pool_env) {
                (Some(k), None, None) => vec![k],
                (None, Some(pool), None) | (None, None, Some(pool)) if !pool.is_empty() => pool,
                (None, Some(_), None) | (None, None, Some(_)) => return err(format!("{at}.api_keys: list at least one key")),
                (None, None, None) => return err(format!("{at}.api_key: required (or api_key_env, api_keys, api_keys_env)")),
                _ => return err(format!("{at}: give one of api_key, api_key_env, api_keys, api_keys_env")),
            };
            if api_keys.iter().any(|k| k.is_empty() || !k.bytes().all(|b| b.is_ascii_graphic())) {
                return err(format!("{at}.api_key: must be printable ASCII without spaces (it is sent as a header)"));
            }
            if p.weight.is_some_and(|w| w == 0 || w > 1000) {
                return err(format!("{at}.weight: 1 to 1000"));
            }
            if p.cooldown_secs.is_some_and(|c| c > 86_400) {
                return err(format!("{at}.cooldown_secs: at most 86400"));
            }
            if p.failures_before_cooldown == Some(0) {
                return err(format!("{at}.failures_before_cooldown: at least 1"));
            }
            if p.models.is_empty() {
                return err(format!("{at}.models: list at least one model"));
            }
            if let Some(m) = p.models.iter().find(|m| m.trim().is_empty() || m.contains('/')) {
                return err(format!("{at}.models: '{m}' is not a valid model id"));
            }
            if p.anthropic_version.is_some() && p.protocol != Protocol::Anthropic {
                return err(format!("{at}.anthropic_version: only for protocol anthropic"));
            }
            if p.responses.is_some() && p.protocol != Protocol::Openai {
                return err(format!("{at}.responses: only for protocol openai"));
            }
            let ca = match &p.ca_file {
                Some(path) if base_url.tls => {
                    Some(crate::tls::load_ca_bundle(path).map_err(|e| ConfigError(format!("{at}.ca_file: {e}")))?)
                }
                Some(_) => return err(format!("{at}.ca_file: only for an https base_url")),
                None => None,
            };
            providers.push(ProviderConfig {
                ca,
                name: p.name,
                protocol: p.protocol,
                base_url,
                api_keys,
                priority: p.priority.unwrap_or(0),
                weight: p.weight.unwrap_or(1),
                cooldown: std::time::Duration::from_secs(p.cooldown_secs.unwrap_or(30)),
                failures_before_cooldown: p.failures_before_cooldown.unwrap_or(3),
                models: p.models,
                anthropic_version: p.anthropic_version.unwrap_or_else(|| DEFAULT_ANTHROPIC_VERSION.to_string()),
                connect_timeout_ms: p.connect_timeout_ms.unwrap_or(10_000),
                read_timeout_secs: p.read_timeout_secs.unwrap_or(600),
                responses: p.responses.unwrap_or(true),
            });
        }

        let mut groups = BTreeMap::new();
        for (name, g) in raw.groups {
            groups.insert(name, Group { platforms: g.platforms, translate: g.translate });
        }
        if groups.is_empty() {
            let platforms = vec![Platform::Openai, Platform::Anthropic, Platform::Gemini, Platform::Video];
            groups.insert("default".to_string(), Group { platforms, translate: false });
        }

        let usd_ok = |v: f64| v.is_finite() && (0.0..=1e6).contains(&v);
        for (model, price) in &raw.prices {
            if ![Some(price.input), Some(price.output), price.cached_input, price.cache_write_input].into_iter().flatten().all(usd_ok) {
                return err(format!("prices.{model}: prices must be numbers from 0 to 1000000 (USD per 1M tokens)"));
            }
            if price.max_output_tokens.is_some_and(|m| m == 0 || m > MAX_OUTPUT_ALLOWANCE) {
                return err(format!("prices.{model}.max_output_tokens: 1 to {MAX_OUTPUT_ALLOWANCE}"));
            }
            if price.default_output_tokens.is_some_and(|d| d == 0 || d > price.max_output_tokens.unwrap_or(MAX_OUTPUT_ALLOWANCE)) {
                return err(format!(
                    "prices.{model}.default_output_tokens: 1 to {}",
                    price.max_output_tokens.map_or("1<<24".to_string(), |m| format!("max_output_tokens ({m})"))
                ));
            }
        }
        // Billing fails closed: a served model without a price would be free for every key.
        for p in &providers {
            if let Some(m) = p.models.iter().find(|m| !raw.prices.contains_key(*m)) {
                return err(format!(
                    "prices.{m}: no price for a served model (provider '{}'); write {{ input: 0, output: 0 }} to serve it free",
                    p.name
                ));
            }
        }

        let mut accounts: Vec<AccountConfig> = Vec::with_capacity(raw.accounts.len());
        for (i, a) in raw.accounts.into_iter().enumerate() {
            let at = format!("accounts[{i}]");
            crate::policy::budget::valid_account_name(&a.name).map_err(|e| ConfigError(format!("{at}.name: {e}")))?;
            if accounts.iter().any(|b| b.name == a.name) {
                return err(format!("{at}.name: the account '{}' is listed twice", a.name));
            }
            if !(a.balance.is_finite() && a.balance >= 0.0) {
                return err(format!("{at}.balance: must be a non-negative number"));
            }
            let budgets =
                a.budgets.as_ref().map(crate::policy::budget::Budgets::parse).transpose().map_err(|e| ConfigError(format!("{at}.{e}")))?;
            accounts.push(AccountConfig { name: a.name, balance: a.balance, budgets: budgets.unwrap_or_default() });
        }
        let mut keys = Vec::with_capacity(raw.keys.len());
        let mut seen = HashSet::new();
        for (i, k) in raw.keys.into_iter().enumerate() {
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
            let input = crate::policy::PolicyInput {
                expires_at: k.expires_at,
                models: k.models,
                ip_allow: k.ip_allow,
                max_request_cost: k.max_request_cost,
                max_output_tokens: k.max_output_tokens,
                default_output_tokens: k.default_output_tokens,
                budgets: k.budgets,
                account: k.account,
                tags: k.tags,
            };
            // Checked against no clock: an expiry that has passed is a warning (`expired_keys`),
            // never an error, or a date would take the gateway down at its next start or reload.
            let policy = crate::policy::KeyPolicy::parse(input, 0).map_err(|e| ConfigError(format!("{at}.{e}")))?;
            if let Some(name) = policy.account.as_ref().filter(|n| !accounts.iter().any(|a| &a.name == *n)) {
                return err(format!("{at}.account: no account named '{name}' in accounts"));
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
            });
            if k.max_concurrent == Some(0) {
                return err(format!("{at}.max_concurrent: at least 1 (disable the key instead)"));
            }
        }

        let video = match raw.video {
            Some(v) => Some(video_config(v, env)?),
            None => None,
        };

        let billing = raw.billing.unwrap_or(RawBilling {
            default_output_tokens: None,
            min_output_tokens: None,
            usage_retention_days: None,
            timezone: None,
            commit_interval_ms: None,
            sync_commit: None,
            drain_secs: None,
            image_input_tokens: None,
            file_input_tokens: None,
        });
        let default_output_tokens = billing.default_output_tokens.unwrap_or(DEFAULT_OUTPUT_TOKENS);
        if default_output_tokens == 0 || default_output_tokens > MAX_OUTPUT_ALLOWANCE {
            return err(format!("billing.default_output_tokens: 1 to {MAX_OUTPUT_ALLOWANCE}"));
        }
        let min_output_tokens = billing.min_output_tokens.unwrap_or(DEFAULT_MIN_OUTPUT_TOKENS.min(default_output_tokens));
        if min_output_tokens == 0 || min_output_tokens > default_output_tokens {
            return err(format!("billing.min_output_tokens: 1 to billing.default_output_tokens ({default_output_tokens})"));
        }
        let forward_headers = header_patterns("forward_headers", &raw.forward_headers, &|bare| {
            crate::protocol::never_forwarded(bare).then_some("carries credentials or is set by tollgate; it is never forwarded")
        })?;
        let trusted_proxies = raw
            .trusted_proxies
            .iter()
            .enumerate()
            .map(|(i, c)| crate::policy::Cidr::parse(c).map_err(|e| ConfigError(format!("trusted_proxies[{i}]: {e}"))))
            .collect::<Result<Vec<_>, _>>()?;
        let forward_response_headers = header_patterns("forward_response_headers", &raw.forward_response_headers, &|bare| {
            ("set-cookie".starts_with(bare) || ["connection", "keep-alive", "proxy-connection", "upgrade"].contains(&bare))
                .then_some("would relay cookies or connection headers; it is never relayed")
        })?;
        let calendar = match billing.timezone.as_deref() {
            Some(name) => crate::policy::budget::Calendar::new(name).map_err(|e| ConfigError(format!("billing.timezone: {e}")))?,
            None => crate::policy::budget::Calendar::default(),
        };
        let defaults = ConsoleConfig::default();
        let console = match raw.console {
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
        let mut otlp =
            crate::telemetry::settings::resolve(raw.telemetry.as_ref().and_then(|t| t.otlp.as_ref()), env).map_err(ConfigError)?;
        if let (Some(settings), Some(bytes)) = (otlp.as_mut(), raw.telemetry.as_ref().and_then(|t| t.max_queue_bytes)) {
            if !(1 << 16..=1 << 32).contains(&bytes) {
                return err("telemetry.max_queue_bytes: 65536 to 4294967296");
            }
            settings.max_queue_bytes = bytes as usize;
        }
        let usage_retention_days = billing.usage_retention_days.unwrap_or(30);
        if usage_retention_days == 0 {
            return err("billing.usage_retention_days: must be at least 1");
        }
        let commit_interval_ms = billing.commit_interval_ms.unwrap_or(DEFAULT_COMMIT_INTERVAL_MS);
        if commit_interval_ms > MAX_COMMIT_INTERVAL_MS {
            return err(format!(
                "billing.commit_interval_ms: at most {MAX_COMMIT_INTERVAL_MS} (a kill -9 loses at most this window of usage records)"
            ));
        }
        let commit =
            CommitPolicy { interval: std::time::Duration::from_millis(commit_interval_ms), sync: billing.sync_commit.unwrap_or(false) };
        let mut retry = RetryPolicy::default();
        if let Some(r) = raw.retry {
            if let Some(attempts) = r.attempts {
                if attempts == 0 || attempts > MAX_ATTEMPTS {
                    return err(format!("retry.attempts: 1 to {MAX_ATTEMPTS} (1: never retry)"));
                }
                retry.attempts = attempts;
            }
            if let Some(on_status) = r.on_status {
                if let Some(bad) = on_status.iter().find(|s| !(400..=599).contains(*s)) {
                    return err(format!("retry.on_status: {bad} is not an error status (400 to 599)"));
                }
                retry.on_status = on_status;
            }
            if let Some(secs) = r.deadline_secs {
                if secs == 0 {
                    return err("retry.deadline_secs: must be greater than 0 (leave it out for no deadline)");
                }
                retry.deadline = Some(std::time::Duration::from_secs(secs));
            }
        }

        let balance_factor = raw.routing.and_then(|r| r.balance_factor).unwrap_or(crate::affinity::DEFAULT_BALANCE_FACTOR);
        if !(0.0..=MAX_BALANCE_FACTOR).contains(&balance_factor) {
            return err(format!(
                "routing.balance_factor: 0 to {MAX_BALANCE_FACTOR} (a provider may take up to 1 + this times its weighted share of a tier's traffic before a conversation goes on to the next; 0.25 by default)"
            ));
        }
        let max_event_bytes = raw.limits.as_ref().and_then(|l| l.max_event_bytes).unwrap_or(DEFAULT_MAX_EVENT_BYTES);
        if !(1 << 16..=1 << 30).contains(&max_event_bytes) {
            return err("limits.max_event_bytes: 65536 to 1073741824");
        }
        let connections = conn_limits(raw.limits)?;
        let drain_secs = billing.drain_secs.unwrap_or(DEFAULT_DRAIN_SECS);
        if drain_secs > 600 {
            return err("billing.drain_secs: 0 to 600 (0: stop reading when the client leaves, and bill from the estimate)");
        }
        let mut media_allowance = crate::relay::MediaAllowance::default();
        for (name, given, slot) in [
            ("image_input_tokens", billing.image_input_tokens, &mut media_allowance.image_tokens),
            ("file_input_tokens", billing.file_input_tokens, &mut media_allowance.file_tokens),
        ] {
            if let Some(n) = given {
                if n > MAX_OUTPUT_ALLOWANCE {
                    return err(format!("billing.{name}: 0 to {MAX_OUTPUT_ALLOWANCE}"));
                }
                *slot = n;
            }
        }

        let fleet = fleet_config(raw.store, env)?;
        Ok(Config {
            fleet,
            drain: std::time::Duration::from_secs(drain_secs),
            media_allowance,
            connections,
            retry,
            balance_factor,
            log_format: raw.log.and_then(|l| l.format).unwrap_or_default(),
            pingora: raw.pingora,
            default_output_tokens,
            min_output_tokens,
            max_event_bytes,
            commit,
            forward_headers,
            forward_response_headers,
            trusted_proxies,
            usage_retention_days,
            listen,
            tls,
            data_dir: raw.data_dir.unwrap_or_else(|| PathBuf::from("./data")),
            max_body_bytes,
            max_buffered_body_bytes,
            body_read_timeout,
            admin,
            metrics,
            providers,
            groups,
            prices: raw.prices,
            keys,
            accounts,
            calendar,
            console,
            otlp,
            video,
            storage: match raw.storage {
                Some(st) => Some(s3_config(st.s3, env)?),
                None => None,
            },
        })
    }
}

/// A list of header names (a trailing `*` makes a prefix), lower-cased; `refused` says why a
/// name may not be listed.
fn header_patterns(key: &str, list: &[String], refused: &dyn Fn(&str) -> Option<&'static str>) -> Result<Vec<String>, ConfigError> {
    let mut names = Vec::with_capacity(list.len());
    for (i, h) in list.iter().enumerate() {
        let name = h.trim().to_ascii_lowercase();
        let bare = name.strip_suffix('*').unwrap_or(&name);
        if bare.is_empty() || http::HeaderName::from_bytes(bare.as_bytes()).is_err() {
            return err(format!("{key}[{i}]: '{h}' is not a header name (a trailing * makes it a prefix)"));
        }
        if let Some(why) = refused(bare) {
            return err(format!("{key}[{i}]: '{h}' {why}"));
        }
        names.push(name);
    }
    Ok(names)
}

/// Largest `limits.max_header_bytes` (Pingora's own limit).
pub const MAX_HEADER_BYTES_LIMIT: usize = 1_048_575;

fn conn_limits(raw: Option<RawLimits>) -> Result<crate::listener::ConnLimits, ConfigError> {
    use crate::listener::{ConnLimits, MAX_KEEPALIVE_TIMEOUT_SECS};
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

/// The PEM text of a CA bundle, checked to hold certificates; errors name `key_path`.
fn ca_pem_file(key_path: &str, path: Option<&Path>) -> Result<Option<String>, ConfigError> {
    let Some(path) = path else { return Ok(None) };
    crate::tls::load_ca_bundle(path).map_err(|e| ConfigError(format!("{key_path}: {e}")))?;
    std::fs::read_to_string(path).map(Some).map_err(|e| ConfigError(format!("{key_path}: {e}")))
}

fn s3_config(s: RawS3, env: &dyn Fn(&str) -> Option<String>) -> Result<S3Config, ConfigError> {
    if let Some(e) = &s.endpoint {
        BaseUrl::parse(e).map_err(|m| ConfigError(format!("storage.s3.endpoint: {m}")))?;
    }
    if s.bucket.is_empty() {
        return err("storage.s3.bucket: must not be empty");
    }
    let access_key = secret("storage.s3.access_key", s.access_key, s.access_key_env, env)?
        .ok_or_else(|| ConfigError("storage.s3.access_key: required (or access_key_env)".into()))?;
    let secret_key = secret("storage.s3.secret_key", s.secret_key, s.secret_key_env, env)?
        .ok_or_else(|| ConfigError("storage.s3.secret_key: required (or secret_key_env)".into()))?;
    let url_ttl_secs = s.url_ttl_secs.unwrap_or(86_400);
    if url_ttl_secs == 0 || url_ttl_secs > 7 * 86_400 {
        return err("storage.s3.url_ttl_secs: 1 to 604800 (presigned URLs last at most 7 days)");
    }
    if let Some(p) = &s.public_base_url {
        BaseUrl::parse(p).map_err(|m| ConfigError(format!("storage.s3.public_base_url: {m}")))?;
    }
    let ca_pem = ca_pem_file("storage.s3.ca_file", s.ca_file.as_deref())?;
    Ok(S3Config {
        ca_pem,
        endpoint: s.endpoint,
        region: s.region,
        bucket: s.bucket,
        access_key,
        secret_key,
        force_path_style: s.force_path_style.unwrap_or(true),
        url_ttl_secs,
        public_base_url: s.public_base_url.map(|p| p.trim_end_matches('/').to_string()),
    })
}

fn video_config(v: RawVideo, env: &dyn Fn(&str) -> Option<String>) -> Result<VideoConfig, ConfigError> {
    let u = v.upstream;
    let base_url = BaseUrl::parse(&u.base_url).map_err(|e| ConfigError(format!("video.upstream.base_url: {e}")))?;
    if !base_url.prefix.is_empty() {
        return err("video.upstream.base_url: the video service is called at '/', give no path");
    }
    let secret_id = secret("video.upstream.secret_id", u.secret_id, u.secret_id_env, env)?
        .ok_or_else(|| ConfigError("video.upstream.secret_id: required (or secret_id_env)".into()))?;
    let secret_key = secret("video.upstream.secret_key", u.secret_key, u.secret_key_env, env)?
        .ok_or_else(|| ConfigError("video.upstream.secret_key: required (or secret_key_env)".into()))?;
    let brand = u.brand.unwrap_or_else(|| "Gen".to_string());
    if brand.is_empty() || !brand.chars().all(|c| c.is_ascii_alphanumeric()) {
        return err("video.upstream.brand: letters and digits only");
    }
    let known = VIDEO_MODELS;
    let models = match v.models {
        Some(list) => {
            if let Some(m) = list.iter().find(|m| !known.contains(&m.as_str())) {
                return err(format!("video.models: '{m}' is not a known video model ({})", known.join(", ")));
            }
            list
        }
        None => known.iter().map(|m| m.to_string()).collect(),
    };
    for (model, price) in &v.prices {
        if !known.contains(&model.as_str()) {
            return err(format!("video.prices.{model}: not a known video model"));
        }
        if !(price.is_finite() && *price >= 0.0) {
            return err(format!("video.prices.{model}: must be a non-negative number"));
        }
    }
    if let Some(m) = models.iter().find(|m| !v.prices.contains_key(*m)) {
        return err(format!(
            "video.prices.{m}: no price for an enabled video model; price it (0 serves it free) or leave it out of video.models"
        ));
    }
    let poll_interval_secs = v.poll_interval_secs.unwrap_or(5);
    if poll_interval_secs == 0 {
        return err("video.poll_interval_secs: must be at least 1");
    }
    let ca_pem = ca_pem_file("video.upstream.ca_file", u.ca_file.as_deref())?;
    let rate_per_sec = u.rate_per_sec.unwrap_or(20);
    if rate_per_sec == 0 {
        return err("video.upstream.rate_per_sec: must be at least 1");
    }
    Ok(VideoConfig {
        base_url,
        secret_id,
        secret_key,
        region: u.region,
        version: u.version,
        brand,
        timeout_secs: u.timeout_secs.unwrap_or(30),
        rate_per_sec,
        ca_pem,
        poll_interval_secs,
        poll_concurrency: v.poll_concurrency.unwrap_or(8).max(1),
        prices: v.prices,
        models,
        max_task_hours: v.max_task_hours.unwrap_or(24),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    const MINIMAL: &str = r#"
listen: 127.0.0.1:8080
providers:
  - name: openai
    protocol: openai
    base_url: https://api.openai.com
    api_key: sk-up
    models: [alpha-5.5]
prices:
  alpha-5.5: { input: 1.25, output: 10.0 }
keys:
  - { key: sk-demo-0001, name: demo, group: default, balance: 5.0 }
"#;

    #[test]
    fn minimal_config_gets_defaults() {
        let c = Config::parse(MINIMAL, &no_env).expect("valid");
        assert_eq!(c.max_body_bytes, DEFAULT_MAX_BODY_BYTES);
        assert_eq!(c.groups["default"].platforms.len(), 4, "every platform, video included");
        assert_eq!(c.providers[0].base_url.port, 443);
        assert!(c.keys[0].enabled);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

        /// A config file with lines dropped, repeated or cut, or bytes inserted: loaded or
        /// refused with a message, never a panic.
        #[test]
        fn a_damaged_config_is_loaded_or_refused(
            edits in proptest::collection::vec((0usize..64, 0u8..4, proptest::prelude::any::<String>()), 0..6),
        ) {
            let mut lines: Vec<String> = format!("{MINIMAL}billing: {{ commit_interval_ms: 5 }}\nmax_body_bytes: 1000000\n")
                .lines()
                .map(str::to_string)
                .collect();
            for (at, kind, text) in edits {
                let i = at % lines.len().max(1);
                match kind {
                    0 if !lines.is_empty() => { lines.remove(i); }
                    1 if !lines.is_empty() => { let l = lines[i].clone(); lines.insert(i, l); }
                    2 if !lines.is_empty() => { let l = &mut lines[i]; let cut = l.char_indices().nth(at % (l.len() + 1)).map_or(l.len(), |(p, _)| p); l.truncate(cut); }
                    _ => lines.insert(i, text),
                }
            }
            match Config::parse(&lines.join("\n"), &no_env) {
                Ok(c) => proptest::prop_assert!(c.max_body_bytes > 0),
                Err(e) => proptest::prop_assert!(!e.0.is_empty()),
            }
        }
    }

    #[test]
    fn body_bounds_default_and_are_checked() {
        let c = Config::parse(MINIMAL, &no_env).expect("valid");
        assert_eq!(c.body_read_timeout, std::time::Duration::from_secs(DEFAULT_BODY_READ_TIMEOUT_SECS));
        assert!(c.max_buffered_body_bytes >= 2 * c.max_body_bytes);
        let c = Config::parse(&format!("{MINIMAL}max_buffered_body_bytes: 40000000\nbody_read_timeout_secs: 5\n"), &no_env).expect("valid");
        assert_eq!((c.max_buffered_body_bytes, c.body_read_timeout.as_secs()), (40_000_000, 5));
        let e = Config::parse(&format!("{MINIMAL}max_buffered_body_bytes: 1000\n"), &no_env).unwrap_err();
        assert!(e.0.contains("max_buffered_body_bytes: must be at least max_body_bytes"), "{e}");
        let e = Config::parse(&format!("{MINIMAL}body_read_timeout_secs: 0\n"), &no_env).unwrap_err();
        assert!(e.0.contains("body_read_timeout_secs"), "{e}");
    }

    #[test]
    fn commit_policy_defaults_bounds_and_header_safe_keys() {
        let c = Config::parse(MINIMAL, &no_env).expect("valid");
        assert_eq!(c.commit, CommitPolicy { interval: std::time::Duration::from_millis(10), sync: false });
        let c = Config::parse(&format!("{MINIMAL}billing: {{ commit_interval_ms: 0, sync_commit: true }}\n"), &no_env).expect("valid");
        assert_eq!(c.commit, CommitPolicy { interval: std::time::Duration::ZERO, sync: true });
        let e = Config::parse(&format!("{MINIMAL}billing: {{ commit_interval_ms: 1001 }}\n"), &no_env).unwrap_err();
        assert!(e.0.contains("billing.commit_interval_ms: at most 1000"), "{e}");
        let e = Config::parse(&MINIMAL.replace("api_key: sk-up", "api_key: \"sk up\""), &no_env).unwrap_err();
        assert!(e.0.contains("providers[0].api_key: must be printable ASCII"), "{e}");
    }

    #[test]
    fn unknown_key_is_rejected_by_name() {
        let text = format!("{MINIMAL}\nlisten_port: 3\n");
        let e = Config::parse(&text, &no_env).unwrap_err();
        assert!(e.0.contains("listen_port"), "{e}");
        let nested = MINIMAL.replace("api_key: sk-up", "api_key: sk-up\n    apikey: x");
        let e = Config::parse(&nested, &no_env).unwrap_err();
        assert!(e.0.contains("apikey"), "{e}");
    }

    #[test]
    fn missing_env_variable_is_named() {
        let text = MINIMAL.replace("api_key: sk-up", "api_key_env: TOLLGATE_TEST_MISSING");
        let e = Config::parse(&text, &no_env).unwrap_err();
        assert!(e.0.contains("TOLLGATE_TEST_MISSING"), "{e}");
        assert!(e.0.contains("providers[0].api_key_env"), "{e}");
        let found = |n: &str| (n == "TOLLGATE_TEST_MISSING").then(|| "sk-env".to_string());
        let c = Config::parse(&text, &found).expect("valid");
        assert_eq!(c.providers[0].api_keys, ["sk-env"]);
    }

    #[test]
    fn routing_settings_default_and_are_checked() {
        let c = Config::parse(MINIMAL, &no_env).expect("valid");
        assert_eq!(c.retry, RetryPolicy { attempts: 2, on_status: vec![429, 500, 502, 503, 504], deadline: None });
        assert_eq!(c.balance_factor, 0.25);
        assert_eq!(Config::parse(&format!("{MINIMAL}routing: {{ balance_factor: 0.1 }}\n"), &no_env).expect("valid").balance_factor, 0.1);
        let p = &c.providers[0];
        assert_eq!((p.priority, p.weight, p.cooldown.as_secs(), p.failures_before_cooldown), (0, 1, 30, 3));
        let text = MINIMAL.replace(
            "api_key: sk-up",
            "api_keys: [sk-a, sk-b]\n    priority: 2\n    weight: 5\n    cooldown_secs: 9\n    failures_before_cooldown: 1",
        );
        let c =
            Config::parse(&format!("{text}retry: {{ attempts: 3, on_status: [429, 529], deadline_secs: 20 }}\n"), &no_env).expect("valid");
        assert_eq!(c.retry, RetryPolicy { attempts: 3, on_status: vec![429, 529], deadline: Some(std::time::Duration::from_secs(20)) });
        let p = &c.providers[0];
        assert_eq!((p.api_keys.len(), p.priority, p.weight, p.cooldown.as_secs(), p.failures_before_cooldown), (2, 2, 5, 9, 1));
        let pool = MINIMAL.replace("api_key: sk-up", "api_keys_env: POOL");
        let env = |n: &str| (n == "POOL").then(|| "sk-1, sk-2\nsk-3".to_string());
        assert_eq!(Config::parse(&pool, &env).expect("valid").providers[0].api_keys, ["sk-1", "sk-2", "sk-3"]);
        for (bad, named) in [
            (MINIMAL.replace("api_key: sk-up", "api_key: sk-up\n    api_keys: [sk-a]"), "give one of"),
            (MINIMAL.replace("api_key: sk-up", "api_keys: []"), "api_keys: list at least one"),
            (MINIMAL.replace("api_key: sk-up", "api_keys: [sk-a, \"b c\"]"), "printable ASCII"),
            (MINIMAL.replace("api_key: sk-up", "api_key: sk-up\n    weight: 0"), "weight: 1 to 1000"),
            (
                MINIMAL.replace("https://api.openai.com", "https://api.openai.com/v1"),
                "ends in /v1, which tollgate adds to every upstream path itself (/v1/…); write base_url: https://api.openai.com",
            ),
            (MINIMAL.replace("https://api.openai.com", "https://openrouter.ai/api/v1/"), "write base_url: https://openrouter.ai/api"),
            (MINIMAL.replace("api_key: sk-up", "api_key: sk-up\n    failures_before_cooldown: 0"), "failures_before_cooldown"),
            (format!("{MINIMAL}retry: {{ attempts: 0 }}\n"), "retry.attempts"),
            (format!("{MINIMAL}retry: {{ on_status: [200] }}\n"), "retry.on_status: 200"),
            (format!("{MINIMAL}retry: {{ deadline_secs: 0 }}\n"), "retry.deadline_secs"),
            (format!("{MINIMAL}routing: {{ balance_factor: -0.1 }}\n"), "routing.balance_factor: 0 to 100"),
            (format!("{MINIMAL}routing: {{ balance_factor: .nan }}\n"), "routing.balance_factor"),
            (format!("{MINIMAL}routing: {{ spread: 1 }}\n"), "spread"),
        ] {
            let e = Config::parse(&bad, &no_env).unwrap_err();
            assert!(e.0.contains(named), "{bad}: {e}");
        }
    }

    #[test]
    fn a_metrics_listener_off_loopback_needs_a_token_or_an_allowlist() {
        let with = |m: &str| format!("{MINIMAL}metrics: {m}\n");
        let e = Config::parse(&with("{ listen: 0.0.0.0:9100 }"), &no_env).unwrap_err();
        assert!(e.0.contains("metrics.listen") && e.0.contains("token_env"), "{e}");
        assert!(Config::parse(&with("{ listen: 127.0.0.1:9100 }"), &no_env).is_ok(), "loopback alone is fine");
        assert!(Config::parse(&with("{ listen: 0.0.0.0:9100, allow: [10.0.0.0/8] }"), &no_env).is_ok());
        let e = Config::parse(&with("{ listen: 0.0.0.0:9100, token_env: NOPE_UNSET }"), &no_env).unwrap_err();
        assert!(e.0.contains("NOPE_UNSET"), "{e}");
        let env = |name: &str| (name == "SCRAPE").then(|| "a-long-random-scrape-token-123".to_string());
        let c = Config::parse(&with("{ listen: 0.0.0.0:9100, token_env: SCRAPE }"), &env).expect("valid");
        assert_eq!(c.metrics.and_then(|m| m.token).as_deref(), Some("a-long-random-scrape-token-123"));
        let e = Config::parse(&with("{ listen: 127.0.0.1:8080 }"), &no_env).unwrap_err();
        assert!(e.0.contains("another listener"), "{e}");
    }

    #[test]
    fn key_with_unknown_group_names_the_key() {
        let text = MINIMAL.replace("group: default", "group: nope");
        let e = Config::parse(&text, &no_env).unwrap_err();
        assert!(e.0.contains("keys[0].group") && e.0.contains("nope"), "{e}");
        // Left out, a key's group is `default`, as in the admin API.
        let text = MINIMAL.replace(", group: default", "");
        assert_ne!(text, MINIMAL);
        let c = Config::parse(&text, &no_env).expect("valid");
        assert_eq!(c.keys[0].group, "default");
    }

    #[test]
    fn bad_base_url_and_protocol_are_named() {
        let e = Config::parse(&MINIMAL.replace("https://api.openai.com", "ftp://x"), &no_env).unwrap_err();
        assert!(e.0.contains("providers[0].base_url"), "{e}");
        let e = Config::parse(&MINIMAL.replace("protocol: openai", "protocol: cohere"), &no_env).unwrap_err();
        assert!(e.0.contains("cohere"), "{e}");
        let e = Config::parse(&MINIMAL.replace("127.0.0.1:8080", "localhost"), &no_env).unwrap_err();
        assert!(e.0.contains("listen"), "{e}");
    }

    #[test]
    fn video_section_is_typed_and_secrets_named() {
        let text = format!(
            "{MINIMAL}video:\n  upstream: {{ base_url: https://vclm.tencentcloudapi.com, secret_id_env: TC_ID, secret_key: k, region: ap-guangzhou, version: \"2024-05-23\" }}\n  models: [genq3-pro]\n  prices: {{ genq3-pro: 0.05 }}\n"
        );
        let e = Config::parse(&text, &no_env).unwrap_err();
        assert!(e.0.contains("video.upstream.secret_id_env") && e.0.contains("TC_ID"), "{e}");
        let c = Config::parse(&text, &|n: &str| (n == "TC_ID").then(|| "id".to_string())).expect("valid");
        let v = c.video.expect("video");
        assert_eq!(v.brand, "Gen");
        assert_eq!(v.rate_per_sec, 20);
        assert_eq!(v.models, ["genq3-pro"]);
        let bad = text.replace("genq3-pro: 0.05", "genq9: 0.05");
        let e = Config::parse(&bad, &|_: &str| Some("x".to_string())).unwrap_err();
        assert!(e.0.contains("video.prices.genq9"), "{e}");
        let bad = text.replace("region: ap-guangzhou", "region: ap-guangzhou, zone: x");
        let e = Config::parse(&bad, &|_: &str| Some("x".to_string())).unwrap_err();
        assert!(e.0.contains("zone"), "{e}");
    }

    #[test]
    fn storage_section_is_typed() {
        let text = format!("{MINIMAL}storage:\n  s3: {{ endpoint: \"http://127.0.0.1:9000\", region: us-east-1, bucket: b, access_key: a, secret_key_env: S3_SK }}\n");
        let e = Config::parse(&text, &no_env).unwrap_err();
        assert!(e.0.contains("storage.s3.secret_key_env") && e.0.contains("S3_SK"), "{e}");
        let c = Config::parse(&text, &|name: &str| (name == "S3_SK").then(|| "sk".to_string())).expect("valid");
        let s3 = c.storage.expect("storage");
        assert_eq!((s3.url_ttl_secs, s3.force_path_style, s3.secret_key.as_str()), (86_400, true, "sk"));
        let e = Config::parse(&text.replace("bucket: b", "bucket: b, acl: public"), &|_: &str| Some("x".into())).unwrap_err();
        assert!(e.0.contains("acl"), "{e}");
    }

    /// Billing fails closed: every served model and every enabled video model has a price.
    #[test]
    fn every_served_model_needs_a_price() {
        let unpriced = MINIMAL.replace("models: [alpha-5.5]", "models: [alpha-5.5, alpha-x]");
        let e = Config::parse(&unpriced, &no_env).unwrap_err();
        assert!(e.0.contains("prices.alpha-x: no price for a served model"), "{e}");
        let free = unpriced.to_string().replace("prices:\n", "prices:\n  alpha-x: { input: 0, output: 0 }\n");
        Config::parse(&free, &no_env).expect("a model priced 0 is deliberately free");
        let video = "video:\n  upstream: { base_url: https://v.example.com, secret_id: i, secret_key: k, region: r, version: v }\n  prices: { genq3-pro: 0.05 }\n";
        let e = Config::parse(&format!("{MINIMAL}{video}"), &no_env).unwrap_err();
        assert!(e.0.contains("video.prices.") && e.0.contains("no price for an enabled video model"), "{e}");
        let listed = video.replace("  prices:", "  models: [genq3-pro]\n  prices:");
        Config::parse(&format!("{MINIMAL}{listed}"), &no_env).expect("only priced models enabled");
        let bad = MINIMAL.replace("{ input: 1.25, output: 10.0 }", "{ input: 1.25, output: 10.0, max_output_tokens: 0 }");
        assert!(Config::parse(&bad, &no_env).unwrap_err().0.contains("max_output_tokens"));
    }

    #[test]
    fn admin_token_must_be_long() {
        for token in ["\"\"", "short", "fifteen-chars-x"] {
            let text = format!("{MINIMAL}admin: {{ listen: 127.0.0.1:9, token: {token} }}\n");
            let e = Config::parse(&text, &no_env).unwrap_err();
            assert!(e.0.contains("admin.token: at least 16 characters"), "{token}: {e}");
        }
        let text = format!("{MINIMAL}admin: {{ listen: 127.0.0.1:9, token: sixteen-chars-xx }}\n");
        assert_eq!(Config::parse(&text, &no_env).expect("valid").admin.expect("admin").token.as_deref(), Some("sixteen-chars-xx"));
    }

    #[test]
    fn placeholder_admin_tokens_are_refused_and_an_unset_one_is_generated_later() {
        for token in ["change-me-to-a-long-random-secret", "CHANGEME-please-0000", "replace-me-with-a-secret", "example-admin-token-1234"] {
            let text = format!("{MINIMAL}admin: {{ listen: 127.0.0.1:9, token: {token} }}\n");
            let e = Config::parse(&text, &no_env).unwrap_err();
            assert!(e.0.contains("admin.token: this is a placeholder"), "{token}: {e}");
        }
        let text = format!("{MINIMAL}admin: {{ listen: 127.0.0.1:9, token_env: TOLLGATE_ADMIN_TOKEN }}\n");
        assert_eq!(Config::parse(&text, &no_env).expect("valid").admin.expect("admin").token, None);
        let placeholder = |_: &str| Some("change-me-to-a-long-random-secret".to_string());
        assert!(Config::parse(&text, &placeholder).is_err(), "a placeholder from the environment too");
        let set = |name: &str| (name == "TOLLGATE_ADMIN_TOKEN").then(|| "k3Jd9sLq0PzX7vBn2MwE".to_string());
        assert_eq!(Config::parse(&text, &set).expect("valid").admin.expect("admin").token.as_deref(), Some("k3Jd9sLq0PzX7vBn2MwE"));
        let hosts = format!("{MINIMAL}admin: {{ listen: 127.0.0.1:9, hosts: [Admin.Internal] }}\n");
        assert_eq!(Config::parse(&hosts, &no_env).expect("valid").admin.expect("admin").hosts, ["admin.internal"]);
        let bad = format!("{MINIMAL}admin: {{ listen: 127.0.0.1:9, hosts: [\"http://x\"] }}\n");
        assert!(Config::parse(&bad, &no_env).unwrap_err().0.contains("admin.hosts[0]"));
    }

    #[test]
    fn video_is_a_platform_and_forward_headers_are_checked() {
        let text = format!("{MINIMAL}groups:\n  default: {{ platforms: [openai, video] }}\nforward_headers: [X-Trace-Id, \"x-mock-*\"]\n");
        let c = Config::parse(&text, &no_env).expect("valid");
        assert_eq!(c.groups["default"].platforms, [Platform::Openai, Platform::Video]);
        assert_eq!(c.forward_headers, ["x-trace-id", "x-mock-*"]);
        let e = Config::parse(&format!("{MINIMAL}forward_headers: [Authorization]\n"), &no_env).unwrap_err();
        assert!(e.0.contains("forward_headers[0]"), "{e}");
        let e = Config::parse(&format!("{MINIMAL}forward_headers: [\"bad header\"]\n"), &no_env).unwrap_err();
        assert!(e.0.contains("forward_headers[0]"), "{e}");
        let c = Config::parse(&format!("{MINIMAL}forward_response_headers: [X-RateLimit-*]\n"), &no_env).expect("valid");
        assert_eq!(c.forward_response_headers, ["x-ratelimit-*"]);
        for bad in ["Set-Cookie", "set-*", "connection"] {
            let e = Config::parse(&format!("{MINIMAL}forward_response_headers: [\"{bad}\"]\n"), &no_env).unwrap_err();
            assert!(e.0.contains("forward_response_headers[0]") && e.0.contains("never relayed"), "{bad}: {e}");
        }
    }

    #[test]
    fn limits_default_and_are_checked() {
        let c = Config::parse(MINIMAL, &no_env).expect("valid");
        assert_eq!(c.connections, crate::listener::ConnLimits::default());
        assert_eq!(c.drain, std::time::Duration::from_secs(DEFAULT_DRAIN_SECS));
        let text = format!("{MINIMAL}limits: {{ header_timeout_secs: 5, max_header_bytes: 8192, max_connections: 0, max_connections_per_ip: 9, keepalive_timeout_secs: 2 }}\n");
        let l = Config::parse(&text, &no_env).expect("valid").connections;
        assert_eq!(
            (l.header_timeout.as_secs(), l.max_header_bytes, l.max_connections, l.max_connections_per_ip, l.keepalive_timeout.as_secs()),
            (5, 8192, 0, 9, 2)
        );
        for bad in [
            "header_timeout_secs: 0",
            "header_timeout_secs: 61",
            "max_header_bytes: 100",
            "max_header_bytes: 2000000",
            "keepalive_timeout_secs: 0",
            "keepalive_timeout_secs: 61",
            "nonsense: 1",
        ] {
            let e = Config::parse(&format!("{MINIMAL}limits: {{ {bad} }}\n"), &no_env).unwrap_err();
            assert!(e.0.contains("limits") || e.0.contains("unknown field"), "{bad}: {e}");
        }
        assert!(Config::parse(&format!("{MINIMAL}billing: {{ drain_secs: 601 }}\n"), &no_env)
            .unwrap_err()
            .0
            .contains("billing.drain_secs"));
        let media =
            Config::parse(&format!("{MINIMAL}billing: {{ image_input_tokens: 10, file_input_tokens: 20 }}\n"), &no_env).expect("valid");
        assert_eq!((media.media_allowance.image_tokens, media.media_allowance.file_tokens), (10, 20));
    }

    #[test]
    fn the_store_section_is_checked_and_its_url_never_printed() {
        let env = |name: &str| (name == "DB_URL").then(|| "postgres://tollgate:s3cret@db:5432/tollgate".to_string());
        let c = Config::parse(&format!("{MINIMAL}store: {{ postgres: {{ url_env: DB_URL }}, node_id: edge-1 }}\n"), &env).expect("valid");
        let fleet = c.fleet.as_ref().expect("a fleet");
        assert_eq!((fleet.node_id.as_str(), fleet.lease.as_secs(), fleet.sync.as_millis()), ("edge-1", 30, 1000));
        assert_eq!(fleet.postgres.pool_size, 16);
        assert!(!format!("{c:?}").contains("s3cret"), "the database password in a debug print");
        assert!(Config::parse(MINIMAL, &env).expect("valid").fleet.is_none(), "no store: the local one");
        for (bad, says) in [
            ("store: { postgres: { url_env: NOPE } }", "NOPE is not set"),
            ("store: { postgres: { url: 'mysql://x' } }", "postgres://"),
            ("store: { postgres: {} }", "url or url_env"),
            ("store: { postgres: { url: 'postgres://a@b/c', url_env: DB_URL } }", "either"),
            ("store: { node_id: a }", "add store.postgres"),
            ("store: { postgres: { url_env: DB_URL }, node_id: 'a b' }", "store.node_id"),
            ("store: { postgres: { url_env: DB_URL }, node_id: a, lease_secs: 2 }", "store.lease_secs"),
            ("store: { postgres: { url_env: DB_URL }, node_id: a, lease_secs: 4, sync_ms: 2000 }", "half of store.lease_secs"),
            ("store: { postgres: { url_env: DB_URL, pool_size: 0 }, node_id: a }", "pool_size"),
            ("store: { postgres: { url_env: DB_URL }, nodes: 3 }", "unknown field"),
        ] {
            let e = Config::parse(&format!("{MINIMAL}{bad}\n"), &env).expect_err(bad);
            assert!(e.0.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn base_url_parts() {
        let b = BaseUrl::parse("http://127.0.0.1:9100/openai/").expect("valid");
        assert_eq!(b, BaseUrl { tls: false, host: "127.0.0.1".into(), port: 9100, prefix: "/openai".into() });
        assert_eq!(b.host_header(), "127.0.0.1:9100");
        let b = BaseUrl::parse("https://api.example.com").expect("valid");
        assert_eq!(b.prefix, "");
        assert_eq!(b.host_header(), "api.example.com");
        assert!(BaseUrl::parse("https://user:pw@x.com").is_err());
        assert!(BaseUrl::parse("x.com").is_err());
    }
}
