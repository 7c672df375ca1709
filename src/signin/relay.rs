//! The telemetry relay: Claude Code's OTLP/HTTP exports (`POST /v1/logs|metrics|traces`, with
//! the person's token) sent on to the configured collector with the person added to every
//! resource (`enduser.id`, `user.email`, `tollgate.team`), without the client ever waiting on
//! the collector: an export is answered 200 once read, and sent from a task of its own. What
//! waits to be sent is bounded (bytes in flight); past that, exports are dropped and counted.
//!
//! The person is added without decoding the export: in protobuf, every `Resource<Signal>`
//! (field 1 of the request) gets a second `resource` field (1) holding the attributes, which
//! protobuf merges into the first (a repeated field's items append); in JSON, the attributes are
//! appended to each `resource.attributes`. A gzipped export is opened (bounded) to do so.

use crate::config::claude_code::ClaudeCodeConfig;
use bytes::Bytes;
use std::io::Read;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The most bytes of exports waiting for the collector at once.
const MAX_IN_FLIGHT: usize = 32 << 20;

/// The three signals and their resource lists in JSON.
pub fn resource_list(signal: &str) -> Option<&'static str> {
    match signal {
        "logs" => Some("resourceLogs"),
        "metrics" => Some("resourceMetrics"),
        "traces" => Some("resourceSpans"),
        _ => None,
    }
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn read_varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*at)?;
        *at += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

fn len_field(field: u64, payload: &[u8], out: &mut Vec<u8>) {
    varint(field << 3 | 2, out);
    varint(payload.len() as u64, out);
    out.extend_from_slice(payload);
}

/// A `Resource` message holding `attrs` (string values).
fn resource_bytes(attrs: &[(&str, String)]) -> Vec<u8> {
    let mut resource = Vec::new();
    for (k, v) in attrs {
        let mut any = Vec::new();
        len_field(1, v.as_bytes(), &mut any);
        let mut kv = Vec::new();
        len_field(1, k.as_bytes(), &mut kv);
        len_field(2, &any, &mut kv);
        len_field(1, &kv, &mut resource);
    }
    resource
}

/// A protobuf export with `attrs` added to each resource; None when it is not well formed.
pub fn add_to_protobuf(body: &[u8], attrs: &[(&str, String)]) -> Option<Vec<u8>> {
    let resource = resource_bytes(attrs);
    let mut extra = Vec::new();
    len_field(1, &resource, &mut extra);
    let mut out = Vec::with_capacity(body.len() + 64);
    let mut at = 0;
    while at < body.len() {
        let start = at;
        let tag = read_varint(body, &mut at)?;
        match tag & 7 {
            0 => {
                read_varint(body, &mut at)?;
            }
            1 => at = at.checked_add(8).filter(|e| *e <= body.len())?,
            5 => at = at.checked_add(4).filter(|e| *e <= body.len())?,
            2 => {
                let len = usize::try_from(read_varint(body, &mut at)?).ok()?;
                let end = at.checked_add(len).filter(|e| *e <= body.len())?;
                if tag >> 3 == 1 {
                    let mut payload = body[at..end].to_vec();
                    payload.extend_from_slice(&extra);
                    len_field(1, &payload, &mut out);
                    at = end;
                    continue;
                }
                at = end;
            }
            _ => return None,
        }
        out.extend_from_slice(&body[start..at]);
    }
    Some(out)
}

/// A JSON export with `attrs` added to each resource; None when it is not one.
pub fn add_to_json(body: &[u8], signal: &str, attrs: &[(&str, String)]) -> Option<Vec<u8>> {
    let mut v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let list = v.get_mut(resource_list(signal)?)?.as_array_mut()?;
    for item in list {
        let obj = item.as_object_mut()?;
        let resource = obj.entry("resource").or_insert_with(|| serde_json::json!({}));
        let attributes = resource.as_object_mut()?.entry("attributes").or_insert_with(|| serde_json::json!([]));
        let attributes = attributes.as_array_mut()?;
        for (k, val) in attrs {
            attributes.push(serde_json::json!({"key": k, "value": {"stringValue": val}}));
        }
    }
    serde_json::to_vec(&v).ok()
}

/// Sends exports on to the collector.
pub struct Relay {
    endpoint: Option<String>,
    headers: Vec<(String, String)>,
    pub max_bytes: usize,
    client: reqwest::Client,
    in_flight: Arc<AtomicUsize>,
}

/// What became of an export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relayed {
    Sent,
    /// No collector is configured: answered and dropped.
    Discarded,
    /// Too much waits for the collector already.
    Dropped,
    /// Not an export this relay can read (its body as the client sent it is not sent on).
    Unreadable,
}

