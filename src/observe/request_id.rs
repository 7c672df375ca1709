//! Every answer of the public listener carries `X-Request-Id`: the client's, when it sent a
//! well-formed one (1 to 128 letters, digits, `.`, `_`, `-`), else one made here. It is the
//! request log's id for the request (see `records::log`). Decided by a per-request Pingora
//! module when the request header arrives.

use async_trait::async_trait;
use pingora_core::modules::http::{HttpModule, HttpModuleBuilder, Module};
use pingora_http::{RequestHeader, ResponseHeader};
use std::any::Any;

pub const HEADER: &str = "x-request-id";

/// Whether a client's request id may be used as is.
pub fn well_formed(id: &str) -> bool {
    (1..=128).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A new request id: `req_` and 24 random base-62 characters (eight from each of three random
/// words: made on every request without an id of its own, so without a draw per character).
pub fn new_id() -> String {
    use rand::RngCore;
    let mut rng = rand::thread_rng();
    let mut id = String::with_capacity(28);
    id.push_str("req_");
    for _ in 0..3 {
        let mut word = rng.next_u64();
        for _ in 0..8 {
            id.push(char::from(crate::base::secrets::BASE62[(word % 62) as usize]));
            word /= 62;
        }
    }
    id
}

/// The per-request module that decides the request's id when its header arrives and puts it
/// on every response header written for it (local answers, refusals, relayed answers alike).
#[derive(Debug, Default)]
pub struct RequestId {
    pub id: String,
}

#[async_trait]
impl HttpModule for RequestId {
    async fn request_header_filter(&mut self, req: &mut RequestHeader) -> pingora_error::Result<()> {
        self.id = match req.headers.get(HEADER).and_then(|v| v.to_str().ok()) {
            Some(id) if well_formed(id) => id.to_string(),
            _ => new_id(),
        };
        Ok(())
    }

    async fn response_header_filter(&mut self, resp: &mut ResponseHeader, _end_of_stream: bool) -> pingora_error::Result<()> {
        if self.id.is_empty() {
            self.id = new_id();
        }
        resp.insert_header(HEADER, self.id.as_str())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// Builds [`RequestId`] for each request.
pub struct RequestIdBuilder;

impl HttpModuleBuilder for RequestIdBuilder {
    fn init(&self) -> Module {
        Box::new(RequestId::default())
    }
}

/// The request's id, as the module decided it.
pub fn id_of(session: &pingora_proxy::Session) -> Option<&str> {
    session.downstream_modules_ctx.get::<RequestId>().map(|m| m.id.as_str()).filter(|id| !id.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids() {
        assert!(well_formed("abc-123_x.y") && well_formed(&"a".repeat(128)));
        for bad in ["", "a b", "ä", "a/b", &"a".repeat(129)] {
            assert!(!well_formed(bad), "{bad}");
        }
        let id = new_id();
        assert!(id.starts_with("req_") && well_formed(&id) && id.len() == 28);
    }
}
