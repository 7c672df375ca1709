//! The `ProxyHttp` implementation. Hooks stay thin: each delegates to `route`, `auth`,
//! `protocol` or `relay` and acts on the outcome.
//!
//! Request bodies (DESIGN.md, constraint 1): a relayed request's body is read whole in
//! `request_filter` (up to `max_body_bytes`), its `model` field picks the providers, and the
//! request then runs as a Pingora subrequest whose body is the preset, already-read bytes.
//! That one path serves every body size; the subrequest's own hooks (`upstream_peer`,
//! `upstream_request_filter`, `response_body_filter`) do the upstream side, and its response
//! tasks are piped to the client as they arrive (nothing is buffered).

use crate::auth::{self, KeyIndex};
use crate::billing;
use crate::ledger::{now_ms, Hold, Ledger, PriceBook, UsageRecord, NANOS_PER_USD};

use crate::config::{Platform, Protocol, MAX_OUTPUT_ALLOWANCE};
use crate::limits::Limits;
use crate::meter::{Shape, UsageScanner};
use crate::protocol::{anthropic, gemini, openai, ApiError, ErrorKind};
use crate::relay::{self, Catalog};
use crate::response::LocalResponse;
use crate::route::{self, Route};
use crate::store::KeyRecord;
use crate::video::{self, VideoService};
use arc_swap::ArcSwap;
use async_trait::async_trait;
use bytes::Bytes;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::{Error, ErrorSource, ErrorType, Result};
use pingora_http::{RequestHeader, ResponseHeader};
use pingora_proxy::subrequest::pipe::{pipe_subrequest, InputBody, InputBodyType};
use pingora_proxy::subrequest::{BodyMode, Ctx as SubrequestCtx};
use pingora_proxy::{FailToProxy, ProxyHttp, Session};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The part of the configuration a reload replaces: providers, models, groups, prices.
/// A request keeps the snapshot it started with.
pub struct Routing {
    pub catalog: Arc<Catalog>,
    pub prices: Arc<PriceBook>,
    /// Output tokens held for a request that names no maximum (and whose model has no
    /// `max_output_tokens`).
    pub default_max_output_tokens: u64,
    /// Extra client headers relayed upstream (`forward_headers`).
    pub forward_headers: Vec<String>,
}

/// Shared state of the gateway.
pub struct Gateway {
    pub routing: Arc<ArcSwap<Routing>>,
    pub keys: Arc<KeyIndex>,
    pub max_body_bytes: usize,
    /// None when no `video` section is configured.
    pub video: Option<Arc<VideoService>>,
    pub ledger: Arc<Ledger>,
    pub limits: Arc<Limits>,
    pub metrics: Arc<crate::metrics::Metrics>,
}

/// Everything the subrequest needs to send a request upstream, decided by the parent.
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
    /// The client's `anthropic-version` / `compat-version`.
    pub client_version: Option<String>,
    pub key: Arc<KeyRecord>,
    /// The money reserved for this request; taken once, at settlement.
    pub hold: Mutex<Option<Hold>>,
    /// tollgate asked for stream usage; the usage chunk is not the client's to see.
    pub withhold_usage: bool,
    pub started: Instant,
    /// What settlement billed (tokens, cost, estimated), for the access log.
    pub billed: Mutex<Option<(crate::meter::Usage, i64, bool)>>,
    /// Counts the request against the key's `max_concurrent` while the plan lives (held, not read).
    pub concurrency_slot: Option<crate::limits::Slot>,
}

/// Per-request state.
#[derive(Default)]
pub struct RequestCtx {
    /// Error shape for this request.
    pub shape: Option<Protocol>,
    /// Set in a relay subrequest only.
    pub plan: Option<Arc<RelayPlan>>,
    /// Index into `plan.candidates` of the provider being tried.
    pub attempt: usize,
    /// Upstream response status (subrequest).
    pub status: u16,
    /// Reads usage from the upstream response (subrequest).
    pub scanner: Option<UsageScanner>,
    /// Route label for metrics and the access log (parent request).
    pub route: &'static str,
    /// For the access log (parent request): who called, when, and the relay it made.
    pub key_name: Option<String>,
    pub started: Option<Instant>,
    pub relayed: Option<Arc<RelayPlan>>,
    /// Counts this request as in flight until dropped.
    pub in_flight: Option<InFlight>,
    /// The subrequest opened an event stream to the client.
    pub stream_open: bool,
    pub first_byte_seen: bool,
}

