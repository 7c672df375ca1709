//! What each protocol looks like on the wire, one file per protocol: the credential and
//! version headers, the client headers it relays, error bodies and model lists, the request
//! fields that bound its output (maximum, choices), the usage injection (chat streams), the
//! model taken from the path (generate-content) and the reader of its usage reports. Pure and
//! unit-tested; `meter` runs the readers over a response stream, `relay` plans the request.

pub mod anthropic;
pub mod audio;
pub mod batch;
pub mod cloud_ingress;
pub mod conversation;
pub mod converse;
pub mod error_class;
pub mod gemini;
pub mod mcp;
pub mod media;
pub mod multipart;
pub mod openai;
pub mod realtime;
pub mod response;
pub mod scan;
pub mod upstream_error;

use serde::Deserialize;
use serde_json::Value;

/// A request header's value as text (None when absent or not visible ASCII).
pub fn header_str(req: &pingora_http::RequestHeader, name: impl http::header::AsHeaderName) -> Option<&str> {
    req.headers.get(name).and_then(|v| v.to_str().ok())
}

/// One of the three model protocols (also called platforms in groups).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Openai,
    Anthropic,
    Gemini,
}

impl Protocol {
    /// Every protocol, in the order of [`Protocol::index`].
    pub const ALL: [Protocol; 3] = [Protocol::Openai, Protocol::Anthropic, Protocol::Gemini];

    /// The protocol's place in per-protocol arrays (0, 1, 2 in the order of [`Protocol::ALL`]).
    pub fn index(self) -> usize {
        match self {
            Protocol::Openai => 0,
            Protocol::Anthropic => 1,
            Protocol::Gemini => 2,
        }
    }

    /// The header that carries the upstream credential.
    pub fn credential_header(self) -> &'static str {
        match self {
            Protocol::Openai => openai::CREDENTIAL_HEADER,
            Protocol::Anthropic => anthropic::CREDENTIAL_HEADER,
            Protocol::Gemini => gemini::CREDENTIAL_HEADER,
        }
    }

    /// Client headers relayed to this protocol's upstreams beyond the common ones.
    pub fn relayed_headers(self) -> &'static [&'static str] {
        match self {
            Protocol::Openai => &openai::RELAYED_HEADERS,
            Protocol::Anthropic => &anthropic::RELAYED_HEADERS,
            Protocol::Gemini => &gemini::RELAYED_HEADERS,
        }
    }

    /// Upstream response headers relayed to this protocol's clients beyond the common ones:
    /// what its SDKs read (request ids, processing time).
    pub fn response_headers(self) -> &'static [&'static str] {
        match self {
            Protocol::Openai => &openai::RESPONSE_HEADERS,
            Protocol::Anthropic => &anthropic::RESPONSE_HEADERS,
            Protocol::Gemini => &gemini::RESPONSE_HEADERS,
        }
    }

    /// How many answers a request asks for (at least 1; more than [`MAX_CHOICES`] is a 400).
    pub fn choices(self, f: &BodyFields<'_>) -> Result<u64, ApiError> {
        match self {
            Protocol::Openai => choice_count(f.n, "n"),
            Protocol::Anthropic => Ok(1),
            Protocol::Gemini => {
                choice_count(f.generation_config.as_ref().and_then(|g| g.candidate_count), "generationConfig.candidateCount")
            }
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Openai => "openai",
            Protocol::Anthropic => "anthropic",
            Protocol::Gemini => "gemini",
        }
    }
}

