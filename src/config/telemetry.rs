//! Where spans go and how many: `telemetry.otlp` in the configuration file, then the standard
//! OpenTelemetry environment variables for whatever the file leaves out.
//!
//! * On when the file has `telemetry.otlp`, or `OTEL_EXPORTER_OTLP_ENDPOINT` /
//!   `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set; off with `OTEL_SDK_DISABLED=true` or
//!   `OTEL_TRACES_EXPORTER=none`.
//! * `endpoint` is the collector's base URL, like `OTEL_EXPORTER_OTLP_ENDPOINT`: over
//!   http/protobuf the spans go to its path + `/v1/traces`; `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
//!   is used as written. Defaults: `http://localhost:4318` (http/protobuf), `:4317` (grpc).
//! * `protocol`: `http/protobuf` (default) or `grpc` (`OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL`).
//! * `headers`: sent with every export, over `OTEL_EXPORTER_OTLP[_TRACES]_HEADERS`.
//! * `sample_ratio` (0 to 1, default 1): the share of new traces recorded; a client's trace
//!   follows the client's decision (`OTEL_TRACES_SAMPLER_ARG`).
//! * From the environment only: `OTEL_EXPORTER_OTLP[_TRACES]_TIMEOUT` (ms, 10000),
//!   `OTEL_BSP_SCHEDULE_DELAY` (ms, 5000), `OTEL_BSP_MAX_QUEUE_SIZE` (2048),
//!   `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` (512), `OTEL_SERVICE_NAME` (`tollgate`),
//!   `OTEL_RESOURCE_ATTRIBUTES`.

use super::{err, ConfigError};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// `telemetry:` as written in the file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTelemetry {
    #[serde(default)]
    pub otlp: Option<RawOtlp>,
    /// The most bytes of encoded spans waiting for the collector (beside the span count).
    #[serde(default)]
    pub max_queue_bytes: Option<u64>,
}

/// `telemetry:` and the `OTEL_*` variables; None: traces off.
pub(super) fn telemetry(raw: Option<&RawTelemetry>, env: &dyn Fn(&str) -> Option<String>) -> Result<Option<Settings>, ConfigError> {
    let mut otlp = resolve(raw.and_then(|t| t.otlp.as_ref()), env).map_err(ConfigError)?;
    if let (Some(settings), Some(bytes)) = (otlp.as_mut(), raw.and_then(|t| t.max_queue_bytes)) {
        if !(1 << 16..=1 << 32).contains(&bytes) {
            return err("telemetry.max_queue_bytes: 65536 to 4294967296");
        }
        settings.max_queue_bytes = bytes as usize;
    }
    Ok(otlp)
}

/// `telemetry.max_queue_bytes` when not set: spans past it are dropped and counted.
pub const DEFAULT_MAX_QUEUE_BYTES: usize = 16 << 20;

/// `telemetry.otlp:` as written in the file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOtlp {
    #[serde(default)]
    pub endpoint: Option<String>,
    #[serde(default)]
    pub protocol: Option<String>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub sample_ratio: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    HttpProtobuf,
    Grpc,
}

/// The exporter's settings, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// http/protobuf: the URL spans are posted to; grpc: the collector's base URL.
    pub endpoint: String,
    pub protocol: Transport,
    pub headers: Vec<(String, String)>,
    pub sample_ratio: f64,
    pub timeout: Duration,
    pub schedule_delay: Duration,
    pub max_queue: usize,
    /// The queue's bound in bytes (`telemetry.max_queue_bytes`): a slow collector holds at most this.
    pub max_queue_bytes: usize,
    pub max_export_batch: usize,
    /// The resource's attributes (`service.name`, `service.version`, `OTEL_RESOURCE_ATTRIBUTES`).
    pub resource: Vec<(String, String)>,
}

