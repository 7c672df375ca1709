//! Stage 2, answer: the endpoints tollgate answers itself for a known key — the model lists,
//! `/v1/usage`, the key page's data and the video task API — each rate-limited like any call.
//! What is left is a model call: its protocol goes on to the draft.

use super::admit::Caller;
use crate::charge::Bucket;
use super::{unknown_endpoint, Exit, Gateway, Outcome, RequestCtx, Step};
use crate::config::{Platform, Protocol};
use crate::protocol::response::LocalResponse;
use crate::protocol::{anthropic, gemini, openai, ApiError, ErrorKind, ModelEntry};
use crate::records::key::KeyRecord;
use crate::route::Route;
use pingora_proxy::Session;

pub(super) async fn answer(gw: &Gateway, session: &mut Session, ctx: &mut RequestCtx, caller: &Caller) -> Step<Protocol> {
    let Caller { route, key, version, routing } = caller;
    let catalog = &routing.catalog;
    // The model lists show exactly what the key may call.
    let listed = |mut models: Vec<ModelEntry>| {
        models.retain(|m| key.policy.allows_model(&m.id));
        models
    };
    let respond = |r: LocalResponse| Err(Exit::Answer(Outcome::Respond(r)));
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
        Route::KeyPageData if !routing.key_page => Err(unknown_endpoint(session.req_header()).into()),
        Route::KeyPageData => {
            gw.charge.count(key, Bucket::Requests).await?;
            let _slot = gw.charge.enter(key).await?;
            let _turn = gw.usage_queries.take(&key.id).await?;
            let data = super::key_page::data(&gw.ledger, gw.requests.as_deref(), key, &routing.calendar).await.map_err(|e| {
                log::error!("key page: {e}");
                ApiError::new(ErrorKind::Internal, "Internal error while reading usage.")
            })?;
            respond(LocalResponse::json(200, &data))
        }
        Route::Usage => {
            // Rate-limited like any call.
            gw.charge.count(key, Bucket::Requests).await?;
            let _slot = gw.charge.enter(key).await?;
            respond(gw.usage(session.req_header().uri.query(), key).await?)
        }
        Route::VideoCreate { .. } | Route::VideoGet { .. } | Route::VideoContent { .. } | Route::VideoList | Route::VideoDelete { .. }
            if !catalog.group_allows(&key.group, Platform::Video) =>
        {
            Err(ApiError::new(ErrorKind::NotFound, format!("This endpoint is not available to keys of group '{}'.", key.group)).into())
        }
        // Every video call is rate-limited like any other: reads too (a download is the
        // operator's egress), and a download holds its `max_concurrent` slot while it streams.
        Route::VideoCreate { .. } | Route::VideoGet { .. } | Route::VideoContent { .. } | Route::VideoList | Route::VideoDelete { .. } => {
            gw.charge.admit_keyed(key, &routing.calendar).await?;
            let _slot = gw.charge.enter(key).await?;
            // Boxed: its future (uploads, downloads, the video service's calls) is larger
            // than the rest of the stages', which every relayed request carries.
            Err(Exit::Answer(Box::pin(gw.video_route(session, ctx, route, key)).await?))
        }
        Route::Files { .. } | Route::Batches { .. } if !catalog.group_allows(&key.group, Platform::Openai) => {
            Err(ApiError::new(ErrorKind::NotFound, format!("This endpoint is not available to keys of group '{}'.", key.group)).into())
        }
        Route::Files { op } => {
            gw.charge.admit_keyed(key, &routing.calendar).await?;
            let _slot = gw.charge.enter(key).await?;
            Err(Exit::Answer(Box::pin(gw.files_route(session, op, key)).await?))
        }
        Route::Batches { op } => {
            gw.charge.admit_keyed(key, &routing.calendar).await?;
            let _slot = gw.charge.enter(key).await?;
            Err(Exit::Answer(Box::pin(gw.batches_route(session, ctx, op, key, routing)).await?))
        }
        // A session counts against `max_concurrent` while it lasts (its turns against `rpm`).
        Route::Realtime => {
            let _slot = gw.charge.enter(key).await?;
            Err(Exit::Answer(Box::pin(gw.realtime(session, ctx, key, routing)).await?))
        }
        // Every MCP request counts against `rpm` and needs a key that is not below zero; tool
        // calls are counted again on their own (`tool_rpm`, `max_concurrent` while a tool runs).
        Route::Mcp => {
            gw.charge.admit_keyed(key, &routing.calendar).await?;
            Err(Exit::Answer(Box::pin(gw.mcp_route(session, ctx, key, routing)).await?))
        }
        other => Ok(other.relay_protocol().ok_or_else(|| ApiError::new(ErrorKind::Internal, "unroutable request"))?),
    }
}

impl Gateway {
    /// `GET /v1/usage[?start=&end=]` for the calling key.
    pub(super) async fn usage(&self, query: Option<&str>, key: &KeyRecord) -> std::result::Result<LocalResponse, ApiError> {
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
        let _turn = self.usage_queries.take(&key.id).await?;
        let calendar = self.routing.load().calendar.clone();
        let report = self.ledger.key_usage(key, start, end, &by, &calendar).await.map_err(internal)?;
        Ok(LocalResponse::json(200, &report))
    }
}
