//! Translation tests: every client protocol against every provider protocol, requests, whole
//! answers and streams (every cut of the provider's bytes), and round trips of the internal form.

use super::*;
use crate::config::Protocol;
use serde_json::json;

fn t(client: Dialect, upstream: Dialect, stream: bool) -> Translation {
    Translation {
        client,
        upstream: upstream.shape(),
        model: "m-1".into(),
        stream,
        client_wants_usage: true,
        gemini_sse: true,
        input_estimate: 42,
        count: false,
        max_event_bytes: super::sse::DEFAULT_MAX_EVENT_BYTES,
    }
}

fn req(client: Dialect, upstream: Dialect, body: Value) -> Value {
    let out = request(&t(client, upstream, false), body.to_string().as_bytes(), 4096).expect("translates");
    serde_json::from_slice(&out).expect("json")
}

fn refused(client: Dialect, upstream: Dialect, body: Value) -> ApiError {
    request(&t(client, upstream, false), body.to_string().as_bytes(), 4096).expect_err("refused")
}

/// A conversation with instructions, an image, a tool call and its result, in each client protocol.
fn chat_turn() -> Value {
    json!({
        "model": "m-1",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Weather?"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}}]},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Rome\"}"}}
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "tool", "tool_call_id": "call_2", "content": "rain"}
        ],
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": false, "$schema": "http://json-schema.org/draft-07/schema#"}}}],
        "tool_choice": "required",
        "max_completion_tokens": 300,
        "temperature": 0.5,
        "stop": ["END"],
        "user": "someone"
    })
}

#[test]
fn chat_to_messages_maps_instructions_parallel_calls_and_results() {
    let out = req(Dialect::Chat, Dialect::Messages, chat_turn());
    assert_eq!(out["system"], json!([{"type": "text", "text": "Be brief."}]));
    assert_eq!(out["max_tokens"], 300);
    assert_eq!(out["stop_sequences"], json!(["END"]));
    assert_eq!(out["tool_choice"], json!({"type": "any"}));
    assert_eq!(out["tools"][0]["input_schema"]["required"], json!(["city"]));
    assert!(out.get("user").is_none(), "dropped: {out}");
    let m = out["messages"].as_array().expect("messages");
    assert_eq!(m.len(), 3);
    assert_eq!(m[0]["content"][1], json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}}));
    // Two calls in one assistant turn; both results in one user turn.
    assert_eq!(m[1]["content"][0], json!({"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}));
    assert_eq!(m[1]["content"][1]["id"], "call_2");
    assert_eq!(m[2]["content"][0]["type"], "tool_result");
    assert_eq!(m[2]["content"][1]["tool_use_id"], "call_2");
}

#[test]
fn chat_to_gemini_names_function_responses_and_narrows_schemas() {
    let out = req(Dialect::Chat, Dialect::Gemini, chat_turn());
    assert_eq!(out["systemInstruction"], json!({"parts": [{"text": "Be brief."}]}));
    assert_eq!(out["generationConfig"]["maxOutputTokens"], 300);
    assert_eq!(out["toolConfig"], json!({"functionCallingConfig": {"mode": "ANY"}}));
    let params = &out["tools"][0]["functionDeclarations"][0]["parameters"];
    assert!(params.get("additionalProperties").is_none() && params.get("$schema").is_none(), "{params}");
    let c = out["contents"].as_array().expect("contents");
    assert_eq!(c[0]["parts"][1], json!({"inlineData": {"mimeType": "image/png", "data": "iVBO"}}));
    assert_eq!(c[1]["role"], "model");
    assert_eq!(c[1]["parts"][1], json!({"functionCall": {"name": "get_weather", "args": {"city": "Rome"}}}));
    assert_eq!(c[2]["parts"][0], json!({"functionResponse": {"name": "get_weather", "response": {"output": "sunny"}}}));
    assert_eq!(c[2]["parts"][1]["functionResponse"]["response"]["output"], "rain");
}

#[test]
fn messages_to_chat_keeps_tool_ids_and_splits_results_into_tool_messages() {
    let out = req(
        Dialect::Messages,
        Dialect::Chat,
        json!({
            "model": "m-1", "max_tokens": 1000, "stream": false,
            "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
            "messages": [
                {"role": "user", "content": "read it"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "from elsewhere", "signature": ""},
                    {"type": "text", "text": "Reading."},
                    {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "/a"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "contents"}]},
                    {"type": "text", "text": "and now?", "cache_control": {"type": "ephemeral"}}
                ]},
                {"role": "system", "content": "A reminder."}
            ],
            "tools": [{"name": "Read", "description": "Read a file", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}}],
            "thinking": {"type": "enabled", "budget_tokens": 9000},
            "metadata": {"user_id": "u"}
        }),
    );
    assert_eq!(out["max_completion_tokens"], 1000);
    assert_eq!(out["reasoning_effort"], "medium");
    let m = out["messages"].as_array().expect("messages");
    assert_eq!(m[0], json!({"role": "system", "content": "You are Claude Code."}));
    assert_eq!(m[2]["tool_calls"][0]["id"], "toolu_1");
    assert_eq!(m[2]["tool_calls"][0]["function"]["arguments"], "{\"file_path\":\"/a\"}");
    assert_eq!(m[2]["content"], "Reading.");
    assert_eq!(m[3], json!({"role": "tool", "tool_call_id": "toolu_1", "content": "contents"}));
    assert_eq!(m[4], json!({"role": "user", "content": "and now?"}));
    assert_eq!(m[5], json!({"role": "system", "content": "A reminder."}));
    assert!(out.get("metadata").is_none());
}

