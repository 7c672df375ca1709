//! The request log: one compact entry per request of the public listener that reached a key
//! check — relayed, refused or failed — with who, what, how it ended and what it cost; never a
//! prompt or an answer. Entries are written off the request path (queued to the store's commit
//! writer when the request ends), kept `console.request_log_days` and at most
//! `console.request_log_max` entries, and read back by `GET /admin/requests`.
//!
//! An entry's id is the request's `X-Request-Id` (see `request_id`); an upstream's own request
//! id is kept in the entry (`upstream_request_id`).

use crate::base::codec::{put_signed, put_str, put_varint, Reader};
use serde::{Deserialize, Serialize};

/// One request, as the log keeps it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LogEntry {
    pub id: String,
    /// Unix milliseconds at which the request ended (its answer finished or failed).
    pub time_ms: u64,
    /// The store's number of the entry (a page's position with `time_ms`).
    #[serde(default)]
    pub seq: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub route: String,
    /// The client's protocol (`openai`, `anthropic`, `gemini`, `video`).
    pub protocol: String,
    /// The provider's protocol, when it is not the client's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_protocol: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    pub status: u16,
    /// Why tollgate refused or failed it (`ErrorKind::reason`), and the field it was about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub param: Option<String>,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// nano-USD.
    pub cost_nanos: i64,
    pub estimated: bool,
    pub latency_ms: u64,
    /// From the request's start to the first byte of the answer's body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_byte_ms: Option<u64>,
    pub attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_request_id: Option<String>,
    /// The provider's own name of the model, when it is not the client's (`models: [{name, upstream}]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_model: Option<String>,
    /// The request's and the answer's body bytes, where they are logged (MCP tool calls).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_bytes: Option<u64>,
    /// What guardrails did (`name:phase:action[:categories]`, comma-separated); never what
    /// they found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guardrail: Option<String>,
    /// The models the call left for the next before its first byte, and why (`model:reason`,
    /// comma-separated; the first is the model asked for); `model` is the one that served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallbacks: Option<String>,
    /// What the response cache did (`hit`, `miss`, `bypass`), when it applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<String>,
    /// What a hit saved (nano-USD at the price table).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_saved_nanos: Option<i64>,
}

impl LogEntry {
    pub fn to_json(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        v["object"] = "request".into();
        v["time"] = crate::protocol::rfc3339(self.time_ms / 1000).into();
        v["cost"] = crate::base::money::usd(self.cost_nanos).into();
        v
    }
}

/// An entry as the gateway writes it: [`LogEntry`]'s fields, borrowed from the request's own
/// state, so writing one copies no field (every request writes one; read back, it is a
/// `LogEntry`).
#[derive(Debug, Clone, Copy, Default)]
pub struct LogLine<'a> {
    pub id: &'a str,
    pub time_ms: u64,
    pub seq: u64,
    pub key_id: Option<&'a str>,
    pub key_name: Option<&'a str>,
    pub model: Option<&'a str>,
    pub route: &'a str,
    pub protocol: &'a str,
    pub upstream_protocol: Option<&'a str>,
    pub provider: Option<&'a str>,
    pub status: u16,
    pub refusal: Option<&'a str>,
    pub param: Option<&'a str>,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_nanos: i64,
    pub estimated: bool,
    pub latency_ms: u64,
    pub first_byte_ms: Option<u64>,
    pub attempts: u32,
    pub upstream_request_id: Option<&'a str>,
    pub upstream_model: Option<&'a str>,
    /// Request and answer body bytes (both or neither).
    pub bytes: Option<(u64, u64)>,
    pub guardrail: Option<&'a str>,
    pub fallbacks: Option<&'a str>,
    pub cache: Option<&'a str>,
    pub cache_saved_nanos: Option<i64>,
}

/// The stored form of an entry (a node's own tree): a version byte, then the fields in their
/// order, in the compact form of [`crate::base::codec`] (every request writes one).
/// The whole is length-prefixed (u32, little-endian), so a commit batch's `[e1,e2,…]` framing
/// can be walked without reading inside the entries.
const STORED_VERSION: u8 = 1;

