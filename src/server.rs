//! Wiring: configuration → database → key index → catalog → Pingora server and services.

use crate::access::auth::{seed_key_id, KeyIndex};
use crate::access::limits::Limits;
use crate::admin::api::AdminApi;
use crate::base::clock::now_unix;
use crate::base::money::usd_to_nanos;
use crate::billing::ledger::{Ledger, PriceBook};
use crate::config::Config;
use crate::edge::gateway::Gateway;
use crate::observe::metrics::Metrics;
use crate::store::objects::ObjectStore;
use crate::store::sled::{SledDb, SledStore};
use crate::store::Store;
use crate::upstream::Routing;
use crate::upstream::{Catalog, DnsRefresh};
use crate::video::{VideoPoller, VideoService};
use arc_swap::ArcSwap;
use async_trait::async_trait;
use pingora_core::server::configuration::{Opt, ServerConf};
use pingora_core::server::Server;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::background_service;
use pingora_core::services::background::BackgroundService;
use std::sync::Arc;
use std::time::Duration;

/// Pingora's own settings from the `pingora:` section (threads, pid_file, upgrade_sock, …).
pub fn server_conf(config: &Config) -> Result<ServerConf, String> {
    let mut conf = match &config.pingora {
        Some(v) => serde_yaml::from_value::<ServerConf>(v.clone()).map_err(|e| format!("pingora: {e}"))?,
        None => ServerConf::default(),
    };
    if config.pingora.as_ref().and_then(|v| v.get("threads")).is_none() {
        conf.threads = 2;
    }
    Ok(conf)
}

/// Tell systemd (Type=notify, NotifyAccess=all) that this process is ready and is now the main
/// one; after an upgrade that makes systemd follow the new process. No-op outside systemd.
fn notify_systemd() {
    let Some(socket) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let message = format!("READY=1\nMAINPID={}\n", std::process::id());
    let sock = match std::os::unix::net::UnixDatagram::unbound() {
        Ok(s) => s,
        Err(e) => {
            log::warn!("systemd notify: {e}");
            return;
        }
    };
    let bytes = socket.as_encoded_bytes();
    let result = if let Some(abstract_name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(abstract_name).and_then(|addr| sock.send_to_addr(message.as_bytes(), &addr))
    } else {
        sock.send_to(message.as_bytes(), &socket)
    };
    if let Err(e) = result {
        log::warn!("systemd notify: {e}");
    }
}

/// The reloadable routing state for a configuration (resolves upstream hosts: blocking); an
/// error when a guardrail cannot be built.
fn routing_for(config: &Config, health: &crate::upstream::health::HealthBook) -> Result<Routing, String> {
    let catalog = Arc::new(Catalog::new(config, now_unix(), health));
    catalog.resolve_all_blocking();
    let services = crate::upstream::cloud_guard::services(config, &catalog)?;
    let guardrails = Arc::new(crate::checks::guard::Guardrails::new(config, &services).map_err(|e| e.to_string())?);
    Ok(Routing {
        catalog,
        prices: Arc::new(PriceBook::new(&config.prices)),
        default_output_tokens: config.default_output_tokens,
        min_output_tokens: config.min_output_tokens,
        max_event_bytes: config.max_event_bytes,
        forward_headers: config.forward_headers.clone(),
        forward_response_headers: config.forward_response_headers.clone(),
        trusted_proxies: config.trusted_proxies.clone(),
        calendar: config.calendar.clone(),
        key_page: config.console.key_page,
        retry: config.retry.clone(),
        media_allowance: config.media_allowance,
        guardrails,
        signup: config.identity.signup.clone().map(Arc::new),
        fallbacks: config.fallbacks.clone(),
    })
}

/// On SIGHUP: re-read the configuration file; if it is valid, swap in its providers, models,
/// groups, prices and keys without dropping a request (requests keep the snapshot they started
/// with). An invalid file is refused with its message and the running configuration stays.
/// Listeners, data_dir, admin, video, storage and pingora settings need an upgrade (`-u`).
struct Reload {
    path: String,
    running: Config,
    routing: Arc<ArcSwap<Routing>>,
    keys: Arc<KeyIndex>,
    ledger: Arc<Ledger>,
    /// The HTTPS listener's certificate, re-read on every reload.
    certificate: Option<Arc<crate::base::tls::ReloadableCert>>,
    /// Provider health, kept for the providers that remain.
    health: Arc<crate::upstream::health::HealthBook>,
    /// What the last load held (keys, accounts, prices, providers): a reload says what changed.
    last: tokio::sync::Mutex<crate::config::changes::Summary>,
    /// `tollgate_config_reloads_total{outcome}`: a reload's effect can be waited for.
    metrics: Arc<Metrics>,
    /// The price feed, whose table each reload's prices are merged with.
    feed: Option<Arc<crate::selling::feed::PriceFeed>>,
}

/// What a reload did: what changed, the sections that need an upgrade, its warnings.
struct Reloaded {
    changed: Vec<String>,
    needs_upgrade: Vec<&'static str>,
    warnings: Vec<String>,
}

