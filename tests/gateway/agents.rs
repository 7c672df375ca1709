//! What coding agents and their SDKs use beyond generation: the responses API's stored
//! responses (owned by the key that created them), token counting and compaction, and
//! conversation affinity across several providers of one model.

use crate::common::*;
use serde_json::{json, Value};

const OTHER_KEY: &str = "sk-client-other-0001";

/// Three chat-completions providers serve alpha-5.5 (told apart by their path prefix at the
/// mock), and two keys.
fn three_provider_config(mock_port: u16) -> String {
    let config = format!(
        r#"
providers:
  - {{ name: p1, protocol: openai, base_url: "http://127.0.0.1:{mock_port}/p1", api_key: {UPSTREAM_KEY}, models: [alpha-5.5] }}
  - {{ name: p2, protocol: openai, base_url: "http://127.0.0.1:{mock_port}/p2", api_key: {UPSTREAM_KEY}, models: [alpha-5.5] }}
  - {{ name: p3, protocol: openai, base_url: "http://127.0.0.1:{mock_port}/p3", api_key: {UPSTREAM_KEY}, models: [alpha-5.5] }}
groups:
  default: {{ platforms: [openai] }}
{prices}keys:
  - {{ key: {CLIENT_KEY}, name: owner, group: default, balance: 5.0 }}
"#,
        prices = prices_section()
    );
    with_key(&config, &format!("{{ key: {OTHER_KEY}, name: other, group: default, balance: 5.0 }}"))
}

async fn send(gw: &Gateway, method: &str, path: &str, key: &str, tag: &str, body: Option<&Value>) -> (u16, Value) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
    let mut req = client().request(method, gw.url(path)).bearer_auth(key).header("x-test-tag", tag);
    if let Some(b) = body {
        req = req.json(b);
    }
    let r = req.send().await.expect("request");
    let status = r.status().as_u16();
    let text = r.text().await.expect("body");
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

/// The provider prefix (`/p1`…) of each request the mock saw with `tag`.
async fn providers_seen(mock: &Proc, tag: &str) -> Vec<String> {
    mock_requests(mock, tag)
        .await
        .iter()
        .map(|r| r["path"].as_str().unwrap_or_default().split("/v1/").next().unwrap_or_default().to_string())
        .collect()
}

/// A streamed create: the response id from its first event.
async fn create_streamed(gw: &Gateway, key: &str, tag: &str, input: &str) -> String {
    let r = client()
        .post(gw.url("/v1/responses"))
        .bearer_auth(key)
        .header("x-test-tag", tag)
        .json(&json!({"model": "alpha-5.5", "input": input, "stream": true}))
        .send()
        .await
        .expect("create");
    assert_eq!(r.status(), 200);
    let text = r.text().await.expect("stream");
    assert!(text.contains("event: response.output_item.added") && text.contains("event: response.content_part.added"), "{text}");
    let created = text.lines().find_map(|l| l.strip_prefix("data: ")).expect("first event");
    let v: Value = serde_json::from_str(created).expect("json");
    assert_eq!(v["type"], "response.created");
    v["response"]["id"].as_str().expect("id").to_string()
}