impl LogLine<'_> {
    /// Append the stored form (with its length prefix) to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; 4]);
        out.push(STORED_VERSION);
        put_str(out, Some(self.id));
        put_varint(out, self.time_ms);
        put_varint(out, self.seq);
        for s in [self.key_id, self.key_name, self.model, Some(self.route), Some(self.protocol), self.upstream_protocol, self.provider] {
            put_str(out, s);
        }
        put_varint(out, u64::from(self.status));
        for s in [self.refusal, self.param] {
            put_str(out, s);
        }
        put_varint(out, self.input_tokens);
        put_varint(out, self.output_tokens);
        // Zigzag: a cost is never negative today, but the form does not assume it.
        put_signed(out, self.cost_nanos);
        out.push(u8::from(self.estimated));
        put_varint(out, self.latency_ms);
        put_varint(out, self.first_byte_ms.map_or(0, |n| n.saturating_add(1)));
        put_varint(out, u64::from(self.attempts));
        put_str(out, self.upstream_request_id);
        // Added after the first entries were written: an entry without them ends before them.
        let fell = self.fallbacks.is_some() || self.cache.is_some();
        if self.upstream_model.is_some() || self.bytes.is_some() || self.guardrail.is_some() || fell {
            put_str(out, self.upstream_model);
        }
        // A guardrail's note comes after the bytes, which are then written (0, 0) when there
        // are none (no request has none).
        if self.bytes.is_some() || self.guardrail.is_some() || fell {
            let (sent, answered) = self.bytes.unwrap_or((0, 0));
            put_varint(out, sent);
            put_varint(out, answered);
        }
        if self.guardrail.is_some() || fell {
            put_str(out, self.guardrail);
        }
        if fell {
            put_str(out, self.fallbacks);
        }
        if let Some(cache) = self.cache {
            put_str(out, Some(cache));
            put_signed(out, self.cache_saved_nanos.unwrap_or(0));
        }
        let len = (out.len() - start - 4) as u32;
        out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    }
}

impl LogEntry {
    /// This entry as a [`LogLine`] (to write it).
    pub fn line(&self) -> LogLine<'_> {
        LogLine {
            id: &self.id,
            time_ms: self.time_ms,
            seq: self.seq,
            key_id: self.key_id.as_deref(),
            key_name: self.key_name.as_deref(),
            model: self.model.as_deref(),
            route: &self.route,
            protocol: &self.protocol,
            upstream_protocol: self.upstream_protocol.as_deref(),
            provider: self.provider.as_deref(),
            status: self.status,
            refusal: self.refusal.as_deref(),
            param: self.param.as_deref(),
            input_tokens: self.input_tokens,
            output_tokens: self.output_tokens,
            cost_nanos: self.cost_nanos,
            estimated: self.estimated,
            latency_ms: self.latency_ms,
            first_byte_ms: self.first_byte_ms,
            attempts: self.attempts,
            upstream_request_id: self.upstream_request_id.as_deref(),
            upstream_model: self.upstream_model.as_deref(),
            bytes: self.request_bytes.zip(self.response_bytes),
            guardrail: self.guardrail.as_deref(),
            fallbacks: self.fallbacks.as_deref(),
            cache: self.cache.as_deref(),
            cache_saved_nanos: self.cache_saved_nanos,
        }
    }

    /// Append the stored form (with its length prefix) to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        self.line().encode(out);
    }

    /// One stored entry (without its length prefix); None if it is not one.
    pub fn decode(bytes: &[u8]) -> Option<LogEntry> {
        let (&version, rest) = bytes.split_first()?;
        if version != STORED_VERSION {
            return None;
        }
        let mut r = Reader(rest);
        let id = r.string()??;
        let time_ms = r.varint()?;
        let seq = r.varint()?;
        let (key_id, key_name, model) = (r.string()?, r.string()?, r.string()?);
        let (route, protocol) = (r.string()??, r.string()??);
        let (upstream_protocol, provider) = (r.string()?, r.string()?);
        let status = u16::try_from(r.varint()?).ok()?;
        let (refusal, param) = (r.string()?, r.string()?);
        let (input_tokens, output_tokens) = (r.varint()?, r.varint()?);
        let cost_nanos = r.signed()?;
        let estimated = r.byte()?;
        let latency_ms = r.varint()?;
        let first_byte_ms = r.varint()?.checked_sub(1);
        let attempts = u32::try_from(r.varint()?).ok()?;
        let upstream_request_id = r.string()?;
        let upstream_model = if r.0.is_empty() { None } else { r.string()? };
        let bytes = if r.0.is_empty() { None } else { Some((r.varint()?, r.varint()?)).filter(|b| *b != (0, 0)) };
        let guardrail = if r.0.is_empty() { None } else { r.string()? };
        let fallbacks = if r.0.is_empty() { None } else { r.string()? };
        let cache = if r.0.is_empty() { None } else { r.string()? };
        let cache_saved_nanos = match cache {
            Some(_) => Some(r.signed()?).filter(|n| *n != 0),
            None => None,
        };
        Some(LogEntry {
            id,
            time_ms,
            seq,
            key_id,
            key_name,
            model,
            route,
            protocol,
            upstream_protocol,
            provider,
            status,
            refusal,
            param,
            input_tokens,
            output_tokens,
            cost_nanos,
            estimated: estimated != 0,
            latency_ms,
            first_byte_ms,
            attempts,
            upstream_request_id,
            upstream_model,
            request_bytes: bytes.map(|b| b.0),
            response_bytes: bytes.map(|b| b.1),
            guardrail,
            fallbacks,
            cache,
            cache_saved_nanos,
        })
    }

    /// The entries of one stored batch: `[` entries separated by `,` `]`, each length-prefixed.
    pub fn decode_batch(bytes: &[u8]) -> Vec<LogEntry> {
        stored_entries(bytes)
            .filter_map(|body| {
                let e = LogEntry::decode(body);
                if e.is_none() {
                    log::warn!("request log: an unreadable entry was skipped");
                }
                e
            })
            .collect()
    }
}