/// The request-body fields tollgate reads, of all three protocols, from one validating scan
/// ([`scan`]); everything else is skipped without allocation. Which fields count is each
/// protocol's (`relay::output` for the output maximum, `Protocol::choices`).
/// `stream_options` is kept as the raw text of its value (whatever its type), borrowed from
/// the body, so the usage rewrite can splice it without parsing the body a second time.
#[derive(Debug, Default)]
pub struct BodyFields<'a> {
    pub model: Option<String>,
    pub stream: Option<bool>,
    /// Chat completions (legacy name) and messages.
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    /// Responses.
    pub max_output_tokens: Option<u64>,
    /// Chat completions: number of choices.
    pub n: Option<u64>,
    /// The service also accepts the proto field names (`generation_config`, `candidate_count`,
    /// `max_output_tokens`): both spellings are read, and a body giving both is refused.
    pub generation_config: Option<GenerationConfig>,
    /// Present whatever its value, `null` included.
    pub stream_options: Option<Raw<'a>>,
    /// Responses: the stored response this turn continues (it must be the caller's).
    pub previous_response_id: Option<String>,
    /// Responses and chat completions: the client's own conversation key for prompt caching.
    pub prompt_cache_key: Option<String>,
    /// Responses: run detached from the request (refused: its usage arrives after the request).
    pub background: Option<bool>,
    /// How the conversation begins, as raw text, for provider affinity: the system prompt (each
    /// protocol's field) and the message list (chat and messages: `messages`; responses:
    /// `input`; generate-content: `contents`). Only their first items are ever read.
    pub messages: Option<Raw<'a>>,
    pub input: Option<Raw<'a>>,
    pub contents: Option<Raw<'a>>,
    pub system: Option<Raw<'a>>,
    pub instructions: Option<Raw<'a>>,
    pub system_instruction: Option<Raw<'a>>,
    /// The images and files the content fields name, counted during the scan.
    pub media: MediaCount,
    /// OpenRouter's list of models to go on to (chat completions, responses): see
    /// `upstream::fallback`.
    pub models: Option<Raw<'a>>,
}

/// A member's value exactly as the body holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Raw<'a>(&'a [u8]);

impl<'a> Raw<'a> {
    pub fn bytes(&self) -> &'a [u8] {
        self.0
    }

    /// The value's text. The scan checked every string's UTF-8 (the rest of JSON is ASCII), so
    /// this is None only for a `Raw` that did not come from a scanned body.
    pub fn text(&self) -> Option<&'a str> {
        std::str::from_utf8(self.0).ok()
    }
}

/// The members of a request body that [`body_fields`] reads, by name (both spellings of
/// generate-content's `generationConfig` are one member: giving both is a duplicate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Member {
    Model,
    Stream,
    MaxTokens,
    MaxCompletionTokens,
    MaxOutputTokens,
    N,
    GenerationConfig,
    StreamOptions,
    PreviousResponseId,
    PromptCacheKey,
    Background,
    Messages,
    Input,
    Contents,
    System,
    Instructions,
    SystemInstruction,
    Models,
}

impl Member {
    const ALL: [Member; 18] = [
        Member::Model,
        Member::Stream,
        Member::MaxTokens,
        Member::MaxCompletionTokens,
        Member::MaxOutputTokens,
        Member::N,
        Member::GenerationConfig,
        Member::StreamOptions,
        Member::PreviousResponseId,
        Member::PromptCacheKey,
        Member::Background,
        Member::Messages,
        Member::Input,
        Member::Contents,
        Member::System,
        Member::Instructions,
        Member::SystemInstruction,
        Member::Models,
    ];

    fn named(name: &[u8]) -> Option<Member> {
        match name {
            b"generation_config" => Some(Member::GenerationConfig),
            _ => Member::ALL.into_iter().find(|m| m.name().as_bytes() == name),
        }
    }

