//! Chat-completions style: `{"error":{"message","type","param","code"}}` and the model list
//! `{"object":"list","data":[{"id","object":"model","created","owned_by"}]}`.

use super::{ApiError, ErrorKind, ModelEntry};
use serde_json::{json, Value};
use std::borrow::Cow;

/// The header that carries the upstream credential.
pub const CREDENTIAL_HEADER: &str = "authorization";
/// Upstream response headers its clients get beyond the common ones (see `relay`).
pub const RESPONSE_HEADERS: [&str; 3] = ["x-request-id", "openai-processing-ms", "openai-version"];
/// Client headers relayed to these upstreams beyond the common ones.
pub const RELAYED_HEADERS: [&str; 1] = ["openai-beta"];

pub fn error_body(e: &ApiError) -> Value {
    let etype = match e.kind {
        ErrorKind::BadRequest
        | ErrorKind::NotFound
        | ErrorKind::ModelNotFound
        | ErrorKind::PayloadTooLarge
        | ErrorKind::RequestTimeout
        | ErrorKind::Conflict
        | ErrorKind::Gone
        | ErrorKind::RequestCostCap
        | ErrorKind::InvalidModel
        | ErrorKind::IdempotencyKeyReused
        | ErrorKind::ContentPolicy => "invalid_request_error",
        ErrorKind::Unauthorized | ErrorKind::KeyExpired => "authentication_error",
        ErrorKind::InsufficientBalance => "insufficient_quota",
        ErrorKind::Forbidden | ErrorKind::IpNotAllowed | ErrorKind::ModelNotAllowed => "permission_error",
        ErrorKind::RateLimited | ErrorKind::BudgetExceeded => "rate_limit_error",
        ErrorKind::Overloaded
        | ErrorKind::StoreUnavailable
        | ErrorKind::GuardrailUnavailable
        | ErrorKind::BadGateway
        | ErrorKind::GatewayTimeout
        | ErrorKind::Internal
        | ErrorKind::UpstreamAuthFailed => "api_error",
    };
    let code = e.upstream_code.as_deref().or(e.kind.code());
    json!({"error": {"message": e.message, "type": etype, "param": e.param, "code": code}})
}

pub fn model_list(models: &[ModelEntry]) -> Value {
    let data: Vec<Value> =
        models.iter().map(|m| json!({"id": m.id, "object": "model", "created": m.created, "owned_by": m.owned_by})).collect();
    json!({"object": "list", "data": data})
}

/// Read one chat-completions (or embeddings) event or body: content, refusals, reasoning and
/// tool calls count as generated text; `usage` (cache reads split out) is the report. Returns
/// true for the usage-only chunk (no choices) of a stream.
pub fn read_chat_event(v: &Value, r: &mut super::Reading) -> bool {
    if let Some(choices) = v.get("choices").and_then(Value::as_array) {
        for c in choices {
            for part in ["delta", "message"] {
                let Some(m) = c.get(part) else { continue };
                for field in ["content", "refusal", "reasoning_content", "reasoning"] {
                    r.text(m.get(field));
                }
                if let Some(calls) = m.get("tool_calls").and_then(Value::as_array) {
                    for call in calls {
                        r.text(super::at(call, "/function/name"));
                        r.text(super::at(call, "/function/arguments"));
                    }
                }
            }
        }
    }
    if let Some(usage) = v.get("usage").filter(|u| u.is_object()) {
        r.seen = seen(usage, "/prompt_tokens", "/prompt_tokens_details/cached_tokens", "/completion_tokens");
        return v.get("choices").and_then(Value::as_array).is_some_and(Vec::is_empty);
    }
    false
}

/// For a traced request: the model of a chat completion (body or chunk) and each choice's
/// `finish_reason`.
pub fn read_chat_answer(v: &Value, a: &mut crate::base::usage::Answer) {
    a.model(v.get("model").and_then(Value::as_str));
    for c in v.get("choices").and_then(Value::as_array).into_iter().flatten() {
        a.finish_reason(c.get("finish_reason").and_then(Value::as_str));
    }
}

/// [`read_chat_answer`] of a whole body, found without parsing it (see [`super::key_strings`]):
/// the first `model` (the top level's comes before any choice) and every `finish_reason`.
pub fn read_chat_answer_body(body: &[u8], a: &mut crate::base::usage::Answer) {
    static FINISH_REASON: super::QuotedKey = super::QuotedKey::new("\"finish_reason\"");
    a.model(super::key_strings(body, &super::MODEL_KEY).next().as_deref());
    for reason in super::key_strings(body, &FINISH_REASON) {
        a.finish_reason(Some(&reason));
    }
}

