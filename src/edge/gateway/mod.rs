//! The `ProxyHttp` implementation: the request path as a chain of stages, each a file with
//! one job, run in order; each hands the next what it decided, or ends the request itself —
//! answered ([`Exit::Answer`]) or refused ([`Exit::Refuse`], an error in the client's shape).
//!
//! ```text
//! request_filter
//!   1 admit    (admit.rs)    endpoint, key, the checks of  → probe, key page, unknown path answered
//!                            every request (its address)
//!   2 answer   (answer.rs)   local endpoints of a key      → model lists, /v1/usage, key page data
//!                            and the kinds answered here   → kinds/: video tasks, files, batches,
//!                            (each admitted as it declares)  realtime sessions, /mcp
//!   3 draft    (draft.rs)    rpm, group, body, model → providers, stored responses; the checks
//!                            of a model call (model rules, output limit, its text)
//!     cache    (cached.rs)   the response cache looked up → a hit, held and answered in 5
//!   4 price    (price.rs)    max_concurrent, the checks of its cost (the cap), tpm, windows
//!                            and balances held          → a count tollgate estimates answered
//!   5 send     (send.rs)     upstream request, retries before the first byte, health
//!     stream   (stream.rs, translated.rs)  answer → usage scanner → client
//!   6 settle   (settle.rs)   hold released, cost debited, record booked (before the last byte)
//! logging
//!   7 report   (report.rs)   metrics, access log, request log, trace
//! ```
//!
//! Stages 1 to 4 decide ([`Gateway::decide`]) and make the [`RelayPlan`]; 5 to 7 carry it out
//! and note in it what happened ([`Happened`]). Every kind of call takes its money through the
//! charge floor (`crate::charge`: admission, holds, the one path that debits) and its checks
//! from one list (`crate::checks`): a new check is a file there and a line in its list, and it
//! runs on every kind that offers what it looks at; a new kind answered here is a file in
//! `kinds/`, an arm of `kinds::of` and its route; how a request is addressed and authenticated
//! for its kind of upstream is the upstream seam's (`upstream::upstream_request`).
//!
//! Pingora's phases: a relayed request makes one pass through the proxy (a second pass, a
//! subrequest with a preset body, was measured at ~3.5× the cost of a local answer), all of it in
//! `request_filter`. Pingora replays a body read in `request_filter` only from its 64 KiB
//! retry buffer, so the upstream exchange is driven here with pingora-core's connector rather
//! than by Pingora's proxy phases (`upstream_peer` and the filters after it are never
//! reached); `logging` runs once the request ended, whatever ended it. Nothing is buffered
//! beyond the request body: response chunks go to the client as they arrive.

use crate::access::auth::KeyIndex;
use crate::billing::ledger::{Hold, Ledger};

use crate::config::Protocol;
use crate::protocol::response::LocalResponse;
use crate::protocol::{header_str, ApiError, ErrorKind};
use crate::records::key::KeyRecord;
use crate::route::Route;
use crate::upstream::{self, Routing};
use crate::video::VideoService;
use arc_swap::ArcSwap;
use async_trait::async_trait;
use bytes::Bytes;
use pingora_core::connectors::http::v1::Connector;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::{Error, ErrorSource, ErrorType, Result};
use pingora_http::RequestHeader;
use pingora_proxy::{FailToProxy, ProxyHttp, Session};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod admit;
mod answer;
mod cached;
mod draft;
mod fallback;
mod guarded;
mod ingress;
mod key_page;
mod keyless;
mod kinds;
mod paging;
mod payments;
mod person;
mod price;
mod report;
mod send;
mod settle;
mod signin;
mod stream;
mod translated;

pub use keyless::{per_minute as keyless_per_minute, KeylessRefusals};

