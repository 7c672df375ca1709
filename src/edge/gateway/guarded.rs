//! The guardrails of a model call (`checks::guard`): its body's texts read in the draft stage,
//! before anything is held or sent — refused (400 `content_policy_violation`, 503 when a
//! guardrail that fails closed could not check) or masked; its answer read as it goes to the
//! client — a stream event by event over the look-behind window (`stream.rs`,
//! `translated.rs`), a whole answer before it is sent (here). What they did is in the
//! access log, the request log and the trace ([`Guarded::summary`]); what they cost
//! (`price_per_check`) is held and billed with the call.

use super::admit::Caller;
use super::{Gateway, RelayPlan, RequestCtx};
use crate::billing::meter::UsageScanner;
use crate::checks::guard::{self, stream::Dialect, stream::OutputGuard, Applied, Call, Noted, Screening};
use crate::config::Protocol;
use crate::protocol::response::LocalResponse;
use crate::protocol::ApiError;
use crate::route::Route;
use crate::upstream::Reply;
use bytes::Bytes;
use pingora_core::protocols::http::client::HttpSession;
use pingora_core::upstreams::peer::{HttpPeer, Peer};
use pingora_error::Result;
use pingora_http::ResponseHeader;
use pingora_proxy::Session;

/// What the guardrails of a call did and still have to do.
#[derive(Default)]
pub struct Guarded {
    pub applied: Applied,
    /// What they did to the request.
    pub noted: Vec<Noted>,
    pub screening: Screening,
}

impl Guarded {
    /// `name:phase:action[:categories]`, comma-separated, of the request and its answer.
    pub fn summary(ctx: &RequestCtx) -> Option<String> {
        let mut all: Vec<Noted> = ctx.guarded.as_ref().map(|g| g.noted.clone()).unwrap_or_default();
        if let Some(out) = ctx.relayed.as_ref().and_then(|p| p.guard.as_ref()) {
            all.extend(out.noted.iter().cloned());
        }
        if let Some(session) = &ctx.realtime {
            all.extend(session.guardrail.iter().cloned());
        }
        if let Some(call) = &ctx.mcp {
            all.extend(call.guardrail.iter().cloned());
        }
        Noted::summary(&all)
    }
}

/// The guardrails a key goes through: its group's, its account's (its record's), its own.
pub(super) fn applying(gw: &Gateway, routing: &crate::upstream::Routing, key: &crate::records::key::KeyRecord) -> Applied {
    let account = key.policy.account.as_deref().and_then(|name| gw.keys.account(name));
    routing.guardrails.applying(&key.group, &key.policy, account.as_ref().map_or(&[][..], |a| a.guardrails.as_slice()))
}

/// The event stream a client of `route` reads, for an answer sent as server-sent events.
pub(super) fn dialect(route: &Route) -> Option<Dialect> {
    match route {
        Route::ChatCompletions => Some(Dialect::Chat),
        Route::Messages => Some(Dialect::Messages),
        Route::Responses => Some(Dialect::Responses),
        Route::GenerateContent { .. } => Some(Dialect::Gemini),
        _ => None,
    }
}

/// Read the body of a model call with the guardrails that apply to its key: the body to send
/// (masked, or as it came). A refusal is noted in `ctx` and answered by the caller.
pub(super) async fn input(
    gw: &Gateway,
    ctx: &mut RequestCtx,
    caller: &Caller,
    protocol: Protocol,
    body: Bytes,
) -> std::result::Result<Bytes, ApiError> {
    let applied = applying(gw, &caller.routing, &caller.key);
    if applied.is_empty() {
        return Ok(body);
    }
    let mut guarded = Box::new(Guarded { applied, ..Default::default() });
    let mut body = body;
    if guarded.applied.input() && !body.is_empty() {
        let model = match &caller.route {
            Route::GenerateContent { model, .. } | Route::GeminiCountTokens { model } | Route::GeminiEmbed { model, .. } => {
                Some(model.clone())
            }
            _ => None,
        };
        let call = Call {
            protocol: protocol.as_str(),
            route: caller.route.label(),
            model: model.as_deref(),
            key_id: &caller.key.id,
            tags: &caller.key.policy.tags,
        };
        let screened = guard::screen_body(&guarded.applied, &call, &body, &mut guarded.screening, &gw.metrics).await;
        guarded.noted = std::mem::take(&mut guarded.screening.noted);
        match screened {
            Ok(Some(masked)) => body = Bytes::from(masked),
            Ok(None) => {}
            Err(refusal) => {
                ctx.guarded = Some(guarded);
                return Err(refusal.error());
            }
        }
    }
    if dialect(&caller.route).is_some() {
        guarded.screening.price_nanos = guarded.screening.price_nanos.saturating_add(guarded.applied.output_price());
    }
    ctx.guarded = Some(guarded);
    Ok(body)
}

