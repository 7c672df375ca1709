//! The responses API, client side only (providers of the `openai` protocol serve it natively
//! unless they say `responses: false`): a client's request and the answer it reads, whole and
//! streamed. Consecutive `function_call` items become one assistant turn with several calls;
//! a streamed answer ends each item with `response.output_item.done` and the whole answer with
//! `response.completed`.
//!
//! A translated response is not stored by any provider: `previous_response_id` is refused and
//! `store` is dropped (the client sends its whole conversation, as Codex does).

use super::carry::{self, Carried};
use super::view::{Json, Object};
use super::{
    data_url, float, invalid, new_id, uint, unsupported, Event, Field, Image, Message, Part, Reasoning, Request, Response, Role, Stop,
    Tool, ToolCall, ToolChoice, Translation, Usage,
};
use crate::config::Protocol;
use crate::protocol::ApiError;
use serde_json::{json, Value};

/// Request fields read by the decoder.
const MAPPED: [&str; 14] = [
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "max_output_tokens",
    "temperature",
    "top_p",
    "stream",
    "reasoning",
    "text",
    "previous_response_id",
    "stream_options",
];

/// Request fields that change nothing a provider of another protocol answers: dropped.
pub const DROPPED: [&str; 10] = [
    "store",
    "include",
    "metadata",
    "client_metadata",
    "user",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "truncation",
    "prompt_cache_retention",
];

/// Tools the responses API runs itself. No provider of another protocol can run them: offered
/// beside function tools they are left out (Codex offers `web_search` on every turn); a request
/// that requires one is refused.
pub const HOSTED_TOOLS: [&str; 8] = [
    "web_search",
    "web_search_preview",
    "file_search",
    "code_interpreter",
    "image_generation",
    "computer_use_preview",
    "mcp",
    "local_shell",
];

/// A responses client's request in the internal form, refused where `to` cannot carry it.
pub fn decode_request(body: Object<'_>, to: Protocol) -> Result<Request, ApiError> {
    super::check_fields(&body, &MAPPED, &DROPPED, to)?;
    if body.get("previous_response_id").is_some_and(|v| !v.is_null()) {
        return Err(unsupported(
            "previous_response_id",
            to,
            "responses of a model of another protocol are not stored; send the whole conversation in 'input'",
        ));
    }
    let mut req = Request::default();
    if let Some(text) = body.get("instructions").and_then(Json::as_str).filter(|t| !t.is_empty()) {
        req.system.push(text.to_string());
    }
    match body.get("input") {
        Some(Json::String(s)) => req.messages.push(Message { role: Role::User, parts: vec![Part::Text(s.to_string())] }),
        Some(Json::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                input_item(item, Field("input", i), to, &mut req)?;
            }
        }
        _ => return Err(invalid("input", "text or a list of items is required")),
    }
    req.messages = super::merge_roles(req.messages);
    for t in body.get("tools").and_then(Json::as_array).into_iter().flatten() {
        tool(t, to, &mut req.tools)?;
    }
    if let Some(kind) = body.get("tool_choice").and_then(|c| c.get("type")).and_then(Json::as_str).filter(|k| HOSTED_TOOLS.contains(k)) {
        return Err(unsupported("tool_choice", to, &format!("the hosted '{kind}' tool cannot run there")));
    }
    req.tool_choice = match body.get("tool_choice") {
        None | Some(Json::Null) => None,
        Some(Json::String(s)) => Some(super::tool_choice_word(s)?),
        Some(v) if v.get("type").and_then(Json::as_str) == Some("function") => Some(ToolChoice::Named(
            v.get("name").and_then(Json::as_str).ok_or_else(|| invalid("tool_choice", "a named function needs its name"))?.to_string(),
        )),
        Some(_) => return Err(unsupported("tool_choice", to, "only auto, none, required or one named function")),
    };
    req.no_parallel_tools = body.get("parallel_tool_calls").and_then(Json::as_bool) == Some(false);
    if let Some(v) = body.get("max_output_tokens").filter(|v| !v.is_null()) {
        req.max_output = Some(uint(v, "max_output_tokens")?);
    }
    if let Some(v) = body.get("temperature").filter(|v| !v.is_null()) {
        req.temperature = Some(float(v, "temperature")?);
    }
    if let Some(v) = body.get("top_p").filter(|v| !v.is_null()) {
        req.top_p = Some(float(v, "top_p")?);
    }
    if let Some(effort) = body.get("reasoning").and_then(|r| r.get("effort")).and_then(Json::as_str) {
        req.reasoning = Some(Reasoning::from_effort(effort).ok_or_else(|| invalid("reasoning.effort", "unknown effort"))?);
    }
    if let Some(format) = body.get("text").and_then(|t| t.get("format")).filter(|f| !f.is_null()) {
        req.json_output = match format.get("type").and_then(Json::as_str) {
            Some("text") => None,
            Some("json_object") => Some(None),
            Some("json_schema") => {
                Some(Some(format.get("schema").map(Json::to_value).ok_or_else(|| invalid("text.format", "json_schema needs its schema"))?))
            }
            _ => return Err(invalid("text.format", "type must be text, json_object or json_schema")),
        };
    }
    Ok(req)
}