    /// The member's name (generate-content's camel-case spelling for `generationConfig`).
    fn name(self) -> &'static str {
        match self {
            Member::Model => "model",
            Member::Stream => "stream",
            Member::MaxTokens => "max_tokens",
            Member::MaxCompletionTokens => "max_completion_tokens",
            Member::MaxOutputTokens => "max_output_tokens",
            Member::N => "n",
            Member::GenerationConfig => "generationConfig",
            Member::StreamOptions => "stream_options",
            Member::PreviousResponseId => "previous_response_id",
            Member::PromptCacheKey => "prompt_cache_key",
            Member::Background => "background",
            Member::Messages => "messages",
            Member::Input => "input",
            Member::Contents => "contents",
            Member::System => "system",
            Member::Instructions => "instructions",
            Member::SystemInstruction => "systemInstruction",
            Member::Models => "models",
        }
    }

    /// Its bit in a set of members seen.
    fn bit(self) -> u32 {
        1 << self as u32
    }

    /// Whether its value is content, walked for media parts.
    fn is_content(self) -> bool {
        matches!(self, Member::Messages | Member::Input | Member::Contents)
    }

    /// Read the member's value (`raw`, already scanned) into `f`.
    fn read<'a>(self, raw: &'a [u8], f: &mut BodyFields<'a>) -> Result<(), ApiError> {
        let name = self.name();
        fn typed<'a, T: Deserialize<'a>>(name: &str, raw: &'a [u8]) -> Result<T, ApiError> {
            serde_json::from_slice(raw).map_err(|e| {
                // A type error: the position serde gives is within the member's value.
                let e = e.to_string();
                let what = e.rsplit_once(" at line ").map_or(e.as_str(), |(what, _)| what);
                ApiError::new(ErrorKind::BadRequest, format!("The request body's '{name}' is not valid: {what}.")).with_param(name)
            })
        }
        // An identifier the client chooses: at most MAX_ID_BYTES, checked before it is parsed.
        fn bounded_id(name: &str, raw: &[u8]) -> Result<Option<String>, ApiError> {
            if raw.len() > MAX_ID_BYTES * 6 + 2 {
                return Err(id_too_long(name));
            }
            let id: Option<String> = typed(name, raw)?;
            if id.as_ref().is_some_and(|id| id.len() > MAX_ID_BYTES) {
                return Err(id_too_long(name));
            }
            Ok(id)
        }
        // `null` is absent, as for any optional field, except in `stream_options`.
        let raw_value = |raw: &'a [u8]| (raw != b"null").then_some(Raw(raw));
        match self {
            Member::Model => {
                // Refused before it is parsed, logged, stored or echoed: a model name is short.
                if raw.len() > MAX_MODEL_BYTES * 6 + 2 {
                    return Err(model_name_too_long());
                }
                let model: Option<String> = typed(name, raw)?;
                if let Some(m) = &model {
                    check_model_name(m)?;
                }
                f.model = model;
            }
            Member::Stream => f.stream = typed(name, raw)?,
            Member::MaxTokens => f.max_tokens = typed(name, raw)?,
            Member::MaxCompletionTokens => f.max_completion_tokens = typed(name, raw)?,
            Member::MaxOutputTokens => f.max_output_tokens = typed(name, raw)?,
            Member::N => f.n = typed(name, raw)?,
            Member::GenerationConfig => f.generation_config = typed(name, raw)?,
            Member::StreamOptions => f.stream_options = Some(Raw(raw)),
            Member::PreviousResponseId => f.previous_response_id = bounded_id(name, raw)?,
            Member::PromptCacheKey => f.prompt_cache_key = bounded_id(name, raw)?,
            Member::Background => f.background = typed(name, raw)?,
            Member::Messages => f.messages = raw_value(raw),
            Member::Input => f.input = raw_value(raw),
            Member::Contents => f.contents = raw_value(raw),
            Member::System => f.system = raw_value(raw),
            Member::Instructions => f.instructions = raw_value(raw),
            Member::SystemInstruction => f.system_instruction = raw_value(raw),
            Member::Models => f.models = raw_value(raw),
        }
        Ok(())
    }
}

/// A change to a JSON request body, made in one copy: members put first in its top-level object,
/// and one span of it replaced. The relay's rewrites of a body (stream usage asked for, the
/// output maximum written) are gathered into one edit, so a body is copied once at most.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BodyEdit {
    /// `"name":value` members, written first in the object, in this order.
    pub first: Vec<String>,
    /// `(start, end, text)`: the bytes `start..end` (inside the object) replaced by `text`.
    pub replace: Option<(usize, usize, String)>,
}

impl BodyEdit {
    pub fn is_empty(&self) -> bool {
        self.first.is_empty() && self.replace.is_none()
    }

    /// `body` with the edit applied (400 when it is not a JSON object, or the span is not in it).
    pub fn apply(&self, body: &[u8]) -> Result<bytes::Bytes, ApiError> {
        let invalid = || ApiError::new(ErrorKind::BadRequest, "The request body must be a JSON object.");
        let open = body.iter().position(|b| !b.is_ascii_whitespace()).filter(|&i| body[i] == b'{').ok_or_else(invalid)?;
        let inside = open + 1;
        let (start, end, text) = match &self.replace {
            Some((start, end, text)) => (*start, *end, text.as_str()),
            None => (inside, inside, ""),
        };
        if start < inside || end < start || end > body.len() {
            return Err(invalid());
        }
        let extra: usize = self.first.iter().map(|m| m.len() + 1).sum::<usize>() + text.len();
        let mut out = Vec::with_capacity(body.len() + extra);
        out.extend_from_slice(&body[..inside]);
        if !self.first.is_empty() {
            out.extend_from_slice(self.first.join(",").as_bytes());
            // A comma before the client's own members, when there are any.
            if body[inside..].iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'}') {
                out.push(b',');
            }
        }
        out.extend_from_slice(&body[inside..start]);
        out.extend_from_slice(text.as_bytes());
        out.extend_from_slice(&body[end..]);
        Ok(bytes::Bytes::from(out))
    }
}

