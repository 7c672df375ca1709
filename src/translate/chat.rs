//! Chat completions, both sides: a client's request and the answer it reads, a provider's
//! request and the answer it sends (whole and streamed).

use super::carry::{self, Carried};
use super::view::{Json, Object, NULL};
use super::{
    data_url, float, invalid, new_id, stops, text_of, uint, unsupported, Event, Field, Image, Message, Part, Reasoning, Request, Response,
    Role, Stop, Tool, ToolCall, ToolChoice, Translation, Usage,
};
use crate::config::Protocol;
use crate::protocol::ApiError;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::borrow::Cow;

/// Request fields read by the decoder.
const MAPPED: [&str; 18] = [
    "model",
    "messages",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "stop",
    "stream",
    "stream_options",
    "n",
    "reasoning_effort",
    "response_format",
    "seed",
    "presence_penalty",
    "frequency_penalty",
];

/// Request fields that change nothing a provider of another protocol answers: dropped. (Also
/// dropped on the way to a chat-completions provider: a request's `top_k`.)
pub const DROPPED: [&str; 7] =
    ["user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier", "prompt_cache_retention"];

fn role_of<'a>(m: &'a Json<'_>) -> &'a str {
    m.get("role").and_then(Json::as_str).unwrap_or_default()
}

/// A chat-completions client's request in the internal form, refused where `to` cannot carry it.
pub fn decode_request(mut body: Object<'_>, to: Protocol) -> Result<Request, ApiError> {
    super::check_fields(&body, &MAPPED, &DROPPED, to)?;
    let mut req = Request::default();
    if let Some(n) = body.get("n").filter(|v| !v.is_null()) {
        if uint(n, "n")? > 1 {
            return Err(unsupported("n", to, "one choice per request only"));
        }
    }
    let Some(Json::Array(messages)) = body.remove("messages") else {
        return Err(invalid("messages", "a list of messages is required"));
    };
    let mut seen_conversation = false;
    for (i, m) in messages.iter().enumerate() {
        let field = Field("messages", i);
        match role_of(m) {
            "system" | "developer" => {
                let text = m.get("content").and_then(text_of).ok_or_else(|| invalid(field, "content must be text"))?;
                if seen_conversation {
                    req.messages.push(Message { role: Role::System, parts: vec![Part::Text(text)] });
                } else {
                    req.system.push(text);
                }
            }
            "user" => {
                seen_conversation = true;
                let parts = user_parts(m.get("content").unwrap_or(&NULL), field, to)?;
                req.messages.push(Message { role: Role::User, parts });
            }
            "assistant" => {
                seen_conversation = true;
                let parts = assistant_parts(m, field)?;
                req.messages.push(Message { role: Role::Assistant, parts });
            }
            "tool" => {
                seen_conversation = true;
                let id = m.get("tool_call_id").and_then(Json::as_str).ok_or_else(|| invalid(field, "tool_call_id is required"))?;
                let text = m.get("content").and_then(text_of).unwrap_or_default();
                req.messages.push(Message {
                    role: Role::User,
                    parts: vec![Part::ToolResult { id: id.to_string(), content: vec![Part::Text(text)], is_error: false }],
                });
            }
            other => return Err(unsupported(format!("{field}.role"), to, &format!("the role '{other}' has no counterpart"))),
        }
    }
    req.messages = super::merge_roles(req.messages);
    req.tools = tools_of(&body, to)?;
    req.tool_choice = match body.get("tool_choice") {
        None | Some(Json::Null) => None,
        Some(Json::String(s)) => Some(super::tool_choice_word(s)?),
        Some(v) => match v.pointer("/function/name").and_then(Json::as_str) {
            Some(name) => Some(ToolChoice::Named(name.to_string())),
            None => return Err(unsupported("tool_choice", to, "only auto, none, required or one named function")),
        },
    };
    req.no_parallel_tools = body.get("parallel_tool_calls").and_then(Json::as_bool) == Some(false);
    for field in ["max_completion_tokens", "max_tokens"] {
        if let Some(v) = body.get(field).filter(|v| !v.is_null()) {
            req.max_output = Some(uint(v, field)?);
            break;
        }
    }
    if let Some(v) = body.get("temperature").filter(|v| !v.is_null()) {
        req.temperature = Some(float(v, "temperature")?);
    }
    if let Some(v) = body.get("top_p").filter(|v| !v.is_null()) {
        req.top_p = Some(float(v, "top_p")?);
    }
    if let Some(v) = body.get("stop").filter(|v| !v.is_null()) {
        req.stop = stops(v, "stop")?;
    }
    if let Some(v) = body.get("seed").filter(|v| !v.is_null()) {
        if to == Protocol::Anthropic {
            return Err(unsupported("seed", to, "it has no seed"));
        }
        req.seed = Some(v.as_i64().ok_or_else(|| invalid("seed", "must be an integer"))?);
    }
    for (field, slot) in [("presence_penalty", &mut req.presence_penalty), ("frequency_penalty", &mut req.frequency_penalty)] {
        if let Some(v) = body.get(field).filter(|v| !v.is_null()) {
            let value = float(v, field)?;
            if to == Protocol::Anthropic && value != 0.0 {
                return Err(unsupported(field, to, "it has no penalties"));
            }
            *slot = Some(value).filter(|v| *v != 0.0);
        }
    }
    if let Some(v) = body.get("reasoning_effort").filter(|v| !v.is_null()) {
        let effort = v.as_str().unwrap_or_default();
        req.reasoning = Some(Reasoning::from_effort(effort).ok_or_else(|| invalid("reasoning_effort", "unknown effort"))?);
    }
    req.json_output = match body.get("response_format") {
        None | Some(Json::Null) => None,
        Some(f) => match f.get("type").and_then(Json::as_str) {
            Some("text") => None,
            Some("json_object") => Some(None),
            Some("json_schema") => Some(Some(
                f.pointer("/json_schema/schema")
                    .map(Json::to_value)
                    .ok_or_else(|| invalid("response_format", "json_schema.schema is required"))?,
            )),
            _ => return Err(invalid("response_format", "type must be text, json_object or json_schema")),
        },
    };
    Ok(req)
}

