//! The files endpoints (a stage-2 answer), answered by the file service: an upload read as a
//! bounded multipart form (spooled to disk), the key's list, one file, its bytes streamed, a
//! delete.

use super::super::admit::Caller;
use super::super::{Gateway, Outcome, RequestCtx};
use crate::protocol::response::LocalResponse;
use crate::protocol::{header_str, ApiError, ErrorKind};
use crate::records::key::KeyRecord;
use crate::route::FileOp;
use futures_util::StreamExt;
use pingora_http::ResponseHeader;
use pingora_proxy::Session;

/// A key's files: uploaded, listed, read, deleted (nothing billed; a key below zero is refused).
pub(in crate::edge::gateway) struct Files;

#[async_trait::async_trait]
impl super::Answered for Files {
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
        _ctx: &mut RequestCtx,
        caller: &Caller,
    ) -> std::result::Result<Outcome, ApiError> {
        let crate::route::Route::Files { op } = &caller.route else { return Err(ApiError::new(ErrorKind::Internal, "not a files route")) };
        files_route(gw, session, op, &caller.key).await
    }
}

pub(super) async fn files_route(
    gw: &Gateway,
    session: &mut Session,
    op: &FileOp,
    key: &KeyRecord,
) -> std::result::Result<Outcome, ApiError> {
    let files = &gw.files;
    match op {
        FileOp::Upload => {
            let boundary = header_str(session.req_header(), http::header::CONTENT_TYPE).and_then(crate::protocol::multipart::boundary);
            let boundary = boundary.ok_or_else(|| {
                ApiError::new(ErrorKind::BadRequest, "A file is uploaded as multipart/form-data with 'purpose' and 'file'.")
            })?;
            let (form, _spooled) = crate::edge::upload::read_form(session, &gw.uploads, &boundary, &key.id).await?;
            let file = files.create(&key.id, &form).await?;
            Ok(Outcome::Respond(LocalResponse::json(200, &serde_json::json!(file))))
        }
        FileOp::List => {
            let page = super::super::paging::Page::of(session.req_header().uri.query(), 10_000, 10_000, false)?;
            let (data, has_more) = files.list(&key.id, page.after.as_deref(), page.limit).await?;
            let items = data.iter().map(|f| serde_json::json!(f)).collect();
            let body = crate::protocol::openai::list_page(items, |v| v.get("id").and_then(serde_json::Value::as_str), has_more);
            Ok(Outcome::Respond(LocalResponse::json(200, &body)))
        }
        FileOp::Get(id) => Ok(Outcome::Respond(LocalResponse::json(200, &serde_json::json!(files.get(&key.id, id).await?)))),
        FileOp::Delete(id) => {
            files.delete(&key.id, id).await?;
            Ok(Outcome::Respond(LocalResponse::json(200, &serde_json::json!({"id": id, "object": "file", "deleted": true}))))
        }
        FileOp::Content(id) => {
            let (file, mut content) = files.content(&key.id, id).await?;
            let mut header = ResponseHeader::build(200, Some(3)).map_err(|e| internal(&e))?;
            header.insert_header(http::header::CONTENT_TYPE, "application/octet-stream").map_err(|e| internal(&e))?;
            header.insert_header(http::header::CONTENT_LENGTH, file.bytes).map_err(|e| internal(&e))?;
            if session.write_response_header(Box::new(header), false).await.is_err() {
                return Ok(Outcome::Done);
            }
            while let Some(chunk) = content.next().await {
                match chunk {
                    Ok(bytes) => {
                        if session.write_response_body(Some(bytes), false).await.is_err() {
                            return Ok(Outcome::Done);
                        }
                    }
                    Err(e) => {
                        // The header went out: the client sees a cut body.
                        log::warn!("files: {id}: reading its bytes failed: {e}");
                        session.set_keepalive(None);
                        return Ok(Outcome::Done);
                    }
                }
            }
            let _ = session.write_response_body(None, true).await;
            Ok(Outcome::Done)
        }
    }
}

fn internal(e: &pingora_error::Error) -> ApiError {
    log::error!("files: {e}");
    ApiError::new(ErrorKind::Internal, "Internal gateway error.")
}
