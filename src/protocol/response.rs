//! The one builder for every response tollgate answers itself (model lists, errors, usage).

use crate::protocol::ApiError;
use crate::protocol::Protocol;
use bytes::Bytes;
use pingora_http::ResponseHeader;
use pingora_proxy::Session;

/// A complete local response.
#[derive(Debug)]
pub struct LocalResponse {
    pub status: u16,
    pub body: Bytes,
    pub content_type: &'static str,
    pub headers: Vec<(&'static str, String)>,
}

impl LocalResponse {
    pub fn json(status: u16, value: &serde_json::Value) -> Self {
        LocalResponse { status, body: Bytes::from(value.to_string()), content_type: "application/json", headers: Vec::new() }
    }

    /// An error in `shape`, with `Retry-After` when the error carries one.
    pub fn error(err: &ApiError, shape: Protocol) -> Self {
        let mut headers = Vec::new();
        if let Some(secs) = err.retry_after {
            headers.push(("retry-after", secs.to_string()));
        }
        LocalResponse { status: err.status(), body: Bytes::from(err.body(shape)), content_type: "application/json", headers }
    }

    /// Write the whole response to the client.
    pub async fn send(self, session: &mut Session) -> pingora_error::Result<()> {
        let mut header = ResponseHeader::build(self.status, Some(4 + self.headers.len()))?;
        header.insert_header("content-type", self.content_type)?;
        header.insert_header("content-length", self.body.len().to_string())?;
        for (name, value) in self.headers {
            // Each cookie is a header of its own; any other name given twice: the last wins.
            if name == "set-cookie" {
                header.append_header(name, value)?;
            } else {
                header.insert_header(name, value)?;
            }
        }
        session.write_response_header(Box::new(header), false).await?;
        session.write_response_body(Some(self.body), true).await?;
        Ok(())
    }
}