/// A function tool, the function tools of a namespace (flattened), or a hosted tool (left out).
fn tool(t: &Json<'_>, to: Protocol, out: &mut Vec<Tool>) -> Result<(), ApiError> {
    match t.get("type").and_then(Json::as_str).unwrap_or_default() {
        "function" => out.push(Tool {
            name: t.get("name").and_then(Json::as_str).ok_or_else(|| invalid("tools", "a function needs a name"))?.to_string(),
            description: t.get("description").and_then(Json::as_str).map(str::to_string),
            schema: t
                .get("parameters")
                .filter(|p| !p.is_null())
                .map(Json::to_value)
                .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
        }),
        "namespace" => {
            for inner in t.get("tools").and_then(Json::as_array).into_iter().flatten() {
                tool(inner, to, out)?;
            }
        }
        kind if HOSTED_TOOLS.contains(&kind) => {}
        kind => return Err(unsupported("tools", to, &format!("'{kind}' tools have no counterpart; function tools can be carried"))),
    }
    Ok(())
}

fn input_item(item: &Json<'_>, field: Field, to: Protocol, req: &mut Request) -> Result<(), ApiError> {
    let kind = item.get("type").and_then(Json::as_str).unwrap_or("message");
    match kind {
        "message" => {
            let role = item.get("role").and_then(Json::as_str).unwrap_or("user");
            let parts = match item.get("content") {
                Some(Json::String(s)) => vec![Part::Text(s.to_string())],
                Some(Json::Array(parts)) => parts
                    .iter()
                    .map(|p| match p.get("type").and_then(Json::as_str) {
                        Some("input_text") | Some("output_text") | Some("text") => {
                            Ok(Part::Text(p.get("text").and_then(Json::as_str).unwrap_or_default().to_string()))
                        }
                        Some("refusal") => Ok(Part::Text(p.get("refusal").and_then(Json::as_str).unwrap_or_default().to_string())),
                        Some("input_image") => {
                            let url = p.get("image_url").and_then(Json::as_str).ok_or_else(|| {
                                unsupported(format!("{field}.content"), to, "images by file id have no counterpart; send image_url")
                            })?;
                            Ok(Part::Image(match data_url(url) {
                                Some((media_type, data)) => Image::Base64 { media_type, data },
                                None => Image::Url(url.to_string()),
                            }))
                        }
                        Some(other) => Err(unsupported(format!("{field}.content"), to, &format!("'{other}' parts have no counterpart"))),
                        None => Err(invalid(field, "a content part needs a type")),
                    })
                    .collect::<Result<_, _>>()?,
                _ => return Err(invalid(field, "content must be text or a list of parts")),
            };
            match role {
                "system" | "developer" if req.messages.is_empty() => req.system.push(super::parts_text(&parts)),
                "system" | "developer" => req.messages.push(Message { role: Role::System, parts }),
                "assistant" => req.messages.push(Message { role: Role::Assistant, parts }),
                _ => req.messages.push(Message { role: Role::User, parts }),
            }
        }
        "function_call" => {
            let call = ToolCall {
                id: item.get("call_id").and_then(Json::as_str).ok_or_else(|| invalid(field, "call_id is required"))?.to_string(),
                name: item.get("name").and_then(Json::as_str).unwrap_or_default().to_string(),
                arguments: item.get("arguments").and_then(Json::as_str).unwrap_or("{}").to_string(),
                signature: None,
            };
            req.messages.push(Message { role: Role::Assistant, parts: vec![Part::ToolCall(call)] });
        }
        "function_call_output" => {
            let id = item.get("call_id").and_then(Json::as_str).ok_or_else(|| invalid(field, "call_id is required"))?;
            let text = match item.get("output") {
                Some(Json::String(s)) => s.to_string(),
                Some(v @ Json::Array(_)) => super::text_of(v).unwrap_or_default(),
                _ => String::new(),
            };
            req.messages.push(Message {
                role: Role::User,
                parts: vec![Part::ToolResult { id: id.to_string(), content: vec![Part::Text(text)], is_error: false }],
            });
        }
        "reasoning" => {
            let text: Vec<&str> = item
                .get("summary")
                .and_then(Json::as_array)
                .into_iter()
                .flatten()
                .filter_map(|s| s.get("text").and_then(Json::as_str))
                .collect();
            if !text.is_empty() {
                req.messages
                    .push(Message { role: Role::Assistant, parts: vec![Part::Thinking { text: text.join("\n"), signature: None }] });
            }
        }
        other => return Err(unsupported(field, to, &format!("'{other}' items have no counterpart"))),
    }
    Ok(())
}

