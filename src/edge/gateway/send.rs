//! Stage 5, send: the request sent to a provider and read up to its final response header,
//! with retries before the first byte (the next provider on a connect failure; a timeout, a
//! failure or a status of `retry.on_status` retried while `retry.attempts` and
//! `retry.deadline_secs` allow), every outcome reported to the provider's health. How the
//! request is addressed and authenticated for its provider is the upstream seam's
//! (`upstream::upstream_request`).

use super::{Gateway, RelayPlan};
use crate::protocol::multipart::Segment;
use crate::protocol::{ApiError, ErrorKind};
use crate::upstream;
use crate::upstream::health::Verdict;
use bytes::Bytes;
use futures_util::StreamExt;
use pingora_core::protocols::http::client::HttpSession;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::{Error, ErrorType, Result};
use pingora_http::{RequestHeader, ResponseHeader};
use std::time::{Duration, Instant};

impl Gateway {
    /// Send the request upstream and read up to the final response header, with retries before
    /// the first byte: a connect failure (nothing sent) moves on to the next provider; a timeout
    /// or failure before the response header, or a status in `retry.on_status`, is retried —
    /// on another provider when there is one — while fewer than `retry.attempts` requests were
    /// sent, after a short jittered backoff, and within `retry.deadline_secs` when it is set
    /// (no attempt starts after it, and none waits for its header past it). Every outcome goes
    /// to the provider's health (and its key's). Sets `plan.happened.served_by` and `plan.happened.attempts`.
    pub(super) async fn open_upstream(&self, client: &RequestHeader, plan: &mut RelayPlan) -> Result<(upstream::Reply, HttpPeer)> {
        let routing = plan.routing.clone();
        let (catalog, policy) = (&routing.catalog, &routing.retry);
        let mut deadline = policy.deadline.map(|d| Instant::now() + d);
        if !plan.fallbacks.is_empty() {
            // Another model may follow: this one's attempts end by `routing.max_fallback_secs`.
            let until = plan.started + routing.fallbacks.max_wait;
            deadline = Some(deadline.map_or(until, |d| d.min(until)));
        }
        // A retry after `pause` still starts inside the deadline.
        let in_time = |pause: Duration| deadline.is_none_or(|d| Instant::now() + pause < d);
        // The pause before another attempt, when `attempts` sent so far leave room for one in
        // number (this model's `retry.attempts`, the request's `routing.max_attempts`) and in
        // time (drawn only then: nothing is computed for a request that succeeds).
        let (before, most) = (plan.happened.attempts, routing.fallbacks.max_attempts);
        let retry_pause = |attempts: u32| {
            (attempts - before < policy.attempts && attempts < most).then(|| backoff(attempts - before)).filter(|pause| in_time(*pause))
        };
        let (mut tried, mut dead): (Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new());
        let mut last: Option<Box<Error>> = None;
        let mut next = catalog.next_provider(&plan.candidates, &tried, &dead, Instant::now());
        while let Some((index, admission)) = next.take() {
            let upstream = &catalog.upstreams[index];
            if !(tried.is_empty() && dead.is_empty() && plan.candidates.first() == Some(&index)) {
                // Not the provider the plan counted (see `upstream::draft`): count it here.
                upstream.health.load.add();
            }
            let Some(peer) = upstream.peer(tried.len() + dead.len()) else {
                log::warn!("provider {} has no resolved address", upstream.config.name);
                admission.report(Verdict::Failed);
                dead.push(index);
                next = catalog.next_provider(&plan.candidates, &tried, &dead, Instant::now());
                continue;
            };
            let key = admission.key;
            let wait = header_wait(deadline, peer.options.read_timeout, Instant::now());
            plan.begin_attempt(upstream);
            let exchanged = self.exchange(client, upstream, key, &peer, wait, plan).await;
            if let (Some(trace), Err(Exchange::Unsent(e) | Exchange::Sent(e))) = (plan.trace.as_mut(), &exchanged) {
                trace.end_attempt(Some(e.etype().as_str()));
            }
            match exchanged {
                Err(Exchange::Unsent(e)) => {
                    admission.report(Verdict::Failed);
                    dead.push(index);
                    if in_time(Duration::ZERO) {
                        next = catalog.next_provider(&plan.candidates, &tried, &dead, Instant::now());
                    }
                    let then = if next.is_some() { "trying the next" } else { "no other provider is left" };
                    log::warn!("provider {} failed to connect ({}); {then}", upstream.config.name, e.etype().as_str());
                    last = Some(e);
                }
                Err(Exchange::Sent(e)) => {
                    plan.happened.attempts += 1;
                    admission.report(Verdict::Failed);
                    tried.push(index);
                    last = Some(e);
                    if let Some(pause) = retry_pause(plan.happened.attempts) {
                        next = catalog.next_provider(&plan.candidates, &tried, &dead, Instant::now());
                        if next.is_some() {
                            log::warn!("provider {} failed before answering; retrying", upstream.config.name);
                            upstream.health.retries.add(1);
                            tokio::time::sleep(pause).await;
                        }
                    }
                }
                Ok((mut http, applied)) => {
                    plan.happened.attempts += 1;
                    plan.happened.rewrites = applied;
                    let Some(header) = http.response_header() else {
                        return Err(Error::explain(ErrorType::InvalidHTTPHeader, "no response header"));
                    };
                    let status = header.status.as_u16();
                    upstream.health.status(status);
                    if let Some(trace) = plan.trace.as_mut() {
                        trace.attempt_answered(status);
                    }
                    let verdict = match status {
                        429 => Verdict::Throttled(retry_after(header)),
                        500..=599 => Verdict::Failed,
                        _ => Verdict::Answered,
                    };
                    admission.report(verdict);
                    let pause = if policy.on_status.contains(&status) { retry_pause(plan.happened.attempts) } else { None };
                    if let Some(pause) = pause {
                        tried.push(index);
                        if let Some(then) = catalog.next_provider(&plan.candidates, &tried, &dead, Instant::now()) {
                            log::warn!("provider {} answered {status}; retrying", upstream.config.name);
                            upstream.health.retries.add(1);
                            if let Some(trace) = plan.trace.as_mut() {
                                trace.end_attempt(None);
                            }
                            // Not the client's: this answer is dropped with its connection.
                            http.shutdown().await;
                            next = Some(then);
                            tokio::time::sleep(pause).await;
                            continue;
                        }
                    }
                    // The answer streams under the provider's own read timeout, whatever was
                    // left of the deadline for its header.
                    http.set_read_timeout(peer.options.read_timeout);
                    plan.happened.served_by = Some(index);
                    // The model's name at the provider (a rewrite rule's `rename_model`, else its own).
                    let theirs = match upstream.config.rewrite.is_empty() {
                        true => upstream.config.upstream_model(&plan.model),
                        false => {
                            let facts =
                                upstream::rewrite::Facts { model: &plan.model, route: plan.route.label(), headers: &client.headers };
                            let rules = upstream::rewrite::for_provider(&upstream.config.rewrite, &facts);
                            upstream::rewrite::provider_model(&upstream.config, &rules, &plan.model)
                        }
                    };
                    let renamed = (plan.translation.is_none() && theirs != plan.model).then_some((theirs, plan.model.as_str()));
                    return Ok((upstream::Reply::new(http, upstream.seam.as_ref(), theirs, renamed), peer));
                }
            }
        }
        Err(last.unwrap_or_else(|| Error::explain(ErrorType::ConnectNoRoute, "no provider address available")))
    }

