//! Bedrock's Converse API as clients speak it to tollgate (`POST /model/{id}/converse`,
//! `/converse-stream`): a Converse request as the messages request it stands for
//! ([`to_messages`]), a messages answer as a `ConverseResponse` ([`answer`]), and a messages
//! stream as `ConverseStream`'s event-stream frames, event by event ([`StreamFrames`]). The
//! reverse of the Bedrock upstream's conversion (`upstream::seam::converse`). Pure.
//!
//! Carried: system prompts, text, images (bytes), tool definitions and choice, tool calls and
//! results (text and JSON), reasoning (text and signature), the output maximum (default
//! [`DEFAULT_MAX_TOKENS`]), temperature, top_p, stop sequences, `additionalModelRequestFields`
//! (merged into the request: `top_k`, `thinking`), stop reasons and usage. Refused (400, the
//! field named): documents, videos, guard content, `performanceConfig`, `promptVariables`.

use super::{ApiError, ErrorKind};
use bytes::Bytes;
use serde_json::{json, Map, Value};

/// The output maximum of a Converse request that names none.
pub const DEFAULT_MAX_TOKENS: u64 = 4096;

fn bad(field: &str, why: &str) -> ApiError {
    ApiError::new(ErrorKind::BadRequest, format!("{field}: {why}")).with_param(field)
}

fn content(blocks: &[Value], at: &str) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::new();
    for (i, b) in blocks.iter().enumerate() {
        let here = format!("{at}[{i}]");
        if let Some(text) = b.get("text").and_then(Value::as_str) {
            out.push(json!({"type": "text", "text": text}));
        } else if let Some(img) = b.get("image") {
            let format = img.get("format").and_then(Value::as_str).unwrap_or("png");
            let Some(bytes) = img.pointer("/source/bytes").and_then(Value::as_str) else {
                return Err(bad(&format!("{here}.image.source"), "only bytes are taken (an S3 location is not)"));
            };
            out.push(json!({"type": "image", "source": {"type": "base64", "media_type": format!("image/{format}"), "data": bytes}}));
        } else if let Some(tu) = b.get("toolUse") {
            out.push(json!({"type": "tool_use", "id": tu.get("toolUseId"), "name": tu.get("name"), "input": tu.get("input").cloned().unwrap_or(json!({}))}));
        } else if let Some(tr) = b.get("toolResult") {
            let mut parts = Vec::new();
            for (j, c) in tr.get("content").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default().iter().enumerate() {
                if let Some(t) = c.get("text").and_then(Value::as_str) {
                    parts.push(json!({"type": "text", "text": t}));
                } else if let Some(j) = c.get("json") {
                    parts.push(json!({"type": "text", "text": j.to_string()}));
                } else {
                    return Err(bad(&format!("{here}.toolResult.content[{j}]"), "text and json results are taken"));
                }
            }
            let mut r = json!({"type": "tool_result", "tool_use_id": tr.get("toolUseId"), "content": parts});
            if tr.get("status").and_then(Value::as_str) == Some("error") {
                r["is_error"] = Value::Bool(true);
            }
            out.push(r);
        } else if let Some(rc) = b.get("reasoningContent") {
            let text = rc.pointer("/reasoningText/text").and_then(Value::as_str).unwrap_or_default();
            let mut t = json!({"type": "thinking", "thinking": text});
            if let Some(sig) = rc.pointer("/reasoningText/signature") {
                t["signature"] = sig.clone();
            }
            out.push(t);
        } else if b.get("cachePoint").is_some() {
            if let Some(last) = out.last_mut() {
                last["cache_control"] = json!({"type": "ephemeral"});
            }
        } else {
            let kind = b.as_object().and_then(|o| o.keys().next().cloned()).unwrap_or_default();
            return Err(bad(&here, &format!("a '{kind}' block is not carried")));
        }
    }
    Ok(out)
}