/// Shared state of the gateway.
pub struct Gateway {
    pub routing: Arc<ArcSwap<Routing>>,
    pub keys: Arc<KeyIndex>,
    /// Size, time and memory bounds for reading request bodies.
    pub body: crate::edge::body::BodyLimits,
    /// Bounds of a multipart upload (spooled to disk, outside the buffered-body budget).
    pub uploads: crate::edge::upload::UploadLimits,
    /// Bounds of a realtime session (`limits.realtime_*`).
    pub realtime: crate::config::listen::Realtime,
    /// Realtime sessions open, per key (`limits.realtime_sessions_per_key`).
    pub realtime_sessions: crate::edge::body::KeyBudgets,
    /// A key's files (`/v1/files`).
    pub files: Arc<crate::files::FileService>,
    /// A key's batches (`/v1/batches`); set once the service runs.
    pub batches: Option<Arc<crate::batch::BatchService>>,
    /// None when no `video` section is configured.
    pub video: Option<Arc<VideoService>>,
    /// The MCP servers behind `/mcp` (`mcp:`); None when there are none.
    pub mcp: Option<Arc<crate::mcp::hub::Hub>>,
    /// The identity provider whose access tokens clients may present (`identity.oidc`).
    pub identity: Option<Arc<crate::identity::Identity>>,
    /// Reads of balances and usage; every debit goes through `charge`.
    pub ledger: Arc<Ledger>,
    /// The money of every call: admission (counts, slots, tokens, holds) and settlement.
    pub charge: Arc<crate::charge::Charge>,
    /// The checks every kind of call goes through (`checks`).
    pub checks: Arc<crate::checks::Checks>,
    /// Redemption codes (`POST /v1/redeem`) and what else sells access.
    pub selling: Arc<crate::selling::Selling>,
    /// Which key created each stored response (responses API).
    pub owners: crate::access::owners::Owners,
    pub metrics: Arc<crate::observe::metrics::Metrics>,
    /// Upstream connections, pooled per provider. HTTP/1.1 only: no provider's peer offers h2
    /// (ALPN), and the HTTP/1.1 connector lets a pooled connection be taken without the state
    /// of a new connection's connect (see `exchange`).
    pub connector: Connector,
    /// `/v1/usage` and `/me/data` reads run one at a time per key (see `usage`).
    pub usage_queries: crate::access::limits::UsageTurns,
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
    pub tracer: Option<Arc<crate::observe::telemetry::Tracer>>,
    /// Refusals without a known key, aggregated per address and minute (see `keyless`).
    pub keyless: KeylessRefusals,
    /// Claude Code's gateway sign-in (`identity.claude_code`); None when off.
    pub signin: Option<Arc<crate::signin::Signin>>,
    /// The response cache (`cache:`); None when off.
    pub cache: Option<Arc<crate::cache::Cache>>,
}

/// Everything needed to send a request upstream, decided before anything is sent (the
/// stages' result), and what happened to it since.
pub struct RelayPlan {
    /// What the key is under (its account, plans, tag limits), as admitted.
    pub under: crate::charge::Under,
    /// The routing snapshot the candidates index into.
    pub routing: Arc<Routing>,
    pub route: Route,
    pub protocol: Protocol,
    pub model: String,
    pub candidates: Vec<usize>,
    /// The client asked for a streamed answer.
    pub stream: bool,
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
    /// A streamed response's owner, known while the request lives (responses API).
    pub streaming_owner: Option<crate::access::owners::StreamingOwner>,
    /// Counts the request against the key's `max_concurrent` while the plan lives (held, not read).
    pub concurrency_slot: Option<crate::access::limits::Slot>,
    /// The tokens it is held for, reserved under the key's `tpm` until it settles.
    pub tokens_reserved: Option<crate::access::limits::TokenReservation>,
    /// The body's share of the buffered-body budget; given back once the body is sent.
    pub body_reservation: Option<crate::edge::body::Reservation>,
    /// The provider speaks another protocol than the client (see `translate`).
    pub translation: Option<crate::translate::Translation>,
    /// A media call (images, speech, transcription): billed in its own units at settlement.
    pub media: Option<crate::billing::media::MediaCall>,
    /// An upload: the form sent instead of `body`, written for each provider as it is sent.
    pub upload: Option<Arc<crate::protocol::multipart::Form>>,
    /// The request's trace while it is relayed (moved here from the request's state).
    pub trace: Option<Box<crate::observe::telemetry::Trace>>,
    /// The output guardrails of its answer, and what its request's masks restore.
    pub guard: Option<Box<crate::checks::guard::stream::OutputGuard>>,
    /// What its guardrails cost (`price_per_check`), billed with it (nano-USD).
    pub guard_price_nanos: i64,
    /// The models it may go on to before its first byte, in order (see `fallback`).
    pub fallbacks: Vec<upstream::fallback::Next>,
    /// On which classes of failure it goes on to them.
    pub fallback_on: crate::config::fallbacks::Classes,
    /// It had fallbacks: its answer names the model that served (`x-tollgate-served-model`).
    pub chained: bool,
    /// Its group's rewrite rules that applied (their header edits are made as it is sent).
    pub group_rules: Option<upstream::rewrite::Matched>,
    /// An upstream's error answer read to decide on a fallback, and its share of the budget of
    /// bytes held for clients: what the client is told from.
    pub error_read: Option<(Vec<u8>, crate::edge::body::Reservation)>,
    /// The response cache applies to it: a hit to answer, or a miss whose answer may be kept.
    pub cache: Option<Box<cached::CacheCall>>,
    /// What happened while it was relayed.
    pub happened: Happened,
}