/// Apply the configuration file's accounts and keys to the store: new ones get their opening
/// balance (the file's balance applies only then), changed entries are written (see
/// `auth::seed_changes`).
async fn seed(keys: &KeyIndex, ledger: &Ledger, config: &Config) -> Result<(), crate::store::StoreError> {
    for account in &config.accounts {
        ledger.open_account(&crate::policy::budget::account_purse(&account.name), usd_to_nanos(account.balance)).await?;
    }
    keys.seed_accounts(&config.accounts).await?;
    keys.set_tag_limits(config.tag_limits.clone());
    keys.set_group_multipliers(&config.groups);
    keys.set_plans(config.plans.clone());
    for seed in &config.keys {
        ledger.open_account(&seed_key_id(&seed.key), usd_to_nanos(seed.balance)).await?;
    }
    keys.seed(&config.keys).await
}

impl Reload {
    async fn reload(&self) -> Result<Reloaded, String> {
        let (path, health, feed, handle) = (self.path.clone(), self.health.clone(), self.feed.clone(), tokio::runtime::Handle::current());
        let (config, routing) = tokio::task::spawn_blocking(move || {
            let mut config = Config::load(std::path::Path::new(&path)).map_err(|e| {
                let e = e.to_string();
                // A running process keeps the environment it started with.
                match e.contains("is not set") {
                    true => format!("{e} (in this process's environment: a variable set since it started is read by an upgrade (-u) or a restart, not by a reload)"),
                    false => e,
                }
            })?;
            if let Some(feed) = &feed {
                handle.block_on(crate::repricing::reload(&mut config, feed))?;
            }
            let routing = routing_for(&config, &health)?;
            Ok::<_, String>((config, routing))
        })
        .await
        .map_err(|e| format!("reload task: {e}"))??;
        if let Some(cert) = &self.certificate {
            cert.reload()?;
        }
        seed(&self.keys, &self.ledger, &config).await.map_err(|e| e.to_string())?;
        for warning in config.expired_keys(crate::base::clock::now_unix()) {
            log::warn!("{warning}");
        }
        let summary = crate::config::changes::Summary::of(&config);
        let (changed, warnings) = self.last.lock().await.changes(&summary);
        *self.last.lock().await = summary;
        crate::observe::logging::set_json(config.log_format == crate::config::LogFormat::Json);
        let names: Vec<&str> = config.providers.iter().map(|p| p.name.as_str()).collect();
        self.health.retain(&names);
        self.routing.store(Arc::new(routing));
        let old = &self.running;
        let mut needs_upgrade = Vec::new();
        if config.listen != old.listen || config.tls.as_ref().map(|t| t.listen) != old.tls.as_ref().map(|t| t.listen) {
            needs_upgrade.push("listen");
        }
        if config.data_dir != old.data_dir {
            needs_upgrade.push("data_dir");
        }
        if config.fleet.as_ref().map(|f| (&f.postgres.url, &f.node_id)) != old.fleet.as_ref().map(|f| (&f.postgres.url, &f.node_id)) {
            needs_upgrade.push("store");
        }
        if config.otlp != old.otlp {
            needs_upgrade.push("telemetry");
        }
        if config.max_body_bytes != old.max_body_bytes {
            needs_upgrade.push("max_body_bytes");
        }
        if config.max_buffered_body_bytes != old.max_buffered_body_bytes {
            needs_upgrade.push("max_buffered_body_bytes");
        }
        if config.body_read_timeout != old.body_read_timeout {
            needs_upgrade.push("body_read_timeout_secs");
        }
        if config.connections != old.connections {
            needs_upgrade.push("limits");
        }
        if format!("{:?}", config.admin) != format!("{:?}", old.admin) {
            needs_upgrade.push("admin");
        }
        if format!("{:?}", config.video) != format!("{:?}", old.video) {
            needs_upgrade.push("video");
        }
        if format!("{:?}", config.storage) != format!("{:?}", old.storage) {
            needs_upgrade.push("storage");
        }
        if config.mcp != old.mcp {
            needs_upgrade.push("mcp");
        }
        if config.notifications != old.notifications {
            needs_upgrade.push("notifications");
        }
        if config.stripe != old.stripe {
            needs_upgrade.push("payments");
        }
        if config.price_feed != old.price_feed {
            needs_upgrade.push("price_feed");
        }
        if config.identity.claude_code != old.identity.claude_code {
            needs_upgrade.push("identity.claude_code");
        }
        Ok(Reloaded { changed, needs_upgrade, warnings })
    }
}

#[async_trait]
impl BackgroundService for Reload {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let mut hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(s) => s,
            Err(e) => {
                log::error!("config reload: cannot listen for SIGHUP: {e}");
                return;
            }
        };
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                got = hangup.recv() => if got.is_none() { return },
            }
            let done = self.reload().await;
            let outcome = if done.is_ok() { "applied" } else { "refused" };
            self.metrics.counter("tollgate_config_reloads_total", &[("outcome", outcome)]).add(1);
            match done {
                Ok(done) => {
                    let what = match done.changed.is_empty() {
                        true => "no change to keys, accounts, prices or providers".to_string(),
                        false => done.changed.join("; "),
                    };
                    match done.needs_upgrade.is_empty() {
                        true => log::info!("configuration reloaded from {}: {what}", self.path),
                        false => log::warn!(
                            "configuration reloaded from {}: {what}; changes to {} take effect only after an upgrade (-u) or restart",
                            self.path,
                            done.needs_upgrade.join(", ")
                        ),
                    }
                    for warning in done.warnings {
                        log::warn!("configuration reload: {warning}");
                    }
                }
                Err(e) => log::error!("configuration reload refused, the running configuration stays: {e}"),
            }
        }
    }
}

