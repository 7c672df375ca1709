//! Wiring: configuration → database → key index → catalog → Pingora server and services.

use crate::admin::AdminApi;
use crate::auth::{now_unix, seed_key_id, usd_to_nanos, KeyIndex};
use crate::ledger::{now_ms, Ledger, PriceBook};
use crate::limits::Limits;
use crate::metrics::Metrics;
use async_trait::async_trait;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use crate::config::Config;
use crate::gateway::Gateway;
use crate::relay::{Catalog, DnsRefresh};
use crate::storage::ObjectStore;
use crate::store::Store;
use crate::video::{VideoPoller, VideoService};
use pingora_core::server::configuration::{Opt, ServerConf};
use pingora_core::server::Server;
use pingora_core::services::background::background_service;
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

/// Deletes usage records older than the retention period, hourly.
struct Retention {
    ledger: Arc<Ledger>,
    keep: Duration,
}

#[async_trait]
impl BackgroundService for Retention {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        loop {
            let before = now_ms().saturating_sub(self.keep.as_millis() as u64);
            match self.ledger.prune(before) {
                Ok(0) => {}
                Ok(n) => log::info!("usage retention: deleted {n} record(s)"),
                Err(e) => log::error!("usage retention: {e}"),
            }
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(Duration::from_secs(3600)) => {}
            }
        }
    }
}

/// Load everything and run until told to stop. Returns only on a start-up error.
pub fn run(mut opt: Opt) -> Result<(), String> {
    let path = opt.conf.take().unwrap_or_else(|| "conf/tollgate.yaml".to_string());
    let config = Config::load(std::path::Path::new(&path)).map_err(|e| e.to_string())?;
    let conf = server_conf(&config)?;
    if opt.test {
        println!("tollgate: configuration {path} is valid");
        return Ok(());
    }
    if config.tls.is_some() {
        return Err("tls: the HTTPS listener is not available in this build yet; remove the tls section".into());
    }

    let store = Store::open(&config.data_dir)
        .map_err(|e| format!("data_dir {}: {e}", config.data_dir.display()))?;
    let keys = Arc::new(KeyIndex::load(&store, &config.keys).map_err(|e| e.to_string())?);
    let ledger = Arc::new(Ledger::open(store.db()).map_err(|e| e.to_string())?);
    for seed in &config.keys {
        // The configured balance applies only when the key is first created.
        ledger
            .open_account(&seed_key_id(&seed.key), usd_to_nanos(seed.balance))
            .map_err(|e| e.to_string())?;
    }
    store.flush().map_err(|e| e.to_string())?;
    let metrics = Arc::new(Metrics::default());
    let catalog = Arc::new(Catalog::new(&config, now_unix()));
    catalog.resolve_all_blocking();
    let video = match &config.video {
        Some(v) => {
            let storage = config.storage.as_ref().map(|s3| Arc::new(ObjectStore::new(s3)));
            Some(Arc::new(VideoService::new(v.clone(), store.db(), ledger.clone(), storage)?))
        }
        None => None,
    };

    let mut server = Server::new_with_opt_and_conf(opt, conf);
    server.bootstrap();

    if let Some(svc) = &video {
        // Tasks left in `submitting` by a crash are failed before anything else runs.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("start-up runtime: {e}"))?;
        let failed = runtime.block_on(svc.recover()).map_err(|e| format!("video recovery: {e}"))?;
        if failed > 0 {
            log::warn!("video: {failed} task(s) interrupted before submission were marked failed");
        }
        server.add_service(background_service("video poller", VideoPoller { service: svc.clone() }));
    }
    if let Some(admin) = &config.admin {
        let api = AdminApi {
            token: admin.token.clone(),
            store: store.clone(),
            keys: keys.clone(),
            ledger: ledger.clone(),
            groups: config.groups.keys().cloned().collect(),
            metrics: metrics.clone(),
        };
        let mut service = pingora_proxy::http_proxy_service_with_name(&server.configuration, api, "tollgate admin");
        service.add_tcp(&admin.listen.to_string());
        server.add_service(service);
    }
    server.add_service(background_service(
        "usage retention",
        Retention { ledger: ledger.clone(), keep: Duration::from_secs(config.usage_retention_days * 86_400) },
    ));
    let gateway = Gateway {
        catalog: catalog.clone(),
        keys,
        max_body_bytes: config.max_body_bytes,
        video,
        ledger,
        prices: Arc::new(PriceBook::new(&config.prices)),
        limits: Arc::new(Limits::default()),
        default_max_output_tokens: config.default_max_output_tokens,
        metrics,
    };
    let mut proxy = pingora_proxy::http_proxy_service_with_name(&server.configuration, gateway, "tollgate");
    if let Some(addr) = config.listen {
        proxy.add_tcp(&addr.to_string());
    }
    server.add_service(proxy);
    server.add_service(background_service(
        "dns refresh",
        DnsRefresh { catalog, every: Duration::from_secs(60) },
    ));
    log::info!("tollgate starting with {path}");
    server.run_forever();
}