/// The longest model name tollgate accepts, in bytes (docs/security.md): longer is 400
/// `invalid_model`, refused before it is logged, stored, traced or echoed.
pub const MAX_MODEL_BYTES: usize = 256;
/// The longest identifier a client chooses (`previous_response_id`, `prompt_cache_key`).
pub const MAX_ID_BYTES: usize = 512;

fn model_name_too_long() -> ApiError {
    ApiError::new(ErrorKind::InvalidModel, format!("The model name is longer than {MAX_MODEL_BYTES} bytes.")).with_param("model")
}

fn id_too_long(name: &str) -> ApiError {
    ApiError::new(ErrorKind::BadRequest, format!("'{name}' is longer than {MAX_ID_BYTES} bytes.")).with_param(name)
}

/// A model name from a body or a path: at most [`MAX_MODEL_BYTES`], no control characters.
pub fn check_model_name(model: &str) -> Result<(), ApiError> {
    if model.len() > MAX_MODEL_BYTES {
        return Err(model_name_too_long());
    }
    if model.chars().any(char::is_control) {
        return Err(ApiError::new(ErrorKind::InvalidModel, "The model name contains control characters.").with_param("model"));
    }
    Ok(())
}

/// Images and files a request's content names, whose tokens are not in its body: parts whose
/// `type` is an image (`image_url`, `input_image`, `image`) or a file (`file`, `input_file`,
/// `document`) in any protocol, and generate-content's `fileData` parts. Inline data
/// (`inlineData`) is in the body already and is not counted. Counted by [`body_fields`]'s scan
/// over the content fields (`messages`, `input`, `contents`), at every depth; the values of
/// `fileData` and `inlineData` members, and a `type` that is not a string, are not looked into.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MediaCount {
    pub images: u64,
    pub files: u64,
}

/// How many items of a conversation are read, at most, looking for its first user message.
const MAX_LEADING_ITEMS: usize = 8;

/// The most values (array items and object members, nested ones included) a part of a client's
/// body may hold before tollgate parses it into a `serde_json::Value` tree: such a tree costs
/// tens of bytes per value, so `[0,0,0,…]` would take twenty times its size in memory.
pub const MAX_PARSED_VALUES: usize = 10_000;

/// The number of values a JSON text holds (1 for a scalar; array items and object members
/// count, at every depth), counted without parsing: commas and openings outside strings.
/// Stops counting past `cap`.
pub fn json_value_count(raw: &[u8], cap: usize) -> usize {
    let (mut count, mut in_string, mut escaped) = (1usize, false, false);
    for &b in raw {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b',' | b'[' | b'{' => {
                count += 1;
                if count > cap {
                    return count;
                }
            }
            _ => {}
        }
    }
    count
}

/// Refuse part of a client's body holding more than [`MAX_PARSED_VALUES`] values before it is
/// parsed (`what` names it in the error).
pub fn check_value_count(raw: &str, what: &str) -> Result<(), ApiError> {
    if json_value_count(raw.as_bytes(), MAX_PARSED_VALUES) > MAX_PARSED_VALUES {
        return Err(ApiError::new(ErrorKind::BadRequest, format!("{what}: at most {MAX_PARSED_VALUES} JSON values")).with_param(what));
    }
    Ok(())
}

/// Parse part of a client's body into a `Value`, within [`check_value_count`].
pub fn parse_bounded(raw: &str, what: &str) -> Result<Value, ApiError> {
    check_value_count(raw, what)?;
    serde_json::from_str(raw).map_err(|e| ApiError::new(ErrorKind::BadRequest, format!("{what}: {e}")).with_param(what))
}