/// A key in the file is stored as an unsalted SHA-256 hash: a short, hand-picked one is cheap to
/// search for if the database leaks.
fn warn_short_keys(config: &Config) {
    for (i, k) in config.keys.iter().enumerate() {
        if k.key.chars().count() < crate::config::keys::MIN_STRONG_KEY_LEN {
            log::warn!(
                "keys[{i}] ({}): shorter than {} characters; its stored hash is cheap to search if the database leaks (admin-created keys are long and random)",
                k.name,
                crate::config::keys::MIN_STRONG_KEY_LEN
            );
        }
    }
}

/// The start-up line: version, file, listeners, store, what is served.
/// The listeners a configuration opens: (its key, its address, how it is reached).
fn listeners(config: &Config) -> Vec<(&'static str, std::net::SocketAddr, &'static str)> {
    let mut out = Vec::new();
    if let Some(l) = config.listen {
        out.push(("listen", l, "http://"));
    }
    if let Some(t) = &config.tls {
        out.push(("tls.listen", t.listen, "https://"));
    }
    if let Some(a) = &config.admin {
        out.push(("admin.listen", a.listen, "admin http://"));
    }
    if let Some(m) = &config.metrics {
        out.push(("metrics.listen", m.listen, "metrics http://"));
    }
    if let Some(c) = &config.console_listen {
        out.push(("console.listen", c.listen, if c.tls.is_some() { "console https://" } else { "console http://" }));
    }
    out
}

fn banner(config: &Config, path: &str) -> String {
    let all = listeners(config);
    let public: Vec<String> = all
        .iter()
        .filter(|(key, ..)| *key != "admin.listen" && *key != "metrics.listen")
        .map(|(_, addr, how)| format!("{how}{addr}"))
        .collect();
    let admin =
        all.iter().find(|(key, ..)| *key == "admin.listen").map_or("no admin API".to_string(), |(_, addr, how)| format!("{how}{addr}"));
    let store = match &config.fleet {
        Some(f) => format!("store postgres (node '{}', journal in {})", f.node_id, config.data_dir.display()),
        None => format!("store sled in {}", config.data_dir.display()),
    };
    let models: std::collections::BTreeSet<&str> = config.providers.iter().flat_map(|p| p.models.iter().map(String::as_str)).collect();
    let metrics = all.iter().find(|(key, ..)| *key == "metrics.listen").map_or(String::new(), |(_, addr, how)| format!(", {how}{addr}"));
    format!(
        "tollgate {} with {path}: listening on {}, {admin}{metrics}; {store}; {} provider(s) serving {} model(s){}",
        crate::VERSION,
        public.join(" and "),
        config.providers.len(),
        models.len(),
        if config.video.is_some() { " and video" } else { "" },
    )
}

/// Refuse to start when a listener's address is taken (by another tollgate, or anything else).
///
/// The address is only bound, never listened on: a listening probe would accept a client's
/// connection for the instant between the check and Pingora's own listen, and a client that
/// waits for the port to open (a test, a health check, systemd's socket probe) would then be
/// refused by the closed probe.
fn check_ports_free(config: &Config) -> Result<(), String> {
    for (key, addr, _) in listeners(config) {
        if let Err(e) = bind_only(addr) {
            let why = match e.kind() {
                std::io::ErrorKind::AddrInUse => {
                    "address already in use (is another tollgate, or another program, listening there?)".to_string()
                }
                _ => e.to_string(),
            };
            return Err(format!("{key} {addr}: {why}"));
        }
    }
    Ok(())
}

/// A socket bound to `addr` and not listening (see `check_ports_free`).
fn bind_only(addr: std::net::SocketAddr) -> std::io::Result<socket2::Socket> {
    let socket = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::STREAM, None)?;
    // As Pingora binds: a port left in TIME_WAIT is free, one in LISTEN is not.
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    Ok(socket)
}

/// Serve a local service (see `local`: the admin API, the metrics listener) on `addr`, under
/// the same connection bounds as the public listener.
fn add_local<T: crate::edge::local::Answer>(
    server: &mut Server,
    config: &Config,
    metrics: &Arc<Metrics>,
    answer: T,
    name: &str,
    addr: std::net::SocketAddr,
) {
    let mut service =
        crate::edge::listener::service(&server.configuration, crate::edge::local::Local(answer), name, &config.connections, metrics, false);
    service.add_tcp(&addr.to_string());
    server.add_service(service);
}

