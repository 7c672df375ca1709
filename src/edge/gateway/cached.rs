//! Stage 3b, cache: a model call that may be answered from the response cache (`crate::cache`)
//! — its key's, account's or group's `cache:` entry, or its request's `x-tollgate-cache` — is
//! looked up once drafted; a kept answer makes it a hit. A hit is a kind of call like any
//! other on the charge path: counted under `rpm` (stage 3), admitted and held for its hit price
//! (stage 4: `prices.<model>.cache_hit` or `cache_hit_ratio` of its original usage, no `tpm`
//! reservation), settled with its original usage and what it saved (its record says `cache:
//! hit`), then answered here whole or as its stream's events at once, with a fresh id. A miss
//! is relayed as any call, and what the client gets is kept as it goes ([`Gateway::capture`]),
//! stored once it ended well — complete, 200, its usage reported — never a cut stream, an
//! error, a refusal or a guarded answer (a call whose guardrails read its answer, or masked
//! its request, is not cached; one that input guardrails let through unchanged is).

use super::admit::Caller;
use super::draft::Drafted;
use super::{Gateway, RelayPlan, RequestCtx, Step};
use crate::billing::meter::{Shape, UsageScanner};
use crate::cache::capture::Capture;
use crate::cache::directive::Directive;
use crate::cache::entry::{Body, Entry};
use crate::policy::cache::CachePolicy;
use crate::protocol::{header_str, ApiError, ErrorKind};
use crate::route::Route;
use bytes::Bytes;
use pingora_error::Result;
use pingora_http::ResponseHeader;
use pingora_proxy::Session;

/// The request header a client asks with, and the answer's header that says what happened
/// (`hit`, `miss`, `bypass`).
pub(super) static HEADER: http::HeaderName = http::HeaderName::from_static("x-tollgate-cache");

/// A call the cache applies to, carried in its plan.
pub struct CacheCall {
    /// How it uses the cache; None: it asked, and cannot (`bypass`).
    using: Option<crate::cache::Use>,
    /// The answer kept for it, until it is answered.
    hit: Option<Hit>,
    /// It was answered from the cache.
    pub(super) answered: Option<Answered>,
    /// The body it was keyed on (address, length): a body changed later (its output lowered to
    /// what the key can pay) is not kept.
    keyed: (usize, usize),
    /// A miss's answer as it goes to the client, and its share of the budget of bytes held.
    capture: Option<(Capture, crate::edge::body::Reservation)>,
    content_type: String,
}

/// A kept answer that will answer the call: priced once, when found, and held against the
/// budget of bytes held for clients until it is sent (an answer the budget has no room for is
/// not served from the cache).
struct Hit {
    entry: Box<Entry>,
    _held: crate::edge::body::Reservation,
    /// Its hit price and its original cost (nano-USD at the price table).
    cost: i64,
    list: i64,
}

/// What a hit used and cost.
#[derive(Debug, Clone, Copy)]
pub(super) struct Answered {
    pub usage: crate::base::usage::Usage,
    /// The hit's price (nano-USD at the price table).
    pub cost: i64,
    /// The original answer's list cost less the hit's.
    pub saved: i64,
}

impl CacheCall {
    /// A kept answer will answer it.
    pub(super) fn is_hit(&self) -> bool {
        self.hit.is_some() || self.answered.is_some()
    }

    /// What the answer's header says.
    pub(super) fn verdict(&self) -> &'static str {
        match (&self.using, self.is_hit()) {
            (_, true) => "hit",
            (Some(u), false) if u.keeps || u.reads => "miss",
            _ => "bypass",
        }
    }

    /// What a hit is held and billed for (None: not a hit).
    pub(super) fn hit_cost(&self) -> Option<i64> {
        self.hit.as_ref().map(|h| h.cost)
    }

    /// A body changed since it was keyed is not kept.
    pub(super) fn body_is(&mut self, body: &Bytes) {
        if (body.as_ptr() as usize, body.len()) != self.keyed {
            if let Some(u) = self.using.as_mut() {
                u.keeps = false;
            }
        }
    }
}

