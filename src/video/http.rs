//! The video endpoints' HTTP side that cannot be a plain JSON answer: streaming the result
//! video to the client (with `Range`), from the task's URL.

use super::{VideoService, RESULT_URL_TTL_SECS};
use crate::base::clock::now_unix;
use crate::protocol::{ApiError, ErrorKind};
use crate::records::key::KeyRecord;
use crate::records::task::Status;
use crate::store::objects::StorageError;
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
    let range = session.req_header().headers.get("range").and_then(|v| v.to_str().ok()).map(str::to_string);
    if let (Some(storage), Some(key)) = (svc.storage(), task.storage_key.as_deref()) {
        let download = storage.get(key, range.as_deref()).await.map_err(|e| match e {
            StorageError::NotFound => ApiError::new(ErrorKind::Gone, "The stored video is no longer available."),
            other => {
                log::warn!("video {id}: storage read failed: {other}");
                ApiError::new(ErrorKind::BadGateway, "The result video could not be read. Retry later.")
            }
        })?;
        let head = Head {
            status: download.status,
            content_type: download.content_type,
            content_length: download.content_length.map(|l| l.to_string()),
            content_range: download.content_range,
        };
        let body = Box::pin(futures_util::stream::unfold(download.body, |mut b| async move { b.next().await.map(|r| (r, b)) }));
        return stream_out(session, id, head, body).await;
    }
    let Some(url) = task.url.as_deref() else {
        return Err(ApiError::new(ErrorKind::Conflict, "The task has no result URL."));
    };
    if task.completed_at.is_some_and(|at| now_unix().saturating_sub(at) > RESULT_URL_TTL_SECS) {
        return Err(expired());
    }
    let mut request = svc.download.get(url);
    if let Some(range) = &range {
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
    let up = upstream.headers();
    let text = |name: &str| up.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    let head =
        Head { status, content_type: text("content-type"), content_length: text("content-length"), content_range: text("content-range") };
    stream_out(session, id, head, upstream.bytes_stream()).await
}

/// The response head of a video download.
struct Head {
    status: u16,
    content_type: Option<String>,
    content_length: Option<String>,
    content_range: Option<String>,
}

/// Write the head, then the body chunk by chunk. An `Err` means nothing was written yet.
async fn stream_out<S, E>(session: &mut Session, id: &str, head: Head, mut body: S) -> Result<(), ApiError>
where
    S: futures_util::Stream<Item = Result<bytes::Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let header_err = |_| ApiError::new(ErrorKind::Internal, "Could not build the response.");
    let mut header = ResponseHeader::build(head.status, Some(5)).map_err(header_err)?;
    header.insert_header("content-type", head.content_type.unwrap_or_else(|| "video/mp4".into())).map_err(header_err)?;
    if let Some(len) = head.content_length {
        header.insert_header("content-length", len).map_err(header_err)?;
    }
    if let Some(range) = head.content_range {
        header.insert_header("content-range", range).map_err(header_err)?;
    }
    header.insert_header("accept-ranges", "bytes").map_err(header_err)?;
    let client_gone = |e: pingora_error::BError| {
        log::debug!("video {id}: client went away: {e}");
    };
    if let Err(e) = session.write_response_header(Box::new(header), false).await {
        client_gone(e);
        return Ok(());
    }
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