/// Stored responses belong to the key that created them: its owner reads, lists, cancels,
/// continues and deletes it at the provider that stored it; any other key gets exactly the
/// answer an unknown id gets, and none of its requests reaches the upstream.
#[tokio::test]
async fn a_stored_response_is_reachable_by_its_owner_only() {
    let mock = start_mock();
    let gw = start_gateway(&three_provider_config(mock.port));
    let tag = format!("own-{}", std::process::id());
    let intruder = format!("intruder-{}", std::process::id());

    let id = create_streamed(&gw, CLIENT_KEY, &tag, "remember the number 7").await;
    let home = providers_seen(&mock, &tag).await[0].clone();

    // Its owner reads it, at the provider that stored it (the mock keeps responses per provider).
    let (status, got) = send(&gw, "GET", &format!("/v1/responses/{id}"), CLIENT_KEY, &tag, None).await;
    assert_eq!((status, got["id"].as_str()), (200, Some(id.as_str())), "{got}");
    let (status, items) = send(&gw, "GET", &format!("/v1/responses/{id}/input_items?limit=5&fields=x"), CLIENT_KEY, &tag, None).await;
    assert_eq!(status, 200, "{items}");
    assert_eq!(items["data"][0]["content"][0]["text"], "remember the number 7");

    // Another key: the same 404 as an id nobody created; a continuation is refused as unknown.
    let unknown = "resp_nobody_made_this";
    let (status, not_found) = send(&gw, "GET", &format!("/v1/responses/{unknown}"), CLIENT_KEY, &tag, None).await;
    assert_eq!(status, 404);
    assert_eq!(not_found["error"]["type"], "invalid_request_error");
    for (method, path) in [
        ("GET", format!("/v1/responses/{id}")),
        ("DELETE", format!("/v1/responses/{id}")),
        ("POST", format!("/v1/responses/{id}/cancel")),
        ("GET", format!("/v1/responses/{id}/input_items")),
    ] {
        let (status, body) = send(&gw, method, &path, OTHER_KEY, &intruder, None).await;
        assert_eq!(status, 404, "{method} {path}: {body}");
        assert_eq!(body.to_string().replace(&id, unknown), not_found.to_string(), "{method} {path}: indistinguishable from unknown");
    }
    let turn = json!({"model": "alpha-5.5", "input": "what was the number?", "previous_response_id": id});
    let (status, body) = send(&gw, "POST", "/v1/responses", OTHER_KEY, &intruder, Some(&turn)).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["param"], "previous_response_id");
    assert!(mock_requests(&mock, &intruder).await.is_empty(), "nothing of the other key reached the upstream");

    // The owner continues the conversation: every turn goes where the response is stored (the
    // mock answers 400 at another provider), whatever the input.
    let mut previous = id.clone();
    for i in 0..6 {
        let turn = json!({"model": "alpha-5.5", "input": format!("turn {i}"), "previous_response_id": previous});
        let (status, body) = send(&gw, "POST", "/v1/responses", CLIENT_KEY, &tag, Some(&turn)).await;
        assert_eq!(status, 200, "turn {i}: {body}");
        previous = body["id"].as_str().expect("a non-streamed response's id").to_string();
    }
    // A response created without streaming is owned too (its id read from the body).
    let (status, got) = send(&gw, "GET", &format!("/v1/responses/{previous}"), CLIENT_KEY, &tag, None).await;
    assert_eq!(status, 200, "{got}");
    let (status, _) = send(&gw, "GET", &format!("/v1/responses/{previous}"), OTHER_KEY, &intruder, None).await;
    assert_eq!(status, 404);

    // Cancel and delete; a deleted response is gone for its owner too, without asking upstream.
    let (status, cancelled) = send(&gw, "POST", &format!("/v1/responses/{id}/cancel"), CLIENT_KEY, &tag, None).await;
    assert_eq!((status, cancelled["status"].as_str()), (200, Some("cancelled")));
    let (status, deleted) = send(&gw, "DELETE", &format!("/v1/responses/{id}"), CLIENT_KEY, &tag, None).await;
    assert_eq!((status, deleted["deleted"].as_bool()), (200, Some(true)));
    let relayed = mock_requests(&mock, &tag).await.len();
    let (status, _) = send(&gw, "GET", &format!("/v1/responses/{id}"), CLIENT_KEY, &tag, None).await;
    assert_eq!(status, 404);
    assert_eq!(mock_requests(&mock, &tag).await.len(), relayed, "answered by the gateway");
    assert!(providers_seen(&mock, &tag).await.iter().all(|p| *p == home), "every call at the provider that stored it");

    // Creating and continuing were billed (7 responses); reading, cancelling and deleting were not.
    let owner = wait_requests(&gw, CLIENT_KEY, 7).await;
    assert_eq!(owner["total"]["requests"], 7, "{owner}");
    assert_eq!(usage(&gw, OTHER_KEY).await["total"]["requests"], 0);
    let text = serde_json::to_string(&mock_requests(&mock, &tag).await).expect("json");
    assert!(!text.contains(CLIENT_KEY), "no client key reached the upstream");
}