/// The cache a drafted call uses, and the answer kept for it. None: the cache does not apply.
pub(super) async fn lookup(
    gw: &Gateway,
    session: &Session,
    ctx: &RequestCtx,
    caller: &Caller,
    drafted: &Drafted,
) -> Step<Option<Box<CacheCall>>> {
    let Some(cache) = gw.cache.as_ref() else { return Ok(None) };
    let Caller { route, key, routing, under, .. } = caller;
    let (samples, stores_by_default) = match route {
        Route::ChatCompletions | Route::Messages | Route::GenerateContent { .. } => (true, false),
        Route::Responses => (true, true),
        Route::Embeddings | Route::GeminiEmbed { .. } => (false, false),
        _ => return Ok(None),
    };
    let asked = match header_str(session.req_header(), &HEADER) {
        Some(value) => Directive::parse(value).map_err(|why| ApiError::new(ErrorKind::BadRequest, why).with_param("x-tollgate-cache"))?,
        None => Directive::default(),
    };
    let group = routing.catalog.groups().get(&key.group).and_then(|g| g.cache.as_ref());
    let policy = CachePolicy::nearest(key.policy.cache.as_ref(), under.account().and_then(|a| a.cache.as_ref()), group);
    let draft = &drafted.draft;
    let call = crate::cache::Call {
        protocol: drafted.protocol.as_str(),
        route: route.label(),
        model: &draft.model,
        stream: draft.stream,
        samples,
        stores_by_default,
        body: &draft.body,
        key_id: &key.id,
        account: under.account().map(|a| a.name.as_str()),
        group: &key.group,
    };
    let consulted = match cache.consult(&call, policy, asked) {
        None => return Ok(None),
        // Other models may answer it, or guardrails read its answer (or masked its request, to
        // restore in the answer): not cached.
        Some(Ok(_)) if !draft.fallbacks.is_empty() || drafted.upload.is_some() || draft.media.is_some() => None,
        Some(Ok(_)) if ctx.guarded.is_some() && super::guarded::output(ctx, route, &draft.model).is_some() => None,
        Some(Ok(using)) => Some(using),
        Some(Err(why)) => {
            log::debug!("response cache: call of key {} not cacheable ({why:?})", key.name);
            None
        }
    };
    let keyed = (draft.body.as_ptr() as usize, draft.body.len());
    let mut call = Box::new(CacheCall { using: consulted, hit: None, answered: None, keyed, capture: None, content_type: String::new() });
    match &call.using {
        None => cache.count("bypass"),
        Some(u) if u.reads => {
            if let Some(entry) = cache.get(&u.key, crate::base::clock::now_ms()).await {
                // Held in memory until it is sent: counted against the budget, else relayed.
                let mut held = gw.body.budget.reservation();
                if held.grow(entry.body.len()) {
                    let (cost, list) = routing.prices.hit_cost(&entry.model, entry.usage);
                    call.hit = Some(Hit { entry: Box::new(entry), _held: held, cost, list });
                }
            }
        }
        Some(u) => cache.count(if u.keeps { "refresh" } else { "bypass" }),
    }
    Ok(Some(call))
}

impl Gateway {
    /// Answer a hit: its header (`x-tollgate-cache: hit`, `age`), then its answer — the kept
    /// bytes with a fresh id, its usage event withheld when the client did not ask for one — a
    /// stream's first event at once, settled (before the last byte, as a relay), then the rest
    /// of its events in one write.
    pub(super) async fn answer_cached(&self, session: &mut Session, ctx: &mut RequestCtx, plan: &mut RelayPlan) -> Result<()> {
        let Some(call) = plan.cache.as_mut() else { return Ok(()) };
        let Some(Hit { mut entry, _held, cost, list }) = call.hit.take() else { return Ok(()) };
        let now = crate::base::clock::now_ms();
        let age_secs = now.saturating_sub(entry.created_ms) / 1000;
        call.answered = Some(Answered { usage: entry.usage, cost, saved: list.saturating_sub(cost).max(0) });
        crate::cache::replay::refresh_id(&mut entry.body, crate::base::secrets::random_base62);
        let (body, first_end) = match std::mem::replace(&mut entry.body, Body::Whole(Vec::new())) {
            Body::Whole(bytes) => (Bytes::from(bytes), None),
            Body::Events { bytes, ends } => (Bytes::from(bytes), ends.first().copied()),
        };
        let mut header = Box::new(ResponseHeader::build(200, Some(5))?);
        header.insert_header(http::header::CONTENT_TYPE, entry.content_type.as_str())?;
        header.insert_header(&HEADER, "hit")?;
        header.insert_header(http::header::AGE, age_secs.to_string())?;
        match first_end {
            Some(_) => {
                header.insert_header(http::header::CACHE_CONTROL, "no-cache")?;
                header.set_version(http::Version::HTTP_11);
                header.insert_header(http::header::TRANSFER_ENCODING, "chunked")?;
            }
            None => header.insert_header(http::header::CONTENT_LENGTH, body.len().to_string())?,
        }
        ctx.response_started = true;
        session.write_response_header(header, false).await.map_err(|e| e.into_down())?;
        plan.happened.first_byte = Some(plan.started.elapsed());
        let Some(first_end) = first_end else {
            Box::pin(self.settle(plan, None, 200)).await;
            return session.write_response_body(Some(body), true).await.map_err(|e| e.into_down());
        };
        // The client did not ask for the usage event the original stream carried: withheld as a
        // relay withholds it.
        let mut scanner = plan.withhold_usage.then(|| UsageScanner::new(plan.route.usage_shape().unwrap_or(Shape::Chat), true, true));
        let mut out = |chunk: Bytes| match scanner.as_mut() {
            Some(s) => s.feed(&chunk).unwrap_or(chunk),
            None => chunk,
        };
        let first = out(body.slice(..first_end));
        session.write_response_body(Some(first), false).await.map_err(|e| e.into_down())?;
        let mut rest = out(body.slice(first_end..));
        if let Some(pending) = scanner.as_mut().and_then(UsageScanner::take_pending) {
            rest = Bytes::from([&rest[..], &pending[..]].concat());
        }
        Box::pin(self.settle(plan, None, 200)).await;
        session.write_response_body(Some(rest), true).await.map_err(|e| e.into_down())
    }