#[derive(Debug, Default, Deserialize)]
pub struct GenerationConfig {
    #[serde(default, rename = "maxOutputTokens", alias = "max_output_tokens")]
    pub max_output_tokens: Option<u64>,
    #[serde(default, rename = "candidateCount", alias = "candidate_count")]
    pub candidate_count: Option<u64>,
}

/// Most choices one request may ask for (the chat-completions API's own limit).
pub const MAX_CHOICES: u64 = 128;

/// A choice count from the request, refused above [`MAX_CHOICES`]; at least 1.
pub(crate) fn choice_count(n: Option<u64>, param: &str) -> Result<u64, ApiError> {
    match n {
        None => Ok(1),
        Some(n) if n > MAX_CHOICES => {
            Err(ApiError::new(ErrorKind::BadRequest, format!("{param}: at most {MAX_CHOICES} choices per request")).with_param(param))
        }
        Some(n) => Ok(n.max(1)),
    }
}

/// Parse the fields routing needs from a JSON request body.
pub fn body_fields(body: &[u8]) -> Result<BodyFields<'_>, ApiError> {
    if body.is_empty() {
        return Err(ApiError::new(ErrorKind::BadRequest, "The request body is empty; send a JSON object."));
    }
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::new(ErrorKind::BadRequest, "The request body must be a JSON object."));
    }
    let invalid =
        |e: scan::ScanError| ApiError::new(ErrorKind::BadRequest, format!("The request body is not valid JSON: {}.", e.describe(body)));
    /// Why the body is refused: not JSON, or a member tollgate reads is not as it must be.
    enum Refusal {
        Scan(scan::ScanError),
        Member(ApiError),
    }
    impl From<scan::ScanError> for Refusal {
        fn from(e: scan::ScanError) -> Self {
            Refusal::Scan(e)
        }
    }
    let mut s = scan::Scanner::new(body);
    let mut f = BodyFields::default();
    let mut seen = 0u32;
    s.ws();
    let members = s.object(0, |s, key_at, key, depth| {
        let member = if key.escaped {
            let name = key.decoded().ok_or(scan::ScanError { at: key_at, what: "lone surrogate in a key" })?;
            Member::named(name.as_bytes())
        } else {
            Member::named(key.raw)
        };
        let start = s.at;
        match member {
            Some(m) if m.is_content() => s.content(depth, &mut f.media)?,
            _ => s.value(depth)?,
        }
        if let Some(m) = member {
            if seen & m.bit() != 0 {
                let name = m.name();
                let twice = ApiError::new(ErrorKind::BadRequest, format!("The request body gives '{name}' twice.")).with_param(name);
                return Err(Refusal::Member(twice));
            }
            seen |= m.bit();
            m.read(&body[start..s.at], &mut f).map_err(Refusal::Member)?;
        }
        Ok(())
    });
    match members {
        Ok(()) => {}
        Err(Refusal::Scan(e)) => return Err(invalid(e)),
        Err(Refusal::Member(e)) => return Err(e),
    }
    if !s.at_end() {
        return Err(invalid(scan::ScanError { at: s.at, what: "trailing characters" }));
    }
    Ok(f)
}

/// Usage counts an upstream reported, each `None` until seen.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SeenUsage {
    pub input: Option<u64>,
    pub cached: Option<u64>,
    pub cache_write: Option<u64>,
    pub output: Option<u64>,
}

/// What the per-protocol usage readers gather from a response's events: reported usage, and
/// the bytes of generated content (text, reasoning, tool-call arguments) for an estimate.
#[derive(Debug, Default, Clone)]
pub struct Reading {
    pub seen: SeenUsage,
    pub text_bytes: u64,
    /// The id of the response being read (responses API), once seen.
    pub response_id: Option<String>,
    /// What a media answer reported beyond its tokens (see [`media`]).
    pub media: media::MediaSeen,
}

impl Reading {
    /// Count a string's bytes as generated content.
    pub fn text(&mut self, v: Option<&Value>) {
        if let Some(s) = v.and_then(Value::as_str) {
            self.text_bytes = self.text_bytes.saturating_add(s.len() as u64);
        }
    }

    /// Count a JSON value's serialized bytes as generated content.
    pub fn json(&mut self, v: &Value) {
        self.text_bytes = self.text_bytes.saturating_add(v.to_string().len() as u64);
    }
}