/// The stored form of each entry of a batch (without its length prefix), unread.
pub fn stored_entries(batch: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = batch.strip_prefix(b"[").unwrap_or(batch);
    std::iter::from_fn(move || {
        let len = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?) as usize;
        let body = rest.get(4..4 + len)?;
        rest = &rest[4 + len..];
        rest = rest.strip_prefix(b",").unwrap_or(rest);
        Some(body)
    })
}

/// What the fleet's table indexes of a stored entry, read without the rest: its id, time,
/// number and key.
#[derive(Debug, PartialEq)]
pub struct EntryHead<'a> {
    pub id: std::borrow::Cow<'a, str>,
    pub time_ms: u64,
    pub seq: u64,
    pub key_id: Option<std::borrow::Cow<'a, str>>,
}

impl<'a> EntryHead<'a> {
    /// The head of one stored entry (as [`stored_entries`] gives it); None if it is not one.
    pub fn read(entry: &'a [u8]) -> Option<EntryHead<'a>> {
        let (&version, rest) = entry.split_first()?;
        if version != STORED_VERSION {
            return None;
        }
        let mut r = Reader(rest);
        Some(EntryHead { id: r.text()??, time_ms: r.varint()?, seq: r.varint()?, key_id: r.text()? })
    }
}

/// What `GET /admin/requests` asks for; every part optional.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Filter {
    /// One request, by its id.
    pub id: Option<String>,
    pub key_id: Option<String>,
    pub model: Option<String>,
    /// The route label (`chat_completions`, `messages`, `mcp_tool_call`, …).
    pub route: Option<String>,
    /// 2, 4 or 5: the status class.
    pub status_class: Option<u16>,
    /// Entries where a guardrail took this action (`block`, `mask`, `monitor`, `error`).
    pub guardrail_action: Option<String>,
    /// `start_ms <= time_ms < end_ms`.
    pub start_ms: u64,
    pub end_ms: u64,
    /// Only entries before this position (the `next` of the previous page).
    pub before: Option<Cursor>,
    pub limit: usize,
}

impl Filter {
    pub fn matches(&self, e: &LogEntry) -> bool {
        e.time_ms >= self.start_ms
            && e.time_ms < self.end_ms
            && self.id.as_ref().is_none_or(|id| *id == e.id)
            && self.key_id.as_ref().is_none_or(|k| e.key_id.as_ref() == Some(k))
            && self.model.as_ref().is_none_or(|m| e.model.as_ref() == Some(m))
            && self.route.as_ref().is_none_or(|r| *r == e.route)
            && self.status_class.is_none_or(|c| e.status / 100 == c)
            && self
                .guardrail_action
                .as_ref()
                .is_none_or(|a| e.guardrail.as_deref().is_some_and(|g| g.split(',').any(|n| n.split(':').nth(2) == Some(a.as_str()))))
    }
}

/// A position in the log, newest first: the time and the store's sequence number of an entry
/// (`<ms>.<n>` in answers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cursor {
    pub time_ms: u64,
    pub seq: u64,
}

impl Cursor {
    pub fn parse(text: &str) -> Option<Cursor> {
        let (t, n) = text.split_once('.')?;
        Some(Cursor { time_ms: t.parse().ok()?, seq: n.parse().ok()? })
    }
}

impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.time_ms, self.seq)
    }
}

/// A page of the log, newest first, and where the next one starts (None: no more).
pub type Page = (Vec<LogEntry>, Option<Cursor>);

#[cfg(test)]
mod tests {
    use super::*;

    fn refused_entry() -> LogEntry {
        LogEntry { id: "req_5".into(), status: 400, ..LogEntry::default() }
    }