/// Load everything and run until told to stop. Returns only on a start-up error.
pub fn run(mut opt: Opt) -> Result<(), String> {
    let path = opt.conf.take().unwrap_or_else(|| "conf/tollgate.yaml".to_string());
    let mut config = Config::load(std::path::Path::new(&path)).map_err(|e| e.to_string())?;
    crate::observe::logging::set_json(config.log_format == crate::config::LogFormat::Json);
    let conf = server_conf(&config)?;
    // The certificate is part of what `-t` checks (a reload must not start a process that
    // cannot serve TLS).
    let certificate = match &config.tls {
        Some(t) => Some(Arc::new(crate::base::tls::ReloadableCert::load(&t.cert, &t.key)?)),
        None => None,
    };
    if let Some((cert, key)) = config.console_listen.as_ref().and_then(|c| c.tls.as_ref()) {
        crate::base::tls::ReloadableCert::load(cert, key).map_err(|e| format!("console.tls: {e}"))?;
    }
    if config.console_listen.is_some() && config.admin.is_none() {
        return Err("console.listen: the console needs the admin section (admin.listen), whose token is the break-glass sign-in".into());
    }
    if opt.test {
        return check_only(&config, &path);
    }
    // Everything this process creates (database files, pid file, sockets) is its user's alone.
    // SAFETY: umask only sets the process's file-creation mask; it cannot fail. SIGHUP is
    // ignored until the reload service listens for it (a background service, started beside
    // the listeners): a reload asked for in between — `systemctl reload` right after a start —
    // is then lost instead of ending the process, SIGHUP's default.
    #[allow(unsafe_code)]
    unsafe {
        libc::umask(0o077);
        libc::signal(libc::SIGHUP, libc::SIG_IGN);
    }
    warn_short_keys(&config);
    for warning in config.expired_keys(crate::base::clock::now_unix()) {
        log::warn!("{warning}");
    }
    if !opt.upgrade {
        // A taken port is one fatal line, like every other start-up error (Pingora would retry
        // it every second for ever). An upgrade takes the running process's sockets over.
        check_ports_free(&config)?;
    }
    let banner = banner(&config, &path);

    // Listening sockets first: in an upgrade (-u) this waits for the old process to pass them,
    // then the database, which the old process releases when it stops accepting.
    let upgrading = opt.upgrade;
    let body_limits = crate::edge::body::BodyLimits {
        max_bytes: config.max_body_bytes,
        read_timeout: config.body_read_timeout,
        budget: crate::edge::body::BodyBudget::new(config.max_buffered_body_bytes),
    };
    let listen = config.listen;
    let connections = config.connections.clone();
    let tls_listen = config.tls.as_ref().map(|t| t.listen);
    if upgrading {
        // Pingora's own wait is logged at debug (once a second); this says once what it is.
        log::info!("upgrade: waiting for the running process to pass its listening sockets (send it SIGQUIT)");
    }
    let mut server = Server::new_with_opt_and_conf(opt, conf);
    server.bootstrap();
    let (local, fleet, store) = open_store(&config, upgrading)?;
    let handover_socket = config.data_dir.join(crate::handover::SOCKET);
    let start_up = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| format!("start-up runtime: {e}"))?;
    let ledger = Arc::new(Ledger::new(store.money(), config.commit.sync));
    let seeding = async {
        let keys = KeyIndex::new(store.keys());
        seed(&keys, &ledger, &config).await.map_err(|e| e.to_string())?;
        let enabled = keys.all_keys().await.map_err(|e| e.to_string())?.iter().filter(|k| k.enabled).count();
        Ok::<_, String>((keys, enabled))
    };
    // Start-up work runs where the store's connections live (a fleet's own runtime).
    let (keys, enabled_keys) = match &fleet {
        Some(node) => node.fleet.block_on(seeding),
        None => start_up.block_on(seeding),
    }?;
    let keys = Arc::new(keys);
    local.flush().map_err(|e| e.to_string())?;
    if let Some(node) = &fleet {
        crate::store::fleet::start(node);
    }
    let metrics = Arc::new(Metrics::default());
    let tracer = match &config.otlp {
        Some(settings) => Some(Arc::new(crate::observe::telemetry::Tracer::start(settings, &metrics)?)),
        None => None,
    };
    let health = Arc::new(crate::upstream::health::HealthBook::new(metrics.clone()));
    let feed = crate::repricing::start_on(&mut config, (&start_up, fleet.as_deref()), ledger.clone(), metrics.clone())?;
    let routing = Arc::new(ArcSwap::from_pointee(routing_for(&config, &health)?));
    crate::repricing::install(&mut server, feed.as_ref(), &routing);
    let objects = config.storage.as_ref().map(|s3| Arc::new(ObjectStore::new(s3)));
    let checks = Arc::new(crate::checks::Checks::default());
    let books = crate::charge::Books::new(ledger.clone());
    let video = match &config.video {
        Some(v) => Some(Arc::new(VideoService::new(v.clone(), store.tasks(), books.clone(), checks.clone(), objects.clone())?)),
        None => None,
    };
    let files = Arc::new(
        crate::files::FileService::new(&config.data_dir, objects, config.fleet.is_some()).with_quota(config.uploads.file_quota_bytes),
    );
    let batches = Arc::new(
        crate::batch::BatchService::new(
            store.jobs(),
            books,
            checks.clone(),
            files.clone(),
            routing.clone(),
            Duration::from_secs(config.batch_poll_secs),
        )
        .with_metrics(metrics.clone()),
    );
    server.add_service(background_service("batch poller", crate::batch::BatchPoller { service: batches.clone() }));

    let identity = identity_service(&mut server, &config)?;
    let mcp = crate::mcp::hub::Hub::new(&config.mcp)?.map(Arc::new);
    let planned = planned(&mut server, &config, (&keys, &ledger, &metrics), &store, (&routing, feed))?;
    let shared =
        Shared { local, store, keys, ledger, routing, metrics, health, video, tracer, identity, checks, mcp, files, batches, planned };
    add_handover(&mut server, handover_socket, &shared);
    if let Some(svc) = &shared.video {
        recover_video(svc, &start_up, upgrading)?;
        server.add_service(background_service("video poller", VideoPoller { service: svc.clone() }));
    }
    add_operator_listeners(&mut server, &config, &shared)?;
    let closing = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let gateway = gateway(&server, &config, &shared, fleet.as_deref(), closing.clone(), body_limits);
    add_background(&mut server, config, path, &shared, certificate.clone(), closing);
    let mut proxy = crate::edge::listener::service(&server.configuration, gateway, "tollgate", &connections, &shared.metrics, true);
    add_public_listeners(&mut proxy, listen, tls_listen.zip(certificate))?;
    server.add_service(proxy);
    server.add_service(background_service("dns refresh", DnsRefresh { routing: shared.routing.clone(), every: Duration::from_secs(60) }));
    let traces = shared.tracer.as_ref().map_or(String::new(), |t| format!("; {}", t.describe()));
    log::info!("{banner}; {enabled_keys} enabled key(s){traces}");
    notify_systemd();
    server.run_forever();
}