/// An assistant message's parts: its reasoning, its text (or refusal) and its tool calls.
fn assistant_parts(m: &Json<'_>, field: Field) -> Result<Vec<Part>, ApiError> {
    let mut parts = Vec::new();
    for field_name in ["reasoning_content", "reasoning"] {
        if let Some(text) = m.get(field_name).and_then(Json::as_str).filter(|t| !t.is_empty()) {
            parts.push(Part::Thinking { text: text.to_string(), signature: None });
        }
    }
    match m.get("content") {
        Some(Json::String(s)) if !s.is_empty() => parts.push(Part::Text(s.to_string())),
        Some(Json::Array(items)) => {
            for p in items {
                if let Some(t) = p.get("text").or_else(|| p.get("refusal")).and_then(Json::as_str) {
                    parts.push(Part::Text(t.to_string()));
                }
            }
        }
        _ => {}
    }
    if let Some(calls) = m.get("tool_calls").and_then(Json::as_array) {
        for call in calls {
            let id = call.get("id").and_then(Json::as_str).ok_or_else(|| invalid(field, "a tool call needs its id"))?;
            let name = call.pointer("/function/name").and_then(Json::as_str).unwrap_or_default();
            let arguments = call.pointer("/function/arguments").and_then(Json::as_str).unwrap_or("{}");
            parts.push(Part::ToolCall(ToolCall {
                id: id.to_string(),
                name: name.to_string(),
                arguments: arguments.to_string(),
                signature: None,
            }));
        }
    }
    Ok(parts)
}

/// `tools`: function tools only.
fn tools_of(body: &Object<'_>, to: Protocol) -> Result<Vec<Tool>, ApiError> {
    let Some(Json::Array(tools)) = body.get("tools") else { return Ok(Vec::new()) };
    let mut out = Vec::with_capacity(tools.len());
    for t in tools {
        if t.get("type").and_then(Json::as_str) != Some("function") {
            return Err(unsupported("tools", to, "only function tools can be carried"));
        }
        let f = t.get("function").ok_or_else(|| invalid("tools", "a function tool needs 'function'"))?;
        out.push(Tool {
            name: f.get("name").and_then(Json::as_str).ok_or_else(|| invalid("tools", "a function needs a name"))?.to_string(),
            description: f.get("description").and_then(Json::as_str).map(str::to_string),
            schema: f.get("parameters").map(Json::to_value).unwrap_or_else(|| json!({"type": "object", "properties": {}})),
        });
    }
    Ok(out)
}

