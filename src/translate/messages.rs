//! The messages protocol, both sides: a client's request and the answer it reads, a provider's
//! request and the answer it sends (whole and streamed).

use super::carry;
use super::view::{Json, Object, NULL};
use super::{
    arguments_value, float, invalid, new_id, stops, text_of, uint, unsupported, Event, Field, Image, Message, Part, Reasoning, Request,
    Response, Role, Stop, Tool, ToolCall, ToolChoice, Translation, Usage,
};
use crate::config::Protocol;
use crate::protocol::ApiError;
use serde::Serialize;
use serde_json::{json, Value};

/// Request fields read by the decoder.
const MAPPED: [&str; 13] = [
    "model",
    "messages",
    "system",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop_sequences",
    "stream",
    "tools",
    "tool_choice",
    "thinking",
    "output_config",
];

/// Request fields that change nothing a provider of another protocol answers: dropped. (Also
/// dropped wherever they appear: `cache_control` on blocks, and the `anthropic-beta` header.)
pub const DROPPED: [&str; 3] = ["metadata", "service_tier", "context_management"];

/// The thinking budget the messages protocol accepts at least.
const MIN_BUDGET: u64 = 1024;

/// A messages client's request in the internal form, refused where `to` cannot carry it.
pub fn decode_request(mut body: Object<'_>, to: Protocol) -> Result<Request, ApiError> {
    super::check_fields(&body, &MAPPED, &DROPPED, to)?;
    let mut req = Request::default();
    match body.get("system") {
        None | Some(Json::Null) => {}
        Some(v) => req.system.push(text_of(v).ok_or_else(|| invalid("system", "must be text or text blocks"))?),
    }
    let Some(Json::Array(messages)) = body.remove("messages") else {
        return Err(invalid("messages", "a list of messages is required"));
    };
    for (i, m) in messages.iter().enumerate() {
        let field = Field("messages", i);
        let role = match m.get("role").and_then(Json::as_str) {
            Some("user") => Role::User,
            Some("assistant") => Role::Assistant,
            // Instructions in the middle of a conversation (sent by some agents).
            Some("system") => Role::System,
            _ => return Err(invalid(field, "role must be user or assistant")),
        };
        let parts = match m.get("content") {
            Some(Json::String(s)) => vec![Part::Text(s.to_string())],
            Some(Json::Array(blocks)) => {
                blocks.iter().map(|b| block(b, field, to)).collect::<Result<Vec<_>, _>>()?.into_iter().flatten().collect()
            }
            _ => return Err(invalid(field, "content must be text or a list of blocks")),
        };
        req.messages.push(Message { role, parts });
    }
    if let Some(Json::Array(tools)) = body.get("tools") {
        for t in tools {
            if t.get("type").and_then(Json::as_str).is_some_and(|kind| kind != "custom") {
                return Err(unsupported("tools", to, "only client tools (name, input_schema) can be carried"));
            }
            req.tools.push(Tool {
                name: t.get("name").and_then(Json::as_str).ok_or_else(|| invalid("tools", "a tool needs a name"))?.to_string(),
                description: t.get("description").and_then(Json::as_str).map(str::to_string),
                schema: t.get("input_schema").map(Json::to_value).unwrap_or_else(|| json!({"type": "object", "properties": {}})),
            });
        }
    }
    if let Some(choice) = body.get("tool_choice").filter(|v| !v.is_null()) {
        req.no_parallel_tools = choice.get("disable_parallel_tool_use").and_then(Json::as_bool) == Some(true);
        req.tool_choice = Some(match choice.get("type").and_then(Json::as_str) {
            Some("auto") => ToolChoice::Auto,
            Some("any") => ToolChoice::Required,
            Some("none") => ToolChoice::None,
            Some("tool") => ToolChoice::Named(
                choice.get("name").and_then(Json::as_str).ok_or_else(|| invalid("tool_choice", "a named tool needs its name"))?.to_string(),
            ),
            _ => return Err(invalid("tool_choice", "type must be auto, any, none or tool")),
        });
    }
    if let Some(v) = body.get("max_tokens").filter(|v| !v.is_null()) {
        req.max_output = Some(uint(v, "max_tokens")?);
    }
    if let Some(v) = body.get("temperature").filter(|v| !v.is_null()) {
        req.temperature = Some(float(v, "temperature")?);
    }
    if let Some(v) = body.get("top_p").filter(|v| !v.is_null()) {
        req.top_p = Some(float(v, "top_p")?);
    }
    if let Some(v) = body.get("top_k").filter(|v| !v.is_null()) {
        req.top_k = Some(uint(v, "top_k")?);
    }
    if let Some(v) = body.get("stop_sequences").filter(|v| !v.is_null()) {
        req.stop = stops(v, "stop_sequences")?;
    }
    if let Some(t) = body.get("thinking").filter(|v| !v.is_null()) {
        req.reasoning = match t.get("type").and_then(Json::as_str) {
            Some("enabled") => Some(Reasoning::Budget(uint(t.get("budget_tokens").unwrap_or(&NULL), "thinking.budget_tokens")?)),
            Some("disabled") => Some(Reasoning::Off),
            // The model decides: the provider's default.
            Some("adaptive") => None,
            _ => return Err(invalid("thinking", "type must be enabled, disabled or adaptive")),
        };
    }
    if let Some(config) = body.get("output_config").filter(|v| !v.is_null()) {
        if let Some(effort) = config.get("effort").and_then(Json::as_str) {
            // Effort asks for more or less reasoning: the other protocols' reasoning controls.
            let effort = if effort == "max" { "high" } else { effort };
            if req.reasoning != Some(Reasoning::Off) {
                req.reasoning =
                    Some(Reasoning::from_effort(effort).ok_or_else(|| invalid("output_config.effort", "low, medium, high or max"))?);
            }
        }
        if let Some(format) = config.get("format").filter(|v| !v.is_null()) {
            if format.get("type").and_then(Json::as_str) != Some("json_schema") {
                return Err(invalid("output_config.format", "type must be json_schema"));
            }
            req.json_output =
                Some(Some(format.get("schema").map(Json::to_value).ok_or_else(|| invalid("output_config.format", "schema is required"))?));
        }
        if let Some((other, _)) = config.as_object().and_then(|c| c.iter().find(|(k, _)| !["effort", "format"].contains(k))) {
            return Err(unsupported(format!("output_config.{other}"), to, "it has no counterpart there"));
        }
    }
    Ok(req)
}

