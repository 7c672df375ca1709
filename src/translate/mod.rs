//! Protocol translation: a client of one protocol calling a model served by a provider of
//! another (opt-in per group, `groups.<name>.translate`). Every request, whole response and
//! stream event goes through one internal form ([`Request`], [`Response`], [`Event`]); each
//! protocol has one decoder and one encoder for it (`chat`, `messages`, `gemini`), so a protocol
//! is added by writing its two sides, not a converter per pair. A request whose client protocol
//! is its provider's never comes here: it is relayed byte for byte.
//!
//! What cannot be carried faithfully (a field that would change the answer and that the
//! provider's protocol has no counterpart for) is refused with 400 naming the field; fields that
//! change nothing upstream are dropped by a list per protocol ([`chat::DROPPED`],
//! [`messages::DROPPED`], [`gemini::DROPPED`]). Usage is not billed from here: the meter reads
//! the provider's own answer, so every token is billed once, as the provider counted it.
//!
//! Round trips: an Anthropic thinking `signature` and a generate-content `thoughtSignature` must
//! come back byte-exact on the next turn. They ride inside the tool-call id the client sees
//! ([`carry`]) and are restored when the client sends that id back.

pub mod carry;
pub mod chat;
pub mod gemini;
pub mod messages;
pub mod responses;
pub mod sse;
pub mod stream;
pub mod view;

use crate::config::Protocol;
use crate::protocol::{ApiError, ErrorKind};
use serde_json::Value;
use view::Json;

pub use stream::StreamTranslator;

/// The protocol a client speaks: one more than the providers, since the responses API is a
/// client protocol only (relayed natively to `openai` providers that serve it, translated to
/// chat completions for those that do not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Chat,
    Messages,
    Gemini,
    Responses,
}

impl Dialect {
    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::Chat => "openai",
            Dialect::Messages => "anthropic",
            Dialect::Gemini => "gemini",
            Dialect::Responses => "responses",
        }
    }

    /// The dialect a provider of `protocol` speaks.
    pub fn of(protocol: Protocol) -> Dialect {
        match protocol {
            Protocol::Openai => Dialect::Chat,
            Protocol::Anthropic => Dialect::Messages,
            Protocol::Gemini => Dialect::Gemini,
        }
    }

    /// The error shape of this dialect.
    pub fn shape(self) -> Protocol {
        match self {
            Dialect::Chat | Dialect::Responses => Protocol::Openai,
            Dialect::Messages => Protocol::Anthropic,
            Dialect::Gemini => Protocol::Gemini,
        }
    }
}

/// The client protocol of a route that can be translated (generation only: embeddings, token
/// counting and stored responses go to providers of their own protocol).
pub fn client_dialect(route: &crate::route::Route) -> Option<Dialect> {
    use crate::route::Route;
    match route {
        Route::ChatCompletions => Some(Dialect::Chat),
        Route::Responses | Route::ResponsesInputTokens => Some(Dialect::Responses),
        Route::Messages | Route::CountTokens => Some(Dialect::Messages),
        Route::GenerateContent { .. } | Route::GeminiCountTokens { .. } => Some(Dialect::Gemini),
        _ => None,
    }
}

/// Whether a route counts the input tokens of a request instead of answering it.
pub fn counts(route: &crate::route::Route) -> bool {
    use crate::route::Route;
    matches!(route, Route::CountTokens | Route::GeminiCountTokens { .. } | Route::ResponsesInputTokens)
}

/// A translated relay: who speaks what, and what the client's answer must look like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Translation {
    pub client: Dialect,
    /// The provider's protocol.
    pub upstream: Protocol,
    /// The model as the client named it (answers name it back).
    pub model: String,
    pub stream: bool,
    /// A chat-completions client asked for the usage chunk (`stream_options.include_usage`).
    pub client_wants_usage: bool,
    /// A generate-content client streams over SSE (`alt=sse`); without it, one JSON array.
    pub gemini_sse: bool,
    /// The input tokens estimated for the request (the messages protocol's `message_start`
    /// reports it before the upstream's real count arrives).
    pub input_estimate: u64,
    /// Token counting (`/v1/messages/count_tokens`, `:countTokens`, `/v1/responses/input_tokens`):
    /// the provider's own count where its protocol has one, else [`count_estimate`].
    pub count: bool,
    /// The largest provider event held while it is incomplete (`limits.max_event_bytes`).
    pub max_event_bytes: usize,
}