fn usage_value(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt_total(),
        "input_tokens_details": {"cached_tokens": u.cache_read},
        "output_tokens": u.output,
        "output_tokens_details": {"reasoning_tokens": u.reasoning},
        "total_tokens": u.prompt_total() + u.output,
    })
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({"type": "message", "id": id, "status": status, "role": "assistant",
           "content": [{"type": "output_text", "text": text, "annotations": []}]})
}

fn call_item(id: &str, call_id: &str, name: &str, arguments: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": arguments, "status": status})
}

fn reasoning_item(id: &str, text: &str) -> Value {
    json!({"type": "reasoning", "id": id, "summary": [{"type": "summary_text", "text": text}]})
}

/// The response object: `completed`, or `incomplete` when the output maximum cut it.
fn response_object(
    id: &str,
    model: &str,
    created: u64,
    output: Vec<Value>,
    stop: Option<Stop>,
    usage: Option<&Usage>,
    done: bool,
) -> Value {
    let (status, incomplete) = match (done, stop) {
        (false, _) => ("in_progress", Value::Null),
        (true, Some(Stop::MaxTokens)) => ("incomplete", json!({"reason": "max_output_tokens"})),
        (true, Some(Stop::ContentFilter)) => ("incomplete", json!({"reason": "content_filter"})),
        (true, _) => ("completed", Value::Null),
    };
    json!({
        "id": id, "object": "response", "created_at": created, "status": status, "incomplete_details": incomplete,
        "model": model, "output": output, "parallel_tool_calls": true, "tool_choice": "auto", "tools": [],
        "usage": usage.map(usage_value),
    })
}

