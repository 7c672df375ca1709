//! The realtime API (a stage-2 answer): one WebSocket session, relayed frame by frame between
//! the client and a provider, billed turn by turn. The upgrade is checked like any call (key,
//! group, model rules, rpm; the session holds a `max_concurrent` slot), sent to the model's first
//! available provider with the provider's key (the client's — a header or the
//! `openai-insecure-api-key.` subprotocol — never goes on), and its `101` relayed. Then each side's
//! frames go to the other whole, as they complete (at most one frame of each side is held), and
//! are read on the way:
//!
//! * a turn is held before it starts — when the client asks for one (`response.create`) or the
//!   server starts one itself (`response.created`, voice activity): a turn that cannot be paid
//!   for is refused with the protocol's `error` event (the client's request is not passed on; a
//!   turn the server started is cancelled upstream) and the session stays open; each turn asked
//!   for counts against the key's `rpm`;
//! * `response.done` settles the turn from its usage (text, audio and cached tokens at their own
//!   prices) and books its record; once the key's balance is spent the session is closed with
//!   code 1008 and the reason;
//! * a session cut by either side, past `limits.realtime_max_secs` or idle for
//!   `limits.realtime_idle_secs`, or sent a frame over `limits.realtime_max_frame_bytes` (1009) is
//!   closed on both sides; a turn left without its `response.done` is billed its hold (fail
//!   closed, marked estimated).

use super::super::admit::Caller;
use super::super::{Gateway, Outcome, RequestCtx};
use crate::billing::ledger::Hold;
use crate::charge::{Bucket, Payer, Used};
use crate::checks::{Kind, Looks, Subject, Text};
use crate::config::Protocol;
use crate::protocol::realtime::{self as rt, Event, Frame, FrameError, Splitter, TurnUsage};
use crate::protocol::{header_str, ApiError, ErrorKind};
use crate::records::key::KeyRecord;
use crate::route::Route;
use crate::upstream::Routing;
use pingora_core::protocols::http::v1::client::HttpSession as UpstreamSession;
use pingora_http::{RequestHeader, ResponseHeader};
use pingora_proxy::Session;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A realtime session: each turn checked, held, settled from its `response.done`.
pub(in crate::edge::gateway) struct Realtime;

#[async_trait::async_trait]
impl super::Answered for Realtime {
    fn platform(&self) -> Option<crate::config::Platform> {
        None
    }

    fn entry(&self) -> crate::charge::Entry {
        // A session counts against `max_concurrent` while it lasts (the session and each turn
        // against `rpm`, counted inside).
        crate::charge::Entry { slot: true, ..crate::charge::Entry::default() }
    }

    async fn run(
        &self,
        gw: &Gateway,
        session: &mut Session,
        ctx: &mut RequestCtx,
        caller: &Caller,
    ) -> std::result::Result<Outcome, ApiError> {
        realtime(gw, session, ctx, &caller.key, &caller.routing).await
    }
}

/// Input tokens a turn is held for beyond the previous turn's input (the conversation grows by
/// what the client said since).
pub const TURN_INPUT_ALLOWANCE: u64 = 4_000;

/// What a session came to, for the access and request logs.
#[derive(Debug, Default, Clone)]
pub struct SessionTotals {
    pub turns: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_nanos: i64,
    pub estimated: bool,
    pub provider: Option<String>,
    /// Why the session ended.
    pub ended: &'static str,
    /// What the key's guardrails did to its events.
    pub guardrail: Vec<crate::checks::guard::Noted>,
}

/// A turn held: asked for by the client and not yet started upstream, or under way.
struct Turn {
    hold: Hold,
    started: Instant,
}

/// A client's text message arriving in fragments, held until its last fragment (its payload is
/// bounded by `limits.realtime_max_frame_bytes` like a whole frame).
enum Fragments {
    None,
    /// A text message: its payload so far (unmasked).
    Text(Vec<u8>),
    /// A binary message: its fragments are relayed as they come.
    Binary,
}

/// How often a key whose turn was refused for its balance is checked again before its audio is
/// relayed once more.
const STARVED_RECHECK: Duration = Duration::from_secs(5);