impl Translation {
    /// The upstream path (after the provider's prefix) and query for this request.
    pub fn upstream_path(&self, prefix: &str) -> String {
        match self.upstream {
            Protocol::Anthropic if self.count => format!("{prefix}/v1/messages/count_tokens"),
            Protocol::Gemini if self.count => format!("{prefix}/v1beta/models/{}:countTokens", self.model),
            Protocol::Openai => format!("{prefix}/v1/chat/completions"),
            Protocol::Anthropic => format!("{prefix}/v1/messages"),
            Protocol::Gemini if self.stream => format!("{prefix}/v1beta/models/{}:streamGenerateContent?alt=sse", self.model),
            Protocol::Gemini => format!("{prefix}/v1beta/models/{}:generateContent", self.model),
        }
    }

    /// The content type of the client's answer.
    pub fn content_type(&self) -> &'static str {
        if self.stream && (self.client != Dialect::Gemini || self.gemini_sse) {
            "text/event-stream"
        } else {
            "application/json"
        }
    }
}

/// Who says a piece of conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    User,
    Assistant,
    /// Instructions in the middle of a conversation (earlier ones are [`Request::system`]).
    System,
}

/// An image, by reference or inline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Image {
    Url(String),
    Base64 { media_type: String, data: String },
}

/// One part of a message.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Text(String),
    Image(Image),
    /// Reasoning text; `signature` only when an Anthropic upstream signed it.
    Thinking {
        text: String,
        signature: Option<String>,
    },
    /// Anthropic's encrypted reasoning.
    RedactedThinking(String),
    ToolCall(ToolCall),
    ToolResult {
        id: String,
        content: Vec<Part>,
        is_error: bool,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The upstream's id (generate-content has none: tollgate makes one).
    pub id: String,
    pub name: String,
    /// The arguments as JSON text (an object).
    pub arguments: String,
    /// A generate-content `thoughtSignature` that came on this call.
    pub signature: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub role: Role,
    pub parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// JSON Schema of the arguments (an object schema).
    pub schema: Value,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    Auto,
    None,
    /// Some tool must be called.
    Required,
    Named(String),
}

/// Reasoning asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reasoning {
    Off,
    /// A budget in tokens.
    Budget(u64),
}

/// The effort names of chat completions and their budgets (both ways, nearest).
const EFFORTS: [(&str, u64); 4] = [("minimal", 512), ("low", 1024), ("medium", 8192), ("high", 24576)];

impl Reasoning {
    pub fn from_effort(effort: &str) -> Option<Reasoning> {
        if effort == "none" {
            return Some(Reasoning::Off);
        }
        EFFORTS.iter().find(|(name, _)| *name == effort).map(|(_, b)| Reasoning::Budget(*b))
    }

    /// The effort name nearest to this budget.
    pub fn effort(self) -> &'static str {
        match self {
            Reasoning::Off => "none",
            Reasoning::Budget(b) => EFFORTS.iter().rev().find(|(_, at)| b >= *at).map_or("minimal", |(name, _)| name),
        }
    }
}

/// A request in the internal form.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Request {
    pub model: String,
    /// Instructions before the conversation.
    pub system: Vec<String>,
    pub messages: Vec<Message>,
    pub tools: Vec<Tool>,
    pub tool_choice: Option<ToolChoice>,
    /// Only one tool call per turn.
    pub no_parallel_tools: bool,
    pub max_output: Option<u64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<u64>,
    pub stop: Vec<String>,
    pub seed: Option<i64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub stream: bool,
    pub reasoning: Option<Reasoning>,
    /// Structured output: a JSON Schema (`Some(None)`: any JSON object).
    pub json_output: Option<Option<Value>>,
}