/// Sign-in with the identity provider (`identity.oidc`), its signing keys refreshed in the
/// background.
fn identity_service(server: &mut Server, config: &Config) -> Result<Option<Arc<crate::identity::Identity>>, String> {
    let Some(oidc) = &config.identity.oidc else { return Ok(None) };
    let identity = Arc::new(crate::identity::Identity::new(oidc.clone()).map_err(|e| e.to_string())?);
    server.add_service(background_service("identity keys", crate::identity::KeyRefresh { identity: identity.clone() }));
    Ok(Some(identity))
}

/// Alerts decided and sent in the background (`notifications:`), when any is configured.
fn notifier(
    server: &mut Server,
    config: &Config,
    (keys, ledger, plans): (&Arc<KeyIndex>, &Arc<Ledger>, &Arc<crate::charge::plans::PlanClock>),
    store: &Arc<dyn crate::store::Store>,
    routing: &Arc<ArcSwap<Routing>>,
) -> Option<Arc<crate::notify::Notifier>> {
    if config.notifications.is_empty() {
        return None;
    }
    let routing = routing.clone();
    let notifier = Arc::new(crate::notify::Notifier::new(
        config.notifications.clone(),
        (keys.clone(), ledger.clone(), plans.clone()),
        store.jobs(),
        Box::new(move || routing.load().calendar.clone()),
    ));
    server.add_service(background_service("notifications", crate::notify::NotifyService(notifier.clone())));
    Some(notifier)
}

/// Plans' periods granted and closed in the background, on the calendar of the routing in force.
fn plan_clock(
    server: &mut Server,
    keys: &Arc<KeyIndex>,
    ledger: &Arc<Ledger>,
    routing: &Arc<ArcSwap<Routing>>,
) -> Arc<crate::charge::plans::PlanClock> {
    let routing = routing.clone();
    let clock =
        Arc::new(crate::charge::plans::PlanClock::new(keys.clone(), ledger.clone(), Box::new(move || routing.load().calendar.clone())));
    server.add_service(background_service("plan clock", crate::charge::plans::PlanService(clock.clone())));
    clock
}

/// What the services of one process share, made once at start.
struct Shared {
    local: SledDb,
    store: Arc<dyn Store>,
    keys: Arc<KeyIndex>,
    ledger: Arc<Ledger>,
    routing: Arc<ArcSwap<Routing>>,
    metrics: Arc<Metrics>,
    health: Arc<crate::upstream::health::HealthBook>,
    video: Option<Arc<VideoService>>,
    tracer: Option<Arc<crate::observe::telemetry::Tracer>>,
    identity: Option<Arc<crate::identity::Identity>>,
    /// The checks every kind of call goes through (one list for the gateway and its services).
    checks: Arc<crate::checks::Checks>,
    /// The MCP servers behind `/mcp` (`mcp:`), shared by the gateway and the console.
    mcp: Option<Arc<crate::mcp::hub::Hub>>,
    /// Keys' files and batches, shared by the gateway and the console.
    files: Arc<crate::files::FileService>,
    batches: Arc<crate::batch::BatchService>,
    /// Plans' periods and alerts.
    planned: Planned,
}