/// One content block (None: nothing to carry, e.g. an empty thinking block).
fn block(b: &Json<'_>, field: Field, to: Protocol) -> Result<Option<Part>, ApiError> {
    let kind = b.get("type").and_then(Json::as_str).unwrap_or_default();
    Ok(Some(match kind {
        "text" => Part::Text(b.get("text").and_then(Json::as_str).unwrap_or_default().to_string()),
        "image" => Part::Image(image(b, field)?),
        "tool_use" => Part::ToolCall(ToolCall {
            id: b.get("id").and_then(Json::as_str).ok_or_else(|| invalid(field, "tool_use needs an id"))?.to_string(),
            name: b.get("name").and_then(Json::as_str).unwrap_or_default().to_string(),
            arguments: b.get("input").map_or_else(|| "{}".to_string(), Json::to_json_text),
            signature: None,
        }),
        "tool_result" => {
            let content = match b.get("content") {
                None | Some(Json::Null) => Vec::new(),
                Some(Json::String(s)) => vec![Part::Text(s.to_string())],
                Some(Json::Array(items)) => items
                    .iter()
                    .map(|i| match i.get("type").and_then(Json::as_str) {
                        Some("text") => Ok(Part::Text(i.get("text").and_then(Json::as_str).unwrap_or_default().to_string())),
                        Some("image") => image(i, field).map(Part::Image),
                        _ => Err(unsupported(format!("{field}.content"), to, "tool results carry text and images only")),
                    })
                    .collect::<Result<_, _>>()?,
                Some(_) => return Err(invalid(field, "tool_result content must be text or blocks")),
            };
            Part::ToolResult {
                id: b.get("tool_use_id").and_then(Json::as_str).ok_or_else(|| invalid(field, "tool_result needs tool_use_id"))?.to_string(),
                content,
                is_error: b.get("is_error").and_then(Json::as_bool) == Some(true),
            }
        }
        "thinking" => {
            let text = b.get("thinking").and_then(Json::as_str).unwrap_or_default().to_string();
            // An empty signature is tollgate's own (thinking from a provider of another protocol).
            let signature = b.get("signature").and_then(Json::as_str).filter(|s| !s.is_empty()).map(str::to_string);
            Part::Thinking { text, signature }
        }
        "redacted_thinking" => Part::RedactedThinking(b.get("data").and_then(Json::as_str).unwrap_or_default().to_string()),
        other => return Err(unsupported(format!("{field}.content"), to, &format!("'{other}' blocks have no counterpart"))),
    }))
}

