//! Stage 5 continued, stream: the provider's answer to the client as it comes — its header
//! through the allowlist, its body chunk by chunk through the usage scanner (stream usage
//! tollgate asked for withheld), settled before the last byte; an error answer rewritten into
//! the client's shape; a client that left drained for the usage; a translated answer handed
//! to `translated`.

use super::send::{retry_after, upstream_failure};
use super::{Gateway, RelayPlan, RequestCtx};
use crate::base::clock::now_ms;
use crate::billing::meter::{Shape, UsageScanner};
use crate::config::Protocol;
use crate::protocol::response::LocalResponse;
use crate::protocol::{ApiError, ErrorKind};
use crate::route::Route;
use crate::upstream;
use crate::upstream::Reply;
use bytes::Bytes;
use pingora_core::protocols::http::client::HttpSession;
use pingora_core::upstreams::peer::{HttpPeer, Peer};
use pingora_error::{Error, ErrorType, Result};
use pingora_http::ResponseHeader;
use pingora_proxy::Session;
use std::time::Instant;

impl Gateway {
    /// Relay the planned request and stream its answer to the client, reading usage on the
    /// side. An `Err` after the response header went out ends the client's connection.
    ///
    /// This future lives as long as the stream (inside `request_filter`'s box), so whatever is
    /// awaited once per request — opening the upstream, an error answer, settling, the end, a
    /// drain — is boxed: inline, the largest of them set the size of every open stream's state
    /// (8.4 KiB before, issue 53; BENCHMARKS.md).
    pub(super) async fn relay(&self, session: &mut Session, ctx: &mut RequestCtx, plan: &mut RelayPlan) -> Result<()> {
        let shape = plan.protocol;
        if plan.cache.as_ref().is_some_and(|c| c.is_hit()) {
            return Box::pin(self.answer_cached(session, ctx, plan)).await;
        }
        // A call without fallbacks opens its upstream directly (the fallbacks' loop holds
        // the attempt loop's future inside its own: one more copy of it for every call).
        let opened = match plan.fallbacks.is_empty() {
            true => Box::pin(self.open_upstream(session.req_header(), plan)).await,
            false => Box::pin(self.open(session.req_header(), plan)).await,
        };
        let (mut http, peer) = match opened {
            Ok(opened) => opened,
            Err(e) => {
                log::warn!("relay failed: {e}");
                return Box::pin(self.refuse_unanswered(session, plan, upstream_failure(&e))).await;
            }
        };
        // The request is sent: its body is not needed while the answer streams (agent
        // requests are hundreds of KiB, their answers last minutes).
        plan.body = Bytes::new();
        if !plan.fallbacks.is_empty() {
            plan.fallbacks = Vec::new();
        }
        // An upload's files too: closed (their disk freed) with their share of the spool budget.
        plan.upload = None;
        plan.body_reservation = None;
        if let Some(t) = plan.translation.clone() {
            return Box::pin(self.relay_translated(session, ctx, plan, http, peer, t)).await;
        }
        // A small renamed answer keeps its exact length (read ahead once; see Reply::keep_length).
        http.keep_length().await;
        let Some(upstream_header) = http.response_header() else {
            let err = ApiError::new(ErrorKind::BadGateway, "The upstream service sent no response.");
            return Box::pin(self.refuse_unanswered(session, plan, err)).await;
        };
        let status = upstream_header.status.as_u16();
        if status >= 400 {
            let retry_after = retry_after(upstream_header).map(|d| d.as_secs().max(1));
            plan.happened.upstream_request_id = upstream_request_id(upstream_header);
            let usage = plan.route.usage_shape().unwrap_or(Shape::Chat);
            return Box::pin(self.relay_error(session, ctx, plan, (http, peer), (status, retry_after), usage)).await;
        }
        let mut header = Box::new(upstream_header.clone());
        plan.happened.upstream_request_id = upstream_request_id(&header);
        let series = self.metrics.protocol(shape);
        series.upstream_seconds.observe(plan.started.elapsed());
        let sse = header.headers.get(http::header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        let _open_stream = sse.then(|| crate::observe::metrics::Live::new(&self.metrics, crate::observe::metrics::Gauge::OpenStreams));
        let withhold = plan.withhold_usage && status == 200;
        prepare_response_header(&mut header, withhold, shape, &plan.routing.forward_response_headers)?;
        if plan.chained {
            header.insert_header(crate::upstream::fallback::SERVED_MODEL, plan.model.as_str())?;
        }
        self.cache_relayed(plan, &mut header, status)?;
        let mut scanner = UsageScanner::new(plan.route.usage_shape().unwrap_or(Shape::Chat), sse, withhold);
        if plan.sampled() {
            scanner.read_answer();
        }
        // Output guardrails: a stream is read as it flows; any other answer whole, before it goes.
        let guarded_stream = status == 200 && sse && plan.guard.as_ref().is_some_and(|g| g.streams());
        if status == 200 && plan.guard.is_some() && !guarded_stream {
            return Box::pin(self.answer_guarded(session, ctx, plan, (http, peer), (header, scanner, status))).await;
        }

        ctx.response_started = true;
        if let Err(e) = session.write_response_header(header, false).await {
            Box::pin(self.drain(&mut http, plan, &mut scanner, status)).await;
            return Err(e.into_down());
        }
        let mut first_byte = true;
        let mut response_named = plan.route != Route::Responses || !sse || status != 200;
        loop {
            let (chunk, done) = self.next_chunk(&mut http, plan, &mut scanner, status).await?;
            let mut out = chunk;
            if let Some(data) = out.as_ref() {
                if first_byte && !data.is_empty() {
                    first_byte = false;
                    let after = plan.started.elapsed();
                    plan.happened.first_byte = Some(after);
                    series.first_byte_seconds.observe(after);
                }
                // The cache keeps the upstream's bytes: a hit withholds its usage as this does.
                Self::capture(plan, data);
                if let Some(replacement) = scanner.feed(data) {
                    out = Some(replacement);
                }
                if !response_named {
                    response_named = self.note_streamed_response(plan, &scanner);
                }
            }
            if done {
                if let Some(rest) = scanner.take_pending() {
                    out = Some(match out {
                        Some(data) if !data.is_empty() => {
                            let mut joined = Vec::with_capacity(data.len() + rest.len());
                            joined.extend_from_slice(&data);
                            joined.extend_from_slice(&rest);
                            Bytes::from(joined)
                        }
                        _ => rest,
                    });
                }
            }
            if guarded_stream {
                let (guarded, blocked) = self.guard_chunk(plan, out, done).await;
                out = guarded;
                if blocked {
                    return Box::pin(self.end_blocked(session, (&mut http, &mut scanner), plan, out, (status, done))).await;
                }
            }
            if done {
                // Settled before the client sees the end: its balance and `/v1/usage` already
                // count this request when its response is complete.
                Box::pin(self.settle(plan, Some(&mut scanner), status)).await;
                Box::pin(self.keep_answer(plan)).await;
                if let Route::StoredResponse { id, op: crate::route::ResponseOp::Delete } = &plan.route {
                    if (200..300).contains(&status) {
                        self.owners.deleted(id).await;
                    }
                }
                return Box::pin(self.end_relay(session, http, &peer, out)).await;
            }
            if let Some(data) = out.filter(|d| !d.is_empty()) {
                if let Err(e) = session.write_response_body(Some(data), false).await {
                    // The client left: the upstream's answer is still billed as it reports it.
                    Box::pin(self.drain(&mut http, plan, &mut scanner, status)).await;
                    return Err(e.into_down());
                }
            }
        }
    }

    /// A stream a guardrail blocked (native or translated): the client's stream ends with its
    /// protocol's error event (`last`); the rest of the upstream's answer is read, unsent, for
    /// what it produced, and billed so.
    pub(super) async fn end_blocked(
        &self,
        session: &mut Session,
        (http, scanner): (&mut Reply, &mut UsageScanner),
        plan: &mut RelayPlan,
        last: Option<Bytes>,
        (status, done): (u16, bool),
    ) -> Result<()> {
        let written = session.write_response_body(last, true).await.map_err(|e| e.into_down());
        match done {
            false => Box::pin(self.drain(http, plan, scanner, status)).await,
            true => Box::pin(self.settle(plan, Some(scanner), status)).await,
        }
        written
    }

    /// A whole answer read before it is sent (to read it with the guardrails, to translate
    /// it), held against the process's budget (`held`). When it cannot be had, the call is
    /// billed as it must be — the rest read unsent for its usage when the budget had no room,
    /// what came when the answer was cut — and the client's error is returned.
    pub(super) async fn read_answer(
        &self,
        (http, scanner): (&mut Reply, &mut UsageScanner),
        plan: &mut RelayPlan,
        status: u16,
        held: &mut crate::edge::body::Reservation,
    ) -> std::result::Result<Vec<u8>, ApiError> {
        match read_whole(http, Some(scanner), DRAIN_MAX_BYTES, held).await {
            Ok(body) => Ok(body),
            Err(Unread::NoRoom) => {
                log::warn!("upstream answer of a {} request not read whole: {}", plan.model, Unread::NoRoom);
                Box::pin(self.drain(http, plan, scanner, status)).await;
                Err(crate::edge::body::busy())
            }
            Err(e @ Unread::Cut(_)) => {
                log::warn!("upstream answer of a {} request not read whole: {e}", plan.model);
                Box::pin(self.abandon(http, plan, scanner, status)).await;
                Err(ApiError::new(ErrorKind::BadGateway, "The upstream service's answer was cut short."))
            }
        }
    }

    /// No answer came from the provider: the request is settled on what it failed with and the
    /// client gets the error in its shape.
    async fn refuse_unanswered(&self, session: &mut Session, plan: &mut RelayPlan, err: ApiError) -> Result<()> {
        self.settle(plan, None, err.status()).await;
        LocalResponse::error(&err, plan.protocol).send(session).await
    }

    /// The next chunk of the upstream's answer (with what else is already here: one write for
    /// the events of one read) and whether it is the last. An answer cut by the upstream is
    /// billed for what came and ends the client's connection (`Err`).
    pub(super) async fn next_chunk(
        &self,
        http: &mut Reply,
        plan: &mut RelayPlan,
        scanner: &mut UsageScanner,
        status: u16,
    ) -> Result<(Option<Bytes>, bool)> {
        match http.read_gathered().await {
            Ok(chunk) => {
                let done = chunk.is_none() || http.response_done();
                Ok((chunk, done))
            }
            Err(e) => {
                log::warn!("upstream response ended early: {e}");
                Box::pin(self.abandon(http, plan, scanner, status)).await;
                Err(e.into_up())
            }
        }
    }

    /// The client's last bytes (after settlement), then the upstream connection back to the pool.
    pub(super) async fn end_relay(&self, session: &mut Session, http: Reply, peer: &HttpPeer, last: Option<Bytes>) -> Result<()> {
        let written = session.write_response_body(last, true).await.map_err(|e| e.into_down());
        let idle = peer.idle_timeout();
        if let HttpSession::H1(h1) = http.into_inner() {
            self.connector.release_http_session(h1, peer, idle).await;
        }
        written
    }

    /// The client left while its answer streamed. The upstream generates (and charges) the
    /// whole answer anyway, and reports its usage only at the end: keep reading it, unsent, for
    /// at most `billing.drain_secs` and [`DRAIN_MAX_BYTES`], and settle on what it reports.
    /// Only when it reports nothing in time is the bill estimated (every byte received, and
    /// the input the hold was made from).
    pub(super) async fn drain(&self, http: &mut Reply, plan: &mut RelayPlan, scanner: &mut UsageScanner, status: u16) {
        let deadline = Instant::now() + self.drain;
        let mut read = 0usize;
        let complete = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || read > DRAIN_MAX_BYTES {
                break false;
            }
            match tokio::time::timeout(left, http.read_response_body()).await {
                Ok(Ok(Some(chunk))) => {
                    read += chunk.len();
                    scanner.feed(&chunk);
                    if http.response_done() {
                        break true;
                    }
                }
                Ok(Ok(None)) => break true,
                Ok(Err(_)) | Err(_) => break false,
            }
        };
        let outcome = if complete { "complete" } else { "cut" };
        self.metrics.counter("tollgate_drained_responses_total", &[("outcome", outcome)]).add(1);
        log::info!("client left during the answer of a {} request; the rest was read for its usage ({outcome}, {read} bytes)", plan.model);
        Box::pin(self.abandon(http, plan, scanner, status)).await;
    }

