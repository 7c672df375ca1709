//! Chat-completions style: `{"error":{"message","type","param","code"}}` and the model list
//! `{"object":"list","data":[{"id","object":"model","created","owned_by"}]}`.

use super::{ApiError, ErrorKind, ModelEntry};
use serde_json::{json, Value};

/// The header that carries the upstream credential.
pub const CREDENTIAL_HEADER: &str = "authorization";
/// Client headers relayed to these upstreams beyond the common ones.
pub const RELAYED_HEADERS: [&str; 1] = ["openai-beta"];

pub fn error_body(e: &ApiError) -> Value {
    let (etype, code) = match e.kind {
        ErrorKind::BadRequest => ("invalid_request_error", Value::Null),
        ErrorKind::Unauthorized => ("authentication_error", json!("invalid_api_key")),
        ErrorKind::InsufficientBalance => ("insufficient_quota", json!("insufficient_quota")),
        ErrorKind::NotFound => ("invalid_request_error", json!("unknown_url")),
        ErrorKind::ModelNotFound => ("invalid_request_error", json!("model_not_found")),
        ErrorKind::PayloadTooLarge => ("invalid_request_error", json!("request_too_large")),
        ErrorKind::Conflict => ("invalid_request_error", json!("not_ready")),
        ErrorKind::Gone => ("invalid_request_error", json!("expired")),
        ErrorKind::RateLimited => ("rate_limit_error", json!("rate_limit_exceeded")),
        ErrorKind::BadGateway => ("api_error", json!("upstream_unavailable")),
        ErrorKind::GatewayTimeout => ("api_error", json!("upstream_timeout")),
        ErrorKind::Internal => ("api_error", json!("internal_error")),
    };
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
                        r.text(call.pointer("/function/name"));
                        r.text(call.pointer("/function/arguments"));
                    }
                }
            }
        }
    }
    if let Some(usage) = v.get("usage").filter(|u| u.is_object()) {
        let prompt = super::u(usage, "/prompt_tokens").unwrap_or(0);
        let cached = super::u(usage, "/prompt_tokens_details/cached_tokens").unwrap_or(0).min(prompt);
        r.seen = super::SeenUsage {
            input: Some(prompt - cached),
            cached: Some(cached),
            cache_write: None,
            output: Some(super::u(usage, "/completion_tokens").unwrap_or(0)),
        };
        return v.get("choices").and_then(Value::as_array).is_some_and(Vec::is_empty);
    }
    false
}

/// Read one responses-API event or body: every `*.delta` (output text, refusals, reasoning,
/// function-call and custom-tool arguments) counts as generated text; the usage is in
/// `response.completed` (a stream) or at the top (a body).
pub fn read_responses_event(v: &Value, r: &mut super::Reading) {
    let kind = v.get("type").and_then(Value::as_str).unwrap_or_default();
    if kind.ends_with(".delta") {
        r.text(v.get("delta"));
    }
    let usage = if kind.is_empty() { v.get("usage") } else { v.pointer("/response/usage") };
    if let Some(usage) = usage.filter(|u| u.is_object()) {
        let input = super::u(usage, "/input_tokens").unwrap_or(0);
        let cached = super::u(usage, "/input_tokens_details/cached_tokens").unwrap_or(0).min(input);
        r.seen = super::SeenUsage {
            input: Some(input - cached),
            cached: Some(cached),
            cache_write: None,
            output: Some(super::u(usage, "/output_tokens").unwrap_or(0)),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