fn user_parts(content: &Json<'_>, field: Field, to: Protocol) -> Result<Vec<Part>, ApiError> {
    match content {
        Json::String(s) => Ok(vec![Part::Text(s.to_string())]),
        Json::Array(items) => items
            .iter()
            .map(|p| match p.get("type").and_then(Json::as_str) {
                Some("text") => Ok(Part::Text(p.get("text").and_then(Json::as_str).unwrap_or_default().to_string())),
                Some("image_url") => {
                    let url =
                        p.pointer("/image_url/url").and_then(Json::as_str).ok_or_else(|| invalid(field, "image_url.url is required"))?;
                    Ok(Part::Image(match data_url(url) {
                        Some((media_type, data)) => Image::Base64 { media_type, data },
                        None => Image::Url(url.to_string()),
                    }))
                }
                Some(other) => Err(unsupported(format!("{field}.content"), to, &format!("'{other}' parts have no counterpart"))),
                None => Err(invalid(field, "a content part needs a type")),
            })
            .collect(),
        _ => Err(invalid(field, "content must be text or a list of parts")),
    }
}

/// The internal form as a chat-completions provider's request (usage always asked for), as the
/// JSON text sent: written straight from the internal form, members in name order (as a `Value`
/// map wrote them before), without a tree in between.
pub fn encode_request(req: &Request) -> Vec<u8> {
    let mut messages: Vec<SentMessage<'_>> =
        req.system.iter().map(|s| SentMessage::new("system", Some(SentContent::Text(Cow::Borrowed(s))))).collect();
    for m in &req.messages {
        match m.role {
            Role::System => messages.push(SentMessage::new("system", Some(SentContent::Text(super::parts_text(&m.parts).into())))),
            Role::User => {
                let mut rest: Vec<SentPart<'_>> = Vec::new();
                for p in &m.parts {
                    match p {
                        Part::ToolResult { id, content, is_error } => {
                            let text = super::parts_text(content);
                            let text = if *is_error { format!("Error: {text}") } else { text };
                            messages.push(SentMessage {
                                tool_call_id: Some(id),
                                ..SentMessage::new("tool", Some(SentContent::Text(text.into())))
                            });
                            // Chat completions' tool messages carry text only: images follow as the user's.
                            rest.extend(content.iter().filter_map(image_part));
                        }
                        Part::Text(t) => rest.push(SentPart { image_url: None, text: Some(t), kind: "text" }),
                        Part::Image(_) => rest.extend(image_part(p)),
                        _ => {}
                    }
                }
                if !rest.is_empty() {
                    let content = if rest.iter().all(|p| p.kind == "text") {
                        SentContent::Text(rest.iter().filter_map(|p| p.text).collect::<Vec<_>>().join("\n").into())
                    } else {
                        SentContent::Parts(rest)
                    };
                    messages.push(SentMessage::new("user", Some(content)));
                }
            }
            Role::Assistant => {
                let text = super::parts_text(&m.parts);
                let calls = m
                    .parts
                    .iter()
                    .filter_map(|p| match p {
                        Part::ToolCall(c) => Some(SentCall {
                            function: SentFunction { arguments: &c.arguments, name: &c.name },
                            id: &c.id,
                            kind: "function",
                        }),
                        _ => None,
                    })
                    .collect();
                let content = (!text.is_empty()).then(|| SentContent::Text(text.into()));
                messages.push(SentMessage { tool_calls: calls, ..SentMessage::new("assistant", content) });
            }
        }
    }
    let tools: Vec<SentTool<'_>> = req
        .tools
        .iter()
        .map(|t| SentTool {
            function: SentToolFunction { description: t.description.as_deref(), name: &t.name, parameters: &t.schema },
            kind: "function",
        })
        .collect();
    let wire = SentRequest {
        frequency_penalty: req.frequency_penalty,
        max_completion_tokens: req.max_output,
        messages,
        model: &req.model,
        parallel_tool_calls: (req.no_parallel_tools && !tools.is_empty()).then_some(false),
        presence_penalty: req.presence_penalty,
        reasoning_effort: match req.reasoning {
            Some(r @ Reasoning::Budget(_)) => Some(r.effort()),
            _ => None,
        },
        response_format: req.json_output.as_ref().map(|schema| SentFormat {
            json_schema: schema.as_ref().map(|schema| SentSchema { name: "output", schema }),
            kind: if schema.is_some() { "json_schema" } else { "json_object" },
        }),
        seed: req.seed,
        stop: &req.stop,
        stream: req.stream,
        // `top_k` has no counterpart and is left out: it narrows sampling, it asks for nothing (and
        // Gemini CLI sends it on every request). Documented as dropped in docs/translation.md.
        stream_options: req.stream.then_some(SentStreamOptions { include_usage: true }),
        temperature: req.temperature,
        tool_choice: req.tool_choice.as_ref().map(|choice| match choice {
            ToolChoice::Auto => SentChoice::Word("auto"),
            ToolChoice::None => SentChoice::Word("none"),
            ToolChoice::Required => SentChoice::Word("required"),
            ToolChoice::Named(name) => SentChoice::Named { function: SentName { name }, kind: "function" },
        }),
        tools,
        top_p: req.top_p,
    };
    let mut out = Vec::with_capacity(256);
    super::sse::serialized_into(&mut out, &wire);
    out
}

