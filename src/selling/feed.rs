//! Prices that follow a feed (`price_feed`): a published price table — LiteLLM's
//! `model_prices_and_context_window.json` or OpenRouter's `/api/v1/models` — read at start and
//! every `refresh`, mapped onto the served models (by their upstream name, then their own, then
//! a feed name that ends in `/<name>`), multiplied by `multiplier`, and installed whole (the
//! caller swaps its price table at once: a request keeps the table it started with). Prices
//! written in the file win; a served model the feed covers keeps its last fed price if a new
//! table lacks it. A feed that cannot be read or parsed keeps the last good table (logged and
//! counted); each change of a model's price is audited once over the fleet.

use crate::billing::ledger::Ledger;
use crate::config::feed::{FeedConfig, FeedFormat};
use crate::config::Price;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The largest feed read (LiteLLM's table is about 3.5 MB).
pub const MAX_FEED_BYTES: usize = 64 * 1024 * 1024;

/// Fed prices, by served model: USD per 1M tokens, as the file writes them.
pub type Table = BTreeMap<String, Price>;

/// One model's prices as a feed gives them (USD per token; per image; per second).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Fed {
    pub input: f64,
    pub output: f64,
    pub cache_read: Option<f64>,
    pub cache_write: Option<f64>,
    pub batch_input: Option<f64>,
    pub batch_output: Option<f64>,
    pub per_image: Option<f64>,
    pub per_second: Option<f64>,
    pub max_output_tokens: Option<u64>,
    /// The most input tokens one call may have (LiteLLM's `max_input_tokens`, OpenRouter's
    /// `context_length`).
    pub context_window: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeedError(pub String);

impl std::fmt::Display for FeedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A price that is a number (OpenRouter writes strings), finite and not negative.
fn number(v: Option<&Value>) -> Option<f64> {
    let n = match v? {
        Value::Number(n) => n.as_f64()?,
        Value::String(s) => s.trim().parse().ok()?,
        _ => return None,
    };
    (n.is_finite() && n >= 0.0).then_some(n)
}

/// The feed's table, by the feed's model names: entries without an input and an output price
/// (or with prices that are not numbers, as LiteLLM's `sample_spec`) left out.
pub fn parse(format: FeedFormat, body: &[u8]) -> Result<HashMap<String, Fed>, FeedError> {
    let doc: Value = serde_json::from_slice(body).map_err(|e| FeedError(format!("the feed is not JSON: {e}")))?;
    let mut out = HashMap::new();
    match format {
        FeedFormat::Litellm => {
            let map = doc.as_object().ok_or_else(|| FeedError("a LiteLLM table is a JSON object of models".into()))?;
            for (name, m) in map {
                let (Some(input), Some(output)) = (number(m.get("input_cost_per_token")), number(m.get("output_cost_per_token"))) else {
                    // Priced per second or per image only (transcriptions, images).
                    if let Some(s) = number(m.get("input_cost_per_second")) {
                        out.insert(name.clone(), Fed { per_second: Some(s), ..Fed::default() });
                    } else if let Some(i) = number(m.get("output_cost_per_image")) {
                        out.insert(name.clone(), Fed { per_image: Some(i), ..Fed::default() });
                    }
                    continue;
                };
                out.insert(
                    name.clone(),
                    Fed {
                        input,
                        output,
                        cache_read: number(m.get("cache_read_input_token_cost")),
                        cache_write: number(m.get("cache_creation_input_token_cost")),
                        batch_input: number(m.get("input_cost_per_token_batches")),
                        batch_output: number(m.get("output_cost_per_token_batches")),
                        per_image: number(m.get("output_cost_per_image")),
                        per_second: number(m.get("input_cost_per_second")),
                        max_output_tokens: m.get("max_output_tokens").and_then(Value::as_u64),
                        context_window: m.get("max_input_tokens").and_then(Value::as_u64),
                    },
                );
            }
        }
        FeedFormat::Openrouter => {
            let data =
                doc.get("data").and_then(Value::as_array).ok_or_else(|| FeedError("an OpenRouter list has `data`, an array".into()))?;
            for m in data {
                let (Some(id), Some(p)) = (m.get("id").and_then(Value::as_str), m.get("pricing")) else { continue };
                let (Some(input), Some(output)) = (number(p.get("prompt")), number(p.get("completion"))) else { continue };
                out.insert(
                    id.to_string(),
                    Fed {
                        input,
                        output,
                        cache_read: number(p.get("input_cache_read")),
                        cache_write: number(p.get("input_cache_write")),
                        per_image: number(p.get("image_output")),
                        max_output_tokens: m.get("top_provider").and_then(|t| t.get("max_completion_tokens")).and_then(Value::as_u64),
                        context_window: m.get("context_length").and_then(Value::as_u64),
                        ..Fed::default()
                    },
                );
            }
        }
    }
    if out.is_empty() {
        return Err(FeedError("the feed has no priced model".into()));
    }
    Ok(out)
}

/// A fed price as the file would write it: USD per 1M tokens times `multiplier`.
fn price_of(f: &Fed, multiplier: f64) -> Price {
    let m = |usd_per_token: f64| usd_per_token * 1e6 * multiplier;
    let per_image = f.per_image.map(|i| {
        let sizes: BTreeMap<String, f64> = [("*".to_string(), i * multiplier)].into();
        [("*".to_string(), sizes)].into()
    });
    Price {
        input: m(f.input),
        output: m(f.output),
        cached_input: f.cache_read.map(m),
        cache_write_input: f.cache_write.map(m),
        batch_input: f.batch_input.map(m),
        batch_output: f.batch_output.map(m),
        per_image,
        per_second: f.per_second.map(|s| s * multiplier),
        max_output_tokens: f.max_output_tokens.filter(|n| (1..=crate::base::usage::MAX_OUTPUT_ALLOWANCE).contains(n)),
        context_window: f.context_window.filter(|n| *n > 0),
        ..Price::default()
    }
}

/// The feed's entry for a served model: by its upstream name, its own, then a name of the
/// feed that ends in `/<upstream name>` (LiteLLM's `openai/…`, OpenRouter's vendor ids).
fn find<'a>(fed: &'a HashMap<String, Fed>, name: &str, upstream: &str) -> Option<&'a Fed> {
    fed.get(upstream).or_else(|| fed.get(name)).or_else(|| {
        let tail = format!("/{upstream}");
        let mut hits: Vec<(&String, &Fed)> = fed.iter().filter(|(k, _)| k.ends_with(&tail)).collect();
        // One answer whatever the map's order.
        hits.sort_by(|a, b| a.0.cmp(b.0));
        hits.first().map(|(_, f)| *f)
    })
}

