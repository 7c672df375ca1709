//! Fallbacks across models: the models a text-generation call may go on to when its own cannot
//! take it — the client's own list (a chat or responses body's `models`, OpenRouter's shape, or
//! the `x-tollgate-fallbacks` header on any protocol), else the operator's
//! (`routing.fallbacks.<model>`). Each is drafted as the call itself would be for it (the key's
//! model rules and the checks, its providers, another protocol reached through translation,
//! its own output allowance and hold); the call holds the dearest. A model the client names
//! that its key may not call refuses the call; one of the operator's is left out. Pure: the
//! gateway's send stage takes them in order (`edge::gateway::send`).

use super::draft::{draft_of, Draft};
use super::Routing;
use crate::checks::{Checks, Stop};
use crate::config::fallbacks::{Classes, MAX_CHAIN};
use crate::config::Protocol;
use crate::protocol::{ApiError, ErrorKind};
use crate::route::Route;
use bytes::Bytes;

/// The header of an answer that names the model that served a call with fallbacks.
pub const SERVED_MODEL: &str = "x-tollgate-served-model";

/// The header a client names its fallbacks in (comma-separated models), on any protocol.
pub const HEADER: http::HeaderName = http::HeaderName::from_static("x-tollgate-fallbacks");

/// A call that may go on to another model: the text-generation calls (an embedding, a media
/// call or a token count answers for the model it names only).
pub fn offered(route: &Route) -> bool {
    matches!(route, Route::ChatCompletions | Route::Responses | Route::Messages | Route::GenerateContent { .. })
}

/// The fallbacks the client's header names (any generation call), if it names any.
#[inline]
pub fn asked(route: &Route, header: Option<&str>) -> Result<Option<Vec<String>>, ApiError> {
    match header {
        Some(h) if offered(route) => header_list(h),
        _ => Ok(None),
    }
}

#[cold]
fn header_list(header: &str) -> Result<Option<Vec<String>>, ApiError> {
    let header = header.trim();
    if header.is_empty() {
        return Ok(None);
    }
    let list: Vec<serde_json::Value> = header.split(',').map(|m| serde_json::Value::String(m.trim().to_string())).collect();
    list_of(&serde_json::Value::Array(list)).map(Some).map_err(|e| e.with_param(HEADER.as_str()))
}

/// A chat or responses body that names `models` (the draft says so: `Draft::models_listed`):
/// the body without it (its first model as `model` when the body names none) and the rest of
/// the list, the models to go on to.
#[cold]
pub fn listed(body: &Bytes) -> Result<(Bytes, Vec<String>), ApiError> {
    let mut value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::new(ErrorKind::BadRequest, format!("The request body is not valid JSON: {e}")))?;
    let map = value.as_object_mut().ok_or_else(|| ApiError::new(ErrorKind::BadRequest, "The request body must be a JSON object."))?;
    let models = map.remove("models").unwrap_or_default();
    let mut list = list_of(&models)?;
    if map.get("model").is_none_or(|m| m.as_str().is_none_or(str::is_empty)) {
        map.insert("model".into(), serde_json::Value::String(list.remove(0)));
    }
    let body = serde_json::to_vec(&value).map_err(|e| ApiError::new(ErrorKind::Internal, e.to_string()))?;
    Ok((Bytes::from(body), list))
}

/// A `models` list: 1 to [`MAX_CHAIN`] model names plus the model itself, each a valid name.
fn list_of(models: &serde_json::Value) -> Result<Vec<String>, ApiError> {
    let invalid =
        || ApiError::new(ErrorKind::BadRequest, format!("'models' is a list of 1 to {} model names.", MAX_CHAIN + 1)).with_param("models");
    let items = models.as_array().filter(|a| !a.is_empty() && a.len() <= MAX_CHAIN + 1).ok_or_else(invalid)?;
    let mut list = Vec::with_capacity(items.len());
    for item in items {
        let name = item.as_str().filter(|s| !s.is_empty()).ok_or_else(invalid)?;
        crate::protocol::check_model_name(name).map_err(|e| e.with_param("models"))?;
        list.push(name.to_string());
    }
    Ok(list)
}

/// Draft `draft`'s fallbacks (the client's list `asked`, else the operator's for its model) and
/// hold the dearest. `body` is the client's body as drafted.
#[allow(clippy::too_many_arguments)]
#[inline]
pub fn attach(
    draft: &mut Draft,
    routing: &Routing,
    (route, protocol): (&Route, Protocol),
    group: &str,
    policy: &crate::policy::KeyPolicy,
    checks: (&Checks, &[crate::policy::plan::PlanModels]),
    asked: Option<Vec<String>>,
    body: &Bytes,
) -> Result<(), Stop> {
    // No list asked for, none in the file: nothing to look at.
    if asked.is_none() && routing.fallbacks.chains.is_empty() {
        return Ok(());
    }
    attach_chain(draft, routing, (route, protocol), group, policy, checks, asked, body)
}