/// A realtime session's state while it is relayed.
struct Relay<'a> {
    gw: &'a Gateway,
    key: Arc<KeyRecord>,
    routing: Arc<Routing>,
    model: String,
    /// Turns the client asked for (`response.create`), held, whose `response.created` has not
    /// come yet: the oldest is the next to start.
    asked: std::collections::VecDeque<Turn>,
    /// Turns under way, by the response's id (several at once: responses out of band).
    running: Vec<(Option<String>, Turn)>,
    /// A turn was refused for the key's balance: the client's audio (which would start turns
    /// the server runs on its own) is not relayed until a turn can be held again; when it was
    /// last checked.
    starved: Option<Instant>,
    /// A client's message in fragments.
    fragments: Fragments,
    /// `session.updated` answers to tollgate's own `session.update` not yet seen (not relayed:
    /// the client did not ask; the next one it gets says the whole session).
    own_updates: u32,
    /// The input of the last turn: the next is held for it and more.
    last_input: u64,
    totals: SessionTotals,
    /// The request's trace (a span per turn), given back when the session ends.
    trace: Option<Box<crate::observe::telemetry::Trace>>,
    /// The provider's span attributes.
    span_attrs: Option<crate::observe::telemetry::Attrs>,
    /// The key's guardrails: each client event's text is read by those of the input phase.
    guards: crate::checks::guard::Applied,
    /// What they cost (`price_per_check`) since the last turn was billed: billed with the next.
    guard_unbilled: i64,
    /// The output guardrails of its answers' text (built in and the operator's patterns), read
    /// over the look-behind window as they stream.
    out_guard: Option<Box<crate::checks::guard::stream::OutputGuard>>,
    /// The placeholders its client events were masked with (the same value, the same one in
    /// the session): those of a guardrail that restores are put back in its answers.
    masks: crate::checks::guard::Masks,
    /// An answer a guardrail blocked: its remaining text events are dropped until it is done.
    suppressing: bool,
}

/// What a guardrail's service is told of a session's call (its text events and answers).
fn guard_call<'a>(model: &'a str, key: &'a KeyRecord) -> crate::checks::guard::Call<'a> {
    crate::checks::guard::Call { protocol: "openai", route: "realtime", model: Some(model), key_id: &key.id, tags: &key.policy.tags }
}

