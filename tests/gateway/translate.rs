//! Protocol translation against the real daemon and the mock upstream: every client protocol
//! calling a model of every other provider protocol, whole and streamed, with tool calls, usage
//! billed once from the provider's count, errors in the client's shape with the provider's status,
//! refusals before anything is sent, and the opt-in per group.

use crate::common;

use crate::common::*;
use serde_json::{json, Value};

const BRIDGE_KEY: &str = "sk-bridge-0001";

fn config(mock_port: u16) -> String {
    let base = standard_config(mock_port);
    let base = base.replace(
        "  chat: { platforms: [openai] }\n",
        "  chat: { platforms: [openai] }\n  bridge: { platforms: [openai, anthropic, gemini], translate: true }\n",
    );
    with_key(&base, &format!("{{ key: {BRIDGE_KEY}, name: bridge, group: bridge, balance: 5.0 }}"))
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Client {
    Chat,
    Messages,
    Gemini,
    Responses,
}

/// The request a client of each protocol sends for `model` (one question, a tool offered).
fn request(client: Client, model: &str, stream: bool) -> (String, Value) {
    let tool_schema =
        json!({"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}}, "required": ["city"]});
    match client {
        Client::Chat => (
            "/v1/chat/completions".into(),
            json!({"model": model, "stream": stream, "stream_options": if stream { json!({"include_usage": true}) } else { Value::Null },
                   "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}],
                   "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": tool_schema}}]}),
        ),
        Client::Messages => (
            "/v1/messages".into(),
            json!({"model": model, "max_tokens": 200, "stream": stream, "system": "Be brief.",
                   "messages": [{"role": "user", "content": "Weather in Paris?"}],
                   "tools": [{"name": "get_weather", "input_schema": tool_schema}]}),
        ),
        Client::Responses => (
            "/v1/responses".into(),
            json!({"model": model, "stream": stream, "store": false, "instructions": "Be brief.",
                   "input": [{"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]}],
                   "tools": [{"type": "function", "name": "get_weather", "parameters": tool_schema, "strict": false}]}),
        ),
        Client::Gemini => (
            format!("/v1beta/models/{model}:{}", if stream { "streamGenerateContent?alt=sse" } else { "generateContent" }),
            json!({"systemInstruction": {"parts": [{"text": "Be brief."}]}, "contents": [{"role": "user", "parts": [{"text": "Weather in Paris?"}]}],
                   "tools": [{"functionDeclarations": [{"name": "get_weather", "parameters": {"type": "OBJECT", "properties": {"city": {"type": "STRING"}}}}]}]}),
        ),
    }
}

/// What a client rebuilt from the answer: text, tool calls (name, arguments), stop, tokens.
#[derive(Debug, Default, PartialEq)]
struct Answer {
    text: String,
    calls: Vec<(String, Value)>,
    stop: String,
    input: u64,
    output: u64,
}

fn events(body: &str) -> Vec<Value> {
    body.split("\n\n")
        .flat_map(|event| event.lines().filter_map(|l| l.strip_prefix("data: ")).map(str::to_string).collect::<Vec<_>>())
        .filter(|d| d.trim() != "[DONE]")
        .map(|d| serde_json::from_str(d.trim()).expect("each event is JSON"))
        .collect()
}

fn read_answer(client: Client, stream: bool, body: &str) -> Answer {
    let mut a = Answer::default();
    let values = if stream { events(body) } else { vec![serde_json::from_str(body).expect("json")] };
    let mut args: Vec<String> = Vec::new();
    for v in &values {
        match client {
            Client::Chat => {
                let choice = &v["choices"][0];
                let m = if stream { &choice["delta"] } else { &choice["message"] };
                a.text.push_str(m["content"].as_str().unwrap_or_default());
                for c in m["tool_calls"].as_array().into_iter().flatten() {
                    if let Some(name) = c.pointer("/function/name").and_then(Value::as_str) {
                        a.calls.push((name.into(), Value::Null));
                        args.push(String::new());
                    }
                    if let Some(piece) = c.pointer("/function/arguments").and_then(Value::as_str) {
                        args.last_mut().expect("a call started").push_str(piece);
                    }
                }
                if let Some(f) = choice["finish_reason"].as_str() {
                    a.stop = f.into();
                }
                if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                    a.input = u["prompt_tokens"].as_u64().unwrap_or(0);
                    a.output = u["completion_tokens"].as_u64().unwrap_or(0);
                }
            }
            Client::Messages if stream => match v["type"].as_str().unwrap_or_default() {
                "content_block_start" if v["content_block"]["type"] == "tool_use" => {
                    a.calls.push((v["content_block"]["name"].as_str().unwrap_or_default().into(), Value::Null));
                    args.push(String::new());
                }
                "content_block_delta" => {
                    a.text.push_str(v["delta"]["text"].as_str().unwrap_or_default());
                    if let Some(p) = v["delta"]["partial_json"].as_str() {
                        args.last_mut().expect("inside a tool block").push_str(p);
                    }
                }
                "message_delta" => {
                    a.stop = v["delta"]["stop_reason"].as_str().unwrap_or_default().into();
                    a.input = v["usage"]["input_tokens"].as_u64().unwrap_or(0);
                    a.output = v["usage"]["output_tokens"].as_u64().unwrap_or(0);
                }
                _ => {}
            },
            Client::Messages => {
                for b in v["content"].as_array().into_iter().flatten() {
                    match b["type"].as_str() {
                        Some("text") => a.text.push_str(b["text"].as_str().unwrap_or_default()),
                        Some("tool_use") => {
                            a.calls.push((b["name"].as_str().unwrap_or_default().into(), Value::Null));
                            args.push(b["input"].to_string());
                        }
                        _ => {}
                    }
                }
                a.stop = v["stop_reason"].as_str().unwrap_or_default().into();
                a.input = v["usage"]["input_tokens"].as_u64().unwrap_or(0);
                a.output = v["usage"]["output_tokens"].as_u64().unwrap_or(0);
            }
            Client::Responses if stream => match v["type"].as_str().unwrap_or_default() {
                "response.output_text.delta" => a.text.push_str(v["delta"].as_str().unwrap_or_default()),
                "response.output_item.added" if v["item"]["type"] == "function_call" => {
                    a.calls.push((v["item"]["name"].as_str().unwrap_or_default().into(), Value::Null));
                    args.push(String::new());
                }
                "response.function_call_arguments.delta" => {
                    args.last_mut().expect("inside a call").push_str(v["delta"].as_str().unwrap_or_default())
                }
                "response.completed" => {
                    let calls = v["response"]["output"].as_array().into_iter().flatten().any(|i| i["type"] == "function_call");
                    a.stop = if calls { "function_call" } else { "completed" }.into();
                    a.input = v["response"]["usage"]["input_tokens"].as_u64().unwrap_or(0);
                    a.output = v["response"]["usage"]["output_tokens"].as_u64().unwrap_or(0);
                }
                _ => {}
            },
            Client::Responses => {
                for item in v["output"].as_array().into_iter().flatten() {
                    match item["type"].as_str() {
                        Some("message") => a.text.push_str(item["content"][0]["text"].as_str().unwrap_or_default()),
                        Some("function_call") => {
                            a.calls.push((item["name"].as_str().unwrap_or_default().into(), Value::Null));
                            args.push(item["arguments"].as_str().unwrap_or_default().to_string());
                        }
                        _ => {}
                    }
                }
                let calls = !a.calls.is_empty();
                a.stop = if calls { "function_call" } else { "completed" }.into();
                a.input = v["usage"]["input_tokens"].as_u64().unwrap_or(0);
                a.output = v["usage"]["output_tokens"].as_u64().unwrap_or(0);
            }
            Client::Gemini => {
                for p in v.pointer("/candidates/0/content/parts").and_then(Value::as_array).into_iter().flatten() {
                    if let Some(t) = p["text"].as_str() {
                        a.text.push_str(t);
                    }
                    if let Some(c) = p.get("functionCall") {
                        a.calls.push((c["name"].as_str().unwrap_or_default().into(), Value::Null));
                        args.push(c["args"].to_string());
                    }
                }
                if let Some(f) = v.pointer("/candidates/0/finishReason").and_then(Value::as_str) {
                    a.stop = f.into();
                }
                if let Some(u) = v.get("usageMetadata") {
                    a.input = u["promptTokenCount"].as_u64().unwrap_or(0);
                    a.output = u["candidatesTokenCount"].as_u64().unwrap_or(0) + u["thoughtsTokenCount"].as_u64().unwrap_or(0);
                }
            }
        }
    }
    for (call, a) in a.calls.iter_mut().zip(args) {
        call.1 = serde_json::from_str(&a).expect("whole arguments");
    }
    a
}

async fn send(gw: &Gateway, client: Client, model: &str, stream: bool, tag: &str, extra: &[(&str, &str)]) -> reqwest::Response {
    let (path, body) = request(client, model, stream);
    let mut r = common::client().post(gw.url(&path)).header("x-test-tag", tag).json(&body);
    r = match client {
        Client::Chat | Client::Responses => r.bearer_auth(BRIDGE_KEY),
        Client::Messages => r
            .header("x-api-key", BRIDGE_KEY)
            .header("anthropic-version", "2023-06-01")
            .header("anthropic-beta", "prompt-caching-2024-07-31"),
        Client::Gemini => r.header("x-goog-api-key", BRIDGE_KEY),
    };
    for (name, value) in extra {
        r = r.header(*name, *value);
    }
    r.send().await.expect("request")
}

const MODELS: [(&str, &str, &str); 3] = [
    ("alpha-5.5", "/oa/v1/chat/completions", "openai"),
    ("beta-opus-4-7", "/an/v1/messages", "anthropic"),
    ("gamma-3.5-flash", "/ge/v1beta/models/gamma-3.5-flash:", "gemini"),
];

fn native(client: Client, provider: &str) -> bool {
    matches!(
        (client, provider),
        (Client::Chat | Client::Responses, "openai") | (Client::Messages, "anthropic") | (Client::Gemini, "gemini")
    )
}

#[tokio::test]
async fn every_client_protocol_reaches_every_model_whole_and_streamed_with_tool_calls_billed_once() {
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port));
    let mut requests = 0;
    let mut spent = 0i64;
    for client in [Client::Chat, Client::Messages, Client::Gemini, Client::Responses] {
        for (model, upstream_path, provider) in MODELS {
            if native(client, provider) {
                continue;
            }
            for stream in [false, true] {
                for tools in [false, true] {
                    let tag = format!("{client:?}-{model}-{stream}-{tools}");
                    let mut extra = vec![("x-mock-usage", "120,17")];
                    if tools {
                        extra.push(("x-mock-tool-calls", "1"));
                    }
                    let resp = send(&gw, client, model, stream, &tag, &extra).await;
                    assert_eq!(resp.status(), 200, "{tag}");
                    let ctype = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
                    assert_eq!(ctype.starts_with("text/event-stream"), stream, "{tag}: {ctype}");
                    let body = resp.text().await.expect("body");
                    let answer = read_answer(client, stream, &body);
                    if tools {
                        assert_eq!(
                            answer.calls,
                            vec![("get_weather".to_string(), json!({"city": "Paris", "unit": "celsius"}))],
                            "{tag}: {body}"
                        );
                        let stop = match client {
                            Client::Chat => "tool_calls",
                            Client::Messages => "tool_use",
                            Client::Gemini => "STOP",
                            Client::Responses => "function_call",
                        };
                        assert_eq!(answer.stop, stop, "{tag}");
                    } else {
                        assert!(answer.text.starts_with("Hello from the"), "{tag}: {body}");
                        assert!(answer.calls.is_empty(), "{tag}");
                    }
                    // The provider's usage, in the client's fields.
                    assert_eq!((answer.input, answer.output), (120, 17), "{tag}: {body}");
                    // The provider got its own protocol at its own path, with its own key.
                    let seen = mock_requests(&mock, &tag).await;
                    assert_eq!(seen.len(), 1, "{tag}");
                    assert!(seen[0]["path"].as_str().unwrap_or_default().starts_with(upstream_path), "{tag}: {}", seen[0]["path"]);
                    assert_eq!(seen[0]["stream"], stream, "{tag}");
                    let headers = seen[0]["headers"].to_string();
                    assert!(!headers.contains(BRIDGE_KEY), "the client key never goes upstream: {headers}");
                    assert!(!headers.contains("anthropic-beta"), "no client beta header on another protocol: {headers}");
                    if provider == "openai" && stream {
                        assert_eq!(seen[0]["stream_options"]["include_usage"], true, "{tag}");
                    }
                    requests += 1;
                    spent += cost_nanos(model, 120, 17);
                }
            }
        }
    }
    // One record per request, each billed the provider's count at the serving model's price.
    let usage = wait_requests(&gw, BRIDGE_KEY, requests).await;
    assert_eq!(nanos(&usage["total"]["cost"]), spent, "{usage}");
    assert_eq!(usage["total"]["input_tokens"], 120 * requests, "{usage}");
    assert_eq!(usage["total"]["output_tokens"], 17 * requests, "{usage}");
    assert_eq!(balance(&gw, BRIDGE_KEY).await, 5_000_000_000 - spent);
}