fn image(b: &Json<'_>, field: Field) -> Result<Image, ApiError> {
    let source = b.get("source").ok_or_else(|| invalid(field, "an image needs a source"))?;
    match source.get("type").and_then(Json::as_str) {
        Some("base64") => Ok(Image::Base64 {
            media_type: source.get("media_type").and_then(Json::as_str).unwrap_or("image/png").to_string(),
            data: source.get("data").and_then(Json::as_str).unwrap_or_default().to_string(),
        }),
        Some("url") => Ok(Image::Url(source.get("url").and_then(Json::as_str).unwrap_or_default().to_string())),
        _ => Err(invalid(field, "an image source is base64 or url")),
    }
}

fn image_block(i: &Image) -> SentBlock<'_> {
    let source = match i {
        Image::Url(url) => SentSource { data: None, media_type: None, kind: "url", url: Some(url) },
        Image::Base64 { media_type, data } => SentSource { data: Some(data), media_type: Some(media_type), kind: "base64", url: None },
    };
    SentBlock { source: Some(source), ..SentBlock::of("image") }
}

/// The internal form as a messages provider's request, as the JSON text sent (`count`: as its
/// token-counting request, without what does not count as input). Written straight from the
/// internal form, members in name order (as a `Value` map wrote them before).
pub fn encode_request(req: &Request, count: bool) -> Result<Vec<u8>, ApiError> {
    let to = Protocol::Anthropic;
    if req.seed.is_some() {
        return Err(unsupported("seed", to, "it has no seed"));
    }
    if req.presence_penalty.is_some() || req.frequency_penalty.is_some() {
        return Err(unsupported("presence_penalty", to, "it has no penalties"));
    }
    let format = match &req.json_output {
        Some(Some(schema)) => Some(SentConfig { format: SentFormat { schema, kind: "json_schema" } }),
        Some(None) => return Err(unsupported("response_format", to, "structured output needs a JSON schema there (json_object has none)")),
        None => None,
    };
    let turns = super::alternating_turns(&req.messages);
    let mut messages = Vec::with_capacity(turns.len());
    for m in &turns {
        let mut content: Vec<SentBlock<'_>> = Vec::with_capacity(m.parts.len());
        // Tool results open a user turn.
        let (results, rest): (Vec<&Part>, Vec<&Part>) = m.parts.iter().partition(|p| matches!(p, Part::ToolResult { .. }));
        for p in results.into_iter().chain(rest) {
            match p {
                Part::Text(t) if !t.is_empty() => content.push(SentBlock { text: Some(t), ..SentBlock::of("text") }),
                Part::Text(_) => {}
                Part::Image(i) => content.push(image_block(i)),
                // Never invented: thinking without an Anthropic signature stays behind.
                Part::Thinking { text, signature: Some(sig) } => {
                    content.push(SentBlock { signature: Some(sig), thinking: Some(text), ..SentBlock::of("thinking") })
                }
                Part::Thinking { .. } => {}
                Part::RedactedThinking(data) => content.push(SentBlock { data: Some(data), ..SentBlock::of("redacted_thinking") }),
                Part::ToolCall(c) => content.push(SentBlock {
                    id: Some(&c.id),
                    input: Some(arguments_value(&c.arguments)),
                    name: Some(&c.name),
                    ..SentBlock::of("tool_use")
                }),
                Part::ToolResult { id, content: inner, is_error } => {
                    let inner = inner
                        .iter()
                        .filter_map(|p| match p {
                            Part::Text(t) => Some(SentBlock { text: Some(t), ..SentBlock::of("text") }),
                            Part::Image(i) => Some(image_block(i)),
                            _ => None,
                        })
                        .collect();
                    content.push(SentBlock {
                        content: Some(inner),
                        is_error: is_error.then_some(true),
                        tool_use_id: Some(id),
                        ..SentBlock::of("tool_result")
                    });
                }
            }
        }
        if !content.is_empty() {
            messages.push(SentMessage { content, role: if m.role == Role::Assistant { "assistant" } else { "user" } });
        }
    }
    let max_tokens = req.max_output.unwrap_or(crate::base::usage::MAX_OUTPUT_ALLOWANCE);
    let mut choice = match &req.tool_choice {
        Some(ToolChoice::Auto) => Some(SentChoice { disable_parallel_tool_use: None, name: None, kind: "auto" }),
        Some(ToolChoice::None) => Some(SentChoice { disable_parallel_tool_use: None, name: None, kind: "none" }),
        Some(ToolChoice::Required) => Some(SentChoice { disable_parallel_tool_use: None, name: None, kind: "any" }),
        Some(ToolChoice::Named(name)) => Some(SentChoice { disable_parallel_tool_use: None, name: Some(name), kind: "tool" }),
        None if req.no_parallel_tools && !req.tools.is_empty() => {
            Some(SentChoice { disable_parallel_tool_use: None, name: None, kind: "auto" })
        }
        None => None,
    };
    if let Some(c) = choice.as_mut().filter(|c| req.no_parallel_tools && c.kind != "none") {
        c.disable_parallel_tool_use = Some(true);
    }
    // The protocol takes a budget of at least 1024 and below the output maximum.
    let thinking = match req.reasoning {
        Some(Reasoning::Budget(b)) => Some(b.max(MIN_BUDGET).min(max_tokens.saturating_sub(1))).filter(|b| *b >= MIN_BUDGET),
        _ => None,
    };
    // A count takes what counts as input only.
    let sampling = !count;
    let wire = SentRequest {
        max_tokens: sampling.then_some(max_tokens),
        messages,
        model: &req.model,
        output_config: format,
        stop_sequences: if sampling { &req.stop } else { &[] },
        stream: sampling && req.stream,
        system: req.system.iter().map(|s| SentBlock { text: Some(s), ..SentBlock::of("text") }).collect(),
        temperature: req.temperature.filter(|_| sampling),
        thinking: thinking.map(|budget_tokens| SentThinking { budget_tokens, kind: "enabled" }),
        tool_choice: choice,
        tools: req
            .tools
            .iter()
            .map(|t| SentTool { description: t.description.as_deref(), input_schema: &t.schema, name: &t.name })
            .collect(),
        top_k: req.top_k.filter(|_| sampling),
        top_p: req.top_p.filter(|_| sampling),
    };
    let mut out = Vec::with_capacity(256);
    super::sse::serialized_into(&mut out, &wire);
    Ok(out)
}

