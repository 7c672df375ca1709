//! `price_feed:`: prices read from a published table (LiteLLM's
//! `model_prices_and_context_window.json`, or OpenRouter's `/api/v1/models`), refreshed in the
//! background; prices written in `prices:` win over it.

use super::{err, ConfigError};
use serde::Deserialize;
use std::time::Duration;

/// How the feed writes its table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeedFormat {
    /// `{ "<model>": { "input_cost_per_token": …, … } }`.
    Litellm,
    /// `{ "data": [ { "id": "<vendor>/<model>", "pricing": { "prompt": "…", … } } ] }`.
    Openrouter,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFeed {
    url: String,
    format: String,
    #[serde(default)]
    refresh: Option<String>,
    #[serde(default)]
    multiplier: Option<f64>,
    #[serde(default)]
    models: Option<Vec<String>>,
    #[serde(default)]
    on_error: Option<String>,
}

/// `price_feed`, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct FeedConfig {
    pub url: String,
    pub format: FeedFormat,
    pub refresh: Duration,
    /// What the feed's prices are multiplied by (a margin; 1: as published).
    pub multiplier: f64,
    /// The served models (their names here) that take prices from the feed: `*` ends a
    /// prefix; `["*"]` by default.
    pub models: Vec<String>,
}

impl FeedConfig {
    /// Whether `model` (its name here) takes its price from the feed.
    pub fn covers(&self, model: &str) -> bool {
        self.models.iter().any(|p| match p.strip_suffix('*') {
            Some(prefix) => model.starts_with(prefix),
            None => p == model,
        })
    }
}

pub(super) fn feed(raw: Option<RawFeed>) -> Result<Option<FeedConfig>, ConfigError> {
    let Some(f) = raw else { return Ok(None) };
    let uri: http::Uri = f.url.parse().map_err(|e| ConfigError(format!("price_feed.url: not a URL ({e})")))?;
    if !matches!((uri.scheme_str(), uri.host()), (Some("http" | "https"), Some(_))) {
        return err("price_feed.url: an http:// or https:// URL");
    }
    let format = match f.format.as_str() {
        "litellm" => FeedFormat::Litellm,
        "openrouter" => FeedFormat::Openrouter,
        other => return err(format!("price_feed.format: '{other}' is not litellm or openrouter")),
    };
    let refresh = match f.refresh.as_deref() {
        None => 3_600,
        Some(r) => crate::policy::budget::Rolling::parse_label(r)
            .ok_or_else(|| ConfigError("price_feed.refresh: a duration, 1m to 366d (\"1h\")".into()))?,
    };
    let multiplier = f.multiplier.unwrap_or(1.0);
    if !(multiplier.is_finite() && multiplier > 0.0 && multiplier <= 100.0) {
        return err("price_feed.multiplier: above 0, at most 100");
    }
    let models = f.models.unwrap_or_else(|| vec!["*".into()]);
    if models.is_empty() || models.iter().any(|m| m.is_empty() || m.trim_end_matches('*').contains('*')) {
        return err("price_feed.models: model names, or prefixes ending in *");
    }
    match f.on_error.as_deref() {
        None | Some("keep") => {}
        Some(other) => return err(format!("price_feed.on_error: '{other}': only keep (the last good table stays)")),
    }
    Ok(Some(FeedConfig { url: f.url, format, refresh: Duration::from_secs(refresh), multiplier, models }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_feed_is_checked_and_covers_its_patterns() {
        let raw: RawFeed = serde_yaml::from_str(
            "{ url: \"https://example.com/p.json\", format: litellm, refresh: 30m, multiplier: 1.2, models: [\"alpha-*\", beta-x] }",
        )
        .expect("yaml");
        let f = feed(Some(raw)).expect("valid").expect("feed");
        assert_eq!((f.format, f.refresh.as_secs(), f.multiplier), (FeedFormat::Litellm, 1800, 1.2));
        assert!(f.covers("alpha-5.5") && f.covers("beta-x") && !f.covers("beta-y"));
        for (bad, says) in [
            ("{ url: \"ftp://x\", format: litellm }", "price_feed.url"),
            ("{ url: \"https://x\", format: csv }", "price_feed.format"),
            ("{ url: \"https://x\", format: litellm, refresh: 5s }", "price_feed.refresh"),
            ("{ url: \"https://x\", format: litellm, multiplier: 0 }", "price_feed.multiplier"),
            ("{ url: \"https://x\", format: litellm, models: [\"a*b\"] }", "price_feed.models"),
            ("{ url: \"https://x\", format: litellm, on_error: fail }", "price_feed.on_error"),
        ] {
            let raw: RawFeed = serde_yaml::from_str(bad).expect("yaml");
            let e = feed(Some(raw)).expect_err(bad);
            assert!(e.0.starts_with(says), "{bad}: {}", e.0);
        }
    }
}