/// Plans' periods, granted and closed (`plans:`), and alerts (`notifications:`, when any
/// receiver is configured), each a background service.
struct Planned {
    plans: Arc<crate::charge::plans::PlanClock>,
    notifier: Option<Arc<crate::notify::Notifier>>,
    /// Redemption codes, card top-ups, prices from a feed.
    selling: Arc<crate::selling::Selling>,
    /// Claude Code's gateway sign-in (`identity.claude_code`).
    signin: Option<Arc<crate::signin::Signin>>,
    /// The response cache (`cache:`) and its sweep.
    cache: Option<Arc<crate::cache::Cache>>,
}

fn planned(
    server: &mut Server,
    config: &Config,
    (keys, ledger, metrics): (&Arc<KeyIndex>, &Arc<Ledger>, &Arc<Metrics>),
    store: &Arc<dyn crate::store::Store>,
    (routing, feed): (&Arc<ArcSwap<Routing>>, Option<Arc<crate::selling::feed::PriceFeed>>),
) -> Result<Planned, String> {
    let plans = plan_clock(server, keys, ledger, routing);
    let notifier = notifier(server, config, (keys, ledger, &plans), store, routing);
    let codes = crate::selling::codes::Codes::new(store.jobs(), ledger.clone(), keys.clone(), plans.clone());
    let stripe = config.stripe.clone().map(|cfg| crate::selling::stripe::Stripe::new(cfg, ledger.clone(), store.jobs()));
    let signup = crate::selling::signup::Signup::new(keys.clone(), ledger.clone(), plans.clone());
    let statements = crate::selling::statement::Statements::new(ledger.clone(), keys.clone(), config.usage_retention_days);
    let selling = Arc::new(crate::selling::Selling { codes, stripe, signup, feed, statements });
    let signin = config.identity.claude_code.clone().and_then(|cfg| {
        crate::signin::Signin::new(cfg, store.jobs(), ledger.money().clone())
            .map(Arc::new)
            .map_err(|e| log::error!("identity.claude_code is off: {e}"))
            .ok()
    });
    let cache = crate::cache::Cache::open(config.cache.as_ref(), store.as_ref(), metrics)?;
    if let Some(cache) = &cache {
        server.add_service(background_service("cache sweep", crate::cache::Sweeper(cache.clone())));
    }
    Ok(Planned { plans, notifier, selling, signin, cache })
}

/// Upgrades: bookings and task writes go to the new process once it has the database, and
/// this process serves the old one's hand-over.
fn add_handover(server: &mut Server, socket: std::path::PathBuf, s: &Shared) {
    let client = Arc::new(crate::handover::Client { socket: socket.clone() });
    s.ledger.set_handover(client.clone());
    if let Some(svc) = &s.video {
        svc.set_handover(client);
    }
    let handover = crate::handover::HandoverServer { socket, ledger: s.ledger.clone(), video: s.video.clone() };
    server.add_service(background_service("handover", crate::handover::HandoverService(Arc::new(handover))));
}

/// The operator's listeners: `/metrics` on its own (`metrics:`), the admin API and console
/// (`admin:`).
fn add_operator_listeners(server: &mut Server, config: &Config, s: &Shared) -> Result<(), String> {
    let scrape = Arc::new(crate::admin::scrape::Scrape {
        metrics: s.metrics.clone(),
        keys: s.keys.clone(),
        local: s.local.clone(),
        store: s.store.clone(),
        health: s.health.clone(),
        video: s.video.clone(),
        cache: s.planned.cache.clone(),
    });
    if let Some(m) = &config.metrics {
        let listener = crate::admin::scrape::MetricsListener { scrape: scrape.clone(), token: m.token.clone(), allow: m.allow.clone() };
        add_local(server, config, &s.metrics, listener, "tollgate metrics", m.listen);
    }
    if let Some(admin) = &config.admin {
        let api = AdminApi {
            token: admin_token(admin, &config.data_dir)?,
            hosts: admin.hosts.clone(),
            local: s.local.clone(),
            store: s.store.clone(),
            keys: s.keys.clone(),
            ledger: s.ledger.clone(),
            routing: s.routing.clone(),
            metrics: s.metrics.clone(),
            health: s.health.clone(),
            video: s.video.clone(),
            mcp: s.mcp.clone(),
            files: Some(s.files.clone()),
            batches: Some(s.batches.clone()),
            request_log_days: config.console.request_log_days,
            request_log_max: config.console.request_log_max,
            scrape,
            identity: s.identity.clone(),
            plans: s.planned.plans.clone(),
            notifier: s.planned.notifier.clone(),
            selling: s.planned.selling.clone(),
            console_url: config.console_listen.as_ref().map_or_else(|| format!("http://{}", admin.listen), |c| c.public_url.clone()),
        };
        let admin_listener = crate::admin::console::AdminListener::new(api);
        if let Some(c) = &config.console_listen {
            let console = crate::admin::console::AdminListener::console(&admin_listener, &c.public_url, c.tls.is_some());
            let mut service = crate::edge::listener::service(
                &server.configuration,
                crate::edge::local::Local(console),
                "tollgate console",
                &config.connections,
                &s.metrics,
                false,
            );
            match &c.tls {
                Some((cert, key)) => {
                    let cert = Arc::new(crate::base::tls::ReloadableCert::load(cert, key)?);
                    let mut settings =
                        pingora_core::listeners::tls::TlsSettings::intermediate("", "").map_err(|e| format!("console.tls: {e}"))?;
                    settings.set_cert_resolver(cert);
                    service.add_tls_with_settings(&c.listen.to_string(), None, settings);
                }
                None => service.add_tcp(&c.listen.to_string()),
            }
            server.add_service(service);
        }
        add_local(server, config, &s.metrics, admin_listener, "tollgate admin", admin.listen);
    } else if config.console_listen.is_some() {
        return Err("console.listen: the console needs the admin section (admin.listen), whose token is the break-glass sign-in".into());
    }
    Ok(())
}