/// `input_tokens` is relayed and not billed; `compact` is relayed and billed from its usage;
/// `background` is refused (its usage would only be known after the request).
#[tokio::test]
async fn input_tokens_and_compact_are_relayed_and_background_is_refused() {
    let mock = start_mock();
    let gw = start_gateway(&three_provider_config(mock.port));
    let tag = format!("count-{}", std::process::id());
    let body = json!({"model": "alpha-5.5", "input": "count me"});
    let (status, counted) = send(&gw, "POST", "/v1/responses/input_tokens", CLIENT_KEY, &tag, Some(&body)).await;
    assert_eq!((status, counted["object"].as_str()), (200, Some("response.input_tokens")), "{counted}");
    assert!(counted["input_tokens"].as_u64().is_some_and(|n| n > 0));
    let before = balance(&gw, CLIENT_KEY).await;
    let (status, compacted) = send(&gw, "POST", "/v1/responses/compact", CLIENT_KEY, &tag, Some(&body)).await;
    assert_eq!((status, compacted["object"].as_str()), (200, Some("response.compaction")), "{compacted}");
    let after = wait_requests(&gw, CLIENT_KEY, 1).await;
    assert_eq!(after["total"]["requests"], 1, "only the compaction is billed: {after}");
    assert_eq!(after["total"]["output_tokens"], 7, "from the compaction's usage");
    assert!(balance(&gw, CLIENT_KEY).await < before);
    let paths: Vec<Value> = mock_requests(&mock, &tag).await.iter().map(|r| r["path"].clone()).collect();
    assert!(paths[0].as_str().is_some_and(|p| p.ends_with("/v1/responses/input_tokens")), "{paths:?}");
    assert!(paths[1].as_str().is_some_and(|p| p.ends_with("/v1/responses/compact")), "{paths:?}");

    let background = json!({"model": "alpha-5.5", "input": "long job", "background": true});
    let (status, refused) = send(&gw, "POST", "/v1/responses", CLIENT_KEY, &tag, Some(&background)).await;
    assert_eq!(status, 400);
    assert_eq!(refused["error"]["param"], "background");
    assert_eq!(mock_requests(&mock, &tag).await.len(), 2, "not relayed");
}

/// With several providers for a model, the turns of one conversation go to one provider
/// (chosen by its first messages or its prompt_cache_key), and conversations spread over them.
#[tokio::test]
async fn the_turns_of_a_conversation_stay_with_one_provider() {
    let mock = start_mock();
    // Affinity without its load bound: twelve conversations sent back to back are not spread
    // evenly by their hashes, and at the default bound one whose provider is over 1.25 times
    // its share would rightly move (tests/gateway/routing.rs covers the bound).
    let gw = start_gateway(&format!("{}routing: {{ balance_factor: 100 }}\n", three_provider_config(mock.port)));
    let mut homes = std::collections::BTreeSet::new();
    for conv in 0..12 {
        let tag = format!("conv-{conv}-{}", std::process::id());
        let mut messages =
            vec![json!({"role": "system", "content": "You are terse."}), json!({"role": "user", "content": format!("question {conv}")})];
        for turn in 0..3 {
            let body = json!({"model": "alpha-5.5", "messages": messages});
            let (status, answer) = send(&gw, "POST", "/v1/chat/completions", CLIENT_KEY, &tag, Some(&body)).await;
            assert_eq!(status, 200, "{answer}");
            messages.push(answer["choices"][0]["message"].clone());
            messages.push(json!({"role": "user", "content": format!("follow-up {turn}")}));
        }
        let seen = providers_seen(&mock, &tag).await;
        assert_eq!(seen.len(), 3);
        assert!(seen.iter().all(|p| *p == seen[0]), "conversation {conv} moved: {seen:?}");
        homes.insert(seen[0].clone());
    }
    assert!(homes.len() > 1, "conversations spread over the providers: {homes:?}");

    // A prompt_cache_key keeps a conversation together whatever its input says.
    let tag = format!("pck-{}", std::process::id());
    for i in 0..5 {
        let body = json!({"model": "alpha-5.5", "input": format!("unrelated {i}"), "prompt_cache_key": "session-42", "store": false});
        let (status, _) = send(&gw, "POST", "/v1/responses", CLIENT_KEY, &tag, Some(&body)).await;
        assert_eq!(status, 200);
    }
    let seen = providers_seen(&mock, &tag).await;
    assert!(seen.len() == 5 && seen.iter().all(|p| *p == seen[0]), "{seen:?}");
}

