//! The `ProxyHttp` implementation. Hooks stay thin: each delegates to `route`, `auth`,
//! `protocol` or `relay` and acts on the outcome.
//!
//! A relayed request makes one pass (DESIGN.md, constraint 1), all of it in `request_filter`:
//!
//! ```text
//! request_filter ── route ── authenticate ──┬─ local endpoint: answer, done
//!                                           └─ relay plan: read the body (body::read: size, time, budget),
//!                                              model → providers, hold, usage injection
//!   relay:  connect (pooled; next provider on a connect failure)
//!           → request header (allowlisted headers, provider credential) + body
//!           → response header → client
//!           → body chunks → usage scanner → client
//!           → last chunk: settle (hold released, cost debited, record queued) → client
//! logging ── metrics, access log
//! ```
//!
//! Pingora replays a body read in `request_filter` only from its 64 KiB retry buffer, so the
//! upstream exchange is driven here with pingora-core's connector rather than by Pingora's
//! proxy phases (`upstream_peer` and the filters after it are never reached). Nothing is
//! buffered beyond the request body: response chunks go to the client as they arrive.

use crate::auth::{self, KeyIndex};
use crate::base::clock::now_ms;
use crate::billing;
use crate::ledger::{Hold, Ledger};
use crate::records::usage::UsageRecord;

use crate::config::{Platform, Protocol};
use crate::health::Verdict;
use crate::limits::Limits;
use crate::meter::{Shape, UsageScanner};
use crate::protocol::{anthropic, gemini, header_str, openai, ApiError, ErrorKind};
use crate::records::key::KeyRecord;
use crate::relay::{self, Routing};
use crate::response::LocalResponse;
use crate::route::{self, Route};
use crate::video::{self, VideoService};
use arc_swap::ArcSwap;
use async_trait::async_trait;
use bytes::Bytes;
use pingora_core::connectors::http::v1::Connector;
use pingora_core::protocols::http::client::HttpSession;
use pingora_core::upstreams::peer::{HttpPeer, Peer};
use pingora_error::{Error, ErrorSource, ErrorType, Result};
use pingora_http::{RequestHeader, ResponseHeader};
use pingora_proxy::{FailToProxy, ProxyHttp, Session};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod keyless;
mod translated;

pub use keyless::{per_minute as keyless_per_minute, KeylessRefusals};

/// Shared state of the gateway.
pub struct Gateway {
    pub routing: Arc<ArcSwap<Routing>>,
    pub keys: Arc<KeyIndex>,
    /// Size, time and memory bounds for reading request bodies.
    pub body: crate::body::BodyLimits,
    /// None when no `video` section is configured.
    pub video: Option<Arc<VideoService>>,
    pub ledger: Arc<Ledger>,
    /// Which key created each stored response (responses API).
    pub owners: crate::responses::Owners,
    pub limits: Arc<Limits>,
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Upstream connections, pooled per provider. HTTP/1.1 only: no provider's peer offers h2
    /// (ALPN), and the HTTP/1.1 connector lets a pooled connection be taken without the state
    /// of a new connection's connect (see `exchange`).
    pub connector: Connector,
    /// `/v1/usage` and `/me/data` reads run one at a time per key (see `usage`).
    pub usage_queries: crate::limits::UsageTurns,
    /// How long a response whose client left is still read for its usage (`billing.drain_secs`).
    pub drain: Duration,
    /// Set once an upgrade began (the listeners go to the new process): every answer from then
    /// on closes its connection (`Connection: close`), so keep-alive clients move to the new
    /// process after their next request instead of holding a connection that Pingora drops,
    /// idle or not, when it stops accepting.
    pub closing: Arc<std::sync::atomic::AtomicBool>,
    /// The request log (see `request_log`); None with `console.request_log: false`.
    pub requests: Option<Arc<dyn crate::store::RequestLogStore>>,
    /// OpenTelemetry traces (see `telemetry`); None when off.
    pub tracer: Option<Arc<crate::telemetry::Tracer>>,
    /// Refusals without a known key, aggregated per address and minute (see `keyless`).
    pub keyless: KeylessRefusals,
}

/// Everything needed to send a request upstream, decided before anything is sent.
pub struct RelayPlan {
    /// The routing snapshot the candidates index into.
    pub routing: Arc<Routing>,
    pub route: Route,
    pub protocol: Protocol,
    pub model: String,
    pub candidates: Vec<usize>,
    pub body: Bytes,
    /// Length of the body the client sent (before any rewrite).
    pub client_body_len: usize,
    /// The input tokens held, billed when the upstream reports none.
    pub input_estimate: u64,
    /// The client's `anthropic-version` / `compat-version`.
    pub client_version: Option<String>,
    pub key: Arc<KeyRecord>,
    /// The money reserved for this request; taken once, at settlement.
    pub hold: Option<Hold>,
    /// tollgate asked for stream usage; the usage chunk is not the client's to see.
    pub withhold_usage: bool,
    pub started: Instant,
    /// What settlement billed (tokens, cost, estimated), for the access log.
    pub billed: Option<(crate::base::usage::Usage, i64, bool)>,
    /// The provider (catalog index) that answered, once one did.
    pub served_by: Option<usize>,
    /// Requests sent upstream (retries included).
    pub attempts: u32,
    /// A streamed response's owner, known while the request lives (responses API).
    pub streaming_owner: Option<crate::responses::StreamingOwner>,
    /// Counts the request against the key's `max_concurrent` while the plan lives (held, not read).
    pub concurrency_slot: Option<crate::limits::Slot>,
    /// The tokens it is held for, reserved under the key's `tpm` until it settles.
    pub tokens_reserved: Option<crate::limits::TokenReservation>,
    /// The body's share of the buffered-body budget; given back once the body is sent.
    pub body_reservation: Option<crate::body::Reservation>,
    /// The provider speaks another protocol than the client (see `translate`).
    pub translation: Option<crate::translate::Translation>,
    /// When the answer's first body byte went to the client, after the start.
    pub first_byte: Option<Duration>,
    /// The upstream's own request id (its `x-request-id` or `request-id`), for the request log.
    pub upstream_request_id: Option<String>,
    /// The request's trace while it is relayed (moved here from the request's state).
    pub trace: Option<Box<crate::telemetry::Trace>>,
}

impl RelayPlan {
    /// With traces on: an upstream attempt's client span opens, with the `traceparent` it sends.
    fn begin_attempt(&mut self, upstream: &relay::Upstream) {
        let Some(trace) = self.trace.as_mut() else { return };
        trace.begin_attempt(&upstream.span_attrs, crate::metrics::gen_ai_operation(self.route.label()), &self.model);
    }

