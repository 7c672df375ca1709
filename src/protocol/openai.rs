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