/// Counts a request in `tollgate_in_flight_requests` for as long as it lives.
pub struct InFlight(Arc<crate::metrics::Metrics>);

impl InFlight {
    pub fn new(metrics: Arc<crate::metrics::Metrics>) -> Self {
        metrics.in_flight.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        InFlight(metrics)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// What the parent request does next.
enum Outcome {
    Respond(LocalResponse),
    Relay(Arc<RelayPlan>),
    /// The response has been written already (a streamed video).
    Done,
}

fn header_str<'a>(req: &'a RequestHeader, name: &str) -> Option<&'a str> {
    req.headers.get(name).and_then(|v| v.to_str().ok())
}

/// The client's messages-protocol version header, under either name.
fn client_version(req: &RequestHeader) -> Option<String> {
    header_str(req, "anthropic-version").or_else(|| header_str(req, "compat-version")).map(str::to_string)
}

/// The error shape a request gets, from its route (and the version header for `/v1/models`).
fn shape_of(route: &Route, req: &RequestHeader) -> Protocol {
    match route {
        Route::NotFound { shape } => *shape,
        Route::Models if client_version(req).is_some() => Protocol::Anthropic,
        Route::Models | Route::Usage => Protocol::Openai,
        Route::GeminiModels | Route::GeminiModel { .. } => Protocol::Gemini,
        other => other.relay_protocol().unwrap_or(Protocol::Openai),
    }
}