/// A chat-completions request as written (members in name order).
#[derive(Serialize)]
struct SentRequest<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    frequency_penalty: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u64>,
    messages: Vec<SentMessage<'a>>,
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    parallel_tool_calls: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    presence_penalty: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_effort: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<SentFormat<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    seed: Option<i64>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    stop: &'a [String],
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<SentStreamOptions>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<SentChoice<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<SentTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
}

#[derive(Serialize)]
struct SentMessage<'a> {
    /// `null` for an assistant turn of tool calls only.
    content: Option<SentContent<'a>>,
    role: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<SentCall<'a>>,
}

impl<'a> SentMessage<'a> {
    fn new(role: &'static str, content: Option<SentContent<'a>>) -> Self {
        SentMessage { content, role, tool_call_id: None, tool_calls: Vec::new() }
    }
}

#[derive(Serialize)]
#[serde(untagged)]
enum SentContent<'a> {
    Text(Cow<'a, str>),
    Parts(Vec<SentPart<'a>>),
}

#[derive(Serialize)]
struct SentPart<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    image_url: Option<SentUrl<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
    #[serde(rename = "type")]
    kind: &'static str,
}

#[derive(Serialize)]
struct SentUrl<'a> {
    url: Cow<'a, str>,
}

#[derive(Serialize)]
struct SentCall<'a> {
    function: SentFunction<'a>,
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
}

#[derive(Serialize)]
struct SentFunction<'a> {
    arguments: &'a str,
    name: &'a str,
}

#[derive(Serialize)]
struct SentTool<'a> {
    function: SentToolFunction<'a>,
    #[serde(rename = "type")]
    kind: &'static str,
}

#[derive(Serialize)]
struct SentToolFunction<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a str>,
    name: &'a str,
    parameters: &'a Value,
}

#[derive(Serialize)]
#[serde(untagged)]
enum SentChoice<'a> {
    Word(&'static str),
    Named {
        function: SentName<'a>,
        #[serde(rename = "type")]
        kind: &'static str,
    },
}

#[derive(Serialize)]
struct SentName<'a> {
    name: &'a str,
}

#[derive(Serialize)]
struct SentFormat<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    json_schema: Option<SentSchema<'a>>,
    #[serde(rename = "type")]
    kind: &'static str,
}

#[derive(Serialize)]
struct SentSchema<'a> {
    name: &'static str,
    schema: &'a Value,
}

#[derive(Serialize)]
struct SentStreamOptions {
    include_usage: bool,
}

fn image_part(p: &Part) -> Option<SentPart<'_>> {
    let url = match p {
        Part::Image(Image::Url(url)) => Cow::Borrowed(url.as_str()),
        Part::Image(Image::Base64 { media_type, data }) => Cow::Owned(format!("data:{media_type};base64,{data}")),
        _ => return None,
    };
    Some(SentPart { image_url: Some(SentUrl { url }), text: None, kind: "image_url" })
}

fn stop_of(reason: &str) -> Option<Stop> {
    Some(match reason {
        "stop" => Stop::EndTurn,
        "length" => Stop::MaxTokens,
        "tool_calls" | "function_call" => Stop::ToolUse,
        "content_filter" => Stop::ContentFilter,
        _ => return None,
    })
}