/// The internal form as the whole answer a responses client reads.
pub fn encode_response(t: &Translation, r: &Response) -> Value {
    let ids = carry::client_call_ids(&r.parts);
    let mut calls = 0;
    let mut output = Vec::new();
    for p in &r.parts {
        match p {
            Part::Text(s) => output.push(message_item(&new_id("msg_"), s, "completed")),
            Part::Thinking { text, .. } => output.push(reasoning_item(&new_id("rs_"), text)),
            Part::ToolCall(c) => {
                let call_id = ids.get(calls).cloned().unwrap_or_else(|| c.id.clone());
                calls += 1;
                let arguments = if c.arguments.is_empty() { "{}" } else { c.arguments.as_str() };
                output.push(call_item(&new_id("fc_"), &call_id, &c.name, arguments, "completed"));
            }
            _ => {}
        }
    }
    response_object(&new_id("resp_"), &t.model, crate::base::clock::now_unix(), output, r.stop, r.usage.as_ref(), true)
}

/// The item being streamed.
enum Open {
    Text { kind: TextItem, id: String, text: String },
    Call { id: String, call_id: String, name: String, arguments: String },
}

/// The two items that stream text: an answer (a message's output text) and reasoning (a
/// reasoning item's summary). Their events differ only in names.
#[derive(Clone, Copy, PartialEq, Eq)]
enum TextItem {
    Message,
    Reasoning,
}

impl TextItem {
    fn id_prefix(self) -> &'static str {
        match self {
            TextItem::Message => "msg_",
            TextItem::Reasoning => "rs_",
        }
    }

    /// The item as `response.output_item.added` shows it (nothing in it yet).
    fn started(self, id: &str) -> Value {
        match self {
            TextItem::Message => json!({"type": "message", "id": id, "status": "in_progress", "role": "assistant", "content": []}),
            TextItem::Reasoning => json!({"type": "reasoning", "id": id, "summary": []}),
        }
    }

    fn finished(self, id: &str, text: &str) -> Value {
        match self {
            TextItem::Message => message_item(id, text, "completed"),
            TextItem::Reasoning => reasoning_item(id, text),
        }
    }

    fn part(self, text: &str) -> Value {
        match self {
            TextItem::Message => json!({"type": "output_text", "text": text, "annotations": []}),
            TextItem::Reasoning => json!({"type": "summary_text", "text": text}),
        }
    }

    /// Event names: part added, text delta, text done, part done; and the part's index field.
    fn events(self) -> [&'static str; 5] {
        match self {
            TextItem::Message => [
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "content_index",
            ],
            TextItem::Reasoning => [
                "response.reasoning_summary_part.added",
                "response.reasoning_summary_text.delta",
                "response.reasoning_summary_text.done",
                "response.reasoning_summary_part.done",
                "summary_index",
            ],
        }
    }
}

/// Writes the stream a responses client reads.
pub struct Encoder {
    id: String,
    model: String,
    created: u64,
    seq: u64,
    open: Option<Open>,
    /// Finished items, for `response.completed`.
    done: Vec<Value>,
    pending: Carried,
    stop: Option<Stop>,
    usage: Option<Usage>,
}

impl Encoder {
    pub fn new(t: &Translation) -> Encoder {
        Encoder {
            id: new_id("resp_"),
            model: t.model.clone(),
            created: crate::base::clock::now_unix(),
            seq: 0,
            open: None,
            done: Vec::new(),
            pending: Carried::default(),
            stop: None,
            usage: None,
        }
    }

    fn emit(&mut self, out: &mut Vec<u8>, name: &str, mut data: Value) {
        data["type"] = json!(name);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        super::sse::write_json(out, Some(name), &data);
    }

    pub fn start(&mut self, out: &mut Vec<u8>) {
        let response = response_object(&self.id, &self.model, self.created, Vec::new(), None, None, false);
        self.emit(out, "response.created", json!({"response": response.clone()}));
        self.emit(out, "response.in_progress", json!({"response": response}));
    }

    fn index(&self) -> usize {
        self.done.len()
    }