    /// End a relay whose response cannot go on: give up the upstream connection and bill what
    /// came from it.
    pub(super) async fn abandon(&self, http: &mut Reply, plan: &mut RelayPlan, scanner: &mut UsageScanner, status: u16) {
        http.shutdown().await;
        self.settle(plan, Some(scanner), status).await;
    }

    /// A response stream named its response: the caller owns it from now on (before the
    /// request is settled, which books the owner; the plan holds the guard). Returns whether
    /// the id was seen.
    pub(super) fn note_streamed_response(&self, plan: &mut RelayPlan, scanner: &UsageScanner) -> bool {
        let (Some(id), Some(index)) = (scanner.response_id(), plan.happened.served_by) else { return false };
        let owner = crate::records::usage::ResponseOwner {
            key_id: plan.key.id.clone(),
            provider: plan.routing.catalog.upstreams[index].config.name.clone(),
            model: plan.model.clone(),
            time_ms: now_ms(),
            // Known once the response is settled (then booked with the record).
            context_tokens: 0,
        };
        plan.streaming_owner = Some(self.owners.started(id, owner));
        true
    }

    /// Answer an upstream's error answer (native or translated), never with its bytes: read to
    /// [`ERROR_BODY_MAX_BYTES`] and metered as it comes (`usage`: its protocol's shape), billed,
    /// then rewritten into the client's shape ([`Gateway::upstream_refused`]); a 429 keeps a
    /// `Retry-After` (the upstream's, else 1 s).
    pub(super) async fn relay_error(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        plan: &mut RelayPlan,
        (mut http, peer): (Reply, HttpPeer),
        (status, retry_after): (u16, Option<u64>),
        usage: Shape,
    ) -> Result<()> {
        let mut scanner = UsageScanner::new(usage, false, false);
        let (body, _held) = match plan.error_read.take() {
            // Read already, for its class (a call with fallbacks).
            Some((body, held)) => {
                let body = Bytes::from(body);
                scanner.feed(&body);
                (body.to_vec(), held)
            }
            None => {
                let mut held = self.body.budget.reservation();
                match read_whole(&mut http, Some(&mut scanner), ERROR_BODY_MAX_BYTES, &mut held).await {
                    Ok(body) => (body, held),
                    Err(e) => {
                        log::warn!("upstream error answer not read whole ({e}); its status's own message is passed on");
                        http.shutdown().await;
                        (Vec::new(), held)
                    }
                }
            }
        };
        self.settle(plan, Some(&mut scanner), status).await;
        let mut err = self.upstream_refused(plan, status, &body);
        if status == 429 {
            err.retry_after = Some(retry_after.unwrap_or(1));
        }
        if http.response_done() {
            let idle = peer.idle_timeout();
            if let HttpSession::H1(h1) = http.into_inner() {
                self.connector.release_http_session(h1, &peer, idle).await;
            }
        }
        ctx.response_started = true;
        LocalResponse::error(&err, plan.protocol).send(session).await
    }