fn stop_name(stop: Stop) -> &'static str {
    match stop {
        Stop::EndTurn | Stop::StopSequence => "stop",
        Stop::MaxTokens => "length",
        Stop::ToolUse => "tool_calls",
        Stop::ContentFilter => "content_filter",
    }
}

/// Chat usage in the internal meaning (`prompt_tokens` includes cache reads).
fn usage_of(u: &Json<'_>) -> Option<Usage> {
    let prompt = u.get("prompt_tokens")?.as_u64()?;
    let n = |path: &str| u.pointer(path).and_then(Json::as_u64);
    let cached = n("/prompt_tokens_details/cached_tokens").unwrap_or(0).min(prompt);
    Some(Usage {
        input: prompt - cached,
        cache_read: cached,
        cache_write: 0,
        output: n("/completion_tokens").unwrap_or(0),
        reasoning: n("/completion_tokens_details/reasoning_tokens").unwrap_or(0),
    })
}

fn usage_value(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_total(),
        "completion_tokens": u.output,
        "total_tokens": u.prompt_total() + u.output,
        "prompt_tokens_details": {"cached_tokens": u.cache_read},
        "completion_tokens_details": {"reasoning_tokens": u.reasoning},
    })
}

/// A chat-completions answer, read without building a JSON tree (only these fields are kept;
/// the rest is skipped as it is parsed).
#[derive(Deserialize)]
struct Answer<'a> {
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    choices: Option<Vec<Choice<'a>>>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(borrow, default)]
    message: Option<WireMessage<'a>>,
    #[serde(borrow, default)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct WireMessage<'a> {
    #[serde(borrow, default)]
    content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    reasoning: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    refusal: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    tool_calls: Option<Vec<WireCall<'a>>>,
}

#[derive(Deserialize)]
struct WireCall<'a> {
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    function: Option<WireFunction<'a>>,
}

#[derive(Deserialize)]
struct WireFunction<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    arguments: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct WireUsage {
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<Details>,
    #[serde(default)]
    completion_tokens_details: Option<Details>,
}