/// A Converse request as a messages request for `model`.
pub fn to_messages(body: &[u8], model: &str, stream: bool) -> Result<Bytes, ApiError> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| ApiError::new(ErrorKind::BadRequest, format!("The request body is not JSON: {e}.")))?;
    let Some(req) = v.as_object() else { return Err(ApiError::new(ErrorKind::BadRequest, "The request body must be a JSON object.")) };
    for field in ["performanceConfig", "promptVariables", "guardrailConfig"] {
        if req.contains_key(field) {
            return Err(bad(field, "not carried by this gateway"));
        }
    }
    let mut out = Map::new();
    out.insert("model".into(), Value::from(model));
    let mut messages = Vec::new();
    for (i, m) in req.get("messages").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default().iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
        let blocks =
            content(m.get("content").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default(), &format!("messages[{i}].content"))?;
        messages.push(json!({"role": role, "content": blocks}));
    }
    out.insert("messages".into(), Value::Array(messages));
    if let Some(system) = req.get("system").and_then(Value::as_array) {
        let blocks = content(system, "system")?;
        if !blocks.is_empty() {
            out.insert("system".into(), Value::Array(blocks));
        }
    }
    let cfg = req.get("inferenceConfig");
    let max = cfg.and_then(|c| c.get("maxTokens")).and_then(Value::as_u64).unwrap_or(DEFAULT_MAX_TOKENS);
    out.insert("max_tokens".into(), Value::from(max));
    for (theirs, ours) in [("temperature", "temperature"), ("topP", "top_p"), ("stopSequences", "stop_sequences")] {
        if let Some(x) = cfg.and_then(|c| c.get(theirs)) {
            out.insert(ours.into(), x.clone());
        }
    }
    if let Some(tc) = req.get("toolConfig") {
        let tools: Vec<Value> = tc
            .get("tools")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .filter_map(|t| t.get("toolSpec"))
            .map(|s| json!({"name": s.get("name"), "description": s.get("description"), "input_schema": s.pointer("/inputSchema/json").cloned().unwrap_or(json!({"type": "object"}))}))
            .collect();
        out.insert("tools".into(), Value::Array(tools));
        if let Some(choice) = tc.get("toolChoice") {
            let c = if choice.get("any").is_some() {
                json!({"type": "any"})
            } else if let Some(name) = choice.pointer("/tool/name") {
                json!({"type": "tool", "name": name})
            } else {
                json!({"type": "auto"})
            };
            out.insert("tool_choice".into(), c);
        }
    }
    if let Some(extra) = req.get("additionalModelRequestFields").and_then(Value::as_object) {
        for (k, x) in extra {
            out.entry(k.clone()).or_insert_with(|| x.clone());
        }
    }
    if stream {
        out.insert("stream".into(), Value::Bool(true));
    }
    Ok(Bytes::from(Value::Object(out).to_string()))
}

fn stop_reason(ours: Option<&str>) -> &'static str {
    match ours {
        Some("tool_use") => "tool_use",
        Some("max_tokens") => "max_tokens",
        Some("stop_sequence") => "stop_sequence",
        Some("refusal") => "content_filtered",
        _ => "end_turn",
    }
}

fn usage(input: u64, output: u64, cache_read: u64, cache_write: u64) -> Value {
    json!({"inputTokens": input, "outputTokens": output, "totalTokens": input + output + cache_read + cache_write,
           "cacheReadInputTokens": cache_read, "cacheWriteInputTokens": cache_write})
}

fn n(v: &Value, p: &str) -> u64 {
    v.pointer(p).and_then(Value::as_u64).unwrap_or(0)
}

/// A whole messages answer as a `ConverseResponse`.
pub fn answer(body: &[u8], latency_ms: u64) -> Option<Vec<u8>> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let mut blocks = Vec::new();
    for b in v.get("content").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default() {
        match b.get("type").and_then(Value::as_str) {
            Some("text") => blocks.push(json!({"text": b.get("text")})),
            Some("tool_use") => blocks.push(json!({"toolUse": {"toolUseId": b.get("id"), "name": b.get("name"), "input": b.get("input")}})),
            Some("thinking") => {
                blocks.push(json!({"reasoningContent": {"reasoningText": {"text": b.get("thinking"), "signature": b.get("signature")}}}))
            }
            _ => {}
        }
    }
    let out = json!({
        "output": {"message": {"role": "assistant", "content": blocks}},
        "stopReason": stop_reason(v.get("stop_reason").and_then(Value::as_str)),
        "usage": usage(n(&v, "/usage/input_tokens"), n(&v, "/usage/output_tokens"), n(&v, "/usage/cache_read_input_tokens"), n(&v, "/usage/cache_creation_input_tokens")),
        "metrics": {"latencyMs": latency_ms},
    });
    Some(out.to_string().into_bytes())
}