/// The fed prices of the served models (`(name, upstream name)`) the feed covers and the file
/// does not price; `kept` (the last table) fills a model the new table lacks.
pub fn map(cfg: &FeedConfig, fed: &HashMap<String, Fed>, served: &[(String, String)], file: &Table, kept: &Table) -> (Table, Vec<String>) {
    let mut out = Table::new();
    let mut missing = Vec::new();
    for (name, upstream) in served {
        if file.contains_key(name) || !cfg.covers(name) || out.contains_key(name) {
            continue;
        }
        match find(fed, name, upstream) {
            Some(f) => {
                out.insert(name.clone(), price_of(f, cfg.multiplier));
            }
            None => {
                missing.push(name.clone());
                if let Some(p) = kept.get(name) {
                    out.insert(name.clone(), p.clone());
                }
            }
        }
    }
    (out, missing)
}

/// How a price reads in the audit trail and `-t`.
pub fn show(p: Option<&Price>) -> String {
    match p {
        None => "none".into(),
        Some(p) => format!("input {} output {} USD/1M", round(p.input), round(p.output)),
    }
}

fn round(v: f64) -> String {
    let s = format!("{v:.6}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// What changed from `old` to `new`: (model, old, new).
pub fn changes<'a>(old: &'a Table, new: &'a Table) -> Vec<(&'a str, Option<&'a Price>, Option<&'a Price>)> {
    let mut out = Vec::new();
    for (m, p) in new {
        if old.get(m) != Some(p) {
            out.push((m.as_str(), old.get(m), Some(p)));
        }
    }
    for (m, p) in old {
        if !new.contains_key(m) {
            out.push((m.as_str(), Some(p), None));
        }
    }
    out
}

/// The served models and the file's prices, as the configuration in force gives them.
#[derive(Debug, Clone, Default)]
pub struct Served {
    pub models: Vec<(String, String)>,
    pub file: Table,
}

/// What swaps a whole price table in.
pub type Installer = Arc<dyn Fn(&Table) + Send + Sync>;

/// The feed of a running gateway: the last good table, what it maps onto, and where it
/// installs each new one.
pub struct PriceFeed {
    pub cfg: FeedConfig,
    http: reqwest::Client,
    ledger: Option<Arc<Ledger>>,
    served: Mutex<Served>,
    current: Mutex<Arc<Table>>,
    /// Swaps in the whole price table (the file's and the fed); nothing before it is set.
    install: Mutex<Option<Installer>>,
    metrics: Option<Arc<crate::observe::metrics::Metrics>>,
    status: Mutex<Status>,
}

/// How the feed's last reads went (unix seconds).
#[derive(Debug, Clone, Default)]
pub struct Status {
    pub last_applied: Option<u64>,
    pub last_failure: Option<(u64, String)>,
}

impl PriceFeed {
    pub fn new(cfg: FeedConfig, served: Served) -> PriceFeed {
        let http = crate::base::outbound::Outbound {
            connect: Some(Duration::from_secs(10)),
            total: Some(Duration::from_secs(60)),
            ..Default::default()
        }
        .client()
        .unwrap_or_default();
        PriceFeed {
            cfg,
            http,
            ledger: None,
            served: Mutex::new(served),
            current: Mutex::new(Arc::default()),
            install: Mutex::new(None),
            metrics: None,
            status: Mutex::default(),
        }
    }

    /// Audit changes in `ledger`'s trail and count refreshes in `metrics`.
    pub fn with(mut self, ledger: Arc<Ledger>, metrics: Arc<crate::observe::metrics::Metrics>) -> PriceFeed {
        self.ledger = Some(ledger);
        self.metrics = Some(metrics);
        self
    }

    /// The fed table in force.
    pub fn current(&self) -> Arc<Table> {
        self.current.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// How the last reads went.
    pub fn status(&self) -> Status {
        self.status.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// From now on, each refresh's table goes to `install`.
    pub fn set_install(&self, install: Installer) {
        *self.install.lock().unwrap_or_else(|p| p.into_inner()) = Some(install);
    }

    /// A reload changed the served models or the file's prices.
    pub fn set_served(&self, served: Served) {
        *self.served.lock().unwrap_or_else(|p| p.into_inner()) = served;
    }

    /// The feed's table, read now.
    pub async fn fetch(&self) -> Result<HashMap<String, Fed>, FeedError> {
        let resp =
            self.http.get(&self.cfg.url).send().await.map_err(|e| FeedError(format!("the feed cannot be read: {}", e.without_url())))?;
        if !resp.status().is_success() {
            return Err(FeedError(format!("the feed answered {}", resp.status())));
        }
        if resp.content_length().is_some_and(|n| n > MAX_FEED_BYTES as u64) {
            return Err(FeedError(format!("the feed is larger than {MAX_FEED_BYTES} bytes")));
        }
        let mut body = Vec::new();
        let mut resp = resp;
        while let Some(chunk) = resp.chunk().await.map_err(|e| FeedError(format!("the feed cannot be read: {}", e.without_url())))? {
            if body.len() + chunk.len() > MAX_FEED_BYTES {
                return Err(FeedError(format!("the feed is larger than {MAX_FEED_BYTES} bytes")));
            }
            body.extend_from_slice(&chunk);
        }
        parse(self.cfg.format, &body)
    }

    /// Read the feed and install what it gives; on a failure the last good table stays. The
    /// models the feed lacks, on success.
    pub async fn refresh(&self) -> Result<Vec<String>, FeedError> {
        let fetched = self.fetch().await;
        let outcome = if fetched.is_ok() { "applied" } else { "kept" };
        if let Some(m) = &self.metrics {
            m.counter("tollgate_price_feed_refreshes_total", &[("outcome", outcome)]).add(1);
        }
        let now = crate::base::clock::now_unix();
        let fed = fetched.inspect_err(|e| {
            log::warn!("price feed: {e}; the last good prices stay");
            self.status.lock().unwrap_or_else(|p| p.into_inner()).last_failure = Some((now, e.0.clone()));
        })?;
        self.status.lock().unwrap_or_else(|p| p.into_inner()).last_applied = Some(now);
        let served = self.served.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let old = self.current();
        let (new, missing) = map(&self.cfg, &fed, &served.models, &served.file, &old);
        for m in &missing {
            log::warn!(
                "price feed: it has no price for the served model '{m}'{}",
                if old.contains_key(m) { "; its last fed price stays" } else { "" }
            );
        }
        self.audit(&old, &new).await;
        let new = Arc::new(new);
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = new.clone();
        let mut whole = served.file.clone();
        whole.extend(new.iter().map(|(k, v)| (k.clone(), v.clone())));
        let install = self.install.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(install) = install {
            install(&whole);
        }
        Ok(missing)
    }

    /// Each change once in the audit trail over the fleet (a mark per model, change and
    /// refresh period).
    async fn audit(&self, old: &Table, new: &Table) {
        let Some(ledger) = &self.ledger else { return };
        let period = crate::base::clock::now_unix() / self.cfg.refresh.as_secs().max(1);
        for (model, before, after) in changes(old, new) {
            let (before, after) = (show(before), show(after));
            log::info!("price feed: {model}: {before} → {after}");
            let reason = format!("price of {model} from the feed: {before} → {after}");
            let digest = crate::access::auth::hex(&crate::access::auth::hash_key(&reason))[..16].to_string();
            let mark = format!("pricefeed:{period}:{digest}");
            if let Err(e) = ledger.top_up_once("price_feed", 0, &reason, &[(&mark, 0)]).await {
                log::warn!("price feed: the change of {model} could not be audited: {e}");
            }
        }
    }
}

/// The feed refreshed in the background every `refresh`.
pub struct PriceFeedService(pub Arc<PriceFeed>);

#[async_trait::async_trait]
impl pingora_core::services::background::BackgroundService for PriceFeedService {
    async fn start(&self, mut shutdown: pingora_core::server::ShutdownWatch) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.0.cfg.refresh) => {}
                _ = shutdown.changed() => return,
            }
            // A failure keeps the last good table (logged and counted by `refresh`).
            let _ = self.0.refresh().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(models: &[&str], multiplier: f64) -> FeedConfig {
        FeedConfig {
            url: "http://x".into(),
            format: FeedFormat::Litellm,
            refresh: Duration::from_secs(3600),
            multiplier,
            models: models.iter().map(|s| s.to_string()).collect(),
        }
    }

    const LITELLM: &str = r#"{
        "sample_spec": {"input_cost_per_token": 0.0, "output_cost_per_token": 0.0, "max_output_tokens": "max output tokens"},
        "gpt-4o": {"input_cost_per_token": 2.5e-06, "output_cost_per_token": 1e-05, "cache_read_input_token_cost": 1.25e-06, "max_output_tokens": 16384, "max_input_tokens": 128000},
        "anthropic/claude-x": {"input_cost_per_token": 3e-06, "output_cost_per_token": 1.5e-05, "cache_creation_input_token_cost": 3.75e-06},
        "whisper-1": {"input_cost_per_second": 0.0001, "mode": "audio_transcription"},
        "broken": {"input_cost_per_token": "lots"}
    }"#;

    #[test]
    fn litellm_entries_are_read_and_mapped_by_upstream_name_with_the_multiplier() {
        let fed = parse(FeedFormat::Litellm, LITELLM.as_bytes()).expect("parsed");
        assert!(fed.contains_key("sample_spec") && !fed.contains_key("broken"));
        assert_eq!(fed["whisper-1"].per_second, Some(0.0001));
        let served = vec![
            ("alpha-4o".to_string(), "gpt-4o".to_string()),
            ("beta-x".to_string(), "claude-x".to_string()),
            ("typed".to_string(), "gpt-4o".to_string()),
            ("other".to_string(), "nope".to_string()),
        ];
        let file: Table = [("typed".to_string(), Price { input: 1.0, output: 1.0, ..Price::default() })].into();
        let (table, missing) = map(&cfg(&["*"], 1.2), &fed, &served, &file, &Table::new());
        let a = &table["alpha-4o"];
        assert_eq!(
            (crate::base::money::usd_to_nanos(a.input), crate::base::money::usd_to_nanos(a.output)),
            (3_000_000_000, 12_000_000_000)
        );
        assert_eq!((a.cached_input.map(crate::base::money::usd_to_nanos), a.max_output_tokens), (Some(1_500_000_000), Some(16384)));
        assert_eq!(a.context_window, Some(128_000), "LiteLLM's max_input_tokens is the model's context window");
        assert_eq!(
            crate::base::money::usd_to_nanos(table["beta-x"].cache_write_input.expect("write")),
            4_500_000_000,
            "found by /claude-x"
        );
        assert!(!table.contains_key("typed"), "the file's price wins");
        assert_eq!(missing, ["other"]);
        // Only the covered models; one the new table lacks keeps its last price.
        let (narrow, _) = map(&cfg(&["beta-*", "other"], 1.0), &fed, &served, &file, &table);
        assert_eq!(narrow.keys().collect::<Vec<_>>(), ["beta-x"]);
        let kept: Table = [("other".to_string(), Price { input: 9.0, output: 9.0, ..Price::default() })].into();
        let (with_kept, _) = map(&cfg(&["*"], 1.0), &fed, &served, &file, &kept);
        assert_eq!(with_kept["other"].input, 9.0);
        assert_eq!(changes(&table, &with_kept).len(), 3, "alpha and beta repriced, other added");
    }

    #[test]
    fn openrouter_prices_are_strings_per_token_under_vendor_ids() {
        let body = r#"{"data": [{"id": "openai/gpt-4o", "pricing": {"prompt": "0.0000025", "completion": "0.00001"}, "top_provider": {"max_completion_tokens": 16384}, "context_length": 128000},
                                {"id": "free/model", "pricing": {"prompt": "0", "completion": "0"}}, {"id": "no-pricing"}]}"#;
        let fed = parse(FeedFormat::Openrouter, body.as_bytes()).expect("parsed");
        assert_eq!(fed.len(), 2);
        let (table, _) = map(&cfg(&["*"], 1.0), &fed, &[("a".into(), "gpt-4o".into())], &Table::new(), &Table::new());
        assert_eq!(crate::base::money::usd_to_nanos(table["a"].input), 2_500_000_000);
        assert_eq!(table["a"].context_window, Some(128_000), "OpenRouter's context_length");
        for bad in ["not json", "{\"data\": 3}", "{}", "[]"] {
            let format = if bad.contains("data") { FeedFormat::Openrouter } else { FeedFormat::Litellm };
            assert!(parse(format, bad.as_bytes()).is_err(), "{bad}");
        }
    }
}
