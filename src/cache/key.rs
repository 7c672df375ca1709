//! What identifies a call that may be answered from the cache: a SHA-256 over the client's
//! protocol, the route, the model that serves it, whether it streams, the scope the answer may
//! be shared in (a key, an account, a group), and the body made canonical — members sorted,
//! no whitespace, and the members that do not change the answer left out ([`IGNORED`]). Only
//! calls deterministic enough to be answered again are keyed ([`cacheable`]). Pure.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// Members that do not change the answer: who asks (`user`, `metadata`, `safety_identifier`),
/// how usage is reported (`stream_options`), and the model and stream flag (keyed apart).
pub const IGNORED: [&str; 6] = ["user", "metadata", "safety_identifier", "stream_options", "model", "stream"];

/// Whom a cached answer may be served to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope<'a> {
    Key(&'a str),
    Account(&'a str),
    Group(&'a str),
}

impl Scope<'_> {
    fn tag(&self) -> (u8, &str) {
        match self {
            Scope::Key(id) => (b'k', id),
            Scope::Account(name) => (b'a', name),
            Scope::Group(name) => (b'g', name),
        }
    }
}

/// Why a call is not answered from the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotCacheable {
    /// It samples (a temperature above 0 and no seed), and the operator did not allow it.
    Sampled,
    /// It continues or stores a conversation at its provider (`store: true`, `previous_response_id`).
    Stored,
    /// It asks for several answers (`n` above 1).
    Several,
    /// The body is not a JSON object.
    NotJson,
}

/// Whether a call's body is deterministic enough to be answered again: `temperature` 0, or
/// a `seed` with no temperature (or `any_temperature`); no stored conversation; one answer.
pub fn cacheable(body: &Value, any_temperature: bool) -> Result<(), NotCacheable> {
    let map = body.as_object().ok_or(NotCacheable::NotJson)?;
    if map.get("store").and_then(Value::as_bool) == Some(true) || map.get("previous_response_id").is_some_and(|v| !v.is_null()) {
        return Err(NotCacheable::Stored);
    }
    if map.get("n").and_then(Value::as_u64).is_some_and(|n| n > 1) {
        return Err(NotCacheable::Several);
    }
    // Generate-content keeps its temperature and seed in `generationConfig`.
    let config = map.get("generationConfig").and_then(Value::as_object);
    let temperature = map.get("temperature").or_else(|| config.and_then(|c| c.get("temperature"))).and_then(Value::as_f64);
    let seed = map.get("seed").or_else(|| config.and_then(|c| c.get("seed"))).is_some_and(|s| !s.is_null());
    match (temperature, seed) {
        _ if any_temperature => Ok(()),
        (Some(0.0), _) => Ok(()),
        (None, true) => Ok(()),
        _ => Err(NotCacheable::Sampled),
    }
}

/// The cache key of a call (hex SHA-256).
pub fn key(protocol: &str, route: &str, model: &str, stream: bool, scope: Scope<'_>, body: &Value) -> String {
    let mut h = Sha256::new();
    // Each part length-prefixed: no two different calls write the same bytes.
    let (tag, owner) = scope.tag();
    for part in [protocol.as_bytes(), route.as_bytes(), model.as_bytes(), &[u8::from(stream), tag], owner.as_bytes()] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part);
    }
    // Members in order (serde_json's map is sorted), compact, written straight into the hash.
    let mut canonical = Vec::with_capacity(256);
    match body {
        Value::Object(map) => {
            canonical.push(b'{');
            for (k, v) in map.iter().filter(|(k, _)| !IGNORED.contains(&k.as_str())) {
                if canonical.len() > 1 {
                    canonical.push(b',');
                }
                // A string and a value always serialise (into memory).
                let _ = serde_json::to_writer(&mut canonical, k);
                canonical.push(b':');
                let _ = serde_json::to_writer(&mut canonical, v);
            }
            canonical.push(b'}');
        }
        other => {
            let _ = serde_json::to_writer(&mut canonical, other);
        }
    }
    h.update(&canonical);
    crate::base::text::hex(&h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_same_call_written_otherwise_has_the_same_key_and_a_different_one_does_not() {
        let a = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0, "user": "u1"});
        let b: Value = serde_json::from_str(
            r#"{ "temperature":0,  "messages":[{"content":"hi","role":"user"}], "user":"u2","metadata":{"x":1},"model":"m" }"#,
        )
        .expect("json");
        let k = |v: &Value| key("openai", "chat_completions", "m", false, Scope::Key("key_1"), v);
        assert_eq!(k(&a), k(&b), "member order, whitespace, user and metadata do not matter");
        assert_ne!(k(&a), k(&json!({"messages": [{"role": "user", "content": "hi!"}], "temperature": 0})));
        assert_ne!(k(&a), key("openai", "chat_completions", "m", true, Scope::Key("key_1"), &a), "a stream is keyed apart");
        assert_ne!(k(&a), key("openai", "chat_completions", "m2", false, Scope::Key("key_1"), &a), "the serving model");
        assert_ne!(k(&a), key("openai", "chat_completions", "m", false, Scope::Key("key_2"), &a), "another key never shares");
        assert_ne!(k(&a), key("openai", "chat_completions", "m", false, Scope::Account("key_1"), &a), "scopes never collide");
        assert_eq!(k(&a).len(), 64);
        // The canonical form is the compact JSON of the members kept, in order.
        let mut h = Sha256::new();
        for part in [&b"openai"[..], b"chat_completions", b"m", &[0, b'k'], b"key_1"] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part);
        }
        h.update(br#"{"messages":[{"content":"hi","role":"user"}],"temperature":0}"#);
        assert_eq!(k(&a), h.finalize().iter().map(|b| format!("{b:02x}")).collect::<String>());
    }

    #[test]
    fn only_calls_deterministic_enough_are_cacheable() {
        assert_eq!(cacheable(&json!({"temperature": 0}), false), Ok(()));
        assert_eq!(cacheable(&json!({"seed": 7}), false), Ok(()));
        assert_eq!(cacheable(&json!({"generationConfig": {"temperature": 0.0}}), false), Ok(()));
        assert_eq!(cacheable(&json!({}), false), Err(NotCacheable::Sampled), "a default temperature samples");
        assert_eq!(cacheable(&json!({"temperature": 0.7, "seed": 1}), false), Err(NotCacheable::Sampled));
        assert_eq!(cacheable(&json!({"temperature": 0.7}), true), Ok(()), "the operator's any_temperature");
        assert_eq!(cacheable(&json!({"temperature": 0, "store": true}), true), Err(NotCacheable::Stored));
        assert_eq!(cacheable(&json!({"temperature": 0, "previous_response_id": "resp_1"}), true), Err(NotCacheable::Stored));
        assert_eq!(cacheable(&json!({"temperature": 0, "n": 2}), true), Err(NotCacheable::Several));
        assert_eq!(cacheable(&json!([1]), true), Err(NotCacheable::NotJson));
    }
}