    /// An upstream's error answer as the client is told it (`protocol::upstream_error`); the
    /// upstream refusing tollgate's own credential is logged at ERROR, naming the provider.
    pub(super) fn upstream_refused(&self, plan: &RelayPlan, status: u16, body: &[u8]) -> ApiError {
        let provider = plan.happened.served_by.map_or("?", |i| plan.routing.catalog.upstreams[i].config.name.as_str());
        match status {
            401 | 403 => log::error!(
                "provider {provider} refused tollgate's credential ({status}): check its api_key / api_key_env; clients get 502 upstream_auth_failed"
            ),
            429 => log::warn!("provider {provider} answered 429 (rate limited)"),
            500..=599 => log::warn!("provider {provider} answered {status}"),
            _ => {}
        }
        crate::protocol::upstream_error::from_body(status, body)
    }
}

/// Where an upstream names its own request id.
static UPSTREAM_REQUEST_IDS: [http::HeaderName; 2] =
    [http::HeaderName::from_static("x-request-id"), http::HeaderName::from_static("request-id")];

/// The most response bytes read, unsent, after the client left (see `Gateway::drain`).
pub(super) const DRAIN_MAX_BYTES: usize = 64 << 20;

/// The most of an upstream's error answer read: its message is passed on cut to 1 KiB
/// (`protocol::upstream_error`), so a larger one only costs memory; past this the connection is
/// closed and the client gets the status's own message.
pub(super) const ERROR_BODY_MAX_BYTES: usize = 64 << 10;