#[tokio::test]
async fn translation_is_opt_in_per_group_and_model_lists_follow_it() {
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port));
    // A key of a group without `translate`: today's rule, a 404 in the client's shape.
    let resp = common::client()
        .post(gw.url("/v1/messages"))
        .header("x-api-key", CLIENT_KEY)
        .json(&json!({"model": "alpha-5.5", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 404);
    let body: Value = resp.json().await.expect("json");
    assert_eq!(body["type"], "error");
    // The bridge key's lists name every model, in each endpoint's shape.
    let list: Value =
        common::client().get(gw.url("/v1/models")).bearer_auth(BRIDGE_KEY).send().await.expect("list").json().await.expect("json");
    let ids: Vec<&str> = list["data"].as_array().into_iter().flatten().filter_map(|m| m["id"].as_str()).collect();
    for (model, _, _) in MODELS {
        assert!(ids.contains(&model), "{model} in {ids:?}");
    }
    let list: Value = common::client()
        .get(gw.url("/v1beta/models"))
        .header("x-goog-api-key", BRIDGE_KEY)
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
    let names: Vec<&str> = list["models"].as_array().into_iter().flatten().filter_map(|m| m["name"].as_str()).collect();
    assert!(names.contains(&"models/beta-opus-4-7") && names.contains(&"models/alpha-5.5"), "{names:?}");
    let resp = common::client().get(gw.url("/v1beta/models/alpha-5.5")).header("x-goog-api-key", BRIDGE_KEY).send().await.expect("get");
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn upstream_errors_reach_the_client_in_its_shape_with_the_same_status_and_nothing_billed() {
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port));
    for client in [Client::Chat, Client::Messages, Client::Gemini, Client::Responses] {
        for (model, _, provider) in MODELS {
            if native(client, provider) {
                continue;
            }
            // Streamed: a stream that fails before its first byte is a real error, not a 200.
            let tag = format!("err-{client:?}-{model}");
            let resp = send(&gw, client, model, true, &tag, &[("x-mock-status", "429"), ("x-mock-retry-after", "7")]).await;
            assert_eq!(resp.status(), 429, "{tag}");
            assert_eq!(resp.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("7"), "{tag}");
            let body: Value = resp.json().await.expect("json error");
            match client {
                Client::Chat | Client::Responses => assert_eq!(body["error"]["type"], "rate_limit_error", "{body}"),
                Client::Messages => {
                    assert_eq!((body["type"].as_str(), body["error"]["type"].as_str()), (Some("error"), Some("rate_limit_error")), "{body}")
                }
                Client::Gemini => assert_eq!(
                    (body["error"]["code"].as_u64(), body["error"]["status"].as_str()),
                    (Some(429), Some("RESOURCE_EXHAUSTED")),
                    "{body}"
                ),
            }
            let resp = send(&gw, client, model, false, &format!("{tag}-400"), &[("x-mock-status", "400")]).await;
            assert_eq!(resp.status(), 400, "{tag}");
        }
    }
    let usage = usage(&gw, BRIDGE_KEY).await;
    assert_eq!(nanos(&usage["total"]["cost"]), 0, "{usage}");
    assert_eq!(balance(&gw, BRIDGE_KEY).await, 5_000_000_000);
}

