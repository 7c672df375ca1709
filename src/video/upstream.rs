//! The Tencent-Cloud-API-3.0-style video service client: signed `POST /` calls with
//! `X-TC-*` headers, the `{"Response":{…}}` envelopes, timeouts, retries with backoff on network
//! errors and `RequestLimitExceeded`, and one request rate for the whole process.

use super::request::Capability;
use super::tc3;
use crate::config::VideoConfig;
use crate::records::task::{TaskError, UpstreamStatus};
use serde_json::{json, Value};
use std::fmt;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

const MAX_ATTEMPTS: u32 = 4;

#[derive(Debug, Clone, PartialEq)]
pub enum UpstreamError {
    /// No answer: connect failure, timeout, cut connection. `sent` is false only when the
    /// request provably never reached the service (the connection was not established).
    Network { timed_out: bool, sent: bool },
    /// The service answered with an error envelope.
    Api { code: String, message: String },
    /// The answer could not be understood.
    Protocol(String),
}

impl UpstreamError {
    /// Worth trying again later (the task stays as it is).
    pub fn is_transient(&self) -> bool {
        match self {
            UpstreamError::Network { .. } | UpstreamError::Protocol(_) => true,
            UpstreamError::Api { code, .. } => {
                code.starts_with("RequestLimitExceeded")
                    || code.starts_with("InternalError")
                    || code.starts_with("ResourceUnavailable")
                    || code.starts_with("AuthFailure")
            }
        }
    }

    /// The client's fault (a 400 on submission).
    pub fn is_invalid_request(&self) -> bool {
        matches!(self, UpstreamError::Api { code, .. }
            if code.starts_with("InvalidParameter") || code.starts_with("MissingParameter")
                || code.starts_with("FailedOperation") || code.starts_with("UnsupportedOperation"))
    }

    pub fn as_task_error(&self) -> TaskError {
        match self {
            UpstreamError::Api { code, message } => TaskError::new(code, message.clone()),
            UpstreamError::Network { .. } => TaskError::new("upstream_unavailable", "The video service could not be reached."),
            UpstreamError::Protocol(_) => TaskError::new("upstream_error", "The video service sent an unreadable answer."),
        }
    }
}

impl fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UpstreamError::Network { timed_out: true, .. } => write!(f, "video service timed out"),
            UpstreamError::Network { timed_out: false, sent: false } => write!(f, "video service unreachable"),
            UpstreamError::Network { timed_out: false, sent: true } => write!(f, "video service connection lost"),
            UpstreamError::Api { code, message } => write!(f, "{code}: {message}"),
            UpstreamError::Protocol(what) => write!(f, "unreadable answer: {what}"),
        }
    }
}

/// A job as a describe call reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct JobState {
    pub status: UpstreamStatus,
    pub progress: Option<u8>,
    pub url: Option<String>,
    pub error: Option<TaskError>,
}

/// Evenly spaced permits: at most `rate` requests per second for the whole process.
struct RateLimiter {
    interval: Duration,
    next: Mutex<Instant>,
}

impl RateLimiter {
    fn new(rate_per_sec: u32) -> Self {
        RateLimiter { interval: Duration::from_secs(1) / rate_per_sec.max(1), next: Mutex::new(Instant::now()) }
    }

    async fn acquire(&self) {
        let slot = {
            let mut next = self.next.lock().await;
            let now = Instant::now();
            let slot = (*next).max(now);
            *next = slot + self.interval;
            slot
        };
        tokio::time::sleep_until(slot.into()).await;
    }
}

pub struct VideoUpstream {
    cfg: VideoConfig,
    url: String,
    host: String,
    service: String,
    http: reqwest::Client,
    limiter: RateLimiter,
}

fn now_unix() -> u64 {
    crate::base::clock::now_unix()
}

