//! Stage 7, report: what a request came to, once it ended, whatever ended it — the
//! metrics (and OpenTelemetry's GenAI metrics), the access log (a refusal without a known key
//! once per address and minute, see `keyless`), the request log and the trace.

use super::{keyless, Gateway, RequestCtx};
use crate::base::clock::now_ms;
use crate::config::Protocol;
use pingora_proxy::Session;
use std::time::Duration;

pub(super) fn report(gw: &Gateway, session: &Session, ctx: &mut RequestCtx) {
    // Every sink below — metrics, the access log, the request log, the trace — reads the
    // client's strings from here: bounded once, here, for all of them.
    bound_client_strings(ctx);
    let status = session.response_written().map_or(0, |r| r.status.as_u16());
    let model = ctx.relayed.as_ref().map_or("-", |p| p.model.as_str());
    let series = gw.metrics.request(ctx.route, model, status);
    // The request's time, read from the clock once for every place that reports it.
    let elapsed = ctx.started.map_or(Duration::ZERO, |t| t.elapsed());
    // OpenTelemetry's GenAI metrics, for a relayed model call a provider answered.
    if let (Some(plan), Some(operation)) = (&ctx.relayed, crate::observe::metrics::gen_ai_operation(ctx.route)) {
        if let Some(provider) = plan.happened.served_by.and_then(|i| plan.routing.catalog.upstreams.get(i)) {
            let g = series.gen_ai(operation, crate::observe::metrics::gen_ai_provider(provider.config.kind));
            if let Some((usage, _, _)) = plan.happened.billed {
                g.input_tokens.observe(usage.input_total() as f64);
                g.output_tokens.observe(usage.output as f64);
            }
            g.duration.observe(elapsed.as_secs_f64());
            if let Some(first) = plan.happened.first_byte {
                g.time_to_first_token.observe(first.as_secs_f64());
            }
        }
    }
    // A refusal without a known key is logged once per address and minute (see `keyless`).
    let logged = if ctx.key_checked && ctx.key.is_none() {
        let peer = session.client_addr().and_then(|a| a.as_inet()).map(|a| crate::policy::normalize(a.ip()));
        match gw.keyless.check(peer, now_ms()) {
            keyless::Verdict::Log { earlier } => {
                gw.metrics.counter("tollgate_keyless_refusals_total", &[("outcome", "logged")]).add(1);
                if earlier > 0 {
                    let from = peer.map_or_else(|| "-".to_string(), |ip| ip.to_string());
                    log::info!(target: "access", "{earlier} more refusals without a known key from {from} in its previous minute were not logged");
                }
                true
            }
            keyless::Verdict::Suppress => {
                gw.metrics.counter("tollgate_keyless_refusals_total", &[("outcome", "not_logged")]).add(1);
                false
            }
        }
    } else {
        true
    };
    // What guardrails did (never what they found), once for every sink.
    let guardrail = super::guarded::Guarded::summary(ctx);
    if logged {
        access_log(session, ctx, status, elapsed, guardrail.as_deref());
        if let Some(log) = gw.requests.as_ref().filter(|_| ctx.key_checked) {
            write_log_entry(log.as_ref(), session, ctx, status, elapsed, guardrail.as_deref());
        }
    }
    if let Some(tracer) = &gw.tracer {
        finish_trace(tracer, session, ctx, status, guardrail.as_deref());
    }
    crate::edge::listener::request_done(session.as_downstream());
}

/// What the client chose and the request keeps for its report — the model or tool it named,
/// the field a refusal was about — cut to [`crate::base::text::MAX_CLIENT_STRING`].
fn bound_client_strings(ctx: &mut RequestCtx) {
    use crate::base::text::{clip_in_place, MAX_CLIENT_STRING};
    if let Some(m) = ctx.model_asked.as_mut() {
        clip_in_place(m, MAX_CLIENT_STRING);
    }
    if let Some(p) = ctx.reason_param.as_mut() {
        clip_in_place(p, MAX_CLIENT_STRING);
    }
    if let Some(call) = ctx.mcp.as_mut() {
        clip_in_place(&mut call.name, MAX_CLIENT_STRING);
    }
}

