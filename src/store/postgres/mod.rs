//! PostgreSQL: the store a fleet of tollgate nodes shares (issue 24).
//!
//! Here: the connection pool (TLS through rustls when the URL's `sslmode` asks for it; the
//! system's web roots plus an optional CA file), the schema that tollgate creates and migrates
//! itself — versioned migrations under an advisory lock so that nodes starting together
//! migrate once, and a database newer than this binary refused —, and the fleet's money
//! ([`accounts`]), keys, records, rate limits and video tasks. `super::fleet` wires them in.

pub mod accounts;
pub mod cache;
pub mod copy;
pub mod jobs;
pub mod keys;
pub mod rates;
pub mod requests;
pub mod tasks;
pub mod usage;

use crate::config::PgSettings;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Why a PostgreSQL call failed.
#[derive(Debug)]
pub enum PgError {
    /// The URL or TLS settings are unusable.
    Config(String),
    /// No connection could be had (server down, refused, TLS failure).
    Unavailable(String),
    /// A statement failed.
    Query(String),
    /// The database's schema is not one this binary can use.
    Schema(String),
}

impl std::fmt::Display for PgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PgError::Config(m) => write!(f, "store.postgres: {m}"),
            PgError::Unavailable(m) => write!(f, "the database is unreachable: {m}"),
            PgError::Query(m) => write!(f, "database statement failed: {m}"),
            PgError::Schema(m) => write!(f, "database schema: {m}"),
        }
    }
}

impl std::error::Error for PgError {}

/// An error as an operator needs it: PostgreSQL's own message with its SQLSTATE code and
/// detail (`ERROR 40P01: deadlock detected (Process 12 waits for …)`), or the whole chain of
/// causes of a connection failure (`error connecting to server: Connection refused (os error
/// 111)`), never the bare `db error`.
pub fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(db) = err.downcast_ref::<tokio_postgres::error::DbError>() {
            let mut out = format!("{} {}: {}", db.severity(), db.code().code(), db.message());
            if let Some(detail) = db.detail() {
                out.push_str(&format!(" ({detail})"));
            }
            return out;
        }
        source = err.source();
    }
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(err) = source {
        let text = err.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = err.source();
    }
    out
}

/// The servers a connection URL names, as `host:port` (no user, no password).
pub fn servers(url: &str) -> String {
    let Ok(config) = url.parse::<tokio_postgres::Config>() else { return "the configured server".to_string() };
    let ports = config.get_ports();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            match host {
                tokio_postgres::config::Host::Tcp(name) => format!("{name}:{port}"),
                tokio_postgres::config::Host::Unix(path) => format!("{}:{port}", path.display()),
            }
        })
        .collect();
    if hosts.is_empty() {
        "localhost:5432".to_string()
    } else {
        hosts.join(", ")
    }
}

impl From<tokio_postgres::Error> for PgError {
    fn from(e: tokio_postgres::Error) -> Self {
        if e.is_closed() || e.as_db_error().is_none() {
            PgError::Unavailable(describe(&e))
        } else {
            PgError::Query(describe(&e))
        }
    }
}

impl From<deadpool_postgres::PoolError> for PgError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        match e {
            deadpool_postgres::PoolError::Backend(e) => e.into(),
            other => PgError::Unavailable(describe(&other)),
        }
    }
}

/// A pool of connections to the shared database, and how many statements went to it.
#[derive(Clone)]
pub struct Pg {
    pool: deadpool_postgres::Pool,
    statements: Arc<AtomicU64>,
    /// A connection could not be had since the last sync round that reached the database
    /// (`/readyz` is not ready from that moment, not only after missed rounds).
    unreachable: Arc<std::sync::atomic::AtomicBool>,
    /// For connections outside the pool (a `LISTEN`er).
    config: tokio_postgres::Config,
    tls: tokio_postgres_rustls::MakeRustlsConnect,
    /// The runtime that makes (and drives) connections, when not the caller's.
    driver: Option<tokio::runtime::Handle>,
}

