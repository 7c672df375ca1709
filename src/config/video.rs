//! `video` and `storage`: the video task service's upstream, models and prices, and the
//! object storage finished videos are copied to.

use super::{err, secret, BaseUrl, ConfigError};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Every API model the video service knows (the video API's model and capability matrix), in the spec's order.
pub const VIDEO_MODELS: [&str; 7] = ["genq3-pro", "genq3-turbo", "genq3-pro-fast", "genq2-pro", "genq2-turbo", "genq2-pro-fast", "genq2"];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawVideo {
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
pub(super) struct RawVideoUpstream {
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStorage {
    s3: RawS3,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawS3 {
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

/// `storage:`.
pub(super) fn storage(raw: RawStorage, env: &dyn Fn(&str) -> Option<String>) -> Result<S3Config, ConfigError> {
    s3_config(raw.s3, env)
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

pub(super) fn video_config(v: RawVideo, env: &dyn Fn(&str) -> Option<String>) -> Result<VideoConfig, ConfigError> {
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

/// The PEM text of a CA bundle, checked to hold certificates; errors name `key_path`.
fn ca_pem_file(key_path: &str, path: Option<&Path>) -> Result<Option<String>, ConfigError> {
    let Some(path) = path else { return Ok(None) };
    crate::base::tls::load_ca_bundle(path).map_err(|e| ConfigError(format!("{key_path}: {e}")))?;
    std::fs::read_to_string(path).map(Some).map_err(|e| ConfigError(format!("{key_path}: {e}")))
}
