//! The video endpoints' HTTP side that cannot be a plain JSON answer: streaming the result
//! video to the client (with `Range`), from the task's URL.

use super::task::Status;
use super::{VideoService, RESULT_URL_TTL_SECS};
use crate::auth::now_unix;
use crate::protocol::{ApiError, ErrorKind};
use crate::store::KeyRecord;
use futures_util::StreamExt;
use pingora_http::ResponseHeader;
use pingora_proxy::Session;

fn expired() -> ApiError {
    ApiError::new(
        ErrorKind::Gone,
        "The result video URL has expired (it is valid for 24 hours after completion). Download results promptly.",
    )
}

/// Stream the task's video to the client. An `Err` means nothing was written yet.
pub async fn serve_content(svc: &VideoService, session: &mut Session, key: &KeyRecord, id: &str) -> Result<(), ApiError> {
    let task = svc.get(key, id).await?;
    match task.status {
        Status::Completed => {}
        Status::Failed => {
            let why = task.error.as_ref().map_or("unknown error", |e| e.message.as_str());
            return Err(ApiError::new(ErrorKind::Conflict, format!("The task failed; there is no video: {why}")));
        }
        other => {
            return Err(ApiError::new(
                ErrorKind::Conflict,
                format!("The task is {}; the video is not ready yet. Poll GET /v1/videos/{id} until it is completed.", other.public()),
            ));
        }
    }
    let Some(url) = task.url.as_deref() else {
        return Err(ApiError::new(ErrorKind::Conflict, "The task has no result URL."));
    };
    if task.completed_at.is_some_and(|at| now_unix().saturating_sub(at) > RESULT_URL_TTL_SECS) {
        return Err(expired());
    }
    let mut request = svc.download.get(url);
    if let Some(range) = session.req_header().headers.get("range").and_then(|v| v.to_str().ok()) {
        request = request.header("range", range);
    }
    let upstream = request.send().await.map_err(|e| {
        log::warn!("video {id}: download failed: {e}");
        ApiError::new(ErrorKind::BadGateway, "The result video could not be fetched. Retry later.")
    })?;
    let status = upstream.status().as_u16();
    match status {
        200 | 206 => {}
        403 | 404 | 410 => return Err(expired()),
        416 => return Err(ApiError::new(ErrorKind::BadRequest, "The requested range is not satisfiable.").with_param("range")),
        _ => {
            log::warn!("video {id}: download answered {status}");
            return Err(ApiError::new(ErrorKind::BadGateway, "The result video could not be fetched. Retry later."));
        }
    }
    let header_err = |_| ApiError::new(ErrorKind::Internal, "Could not build the response.");
    let mut header = ResponseHeader::build(status, Some(5)).map_err(header_err)?;
    let up = upstream.headers();
    let content_type = up.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("video/mp4").to_string();
    header.insert_header("content-type", content_type).map_err(header_err)?;
    for name in ["content-length", "content-range", "last-modified", "etag"] {
        if let Some(v) = up.get(name).and_then(|v| v.to_str().ok()) {
            header.insert_header(name, v.to_string()).map_err(header_err)?;
        }
    }
    header.insert_header("accept-ranges", "bytes").map_err(header_err)?;
    let client_gone = |e: pingora_error::BError| {
        log::debug!("video {id}: client went away: {e}");
    };
    if let Err(e) = session.write_response_header(Box::new(header), false).await {
        client_gone(e);
        return Ok(());
    }
    let mut body = upstream.bytes_stream();
    while let Some(chunk) = body.next().await {
        match chunk {
            Ok(bytes) => {
                if let Err(e) = session.write_response_body(Some(bytes), false).await {
                    client_gone(e);
                    session.set_keepalive(None);
                    return Ok(());
                }
            }
            Err(e) => {
                log::warn!("video {id}: download cut: {e}");
                session.set_keepalive(None);
                return Ok(());
            }
        }
    }
    if let Err(e) = session.write_response_body(None, true).await {
        client_gone(e);
    }
    Ok(())
}
