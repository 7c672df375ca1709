//! Bedrock's Converse API for the models that are not Anthropic's (Llama, Mistral, Nova,
//! Titan, …): the provider keeps a messages-protocol face — so every client protocol reaches it
//! through the translation layer as it reaches an Anthropic model, and metering reads the
//! messages protocol's usage — and this file converts at the wire: a messages request to a
//! `Converse` / `ConverseStream` request, and the answer back (a whole `ConverseResponse`, or
//! `ConverseStream`'s event-stream frames) to the messages protocol's JSON or SSE.
//!
//! Carried: system prompts, text, images (base64), tool definitions, tool choice, tool calls and
//! tool results (text, JSON, images; errors), `cache_control` as cache points, the output maximum,
//! temperature, top_p and stop sequences, stop reasons, usage with cache reads and writes, and
//! reasoning text. Not carried: image URLs (Converse takes bytes: refused 400), documents, `top_k`
//! and other model-specific fields, `tool_choice: none` (Converse has no such choice: the tools
//! stay offered).

use super::eventstream::{exception_event, header, sse_header, Frames};
use super::{Decode, SeamError};
use aws_smithy_types::event_stream::Message;
use bytes::Bytes;
use serde_json::{json, Map, Value};

/// A messages-protocol request body as a Converse request body.
pub fn request(body: &[u8]) -> Result<Bytes, SeamError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| SeamError::Body(format!("not JSON ({e})")))?;
    let mut out = Map::new();
    if let Some(system) = v.get("system") {
        out.insert("system".into(), Value::Array(system_blocks(system)));
    }
    let mut messages = Vec::new();
    for m in v.get("messages").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default() {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
        let content = match m.get("content") {
            Some(Value::String(text)) => vec![json!({"text": text})],
            Some(Value::Array(blocks)) => blocks.iter().map(content_block).collect::<Result<Vec<_>, _>>()?.into_iter().flatten().collect(),
            _ => Vec::new(),
        };
        messages.push(json!({"role": role, "content": content}));
    }
    out.insert("messages".into(), Value::Array(messages));
    let mut inference = Map::new();
    for (ours, theirs) in
        [("max_tokens", "maxTokens"), ("temperature", "temperature"), ("top_p", "topP"), ("stop_sequences", "stopSequences")]
    {
        if let Some(value) = v.get(ours).filter(|x| !x.is_null()) {
            inference.insert(theirs.into(), value.clone());
        }
    }
    if !inference.is_empty() {
        out.insert("inferenceConfig".into(), Value::Object(inference));
    }
    if let Some(tools) = v.get("tools").and_then(Value::as_array).filter(|t| !t.is_empty()) {
        let mut specs = Vec::new();
        for t in tools {
            let mut spec = Map::new();
            spec.insert("name".into(), t.get("name").cloned().unwrap_or_default());
            if let Some(d) = t.get("description").filter(|d| d.is_string()) {
                spec.insert("description".into(), d.clone());
            }
            spec.insert("inputSchema".into(), json!({"json": t.get("input_schema").cloned().unwrap_or_else(|| json!({"type": "object"}))}));
            specs.push(json!({"toolSpec": spec}));
            if t.get("cache_control").is_some() {
                specs.push(json!({"cachePoint": {"type": "default"}}));
            }
        }
        let mut config = Map::new();
        config.insert("tools".into(), Value::Array(specs));
        let choice = v.get("tool_choice");
        let converse_choice = match choice.and_then(|c| c.get("type")).and_then(Value::as_str) {
            Some("any") => Some(json!({"any": {}})),
            Some("tool") => Some(json!({"tool": {"name": choice.and_then(|c| c.get("name")).cloned().unwrap_or_default()}})),
            Some("auto") => Some(json!({"auto": {}})),
            _ => None,
        };
        if let Some(c) = converse_choice {
            config.insert("toolChoice".into(), c);
        }
        out.insert("toolConfig".into(), Value::Object(config));
    }
    serde_json::to_vec(&Value::Object(out)).map(Bytes::from).map_err(|e| SeamError::Body(e.to_string()))
}