#[tokio::test]
async fn what_cannot_be_carried_is_refused_before_anything_is_sent() {
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port));
    let resp = common::client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(BRIDGE_KEY)
        .header("x-test-tag", "refused-n")
        .json(&json!({"model": "beta-opus-4-7", "n": 2, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.expect("json");
    assert_eq!(body["error"]["param"], "n", "{body}");
    let resp = common::client()
        .post(gw.url("/v1beta/models/alpha-5.5:generateContent"))
        .header("x-goog-api-key", BRIDGE_KEY)
        .header("x-test-tag", "refused-audio")
        .json(&json!({"contents": [{"role": "user", "parts": [{"inlineData": {"mimeType": "audio/wav", "data": "AAAA"}}]}]}))
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.expect("json");
    assert_eq!(body["error"]["status"], "INVALID_ARGUMENT", "{body}");
    assert!(body["error"]["message"].as_str().unwrap_or_default().contains("contents[0].parts"), "{body}");
    assert!(mock_requests(&mock, "refused-n").await.is_empty());
    assert!(mock_requests(&mock, "refused-audio").await.is_empty());
    assert_eq!(balance(&gw, BRIDGE_KEY).await, 5_000_000_000);
}

#[tokio::test]
async fn a_translated_stream_cut_by_the_provider_is_billed_and_ends_the_connection() {
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port));
    let resp = send(&gw, Client::Messages, "alpha-5.5", true, "cut", &[("x-mock-cut-after", "2"), ("x-mock-deltas", "6")]).await;
    assert_eq!(resp.status(), 200);
    // The client sees its stream end without message_stop: an error, not a clean end.
    let body = resp.text().await;
    assert!(body.as_ref().map_or(true, |b| !b.contains("message_stop")), "{body:?}");
    // Billed fail-closed from what came (estimated), one record.
    let usage = wait_requests(&gw, BRIDGE_KEY, 1).await;
    assert!(nanos(&usage["total"]["cost"]) > 0, "{usage}");
}

