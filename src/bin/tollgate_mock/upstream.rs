//! A mock upstream that speaks the three model protocols as the real services frame them
//! (JSON bodies and SSE streams, with usage), for tests, benchmarks and the offline demo.
//!
//! Served paths (any prefix before them is ignored, so one mock can stand in for several
//! providers told apart by their base-URL prefix):
//! `…/v1/chat/completions`, `…/v1/responses`, `…/v1/embeddings`, `…/v1/messages`,
//! `…/models/{m}:generateContent`, `…/models/{m}:streamGenerateContent`, token counting
//! (`…/v1/messages/count_tokens`, `…/models/{m}:countTokens`), generate-content embeddings, and
//! the responses API's other endpoints: a created response (unique id) is stored per path
//! prefix, i.e. per provider, and can be read, cancelled, deleted and listed
//! (`…/v1/responses/{id}[/cancel|/input_items]`) and continued (`previous_response_id`, 400 when
//! unknown to that provider) there only; `…/v1/responses/input_tokens` and `…/compact` answer.
//!
//! Agent turns: a request whose text holds `[[read:PATH]]` and that offers a file-reading or
//! shell tool (Claude Code's `Read`, Gemini CLI's `read_file`, Codex's shell tools) is answered
//! with a call of that tool reading PATH; a request that carries a tool result back is answered
//! `The tool answered: <result>`. Streamed as each service streams tool calls.
//!
//! Control headers (a client sends them through the gateway):
//! `x-mock-status: N` answer N with a mock error body; `x-mock-delay-ms: N` wait before the
//! response header; `x-mock-deltas: N` text deltas in the answer (default 3);
//! `x-mock-interval-ms: N` pause between stream events; `x-mock-hold: T` after the first stream
//! event (or after `x-mock-hold-after: N` events), wait at least one second and until
//! `POST /__mock/release?token=T`; `x-mock-cut-after: N` drop the connection after N events;
//! `x-mock-endless-event: N` answer N bytes of SSE data lines with no blank line;
//! `x-mock-error-bytes: N` pad an `x-mock-status` error's message to N bytes;
//! `x-mock-error: context_length|content_policy` answer 400 with the error the real service
//! gives for a prompt too long or refused by its content policy;
//! `x-mock-usage: IN,OUT` report these token counts (`x-mock-conform: 1`: OUT at most the
//! maximum the request names in its protocol's own field); `x-mock-no-usage: 1` report no usage at
//! all (whatever the request asked); `x-mock-tool-calls: 1` answer with a `get_weather` tool
//! call only (arguments, no text); `x-mock-cache: WRITE,READ` report prompt-cache writes
//! and reads (messages). Per provider and key: `x-mock-only: PREFIX[,PREFIX]` applies the
//! failure controls (`x-mock-status`, `x-mock-delay-ms`, `x-mock-cut-after`, `x-mock-hold`,
//! `x-mock-retry-after: N`, which adds `Retry-After` to an `x-mock-status` answer) only to
//! paths under those prefixes, `x-mock-only-key: KEY` only to requests with that upstream key,
//! `x-mock-only-model: MODEL[,MODEL]` only to requests for those models (the upstream's names).
//! `x-mock-keep-body: 1` keeps the request's body in `/__mock/requests` (a cloud call's always is).
//!
//! Introspection: `GET /__mock/requests[?tag=T]` lists the requests received (headers, path,
//! body length, model; tag from `x-test-tag`). The mock demands its own upstream key (one of
//! them: `--key a,b`) in the protocol's credential header and answers 401 otherwise. The
//! OpenAI API's images, audio and moderations endpoints are `media`'s.

use async_trait::async_trait;
use bytes::Bytes;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::{Error, ErrorType, Result};
use pingora_http::{RequestHeader, ResponseHeader};
use pingora_proxy::{ProxyHttp, Session};
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

use crate::agent::*;
use crate::bodies::*;
use crate::cloud::{CloudCall, CloudMock};
use crate::tc::*;
use crate::wire::*;

const MAX_RECORDS: usize = 2000;
const HOLD_CAP: Duration = Duration::from_secs(30);

/// One request as the mock saw it.
#[derive(Debug, Clone, Serialize)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub query: Option<String>,
    pub headers: BTreeMap<String, Vec<String>>,
    pub body_len: usize,
    pub model: Option<String>,
    pub tag: Option<String>,
    /// The request's `stream_options` (chat completions), as received.
    pub stream_options: Option<Value>,
    /// The request asked for a stream (`"stream": true`, or `:streamGenerateContent`).
    pub stream: bool,
    /// The output maximum the request named, in whichever protocol field.
    pub max_output: Option<u64>,
    /// A cloud endpoint's request body (its signature is recomputed from it by the tests).
    pub body: Option<String>,
}

/// The output maximum a request names in its own protocol's field.
fn own_max_output(kind: Kind, v: &Value) -> Option<u64> {
    let fields: &[&str] = match kind {
        Kind::Chat => &["/max_completion_tokens", "/max_tokens"],
        Kind::Responses => &["/max_output_tokens"],
        Kind::Messages => &["/max_tokens"],
        Kind::Generate { .. } => &["/generationConfig/maxOutputTokens"],
        _ => &[],
    };
    fields.iter().find_map(|p| v.pointer(p).and_then(Value::as_u64))
}

/// The output maximum a request body names (`max_tokens`, `max_completion_tokens`,
/// `max_output_tokens`, `generationConfig.maxOutputTokens`).
fn max_output_of(v: &Value) -> Option<u64> {
    ["/max_tokens", "/max_completion_tokens", "/max_output_tokens", "/generationConfig/maxOutputTokens"]
        .iter()
        .find_map(|p| v.pointer(p).and_then(Value::as_u64))
}