#[allow(clippy::too_many_arguments)]
fn attach_chain(
    draft: &mut Draft,
    routing: &Routing,
    (route, protocol): (&Route, Protocol),
    group: &str,
    policy: &crate::policy::KeyPolicy,
    checks: (&Checks, &[crate::policy::plan::PlanModels]),
    asked: Option<Vec<String>>,
    body: &Bytes,
) -> Result<(), Stop> {
    if !offered(route) || draft.media.is_some() || draft.previous_response_id.is_some() {
        return Ok(());
    }
    let (models, on, strict) = match asked {
        Some(list) => (list, Classes::ALL, true),
        None => match routing.fallbacks.chains.get(&draft.model) {
            Some(chain) => (chain.to.clone(), chain.on, false),
            None => return Ok(()),
        },
    };
    for model in models.iter().filter(|m| **m != draft.model) {
        if draft.fallbacks.iter().any(|f| f.model == *model) {
            continue;
        }
        let (own_route, own_body) = match route {
            Route::GenerateContent { stream, .. } => (Some(Route::GenerateContent { model: model.clone(), stream: *stream }), body.clone()),
            _ => (None, with_model(body, model)?),
        };
        let at = own_route.as_ref().unwrap_or(route);
        match draft_of(routing, at, protocol, group, policy, checks, own_body, None, true) {
            Ok(mut fallback) => {
                fallback.route = own_route;
                draft.fallbacks.push(fallback);
            }
            Err(Stop::Refuse(e)) if strict => return Err(Stop::Refuse(e.with_param("models"))),
            Err(stop) if strict => return Err(stop),
            Err(stop) => log::debug!("fallback {model} of {} left out: {}", draft.model, stop.refusal().message),
        }
    }
    draft.fallback_on = on;
    draft.held();
    Ok(())
}

/// `body` (a JSON object) naming `model`.
fn with_model(body: &Bytes, model: &str) -> Result<Bytes, ApiError> {
    super::seam::edit_object(body, |map| {
        map.insert("model".into(), serde_json::Value::String(model.to_string()));
    })
    .map_err(|e| ApiError::new(ErrorKind::BadRequest, format!("The request body could not be read: {e}")))
}

/// Whether `model`'s context window (`prices.<model>.context_window`) holds `input` tokens
/// (a model without one: yes).
pub fn fits(routing: &Routing, model: &str, input: u64) -> bool {
    routing.prices.price(model).and_then(|p| p.context_window).is_none_or(|window| input <= window)
}

/// A model a call may go on to, as its send stage takes it.
pub struct Next {
    pub model: String,
    pub candidates: Vec<usize>,
    /// The body its providers get.
    pub body: Bytes,
    pub translation: Option<crate::translate::Translation>,
    pub withhold_usage: bool,
    /// Its own route, when its model is in the path (generate content).
    pub route: Option<Route>,
}

impl From<Draft> for Next {
    fn from(d: Draft) -> Next {
        Next {
            model: d.model,
            candidates: d.candidates,
            body: d.body,
            translation: d.translation,
            withhold_usage: d.withhold_usage,
            route: d.route,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(v: serde_json::Value) -> Bytes {
        Bytes::from(serde_json::to_vec(&v).expect("json"))
    }

    #[test]
    fn a_clients_list_is_read_from_the_body_or_the_header_and_the_body_sent_names_none() {
        let chat = body(serde_json::json!({"model": "a", "models": ["b", "c"], "messages": []}));
        let (sent, list) = listed(&chat).expect("read");
        assert_eq!(list, vec!["b".to_string(), "c".to_string()]);
        let sent: serde_json::Value = serde_json::from_slice(&sent).expect("json");
        assert_eq!(sent, serde_json::json!({"model": "a", "messages": []}), "`models` is not sent on");
        // Without `model`, the list's first is the model.
        let (sent, list) = listed(&body(serde_json::json!({"models": ["b", "c"], "input": "hi"}))).expect("read");
        assert_eq!(list, vec!["c".to_string()]);
        assert_eq!(serde_json::from_slice::<serde_json::Value>(&sent).expect("json")["model"], "b");
        // The header on any generation call; not on another.
        assert_eq!(asked(&Route::Messages, Some(" b , c ")).expect("read"), Some(vec!["b".to_string(), "c".to_string()]));
        assert_eq!(asked(&Route::Embeddings, Some("b")).expect("read"), None);
        assert_eq!(asked(&Route::Messages, None).expect("read"), None);
        // Refused: an empty list, one too long, a name that is not one.
        for bad in [serde_json::json!([]), serde_json::Value::from(vec!["m"; 10]), serde_json::json!([1]), serde_json::json!("b")] {
            let e = listed(&body(serde_json::json!({"model": "a", "models": bad}))).expect_err("refused");
            assert_eq!((e.status(), e.param.as_deref()), (400, Some("models")), "{bad}");
        }
        let e = asked(&Route::Messages, Some("b,,c")).expect_err("an empty name");
        assert_eq!(e.param.as_deref(), Some(HEADER.as_str()));
    }
}
