//! Stage 4, price and hold: the checks on what the request may cost, in the order of the
//! README's "Keys and policy" (after the rate limits and the model's rules of the stages
//! before): requests in flight (`max_concurrent`), the request's cost cap, the tokens it is
//! held for under a `tpm`, then the spend windows and the balances — the money is held in
//! every purse the key pays from. A request that named no output maximum is lowered to what
//! fits rather than refused. Out of it comes the relay plan.

use super::admit::Caller;
use super::draft::Drafted;
use super::{Exit, Gateway, Happened, Outcome, RelayPlan, RequestCtx, Step};
use crate::billing::ledger::Hold;
use crate::config::Protocol;
use crate::protocol::response::LocalResponse;
use crate::protocol::{ApiError, ErrorKind};
use crate::records::key::KeyRecord;
use crate::route::Route;
use crate::upstream::{self, Routing};
use pingora_proxy::Session;
use std::time::Instant;

pub(super) async fn price(gw: &Gateway, session: &Session, ctx: &mut RequestCtx, caller: Caller, drafted: Drafted) -> Step<Box<RelayPlan>> {
    let Caller { route, key, version, routing } = caller;
    let Drafted { protocol, mut draft, body_reservation, upload } = drafted;
    let slot = gw.limits.enter(&key).await?;
    // A request that named no maximum is held (and asks) for less when its cap is lower.
    if let Some(cap) = key.policy.max_request_cost_nanos.filter(|cap| draft.hold_nanos > *cap) {
        draft.lower_output(&routing, &route, draft.output_covered(&routing, cap))?;
    }
    key.policy.check_cost(draft.hold_nanos).inspect_err(|_| ctx.model_asked = Some(draft.model.clone()))?;
    // Under a `tpm`, the tokens the request is held for are reserved until it settles (a
    // request that named no maximum asks for no more than the whole limit leaves room for).
    let tokens_reserved = match key.tpm {
        Some(tpm) if route.billed() => {
            let input = draft.input.tokens();
            draft.lower_output(&routing, &route, tpm.saturating_sub(input) / draft.choices.max(1))?;
            gw.limits.reserve_tokens(&key, input.saturating_add(draft.output_allowance))?
        }
        _ => None,
    };
    if let Some(t) = &mut draft.translation {
        t.gemini_sse = session.req_header().uri.query().is_some_and(|q| q.split('&').any(|kv| kv == "alt=sse"));
        if t.count && t.upstream == Protocol::Openai {
            // Chat completions has no token count: tollgate's estimate, answered here.
            let estimate = crate::translate::count_estimate(t, draft.client_body_len);
            return Err(Exit::Answer(Outcome::Respond(LocalResponse::json(200, &estimate))));
        }
    }
    // Then the spend windows (the key's, its account's), then the balances.
    let hold = gw.hold_for(&routing, &key, &route, &mut draft).await.inspect_err(|_| ctx.model_asked = Some(draft.model.clone()))?;
    let billed = route.billed();
    Ok(Box::new(RelayPlan {
        routing,
        route,
        protocol,
        model: draft.model,
        candidates: draft.candidates,
        stream: draft.stream,
        body: draft.body,
        client_body_len: draft.client_body_len,
        input_estimate: draft.input.tokens(),
        client_version: version,
        key,
        // An unbilled route (token counting) still needs a key in credit, but holds
        // nothing and is not settled: no charge, no usage record.
        hold: billed.then_some(hold),
        withhold_usage: draft.withhold_usage,
        started: Instant::now(),
        streaming_owner: None,
        concurrency_slot: slot,
        tokens_reserved,
        body_reservation,
        translation: draft.translation,
        media: draft.media,
        upload,
        trace: ctx.trace.take(),
        happened: Happened::default(),
    }))
}

