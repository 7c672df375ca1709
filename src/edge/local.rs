//! A listener that answers every request itself, with no upstream: the admin API and the
//! metrics listener. One `ProxyHttp` for both: the service's [`Answer`] is called, an error goes
//! out in the chat-completions error shape and ends the connection, and the next request on a
//! kept-alive connection gets fresh header bounds (see `listener`).

use crate::protocol::response::LocalResponse;
use crate::protocol::{ApiError, Protocol};
use async_trait::async_trait;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::{Error, ErrorType, Result};
use pingora_proxy::{ProxyHttp, Session};

/// What a local service answers one request with.
#[async_trait]
pub trait Answer: Send + Sync + 'static {
    async fn answer(&self, session: &mut Session) -> std::result::Result<LocalResponse, ApiError>;
}

/// A local service as Pingora serves it.
pub struct Local<T>(pub T);

#[async_trait]
impl<T: Answer> ProxyHttp for Local<T> {
    type CTX = ();

    fn new_ctx(&self) {}

    async fn request_filter(&self, session: &mut Session, _ctx: &mut ()) -> Result<bool> {
        let resp = match self.0.answer(session).await {
            Ok(r) => r,
            Err(e) => {
                session.set_keepalive(None);
                LocalResponse::error(&e, Protocol::Openai)
            }
        };
        resp.send(session).await?;
        Ok(true)
    }

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
        Err(Error::explain(ErrorType::InternalError, "a local service has no upstream"))
    }

    /// The next request on this connection gets fresh header bounds (see `listener`).
    async fn logging(&self, session: &mut Session, _e: Option<&pingora_error::Error>, _ctx: &mut ()) {
        crate::edge::listener::request_done(session.as_downstream());
    }
}
