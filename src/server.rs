//! Wiring: configuration → database → key index → catalog → Pingora server and services.

use crate::auth::{now_unix, KeyIndex};
use crate::config::Config;
use crate::gateway::Gateway;
use crate::relay::{Catalog, DnsRefresh};
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
    store.flush().map_err(|e| e.to_string())?;
    let catalog = Arc::new(Catalog::new(&config, now_unix()));
    catalog.resolve_all_blocking();
    let video = match &config.video {
        Some(v) => Some(Arc::new(VideoService::new(v.clone(), store.db())?)),
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
    let gateway = Gateway { catalog: catalog.clone(), keys, max_body_bytes: config.max_body_bytes, video };
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