#[test]
fn gemini_client_calls_get_ids_and_responses_find_them() {
    let body = json!({
        "contents": [
            {"role": "user", "parts": [{"text": "Weather in two cities"}]},
            {"role": "model", "parts": [
                {"functionCall": {"name": "w", "args": {"c": "a"}}, "thoughtSignature": "sig=="},
                {"functionCall": {"name": "w", "args": {"c": "b"}}}
            ]},
            {"role": "user", "parts": [
                {"functionResponse": {"name": "w", "response": {"output": "A"}}},
                {"functionResponse": {"name": "w", "response": {"output": "B"}}}
            ]}
        ],
        "generationConfig": {"maxOutputTokens": 50, "thinkingConfig": {"thinkingBudget": 2048}, "candidateCount": 1},
        "safetySettings": [{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_NONE"}]
    });
    let out = req(Dialect::Gemini, Dialect::Messages, body);
    let m = out["messages"].as_array().expect("messages");
    let a = m[1]["content"][0]["id"].as_str().expect("id");
    let b = m[1]["content"][1]["id"].as_str().expect("id");
    assert_ne!(a, b);
    assert_eq!(m[2]["content"][0]["tool_use_id"], a);
    assert_eq!(m[2]["content"][1]["tool_use_id"], b);
    assert_eq!(m[2]["content"][1]["content"][0]["text"], "B");
    // A budget the output maximum leaves no room for (the protocol takes 1024 at least) is not asked.
    assert!(out.get("thinking").is_none(), "{out}");
    assert_eq!(out["max_tokens"], 50);
}

#[test]
fn what_cannot_be_carried_is_refused_naming_the_field() {
    let chat = |extra: Value| {
        let mut b = json!({"model": "m-1", "messages": [{"role": "user", "content": "hi"}]});
        if let (Some(b), Some(e)) = (b.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        b
    };
    for (extra, to, field) in [
        (json!({"n": 2}), Dialect::Messages, "n"),
        (json!({"logprobs": true}), Dialect::Messages, "logprobs"),
        (json!({"logit_bias": {"1": 2}}), Dialect::Gemini, "logit_bias"),
        (json!({"seed": 3}), Dialect::Messages, "seed"),
        (json!({"presence_penalty": 0.5}), Dialect::Messages, "presence_penalty"),
        (json!({"response_format": {"type": "json_object"}}), Dialect::Messages, "response_format"),
        (json!({"audio": {"voice": "x"}}), Dialect::Gemini, "audio"),
        (
            json!({"parallel_tool_calls": false, "tools": [{"type": "function", "function": {"name": "f"}}]}),
            Dialect::Gemini,
            "parallel_tool_calls",
        ),
    ] {
        let e = refused(Dialect::Chat, to, chat(extra.clone()));
        assert_eq!((e.status(), e.param.as_deref()), (400, Some(field)), "{extra}: {e:?}");
    }
    let e = refused(
        Dialect::Chat,
        Dialect::Messages,
        json!({"model": "m-1", "messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]}),
    );
    assert_eq!(e.param.as_deref(), Some("messages[0].content"));
    // `top_k` narrows sampling only: left out for a chat-completions provider (which has none).
    let out = req(
        Dialect::Messages,
        Dialect::Chat,
        json!({"model": "m", "max_tokens": 5, "top_k": 3, "messages": [{"role": "user", "content": "x"}]}),
    );
    assert!(out.get("top_k").is_none(), "{out}");
    let e = refused(
        Dialect::Messages,
        Dialect::Gemini,
        json!({"model": "m", "max_tokens": 5, "output_config": {"task_budget": 3}, "messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(e.param.as_deref(), Some("output_config.task_budget"));
    let e = refused(
        Dialect::Gemini,
        Dialect::Chat,
        json!({"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"candidateCount": 2}}),
    );
    assert_eq!(e.param.as_deref(), Some("generationConfig.candidateCount"));
    // Harmless settings pass: n = 1, logprobs false.
    req(Dialect::Chat, Dialect::Messages, chat(json!({"n": 1, "logprobs": false, "store": true, "service_tier": "auto"})));
}

#[test]
fn reasoning_controls_map_between_protocols() {
    // Claude Code: adaptive thinking with an effort.
    let claude = json!({"model": "m", "max_tokens": 32000, "thinking": {"type": "adaptive"}, "output_config": {"effort": "high"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}, "messages": [{"role": "user", "content": "x"}]});
    assert_eq!(req(Dialect::Messages, Dialect::Chat, claude.clone())["reasoning_effort"], "high");
    assert_eq!(
        req(Dialect::Messages, Dialect::Gemini, claude)["generationConfig"]["thinkingConfig"],
        json!({"thinkingBudget": 24576, "includeThoughts": true})
    );
    // Gemini CLI: thoughts included, no budget: the provider's default, nothing asked.
    let gemini = json!({"contents": [{"role": "user", "parts": [{"text": "x"}]}], "generationConfig": {"temperature": 1, "topP": 0.95, "topK": 64, "thinkingConfig": {"includeThoughts": true}}});
    let out = req(Dialect::Gemini, Dialect::Chat, gemini);
    assert!(out.get("reasoning_effort").is_none() && out.get("top_k").is_none(), "{out}");
    assert_eq!((out["temperature"].as_f64(), out["top_p"].as_f64()), (Some(1.0), Some(0.95)));
    let budget = json!({"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"maxOutputTokens": 20000, "thinkingConfig": {"thinkingBudget": 1500}}});
    assert_eq!(req(Dialect::Gemini, Dialect::Messages, budget.clone())["thinking"], json!({"type": "enabled", "budget_tokens": 1500}));
    assert_eq!(req(Dialect::Gemini, Dialect::Chat, budget)["reasoning_effort"], "low");
    let off = json!({"model": "m", "reasoning_effort": "low", "messages": [{"role": "user", "content": "x"}]});
    assert_eq!(req(Dialect::Chat, Dialect::Gemini, off)["generationConfig"]["thinkingConfig"]["thinkingBudget"], 1024);
}

#[test]
fn structured_output_maps_to_response_schema() {
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema",
        "json_schema": {"name": "r", "schema": {"type": "object", "properties": {"a": {"type": ["string", "null"]}}, "additionalProperties": false}}}});
    let g = req(Dialect::Chat, Dialect::Gemini, body)["generationConfig"].clone();
    assert_eq!(g["responseMimeType"], "application/json");
    assert_eq!(g["responseSchema"], json!({"type": "object", "properties": {"a": {"type": "string", "nullable": true}}}));
    let back = req(
        Dialect::Gemini,
        Dialect::Chat,
        json!({"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"responseMimeType": "application/json", "responseSchema": {"type": "OBJECT", "properties": {"a": {"type": "STRING"}}}}}),
    );
    assert_eq!(back["response_format"]["json_schema"]["schema"], json!({"type": "object", "properties": {"a": {"type": "string"}}}));
    // To a messages provider: its output_config.format (a schema is required there).
    let m = req(
        Dialect::Chat,
        Dialect::Messages,
        json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object"}}}}),
    );
    assert_eq!(m["output_config"], json!({"format": {"type": "json_schema", "schema": {"type": "object"}}}));
    let back = req(
        Dialect::Messages,
        Dialect::Gemini,
        json!({"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "x"}],
        "output_config": {"format": {"type": "json_schema", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}}}),
    );
    assert_eq!(back["generationConfig"]["responseSchema"], json!({"type": "object", "properties": {"a": {"type": "integer"}}}));
}

#[test]
fn responses_items_become_turns_consecutive_calls_one_assistant_message() {
    let body = json!({
        "model": "m", "instructions": "Be brief.", "store": false, "include": ["reasoning.encrypted_content"],
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Use tools."}]},
            {"role": "user", "content": "Weather in two cities?"},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "two calls"}]},
            {"type": "function_call", "call_id": "call_a", "name": "w", "arguments": "{\"c\":\"a\"}"},
            {"type": "function_call", "call_id": "call_b", "name": "w", "arguments": "{\"c\":\"b\"}"},
            {"type": "function_call_output", "call_id": "call_a", "output": "A"},
            {"type": "function_call_output", "call_id": "call_b", "output": "B"}
        ],
        "tools": [{"type": "function", "name": "w", "parameters": {"type": "object"}, "strict": false}],
        "max_output_tokens": 500, "reasoning": {"effort": "low", "summary": "auto"}
    });
    let out = req(Dialect::Responses, Dialect::Messages, body.clone());
    assert_eq!(out["system"], json!([{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Use tools."}]));
    let m = out["messages"].as_array().expect("messages");
    assert_eq!(m.len(), 3, "{out}");
    let calls: Vec<&str> = m[1]["content"].as_array().into_iter().flatten().filter_map(|b| b["id"].as_str()).collect();
    assert_eq!(calls, ["call_a", "call_b"], "one assistant turn with both calls");
    assert_eq!(m[2]["content"][1]["tool_use_id"], "call_b");
    assert_eq!(out["max_tokens"], 500);
    let out = req(Dialect::Responses, Dialect::Chat, body);
    assert_eq!(out["messages"][3]["tool_calls"].as_array().map(Vec::len), Some(2), "{out}");
    assert_eq!(out["reasoning_effort"], "low");
    // A stored conversation cannot be continued on another protocol's model.
    let e = refused(Dialect::Responses, Dialect::Gemini, json!({"model": "m", "input": "x", "previous_response_id": "resp_1"}));
    assert_eq!(e.param.as_deref(), Some("previous_response_id"));
    // Codex: hosted tools offered beside functions are left out; namespaces are flattened.
    let codex = json!({"model": "m", "input": "x", "client_metadata": {"x": "y"}, "tools": [
        {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
        {"type": "namespace", "name": "agents", "tools": [{"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}}]},
        {"type": "web_search", "external_web_access": false}]});
    let names: Vec<String> = req(Dialect::Responses, Dialect::Messages, codex)["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["name"].as_str().map(str::to_string))
        .collect();
    assert_eq!(names, ["exec_command", "spawn_agent"]);
    let e = refused(
        Dialect::Responses,
        Dialect::Chat,
        json!({"model": "m", "input": "x", "tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}}),
    );
    assert_eq!(e.param.as_deref(), Some("tool_choice"));
    let e = refused(
        Dialect::Responses,
        Dialect::Chat,
        json!({"model": "m", "input": "x", "tools": [{"type": "custom", "name": "apply_patch"}]}),
    );
    assert_eq!(e.param.as_deref(), Some("tools"));
}

#[test]
fn a_cut_answer_is_an_incomplete_response() {
    let answer = json!({"id": "c", "choices": [{"index": 0, "finish_reason": "length", "message": {"role": "assistant", "content": "Hel"}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1}});
    let out: Value =
        serde_json::from_slice(&response(&t(Dialect::Responses, Dialect::Chat, false), answer.to_string().as_bytes()).expect("reads"))
            .expect("json");
    assert_eq!((out["status"].as_str(), out["incomplete_details"]["reason"].as_str()), (Some("incomplete"), Some("max_output_tokens")));
}

#[test]
fn counting_requests_keep_what_counts_and_answers_take_the_client_shape() {
    let count = |client, upstream: Dialect, body: Value| {
        let tr = Translation { count: true, ..t(client, upstream, false) };
        let out = request(&tr, body.to_string().as_bytes(), 0).expect("translates");
        (tr, serde_json::from_slice::<Value>(&out).expect("json"))
    };
    let (tr, out) = count(Dialect::Messages, Dialect::Gemini, json!({"model": "m-1", "messages": [{"role": "user", "content": "x"}]}));
    assert_eq!(tr.upstream_path("/p"), "/p/v1beta/models/m-1:countTokens");
    assert_eq!(out["generateContentRequest"]["model"], "models/m-1");
    assert!(out["generateContentRequest"].get("generationConfig").is_none(), "no output maximum asked: {out}");
    assert_eq!(response(&tr, br#"{"totalTokens": 9}"#).expect("reads"), br#"{"input_tokens":9}"#);
    let (tr, out) = count(
        Dialect::Gemini,
        Dialect::Messages,
        json!({"generateContentRequest": {"model": "models/m-1", "contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"temperature": 0.2}}}),
    );
    assert_eq!(tr.upstream_path(""), "/v1/messages/count_tokens");
    assert!(out.get("max_tokens").is_none() && out.get("temperature").is_none(), "{out}");
    assert_eq!(out["messages"][0]["content"][0]["text"], "x");
    assert_eq!(response(&tr, br#"{"input_tokens": 9}"#).expect("reads"), br#"{"totalTokens":9}"#);
}

#[test]
fn images_cross_every_protocol() {
    let url = "https://example.com/cat.jpg";
    // A generate-content client's inline image and file reference.
    let gemini = json!({"contents": [{"role": "user", "parts": [{"text": "what is it?"},
        {"inlineData": {"mimeType": "image/jpeg", "data": "/9j/"}}, {"fileData": {"mimeType": "image/jpeg", "fileUri": url}}]}]});
    let m = req(Dialect::Gemini, Dialect::Messages, gemini.clone());
    assert_eq!(m["messages"][0]["content"][1]["source"], json!({"type": "base64", "media_type": "image/jpeg", "data": "/9j/"}));
    assert_eq!(m["messages"][0]["content"][2]["source"], json!({"type": "url", "url": url}));
    let c = req(Dialect::Gemini, Dialect::Chat, gemini);
    assert_eq!(c["messages"][0]["content"][1]["image_url"]["url"], "data:image/jpeg;base64,/9j/");
    assert_eq!(c["messages"][0]["content"][2]["image_url"]["url"], url);
    // A messages client's images, one inside a tool result (Claude Code's Read of an image).
    let messages = json!({"model": "m", "max_tokens": 10, "messages": [
        {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": url}}, {"type": "text", "text": "and?"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": "a.png"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}}]}]}]});
    let c = req(Dialect::Messages, Dialect::Chat, messages.clone());
    assert_eq!(c["messages"][0]["content"][0]["image_url"]["url"], url);
    assert_eq!(c["messages"][2]["role"], "tool");
    assert_eq!(c["messages"][3]["content"][0]["image_url"]["url"], "data:image/png;base64,iVBO", "the tool's image follows as the user's");
    let g = req(Dialect::Messages, Dialect::Gemini, messages);
    assert_eq!(g["contents"][0]["parts"][0]["fileData"]["fileUri"], url);
    assert_eq!(g["contents"][2]["parts"][1]["inlineData"]["data"], "iVBO");
    // A responses client's input image.
    let r = req(
        Dialect::Responses,
        Dialect::Messages,
        json!({"model": "m", "input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "data:image/webp;base64,UklG"}]}]}),
    );
    assert_eq!(r["messages"][0]["content"][0]["source"]["media_type"], "image/webp");
}

#[test]
fn a_missing_maximum_is_the_held_one() {
    let out = req(Dialect::Chat, Dialect::Messages, json!({"model": "m-1", "messages": [{"role": "user", "content": "hi"}]}));
    assert_eq!(out["max_tokens"], 4096);
}

/// The whole answer of each provider protocol, all saying the same: thinking, text, a call.
fn provider_answers() -> Vec<(Dialect, Value)> {
    vec![
        (
            Dialect::Chat,
            json!({"id": "chatcmpl-1", "object": "chat.completion", "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": "Let me check.", "reasoning_content": "Think.",
                "tool_calls": [{"id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]}}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 20, "prompt_tokens_details": {"cached_tokens": 30}, "completion_tokens_details": {"reasoning_tokens": 5}}}),
        ),
        (
            Dialect::Messages,
            json!({"id": "msg_1", "type": "message", "role": "assistant", "content": [
                {"type": "thinking", "thinking": "Think.", "signature": "SIG+/="},
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "toolu_9", "name": "get_weather", "input": {"city": "Paris"}}],
                "stop_reason": "tool_use", "usage": {"input_tokens": 70, "cache_read_input_tokens": 30, "cache_creation_input_tokens": 0, "output_tokens": 20}}),
        ),
        (
            Dialect::Gemini,
            json!({"candidates": [{"content": {"role": "model", "parts": [
                {"text": "Think.", "thought": true},
                {"text": "Let me check."},
                {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}, "thoughtSignature": "GSIG=="}]}, "finishReason": "STOP"}],
                "usageMetadata": {"promptTokenCount": 100, "cachedContentTokenCount": 30, "candidatesTokenCount": 15, "thoughtsTokenCount": 5, "totalTokenCount": 120}}),
        ),
    ]
}

#[test]
fn whole_answers_carry_text_reasoning_calls_stop_and_usage_in_every_pair() {
    for (upstream, answer) in provider_answers() {
        for client in [Dialect::Chat, Dialect::Messages, Dialect::Gemini, Dialect::Responses] {
            if client == upstream {
                continue;
            }
            let text = response(&t(client, upstream, false), answer.to_string().as_bytes()).expect("reads");
            let out: Value = serde_json::from_slice(&text).expect("json");
            let what = format!("{upstream:?} -> {client:?}: {out}");
            if client == Dialect::Chat {
                // Written without a tree, members in name order: the text a tree of it writes.
                assert_eq!(String::from_utf8_lossy(&text), out.to_string(), "{what}");
            }
            match client {
                Dialect::Chat => {
                    let m = &out["choices"][0]["message"];
                    assert_eq!(m["content"], "Let me check.", "{what}");
                    assert_eq!(m["reasoning_content"], "Think.", "{what}");
                    assert_eq!(m["tool_calls"][0]["function"]["arguments"], "{\"city\":\"Paris\"}", "{what}");
                    assert_eq!(out["choices"][0]["finish_reason"], "tool_calls", "{what}");
                    assert_eq!(out["usage"]["prompt_tokens"], 100, "{what}");
                    assert_eq!(out["usage"]["prompt_tokens_details"]["cached_tokens"], 30, "{what}");
                    assert_eq!(out["usage"]["completion_tokens"], 20, "{what}");
                    assert_eq!(out["model"], "m-1");
                }
                Dialect::Messages => {
                    let c = &out["content"];
                    assert_eq!(c[0]["type"], "thinking", "{what}");
                    assert_eq!(c[0]["signature"], "", "never invented: {what}");
                    assert_eq!(c[1]["text"], "Let me check.", "{what}");
                    assert_eq!(c[2]["input"], json!({"city": "Paris"}), "{what}");
                    assert_eq!(out["stop_reason"], "tool_use", "{what}");
                    assert_eq!(out["usage"]["input_tokens"], 70, "cache reads apart: {what}");
                    assert_eq!(out["usage"]["cache_read_input_tokens"], 30, "{what}");
                    assert_eq!(out["usage"]["output_tokens"], 20, "{what}");
                }
                Dialect::Responses => {
                    let o = &out["output"];
                    assert_eq!(o[0]["summary"][0]["text"], "Think.", "{what}");
                    assert_eq!(o[1]["content"][0]["text"], "Let me check.", "{what}");
                    assert_eq!((o[2]["type"].as_str(), o[2]["name"].as_str()), (Some("function_call"), Some("get_weather")), "{what}");
                    assert_eq!(o[2]["arguments"], "{\"city\":\"Paris\"}", "{what}");
                    assert_eq!(out["status"], "completed", "{what}");
                    assert_eq!(out["usage"]["input_tokens"], 100, "{what}");
                    assert_eq!(out["usage"]["input_tokens_details"]["cached_tokens"], 30, "{what}");
                    assert_eq!(out["usage"]["output_tokens"], 20, "{what}");
                }
                Dialect::Gemini => {
                    let p = &out["candidates"][0]["content"]["parts"];
                    assert_eq!(p[0], json!({"text": "Think.", "thought": true}), "{what}");
                    assert_eq!(p[1]["text"], "Let me check.", "{what}");
                    assert_eq!(p[2]["functionCall"]["args"], json!({"city": "Paris"}), "{what}");
                    assert_eq!(out["candidates"][0]["finishReason"], "STOP", "{what}");
                    assert_eq!(out["usageMetadata"]["promptTokenCount"], 100, "{what}");
                    assert_eq!(out["usageMetadata"]["cachedContentTokenCount"], 30, "{what}");
                    let total_out = out["usageMetadata"]["candidatesTokenCount"].as_u64().unwrap_or(0)
                        + out["usageMetadata"]["thoughtsTokenCount"].as_u64().unwrap_or(0);
                    assert_eq!(total_out, 20, "{what}");
                }
            }
        }
    }
}

/// The client's next turn sends the call id back: the provider gets its own id and signatures.
#[test]
fn signatures_come_back_byte_exact_on_the_next_turn() {
    let answers = provider_answers();
    // Anthropic signature through a chat-completions client.
    let out: Value =
        serde_json::from_slice(&response(&t(Dialect::Chat, Dialect::Messages, false), answers[1].1.to_string().as_bytes()).expect("reads"))
            .expect("json");
    let id = out["choices"][0]["message"]["tool_calls"][0]["id"].as_str().expect("id").to_string();
    let next = req(
        Dialect::Chat,
        Dialect::Messages,
        json!({"model": "m-1", "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "Let me check.", "tool_calls": [{"id": id, "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": id, "content": "sunny"}
        ]}),
    );
    let turn = &next["messages"][1]["content"];
    assert_eq!(turn[0], json!({"type": "thinking", "thinking": "Think.", "signature": "SIG+/="}));
    assert_eq!(turn[2]["id"], "toolu_9");
    assert_eq!(next["messages"][2]["content"][0]["tool_use_id"], "toolu_9");

    // A generate-content thoughtSignature through a messages client.
    let out: Value = serde_json::from_slice(
        &response(&t(Dialect::Messages, Dialect::Gemini, false), answers[2].1.to_string().as_bytes()).expect("reads"),
    )
    .expect("json");
    let id = out["content"][2]["id"].as_str().expect("id").to_string();
    let next = req(
        Dialect::Messages,
        Dialect::Gemini,
        json!({"model": "m-1", "max_tokens": 100, "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": out["content"].clone()},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": "sunny"}]}
        ]}),
    );
    let model_turn = &next["contents"][1]["parts"];
    assert_eq!(model_turn.as_array().map(Vec::len), Some(2), "thought not sent back: {model_turn}");
    assert_eq!(model_turn[1]["thoughtSignature"], "GSIG==");
    assert_eq!(next["contents"][2]["parts"][0]["functionResponse"]["name"], "get_weather");
}

/// A provider's stream in its own framing: thinking, text in pieces, a call with arguments in
/// pieces, the stop and the usage.
fn provider_stream(upstream: Dialect) -> String {
    let upstream = upstream.shape();
    let mut out = Vec::new();
    let data = |out: &mut Vec<u8>, name: Option<&str>, v: Value| sse::write(out, name, &v.to_string());
    match upstream {
        Protocol::Openai => {
            let chunk = |delta: Value, finish: Value| json!({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
            data(&mut out, None, chunk(json!({"role": "assistant", "content": ""}), Value::Null));
            data(&mut out, None, chunk(json!({"reasoning_content": "Think."}), Value::Null));
            data(&mut out, None, chunk(json!({"content": "Let me "}), Value::Null));
            data(&mut out, None, chunk(json!({"content": "check."}), Value::Null));
            data(
                &mut out,
                None,
                chunk(
                    json!({"tool_calls": [{"index": 0, "id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": ""}}]}),
                    Value::Null,
                ),
            );
            data(&mut out, None, chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\":"}}]}), Value::Null));
            data(&mut out, None, chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"Paris\"}"}}]}), Value::Null));
            data(&mut out, None, chunk(json!({}), json!("tool_calls")));
            data(
                &mut out,
                None,
                json!({"id": "c", "choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 20, "prompt_tokens_details": {"cached_tokens": 30}}}),
            );
            sse::write(&mut out, None, "[DONE]");
        }
        Protocol::Anthropic => {
            data(
                &mut out,
                Some("message_start"),
                json!({"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 70, "cache_read_input_tokens": 30, "output_tokens": 1}}}),
            );
            data(
                &mut out,
                Some("content_block_start"),
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
            );
            data(
                &mut out,
                Some("content_block_delta"),
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Think."}}),
            );
            data(
                &mut out,
                Some("content_block_delta"),
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "SIG+/="}}),
            );
            data(&mut out, Some("content_block_stop"), json!({"type": "content_block_stop", "index": 0}));
            data(
                &mut out,
                Some("content_block_start"),
                json!({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}),
            );
            data(
                &mut out,
                Some("content_block_delta"),
                json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Let me "}}),
            );
            data(&mut out, Some("ping"), json!({"type": "ping"}));
            data(
                &mut out,
                Some("content_block_delta"),
                json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "check."}}),
            );
            data(&mut out, Some("content_block_stop"), json!({"type": "content_block_stop", "index": 1}));
            data(
                &mut out,
                Some("content_block_start"),
                json!({"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "toolu_9", "name": "get_weather", "input": {}}}),
            );
            data(
                &mut out,
                Some("content_block_delta"),
                json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "{\"city\":"}}),
            );
            data(
                &mut out,
                Some("content_block_delta"),
                json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "\"Paris\"}"}}),
            );
            data(&mut out, Some("content_block_stop"), json!({"type": "content_block_stop", "index": 2}));
            data(
                &mut out,
                Some("message_delta"),
                json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 20}}),
            );
            data(&mut out, Some("message_stop"), json!({"type": "message_stop"}));
        }
        Protocol::Gemini => {
            let chunk = |parts: Value, finish: Option<&str>, out_tokens: u64| {
                let mut c = json!({"candidates": [{"content": {"role": "model", "parts": parts}, "index": 0}],
                    "usageMetadata": {"promptTokenCount": 100, "cachedContentTokenCount": 30, "candidatesTokenCount": out_tokens, "thoughtsTokenCount": 5}});
                if let Some(f) = finish {
                    c["candidates"][0]["finishReason"] = json!(f);
                }
                c
            };
            data(&mut out, None, chunk(json!([{"text": "Think.", "thought": true}]), None, 0));
            data(&mut out, None, chunk(json!([{"text": "Let me "}]), None, 3));
            data(&mut out, None, chunk(json!([{"text": "check."}]), None, 6));
            data(
                &mut out,
                None,
                chunk(
                    json!([{"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}, "thoughtSignature": "GSIG=="}]),
                    Some("STOP"),
                    15,
                ),
            );
        }
    }
    String::from_utf8(out).unwrap_or_default()
}

/// What a client's stream accumulator rebuilds from the bytes it got.
#[derive(Debug, PartialEq)]
struct Rebuilt {
    text: String,
    thinking: String,
    calls: Vec<(String, Value)>,
    stop: String,
    prompt: u64,
    output: u64,
}

fn rebuild(client: Dialect, bytes: &[u8]) -> Rebuilt {
    let mut r = Rebuilt { text: String::new(), thinking: String::new(), calls: Vec::new(), stop: String::new(), prompt: 0, output: 0 };
    let values: Vec<Value> = if client == Dialect::Gemini && !bytes.starts_with(b"data:") {
        serde_json::from_slice::<Vec<Value>>(bytes).expect("one JSON array")
    } else {
        let mut reader = sse::SseReader::default();
        let mut events = Vec::new();
        reader.feed(bytes, &mut events).expect("lines");
        reader.finish(&mut events);
        assert!(client != Dialect::Chat || events.last().map(|e| e.data.as_str()) == Some("[DONE]"), "ends with [DONE]");
        events.iter().filter(|e| e.data != "[DONE]").map(|e| serde_json::from_str(&e.data).expect("json event")).collect()
    };
    let mut args: Vec<String> = Vec::new();
    let mut done_items: Vec<Value> = Vec::new();
    for v in &values {
        match client {
            Dialect::Chat => {
                if let Some(d) = v.pointer("/choices/0/delta") {
                    r.text.push_str(d["content"].as_str().unwrap_or_default());
                    r.thinking.push_str(d["reasoning_content"].as_str().unwrap_or_default());
                    for c in d["tool_calls"].as_array().into_iter().flatten() {
                        let i = c["index"].as_u64().unwrap_or(0) as usize;
                        if let Some(name) = c.pointer("/function/name").and_then(Value::as_str) {
                            assert!(c["id"].is_string(), "id and name come first");
                            r.calls.push((name.to_string(), Value::Null));
                            args.push(String::new());
                        }
                        args[i].push_str(c.pointer("/function/arguments").and_then(Value::as_str).unwrap_or_default());
                    }
                    if let Some(f) = v.pointer("/choices/0/finish_reason").and_then(Value::as_str) {
                        r.stop = f.to_string();
                    }
                }
                if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                    r.prompt = u["prompt_tokens"].as_u64().unwrap_or(0);
                    r.output = u["completion_tokens"].as_u64().unwrap_or(0);
                }
            }
            Dialect::Messages => match v["type"].as_str().unwrap_or_default() {
                "message_start" => r.prompt = v.pointer("/message/usage/input_tokens").and_then(Value::as_u64).unwrap_or(0),
                "content_block_start" if v.pointer("/content_block/type") == Some(&json!("tool_use")) => {
                    r.calls.push((v.pointer("/content_block/name").and_then(Value::as_str).unwrap_or_default().to_string(), Value::Null));
                    args.push(String::new());
                }
                "content_block_delta" => {
                    let d = &v["delta"];
                    r.text.push_str(d["text"].as_str().unwrap_or_default());
                    r.thinking.push_str(d["thinking"].as_str().unwrap_or_default());
                    if let Some(p) = d["partial_json"].as_str() {
                        args.last_mut().expect("inside a tool block").push_str(p);
                    }
                }
                "message_delta" => {
                    r.stop = v.pointer("/delta/stop_reason").and_then(Value::as_str).unwrap_or_default().to_string();
                    let u = &v["usage"];
                    r.prompt = u["input_tokens"].as_u64().unwrap_or(0) + u["cache_read_input_tokens"].as_u64().unwrap_or(0);
                    r.output = u["output_tokens"].as_u64().unwrap_or(0);
                }
                _ => {}
            },
            Dialect::Responses => match v["type"].as_str().unwrap_or_default() {
                "response.output_text.delta" => r.text.push_str(v["delta"].as_str().unwrap_or_default()),
                "response.reasoning_summary_text.delta" => r.thinking.push_str(v["delta"].as_str().unwrap_or_default()),
                "response.output_item.added" if v["item"]["type"] == "function_call" => {
                    r.calls.push((v["item"]["name"].as_str().unwrap_or_default().to_string(), Value::Null));
                    args.push(String::new());
                }
                "response.function_call_arguments.delta" => {
                    args.last_mut().expect("inside a call").push_str(v["delta"].as_str().unwrap_or_default())
                }
                "response.output_item.done" => done_items.push(v["item"].clone()),
                "response.completed" | "response.incomplete" => {
                    let resp = &v["response"];
                    assert_eq!(resp["output"].as_array(), Some(&done_items), "completed lists the finished items");
                    r.stop = resp["status"].as_str().unwrap_or_default().to_string();
                    r.prompt = resp["usage"]["input_tokens"].as_u64().unwrap_or(0);
                    r.output = resp["usage"]["output_tokens"].as_u64().unwrap_or(0);
                }
                _ => {}
            },
            Dialect::Gemini => {
                for p in v.pointer("/candidates/0/content/parts").and_then(Value::as_array).into_iter().flatten() {
                    if p["thought"] == json!(true) {
                        r.thinking.push_str(p["text"].as_str().unwrap_or_default());
                    } else if let Some(t) = p["text"].as_str() {
                        r.text.push_str(t);
                    } else if let Some(c) = p.get("functionCall") {
                        r.calls.push((c["name"].as_str().unwrap_or_default().to_string(), c["args"].clone()));
                    }
                }
                if let Some(f) = v.pointer("/candidates/0/finishReason").and_then(Value::as_str) {
                    r.stop = f.to_string();
                }
                if let Some(u) = v.get("usageMetadata") {
                    r.prompt = u["promptTokenCount"].as_u64().unwrap_or(0);
                    r.output = u["candidatesTokenCount"].as_u64().unwrap_or(0) + u["thoughtsTokenCount"].as_u64().unwrap_or(0);
                }
            }
        }
    }
    for (call, a) in r.calls.iter_mut().zip(args) {
        call.1 = serde_json::from_str(&a).expect("arguments are whole JSON");
    }
    r
}

fn translate_stream(tr: &Translation, chunks: &[&[u8]]) -> Vec<u8> {
    let mut s = StreamTranslator::new(tr);
    let mut out = s.start();
    for c in chunks {
        out.extend(s.feed(c).expect("reads"));
    }
    out.extend(s.finish());
    out
}

#[test]
fn streams_rebuild_the_same_answer_in_every_pair_at_every_cut() {
    for upstream in [Dialect::Chat, Dialect::Messages, Dialect::Gemini] {
        let bytes = provider_stream(upstream);
        let bytes = bytes.as_bytes();
        for client in [Dialect::Chat, Dialect::Messages, Dialect::Gemini, Dialect::Responses] {
            if client == upstream {
                continue;
            }
            for sse_framing in [true, false] {
                if !sse_framing && client != Dialect::Gemini {
                    continue;
                }
                let tr = Translation { gemini_sse: sse_framing, ..t(client, upstream, true) };
                let whole = rebuild(client, &translate_stream(&tr, &[bytes]));
                let stop = match client {
                    Dialect::Chat => "tool_calls",
                    Dialect::Messages => "tool_use",
                    Dialect::Gemini => "STOP",
                    Dialect::Responses => "completed",
                };
                assert_eq!(
                    whole,
                    Rebuilt {
                        text: "Let me check.".into(),
                        thinking: "Think.".into(),
                        calls: vec![("get_weather".into(), json!({"city": "Paris"}))],
                        stop: stop.into(),
                        prompt: 100,
                        output: 20,
                    },
                    "{upstream:?} -> {client:?}"
                );
                // Cut anywhere (two cuts, a step apart to keep it quick), the same answer.
                for i in (0..bytes.len()).step_by(7) {
                    let j = (i + bytes.len()) / 2;
                    let cut = rebuild(client, &translate_stream(&tr, &[&bytes[..i], &bytes[i..j], &bytes[j..]]));
                    assert_eq!(cut, whole, "{upstream:?} -> {client:?} cut at {i}, {j}");
                }
            }
        }
    }
}

#[test]
fn message_start_carries_an_estimate_and_message_delta_the_real_usage() {
    let tr = t(Dialect::Messages, Dialect::Chat, true);
    let mut s = StreamTranslator::new(&tr);
    let start = String::from_utf8(s.start()).expect("utf-8");
    assert!(start.starts_with("event: message_start\n"), "{start}");
    assert!(start.contains("\"input_tokens\":42"), "the estimate: {start}");
    let rest = s.feed(provider_stream(Dialect::Chat).as_bytes()).expect("reads");
    let rest = String::from_utf8([rest, s.finish()].concat()).expect("utf-8");
    let delta = rest.lines().find(|l| l.contains("\"message_delta\"")).expect("message_delta");
    assert!(
        delta.contains("\"input_tokens\":70") && delta.contains("\"cache_read_input_tokens\":30") && delta.contains("\"output_tokens\":20"),
        "{delta}"
    );
    assert!(rest.trim_end().ends_with("data: {\"type\":\"message_stop\"}"));
}

#[test]
fn a_streamed_call_id_carries_the_signed_thinking_before_it() {
    for client in [Dialect::Chat, Dialect::Gemini, Dialect::Responses] {
        let out =
            String::from_utf8(translate_stream(&t(client, Dialect::Messages, true), &[provider_stream(Dialect::Messages).as_bytes()]))
                .expect("utf-8");
        let id = out.split('"').find(|piece| piece.starts_with("toolu_9")).unwrap_or_else(|| panic!("{client:?}: no call id in {out}"));
        let (upstream_id, carried) = carry::unwrap(id);
        assert_eq!(upstream_id, "toolu_9", "{client:?}");
        assert_eq!(carried.thinking, vec![("Think.".to_string(), "SIG+/=".to_string())], "{client:?}");
    }
}

#[test]
fn a_chat_client_that_did_not_ask_gets_no_usage_chunk() {
    let tr = Translation { client_wants_usage: false, ..t(Dialect::Chat, Dialect::Messages, true) };
    let out = String::from_utf8(translate_stream(&tr, &[provider_stream(Dialect::Messages).as_bytes()])).expect("utf-8");
    assert!(!out.contains("\"usage\""), "{out}");
    assert!(out.ends_with("data: [DONE]\n\n"));
}

#[test]
fn an_error_inside_a_stream_reaches_the_client_in_its_shape() {
    let tr = t(Dialect::Chat, Dialect::Messages, true);
    let err = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
    let out = String::from_utf8(translate_stream(&tr, &[err.as_bytes()])).expect("utf-8");
    // Rewritten as every upstream error is: the client's shape, no upstream text.
    assert!(out.contains("{\"error\":{\"code\":\"overloaded\",\"message\":\"The upstream service is overloaded. Retry later.\""), "{out}");
}

mod round_trip {
    //! internal form → encode → decode is the identity on what both protocols can say.
    use super::super::*;
    use crate::config::Protocol;
    use proptest::prelude::*;

    fn text() -> impl Strategy<Value = String> {
        "[a-zA-Z0-9 .,!?\n]{1,20}"
    }

    fn call() -> impl Strategy<Value = ToolCall> {
        ("[a-z_]{1,8}", "[a-zA-Z0-9_]{1,10}", text()).prop_map(|(name, id, v)| ToolCall {
            id: format!("call_{id}"),
            name,
            arguments: serde_json::json!({"v": v}).to_string(),
            signature: None,
        })
    }

    /// A conversation: user text, assistant text and calls, user results of those calls.
    fn conversation() -> impl Strategy<Value = Request> {
        (text(), text(), proptest::collection::vec(call(), 0..3), proptest::option::of(1u64..5000), proptest::option::of(0u32..20))
            .prop_map(|(system, said, mut calls, max, temp)| {
                // Call ids are unique within a conversation (as every protocol requires).
                for (i, c) in calls.iter_mut().enumerate() {
                    c.id = format!("{}_{i}", c.id);
                }
                let mut messages = vec![Message { role: Role::User, parts: vec![Part::Text("hello".into())] }];
                let mut assistant = vec![Part::Text(said)];
                assistant.extend(calls.iter().cloned().map(Part::ToolCall));
                messages.push(Message { role: Role::Assistant, parts: assistant });
                if !calls.is_empty() {
                    messages.push(Message {
                        role: Role::User,
                        parts: calls
                            .iter()
                            .map(|c| Part::ToolResult {
                                id: c.id.clone(),
                                content: vec![Part::Text(format!("r{}", c.name))],
                                is_error: false,
                            })
                            .collect(),
                    });
                }
                Request {
                    model: "m".into(),
                    system: vec![system],
                    messages,
                    max_output: max,
                    temperature: temp.map(|t| f64::from(t) / 10.0),
                    stop: vec!["END".into()],
                    tools: vec![Tool {
                        name: "f".into(),
                        description: Some("d".into()),
                        schema: serde_json::json!({"type": "object", "properties": {"v": {"type": "string"}}}),
                    }],
                    ..Request::default()
                }
            })
    }

    fn through(req: &Request, via: Protocol) -> Request {
        let text = match via {
            Protocol::Openai => String::from_utf8(chat::encode_request(req)).expect("utf-8"),
            Protocol::Anthropic => String::from_utf8(messages::encode_request(req, false).expect("encodes")).expect("utf-8"),
            Protocol::Gemini => gemini::encode_request(req).expect("encodes").to_string(),
        };
        let Ok(super::view::Json::Object(map)) = super::view::parse(&text, "body") else { panic!("an object") };
        let mut back = match via {
            Protocol::Openai => chat::decode_request(map, Protocol::Anthropic),
            Protocol::Anthropic => messages::decode_request(map, Protocol::Openai),
            Protocol::Gemini => gemini::decode_request(map, Protocol::Openai),
        }
        .expect("decodes");
        back.model = req.model.clone();
        back
    }

    proptest! {
        #[test]
        fn chat_and_messages_say_it_back_exactly(req in conversation()) {
            let mut expected = req.clone();
            // The messages protocol requires a maximum (the held one is set before encoding).
            expected.max_output = Some(req.max_output.unwrap_or(crate::base::usage::MAX_OUTPUT_ALLOWANCE));
            let mut req = req;
            req.max_output = expected.max_output;
            prop_assert_eq!(through(&req, Protocol::Openai), req.clone());
            // Written in name order, compact: the text a `Value` tree of it writes.
            for text in [chat::encode_request(&req), messages::encode_request(&expected, false).expect("encodes")] {
                let tree: serde_json::Value = serde_json::from_slice(&text).expect("JSON");
                prop_assert_eq!(String::from_utf8(text).expect("utf-8"), tree.to_string());
            }
            prop_assert_eq!(through(&req, Protocol::Anthropic), expected);
        }

        /// The messages answer written member by member is the JSON its parts say, whatever
        /// their strings hold (quotes, escapes, controls, any script), arguments that are no
        /// object as `{}`.
        #[test]
        fn a_written_messages_answer_is_the_json_of_its_parts(
            said in any::<String>(), thought in any::<String>(), sig in any::<String>(), model in any::<String>(),
            name in any::<String>(), args in prop_oneof![Just("{\"a\": [1, \"x\"]}".to_string()), any::<String>()],
            input in 0u64..1_000_000, output in 0u64..1_000_000,
        ) {
            let r = Response {
                id: String::new(),
                parts: vec![
                    Part::Thinking { text: thought.clone(), signature: Some(sig.clone()) },
                    Part::RedactedThinking(sig.clone()),
                    Part::Text(said.clone()),
                    Part::Image(Image::Url("u".into())),
                    Part::ToolCall(ToolCall { id: "call_1".into(), name: name.clone(), arguments: args.clone(), signature: None }),
                ],
                stop: Some(Stop::ToolUse),
                usage: Some(Usage { input, output, cache_read: 3, cache_write: 4, reasoning: 0 }),
            };
            let t = Translation { model: model.clone(), ..super::t(Dialect::Messages, Dialect::Chat, false) };
            let out: serde_json::Value = serde_json::from_slice(&messages::encode_response(&t, &r)).expect("JSON");
            let id = out["id"].as_str().unwrap_or_default().to_string();
            prop_assert!(id.starts_with("msg_"));
            let object = serde_json::from_str::<serde_json::Value>(&args).ok().filter(serde_json::Value::is_object);
            // The call's id carries the signed thinking before it (see `carry`).
            let call_id = carry::client_call_ids(&r.parts).into_iter().next().unwrap_or_default();
            prop_assert_eq!(out, serde_json::json!({
                "id": id, "type": "message", "role": "assistant", "model": model,
                "content": [
                    {"type": "thinking", "thinking": thought, "signature": sig},
                    {"type": "redacted_thinking", "data": sig},
                    {"type": "text", "text": said},
                    {"type": "tool_use", "id": call_id, "name": name, "input": object.unwrap_or_else(|| serde_json::json!({}))},
                ],
                "stop_reason": "tool_use", "stop_sequence": null,
                "usage": {"input_tokens": input, "cache_creation_input_tokens": 4, "cache_read_input_tokens": 3, "output_tokens": output},
            }));
        }

        #[test]
        fn generate_content_says_it_back_but_for_its_own_call_ids(req in conversation()) {
            let back = through(&req, Protocol::Gemini);
            // Ids are tollgate's on the way back; everything else is the same.
            let strip = |r: &Request| {
                let mut r = r.clone();
                for m in &mut r.messages {
                    for p in &mut m.parts {
                        match p {
                            Part::ToolCall(c) => c.id.clear(),
                            Part::ToolResult { id, .. } => id.clear(),
                            _ => {}
                        }
                    }
                }
                r
            };
            prop_assert_eq!(strip(&back), strip(&req));
        }
    }
}

#[test]
fn a_provider_event_over_the_bound_ends_the_clients_stream_with_its_error_event() {
    for client in [Dialect::Chat, Dialect::Messages, Dialect::Gemini, Dialect::Responses] {
        let tr = Translation { max_event_bytes: 1 << 16, ..t(client, Dialect::Messages, true) };
        let mut s = StreamTranslator::new(&tr);
        let mut broke = false;
        for _ in 0..200 {
            // A data line after another, never the blank line that ends the event.
            if s.feed(format!("data: {}\n", "x".repeat(1000)).as_bytes()).is_err() {
                broke = true;
                break;
            }
        }
        assert!(broke, "{client:?}: the event is refused past its bound");
        let last = String::from_utf8(s.fail()).expect("utf-8");
        assert!(last.contains("error") || last.contains("ERROR"), "{client:?}: {last}");
    }
}

#[test]
fn a_new_id_is_its_prefix_and_24_lowercase_hex_digits_never_the_same_twice() {
    let (a, b) = (super::new_id("msg_"), super::new_id("msg_"));
    assert_eq!(a.len(), 28);
    assert!(a.starts_with("msg_") && a[4..].bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)), "{a}");
    assert_ne!(a, b);
}