/// `GET /v1/realtime?model=…`: the session, from its upgrade to its end.
pub(super) async fn realtime(
    gw: &Gateway,
    session: &mut Session,
    ctx: &mut RequestCtx,
    key: &Arc<KeyRecord>,
    routing: &Arc<Routing>,
) -> std::result::Result<Outcome, ApiError> {
    let req = session.req_header();
    let upgrade = header_str(req, "upgrade").is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    if !upgrade || header_str(req, "sec-websocket-key").is_none() {
        return Err(ApiError::new(ErrorKind::BadRequest, "The realtime API takes a WebSocket upgrade (GET with Upgrade: websocket)."));
    }
    let model = query_model(req.uri.query())?;
    ctx.model_asked = Some(model.clone());
    crate::protocol::check_model_name(&model)?;
    if !routing.catalog.group_allows(&key.group, Protocol::Openai) {
        return Err(ApiError::new(ErrorKind::NotFound, format!("This endpoint is not available to keys of group '{}'.", key.group)));
    }
    gw.checks.vet(&Subject::new(Kind::RealtimeTurn, &key.policy).model(&model).plans(&gw.charge.plan_models(key)))?;
    let candidates: Vec<usize> = routing
        .catalog
        .candidates(Protocol::Openai, &model)
        .map(|c| {
            c.iter().copied().filter(|&i| routing.catalog.upstreams[i].seam.serves(&Route::Realtime, Protocol::Openai, false)).collect()
        })
        .unwrap_or_default();
    if candidates.is_empty() {
        return Err(ApiError::new(
            ErrorKind::ModelNotFound,
            format!("The model '{model}' is not available for realtime sessions to this key."),
        )
        .with_param("model"));
    }
    if crate::billing::realtime::turn_hold(&routing.prices, &model, 0, 0).is_none() {
        return Err(ApiError::new(ErrorKind::Internal, format!("The model '{model}' is not priced on this gateway and cannot be served.")));
    }
    // A key with nothing left is refused before the session opens (each turn is held as it
    // starts); the session counts against `rpm` like a turn.
    gw.charge.count(key, Bucket::Requests).await?;
    // One of the key's `limits.realtime_sessions_per_key`, held while the session lasts.
    let mut slot = gw.realtime_sessions.of(&key.id).reservation();
    if !slot.grow(1) {
        let mut refused = ApiError::new(
            ErrorKind::RateLimited,
            format!("This key has {} realtime sessions open, the most it may hold at once; close one first.", gw.realtime.sessions_per_key),
        );
        refused.retry_after = Some(1);
        return Err(refused);
    }
    gw.charge.covers(key, &routing.calendar, 1, "a realtime session needs").await?;
    let mut relay = Relay {
        gw,
        key: key.clone(),
        routing: routing.clone(),
        model,
        asked: std::collections::VecDeque::new(),
        running: Vec::new(),
        starved: None,
        fragments: Fragments::None,
        own_updates: 0,
        last_input: 0,
        totals: SessionTotals::default(),
        trace: None,
        span_attrs: None,
        guards: super::super::guarded::applying(gw, routing, key),
        guard_unbilled: 0,
        out_guard: None,
        masks: crate::checks::guard::Masks::default(),
        suppressing: false,
    };
    relay.out_guard = relay.output_guard();
    let (mut upstream, answer) = open_realtime(gw, session.req_header(), &mut relay, &candidates).await?;
    if answer.status.as_u16() != 101 {
        let status = answer.status.as_u16();
        let body = upstream.read_body_bytes().await.ok().flatten().unwrap_or_default();
        upstream.shutdown().await;
        return Err(realtime_refused(relay.totals.provider.as_deref().unwrap_or("?"), status, &body));
    }
    upstream.maybe_upgrade_body_writer();
    upstream.read_timeout = None;
    let mut header = ResponseHeader::build(101, Some(4)).map_err(internal)?;
    for name in ["upgrade", "connection", "sec-websocket-accept", "sec-websocket-protocol"] {
        if let Some(v) = answer.headers.get(name) {
            header.insert_header(name, v.clone()).map_err(internal)?;
        }
    }
    ctx.response_started = true;
    if let Err(e) = session.write_response_header(Box::new(header), false).await {
        log::debug!("realtime: the client left before its upgrade: {e}");
        upstream.shutdown().await;
        return Ok(Outcome::Done);
    }
    let limits = gw.realtime;
    // The request's trace takes a span per turn while the session lasts (a refused upgrade
    // left it with the request, which reports it).
    relay.trace = ctx.trace.take();
    // An open session counts among the open streams while it lasts.
    let _open = crate::observe::metrics::Live::new(&gw.metrics, crate::observe::metrics::Gauge::OpenStreams);
    relay.totals.ended = relay.run(session, &mut upstream, limits).await;
    upstream.shutdown().await;
    relay.end_turns_unreported().await;
    ctx.trace = relay.trace.take();
    ctx.realtime = Some(Box::new(relay.totals));
    Ok(Outcome::Done)
}

/// Send the upgrade to the first provider that takes a connection: its request (the
/// client's WebSocket headers, the provider's key and model name), and its answer's header.
async fn open_realtime(
    gw: &Gateway,
    client: &RequestHeader,
    relay: &mut Relay<'_>,
    candidates: &[usize],
) -> std::result::Result<(UpstreamSession, ResponseHeader), ApiError> {
    let catalog = &relay.routing.catalog;
    let (mut tried, mut dead) = (Vec::new(), Vec::new());
    while let Some((index, admission)) = catalog.next_provider(candidates, &tried, &dead, Instant::now()) {
        let upstream = &catalog.upstreams[index];
        let Some(peer) = upstream.peer(tried.len() + dead.len()) else {
            dead.push(index);
            continue;
        };
        let token = crate::upstream::bearer(upstream).await.map_err(|e| super::super::send::upstream_failure(&e))?;
        let req = crate::upstream::realtime_request(client, upstream, admission.key, &relay.model, token.as_ref())
            .map_err(|e| super::super::send::upstream_failure(&e))?;
        let connected = async {
            let (mut http, _) = gw.connector.get_http_session(&peer).await?;
            http.read_timeout = peer.options.read_timeout;
            http.write_request_header(Box::new(req)).await?;
            http.read_response().await?;
            let header = http
                .resp_header()
                .cloned()
                .ok_or_else(|| pingora_error::Error::explain(pingora_error::ErrorType::InvalidHTTPHeader, "no answer"))?;
            Ok::<_, Box<pingora_error::Error>>((http, header))
        };
        match connected.await {
            Ok((http, header)) => {
                let verdict = match header.status.as_u16() {
                    429 => crate::upstream::health::Verdict::Throttled(super::super::send::retry_after(&header)),
                    500..=599 => crate::upstream::health::Verdict::Failed,
                    _ => crate::upstream::health::Verdict::Answered,
                };
                admission.report(verdict);
                relay.totals.provider = Some(upstream.config.name.clone());
                relay.span_attrs = Some(upstream.span_attrs.clone());
                return Ok((http, header));
            }
            Err(e) => {
                log::warn!("realtime: provider {} failed to open a session: {e}", upstream.config.name);
                admission.report(crate::upstream::health::Verdict::Failed);
                tried.push(index);
            }
        }
    }
    Err(ApiError::new(ErrorKind::BadGateway, "The upstream service is unreachable. Retry later."))
}

