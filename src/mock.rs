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
//! `x-mock-usage: IN,OUT` report these token counts (`x-mock-conform: 1`: OUT at most the
//! maximum the request names in its protocol's own field); `x-mock-no-usage: 1` report no usage at
//! all (whatever the request asked); `x-mock-tool-calls: 1` answer with a `get_weather` tool
//! call only (arguments, no text); `x-mock-cache: WRITE,READ` report prompt-cache writes
//! and reads (messages). Per provider and key: `x-mock-only: PREFIX[,PREFIX]` applies the
//! failure controls (`x-mock-status`, `x-mock-delay-ms`, `x-mock-cut-after`, `x-mock-hold`,
//! `x-mock-retry-after: N`, which adds `Retry-After` to an `x-mock-status` answer) only to
//! paths under those prefixes, `x-mock-only-key: KEY` only to requests with that upstream key.
//!
//! Introspection: `GET /__mock/requests[?tag=T]` lists the requests received (headers, path,
//! body length, model; tag from `x-test-tag`). The mock demands its own upstream key (one of
//! them: `--key a,b`) in the protocol's credential header and answers 401 otherwise.

use async_trait::async_trait;
use base64::Engine;
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

const MAX_RECORDS: usize = 2000;
const HOLD_CAP: Duration = Duration::from_secs(30);
const WORDS: [&str; 8] = ["Hello", " from", " the", " mock", " upstream", ",", " friend", "."];

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
}

/// The Tencent-Cloud-API-3.0-style video service.
///
/// `POST /` with `X-TC-Action`: every call's TC3 signature is checked against the mock's
/// secret. A job advances one step per describe: WAIT, RUN (Progress 50), DONE. Markers in the
/// Prompt steer it: `[submit-error]` refuses the submission, `[throttle-once]` answers
/// RequestLimitExceeded to the first submission, `[slow-submit]` creates the job but answers
/// the submission 3 s late, `[fail]` ends in FAIL, `[expired]` gives a
/// result URL that answers 403, `[big]` makes the result 20 MiB, `[hold:T]` stays RUN until `POST /__mock/release?token=T`.
/// `GET /__mock/tc_calls` lists the calls (action, payload); `GET /__mock/video/{job}.mp4`
/// serves the result (Range supported).
pub struct TcMock {
    pub secret_id: String,
    pub secret_key: String,
    jobs: Mutex<HashMap<String, TcJob>>,
    calls: Mutex<Vec<Value>>,
    throttled: Mutex<std::collections::HashSet<String>>,
}

#[derive(Clone)]
struct TcJob {
    prompt: String,
    describes: u32,
    released: bool,
}

/// Size of the mock result video.
pub const MOCK_VIDEO_LEN: usize = 300_000;
/// Size of the mock result of a `[big]` job (several multipart parts).
pub const MOCK_BIG_VIDEO_LEN: usize = 20 * 1024 * 1024 + 123;

/// The mock result video's bytes: an MP4 `ftyp` box, then a pattern.
pub fn mock_video_bytes() -> Vec<u8> {
    mock_video_of(MOCK_VIDEO_LEN)
}

/// A mock video of `len` bytes.
pub fn mock_video_of(len: usize) -> Vec<u8> {
    let mut v = b"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00mp42isom".to_vec();
    v.extend((v.len()..len).map(|i| (i % 251) as u8));
    v
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    Chat,
    Responses,
    Embeddings,
    Messages,
    Generate { stream: bool },
}

struct Call {
    kind: Kind,
    model: String,
    stream: bool,
    include_usage: bool,
    input_tokens: u64,
    deltas: usize,
    interval: Duration,
    hold: Option<String>,
    /// Events sent before holding (default 1).
    hold_after: usize,
    /// Close the connection after this many events, without finishing the response.
    cut_after: Option<usize>,
    embed_inputs: usize,
    embed_base64: bool,
    gemini_sse: bool,
    /// Reported output tokens (default: one per delta).
    output_tokens: Option<u64>,
    no_usage: bool,
    /// Answer with this tool call instead of text.
    tool: Option<ToolCall>,
    /// Answer with this text instead of the mock's words (an agent turn that got its tool result).
    reply: Option<String>,
    /// Responses: the id of the response being created.
    response_id: String,
    /// Prompt-cache (write, read) tokens to report.
    cache: Option<(u64, u64)>,
}

fn pair(req: &RequestHeader, name: &str) -> Option<(u64, u64)> {
    let (a, b) = header(req, name)?.split_once(',')?;
    Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
}

/// The tool call a `x-mock-tool-calls` answer makes, and its arguments in stream pieces.
const TOOL_ARGS: [&str; 4] = ["{\"city\":", " \"Paris\",", " \"unit\":", " \"celsius\"}"];

/// A tool call the mock answers with.
#[derive(Clone, Debug)]
struct ToolCall {
    name: String,
    /// The arguments as JSON text.
    args: String,
}

impl ToolCall {
    /// The arguments in about four stream pieces (cut at character boundaries).
    fn pieces(&self) -> Vec<String> {
        let chars: Vec<char> = self.args.chars().collect();
        let size = chars.len().div_ceil(4).max(1);
        chars.chunks(size).map(|c| c.iter().collect()).collect()
    }

    fn args_value(&self) -> Value {
        serde_json::from_str(&self.args).unwrap_or(Value::Null)
    }
}