/// Write the request's entry in the request log (see `request_log`), borrowing every field
/// from the request's state.
fn write_log_entry(
    log: &dyn crate::store::RequestLogStore,
    session: &Session,
    ctx: &RequestCtx,
    status: u16,
    elapsed: Duration,
    guardrail: Option<&str>,
) {
    // Only a request the id module never saw (none today) needs an id made here.
    let made;
    let id = match crate::observe::request_id::id_of(session) {
        Some(id) => id,
        None => {
            made = crate::observe::request_id::new_id();
            made.as_str()
        }
    };
    let fell = ctx.relayed.as_deref().filter(|p| !p.happened.fell_back.is_empty()).and_then(super::fallback::fell_back);
    let mut entry = crate::records::log::LogLine {
        id,
        time_ms: now_ms(),
        key_id: ctx.key.as_ref().map(|k| k.id.as_str()),
        key_name: ctx.key.as_ref().map(|k| k.name.as_str()),
        model: ctx.model_asked.as_deref(),
        route: ctx.route,
        protocol: ctx.shape.unwrap_or(Protocol::Openai).as_str(),
        status,
        refusal: ctx.reason,
        param: ctx.reason_param.as_deref(),
        latency_ms: elapsed.as_millis() as u64,
        guardrail,
        ..Default::default()
    };
    if let Some(plan) = &ctx.relayed {
        entry.model = Some(&plan.model);
        entry.protocol = plan.protocol.as_str();
        entry.upstream_protocol = plan.translation.as_ref().map(|t| t.upstream.as_str());
        let served_by = plan.happened.served_by.map(|i| &plan.routing.catalog.upstreams[i].config);
        entry.provider = served_by.map(|c| c.name.as_str());
        entry.upstream_model = served_by.map(|c| c.upstream_model(&plan.model)).filter(|m| *m != plan.model);
        entry.attempts = plan.happened.attempts;
        entry.first_byte_ms = plan.happened.first_byte.map(|d| d.as_millis() as u64);
        entry.upstream_request_id = plan.happened.upstream_request_id.as_deref();
        entry.fallbacks = fell.as_deref();
        if let Some(call) = plan.cache.as_deref() {
            entry.cache = Some(call.verdict());
            entry.cache_saved_nanos = call.answered.map(|a| a.saved);
        }
        if let Some((usage, cost, estimated)) = plan.happened.billed {
            entry.input_tokens = usage.input_total();
            entry.output_tokens = usage.output;
            entry.cost_nanos = cost;
            entry.estimated = estimated;
        }
    }
    if let Some((charged, _)) = ctx.video_charge {
        entry.cost_nanos = charged;
        entry.protocol = "video";
    }
    if let Some(s) = &ctx.realtime {
        entry.input_tokens = s.input_tokens;
        entry.output_tokens = s.output_tokens;
        entry.cost_nanos = s.cost_nanos;
        entry.estimated = s.estimated;
        entry.provider = s.provider.as_deref();
    }
    if let Some(call) = &ctx.mcp {
        entry.protocol = "mcp";
        entry.provider = Some(call.server.as_str()).filter(|s| !s.is_empty());
        entry.status = call.status;
        entry.cost_nanos = call.cost_nanos;
        entry.bytes = Some((call.bytes_in, call.bytes_out));
    }
    log.append(entry);
}