/// Why a whole answer was not read.
pub(super) enum Unread {
    /// The upstream's answer ended early, or passed its bound.
    Cut(Box<Error>),
    /// The process's budget of bytes held for clients had no room for it.
    NoRoom,
}

impl std::fmt::Display for Unread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unread::Cut(e) => write!(f, "{e}"),
            Unread::NoRoom => f.write_str("no room in the budget of bytes held for clients"),
        }
    }
}

/// A whole upstream answer, metered as it comes (when a `scanner` is given), at most `max` bytes
/// (over it: an error), each byte held against the process's budget of bytes held for clients
/// (`held`, given back when the caller drops it).
pub(super) async fn read_whole(
    http: &mut Reply,
    mut scanner: Option<&mut UsageScanner>,
    max: usize,
    held: &mut crate::edge::body::Reservation,
) -> std::result::Result<Vec<u8>, Unread> {
    let mut body = Vec::new();
    loop {
        match http.read_response_body().await.map_err(Unread::Cut)? {
            Some(chunk) => {
                if let Some(scanner) = scanner.as_deref_mut() {
                    scanner.feed(&chunk);
                }
                if body.len() + chunk.len() > max {
                    return Err(Unread::Cut(Error::explain(ErrorType::InvalidHTTPHeader, "upstream answer too large")));
                }
                if !held.grow(chunk.len()) {
                    return Err(Unread::NoRoom);
                }
                body.extend_from_slice(&chunk);
                if http.response_done() {
                    return Ok(body);
                }
            }
            None => return Ok(body),
        }
    }
}