/// The schema, one migration per version, applied in order. Never edit one that has shipped:
/// add the next.
const MIGRATIONS: &[(i32, &str)] = &[
    (
        1,
        "CREATE TABLE accounts (
         key_id TEXT PRIMARY KEY,
         balance BIGINT NOT NULL,
         leased BIGINT NOT NULL DEFAULT 0 CHECK (leased >= 0)
     );
     CREATE TABLE leases (
         key_id TEXT NOT NULL REFERENCES accounts (key_id),
         node_id TEXT NOT NULL,
         amount BIGINT NOT NULL CHECK (amount >= 0),
         expires_at TIMESTAMPTZ NOT NULL,
         PRIMARY KEY (key_id, node_id)
     );
     CREATE INDEX leases_expiry ON leases (expires_at);",
    ),
    (
        2,
        "CREATE TABLE keys (
         id TEXT PRIMARY KEY,
         key_hash TEXT NOT NULL UNIQUE,
         record TEXT NOT NULL,
         updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
     );
     CREATE TABLE key_changes (
         seq BIGSERIAL PRIMARY KEY,
         key_id TEXT NOT NULL,
         at TIMESTAMPTZ NOT NULL DEFAULT now()
     );
     CREATE INDEX key_changes_at ON key_changes (at);",
    ),
    (
        3,
        "CREATE TABLE usage_records (
         node_id TEXT NOT NULL,
         seq BIGINT NOT NULL,
         key_id TEXT NOT NULL,
         time_ms BIGINT NOT NULL,
         record TEXT NOT NULL,
         PRIMARY KEY (node_id, seq)
     );
     CREATE INDEX usage_records_by_key ON usage_records (key_id, time_ms);",
    ),
    (
        4,
        "CREATE TABLE video_tasks (
         id TEXT PRIMARY KEY,
         key_id TEXT NOT NULL,
         record TEXT NOT NULL,
         open BOOLEAN NOT NULL,
         claimed_by TEXT,
         claim_until TIMESTAMPTZ,
         updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
     );
     CREATE INDEX video_tasks_open ON video_tasks (updated_at) WHERE open;
     CREATE TABLE idempotency_keys (
         key_id TEXT NOT NULL,
         idem_key TEXT NOT NULL,
         task_id TEXT NOT NULL,
         created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
         PRIMARY KEY (key_id, idem_key)
     );",
    ),
    (
        5,
        "CREATE TABLE rate_windows (
         key_id TEXT NOT NULL,
         window_start BIGINT NOT NULL,
         requests_granted BIGINT NOT NULL DEFAULT 0,
         tokens BIGINT NOT NULL DEFAULT 0,
         PRIMARY KEY (key_id, window_start)
     );",
    ),
    (
        6,
        "CREATE TABLE concurrency_leases (
         key_id TEXT NOT NULL,
         node_id TEXT NOT NULL,
         slots BIGINT NOT NULL CHECK (slots >= 0),
         expires_at TIMESTAMPTZ NOT NULL,
         PRIMARY KEY (key_id, node_id)
     );",
    ),
    (
        7,
        "CREATE TABLE response_owners (
         id TEXT PRIMARY KEY,
         owner TEXT NOT NULL,
         time_ms BIGINT NOT NULL
     );
     CREATE INDEX response_owners_time ON response_owners (time_ms);
     CREATE INDEX usage_records_time ON usage_records (time_ms);",
    ),
    (
        8,
        // Records are the database's main load: one index per record instead of three. A
        // batch's records are known new by the journal's mark (the highest number booked),
        // not by a primary key; records arrive about in time order, so a BRIN index serves
        // the time range of pruning. The marks start at what is booked already.
        "CREATE TABLE journal_marks (
         node_id TEXT PRIMARY KEY,
         booked_through BIGINT NOT NULL
     );
     INSERT INTO journal_marks SELECT node_id, max(seq) FROM usage_records GROUP BY node_id;
     ALTER TABLE usage_records DROP CONSTRAINT usage_records_pkey;
     DROP INDEX usage_records_time;
     CREATE INDEX usage_records_time ON usage_records USING brin (time_ms);",
    ),
    (
        9,
        // Shared accounts (their balances and spend windows are rows of `accounts`, named
        // `acct:<name>` and `win:<owner>:<window>:<start>`); their changes go through
        // `key_changes` as `acct:<name>`.
        // The audit trail of balance moves by an administrator, and the request log.
        "CREATE TABLE key_accounts (
         name TEXT PRIMARY KEY,
         record TEXT NOT NULL
     );
     CREATE TABLE audit_log (
         seq BIGSERIAL PRIMARY KEY,
         time_ms BIGINT NOT NULL,
         record TEXT NOT NULL
     );
     CREATE INDEX audit_log_time ON audit_log (time_ms);
     CREATE TABLE request_log (
         seq BIGSERIAL PRIMARY KEY,
         node_id TEXT NOT NULL,
         node_seq BIGINT NOT NULL,
         id TEXT NOT NULL,
         time_ms BIGINT NOT NULL,
         key_id TEXT,
         record TEXT NOT NULL,
         UNIQUE (node_id, node_seq)
     );
     CREATE INDEX request_log_time ON request_log (time_ms, seq);
     CREATE INDEX request_log_key ON request_log (key_id, time_ms);
     CREATE INDEX request_log_id ON request_log (id);",
    ),
    (
        10,
        // Usage records and request-log entries in the binary form a node already keeps them in
        // (`crate::store::usage_codec`, `LogEntry::encode`): their JSON was most of what a node
        // spent on shipping them. Rows written before keep their JSON in `record`.
        "ALTER TABLE usage_records ADD COLUMN bin BYTEA, ALTER COLUMN record SET DEFAULT '';
     ALTER TABLE request_log ADD COLUMN bin BYTEA, ALTER COLUMN record SET DEFAULT '';",
    ),
    (
        11,
        // A key's own tasks, listed newest first (`GET /v1/videos`).
        "CREATE INDEX video_tasks_key ON video_tasks (key_id);",
    ),
    (
        12,
        // Long-lived jobs other than video tasks (batches), claimed like video tasks.
        "CREATE TABLE jobs (
         id TEXT PRIMARY KEY,
         kind TEXT NOT NULL,
         key_id TEXT NOT NULL,
         created_at BIGINT NOT NULL,
         record TEXT NOT NULL,
         open BOOLEAN NOT NULL,
         claimed_by TEXT,
         claim_until TIMESTAMPTZ,
         updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
     );
     CREATE INDEX jobs_open ON jobs (kind, updated_at) WHERE open;
     CREATE INDEX jobs_key ON jobs (kind, key_id, created_at);",
    ),
    (
        13,
        // What was done once across the fleet (a plan's grant, a period's close): written in
        // the transaction of the balance change it marks.
        "CREATE TABLE marks (
         id TEXT PRIMARY KEY,
         value BIGINT NOT NULL,
         time_ms BIGINT NOT NULL
     );",
    ),
    (
        14,
        // The response cache: answers by cache key, whose and of which model, when each
        // expires and was last used (the least recently used go first past the bound).
        "CREATE TABLE response_cache (
         key TEXT PRIMARY KEY,
         key_id TEXT NOT NULL,
         model TEXT NOT NULL,
         expires_ms BIGINT NOT NULL,
         used_ms BIGINT NOT NULL,
         bytes BIGINT NOT NULL,
         value BYTEA NOT NULL
     );
     CREATE INDEX response_cache_used ON response_cache (used_ms);
     CREATE INDEX response_cache_expires ON response_cache (expires_ms);",
    ),
];