/// Why generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    EndTurn,
    MaxTokens,
    ToolUse,
    StopSequence,
    ContentFilter,
}

/// Token counts in one meaning: `input` excludes cache reads and writes; `output` includes
/// reasoning (`reasoning` says how much of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub input: u64,
    pub cache_read: u64,
    pub cache_write: u64,
    pub output: u64,
    pub reasoning: u64,
}

impl Usage {
    pub fn prompt_total(&self) -> u64 {
        self.input + self.cache_read + self.cache_write
    }
}

/// A whole answer in the internal form.
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    pub id: String,
    pub parts: Vec<Part>,
    pub stop: Option<Stop>,
    pub usage: Option<Usage>,
}

/// One step of a streamed answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Text(String),
    Thinking(String),
    /// The thinking block just streamed was signed (Anthropic): its whole text and signature.
    SignedThinking {
        text: String,
        signature: String,
    },
    RedactedThinking(String),
    /// A tool call begins (later [`Event::ToolArgs`] belong to it).
    ToolStart {
        id: String,
        name: String,
        signature: Option<String>,
    },
    ToolArgs(String),
    Stop(Stop),
    /// The usage so far (a later report replaces it).
    Usage(Usage),
    /// The upstream reported an error inside its stream.
    Error {
        status: u16,
        message: String,
    },
}

/// Refuse a field that cannot be carried to `to`.
pub fn unsupported(field: impl std::fmt::Display, to: Protocol, why: &str) -> ApiError {
    let field = field.to_string();
    ApiError::new(
        ErrorKind::BadRequest,
        format!("'{field}' cannot be carried to this model, which is served over the {} protocol: {why}.", to.as_str()),
    )
    .with_param(&field)
}

/// A malformed client request.
pub fn invalid(field: impl std::fmt::Display, what: &str) -> ApiError {
    let field = field.to_string();
    ApiError::new(ErrorKind::BadRequest, format!("'{field}': {what}.")).with_param(&field)
}

/// An item of a list field, as an error names it (`messages[3]`): written only when one does.
#[derive(Debug, Clone, Copy)]
pub struct Field<'a>(pub &'a str, pub usize);

impl std::fmt::Display for Field<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}[{}]", self.0, self.1)
    }
}

/// Check a client request's top-level fields: each must be in `mapped` or `dropped`, else it
/// is refused (it would change the answer and the provider's protocol has no counterpart). A
/// field set to `null` or `false` asks for nothing and passes.
pub fn check_fields(body: &view::Object<'_>, mapped: &[&str], dropped: &[&str], to: Protocol) -> Result<(), ApiError> {
    for (name, value) in body.iter() {
        if value.is_null() || value.as_bool() == Some(false) || mapped.contains(&name) || dropped.contains(&name) {
            continue;
        }
        return Err(unsupported(name, to, "it has no counterpart there"));
    }
    Ok(())
}