/// A messages request as written (members in name order).
#[derive(Serialize)]
struct SentRequest<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u64>,
    messages: Vec<SentMessage<'a>>,
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    output_config: Option<SentConfig<'a>>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    stop_sequences: &'a [String],
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    system: Vec<SentBlock<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking: Option<SentThinking>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<SentChoice<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<SentTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_k: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
}

#[derive(Serialize)]
struct SentMessage<'a> {
    content: Vec<SentBlock<'a>>,
    role: &'static str,
}

/// A content block: its type and the members of that type (in name order).
#[derive(Serialize, Default)]
struct SentBlock<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<Vec<SentBlock<'a>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    /// A tool call's arguments as the object the protocol's `input` is.
    input: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    is_error: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    signature: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    source: Option<SentSource<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_use_id: Option<&'a str>,
    #[serde(rename = "type")]
    kind: &'static str,
}

impl SentBlock<'_> {
    fn of(kind: &'static str) -> Self {
        SentBlock { kind, ..SentBlock::default() }
    }
}

#[derive(Serialize)]
struct SentSource<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    media_type: Option<&'a str>,
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    url: Option<&'a str>,
}

#[derive(Serialize)]
struct SentConfig<'a> {
    format: SentFormat<'a>,
}

#[derive(Serialize)]
struct SentFormat<'a> {
    schema: &'a Value,
    #[serde(rename = "type")]
    kind: &'static str,
}