    /// One request to one provider: connect (pooled), send, read up to the final response
    /// header. A pooled connection its peer had closed is replaced (the request cannot have
    /// been processed).
    async fn exchange(
        &self,
        client: &RequestHeader,
        upstream: &upstream::Upstream,
        key: usize,
        peer: &HttpPeer,
        header_wait: Option<Duration>,
        plan: &RelayPlan,
    ) -> std::result::Result<(HttpSession, Option<String>), Exchange> {
        let mut stale = 0;
        let mut redated = false;
        let token = upstream::bearer(upstream).await.map_err(Exchange::Unsent)?;
        loop {
            // Built per attempt (moved into the send; a replaced connection gets a new one).
            let ask = upstream::Ask {
                model: &plan.model,
                stream: plan.stream,
                client_version: plan.client_version.as_deref(),
                route: plan.route.label(),
                group_rules: plan.group_rules.as_ref(),
            };
            let (mut req, body, applied) = upstream::upstream_request(
                client,
                upstream,
                key,
                match &plan.translation {
                    Some(t) => upstream::Destination::Translated(t),
                    None => upstream::Destination::Relayed(&plan.route),
                },
                &ask,
                &plan.body,
                &plan.routing.forward_headers,
                token.as_ref(),
            )
            .map_err(Exchange::Unsent)?;
            // An upload: the form, written for this provider (its model name, a boundary of tollgate's).
            let form = match &plan.upload {
                Some(form) => {
                    let (content_type, segments) = form.encode(Some(upstream.config.upstream_model(&plan.model)));
                    req.insert_header(http::header::CONTENT_TYPE, content_type).map_err(Exchange::Unsent)?;
                    let length: u64 = segments.iter().map(Segment::size).sum();
                    req.insert_header(http::header::CONTENT_LENGTH, length).map_err(Exchange::Unsent)?;
                    segments
                }
                None => Vec::new(),
            };
            if let Some(trace) = plan.trace.as_deref() {
                // The attempt's span is the upstream's parent; the client's vendor state goes on
                // (and no other: a `tracestate` relayed by `forward_headers` is replaced).
                let (parent, state) = (http::HeaderName::from_static("traceparent"), http::HeaderName::from_static("tracestate"));
                req.insert_header(parent, trace.traceparent().unwrap_or_default()).map_err(Exchange::Unsent)?;
                match trace.state() {
                    Some(value) => req.insert_header(state, value).map_err(Exchange::Unsent)?,
                    None if req.headers.contains_key(&state) => {
                        req.remove_header(&state);
                    }
                    None => {}
                }
            }
            let (http, reused) = match self.connector.reused_http_session(peer).await {
                Some(pooled) => (pooled, true),
                // A new connection's future (TCP and TLS connect, ~9 KB) is kept on the heap:
                // inline, every request's future would carry it and be copied with it.
                None => Box::pin(self.connector.get_http_session(peer)).await.map_err(Exchange::Unsent)?,
            };
            let mut http = HttpSession::H1(http);
            http.set_read_timeout(header_wait);
            http.set_write_timeout(peer.options.write_timeout);
            match send_request(&mut http, req, &body, &form).await {
                Ok(()) => {
                    // A signature refused for a clock the answer showed to be off is signed
                    // again, once, dated by the service's clock.
                    if !redated && http.response_header().is_some_and(|h| h.status == 403 && upstream.seam.clock_corrected(h)) {
                        redated = true;
                        http.shutdown().await;
                        continue;
                    }
                    return Ok((http, applied));
                }
                Err(mut e) => {
                    e.retry.decide_reuse(reused);
                    if e.retry() && stale < MAX_STALE_CONNECTIONS {
                        log::debug!("provider {}: pooled connection was closed ({e}); using another", upstream.config.name);
                        stale += 1;
                        continue;
                    }
                    return Err(Exchange::Sent(e.into_up()));
                }
            }
        }
    }
}

