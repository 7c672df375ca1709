//! The answers of Bedrock-format calls reshaped on their way out: a downstream module that
//! every answer passes through, idle but for a request [`activate`]d by the gateway, whose
//! `200` messages answer it rewrites — a stream (`text/event-stream`) event by event as
//! `InvokeModelWithResponseStream`'s or `ConverseStream`'s AWS event-stream frames
//! (`protocol::cloud_ingress::Frames`), a whole answer as a `ConverseResponse`
//! (`protocol::converse::answer`) — whichever path wrote it (relayed, translated, read by the
//! guardrails). Refusals and errors pass unchanged.

use crate::protocol::cloud_ingress::{Frames, Reshape};
use async_trait::async_trait;
use bytes::Bytes;
use pingora_core::modules::http::{HttpModule, HttpModuleBuilder, Module};
use pingora_http::ResponseHeader;
use std::any::Any;

enum Doing {
    Frames(Frames),
    /// A whole answer collected (at most the bound) to be rewritten at its end.
    Whole(Vec<u8>, std::time::Instant),
}

#[derive(Default)]
pub struct IngressFraming {
    /// Set for a Bedrock call: how, and the largest event (or answer) held.
    wanted: Option<(Reshape, usize)>,
    doing: Option<Doing>,
}

/// Reshape this request's answer (see the module doc).
pub fn activate(session: &mut pingora_proxy::Session, reshape: Reshape, max_event: usize) {
    if let Some(m) = session.downstream_modules_ctx.get_mut::<IngressFraming>() {
        m.wanted = Some((reshape, max_event));
    }
}

/// The largest whole answer rewritten as a `ConverseResponse`.
const MAX_WHOLE: usize = 64 << 20;

#[async_trait]
impl HttpModule for IngressFraming {
    async fn response_header_filter(&mut self, resp: &mut ResponseHeader, _end_of_stream: bool) -> pingora_error::Result<()> {
        let Some((reshape, max_event)) = self.wanted else { return Ok(()) };
        let content_type = |v: &[u8]| resp.headers.get(http::header::CONTENT_TYPE).is_some_and(|c| c.as_bytes().starts_with(v));
        if resp.status.as_u16() != 200 {
            return Ok(());
        }
        self.doing = match reshape {
            Reshape::InvokeFrames if content_type(b"text/event-stream") => Some(Doing::Frames(Frames::new(max_event))),
            Reshape::ConverseFrames if content_type(b"text/event-stream") => Some(Doing::Frames(Frames::converse(max_event))),
            Reshape::ConverseJson if content_type(b"application/json") => Some(Doing::Whole(Vec::new(), std::time::Instant::now())),
            _ => None,
        };
        match self.doing {
            Some(Doing::Frames(_)) => resp.insert_header(http::header::CONTENT_TYPE, "application/vnd.amazon.eventstream")?,
            Some(Doing::Whole(..)) => {}
            None => return Ok(()),
        }
        resp.remove_header(&http::header::CONTENT_LENGTH);
        Ok(())
    }

    fn response_body_filter(&mut self, body: &mut Option<Bytes>, end_of_stream: bool) -> pingora_error::Result<()> {
        match self.doing.as_mut() {
            None => {}
            Some(Doing::Frames(frames)) => {
                let mut out = body.take().map(|b| frames.feed(&b)).unwrap_or_default();
                if end_of_stream {
                    let rest = frames.finish();
                    if !rest.is_empty() {
                        let mut joined = Vec::with_capacity(out.len() + rest.len());
                        joined.extend_from_slice(&out);
                        joined.extend_from_slice(&rest);
                        out = Bytes::from(joined);
                    }
                }
                *body = Some(out);
            }
            Some(Doing::Whole(held, started)) => {
                if let Some(b) = body.take() {
                    if held.len() + b.len() <= MAX_WHOLE {
                        held.extend_from_slice(&b);
                    }
                }
                if end_of_stream {
                    let latency = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                    let whole = std::mem::take(held);
                    *body = Some(Bytes::from(crate::protocol::converse::answer(&whole, latency).unwrap_or(whole)));
                } else {
                    *body = Some(Bytes::new());
                }
            }
        }
        Ok(())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

pub struct IngressFramingBuilder;

impl HttpModuleBuilder for IngressFramingBuilder {
    fn init(&self) -> Module {
        Box::new(IngressFraming::default())
    }
}
