//! The event streams a client reads (chat, messages, responses, generate-content, a realtime
//! session's frames): where an event ends, its data, where its text delta is, the event again
//! with new data, and the error event that ends a stream. Read by the output guardrails, the
//! local ones ([`super::stream`]) and those a service reads ([`super::segments`]).

use crate::protocol::ApiError;
use serde_json::{json, Value};

/// The event stream a client reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Chat,
    Messages,
    Responses,
    Gemini,
    /// A realtime session's server events (each a WebSocket frame's JSON, fed as an event).
    Realtime,
}

/// Where an event's text delta is.
pub(super) struct Spot {
    pub(super) channel: u32,
    pub(super) pointer: String,
    pub(super) text: String,
    pub(super) changed: bool,
    /// No match may be under way in its text: it may go.
    pub(super) safe: bool,
}

/// The end of the first whole event in `buf` (after its blank line).
pub(super) fn event_end(buf: &[u8]) -> Option<usize> {
    let lf = memchr::memmem::find(buf, b"\n\n").map(|i| i + 2);
    let crlf = memchr::memmem::find(buf, b"\r\n\r\n").map(|i| i + 4);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The `data:` of an event (one line; the protocols here send one).
pub(super) fn data_of(raw: &[u8]) -> Option<&[u8]> {
    raw.split(|b| *b == b'\n').find_map(|line| line.strip_prefix(b"data:")).map(|d| d.trim_ascii())
}

/// The event with its `data:` replaced by `data`'s JSON, its other lines kept.
pub(super) fn rewrite(raw: &[u8], data: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len() + 16);
    for line in raw.split(|b| *b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            continue;
        }
        if line.starts_with(b"data:") {
            out.extend_from_slice(b"data: ");
            out.extend(serde_json::to_vec(data).unwrap_or_default());
        } else {
            out.extend_from_slice(line);
        }
        out.push(b'\n');
    }
    out.push(b'\n');
    out
}

/// Whether a responses event repeats a whole text (a part, an item, the response done).
pub(super) fn completes(v: &Value) -> bool {
    v["type"]
        .as_str()
        .is_some_and(|t| t.ends_with(".done") || matches!(t, "response.completed" | "response.incomplete" | "response.failed"))
}

/// Where a dialect's event carries a text delta.
pub(super) fn spot(dialect: Dialect, v: &Value) -> Option<Spot> {
    let at = |channel: u32, pointer: String| {
        let text = v.pointer(&pointer)?.as_str()?;
        (!text.is_empty()).then(|| Spot { channel, pointer, text: text.to_string(), changed: false, safe: false })
    };
    match dialect {
        Dialect::Chat => {
            let choices = v["choices"].as_array()?;
            choices.iter().enumerate().find_map(|(i, c)| {
                let index = c["index"].as_u64().unwrap_or(i as u64) as u32;
                at(index * 1024, format!("/choices/{i}/delta/content")).or_else(|| {
                    let calls = c["delta"]["tool_calls"].as_array()?;
                    calls.iter().enumerate().find_map(|(j, call)| {
                        let k = call["index"].as_u64().unwrap_or(j as u64) as u32;
                        at(index * 1024 + 1 + k, format!("/choices/{i}/delta/tool_calls/{j}/function/arguments"))
                    })
                })
            })
        }
        Dialect::Messages => {
            if v["type"] != "content_block_delta" {
                return None;
            }
            let index = v["index"].as_u64().unwrap_or(0) as u32;
            ["text", "partial_json", "thinking"].iter().find_map(|f| at(index, format!("/delta/{f}")))
        }
        Dialect::Responses | Dialect::Realtime => {
            let t = v["type"].as_str()?;
            // A realtime session's audio deltas are audio, not text.
            if !t.ends_with(".delta") || t.ends_with("audio.delta") {
                return None;
            }
            let channel = (v["output_index"].as_u64().unwrap_or(0) * 1024 + v["content_index"].as_u64().unwrap_or(0)) as u32;
            at(channel, "/delta".to_string())
        }
        Dialect::Gemini => {
            let candidates = v["candidates"].as_array()?;
            candidates.iter().enumerate().find_map(|(i, c)| {
                let parts = c["content"]["parts"].as_array()?;
                parts.iter().enumerate().find_map(|(j, _)| at(i as u32, format!("/candidates/{i}/content/parts/{j}/text")))
            })
        }
    }
}

/// `err` as the event that ends a stream in `dialect`: chat's error chunk, messages'
/// `event: error`, generate-content's error object, responses' `response.failed`.
pub fn error_event(dialect: Dialect, err: &ApiError, model: &str) -> Vec<u8> {
    use crate::config::Protocol;
    let (event, data) = match dialect {
        Dialect::Realtime => {
            let body = serde_json::from_slice::<Value>(&err.body(Protocol::Openai)).unwrap_or(Value::Null);
            let error = json!({"type": "invalid_request_error", "code": body["error"]["code"], "message": body["error"]["message"]});
            (
                None,
                json!({"type": "error", "event_id": format!("event_tollgate_{}", crate::base::secrets::random_base62(16)), "error": error}),
            )
        }
        Dialect::Chat => (None, serde_json::from_slice::<Value>(&err.body(Protocol::Openai)).unwrap_or(Value::Null)),
        Dialect::Messages => (Some("error"), serde_json::from_slice::<Value>(&err.body(Protocol::Anthropic)).unwrap_or(Value::Null)),
        Dialect::Gemini => (None, serde_json::from_slice::<Value>(&err.body(Protocol::Gemini)).unwrap_or(Value::Null)),
        Dialect::Responses => {
            let body = serde_json::from_slice::<Value>(&err.body(Protocol::Openai)).unwrap_or(Value::Null);
            let response = json!({
                "id": format!("resp_{}", crate::base::secrets::random_base62(24)),
                "object": "response",
                "created_at": crate::base::clock::now_ms() / 1000,
                "model": model,
                "status": "failed",
                "error": {"code": body["error"]["code"], "message": body["error"]["message"]},
                "incomplete_details": null,
                "output": [],
                "parallel_tool_calls": false,
                "tool_choice": "auto",
                "tools": [],
            });
            (Some("response.failed"), json!({"type": "response.failed", "response": response}))
        }
    };
    let mut out = Vec::new();
    if let Some(event) = event {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(event.as_bytes());
        out.push(b'\n');
    }
    out.extend_from_slice(b"data: ");
    out.extend(serde_json::to_vec(&data).unwrap_or_default());
    out.extend_from_slice(b"\n\n");
    out
}