/// How many pooled connections found closed by their peer are replaced before giving up.
const MAX_STALE_CONNECTIONS: usize = 2;

/// How one upstream exchange failed.
enum Exchange {
    /// Nothing was sent (no connection): another provider can take it at no risk.
    Unsent(Box<Error>),
    /// The request went out and no response header came back.
    Sent(Box<Error>),
}

/// A 429's `Retry-After`, in seconds or as an HTTP date.
pub(super) fn retry_after(header: &ResponseHeader) -> Option<std::time::Duration> {
    let value = header.headers.get(http::header::RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(std::time::Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(std::time::SystemTime::now()).unwrap_or_default())
}

/// How long an attempt started at `now` may wait for its response header: its provider's read
/// timeout, cut to what is left of the retry deadline.
fn header_wait(deadline: Option<Instant>, read_timeout: Option<Duration>, now: Instant) -> Option<Duration> {
    let left = deadline.map(|d| d.saturating_duration_since(now));
    match (left, read_timeout) {
        (Some(left), Some(read)) => Some(left.min(read)),
        (left, read) => left.or(read),
    }
}

/// The pause before retry `n` (1, 2, …): 50 ms doubling per retry, at most 1 s, jittered down
/// to half, so that clients retrying together do not hit the next provider at once.
fn backoff(n: u32) -> Duration {
    use rand::Rng;
    let full = 50u64.saturating_mul(1 << n.saturating_sub(1).min(5)).min(1000);
    Duration::from_millis(rand::thread_rng().gen_range(full / 2..=full))
}

/// Send the request header and body (`form`'s segments instead, for an upload); read up to the
/// final response header.
async fn send_request(http: &mut HttpSession, req: RequestHeader, body: &Bytes, form: &[Segment]) -> Result<()> {
    http.write_request_header(Box::new(req)).await?;
    if !body.is_empty() {
        http.write_request_body(body.clone(), true).await?;
    }
    for segment in form {
        match segment {
            Segment::Bytes(bytes) => http.write_request_body(bytes.clone(), false).await?,
            Segment::File { spool, len } => {
                let mut chunks = crate::base::spool::chunks(spool.clone(), *len, UPLOAD_CHUNK);
                while let Some(chunk) = chunks.next().await {
                    let chunk = chunk.map_err(|e| Error::explain(ErrorType::WriteError, format!("upload spool unreadable: {e}")))?;
                    http.write_request_body(chunk, false).await?;
                }
            }
        }
    }
    http.finish_request_body().await?;
    loop {
        http.read_response_header().await?;
        match http.response_header() {
            Some(h) if h.status.is_informational() => continue,
            Some(_) => return Ok(()),
            None => return Err(Error::explain(ErrorType::InvalidHTTPHeader, "no response header")),
        }
    }
}

/// How much of a spooled upload is read from disk at a time.
const UPLOAD_CHUNK: u64 = 64 << 10;

/// Map a proxy failure to the client-facing error (never naming the upstream).
pub(super) fn upstream_failure(e: &Error) -> ApiError {
    match e.etype() {
        ErrorType::InvalidCert | ErrorType::TLSHandshakeFailure | ErrorType::HandshakeError => {
            ApiError::new(ErrorKind::BadGateway, "The upstream service's TLS certificate could not be verified; the request was not sent.")
        }
        ErrorType::ConnectTimedout | ErrorType::ReadTimedout | ErrorType::WriteTimedout => {
            ApiError::new(ErrorKind::GatewayTimeout, "The upstream service did not answer in time.")
        }
        ErrorType::Custom(name) if *name == upstream::seam::BODY_ERROR => {
            let why = e.context.as_ref().map_or_else(String::new, |c| c.as_str().to_string());
            ApiError::new(ErrorKind::BadRequest, format!("The request cannot be sent to the provider of this model: {why}."))
        }
        ErrorType::Custom(name) if *name == upstream::seam::CREDENTIALS_ERROR => ApiError::new(
            ErrorKind::Overloaded,
            "The gateway could not sign in to the upstream service (its log records why, for the operator). Retry later.",
        ),
        _ => ApiError::new(ErrorKind::BadGateway, "The upstream service is unreachable. Retry later."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn an_attempt_waits_for_its_header_at_most_until_the_deadline() {
        let now = Instant::now();
        let s = Duration::from_secs;
        assert_eq!(header_wait(None, Some(s(600)), now), Some(s(600)), "no deadline: the provider's read timeout");
        assert_eq!(header_wait(Some(now + s(20)), Some(s(600)), now), Some(s(20)), "cut to the deadline");
        assert_eq!(header_wait(Some(now + s(20)), Some(s(5)), now), Some(s(5)), "the read timeout when it ends first");
        assert_eq!(header_wait(Some(now + s(20)), None, now), Some(s(20)));
        assert_eq!(header_wait(None, None, now), None);
        assert_eq!(header_wait(Some(now), Some(s(5)), now + s(1)), Some(Duration::ZERO), "a spent deadline leaves nothing");
    }

    #[test]
    fn the_backoff_doubles_from_50_ms_to_1_s_jittered_down_to_half() {
        for (n, full) in [(1, 50), (2, 100), (3, 200), (5, 800), (6, 1000), (40, 1000)] {
            for _ in 0..50 {
                let ms = backoff(n).as_millis() as u64;
                assert!((full / 2..=full).contains(&ms), "retry {n}: {ms} ms, expected {} to {full}", full / 2);
            }
        }
    }
}