/// The settings, or None when traces are off. `env` reads a variable (the process's
/// environment outside tests).
pub fn resolve(raw: Option<&RawOtlp>, env: &dyn Fn(&str) -> Option<String>) -> Result<Option<Settings>, String> {
    let var = |name: &str| env(name).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
    let either = |specific: &str, general: &str| var(specific).or_else(|| var(general));
    if var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
        || var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"))
    {
        return Ok(None);
    }
    let traces_endpoint = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    let base_endpoint = var("OTEL_EXPORTER_OTLP_ENDPOINT");
    if raw.is_none() && traces_endpoint.is_none() && base_endpoint.is_none() {
        return Ok(None);
    }
    let (protocol, from) = match raw.and_then(|r| r.protocol.clone()) {
        Some(p) => (Some(p), "telemetry.otlp.protocol"),
        None => (either("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"), "OTEL_EXPORTER_OTLP_PROTOCOL"),
    };
    let protocol = match protocol.as_deref() {
        None | Some("http/protobuf") => Transport::HttpProtobuf,
        Some("grpc") => Transport::Grpc,
        Some(other) => return Err(format!("{from}: '{other}' is not supported; use http/protobuf or grpc")),
    };
    // The file's endpoint is a base URL; the traces variable a full one.
    let (endpoint, full) = match (raw.and_then(|r| r.endpoint.clone()), traces_endpoint, base_endpoint) {
        (Some(e), _, _) => (e, false),
        (None, Some(e), _) => (e, true),
        (None, None, Some(e)) => (e, false),
        (None, None, None) => {
            (if protocol == Transport::Grpc { "http://localhost:4317" } else { "http://localhost:4318" }.to_string(), false)
        }
    };
    let shown = crate::base::text::redact_url(&endpoint);
    let url = reqwest::Url::parse(&endpoint).map_err(|e| format!("telemetry.otlp.endpoint: '{shown}' is not a URL ({e})"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(format!("telemetry.otlp.endpoint: '{shown}' must be an http:// or https:// URL with a host"));
    }
    let endpoint = match protocol {
        Transport::HttpProtobuf if !full => format!("{}/v1/traces", endpoint.trim_end_matches('/')),
        _ => endpoint,
    };
    let mut headers = Vec::new();
    for (name, value) in key_values(&var("OTEL_EXPORTER_OTLP_HEADERS").unwrap_or_default())
        .into_iter()
        .chain(key_values(&var("OTEL_EXPORTER_OTLP_TRACES_HEADERS").unwrap_or_default()))
        .chain(raw.map(|r| r.headers.clone()).unwrap_or_default())
    {
        let name = name.to_ascii_lowercase();
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() || http::HeaderValue::from_str(&value).is_err() {
            return Err(format!("telemetry.otlp.headers: '{name}' is not a valid header"));
        }
        headers.retain(|(n, _): &(String, String)| n != &name);
        headers.push((name, value));
    }
    let sample_ratio = match raw.and_then(|r| r.sample_ratio) {
        Some(r) => r,
        None => match (var("OTEL_TRACES_SAMPLER").as_deref(), var("OTEL_TRACES_SAMPLER_ARG")) {
            (None | Some("traceidratio" | "parentbased_traceidratio"), Some(arg)) => {
                arg.parse().map_err(|_| format!("OTEL_TRACES_SAMPLER_ARG: '{arg}' is not a number"))?
            }
            (Some("always_off" | "parentbased_always_off"), _) => 0.0,
            _ => 1.0,
        },
    };
    if !(0.0..=1.0).contains(&sample_ratio) {
        return Err(format!("telemetry.otlp.sample_ratio: {sample_ratio} is not between 0 and 1"));
    }
    let number = |name: &str, default: u64, max: u64| -> Result<u64, String> {
        match var(name) {
            None => Ok(default),
            Some(v) => {
                v.parse::<u64>().ok().filter(|n| (1..=max).contains(n)).ok_or(format!("{name}: '{v}' is not a number from 1 to {max}"))
            }
        }
    };
    let timeout_ms = match var("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") {
        Some(_) => number("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", 10_000, 600_000)?,
        None => number("OTEL_EXPORTER_OTLP_TIMEOUT", 10_000, 600_000)?,
    };
    let max_queue = number("OTEL_BSP_MAX_QUEUE_SIZE", 2048, 1 << 20)? as usize;
    let max_export_batch = (number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512, 1 << 20)? as usize).min(max_queue);
    let mut resource = vec![("service.name".to_string(), "tollgate".to_string())];
    for (k, v) in key_values(&var("OTEL_RESOURCE_ATTRIBUTES").unwrap_or_default()) {
        resource.retain(|(n, _)| n != &k);
        resource.push((k, v));
    }
    if let Some(name) = var("OTEL_SERVICE_NAME") {
        resource.retain(|(n, _)| n != "service.name");
        resource.push(("service.name".to_string(), name));
    }
    resource.push(("service.version".to_string(), env!("CARGO_PKG_VERSION").to_string()));
    Ok(Some(Settings {
        endpoint,
        protocol,
        headers,
        sample_ratio,
        timeout: Duration::from_millis(timeout_ms),
        schedule_delay: Duration::from_millis(number("OTEL_BSP_SCHEDULE_DELAY", 5000, 3_600_000)?),
        max_queue,
        max_queue_bytes: DEFAULT_MAX_QUEUE_BYTES,
        max_export_batch,
        resource,
    }))
}