/// What happened to a relayed request (the plan is what was decided): for settlement, the
/// logs, the metrics and the trace.
#[derive(Debug, Default)]
pub struct Happened {
    /// What settlement billed (tokens, cost, estimated), for the access log.
    pub billed: Option<(crate::base::usage::Usage, i64, bool)>,
    /// The provider (catalog index) that answered, once one did.
    pub served_by: Option<usize>,
    /// Requests sent upstream (retries included).
    pub attempts: u32,
    /// When the answer's first body byte went to the client, after the start.
    pub first_byte: Option<Duration>,
    /// The upstream's own request id (its `x-request-id` or `request-id`), for the request log.
    pub upstream_request_id: Option<String>,
    /// Each model it left for the next before its first byte, and why (a class of
    /// `protocol::error_class`, or `context_window`): the first is the model asked for.
    pub fell_back: Vec<(String, &'static str)>,
    /// The ids of the rewrite rules its provider's request was made with (comma-separated).
    pub rewrites: Option<String>,
}

impl RelayPlan {
    /// With traces on: an upstream attempt's client span opens, with the `traceparent` it sends.
    fn begin_attempt(&mut self, upstream: &upstream::Upstream) {
        let Some(trace) = self.trace.as_mut() else { return };
        // The attempt's span names the model as the provider knows it; the request's, as the client named it.
        let model = upstream.config.upstream_model(&self.model);
        trace.begin_attempt(&upstream.span_attrs, crate::observe::metrics::gen_ai_operation(self.route.label()), model);
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
    pub in_flight: Option<crate::observe::metrics::Live>,
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
    pub trace: Option<Box<crate::observe::telemetry::Trace>>,
    /// A realtime session's turns and what they cost, once it ended.
    pub realtime: Option<Box<kinds::realtime::SessionTotals>>,
    /// An MCP tool call: its server and tool, what it came to and cost.
    pub mcp: Option<Box<kinds::mcp::ToolCallFacts>>,
    /// What the guardrails did to the request (and hold for its answer).
    pub guarded: Option<Box<guarded::Guarded>>,
    /// The caller presented tollgate's own token (Claude Code's gateway sign-in): who it names.
    /// Its refusals are in the gateway protocol's terms.
    pub signed_in: Option<Arc<crate::signin::token::Claims>>,
    /// A messages call that came in Bedrock's or Vertex AI's format, and the model its path named.
    pub ingress: Option<(crate::protocol::cloud_ingress::Ingress, Option<String>)>,
}

/// How a stage ends the request before it is relayed: answered here (a local endpoint, a
/// streamed video, a count tollgate estimates), or refused.
enum Exit {
    Answer(Outcome),
    Refuse(ApiError),
}

impl From<ApiError> for Exit {
    fn from(e: ApiError) -> Self {
        Exit::Refuse(e)
    }
}

/// A check refused the call, or answered it.
impl From<crate::checks::Stop> for Exit {
    fn from(stop: crate::checks::Stop) -> Self {
        match stop {
            crate::checks::Stop::Refuse(e) => Exit::Refuse(e),
            crate::checks::Stop::Answer(r) => Exit::Answer(Outcome::Respond(r)),
        }
    }
}

/// What a stage hands the next one, or how it ended the request.
type Step<T> = std::result::Result<T, Exit>;

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

/// The client's messages-protocol version header, under either name.
fn client_version(req: &RequestHeader) -> Option<String> {
    header_str(req, &ANTHROPIC_VERSION).or_else(|| header_str(req, &COMPAT_VERSION)).map(str::to_string)
}

/// The error shape a request gets, from its route (and the version header for `/v1/models`).
fn shape_of(route: &Route, req: &RequestHeader) -> Protocol {
    match route {
        Route::NotFound { shape } => *shape,
        Route::Models if client_version(req).is_some() => Protocol::Anthropic,
        Route::Models
        | Route::Usage
        | Route::Redeem
        | Route::StripeWebhook
        | Route::Signin(_)
        | Route::Root
        | Route::KeyPage { .. }
        | Route::KeyPageData => Protocol::Openai,
        Route::GeminiModels | Route::GeminiModel { .. } => Protocol::Gemini,
        other => other.relay_protocol().unwrap_or(Protocol::Openai),
    }
}

/// 404 for a path nobody serves (or one switched off, like `/me`).
fn unknown_endpoint(req: &RequestHeader) -> ApiError {
    ApiError::new(ErrorKind::NotFound, format!("Unknown endpoint: {} {}", req.method, req.uri.path()))
}

impl Gateway {
    /// A request refused by tollgate: counted in `tollgate_refusals_total` by `code`, which the
    /// access and request logs give as its reason.
    fn note_refusal(&self, ctx: &mut RequestCtx, code: &'static str) {
        self.metrics.counter("tollgate_refusals_total", &[("code", code)]).add(1);
        ctx.reason = Some(code);
    }