    /// The request is traced and recorded: its answer's model and finish reasons are read.
    pub(crate) fn sampled(&self) -> bool {
        self.trace.as_ref().is_some_and(|t| t.sampled)
    }
}

/// Per-request state.
#[derive(Default)]
pub struct RequestCtx {
    /// Error shape for this request.
    pub shape: Option<Protocol>,
    /// Route label for metrics and the access log.
    pub route: &'static str,
    /// For the access log and the request log: who called (once the key check passed), when,
    /// and the relay it made.
    pub key: Option<Arc<KeyRecord>>,
    pub started: Option<Instant>,
    pub relayed: Option<Box<RelayPlan>>,
    /// Counts this request as in flight until dropped.
    pub in_flight: Option<crate::metrics::Live>,
    /// A relayed response's header went to the client: a later failure can only end the
    /// connection (no error response can follow).
    pub response_started: bool,
    /// For the access log of a request that was not relayed: the model it asked for.
    pub model_asked: Option<String>,
    /// For the access log of a refused request: why (`ErrorKind::reason`).
    pub reason: Option<&'static str>,
    /// And the request field it was about, when the refusal names one.
    pub reason_param: Option<String>,
    /// For the access log of a video submission: what it charged (nano-USD) for how many seconds.
    pub video_charge: Option<(i64, u32)>,
    /// The request reached the key check: it goes into the request log.
    pub key_checked: bool,
    /// Its trace, with traces on (in the relay plan while it is relayed).
    pub trace: Option<Box<crate::telemetry::Trace>>,
}

/// What the request does next.
enum Outcome {
    Respond(LocalResponse),
    Relay(Box<RelayPlan>),
    /// The response has been written already (a streamed video).
    Done,
}

// Header names looked up on every request, made once: a name given as `&str` is parsed and
// checked again at each lookup.
static ANTHROPIC_VERSION: http::HeaderName = http::HeaderName::from_static("anthropic-version");
static COMPAT_VERSION: http::HeaderName = http::HeaderName::from_static("compat-version");
static UPSTREAM_REQUEST_IDS: [http::HeaderName; 2] =
    [http::HeaderName::from_static("x-request-id"), http::HeaderName::from_static("request-id")];

/// The client's messages-protocol version header, under either name.
fn client_version(req: &RequestHeader) -> Option<String> {
    header_str(req, &ANTHROPIC_VERSION).or_else(|| header_str(req, &COMPAT_VERSION)).map(str::to_string)
}

/// The error shape a request gets, from its route (and the version header for `/v1/models`).
fn shape_of(route: &Route, req: &RequestHeader) -> Protocol {
    match route {
        Route::NotFound { shape } => *shape,
        Route::Models if client_version(req).is_some() => Protocol::Anthropic,
        Route::Models | Route::Usage | Route::Root | Route::KeyPage { .. } | Route::KeyPageData => Protocol::Openai,
        Route::GeminiModels | Route::GeminiModel { .. } => Protocol::Gemini,
        other => other.relay_protocol().unwrap_or(Protocol::Openai),
    }
}

/// 404 for a path nobody serves (or one switched off, like `/me`).
fn unknown_endpoint(req: &RequestHeader) -> ApiError {
    ApiError::new(ErrorKind::NotFound, format!("Unknown endpoint: {} {}", req.method, req.uri.path()))
}

/// Map a proxy failure to the client-facing error (never naming the upstream).
pub fn upstream_failure(e: &Error) -> ApiError {
    match e.etype() {
        ErrorType::InvalidCert | ErrorType::TLSHandshakeFailure | ErrorType::HandshakeError => {
            ApiError::new(ErrorKind::BadGateway, "The upstream service's TLS certificate could not be verified; the request was not sent.")
        }
        ErrorType::ConnectTimedout | ErrorType::ReadTimedout | ErrorType::WriteTimedout => {
            ApiError::new(ErrorKind::GatewayTimeout, "The upstream service did not answer in time.")
        }
        _ => ApiError::new(ErrorKind::BadGateway, "The upstream service is unreachable. Retry later."),
    }
}