impl VideoUpstream {
    pub fn new(cfg: VideoConfig) -> Result<Self, String> {
        let base = &cfg.base_url;
        let scheme = if base.tls { "https" } else { "http" };
        let host = base.host_header();
        let url = format!("{scheme}://{host}/");
        let service = base.host.split('.').next().unwrap_or_default().to_string();
        let roots = match &cfg.ca_pem {
            Some(pem) => reqwest::Certificate::from_pem_bundle(pem.as_bytes()).map_err(|e| format!("video.upstream.ca_file: {e}"))?,
            None => Vec::new(),
        };
        let http = crate::base::outbound::Outbound {
            total: Some(Duration::from_secs(cfg.timeout_secs)),
            connect: Some(Duration::from_secs(cfg.timeout_secs.min(10))),
            roots,
            ..Default::default()
        }
        .client()
        .map_err(|e| format!("video client: {e}"))?;
        let limiter = RateLimiter::new(cfg.rate_per_sec);
        Ok(VideoUpstream { cfg, url, host, service, http, limiter })
    }

    pub fn submit_action(&self, cap: Capability) -> String {
        format!("Submit{}{}Job", cap.action_part(), self.cfg.brand)
    }

    pub fn describe_action(&self, cap: Capability) -> String {
        format!("Describe{}{}Job", cap.action_part(), self.cfg.brand)
    }

    /// One signed call, without retries.
    async fn call_once(&self, action: &str, payload: &[u8]) -> Result<Value, UpstreamError> {
        self.limiter.acquire().await;
        let timestamp = now_unix();
        let auth = tc3::authorization(&tc3::SignInput {
            secret_id: &self.cfg.secret_id,
            secret_key: &self.cfg.secret_key,
            host: &self.host,
            service: &self.service,
            timestamp,
            payload,
            action: Some(action),
        });
        let resp = self
            .http
            .post(&self.url)
            .header("content-type", tc3::CONTENT_TYPE)
            .header("host", &self.host)
            .header("x-tc-action", action)
            .header("x-tc-version", &self.cfg.version)
            .header("x-tc-timestamp", timestamp.to_string())
            .header("x-tc-region", &self.cfg.region)
            .header("authorization", auth)
            .body(payload.to_vec())
            .send()
            .await
            .map_err(|e| UpstreamError::Network { timed_out: e.is_timeout(), sent: !e.is_connect() })?;
        let status = resp.status();
        let body = resp.bytes().await.map_err(|e| UpstreamError::Network { timed_out: e.is_timeout(), sent: true })?;
        let v: Value = serde_json::from_slice(&body).map_err(|_| UpstreamError::Protocol(format!("HTTP {status}, body is not JSON")))?;
        let response = v.get("Response").cloned().ok_or_else(|| UpstreamError::Protocol("no Response object".into()))?;
        if let Some(err) = response.get("Error") {
            return Err(UpstreamError::Api {
                code: err.get("Code").and_then(Value::as_str).unwrap_or("UnknownError").to_string(),
                message: err.get("Message").and_then(Value::as_str).unwrap_or_default().to_string(),
            });
        }
        Ok(response)
    }

    /// A call with retries and exponential backoff on throttling and on network errors — for a
    /// call that is not `idempotent` (a submission creates a paid job), only on those that
    /// prove the request never reached the service.
    pub async fn call(&self, action: &str, payload: &Value, idempotent: bool) -> Result<Value, UpstreamError> {
        let body = serde_json::to_vec(payload).map_err(|e| UpstreamError::Protocol(e.to_string()))?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.call_once(action, &body).await {
                Err(e) if attempt < MAX_ATTEMPTS && retryable(&e, idempotent) => {
                    let backoff = Duration::from_millis(200 * 2u64.pow(attempt - 1));
                    log::warn!("video {action}: {e}; retrying in {backoff:?}");
                    tokio::time::sleep(backoff).await;
                }
                other => return other,
            }
        }
    }

    /// Submit a job; its upstream id.
    pub async fn submit(&self, cap: Capability, payload: &serde_json::Map<String, Value>) -> Result<String, UpstreamError> {
        let resp = self.call(&self.submit_action(cap), &Value::Object(payload.clone()), false).await?;
        resp.get("JobId")
            .and_then(Value::as_str)
            .filter(|j| !j.is_empty())
            .map(str::to_string)
            .ok_or_else(|| UpstreamError::Protocol("submit answer without JobId".into()))
    }

    pub async fn describe(&self, cap: Capability, job_id: &str) -> Result<JobState, UpstreamError> {
        let resp = self.call(&self.describe_action(cap), &json!({"JobId": job_id}), true).await?;
        parse_describe(&resp)
    }
}