#[derive(Serialize)]
struct SentThinking {
    budget_tokens: u64,
    #[serde(rename = "type")]
    kind: &'static str,
}

#[derive(Serialize)]
struct SentChoice<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    disable_parallel_tool_use: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    #[serde(rename = "type")]
    kind: &'static str,
}

#[derive(Serialize)]
struct SentTool<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a str>,
    input_schema: &'a Value,
    name: &'a str,
}

fn stop_of(reason: &str) -> Option<Stop> {
    Some(match reason {
        "end_turn" | "pause_turn" => Stop::EndTurn,
        "max_tokens" | "model_context_window_exceeded" => Stop::MaxTokens,
        "tool_use" => Stop::ToolUse,
        "stop_sequence" => Stop::StopSequence,
        "refusal" => Stop::ContentFilter,
        _ => return None,
    })
}

fn stop_name(stop: Stop) -> &'static str {
    match stop {
        Stop::EndTurn => "end_turn",
        Stop::MaxTokens => "max_tokens",
        Stop::ToolUse => "tool_use",
        Stop::StopSequence => "stop_sequence",
        Stop::ContentFilter => "refusal",
    }
}

/// Messages usage (already the internal meaning: input excludes cache reads and writes).
fn usage_of(u: &Json<'_>) -> Usage {
    let n = |name: &str| u.get(name).and_then(Json::as_u64).unwrap_or(0);
    Usage {
        input: n("input_tokens"),
        cache_read: n("cache_read_input_tokens"),
        cache_write: n("cache_creation_input_tokens"),
        output: n("output_tokens"),
        reasoning: 0,
    }
}

fn usage_value(u: &Usage) -> Value {
    json!({
        "input_tokens": u.input,
        "cache_creation_input_tokens": u.cache_write,
        "cache_read_input_tokens": u.cache_read,
        "output_tokens": u.output,
    })
}

/// A messages provider's whole answer in the internal form.
pub fn decode_response(v: &Json<'_>) -> Option<Response> {
    let blocks = v.get("content")?.as_array()?;
    let mut parts = Vec::new();
    for b in blocks {
        match b.get("type").and_then(Json::as_str) {
            Some("text") => parts.push(Part::Text(b.get("text").and_then(Json::as_str).unwrap_or_default().to_string())),
            Some("thinking") => parts.push(Part::Thinking {
                text: b.get("thinking").and_then(Json::as_str).unwrap_or_default().to_string(),
                signature: b.get("signature").and_then(Json::as_str).map(str::to_string),
            }),
            Some("redacted_thinking") => {
                parts.push(Part::RedactedThinking(b.get("data").and_then(Json::as_str).unwrap_or_default().to_string()))
            }
            Some("tool_use") => parts.push(Part::ToolCall(ToolCall {
                id: b.get("id").and_then(Json::as_str).map_or_else(|| new_id("toolu_"), str::to_string),
                name: b.get("name").and_then(Json::as_str).unwrap_or_default().to_string(),
                arguments: b.get("input").map_or_else(|| "{}".to_string(), Json::to_json_text),
                signature: None,
            })),
            _ => {}
        }
    }
    Some(Response {
        id: v.get("id").and_then(Json::as_str).unwrap_or_default().to_string(),
        parts,
        stop: v.get("stop_reason").and_then(Json::as_str).and_then(stop_of),
        usage: v.get("usage").filter(|u| u.as_object().is_some()).map(usage_of),
    })
}

