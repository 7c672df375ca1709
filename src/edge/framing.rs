//! The answer of a Bedrock-format stream (`/model/{id}/invoke-with-response-stream`) in AWS
//! event-stream frames: a downstream module that every answer passes through, idle but for a
//! request [`activate`]d by the gateway, whose `200 text/event-stream` answer it rewrites
//! event by event (`protocol::cloud_ingress::Frames`) — whichever path wrote it (relayed,
//! translated, read by the guardrails). Refusals and errors pass unchanged.

use crate::protocol::cloud_ingress::Frames;
use async_trait::async_trait;
use bytes::Bytes;
use pingora_core::modules::http::{HttpModule, HttpModuleBuilder, Module};
use pingora_http::ResponseHeader;
use std::any::Any;

#[derive(Default)]
pub struct IngressFraming {
    /// Set for a Bedrock stream: the largest event held while incomplete.
    wanted: Option<usize>,
    frames: Option<Frames>,
}

/// Frame this request's stream (see the module doc).
pub fn activate(session: &mut pingora_proxy::Session, max_event: usize) {
    if let Some(m) = session.downstream_modules_ctx.get_mut::<IngressFraming>() {
        m.wanted = Some(max_event);
    }
}

#[async_trait]
impl HttpModule for IngressFraming {
    async fn response_header_filter(&mut self, resp: &mut ResponseHeader, _end_of_stream: bool) -> pingora_error::Result<()> {
        let Some(max_event) = self.wanted else { return Ok(()) };
        let sse = resp.headers.get(http::header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        if resp.status.as_u16() == 200 && sse {
            resp.insert_header(http::header::CONTENT_TYPE, "application/vnd.amazon.eventstream")?;
            resp.remove_header(&http::header::CONTENT_LENGTH);
            self.frames = Some(Frames::new(max_event));
        }
        Ok(())
    }

    fn response_body_filter(&mut self, body: &mut Option<Bytes>, end_of_stream: bool) -> pingora_error::Result<()> {
        let Some(frames) = self.frames.as_mut() else { return Ok(()) };
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
