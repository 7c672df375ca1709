//! The answers the mock writes: whole JSON bodies with usage, and each protocol's stream
//! events as the real services frame them.

use crate::wire::*;
use base64::Engine;
use serde_json::{json, Value};

pub(crate) fn sse(event: Option<&str>, data: &Value) -> String {
    match event {
        Some(name) => format!("event: {name}\ndata: {data}\n\n"),
        None => format!("data: {data}\n\n"),
    }
}

/// Remove the usage an answer or event carries (`usage`, `usageMetadata`, `response.usage`),
/// as a field mask or an upstream that omits it would.
pub(crate) fn strip_usage(v: &mut Value) {
    if let Some(obj) = v.as_object_mut() {
        obj.remove("usage");
        obj.remove("usageMetadata");
        if let Some(inner) = obj.get_mut("response") {
            strip_usage(inner);
        }
    }
}

/// The whole (non-streamed) answer, without its usage when the call says so.
pub(crate) fn whole_body(call: &Call) -> Value {
    let mut v = whole_body_with_usage(call);
    if call.no_usage {
        strip_usage(&mut v);
    }
    v
}

/// Messages usage, with prompt-cache tokens when the call has them.
pub(crate) fn messages_usage(call: &Call, out: u64) -> Value {
    let mut u = json!({"input_tokens": call.input_tokens, "output_tokens": out});
    if let Some((write, read)) = call.cache {
        u["cache_creation_input_tokens"] = json!(write);
        u["cache_read_input_tokens"] = json!(read);
    }
    u
}

/// The answer's text in stream pieces: the reply's words, or the mock's.
pub(crate) fn words_of(call: &Call) -> Vec<String> {
    match &call.reply {
        Some(reply) if call.pieces.is_some() => {
            let chars: Vec<char> = reply.chars().collect();
            chars.chunks(call.pieces.unwrap_or(1).max(1)).map(|c| c.iter().collect()).collect()
        }
        Some(reply) => reply.split_inclusive(' ').map(str::to_string).collect(),
        None => text_of(call.deltas).into_iter().map(str::to_string).collect(),
    }
}

pub(crate) fn whole_body_with_usage(call: &Call) -> Value {
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
pub(crate) fn gemini_call_chunk(model: &str, t: &ToolCall, inp: u64, out: u64) -> Value {
    let mut chunk = gemini_chunk(model, "", Some("STOP"), inp, out);
    chunk["candidates"][0]["content"]["parts"] = json!([{"functionCall": {"name": t.name, "args": t.args_value()}}]);
    chunk
}

/// A finished response's output item: the message with its text, or the function call.
pub(crate) fn response_item(call: &Call, text: &str) -> Value {
    match &call.tool {
        Some(t) => json!({"type": "function_call", "id": "fc_mock", "call_id": "call_mock", "name": t.name,
                          "arguments": t.args, "status": "completed"}),
        None => json!({"type": "message", "id": "msg_mock", "status": "completed", "role": "assistant",
                       "content": [{"type": "output_text", "text": text, "annotations": []}]}),
    }
}

pub(crate) fn response_output(call: &Call, text: &str) -> Value {
    json!([response_item(call, text)])
}

pub(crate) fn response_object(call: &Call, output: &Value, status: &str, out: u64) -> Value {
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

pub(crate) fn gemini_chunk(model: &str, text: &str, finish: Option<&str>, inp: u64, out: u64) -> Value {
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
pub(crate) fn stream_events(call: &Call) -> Vec<String> {
    let words = words_of(call);
    let out = call.output_tokens.unwrap_or(call.deltas as u64);
    let inp = call.input_tokens;
    let mut ev = Vec::new();
    match call.kind {
        Kind::Chat | Kind::Embeddings => chat_events(call, &words, out, inp, &mut ev),
        Kind::Responses => responses_events(call, &words, out, &mut ev),
        Kind::Messages => messages_events(call, &words, out, &mut ev),
        Kind::Generate { .. } => gemini_events(call, &words, out, inp, &mut ev),
    }
    ev
}

/// Chat completions' chunks (and `[DONE]`).
fn chat_events(call: &Call, words: &[String], out: u64, inp: u64, ev: &mut Vec<String>) {
    let model = call.model.as_str();
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
        for w in words {
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

/// The responses API's events, numbered.
fn responses_events(call: &Call, words: &[String], out: u64, ev: &mut Vec<String>) {
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
            for w in words {
                push("response.output_text.delta", json!({"item_id": "msg_mock", "output_index": 0, "content_index": 0, "delta": w}));
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

/// The messages API's events.
fn messages_events(call: &Call, words: &[String], out: u64, ev: &mut Vec<String>) {
    let model = call.model.as_str();
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

/// Generate content's chunks: SSE with `alt=sse`, else one JSON array.
fn gemini_events(call: &Call, words: &[String], out: u64, inp: u64, ev: &mut Vec<String>) {
    let model = call.model.as_str();
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
