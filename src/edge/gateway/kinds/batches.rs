//! The batch endpoints (a stage-2 answer), answered by the batch service: create (charged its
//! worst case, see `crate::batch`), the key's list, one batch, cancel.

use super::super::admit::Caller;
use super::super::{Gateway, Outcome, RequestCtx};
use crate::protocol::response::LocalResponse;
use crate::protocol::{ApiError, ErrorKind};
use crate::records::key::KeyRecord;
use crate::route::BatchOp;
use crate::upstream::Routing;
use pingora_proxy::Session;
use std::sync::Arc;

/// A batch: charged its worst case at creation, each line checked; settled when it ends.
pub(in crate::edge::gateway) struct Batches;

#[async_trait::async_trait]
impl super::Answered for Batches {
    fn platform(&self) -> Option<crate::config::Platform> {
        Some(crate::config::Platform::Openai)
    }

    fn entry(&self) -> crate::charge::Entry {
        crate::charge::Entry::KEYED
    }

    async fn run(
        &self,
        gw: &Gateway,
        session: &mut Session,
        ctx: &mut RequestCtx,
        caller: &Caller,
    ) -> std::result::Result<Outcome, ApiError> {
        let crate::route::Route::Batches { op } = &caller.route else {
            return Err(ApiError::new(ErrorKind::Internal, "not a batches route"));
        };
        batches_route(gw, session, ctx, op, &caller.key, &caller.routing).await
    }
}

pub(super) async fn batches_route(
    gw: &Gateway,
    session: &mut Session,
    ctx: &mut RequestCtx,
    op: &BatchOp,
    key: &KeyRecord,
    routing: &Arc<Routing>,
) -> std::result::Result<Outcome, ApiError> {
    let Some(batches) = gw.batches.as_ref() else {
        return Err(ApiError::new(ErrorKind::NotFound, "Batches are not available on this gateway."));
    };
    let batch = match op {
        BatchOp::Create => {
            let body = crate::edge::body::read(session, &gw.body).await?.bytes;
            let payment = gw.charge.payment(key, &routing.calendar)?;
            batches.create(key, &payment, &body, super::super::guarded::applying(gw, routing, key)).await?
        }
        BatchOp::Get(id) => batches.get(key, id).await?,
        BatchOp::Cancel(id) => batches.cancel(key, id).await?,
        BatchOp::List => {
            let page = super::super::paging::Page::of(session.req_header().uri.query(), 100, 20, false)?;
            let (list, has_more) = batches.list(key, page.after.as_deref(), page.limit).await?;
            let items = list.iter().map(crate::batch::record::Batch::view).collect();
            let body = crate::protocol::openai::list_page(items, |v| v.get("id").and_then(serde_json::Value::as_str), has_more);
            return Ok(Outcome::Respond(LocalResponse::json(200, &body)));
        }
    };
    ctx.model_asked = Some(batch.model.clone());
    Ok(Outcome::Respond(LocalResponse::json(200, &batch.view())))
}