/// A provider's refusal of the upgrade, as the client is told it.
fn realtime_refused(provider: &str, status: u16, body: &[u8]) -> ApiError {
    if matches!(status, 401 | 403) {
        log::error!("provider {provider} refused tollgate's credential ({status}) for a realtime session");
    }
    crate::protocol::upstream_error::from_body(status, body)
}

fn internal(e: Box<pingora_error::Error>) -> ApiError {
    log::error!("realtime: {e}");
    ApiError::new(ErrorKind::Internal, "Internal gateway error.")
}

/// The `model` query parameter, required.
fn query_model(query: Option<&str>) -> std::result::Result<String, ApiError> {
    query
        .unwrap_or_default()
        .split('&')
        .find_map(|pair| pair.strip_prefix("model="))
        .map(crate::base::text::decode_component)
        .filter(|m| !m.is_empty())
        .ok_or_else(|| ApiError::new(ErrorKind::BadRequest, "The 'model' query parameter is required.").with_param("model"))
}

/// Why the relay loop stopped.
enum Stop {
    Client,
    Upstream,
    /// Closed by tollgate: the close code both sides get, and the reason.
    Closed(u16, &'static str),
}

impl Relay<'_> {
    /// The output tokens a turn is held for: what the upstream is told a turn may write.
    fn turn_output(&self) -> u64 {
        self.routing
            .prices
            .price(&self.model)
            .and_then(|p| p.default_output_tokens.or(p.max_output_tokens))
            .unwrap_or(self.routing.default_output_tokens)
    }

    /// Hold one more turn in every purse of the key, counted against its `rpm`; when it cannot
    /// be, why (the `error` event's code and message).
    async fn hold_turn(&mut self) -> Result<Turn, (&'static str, String)> {
        if let Err(e) = self.gw.charge.count(&self.key, Bucket::Requests).await {
            return Err(("rate_limit_exceeded", e.message));
        }
        let hold = self.hold(false).await?;
        self.starved = None;
        Ok(Turn { hold, started: Instant::now() })
    }

    /// Hold what a turn may cost (`probe`: only to see whether it could be, not counted as a
    /// refusal).
    async fn hold(&mut self, probe: bool) -> Result<Hold, (&'static str, String)> {
        let book = &self.routing.prices;
        let amount = crate::billing::realtime::turn_hold(
            book,
            &self.model,
            self.last_input.saturating_add(TURN_INPUT_ALLOWANCE),
            self.turn_output(),
        )
        .unwrap_or(0);
        let purses = self.gw.charge.purses(&self.key, &self.routing.calendar).map_err(|e| ("turn_refused", e.message))?;
        match self.gw.charge.hold(purses, amount, self.gw.charge.rate(&self.key)).await {
            Ok(Ok(hold)) => Ok(hold),
            Ok(Err(refused)) => {
                if !probe {
                    self.starved = Some(Instant::now());
                }
                Err(("insufficient_balance", refused.to_api_error("this turn may cost up to", crate::base::clock::now_unix()).message))
            }
            Err(_) => Err(("server_error", "The key's balance cannot be read right now.".into())),
        }
    }

    /// Whether the client's audio may be relayed: not while the key cannot pay for a turn (checked
    /// again every few seconds, so a key topped up meanwhile speaks again).
    async fn audio_allowed(&mut self) -> bool {
        match self.starved {
            None => true,
            Some(at) if at.elapsed() < STARVED_RECHECK => false,
            Some(_) => match self.hold(true).await {
                Ok(_released) => {
                    self.starved = None;
                    true
                }
                Err(_) => {
                    self.starved = Some(Instant::now());
                    false
                }
            },
        }
    }