/// Translate a client request body into the provider's: decode, check what the provider can
/// take, encode. `default_max_output` is set when the request names no maximum (the messages
/// protocol requires one; it is also what the request was held for).
pub fn request(t: &Translation, body: &[u8], default_max_output: u64) -> Result<bytes::Bytes, ApiError> {
    let value = view::parse(
        std::str::from_utf8(body).map_err(|_| ApiError::new(ErrorKind::BadRequest, "The request body is not valid UTF-8."))?,
        "request body",
    )?;
    let Json::Object(mut map) = value else {
        return Err(ApiError::new(ErrorKind::BadRequest, "The request body must be a JSON object."));
    };
    // A generate-content count may wrap the request it counts.
    if t.count && t.client == Dialect::Gemini {
        if let Some(Json::Object(inner)) = map.remove("generateContentRequest") {
            map = inner;
        }
    }
    let mut req = match t.client {
        Dialect::Chat => chat::decode_request(map, t.upstream)?,
        Dialect::Messages => messages::decode_request(map, t.upstream)?,
        Dialect::Gemini => gemini::decode_request(map, t.upstream)?,
        Dialect::Responses => responses::decode_request(map, t.upstream)?,
    };
    req.model = t.model.clone();
    req.stream = t.stream;
    if req.max_output.is_none() && !t.count {
        req.max_output = Some(default_max_output);
    }
    carry::restore(&mut req);
    let mut out = match t.upstream {
        // Written straight to text (no JSON tree). Chat completions has no token count: a count
        // is answered with tollgate's estimate.
        Protocol::Openai => return Ok(bytes::Bytes::from(chat::encode_request(&req))),
        Protocol::Anthropic => return messages::encode_request(&req, t.count).map(bytes::Bytes::from),
        Protocol::Gemini => gemini::encode_request(&req)?,
    };
    if t.count {
        out = count_request(&t.model, out);
    }
    let mut bytes = Vec::with_capacity(body.len() + 64);
    sse::serialized_into(&mut bytes, &out);
    Ok(bytes::Bytes::from(bytes))
}

/// A generate-content request as its token-counting request (the request it counts, named).
fn count_request(model: &str, generation: Value) -> Value {
    match generation {
        Value::Object(mut m) => {
            m.insert("model".into(), Value::String(format!("models/{model}")));
            serde_json::json!({"generateContentRequest": Value::Object(m)})
        }
        other => other,
    }
}

/// A token count in the client's shape.
pub fn count_answer(client: Dialect, tokens: u64) -> Value {
    match client {
        Dialect::Messages => serde_json::json!({"input_tokens": tokens}),
        Dialect::Gemini => serde_json::json!({"totalTokens": tokens}),
        Dialect::Responses | Dialect::Chat => serde_json::json!({"object": "response.input_tokens", "input_tokens": tokens}),
    }
}

/// tollgate's estimate of a request's input tokens, for a provider whose protocol has no
/// count (chat completions): one token per four bytes of the request body as the client sent it.
pub fn count_estimate(t: &Translation, client_body_len: usize) -> Value {
    count_answer(t.client, crate::billing::meter::tokens_from_bytes(client_body_len as u64))
}

/// Translate a whole (non-streamed) successful answer.
pub fn response(t: &Translation, body: &[u8]) -> Result<Vec<u8>, ApiError> {
    let bad = || ApiError::new(ErrorKind::BadGateway, "The upstream service sent an answer that could not be read.");
    let tree = || serde_json::from_slice::<Value>(body).map_err(|_| bad());
    if t.count {
        let value = tree()?;
        let tokens = value.get("input_tokens").or_else(|| value.get("totalTokens")).and_then(Value::as_u64).ok_or_else(bad)?;
        let mut bytes = Vec::new();
        sse::serialized_into(&mut bytes, &count_answer(t.client, tokens));
        return Ok(bytes);
    }
    let resp = match t.upstream {
        // Read field by field (the most common provider protocol; no JSON tree).
        Protocol::Openai => chat::decode_response(body),
        Protocol::Anthropic => {
            messages::decode_response(&view::parse(std::str::from_utf8(body).map_err(|_| bad())?, "answer").map_err(|_| bad())?)
        }
        Protocol::Gemini => gemini::decode_response(&tree()?),
    }
    .ok_or_else(bad)?;
    let out = match t.client {
        // Written as text (no JSON tree): the two protocols most clients speak.
        Dialect::Chat => return Ok(chat::encode_response(t, &resp)),
        Dialect::Messages => return Ok(messages::encode_response(t, &resp)),
        Dialect::Gemini => gemini::encode_response(t, &resp),
        Dialect::Responses => responses::encode_response(t, &resp),
    };
    let mut bytes = Vec::with_capacity(body.len() + 128);
    sse::serialized_into(&mut bytes, &out);
    Ok(bytes)
}

/// A stable id for a call or answer that came without one.
pub fn new_id(prefix: &str) -> String {
    let mut id = String::with_capacity(prefix.len() + 24);
    id.push_str(prefix);
    id.push_str(&crate::base::text::hex(&rand::random::<[u8; 12]>()));
    id
}