impl Gateway {
    /// What a request of `key` is paid from, in the order of checks: its spend windows, its
    /// account's, its balance, its account's balance. A key whose account this node does not
    /// know (yet) is refused for now.
    pub(super) fn purses(&self, routing: &Routing, key: &KeyRecord) -> std::result::Result<Vec<crate::records::purse::Purse>, ApiError> {
        if key.policy.account.is_none() && key.policy.budgets.is_empty() {
            return Ok(vec![crate::records::purse::Purse::key(&key.id)]);
        }
        let account = match &key.policy.account {
            Some(name) => Some(self.keys.account(name).ok_or_else(|| crate::store::fleet::unavailable("the key's account"))?),
            None => None,
        };
        Ok(crate::records::purse::purses(key, account.as_deref(), &routing.calendar, crate::base::clock::now_unix()))
    }

    /// Refuse (402) a key — or its account — whose balance is below zero: README's rule that a
    /// negative key is refused everything that needs a key, for the calls that hold nothing
    /// themselves (files, batches' reads, MCP handshakes and listings).
    pub(super) async fn solvent(&self, routing: &Routing, key: &KeyRecord) -> std::result::Result<(), ApiError> {
        self.covers(routing, key, 0, "this call needs").await
    }

    /// A call of `key` to an endpoint answered here that needs a key in good standing (files,
    /// batches, video, MCP): counted against its `rpm`, refused while it is below zero.
    pub(super) async fn admit_keyed(&self, routing: &Routing, key: &KeyRecord) -> std::result::Result<(), ApiError> {
        self.limits.admit(key).await?;
        self.solvent(routing, key).await
    }

    /// Whether every purse of `key` covers `amount` now (held and given back at once); the 402
    /// says `what` it was for.
    pub(super) async fn covers(&self, routing: &Routing, key: &KeyRecord, amount: i64, what: &str) -> std::result::Result<(), ApiError> {
        let purses = self.purses(routing, key)?;
        match self.ledger.hold_from(purses, amount).await {
            Ok(Ok(_released)) => Ok(()),
            Ok(Err(refused)) => Err(refused.to_api_error(what, crate::base::clock::now_unix())),
            Err(e) => {
                log::warn!("ledger: {e}");
                Err(crate::store::fleet::unavailable("the key's balance"))
            }
        }
    }

    /// Hold the most `draft` can cost in every purse of `key`. A request that named no output
    /// maximum and does not fit is lowered to what the purse that refused it covers (down to
    /// `billing.min_output_tokens`) and tried again; a refusal says how many output tokens the
    /// money covers and which field to set.
    pub(super) async fn hold_for(
        &self,
        routing: &Routing,
        key: &KeyRecord,
        route: &Route,
        draft: &mut upstream::Draft,
    ) -> std::result::Result<Hold, ApiError> {
        let purses = self.purses(routing, key)?;
        // Each lowering fits the purse that refused; another purse may then refuse in turn.
        let mut lowerings = 0;
        loop {
            match self.ledger.hold_from(purses.clone(), draft.hold_nanos).await {
                Ok(Ok(hold)) => return Ok(hold),
                Ok(Err(refused)) => {
                    let available = refused.short.available.max(0);
                    if lowerings < 4 && draft.lower_output(routing, route, draft.output_covered(routing, available))? {
                        lowerings += 1;
                        continue;
                    }
                    let mut e = refused.to_api_error("this request may cost up to", crate::base::clock::now_unix());
                    if route.billed() && !route.embeds() && !route.media() {
                        let covered = draft.output_covered(routing, available);
                        e.message.push_str(&match covered {
                            0 => " That does not cover this request's input.".to_string(),
                            n => format!(
                                " It covers at most {n} output tokens with this input: set '{}' to {n} or less.",
                                draft.output_field
                            ),
                        });
                    }
                    return Err(e);
                }
                Err(crate::store::StoreError::Shared(e)) => {
                    log::warn!("ledger: {e}");
                    return Err(crate::store::fleet::unavailable("the key's balance"));
                }
                Err(e) => {
                    log::error!("ledger: {e}");
                    return Err(ApiError::new(ErrorKind::Internal, "Internal error while checking the balance."));
                }
            }
        }
    }
}
