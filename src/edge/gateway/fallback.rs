//! Stage 5, send, across models: a call with fallbacks (`upstream::fallback`) goes on to the
//! next model, before its first byte, when its own cannot take it — its context window cannot
//! hold the input (no call made), or its providers failed in a class the call falls back on
//! (`protocol::error_class`: read from the status, else from the error answer itself). Retries
//! and fallbacks share `routing.max_attempts`, and none starts after `routing.max_fallback_secs`.
//! The hold stays the one taken (the dearest candidate's); settlement bills the model that served.

use super::{Gateway, RelayPlan};
use crate::protocol::error_class::{classify, FailureClass};
use crate::route::Route;
use crate::upstream::{self, Reply};
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::{ErrorType, Result};
use pingora_http::RequestHeader;
use std::time::Instant;

impl Gateway {
    /// Open the upstream for `plan`'s model, going on to its fallbacks as they allow (see the
    /// module). A call without fallbacks calls [`Gateway::open_upstream`] alone.
    pub(super) async fn open(&self, client: &RequestHeader, plan: &mut RelayPlan) -> Result<(Reply, HttpPeer)> {
        let until = plan.started + plan.routing.fallbacks.max_wait;
        // A fallback whose model is in the path (generate content) is sent under its own path.
        let mut own_header: Option<RequestHeader> = None;
        loop {
            let header = own_header.as_ref().unwrap_or(client);
            if !plan.fallbacks.is_empty() && !upstream::fallback::fits(&plan.routing, &plan.model, plan.input_estimate) {
                own_header = self.fall_back(plan, client, "context_window");
                continue;
            }
            let opened = Box::pin(self.open_upstream(header, plan)).await;
            let room = plan.happened.attempts < plan.routing.fallbacks.max_attempts && Instant::now() < until;
            if plan.fallbacks.is_empty() || !room {
                return opened;
            }
            let (reply, peer) = match opened {
                Ok(opened) => opened,
                Err(e) => {
                    let class = match e.etype() {
                        ErrorType::ReadTimedout | ErrorType::ConnectTimedout | ErrorType::WriteTimedout => FailureClass::Timeout,
                        _ => FailureClass::Unavailable,
                    };
                    if !plan.fallback_on.contains(class) {
                        return Err(e);
                    }
                    own_header = self.fall_back(plan, client, class.name());
                    continue;
                }
            };
            let status = reply.response_header().map_or(502, |h| h.status.as_u16());
            let (mut reply, class, read) = match status {
                200..=399 => return Ok((reply, peer)),
                408 | 429 | 500..=599 => (reply, classify(status, b"", None), None),
                // A client error is read for what it says (a context too long, a refusal).
                _ => {
                    let mut reply = reply;
                    let aws = reply.response_header().and_then(|h| h.headers.get("x-amzn-errortype")).and_then(|v| v.to_str().ok());
                    let aws = aws.map(str::to_string);
                    let read = self.read_error(&mut reply).await;
                    let class = read.as_ref().and_then(|(body, _)| classify(status, body, aws.as_deref()));
                    (reply, class, read)
                }
            };
            match class.filter(|c| plan.fallback_on.contains(*c)) {
                Some(class) => {
                    drop(read);
                    // Not the client's: its connection is closed with it.
                    reply.shutdown().await;
                    own_header = self.fall_back(plan, client, class.name());
                }
                None => {
                    plan.error_read = read;
                    return Ok((reply, peer));
                }
            }
        }
    }

    /// An error answer read whole for its class (None: it could not be, or the budget of bytes
    /// held for clients had no room; the client is then told the status's own message).
    async fn read_error(&self, reply: &mut Reply) -> Option<(Vec<u8>, crate::edge::body::Reservation)> {
        let mut held = self.body.budget.reservation();
        match super::stream::read_whole(reply, None, super::stream::ERROR_BODY_MAX_BYTES, &mut held).await {
            Ok(body) => Some((body, held)),
            Err(e) => {
                log::warn!("an upstream error answer was not read whole ({e})");
                None
            }
        }
    }

    /// Go on to the plan's next model, noting why the last one was left; the request header a
    /// generate-content fallback is sent under (its model in the path).
    fn fall_back(&self, plan: &mut RelayPlan, client: &RequestHeader, why: &'static str) -> Option<RequestHeader> {
        let next = plan.fallbacks.remove(0);
        log::info!("model {} left for {} ({why})", plan.model, next.model);
        self.metrics.counter("tollgate_fallbacks_total", &[("reason", why)]).add(1);
        let left = std::mem::replace(&mut plan.model, next.model);
        plan.happened.fell_back.push((left, why));
        plan.candidates = next.candidates;
        plan.body = next.body;
        plan.translation = next.translation;
        plan.withhold_usage = next.withhold_usage;
        // Its first provider is its load from now on (the attempt loop counts the others).
        if let Some(&first) = plan.candidates.first() {
            plan.routing.catalog.upstreams[first].health.load.add();
        }
        let route = next.route?;
        // The path names the model the client asked for: the first one left.
        let asked = plan.happened.fell_back.first().map_or("", |(m, _)| m.as_str());
        let header = match (&plan.route, &route) {
            (Route::GenerateContent { .. }, Route::GenerateContent { model, .. }) if plan.translation.is_none() => {
                let mut header = client.clone();
                let path = client.uri.path().replacen(&format!("/models/{asked}:"), &format!("/models/{model}:"), 1);
                let target = match client.uri.query() {
                    Some(q) => format!("{path}?{q}"),
                    None => path,
                };
                match target.parse::<http::Uri>() {
                    Ok(uri) => header.set_uri(uri),
                    Err(e) => log::warn!("fallback {model}: its path does not parse ({e})"),
                }
                Some(header)
            }
            _ => None,
        };
        plan.route = route;
        header
    }
}

/// What the request log, the access log and the trace say of a call's fallbacks: each model it
/// left and why (`model:reason`, comma-separated), None when it took none.
#[inline]
pub(super) fn fell_back(plan: &RelayPlan) -> Option<String> {
    if plan.happened.fell_back.is_empty() {
        return None;
    }
    Some(plan.happened.fell_back.iter().map(|(model, why)| format!("{model}:{why}")).collect::<Vec<_>>().join(","))
}

/// The ids of the rewrite rules a call was sent with (its group's, then its provider's),
/// comma-separated; None when none applied.
#[inline]
pub(super) fn rewrites(plan: &RelayPlan) -> Option<String> {
    let group = plan.group_rules.as_ref().map(|rules| upstream::rewrite::ids(rules.iter()));
    match (group, plan.happened.rewrites.as_deref()) {
        (Some(g), Some(p)) => Some(format!("{g},{p}")),
        (Some(g), None) => Some(g),
        (None, p) => p.map(str::to_string),
    }
}