fn system_blocks(system: &Value) -> Vec<Value> {
    match system {
        Value::String(text) => vec![json!({"text": text})],
        Value::Array(blocks) => {
            let mut out = Vec::new();
            for b in blocks {
                if let Some(text) = b.get("text").and_then(Value::as_str) {
                    out.push(json!({"text": text}));
                    if b.get("cache_control").is_some() {
                        out.push(json!({"cachePoint": {"type": "default"}}));
                    }
                }
            }
            out
        }
        _ => Vec::new(),
    }
}

/// One messages content block as Converse's (with a cache point after it when it asks for one);
/// nothing for a block Converse has no place for (a thinking block sent back).
fn content_block(b: &Value) -> Result<Vec<Value>, SeamError> {
    let kind = b.get("type").and_then(Value::as_str).unwrap_or_default();
    let block = match kind {
        "text" => json!({"text": b.get("text").cloned().unwrap_or_default()}),
        "image" => image(b)?,
        "tool_use" => json!({"toolUse": {
            "toolUseId": b.get("id").cloned().unwrap_or_default(),
            "name": b.get("name").cloned().unwrap_or_default(),
            "input": b.get("input").cloned().unwrap_or_else(|| json!({})),
        }}),
        "tool_result" => {
            let content = match b.get("content") {
                Some(Value::String(text)) => vec![json!({"text": text})],
                Some(Value::Array(parts)) => parts
                    .iter()
                    .map(|p| match p.get("type").and_then(Value::as_str) {
                        Some("image") => image(p),
                        _ => Ok(json!({"text": p.get("text").cloned().unwrap_or_default()})),
                    })
                    .collect::<Result<Vec<_>, _>>()?,
                _ => Vec::new(),
            };
            let status = if b.get("is_error").and_then(Value::as_bool) == Some(true) { "error" } else { "success" };
            json!({"toolResult": {"toolUseId": b.get("tool_use_id").cloned().unwrap_or_default(), "content": content, "status": status}})
        }
        _ => return Ok(Vec::new()),
    };
    let mut out = vec![block];
    if b.get("cache_control").is_some() {
        out.push(json!({"cachePoint": {"type": "default"}}));
    }
    Ok(out)
}

/// A base64 image block as Converse's (its format from the media type).
fn image(b: &Value) -> Result<Value, SeamError> {
    let source = b.get("source");
    if source.and_then(|s| s.get("type")).and_then(Value::as_str) != Some("base64") {
        return Err(SeamError::Body("images must be sent as base64 data to this model (Bedrock's Converse takes no image URL)".into()));
    }
    let media = source.and_then(|s| s.get("media_type")).and_then(Value::as_str).unwrap_or("image/png");
    let format = media.strip_prefix("image/").unwrap_or("png").replace("jpg", "jpeg");
    Ok(json!({"image": {"format": format, "source": {"bytes": source.and_then(|s| s.get("data")).cloned().unwrap_or_default()}}}))
}

/// Converse's stop reason as the messages protocol's.
fn stop_reason(theirs: &str) -> &'static str {
    match theirs {
        "tool_use" => "tool_use",
        "max_tokens" => "max_tokens",
        "stop_sequence" => "stop_sequence",
        "guardrail_intervened" | "content_filtered" => "refusal",
        _ => "end_turn",
    }
}

/// Converse's usage as the messages protocol's.
fn usage(u: Option<&Value>) -> Value {
    let n = |key: &str| u.and_then(|u| u.get(key)).and_then(Value::as_u64).unwrap_or(0);
    json!({
        "input_tokens": n("inputTokens"),
        "output_tokens": n("outputTokens"),
        "cache_read_input_tokens": n("cacheReadInputTokens"),
        "cache_creation_input_tokens": n("cacheWriteInputTokens"),
    })
}

/// A messages id for an answer (Converse's has none).
fn message_id() -> String {
    crate::translate::new_id("msg_bdrk_")
}

/// A whole `ConverseResponse` as a messages answer (buffered: it is one JSON object).
#[derive(Default)]
pub struct WholeToMessages {
    body: Vec<u8>,
    /// The model as the provider knows it.
    model: String,
}