impl Relay {
    pub fn new(cfg: &ClaudeCodeConfig) -> Result<Relay, String> {
        let client = crate::base::outbound::Outbound {
            connect: Some(std::time::Duration::from_secs(5)),
            total: Some(std::time::Duration::from_secs(10)),
            follow_redirects: false,
            ..Default::default()
        }
        .client()
        .map_err(|e| format!("telemetry relay: {e}"))?;
        Ok(Relay {
            endpoint: cfg.telemetry_endpoint.clone(),
            headers: cfg.telemetry_headers.clone(),
            max_bytes: cfg.telemetry_max_bytes,
            client,
            in_flight: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// Relay one export of `signal` (`logs`, `metrics`, `traces`) for the person of `attrs`.
    pub fn relay(&self, signal: &str, body: Bytes, content_type: &str, encoding: Option<&str>, attrs: &[(&str, String)]) -> Relayed {
        let Some(endpoint) = &self.endpoint else { return Relayed::Discarded };
        let raw = match encoding.map(str::to_ascii_lowercase).as_deref() {
            None | Some("identity") => body.to_vec(),
            Some("gzip") => {
                let mut out = Vec::new();
                let limit = u64::try_from(self.max_bytes).unwrap_or(u64::MAX) + 1;
                if flate2::read::GzDecoder::new(&body[..]).take(limit).read_to_end(&mut out).is_err() || out.len() > self.max_bytes {
                    return Relayed::Unreadable;
                }
                out
            }
            Some(_) => return Relayed::Unreadable,
        };
        let json = content_type.to_ascii_lowercase().starts_with("application/json");
        let added = if json { add_to_json(&raw, signal, attrs) } else { add_to_protobuf(&raw, attrs) };
        let Some(payload) = added else { return Relayed::Unreadable };
        let size = payload.len();
        if self.in_flight.fetch_add(size, Ordering::AcqRel) + size > MAX_IN_FLIGHT {
            self.in_flight.fetch_sub(size, Ordering::AcqRel);
            return Relayed::Dropped;
        }
        let mut req = self
            .client
            .post(format!("{endpoint}/v1/{signal}"))
            .header("content-type", if json { "application/json" } else { "application/x-protobuf" });
        for (k, v) in &self.headers {
            req = req.header(k.as_str(), v.as_str());
        }
        let in_flight = self.in_flight.clone();
        let signal = signal.to_string();
        tokio::spawn(async move {
            match req.body(payload).send().await {
                Ok(r) if r.status().is_success() => {}
                Ok(r) => log::warn!("telemetry relay: the collector answered {} to an export of {signal}", r.status()),
                Err(e) => log::warn!("telemetry relay: the collector could not be reached: {e}"),
            }
            in_flight.fetch_sub(size, Ordering::AcqRel);
        });
        Relayed::Sent
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads a message's fields: (number, wire type, payload of a LEN field).
    fn fields(b: &[u8]) -> Vec<(u64, Vec<u8>)> {
        let mut at = 0;
        let mut out = Vec::new();
        while at < b.len() {
            let tag = read_varint(b, &mut at).unwrap();
            assert_eq!(tag & 7, 2);
            let len = read_varint(b, &mut at).unwrap() as usize;
            out.push((tag >> 3, b[at..at + len].to_vec()));
            at += len;
        }
        out
    }

    #[test]
    fn each_resource_of_a_protobuf_export_gets_the_persons_attributes() {
        // ExportLogsServiceRequest { resource_logs: [ { resource: { attributes: [service.name=cc] }, scope_logs: [..] } ×2 ] }
        let original_resource = resource_bytes(&[("service.name", "claude-code".into())]);
        let mut rl = Vec::new();
        len_field(1, &original_resource, &mut rl);
        len_field(2, b"scope-logs-bytes", &mut rl);
        let mut body = Vec::new();
        len_field(1, &rl, &mut body);
        len_field(1, &rl, &mut body);
        let attrs = [("enduser.id", "ada".to_string()), ("tollgate.team", "research".to_string())];
        let out = add_to_protobuf(&body, &attrs).unwrap();
        let top = fields(&out);
        assert_eq!(top.len(), 2);
        for (n, rl) in top {
            assert_eq!(n, 1);
            let inner = fields(&rl);
            // The original resource, the scope logs, then the added resource (merged by protobuf).
            assert_eq!(inner.iter().map(|(n, _)| *n).collect::<Vec<_>>(), [1, 2, 1]);
            assert_eq!(inner[1].1, b"scope-logs-bytes");
            let added: Vec<(u64, Vec<u8>)> = fields(&inner[2].1);
            let keys: Vec<String> = added.iter().map(|(_, kv)| String::from_utf8(fields(kv)[0].1.clone()).unwrap()).collect();
            assert_eq!(keys, ["enduser.id", "tollgate.team"]);
        }
        assert_eq!(add_to_protobuf(&[0x0a, 0x05, 0x01], &attrs), None, "a length past the end");
    }

    #[test]
    fn each_resource_of_a_json_export_gets_them_too() {
        let body = br#"{"resourceMetrics":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"claude-code"}}]},"scopeMetrics":[]},{"scopeMetrics":[]}]}"#;
        let out = add_to_json(body, "metrics", &[("enduser.id", "ada".into())]).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["resourceMetrics"][0]["resource"]["attributes"][1]["key"], "enduser.id");
        assert_eq!(v["resourceMetrics"][1]["resource"]["attributes"][0]["value"]["stringValue"], "ada");
        assert_eq!(add_to_json(b"[]", "metrics", &[]), None);
    }
}
