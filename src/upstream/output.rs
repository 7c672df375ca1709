//! The output limit of a relayed request, in one place: which fields name it on each route (a
//! field of another protocol is refused), how many tokens are held when the request names none,
//! how far that allowance is lowered to what the key can afford, and the body the upstream gets.
//!
//! The rule (docs/security.md): the upstream is always told where the hold ends. A request that
//! names its maximum in its route's own field is held for it and sent as it is; one that names
//! none is held for the allowance and sent with the allowance written into the route's own
//! field. So a conforming upstream never generates past what was held.

use crate::protocol::{ApiError, BodyFields, ErrorKind};
use crate::route::Route;

/// The output-limit fields a route's protocol defines, in the order they are read.
fn own_fields(route: &Route) -> &'static [&'static str] {
    match route {
        Route::ChatCompletions => &["max_completion_tokens", "max_tokens"],
        Route::Responses | Route::ResponsesCompact => &["max_output_tokens"],
        Route::Messages => &["max_tokens"],
        Route::GenerateContent { .. } => &["generationConfig.maxOutputTokens"],
        _ => &[],
    }
}

/// A body field's value by its name here.
fn field_value(fields: &BodyFields<'_>, name: &str) -> Option<u64> {
    match name {
        "max_completion_tokens" => fields.max_completion_tokens,
        "max_tokens" => fields.max_tokens,
        "max_output_tokens" => fields.max_output_tokens,
        "generationConfig.maxOutputTokens" => fields.generation_config.as_ref().and_then(|g| g.max_output_tokens),
        _ => None,
    }
}

/// Every output-limit field tollgate reads, of any protocol.
const ALL_FIELDS: [&str; 4] = ["max_completion_tokens", "max_tokens", "max_output_tokens", "generationConfig.maxOutputTokens"];

/// The field a request's output maximum is written to when tollgate sets it.
pub fn field(route: &Route) -> &'static str {
    own_fields(route).first().copied().unwrap_or("max_tokens")
}

/// The per-choice output maximum a request names in its route's own fields (the largest, when
/// chat completions gives both of its spellings: an upstream may honour either). A field of
/// another protocol is refused (400 naming it and the route's own field): the upstream would
/// ignore it and generate past the hold. Routes without an output limit (embeddings, counting,
/// stored responses) name none.
pub fn asked(route: &Route, fields: &BodyFields<'_>) -> Result<Option<u64>, ApiError> {
    let own = own_fields(route);
    if own.is_empty() {
        return Ok(None);
    }
    if let Some(foreign) = ALL_FIELDS.iter().find(|name| !own.contains(name) && field_value(fields, name).is_some()) {
        return Err(ApiError::new(
            ErrorKind::BadRequest,
            format!("'{foreign}' is not a parameter of this API; the output limit is set with '{}'.", field(route)),
        )
        .with_param(foreign));
    }
    Ok(own.iter().filter_map(|name| field_value(fields, name)).max())
}

