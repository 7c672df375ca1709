//! The video task endpoints, answered by the video service (a stage-2 answer: a video
//! request is never relayed as a model call).

use super::{Gateway, Outcome, RequestCtx};
use crate::protocol::response::LocalResponse;
use crate::protocol::{header_str, ApiError, ErrorKind};
use crate::records::key::KeyRecord;
use crate::route::Route;
use crate::video;
use pingora_proxy::Session;

impl Gateway {
    /// The video task endpoints.
    pub(super) async fn video_route(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        route: &Route,
        key: &KeyRecord,
    ) -> std::result::Result<Outcome, ApiError> {
        let Some(svc) = self.video.as_ref() else {
            return Err(ApiError::new(ErrorKind::NotFound, "Video generation is not configured on this gateway."));
        };
        match route {
            Route::VideoCreate { legacy } => {
                let body = crate::edge::body::read(session, &self.body).await?;
                let idem = header_str(session.req_header(), "idempotency-key").map(str::to_string);
                if idem.as_ref().is_some_and(|k| k.is_empty() || k.len() > 255) {
                    return Err(ApiError::new(ErrorKind::BadRequest, "Idempotency-Key: 1 to 255 characters").with_param("Idempotency-Key"));
                }
                let purses = self.purses(&self.routing.load(), key)?;
                let (task, created) = svc.create(key, &purses, &body.bytes, idem.as_deref()).await.inspect_err(|_| {
                    // The bounded field reader, never a whole JSON tree: a refused body may be a bomb.
                    ctx.model_asked = crate::protocol::body_fields(&body.bytes).ok().and_then(|f| f.model);
                })?;
                ctx.model_asked = Some(task.api_model.clone());
                // A new task's charge (an Idempotency-Key's earlier task charged nothing now).
                if created && task.charged {
                    ctx.video_charge = Some((task.cost_nanos, task.duration));
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
            _ => Err(ApiError::new(ErrorKind::Internal, "not a video route")),
        }
    }
}