    /// Route, authenticate and either answer locally or plan a relay: the request stages in
    /// their order, each of which may answer the request itself (see [`Exit`]).
    async fn decide(&self, session: &mut Session, ctx: &mut RequestCtx) -> std::result::Result<Outcome, ApiError> {
        match self.stages(session, ctx).await {
            Ok(plan) => Ok(Outcome::Relay(plan)),
            Err(Exit::Answer(outcome)) => Ok(outcome),
            Err(Exit::Refuse(e)) => Err(e),
        }
    }

    async fn stages(&self, session: &mut Session, ctx: &mut RequestCtx) -> Step<Box<RelayPlan>> {
        let caller = admit::admit(self, session, ctx).await?;
        let Some(caller) = caller else {
            // A request that is not a key's: the sign-in's OAuth endpoints and page, the
            // payment provider's events.
            let req = session.req_header();
            let answered = match crate::route::classify(req.method.as_str(), req.uri.path()) {
                Route::Signin(op) => signin::keyless(self, session, op).await?,
                _ => payments::stripe_webhook(self, session).await?,
            };
            return Err(Exit::Answer(Outcome::Respond(answered)));
        };
        let protocol = answer::answer(self, session, ctx, &caller).await?;
        let drafted = draft::draft(self, session, ctx, &caller, protocol).await?;
        let cached = cached::lookup(self, session, ctx, &caller, &drafted).await?;
        price::price(self, session, ctx, caller, drafted, cached).await
    }
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx {
            in_flight: Some(crate::observe::metrics::Live::new(&self.metrics, crate::observe::metrics::Gauge::InFlight)),
            ..RequestCtx::default()
        }
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
                self.note_refusal(ctx, err.kind.reason());
                ctx.reason_param = err.param.clone();
                // The body may be unread: do not reuse the connection after an early refusal.
                session.set_keepalive(None);
                let bedrock = ctx.ingress.as_ref().is_some_and(|(i, _)| i.bedrock());
                let answer = match ctx.signed_in {
                    Some(_) => signin::refusal(&err),
                    None if bedrock => ingress::bedrock_refusal(&err),
                    None => LocalResponse::error(&err, ctx.shape.unwrap_or(Protocol::Openai)),
                };
                answer.send(session).await?;
            }
        }
        Ok(true)
    }

    /// Pingora's default (response compression, off) and the request id of every answer.
    fn init_downstream_modules(&self, modules: &mut pingora_core::modules::http::HttpModules) {
        modules.add_module(pingora_core::modules::http::compression::ResponseCompressionBuilder::enable(0));
        modules.add_module(Box::new(crate::observe::request_id::RequestIdBuilder));
        modules.add_module(Box::new(crate::edge::framing::IngressFramingBuilder));
    }

    /// Never reached: `request_filter` answers every request.
    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut RequestCtx) -> Result<Box<HttpPeer>> {
        Err(Error::explain(ErrorType::InternalError, "requests are relayed from request_filter"))
    }

    /// Counts the request and writes its access-log line.
    async fn logging(&self, session: &mut Session, _e: Option<&Error>, ctx: &mut RequestCtx) {
        report::report(self, session, ctx);
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