/// A provider that fails breaks the affinity: the conversations that preferred it are served
/// by the next provider in their order, and nothing fails.
#[tokio::test]
async fn a_failing_provider_hands_its_conversations_on() {
    let mock = start_mock();
    let dead = free_port();
    let config = format!(
        r#"
providers:
  - {{ name: down, protocol: anthropic, base_url: "http://127.0.0.1:{dead}/down", api_key: {UPSTREAM_KEY}, models: [beta-opus-4-7] }}
  - {{ name: up, protocol: anthropic, base_url: "http://127.0.0.1:{port}/up", api_key: {UPSTREAM_KEY}, models: [beta-opus-4-7] }}
groups:
  default: {{ platforms: [anthropic] }}
{prices}keys:
  - {{ key: {CLIENT_KEY}, name: owner, group: default, balance: 5.0 }}
"#,
        port = mock.port,
        prices = prices_section()
    );
    let gw = start_gateway_logged(&config);
    let tag = format!("fail-{}", std::process::id());
    for conv in 0..10 {
        let r = client()
            .post(gw.url("/v1/messages"))
            .header("x-api-key", CLIENT_KEY)
            .header("x-test-tag", &tag)
            .json(&json!({"model": "beta-opus-4-7", "max_tokens": 10, "system": "s", "messages": [{"role": "user", "content": format!("c{conv}")}]}))
            .send()
            .await
            .expect("request");
        assert_eq!(r.status(), 200);
    }
    assert_eq!(providers_seen(&mock, &tag).await, vec!["/up".to_string(); 10]);
    // Some of these conversations preferred the provider that is down (ten coin flips).
    assert!(gw.log().contains("provider down failed to connect"), "{}", gw.log());
}

/// A stream names its response in its first event; from then on (long before the request is
/// settled and its owner booked) the owner can reach it and another key cannot.
#[tokio::test]
async fn a_response_still_streaming_is_owned_from_its_first_event() {
    let mock = start_mock();
    let gw = start_gateway(&three_provider_config(mock.port));
    let tag = format!("live-{}", std::process::id());
    let token = format!("hold-{}", std::process::id());
    let mut r = client()
        .post(gw.url("/v1/responses"))
        .bearer_auth(CLIENT_KEY)
        .header("x-test-tag", &tag)
        .header("x-mock-hold", &token)
        .json(&json!({"model": "alpha-5.5", "input": "a long answer", "stream": true}))
        .send()
        .await
        .expect("create");
    assert_eq!(r.status(), 200);
    let mut seen = String::new();
    let id = loop {
        let chunk = r.chunk().await.expect("read").expect("the first event before the stream ends");
        seen.push_str(&String::from_utf8_lossy(&chunk));
        if let Some(event) = seen.split("\n\n").next().filter(|_| seen.contains("\n\n")) {
            let data = event.lines().find_map(|l| l.strip_prefix("data: ")).expect("data");
            break serde_json::from_str::<Value>(data).expect("json")["response"]["id"].as_str().expect("id").to_string();
        }
    };
    // The stream is held open by the mock: nothing is settled yet.
    assert_eq!(usage(&gw, CLIENT_KEY).await["total"]["requests"], 0);
    let (status, got) = send(&gw, "GET", &format!("/v1/responses/{id}"), CLIENT_KEY, &tag, None).await;
    assert_eq!((status, got["id"].as_str()), (200, Some(id.as_str())), "{got}");
    let (status, _) = send(&gw, "GET", &format!("/v1/responses/{id}"), OTHER_KEY, &tag, None).await;
    assert_eq!(status, 404);
    client().post(mock.url(&format!("/__mock/release?token={token}"))).send().await.expect("release");
    let rest = r.text().await.expect("rest of the stream");
    assert!(rest.contains("response.completed"), "{rest}");
    // Settled: the owner is now read from the booked record.
    wait_requests(&gw, CLIENT_KEY, 1).await;
    let (status, _) = send(&gw, "GET", &format!("/v1/responses/{id}"), CLIENT_KEY, &tag, None).await;
    assert_eq!(status, 200);
    let (status, _) = send(&gw, "GET", &format!("/v1/responses/{id}"), OTHER_KEY, &tag, None).await;
    assert_eq!(status, 404);
}