/// The field a refusal about the request's output maximum names: the one the request used,
/// else the one to set.
pub fn named_field(route: &Route, fields: &BodyFields<'_>) -> &'static str {
    own_fields(route).iter().copied().find(|name| field_value(fields, name).is_some()).unwrap_or_else(|| field(route))
}

/// The per-choice output tokens held for a request that names no maximum: the key's
/// `default_output_tokens`, else the model's (`prices.<model>.default_output_tokens`), else its
/// `max_output_tokens`, else `billing.default_output_tokens`; never above the model's or the
/// key's `max_output_tokens`.
pub fn default_allowance(
    model_default: Option<u64>,
    model_limit: Option<u64>,
    key_default: Option<u64>,
    key_cap: Option<u64>,
    global: u64,
) -> u64 {
    let wanted = key_default.or(model_default).or(model_limit).unwrap_or(global);
    [model_limit, key_cap].into_iter().flatten().fold(wanted, u64::min).max(1)
}

/// The `"field":tokens` member that writes a request's output maximum first in its body, for a
/// route whose field is a top-level one (None for generate-content's, in `generationConfig`:
/// see [`with_maximum`]).
pub fn maximum_member(route: &Route, tokens: u64) -> Option<String> {
    let field = field(route);
    (!field.contains('.')).then(|| format!("\"{field}\":{tokens}"))
}

/// `body` with its output maximum set to `tokens` in the route's own field (a request that named
/// none): a top-level field goes in first; generate-content's sits in `generationConfig`.
pub fn with_maximum(route: &Route, body: &bytes::Bytes, tokens: u64) -> Result<bytes::Bytes, ApiError> {
    let field = field(route);
    if let Some(nested) = field.strip_prefix("generationConfig.") {
        let mut value: serde_json::Value = if body.is_empty() {
            serde_json::json!({})
        } else {
            let text =
                std::str::from_utf8(body).map_err(|_| ApiError::new(ErrorKind::BadRequest, "The request body is not valid UTF-8."))?;
            crate::protocol::parse_bounded(text, "request body")?
        };
        let Some(map) = value.as_object_mut() else {
            return Err(ApiError::new(ErrorKind::BadRequest, "The request body must be a JSON object."));
        };
        // The proto spelling is accepted too; one field is kept.
        let config = map.remove("generation_config").or_else(|| map.remove("generationConfig")).unwrap_or_else(|| serde_json::json!({}));
        let mut config = match config {
            serde_json::Value::Object(c) => c,
            _ => return Err(ApiError::new(ErrorKind::BadRequest, "'generationConfig' must be an object.").with_param("generationConfig")),
        };
        config.remove("max_output_tokens");
        config.insert(nested.to_string(), tokens.into());
        map.insert("generationConfig".to_string(), serde_json::Value::Object(config));
        return serde_json::to_vec(&value)
            .map(bytes::Bytes::from)
            .map_err(|_| ApiError::new(ErrorKind::Internal, "Internal error while preparing the request."));
    }
    let member = maximum_member(route, tokens).unwrap_or_default();
    crate::protocol::BodyEdit { first: vec![member], replace: None }.apply(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::body_fields;

    fn gc() -> Route {
        Route::GenerateContent { model: "g".into(), stream: false }
    }

    #[test]
    fn each_route_reads_its_own_fields_and_refuses_another_protocols() {
        let f = body_fields(br#"{"model":"m","max_output_tokens":16000}"#).expect("parse");
        let refused = asked(&Route::ChatCompletions, &f).expect_err("a responses field on chat completions");
        assert_eq!(refused.param.as_deref(), Some("max_output_tokens"));
        assert!(refused.message.contains("max_completion_tokens"), "{}", refused.message);
        assert_eq!(asked(&Route::Responses, &f).ok(), Some(Some(16000)));
        assert!(asked(&Route::Messages, &f).is_err());

        let f = body_fields(br#"{"model":"m","max_tokens":7}"#).expect("parse");
        assert_eq!(asked(&Route::ChatCompletions, &f).ok(), Some(Some(7)));
        assert_eq!(asked(&Route::Messages, &f).ok(), Some(Some(7)));
        assert!(asked(&Route::Responses, &f).is_err());
        assert!(asked(&gc(), &f).is_err(), "not a generate-content field");
        assert_eq!(asked(&Route::Embeddings, &f).ok(), Some(None), "no output limit on embeddings");

        // Both chat spellings: the larger is what an upstream may honour.
        let f = body_fields(br#"{"model":"m","max_completion_tokens":9,"max_tokens":700}"#).expect("parse");
        assert_eq!(asked(&Route::ChatCompletions, &f).ok(), Some(Some(700)));
        assert_eq!(named_field(&Route::ChatCompletions, &f), "max_completion_tokens");

        let f = body_fields(br#"{"generationConfig":{"maxOutputTokens":13}}"#).expect("parse");
        assert_eq!(asked(&gc(), &f).ok(), Some(Some(13)));
        assert!(asked(&Route::ChatCompletions, &f).is_err());
        let f = body_fields(br#"{"generation_config":{"max_output_tokens":11}}"#).expect("parse");
        assert_eq!(asked(&gc(), &f).ok(), Some(Some(11)));
    }

    #[test]
    fn the_default_allowance_follows_key_model_then_global_and_never_passes_a_cap() {
        assert_eq!(default_allowance(None, None, None, None, 4096), 4096);
        assert_eq!(default_allowance(None, Some(128_000), None, None, 4096), 128_000);
        assert_eq!(default_allowance(Some(8000), Some(128_000), None, None, 4096), 8000);
        assert_eq!(default_allowance(Some(8000), Some(128_000), Some(300), None, 4096), 300);
        assert_eq!(default_allowance(None, Some(1000), Some(3000), None, 4096), 1000, "the model's limit");
        assert_eq!(default_allowance(None, None, None, Some(50), 4096), 50, "the key's cap");
    }

    #[test]
    fn the_maximum_is_written_into_the_routes_own_field() {
        let body = bytes::Bytes::from_static(br#" {"model":"m","messages":[]}"#);
        let out = with_maximum(&Route::ChatCompletions, &body, 12).expect("written");
        let v: serde_json::Value = serde_json::from_slice(&out).expect("json");
        assert_eq!(v["max_completion_tokens"], 12);
        assert_eq!(v["model"], "m");
        let out = with_maximum(&Route::Responses, &bytes::Bytes::from_static(b"{}"), 5).expect("written");
        assert_eq!(&out[..], br#"{"max_output_tokens":5}"#);
        let out = with_maximum(&Route::Messages, &body, 3).expect("written");
        assert_eq!(serde_json::from_slice::<serde_json::Value>(&out).expect("json")["max_tokens"], 3);
        let g = bytes::Bytes::from_static(br#"{"contents":[],"generation_config":{"temperature":0.5}}"#);
        let out = with_maximum(&gc(), &g, 9).expect("written");
        let v: serde_json::Value = serde_json::from_slice(&out).expect("json");
        assert_eq!(v["generationConfig"]["maxOutputTokens"], 9);
        assert_eq!(v["generationConfig"]["temperature"], 0.5);
        assert!(v.get("generation_config").is_none());
        assert!(with_maximum(&Route::ChatCompletions, &bytes::Bytes::from_static(b"[1]"), 1).is_err());
    }
}
