//! An upstream's answer as the gateway reads it: the HTTP session, and where the provider's
//! seam frames the answer otherwise than its wire protocol (Bedrock's event stream), the
//! header and every body chunk decoded into the wire protocol's framing first — so metering,
//! translation and the client see one framing whatever the kind of upstream.

use super::seam::{Decode, Seam};
use bytes::Bytes;
use pingora_core::protocols::http::client::HttpSession;
use pingora_http::ResponseHeader;

pub struct Reply {
    http: HttpSession,
    /// The decoded header (None: the session's own, undecoded).
    header: Option<Box<ResponseHeader>>,
    decoder: Option<Box<dyn Decode>>,
}

impl Reply {
    /// The answer of `http` (its header read) from a provider with seam `seam`.
    pub fn new(http: HttpSession, seam: &dyn Seam) -> Reply {
        let decoder = http.response_header().and_then(|h| seam.decoder(h));
        let header = match (&decoder, http.response_header()) {
            (Some(d), Some(h)) => {
                let mut header = Box::new(h.clone());
                d.header(&mut header);
                Some(header)
            }
            _ => None,
        };
        Reply { http, header, decoder }
    }

    pub fn response_header(&self) -> Option<&ResponseHeader> {
        self.header.as_deref().or_else(|| self.http.response_header())
    }

    /// The next chunk of the body, decoded (possibly empty while a frame is incomplete).
    pub async fn read_response_body(&mut self) -> pingora_error::Result<Option<Bytes>> {
        let chunk = self.http.read_response_body().await?;
        Ok(match (&mut self.decoder, chunk) {
            (None, chunk) => chunk,
            (Some(d), Some(data)) => Some(d.decode(&data)),
            (Some(d), None) => Some(d.finish()).filter(|rest| !rest.is_empty()),
        })
    }

    pub fn response_done(&mut self) -> bool {
        self.http.response_done()
    }

    pub async fn shutdown(&mut self) {
        self.http.shutdown().await;
    }

    /// The session, to give back to the connection pool.
    pub fn into_inner(self) -> HttpSession {
        self.http
    }
}
