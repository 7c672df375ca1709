//! Stage 4, price and hold: the checks on what the request may cost, in the order of the
//! the manual's "Keys and policy" (docs/keys.md) (after the rate limits and the model's rules of the stages
//! before): requests in flight (`max_concurrent`), the request's cost cap, the tokens it is
//! held for under a `tpm`, then the spend windows and the balances — the money is held in
//! every purse the key pays from. A request that named no output maximum is lowered to what
//! fits rather than refused. Out of it comes the relay plan.

use super::admit::Caller;
use super::draft::Drafted;
use super::{Exit, Gateway, Happened, Outcome, RelayPlan, RequestCtx, Step};
use crate::billing::ledger::Hold;
use crate::checks::{Kind, Subject};
use crate::config::Protocol;
use crate::protocol::response::LocalResponse;
use crate::protocol::ApiError;
use crate::records::key::KeyRecord;
use crate::route::Route;
use crate::upstream::{self, Routing};
use pingora_proxy::Session;
use std::time::Instant;

pub(super) async fn price(
    gw: &Gateway,
    session: &Session,
    ctx: &mut RequestCtx,
    caller: Caller,
    drafted: Drafted,
    mut cache: Option<Box<super::cached::CacheCall>>,
) -> Step<Box<RelayPlan>> {
    let Caller { route, key, version, routing, under, .. } = caller;
    let Drafted { protocol, mut draft, body_reservation, upload, group_rules } = drafted;
    let slot = gw.charge.enter_under(&key, &under).await?;
    // A hit is held for exactly its hit price (its original usage is known), and reserves no tokens.
    let hit = cache.as_deref().and_then(super::cached::CacheCall::hit_cost);
    if let Some(cost) = hit {
        draft.hold_nanos = cost;
    }
    // What its guardrails cost is held and billed with it.
    let guard_price_nanos = super::guarded::price(ctx);
    draft.add_fixed(guard_price_nanos);
    // What the key is charged of the price table.
    let rate = under.rate();
    // A request that named no maximum is held (and asks) for less when its cap (in what the
    // key is charged) is lower.
    if let Some(cap) = key.policy.max_request_cost_nanos.filter(|cap| hit.is_none() && rate.apply(draft.hold_nanos) > *cap) {
        draft.lower_output(&routing, &route, draft.output_covered(&routing, rate.list_within(cap)))?;
    }
    // The checks that look at what a call may cost (the key's cap among them).
    let cost = Some(rate.apply(draft.hold_nanos));
    if let Err(stop) = gw.checks.run(&Subject { cost, ..Subject::new(Kind::ModelCall, &key.policy) }) {
        ctx.model_asked = Some(draft.model.clone());
        return Err(stop.into());
    }
    // Under a `tpm`, the tokens the request is held for are reserved until it settles (a
    // request that named no maximum asks for no more than the whole limit leaves room for).
    // The key's own `tpm` lowers the output allowance to what fits; an account's or a tag's
    // `tpm` (shared with other keys) only refuses what does not fit.
    let tokens_reserved = match route.billed() && hit.is_none() {
        true => {
            let input = draft.input.tokens();
            if let Some(tpm) = key.tpm {
                draft.lower_output(&routing, &route, tpm.saturating_sub(input) / draft.choices.max(1))?;
            }
            gw.charge.reserve_tokens(&key, &under, input.saturating_add(draft.most_output()))?
        }
        false => None,
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
    let hold = hold_for(gw, &routing, (&key, &under), &route, (&mut draft, hit.is_none()))
        .await
        .inspect_err(|_| ctx.model_asked = Some(draft.model.clone()))?;
    if let Some(call) = cache.as_mut() {
        // Its output lowered to what the key can pay: its answer is not the one keyed.
        call.body_is(&draft.body);
    }
    let billed = route.billed();
    let guard = super::guarded::output(ctx, &route, &draft.model);
    let (fallback_on, chained) = (draft.fallback_on, !draft.fallbacks.is_empty());
    let fallbacks = match chained {
        true => std::mem::take(&mut draft.fallbacks).into_iter().map(upstream::fallback::Next::from).collect(),
        false => Vec::new(),
    };
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
        under,
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
        guard,
        guard_price_nanos,
        fallbacks,
        fallback_on,
        chained,
        group_rules,
        error_read: None,
        cache,
        happened: Happened::default(),
    }))
}

/// Hold the most `draft` can cost in every purse of `key`. A request that named no output
/// maximum and does not fit is lowered to what the purse that refused it covers (down to
/// `billing.min_output_tokens`) and tried again; a refusal says how many output tokens the
/// money covers and which field to set.
async fn hold_for(
    gw: &Gateway,
    routing: &Routing,
    (key, under): (&std::sync::Arc<KeyRecord>, &crate::charge::Under),
    route: &Route,
    (draft, lowerable): (&mut upstream::Draft, bool),
) -> std::result::Result<Hold, ApiError> {
    let mut purses = gw.charge.purses_kept(key, under, &routing.calendar)?;
    let rate = under.rate();
    // Each lowering fits the purse that refused; another purse may then refuse in turn.
    let mut lowerings = 0;
    loop {
        let mut refused = match gw.charge.hold(purses, draft.hold_nanos, rate).await? {
            Ok(hold) => return Ok(hold),
            Err(refused) => refused,
        };
        purses = std::mem::take(&mut refused.purses);
        // What the refusing purse has left, in the price table's money.
        let available = rate.list_within(refused.short.available.max(0));
        if lowerable && lowerings < 4 && draft.lower_output(routing, route, draft.output_covered(routing, available))? {
            lowerings += 1;
            continue;
        }
        let mut e = refused.to_api_error("this request may cost up to", crate::base::clock::now_unix());
        if route.billed() && !route.embeds() && !route.media() {
            let covered = draft.output_covered(routing, available);
            e.message.push_str(&match covered {
                0 => " That does not cover this request's input.".to_string(),
                n => format!(" It covers at most {n} output tokens with this input: set '{}' to {n} or less.", draft.output_field),
            });
        }
        return Err(e);
    }
}