impl Gateway {
    /// Route, authenticate and either answer locally or plan a relay.
    async fn decide(&self, session: &mut Session, ctx: &mut RequestCtx) -> std::result::Result<Outcome, ApiError> {
        let req = session.req_header();
        let route = route::classify(req.method.as_str(), req.uri.path());
        ctx.shape = Some(shape_of(&route, req));
        ctx.route = route.label();

        if let Some(param) = auth::query_carries_key(req.uri.query()) {
            return Err(ApiError::new(
                ErrorKind::BadRequest,
                format!("API keys are not accepted in query parameters ('{param}'). Send the key in a header."),
            )
            .with_param(&param));
        }
        if let Route::NotFound { .. } = route {
            return Err(unknown_endpoint(req));
        }
        if route == Route::Root {
            // A reachability probe (agent CLIs send one to their base URL): no key needed,
            // nothing about the configuration shown.
            return Ok(Outcome::Respond(LocalResponse::json(200, &serde_json::json!({"object": "tollgate", "status": "ok"}))));
        }
        if let Route::KeyPage { file } = route {
            if !self.routing.load().key_page {
                return Err(unknown_endpoint(req));
            }
            return Ok(Outcome::Respond(crate::console::me::page(file)));
        }
        ctx.key_checked = true;
        let key = self.keys.authenticate(auth::extract_key(&req.headers))?;
        ctx.key = Some(key.clone());
        let version = client_version(req);
        let routing = self.routing.load_full();
        let catalog = &routing.catalog;
        if key.policy.ip_allow.is_some() {
            let peer = session.client_addr().and_then(|a| a.as_inet()).map(|a| a.ip());
            let Some(peer) = peer else {
                return Err(ApiError::new(ErrorKind::IpNotAllowed, "This API key may only be used from listed addresses."));
            };
            use crate::policy::forwarded::{client_address, ClientAddr};
            match client_address(peer, &req.headers, &routing.trusted_proxies) {
                Ok(ClientAddr::Known(client)) => key.policy.check_address(client)?,
                Ok(ClientAddr::Unknown) => {
                    return Err(ApiError::new(ErrorKind::IpNotAllowed, "This API key may only be used from listed addresses."))
                }
                Err(crate::policy::forwarded::Malformed(why)) => {
                    return Err(ApiError::new(ErrorKind::BadRequest, format!("The forwarding headers cannot be read: {why}.")))
                }
            }
        }
        // The model lists show exactly what the key may call.
        let listed = |mut models: Vec<crate::protocol::ModelEntry>| {
            models.retain(|m| key.policy.allows_model(&m.id));
            models
        };

        let protocol = match &route {
            Route::Models => {
                let (only, shape) =
                    if version.is_some() { (Some(Protocol::Anthropic), Protocol::Anthropic) } else { (None, Protocol::Openai) };
                let models = listed(catalog.models_for(&key.group, only));
                let body = match shape {
                    Protocol::Anthropic => anthropic::model_list(&models),
                    _ => openai::model_list(&models),
                };
                return Ok(Outcome::Respond(LocalResponse::json(200, &body)));
            }
            Route::GeminiModels => {
                let models = listed(catalog.models_for(&key.group, Some(Protocol::Gemini)));
                return Ok(Outcome::Respond(LocalResponse::json(200, &gemini::model_list(&models))));
            }
            Route::GeminiModel { model } => {
                let models = listed(catalog.models_for(&key.group, Some(Protocol::Gemini)));
                let wanted = model.strip_prefix("models/").unwrap_or(model);
                crate::protocol::check_model_name(wanted)?;
                return match models.iter().find(|m| m.id == wanted) {
                    Some(m) => Ok(Outcome::Respond(LocalResponse::json(200, &gemini::model(m)))),
                    None => Err(ApiError::new(ErrorKind::ModelNotFound, format!("models/{wanted} is not found."))),
                };
            }
            Route::KeyPageData if !routing.key_page => {
                return Err(unknown_endpoint(req));
            }
            Route::KeyPageData => {
                self.limits.admit(&key).await?;
                let _slot = self.limits.enter(&key).await?;
                let _turn = self.usage_queries.take(&key.id).await?;
                let data =
                    crate::console::me::data(&self.ledger, self.requests.as_deref(), &key, &routing.calendar).await.map_err(|e| {
                        log::error!("key page: {e}");
                        ApiError::new(ErrorKind::Internal, "Internal error while reading usage.")
                    })?;
                return Ok(Outcome::Respond(LocalResponse::json(200, &data)));
            }
            Route::Usage => {
                // Rate-limited like any call.
                self.limits.admit(&key).await?;
                let _slot = self.limits.enter(&key).await?;
                return self.usage(req.uri.query(), &key).await.map(Outcome::Respond);
            }
            Route::VideoCreate { .. } | Route::VideoGet { .. } | Route::VideoContent { .. }
                if !catalog.group_allows(&key.group, Platform::Video) =>
            {
                return Err(ApiError::new(
                    ErrorKind::NotFound,
                    format!("This endpoint is not available to keys of group '{}'.", key.group),
                ));
            }
            // Every video call is rate-limited like any other: reads too (a download is the
            // operator's egress), and a download holds its `max_concurrent` slot while it streams.
            Route::VideoCreate { .. } | Route::VideoGet { .. } | Route::VideoContent { .. } => {
                self.limits.admit(&key).await?;
                let _slot = self.limits.enter(&key).await?;
                // Boxed: its future (uploads, downloads, the video service's calls) is larger
                // than the rest of `decide`'s, which every relayed request carries.
                return Box::pin(self.video_route(session, ctx, &route, &key)).await;
            }
            other => other.relay_protocol().ok_or_else(|| ApiError::new(ErrorKind::Internal, "unroutable request"))?,
        };

        // Rate limits first: every request of a known key counts against its `rpm`, the ones
        // refused below (a group's endpoint, an unknown or over-long model, a bad body, a
        // policy) included.
        self.limits.admit(&key).await?;
        if !catalog.group_allows(&key.group, protocol) {
            return Err(ApiError::new(ErrorKind::NotFound, format!("This endpoint is not available to keys of group '{}'.", key.group)));
        }
        let client_body = crate::body::read(session, &self.body).await?;
        let mut draft = match &route {
            Route::StoredResponse { id, .. } => {
                let owner = self.owners.owned_by(id, &key.id).await.map_err(crate::responses::unavailable)?;
                let draft = owner
                    .and_then(|owner| relay::stored_draft(&routing, &owner, client_body.bytes))
                    .ok_or_else(|| crate::responses::not_found(id))?;
                // A stored response is read under the model rules of the model that made it.
                key.policy.check_model(&draft.model).inspect_err(|_| ctx.model_asked = Some(draft.model.clone()))?;
                draft
            }
            _ => {
                let body = client_body.bytes.clone();
                let mut draft = relay::draft(&routing, &route, protocol, &key.group, &key.policy, client_body.bytes).inspect_err(|_| {
                    // Refused: the access log names the model asked for, if the body or the
                    // path (generate-content) names one.
                    ctx.model_asked = match &route {
                        Route::GenerateContent { model, .. } | Route::GeminiCountTokens { model } | Route::GeminiEmbed { model, .. } => {
                            crate::protocol::check_model_name(model).ok().map(|()| model.clone())
                        }
                        _ => crate::protocol::body_fields(&body).ok().and_then(|f| f.model),
                    };
                })?;
                if let Some(previous) = &draft.previous_response_id {
                    let owner = self.owners.owned_by(previous, &key.id).await.map_err(crate::responses::unavailable)?;
                    let owner = owner.ok_or_else(|| crate::responses::previous_not_found(previous))?;
                    // The conversation is stored with that provider: it serves the turn.
                    relay::prefer_provider(catalog, &mut draft.candidates, &owner.provider);
                    // And it is counted again as this turn's input.
                    draft.continues(&routing, &route, owner.context_tokens)?;
                }
                draft
            }
        };
        // The order of checks (README "Keys and policy"): rate limits (above), the model's
        // rules (after the model resolved to one a provider serves; an unknown one stayed a 404)
        // then the output limits (both in the draft), then requests in flight, then the
        // request's cost cap, then the balance.
        let slot = self.limits.enter(&key).await?;
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
                self.limits.reserve_tokens(&key, input.saturating_add(draft.output_allowance))?
            }
            _ => None,
        };
        if let Some(t) = &mut draft.translation {
            t.gemini_sse = session.req_header().uri.query().is_some_and(|q| q.split('&').any(|kv| kv == "alt=sse"));
            if t.count && t.upstream == Protocol::Openai {
                // Chat completions has no token count: tollgate's estimate, answered here.
                return Ok(Outcome::Respond(LocalResponse::json(200, &crate::translate::count_estimate(t, draft.client_body_len))));
            }
        }
        // Then the spend windows (the key's, its account's), then the balances.
        let hold = self.hold_for(&routing, &key, &route, &mut draft).await.inspect_err(|_| ctx.model_asked = Some(draft.model.clone()))?;
        let billed = route.billed();
        Ok(Outcome::Relay(Box::new(RelayPlan {
            routing: routing.clone(),
            route,
            protocol,
            model: draft.model,
            candidates: draft.candidates,
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
            billed: None,
            served_by: None,
            attempts: 0,
            streaming_owner: None,
            concurrency_slot: slot,
            tokens_reserved,
            body_reservation: Some(client_body.reservation),
            translation: draft.translation,
            first_byte: None,
            upstream_request_id: None,
            trace: ctx.trace.take(),
        })))
    }

    /// What a request of `key` is paid from, in the order of checks: its spend windows, its
    /// account's, its balance, its account's balance. A key whose account this node does not
    /// know (yet) is refused for now.
    fn purses(&self, routing: &Routing, key: &KeyRecord) -> std::result::Result<Vec<crate::records::purse::Purse>, ApiError> {
        if key.policy.account.is_none() && key.policy.budgets.is_empty() {
            return Ok(vec![crate::records::purse::Purse::key(&key.id)]);
        }
        let account = match &key.policy.account {
            Some(name) => Some(self.keys.account(name).ok_or_else(|| crate::store::fleet::unavailable("the key's account"))?),
            None => None,
        };
        Ok(crate::records::purse::purses(key, account.as_deref(), &routing.calendar, crate::base::clock::now_unix()))
    }

    /// Hold the most `draft` can cost in every purse of `key`. A request that named no output
    /// maximum and does not fit is lowered to what the purse that refused it covers (down to
    /// `billing.min_output_tokens`) and tried again; a refusal says how many output tokens the
    /// money covers and which field to set.
    async fn hold_for(
        &self,
        routing: &Routing,
        key: &KeyRecord,
        route: &Route,
        draft: &mut relay::Draft,
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
                    if route.billed() && !route.embeds() {
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

    /// `GET /v1/usage[?start=&end=]` for the calling key.
    async fn usage(&self, query: Option<&str>, key: &KeyRecord) -> std::result::Result<LocalResponse, ApiError> {
        let (start, end) = crate::ledger::usage_window(query)?;
        let internal = |e: crate::store::StoreError| match e {
            crate::store::StoreError::Shared(e) => {
                log::warn!("usage query: {e}");
                crate::store::fleet::unavailable("the key's usage")
            }
            e => {
                log::error!("usage query: {e}");
                ApiError::new(ErrorKind::Internal, "Internal error while reading usage.")
            }
        };
        let by = crate::ledger::usage_grouping(query)?;
        // Reading a long history is CPU work: on a blocking thread, one query at a time per key
        // (one key's reads never delay another's), never on the threads that relay requests.
        let _turn = self.usage_queries.take(&key.id).await?;
        let calendar = self.routing.load().calendar.clone();
        let report = self.ledger.key_usage(key, start, end, &by, &calendar).await.map_err(internal)?;
        Ok(LocalResponse::json(200, &report))
    }

    /// Bill a finished relay: release the hold, charge what was used. Runs before the last
    /// byte goes to the client (with `sync_commit`, after the record is on disk).
    async fn settle(&self, plan: &mut RelayPlan, scanner: Option<&mut UsageScanner>, status: u16) {
        let Some(hold) = plan.hold.take() else { return };
        let scan = scanner.map(|s| {
            let found = (s.finish(), s.response_id().map(str::to_string));
            if let Some(trace) = plan.trace.as_mut() {
                trace.answer = s.take_answer();
            }
            found
        });
        // A response the upstream stored (a successful create) becomes the key's.
        let (scan, response_id) = match scan {
            Some((scan, id)) => (Some(scan), id.filter(|_| plan.route == Route::Responses && (200..300).contains(&status))),
            None => (None, None),
        };
        let (usage, estimated) = billing::billed_usage(scan, status, plan.input_estimate, plan.route.embeds());
        let cost = plan.routing.prices.cost(&plan.model, usage);
        plan.billed = Some((usage, cost, estimated));
        let input_total = usage.input_total();
        self.limits.spend_tokens(&plan.key, input_total.saturating_add(usage.output)).await;
        plan.tokens_reserved = None;
        let series = self.metrics.model(&plan.model);
        if estimated {
            series.estimated_bills.add(1);
        }
        series.input_tokens.add(input_total);
        series.output_tokens.add(usage.output);
        series.cost_nanos.add(cost.max(0) as u64);
        let record = UsageRecord {
            time_ms: now_ms(),
            key_id: plan.key.id.clone(),
            model: plan.model.clone(),
            protocol: plan.protocol.as_str().to_string(),
            route: plan.route.label().to_string(),
            input_tokens: usage.input,
            cached_tokens: usage.cached,
            cache_write_tokens: usage.cache_write,
            output_tokens: usage.output,
            cost_nanos: cost,
            status,
            latency_ms: plan.started.elapsed().as_millis() as u64,
            estimated,
            seq: 0,
            balance_after: 0,
            provider: plan.served_by.map(|i| plan.routing.catalog.upstreams[i].config.name.clone()),
            attempts: plan.attempts,
            response_id,
            upstream_protocol: plan.translation.as_ref().map(|t| t.upstream.as_str().to_string()),
            charged: Vec::new(),
            tags: plan.key.policy.tags.clone(),
        };
        if let Err(e) = self.ledger.settle(hold, record).await {
            log::error!("ledger: could not settle a request of key {}: {e}", plan.key.name);
        }
    }

    /// The video task endpoints.
    async fn video_route(
        &self,
        session: &mut Session,
        ctx: &mut RequestCtx,
        route: &Route,
        key: &KeyRecord,
    ) -> std::result::Result<Outcome, ApiError> {
        let Some(svc) = self.video.as_ref() else {
            return Err(ApiError::new(ErrorKind::NotFound, "Video generation is not configured on this gateway."));
        };
        match route {
            Route::VideoCreate { legacy } => {
                let body = crate::body::read(session, &self.body).await?;
                let idem = header_str(session.req_header(), "idempotency-key").map(str::to_string);
                if idem.as_ref().is_some_and(|k| k.is_empty() || k.len() > 255) {
                    return Err(ApiError::new(ErrorKind::BadRequest, "Idempotency-Key: 1 to 255 characters").with_param("Idempotency-Key"));
                }
                let purses = self.purses(&self.routing.load(), key)?;
                let (task, created) = svc.create(key, &purses, &body.bytes, idem.as_deref()).await.inspect_err(|_| {
                    // The bounded field reader, never a whole JSON tree: a refused body may be a bomb.
                    ctx.model_asked = crate::protocol::body_fields(&body.bytes).ok().and_then(|f| f.model);
                })?;
                ctx.model_asked = Some(task.api_model.clone());
                // A new task's charge (an Idempotency-Key's earlier task charged nothing now).
                if created && task.charged {
                    ctx.video_charge = Some((task.cost_nanos, task.duration));
                }
                let task = svc.present(task).await;
                Ok(Outcome::Respond(LocalResponse::json(200, &task.to_json(true, *legacy))))
            }
            Route::VideoGet { id, legacy } => {
                let task = svc.present(svc.get(key, id).await?).await;
                Ok(Outcome::Respond(LocalResponse::json(200, &task.to_json(false, *legacy))))
            }
            Route::VideoContent { id } => {
                video::http::serve_content(svc, session, key, id).await?;
                Ok(Outcome::Done)
            }
            _ => Err(ApiError::new(ErrorKind::Internal, "not a video route")),
        }
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
        (mut http, peer): (HttpSession, HttpPeer),
        (status, retry_after): (u16, Option<u64>),
        usage: Shape,
    ) -> Result<()> {
        let mut scanner = UsageScanner::new(usage, false, false);
        let body = match read_whole(&mut http, &mut scanner, ERROR_BODY_MAX_BYTES).await {
            Ok(body) => body,
            Err(e) => {
                log::warn!("upstream error answer not read whole ({e}); its status's own message is passed on");
                http.shutdown().await;
                Vec::new()
            }
        };
        self.settle(plan, Some(&mut scanner), status).await;
        let mut err = self.upstream_refused(plan, status, &body);
        if status == 429 {
            err.retry_after = Some(retry_after.unwrap_or(1));
        }
        if http.response_done() {
            let idle = peer.idle_timeout();
            if let HttpSession::H1(h1) = http {
                self.connector.release_http_session(h1, &peer, idle).await;
            }
        }
        ctx.response_started = true;
        LocalResponse::error(&err, plan.protocol).send(session).await
    }

    /// An upstream's error answer as the client is told it (`protocol::upstream_error`); the
    /// upstream refusing tollgate's own credential is logged at ERROR, naming the provider.
    pub(super) fn upstream_refused(&self, plan: &RelayPlan, status: u16, body: &[u8]) -> ApiError {
        let provider = plan.served_by.map_or("?", |i| plan.routing.catalog.upstreams[i].config.name.as_str());
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

    /// Send the request upstream and read up to the final response header, with retries before
    /// the first byte: a connect failure (nothing sent) moves on to the next provider; a timeout
    /// or failure before the response header, or a status in `retry.on_status`, is retried —
    /// on another provider when there is one — while fewer than `retry.attempts` requests were
    /// sent, after a short jittered backoff, and within `retry.deadline_secs` when it is set
    /// (no attempt starts after it, and none waits for its header past it). Every outcome goes
    /// to the provider's health (and its key's). Sets `plan.served_by` and `plan.attempts`.
    async fn open_upstream(&self, client: &RequestHeader, plan: &mut RelayPlan) -> Result<(HttpSession, HttpPeer)> {
        let routing = plan.routing.clone();
        let (catalog, policy) = (&routing.catalog, &routing.retry);
        let deadline = policy.deadline.map(|d| Instant::now() + d);
        // A retry after `pause` still starts inside the deadline.
        let in_time = |pause: Duration| deadline.is_none_or(|d| Instant::now() + pause < d);
        // The pause before another attempt, when `attempts` sent so far leave room for one in
        // number and in time (drawn only then: nothing is computed for a request that succeeds).
        let retry_pause = |attempts: u32| (attempts < policy.attempts).then(|| backoff(attempts)).filter(|pause| in_time(*pause));
        let (mut tried, mut dead): (Vec<usize>, Vec<usize>) = (Vec::new(), Vec::new());
        let mut last: Option<Box<Error>> = None;
        let mut next = catalog.next_provider(&plan.candidates, &tried, &dead, Instant::now());
        while let Some((index, admission)) = next.take() {
            let upstream = &catalog.upstreams[index];
            if !(tried.is_empty() && dead.is_empty() && plan.candidates.first() == Some(&index)) {
                // Not the provider the plan counted (see `relay::draft`): count it here.
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
                    plan.attempts += 1;
                    admission.report(Verdict::Failed);
                    tried.push(index);
                    last = Some(e);
                    if let Some(pause) = retry_pause(plan.attempts) {
                        next = catalog.next_provider(&plan.candidates, &tried, &dead, Instant::now());
                        if next.is_some() {
                            log::warn!("provider {} failed before answering; retrying", upstream.config.name);
                            upstream.health.retries.add(1);
                            tokio::time::sleep(pause).await;
                        }
                    }
                }
                Ok(mut http) => {
                    plan.attempts += 1;
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
                    let pause = if policy.on_status.contains(&status) { retry_pause(plan.attempts) } else { None };
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
                    plan.served_by = Some(index);
                    return Ok((http, peer));
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
        upstream: &relay::Upstream,
        key: usize,
        peer: &HttpPeer,
        header_wait: Option<Duration>,
        plan: &RelayPlan,
    ) -> std::result::Result<HttpSession, Exchange> {
        let mut stale = 0;
        loop {
            // Built per attempt (moved into the send; a replaced connection gets a new one).
            let mut req = relay::upstream_request(
                client,
                upstream,
                key,
                match &plan.translation {
                    Some(t) => relay::Destination::Translated(t),
                    None => relay::Destination::Relayed(&plan.route),
                },
                plan.client_version.as_deref(),
                plan.body.len(),
                &plan.routing.forward_headers,
            )
            .map_err(Exchange::Unsent)?;
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
            match send_request(&mut http, req, &plan.body).await {
                Ok(()) => return Ok(http),
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

    /// A response stream named its response: the caller owns it from now on (before the
    /// request is settled, which books the owner; the plan holds the guard). Returns whether
    /// the id was seen.
    fn note_streamed_response(&self, plan: &mut RelayPlan, scanner: &UsageScanner) -> bool {
        let (Some(id), Some(index)) = (scanner.response_id(), plan.served_by) else { return false };
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

    /// End a relay whose response cannot go on: give up the upstream connection and bill what
    /// came from it.
    async fn abandon(&self, http: &mut HttpSession, plan: &mut RelayPlan, scanner: &mut UsageScanner, status: u16) {
        http.shutdown().await;
        self.settle(plan, Some(scanner), status).await;
    }

    /// The client left while its answer streamed. The upstream generates (and charges) the
    /// whole answer anyway, and reports its usage only at the end: keep reading it, unsent, for
    /// at most `billing.drain_secs` and [`DRAIN_MAX_BYTES`], and settle on what it reports.
    /// Only when it reports nothing in time is the bill estimated (every byte received, and
    /// the input the hold was made from).
    async fn drain(&self, http: &mut HttpSession, plan: &mut RelayPlan, scanner: &mut UsageScanner, status: u16) {
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
        self.abandon(http, plan, scanner, status).await;
    }

    /// Relay the planned request and stream its answer to the client, reading usage on the
    /// side. An `Err` after the response header went out ends the client's connection.
    async fn relay(&self, session: &mut Session, ctx: &mut RequestCtx, plan: &mut RelayPlan) -> Result<()> {
        let shape = plan.protocol;
        let (mut http, peer) = match self.open_upstream(session.req_header(), plan).await {
            Ok(opened) => opened,
            Err(e) => {
                log::warn!("relay failed: {e}");
                let err = upstream_failure(&e);
                self.settle(plan, None, err.status()).await;
                LocalResponse::error(&err, shape).send(session).await?;
                return Ok(());
            }
        };
        // The request is sent: its body is not needed while the answer streams (agent
        // requests are hundreds of KiB, their answers last minutes).
        plan.body = Bytes::new();
        plan.body_reservation = None;
        if let Some(t) = plan.translation.clone() {
            return Box::pin(self.relay_translated(session, ctx, plan, http, peer, t)).await;
        }
        let Some(upstream_header) = http.response_header() else {
            let err = ApiError::new(ErrorKind::BadGateway, "The upstream service sent no response.");
            self.settle(plan, None, err.status()).await;
            LocalResponse::error(&err, shape).send(session).await?;
            return Ok(());
        };
        let status = upstream_header.status.as_u16();
        if status >= 400 {
            let retry_after = retry_after(upstream_header).map(|d| d.as_secs().max(1));
            plan.upstream_request_id = upstream_request_id(upstream_header);
            let usage = plan.route.usage_shape().unwrap_or(Shape::Chat);
            return self.relay_error(session, ctx, plan, (http, peer), (status, retry_after), usage).await;
        }
        let mut header = Box::new(upstream_header.clone());
        plan.upstream_request_id = upstream_request_id(&header);
        let series = self.metrics.protocol(shape);
        series.upstream_seconds.observe(plan.started.elapsed());
        let sse = header.headers.get(http::header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        let _open_stream = sse.then(|| crate::metrics::Live::new(&self.metrics, crate::metrics::Gauge::OpenStreams));
        let withhold = plan.withhold_usage && status == 200;
        prepare_response_header(&mut header, withhold, shape, &plan.routing.forward_response_headers)?;
        let mut scanner = UsageScanner::new(plan.route.usage_shape().unwrap_or(Shape::Chat), sse, withhold);
        if plan.sampled() {
            scanner.read_answer();
        }

        ctx.response_started = true;
        if let Err(e) = session.write_response_header(header, false).await {
            self.drain(&mut http, plan, &mut scanner, status).await;
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
                    plan.first_byte = Some(after);
                    series.first_byte_seconds.observe(after);
                }
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
                // Settled before the client sees the end: its balance and `/v1/usage` already
                // count this request when its response is complete.
                self.settle(plan, Some(&mut scanner), status).await;
                if let Route::StoredResponse { id, op: crate::route::ResponseOp::Delete } = &plan.route {
                    if (200..300).contains(&status) {
                        self.owners.deleted(id).await;
                    }
                }
                return self.end_relay(session, http, &peer, out).await;
            }
            if let Some(data) = out.filter(|d| !d.is_empty()) {
                if let Err(e) = session.write_response_body(Some(data), false).await {
                    // The client left: the upstream's answer is still billed as it reports it.
                    self.drain(&mut http, plan, &mut scanner, status).await;
                    return Err(e.into_down());
                }
            }
        }
    }

    /// The next chunk of the upstream's answer and whether it is the last. An answer cut by the
    /// upstream is billed for what came and ends the client's connection (`Err`).
    async fn next_chunk(
        &self,
        http: &mut HttpSession,
        plan: &mut RelayPlan,
        scanner: &mut UsageScanner,
        status: u16,
    ) -> Result<(Option<Bytes>, bool)> {
        match http.read_response_body().await {
            Ok(chunk) => {
                let done = chunk.is_none() || http.response_done();
                Ok((chunk, done))
            }
            Err(e) => {
                log::warn!("upstream response ended early: {e}");
                self.abandon(http, plan, scanner, status).await;
                Err(e.into_up())
            }
        }
    }

    /// The client's last bytes (after settlement), then the upstream connection back to the pool.
    async fn end_relay(&self, session: &mut Session, http: HttpSession, peer: &HttpPeer, last: Option<Bytes>) -> Result<()> {
        let written = session.write_response_body(last, true).await.map_err(|e| e.into_down());
        let idle = peer.idle_timeout();
        if let HttpSession::H1(h1) = http {
            self.connector.release_http_session(h1, peer, idle).await;
        }
        written
    }
}

/// The most response bytes read, unsent, after the client left (see `Gateway::drain`).
const DRAIN_MAX_BYTES: usize = 64 << 20;

/// The most of an upstream's error answer read: its message is passed on cut to 1 KiB
/// (`protocol::upstream_error`), so a larger one only costs memory; past this the connection is
/// closed and the client gets the status's own message.
const ERROR_BODY_MAX_BYTES: usize = 64 << 10;

/// A whole upstream answer, metered as it comes, at most `max` bytes (over it: an error).
async fn read_whole(http: &mut HttpSession, scanner: &mut UsageScanner, max: usize) -> Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        match http.read_response_body().await? {
            Some(chunk) => {
                scanner.feed(&chunk);
                if body.len() + chunk.len() > max {
                    return Err(Error::explain(ErrorType::InvalidHTTPHeader, "upstream answer too large"));
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
fn retry_after(header: &ResponseHeader) -> Option<std::time::Duration> {
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

/// Send the request header and body; read up to the final response header.
async fn send_request(http: &mut HttpSession, req: RequestHeader, body: &Bytes) -> Result<()> {
    http.write_request_header(Box::new(req)).await?;
    if !body.is_empty() {
        http.write_request_body(body.clone(), true).await?;
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

/// The upstream's response header as the client gets it: only allowlisted headers (see
/// [`relay::response_header_allowed`]: no connection-level header, no account identifier, rate
/// limit or cookie of the operator's), and a body whose length changes (usage withheld) or was
/// never given is sent chunked.
fn prepare_response_header(header: &mut ResponseHeader, length_changes: bool, protocol: Protocol, forward: &[String]) -> Result<()> {
    let dropped: Vec<http::header::HeaderName> =
        header.headers.keys().filter(|name| !relay::response_header_allowed(name.as_str(), protocol, forward)).cloned().collect();
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

/// One structured line per client request (target `access`), as `name=value` pairs or, with
/// `log.format: json`, one JSON object with the same fields. Names the key, never its secret;
/// the path is logged without its query string. A refused request names the model it asked
/// for and `reason`; a video submission its model, seconds and charge.
/// The upstream's own request id, from its answer's header.
pub(crate) fn upstream_request_id(header: &ResponseHeader) -> Option<String> {
    UPSTREAM_REQUEST_IDS
        .iter()
        .find_map(|name| header.headers.get(name).and_then(|v| v.to_str().ok()))
        .filter(|v| v.len() <= 256)
        .map(str::to_string)
}

/// Write the request's entry in the request log (see `request_log`), borrowing every field
/// from the request's state.
fn write_log_entry(log: &dyn crate::store::RequestLogStore, session: &Session, ctx: &RequestCtx, status: u16, elapsed: Duration) {
    // Only a request the id module never saw (none today) needs an id made here.
    let made;
    let id = match crate::request_log::id_of(session) {
        Some(id) => id,
        None => {
            made = crate::request_log::new_id();
            made.as_str()
        }
    };
    let mut entry = crate::request_log::LogLine {
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
        ..Default::default()
    };
    if let Some(plan) = &ctx.relayed {
        entry.model = Some(&plan.model);
        entry.protocol = plan.protocol.as_str();
        entry.upstream_protocol = plan.translation.as_ref().map(|t| t.upstream.as_str());
        entry.provider = plan.served_by.map(|i| plan.routing.catalog.upstreams[i].config.name.as_str());
        entry.attempts = plan.attempts;
        entry.first_byte_ms = plan.first_byte.map(|d| d.as_millis() as u64);
        entry.upstream_request_id = plan.upstream_request_id.as_deref();
        if let Some((usage, cost, estimated)) = plan.billed {
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
    log.append(entry);
}

/// Hand the request's trace to the tracer with what the request came to (see
/// `telemetry::Trace::finish` for what each span says).
fn finish_trace(tracer: &crate::telemetry::Tracer, session: &Session, ctx: &mut RequestCtx, status: u16) {
    let Some(trace) = ctx.trace.take().or_else(|| ctx.relayed.as_mut().and_then(|p| p.trace.take())) else { return };
    if !trace.sampled {
        return;
    }
    let req = session.req_header();
    let mut facts = crate::telemetry::RequestFacts {
        method: crate::telemetry::method_name(&req.method),
        route: ctx.route,
        operation: crate::metrics::gen_ai_operation(ctx.route),
        model: ctx.model_asked.as_deref(),
        status,
        key_name: ctx.key.as_ref().map(|k| k.name.as_str()),
        tags: ctx.key.as_ref().map(|k| &k.policy.tags),
        refusal: ctx.reason,
        request_id: crate::request_log::id_of(session),
        ..Default::default()
    };
    if let Some(plan) = &ctx.relayed {
        facts.model = Some(&plan.model);
        facts.provider =
            plan.served_by.and_then(|i| plan.routing.catalog.upstreams.get(i)).map(|u| crate::metrics::gen_ai_provider(u.config.protocol));
        facts.first_byte = plan.first_byte;
        if let Some((usage, cost, estimated)) = plan.billed {
            facts.usage = Some(usage);
            facts.cost_nanos = Some(cost);
            facts.estimated = estimated;
        }
    }
    if let Some((charged, _)) = ctx.video_charge {
        facts.cost_nanos = Some(charged);
    }
    tracer.finish(*trace, &facts);
}

fn access_log(session: &Session, ctx: &RequestCtx, status: u16, elapsed: Duration) {
    if !log::log_enabled!(target: "access", log::Level::Info) {
        return;
    }
    let req = session.req_header();
    let latency_ms = elapsed.as_secs_f64() * 1000.0;
    let (model, usage, provider, attempts) = match &ctx.relayed {
        Some(plan) => {
            let provider = plan.served_by.map_or("-", |i| plan.routing.catalog.upstreams[i].config.name.as_str());
            (plan.model.as_str(), plan.billed, provider, plan.attempts)
        }
        None => (ctx.model_asked.as_deref().unwrap_or("-"), None, "-", 0),
    };
    let (input, output, mut cost, estimated) = usage.map_or((0, 0, 0, false), |(u, c, e)| (u.input_total(), u.output, c, e));
    if let Some((charged, _)) = ctx.video_charge {
        cost = charged;
    }
    let cost_usd = crate::base::money::usd(cost);
    let key = ctx.key.as_ref().map_or("-", |k| k.name.as_str());
    // A translated request names the provider's protocol.
    let translated = ctx.relayed.as_ref().and_then(|p| p.translation.as_ref()).map(|t| t.upstream.as_str());
    // The id the client got in `X-Request-Id` (the request log's too), and the upstream's own.
    let request_id = crate::request_log::id_of(session).unwrap_or("-");
    let upstream_id = ctx.relayed.as_ref().and_then(|p| p.upstream_request_id.as_deref());
    if crate::logging::json() {
        let mut line = serde_json::json!({
            "request_id": request_id,
            "method": req.method.as_str(), "path": req.uri.path(), "route": ctx.route, "status": status,
            "key": key, "model": model, "provider": provider, "attempts": attempts,
            "input_tokens": input, "output_tokens": output, "cost_usd": cost_usd, "estimated": estimated,
            "latency_ms": (latency_ms * 1000.0).round() / 1000.0,
        });
        if let Some(reason) = ctx.reason {
            line["reason"] = reason.into();
        }
        if let Some(param) = &ctx.reason_param {
            line["param"] = param.as_str().into();
        }
        if let Some((_, seconds)) = ctx.video_charge {
            line["video_seconds"] = seconds.into();
        }
        if let Some(upstream) = translated {
            line["translated_to"] = upstream.into();
        }
        if let Some(id) = upstream_id {
            line["upstream_request_id"] = id.into();
        }
        log::info!(target: "access", "{line}");
        return;
    }
    let mut extra = String::new();
    if let Some(reason) = ctx.reason {
        extra.push_str(" reason=");
        extra.push_str(reason);
    }
    if let Some(param) = &ctx.reason_param {
        extra.push_str(&format!(" param={param:?}"));
    }
    if let Some((_, seconds)) = ctx.video_charge {
        extra.push_str(&format!(" video_seconds={seconds}"));
    }
    if let Some(upstream) = translated {
        extra.push_str(" translated_to=");
        extra.push_str(upstream);
    }
    if let Some(id) = upstream_id {
        extra.push_str(&format!(" upstream_request_id={id:?}"));
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

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx { in_flight: Some(crate::metrics::Live::new(&self.metrics, crate::metrics::Gauge::InFlight)), ..RequestCtx::default() }
    }

    /// Every request is answered here: a local endpoint, a refusal, or a relay (see the
    /// module doc). Always returns `Ok(true)` (the response was sent) or an error after the
    /// relayed response started.
    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        ctx.started = Some(Instant::now());
        if let Some(tracer) = &self.tracer {
            let req = session.req_header();
            ctx.trace = Some(Box::new(tracer.begin(header_str(req, "traceparent"), header_str(req, "tracestate"))));
        }
        if self.closing.load(std::sync::atomic::Ordering::Relaxed) {
            session.set_keepalive(None);
        }
        match self.decide(session, ctx).await {
            Ok(Outcome::Respond(resp)) => resp.send(session).await?,
            Ok(Outcome::Relay(mut plan)) => {
                let relayed = self.relay(session, ctx, &mut plan).await;
                ctx.relayed = Some(plan);
                relayed?
            }
            Ok(Outcome::Done) => {}
            Err(err) => {
                ctx.reason = Some(err.kind.reason());
                ctx.reason_param = err.param.clone();
                self.metrics.counter("tollgate_refusals_total", &[("code", err.kind.reason())]).add(1);
                // The body may be unread: do not reuse the connection after an early refusal.
                session.set_keepalive(None);
                LocalResponse::error(&err, ctx.shape.unwrap_or(Protocol::Openai)).send(session).await?;
            }
        }
        Ok(true)
    }

    /// Pingora's default (response compression, off) and the request id of every answer.
    fn init_downstream_modules(&self, modules: &mut pingora_core::modules::http::HttpModules) {
        modules.add_module(pingora_core::modules::http::compression::ResponseCompressionBuilder::enable(0));
        modules.add_module(Box::new(crate::request_log::RequestIdBuilder));
    }

    /// Never reached: `request_filter` answers every request.
    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut RequestCtx) -> Result<Box<HttpPeer>> {
        Err(Error::explain(ErrorType::InternalError, "requests are relayed from request_filter"))
    }

    /// Counts the request and writes its access-log line.
    async fn logging(&self, session: &mut Session, _e: Option<&Error>, ctx: &mut RequestCtx) {
        let status = session.response_written().map_or(0, |r| r.status.as_u16());
        let model = ctx.relayed.as_ref().map_or("-", |p| p.model.as_str());
        let series = self.metrics.request(ctx.route, model, status);
        // The request's time, read from the clock once for every place that reports it.
        let elapsed = ctx.started.map_or(Duration::ZERO, |t| t.elapsed());
        // OpenTelemetry's GenAI metrics, for a relayed model call a provider answered.
        if let (Some(plan), Some(operation)) = (&ctx.relayed, crate::metrics::gen_ai_operation(ctx.route)) {
            if let Some(provider) = plan.served_by.and_then(|i| plan.routing.catalog.upstreams.get(i)) {
                let g = series.gen_ai(operation, crate::metrics::gen_ai_provider(provider.config.protocol));
                if let Some((usage, _, _)) = plan.billed {
                    g.input_tokens.observe(usage.input_total() as f64);
                    g.output_tokens.observe(usage.output as f64);
                }
                g.duration.observe(elapsed.as_secs_f64());
                if let Some(first) = plan.first_byte {
                    g.time_to_first_token.observe(first.as_secs_f64());
                }
            }
        }
        // A refusal without a known key is logged once per address and minute (see `keyless`).
        let logged = if ctx.key_checked && ctx.key.is_none() {
            let peer = session.client_addr().and_then(|a| a.as_inet()).map(|a| crate::policy::normalize(a.ip()));
            match self.keyless.check(peer, now_ms()) {
                keyless::Verdict::Log { earlier } => {
                    self.metrics.counter("tollgate_keyless_refusals_total", &[("outcome", "logged")]).add(1);
                    if earlier > 0 {
                        let from = peer.map_or_else(|| "-".to_string(), |ip| ip.to_string());
                        log::info!(target: "access", "{earlier} more refusals without a known key from {from} in its previous minute were not logged");
                    }
                    true
                }
                keyless::Verdict::Suppress => {
                    self.metrics.counter("tollgate_keyless_refusals_total", &[("outcome", "not_logged")]).add(1);
                    false
                }
            }
        } else {
            true
        };
        if logged {
            access_log(session, ctx, status, elapsed);
            if let Some(log) = self.requests.as_ref().filter(|_| ctx.key_checked) {
                write_log_entry(log.as_ref(), session, ctx, status, elapsed);
            }
        }
        if let Some(tracer) = &self.tracer {
            finish_trace(tracer, session, ctx, status);
        }
        crate::listener::request_done(session.as_downstream());
    }

    /// A relay that failed after its response header went out was logged where it failed:
    /// Pingora's own ERROR line would only repeat it.
    fn suppress_error_log(&self, _session: &Session, ctx: &RequestCtx, _error: &Error) -> bool {
        ctx.response_started
    }

    /// An error out of `request_filter`: before a response started, an internal-error answer
    /// in the request's shape; after, nothing more can be written and the connection ends.
    async fn fail_to_proxy(&self, session: &mut Session, e: &Error, ctx: &mut RequestCtx) -> FailToProxy {
        if ctx.response_started {
            return FailToProxy { error_code: 0, can_reuse_downstream: false };
        }
        let err = ApiError::new(ErrorKind::Internal, "Internal gateway error.");
        let code = match e.esource() {
            ErrorSource::Downstream => 0,
            _ => {
                if let Err(write_err) = LocalResponse::error(&err, ctx.shape.unwrap_or(Protocol::Openai)).send(session).await {
                    log::debug!("could not send error response: {write_err}");
                }
                err.status()
            }
        };
        FailToProxy { error_code: code, can_reuse_downstream: false }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