#[tokio::test]
async fn a_provider_without_the_responses_api_gets_responses_requests_as_chat_completions() {
    let mock = start_mock();
    // `responses: false`: no translating group needed, the provider's own models.
    let body = format!(
        r#"
providers:
  - {{ name: compat, protocol: openai, base_url: "http://127.0.0.1:{port}/compat", api_key: {UPSTREAM_KEY}, models: [alpha-5.5], responses: false }}
{prices}keys:
  - {{ key: {CLIENT_KEY}, name: tester, group: default, balance: 5.0 }}
"#,
        port = mock.port,
        prices = prices_section()
    );
    let gw = start_gateway(&body);
    for stream in [false, true] {
        let tag = format!("compat-{stream}");
        let (path, body) = request(Client::Responses, "alpha-5.5", stream);
        let resp = common::client()
            .post(gw.url(&path))
            .bearer_auth(CLIENT_KEY)
            .header("x-test-tag", &tag)
            .header("x-mock-usage", "40,3")
            .json(&body)
            .send()
            .await
            .expect("request");
        assert_eq!(resp.status(), 200);
        let answer = read_answer(Client::Responses, stream, &resp.text().await.expect("body"));
        assert_eq!((answer.text.as_str(), answer.input, answer.output), ("Hello from the", 40, 3), "{tag}");
        let seen = mock_requests(&mock, &tag).await;
        assert_eq!(seen[0]["path"], "/compat/v1/chat/completions", "{tag}");
    }
    let usage = wait_requests(&gw, CLIENT_KEY, 2).await;
    assert_eq!(nanos(&usage["total"]["cost"]), 2 * cost_nanos("alpha-5.5", 40, 3));
}