impl WholeToMessages {
    pub fn new(model: &str) -> Self {
        WholeToMessages { body: Vec::new(), model: model.to_string() }
    }
}

impl Decode for WholeToMessages {
    fn header(&self, header: &mut pingora_http::ResponseHeader) {
        header.remove_header(&http::header::CONTENT_LENGTH);
    }

    fn decode(&mut self, chunk: &[u8]) -> Bytes {
        self.body.extend_from_slice(chunk);
        Bytes::new()
    }

    fn finish(&mut self) -> Bytes {
        let v: Value = serde_json::from_slice(&std::mem::take(&mut self.body)).unwrap_or_default();
        let mut content = Vec::new();
        for b in v.pointer("/output/message/content").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default() {
            if let Some(text) = b.get("text") {
                content.push(json!({"type": "text", "text": text}));
            } else if let Some(t) = b.get("toolUse") {
                content.push(json!({"type": "tool_use", "id": t.get("toolUseId"), "name": t.get("name"), "input": t.get("input").cloned().unwrap_or_else(|| json!({}))}));
            } else if let Some(r) = b.pointer("/reasoningContent/reasoningText") {
                content.push(json!({"type": "thinking", "thinking": r.get("text"), "signature": r.get("signature").cloned().unwrap_or_else(|| json!(""))}));
            }
        }
        let answer = json!({
            "id": message_id(), "type": "message", "role": "assistant", "model": self.model, "content": content,
            "stop_reason": stop_reason(v.get("stopReason").and_then(Value::as_str).unwrap_or_default()),
            "stop_sequence": null, "usage": usage(v.get("usage")),
        });
        Bytes::from(answer.to_string())
    }
}

/// `ConverseStream`'s event-stream frames as the messages protocol's SSE.
#[derive(Default)]
pub struct StreamToMessages {
    frames: Frames,
    events: Events,
}

/// What the messages events written so far leave to write.
#[derive(Default)]
struct Events {
    /// The model as the provider knows it.
    model: String,
    /// Content blocks opened (by index).
    open: Vec<u64>,
    stop: Option<&'static str>,
    /// `message_stop` was sent.
    ended: bool,
}

fn event(out: &mut Vec<u8>, kind: &str, data: &Value) {
    crate::translate::sse::write_json(out, Some(kind), data);
}

impl StreamToMessages {
    pub fn new(model: &str) -> Self {
        StreamToMessages { frames: Frames::default(), events: Events { model: model.to_string(), ..Default::default() } }
    }
}

impl Events {
    /// Open block `index` (as `kind`) unless it is open.
    fn open_block(&mut self, index: u64, block: Value, out: &mut Vec<u8>) {
        if !self.open.contains(&index) {
            self.open.push(index);
            event(out, "content_block_start", &json!({"type": "content_block_start", "index": index, "content_block": block}));
        }
    }