    /// What a relayed answer's `x-tollgate-cache` says (None: the cache does not apply); a 200
    /// that may be kept starts being captured (`content_type`: what it is kept as).
    pub(super) fn cache_begin(&self, plan: &mut RelayPlan, status: u16, content_type: &str) -> Option<&'static str> {
        let call = plan.cache.as_mut()?;
        let verdict = call.verdict();
        if let Some(using) = call.using.as_ref().filter(|u| u.keeps && status == 200 && plan.guard.is_none()) {
            let sse = content_type.starts_with("text/event-stream");
            let max = usize::try_from(using.max_entry_bytes).unwrap_or(usize::MAX);
            call.capture = Some((Capture::new(sse, max), self.body.budget.reservation()));
            call.content_type = content_type.chars().take(128).collect();
        }
        Some(verdict)
    }

    /// A native relay's header (the upstream's, as the client gets it): what the cache did, and
    /// its answer kept as it is typed.
    pub(super) fn cache_relayed(&self, plan: &mut RelayPlan, header: &mut ResponseHeader, status: u16) -> Result<()> {
        if plan.cache.is_none() {
            return Ok(());
        }
        let content_type = header.headers.get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        if let Some(verdict) = self.cache_begin(plan, status, &content_type) {
            header.insert_header(&HEADER, verdict)?;
        }
        Ok(())
    }

    /// Keep `bytes` of the answer going out (nothing once past the entry's bound or the budget
    /// of bytes held for clients).
    pub(super) fn capture(plan: &mut RelayPlan, bytes: &[u8]) {
        let Some(call) = plan.cache.as_mut() else { return };
        let Some((capture, held)) = call.capture.as_mut() else { return };
        let before = capture.held();
        capture.feed(bytes);
        if !held.grow(capture.held().saturating_sub(before)) {
            call.capture = None;
        }
    }

    /// Store a miss's answer once it ended well (after settlement, before the client's last
    /// byte, so that the same call made once this one ended is a hit): complete, its usage
    /// reported.
    pub(super) async fn keep_answer(&self, plan: &mut RelayPlan) {
        let (Some(cache), Some(call)) = (self.cache.as_ref(), plan.cache.as_mut()) else { return };
        let Some((capture, held)) = call.capture.take() else { return };
        let Some(using) = call.using.as_ref().filter(|u| u.keeps) else { return };
        let Some((usage, _, false)) = plan.happened.billed else { return };
        let Some(body) = capture.finish() else { return };
        let now = crate::base::clock::now_ms();
        let entry = Entry {
            content_type: std::mem::take(&mut call.content_type),
            model: plan.model.clone(),
            usage,
            created_ms: now,
            expires_ms: now.saturating_add(using.ttl_secs.saturating_mul(1000)),
            body,
        };
        cache.keep(&using.key, &plan.key.id, &entry).await;
        drop(held);
    }
}