/// Hand the request's trace to the tracer with what the request came to (see
/// `telemetry::Trace::finish` for what each span says).
fn finish_trace(tracer: &crate::observe::telemetry::Tracer, session: &Session, ctx: &mut RequestCtx, status: u16, guardrail: Option<&str>) {
    let Some(trace) = ctx.trace.take().or_else(|| ctx.relayed.as_mut().and_then(|p| p.trace.take())) else { return };
    if !trace.sampled {
        return;
    }
    let req = session.req_header();
    let fell = ctx.relayed.as_deref().filter(|p| !p.happened.fell_back.is_empty()).and_then(super::fallback::fell_back);
    let rewrites = ctx.relayed.as_deref().and_then(super::fallback::rewrites);
    let mut facts = crate::observe::telemetry::RequestFacts {
        method: crate::observe::telemetry::method_name(&req.method),
        route: ctx.route,
        operation: crate::observe::metrics::gen_ai_operation(ctx.route),
        model: ctx.model_asked.as_deref(),
        status,
        key_name: ctx.key.as_ref().map(|k| k.name.as_str()),
        tags: ctx.key.as_ref().map(|k| &k.policy.tags),
        refusal: ctx.reason,
        request_id: crate::observe::request_id::id_of(session),
        guardrail,
        ..Default::default()
    };
    if let Some(plan) = &ctx.relayed {
        facts.model = Some(&plan.model);
        facts.provider = plan
            .happened
            .served_by
            .and_then(|i| plan.routing.catalog.upstreams.get(i))
            .map(|u| crate::observe::metrics::gen_ai_provider(u.config.kind));
        facts.first_byte = plan.happened.first_byte;
        facts.requested_model = plan.happened.fell_back.first().map(|(m, _)| m.as_str());
        facts.fallbacks = fell.as_deref();
        facts.rewrites = rewrites.as_deref();
        if let Some((usage, cost, estimated)) = plan.happened.billed {
            facts.usage = Some(usage);
            facts.cost_nanos = Some(cost);
            facts.estimated = estimated;
        }
    }
    if let Some((charged, _)) = ctx.video_charge {
        facts.cost_nanos = Some(charged);
    }
    if let Some(call) = &ctx.mcp {
        facts.cost_nanos = Some(call.cost_nanos);
        facts.status = call.status;
    }
    tracer.finish(*trace, &facts);
}