/// A request's headers as recorded (each name with its values).
fn headers_of(req: &RequestHeader) -> BTreeMap<String, Vec<String>> {
    let mut headers: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (k, v) in req.headers.iter() {
        headers.entry(k.as_str().to_string()).or_default().push(String::from_utf8_lossy(v.as_bytes()).into_owned());
    }
    headers
}

impl Recorded {
    /// A request of the media and realtime endpoints, as recorded (no chat fields).
    fn of(req: &RequestHeader, body_len: usize, model: Option<&str>, stream: bool, body: Option<String>) -> Recorded {
        Recorded {
            method: req.method.to_string(),
            path: req.uri.path().to_string(),
            query: req.uri.query().map(str::to_string),
            headers: headers_of(req),
            body_len,
            model: model.map(str::to_string),
            tag: header(req, "x-test-tag").map(str::to_string),
            stream_options: None,
            stream,
            max_output: None,
            body,
        }
    }
}

/// The 401 of a request without the mock's key.
async fn unauthorized(session: &mut Session) -> Result<()> {
    let b = error_body(Kind::Chat, 401, "mock: missing or wrong upstream key");
    send(session, 401, "application/json", b.to_string().into(), &[]).await
}

/// The mock server's state.
pub struct MockUpstream {
    /// The key (or comma-separated keys) a request must carry in its protocol's credential header.
    pub upstream_key: String,
    records: Mutex<Vec<Recorded>>,
    holds: Mutex<HashMap<String, Arc<Notify>>>,
    tc: TcMock,
    /// Stored responses by (path prefix, i.e. provider; id): the object and its input items.
    responses: Mutex<HashMap<(String, String), (Value, Value)>>,
    next_id: std::sync::atomic::AtomicU64,
    /// Bedrock, Vertex AI and Azure OpenAI (see `cloud`).
    cloud: CloudMock,
    /// Files and batches (see `batches`).
    batches: crate::batches::BatchMock,
    /// An MCP server (see `mcp`).
    mcp: crate::mcp::McpMock,
    /// An OpenID Connect provider for the demo (see `oidc`).
    oidc: crate::oidc::Oidc,
}

impl MockUpstream {
    pub fn new(
        upstream_key: impl Into<String>,
        tc_secret_id: impl Into<String>,
        tc_secret_key: impl Into<String>,
        cloud: CloudMock,
    ) -> Self {
        MockUpstream {
            cloud,
            batches: Default::default(),
            mcp: Default::default(),
            oidc: crate::oidc::Oidc::new(),
            upstream_key: upstream_key.into(),
            records: Mutex::new(Vec::new()),
            holds: Mutex::new(HashMap::new()),
            responses: Mutex::new(HashMap::new()),
            next_id: std::sync::atomic::AtomicU64::new(1),
            tc: TcMock {
                secret_id: tc_secret_id.into(),
                secret_key: tc_secret_key.into(),
                jobs: Mutex::new(HashMap::new()),
                calls: Mutex::new(Vec::new()),
                throttled: Mutex::new(Default::default()),
            },
        }
    }

    fn hold(&self, token: &str) -> Arc<Notify> {
        let mut holds = self.holds.lock().unwrap_or_else(|p| p.into_inner());
        holds.entry(token.to_string()).or_insert_with(|| Arc::new(Notify::new())).clone()
    }

    fn record(&self, r: Recorded) {
        let mut records = self.records.lock().unwrap_or_else(|p| p.into_inner());
        if records.len() >= MAX_RECORDS {
            records.remove(0);
        }
        records.push(r);
    }

    fn records(&self, tag: Option<&str>) -> Vec<Recorded> {
        let records = self.records.lock().unwrap_or_else(|p| p.into_inner());
        records.iter().filter(|r| tag.is_none() || r.tag.as_deref() == tag).cloned().collect()
    }

    /// The upstream key a request presents in its protocol's credential header.
    fn presented_key(kind: Kind, req: &RequestHeader) -> Option<&str> {
        match kind {
            Kind::Messages => header(req, "x-api-key"),
            Kind::Generate { .. } => header(req, "x-goog-api-key"),
            _ => header(req, "authorization").and_then(|v| v.strip_prefix("Bearer ")),
        }
    }

    /// Whether the request carries one of the mock's keys (`--key` takes a comma-separated pool).
    fn credential_ok(&self, kind: Kind, req: &RequestHeader) -> bool {
        Self::presented_key(kind, req).is_some_and(|k| self.upstream_key.split(',').any(|mine| mine == k))
    }
}

fn kind_of(path: &str) -> Option<Kind> {
    if path.ends_with("/v1/chat/completions") {
        Some(Kind::Chat)
    } else if path.ends_with("/v1/responses") {
        Some(Kind::Responses)
    } else if path.ends_with("/v1/embeddings") {
        Some(Kind::Embeddings)
    } else if path.ends_with("/v1/messages") {
        Some(Kind::Messages)
    } else if path.contains("/models/") && path.ends_with(":streamGenerateContent") {
        Some(Kind::Generate { stream: true })
    } else if path.contains("/models/") && path.ends_with(":generateContent") {
        Some(Kind::Generate { stream: false })
    } else {
        None
    }
}

fn error_body(kind: Kind, status: u16, message: &str) -> Value {
    match kind {
        Kind::Messages => json!({"type": "error", "error": {"type": "mock_error", "message": message}}),
        Kind::Generate { .. } => json!({"error": {"code": status, "message": message, "status": "MOCK"}}),
        _ => json!({"error": {"message": message, "type": "mock_error", "param": null, "code": "mock"}}),
    }
}