/// The string values of every `"key":` member (`quoted_key` is `"key"`, quotes included) in a
/// JSON text, in order, found by searching
/// for the key rather than parsing the text (a traced answer's model and finish reasons are a
/// few bytes of a body that may be long). A key inside a string value cannot match: its quotes
/// are escaped there. A member whose value is not a string is skipped.
pub(crate) fn key_strings<'a>(body: &'a [u8], key: &'static QuotedKey) -> impl Iterator<Item = std::borrow::Cow<'a, str>> + 'a {
    let quoted_key = key.0;
    key.finder().find_iter(body).filter_map(move |at| {
        if at > 0 && body[at - 1] == b'\\' {
            return None;
        }
        let rest = body[at + quoted_key.len()..].trim_ascii_start();
        let value = rest.strip_prefix(b":")?.trim_ascii_start();
        if value.first() != Some(&b'"') {
            return None;
        }
        // A string without escapes is taken where it is; one with escapes is decoded.
        let plain = value[1..].iter().position(|&b| b == b'"' || b == b'\\').filter(|&end| value[1 + end] == b'"');
        match plain {
            Some(end) => std::str::from_utf8(&value[1..1 + end]).ok().map(std::borrow::Cow::Borrowed),
            None => serde_json::Deserializer::from_slice(value).into_iter::<std::borrow::Cow<'a, str>>().next()?.ok(),
        }
    })
}

/// A member's name as [`key_strings`] searches for it, quotes included, with its searcher
/// built once (building one cost more than the search in a small answer).
pub(crate) struct QuotedKey(&'static str, std::sync::OnceLock<memchr::memmem::Finder<'static>>);

impl QuotedKey {
    pub(crate) const fn new(quoted: &'static str) -> QuotedKey {
        QuotedKey(quoted, std::sync::OnceLock::new())
    }

    fn finder(&self) -> &memchr::memmem::Finder<'static> {
        self.1.get_or_init(|| memchr::memmem::Finder::new(self.0.as_bytes()))
    }
}

/// `"model"`, read from chat-completion and message answers.
pub(crate) static MODEL_KEY: QuotedKey = QuotedKey::new("\"model\"");

/// An unsigned integer at a JSON pointer.
pub(crate) fn u(v: &Value, path: &str) -> Option<u64> {
    at(v, path).and_then(Value::as_u64)
}

/// The value at a JSON pointer written without escapes (`/usage/prompt_tokens`), found without
/// allocating: `Value::pointer` builds a `String` per segment, and the usage readers run on
/// every response and every stream event.
pub(crate) fn at<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('/').skip(1).try_fold(v, |v, segment| match v {
        Value::Object(map) => map.get(segment),
        Value::Array(items) => segment.parse::<usize>().ok().and_then(|i| items.get(i)),
        _ => None,
    })
}

/// Every header a client key may arrive in (each protocol's, and the spec's alternative).
pub const KEY_HEADERS: [&str; 4] = ["authorization", "x-api-key", "x-goog-api-key", "x-alt-api-key"];

/// Headers tollgate sets itself or that carry credentials: never relayed from a client, not
/// even when an operator lists them in `forward_headers`.
pub fn never_forwarded(name: &str) -> bool {
    KEY_HEADERS.contains(&name)
        || [
            "proxy-authorization",
            "cookie",
            "host",
            "content-length",
            "transfer-encoding",
            "connection",
            "expect",
            "accept-encoding",
            "anthropic-version",
            "compat-version",
            "x-goog-user-project",
            "x-goog-fieldmask",
            "openai-organization",
            "openai-project",
            "te",
            "upgrade",
            "keep-alive",
        ]
        .contains(&name)
}