/// The advisory lock that serialises migrations across nodes.
const MIGRATION_LOCK: i64 = 0x7011_6a7e_0001;

fn tls(settings: &PgSettings) -> Result<tokio_postgres_rustls::MakeRustlsConnect, PgError> {
    let mut roots = rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
    if let Some(pem) = &settings.ca_pem {
        for der in crate::base::tls::pem_certificates(pem, "ca_file").map_err(PgError::Config)? {
            roots.add(rustls::pki_types::CertificateDer::from(der)).map_err(|e| PgError::Config(format!("ca_file: {e}")))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| PgError::Config(format!("tls: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_postgres_rustls::MakeRustlsConnect::new(config))
}

impl Pg {
    /// A pool for `settings` (no connection is made until one is needed).
    pub fn new(settings: &PgSettings) -> Result<Pg, PgError> {
        let config: tokio_postgres::Config = settings.url.parse().map_err(|e| PgError::Config(format!("url: {e}")))?;
        let tls = tls(settings)?;
        let manager = deadpool_postgres::Manager::from_config(
            config.clone(),
            tls.clone(),
            deadpool_postgres::ManagerConfig { recycling_method: deadpool_postgres::RecyclingMethod::Fast },
        );
        let pool = deadpool_postgres::Pool::builder(manager)
            .max_size(settings.pool_size.max(1))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .create_timeout(Some(std::time::Duration::from_secs(5)))
            .wait_timeout(Some(std::time::Duration::from_secs(5)))
            .build()
            .map_err(|e| PgError::Config(e.to_string()))?;
        Ok(Pg { pool, statements: Arc::new(AtomicU64::new(0)), unreachable: Arc::default(), config, tls, driver: None })
    }

    /// Make connections on `runtime`: a connection's task lives on the runtime that made it,
    /// so the pool's connections are made on one that lives as long as the process.
    pub fn on(mut self, runtime: tokio::runtime::Handle) -> Pg {
        self.driver = Some(runtime);
        self
    }

    /// A connection from the pool.
    pub async fn client(&self) -> Result<deadpool_postgres::Object, PgError> {
        let got = match &self.driver {
            Some(runtime) => {
                let pool = self.pool.clone();
                runtime.spawn(async move { pool.get().await }).await.map_err(|e| PgError::Unavailable(format!("store runtime: {e}")))?
            }
            None => self.pool.get().await,
        };
        got.map_err(|e| {
            // A connection that could not be made (not a busy pool's wait) means the database
            // is out of reach.
            use deadpool_postgres::{PoolError, TimeoutType};
            if matches!(e, PoolError::Backend(_) | PoolError::Timeout(TimeoutType::Create | TimeoutType::Recycle)) {
                self.unreachable.store(true, Ordering::Relaxed);
            }
            e.into()
        })
    }

    /// Whether a connection failed since the database was last known reached.
    pub fn unreachable(&self) -> bool {
        self.unreachable.load(Ordering::Relaxed)
    }

    /// A sync round reached the database.
    pub fn reached(&self) {
        self.unreachable.store(false, Ordering::Relaxed);
    }

    /// A connection of its own that `LISTEN`s on `channel`: the notifications arrive on the
    /// receiver, which ends when the connection does. Keep the client: dropping it closes the
    /// connection.
    pub async fn listen(
        &self,
        channel: &str,
    ) -> Result<(tokio_postgres::Client, tokio::sync::mpsc::UnboundedReceiver<tokio_postgres::Notification>), PgError> {
        let (client, mut connection) = self.config.connect(self.tls.clone()).await?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                    Some(Ok(tokio_postgres::AsyncMessage::Notification(n))) => {
                        if tx.send(n).is_err() {
                            return;
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        log::warn!("store: listening connection ended: {e}");
                        return;
                    }
                    None => return,
                }
            }
        });
        client.batch_execute(&format!("LISTEN {channel}")).await?;
        self.count(1);
        Ok((client, rx))
    }

    /// Count `n` statements sent (for `/metrics`: statements per relayed request).
    pub fn count(&self, n: u64) {
        self.statements.fetch_add(n, Ordering::Relaxed);
    }

    /// Statements sent since start.
    pub fn statements(&self) -> u64 {
        self.statements.load(Ordering::Relaxed)
    }

    /// The schema version the database is at (0: none yet); refused when newer than this
    /// binary knows.
    pub async fn version(&self) -> Result<i32, PgError> {
        let client = self.client().await?;
        let exists: bool = client.query_one("SELECT to_regclass('tollgate_schema') IS NOT NULL", &[]).await?.get(0);
        let current: i32 =
            if exists { client.query_one("SELECT COALESCE(MAX(version), 0) FROM tollgate_schema", &[]).await?.get(0) } else { 0 };
        let newest = MIGRATIONS.last().map_or(0, |m| m.0);
        if current > newest {
            return Err(PgError::Schema(format!(
                "the database is at version {current}, this tollgate knows up to {newest}: upgrade tollgate on this node"
            )));
        }
        Ok(current)
    }

    /// Bring the schema to this binary's version; returns it. A database at a later version
    /// (a newer tollgate migrated it) is refused rather than written with old assumptions.
    pub async fn migrate(&self) -> Result<i32, PgError> {
        self.migrate_to(MIGRATIONS.last().map_or(0, |m| m.0)).await
    }

    /// Bring the schema to `target` (at most this binary's version): what `migrate` does, and
    /// how a test prepares a database as an older tollgate left it.
    pub async fn migrate_to(&self, target: i32) -> Result<i32, PgError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).await?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS tollgate_schema (version INTEGER PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())",
        )
        .await?;
        let current: i32 = tx.query_one("SELECT COALESCE(MAX(version), 0) FROM tollgate_schema", &[]).await?.get(0);
        let newest = MIGRATIONS.last().map_or(0, |m| m.0);
        if current > newest {
            return Err(PgError::Schema(format!(
                "the database is at version {current}, this tollgate knows up to {newest}: upgrade tollgate on this node"
            )));
        }
        for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > current && *v <= target) {
            tx.batch_execute(sql).await.map_err(|e| PgError::Schema(format!("migration {version}: {e}")))?;
            tx.execute("INSERT INTO tollgate_schema (version) VALUES ($1)", &[version]).await?;
            log::info!("database schema migrated to version {version}");
        }
        tx.commit().await?;
        self.count(4);
        Ok(target.min(newest).max(current))
    }
}