/// The proxy of model calls.
fn gateway(
    server: &Server,
    config: &Config,
    s: &Shared,
    fleet: Option<&crate::store::fleet::FleetStore>,
    closing: Arc<std::sync::atomic::AtomicBool>,
    body: crate::edge::body::BodyLimits,
) -> Gateway {
    let options = pingora_core::connectors::ConnectorOptions::from_server_conf(&server.configuration);
    let keyless_per_minute = crate::edge::gateway::keyless_per_minute(config.console.request_log_max, config.console.request_log_days);
    Gateway {
        routing: s.routing.clone(),
        keys: s.keys.clone(),
        uploads: crate::edge::upload::UploadLimits::new(
            config.uploads.max_upload_bytes,
            body.read_timeout,
            config.uploads.max_spooled_bytes,
            body.budget.clone(),
        ),
        realtime: config.realtime,
        files: s.files.clone(),
        batches: Some(s.batches.clone()),
        identity: s.identity.clone(),
        mcp: s.mcp.clone(),
        body,
        video: s.video.clone(),
        owners: crate::access::owners::Owners::new(s.ledger.clone()),
        ledger: s.ledger.clone(),
        charge: Arc::new(
            crate::charge::Charge::new(
                crate::charge::Books::new(s.ledger.clone()),
                Arc::new(match fleet {
                    Some(node) => Limits::for_fleet(node.fleet.clone()),
                    None => Limits::default(),
                }),
                s.keys.clone(),
            )
            .with_plans(s.planned.plans.clone()),
        ),
        checks: s.checks.clone(),
        selling: s.planned.selling.clone(),
        metrics: s.metrics.clone(),
        connector: pingora_core::connectors::http::v1::Connector::new(Some(options)),
        usage_queries: crate::access::limits::UsageTurns::default(),
        realtime_sessions: crate::edge::body::KeyBudgets::new(usize::try_from(config.realtime.sessions_per_key).unwrap_or(usize::MAX)),
        drain: config.drain,
        closing,
        requests: config.console.request_log.then(|| s.store.requests()),
        tracer: s.tracer.clone(),
        keyless: crate::edge::gateway::KeylessRefusals::new(keyless_per_minute),
        signin: s.planned.signin.clone(),
        cache: s.planned.cache.clone(),
    }
}

/// The services in the background: the drain at a stop or an upgrade, usage retention,
/// configuration reloads (which keep the running configuration).
fn add_background(
    server: &mut Server,
    config: Config,
    path: String,
    s: &Shared,
    certificate: Option<Arc<crate::base::tls::ReloadableCert>>,
    closing: Arc<std::sync::atomic::AtomicBool>,
) {
    let drain = crate::drain::Drain {
        tracer: s.tracer.clone(),
        metrics: s.metrics.clone(),
        local: s.local.clone(),
        ledger: s.ledger.clone(),
        phases: tokio::sync::Mutex::new(server.watch_execution_phase()),
        closing,
    };
    server.add_service(background_service("drain", drain));
    let retention = crate::billing::retention::Retention {
        ledger: s.ledger.clone(),
        keep: Duration::from_secs(config.usage_retention_days * 86_400),
        requests: s.store.requests(),
        console: config.console,
    };
    server.add_service(background_service("usage retention", retention));
    let reload = Reload {
        path,
        last: tokio::sync::Mutex::new(crate::config::changes::Summary::of(&config)),
        running: config,
        routing: s.routing.clone(),
        keys: s.keys.clone(),
        ledger: s.ledger.clone(),
        certificate,
        health: s.health.clone(),
        metrics: s.metrics.clone(),
        feed: s.planned.selling.feed.clone(),
    };
    server.add_service(background_service("config reload", reload));
}

/// `tollgate -t`: the configuration is valid (it was loaded), a fleet's database is reached and
/// its schema read; expired keys are warned of.
fn check_only(config: &Config, path: &str) -> Result<(), String> {
    if let Some(fleet) = &config.fleet {
        let version = crate::store::fleet::check(fleet).map_err(|e| e.to_string())?;
        println!("tollgate: store.postgres reached; schema version {version} (node '{}')", fleet.node_id);
        if config.storage.is_none() {
            eprintln!("tollgate: warning: /v1/files needs object storage (storage.s3) on a gateway of several nodes; without it the files endpoints answer 404");
        }
    }
    for warning in config.expired_keys(crate::base::clock::now_unix()) {
        eprintln!("tollgate: warning: {warning}");
    }
    crate::repricing::check(config)?;
    println!("tollgate: configuration {path} is valid");
    Ok(())
}