/// Why a request is refused or failed, independent of protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    BadRequest,
    Unauthorized,
    InsufficientBalance,
    /// The caller is known but may not do this (403).
    Forbidden,
    NotFound,
    ModelNotFound,
    PayloadTooLarge,
    /// The client did not send its request in time (408).
    RequestTimeout,
    /// The gateway has no room for the request right now (503, with `Retry-After`).
    Overloaded,
    /// A fleet node cannot reach its database for what the request needs (503, `Retry-After`).
    StoreUnavailable,
    /// The resource is not in a state that allows this (video not ready).
    Conflict,
    /// The resource existed but is no longer available (expired video URL).
    Gone,
    RateLimited,
    BadGateway,
    GatewayTimeout,
    Internal,
    /// The key is past its `expires_at` (401).
    KeyExpired,
    /// The client address is outside the key's `ip_allow` (403).
    IpNotAllowed,
    /// The key's model rules exclude the model (403).
    ModelNotAllowed,
    /// The request's worst-case cost is above the key's `max_request_cost` (402).
    RequestCostCap,
    /// A spend window (day, week, month) of the key or its account has no room for the
    /// request (429, `Retry-After` to the window's end).
    BudgetExceeded,
    /// A model name no provider could serve: too long, or not text (400 `invalid_model`).
    InvalidModel,
    /// The upstream refused tollgate's own credential (502 `upstream_auth_failed`).
    UpstreamAuthFailed,
    /// An `Idempotency-Key` sent again with another body (422 `idempotency_key_reused`).
    IdempotencyKeyReused,
    /// A guardrail blocked what the call sends or what came back (400 `content_policy_violation`).
    ContentPolicy,
    /// A guardrail that fails closed could not check the call (503 `guardrail_unavailable`).
    GuardrailUnavailable,
}

impl ErrorKind {
    /// The machine-readable code of a refusal, the same in every protocol's shape:
    /// chat-completions' `error.code`, messages' `error.code` (beside `type`, which the SDKs
    /// read; they ignore the rest), generate-content's `google.rpc.ErrorInfo` reason (in capitals).
    /// None for a plain bad request (its `param` says what was wrong).
    pub fn code(self) -> Option<&'static str> {
        Some(match self {
            ErrorKind::BadRequest => return None,
            ErrorKind::Unauthorized => "invalid_api_key",
            ErrorKind::InsufficientBalance => "insufficient_quota",
            ErrorKind::NotFound => "unknown_url",
            ErrorKind::ModelNotFound => "model_not_found",
            ErrorKind::PayloadTooLarge => "request_too_large",
            ErrorKind::RequestTimeout => "request_timeout",
            ErrorKind::Overloaded => "overloaded",
            ErrorKind::StoreUnavailable => "store_unavailable",
            ErrorKind::Conflict => "not_ready",
            ErrorKind::Gone => "expired",
            ErrorKind::Forbidden => "forbidden",
            ErrorKind::RateLimited => "rate_limit_exceeded",
            ErrorKind::BadGateway => "upstream_unavailable",
            ErrorKind::GatewayTimeout => "upstream_timeout",
            ErrorKind::Internal => "internal_error",
            ErrorKind::KeyExpired => "key_expired",
            ErrorKind::IpNotAllowed => "ip_not_allowed",
            ErrorKind::ModelNotAllowed => "model_not_allowed",
            ErrorKind::RequestCostCap => "request_cost_cap_exceeded",
            ErrorKind::BudgetExceeded => "budget_exceeded",
            ErrorKind::InvalidModel => "invalid_model",
            ErrorKind::UpstreamAuthFailed => "upstream_auth_failed",
            ErrorKind::IdempotencyKeyReused => "idempotency_key_reused",
            ErrorKind::ContentPolicy => "content_policy_violation",
            ErrorKind::GuardrailUnavailable => "guardrail_unavailable",
        })
    }

    /// A short code for the access log's `reason=`.
    pub fn reason(self) -> &'static str {
        match self {
            ErrorKind::BadRequest => "invalid_request",
            ErrorKind::Unauthorized => "unauthorized",
            ErrorKind::InsufficientBalance => "insufficient_balance",
            ErrorKind::Forbidden => "forbidden",
            ErrorKind::NotFound => "not_found",
            ErrorKind::ModelNotFound => "unknown_model",
            ErrorKind::PayloadTooLarge => "body_too_large",
            ErrorKind::RequestTimeout => "body_timeout",
            ErrorKind::Overloaded => "overloaded",
            ErrorKind::StoreUnavailable => "store_unavailable",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Gone => "gone",
            ErrorKind::RateLimited => "rate_limited",
            ErrorKind::BadGateway => "upstream_failed",
            ErrorKind::GatewayTimeout => "upstream_timeout",
            ErrorKind::Internal => "internal",
            ErrorKind::KeyExpired => "key_expired",
            ErrorKind::IpNotAllowed => "ip_not_allowed",
            ErrorKind::ModelNotAllowed => "model_not_allowed",
            ErrorKind::RequestCostCap => "request_cost_cap_exceeded",
            ErrorKind::BudgetExceeded => "budget_exceeded",
            ErrorKind::InvalidModel => "invalid_model",
            ErrorKind::UpstreamAuthFailed => "upstream_auth_failed",
            ErrorKind::IdempotencyKeyReused => "idempotency_key_reused",
            ErrorKind::ContentPolicy => "content_policy_violation",
            ErrorKind::GuardrailUnavailable => "guardrail_unavailable",
        }
    }

    pub fn status(self) -> u16 {
        match self {
            ErrorKind::BadRequest | ErrorKind::InvalidModel | ErrorKind::ContentPolicy => 400,
            ErrorKind::IdempotencyKeyReused => 422,
            ErrorKind::UpstreamAuthFailed => 502,
            ErrorKind::Unauthorized | ErrorKind::KeyExpired => 401,
            ErrorKind::InsufficientBalance | ErrorKind::RequestCostCap => 402,
            ErrorKind::Forbidden | ErrorKind::IpNotAllowed | ErrorKind::ModelNotAllowed => 403,
            ErrorKind::NotFound | ErrorKind::ModelNotFound => 404,
            ErrorKind::PayloadTooLarge => 413,
            ErrorKind::RequestTimeout => 408,
            ErrorKind::Overloaded | ErrorKind::StoreUnavailable | ErrorKind::GuardrailUnavailable => 503,
            ErrorKind::Conflict => 409,
            ErrorKind::Gone => 410,
            ErrorKind::RateLimited | ErrorKind::BudgetExceeded => 429,
            ErrorKind::BadGateway => 502,
            ErrorKind::GatewayTimeout => 504,
            ErrorKind::Internal => 500,
        }
    }
}