    /// End the open item: its `…done` events and `response.output_item.done`.
    fn close(&mut self, out: &mut Vec<u8>) {
        let Some(open) = self.open.take() else { return };
        let index = self.index();
        let item = match open {
            Open::Text { kind, id, text } => {
                let [_, _, text_done, part_done, at] = kind.events();
                self.emit(out, text_done, json!({"item_id": id, "output_index": index, at: 0, "text": text}));
                self.emit(out, part_done, json!({"item_id": id, "output_index": index, at: 0, "part": kind.part(&text)}));
                kind.finished(&id, &text)
            }
            Open::Call { id, call_id, name, arguments } => {
                let arguments = if arguments.is_empty() { "{}".to_string() } else { arguments };
                self.emit(
                    out,
                    "response.function_call_arguments.done",
                    json!({"item_id": id, "output_index": index, "arguments": arguments}),
                );
                call_item(&id, &call_id, &name, &arguments, "completed")
            }
        };
        self.emit(out, "response.output_item.done", json!({"output_index": index, "item": item}));
        self.done.push(item);
    }

    /// A piece of text for a `kind` item: opened first if another item is open.
    fn text(&mut self, kind: TextItem, piece: String, out: &mut Vec<u8>) {
        let [part_added, delta, _, _, at] = kind.events();
        if !matches!(&self.open, Some(Open::Text { kind: open, .. }) if *open == kind) {
            self.close(out);
            let id = new_id(kind.id_prefix());
            let index = self.index();
            self.emit(out, "response.output_item.added", json!({"output_index": index, "item": kind.started(&id)}));
            self.emit(out, part_added, json!({"item_id": id, "output_index": index, at: 0, "part": kind.part("")}));
            self.open = Some(Open::Text { kind, id, text: String::new() });
        }
        let index = self.index();
        if let Some(Open::Text { id, text, .. }) = &mut self.open {
            text.push_str(&piece);
            let id = id.clone();
            self.emit(out, delta, json!({"item_id": id, "output_index": index, at: 0, "delta": piece}));
        }
    }

    pub fn event(&mut self, e: Event, out: &mut Vec<u8>) {
        let index = self.index();
        match e {
            Event::Text(t) => self.text(TextItem::Message, t, out),
            Event::Thinking(t) => self.text(TextItem::Reasoning, t, out),
            Event::SignedThinking { text, signature } => self.pending.thinking.push((text, signature)),
            Event::RedactedThinking(data) => self.pending.redacted.push(data),
            Event::ToolStart { id, name, signature } => {
                self.close(out);
                let call_id = self.pending.call_id(&id, signature);
                let item_id = new_id("fc_");
                let index = self.index();
                let item = call_item(&item_id, &call_id, &name, "", "in_progress");
                self.emit(out, "response.output_item.added", json!({"output_index": index, "item": item}));
                self.open = Some(Open::Call { id: item_id, call_id, name, arguments: String::new() });
            }
            Event::ToolArgs(a) => {
                if let Some(Open::Call { id, arguments, .. }) = &mut self.open {
                    arguments.push_str(&a);
                    let id = id.clone();
                    self.emit(out, "response.function_call_arguments.delta", json!({"item_id": id, "output_index": index, "delta": a}));
                }
            }
            Event::Stop(stop) => self.stop = Some(stop),
            Event::Usage(u) => self.usage = Some(u),
            Event::Error { status, message } => {
                let err = crate::protocol::upstream_error::rewrite(status, Some(&message), None);
                let body = crate::protocol::openai::error_body(&err);
                self.emit(out, "error", json!({"code": body["error"]["code"], "message": body["error"]["message"], "param": null}));
            }
        }
    }

    pub fn finish(&mut self, out: &mut Vec<u8>) {
        self.close(out);
        let output = std::mem::take(&mut self.done);
        let response = response_object(&self.id, &self.model, self.created, output, self.stop, self.usage.as_ref(), true);
        let name = if response["status"] == "completed" { "response.completed" } else { "response.incomplete" };
        self.emit(out, name, json!({"response": response}));
    }
}