/// The one store: sled on a single node, the shared PostgreSQL database in a fleet (with this
/// node's journal in the local database). In an upgrade the local database is waited for: the
/// old process releases it when it stops accepting.
#[allow(clippy::type_complexity)]
fn open_store(config: &Config, upgrading: bool) -> Result<(SledDb, Option<Arc<crate::store::fleet::FleetStore>>, Arc<dyn Store>), String> {
    let local = if upgrading { SledDb::open_waiting(&config.data_dir, Duration::from_secs(600)) } else { SledDb::open(&config.data_dir) }
        .map_err(|e| format!("data_dir {}: {e} (is another tollgate running on it?)", config.data_dir.display()))?;
    let fleet = match &config.fleet {
        Some(conf) => {
            let fleet = crate::store::fleet::Fleet::connect(conf).map_err(|e| e.to_string())?;
            Some(Arc::new(crate::store::fleet::FleetStore::new(fleet, local.db(), config.commit).map_err(|e| e.to_string())?))
        }
        None => None,
    };
    let store: Arc<dyn Store> = match &fleet {
        Some(node) => node.clone(),
        None => Arc::new(SledStore::new(local.db(), config.commit).map_err(|e| e.to_string())?),
    };
    Ok((local, fleet, store))
}

/// Tasks left in `submitting` by a crash are failed before anything else runs. In an upgrade
/// the previous process may still be submitting recent tasks.
fn recover_video(svc: &VideoService, start_up: &tokio::runtime::Runtime, upgrading: bool) -> Result<(), String> {
    let spare = if upgrading { 600 } else { 0 };
    let failed = start_up.block_on(svc.recover(spare)).map_err(|e| format!("video recovery: {e}"))?;
    if failed > 0 {
        log::warn!("video: {failed} task(s) interrupted before submission were marked failed");
    }
    Ok(())
}

/// The admin token: the configured one, else the one in `data_dir/admin-token` (generated
/// there at the first such start).
fn admin_token(admin: &crate::config::AdminConfig, data_dir: &std::path::Path) -> Result<String, String> {
    if let Some(token) = &admin.token {
        return Ok(token.clone());
    }
    let (token, path, made) = crate::admin::guard::token_file(data_dir)?;
    let why = match &admin.token_env {
        Some(name) => format!("admin.token_env names {name}, which is not set"),
        None => "admin.token is not set".to_string(),
    };
    // The file is named, never the token: logs are shipped and kept.
    if made {
        log::warn!("{why}: an admin token was generated into {} (0600, kept across restarts)", path.display());
    } else {
        log::info!("{why}: the admin token is the one in {}", path.display());
    }
    Ok(token)
}

/// The public listeners: plain HTTP, and HTTPS with HTTP/2 and HTTP/1.1 by ALPN (TLS 1.2 and
/// 1.3 with rustls' default cipher suites), its certificate re-read on reload.
fn add_public_listeners<A>(
    proxy: &mut pingora_core::services::listening::Service<A>,
    listen: Option<std::net::SocketAddr>,
    tls: Option<(std::net::SocketAddr, Arc<crate::base::tls::ReloadableCert>)>,
) -> Result<(), String> {
    if let Some(addr) = listen {
        // No read buffer in front of a plain client connection: Pingora reads a request header
        // into a buffer of its own and a body into the body reader's, so its default 64 KiB
        // `BufReader` only held a copy, and one per open stream (issue 53: 5 KiB resident per
        // held stream; see BENCHMARKS.md).
        let unbuffered = pingora_core::protocols::l4::stream::L4BufferSettings::default().read(0);
        proxy.add_listener(pingora_core::listeners::ListenerConfig::tcp(addr.to_string()).l4_buffer(unbuffered));
    }
    if let Some((addr, cert)) = tls {
        let mut settings = pingora_core::listeners::tls::TlsSettings::intermediate("", "").map_err(|e| format!("tls: {e}"))?;
        settings.set_cert_resolver(cert);
        settings.enable_h2();
        proxy.add_tls_with_settings(&addr.to_string(), None, settings);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::bind_only;

    #[test]
    fn the_port_probe_never_accepts_a_connection() {
        // A client waiting for the port to open must not be let in by the probe and then
        // refused once the probe closes (tests/gateway/tls.rs lost a request to exactly that).
        let probe = bind_only("127.0.0.1:0".parse().expect("address")).expect("bind");
        let addr = probe.local_addr().expect("local").as_socket().expect("inet");
        let err = std::net::TcpStream::connect(addr).expect_err("a bound, not listening socket accepts nothing");
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
        // And a listening port is reported taken.
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
        let err = bind_only(taken.local_addr().expect("local")).expect_err("in use");
        assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
    }
}
