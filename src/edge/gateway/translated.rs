//! The answer of a translated relay (the provider speaks another protocol than the client; see
//! `translate`). The provider's bytes are metered as they come, in its own protocol, so the
//! bill is the provider's count exactly as for a native relay; what the client gets is
//! re-encoded: a whole answer once it is complete, a stream event by event.

use super::send::retry_after;
use super::stream::upstream_request_id;
use super::{Gateway, RelayPlan, RequestCtx};
use crate::billing::meter::{Shape, UsageScanner};
use crate::config::Protocol;
use crate::protocol::response::LocalResponse;

use crate::translate::{self, StreamTranslator, Translation};
use crate::upstream::Reply;
use bytes::Bytes;
use pingora_core::protocols::http::client::HttpSession;
use pingora_core::upstreams::peer::{HttpPeer, Peer};
use pingora_error::{Error, ErrorType, Result};
use pingora_http::ResponseHeader;
use pingora_proxy::Session;

/// How the provider's answer reports usage.
fn shape_of(upstream: Protocol) -> Shape {
    match upstream {
        Protocol::Openai => Shape::Chat,
        Protocol::Anthropic => Shape::Messages,
        Protocol::Gemini => Shape::Gemini,
    }
}

impl Gateway {
    /// Relay the provider's answer (its header read by `open_upstream`) to the client in the
    /// client's protocol.
    pub(super) async fn relay_translated(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        plan: &mut RelayPlan,
        mut http: Reply,
        peer: HttpPeer,
        t: Translation,
    ) -> Result<()> {
        let shape = plan.protocol;
        let Some(upstream_header) = http.response_header() else {
            return Err(Error::explain(ErrorType::InvalidHTTPHeader, "no response header"));
        };
        let status = upstream_header.status.as_u16();
        plan.happened.upstream_request_id = upstream_request_id(upstream_header);
        let retry_after = retry_after(upstream_header).map(|d| d.as_secs().max(1));
        let sse = upstream_header.headers.get(http::header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        let series = self.metrics.protocol(shape);
        series.upstream_seconds.observe(plan.started.elapsed());
        if !(200..300).contains(&status) {
            // A stream that failed before its first byte is a real error, in the client's shape,
            // with the provider's status, as a native relay's.
            return Box::pin(self.relay_error(session, ctx, plan, (http, peer), (status, retry_after), shape_of(t.upstream))).await;
        }
        let mut scanner = UsageScanner::new(shape_of(t.upstream), sse, false);
        if plan.sampled() {
            scanner.read_answer();
        }
        if !t.stream {
            return Box::pin(self.answer_whole(session, ctx, plan, (http, peer), &t, (status, scanner))).await;
        }

        let mut header = Box::new(ResponseHeader::build(status, Some(4))?);
        header.insert_header(http::header::CONTENT_TYPE, t.content_type())?;
        header.insert_header(http::header::CACHE_CONTROL, "no-cache")?;
        header.set_version(http::Version::HTTP_11);
        header.insert_header(http::header::TRANSFER_ENCODING, "chunked")?;
        if plan.chained {
            header.insert_header(crate::upstream::fallback::SERVED_MODEL, plan.model.as_str())?;
        }
        if let Some(verdict) = self.cache_begin(plan, status, t.content_type()) {
            header.insert_header(&super::cached::HEADER, verdict)?;
        }
        let _open_stream = crate::observe::metrics::Live::new(&self.metrics, crate::observe::metrics::Gauge::OpenStreams);
        ctx.response_started = true;
        if let Err(e) = session.write_response_header(header, false).await {
            Box::pin(self.drain(&mut http, plan, &mut scanner, status)).await;
            return Err(e.into_down());
        }
        let mut translator = StreamTranslator::new(&t);
        let opening = translator.start();
        Self::capture(plan, &opening);
        if !opening.is_empty() {
            if let Err(e) = session.write_response_body(Some(Bytes::from(opening)), false).await {
                Box::pin(self.drain(&mut http, plan, &mut scanner, status)).await;
                return Err(e.into_down());
            }
        }
        let mut first_byte = true;
        loop {
            let (chunk, done) = self.next_chunk(&mut http, plan, &mut scanner, status).await?;
            let mut out = Vec::new();
            if let Some(data) = chunk {
                if first_byte && !data.is_empty() {
                    first_byte = false;
                    let after = plan.started.elapsed();
                    plan.happened.first_byte = Some(after);
                    series.first_byte_seconds.observe(after);
                }
                scanner.feed(&data);
                match translator.feed(&data) {
                    Ok(bytes) => out = bytes,
                    Err(translate::stream::Broken) => {
                        // Billed for what came; the client's stream ends with its error event.
                        log::warn!("upstream stream of a translated request has an event over limits.max_event_bytes; ended");
                        Box::pin(self.abandon(&mut http, plan, &mut scanner, status)).await;
                        let last = Bytes::from(translator.fail());
                        return session.write_response_body(Some(last), true).await.map_err(|e| e.into_down());
                    }
                }
            }
            if done {
                out.extend(translator.finish());
            }
            Self::capture(plan, &out);
            let mut out = Bytes::from(out);
            if plan.guard.as_ref().is_some_and(|g| g.streams()) {
                let (guarded, blocked) = self.guard_chunk(plan, Some(out), done).await;
                out = guarded.unwrap_or_default();
                if blocked {
                    return Box::pin(self.end_blocked(session, (&mut http, &mut scanner), plan, Some(out), (status, done))).await;
                }
            }
            if done {
                // Settled before the client sees the end, as a native relay.
                Box::pin(self.settle(plan, Some(&mut scanner), status)).await;
                Box::pin(self.keep_answer(plan)).await;
                return Box::pin(self.end_relay(session, http, &peer, Some(out))).await;
            }
            if !out.is_empty() {
                if let Err(e) = session.write_response_body(Some(out), false).await {
                    Box::pin(self.drain(&mut http, plan, &mut scanner, status)).await;
                    return Err(e.into_down());
                }
            }
        }
    }

    /// A translated answer that is not streamed: read whole, settled, translated, sent. Its own
    /// future (boxed by the caller), so a stream's state does not carry this path's.
    async fn answer_whole(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        plan: &mut RelayPlan,
        (mut http, peer): (Reply, HttpPeer),
        t: &Translation,
        (status, mut scanner): (u16, UsageScanner),
    ) -> Result<()> {
        let shape = plan.protocol;
        let mut held = self.body.budget.reservation();
        let body = match self.read_answer((&mut http, &mut scanner), plan, status, &mut held).await {
            Ok(body) => body,
            Err(err) => return LocalResponse::error(&err, shape).send(session).await,
        };
        self.settle(plan, Some(&mut scanner), status).await;
        let idle = peer.idle_timeout();
        if let HttpSession::H1(h1) = http.into_inner() {
            self.connector.release_http_session(h1, &peer, idle).await;
        }
        let translated = match translate::response(t, &body) {
            Ok(bytes) => self.guard_whole(plan, bytes).await,
            Err(err) => {
                log::warn!("a translated answer could not be read ({} -> {})", t.upstream.as_str(), t.client.as_str());
                Err(err)
            }
        };
        let response = match translated {
            Ok(bytes) => {
                let mut headers =
                    if plan.chained { vec![(crate::upstream::fallback::SERVED_MODEL, plan.model.clone())] } else { Vec::new() };
                if let Some(verdict) = self.cache_begin(plan, status, "application/json") {
                    headers.push(("x-tollgate-cache", verdict.to_string()));
                    Self::capture(plan, &bytes);
                    Box::pin(self.keep_answer(plan)).await;
                }
                LocalResponse { status, body: Bytes::from(bytes), content_type: "application/json", headers }
            }
            Err(err) => {
                self.note_refusal(ctx, err.kind.reason());
                LocalResponse::error(&err, shape)
            }
        };
        ctx.response_started = true;
        response.send(session).await
    }
}