#[derive(Deserialize)]
struct Details {
    #[serde(default)]
    cached_tokens: Option<u64>,
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

/// A chat-completions provider's whole answer in the internal form.
pub fn decode_response(body: &[u8]) -> Option<Response> {
    // Read as text: one UTF-8 check for the whole body rather than one per string.
    let answer: Answer<'_> = serde_json::from_str(std::str::from_utf8(body).ok()?).ok()?;
    let choice = answer.choices?.into_iter().next()?;
    let m = choice.message?;
    let mut parts = Vec::new();
    let present = |t: Option<Cow<'_, str>>| t.filter(|t| !t.is_empty()).map(Cow::into_owned);
    for t in [m.reasoning_content, m.reasoning].into_iter().filter_map(present) {
        parts.push(Part::Thinking { text: t, signature: None });
    }
    for t in [m.content, m.refusal].into_iter().filter_map(present) {
        parts.push(Part::Text(t));
    }
    for call in m.tool_calls.into_iter().flatten() {
        let function = call.function;
        let (name, arguments) = function.map_or((None, None), |f| (f.name, f.arguments));
        parts.push(Part::ToolCall(ToolCall {
            id: call.id.map_or_else(|| new_id("call_"), Cow::into_owned),
            name: name.map(Cow::into_owned).unwrap_or_default(),
            arguments: arguments.map_or_else(|| "{}".to_string(), Cow::into_owned),
            signature: None,
        }));
    }
    let usage = answer.usage.and_then(|u| {
        let prompt = u.prompt_tokens?;
        let cached = u.prompt_tokens_details.and_then(|d| d.cached_tokens).unwrap_or(0).min(prompt);
        Some(Usage {
            input: prompt - cached,
            cache_read: cached,
            cache_write: 0,
            output: u.completion_tokens.unwrap_or(0),
            reasoning: u.completion_tokens_details.and_then(|d| d.reasoning_tokens).unwrap_or(0),
        })
    });
    Some(Response {
        id: answer.id.map(Cow::into_owned).unwrap_or_default(),
        parts,
        stop: choice.finish_reason.as_deref().and_then(stop_of),
        usage,
    })
}

/// The internal form as the whole answer a chat-completions client reads, as its JSON text
/// (members in name order, as a `Value` map wrote them before; no tree in between).
pub fn encode_response(t: &Translation, r: &Response) -> Vec<u8> {
    let ids = carry::client_call_ids(&r.parts);
    let mut calls = Vec::new();
    let mut text = String::new();
    let mut thinking = String::new();
    for p in &r.parts {
        match p {
            Part::Text(s) => text.push_str(s),
            Part::Thinking { text: s, .. } => thinking.push_str(s),
            Part::ToolCall(c) => calls.push(SentCall {
                function: SentFunction { arguments: if c.arguments.is_empty() { "{}" } else { &c.arguments }, name: &c.name },
                id: ids.get(calls.len()).map_or(c.id.as_str(), String::as_str),
                kind: "function",
            }),
            _ => {}
        }
    }
    let answer = SentAnswer {
        choices: [SentChoiceOut {
            finish_reason: r.stop.map_or("stop", stop_name),
            index: 0,
            logprobs: None,
            message: SentAnswerMessage {
                content: (!text.is_empty() || calls.is_empty()).then_some(text),
                reasoning_content: (!thinking.is_empty()).then_some(thinking),
                refusal: None,
                role: "assistant",
                tool_calls: calls,
            },
        }],
        created: crate::base::clock::now_unix(),
        id: chat_id(&r.id),
        model: &t.model,
        object: "chat.completion",
        usage: r.usage.map(|u| SentUsage {
            completion_tokens: u.output,
            completion_tokens_details: SentReasoning { reasoning_tokens: u.reasoning },
            prompt_tokens: u.prompt_total(),
            prompt_tokens_details: SentCached { cached_tokens: u.cache_read },
            total_tokens: u.prompt_total() + u.output,
        }),
    };
    let mut out = Vec::with_capacity(384);
    super::sse::serialized_into(&mut out, &answer);
    out
}

/// A whole chat-completions answer as written (members in name order).
#[derive(Serialize)]
struct SentAnswer<'a> {
    choices: [SentChoiceOut<'a>; 1],
    created: u64,
    id: String,
    model: &'a str,
    object: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<SentUsage>,
}

#[derive(Serialize)]
struct SentChoiceOut<'a> {
    finish_reason: &'static str,
    index: u32,
    logprobs: Option<()>,
    message: SentAnswerMessage<'a>,
}

#[derive(Serialize)]
struct SentAnswerMessage<'a> {
    /// `null` for an answer of tool calls only.
    content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<String>,
    refusal: Option<()>,
    role: &'static str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<SentCall<'a>>,
}

#[derive(Serialize)]
struct SentUsage {
    completion_tokens: u64,
    completion_tokens_details: SentReasoning,
    prompt_tokens: u64,
    prompt_tokens_details: SentCached,
    total_tokens: u64,
}

#[derive(Serialize)]
struct SentReasoning {
    reasoning_tokens: u64,
}

#[derive(Serialize)]
struct SentCached {
    cached_tokens: u64,
}

fn chat_id(upstream: &str) -> String {
    if upstream.starts_with("chatcmpl-") {
        upstream.to_string()
    } else {
        new_id("chatcmpl-")
    }
}

/// Reads a chat-completions provider's stream.
#[derive(Debug, Default)]
pub struct Decoder {
    /// The provider's index of the tool call being streamed.
    tool: Option<u64>,
}