    /// Bill a turn from its usage (`usage`; None: the turn ended unreported, billed its hold,
    /// estimated). A turn that was never held — one the server ran although its hold was
    /// refused and it was cancelled — is billed its reported usage all the same. Whether the
    /// key's balance is spent.
    async fn settle(&mut self, turn: Option<Turn>, usage: Option<TurnUsage>) -> bool {
        let started = turn.as_ref().map_or_else(Instant::now, |t| t.started);
        let (usage_record, cost, estimated) = match usage {
            Some(u) => {
                self.last_input = u.input();
                (
                    crate::billing::realtime::record_usage(&u),
                    crate::billing::realtime::turn_cost(&self.routing.prices, &self.model, &u),
                    false,
                )
            }
            None => match &turn {
                Some(t) => (crate::base::usage::Usage::default(), t.hold.list(), true),
                None => return false,
            },
        };
        // The guardrails' checks since the last turn are billed with this one.
        let cost = cost.saturating_add(std::mem::take(&mut self.guard_unbilled));
        let rate = turn.as_ref().map_or_else(|| self.gw.charge.rate(&self.key), |t| t.hold.rate());
        let charged = rate.apply(cost);
        self.totals.turns += 1;
        self.totals.input_tokens += usage_record.input_total();
        self.totals.output_tokens += usage_record.output;
        self.totals.cost_nanos += charged;
        self.totals.estimated |= estimated;
        self.gw.charge.spend_tokens(&self.key, usage_record.input_total().saturating_add(usage_record.output)).await;
        if let (Some(trace), Some(attrs)) = (self.trace.as_deref_mut(), self.span_attrs.as_ref()) {
            trace.turn(attrs, &self.model, started, (usage_record.input_total(), usage_record.output), estimated);
        }
        let series = self.gw.metrics.model(&self.model);
        series.input_tokens.add(usage_record.input_total());
        series.output_tokens.add(usage_record.output);
        series.cost_nanos.add(charged.max(0) as u64);
        let payer = Payer {
            key_id: &self.key.id,
            tags: &self.key.policy.tags,
            model: &self.model,
            protocol: Protocol::Openai.as_str(),
            route: Route::Realtime.label(),
            rate,
        };
        let used = Used {
            usage: usage_record,
            cost_nanos: cost,
            latency_ms: started.elapsed().as_millis() as u64,
            estimated,
            provider: self.totals.provider.clone(),
            ..Used::default()
        };
        let books = self.gw.charge.books();
        let booked = match turn {
            Some(turn) => books.settle(turn.hold, &payer, used).await,
            // Unheld: debited at once from every purse the key draws on (never refused: the
            // upstream already ran it).
            None => {
                let purses = self.gw.charge.purses(&self.key, &self.routing.calendar).unwrap_or_default();
                books.debit(&payer, used, &purses).await
            }
        };
        match booked {
            Ok(_) => self.exhausted().await,
            Err(e) => {
                log::error!("ledger: could not settle a realtime turn of key {}: {e}", self.key.name);
                false
            }
        }
    }

    /// Whether what the key draws on is spent: a purse it pays from (its balance, or for a
    /// member's key without an allowance its team's account; a window) is at or below zero.
    async fn exhausted(&self) -> bool {
        self.gw.charge.covers(&self.key, &self.routing.calendar, 1, "").await.is_err()
    }

    /// Turns left without their `response.done` (the session ended in them): each billed its
    /// hold. Turns asked for that never started are released.
    async fn end_turns_unreported(&mut self) {
        self.asked.clear();
        while let Some((_, turn)) = self.running.pop() {
            self.settle(Some(turn), None).await;
        }
    }