/// A price feed for the demo (`price_feed` in docs/selling.md): a few entries of LiteLLM's
/// `model_prices_and_context_window.json`, in its shape and with its values (litellm 1.110.2).
const PRICE_TABLE_PATH: &str = "/prices/model_prices_and_context_window.json";
const PRICE_TABLE: &str = r#"{
  "gpt-4o": {"input_cost_per_token": 2.5e-06, "output_cost_per_token": 1e-05, "cache_read_input_token_cost": 1.25e-06, "max_output_tokens": 16384, "litellm_provider": "openai", "mode": "chat"},
  "gpt-4o-mini": {"input_cost_per_token": 1.5e-07, "output_cost_per_token": 6e-07, "cache_read_input_token_cost": 7.5e-08, "max_output_tokens": 16384, "litellm_provider": "openai", "mode": "chat"},
  "claude-sonnet-4-5": {"input_cost_per_token": 3e-06, "output_cost_per_token": 1.5e-05, "cache_read_input_token_cost": 3e-07, "cache_creation_input_token_cost": 3.75e-06, "max_output_tokens": 64000, "litellm_provider": "anthropic", "mode": "chat"},
  "whisper-1": {"input_cost_per_second": 0.0001, "output_cost_per_second": 0.0001, "litellm_provider": "openai", "mode": "audio_transcription"}
}"#;

impl MockUpstream {
    /// The demo OpenID Connect provider (see `oidc`), the clouds' token endpoints (see
    /// `cloud`) and the demo's price feed, when the request is for one of them.
    async fn token_endpoints(&self, session: &mut Session, req: &RequestHeader, query: &str, body: &[u8]) -> Option<Result<()>> {
        let path = req.uri.path();
        if path == PRICE_TABLE_PATH {
            return Some(send(session, 200, "application/json", PRICE_TABLE.into(), &[]).await);
        }
        if crate::oidc::handles(path) {
            let host = header(req, "host").unwrap_or("127.0.0.1:9100");
            let (status, ctype, text, headers) = self.oidc.answer(host, req.method.as_str(), path, query, body);
            let extra: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            return Some(send(session, status, ctype, text.into(), &extra).await);
        }
        let (status, answer) = self.cloud.token_endpoint(path, body)?;
        Some(send(session, status, "application/json", answer.to_string().into(), &[]).await)
    }

