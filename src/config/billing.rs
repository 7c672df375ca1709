//! `prices` and `billing`: what a model costs, the output a request is held for, how usage
//! records reach the disk, the spend windows' calendar, and what a departed client's response
//! still costs.

use super::{err, ConfigError, ProviderConfig};
use crate::base::usage::MAX_OUTPUT_ALLOWANCE;
use crate::policy::budget::Calendar;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// `billing:`, validated.
pub(super) struct Billing {
    pub default_output_tokens: u64,
    pub min_output_tokens: u64,
    pub calendar: Calendar,
    pub usage_retention_days: u64,
    pub commit: CommitPolicy,
    pub drain: Duration,
    pub media_allowance: MediaAllowance,
}

/// `prices:`: numbers in range, and a price for every model a provider serves (billing fails
/// closed: a served model without a price would be free for every key) — by the file, or by
/// the feed when it covers the model (whether the feed has it is known at start, which refuses
/// it otherwise).
pub(super) fn check_prices(
    prices: &BTreeMap<String, Price>,
    providers: &[ProviderConfig],
    feed: Option<&super::feed::FeedConfig>,
) -> Result<(), ConfigError> {
    let usd_ok = |v: f64| v.is_finite() && (0.0..=1e6).contains(&v);
    for (model, price) in prices {
        if ![Some(price.input), Some(price.output), price.cached_input, price.cache_write_input].into_iter().flatten().all(usd_ok) {
            return err(format!("prices.{model}: prices must be numbers from 0 to 1000000 (USD per 1M tokens)"));
        }
        for (name, v) in [
            ("image_input", price.image_input),
            ("image_output", price.image_output),
            ("audio_input", price.audio_input),
            ("audio_output", price.audio_output),
            ("characters", price.characters),
            ("per_second", price.per_second),
            ("batch_input", price.batch_input),
            ("batch_output", price.batch_output),
        ] {
            if v.is_some_and(|v| !usd_ok(v)) {
                return err(format!("prices.{model}.{name}: a number from 0 to 1000000 (USD)"));
            }
        }
        for (quality, sizes) in price.per_image.iter().flatten() {
            if sizes.is_empty() {
                return err(format!("prices.{model}.per_image.{quality}: give a price for at least one size (\"*\" for any)"));
            }
            if let Some((size, _)) = sizes.iter().find(|(_, v)| !usd_ok(**v)) {
                return err(format!("prices.{model}.per_image.{quality}.{size}: a number from 0 to 1000000 (USD an image)"));
            }
        }
        if price.per_image.as_ref().is_some_and(BTreeMap::is_empty) {
            return err(format!("prices.{model}.per_image: give a price for at least one quality (\"*\" for any)"));
        }
        if price.cache_hit.is_some_and(|v| !usd_ok(v)) {
            return err(format!("prices.{model}.cache_hit: a number from 0 to 1000000 (USD per 1M tokens of the original answer)"));
        }
        match (price.cache_hit, price.cache_hit_ratio) {
            (Some(_), Some(_)) => return err(format!("prices.{model}: give cache_hit or cache_hit_ratio, not both")),
            (_, Some(r)) if !(r.is_finite() && (0.0..=1.0).contains(&r)) => {
                return err(format!("prices.{model}.cache_hit_ratio: a fraction from 0 to 1 of the original cost"))
            }
            _ => {}
        }
        if price.context_window == Some(0) {
            return err(format!("prices.{model}.context_window: at least 1 (input tokens)"));
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
    for p in providers {
        if let Some(m) = p.models.iter().find(|m| !prices.contains_key(*m) && !feed.is_some_and(|f| f.covers(m))) {
            return err(format!(
                "prices.{m}: no price for a served model (provider '{}'); write {{ input: 0, output: 0 }} to serve it free",
                p.name
            ));
        }
    }
    Ok(())
}

/// `billing:` (every key optional).
pub(super) fn billing(raw: Option<RawBilling>) -> Result<Billing, ConfigError> {
    let billing = raw.unwrap_or_default();
    let default_output_tokens = billing.default_output_tokens.unwrap_or(DEFAULT_OUTPUT_TOKENS);
    if default_output_tokens == 0 || default_output_tokens > MAX_OUTPUT_ALLOWANCE {
        return err(format!("billing.default_output_tokens: 1 to {MAX_OUTPUT_ALLOWANCE}"));
    }
    let min_output_tokens = billing.min_output_tokens.unwrap_or(DEFAULT_MIN_OUTPUT_TOKENS.min(default_output_tokens));
    if min_output_tokens == 0 || min_output_tokens > default_output_tokens {
        return err(format!("billing.min_output_tokens: 1 to billing.default_output_tokens ({default_output_tokens})"));
    }
    let calendar = match billing.timezone.as_deref() {
        Some(name) => Calendar::new(name).map_err(|e| ConfigError(format!("billing.timezone: {e}")))?,
        None => Calendar::default(),
    };
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
    let commit = CommitPolicy { interval: Duration::from_millis(commit_interval_ms), sync: billing.sync_commit.unwrap_or(false) };
    let drain_secs = billing.drain_secs.unwrap_or(DEFAULT_DRAIN_SECS);
    if drain_secs > 600 {
        return err("billing.drain_secs: 0 to 600 (0: stop reading when the client leaves, and bill from the estimate)");
    }
    let mut media_allowance = MediaAllowance::default();
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
    Ok(Billing {
        default_output_tokens,
        min_output_tokens,
        calendar,
        usage_retention_days,
        commit,
        drain: Duration::from_secs(drain_secs),
        media_allowance,
    })
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBilling {
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

/// USD per one million tokens, and the model's output limit; for the media endpoints, what
/// their own units cost (`billing::media`).
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
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
    /// The most input tokens one call of this model may have: a fallback candidate whose window
    /// cannot hold a request's input estimate is skipped without a call (`routing.fallbacks`).
    #[serde(default)]
    pub context_window: Option<u64>,
    /// The output tokens held and asked for when a request names no maximum (at most
    /// `max_output_tokens`); `billing.default_output_tokens` when absent.
    #[serde(default)]
    pub default_output_tokens: Option<u64>,
    /// Images: image tokens of the input and of the output, USD per 1M (default: `input`,
    /// `output`).
    #[serde(default)]
    pub image_input: Option<f64>,
    #[serde(default)]
    pub image_output: Option<f64>,
    /// Transcriptions and realtime: audio tokens of the input, USD per 1M (default: `input`).
    #[serde(default)]
    pub audio_input: Option<f64>,
    /// Realtime: audio tokens of the output, USD per 1M (default: `output`).
    #[serde(default)]
    pub audio_output: Option<f64>,
    /// Images billed per image: USD by quality, then size (`"*"` matches any).
    #[serde(default)]
    pub per_image: Option<BTreeMap<String, BTreeMap<String, f64>>>,
    /// Speech billed per input character: USD per 1M characters.
    #[serde(default)]
    pub characters: Option<f64>,
    /// Transcriptions billed per second of audio: USD a second.
    #[serde(default)]
    pub per_second: Option<f64>,
    /// Batch work, USD per 1M tokens (default: half of `input`, `output`).
    #[serde(default)]
    pub batch_input: Option<f64>,
    #[serde(default)]
    pub batch_output: Option<f64>,
    /// An answer from the response cache: USD per 1M tokens of the answer's original usage
    /// (input and output together), or `cache_hit_ratio`, a fraction of its original cost.
    /// Neither: a hit is free.
    #[serde(default)]
    pub cache_hit: Option<f64>,
    #[serde(default)]
    pub cache_hit_ratio: Option<f64>,
}

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

/// Input tokens held for content a request references rather than carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MediaAllowance {
    pub image_tokens: u64,
    pub file_tokens: u64,
}

impl MediaAllowance {
    /// The input tokens held for the images and files a request references.
    pub fn tokens(&self, media: crate::protocol::MediaCount) -> u64 {
        media.images.saturating_mul(self.image_tokens).saturating_add(media.files.saturating_mul(self.file_tokens))
    }
}

impl Default for MediaAllowance {
    fn default() -> Self {
        MediaAllowance { image_tokens: DEFAULT_IMAGE_INPUT_TOKENS, file_tokens: DEFAULT_FILE_INPUT_TOKENS }
    }
}

/// Input tokens held for each image a request names (by URL, file id or inline), and for
/// each file or document (`billing.image_input_tokens`, `billing.file_input_tokens`): what the
/// service may count for content that is not in the body.
pub const DEFAULT_IMAGE_INPUT_TOKENS: u64 = 2_000;

pub const DEFAULT_FILE_INPUT_TOKENS: u64 = 100_000;

/// Default `billing.drain_secs`.
pub const DEFAULT_DRAIN_SECS: u64 = 30;

/// Default `billing.commit_interval_ms`.
pub const DEFAULT_COMMIT_INTERVAL_MS: u64 = 10;

/// Largest `billing.commit_interval_ms` accepted.
pub const MAX_COMMIT_INTERVAL_MS: u64 = 1000;

/// `billing.default_output_tokens` when not set.
pub const DEFAULT_OUTPUT_TOKENS: u64 = 4096;

/// `billing.min_output_tokens` when not set.
pub const DEFAULT_MIN_OUTPUT_TOKENS: u64 = 256;