    /// Relay frames both ways until either side ends the session or a bound does; the reason.
    async fn run(&mut self, client: &mut Session, upstream: &mut UpstreamSession, limits: crate::config::listen::Realtime) -> &'static str {
        let mut from_client = Splitter::new(limits.max_frame_bytes);
        let mut from_upstream = Splitter::new(limits.max_frame_bytes);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(limits.max_secs);
        let idle = Duration::from_secs(limits.idle_secs);
        // What the session holds of frames and messages not yet whole counts against the
        // process's budget of buffered bytes, as a request body does.
        let mut held = self.gw.body.budget.reservation();
        loop {
            let fragments = match &self.fragments {
                Fragments::Text(payload) => payload.len(),
                _ => 0,
            };
            if !held.resize(from_client.held() + from_upstream.held() + fragments) {
                self.end_turns_unreported().await;
                let why = "the gateway holds too much unfinished data; try again later";
                let _ = client.write_response_body(Some(rt::close_frame(1013, why, false)), false).await;
                let _ = upstream.write_body(&rt::close_frame(1001, why, true)).await;
                return "over the buffered-bytes budget";
            }
            let stop = tokio::select! {
                read = client.read_request_body() => match read {
                    Ok(Some(chunk)) => {
                        from_client.push(&chunk);
                        self.client_frames(&mut from_client, client, upstream, limits.max_frame_bytes).await
                    }
                    _ => Some(Stop::Client),
                },
                read = upstream.read_body_bytes() => match read {
                    Ok(Some(chunk)) => {
                        from_upstream.push(&chunk);
                        self.upstream_frames(&mut from_upstream, client, upstream).await
                    }
                    _ => Some(Stop::Upstream),
                },
                () = tokio::time::sleep_until(deadline) => Some(Stop::Closed(1008, "session time limit")),
                () = tokio::time::sleep(idle) => Some(Stop::Closed(1001, "session idle")),
            };
            if stop.is_some() {
                // Turns the session ends in are settled before the client hears of the end.
                self.end_turns_unreported().await;
            }
            match stop {
                None => continue,
                Some(Stop::Client) => return "client closed",
                Some(Stop::Upstream) => {
                    let _ = client.write_response_body(Some(rt::close_frame(1011, "the upstream session ended", false)), false).await;
                    return "upstream closed";
                }
                Some(Stop::Closed(code, why)) => {
                    let _ = client.write_response_body(Some(rt::close_frame(code, why, false)), false).await;
                    let _ = upstream.write_body(&rt::close_frame(1000, why, true)).await;
                    return why;
                }
            }
        }
    }

    /// The client's whole frames. A text message in fragments is held until whole and read
    /// then (sent on as one frame); a turn asked for is held first (refused: not passed on),
    /// with the upstream told where its hold ends, as is a `session.update` for the turns the
    /// server starts; audio is not passed on while the key cannot pay for a turn; a close is
    /// passed on and ends the session.
    async fn client_frames(
        &mut self,
        frames: &mut Splitter,
        client: &mut Session,
        upstream: &mut UpstreamSession,
        max_message: u64,
    ) -> Option<Stop> {
        loop {
            let frame = match frames.next_frame() {
                Ok(Some(frame)) => frame,
                Ok(None) => return None,
                Err(e) => return Some(frame_error(&e)),
            };
            // A message in fragments: a text one is gathered, a binary one relayed as it comes.
            let whole: Option<Vec<u8>> = match (&mut self.fragments, frame.is_continuation()) {
                (Fragments::Text(payload), true) => {
                    payload.extend_from_slice(&frame.payload());
                    if payload.len() as u64 > max_message {
                        return Some(Stop::Closed(1009, "message too large"));
                    }
                    if !frame.fin {
                        continue;
                    }
                    let Fragments::Text(payload) = std::mem::replace(&mut self.fragments, Fragments::None) else { continue };
                    Some(payload)
                }
                (Fragments::Binary, true) => {
                    if frame.fin {
                        self.fragments = Fragments::None;
                    }
                    None
                }
                (Fragments::None, true) => return Some(Stop::Closed(1002, "a continuation frame without a message")),
                (Fragments::None, false) if frame.starts_text_fragments() => {
                    self.fragments = Fragments::Text(frame.payload().into_owned());
                    continue;
                }
                (Fragments::None, false) if frame.starts_binary_fragments() => {
                    self.fragments = Fragments::Binary;
                    None
                }
                (Fragments::None, false) => None,
                // A control frame between fragments is relayed as it comes; a new message before
                // the last one ended is a protocol error.
                (_, false) if matches!(frame.opcode, tungstenite::protocol::frame::coding::OpCode::Control(_)) => None,
                (_, false) => return Some(Stop::Closed(1002, "a new message before the last one ended")),
            };
            let mut whole = whole;
            let event = match &whole {
                Some(payload) => rt::client_message(payload),
                None => rt::client_event(&frame),
            };
            // The key's guardrails read each client event's text but audio: a blocked one is
            // not passed on (the client gets an `error` event, the session stays open); a
            // masked one is passed on masked.
            if self.guards.input() && !matches!(event, Event::AudioAppend) && (whole.is_some() || frame.is_text()) {
                let payload = whole.as_deref().map_or_else(|| frame.payload(), std::borrow::Cow::Borrowed);
                match self.guard(&payload).await {
                    Ok(Some(masked)) => whole = Some(masked),
                    Ok(None) => {}
                    Err(e) => {
                        if client.write_response_body(Some(rt::error_event(e.kind.reason(), &e.message)), false).await.is_err() {
                            return Some(Stop::Client);
                        }
                        continue;
                    }
                }
            }
            // The checks that read a call's text see every client event but audio (a refused one
            // is not passed on; the client gets an `error` event). None registered: nothing to
            // unmask or read (the model's rules ran when the session opened).
            if self.gw.checks.read(Looks::TEXT) && !matches!(event, Event::AudioAppend) && (whole.is_some() || frame.is_text()) {
                let payload = whole.as_deref().map_or_else(|| frame.payload(), std::borrow::Cow::Borrowed);
                let vetted = self.gw.checks.vet(&Subject::new(Kind::RealtimeTurn, &self.key.policy).text(Text::Json(&payload)));
                if let Err(e) = vetted {
                    if client.write_response_body(Some(rt::error_event(e.kind.reason(), &e.message)), false).await.is_err() {
                        return Some(Stop::Client);
                    }
                    continue;
                }
            }
            let mut rewritten: Option<Vec<u8>> = None;
            match event {
                Event::ResponseCreate => match self.hold_turn().await {
                    Ok(turn) => {
                        self.asked.push_back(turn);
                        let payload = whole.as_deref().map_or_else(|| frame.payload(), std::borrow::Cow::Borrowed);
                        rewritten = rt::cap_output(&payload, &event, self.turn_output());
                    }
                    Err((code, why)) => {
                        if client.write_response_body(Some(rt::error_event(code, &why)), false).await.is_err() {
                            return Some(Stop::Client);
                        }
                        continue;
                    }
                },
                Event::SessionUpdate => {
                    let payload = whole.as_deref().map_or_else(|| frame.payload(), std::borrow::Cow::Borrowed);
                    rewritten = rt::cap_output(&payload, &event, self.turn_output());
                }
                Event::AudioAppend if !self.audio_allowed().await => continue,
                _ => {}
            }
            let sent = match (rewritten, whole) {
                (Some(payload), _) | (None, Some(payload)) => upstream.write_body(&rt::client_text_frame(&payload)).await,
                (None, None) => upstream.write_body(&frame.bytes).await,
            };
            if sent.is_err() {
                return Some(Stop::Upstream);
            }
            if frame.is_close() {
                // The client's close is answered with its code (as the upstream would) before
                // the session ends.
                let _ = client.write_response_body(Some(rt::close_answer(&frame.payload())), false).await;
                return Some(Stop::Client);
            }
        }
    }

    /// A client event read by the key's guardrails: masked (the event again), as it came, or
    /// refused.
    async fn guard(&mut self, payload: &[u8]) -> Result<Option<Vec<u8>>, ApiError> {
        let call = guard_call(&self.model, &self.key);
        let mut screening = crate::checks::guard::Screening { masks: std::mem::take(&mut self.masks), ..Default::default() };
        let screened = crate::checks::guard::screen_body(&self.guards, &call, payload, &mut screening, &self.gw.metrics).await;
        self.guard_unbilled = self.guard_unbilled.saturating_add(screening.price_nanos);
        self.totals.guardrail.extend(screening.noted);
        let restoring = screening.masks.restore.len() != self.masks.restore.len();
        self.masks = screening.masks;
        if restoring {
            // Placeholders to put back: the answers read from now on restore them.
            match self.out_guard.as_mut() {
                Some(guard) => guard.restore_from(&self.masks),
                None => self.out_guard = self.output_guard(),
            }
        }
        screened.map_err(|r| r.error())
    }

    /// The output guard of the session's answers, when a guardrail reads them.
    fn output_guard(&self) -> Option<Box<crate::checks::guard::stream::OutputGuard>> {
        use crate::checks::guard::stream::{Dialect, OutputGuard};
        OutputGuard::new(&self.guards, &self.masks, Some(Dialect::Realtime), &self.model).map(Box::new)
    }

    /// A server frame to the client: through the output guard when one reads the answers (its
    /// events held over the look-behind window, all let go when a response is `done`); a
    /// blocked answer ends with an `error` event, is cancelled upstream and its remaining text
    /// events dropped, and the session goes on. Whether the client is still there.
    async fn pass_on(&mut self, frame: &Frame, done: bool, client: &mut Session, upstream: &mut UpstreamSession) -> bool {
        use crate::checks::guard::stream::OutputGuard;
        let Some(guard) = self.out_guard.as_mut().filter(|_| frame.is_text()) else {
            return client.write_response_body(Some(frame.bytes.clone()), false).await.is_ok();
        };
        let payload = frame.payload();
        if self.suppressing {
            let kind = serde_json::from_slice::<serde_json::Value>(&payload).ok().and_then(|v| v["type"].as_str().map(str::to_string));
            if kind.as_deref().is_some_and(|t| t.ends_with(".delta") || (t.ends_with(".done") && t != "response.done")) {
                return true;
            }
            self.suppressing = !done;
        }
        let mut event = Vec::with_capacity(payload.len() + 8);
        event.extend_from_slice(b"data: ");
        event.extend_from_slice(&payload);
        event.extend_from_slice(b"\n\n");
        let call = guard_call(&self.model, &self.key);
        let fed = guard.relay(&event, done, &call, &self.gw.metrics).await;
        let out = fed.out;
        if fed.blocked.is_some() {
            let _ = upstream.write_body(&rt::cancel_frame()).await;
            self.suppressing = !done;
        }
        if fed.blocked.is_some() || done {
            self.totals.guardrail.append(&mut guard.noted);
        }
        if fed.blocked.is_some() {
            // What it held of the blocked answer is dropped with it; the next answer is read anew.
            self.out_guard = self.output_guard();
        }
        for data in OutputGuard::events(&out) {
            let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else { continue };
            if client.write_response_body(Some(rt::text_frame(&v, false)), false).await.is_err() {
                return false;
            }
        }
        true
    }

    /// The upstream's whole frames, passed on: a turn the server started on its own is held
    /// (cancelled upstream when it cannot be), one the client asked for takes the oldest hold
    /// asked; each `response.done` settles its own turn (by the response's id).
    async fn upstream_frames(&mut self, frames: &mut Splitter, client: &mut Session, upstream: &mut UpstreamSession) -> Option<Stop> {
        loop {
            let frame: Frame = match frames.next_frame() {
                Ok(Some(frame)) => frame,
                Ok(None) => return None,
                Err(e) => return Some(frame_error(&e)),
            };
            let mut spent = false;
            let mut done = false;
            match rt::server_event(&frame) {
                Event::ResponseCreated(id) => match self.asked.pop_front() {
                    Some(turn) => self.running.push((id, turn)),
                    None => match self.hold_turn().await {
                        Ok(turn) => self.running.push((id, turn)),
                        Err((code, why)) => {
                            let _ = upstream.write_body(&rt::cancel_frame()).await;
                            let _ = client.write_response_body(Some(rt::error_event(code, &why)), false).await;
                        }
                    },
                },
                // The session began: its turns — those the server starts on its own too — are
                // bounded at the output a turn is held for.
                Event::SessionCreated(session) => {
                    if let Some(cap) = rt::session_cap(&session, self.turn_output()) {
                        if upstream.write_body(&cap).await.is_err() {
                            return Some(Stop::Upstream);
                        }
                        self.own_updates += 1;
                    }
                }
                // One `session.updated` answers tollgate's own update: held back (the client's
                // next one, or this one if the client's came first, says the whole session).
                Event::SessionUpdated if self.own_updates > 0 => {
                    self.own_updates -= 1;
                    continue;
                }
                Event::ResponseDone(usage, id) => {
                    // A response without an id is the oldest under way's.
                    let at = match id {
                        Some(_) => self.running.iter().position(|(held, _)| *held == id),
                        None => (!self.running.is_empty()).then_some(0),
                    };
                    let turn = at.map(|i| self.running.remove(i).1);
                    spent = self.settle(turn, Some(usage)).await;
                    done = true;
                }
                _ => {}
            }
            if !self.pass_on(&frame, done, client, upstream).await {
                return Some(Stop::Client);
            }
            if frame.is_close() {
                return Some(Stop::Upstream);
            }
            if spent {
                return Some(Stop::Closed(1008, "the key's balance is spent"));
            }
        }
    }
}

fn frame_error(e: &FrameError) -> Stop {
    match e {
        FrameError::TooLarge(_) => Stop::Closed(1009, "frame too large"),
        FrameError::Malformed(_) => Stop::Closed(1008, "malformed frame"),
    }
}