    fn frame(&mut self, message: &Message, out: &mut Vec<u8>) {
        if header(message, ":message-type") != Some("event") {
            exception_event(message, out);
            return;
        }
        let v: Value = serde_json::from_slice(message.payload()).unwrap_or_default();
        let index = v.get("contentBlockIndex").and_then(Value::as_u64).unwrap_or(0);
        match header(message, ":event-type").unwrap_or_default() {
            "messageStart" => {
                let start = json!({"type": "message_start", "message": {"id": message_id(), "type": "message", "role": "assistant",
                    "model": self.model, "content": [], "stop_reason": null, "stop_sequence": null,
                    "usage": {"input_tokens": 0, "output_tokens": 0}}});
                event(out, "message_start", &start);
            }
            "contentBlockStart" => {
                if let Some(t) = v.pointer("/start/toolUse") {
                    self.open_block(index, json!({"type": "tool_use", "id": t.get("toolUseId"), "name": t.get("name"), "input": {}}), out);
                }
            }
            "contentBlockDelta" => {
                let delta = v.get("delta").cloned().unwrap_or_default();
                if let Some(text) = delta.get("text") {
                    self.open_block(index, json!({"type": "text", "text": ""}), out);
                    event(
                        out,
                        "content_block_delta",
                        &json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}}),
                    );
                } else if let Some(input) = delta.pointer("/toolUse/input") {
                    let d = json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": input}});
                    event(out, "content_block_delta", &d);
                } else if let Some(r) = delta.get("reasoningContent") {
                    self.open_block(index, json!({"type": "thinking", "thinking": "", "signature": ""}), out);
                    let d = match (r.get("text"), r.get("signature")) {
                        (Some(text), _) => json!({"type": "thinking_delta", "thinking": text}),
                        (None, Some(sig)) => json!({"type": "signature_delta", "signature": sig}),
                        _ => return,
                    };
                    event(out, "content_block_delta", &json!({"type": "content_block_delta", "index": index, "delta": d}));
                }
            }
            "contentBlockStop" if self.open.contains(&index) => {
                event(out, "content_block_stop", &json!({"type": "content_block_stop", "index": index}));
            }
            "messageStop" => self.stop = Some(stop_reason(v.get("stopReason").and_then(Value::as_str).unwrap_or_default())),
            "metadata" => self.end(v.get("usage"), out),
            _ => {}
        }
    }

    /// The message's end: its stop reason and usage, then `message_stop`.
    fn end(&mut self, u: Option<&Value>, out: &mut Vec<u8>) {
        if self.ended {
            return;
        }
        self.ended = true;
        let delta = json!({"type": "message_delta", "delta": {"stop_reason": self.stop.unwrap_or("end_turn"), "stop_sequence": null}, "usage": usage(u)});
        event(out, "message_delta", &delta);
        event(out, "message_stop", &json!({"type": "message_stop"}));
    }
}

impl Decode for StreamToMessages {
    fn header(&self, header: &mut pingora_http::ResponseHeader) {
        sse_header(header);
    }

    fn decode(&mut self, chunk: &[u8]) -> Bytes {
        let events = &mut self.events;
        self.frames.read(chunk, |message, out| events.frame(message, out))
    }