/// A tool call's arguments as the JSON object a tool_use block's `input` is (`{}` when they
/// are empty or not an object).
fn input_of(arguments: &str) -> &str {
    if !arguments.trim_start().starts_with('{') {
        return "{}";
    }
    serde_json::from_str::<&serde_json::value::RawValue>(arguments).map_or("{}", |raw| raw.get())
}

/// The internal form as the whole answer a messages client reads. Its member names and
/// punctuation are written as they are and its strings through serde_json, member by member in
/// the order the API writes them: serde's derived writer escaped every fixed member name again
/// on every answer (a small answer's translation: 12.6 K instructions before, 9.2 K after).
pub fn encode_response(t: &Translation, r: &Response) -> Vec<u8> {
    use super::sse::{number_into as number, string_into as string};
    let ids = carry::client_call_ids(&r.parts);
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(br#"{"id":"#);
    string(&mut out, &new_id("msg_"));
    out.extend_from_slice(br#","type":"message","role":"assistant","model":"#);
    string(&mut out, &t.model);
    out.extend_from_slice(br#","content":["#);
    let mut calls = 0;
    let mut first = true;
    for p in &r.parts {
        let at = out.len();
        if !first {
            out.push(b',');
        }
        match p {
            Part::Text(text) => {
                out.extend_from_slice(br#"{"type":"text","text":"#);
                string(&mut out, text);
            }
            Part::Thinking { text, signature } => {
                out.extend_from_slice(br#"{"type":"thinking","thinking":"#);
                string(&mut out, text);
                out.extend_from_slice(br#","signature":"#);
                string(&mut out, signature.as_deref().unwrap_or_default());
            }
            Part::RedactedThinking(data) => {
                out.extend_from_slice(br#"{"type":"redacted_thinking","data":"#);
                string(&mut out, data);
            }
            Part::ToolCall(c) => {
                let id = ids.get(calls).map_or(c.id.as_str(), String::as_str);
                calls += 1;
                out.extend_from_slice(br#"{"type":"tool_use","id":"#);
                string(&mut out, id);
                out.extend_from_slice(br#","name":"#);
                string(&mut out, &c.name);
                out.extend_from_slice(br#","input":"#);
                out.extend_from_slice(input_of(&c.arguments).as_bytes());
            }
            _ => {
                out.truncate(at);
                continue;
            }
        }
        out.push(b'}');
        first = false;
    }
    let usage = r.usage.unwrap_or(Usage { input: t.input_estimate, ..Usage::default() });
    out.extend_from_slice(br#"],"stop_reason":"#);
    string(&mut out, stop_name(r.stop.unwrap_or(Stop::EndTurn)));
    out.extend_from_slice(br#","stop_sequence":null,"usage":{"input_tokens":"#);
    number(&mut out, usage.input);
    out.extend_from_slice(br#","cache_creation_input_tokens":"#);
    number(&mut out, usage.cache_write);
    out.extend_from_slice(br#","cache_read_input_tokens":"#);
    number(&mut out, usage.cache_read);
    out.extend_from_slice(br#","output_tokens":"#);
    number(&mut out, usage.output);
    out.extend_from_slice(b"}}");
    out
}

/// Reads a messages provider's stream.
#[derive(Debug, Default)]
pub struct Decoder {
    usage: Usage,
    /// The text of the thinking block being streamed (its signature comes last).
    thinking: String,
}

impl Decoder {
    pub fn event(&mut self, data: &str, out: &mut Vec<Event>) {
        let Ok(v) = super::view::parse(data, "event") else { return };
        match v.get("type").and_then(Json::as_str).unwrap_or_default() {
            "message_start" => {
                if let Some(u) = v.pointer("/message/usage") {
                    self.usage = usage_of(u);
                    out.push(Event::Usage(self.usage));
                }
            }
            "content_block_start" => {
                let b = v.get("content_block").unwrap_or(&NULL);
                match b.get("type").and_then(Json::as_str) {
                    Some("text") => {
                        if let Some(t) = b.get("text").and_then(Json::as_str).filter(|t| !t.is_empty()) {
                            out.push(Event::Text(t.to_string()));
                        }
                    }
                    Some("tool_use") => out.push(Event::ToolStart {
                        id: b.get("id").and_then(Json::as_str).map_or_else(|| new_id("toolu_"), str::to_string),
                        name: b.get("name").and_then(Json::as_str).unwrap_or_default().to_string(),
                        signature: None,
                    }),
                    Some("thinking") => self.thinking.clear(),
                    Some("redacted_thinking") => {
                        out.push(Event::RedactedThinking(b.get("data").and_then(Json::as_str).unwrap_or_default().to_string()))
                    }
                    _ => {}
                }
            }
            "content_block_delta" => {
                let d = v.get("delta").unwrap_or(&NULL);
                let s = |field: &str| d.get(field).and_then(Json::as_str).unwrap_or_default().to_string();
                match d.get("type").and_then(Json::as_str) {
                    Some("text_delta") => out.push(Event::Text(s("text"))),
                    Some("input_json_delta") => {
                        let piece = s("partial_json");
                        if !piece.is_empty() {
                            out.push(Event::ToolArgs(piece));
                        }
                    }
                    Some("thinking_delta") => {
                        let piece = s("thinking");
                        self.thinking.push_str(&piece);
                        out.push(Event::Thinking(piece));
                    }
                    Some("signature_delta") => {
                        out.push(Event::SignedThinking { text: std::mem::take(&mut self.thinking), signature: s("signature") })
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(stop) = v.pointer("/delta/stop_reason").and_then(Json::as_str).and_then(stop_of) {
                    out.push(Event::Stop(stop));
                }
                if let Some(u) = v.get("usage").filter(|u| u.as_object().is_some()) {
                    let later = usage_of(u);
                    self.usage.output = later.output;
                    if u.get("input_tokens").is_some_and(|i| !i.is_null()) {
                        self.usage.input = later.input;
                        self.usage.cache_read = later.cache_read;
                        self.usage.cache_write = later.cache_write;
                    }
                    out.push(Event::Usage(self.usage));
                }
            }
            "error" => {
                let kind = v.pointer("/error/type").and_then(Json::as_str).unwrap_or_default();
                let status = match kind {
                    "rate_limit_error" => 429,
                    "overloaded_error" => 529,
                    "invalid_request_error" => 400,
                    _ => 500,
                };
                let message = v.pointer("/error/message").and_then(Json::as_str).unwrap_or("The upstream service failed.");
                out.push(Event::Error { status, message: message.to_string() });
            }
            _ => {}
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Text,
    Thinking,
    Tool,
}

/// Writes the stream a messages client reads.
pub struct Encoder {
    id: String,
    model: String,
    input_estimate: u64,
    started: bool,
    /// The open block and its index.
    open: Option<(Block, usize)>,
    next_index: usize,
    stop: Option<Stop>,
    usage: Option<Usage>,
}

impl Encoder {
    pub fn new(t: &Translation) -> Encoder {
        Encoder {
            id: new_id("msg_"),
            model: t.model.clone(),
            input_estimate: t.input_estimate,
            started: false,
            open: None,
            next_index: 0,
            stop: None,
            usage: None,
        }
    }

    fn emit(out: &mut Vec<u8>, name: &str, v: Value) {
        super::sse::write_json(out, Some(name), &v);
    }

    /// `message_start`, once: with the provider's input count if it came first, else the estimate
    /// (a context meter reads it; the real count follows in `message_delta`).
    pub fn start(&mut self, out: &mut Vec<u8>) {
        if self.started {
            return;
        }
        self.started = true;
        let mut usage = self.usage.unwrap_or(Usage { input: self.input_estimate, ..Usage::default() });
        usage.output = 1;
        Self::emit(
            out,
            "message_start",
            json!({"type": "message_start", "message": {
                "id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
                "stop_reason": null, "stop_sequence": null, "usage": usage_value(&usage),
            }}),
        );
    }

    fn close(&mut self, out: &mut Vec<u8>) {
        if let Some((_, index)) = self.open.take() {
            Self::emit(out, "content_block_stop", json!({"type": "content_block_stop", "index": index}));
        }
    }

    /// Make `kind` the open block (a new one unless it already is).
    fn open(&mut self, kind: Block, block: Value, out: &mut Vec<u8>) -> usize {
        if let Some((open, index)) = self.open {
            if open == kind && kind != Block::Tool {
                return index;
            }
        }
        self.close(out);
        let index = self.next_index;
        self.next_index += 1;
        self.open = Some((kind, index));
        Self::emit(out, "content_block_start", json!({"type": "content_block_start", "index": index, "content_block": block}));
        index
    }

    fn delta(out: &mut Vec<u8>, index: usize, delta: Value) {
        Self::emit(out, "content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": delta}));
    }

    pub fn event(&mut self, e: Event, out: &mut Vec<u8>) {
        if let Event::Usage(u) = e {
            self.usage = Some(u);
            return;
        }
        self.start(out);
        match e {
            Event::Text(t) => {
                let index = self.open(Block::Text, json!({"type": "text", "text": ""}), out);
                Self::delta(out, index, json!({"type": "text_delta", "text": t}));
            }
            Event::Thinking(t) => {
                let index = self.open(Block::Thinking, json!({"type": "thinking", "thinking": "", "signature": ""}), out);
                Self::delta(out, index, json!({"type": "thinking_delta", "thinking": t}));
            }
            Event::SignedThinking { signature: sig, .. } => {
                if let Some((Block::Thinking, index)) = self.open {
                    Self::delta(out, index, json!({"type": "signature_delta", "signature": sig}));
                }
            }
            Event::RedactedThinking(data) => {
                self.close(out);
                let index = self.open(Block::Thinking, json!({"type": "redacted_thinking", "data": data}), out);
                let _ = index;
                self.close(out);
            }
            Event::ToolStart { id, name, signature } => {
                let id = carry::wrap(&id, &carry::Carried { signature, ..Default::default() });
                self.open(Block::Tool, json!({"type": "tool_use", "id": id, "name": name, "input": {}}), out);
            }
            Event::ToolArgs(a) => {
                if let Some((Block::Tool, index)) = self.open {
                    Self::delta(out, index, json!({"type": "input_json_delta", "partial_json": a}));
                }
            }
            Event::Stop(stop) => self.stop = Some(stop),
            Event::Usage(_) => {}
            Event::Error { status, message } => {
                self.close(out);
                let err = crate::protocol::upstream_error::rewrite(status, Some(&message), None);
                Self::emit(out, "error", crate::protocol::anthropic::error_body(&err));
            }
        }
    }

    pub fn finish(&mut self, out: &mut Vec<u8>) {
        self.start(out);
        self.close(out);
        let usage = self.usage.unwrap_or(Usage { input: self.input_estimate, ..Usage::default() });
        Self::emit(
            out,
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": stop_name(self.stop.unwrap_or(Stop::EndTurn)), "stop_sequence": null}, "usage": usage_value(&usage)}),
        );
        Self::emit(out, "message_stop", json!({"type": "message_stop"}));
    }
}