#[tokio::test]
async fn token_counting_reaches_translated_models_never_404() {
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port));
    let messages_body = json!({"model": "M", "system": "Be brief.", "messages": [{"role": "user", "content": "Weather in Paris?"}]});
    // The provider's own count where its protocol has one (x-mock-usage sets it).
    let mut body = messages_body.clone();
    body["model"] = json!("gamma-3.5-flash");
    let resp = common::client()
        .post(gw.url("/v1/messages/count_tokens"))
        .header("x-api-key", BRIDGE_KEY)
        .header("x-test-tag", "count-ge")
        .header("x-mock-usage", "31,0")
        .json(&body)
        .send()
        .await
        .expect("count");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.json::<Value>().await.expect("json"), json!({"input_tokens": 31}));
    assert_eq!(mock_requests(&mock, "count-ge").await[0]["path"], "/ge/v1beta/models/gamma-3.5-flash:countTokens");
    let resp = common::client()
        .post(gw.url("/v1beta/models/beta-opus-4-7:countTokens"))
        .header("x-goog-api-key", BRIDGE_KEY)
        .header("x-test-tag", "count-an")
        .header("x-mock-usage", "44,0")
        .json(&json!({"contents": [{"role": "user", "parts": [{"text": "Weather in Paris?"}]}]}))
        .send()
        .await
        .expect("count");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.json::<Value>().await.expect("json"), json!({"totalTokens": 44}));
    assert_eq!(mock_requests(&mock, "count-an").await[0]["path"], "/an/v1/messages/count_tokens");
    let resp = common::client()
        .post(gw.url("/v1/responses/input_tokens"))
        .bearer_auth(BRIDGE_KEY)
        .header("x-mock-usage", "12,0")
        .json(&json!({"model": "gamma-3.5-flash", "input": "Weather in Paris?"}))
        .send()
        .await
        .expect("count");
    assert_eq!(resp.json::<Value>().await.expect("json")["input_tokens"], 12);
    // A chat-completions provider has no count: tollgate's estimate (a token per 4 bytes).
    let mut body = messages_body.clone();
    body["model"] = json!("alpha-5.5");
    let len = serde_json::to_vec(&body).expect("json").len() as u64;
    let resp = common::client()
        .post(gw.url("/v1/messages/count_tokens"))
        .header("x-api-key", BRIDGE_KEY)
        .header("x-test-tag", "count-oa")
        .json(&body)
        .send()
        .await
        .expect("count");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.json::<Value>().await.expect("json"), json!({"input_tokens": len.div_ceil(4)}));
    assert!(mock_requests(&mock, "count-oa").await.is_empty(), "answered by tollgate");
    // Counting is not billed.
    assert_eq!(balance(&gw, BRIDGE_KEY).await, 5_000_000_000);
}

#[tokio::test]
async fn the_access_line_names_the_providers_protocol() {
    let mock = start_mock();
    let gw = start_gateway_logged(&config(mock.port));
    let resp = send(&gw, Client::Messages, "alpha-5.5", false, "logged", &[]).await;
    assert_eq!(resp.status(), 200);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let line = loop {
        if let Some(line) = gw.log().lines().find(|l| l.contains("route=messages")).map(str::to_string) {
            break line;
        }
        assert!(std::time::Instant::now() < deadline, "no access line: {}", gw.log());
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert!(line.contains("translated_to=openai") && line.contains("provider=\"oa\""), "{line}");
    assert!(!line.contains(BRIDGE_KEY), "{line}");
}
