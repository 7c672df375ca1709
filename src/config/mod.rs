//! The configuration file: YAML → typed, validated [`Config`].
//!
//! Every rule about what a valid configuration is lives here, one file per section, each
//! with its raw shape (as written), its validated values and its parser: [`listen`]
//! (listeners, admin, metrics, body and connection limits), [`upstream`] (providers, groups,
//! forwarded headers, retries, routing), [`billing`] (prices, output allowances, commit,
//! calendar), [`keys`] (keys and shared accounts), [`video`] (the video service and object
//! storage), [`console`] (request log, log format), [`telemetry`] (OpenTelemetry) and
//! [`store`] (a fleet's shared database). Unknown keys are rejected, secrets given as `*_env`
//! are read from the environment at load time (a missing variable is named), and every error
//! message names the offending key.
//!
//! The configuration builds values and opens nothing: no database, no socket. It may import
//! `base`, `protocol`, `policy` (a key's policy is parsed by its rules) and `tls` (a
//! certificate that does not read is refused at start and on reload); everything else
//! imports it.

pub mod billing;
pub mod cache;
pub mod changes;
pub mod claude_code;
pub mod cloud;
pub mod console;
pub mod fallbacks;
pub mod feed;
pub mod guardrails;
pub mod identity;
pub mod keys;
pub mod listen;
pub mod mcp;
pub mod notifications;
pub mod payments;
pub mod rewrite;
pub mod store;
pub mod telemetry;
pub mod upstream;
pub mod video;

pub use crate::protocol::Protocol;
pub use billing::{CommitPolicy, MediaAllowance, Price};
pub use cloud::{Cloud, ProviderKind};
pub use console::{ConsoleConfig, ConsoleListen, LogFormat};
pub use identity::{IdentityConfig, OidcConfig};
pub use keys::{AccountConfig, KeyConfig};
pub use listen::{AdminConfig, ConnLimits, MetricsConfig, TlsConfig};
pub use mcp::{McpAuth, McpConfig, McpServerConfig, McpTransport};
pub use store::{FleetConfig, PgSettings};
pub use upstream::{BaseUrl, Group, Platform, ProviderConfig, RetryPolicy};
pub use video::{S3Config, VideoConfig, VIDEO_MODELS};

use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// A configuration error; the message names the key at fault.
#[derive(Debug)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

fn err<T>(msg: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError(msg.into()))
}