/// Worth another attempt now. A throttling answer means the request was not processed; a
/// network error after the request was sent may hide a processed one, so only an
/// `idempotent` call is sent again.
fn retryable(e: &UpstreamError, idempotent: bool) -> bool {
    match e {
        UpstreamError::Network { sent, .. } => idempotent || !sent,
        UpstreamError::Api { code, .. } => code.starts_with("RequestLimitExceeded"),
        UpstreamError::Protocol(_) => false,
    }
}

/// Read a describe answer's `Response` object.
pub fn parse_describe(resp: &Value) -> Result<JobState, UpstreamError> {
    let status_text = resp.get("Status").and_then(Value::as_str).unwrap_or_default();
    let status =
        UpstreamStatus::parse(status_text).ok_or_else(|| UpstreamError::Protocol(format!("unknown job Status '{status_text}'")))?;
    let text = |k: &str| resp.get(k).and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_string);
    let error = match (text("ErrorCode"), text("ErrorMessage")) {
        (None, None) => None,
        (code, message) => Some(TaskError::new(
            code.as_deref().unwrap_or("generation_failed"),
            message.unwrap_or_else(|| "The video service reported the task as failed.".into()),
        )),
    };
    Ok(JobState {
        status,
        progress: resp.get("Progress").and_then(Value::as_u64).map(|p| p.min(100) as u8),
        url: text("ResultVideoUrl"),
        error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describe_answers() {
        let s = parse_describe(&json!({"Status": "DONE", "ResultVideoUrl": "https://x/v.mp4", "RequestId": "r"})).expect("ok");
        assert_eq!(s.status, UpstreamStatus::Done);
        assert_eq!(s.url.as_deref(), Some("https://x/v.mp4"));
        let s = parse_describe(&json!({"Status": "FAIL", "ErrorCode": "FailedOperation.Moderation", "ErrorMessage": "no"})).expect("ok");
        assert_eq!(s.error, Some(TaskError::new("FailedOperation.Moderation", "no")));
        let s = parse_describe(&json!({"Status": "RUN", "Progress": 30})).expect("ok");
        assert_eq!(s.progress, Some(30));
        assert!(parse_describe(&json!({"Status": "LOST"})).is_err());
    }

    #[test]
    fn error_classes() {
        let api = |c: &str| UpstreamError::Api { code: c.into(), message: String::new() };
        assert!(retryable(&api("RequestLimitExceeded"), false));
        assert!(!retryable(&api("InvalidParameterValue"), true));
        // A submission is sent again only when it provably did not arrive.
        assert!(retryable(&UpstreamError::Network { timed_out: false, sent: false }, false));
        assert!(!retryable(&UpstreamError::Network { timed_out: true, sent: true }, false));
        assert!(!retryable(&UpstreamError::Network { timed_out: false, sent: true }, false));
        assert!(retryable(&UpstreamError::Network { timed_out: true, sent: true }, true));
        assert!(api("InvalidParameterValue.Image").is_invalid_request());
        assert!(!api("ResourceNotFound.JobNotExist").is_transient());
        assert!(api("InternalError").is_transient());
        assert!(UpstreamError::Network { timed_out: true, sent: true }.is_transient());
    }

    #[tokio::test]
    async fn rate_limiter_spaces_permits() {
        let limiter = RateLimiter::new(50);
        let start = Instant::now();
        for _ in 0..6 {
            limiter.acquire().await;
        }
        // Six permits at 50/s need at least five 20 ms intervals.
        assert!(start.elapsed() >= Duration::from_millis(100));
    }
}