/// A field of an access log line: written bare, quoted (`{:?}`), or a number.
enum Field<'a> {
    Bare(&'a str),
    Quoted(&'a str),
    Num(u64),
}

/// One structured line per client request (target `access`), as `name=value` pairs or, with
/// `log.format: json`, one JSON object with the same fields. Names the key, never its secret;
/// the path is logged without its query string. A refused request names the model it asked
/// for and `reason`; a video submission its model, seconds and charge.
fn access_log(session: &Session, ctx: &RequestCtx, status: u16, elapsed: Duration, guardrail: Option<&str>) {
    if !log::log_enabled!(target: "access", log::Level::Info) {
        return;
    }
    let req = session.req_header();
    let latency_ms = elapsed.as_secs_f64() * 1000.0;
    let (model, usage, provider, attempts) = match &ctx.relayed {
        Some(plan) => {
            let provider = plan.happened.served_by.map_or("-", |i| plan.routing.catalog.upstreams[i].config.name.as_str());
            (plan.model.as_str(), plan.happened.billed, provider, plan.happened.attempts)
        }
        None => (ctx.model_asked.as_deref().unwrap_or("-"), None, "-", 0),
    };
    let (mut input, mut output, mut cost, mut estimated) = usage.map_or((0, 0, 0, false), |(u, c, e)| (u.input_total(), u.output, c, e));
    if let Some((charged, _)) = ctx.video_charge {
        cost = charged;
    }
    let mut provider = provider;
    let mut status = status;
    // An MCP tool call: its server, what it came to and cost.
    if let Some(call) = &ctx.mcp {
        provider = if call.server.is_empty() { "-" } else { call.server.as_str() };
        cost = call.cost_nanos;
        status = call.status;
    }
    // A realtime session: its turns' totals.
    if let Some(s) = &ctx.realtime {
        (input, output, cost, estimated) = (s.input_tokens, s.output_tokens, s.cost_nanos, s.estimated);
        provider = s.provider.as_deref().unwrap_or("-");
    }
    let cost_usd = crate::base::money::usd(cost);
    let key = ctx.key.as_ref().map_or("-", |k| k.name.as_str());
    // A translated request names the provider's protocol.
    let translated = ctx.relayed.as_ref().and_then(|p| p.translation.as_ref()).map(|t| t.upstream.as_str());
    // The id the client got in `X-Request-Id` (the request log's too), and the upstream's own.
    let request_id = crate::observe::request_id::id_of(session).unwrap_or("-");
    let upstream_id = ctx.relayed.as_ref().and_then(|p| p.happened.upstream_request_id.as_deref());
    // The model asked for and each one left, when the call fell back.
    let fell = ctx.relayed.as_deref().filter(|p| !p.happened.fell_back.is_empty()).and_then(super::fallback::fell_back);
    let requested = ctx.relayed.as_ref().and_then(|p| p.happened.fell_back.first()).map(|(m, _)| m.as_str());
    // The provider's own name of the model, when it differs.
    let upstream_model = ctx.relayed.as_ref().and_then(|p| {
        let config = &p.routing.catalog.upstreams[p.happened.served_by?].config;
        Some(config.upstream_model(&p.model)).filter(|m| *m != p.model)
    });
    // The fields a line has only when they apply, in their order.
    let mut fields: Vec<(&str, Field<'_>)> = Vec::new();
    if let Some(reason) = ctx.reason {
        fields.push(("reason", Field::Bare(reason)));
    }
    if let Some(param) = &ctx.reason_param {
        fields.push(("param", Field::Quoted(param)));
    }
    if let Some((_, seconds)) = ctx.video_charge {
        fields.push(("video_seconds", Field::Num(u64::from(seconds))));
    }
    if let Some(s) = &ctx.realtime {
        fields.extend([("turns", Field::Num(s.turns)), ("ended", Field::Quoted(s.ended))]);
    }
    if let Some(upstream) = translated {
        fields.push(("translated_to", Field::Bare(upstream)));
    }
    if let Some(id) = upstream_id {
        fields.push(("upstream_request_id", Field::Quoted(id)));
    }
    if let Some(m) = upstream_model {
        fields.push(("upstream_model", Field::Quoted(m)));
    }
    if let (Some(asked), Some(fell)) = (requested, &fell) {
        fields.extend([("requested_model", Field::Quoted(asked)), ("fallbacks", Field::Quoted(fell))]);
    }
    let rewrites = ctx.relayed.as_deref().and_then(super::fallback::rewrites);
    if let Some(ids) = &rewrites {
        fields.push(("rewrites", Field::Quoted(ids)));
    }
    if let Some(g) = guardrail {
        fields.push(("guardrail", Field::Quoted(g)));
    }
    if let Some(call) = ctx.relayed.as_ref().and_then(|p| p.cache.as_deref()) {
        fields.push(("cache", Field::Bare(call.verdict())));
    }
    if crate::observe::logging::json() {
        let mut line = serde_json::json!({
            "request_id": request_id,
            "method": req.method.as_str(), "path": req.uri.path(), "route": ctx.route, "status": status,
            "key": key, "model": model, "provider": provider, "attempts": attempts,
            "input_tokens": input, "output_tokens": output, "cost_usd": cost_usd, "estimated": estimated,
            "latency_ms": (latency_ms * 1000.0).round() / 1000.0,
        });
        for (name, field) in &fields {
            line[*name] = match field {
                Field::Bare(v) | Field::Quoted(v) => (*v).into(),
                Field::Num(n) => (*n).into(),
            };
        }
        log::info!(target: "access", "{line}");
        return;
    }
    let mut extra = String::new();
    for (name, field) in &fields {
        extra.push_str(&match field {
            Field::Bare(v) => format!(" {name}={v}"),
            Field::Quoted(v) => format!(" {name}={v:?}"),
            Field::Num(n) => format!(" {name}={n}"),
        });
    }
    log::info!(
        target: "access",
        "request_id={request_id} method={} path={:?} route={} status={} key={:?} model={:?} provider={:?} attempts={} input_tokens={} output_tokens={} cost_usd={:.9} estimated={} latency_ms={:.3}{extra}",
        req.method,
        req.uri.path(),
        ctx.route,
        status,
        key,
        model,
        provider,
        attempts,
        input,
        output,
        cost_usd,
        estimated,
        latency_ms
    );
}