// ---------------------------------------------------------------- raw file shape

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    pingora: Option<serde_yaml::Value>,
    #[serde(default)]
    listen: Option<String>,
    #[serde(default)]
    tls: Option<listen::RawTls>,
    #[serde(default)]
    data_dir: Option<PathBuf>,
    #[serde(default)]
    max_body_bytes: Option<usize>,
    #[serde(default)]
    max_buffered_body_bytes: Option<usize>,
    #[serde(default)]
    body_read_timeout_secs: Option<u64>,
    #[serde(default)]
    admin: Option<listen::RawAdmin>,
    /// `metrics: { listen, token_env, allow }`: `/metrics` on a listener of its own.
    #[serde(default)]
    metrics: Option<listen::RawMetrics>,
    #[serde(default)]
    providers: Vec<upstream::RawProvider>,
    #[serde(default)]
    groups: BTreeMap<String, upstream::RawGroup>,
    #[serde(default)]
    prices: BTreeMap<String, Price>,
    #[serde(default)]
    keys: Vec<keys::RawKey>,
    /// Shared accounts keys may draw on (`keys[].account`).
    #[serde(default)]
    accounts: Vec<keys::RawAccount>,
    #[serde(default)]
    billing: Option<billing::RawBilling>,
    #[serde(default)]
    video: Option<video::RawVideo>,
    #[serde(default)]
    storage: Option<video::RawStorage>,
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
    retry: Option<upstream::RawRetry>,
    /// How providers of one tier share the traffic.
    #[serde(default)]
    routing: Option<upstream::RawRouting>,
    /// `log: { format: text | json }`.
    #[serde(default)]
    log: Option<console::RawLog>,
    /// The request log and the console (`console:`).
    #[serde(default)]
    console: Option<console::RawConsole>,
    /// People and clients signed in by an OpenID Connect provider (`identity:`).
    #[serde(default)]
    identity: Option<identity::RawIdentity>,
    /// The MCP servers tollgate fronts at `/mcp` (`mcp:`).
    #[serde(default)]
    mcp: Option<mcp::RawMcp>,
    /// Client connections and request headers (see `listener`).
    #[serde(default)]
    limits: Option<listen::RawLimits>,
    /// `telemetry: { otlp: … }` (see [`telemetry`]).
    #[serde(default)]
    telemetry: Option<telemetry::RawTelemetry>,
    /// Where keys, money, records and tasks are kept: the local sled database (default) or a
    /// PostgreSQL server shared by several nodes.
    #[serde(default)]
    store: Option<store::RawStore>,
    /// The guardrails calls' texts go through (`guardrails:`), attached by name.
    #[serde(default)]
    guardrails: Vec<guardrails::RawGuardrail>,
    /// What the keys carrying a tag value share: `{ "team=search": { rpm, tpm, max_concurrent, budgets } }`.
    #[serde(default)]
    tag_limits: std::collections::BTreeMap<String, crate::policy::limits::TagLimitInput>,
    /// What keys and accounts subscribe to: a credit per period and limits of its own.
    #[serde(default)]
    plans: Vec<crate::policy::plan::PlanInput>,
    /// Where alerts go: signed webhooks, and which events each receives.
    #[serde(default)]
    notifications: Vec<notifications::RawNotification>,
    /// How customers pay for credit (`payments: { stripe: … }`).
    #[serde(default)]
    payments: Option<payments::RawPayments>,
    /// Prices read from a published table (`price_feed:`).
    #[serde(default)]
    price_feed: Option<feed::RawFeed>,
    /// The response cache's store (`cache:`); without it, no cache.
    #[serde(default)]
    cache: Option<cache::RawCache>,
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
    /// `console.listen`: the console's own listener, when it has one.
    pub console_listen: Option<ConsoleListen>,
    /// `identity:`: the OpenID Connect provider, when one is configured.
    pub identity: IdentityConfig,
    /// `mcp:`: the MCP servers behind `/mcp`.
    pub mcp: McpConfig,
    /// Output tokens held and asked for, per choice, when a request names no maximum and
    /// neither its key nor its model sets one (`billing.default_output_tokens`).
    pub default_output_tokens: u64,
    /// The fewest output tokens such a request is lowered to when its key cannot afford the
    /// default (`billing.min_output_tokens`).
    pub min_output_tokens: u64,
    /// The largest upstream event a translated stream holds (`limits.max_event_bytes`).
    pub max_event_bytes: usize,
    /// The largest multipart upload and what all uploads in flight may spool
    /// (`limits.max_upload_bytes`, `limits.max_spooled_bytes`).
    pub uploads: listen::Uploads,
    /// The bounds of a realtime session (`limits.realtime_*`).
    pub realtime: listen::Realtime,
    /// How often an open batch is asked about at its provider (`limits.batch_poll_secs`).
    pub batch_poll_secs: u64,
    /// Usage records older than this are deleted.
    pub usage_retention_days: u64,
    /// How usage records reach the disk (`billing.commit_interval_ms`, `billing.sync_commit`).
    pub commit: CommitPolicy,
    pub video: Option<VideoConfig>,
    pub storage: Option<S3Config>,
    /// Retries before the first byte (`retry:`).
    pub retry: RetryPolicy,
    /// Fallbacks across models and the bounds of one request's attempts (`routing.fallbacks`,
    /// `routing.max_attempts`, `routing.max_fallback_secs`).
    pub fallbacks: fallbacks::Fallbacks,
    /// ε of conversation affinity's bounded load (`routing.balance_factor`): a provider takes
    /// a conversation's request only while its share of its tier's recent traffic is within
    /// `1 + ε` times its weighted share.
    pub balance_factor: f64,
    /// `log.format`.
    pub log_format: LogFormat,
    /// Client connections and request headers (`limits:`).
    pub connections: ConnLimits,
    /// How long a response whose client left is still read for its usage (`billing.drain_secs`).
    pub drain: std::time::Duration,
    /// Input tokens held per referenced image and file.
    pub media_allowance: MediaAllowance,
    /// `store:` with `postgres:` — the store several nodes share. None: the local sled store.
    pub fleet: Option<FleetConfig>,
    /// OpenTelemetry traces (`telemetry.otlp` and the `OTEL_*` variables); None: off.
    pub otlp: Option<telemetry::Settings>,
    /// `guardrails:`, attached by name to groups, accounts and keys.
    pub guardrails: Vec<guardrails::GuardrailConfig>,
    /// `tag_limits:`.
    pub tag_limits: crate::policy::limits::TagLimits,
    /// `plans:`.
    pub plans: crate::policy::plan::Plans,
    /// `notifications:`.
    pub notifications: Vec<notifications::NotificationConfig>,
    /// `payments.stripe`: card top-ups through Stripe Checkout.
    pub stripe: Option<payments::StripeConfig>,
    /// `price_feed`: prices from a published table (the file's win).
    pub price_feed: Option<feed::FeedConfig>,
    /// The response cache (`cache:`); None: no cache.
    pub cache: Option<cache::CacheConfig>,
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

    /// Parse and validate YAML text; `env` looks up environment variables. Each section is
    /// checked by its own parser (the modules below); what one section's rules need of
    /// another's is passed in.
    pub fn parse(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let raw: RawConfig = serde_yaml::from_str(text).map_err(|e| ConfigError(e.to_string()))?;

        let front =
            listen::front(raw.listen.as_deref(), raw.tls, raw.max_body_bytes, raw.max_buffered_body_bytes, raw.body_read_timeout_secs)?;
        let admin = listen::admin(raw.admin, env)?;
        let metrics = listen::metrics(raw.metrics, env, admin.as_ref(), front.listen)?;
        let trusted_proxies = listen::trusted_proxies(&raw.trusted_proxies)?;
        let (max_event_bytes, uploads, realtime, connections, batch_poll_secs) = listen::limits(raw.limits)?;

        let providers = upstream::providers(raw.providers, env)?;
        let groups = upstream::groups(raw.groups)?;
        let (forward_headers, forward_response_headers) = upstream::forwarded_headers(&raw.forward_headers, &raw.forward_response_headers)?;
        let retry = upstream::retry(raw.retry)?;
        let balance_factor = upstream::balance_factor(raw.routing.as_ref())?;
        let fallbacks = {
            let (chains, bounds) = match raw.routing {
                Some(r) => (r.fallbacks, (r.max_attempts, r.max_fallback_secs)),
                None => (None, (None, None)),
            };
            let served = |m: &str| providers.iter().any(|p| p.models.iter().any(|n| n == m));
            fallbacks::fallbacks(chains, bounds, &served, retry.attempts)?
        };

        let price_feed = feed::feed(raw.price_feed)?;
        billing::check_prices(&raw.prices, &providers, price_feed.as_ref())?;
        let billing = billing::billing(raw.billing)?;
        let accounts = keys::accounts(raw.accounts)?;
        let keys = keys::keys(raw.keys, &groups, &accounts)?;

        let video = raw.video.map(|v| video::video_config(v, env)).transpose()?;
        let storage = raw.storage.map(|s| video::storage(s, env)).transpose()?;
        let identity = identity::identity(raw.identity, env)?;
        let mcp = mcp::mcp(raw.mcp, env)?;
        let console_listen = console::console_listen(raw.console.as_ref(), identity.oidc.is_some())?;
        let console = console::console(raw.console)?;
        let otlp = telemetry::telemetry(raw.telemetry.as_ref(), env)?;
        let fleet = store::fleet_config(raw.store, env)?;
        let guardrails = guardrails::guardrails(raw.guardrails, env, &providers)?;
        let tag_limits = crate::policy::limits::TagLimits::parse(&raw.tag_limits).map_err(|e| ConfigError(format!("tag_limits.{e}")))?;
        let notifications = notifications::notifications(raw.notifications, env)?;
        let stripe = payments::stripe(raw.payments, env)?;
        let plans = crate::policy::plan::Plans::parse(&raw.plans).map_err(|e| ConfigError(format!("plans{e}")))?;
        if let Some(s) = &identity.signup {
            if !groups.contains_key(&s.group) {
                return err(format!("identity.signup.group: no group named '{}' in groups", s.group));
            }
            if let Some(p) = s.plan.as_ref().filter(|p| plans.get(p).is_none()) {
                return err(format!("identity.signup.plan: no plan named '{p}' in plans"));
            }
        }
        let unknown_plan = |plan: &Option<String>| plan.as_ref().filter(|p| plans.get(p).is_none()).cloned();
        if let Some((i, p)) = keys.iter().enumerate().find_map(|(i, k)| unknown_plan(&k.plan).map(|p| (i, p))) {
            return err(format!("keys[{i}].plan: no plan named '{p}' in plans"));
        }
        if let Some((i, p)) = accounts.iter().enumerate().find_map(|(i, a)| unknown_plan(&a.plan).map(|p| (i, p))) {
            return err(format!("accounts[{i}].plan: no plan named '{p}' in plans"));
        }
        let config = Config {
            pingora: raw.pingora,
            listen: front.listen,
            tls: front.tls,
            data_dir: raw.data_dir.unwrap_or_else(|| PathBuf::from("./data")),
            max_body_bytes: front.max_body_bytes,
            max_buffered_body_bytes: front.max_buffered_body_bytes,
            body_read_timeout: front.body_read_timeout,
            admin,
            metrics,
            providers,
            groups,
            prices: raw.prices,
            forward_headers,
            forward_response_headers,
            trusted_proxies,
            keys,
            accounts,
            calendar: billing.calendar,
            console,
            console_listen,
            identity,
            mcp,
            default_output_tokens: billing.default_output_tokens,
            min_output_tokens: billing.min_output_tokens,
            max_event_bytes,
            uploads,
            realtime,
            batch_poll_secs,
            usage_retention_days: billing.usage_retention_days,
            commit: billing.commit,
            video,
            storage,
            retry,
            fallbacks,
            balance_factor,
            log_format: console::log_format(raw.log),
            connections,
            drain: billing.drain,
            media_allowance: billing.media_allowance,
            fleet,
            tag_limits,
            plans,
            notifications,
            stripe,
            price_feed,
            otlp,
            guardrails,
            cache: cache::cache(raw.cache)?,
        };
        guardrails::check_attached(&config)?;
        cache::check_entries(&config)?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use billing::DEFAULT_DRAIN_SECS;
    use listen::{DEFAULT_BODY_READ_TIMEOUT_SECS, DEFAULT_MAX_BODY_BYTES};

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
    fn cache_entries_need_the_cache_section_and_a_hit_has_one_price() {
        let with = |extra: &str| Config::parse(&format!("{MINIMAL}{extra}"), &no_env);
        let grouped = "groups:\n  default: { platforms: [openai], cache: { ttl: 60, scope: group } }\n";
        let e = with(grouped).expect_err("no cache section");
        assert!(e.0.starts_with("groups.default.cache: the response cache is off"), "{e}");
        let c = with(&format!("{grouped}cache: {{}}\n")).expect("valid");
        assert_eq!(c.groups["default"].cache.as_ref().map(|p| p.scope), Some(crate::policy::cache::CacheScope::Group));
        let e = with("accounts:\n  - { name: team, cache: { ttl: 5 } }\n").expect_err("no section");
        assert!(e.0.starts_with("accounts[0].cache:"), "{e}");
        let keyed = MINIMAL.replace("balance: 5.0 }", "balance: 5.0, cache: { ttl: 0 } }");
        let e = Config::parse(&format!("{keyed}cache: {{}}\n"), &no_env).expect_err("ttl 0");
        assert!(e.0.contains("cache.ttl: 1 to"), "{e}");
        let priced = |p: &str| Config::parse(&MINIMAL.replace("output: 10.0 }", &format!("output: 10.0, {p} }}")), &no_env);
        assert!(priced("cache_hit: 0.1").is_ok() && priced("cache_hit_ratio: 0.25").is_ok());
        assert!(priced("cache_hit: 0.1, cache_hit_ratio: 0.2").expect_err("both").0.contains("not both"));
        assert!(priced("cache_hit_ratio: 1.5").expect_err("above 1").0.contains("cache_hit_ratio: a fraction"));
    }

    #[test]
    fn fallbacks_name_served_models_and_known_classes_within_their_bounds() {
        let no_env = |_: &str| None;
        let text = MINIMAL
            .replace("models: [alpha-5.5]", "models: [alpha-5.5, alpha-4o]")
            .replace("prices:\n", "prices:\n  alpha-4o: { input: 1, output: 2, context_window: 128000 }\n");
        let c = Config::parse(&text, &no_env).expect("valid");
        assert_eq!((c.fallbacks.max_attempts, c.fallbacks.max_wait.as_secs()), (6, 60), "defaults");
        let with = |routing: &str| Config::parse(&format!("{text}routing: {routing}\n"), &no_env);
        let c =
            with("{ fallbacks: { alpha-5.5: { to: [alpha-4o], on: [rate_limited, timeout] } }, max_attempts: 3, max_fallback_secs: 9 }")
                .expect("valid");
        let chain = &c.fallbacks.chains["alpha-5.5"];
        assert_eq!((chain.to.as_slice(), chain.on.names()), (&["alpha-4o".to_string()][..], vec!["rate_limited", "timeout"]));
        assert_eq!((c.fallbacks.max_attempts, c.fallbacks.max_wait.as_secs()), (3, 9));
        assert_eq!(
            with("{ fallbacks: { alpha-5.5: { to: [alpha-4o] } } }").expect("valid").fallbacks.chains["alpha-5.5"].on.names().len(),
            5
        );
        for (routing, says) in [
            ("{ fallbacks: { nope: { to: [alpha-4o] } } }", "routing.fallbacks.nope: no provider serves"),
            ("{ fallbacks: { alpha-5.5: { to: [nope] } } }", "to[0]: no provider serves"),
            ("{ fallbacks: { alpha-5.5: { to: [alpha-5.5] } } }", "named twice (or is the model itself)"),
            ("{ fallbacks: { alpha-5.5: { to: [] } } }", "to: 1 to 8"),
            ("{ fallbacks: { alpha-5.5: { to: [alpha-4o], on: [moderation] } } }", "'moderation' is not one of"),
            ("{ fallbacks: { alpha-5.5: { to: [alpha-4o], on: [] } } }", "on: name at least one"),
            ("{ max_attempts: 1 }", "routing.max_attempts: 2 (retry.attempts)"),
            ("{ max_fallback_secs: 0 }", "routing.max_fallback_secs"),
        ] {
            let e = with(routing).expect_err(routing).0;
            assert!(e.contains(says), "{routing}: {e}");
        }
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
        assert_eq!(c.connections, crate::config::ConnLimits::default());
        assert_eq!((c.uploads.max_upload_bytes, c.uploads.max_spooled_bytes), (25 << 20, 1 << 30));
        let big = Config::parse(&format!("{MINIMAL}limits: {{ max_upload_bytes: 2147483648 }}\n"), &no_env).expect("valid");
        assert_eq!(big.uploads.max_spooled_bytes, 2147483648, "at least one upload of the largest size");
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
            "max_upload_bytes: 10",
            "max_upload_bytes: 1000000, max_spooled_bytes: 999999",
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