/// A JSON object's text, or `{}` for an empty string (a tool call with no arguments).
pub fn arguments_value(arguments: &str) -> Value {
    if arguments.trim().is_empty() {
        return Value::Object(Default::default());
    }
    serde_json::from_str(arguments).unwrap_or_else(|_| Value::Object(Default::default()))
}

/// The text of a string field or of an array of `{type: text, text}` parts.
pub fn text_of(v: &Json<'_>) -> Option<String> {
    match v {
        Json::String(s) => Some(s.to_string()),
        Json::Array(items) => Some(items.iter().filter_map(|p| p.get("text").and_then(Json::as_str)).collect::<Vec<_>>().join("\n")),
        _ => None,
    }
}

/// A `data:` URL's media type and base64 payload.
pub fn data_url(url: &str) -> Option<(String, String)> {
    let rest = url.strip_prefix("data:")?;
    let (meta, data) = rest.split_once(',')?;
    let media = meta.strip_suffix(";base64")?;
    Some((media.to_string(), data.to_string()))
}

/// Merge consecutive messages of one role (protocols that alternate roles need it; tool results
/// of one turn become one message).
pub fn merge_roles(messages: Vec<Message>) -> Vec<Message> {
    let mut out: Vec<Message> = Vec::with_capacity(messages.len());
    for m in messages {
        match out.last_mut() {
            Some(last) if last.role == m.role && m.role != Role::System => last.parts.extend(m.parts),
            _ => out.push(m),
        }
    }
    out
}

/// The text parts of a message, joined by new lines.
pub fn parts_text(parts: &[Part]) -> String {
    let texts: Vec<&str> = parts.iter().filter_map(|p| if let Part::Text(t) = p { Some(t.as_str()) } else { None }).collect();
    texts.join("\n")
}

/// The conversation as protocols with instructions only on top take it (messages,
/// generate-content): a mid-conversation instruction becomes a user turn's
/// `<system-reminder>` text, and consecutive turns of one role are merged.
pub fn alternating_turns(messages: &[Message]) -> Vec<Message> {
    let turns = messages
        .iter()
        .map(|m| match m.role {
            Role::System => Message {
                role: Role::User,
                parts: m
                    .parts
                    .iter()
                    .map(|p| match p {
                        Part::Text(t) => Part::Text(format!("<system-reminder>\n{t}\n</system-reminder>")),
                        other => other.clone(),
                    })
                    .collect(),
            },
            _ => m.clone(),
        })
        .collect();
    merge_roles(turns)
}

/// `auto`, `none` or `required` as a tool choice (chat completions, responses).
pub fn tool_choice_word(word: &str) -> Result<ToolChoice, ApiError> {
    match word {
        "auto" => Ok(ToolChoice::Auto),
        "none" => Ok(ToolChoice::None),
        "required" => Ok(ToolChoice::Required),
        _ => Err(invalid("tool_choice", "must be auto, none, required or a named function")),
    }
}

/// A number field as u64, refused when it is not one.
pub fn uint(v: &Json<'_>, field: &str) -> Result<u64, ApiError> {
    v.as_u64().ok_or_else(|| invalid(field, "must be a non-negative integer"))
}

/// A number field as f64, refused when it is not one.
pub fn float(v: &Json<'_>, field: &str) -> Result<f64, ApiError> {
    v.as_f64().ok_or_else(|| invalid(field, "must be a number"))
}

/// Stop sequences: a string or a list of strings.
pub fn stops(v: &Json<'_>, field: &str) -> Result<Vec<String>, ApiError> {
    match v {
        Json::String(s) => Ok(vec![s.to_string()]),
        Json::Array(items) => {
            items.iter().map(|s| s.as_str().map(str::to_string).ok_or_else(|| invalid(field, "must be strings"))).collect()
        }
        _ => Err(invalid(field, "must be a string or a list of strings")),
    }
}

#[cfg(test)]
mod tests;
