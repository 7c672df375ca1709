//! Messages style: `{"type":"error","error":{"type","message"}}` and the model list
//! `{"data":[{"type":"model","id","display_name","created_at"}],"has_more","first_id","last_id"}`.

use super::{rfc3339, ApiError, ErrorKind, ModelEntry};
use serde_json::{json, Value};

/// The header that carries the upstream credential.
pub const CREDENTIAL_HEADER: &str = "x-api-key";
/// Upstream response headers its clients get beyond the common ones (see `relay`).
pub const RESPONSE_HEADERS: [&str; 2] = ["request-id", "x-request-id"];
/// Client headers relayed to these upstreams beyond the common ones.
pub const RELAYED_HEADERS: [&str; 1] = ["anthropic-beta"];
/// The API version header (the client's, else the provider's configured default).
pub const VERSION_HEADER: &str = "anthropic-version";

pub fn error_body(e: &ApiError) -> Value {
    let etype = match e.kind {
        ErrorKind::BadRequest | ErrorKind::InvalidModel | ErrorKind::IdempotencyKeyReused | ErrorKind::ContentPolicy => {
            "invalid_request_error"
        }
        ErrorKind::Unauthorized | ErrorKind::KeyExpired => "authentication_error",
        ErrorKind::InsufficientBalance | ErrorKind::RequestCostCap => "billing_error",
        ErrorKind::NotFound | ErrorKind::ModelNotFound | ErrorKind::Gone => "not_found_error",
        ErrorKind::Forbidden | ErrorKind::IpNotAllowed | ErrorKind::ModelNotAllowed => "permission_error",
        ErrorKind::Conflict => "invalid_request_error",
        ErrorKind::PayloadTooLarge => "request_too_large",
        ErrorKind::RequestTimeout => "timeout_error",
        ErrorKind::Overloaded | ErrorKind::StoreUnavailable | ErrorKind::GuardrailUnavailable => "overloaded_error",
        ErrorKind::RateLimited | ErrorKind::BudgetExceeded => "rate_limit_error",
        ErrorKind::BadGateway | ErrorKind::Internal | ErrorKind::UpstreamAuthFailed => "api_error",
        ErrorKind::GatewayTimeout => "timeout_error",
    };
    match e.upstream_code.as_deref().or(e.kind.code()) {
        Some(code) => json!({"type": "error", "error": {"type": etype, "message": e.message, "code": code}}),
        None => json!({"type": "error", "error": {"type": etype, "message": e.message}}),
    }
}

pub fn model_list(models: &[ModelEntry]) -> Value {
    let data: Vec<Value> =
        models.iter().map(|m| json!({"type": "model", "id": m.id, "display_name": m.id, "created_at": rfc3339(m.created)})).collect();
    json!({
        "data": data,
        "has_more": false,
        "first_id": models.first().map(|m| m.id.as_str()),
        "last_id": models.last().map(|m| m.id.as_str()),
    })
}

/// For a traced request: the model that answered (`model` of the body or of `message_start`'s
/// message) and its `stop_reason` (of the body or of `message_delta`).
pub fn read_answer(v: &Value, a: &mut crate::base::usage::Answer) {
    a.model(v.get("model").or_else(|| super::at(v, "/message/model")).and_then(Value::as_str));
    a.finish_reason(v.get("stop_reason").or_else(|| super::at(v, "/delta/stop_reason")).and_then(Value::as_str));
}

/// [`read_answer`] of a whole message body, found without parsing it (see
/// [`super::key_strings`]): a message has one `model` and one `stop_reason`, before and after its
/// content; content blocks have neither.
pub fn read_answer_body(body: &[u8], a: &mut crate::base::usage::Answer) {
    static STOP_REASON: super::QuotedKey = super::QuotedKey::new("\"stop_reason\"");
    a.model(super::key_strings(body, &super::MODEL_KEY).next().as_deref());
    a.finish_reason(super::key_strings(body, &STOP_REASON).last().as_deref());
}

/// Read one messages event or body: text, tool-input JSON, thinking and signatures count as
/// generated text; input and cache counts come from `message_start` (or the body), the final
/// output count from the last `message_delta`.
pub fn read_event(v: &Value, r: &mut super::Reading) {
    let kind = v.get("type").and_then(Value::as_str).unwrap_or_default();
    let usage = match kind {
        "message_start" => super::at(v, "/message/usage"),
        "content_block_delta" => {
            r.text(super::at(v, "/delta/text"));
            r.text(super::at(v, "/delta/partial_json"));
            r.text(super::at(v, "/delta/thinking"));
            r.text(super::at(v, "/delta/signature"));
            None
        }
        _ => v.get("usage"),
    };
    if let Some(usage) = usage.filter(|u| u.is_object()) {
        if let Some(input) = super::u(usage, "/input_tokens") {
            r.seen.input = Some(input);
            r.seen.cache_write = Some(super::u(usage, "/cache_creation_input_tokens").unwrap_or(0));
            r.seen.cached = Some(super::u(usage, "/cache_read_input_tokens").unwrap_or(0));
        }
        // message_start carries a placeholder output count; the final one comes last.
        if kind != "message_start" {
            if let Some(out) = super::u(usage, "/output_tokens") {
                r.seen.output = Some(out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_shape() {
        let v = error_body(&ApiError::new(ErrorKind::Unauthorized, "invalid x-api-key"));
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "authentication_error");
        assert_eq!(v["error"]["message"], "invalid x-api-key");
    }

    #[test]
    fn list_shape() {
        let m = |id: &str| ModelEntry { id: id.into(), created: 0, owned_by: "anthropic" };
        let v = model_list(&[m("beta-opus-4-7"), m("beta-sonnet-4-6")]);
        assert_eq!(v["data"][0]["type"], "model");
        assert_eq!(v["data"][0]["display_name"], "beta-opus-4-7");
        assert_eq!(v["data"][0]["created_at"], "1970-01-01T00:00:00Z");
        assert_eq!(v["has_more"], false);
        assert_eq!(v["first_id"], "beta-opus-4-7");
        assert_eq!(v["last_id"], "beta-sonnet-4-6");
        assert_eq!(model_list(&[])["first_id"], Value::Null);
    }
}
