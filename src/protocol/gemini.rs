//! Generate-content style: `{"error":{"code","message","status"}}` and the model list
//! `{"models":[{"name":"models/<id>","displayName","supportedGenerationMethods",…}]}`.

use super::{ApiError, ErrorKind, ModelEntry};
use serde_json::{json, Value};

/// The header that carries the upstream credential.
pub const CREDENTIAL_HEADER: &str = "x-goog-api-key";
/// Client headers relayed to these upstreams beyond the common ones.
pub const RELAYED_HEADERS: [&str; 1] = ["x-goog-api-client"];

pub fn error_body(e: &ApiError) -> Value {
    let status = match e.kind {
        ErrorKind::BadRequest | ErrorKind::PayloadTooLarge => "INVALID_ARGUMENT",
        ErrorKind::Unauthorized => "UNAUTHENTICATED",
        ErrorKind::InsufficientBalance => "FAILED_PRECONDITION",
        ErrorKind::NotFound | ErrorKind::ModelNotFound | ErrorKind::Gone => "NOT_FOUND",
        ErrorKind::Conflict => "FAILED_PRECONDITION",
        ErrorKind::RateLimited => "RESOURCE_EXHAUSTED",
        ErrorKind::BadGateway => "UNAVAILABLE",
        ErrorKind::GatewayTimeout => "DEADLINE_EXCEEDED",
        ErrorKind::Internal => "INTERNAL",
    };
    json!({"error": {"code": e.status(), "message": e.message, "status": status}})
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