    fn finish(&mut self) -> Bytes {
        Bytes::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_smithy_types::event_stream::{Header, HeaderValue};

    #[test]
    fn a_messages_request_becomes_a_converse_request() {
        let body = json!({
            "model": "m", "max_tokens": 100, "temperature": 0.5, "stop_sequences": ["END"], "stream": true, "top_k": 5,
            "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
            "tools": [{"name": "get_weather", "description": "weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
            "tool_choice": {"type": "tool", "name": "get_weather"},
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "AAAA"}}]},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"}, {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny", "is_error": false}]},
            ],
        });
        let out: Value = serde_json::from_slice(&request(body.to_string().as_bytes()).unwrap()).unwrap();
        assert_eq!(
            out,
            json!({
                "system": [{"text": "be brief"}, {"cachePoint": {"type": "default"}}],
                "messages": [
                    {"role": "user", "content": [{"text": "hi"}, {"image": {"format": "jpeg", "source": {"bytes": "AAAA"}}}]},
                    {"role": "assistant", "content": [{"toolUse": {"toolUseId": "t1", "name": "get_weather", "input": {"city": "Paris"}}}]},
                    {"role": "user", "content": [{"toolResult": {"toolUseId": "t1", "content": [{"text": "sunny"}], "status": "success"}}]},
                ],
                "inferenceConfig": {"maxTokens": 100, "temperature": 0.5, "stopSequences": ["END"]},
                "toolConfig": {"tools": [{"toolSpec": {"name": "get_weather", "description": "weather",
                    "inputSchema": {"json": {"type": "object", "properties": {"city": {"type": "string"}}}}}}],
                    "toolChoice": {"tool": {"name": "get_weather"}}},
            })
        );
        let url_image =
            json!({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "https://x"}}]}]});
        assert!(matches!(request(url_image.to_string().as_bytes()), Err(SeamError::Body(why)) if why.contains("base64")));
    }

    #[test]
    fn a_whole_converse_answer_becomes_a_messages_answer() {
        let mut d = WholeToMessages::new("meta.llama");
        let answer = br#"{"output":{"message":{"role":"assistant","content":[{"text":"Hello"},{"toolUse":{"toolUseId":"t1","name":"f","input":{"a":1}}}]}},
            "stopReason":"tool_use","usage":{"inputTokens":12,"outputTokens":4,"totalTokens":16,"cacheReadInputTokens":3},"metrics":{"latencyMs":5}}"#;
        assert!(d.decode(&answer[..20]).is_empty());
        assert!(d.decode(&answer[20..]).is_empty());
        let v: Value = serde_json::from_slice(&d.finish()).unwrap();
        assert_eq!(
            v["content"],
            json!([{"type": "text", "text": "Hello"}, {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}])
        );
        assert_eq!((v["stop_reason"].as_str(), v["model"].as_str()), (Some("tool_use"), Some("meta.llama")));
        assert_eq!(
            v["usage"],
            json!({"input_tokens": 12, "output_tokens": 4, "cache_read_input_tokens": 3, "cache_creation_input_tokens": 0})
        );
    }

    fn frame(kind: &str, payload: Value) -> Vec<u8> {
        let m = Message::new(payload.to_string())
            .add_header(Header::new(":event-type", HeaderValue::String(kind.to_string().into())))
            .add_header(Header::new(":content-type", HeaderValue::String("application/json".into())))
            .add_header(Header::new(":message-type", HeaderValue::String("event".into())));
        let mut out = Vec::new();
        aws_smithy_eventstream::frame::write_message_to(&m, &mut out).unwrap();
        out
    }

    #[test]
    fn converse_stream_events_become_messages_events_with_usage_at_the_end() {
        let mut wire = frame("messageStart", json!({"role": "assistant", "p": "ab"}));
        wire.extend(frame("contentBlockDelta", json!({"contentBlockIndex": 0, "delta": {"text": "Hel"}})));
        wire.extend(frame("contentBlockDelta", json!({"contentBlockIndex": 0, "delta": {"text": "lo"}})));
        wire.extend(frame("contentBlockStop", json!({"contentBlockIndex": 0})));
        wire.extend(frame("contentBlockStart", json!({"contentBlockIndex": 1, "start": {"toolUse": {"toolUseId": "t1", "name": "f"}}})));
        wire.extend(frame("contentBlockDelta", json!({"contentBlockIndex": 1, "delta": {"toolUse": {"input": "{\"a\":"}}})));
        wire.extend(frame("contentBlockStop", json!({"contentBlockIndex": 1})));
        wire.extend(frame("messageStop", json!({"stopReason": "tool_use"})));
        wire.extend(frame(
            "metadata",
            json!({"usage": {"inputTokens": 9, "outputTokens": 5, "totalTokens": 14}, "metrics": {"latencyMs": 3}}),
        ));
        let mut d = StreamToMessages::new("mistral.x");
        let mut out = Vec::new();
        for piece in wire.chunks(13) {
            out.extend_from_slice(&d.decode(piece));
        }
        let text = String::from_utf8(out).unwrap();
        let events: Vec<(&str, Value)> = text
            .split("\n\n")
            .filter(|b| !b.is_empty())
            .map(|b| {
                let mut lines = b.lines();
                let name = lines.next().unwrap().strip_prefix("event: ").unwrap();
                (name, serde_json::from_str(lines.next().unwrap().strip_prefix("data: ").unwrap()).unwrap())
            })
            .collect();
        let names: Vec<&str> = events.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(events[0].1["message"]["model"], "mistral.x");
        assert_eq!(events[5].1["content_block"], json!({"type": "tool_use", "id": "t1", "name": "f", "input": {}}));
        assert_eq!(events[6].1["delta"], json!({"type": "input_json_delta", "partial_json": "{\"a\":"}));
        assert_eq!(events[8].1["delta"]["stop_reason"], "tool_use");
        assert_eq!(events[8].1["usage"]["input_tokens"], 9);
        assert_eq!(events[8].1["usage"]["output_tokens"], 5);
        // The meter reads it as it reads Anthropic's own stream.
        let mut scanner = crate::billing::meter::UsageScanner::new(crate::billing::meter::Shape::Messages, true, false);
        scanner.feed(&Bytes::from(text.clone()));
        let found = scanner.finish();
        assert_eq!((found.input, found.output), (Some(9), Some(5)));
    }
}