/// The marker an agent test puts in its prompt: `[[read:PATH]]` asks the mock to answer with a
/// call of a file-reading (or shell) tool the request offers, reading PATH.
const READ_MARKER: &str = "[[read:";

/// Tools the mock knows how to call to read a file, in order of preference: Claude Code's,
/// Gemini CLI's, Codex's (several versions) and the generic shell tools.
const READ_TOOLS: [&str; 7] = ["Read", "read_file", "shell_command", "exec_command", "shell", "run_shell_command", "Bash"];

/// The tools a request offers, as (name, JSON schema of the arguments).
fn offered_tools(kind: Kind, v: &Value) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for tool in v.get("tools").and_then(Value::as_array).into_iter().flatten() {
        match kind {
            Kind::Messages => {
                if let Some(name) = tool.get("name").and_then(Value::as_str) {
                    out.push((name.to_string(), tool.get("input_schema").cloned().unwrap_or(Value::Null)));
                }
            }
            Kind::Generate { .. } => {
                for d in tool.get("functionDeclarations").and_then(Value::as_array).into_iter().flatten() {
                    if let Some(name) = d.get("name").and_then(Value::as_str) {
                        let schema = d.get("parametersJsonSchema").or_else(|| d.get("parameters")).cloned().unwrap_or(Value::Null);
                        out.push((name.to_string(), schema));
                    }
                }
            }
            Kind::Chat => {
                if let Some(f) = tool.get("function") {
                    if let Some(name) = f.get("name").and_then(Value::as_str) {
                        out.push((name.to_string(), f.get("parameters").cloned().unwrap_or(Value::Null)));
                    }
                }
            }
            Kind::Responses | Kind::Embeddings => {
                if tool.get("type").and_then(Value::as_str) == Some("function") {
                    if let Some(name) = tool.get("name").and_then(Value::as_str) {
                        out.push((name.to_string(), tool.get("parameters").cloned().unwrap_or(Value::Null)));
                    }
                }
            }
        }
    }
    out
}

/// Arguments that make tool `name` (with `schema`) read `path`: a property naming a path gets
/// the path; a command gets `cat PATH` (as a string or an argv array, as the schema says).
fn read_args(schema: &Value, path: &str) -> Value {
    let mut args = serde_json::Map::new();
    let props = schema.get("properties").and_then(Value::as_object);
    for (name, prop) in props.into_iter().flatten() {
        let kind = prop.get("type").and_then(Value::as_str).unwrap_or("string").to_ascii_lowercase();
        if name.contains("path") {
            args.insert(name.clone(), json!(path));
        } else if name == "command" || name == "cmd" {
            let command = if kind == "array" { json!(["cat", path]) } else { json!(format!("cat {path}")) };
            args.insert(name.clone(), command);
        }
    }
    Value::Object(args)
}

/// The text of the last tool result a request carries back, if any.
fn tool_result(kind: Kind, v: &Value) -> Option<String> {
    let text_of = |c: &Value| -> String {
        match c {
            Value::String(s) => s.clone(),
            Value::Array(parts) => parts.iter().filter_map(|p| p.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join(""),
            other => other.to_string(),
        }
    };
    let mut found = None;
    match kind {
        Kind::Messages => {
            for m in v.get("messages").and_then(Value::as_array).into_iter().flatten() {
                for block in m.get("content").and_then(Value::as_array).into_iter().flatten() {
                    if block.get("type").and_then(Value::as_str) == Some("tool_result") {
                        found = Some(block.get("content").map(text_of).unwrap_or_default());
                    }
                }
            }
        }
        Kind::Responses | Kind::Embeddings => {
            for item in v.get("input").and_then(Value::as_array).into_iter().flatten() {
                let t = item.get("type").and_then(Value::as_str).unwrap_or_default();
                if t == "function_call_output" || t == "custom_tool_call_output" {
                    found = Some(item.get("output").map(text_of).unwrap_or_default());
                }
            }
        }
        Kind::Chat => {
            for m in v.get("messages").and_then(Value::as_array).into_iter().flatten() {
                if m.get("role").and_then(Value::as_str) == Some("tool") {
                    found = Some(m.get("content").map(text_of).unwrap_or_default());
                }
            }
        }
        Kind::Generate { .. } => {
            for c in v.get("contents").and_then(Value::as_array).into_iter().flatten() {
                for part in c.get("parts").and_then(Value::as_array).into_iter().flatten() {
                    if let Some(r) = part.pointer("/functionResponse/response") {
                        found = Some(r.to_string());
                    }
                }
            }
        }
    }
    found
}

/// An agent's turn: a request carrying a tool result is answered with that result's text
/// (`The tool answered: …`); one whose prompt holds `[[read:PATH]]` and that offers a known
/// tool is answered with a call of that tool reading PATH.
fn agent_turn(kind: Kind, v: &Value, body: &[u8]) -> (Option<ToolCall>, Option<String>) {
    if let Some(result) = tool_result(kind, v) {
        let result: String = result.chars().take(4000).collect();
        return (None, Some(format!("The tool answered: {}", result.trim())));
    }
    let text = String::from_utf8_lossy(body);
    let Some(at) = text.find(READ_MARKER) else { return (None, None) };
    let rest = &text[at + READ_MARKER.len()..];
    let Some(end) = rest.find("]]") else { return (None, None) };
    let path = &rest[..end];
    let tools = offered_tools(kind, v);
    let chosen = READ_TOOLS.iter().find_map(|want| tools.iter().find(|(name, _)| name == want));
    match chosen {
        Some((name, schema)) => (Some(ToolCall { name: name.clone(), args: read_args(schema, path).to_string() }), None),
        None => (None, None),
    }
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn header<'a>(req: &'a RequestHeader, name: &str) -> Option<&'a str> {
    req.headers.get(name).and_then(|v| v.to_str().ok())
}

