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
use crate::config::Protocol;
use crate::protocol::{anthropic, gemini, openai, ApiError, ErrorKind};
use crate::relay::{self, Catalog};
use crate::response::LocalResponse;
use crate::route::{self, Route};
use crate::store::KeyRecord;
use crate::video::{self, VideoService};
use async_trait::async_trait;
use bytes::Bytes;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::{Error, ErrorSource, ErrorType, Result};
use pingora_http::{RequestHeader, ResponseHeader};
use pingora_proxy::subrequest::pipe::{pipe_subrequest, InputBody, InputBodyType};
use pingora_proxy::subrequest::{BodyMode, Ctx as SubrequestCtx};
use pingora_proxy::{FailToProxy, ProxyHttp, Session};
use std::sync::Arc;

/// Shared state of the gateway.
pub struct Gateway {
    pub catalog: Arc<Catalog>,
    pub keys: Arc<KeyIndex>,
    pub max_body_bytes: usize,
    /// None when no `video` section is configured.
    pub video: Option<Arc<VideoService>>,
}

/// Everything the subrequest needs to send a request upstream, decided by the parent.
#[derive(Debug)]
pub struct RelayPlan {
    pub route: Route,
    pub protocol: Protocol,
    pub model: String,
    pub candidates: Vec<usize>,
    pub body: Bytes,
    /// The client's `anthropic-version` / `compat-version`.
    pub client_version: Option<String>,
    pub key: Arc<KeyRecord>,
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
    header_str(req, "anthropic-version")
        .or_else(|| header_str(req, "compat-version"))
        .map(str::to_string)
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

/// Map a proxy failure to the client-facing error (never naming the upstream).
pub fn upstream_failure(e: &Error) -> ApiError {
    match e.etype() {
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

        if let Some(param) = auth::query_carries_key(req.uri.query()) {
            return Err(ApiError::new(
                ErrorKind::BadRequest,
                format!("API keys are not accepted in query parameters ('{param}'). Send the key in a header."),
            )
            .with_param(&param));
        }
        if let Route::NotFound { .. } = route {
            return Err(ApiError::new(
                ErrorKind::NotFound,
                format!("Unknown endpoint: {} {}", req.method, req.uri.path()),
            ));
        }
        let key = self.keys.authenticate(auth::extract_key(&req.headers))?;
        let version = client_version(req);

        let protocol = match &route {
            Route::Models => {
                let (only, shape) = if version.is_some() {
                    (Some(Protocol::Anthropic), Protocol::Anthropic)
                } else {
                    (None, Protocol::Openai)
                };
                let models = self.catalog.models_for(&key.group, only);
                let body = match shape {
                    Protocol::Anthropic => anthropic::model_list(&models),
                    _ => openai::model_list(&models),
                };
                return Ok(Outcome::Respond(LocalResponse::json(200, &body)));
            }
            Route::GeminiModels => {
                let models = self.catalog.models_for(&key.group, Some(Protocol::Gemini));
                return Ok(Outcome::Respond(LocalResponse::json(200, &gemini::model_list(&models))));
            }
            Route::GeminiModel { model } => {
                let models = self.catalog.models_for(&key.group, Some(Protocol::Gemini));
                let wanted = model.strip_prefix("models/").unwrap_or(model);
                return match models.iter().find(|m| m.id == wanted) {
                    Some(m) => Ok(Outcome::Respond(LocalResponse::json(200, &gemini::model(m)))),
                    None => Err(ApiError::new(ErrorKind::ModelNotFound, format!("models/{wanted} is not found."))),
                };
            }
            Route::Usage => {
                // Metering (per-request records) is not built yet: the counters are honestly zero.
                let body = serde_json::json!({
                    "object": "usage",
                    "key": {"name": key.name, "group": key.group},
                    "balance": key.balance_nanos as f64 / 1e9,
                    "total": {"requests": 0, "input_tokens": 0, "output_tokens": 0, "cost": 0.0},
                    "models": [],
                });
                return Ok(Outcome::Respond(LocalResponse::json(200, &body)));
            }
            Route::VideoCreate { .. } | Route::VideoGet { .. } | Route::VideoContent { .. } => {
                return self.video_route(session, &route, &key).await;
            }
            other => other.relay_protocol().ok_or_else(|| ApiError::new(ErrorKind::Internal, "unroutable request"))?,
        };

        if !self.catalog.group_allows(&key.group, protocol) {
            return Err(ApiError::new(
                ErrorKind::NotFound,
                format!("This endpoint is not available to keys of group '{}'.", key.group),
            ));
        }
        let body = self.read_body(session).await?;
        let model = match &route {
            Route::GenerateContent { model, .. } => model.clone(),
            _ => relay::body_fields(&body)?
                .model
                .filter(|m| !m.is_empty())
                .ok_or_else(|| ApiError::new(ErrorKind::BadRequest, "The 'model' field is required.").with_param("model"))?,
        };
        let candidates = self
            .catalog
            .candidates(protocol, &model)
            .filter(|_| self.catalog.group_allows(&key.group, protocol))
            .ok_or_else(|| {
                ApiError::new(
                    ErrorKind::ModelNotFound,
                    format!("The model '{model}' does not exist or is not available to this key. See the model list."),
                )
                .with_param("model")
            })?
            .to_vec();
        Ok(Outcome::Relay(Arc::new(RelayPlan {
            route,
            protocol,
            model,
            candidates,
            body,
            client_version: version,
            key,
        })))
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
                let task = svc.create(key, &body, idem.as_deref()).await?;
                Ok(Outcome::Respond(LocalResponse::json(200, &task.to_json(true, *legacy))))
            }
            Route::VideoGet { id, legacy } => {
                let task = svc.get(key, id).await?;
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
        let too_large = || {
            ApiError::new(
                ErrorKind::PayloadTooLarge,
                format!("The request body exceeds the limit of {limit} bytes."),
            )
        };
        let declared = header_str(session.req_header(), "content-length").and_then(|v| v.trim().parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit as u64) {
            return Err(too_large());
        }
        // The checks passed: tell a client that waits for it (curl does above 1 MiB) to send.
        let expects_continue = header_str(session.req_header(), "expect")
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("100-continue"));
        if expects_continue {
            let write = async {
                let continue_header = ResponseHeader::build(100, Some(0))?;
                session.write_response_header(Box::new(continue_header), false).await
            };
            write.await.map_err(|e| {
                ApiError::new(ErrorKind::BadRequest, format!("The request body could not be read: {}", e.etype().as_str()))
            })?;
        }
        let mut chunks: Vec<Bytes> = Vec::new();
        let mut total = 0usize;
        loop {
            let chunk = session.read_request_body().await.map_err(|e| {
                ApiError::new(ErrorKind::BadRequest, format!("The request body could not be read: {}", e.etype().as_str()))
            })?;
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
        let Some(spawner) = session.subrequest_spawner.as_ref() else {
            return Err(Error::explain(ErrorType::InternalError, "subrequests are not enabled"));
        };
        let body = plan.body.clone();
        let sub_ctx = SubrequestCtx::builder()
            .body_mode(BodyMode::ExpectBody)
            .user_ctx(Box::new(plan))
            .build();
        let (subrequest, handle) = spawner.create_subrequest(session.as_downstream(), sub_ctx);
        let input = InputBodyType::Preset(if body.is_empty() {
            InputBody::NoBody
        } else {
            InputBody::Bytes(vec![body])
        });
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

#[async_trait]
impl ProxyHttp for Gateway {
    type CTX = RequestCtx;

    fn new_ctx(&self) -> RequestCtx {
        RequestCtx::default()
    }

    fn allow_spawning_subrequest(&self, session: &Session, _ctx: &RequestCtx) -> bool {
        session.subrequest_ctx.is_none()
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RequestCtx) -> Result<bool> {
        // A relay subrequest carries its plan: go straight to the upstream.
        if let Some(plan) = session
            .subrequest_ctx
            .as_ref()
            .and_then(|c| c.user_ctx())
            .and_then(|u| u.downcast_ref::<Arc<RelayPlan>>())
        {
            ctx.shape = Some(plan.protocol);
            ctx.plan = Some(plan.clone());
            return Ok(false);
        }
        match self.decide(session, ctx).await {
            Ok(Outcome::Respond(resp)) => resp.send(session).await?,
            Ok(Outcome::Relay(plan)) => self.relay(session, plan).await?,
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
            let upstream = &self.catalog.upstreams[plan.candidates[ctx.attempt]];
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
                    self.catalog.upstreams[plan.candidates[ctx.attempt]].config.name,
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
        let upstream = &self.catalog.upstreams[plan.candidates[ctx.attempt.min(plan.candidates.len() - 1)]];
        relay::rewrite_request(upstream_request, upstream, plan.client_version.as_deref(), plan.body.len())
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