/// `k1=v1,k2=v2` with percent-encoded values (the OTEL_*_HEADERS and OTEL_RESOURCE_ATTRIBUTES
/// form); pairs without `=` are skipped.
fn key_values(text: &str) -> Vec<(String, String)> {
    text.split(',')
        .filter_map(|pair| pair.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), percent_decoded(v.trim())))
        .filter(|(k, _)| !k.is_empty())
        .collect()
}

fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1).copied().and_then(hex), bytes.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(hi), Some(lo)) => {
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: BTreeMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |name| vars.get(name).cloned()
    }

    #[test]
    fn off_unless_the_file_or_an_endpoint_variable_asks() {
        assert_eq!(resolve(None, &with(&[])).unwrap(), None);
        assert_eq!(resolve(None, &with(&[("OTEL_EXPORTER_OTLP_HEADERS", "a=b")])).unwrap(), None);
        let on = resolve(Some(&RawOtlp::default()), &with(&[])).unwrap().unwrap();
        assert_eq!((on.endpoint.as_str(), on.protocol, on.sample_ratio), ("http://localhost:4318/v1/traces", Transport::HttpProtobuf, 1.0));
        assert_eq!(resolve(Some(&RawOtlp::default()), &with(&[("OTEL_SDK_DISABLED", "true")])).unwrap(), None);
        let env = resolve(None, &with(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/otlp/")])).unwrap().unwrap();
        assert_eq!(env.endpoint, "http://c:4318/otlp/v1/traces");
        let exact = resolve(None, &with(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:9/in")])).unwrap().unwrap();
        assert_eq!(exact.endpoint, "http://c:9/in");
    }

    #[test]
    fn the_file_wins_and_the_environment_fills_in() {
        let raw = RawOtlp {
            endpoint: Some("http://collector:4317".into()),
            protocol: Some("grpc".into()),
            headers: [("X-Token".to_string(), "file".to_string())].into(),
            sample_ratio: Some(0.25),
        };
        let env = with(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://other:1"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-token=env,x-tenant=a%20b"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.5"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
            ("OTEL_SERVICE_NAME", "edge-1"),
            ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod,service.name=ignored"),
        ]);
        let s = resolve(Some(&raw), &env).unwrap().unwrap();
        assert_eq!((s.endpoint.as_str(), s.protocol, s.sample_ratio), ("http://collector:4317", Transport::Grpc, 0.25));
        assert_eq!(s.headers, vec![("x-tenant".to_string(), "a b".to_string()), ("x-token".to_string(), "file".to_string())]);
        assert_eq!(s.timeout, Duration::from_millis(2500));
        assert!(s.resource.contains(&("service.name".into(), "edge-1".into())));
        assert!(s.resource.contains(&("deployment.environment".into(), "prod".into())));
        assert!(!s.resource.contains(&("service.name".into(), "ignored".into())));
    }

    #[test]
    fn bad_settings_are_named() {
        let bad = |raw: RawOtlp, vars: &[(&str, &str)]| resolve(Some(&raw), &with(vars)).unwrap_err();
        assert!(bad(RawOtlp { protocol: Some("http/json".into()), ..Default::default() }, &[]).contains("http/protobuf or grpc"));
        assert!(bad(RawOtlp { endpoint: Some("collector:4318".into()), ..Default::default() }, &[]).contains("telemetry.otlp.endpoint"));
        assert!(bad(RawOtlp { sample_ratio: Some(1.5), ..Default::default() }, &[]).contains("sample_ratio"));
        assert!(bad(RawOtlp { headers: [("bad name".to_string(), "v".to_string())].into(), ..Default::default() }, &[]).contains("headers"));
        assert!(bad(RawOtlp::default(), &[("OTEL_BSP_MAX_QUEUE_SIZE", "lots")]).contains("OTEL_BSP_MAX_QUEUE_SIZE"));
    }
}