/// For a traced request: the model of a response (body, or the response an event carries) and
/// how it ended (`incomplete_details.reason`, else a final `status`).
pub fn read_responses_answer(v: &Value, a: &mut crate::base::usage::Answer) {
    let Some(r) = (if v.get("type").is_some() { v.get("response") } else { Some(v) }) else { return };
    a.model(r.get("model").and_then(Value::as_str));
    let status = r.get("status").and_then(Value::as_str).filter(|s| matches!(*s, "completed" | "incomplete" | "failed" | "cancelled"));
    if status.is_some() {
        a.finish_reason(super::at(r, "/incomplete_details/reason").and_then(Value::as_str).or(status));
    }
}

/// [`read_responses_answer`] of a whole response object, read without building its JSON tree.
pub fn read_responses_answer_body(body: &[u8], a: &mut crate::base::usage::Answer) {
    #[derive(serde::Deserialize)]
    struct Incomplete<'a> {
        #[serde(borrow, default)]
        reason: Option<Cow<'a, str>>,
    }
    #[derive(serde::Deserialize)]
    struct Body<'a> {
        #[serde(borrow, default)]
        model: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        status: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        incomplete_details: Option<Incomplete<'a>>,
    }
    if let Ok(b) = serde_json::from_slice::<Body>(body) {
        a.model(b.model.as_deref());
        let status = b.status.as_deref().filter(|s| matches!(*s, "completed" | "incomplete" | "failed" | "cancelled"));
        if status.is_some() {
            a.finish_reason(b.incomplete_details.as_ref().and_then(|d| d.reason.as_deref()).or(status));
        }
    }
}

/// Read one responses-API event or body: every `*.delta` (output text, refusals, reasoning,
/// function-call and custom-tool arguments) counts as generated text; the usage is in
/// `response.completed` (a stream) or at the top (a body).
pub fn read_responses_event(v: &Value, r: &mut super::Reading) {
    let kind = v.get("type").and_then(Value::as_str).unwrap_or_default();
    if kind.ends_with(".delta") {
        r.text(v.get("delta"));
    }
    if r.response_id.is_none() {
        let id = if kind.is_empty() {
            v.get("id").filter(|_| v.get("object").and_then(Value::as_str) == Some("response"))
        } else {
            super::at(v, "/response/id")
        };
        r.response_id = id.and_then(Value::as_str).map(str::to_string);
    }
    let usage = if kind.is_empty() { v.get("usage") } else { super::at(v, "/response/usage") };
    if let Some(usage) = usage.filter(|u| u.is_object()) {
        r.seen = seen(usage, "/input_tokens", "/input_tokens_details/cached_tokens", "/output_tokens");
    }
}

/// The top-level `id` of a response object whose text may be cut short (the first part of a
/// large body): read field by field, stopping at `id` (the API writes it first).
pub fn response_id_in_head(head: &[u8]) -> Option<String> {
    use serde::de::{Deserializer as _, Error as _, IgnoredAny, MapAccess, Visitor};
    struct FindId<'f>(&'f mut Option<String>);
    impl<'de> Visitor<'de> for FindId<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a response object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                if key == "id" {
                    *self.0 = map.next_value::<String>().ok();
                    // Found: the rest is not read.
                    return Err(A::Error::custom("found"));
                }
                map.next_value::<IgnoredAny>()?;
            }
            Ok(())
        }
    }
    let mut id = None;
    let mut de = serde_json::Deserializer::from_slice(head);
    // Stopping at the id (or at the cut) ends in an error by design.
    let _ = (&mut de).deserialize_map(FindId(&mut id));
    id
}

/// A usage object whose input count includes its cache reads (both OpenAI shapes): the cache
/// reads split out (never more than the input), the output as reported.
fn seen(usage: &Value, input: &str, cached: &str, output: &str) -> super::SeenUsage {
    let all_input = super::u(usage, input).unwrap_or(0);
    let cached = super::u(usage, cached).unwrap_or(0).min(all_input);
    super::SeenUsage {
        input: Some(all_input - cached),
        cached: Some(cached),
        cache_write: None,
        output: Some(super::u(usage, output).unwrap_or(0)),
    }
}

/// The client asked for stream usage itself (`stream_options.include_usage: true`).
pub fn client_wants_usage(f: &super::BodyFields<'_>) -> bool {
    #[derive(serde::Deserialize)]
    struct Probe {
        #[serde(default)]
        include_usage: Option<bool>,
    }
    f.stream_options.and_then(|raw| serde_json::from_slice::<Probe>(raw.bytes()).ok()).and_then(|p| p.include_usage).unwrap_or(false)
}