/// The output tokens a request may produce, all choices together: the per-choice maximum it
/// names (refused above the model's `max_output_tokens`, or above [`MAX_OUTPUT_ALLOWANCE`]),
/// else the model's limit, else `billing.default_max_output_tokens`; times `n` /
/// `candidateCount`.
fn output_allowance(fields: &relay::BodyFields<'_>, routing: &Routing, model: &str) -> std::result::Result<u64, ApiError> {
    let model_limit = routing.prices.price(model).and_then(|p| p.max_output_tokens);
    let per_choice = match fields.max_output() {
        Some(asked) => {
            let limit = model_limit.unwrap_or(MAX_OUTPUT_ALLOWANCE);
            if asked > limit {
                return Err(ApiError::new(
                    ErrorKind::BadRequest,
                    format!("The maximum output of {asked} tokens is more than the model '{model}' can produce ({limit})."),
                ));
            }
            asked
        }
        None => model_limit.unwrap_or(routing.default_max_output_tokens),
    };
    Ok(per_choice.saturating_mul(fields.choices()?))
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
            return Err(ApiError::new(ErrorKind::NotFound, format!("Unknown endpoint: {} {}", req.method, req.uri.path())));
        }
        let key = self.keys.authenticate(auth::extract_key(&req.headers))?;
        ctx.key_name = Some(key.name.clone());
        let version = client_version(req);
        let routing = self.routing.load_full();
        let catalog = &routing.catalog;

        let protocol = match &route {
            Route::Models => {
                let (only, shape) =
                    if version.is_some() { (Some(Protocol::Anthropic), Protocol::Anthropic) } else { (None, Protocol::Openai) };
                let models = catalog.models_for(&key.group, only);
                let body = match shape {
                    Protocol::Anthropic => anthropic::model_list(&models),
                    _ => openai::model_list(&models),
                };
                return Ok(Outcome::Respond(LocalResponse::json(200, &body)));
            }
            Route::GeminiModels => {
                let models = catalog.models_for(&key.group, Some(Protocol::Gemini));
                return Ok(Outcome::Respond(LocalResponse::json(200, &gemini::model_list(&models))));
            }
            Route::GeminiModel { model } => {
                let models = catalog.models_for(&key.group, Some(Protocol::Gemini));
                let wanted = model.strip_prefix("models/").unwrap_or(model);
                return match models.iter().find(|m| m.id == wanted) {
                    Some(m) => Ok(Outcome::Respond(LocalResponse::json(200, &gemini::model(m)))),
                    None => Err(ApiError::new(ErrorKind::ModelNotFound, format!("models/{wanted} is not found."))),
                };
            }
            Route::Usage => return self.usage(req.uri.query(), &key).map(Outcome::Respond),
            Route::VideoCreate { .. } | Route::VideoGet { .. } | Route::VideoContent { .. }
                if !catalog.group_allows(&key.group, Platform::Video) =>
            {
                return Err(ApiError::new(
                    ErrorKind::NotFound,
                    format!("This endpoint is not available to keys of group '{}'.", key.group),
                ));
            }
            Route::VideoCreate { .. } => {
                self.limits.admit(&key)?;
                let _slot = self.limits.enter(&key)?;
                return self.video_route(session, &route, &key).await;
            }
            Route::VideoGet { .. } | Route::VideoContent { .. } => {
                return self.video_route(session, &route, &key).await;
            }
            other => other.relay_protocol().ok_or_else(|| ApiError::new(ErrorKind::Internal, "unroutable request"))?,
        };

        if !catalog.group_allows(&key.group, protocol) {
            return Err(ApiError::new(ErrorKind::NotFound, format!("This endpoint is not available to keys of group '{}'.", key.group)));
        }
        self.limits.admit(&key)?;
        let slot = self.limits.enter(&key)?;
        let client_body = self.read_body(session).await?;
        let fields = match &route {
            Route::GenerateContent { .. } if client_body.is_empty() => relay::BodyFields::default(),
            _ => relay::body_fields(&client_body)?,
        };
        let model = match &route {
            Route::GenerateContent { model, .. } => model.clone(),
            _ => fields
                .model
                .clone()
                .filter(|m| !m.is_empty())
                .ok_or_else(|| ApiError::new(ErrorKind::BadRequest, "The 'model' field is required.").with_param("model"))?,
        };
        let candidates = catalog
            .candidates(protocol, &model)
            .filter(|_| catalog.group_allows(&key.group, protocol))
            .ok_or_else(|| {
                ApiError::new(
                    ErrorKind::ModelNotFound,
                    format!("The model '{model}' does not exist or is not available to this key. See the model list."),
                )
                .with_param("model")
            })?
            .to_vec();

        // Hold the most this request can cost before anything is forwarded.
        let output_allowance = match route {
            Route::Embeddings => 0,
            _ => output_allowance(&fields, &routing, &model)?,
        };
        let estimate =
            routing.prices.hold_cost(&model, billing::hold_input_tokens(client_body.len()), output_allowance).ok_or_else(|| {
                log::error!("model {model} is served without a price; refused");
                ApiError::new(ErrorKind::Internal, format!("The model '{model}' is not priced on this gateway and cannot be served."))
            })?;
        let hold = match self.ledger.hold(&key.id, estimate) {
            Ok(Ok(hold)) => hold,
            Ok(Err(short)) => return Err(short.to_api_error("this request may cost up to")),
            Err(e) => {
                log::error!("ledger: {e}");
                return Err(ApiError::new(ErrorKind::Internal, "Internal error while checking the balance."));
            }
        };

        // A streamed chat completion reports usage only when asked: whatever the client sent
        // in `stream_options`, ask, and withhold the usage chunk from a client that did not.
        let client_body_len = client_body.len();
        let mut withhold_usage = false;
        let body = if route == Route::ChatCompletions && fields.stream == Some(true) && !fields.client_wants_usage() {
            withhold_usage = true;
            relay::with_include_usage(&client_body, &fields)?
        } else {
            client_body.clone()
        };
        drop(fields);
        Ok(Outcome::Relay(Arc::new(RelayPlan {
            routing: routing.clone(),
            route,
            protocol,
            model,
            candidates,
            body,
            client_body_len,
            client_version: version,
            key,
            hold: Mutex::new(Some(hold)),
            withhold_usage,
            started: Instant::now(),
            billed: Mutex::new(None),
            concurrency_slot: slot,
        })))
    }

    /// `GET /v1/usage[?start=&end=]` for the calling key.
    fn usage(&self, query: Option<&str>, key: &KeyRecord) -> std::result::Result<LocalResponse, ApiError> {
        let mut start = 0u64;
        let mut end = u64::MAX;
        for pair in query.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let parse = || {
                value
                    .parse::<u64>()
                    .map_err(|_| ApiError::new(ErrorKind::BadRequest, format!("{name}: must be a unix time in seconds")).with_param(name))
            };
            match name {
                "start" => start = parse()?.saturating_mul(1000),
                "end" => end = parse()?.saturating_mul(1000),
                _ => {}
            }
        }
        let internal = |e: crate::store::StoreError| {
            log::error!("usage query: {e}");
            ApiError::new(ErrorKind::Internal, "Internal error while reading usage.")
        };
        let (total, by_model) = self.ledger.summary(&key.id, start, end).map_err(internal)?;
        let balance = self.ledger.balance(&key.id).map_err(internal)?;
        let models: Vec<serde_json::Value> = by_model
            .iter()
            .map(|(model, t)| {
                let mut row = t.to_json();
                row["model"] = serde_json::json!(model);
                row
            })
            .collect();
        Ok(LocalResponse::json(
            200,
            &serde_json::json!({
                "object": "usage",
                "key": {"name": key.name, "group": key.group},
                "balance": balance as f64 / NANOS_PER_USD as f64,
                "total": total.to_json(),
                "models": models,
            }),
        ))
    }

    /// Bill a finished relay (subrequest `logging`): release the hold, charge what was used.
    async fn settle(&self, ctx: &mut RequestCtx, error: Option<&Error>) {
        let Some(plan) = ctx.plan.as_ref() else { return };
        let hold = plan.hold.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(hold) = hold else { return };
        let scan = ctx.scanner.as_mut().map(UsageScanner::finish);
        let status = match (ctx.status, error) {
            (0, Some(e)) => upstream_failure(e).status(),
            (s, _) => s,
        };
        let (usage, estimated) = billing::billed_usage(scan, status, plan.client_body_len);
        let cost = plan.routing.prices.cost(&plan.model, usage);
        if estimated {
            self.metrics.add("tollgate_estimated_bills_total", &[("model", &plan.model)], 1.0);
        }
        *plan.billed.lock().unwrap_or_else(|p| p.into_inner()) = Some((usage, cost, estimated));
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
        };
        let input_total = usage.input.saturating_add(usage.cached).saturating_add(usage.cache_write);
        self.limits.spend_tokens(&plan.key.id, input_total.saturating_add(usage.output));
        let m = &self.metrics;
        m.add("tollgate_tokens_total", &[("model", &plan.model), ("kind", "input")], input_total as f64);
        m.add("tollgate_tokens_total", &[("model", &plan.model), ("kind", "output")], usage.output as f64);
        m.add("tollgate_cost_usd_total", &[("model", &plan.model)], cost as f64 / NANOS_PER_USD as f64);
        if let Err(e) = self.ledger.settle(hold, record).await {
            log::error!("ledger: could not settle a request of key {}: {e}", plan.key.name);
        }
    }

    /// The video task endpoints.
    async fn video_route(&self, session: &mut Session, route: &Route, key: &KeyRecord) -> std::result::Result<Outcome, ApiError> {
        let Some(svc) = self.video.as_ref() else {
            return Err(ApiError::new(ErrorKind::NotFound, "Video generation is not configured on this gateway."));
        };
        match route {
            Route::VideoCreate { legacy } => {
                let body = self.read_body(session).await?;
                let idem = header_str(session.req_header(), "idempotency-key").map(str::to_string);
                if idem.as_ref().is_some_and(|k| k.is_empty() || k.len() > 255) {
                    return Err(ApiError::new(ErrorKind::BadRequest, "Idempotency-Key: 1 to 255 characters").with_param("Idempotency-Key"));
                }
                let task = svc.present(svc.create(key, &body, idem.as_deref()).await?).await;
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

    /// Read the whole request body, refusing more than `max_body_bytes` (413) without reading
    /// past the limit.
    async fn read_body(&self, session: &mut Session) -> std::result::Result<Bytes, ApiError> {
        let limit = self.max_body_bytes;
        let too_large = || ApiError::new(ErrorKind::PayloadTooLarge, format!("The request body exceeds the limit of {limit} bytes."));
        let declared = header_str(session.req_header(), "content-length").and_then(|v| v.trim().parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit as u64) {
            return Err(too_large());
        }
        // The checks passed: tell a client that waits for it (curl does above 1 MiB) to send.
        let expects_continue = header_str(session.req_header(), "expect").is_some_and(|v| v.trim().eq_ignore_ascii_case("100-continue"));
        if expects_continue {
            let write = async {
                let continue_header = ResponseHeader::build(100, Some(0))?;
                session.write_response_header(Box::new(continue_header), false).await
            };
            write
                .await
                .map_err(|e| ApiError::new(ErrorKind::BadRequest, format!("The request body could not be read: {}", e.etype().as_str())))?;
        }
        let mut chunks: Vec<Bytes> = Vec::new();
        let mut total = 0usize;
        loop {
            let chunk = session
                .read_request_body()
                .await
                .map_err(|e| ApiError::new(ErrorKind::BadRequest, format!("The request body could not be read: {}", e.etype().as_str())))?;
            let Some(chunk) = chunk else { break };
            total += chunk.len();
            if total > limit {
                return Err(too_large());
            }
            chunks.push(chunk);
        }
        Ok(match chunks.len() {
            0 => Bytes::new(),
            1 => chunks.swap_remove(0),
            _ => {
                let mut all = Vec::with_capacity(total);
                for c in &chunks {
                    all.extend_from_slice(c);
                }
                Bytes::from(all)
            }
        })
    }

    /// Run the planned request as a subrequest with the preset body and pipe its response.
    async fn relay(&self, session: &mut Session, plan: Arc<RelayPlan>) -> Result<()> {
        let shape = plan.protocol;
        let body = plan.body.clone();
        // The subrequest re-reads the request header as HTTP/1.x text; an HTTP/2 client's
        // request is written out as HTTP/1.1 for it (the upstream side is HTTP/1.1 anyway).
        if session.req_header().version == http::Version::HTTP_2 {
            session.req_header_mut().set_version(http::Version::HTTP_11);
        }
        let Some(spawner) = session.subrequest_spawner.as_ref() else {
            return Err(Error::explain(ErrorType::InternalError, "subrequests are not enabled"));
        };
        let sub_ctx = SubrequestCtx::builder().body_mode(BodyMode::ExpectBody).user_ctx(Box::new(plan)).build();
        let (subrequest, handle) = spawner.create_subrequest(session.as_downstream(), sub_ctx);
        let input = InputBodyType::Preset(if body.is_empty() { InputBody::NoBody } else { InputBody::Bytes(vec![body]) });
        let state = match pipe_subrequest(session, subrequest, handle, |task| Ok(Some(task)), input).await {
            Ok(state) => {
                if !state.header_received {
                    let err = ApiError::new(ErrorKind::BadGateway, "The upstream service sent no response.");
                    LocalResponse::error(&err, shape).send(session).await?;
                }
                state
            }
            Err(failure) => {
                let from_client = matches!(failure.error.esource(), ErrorSource::Downstream) && !failure.from_subreq;
                if !failure.state.header_received && !from_client {
                    log::warn!("relay failed: {}", failure.error);
                    let err = upstream_failure(&failure.error);
                    LocalResponse::error(&err, shape).send(session).await?;
                } else {
                    // Mid-response failure: the client sees the connection end.
                    session.set_keepalive(None);
                }
                failure.state
            }
        };
        // Keep the pipe open until the subrequest has finished its own logging.
        let _pipe = state.pipe_rx;
        if let Some(join) = state.join_handle {
            let _ = join.await;
        }
        Ok(())
    }
}

/// One structured line per client request (target `access`). Names the key, never its secret;
/// the path is logged without its query string.
fn access_log(session: &Session, ctx: &RequestCtx, status: u16) {
    if !log::log_enabled!(target: "access", log::Level::Info) {
        return;
    }
    let req = session.req_header();
    let latency_ms = ctx.started.map_or(0.0, |t| t.elapsed().as_secs_f64() * 1000.0);
    let (model, usage) = match &ctx.relayed {
        Some(plan) => (plan.model.as_str(), *plan.billed.lock().unwrap_or_else(|p| p.into_inner())),
        None => ("-", None),
    };
    let (input, output, cost, estimated) =
        usage.map_or((0, 0, 0, false), |(u, c, e)| (u.input.saturating_add(u.cached).saturating_add(u.cache_write), u.output, c, e));
    log::info!(
        target: "access",
        "method={} path={:?} route={} status={} key={:?} model={:?} input_tokens={} output_tokens={} cost_usd={:.9} estimated={} latency_ms={:.3}",
        req.method,
        req.uri.path(),
        ctx.route,
        status,
        ctx.key_name.as_deref().unwrap_or("-"),
        model,
        input,
        output,
        cost as f64 / NANOS_PER_USD as f64,
        estimated,
        latency_ms
    );
}

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx { in_flight: Some(InFlight::new(self.metrics.clone())), ..RequestCtx::default() }
    }

    fn allow_spawning_subrequest(&self, session: &Session, _ctx: &RequestCtx) -> bool {
        session.subrequest_ctx.is_none()
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        // A relay subrequest carries its plan: go straight to the upstream.
        if let Some(plan) = session.subrequest_ctx.as_ref().and_then(|c| c.user_ctx()).and_then(|u| u.downcast_ref::<Arc<RelayPlan>>()) {
            let plan = plan.clone();
            // The subrequest reads its preset body by the length its header declares; the body
            // may have been rewritten, so declare the real length (before the body is read).
            let req = session.req_header_mut();
            req.remove_header("transfer-encoding");
            req.insert_header("content-length", plan.body.len().to_string())?;
            ctx.shape = Some(plan.protocol);
            ctx.plan = Some(plan);
            return Ok(false);
        }
        ctx.started = Some(Instant::now());
        match self.decide(session, ctx).await {
            Ok(Outcome::Respond(resp)) => resp.send(session).await?,
            Ok(Outcome::Relay(plan)) => {
                ctx.relayed = Some(plan.clone());
                self.relay(session, plan).await?
            }
            Ok(Outcome::Done) => {}
            Err(err) => {
                // The body may be unread: do not reuse the connection after an early refusal.
                session.set_keepalive(None);
                LocalResponse::error(&err, ctx.shape.unwrap_or(Protocol::Openai)).send(session).await?;
            }
        }
        Ok(true)
    }

    async fn upstream_peer(&self, _session: &mut Session, ctx: &mut RequestCtx) -> Result<Box<HttpPeer>> {
        let Some(plan) = ctx.plan.as_ref() else {
            return Err(Error::explain(ErrorType::InternalError, "no relay plan"));
        };
        // Skip providers whose host does not resolve right now.
        while ctx.attempt < plan.candidates.len() {
            let upstream = &plan.routing.catalog.upstreams[plan.candidates[ctx.attempt]];
            if let Some(peer) = upstream.peer(ctx.attempt) {
                return Ok(Box::new(peer));
            }
            log::warn!("provider {} has no resolved address", upstream.config.name);
            ctx.attempt += 1;
        }
        Err(Error::explain(ErrorType::ConnectNoRoute, "no provider address available"))
    }

    fn fail_to_connect(&self, _session: &mut Session, _peer: &HttpPeer, ctx: &mut RequestCtx, mut e: Box<Error>) -> Box<Error> {
        if let Some(plan) = ctx.plan.as_ref() {
            if ctx.attempt + 1 < plan.candidates.len() {
                log::warn!(
                    "provider {} failed to connect ({}); trying the next",
                    plan.routing.catalog.upstreams[plan.candidates[ctx.attempt]].config.name,
                    e.etype().as_str()
                );
                ctx.attempt += 1;
                e.set_retry(true);
            }
        }
        e
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut RequestCtx,
    ) -> Result<()> {
        let Some(plan) = ctx.plan.as_ref() else {
            return Err(Error::explain(ErrorType::InternalError, "no relay plan"));
        };
        let upstream = &plan.routing.catalog.upstreams[plan.candidates[ctx.attempt.min(plan.candidates.len() - 1)]];
        relay::rewrite_request(
            upstream_request,
            upstream,
            &plan.route,
            plan.client_version.as_deref(),
            plan.body.len(),
            &plan.routing.forward_headers,
        )
    }

    async fn response_filter(&self, _session: &mut Session, upstream_response: &mut ResponseHeader, ctx: &mut RequestCtx) -> Result<()> {
        let Some(plan) = ctx.plan.as_ref() else { return Ok(()) };
        ctx.status = upstream_response.status.as_u16();
        let sse =
            upstream_response.headers.get("content-type").and_then(|v| v.to_str().ok()).is_some_and(|v| v.starts_with("text/event-stream"));
        self.metrics.observe("tollgate_upstream_seconds", &[("protocol", plan.protocol.as_str())], plan.started.elapsed().as_secs_f64());
        if sse {
            ctx.stream_open = true;
            self.metrics.open_streams.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        let withhold = plan.withhold_usage && ctx.status == 200;
        if withhold {
            // The body changes length when the usage chunk is withheld.
            upstream_response.remove_header("content-length");
        }
        ctx.scanner = Some(UsageScanner::new(plan.route.usage_shape().unwrap_or(Shape::Chat), sse, withhold));
        Ok(())
    }

    fn response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        end_of_stream: bool,
        ctx: &mut RequestCtx,
    ) -> Result<Option<std::time::Duration>> {
        if !ctx.first_byte_seen && body.as_ref().is_some_and(|b| !b.is_empty()) {
            ctx.first_byte_seen = true;
            if let Some(plan) = ctx.plan.as_ref() {
                self.metrics.observe(
                    "tollgate_first_byte_seconds",
                    &[("protocol", plan.protocol.as_str())],
                    plan.started.elapsed().as_secs_f64(),
                );
            }
        }
        if let Some(scanner) = ctx.scanner.as_mut() {
            if let Some(chunk) = body.as_ref() {
                if let Some(replacement) = scanner.feed(chunk) {
                    *body = Some(replacement);
                }
            }
            if end_of_stream {
                if let Some(rest) = scanner.take_pending() {
                    let mut joined = body.take().map(|b| b.to_vec()).unwrap_or_default();
                    joined.extend_from_slice(&rest);
                    *body = Some(Bytes::from(joined));
                }
            }
        }
        Ok(None)
    }

    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut RequestCtx) {
        if ctx.plan.is_some() {
            if ctx.stream_open {
                self.metrics.open_streams.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            }
            self.settle(ctx, e).await;
            return;
        }
        let status = session.response_written().map_or(0, |r| r.status.as_u16());
        let status_text = status.to_string();
        let model = ctx.relayed.as_ref().map_or("-", |p| p.model.as_str());
        self.metrics.add("tollgate_requests_total", &[("route", ctx.route), ("model", model), ("status", &status_text)], 1.0);
        access_log(session, ctx, status);
    }

    async fn fail_to_proxy(&self, session: &mut Session, e: &Error, ctx: &mut RequestCtx) -> FailToProxy {
        // In a subrequest the parent writes the error (it knows whether headers went out).
        if ctx.plan.is_some() {
            return FailToProxy { error_code: upstream_failure(e).status(), can_reuse_downstream: false };
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