/// A client-facing error: the kind decides the status, the message is safe to show
/// (it never names an upstream host or key).
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
    pub param: Option<String>,
    /// Seconds for `Retry-After` (429).
    pub retry_after: Option<u64>,
    /// An upstream's own status, kept when its error is passed on in another protocol's shape.
    pub upstream_status: Option<u16>,
    /// An upstream's own error code (`context_length_exceeded`), shown as chat-completions' `code`.
    pub upstream_code: Option<String>,
}

impl ApiError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ApiError { kind, message: message.into(), param: None, retry_after: None, upstream_status: None, upstream_code: None }
    }

    pub fn with_param(mut self, param: &str) -> Self {
        self.param = Some(param.to_string());
        self
    }

    pub fn status(&self) -> u16 {
        self.upstream_status.unwrap_or_else(|| self.kind.status())
    }

    /// The JSON body in `protocol`'s own error shape: every error a client is answered with
    /// passes here, its message and `param` bounded (they may quote what the client sent).
    pub fn body(&self, protocol: Protocol) -> Vec<u8> {
        use crate::base::text::{clip, MAX_CLIENT_STRING, MAX_ERROR_MESSAGE};
        let long = self.message.len() > MAX_ERROR_MESSAGE || self.param.as_ref().is_some_and(|p| p.len() > MAX_CLIENT_STRING);
        let bounded;
        let err = if long {
            bounded = ApiError {
                message: clip(&self.message, MAX_ERROR_MESSAGE).into_owned(),
                param: self.param.as_deref().map(|p| clip(p, MAX_CLIENT_STRING).into_owned()),
                ..self.clone()
            };
            &bounded
        } else {
            self
        };
        let value = match protocol {
            Protocol::Openai => openai::error_body(err),
            Protocol::Anthropic => anthropic::error_body(err),
            Protocol::Gemini => gemini::error_body(err),
        };
        value.to_string().into_bytes()
    }
}

/// A model as the model lists show it.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelEntry {
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    pub owned_by: &'static str,
}

/// Unix seconds → RFC 3339 UTC (`1970-01-01T00:00:00Z`).
pub fn rfc3339(unix: u64) -> String {
    let secs = unix % 86_400;
    format!("{}T{:02}:{:02}:{:02}Z", utc_date(unix / 86_400), secs / 3600, (secs / 60) % 60, secs % 60)
}

/// Days since the Unix epoch → the UTC date (`1970-01-01`).
pub fn utc_date(days: u64) -> String {
    // Civil-from-days (H. Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

#[cfg(test)]
pub mod tests;