    #[test]
    fn filters_and_cursors() {
        let e = LogEntry { key_id: Some("k".into()), model: Some("m".into()), status: 429, time_ms: 5, ..LogEntry::default() };
        let f = Filter { end_ms: u64::MAX, ..Filter::default() };
        assert!(f.matches(&e));
        assert!(Filter { status_class: Some(4), ..f.clone() }.matches(&e));
        assert!(!Filter { status_class: Some(2), ..f.clone() }.matches(&e));
        assert!(!Filter { key_id: Some("other".into()), ..f.clone() }.matches(&e));
        assert!(!Filter { start_ms: 6, ..f.clone() }.matches(&e));
        let chat = LogEntry { route: "chat_completions".into(), ..e.clone() };
        assert!(Filter { route: Some("chat_completions".into()), ..f.clone() }.matches(&chat));
        assert!(!Filter { route: Some("mcp_tool_call".into()), ..f.clone() }.matches(&chat));
        // The stored form says the same entry again, alone and in a batch.
        let full = LogEntry {
            id: "req_1".into(),
            time_ms: 1_795_000_000_123,
            seq: 9,
            key_id: Some("key_a".into()),
            key_name: Some("ä name".into()),
            model: Some("m".into()),
            route: "chat_completions".into(),
            protocol: "openai".into(),
            upstream_protocol: Some("anthropic".into()),
            provider: Some("p".into()),
            status: 200,
            refusal: None,
            param: Some("max_tokens".into()),
            input_tokens: 1 << 40,
            output_tokens: 300,
            cost_nanos: 12_345,
            estimated: true,
            latency_ms: 1500,
            first_byte_ms: Some(0),
            attempts: 2,
            upstream_request_id: Some("up-1".into()),
            upstream_model: Some("anthropic.m-v1:0".into()),
            request_bytes: None,
            response_bytes: None,
            guardrail: None,
            fallbacks: Some("m0:context_window,m1:rate_limited".into()),
            cache: Some("hit".into()),
            cache_saved_nanos: Some(77),
        };
        // A miss of the response cache, with nothing else of the later fields.
        let miss = LogEntry { id: "req_5".into(), cache: Some("miss".into()), ..LogEntry::default() };
        let mut one = Vec::new();
        miss.encode(&mut one);
        assert_eq!(LogEntry::decode(&one[4..]), Some(miss));
        // An MCP tool call's entry: no upstream model, its bytes.
        let tool = LogEntry {
            id: "req_3".into(),
            route: "mcp_tool_call".into(),
            model: Some("docs__search".into()),
            request_bytes: Some(120),
            response_bytes: Some(1 << 20),
            ..LogEntry::default()
        };
        let mut one = Vec::new();
        tool.encode(&mut one);
        assert_eq!(LogEntry::decode(&one[4..]), Some(tool));
        // A guarded call's entry: what its guardrails did, found by the action.
        let guarded = LogEntry {
            id: "req_4".into(),
            guardrail: Some("secrets:input:mask:aws_key,pii:output:monitor:email".into()),
            ..LogEntry::default()
        };
        let mut one = Vec::new();
        guarded.encode(&mut one);
        assert_eq!(LogEntry::decode(&one[4..]).as_ref(), Some(&guarded));
        let by = |action: &str| Filter { guardrail_action: Some(action.into()), end_ms: u64::MAX, ..Filter::default() };
        assert!(by("mask").matches(&guarded) && by("monitor").matches(&guarded));
        assert!(!by("block").matches(&guarded) && !by("mask").matches(&refused_entry()));
        let refused = LogEntry { id: "req_2".into(), cost_nanos: -5, status: 401, ..LogEntry::default() };
        let mut batch = b"[".to_vec();
        full.encode(&mut batch);
        batch.push(b',');
        refused.encode(&mut batch);
        batch.push(b']');
        assert_eq!(LogEntry::decode_batch(&batch), vec![full.clone(), refused.clone()]);
        // What the fleet's table indexes reads without the rest.
        let heads: Vec<EntryHead> = stored_entries(&batch).filter_map(EntryHead::read).collect();
        let head =
            |e: &LogEntry| EntryHead { id: e.id.clone().into(), time_ms: e.time_ms, seq: e.seq, key_id: e.key_id.clone().map(Into::into) };
        assert_eq!(heads, vec![head(&full), head(&refused)]);
        let mut one = Vec::new();
        full.encode(&mut one);
        assert_eq!(LogEntry::decode(&one[4..]), Some(full));
        assert_eq!(LogEntry::decode(&one[4..one.len() - 1]), None, "a cut entry is not one");
        let c = Cursor { time_ms: 1_795_000_000_123, seq: 42 };
        assert_eq!(Cursor::parse(&c.to_string()), Some(c));
        assert_eq!(Cursor::parse("x.1"), None);
    }
}