fn frame(kind: &str, payload: &Value, out: &mut Vec<u8>) {
    use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
    let message = Message::new(Bytes::from(payload.to_string()))
        .add_header(Header::new(":event-type", HeaderValue::String(kind.to_string().into())))
        .add_header(Header::new(":content-type", HeaderValue::String("application/json".into())))
        .add_header(Header::new(":message-type", HeaderValue::String("event".into())));
    if let Err(e) = aws_smithy_eventstream::frame::write_message_to(&message, out) {
        log::warn!("converse ingress: a frame could not be written: {e}");
    }
}

/// A messages stream as `ConverseStream` frames: `messageStart`, `contentBlockStart` (tool
/// calls), `contentBlockDelta`, `contentBlockStop`, `messageStop`, `metadata` (usage).
#[derive(Default)]
pub struct StreamFrames {
    usage: (u64, u64, u64, u64),
    stop: Option<&'static str>,
    started: Option<std::time::Instant>,
}

impl StreamFrames {
    /// The frames of one messages stream event (`data` JSON).
    pub fn event(&mut self, data: &Value, out: &mut Vec<u8>) {
        let index = data.get("index").and_then(Value::as_u64).unwrap_or(0);
        match data.get("type").and_then(Value::as_str) {
            Some("message_start") => {
                self.started = Some(std::time::Instant::now());
                self.usage.0 = n(data, "/message/usage/input_tokens");
                self.usage.2 = n(data, "/message/usage/cache_read_input_tokens");
                self.usage.3 = n(data, "/message/usage/cache_creation_input_tokens");
                frame("messageStart", &json!({"role": "assistant"}), out);
            }
            Some("content_block_start") if data.pointer("/content_block/type").and_then(Value::as_str) == Some("tool_use") => {
                let start =
                    json!({"toolUse": {"toolUseId": data.pointer("/content_block/id"), "name": data.pointer("/content_block/name")}});
                frame("contentBlockStart", &json!({"contentBlockIndex": index, "start": start}), out);
            }
            Some("content_block_delta") => {
                let d = data.get("delta").cloned().unwrap_or_default();
                let delta = match d.get("type").and_then(Value::as_str) {
                    Some("text_delta") => json!({"text": d.get("text")}),
                    Some("input_json_delta") => json!({"toolUse": {"input": d.get("partial_json")}}),
                    Some("thinking_delta") => json!({"reasoningContent": {"text": d.get("thinking")}}),
                    Some("signature_delta") => json!({"reasoningContent": {"signature": d.get("signature")}}),
                    _ => return,
                };
                frame("contentBlockDelta", &json!({"contentBlockIndex": index, "delta": delta}), out);
            }
            Some("content_block_stop") => frame("contentBlockStop", &json!({"contentBlockIndex": index}), out),
            Some("message_delta") => {
                self.stop = Some(stop_reason(data.pointer("/delta/stop_reason").and_then(Value::as_str)));
                if let Some(o) = data.pointer("/usage/output_tokens").and_then(Value::as_u64) {
                    self.usage.1 = o;
                }
                if let Some(i) = data.pointer("/usage/input_tokens").and_then(Value::as_u64) {
                    self.usage.0 = i;
                }
            }
            Some("message_stop") => {
                frame("messageStop", &json!({"stopReason": self.stop.unwrap_or("end_turn")}), out);
                let (i, o, r, w) = self.usage;
                let latency = self.started.map_or(0, |s| u64::try_from(s.elapsed().as_millis()).unwrap_or(u64::MAX));
                frame("metadata", &json!({"usage": usage(i, o, r, w), "metrics": {"latencyMs": latency}}), out);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_smithy_eventstream::frame::{DecodedFrame, MessageFrameDecoder};

    #[test]
    fn a_converse_request_becomes_the_messages_request_it_stands_for() {
        let body = json!({
            "messages": [{"role": "user", "content": [{"text": "hi"}, {"image": {"format": "png", "source": {"bytes": "aGk="}}}]},
                         {"role": "assistant", "content": [{"toolUse": {"toolUseId": "t1", "name": "f", "input": {"a": 1}}}]},
                         {"role": "user", "content": [{"toolResult": {"toolUseId": "t1", "content": [{"json": {"ok": true}}], "status": "error"}}]}],
            "system": [{"text": "be brief"}, {"cachePoint": {"type": "default"}}],
            "inferenceConfig": {"maxTokens": 50, "temperature": 0.2, "stopSequences": ["END"]},
            "toolConfig": {"tools": [{"toolSpec": {"name": "f", "description": "d", "inputSchema": {"json": {"type": "object"}}}}], "toolChoice": {"any": {}}},
            "additionalModelRequestFields": {"top_k": 5},
        });
        let out: Value = serde_json::from_slice(&to_messages(body.to_string().as_bytes(), "beta-opus-4-7", true).unwrap()).unwrap();
        assert_eq!(out["model"], "beta-opus-4-7");
        assert_eq!(
            (out["max_tokens"].as_u64(), out["temperature"].as_f64(), out["top_k"].as_u64(), out["stream"].as_bool()),
            (Some(50), Some(0.2), Some(5), Some(true))
        );
        assert_eq!(out["system"], json!([{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}]));
        assert_eq!(out["messages"][0]["content"][1]["source"], json!({"type": "base64", "media_type": "image/png", "data": "aGk="}));
        assert_eq!(out["messages"][1]["content"][0], json!({"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}));
        assert_eq!(
            out["messages"][2]["content"][0],
            json!({"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "{\"ok\":true}"}], "is_error": true})
        );
        assert_eq!(
            (out["tool_choice"].clone(), out["tools"][0]["input_schema"].clone()),
            (json!({"type": "any"}), json!({"type": "object"}))
        );
        let plain: Value = serde_json::from_slice(&to_messages(br#"{"messages":[]}"#, "m", false).unwrap()).unwrap();
        assert_eq!(plain, json!({"model": "m", "messages": [], "max_tokens": DEFAULT_MAX_TOKENS}));
        let e = to_messages(br#"{"messages":[{"role":"user","content":[{"document":{}}]}]}"#, "m", false).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].content[0]"));
        assert!(to_messages(br#"{"performanceConfig":{}}"#, "m", false).is_err());
    }

    #[test]
    fn a_messages_answer_and_stream_become_converses() {
        let whole = json!({"content": [{"type": "text", "text": "Hello"}, {"type": "tool_use", "id": "t", "name": "f", "input": {}}],
                           "stop_reason": "tool_use", "usage": {"input_tokens": 3, "output_tokens": 4}});
        let a: Value = serde_json::from_slice(&answer(whole.to_string().as_bytes(), 7).unwrap()).unwrap();
        assert_eq!(a["output"]["message"]["content"][0], json!({"text": "Hello"}));
        assert_eq!((a["stopReason"].as_str(), a["usage"]["totalTokens"].as_u64()), (Some("tool_use"), Some(7)));
        let mut s = StreamFrames::default();
        let mut out = Vec::new();
        for e in [
            json!({"type": "message_start", "message": {"usage": {"input_tokens": 9, "output_tokens": 1}}}),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}}),
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}}),
            json!({"type": "message_stop"}),
        ] {
            s.event(&e, &mut out);
        }
        let mut buf = bytes::BytesMut::from(&out[..]);
        let mut d = MessageFrameDecoder::new();
        let mut seen = Vec::new();
        while let Ok(DecodedFrame::Complete(m)) = d.decode_frame(&mut buf) {
            let kind = m
                .headers()
                .iter()
                .find(|h| h.name().as_str() == ":event-type")
                .and_then(|h| h.value().as_string().ok())
                .map(|s| s.as_str().to_string())
                .unwrap();
            seen.push((kind, serde_json::from_slice::<Value>(m.payload()).unwrap()));
        }
        let kinds: Vec<&str> = seen.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(kinds, ["messageStart", "contentBlockDelta", "contentBlockStop", "messageStop", "metadata"]);
        assert_eq!(seen[1].1["delta"]["text"], "Hi");
        assert_eq!((seen[4].1["usage"]["inputTokens"].as_u64(), seen[4].1["usage"]["outputTokens"].as_u64()), (Some(9), Some(2)));
    }
}