/// The upstream's response header as the client gets it: only allowlisted headers (see
/// [`upstream::response_header_allowed`]: no connection-level header, no account identifier, rate
/// limit or cookie of the operator's), and a body whose length changes (usage withheld) or was
/// never given is sent chunked.
fn prepare_response_header(header: &mut ResponseHeader, length_changes: bool, protocol: Protocol, forward: &[String]) -> Result<()> {
    let dropped: Vec<http::header::HeaderName> =
        header.headers.keys().filter(|name| !upstream::response_header_allowed(name.as_str(), protocol, forward)).cloned().collect();
    for name in &dropped {
        header.remove_header(name);
    }
    if length_changes {
        header.remove_header(&http::header::CONTENT_LENGTH);
    }
    let framed = header.headers.contains_key(http::header::CONTENT_LENGTH) || header.headers.contains_key(http::header::TRANSFER_ENCODING);
    if !framed && !matches!(header.status.as_u16(), 204 | 304) {
        header.set_version(http::Version::HTTP_11);
        header.insert_header(http::header::TRANSFER_ENCODING, "chunked")?;
    }
    Ok(())
}

/// The upstream's own request id, from its answer's header.
pub(super) fn upstream_request_id(header: &ResponseHeader) -> Option<String> {
    UPSTREAM_REQUEST_IDS
        .iter()
        .find_map(|name| header.headers.get(name).and_then(|v| v.to_str().ok()))
        .filter(|v| v.len() <= 256)
        .map(str::to_string)
}
