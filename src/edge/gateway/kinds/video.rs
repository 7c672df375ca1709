//! The video task endpoints, answered by the video service (a stage-2 answer: a video
//! request is never relayed as a model call).

use super::super::admit::Caller;
use super::super::{Gateway, Outcome, RequestCtx};
use crate::protocol::response::LocalResponse;
use crate::protocol::{header_str, ApiError, ErrorKind};
use crate::records::key::KeyRecord;
use crate::route::Route;
use crate::video;
use pingora_proxy::Session;

/// A video task (create, read, download, list, delete): charged its price at creation.
pub(in crate::edge::gateway) struct Video;

#[async_trait::async_trait]
impl super::Answered for Video {
    fn platform(&self) -> Option<crate::config::Platform> {
        Some(crate::config::Platform::Video)
    }

    fn entry(&self) -> crate::charge::Entry {
        // Every video call is counted like any other: reads too (a download is the operator's
        // egress), and a download holds its `max_concurrent` slot while it streams.
        crate::charge::Entry::KEYED
    }

    async fn run(
        &self,
        gw: &Gateway,
        session: &mut Session,
        ctx: &mut RequestCtx,
        caller: &Caller,
    ) -> std::result::Result<Outcome, ApiError> {
        video_route(gw, session, ctx, caller).await
    }
}

/// The video task endpoints.
pub(super) async fn video_route(
    gw: &Gateway,
    session: &mut Session,
    ctx: &mut RequestCtx,
    caller: &Caller,
) -> std::result::Result<Outcome, ApiError> {
    let (route, key) = (&caller.route, caller.key.as_ref());
    let Some(svc) = gw.video.as_ref() else {
        return Err(ApiError::new(ErrorKind::NotFound, "Video generation is not configured on this gateway."));
    };
    match route {
        Route::VideoCreate { legacy } => {
            let body = video_body(gw, session, key).await?;
            // The key's guardrails read the request (its prompt) before the task is charged.
            let body = super::super::guarded::input(gw, ctx, caller, crate::config::Protocol::Openai, body).await?;
            let idem = header_str(session.req_header(), "idempotency-key").map(str::to_string);
            if idem.as_ref().is_some_and(|k| k.is_empty() || k.len() > 255) {
                return Err(ApiError::new(ErrorKind::BadRequest, "Idempotency-Key: 1 to 255 characters").with_param("Idempotency-Key"));
            }
            let payment = gw.charge.payment(key, &gw.routing.load().calendar)?;
            let (task, created) =
                svc.create(key, &payment, &body, (idem.as_deref(), super::super::guarded::price(ctx))).await.inspect_err(|_| {
                    // The bounded field reader, never a whole JSON tree: a refused body may be a bomb.
                    ctx.model_asked = crate::protocol::body_fields(&body).ok().and_then(|f| f.model);
                })?;
            ctx.model_asked = Some(task.api_model.clone());
            // A new task's charge (an Idempotency-Key's earlier task charged nothing now).
            if created && task.charged {
                ctx.video_charge = Some((task.price_multiplier.unwrap_or_default().apply(task.cost_nanos), task.duration));
            }
            let task = svc.present(task).await;
            Ok(Outcome::Respond(LocalResponse::json(200, &task.to_json(true, *legacy))))
        }
        Route::VideoGet { id, legacy } => {
            let task = svc.present(svc.get(key, id).await?).await;
            Ok(Outcome::Respond(LocalResponse::json(200, &task.to_json(false, *legacy))))
        }
        Route::VideoContent { id } => {
            video::http::serve_content(svc, session, key, id).await?;
            Ok(Outcome::Done)
        }
        Route::VideoList => {
            let page = super::super::paging::Page::of(session.req_header().uri.query(), 100, 20, true)?;
            let (tasks, has_more) = svc.list(key, page.after.as_deref(), page.limit, page.newest_first).await?;
            let data: Vec<serde_json::Value> = tasks.iter().map(|t| t.to_json(false, false)).collect();
            let body = crate::protocol::openai::list_page(data, |v| v.get("id").and_then(serde_json::Value::as_str), has_more);
            Ok(Outcome::Respond(LocalResponse::json(200, &body)))
        }
        Route::VideoDelete { id } => {
            svc.delete(key, id).await?;
            let body = serde_json::json!({"id": id, "object": "video.deleted", "deleted": true});
            Ok(Outcome::Respond(LocalResponse::json(200, &body)))
        }
        _ => Err(ApiError::new(ErrorKind::Internal, "not a video route")),
    }
}

/// A create-task body: JSON as sent, or a form (the OpenAI SDK's `videos.create`) as the
/// JSON it stands for (`video::request::form_body`).
async fn video_body(gw: &Gateway, session: &mut Session, key: &KeyRecord) -> std::result::Result<bytes::Bytes, ApiError> {
    let boundary = header_str(session.req_header(), http::header::CONTENT_TYPE).and_then(crate::protocol::multipart::boundary);
    let Some(boundary) = boundary else { return Ok(crate::edge::body::read(session, &gw.body).await?.bytes) };
    let (form, _spooled) = crate::edge::upload::read_form(session, &gw.uploads, &boundary, &key.id).await?;
    let form = std::sync::Arc::new(form);
    let body = tokio::task::spawn_blocking(move || video::request::form_body(&form))
        .await
        .map_err(|e| ApiError::new(ErrorKind::Internal, format!("form: {e}")))??;
    Ok(bytes::Bytes::from(body))
}