/// Read a JSON value's texts (a tool call's arguments or its result, a video's request) with
/// the guardrails of `applied` that read that phase, masking it in place; what they did is
/// added to `noted`. What they cost (`price_per_check`), or the refusal.
pub(super) async fn screen_value(
    gw: &Gateway,
    applied: &Applied,
    call: &Call<'_>,
    value: &mut serde_json::Value,
    output: bool,
    noted: &mut Vec<Noted>,
) -> std::result::Result<i64, ApiError> {
    let mut screening = Screening::default();
    let screened = guard::screen(applied, output, call, &mut guard::texts_of(value), &mut screening, &gw.metrics).await;
    noted.append(&mut screening.noted);
    screened.map(|_| screening.price_nanos).map_err(|r| r.error())
}

/// The output guard of a planned relay (None without output guardrails or masks to restore):
/// only a model's text answer is read (chat, messages, responses, generate-content) — images,
/// audio and embeddings pass as they come, never held whole.
pub(super) fn output(ctx: &RequestCtx, route: &Route, model: &str) -> Option<Box<OutputGuard>> {
    let guarded = ctx.guarded.as_ref()?;
    let dialect = dialect(route)?;
    OutputGuard::new(&guarded.applied, &guarded.screening.masks, Some(dialect), model).map(Box::new)
}

/// What a guardrail's service is told of a planned call.
pub(super) fn call_of(plan: &RelayPlan) -> Call<'_> {
    Call {
        protocol: plan.protocol.as_str(),
        route: plan.route.label(),
        model: Some(&plan.model),
        key_id: &plan.key.id,
        tags: &plan.key.policy.tags,
    }
}

/// What the guardrails cost this call (`price_per_check`), nano-USD.
pub(super) fn price(ctx: &RequestCtx) -> i64 {
    ctx.guarded.as_ref().map_or(0, |g| g.screening.price_nanos)
}

impl Gateway {
    /// A whole answer with output guardrails: read whole (billed on what the upstream
    /// reported), read by the guardrails, then sent as it is, masked or restored — or replaced
    /// by the error when one blocks it. `body` is a translated answer already read.
    pub(super) async fn answer_guarded(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        plan: &mut RelayPlan,
        (mut http, peer): (Reply, HttpPeer),
        (mut header, mut scanner, status): (Box<ResponseHeader>, UsageScanner, u16),
    ) -> Result<()> {
        let mut held = self.body.budget.reservation();
        let body = match self.read_answer((&mut http, &mut scanner), plan, status, &mut held).await {
            Ok(body) => body,
            Err(err) => return LocalResponse::error(&err, plan.protocol).send(session).await,
        };
        self.settle(plan, Some(&mut scanner), status).await;
        let idle = peer.idle_timeout();
        if let HttpSession::H1(h1) = http.into_inner() {
            self.connector.release_http_session(h1, &peer, idle).await;
        }
        let body = match self.guard_whole(plan, body).await {
            Ok(body) => body,
            Err(err) => {
                self.note_refusal(ctx, err.kind.reason());
                ctx.response_started = true;
                return LocalResponse::error(&err, plan.protocol).send(session).await;
            }
        };
        header.remove_header(&http::header::TRANSFER_ENCODING);
        header.insert_header(http::header::CONTENT_LENGTH, body.len().to_string())?;
        ctx.response_started = true;
        session.write_response_header(header, false).await?;
        session.write_response_body(Some(Bytes::from(body)), true).await
    }

    /// A chunk of a guarded stream through its output guard (at the end, what it still held):
    /// what to send, and whether a guardrail blocked the answer.
    pub(super) async fn guard_chunk(&self, plan: &mut RelayPlan, chunk: Option<Bytes>, done: bool) -> (Option<Bytes>, bool) {
        let Some(mut guard) = plan.guard.take() else { return (chunk, false) };
        let call = call_of(plan);
        let fed = guard.relay(chunk.as_deref().unwrap_or_default(), done, &call, &self.metrics).await;
        plan.guard = Some(guard);
        (Some(Bytes::from(fed.out)), fed.blocked.is_some())
    }

    /// A whole answer's bytes through the plan's output guard: as they are (not JSON, or
    /// nothing to change), rewritten, or the error that replaces them.
    pub(super) async fn guard_whole(&self, plan: &mut RelayPlan, body: Vec<u8>) -> std::result::Result<Vec<u8>, ApiError> {
        let Some(mut guard) = plan.guard.take() else { return Ok(body) };
        let Ok(mut value) = serde_json::from_slice::<serde_json::Value>(&body) else {
            plan.guard = Some(guard);
            return Ok(body);
        };
        let answered = guard.answer(&call_of(plan), &mut value, &self.metrics).await;
        plan.guard = Some(guard);
        match answered {
            Ok(true) => Ok(serde_json::to_vec(&value).unwrap_or(body)),
            Ok(false) => Ok(body),
            Err(refusal) => Err(refusal.error()),
        }
    }
}
