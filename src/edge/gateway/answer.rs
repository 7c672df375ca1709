//! Stage 2, answer: the endpoints tollgate answers itself for a known key — the model lists,
//! `/v1/usage`, the key page's data — and the router to the kinds of call answered here
//! (`kinds`: video tasks, files, batches, realtime sessions, MCP), each admitted as it declares
//! by the charge floor. What is left is a model call: its protocol goes on to the draft.

use super::admit::Caller;
use super::{unknown_endpoint, Exit, Gateway, Outcome, RequestCtx, Step};
use crate::charge::Entry;
use crate::config::Protocol;
use crate::protocol::response::LocalResponse;
use crate::protocol::{anthropic, gemini, openai, ApiError, ErrorKind, ModelEntry};
use crate::records::key::KeyRecord;
use crate::route::Route;
use pingora_proxy::Session;

pub(super) async fn answer(gw: &Gateway, session: &mut Session, ctx: &mut RequestCtx, caller: &Caller) -> Step<Protocol> {
    let Caller { route, key, version, routing, .. } = caller;
    let catalog = &routing.catalog;
    // The model lists show exactly what the key may call.
    let listed = |mut models: Vec<ModelEntry>| {
        models.retain(|m| key.policy.allows_model(&m.id));
        models
    };
    let respond = |r: LocalResponse| Err(Exit::Answer(Outcome::Respond(r)));
    // A kind of call answered here (`kinds`): its group's platform, its admission, its run.
    if let Some(kind) = super::kinds::of(route) {
        if kind.platform().is_some_and(|p| !catalog.group_allows(&key.group, p)) {
            let refused = format!("This endpoint is not available to keys of group '{}'.", key.group);
            return Err(ApiError::new(ErrorKind::NotFound, refused).into());
        }
        let _slot = gw.charge.admit(key, &routing.calendar, kind.entry()).await?;
        return Err(Exit::Answer(kind.run(gw, session, ctx, caller).await?));
    }
    match route {
        Route::Models => {
            // The list is of what the endpoints of the client's own protocol serve it: a
            // messages client's (it sends a version header) or a chat-completions client's.
            let shape = if version.is_some() { Protocol::Anthropic } else { Protocol::Openai };
            let models = listed(catalog.models_for(&key.group, Some(shape)));
            let body = match shape {
                Protocol::Anthropic => anthropic::model_list(&models),
                _ => openai::model_list(&models),
            };
            respond(LocalResponse::json(200, &body))
        }
        Route::GeminiModels => {
            let models = listed(catalog.models_for(&key.group, Some(Protocol::Gemini)));
            respond(LocalResponse::json(200, &gemini::model_list(&models)))
        }
        Route::GeminiModel { model } => {
            let models = listed(catalog.models_for(&key.group, Some(Protocol::Gemini)));
            let wanted = model.strip_prefix("models/").unwrap_or(model);
            crate::protocol::check_model_name(wanted)?;
            match models.iter().find(|m| m.id == wanted) {
                Some(m) => respond(LocalResponse::json(200, &gemini::model(m))),
                None => Err(ApiError::new(ErrorKind::ModelNotFound, format!("models/{wanted} is not found.")).into()),
            }
        }
        Route::Signin(crate::route::SigninOp::ManagedSettings) => respond(super::signin::managed_settings(gw, session, ctx, caller)?),
        Route::Signin(crate::route::SigninOp::Telemetry(signal)) => {
            respond(super::signin::telemetry(gw, session, ctx, caller, signal).await?)
        }
        Route::KeyPageData if !routing.key_page => Err(unknown_endpoint(session.req_header()).into()),
        Route::KeyPageData => {
            let _slot = gw.charge.admit(key, &routing.calendar, Entry::READ).await?;
            let _turn = gw.usage_queries.take(&key.id).await?;
            let data = super::key_page::data(&gw.ledger, gw.requests.as_deref(), key, &routing.calendar).await.map_err(|e| {
                log::error!("key page: {e}");
                ApiError::new(ErrorKind::Internal, "Internal error while reading usage.")
            })?;
            respond(LocalResponse::json(200, &data))
        }
        Route::Usage => {
            // Rate-limited like any call.
            let _slot = gw.charge.admit(key, &routing.calendar, Entry::READ).await?;
            respond(usage(gw, session.req_header().uri.query(), key).await?)
        }
        other => Ok(other.relay_protocol().ok_or_else(|| ApiError::new(ErrorKind::Internal, "unroutable request"))?),
    }
}

/// `GET /v1/usage[?start=&end=]` for the calling key.
async fn usage(gw: &Gateway, query: Option<&str>, key: &KeyRecord) -> std::result::Result<LocalResponse, ApiError> {
    let (start, end) = crate::billing::ledger::usage_window(query)?;
    let internal = |e: crate::store::StoreError| match e {
        crate::store::StoreError::Shared(e) => {
            log::warn!("usage query: {e}");
            crate::store::fleet::unavailable("the key's usage")
        }
        e => {
            log::error!("usage query: {e}");
            ApiError::new(ErrorKind::Internal, "Internal error while reading usage.")
        }
    };
    let by = crate::billing::ledger::usage_grouping(query)?;
    // Reading a long history is CPU work: on a blocking thread, one query at a time per key
    // (one key's reads never delay another's), never on the threads that relay requests.
    let _turn = gw.usage_queries.take(&key.id).await?;
    let calendar = gw.routing.load().calendar.clone();
    let mut report = gw.ledger.key_usage(key, start, end, &by, &calendar).await.map_err(internal)?;
    // The plans it is under: their period, credit and what is left of it.
    let plans = gw.charge.plan_standing(key).await.map_err(internal)?;
    if !plans.is_empty() {
        report["plans"] = serde_json::json!(plans);
    }
    Ok(LocalResponse::json(200, &report))
}
