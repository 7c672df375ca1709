//! Generate-content style: `{"error":{"code","message","status"}}` and the model list
//! `{"models":[{"name":"models/<id>","displayName","supportedGenerationMethods",…}]}`.

use super::{ApiError, ErrorKind, ModelEntry};
use serde_json::{json, Value};

/// The header that carries the upstream credential.
pub const CREDENTIAL_HEADER: &str = "x-goog-api-key";
/// Upstream response headers its clients get beyond the common ones (see `relay`).
pub const RESPONSE_HEADERS: [&str; 2] = ["x-request-id", "server-timing"];
/// Client headers relayed to these upstreams beyond the common ones.
pub const RELAYED_HEADERS: [&str; 1] = ["x-goog-api-client"];

pub fn error_body(e: &ApiError) -> Value {
    let status = match e.kind {
        ErrorKind::BadRequest | ErrorKind::PayloadTooLarge | ErrorKind::InvalidModel | ErrorKind::ContentPolicy => "INVALID_ARGUMENT",
        ErrorKind::IdempotencyKeyReused => "FAILED_PRECONDITION",
        ErrorKind::UpstreamAuthFailed => "UNAVAILABLE",
        ErrorKind::Unauthorized | ErrorKind::KeyExpired => "UNAUTHENTICATED",
        ErrorKind::InsufficientBalance | ErrorKind::RequestCostCap => "FAILED_PRECONDITION",
        ErrorKind::NotFound | ErrorKind::ModelNotFound | ErrorKind::Gone => "NOT_FOUND",
        ErrorKind::Forbidden | ErrorKind::IpNotAllowed | ErrorKind::ModelNotAllowed => "PERMISSION_DENIED",
        ErrorKind::Conflict => "FAILED_PRECONDITION",
        ErrorKind::RateLimited | ErrorKind::BudgetExceeded => "RESOURCE_EXHAUSTED",
        ErrorKind::BadGateway => "UNAVAILABLE",
        ErrorKind::GatewayTimeout | ErrorKind::RequestTimeout => "DEADLINE_EXCEEDED",
        ErrorKind::Overloaded | ErrorKind::StoreUnavailable | ErrorKind::GuardrailUnavailable => "UNAVAILABLE",
        ErrorKind::Internal => "INTERNAL",
    };
    match e.kind.code() {
        // google.rpc.ErrorInfo, as the service itself names a reason.
        Some(code) => json!({"error": {"code": e.status(), "message": e.message, "status": status, "details": [
            {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": code.to_ascii_uppercase(), "domain": "tollgate"}
        ]}}),
        None => json!({"error": {"code": e.status(), "message": e.message, "status": status}}),
    }
}

pub fn model(m: &ModelEntry) -> Value {
    json!({
        "name": format!("models/{}", m.id),
        "version": "001",
        "displayName": m.id,
        "description": m.id,
        "supportedGenerationMethods": ["generateContent", "streamGenerateContent"],
    })
}

pub fn model_list(models: &[ModelEntry]) -> Value {
    json!({"models": models.iter().map(model).collect::<Vec<_>>()})
}

/// For a traced request: `modelVersion` and each candidate's `finishReason`.
pub fn read_answer(v: &Value, a: &mut crate::base::usage::Answer) {
    a.model(v.get("modelVersion").and_then(Value::as_str));
    for c in v.get("candidates").and_then(Value::as_array).into_iter().flatten() {
        a.finish_reason(c.get("finishReason").and_then(Value::as_str));
    }
}

/// [`read_answer`] of a whole body (one response, or a JSON array of stream chunks), found
/// without parsing it (see [`super::key_strings`]).
pub fn read_answer_body(body: &[u8], a: &mut crate::base::usage::Answer) {
    static MODEL_VERSION: super::QuotedKey = super::QuotedKey::new("\"modelVersion\"");
    static FINISH_REASON: super::QuotedKey = super::QuotedKey::new("\"finishReason\"");
    a.model(super::key_strings(body, &MODEL_VERSION).next().as_deref());
    for reason in super::key_strings(body, &FINISH_REASON) {
        a.finish_reason(Some(&reason));
    }
}

/// Read one generate-content chunk or body: text parts, function calls and code count as
/// generated content; `usageMetadata` is the report (thoughts count as output).
pub fn read_event(v: &Value, r: &mut super::Reading) {
    if let Some(candidates) = v.get("candidates").and_then(Value::as_array) {
        for c in candidates {
            if let Some(parts) = super::at(c, "/content/parts").and_then(Value::as_array) {
                for p in parts {
                    r.text(p.get("text"));
                    // Function calls and code carry their arguments as JSON.
                    for field in ["functionCall", "executableCode", "codeExecutionResult", "inlineData"] {
                        if let Some(v) = p.get(field) {
                            r.json(v);
                        }
                    }
                }
            }
        }
    }
    if let Some(meta) = v.get("usageMetadata").filter(|u| u.is_object()) {
        let prompt = super::u(meta, "/promptTokenCount").unwrap_or(0);
        let cached = super::u(meta, "/cachedContentTokenCount").unwrap_or(0).min(prompt);
        let output = super::u(meta, "/candidatesTokenCount").unwrap_or(0) + super::u(meta, "/thoughtsTokenCount").unwrap_or(0);
        r.seen = super::SeenUsage { input: Some(prompt - cached), cached: Some(cached), cache_write: None, output: Some(output) };
    }
}

/// The model and whether the answer streams, from the last path segment of a generate-content
/// call, `{model}:generateContent` or `{model}:streamGenerateContent`.
pub fn model_and_action(name: &str) -> Option<(&str, bool)> {
    let (model, action) = name.rsplit_once(':')?;
    if model.is_empty() || model.contains('/') {
        return None;
    }
    match action {
        "generateContent" => Some((model, false)),
        "streamGenerateContent" => Some((model, true)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_shape() {
        let v = error_body(&ApiError::new(ErrorKind::ModelNotFound, "models/x is not found"));
        assert_eq!(v["error"]["code"], 404);
        assert_eq!(v["error"]["status"], "NOT_FOUND");
        let v = error_body(&ApiError::new(ErrorKind::Unauthorized, "no key"));
        assert_eq!(v["error"]["status"], "UNAUTHENTICATED");
    }

    #[test]
    fn list_shape() {
        let v = model_list(&[ModelEntry { id: "gamma-3.5-flash".into(), created: 0, owned_by: "google" }]);
        assert_eq!(v["models"][0]["name"], "models/gamma-3.5-flash");
        assert_eq!(v["models"][0]["displayName"], "gamma-3.5-flash");
        assert_eq!(v["models"][0]["supportedGenerationMethods"][1], "streamGenerateContent");
    }
}