    async fn answer(&self, session: &mut Session) -> Result<()> {
        let req = session.req_header().clone();
        let path = req.uri.path().to_string();
        let query = req.uri.query().map(str::to_string);

        if path.starts_with("/__mock/") {
            return self.introspect(session, &req, &path, query.as_deref()).await;
        }
        if crate::realtime::is_upgrade(&req, &path) {
            return self.realtime(session, &req).await;
        }

        let mut body = Vec::new();
        while let Some(chunk) = session.read_request_body().await? {
            body.extend_from_slice(&chunk);
        }
        if let Some(answered) = self.token_endpoints(session, &req, query.as_deref().unwrap_or_default(), &body).await {
            return answered;
        }
        if let Some(endpoint) = crate::media::endpoint(&path) {
            return self.media(session, &req, endpoint, body).await;
        }
        if let Some(answered) = self.services(session, &req, &path, &mut body).await {
            return answered;
        }
        let cloud = crate::cloud::classify(&path, query.as_deref());
        if let Some(action) = header(&req, "x-tc-action") {
            return self.tc_answer(session, &req, action.to_string(), &body).await;
        }
        // Converse: checked as Bedrock checks it, then answered as a messages request.
        let parsed = match crate::cloud::as_messages(cloud.as_ref(), serde_json::from_slice(&body).unwrap_or(Value::Null)) {
            Ok(parsed) => parsed,
            Err(refusal) => return refuse(session, refusal).await,
        };
        let headers = headers_of(&req);
        if path.contains("/v1/responses/")
            && self.stored_response(session, &req, &path, query.as_deref(), headers.clone(), &parsed, body.len()).await?
        {
            return Ok(());
        }
        // Token counting (`/v1/messages/count_tokens`, `…/models/{m}:countTokens`): the
        // protocol's credential, errors and answer shape, no generation.
        let counting = if cloud.as_ref().is_some_and(CloudCall::counts) {
            Some(Kind::Generate { stream: false })
        } else if path.ends_with("/v1/messages/count_tokens") {
            Some(Kind::Messages)
        } else if path.contains("/models/") && path.ends_with(":countTokens") {
            Some(Kind::Generate { stream: false })
        } else {
            None
        };
        let embedding = path.contains("/models/") && (path.ends_with(":embedContent") || path.ends_with(":batchEmbedContents"));
        let kind = counting.or(cloud.as_ref().map(CloudCall::kind));
        let Some(kind) = kind.or(embedding.then_some(Kind::Generate { stream: false })).or_else(|| kind_of(&path)) else {
            return send(session, 404, "application/json", Bytes::from_static(b"{\"error\":\"mock: unknown path\"}"), &[]).await;
        };
        let model = cloud.as_ref().and_then(CloudCall::model).or_else(|| match kind {
            Kind::Generate { .. } => path.rsplit_once("/models/").and_then(|(_, rest)| rest.split_once(':')).map(|(m, _)| m.to_string()),
            _ => parsed.get("model").and_then(Value::as_str).map(str::to_string),
        });
        self.record(Recorded {
            method: req.method.to_string(),
            path: path.clone(),
            query: query.clone(),
            headers,
            body_len: body.len(),
            model: model.clone(),
            tag: header(&req, "x-test-tag").map(str::to_string),
            stream_options: parsed.get("stream_options").cloned(),
            max_output: max_output_of(&parsed),
            stream: cloud
                .as_ref()
                .and_then(CloudCall::stream)
                .unwrap_or(kind == Kind::Generate { stream: true } || parsed.get("stream").and_then(Value::as_bool) == Some(true)),
            body: (cloud.is_some() || header(&req, "x-mock-keep-body").is_some()).then(|| String::from_utf8_lossy(&body).into_owned()),
        });

        let refused = match &cloud {
            Some(c) => self.cloud_refusal(c, kind, &req, &body, &parsed).err(),
            None => (!self.credential_ok(kind, &req)).then(|| (401, error_body(kind, 401, "mock: missing or wrong upstream key"), vec![])),
        };
        if let Some(refusal) = refused {
            return refuse(session, refusal).await;
        }
        // Failure controls apply only to the provider (`x-mock-only: PREFIX,…`) and the key
        // (`x-mock-only-key: KEY`) they name, when named.
        let applies = header(&req, "x-mock-only").is_none_or(|only| only.split(',').any(|p| path.starts_with(p.trim())))
            && header(&req, "x-mock-only-key").is_none_or(|k| Self::presented_key(kind, &req) == Some(k))
            && header(&req, "x-mock-only-model").is_none_or(|only| only.split(',').any(|m| model.as_deref() == Some(m.trim())));
        let ctl = |name: &str| if applies { header(&req, name) } else { None };
        let ctl_num = |name: &str| ctl(name).and_then(|v| v.trim().parse::<u64>().ok());
        if let Some(ms) = ctl_num("x-mock-delay-ms") {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        if let Some(total) = ctl_num("x-mock-endless-event") {
            return endless_event(session, total).await;
        }
        let bedrock = matches!(cloud, Some(CloudCall::Bedrock { .. } | CloudCall::Converse { .. }));
        let azure = matches!(cloud, Some(CloudCall::Azure { .. }));
        let asked = (ctl("x-mock-error"), ctl_num("x-mock-status"), ctl_num("x-mock-error-bytes"), ctl("x-mock-retry-after"));
        if let Some((status, b, headers)) = controlled_error(kind, (bedrock, azure), asked) {
            let extra: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            return send(session, status, "application/json", b.to_string().into(), &extra).await;
        }

        if let Some(answer) = counted_or_embedded(kind, counting.is_some(), embedding, &req, &parsed, body.len()) {
            return send(session, 200, "application/json", answer.to_string().into(), &[]).await;
        }
        let (mut tool, reply) = agent_turn(kind, &parsed, &body);
        if header(&req, "x-mock-tool-calls").is_some() {
            tool = Some(ToolCall { name: "get_weather".into(), args: TOOL_ARGS.concat() });
        }
        let prefix = path.split("/v1/").next().unwrap_or_default().to_string();
        if let Some(b) = self.unknown_previous(kind, &prefix, &parsed) {
            return send(session, 400, "application/json", b.to_string().into(), &[]).await;
        }
        let mut call = self.call_of(kind, model, &req, &parsed, body.len(), query.as_deref(), applies, tool, reply);
        if let Some(stream) = cloud.as_ref().and_then(CloudCall::stream) {
            call.stream = stream;
        }
        if matches!(cloud, Some(CloudCall::Bedrock { .. } | CloudCall::Converse { .. })) {
            call.bedrock = Some(ctl_num("x-mock-bedrock-exception").map(|n| n as usize));
            call.converse = matches!(cloud, Some(CloudCall::Converse { .. }));
        }
        if kind == Kind::Responses && parsed.get("store").and_then(Value::as_bool) != Some(false) {
            self.store_response(prefix, &call, &parsed);
        }
        self.deliver(session, &call).await
    }

    /// The OpenAI API's media endpoints (`media`): recorded with what the upstream received,
    /// the credential and `x-mock-status` checked, then answered.
    async fn media(&self, session: &mut Session, req: &RequestHeader, endpoint: &str, body: Vec<u8>) -> Result<()> {
        let body_len = body.len();
        let Some(fields) = crate::media::read(req, body).await else {
            let b = json!({"error": {"message": "mock: the body cannot be read", "type": "invalid_request_error"}});
            return send(session, 400, "application/json", b.to_string().into(), &[]).await;
        };
        self.record(Recorded::of(req, body_len, fields.model(), fields.streamed(), Some(fields.recorded().to_string())));
        if !self.credential_ok(Kind::Chat, req) {
            return unauthorized(session).await;
        }
        let applies = header(req, "x-mock-only").is_none_or(|only| only.split(',').any(|p| req.uri.path().starts_with(p.trim())));
        if let Some(status) = num(req, "x-mock-status").and_then(|s| u16::try_from(s).ok()).filter(|_| applies) {
            let b = error_body(Kind::Chat, status, &format!("mock says {status}"));
            return send(session, status, "application/json", b.to_string().into(), &[]).await;
        }
        let hold = header(req, "x-mock-hold").map(|token| self.hold(token));
        crate::media::answer(session, req, endpoint, &fields, hold).await
    }

    /// The mock's services at their own paths — Bedrock Guardrails, the MCP server, the batch API —, answered;
    /// None for any other path.
    async fn services(&self, session: &mut Session, req: &RequestHeader, path: &str, body: &mut Vec<u8>) -> Option<Result<()>> {
        if let Some(id) = crate::cloud::guardrail_path(path) {
            self.record(Recorded::of(req, body.len(), None, false, Some(String::from_utf8_lossy(body).into_owned())));
            let answer = self.cloud.check_sigv4(req, body).and_then(|()| crate::cloud::apply_guardrail(&id, body));
            return Some(match answer {
                Ok(v) => send(session, 200, "application/json", v.to_string().into(), &[]).await,
                Err(refusal) => refuse(session, refusal).await,
            });
        }
        if crate::mcp::is_mcp(path) {
            self.record(Recorded::of(req, body.len(), None, false, Some(String::from_utf8_lossy(body).into_owned())));
            return Some(self.mcp.answer(session, req, body).await);
        }
        let op = crate::batches::op(req.method.as_str(), path)?;
        Some(self.batch_api(session, req, op, std::mem::take(body)).await)
    }

    /// The batch API (`batches`): recorded (an upload with its file's text), its credential
    /// checked, then answered.
    async fn batch_api(&self, session: &mut Session, req: &RequestHeader, op: crate::batches::Op, body: Vec<u8>) -> Result<()> {
        let text =
            matches!(op, crate::batches::Op::Upload | crate::batches::Op::Create).then(|| String::from_utf8_lossy(&body).into_owned());
        self.record(Recorded::of(req, body.len(), None, false, text));
        if !self.credential_ok(Kind::Chat, req) {
            return unauthorized(session).await;
        }
        self.batches.answer(session, req, op, body).await
    }

    /// A realtime session (`realtime`): the upgrade recorded (its headers: which key it carried),
    /// its credential checked, then the scripted session.
    async fn realtime(&self, session: &mut Session, req: &RequestHeader) -> Result<()> {
        let model = req.uri.query().and_then(|q| q.split('&').find_map(|p| p.strip_prefix("model=")));
        self.record(Recorded::of(req, 0, model, true, None));
        if !self.credential_ok(Kind::Chat, req) {
            return unauthorized(session).await;
        }
        crate::realtime::session(session, req).await
    }

    /// The video service's answer to one of its actions.
    async fn tc_answer(&self, session: &mut Session, req: &RequestHeader, action: String, body: &[u8]) -> Result<()> {
        let answer = self.tc.call(req, &action, body);
        // `[slow-submit]`: the job is created, the answer comes after 3 s (a client with a
        // shorter timeout never learns the job id).
        if action.starts_with("Submit") && String::from_utf8_lossy(body).contains("[slow-submit]") {
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        send(session, 200, "application/json", answer.to_string().into(), &[]).await
    }

    /// The answer of a call: streamed, or whole (Bedrock's with its clock in `Date`).
    async fn deliver(&self, session: &mut Session, call: &Call) -> Result<()> {
        if call.stream {
            return self.stream(session, call).await;
        }
        let b = if call.converse { crate::cloud::converse_whole(&whole_body(call)) } else { whole_body(call) }.to_string();
        let date = httpdate::fmt_http_date(self.cloud.aws_now());
        let extra: &[(&str, &str)] = if call.bedrock.is_some() { &[("date", date.as_str())] } else { &[] };
        send(session, 200, "application/json", b.into(), extra).await
    }

    /// A responses-API turn continuing a response this provider never stored: its 400 body.
    fn unknown_previous(&self, kind: Kind, prefix: &str, parsed: &Value) -> Option<Value> {
        let previous = parsed.get("previous_response_id").and_then(Value::as_str).filter(|_| kind == Kind::Responses)?;
        (!self.responses().contains_key(&(prefix.to_string(), previous.to_string()))).then(|| {
            json!({"error": {"message": format!("Previous response with id '{previous}' not found."),
                "type": "invalid_request_error", "param": "previous_response_id", "code": "previous_response_not_found"}})
        })
    }

    /// A cloud's own checks of a request: its signature or token, its URL, its body.
    fn cloud_refusal(
        &self,
        c: &CloudCall,
        kind: Kind,
        req: &RequestHeader,
        body: &[u8],
        parsed: &Value,
    ) -> std::result::Result<(), crate::cloud::Refusal> {
        match c {
            CloudCall::Bedrock { .. } | CloudCall::Converse { .. } => self.cloud.check_sigv4(req, body)?,
            CloudCall::VertexGoogle { .. } | CloudCall::VertexAnthropic { .. } if !self.cloud.token_ok(req) => {
                let b = json!({"error": {"code": 401, "message": "Request had invalid authentication credentials. Expected OAuth 2 access token.", "status": "UNAUTHENTICATED"}});
                return Err((401, b, vec![]));
            }
            CloudCall::Azure { .. } => {
                let key_ok = header(req, "api-key").is_some_and(|k| self.upstream_key.split(',').any(|mine| mine == k));
                if !key_ok && !self.cloud.token_ok(req) {
                    let b = json!({"error": {"code": "401", "message": "Access denied due to invalid subscription key or wrong API endpoint."}});
                    return Err((401, b, vec![]));
                }
            }
            _ => {}
        }
        if let Some(why) = crate::cloud::messages_body_refused(c, parsed) {
            let b = match c {
                CloudCall::Bedrock { .. } => crate::cloud::bedrock_error(400, &why).0,
                _ => error_body(kind, 400, &why),
            };
            return Err((400, b, vec![]));
        }
        Ok(())
    }

    /// A stored response's endpoints (`…/v1/responses/{id}[/…]`): recorded, and answered
    /// from the responses this provider stored. False: not one of them (a create goes on).
    #[allow(clippy::too_many_arguments)]
    async fn stored_response(
        &self,
        session: &mut Session,
        req: &RequestHeader,
        path: &str,
        query: Option<&str>,
        headers: BTreeMap<String, Vec<String>>,
        parsed: &Value,
        body_len: usize,
    ) -> Result<bool> {
        self.record(Recorded {
            method: req.method.to_string(),
            path: path.to_string(),
            query: query.map(str::to_string),
            headers,
            body_len,
            model: parsed.get("model").and_then(Value::as_str).map(str::to_string),
            tag: header(req, "x-test-tag").map(str::to_string),
            stream_options: None,
            stream: false,
            max_output: max_output_of(parsed),
            body: None,
        });
        if !self.credential_ok(Kind::Responses, req) {
            let b = error_body(Kind::Responses, 401, "mock: missing or wrong upstream key").to_string();
            send(session, 401, "application/json", b.into(), &[]).await?;
            return Ok(true);
        }
        if let Some((status, answer)) = self.responses_api(req.method.as_str(), path, body_len) {
            send(session, status, "application/json", answer.to_string().into(), &[]).await?;
            return Ok(true);
        }
        Ok(false)
    }

    /// `/__mock/…`: the requests received, releasing a hold, the video service's calls and
    /// its downloads.
    async fn introspect(&self, session: &mut Session, req: &RequestHeader, path: &str, query: Option<&str>) -> Result<()> {
        if path == "/__mock/requests" {
            let tag = query.and_then(|q| q.strip_prefix("tag="));
            let body = serde_json::to_vec(&self.records(tag)).unwrap_or_default();
            return send(session, 200, "application/json", body.into(), &[]).await;
        }
        if path == "/__mock/release" {
            if let Some(token) = query.and_then(|q| q.strip_prefix("token=")) {
                self.hold(token).notify_one();
                self.tc.release(token);
            }
            return send(session, 200, "application/json", Bytes::from_static(b"{}"), &[]).await;
        }
        if path == "/__mock/tokens" {
            return send(session, 200, "application/json", self.cloud.token_requests().to_string().into(), &[]).await;
        }
        if path == "/__mock/token_fail" {
            let n = query.and_then(|q| q.strip_prefix("n=")).and_then(|n| n.parse().ok()).unwrap_or(1);
            self.cloud.fail_next_tokens(n);
            return send(session, 200, "application/json", Bytes::from_static(b"{}"), &[]).await;
        }
        if path == "/__mock/tc_calls" {
            let calls = self.tc.calls.lock().unwrap_or_else(|p| p.into_inner()).clone();
            return send(session, 200, "application/json", Value::Array(calls).to_string().into(), &[]).await;
        }
        if let Some(file) = path.strip_prefix("/__mock/video/") {
            return self.tc.serve_video(session, req, file, false).await;
        }
        if let Some(file) = path.strip_prefix("/__mock/expired/") {
            return self.tc.serve_video(session, req, file, true).await;
        }
        send(session, 404, "application/json", Bytes::from_static(b"{\"error\":\"mock: unknown path\"}"), &[]).await
    }

    /// The call a request asks for, as the mock reads it (with the failure controls that
    /// `applies` lets through).
    #[allow(clippy::too_many_arguments)]
    fn call_of(
        &self,
        kind: Kind,
        model: Option<String>,
        req: &RequestHeader,
        parsed: &Value,
        body_len: usize,
        query: Option<&str>,
        applies: bool,
        tool: Option<ToolCall>,
        reply: Option<String>,
    ) -> Call {
        let ctl = |req: &RequestHeader, name: &str| if applies { header(req, name).map(str::to_string) } else { None };
        let ctl_num = |req: &RequestHeader, name: &str| ctl(req, name).and_then(|v| v.trim().parse::<u64>().ok());
        Call {
            kind,
            model: model.unwrap_or_else(|| "unknown".into()),
            stream: match kind {
                Kind::Generate { stream } => stream,
                _ => parsed.get("stream").and_then(Value::as_bool).unwrap_or(false),
            },
            include_usage: parsed.pointer("/stream_options/include_usage").and_then(Value::as_bool).unwrap_or(false)
                && header(req, "x-mock-no-usage").is_none(),
            input_tokens: pair(req, "x-mock-usage").map_or((body_len as u64).div_ceil(4).max(1), |(i, _)| i),
            // `x-mock-conform: 1`: the output ends at the maximum the request names in its own
            // protocol's field, as a conforming upstream's does (a field of another protocol is
            // ignored, as the real services ignore or refuse it).
            output_tokens: pair(req, "x-mock-usage").map(|(_, o)| match header(req, "x-mock-conform") {
                Some(_) => own_max_output(kind, parsed).map_or(o, |max| o.min(max)),
                None => o,
            }),
            // A field mask (query `fields` / `$fields`, or `X-Goog-FieldMask`) that does not
            // name usage removes it, as the real service does.
            no_usage: header(req, "x-mock-no-usage").is_some()
                || header(req, "x-goog-fieldmask").is_some()
                || query.is_some_and(|q| {
                    q.split('&').any(|p| p.starts_with("fields=") || p.starts_with("$fields=") || p.starts_with("%24fields="))
                }),
            tool,
            pieces: reply.as_ref().and(echo_pieces(parsed)),
            reply,
            response_id: format!("resp_mock_{}", self.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed)),
            cache: pair(req, "x-mock-cache"),
            deltas: num(req, "x-mock-deltas").unwrap_or(3) as usize,
            interval: Duration::from_millis(num(req, "x-mock-interval-ms").unwrap_or(0)),
            hold: ctl(req, "x-mock-hold"),
            hold_after: num(req, "x-mock-hold-after").unwrap_or(1).max(1) as usize,
            cut_after: ctl_num(req, "x-mock-cut-after").map(|n| n as usize),
            embed_inputs: match parsed.get("input") {
                Some(Value::Array(items)) => items.len().max(1),
                _ => 1,
            },
            embed_base64: parsed.get("encoding_format").and_then(Value::as_str) == Some("base64"),
            gemini_sse: query.is_some_and(|q| q.split('&').any(|p| p == "alt=sse")),
            bedrock: None,
            converse: false,
        }
    }

    /// A created response, stored as the service stores it: readable by id later (at this
    /// provider only).
    fn store_response(&self, prefix: String, call: &Call, parsed: &Value) {
        let mut object = whole_body(call);
        object["store"] = json!(true);
        let items = match parsed.get("input") {
            Some(Value::String(text)) => {
                json!([{"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}])
            }
            Some(items @ Value::Array(_)) => items.clone(),
            _ => json!([]),
        };
        self.responses().insert((prefix, call.response_id.clone()), (object, items));
    }

    fn responses(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), (Value, Value)>> {
        self.responses.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The responses API beyond creation: stored responses (`GET`/`DELETE …/responses/{id}`,
    /// `…/cancel`, `…/input_items`), counting input tokens and compaction. None when `path` is
    /// not one of these.
    fn responses_api(&self, method: &str, path: &str, body_len: usize) -> Option<(u16, Value)> {
        let (prefix, tail) = path.split_once("/v1/responses/")?;
        let key = |id: &str| (prefix.to_string(), id.to_string());
        let missing = |id: &str| {
            (
                404,
                json!({"error": {"message": format!("Response with id '{id}' not found."), "type": "invalid_request_error", "param": null, "code": null}}),
            )
        };
        let tokens = (body_len as u64).div_ceil(4).max(1);
        Some(match (method, tail) {
            ("POST", "input_tokens") => (200, json!({"object": "response.input_tokens", "input_tokens": tokens})),
            ("POST", "compact") => (
                200,
                json!({"id": format!("cmp_mock_{}", self.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed)),
                    "object": "response.compaction", "created_at": now(),
                    "output": [{"type": "compaction", "id": "cmp_item_mock", "encrypted_content": "bW9jaw=="}],
                    "usage": {"input_tokens": tokens, "input_tokens_details": {"cached_tokens": 0},
                              "output_tokens": 7, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": tokens + 7}}),
            ),
            ("POST", _) => {
                let id = tail.strip_suffix("/cancel")?;
                match self.responses().get_mut(&key(id)) {
                    Some((object, _)) => {
                        object["status"] = json!("cancelled");
                        (200, object.clone())
                    }
                    None => missing(id),
                }
            }
            ("GET", _) => match tail.strip_suffix("/input_items") {
                Some(id) => match self.responses().get(&key(id)) {
                    Some((_, Value::Array(items))) => (
                        200,
                        json!({"object": "list", "data": items, "has_more": false,
                        "first_id": items.first().and_then(|i| i.get("id")).cloned().unwrap_or(Value::Null),
                        "last_id": items.last().and_then(|i| i.get("id")).cloned().unwrap_or(Value::Null)}),
                    ),
                    _ => missing(id),
                },
                None => match self.responses().get(&key(tail)) {
                    Some((object, _)) => (200, object.clone()),
                    None => missing(tail),
                },
            },
            ("DELETE", _) => match self.responses().remove(&key(tail)) {
                Some(_) => (200, json!({"id": tail, "object": "response", "deleted": true})),
                None => missing(tail),
            },
            _ => return None,
        })
    }

    async fn stream(&self, session: &mut Session, call: &Call) -> Result<()> {
        let mut events: Vec<Bytes> = stream_events(call).into_iter().map(Bytes::from).collect();
        let mut ctype =
            if matches!(call.kind, Kind::Generate { .. }) && !call.gemini_sse { "application/json" } else { "text/event-stream" };
        let mut h = ResponseHeader::build(200, Some(3))?;
        if let Some(exception_after) = call.bedrock {
            // Bedrock's framing: each event in an event-stream frame (and an exception frame
            // where asked).
            let text: Vec<String> = events.iter().map(|e| String::from_utf8_lossy(e).into_owned()).collect();
            let (input, output) = (call.input_tokens, call.output_tokens.unwrap_or(call.deltas as u64));
            let frames = if call.converse {
                crate::cloud::converse_frames(&text, input, output)
            } else {
                crate::cloud::event_stream_frames(&text, input, output)
            };
            events = frames.into_iter().map(Bytes::from).collect();
            if let Some(n) = exception_after {
                events.truncate(n);
                events.push(Bytes::from(crate::cloud::exception_frame("modelStreamErrorException", "The model stream failed (mock).")));
            }
            ctype = "application/vnd.amazon.eventstream";
            h.insert_header("date", httpdate::fmt_http_date(self.cloud.aws_now()))?;
        }
        h.insert_header("content-type", ctype)?;
        h.insert_header("cache-control", "no-cache")?;
        // Framed as the services frame a stream: chunked, so a cut (no last chunk) shows as one.
        h.insert_header("transfer-encoding", "chunked")?;
        service_headers(&mut h)?;
        session.write_response_header(Box::new(h), false).await?;
        let count = events.len();
        for (i, event) in events.into_iter().enumerate() {
            session.write_response_body(Some(event), false).await?;
            if call.cut_after == Some(i + 1) {
                return Err(Error::explain(ErrorType::WriteError, "mock: connection cut on request"));
            }
            if i + 1 == call.hold_after {
                if let Some(token) = &call.hold {
                    let notify = self.hold(token);
                    let released = tokio::time::timeout(HOLD_CAP, notify.notified());
                    let (_, _) = tokio::join!(released, tokio::time::sleep(Duration::from_secs(1)));
                }
            }
            if i + 1 < count && !call.interval.is_zero() {
                tokio::time::sleep(call.interval).await;
            }
        }
        session.write_response_body(None, true).await
    }
}

#[async_trait]
impl ProxyHttp for MockUpstream {
    type CTX = ();

    fn new_ctx(&self) {}

    async fn request_filter(&self, session: &mut Session, _ctx: &mut ()) -> Result<bool> {
        self.answer(session).await?;
        Ok(true)
    }

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut ()) -> Result<Box<HttpPeer>> {
        Err(Error::explain(ErrorType::InternalError, "the mock has no upstream"))
    }
}

/// A refusal answered (status, JSON body, headers).
async fn refuse(session: &mut Session, (status, body, headers): crate::cloud::Refusal) -> Result<()> {
    let extra: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    send(session, status, "application/json", body.to_string().into(), &extra).await
}

/// An `x-mock-status` answer: the protocol's (or Bedrock's) error body and headers.
/// An error answer: its status, body and extra headers.
type Failure = (u16, Value, Vec<(&'static str, String)>);

/// The error a request's failure controls ask for: `x-mock-error` (a class), else
/// `x-mock-status` (its message padded to `x-mock-error-bytes`, with `x-mock-retry-after`).
fn controlled_error(
    kind: Kind,
    (bedrock, azure): (bool, bool),
    (class, status, pad, retry_after): (Option<&str>, Option<u64>, Option<u64>, Option<&str>),
) -> Option<Failure> {
    if let Some(failure) = class.and_then(|class| class_error(kind, class, (bedrock, azure))) {
        return Some(failure);
    }
    let status = status.and_then(|s| u16::try_from(s).ok())?;
    // `x-mock-error-bytes: N`: the message padded to N bytes (an oversized error answer).
    let pad = pad.map_or(String::new(), |n| " ".repeat(usize::try_from(n).unwrap_or(0).min(64 << 20)));
    let (b, headers) = mock_error(kind, status, &format!("mock says {status}{pad}"), retry_after, bedrock);
    Some((status, b, headers))
}

/// `x-mock-error: context_length | content_policy`: the error each kind of upstream answers
/// for a prompt too long for the model, or one its content policy refuses, as the real
/// services word them (status 400; Bedrock's with its `x-amzn-ErrorType`; Azure OpenAI's
/// `content_filter` apart from OpenAI's `content_policy_violation`).
fn class_error(kind: Kind, class: &str, (bedrock, azure): (bool, bool)) -> Option<Failure> {
    let amzn = |t: &str| vec![("x-amzn-errortype", format!("{t}:http://internal.amazon.com/coral/com.amazon.bedrock/"))];
    let (body, headers) = match (class, bedrock, kind) {
        ("context_length", true, _) => (json!({"message": "Input is too long for requested model."}), amzn("ValidationException")),
        ("content_policy", true, _) => (json!({"message": "The request was blocked by content filters."}), amzn("ValidationException")),
        ("context_length", _, Kind::Messages) => (
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "prompt is too long: 210000 tokens > 200000 maximum"}}),
            vec![],
        ),
        ("content_policy", _, Kind::Messages) => (
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "Output blocked by content filtering policy"}}),
            vec![],
        ),
        ("context_length", _, Kind::Generate { .. }) => (
            json!({"error": {"code": 400, "message": "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).", "status": "INVALID_ARGUMENT"}}),
            vec![],
        ),
        ("content_policy", _, Kind::Generate { .. }) => (
            json!({"error": {"code": 400, "message": "The request was blocked due to safety reasons.", "status": "INVALID_ARGUMENT"}}),
            vec![],
        ),
        ("context_length", _, _) => (
            json!({"error": {"message": "This model's maximum context length is 128000 tokens. However, your messages resulted in 210000 tokens.", "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}),
            vec![],
        ),
        ("content_policy", _, _) if azure => (
            json!({"error": {"message": "The response was filtered due to the prompt triggering Azure OpenAI's content management policy.", "type": null, "param": "prompt", "code": "content_filter", "status": 400}}),
            vec![],
        ),
        ("content_policy", _, _) => (
            json!({"error": {"message": "Your request was rejected as a result of our safety system.", "type": "invalid_request_error", "param": null, "code": "content_policy_violation"}}),
            vec![],
        ),
        _ => return None,
    };
    Some((400, body, headers))
}

fn mock_error(kind: Kind, status: u16, message: &str, retry_after: Option<&str>, bedrock: bool) -> (Value, Vec<(&'static str, String)>) {
    let mut headers = vec![("x-mock-error", "yes".to_string())];
    let body = if bedrock {
        let (body, amzn) = crate::cloud::bedrock_error(status, message);
        headers.push(("x-amzn-errortype", amzn));
        body
    } else {
        error_body(kind, status, message)
    };
    if let Some(after) = retry_after.filter(|a| !a.is_empty()) {
        headers.push(("retry-after", after.to_string()));
    }
    (body, headers)
}

/// `x-mock-endless-event: N`: a misbehaving stream, `N` bytes of data lines and never the
/// blank line that ends an event.
async fn endless_event(session: &mut Session, total: u64) -> Result<()> {
    let mut h = ResponseHeader::build(200, Some(3))?;
    h.insert_header("content-type", "text/event-stream")?;
    h.insert_header("transfer-encoding", "chunked")?;
    session.write_response_header(Box::new(h), false).await?;
    let line = Bytes::from(format!("data: {}\n", "x".repeat(64 * 1024 - 7)));
    let mut sent = 0u64;
    while sent < total {
        if session.write_response_body(Some(line.clone()), false).await.is_err() {
            return Ok(());
        }
        sent += line.len() as u64;
    }
    session.write_response_body(None, true).await?;
    Ok(())
}

/// Token counting and generate-content embeddings, answered without generating (no usage
/// reported for embeddings, as the service does).
fn counted_or_embedded(kind: Kind, counting: bool, embedding: bool, req: &RequestHeader, parsed: &Value, body_len: usize) -> Option<Value> {
    if embedding {
        let vector = json!({"values": [0.125, -0.5, 0.25]});
        return Some(match parsed.get("requests").and_then(Value::as_array) {
            Some(items) => json!({"embeddings": vec![vector; items.len()]}),
            None => json!({"embedding": vector}),
        });
    }
    if !counting {
        return None;
    }
    let n = pair(req, "x-mock-usage").map_or((body_len as u64).div_ceil(4).max(1), |(i, _)| i);
    Some(match kind {
        Kind::Messages => json!({"input_tokens": n}),
        _ => json!({"totalTokens": n, "promptTokensDetails": [{"modality": "TEXT", "tokenCount": n}]}),
    })
}
