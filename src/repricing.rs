//! The price feed (`selling::feed`) wired to the running gateway: read once at start, before
//! the first routing is built — a served model priced by neither the file nor the feed refuses
//! the start, as a model without a price always did —, refreshed in the background into the
//! routing in force, merged again into each reload, and read once by `-t`.

use crate::config::Config;
use crate::selling::feed::{PriceFeed, Served, Table};
use crate::upstream::Routing;
use arc_swap::ArcSwap;
use std::sync::Arc;

/// The served models (name, upstream name) and the file's prices of `config`.
pub fn served(config: &Config) -> Served {
    let mut models = Vec::new();
    for p in &config.providers {
        for m in &p.models {
            models.push((m.clone(), p.upstream_model(m).to_string()));
        }
    }
    Served { models, file: config.prices.clone() }
}

/// The served models without a price in `config`.
fn unpriced(config: &Config) -> Vec<String> {
    let mut out: Vec<String> =
        config.providers.iter().flat_map(|p| p.models.iter()).filter(|m| !config.prices.contains_key(*m)).cloned().collect();
    out.sort();
    out.dedup();
    out
}

/// `fed` merged under the file's prices of `config` (the file's win); Err names the served
/// models priced by neither.
pub fn merge(config: &mut Config, fed: &Table) -> Result<(), String> {
    for (model, price) in fed {
        config.prices.entry(model.clone()).or_insert_with(|| price.clone());
    }
    let missing = unpriced(config);
    if !missing.is_empty() {
        return Err(format!(
            "prices: no price for the served model(s) {} in the file or the price feed; write {{ input: 0, output: 0 }} to serve one free",
            missing.join(", ")
        ));
    }
    Ok(())
}

/// The feed, read once into `config` at start, when there is one; it audits into `ledger` and
/// counts into `metrics` from then on.
pub async fn start(
    config: &mut Config,
    ledger: Arc<crate::billing::ledger::Ledger>,
    metrics: Arc<crate::observe::metrics::Metrics>,
) -> Result<Option<Arc<PriceFeed>>, String> {
    let Some(cfg) = config.price_feed.clone() else { return Ok(None) };
    let feed = PriceFeed::new(cfg, served(config)).with(ledger, metrics);
    match feed.refresh().await {
        Ok(missing) if !missing.is_empty() => log::warn!("price feed: no price in it for {}", missing.join(", ")),
        Ok(_) => log::info!("price feed: {} model(s) priced from {}", feed.current().len(), crate::base::text::redact_url(&feed.cfg.url)),
        Err(e) => log::warn!("price feed: {e}; the file's prices alone at start"),
    }
    merge(config, &feed.current())?;
    Ok(Some(Arc::new(feed)))
}

/// [`start`] on the runtime where the store's connections live (a fleet's own, else `start_up`).
pub fn start_on(
    config: &mut Config,
    (start_up, fleet): (&tokio::runtime::Runtime, Option<&crate::store::fleet::FleetStore>),
    ledger: Arc<crate::billing::ledger::Ledger>,
    metrics: Arc<crate::observe::metrics::Metrics>,
) -> Result<Option<Arc<PriceFeed>>, String> {
    let started = start(config, ledger, metrics);
    match fleet {
        Some(node) => node.fleet.block_on(started),
        None => start_up.block_on(started),
    }
}

/// From now on each refresh of `feed` (when there is one) is installed into `routing`, and
/// the feed is read every `refresh` in the background.
pub fn install(server: &mut pingora_core::server::Server, feed: Option<&Arc<PriceFeed>>, routing: &Arc<ArcSwap<Routing>>) {
    let Some(feed) = feed else { return };
    server.add_service(pingora_core::services::background::background_service(
        "price feed",
        crate::selling::feed::PriceFeedService(feed.clone()),
    ));
    let routing = routing.clone();
    feed.set_install(Arc::new(move |whole: &Table| {
        let mut next = Routing::clone(&routing.load());
        next.prices = Arc::new(crate::billing::ledger::PriceBook::new(whole));
        routing.store(Arc::new(next));
    }));
}

/// A reload: `config` (the file as it is now) priced by the feed's table — read again once
/// when a model it covers has no fed price yet.
pub async fn reload(config: &mut Config, feed: &PriceFeed) -> Result<(), String> {
    feed.set_served(served(config));
    let covered_unpriced = |config: &Config, fed: &Table| unpriced(config).iter().any(|m| !fed.contains_key(m));
    if covered_unpriced(config, &feed.current()) {
        let _ = feed.refresh().await;
    }
    merge(config, &feed.current())
}

/// `-t`: the feed read once, and what it would apply to `config`.
pub fn check(config: &Config) -> Result<(), String> {
    let Some(cfg) = config.price_feed.clone() else { return Ok(()) };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| format!("price feed: {e}"))?;
    let feed = PriceFeed::new(cfg, served(config));
    let missing = runtime.block_on(feed.refresh()).map_err(|e| format!("price_feed: {e}"))?;
    let fed = feed.current();
    for (model, price) in fed.iter() {
        println!("tollgate: price_feed would price {model}: {}", crate::selling::feed::show(Some(price)));
    }
    for model in &missing {
        println!("tollgate: price_feed has no price for {model}");
    }
    let unpriced: Vec<String> = unpriced(config).into_iter().filter(|m| !fed.contains_key(m)).collect();
    if unpriced.is_empty() {
        Ok(())
    } else {
        Err(format!("prices: no price for the served model(s) {} in the file or the price feed", unpriced.join(", ")))
    }
}