fn num(req: &RequestHeader, name: &str) -> Option<u64> {
    header(req, name).and_then(|v| v.trim().parse().ok())
}

impl MockUpstream {
    pub fn new(upstream_key: impl Into<String>, tc_secret_id: impl Into<String>, tc_secret_key: impl Into<String>) -> Self {
        MockUpstream {
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

/// Headers the real services send on every answer that belong to the operator's account (its
/// organisation, project, account-wide rate limits, cookies) or to the service's insides, next
/// to the ones SDKs read (request ids, processing time, `x-should-retry`).
const SERVICE_HEADERS: [(&str, &str); 11] = [
    ("x-request-id", "req_mock_0001"),
    ("request-id", "req_mock_0001"),
    ("openai-processing-ms", "12"),
    ("x-should-retry", "false"),
    ("openai-organization", "org-mock-operator"),
    ("openai-project", "proj_mock_operator"),
    ("x-ratelimit-remaining-requests", "4999"),
    ("anthropic-ratelimit-tokens-remaining", "399000"),
    ("anthropic-organization-id", "mock-operator-org"),
    ("set-cookie", "__cf_bm=mock-operator-cookie; path=/; HttpOnly"),
    ("x-envoy-upstream-service-time", "11"),
];

fn service_headers(h: &mut ResponseHeader) -> Result<()> {
    for (k, v) in SERVICE_HEADERS {
        h.append_header(k, v)?;
    }
    Ok(())
}

async fn send(session: &mut Session, status: u16, ctype: &str, body: Bytes, extra: &[(&str, &str)]) -> Result<()> {
    let mut h = ResponseHeader::build(status, Some(4 + SERVICE_HEADERS.len()))?;
    h.insert_header("content-type", ctype)?;
    h.insert_header("content-length", body.len().to_string())?;
    service_headers(&mut h)?;
    for (k, v) in extra {
        h.insert_header(k.to_string(), *v)?;
    }
    session.write_response_header(Box::new(h), false).await?;
    session.write_response_body(Some(body), true).await
}

fn text_of(deltas: usize) -> Vec<&'static str> {
    (0..deltas).map(|i| WORDS[i % WORDS.len()]).collect()
}

impl MockUpstream {
    async fn answer(&self, session: &mut Session) -> Result<()> {
        let req = session.req_header().clone();
        let path = req.uri.path().to_string();
        let query = req.uri.query().map(str::to_string);

        if path == "/__mock/requests" {
            let tag = query.as_deref().and_then(|q| q.strip_prefix("tag="));
            let body = serde_json::to_vec(&self.records(tag)).unwrap_or_default();
            return send(session, 200, "application/json", body.into(), &[]).await;
        }
        if path == "/__mock/release" {
            if let Some(token) = query.as_deref().and_then(|q| q.strip_prefix("token=")) {
                self.hold(token).notify_one();
                self.tc.release(token);
            }
            return send(session, 200, "application/json", Bytes::from_static(b"{}"), &[]).await;
        }
        if path == "/__mock/tc_calls" {
            let calls = self.tc.calls.lock().unwrap_or_else(|p| p.into_inner()).clone();
            return send(session, 200, "application/json", Value::Array(calls).to_string().into(), &[]).await;
        }
        if let Some(file) = path.strip_prefix("/__mock/video/") {
            return self.tc.serve_video(session, &req, file, false).await;
        }
        if let Some(file) = path.strip_prefix("/__mock/expired/") {
            return self.tc.serve_video(session, &req, file, true).await;
        }

        let mut body = Vec::new();
        while let Some(chunk) = session.read_request_body().await? {
            body.extend_from_slice(&chunk);
        }
        if let Some(action) = header(&req, "x-tc-action") {
            let action = action.to_string();
            let answer = self.tc.call(&req, &action, &body);
            // `[slow-submit]`: the job is created, the answer comes after 3 s (a client with a
            // shorter timeout never learns the job id).
            if action.starts_with("Submit") && String::from_utf8_lossy(&body).contains("[slow-submit]") {
                tokio::time::sleep(Duration::from_secs(3)).await;
            }
            return send(session, 200, "application/json", answer.to_string().into(), &[]).await;
        }
        let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let mut headers: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (k, v) in req.headers.iter() {
            headers.entry(k.as_str().to_string()).or_default().push(String::from_utf8_lossy(v.as_bytes()).into_owned());
        }
        if path.contains("/v1/responses/") {
            self.record(Recorded {
                method: req.method.to_string(),
                path: path.clone(),
                query: query.clone(),
                headers: headers.clone(),
                body_len: body.len(),
                model: parsed.get("model").and_then(Value::as_str).map(str::to_string),
                tag: header(&req, "x-test-tag").map(str::to_string),
                stream_options: None,
                stream: false,
                max_output: max_output_of(&parsed),
            });
            if !self.credential_ok(Kind::Responses, &req) {
                let b = error_body(Kind::Responses, 401, "mock: missing or wrong upstream key").to_string();
                return send(session, 401, "application/json", b.into(), &[]).await;
            }
            if let Some((status, answer)) = self.responses_api(req.method.as_str(), &path, body.len()) {
                return send(session, status, "application/json", answer.to_string().into(), &[]).await;
            }
        }
        // Token counting (`/v1/messages/count_tokens`, `…/models/{m}:countTokens`): the
        // protocol's credential, errors and answer shape, no generation.
        let counting = if path.ends_with("/v1/messages/count_tokens") {
            Some(Kind::Messages)
        } else if path.contains("/models/") && path.ends_with(":countTokens") {
            Some(Kind::Generate { stream: false })
        } else {
            None
        };
        let embedding = path.contains("/models/") && (path.ends_with(":embedContent") || path.ends_with(":batchEmbedContents"));
        let Some(kind) = counting.or(embedding.then_some(Kind::Generate { stream: false })).or_else(|| kind_of(&path)) else {
            return send(session, 404, "application/json", Bytes::from_static(b"{\"error\":\"mock: unknown path\"}"), &[]).await;
        };
        let model = match kind {
            Kind::Generate { .. } => path.rsplit_once("/models/").and_then(|(_, rest)| rest.split_once(':')).map(|(m, _)| m.to_string()),
            _ => parsed.get("model").and_then(Value::as_str).map(str::to_string),
        };
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
            stream: kind == Kind::Generate { stream: true } || parsed.get("stream").and_then(Value::as_bool) == Some(true),
        });

        if !self.credential_ok(kind, &req) {
            let b = error_body(kind, 401, "mock: missing or wrong upstream key").to_string();
            return send(session, 401, "application/json", b.into(), &[]).await;
        }
        // Failure controls apply only to the provider (`x-mock-only: PREFIX,…`) and the key
        // (`x-mock-only-key: KEY`) they name, when named.
        let applies = header(&req, "x-mock-only").is_none_or(|only| only.split(',').any(|p| path.starts_with(p.trim())))
            && header(&req, "x-mock-only-key").is_none_or(|k| Self::presented_key(kind, &req) == Some(k));
        let ctl = |name: &str| if applies { header(&req, name) } else { None };
        let ctl_num = |name: &str| ctl(name).and_then(|v| v.trim().parse::<u64>().ok());
        if let Some(ms) = ctl_num("x-mock-delay-ms") {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        if let Some(total) = ctl_num("x-mock-endless-event") {
            // A misbehaving stream: `total` bytes of data lines, never the blank line that ends
            // an event.
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
            return Ok(());
        }
        if let Some(status) = ctl_num("x-mock-status").and_then(|s| u16::try_from(s).ok()) {
            // `x-mock-error-bytes: N`: the message padded to N bytes (an oversized error answer).
            let pad = ctl_num("x-mock-error-bytes").map_or(String::new(), |n| " ".repeat(usize::try_from(n).unwrap_or(0).min(64 << 20)));
            let b = error_body(kind, status, &format!("mock says {status}{pad}")).to_string();
            let retry_after = ctl("x-mock-retry-after").unwrap_or_default().to_string();
            let mut extra = vec![("x-mock-error", "yes")];
            if !retry_after.is_empty() {
                extra.push(("retry-after", retry_after.as_str()));
            }
            return send(session, status, "application/json", b.into(), &extra).await;
        }

        // Embeddings of generate-content (no usage reported, as the service does).
        if embedding {
            let vector = json!({"values": [0.125, -0.5, 0.25]});
            let answer = match parsed.get("requests").and_then(Value::as_array) {
                Some(items) => json!({"embeddings": vec![vector; items.len()]}),
                None => json!({"embedding": vector}),
            };
            return send(session, 200, "application/json", answer.to_string().into(), &[]).await;
        }
        if counting.is_some() {
            let n = pair(&req, "x-mock-usage").map_or((body.len() as u64).div_ceil(4).max(1), |(i, _)| i);
            let answer = match kind {
                Kind::Messages => json!({"input_tokens": n}),
                _ => json!({"totalTokens": n, "promptTokensDetails": [{"modality": "TEXT", "tokenCount": n}]}),
            };
            return send(session, 200, "application/json", answer.to_string().into(), &[]).await;
        }
        let input = parsed.get("input");
        let (mut tool, reply) = agent_turn(kind, &parsed, &body);
        if header(&req, "x-mock-tool-calls").is_some() {
            tool = Some(ToolCall { name: "get_weather".into(), args: TOOL_ARGS.concat() });
        }
        let prefix = path.split("/v1/").next().unwrap_or_default().to_string();
        if kind == Kind::Responses {
            if let Some(previous) = parsed.get("previous_response_id").and_then(Value::as_str) {
                if !self.responses().contains_key(&(prefix.clone(), previous.to_string())) {
                    let b = json!({"error": {"message": format!("Previous response with id '{previous}' not found."),
                        "type": "invalid_request_error", "param": "previous_response_id", "code": "previous_response_not_found"}});
                    return send(session, 400, "application/json", b.to_string().into(), &[]).await;
                }
            }
        }
        let call = Call {
            kind,
            model: model.unwrap_or_else(|| "unknown".into()),
            stream: match kind {
                Kind::Generate { stream } => stream,
                _ => parsed.get("stream").and_then(Value::as_bool).unwrap_or(false),
            },
            include_usage: parsed.pointer("/stream_options/include_usage").and_then(Value::as_bool).unwrap_or(false)
                && header(&req, "x-mock-no-usage").is_none(),
            input_tokens: pair(&req, "x-mock-usage").map_or((body.len() as u64).div_ceil(4).max(1), |(i, _)| i),
            // `x-mock-conform: 1`: the output ends at the maximum the request names in its own
            // protocol's field, as a conforming upstream's does (a field of another protocol is
            // ignored, as the real services ignore or refuse it).
            output_tokens: pair(&req, "x-mock-usage").map(|(_, o)| match header(&req, "x-mock-conform") {
                Some(_) => own_max_output(kind, &parsed).map_or(o, |max| o.min(max)),
                None => o,
            }),
            // A field mask (query `fields` / `$fields`, or `X-Goog-FieldMask`) that does not
            // name usage removes it, as the real service does.
            no_usage: header(&req, "x-mock-no-usage").is_some()
                || header(&req, "x-goog-fieldmask").is_some()
                || query.as_deref().is_some_and(|q| {
                    q.split('&').any(|p| p.starts_with("fields=") || p.starts_with("$fields=") || p.starts_with("%24fields="))
                }),
            tool,
            reply,
            response_id: format!("resp_mock_{}", self.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed)),
            cache: pair(&req, "x-mock-cache"),
            deltas: num(&req, "x-mock-deltas").unwrap_or(3) as usize,
            interval: Duration::from_millis(num(&req, "x-mock-interval-ms").unwrap_or(0)),
            hold: ctl("x-mock-hold").map(str::to_string),
            hold_after: num(&req, "x-mock-hold-after").unwrap_or(1).max(1) as usize,
            cut_after: ctl_num("x-mock-cut-after").map(|n| n as usize),
            embed_inputs: match input {
                Some(Value::Array(items)) => items.len().max(1),
                _ => 1,
            },
            embed_base64: parsed.get("encoding_format").and_then(Value::as_str) == Some("base64"),
            gemini_sse: query.as_deref().is_some_and(|q| q.split('&').any(|p| p == "alt=sse")),
        };
        if kind == Kind::Responses && parsed.get("store").and_then(Value::as_bool) != Some(false) {
            // Stored as the service stores it: readable by id later (at this provider only).
            let mut object = whole_body(&call);
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
        if call.stream {
            self.stream(session, &call).await
        } else {
            let b = whole_body(&call).to_string();
            send(session, 200, "application/json", b.into(), &[]).await
        }
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
        let events = stream_events(call);
        let ctype = if matches!(call.kind, Kind::Generate { .. }) && !call.gemini_sse { "application/json" } else { "text/event-stream" };
        let mut h = ResponseHeader::build(200, Some(3))?;
        h.insert_header("content-type", ctype)?;
        h.insert_header("cache-control", "no-cache")?;
        // Framed as the services frame a stream: chunked, so a cut (no last chunk) shows as one.
        h.insert_header("transfer-encoding", "chunked")?;
        service_headers(&mut h)?;
        session.write_response_header(Box::new(h), false).await?;
        let count = events.len();
        for (i, event) in events.into_iter().enumerate() {
            session.write_response_body(Some(Bytes::from(event)), false).await?;
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

impl TcMock {
    fn release(&self, token: &str) {
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        for job in jobs.values_mut() {
            if job.prompt.contains(&format!("[hold:{token}]")) {
                job.released = true;
            }
        }
    }

    fn error(code: &str, message: &str) -> Value {
        json!({"Response": {"Error": {"Code": code, "Message": message}, "RequestId": "mock-req"}})
    }

    /// Check the TC3 headers and signature exactly as the real service would.
    fn check_signature(&self, req: &RequestHeader, action: &str, body: &[u8]) -> Result<(), Value> {
        let host = header(req, "host").unwrap_or_default();
        let auth = header(req, "authorization").unwrap_or_default();
        let timestamp: u64 = header(req, "x-tc-timestamp").and_then(|t| t.parse().ok()).unwrap_or(0);
        if header(req, "x-tc-version").is_none() || header(req, "x-tc-region").is_none() {
            return Err(Self::error("MissingParameter", "X-TC-Version and X-TC-Region are required"));
        }
        if header(req, "content-type") != Some(crate::video::tc3::CONTENT_TYPE) {
            return Err(Self::error("InvalidParameter", "wrong content type"));
        }
        if now().abs_diff(timestamp) > 300 {
            return Err(Self::error("AuthFailure.SignatureExpire", "timestamp too far off"));
        }
        let service = host.split(['.', ':']).next().unwrap_or_default();
        let expected = crate::video::tc3::authorization(&crate::video::tc3::SignInput {
            secret_id: &self.secret_id,
            secret_key: &self.secret_key,
            host,
            service,
            timestamp,
            payload: body,
            action: Some(action),
        });
        if auth != expected {
            return Err(Self::error("AuthFailure.SignatureFailure", "signature mismatch"));
        }
        Ok(())
    }

    fn call(&self, req: &RequestHeader, action: &str, body: &[u8]) -> Value {
        let payload: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).push(json!({"action": action, "payload": payload}));
        if let Err(e) = self.check_signature(req, action, body) {
            return e;
        }
        let host = header(req, "host").unwrap_or("127.0.0.1").to_string();
        if action.starts_with("Submit") && action.ends_with("Job") {
            let prompt = payload.get("Prompt").and_then(Value::as_str).unwrap_or_default().to_string();
            if prompt.contains("[submit-error]") {
                return Self::error("InvalidParameterValue.Prompt", "mock: the prompt was rejected");
            }
            if prompt.contains("[throttle-once]") {
                let mut throttled = self.throttled.lock().unwrap_or_else(|p| p.into_inner());
                if throttled.insert(prompt.clone()) {
                    return Self::error("RequestLimitExceeded", "mock: slow down");
                }
            }
            let job_id = format!("job-{:x}", rand::random::<u64>());
            let job = TcJob { prompt, describes: 0, released: false };
            self.jobs.lock().unwrap_or_else(|p| p.into_inner()).insert(job_id.clone(), job);
            return json!({"Response": {"JobId": job_id, "RequestId": "mock-req"}});
        }
        if action.starts_with("Describe") && action.ends_with("Job") {
            let job_id = payload.get("JobId").and_then(Value::as_str).unwrap_or_default().to_string();
            let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
            let Some(job) = jobs.get_mut(&job_id) else {
                return Self::error("ResourceNotFound.JobNotExist", "mock: no such job");
            };
            job.describes += 1;
            let held = job.prompt.contains("[hold:") && !job.released;
            let response = match job.describes {
                1 => json!({"Status": "WAIT"}),
                2 => json!({"Status": "RUN", "Progress": 50}),
                _ if held => json!({"Status": "RUN", "Progress": 60}),
                _ if job.prompt.contains("[fail]") => {
                    json!({"Status": "FAIL", "ErrorCode": "FailedOperation.Moderation", "ErrorMessage": "mock: content rejected"})
                }
                _ => {
                    let dir = if job.prompt.contains("[expired]") { "expired" } else { "video" };
                    json!({"Status": "DONE", "ResultVideoUrl": format!("http://{host}/__mock/{dir}/{job_id}.mp4")})
                }
            };
            let mut response = response;
            response["RequestId"] = json!("mock-req");
            return json!({ "Response": response });
        }
        Self::error("InvalidAction", "mock: unknown action")
    }

    async fn serve_video(&self, session: &mut Session, req: &RequestHeader, file: &str, expired: bool) -> Result<()> {
        let prompt = file
            .strip_suffix(".mp4")
            .and_then(|job| self.jobs.lock().unwrap_or_else(|p| p.into_inner()).get(job).map(|j| j.prompt.clone()));
        let Some(prompt) = prompt.filter(|_| !expired) else {
            let status = if expired { 403 } else { 404 };
            return send(session, status, "application/xml", Bytes::from_static(b"<Error>AccessDenied</Error>"), &[]).await;
        };
        let video = mock_video_of(if prompt.contains("[big]") { MOCK_BIG_VIDEO_LEN } else { MOCK_VIDEO_LEN });
        let range = header(req, "range").and_then(|r| r.strip_prefix("bytes=")).and_then(|r| r.split_once('-'));
        let Some((start, end)) = range else {
            return send(session, 200, "video/mp4", video.into(), &[]).await;
        };
        let len = video.len();
        let start: usize = start.parse().unwrap_or(0);
        let end: usize = end.parse().map_or(len - 1, |e: usize| e.min(len - 1));
        if start > end {
            return send(session, 416, "text/plain", Bytes::new(), &[]).await;
        }
        let content_range = format!("bytes {start}-{end}/{len}");
        send(session, 206, "video/mp4", Bytes::copy_from_slice(&video[start..=end]), &[("content-range", &content_range)]).await
    }
}

fn sse(event: Option<&str>, data: &Value) -> String {
    match event {
        Some(name) => format!("event: {name}\ndata: {data}\n\n"),
        None => format!("data: {data}\n\n"),
    }
}

/// Remove the usage an answer or event carries (`usage`, `usageMetadata`, `response.usage`),
/// as a field mask or an upstream that omits it would.
fn strip_usage(v: &mut Value) {
    if let Some(obj) = v.as_object_mut() {
        obj.remove("usage");
        obj.remove("usageMetadata");
        if let Some(inner) = obj.get_mut("response") {
            strip_usage(inner);
        }
    }
}

/// The whole (non-streamed) answer, without its usage when the call says so.
fn whole_body(call: &Call) -> Value {
    let mut v = whole_body_with_usage(call);
    if call.no_usage {
        strip_usage(&mut v);
    }
    v
}

/// Messages usage, with prompt-cache tokens when the call has them.
fn messages_usage(call: &Call, out: u64) -> Value {
    let mut u = json!({"input_tokens": call.input_tokens, "output_tokens": out});
    if let Some((write, read)) = call.cache {
        u["cache_creation_input_tokens"] = json!(write);
        u["cache_read_input_tokens"] = json!(read);
    }
    u
}

/// The answer's text in stream pieces: the reply's words, or the mock's.
fn words_of(call: &Call) -> Vec<String> {
    match &call.reply {
        Some(reply) => reply.split_inclusive(' ').map(str::to_string).collect(),
        None => text_of(call.deltas).into_iter().map(str::to_string).collect(),
    }
}

fn whole_body_with_usage(call: &Call) -> Value {
    let words = words_of(call);
    let text: String = words.concat();
    let out = call.output_tokens.unwrap_or(call.deltas as u64);
    let inp = call.input_tokens;
    let model = &call.model;
    match call.kind {
        Kind::Chat if call.tool.is_some() => json!({
            "id": "chatcmpl-mock", "object": "chat.completion", "created": now(), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_mock", "type": "function", "function": call.tool.as_ref().map(|t| json!({"name": t.name, "arguments": t.args}))}]},
                "logprobs": null, "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": inp, "completion_tokens": out, "total_tokens": inp + out},
        }),
        Kind::Chat => json!({
            "id": "chatcmpl-mock", "object": "chat.completion", "created": now(), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": null},
                         "logprobs": null, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": inp, "completion_tokens": out, "total_tokens": inp + out},
        }),
        Kind::Responses => response_object(call, &response_output(call, &text), "completed", out),
        Kind::Embeddings => {
            let vector = [0.25f32, -0.5, 0.125, 1.0];
            let data: Vec<Value> = (0..call.embed_inputs)
                .map(|i| {
                    let embedding = if call.embed_base64 {
                        let bytes: Vec<u8> = vector.iter().flat_map(|f| f.to_le_bytes()).collect();
                        json!(base64::engine::general_purpose::STANDARD.encode(bytes))
                    } else {
                        json!(vector)
                    };
                    json!({"object": "embedding", "index": i, "embedding": embedding})
                })
                .collect();
            json!({"object": "list", "data": data, "model": model,
                   "usage": {"prompt_tokens": inp, "total_tokens": inp}})
        }
        Kind::Messages => {
            let (content, stop) = match &call.tool {
                Some(t) => (json!([{"type": "tool_use", "id": "toolu_mock", "name": t.name, "input": t.args_value()}]), "tool_use"),
                None => (json!([{"type": "text", "text": text}]), "end_turn"),
            };
            json!({
                "id": "msg_mock", "type": "message", "role": "assistant", "model": model,
                "content": content, "stop_reason": stop, "stop_sequence": null,
                "usage": messages_usage(call, out),
            })
        }
        Kind::Generate { .. } => match &call.tool {
            Some(t) => gemini_call_chunk(model, t, inp, out),
            None => gemini_chunk(model, &text, Some("STOP"), inp, out),
        },
    }
}

/// A generate-content chunk that calls a function.
fn gemini_call_chunk(model: &str, t: &ToolCall, inp: u64, out: u64) -> Value {
    let mut chunk = gemini_chunk(model, "", Some("STOP"), inp, out);
    chunk["candidates"][0]["content"]["parts"] = json!([{"functionCall": {"name": t.name, "args": t.args_value()}}]);
    chunk
}

/// A finished response's output item: the message with its text, or the function call.
fn response_item(call: &Call, text: &str) -> Value {
    match &call.tool {
        Some(t) => json!({"type": "function_call", "id": "fc_mock", "call_id": "call_mock", "name": t.name,
                          "arguments": t.args, "status": "completed"}),
        None => json!({"type": "message", "id": "msg_mock", "status": "completed", "role": "assistant",
                       "content": [{"type": "output_text", "text": text, "annotations": []}]}),
    }
}

fn response_output(call: &Call, text: &str) -> Value {
    json!([response_item(call, text)])
}

fn response_object(call: &Call, output: &Value, status: &str, out: u64) -> Value {
    let (model, inp) = (call.model.as_str(), call.input_tokens);
    let output = if status == "completed" { output.clone() } else { json!([]) };
    let usage = if status == "completed" {
        json!({"input_tokens": inp, "input_tokens_details": {"cached_tokens": 0},
               "output_tokens": out, "output_tokens_details": {"reasoning_tokens": 0},
               "total_tokens": inp + out})
    } else {
        Value::Null
    };
    json!({"id": call.response_id, "object": "response", "created_at": now(), "status": status,
           "model": model, "output": output, "parallel_tool_calls": true, "tool_choice": "auto",
           "tools": [], "usage": usage})
}

fn gemini_chunk(model: &str, text: &str, finish: Option<&str>, inp: u64, out: u64) -> Value {
    let mut candidate = json!({"content": {"parts": [{"text": text}], "role": "model"}, "index": 0});
    if let Some(f) = finish {
        candidate["finishReason"] = json!(f);
    }
    json!({"candidates": [candidate],
           "usageMetadata": {"promptTokenCount": inp, "candidatesTokenCount": out, "totalTokenCount": inp + out},
           "modelVersion": model})
}

/// The stream as a list of wire pieces; the first piece is the first event. Chat streams carry
/// usage only when asked (`include_usage`); with `no_usage` no event carries any.
fn stream_events(call: &Call) -> Vec<String> {
    let words = words_of(call);
    let out = call.output_tokens.unwrap_or(call.deltas as u64);
    let inp = call.input_tokens;
    let model = call.model.as_str();
    let mut ev = Vec::new();
    match call.kind {
        Kind::Chat | Kind::Embeddings => {
            let created = now();
            let chunk = |delta: Value, finish: Value| {
                json!({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": created, "model": model,
                       "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]})
            };
            if let Some(tool) = &call.tool {
                ev.push(sse(
                    None,
                    &chunk(
                        json!({"role": "assistant", "content": null, "tool_calls": [
                    {"index": 0, "id": "call_mock", "type": "function", "function": {"name": tool.name, "arguments": ""}}]}),
                        Value::Null,
                    ),
                ));
                for piece in tool.pieces() {
                    ev.push(sse(None, &chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}), Value::Null)));
                }
            } else {
                ev.push(sse(None, &chunk(json!({"role": "assistant", "content": ""}), Value::Null)));
                for w in &words {
                    ev.push(sse(None, &chunk(json!({"content": w}), Value::Null)));
                }
            }
            // The finish chunk, the usage chunk and [DONE] leave together, as the service sends them.
            let finish = if call.tool.is_some() { "tool_calls" } else { "stop" };
            let mut tail = sse(None, &chunk(json!({}), json!(finish)));
            if call.include_usage {
                tail.push_str(&sse(
                    None,
                    &json!({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": created,
                    "model": model, "choices": [],
                    "usage": {"prompt_tokens": inp, "completion_tokens": out, "total_tokens": inp + out}}),
                ));
            }
            tail.push_str("data: [DONE]\n\n");
            ev.push(tail);
        }
        Kind::Responses => {
            let mut seq = 0u64;
            let mut push = |name: &str, mut data: Value| {
                if call.no_usage {
                    strip_usage(&mut data);
                }
                data["type"] = json!(name);
                data["sequence_number"] = json!(seq);
                seq += 1;
                ev.push(sse(Some(name), &data));
            };
            push("response.created", json!({"response": response_object(call, &json!([]), "in_progress", 0)}));
            push("response.in_progress", json!({"response": response_object(call, &json!([]), "in_progress", 0)}));
            let text: String = words.concat();
            let item = response_item(call, &text);
            match &call.tool {
                Some(tool) => {
                    let mut started = item.clone();
                    started["arguments"] = json!("");
                    started["status"] = json!("in_progress");
                    push("response.output_item.added", json!({"output_index": 0, "item": started}));
                    for piece in tool.pieces() {
                        push("response.function_call_arguments.delta", json!({"item_id": "fc_mock", "output_index": 0, "delta": piece}));
                    }
                    push("response.function_call_arguments.done", json!({"item_id": "fc_mock", "output_index": 0, "arguments": tool.args}));
                }
                None => {
                    push(
                        "response.output_item.added",
                        json!({"output_index": 0, "item":
                        {"type": "message", "id": "msg_mock", "status": "in_progress", "role": "assistant", "content": []}}),
                    );
                    push(
                        "response.content_part.added",
                        json!({"item_id": "msg_mock", "output_index": 0, "content_index": 0,
                        "part": {"type": "output_text", "text": "", "annotations": []}}),
                    );
                    for w in &words {
                        push(
                            "response.output_text.delta",
                            json!({"item_id": "msg_mock", "output_index": 0, "content_index": 0, "delta": w}),
                        );
                    }
                    push("response.output_text.done", json!({"item_id": "msg_mock", "output_index": 0, "content_index": 0, "text": text}));
                    push(
                        "response.content_part.done",
                        json!({"item_id": "msg_mock", "output_index": 0, "content_index": 0,
                        "part": {"type": "output_text", "text": text, "annotations": []}}),
                    );
                }
            }
            push("response.output_item.done", json!({"output_index": 0, "item": item}));
            push("response.completed", json!({"response": response_object(call, &json!([item]), "completed", out)}));
        }
        Kind::Messages => {
            ev.push(sse(
                Some("message_start"),
                &json!({"type": "message_start", "message": {
                "id": "msg_mock", "type": "message", "role": "assistant", "model": model, "content": [],
                "stop_reason": null, "stop_sequence": null, "usage": messages_usage(call, 1)}}),
            ));
            let block = match &call.tool {
                Some(t) => json!({"type": "tool_use", "id": "toolu_mock", "name": t.name, "input": {}}),
                None => json!({"type": "text", "text": ""}),
            };
            ev.push(sse(Some("content_block_start"), &json!({"type": "content_block_start", "index": 0, "content_block": block})));
            ev.push(sse(Some("ping"), &json!({"type": "ping"})));
            let deltas: Vec<Value> = match &call.tool {
                Some(t) => t.pieces().into_iter().map(|p| json!({"type": "input_json_delta", "partial_json": p})).collect(),
                None => words.iter().map(|w| json!({"type": "text_delta", "text": w})).collect(),
            };
            for delta in deltas {
                ev.push(sse(Some("content_block_delta"), &json!({"type": "content_block_delta", "index": 0, "delta": delta})));
            }
            ev.push(sse(Some("content_block_stop"), &json!({"type": "content_block_stop", "index": 0})));
            let stop = if call.tool.is_some() { "tool_use" } else { "end_turn" };
            ev.push(sse(
                Some("message_delta"),
                &json!({"type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": {"output_tokens": out}}),
            ));
            ev.push(sse(Some("message_stop"), &json!({"type": "message_stop"})));
        }
        Kind::Generate { .. } => {
            let n = if call.tool.is_some() { 1 } else { words.len().max(1) };
            let chunks: Vec<Value> = (0..n)
                .map(|i| {
                    let w = words.get(i).map_or("", String::as_str);
                    let finish = (i + 1 == n).then_some("STOP");
                    // Counts grow chunk by chunk; the last chunk carries the answer's total.
                    let so_far = if i + 1 == n { out } else { (i as u64 + 1).min(out) };
                    let mut chunk = match &call.tool {
                        Some(t) => gemini_call_chunk(model, t, inp, out),
                        None => gemini_chunk(model, w, finish, inp, so_far),
                    };
                    if call.no_usage {
                        strip_usage(&mut chunk);
                    }
                    chunk
                })
                .collect();
            if call.gemini_sse {
                for c in &chunks {
                    ev.push(format!("data: {c}\r\n\r\n"));
                }
            } else {
                // Without alt=sse the service streams one JSON array.
                for (i, c) in chunks.iter().enumerate() {
                    let lead = if i == 0 { "[" } else { "\n,\r\n" };
                    ev.push(format!("{lead}{c}"));
                }
                ev.push("]".to_string());
            }
        }
    }
    ev
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