/// The edit that sets `stream_options.include_usage` to true, whatever `stream_options` held
/// (absent, null, not an object, false): the usage part of a streaming chat completion's one
/// rewrite. Only the `stream_options` value is parsed; the rest of the body is kept as it is.
pub fn include_usage(body: &[u8], fields: &super::BodyFields<'_>) -> Result<super::BodyEdit, ApiError> {
    let invalid = || ApiError::new(ErrorKind::BadRequest, "The request body must be a JSON object.");
    let Some(raw) = fields.stream_options else {
        return Ok(super::BodyEdit { first: vec![r#""stream_options":{"include_usage":true}"#.to_string()], replace: None });
    };
    let text = raw.text().ok_or_else(invalid)?;
    let start = (text.as_ptr() as usize).checked_sub(body.as_ptr() as usize).ok_or_else(invalid)?;
    let end = start + text.len();
    if body.get(start..end) != Some(text.as_bytes()) {
        return Err(invalid());
    }
    // The client's other options are kept verbatim (raw values, never re-encoded).
    super::check_value_count(text, "stream_options")?;
    let mut opts: std::collections::BTreeMap<String, &serde_json::value::RawValue> = serde_json::from_str(text).unwrap_or_default();
    let yes = serde_json::value::RawValue::from_string("true".into()).map_err(|_| invalid())?;
    opts.insert("include_usage".into(), &yes);
    Ok(super::BodyEdit { first: Vec::new(), replace: Some((start, end, serde_json::to_string(&opts).map_err(|_| invalid())?)) })
}

/// The body with `stream_options.include_usage` set to true (see [`include_usage`]).
pub fn with_include_usage(body: &[u8], fields: &super::BodyFields<'_>) -> Result<bytes::Bytes, ApiError> {
    include_usage(body, fields)?.apply(body)
}

/// A page of a cursor-paged list (`videos.list`, `files.list`): the items, the ids of the first
/// and last (the SDKs' `after` cursor) and whether more follow.
pub fn list_page(items: Vec<Value>, id_of: impl Fn(&Value) -> Option<&str>, has_more: bool) -> Value {
    let first = items.first().and_then(&id_of).map(str::to_string);
    let last = items.last().and_then(&id_of).map(str::to_string);
    serde_json::json!({"object": "list", "data": items, "first_id": first, "last_id": last, "has_more": has_more})
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_response_id_is_read_from_a_head_or_an_event() {
        let body = br#"{"id":"resp_1","object":"response","output":[{"id":"msg_2","content":[]}],"usage":{"input_tokens":1}}"#;
        assert_eq!(response_id_in_head(body).as_deref(), Some("resp_1"));
        assert_eq!(response_id_in_head(&body[..20]).as_deref(), Some("resp_1"), "a cut head");
        let later = br#"{"object":"response","metadata":{"id":"not-this"},"id":"resp_3","output":[{"x"#;
        assert_eq!(response_id_in_head(later).as_deref(), Some("resp_3"), "top level only, even after nested ids");
        assert_eq!(response_id_in_head(br#"{"object":"response","output":[1,2"#), None);
        assert_eq!(response_id_in_head(b"not json"), None);
        let mut r = super::super::Reading::default();
        read_responses_event(&json!({"type": "response.created", "response": {"id": "resp_9", "status": "in_progress"}}), &mut r);
        read_responses_event(&json!({"type": "response.output_item.added", "item": {"id": "msg_1"}}), &mut r);
        assert_eq!(r.response_id.as_deref(), Some("resp_9"));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Whatever the client sent, the rewritten body is the same object with
        /// `stream_options.include_usage: true` (the client's other options kept).
        #[test]
        fn include_usage_is_spliced_into_any_body(body in super::super::tests::arb_body(), pretty in any::<bool>()) {
            let bytes = if pretty { serde_json::to_vec_pretty(&body) } else { serde_json::to_vec(&body) }.expect("json");
            let fields = super::super::body_fields(&bytes).expect("fields");
            let out = with_include_usage(&bytes, &fields).expect("rewritten");
            let mut got: Value = serde_json::from_slice(&out).expect("still JSON");
            prop_assert_eq!(&got["stream_options"]["include_usage"], &Value::Bool(true));
            // Compared after the same parse (floats are not round-tripped exactly by serde_json).
            let mut want: Value = serde_json::from_slice(&bytes).expect("json");
            let mut opts = match want.get("stream_options") {
                Some(Value::Object(m)) => m.clone(),
                _ => serde_json::Map::new(),
            };
            opts.insert("include_usage".into(), Value::Bool(true));
            want["stream_options"] = Value::Object(opts);
            // Duplicate keys (a client's own stream_options next to ours) cannot occur: one object.
            if let (Some(g), Some(w)) = (got.as_object_mut(), want.as_object()) {
                prop_assert_eq!(&*g, w);
            }
        }
    }

    #[test]
    fn error_shape() {
        let e = ApiError::new(ErrorKind::ModelNotFound, "model 'x' not found").with_param("model");
        let v = error_body(&e);
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["code"], "model_not_found");
        assert_eq!(v["error"]["param"], "model");
        assert_eq!(v["error"]["message"], "model 'x' not found");
    }

    #[test]
    fn list_shape() {
        let v = model_list(&[ModelEntry { id: "alpha-5.5".into(), created: 7, owned_by: "openai" }]);
        assert_eq!(v["object"], "list");
        assert_eq!(v["data"][0]["id"], "alpha-5.5");
        assert_eq!(v["data"][0]["object"], "model");
        assert_eq!(v["data"][0]["created"], 7);
    }
}