impl Decoder {
    pub fn event(&mut self, data: &str, out: &mut Vec<Event>) {
        if data.trim() == "[DONE]" {
            return;
        }
        let Ok(v) = super::view::parse(data, "event") else { return };
        if let Some(e) = v.get("error") {
            let message = e.get("message").and_then(Json::as_str).unwrap_or("The upstream service failed.").to_string();
            out.push(Event::Error { status: 500, message });
            return;
        }
        if let Some(choice) = v.get("choices").and_then(Json::as_array).and_then(<[_]>::first) {
            if let Some(d) = choice.get("delta") {
                for field in ["reasoning_content", "reasoning"] {
                    if let Some(t) = d.get(field).and_then(Json::as_str).filter(|t| !t.is_empty()) {
                        out.push(Event::Thinking(t.to_string()));
                    }
                }
                if let Some(t) = d.get("content").and_then(Json::as_str).filter(|t| !t.is_empty()) {
                    out.push(Event::Text(t.to_string()));
                }
                if let Some(t) = d.get("refusal").and_then(Json::as_str).filter(|t| !t.is_empty()) {
                    out.push(Event::Text(t.to_string()));
                }
                for call in d.get("tool_calls").and_then(Json::as_array).into_iter().flatten() {
                    let index = call.get("index").and_then(Json::as_u64).unwrap_or(0);
                    let name = call.pointer("/function/name").and_then(Json::as_str);
                    let id = call.get("id").and_then(Json::as_str);
                    if self.tool != Some(index) && (id.is_some() || name.is_some()) {
                        self.tool = Some(index);
                        out.push(Event::ToolStart {
                            id: id.map_or_else(|| new_id("call_"), str::to_string),
                            name: name.unwrap_or_default().to_string(),
                            signature: None,
                        });
                    }
                    if let Some(a) = call.pointer("/function/arguments").and_then(Json::as_str).filter(|a| !a.is_empty()) {
                        out.push(Event::ToolArgs(a.to_string()));
                    }
                }
            }
            if let Some(stop) = choice.get("finish_reason").and_then(Json::as_str).and_then(stop_of) {
                out.push(Event::Stop(stop));
            }
        }
        if let Some(u) = v.get("usage").and_then(usage_of) {
            out.push(Event::Usage(u));
        }
    }
}

/// Writes the stream a chat-completions client reads.
pub struct Encoder {
    id: String,
    created: u64,
    model: String,
    wants_usage: bool,
    /// Index of the tool call being streamed.
    tool: Option<usize>,
    /// Signed thinking not yet given to a tool call id (see `carry`).
    pending: Carried,
    finished: bool,
    usage: Option<Usage>,
}

impl Encoder {
    pub fn new(t: &Translation) -> Encoder {
        Encoder {
            id: new_id("chatcmpl-"),
            created: crate::base::clock::now_unix(),
            model: t.model.clone(),
            wants_usage: t.client_wants_usage,
            tool: None,
            pending: Carried::default(),
            finished: false,
            usage: None,
        }
    }

    fn chunk(&self, out: &mut Vec<u8>, delta: Value, finish: Option<&str>) {
        let v = json!({
            "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        });
        super::sse::write_json(out, None, &v);
    }

    pub fn start(&mut self, out: &mut Vec<u8>) {
        self.chunk(out, json!({"role": "assistant", "content": ""}), None);
    }

    pub fn event(&mut self, e: Event, out: &mut Vec<u8>) {
        match e {
            Event::Text(t) => self.chunk(out, json!({"content": t}), None),
            Event::Thinking(t) => self.chunk(out, json!({"reasoning_content": t}), None),
            Event::SignedThinking { text, signature } => self.pending.thinking.push((text, signature)),
            Event::RedactedThinking(data) => self.pending.redacted.push(data),
            Event::ToolStart { id, name, signature } => {
                let index = self.tool.map_or(0, |i| i + 1);
                self.tool = Some(index);
                let id = self.pending.call_id(&id, signature);
                self.chunk(
                    out,
                    json!({"tool_calls": [{"index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]}),
                    None,
                );
            }
            Event::ToolArgs(a) => {
                let index = self.tool.unwrap_or(0);
                self.chunk(out, json!({"tool_calls": [{"index": index, "function": {"arguments": a}}]}), None);
            }
            Event::Stop(stop) => {
                if !self.finished {
                    self.finished = true;
                    self.chunk(out, json!({}), Some(stop_name(stop)));
                }
            }
            Event::Usage(u) => self.usage = Some(u),
            Event::Error { status, message } => {
                let err = crate::protocol::upstream_error::rewrite(status, Some(&message), None);
                super::sse::write_json(out, None, &crate::protocol::openai::error_body(&err));
            }
        }
    }

    pub fn finish(&mut self, out: &mut Vec<u8>) {
        if let (true, Some(u)) = (self.wants_usage, &self.usage) {
            let v = json!({
                "id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [], "usage": usage_value(u),
            });
            super::sse::write_json(out, None, &v);
        }
        super::sse::write(out, None, "[DONE]");
    }
}
