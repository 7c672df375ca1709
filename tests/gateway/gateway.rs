//! Gateway core against the real daemon and the mock upstream: routes, keys, routing by model,
//! large bodies, header rewrite, streaming, model lists, upstream failures.

use crate::common::*;
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::time::Duration;

fn chat_body(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}]})
}

async fn post(url: &str, key_header: (&str, &str), tag: &str, body: &Value) -> reqwest::Response {
    client().post(url).header(key_header.0, key_header.1).header("x-test-tag", tag).json(body).send().await.expect("request")
}

fn bearer(key: &str) -> (&'static str, String) {
    ("authorization", format!("Bearer {key}"))
}

#[tokio::test]
async fn every_route_and_alias_reaches_its_upstream_path() {
    let mock = start_mock();
    let gw = start_gateway(&standard_config(mock.port));
    let auth = bearer(CLIENT_KEY);
    let cases: Vec<(&str, Value, &str)> = vec![
        ("/v1/chat/completions", chat_body("alpha-5.5"), "/oa/v1/chat/completions"),
        ("/chat/completions", chat_body("alpha-5.5"), "/oa/v1/chat/completions"),
        ("/v1/responses", json!({"model": "alpha-5.5", "input": "hi"}), "/oa/v1/responses"),
        ("/responses", json!({"model": "alpha-5.5", "input": "hi"}), "/oa/v1/responses"),
        ("/v1/embeddings", json!({"model": "alpha-embed-3", "input": "hi"}), "/oa/v1/embeddings"),
        ("/embeddings", json!({"model": "alpha-embed-3", "input": "hi"}), "/oa/v1/embeddings"),
        ("/v1/messages", json!({"model": "beta-opus-4-7", "max_tokens": 8, "messages": []}), "/an/v1/messages"),
        ("/messages", json!({"model": "beta-opus-4-7", "max_tokens": 8, "messages": []}), "/an/v1/messages"),
        ("/v1beta/models/gamma-3.5-flash:generateContent", json!({"contents": []}), "/ge/v1beta/models/gamma-3.5-flash:generateContent"),
        (
            "/v1beta/models/gamma-3.5-flash:streamGenerateContent",
            json!({"contents": []}),
            "/ge/v1beta/models/gamma-3.5-flash:streamGenerateContent",
        ),
        ("/v1/models/gamma-3.5-flash:generateContent", json!({"contents": []}), "/ge/v1/models/gamma-3.5-flash:generateContent"),
        (
            "/v1/models/gamma-3.5-flash:streamGenerateContent",
            json!({"contents": []}),
            "/ge/v1/models/gamma-3.5-flash:streamGenerateContent",
        ),
    ];
    for (i, (path, body, upstream_path)) in cases.iter().enumerate() {
        let tag = format!("route-{i}");
        let resp = post(&gw.url(path), (auth.0, &auth.1), &tag, body).await;
        assert_eq!(resp.status(), 200, "{path}");
        let seen = mock_requests(&mock, &tag).await;
        assert_eq!(seen.len(), 1, "{path}");
        assert_eq!(seen[0]["path"], *upstream_path, "{path}");
        assert_eq!(seen[0]["method"], "POST");
    }
    for path in ["/v1/usage", "/usage", "/v1/models", "/models", "/v1beta/models"] {
        let resp = client().get(gw.url(path)).header(auth.0, &auth.1).send().await.expect("get");
        assert_eq!(resp.status(), 200, "{path}");
    }
}

#[tokio::test]
async fn keys_are_accepted_in_every_header_on_every_endpoint() {
    let mock = start_mock();
    let gw = start_gateway(&standard_config(mock.port));
    let bearer_value = format!("Bearer {CLIENT_KEY}");
    let headers: [(&str, &str); 4] =
        [("authorization", &bearer_value), ("x-api-key", CLIENT_KEY), ("x-goog-api-key", CLIENT_KEY), ("x-alt-api-key", CLIENT_KEY)];
    for (name, value) in headers {
        for (path, body) in [
            ("/v1/chat/completions", chat_body("alpha-5.5")),
            ("/v1/messages", json!({"model": "beta-sonnet-4-6", "max_tokens": 8, "messages": []})),
            ("/v1beta/models/gamma-3.5-flash:generateContent", json!({"contents": []})),
        ] {
            let resp = post(&gw.url(path), (name, value), "hdr", &body).await;
            assert_eq!(resp.status(), 200, "{name} on {path}");
        }
        for path in ["/v1/models", "/v1beta/models", "/v1/usage"] {
            let resp = client().get(gw.url(path)).header(name, value).send().await.expect("get");
            assert_eq!(resp.status(), 200, "{name} on {path}");
        }
    }
}

#[tokio::test]
async fn key_in_query_is_400_even_with_a_valid_header() {
    let mock = start_mock();
    let gw = start_gateway(&standard_config(mock.port));
    let auth = bearer(CLIENT_KEY);
    for query in ["key=abc", "api_key=abc", "apikey=abc", "access_token=abc", "alt=sse&KEY=abc"] {
        let url = gw.url(&format!("/v1beta/models/gamma-3.5-flash:streamGenerateContent?{query}"));
        let resp = post(&url, (auth.0, &auth.1), "query-key", &json!({"contents": []})).await;
        assert_eq!(resp.status(), 400, "{query}");
        let v: Value = resp.json().await.expect("json");
        assert_eq!(v["error"]["status"], "INVALID_ARGUMENT", "{v}");
        let resp = client().get(gw.url(&format!("/v1/models?{query}"))).header(auth.0, &auth.1).send().await.expect("get");
        assert_eq!(resp.status(), 400, "{query}");
    }
    assert!(mock_requests(&mock, "query-key").await.is_empty(), "nothing may reach the upstream");
}

#[tokio::test]
async fn missing_wrong_and_disabled_keys_are_401_in_each_shape() {
    let mock = start_mock();
    let gw = start_gateway(&standard_config(mock.port));
    for key in [None, Some("sk-wrong-key-000"), Some(DISABLED_KEY)] {
        let with_key = |rb: reqwest::RequestBuilder| match key {
            Some(k) => rb.header("x-api-key", k),
            None => rb,
        };
        let r = with_key(client().post(gw.url("/v1/chat/completions")).json(&chat_body("alpha-5.5"))).send().await.expect("req");
        assert_eq!(r.status(), 401);
        let v: Value = r.json().await.expect("json");
        assert_eq!(v["error"]["type"], "authentication_error", "{v}");
        assert!(v["error"]["message"].is_string());

        let r = with_key(client().post(gw.url("/v1/messages")).json(&json!({"model": "beta-opus-4-7"}))).send().await.expect("req");
        assert_eq!(r.status(), 401);
        let v: Value = r.json().await.expect("json");
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "authentication_error", "{v}");

        let r =
            with_key(client().post(gw.url("/v1beta/models/gamma-3.5-flash:generateContent")).json(&json!({}))).send().await.expect("req");
        assert_eq!(r.status(), 401);
        let v: Value = r.json().await.expect("json");
        assert_eq!(v["error"]["status"], "UNAUTHENTICATED", "{v}");
        assert_eq!(v["error"]["code"], 401);
    }
    let r = client().get(gw.url("/v1/models")).header("x-api-key", DISABLED_KEY).send().await.expect("req");
    assert_eq!(r.status(), 401);
    let msg = r.text().await.expect("text");
    assert!(msg.contains("disabled"), "{msg}");
}

#[tokio::test]
async fn unknown_paths_are_404_in_the_fitting_shape() {
    let mock = start_mock();
    let gw = start_gateway(&standard_config(mock.port));
    let auth = bearer(CLIENT_KEY);
    let r = client().get(gw.url("/v1/nothing")).header(auth.0, &auth.1).send().await.expect("req");
    assert_eq!(r.status(), 404);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    let r = client().get(gw.url("/v1/messages/batches")).header(auth.0, &auth.1).send().await.expect("req");
    assert_eq!(r.status(), 404);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["error"]["type"], "not_found_error");
    let r = client().post(gw.url("/v1beta/models/gamma-3.5-flash:noSuchAction")).header(auth.0, &auth.1).send().await.expect("req");
    assert_eq!(r.status(), 404);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["error"]["status"], "NOT_FOUND");
}

#[tokio::test]
async fn routing_by_model_unknown_models_and_group_limits() {
    let mock = start_mock();
    let port = mock.port;
    let config = standard_config(port).replace(
        "groups:",
        &format!(
            "  - {{ name: oa2, protocol: openai, base_url: \"http://127.0.0.1:{port}/second\", api_key: {UPSTREAM_KEY}, models: [alpha-5.4] }}\ngroups:"
        ),
    );
    let gw = start_gateway(&config);
    let auth = bearer(CLIENT_KEY);
    let r = post(&gw.url("/v1/chat/completions"), (auth.0, &auth.1), "m54", &chat_body("alpha-5.4")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(mock_requests(&mock, "m54").await[0]["path"], "/second/v1/chat/completions");
    let r = post(&gw.url("/v1/chat/completions"), (auth.0, &auth.1), "m55", &chat_body("alpha-5.5")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(mock_requests(&mock, "m55").await[0]["path"], "/oa/v1/chat/completions");

    // Unknown model, or a model of another protocol: 404 in the endpoint's shape.
    let r = post(&gw.url("/v1/chat/completions"), (auth.0, &auth.1), "unknown", &chat_body("beta-opus-4-7")).await;
    assert_eq!(r.status(), 404);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["error"]["code"], "model_not_found", "{v}");
    let r = post(&gw.url("/v1/messages"), (auth.0, &auth.1), "unknown", &json!({"model": "nope", "max_tokens": 1})).await;
    assert_eq!(r.status(), 404);
    assert_eq!(r.json::<Value>().await.expect("json")["error"]["type"], "not_found_error");
    let r = post(&gw.url("/v1beta/models/nope:generateContent"), (auth.0, &auth.1), "unknown", &json!({})).await;
    assert_eq!(r.status(), 404);
    assert_eq!(r.json::<Value>().await.expect("json")["error"]["status"], "NOT_FOUND");
    // Missing model / broken JSON: 400.
    let r = post(&gw.url("/v1/chat/completions"), (auth.0, &auth.1), "unknown", &json!({"messages": []})).await;
    assert_eq!(r.status(), 400);
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .header(auth.0, &auth.1)
        .header("x-test-tag", "unknown")
        .body("{\"model\":")
        .send()
        .await
        .expect("req");
    assert_eq!(r.status(), 400);
    assert!(mock_requests(&mock, "unknown").await.is_empty());

    // A chat-group key: openai endpoints (embeddings included) work, the others are 404.
    let chat = bearer(CHAT_KEY);
    let r = post(&gw.url("/v1/embeddings"), (chat.0, &chat.1), "group", &json!({"model": "alpha-embed-3", "input": "x"})).await;
    assert_eq!(r.status(), 200);
    let r = post(&gw.url("/v1/messages"), (chat.0, &chat.1), "group", &json!({"model": "beta-opus-4-7", "max_tokens": 1})).await;
    assert_eq!(r.status(), 404);
    assert_eq!(r.json::<Value>().await.expect("json")["error"]["type"], "not_found_error");
    let r = post(&gw.url("/v1beta/models/gamma-3.5-flash:generateContent"), (chat.0, &chat.1), "group", &json!({})).await;
    assert_eq!(r.status(), 404);
    assert_eq!(mock_requests(&mock, "group").await.len(), 1, "only the embeddings call went upstream");
}

#[tokio::test]
async fn a_4_mib_body_with_model_last_is_routed_by_model() {
    let mock = start_mock();
    let port = mock.port;
    let config = standard_config(port).replace(
        "groups:",
        &format!(
            "  - {{ name: big, protocol: openai, base_url: \"http://127.0.0.1:{port}/big\", api_key: {UPSTREAM_KEY}, models: [alpha-big] }}\ngroups:"
        ),
    );
    let gw = start_gateway(&config);
    let filler = "q".repeat(4 * 1024 * 1024 + 17);
    // Hand-built so that `model` is the very last field.
    let body = format!(r#"{{"messages":[{{"role":"user","content":"{filler}"}}],"stream":false,"max_tokens":16,"model":"alpha-big"}}"#);
    let len = body.len();
    assert!(len > 4 * 1024 * 1024);
    let resp = client()
        .post(gw.url("/v1/chat/completions"))
        .header("authorization", format!("Bearer {CLIENT_KEY}"))
        .header("content-type", "application/json")
        .header("x-test-tag", "big")
        .body(body)
        .send()
        .await
        .expect("big request");
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.expect("json");
    assert_eq!(v["model"], "alpha-big");
    let seen = mock_requests(&mock, "big").await;
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0]["path"], "/big/v1/chat/completions");
    assert_eq!(seen[0]["body_len"], len, "the upstream received the whole body");
    assert_eq!(seen[0]["headers"]["content-length"][0], len.to_string());
}

#[tokio::test]
async fn bodies_over_the_limit_are_413_without_reaching_the_upstream() {
    let mock = start_mock();
    let gw = start_gateway(&format!("max_body_bytes: 65536\n{}", standard_config(mock.port)));
    let auth = bearer(CLIENT_KEY);
    let big = format!(r#"{{"model":"alpha-5.5","pad":"{}"}}"#, "z".repeat(70_000));
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .header(auth.0, &auth.1)
        .header("x-test-tag", "413")
        .body(big.clone())
        .send()
        .await
        .expect("req");
    assert_eq!(r.status(), 413);
    assert_eq!(r.json::<Value>().await.expect("json")["error"]["code"], "request_too_large");
    // Chunked (no Content-Length): refused once the limit is crossed.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = big.as_bytes().chunks(8192).map(|c| Ok(c.to_vec())).collect();
    let stream = futures_util::stream::iter(chunks);
    let r = client()
        .post(gw.url("/v1/messages"))
        .header(auth.0, &auth.1)
        .header("x-test-tag", "413")
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await
        .expect("req");
    assert_eq!(r.status(), 413);
    assert_eq!(r.json::<Value>().await.expect("json")["error"]["type"], "request_too_large");
    // Just under the limit passes.
    let ok = format!(r#"{{"model":"alpha-5.5","pad":"{}"}}"#, "z".repeat(60_000));
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .header(auth.0, &auth.1)
        .header("x-test-tag", "413ok")
        .body(ok)
        .send()
        .await
        .expect("req");
    assert_eq!(r.status(), 200);
    assert!(mock_requests(&mock, "413").await.is_empty());
}

#[tokio::test]
async fn the_upstream_never_sees_a_client_key() {
    let mock = start_mock();
    let gw = start_gateway(&standard_config(mock.port));
    for (i, (path, body)) in [
        ("/v1/chat/completions", chat_body("alpha-5.5")),
        ("/v1/messages", json!({"model": "beta-opus-4-7", "max_tokens": 8, "messages": []})),
        ("/v1beta/models/gamma-3.5-flash:generateContent", json!({"contents": []})),
    ]
    .into_iter()
    .enumerate()
    {
        let tag = format!("leak-{i}");
        let r = client()
            .post(gw.url(path))
            .header("authorization", format!("Bearer {CLIENT_KEY}"))
            .header("x-api-key", CLIENT_KEY)
            .header("x-goog-api-key", CLIENT_KEY)
            .header("x-alt-api-key", CLIENT_KEY)
            .header("proxy-authorization", format!("Bearer {CLIENT_KEY}"))
            .header("compat-version", "2023-06-01")
            .header("x-test-tag", &tag)
            .json(&body)
            .send()
            .await
            .expect("req");
        assert_eq!(r.status(), 200, "{path}: the mock accepted the provider's credential");
        let seen = mock_requests(&mock, &tag).await;
        assert_eq!(seen.len(), 1);
        let headers = seen[0]["headers"].to_string();
        assert!(!headers.contains(CLIENT_KEY), "{path}: client key reached the upstream: {headers}");
        assert!(headers.contains(UPSTREAM_KEY), "{path}: {headers}");
        assert_eq!(seen[0]["headers"]["host"][0], format!("127.0.0.1:{}", mock.port));
        if path == "/v1/messages" {
            assert_eq!(seen[0]["headers"]["anthropic-version"][0], "2023-06-01");
            assert!(seen[0]["headers"].get("compat-version").is_none());
        }
    }
    // The configured default version is sent when the client sends none.
    let r = post(&gw.url("/v1/messages"), ("x-api-key", CLIENT_KEY), "ver", &json!({"model": "beta-opus-4-7", "max_tokens": 1})).await;
    assert_eq!(r.status(), 200);
    assert_eq!(mock_requests(&mock, "ver").await[0]["headers"]["anthropic-version"][0], "2023-06-01");
    let r = client()
        .post(gw.url("/v1/messages"))
        .header("x-api-key", CLIENT_KEY)
        .header("anthropic-version", "2099-01-01")
        .header("x-test-tag", "ver2")
        .json(&json!({"model": "beta-opus-4-7", "max_tokens": 1}))
        .send()
        .await
        .expect("req");
    assert_eq!(r.status(), 200);
    assert_eq!(mock_requests(&mock, "ver2").await[0]["headers"]["anthropic-version"][0], "2099-01-01");
}

/// The mock sends one event, then holds the stream (at least one second, and until released).
/// The client must hold that first event while the upstream is still holding: only then does
/// the test release the rest. A buffering gateway would never deliver it and the test times out.
#[tokio::test]
async fn streams_pass_through_event_by_event() {
    let mock = start_mock();
    let gw = start_gateway(&standard_config(mock.port));
    for (i, (path, body, first_marker)) in [
        ("/v1/chat/completions", json!({"model": "alpha-5.5", "stream": true, "messages": []}), "\"role\":\"assistant\""),
        ("/v1/messages", json!({"model": "beta-opus-4-7", "stream": true, "max_tokens": 8, "messages": []}), "message_start"),
        ("/v1beta/models/gamma-3.5-flash:streamGenerateContent?alt=sse", json!({"contents": []}), "candidates"),
    ]
    .into_iter()
    .enumerate()
    {
        let token = format!("hold-{i}-{}", std::process::id());
        let resp = client()
            .post(gw.url(path))
            .header("authorization", format!("Bearer {CLIENT_KEY}"))
            .header("x-mock-hold", &token)
            .header("x-mock-deltas", "5")
            .json(&body)
            .send()
            .await
            .expect("stream request");
        assert_eq!(resp.status(), 200);
        assert!(resp.headers()["content-type"].to_str().unwrap_or("").starts_with("text/event-stream"));
        let mut stream = resp.bytes_stream();
        let mut received = Vec::new();
        // Read until the first event is complete, while the upstream holds the rest.
        let first = tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(chunk) = stream.next().await {
                received.extend_from_slice(&chunk.expect("chunk"));
                let text = String::from_utf8_lossy(&received);
                if text.contains("\n\n") || text.contains("\r\n\r\n") {
                    return text.into_owned();
                }
            }
            panic!("stream ended before the first event");
        })
        .await
        .unwrap_or_else(|_| panic!("{path}: first event not delivered while the upstream held the stream"));
        assert!(first.contains(first_marker), "{path}: {first}");
        let events_before_release = first.matches("data:").count();
        assert_eq!(events_before_release, 1, "{path}: only the first event exists yet: {first}");
        client().post(mock.url(&format!("/__mock/release?token={token}"))).send().await.expect("release");
        while let Some(chunk) = stream.next().await {
            received.extend_from_slice(&chunk.expect("chunk"));
        }
        let all = String::from_utf8_lossy(&received);
        assert!(all.matches("data:").count() >= 5, "{path}: the rest arrived after release: {all}");
    }
}

#[tokio::test]
async fn model_lists_in_each_shape_filtered_by_group() {
    let mock = start_mock();
    let gw = start_gateway(&standard_config(mock.port));
    let get = |path: &str, key: &str, extra: Option<(&str, &str)>| {
        let mut rb = client().get(gw.url(path)).header("authorization", format!("Bearer {key}"));
        if let Some((k, v)) = extra {
            rb = rb.header(k, v);
        }
        rb.send()
    };
    let v: Value = get("/v1/models", CLIENT_KEY, None).await.expect("req").json().await.expect("json");
    assert_eq!(v["object"], "list");
    let ids: Vec<&str> = v["data"].as_array().expect("data").iter().filter_map(|m| m["id"].as_str()).collect();
    // A chat-completions client's list: what its endpoints serve this (non-translating) group —
    // not the messages and generate-content models, which its calls would answer 404.
    assert_eq!(ids, ["alpha-5.5", "alpha-4o-mini", "alpha-embed-3"]);
    assert_eq!(v["data"][0]["object"], "model");
    for listed in &ids {
        let r = client()
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(CLIENT_KEY)
            .json(&json!({"model": listed, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}))
            .send()
            .await
            .expect("call");
        assert_ne!(r.status(), 404, "{listed} is listed but its call is 404");
    }

    for header in ["anthropic-version", "compat-version"] {
        let v: Value = get("/v1/models", CLIENT_KEY, Some((header, "2023-06-01"))).await.expect("req").json().await.expect("json");
        let ids: Vec<&str> = v["data"].as_array().expect("data").iter().filter_map(|m| m["id"].as_str()).collect();
        assert_eq!(ids, ["beta-opus-4-7", "beta-sonnet-4-6"], "{header}");
        assert_eq!(v["data"][0]["type"], "model");
        assert_eq!(v["data"][0]["display_name"], "beta-opus-4-7");
        assert!(v["data"][0]["created_at"].as_str().is_some_and(|s| s.ends_with('Z')));
        assert_eq!(v["has_more"], false);
        assert_eq!(v["first_id"], "beta-opus-4-7");
        assert_eq!(v["last_id"], "beta-sonnet-4-6");
    }

    let v: Value = get("/v1beta/models", CLIENT_KEY, None).await.expect("req").json().await.expect("json");
    assert_eq!(v["models"][0]["name"], "models/gamma-3.5-flash");
    assert_eq!(v["models"][0]["displayName"], "gamma-3.5-flash");
    assert!(v["models"][0]["supportedGenerationMethods"].as_array().is_some_and(|m| m.contains(&json!("generateContent"))));
    let r = get("/v1beta/models/gamma-3.5-flash", CLIENT_KEY, None).await.expect("req");
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.expect("json")["name"], "models/gamma-3.5-flash");
    let r = get("/v1beta/models/gamma-9", CLIENT_KEY, None).await.expect("req");
    assert_eq!(r.status(), 404);
    assert_eq!(r.json::<Value>().await.expect("json")["error"]["status"], "NOT_FOUND");

    // The chat group sees only chat-completions models.
    let v: Value = get("/v1/models", CHAT_KEY, None).await.expect("req").json().await.expect("json");
    let ids: Vec<&str> = v["data"].as_array().expect("data").iter().filter_map(|m| m["id"].as_str()).collect();
    assert_eq!(ids, ["alpha-5.5", "alpha-4o-mini", "alpha-embed-3"]);
    let v: Value = get("/v1beta/models", CHAT_KEY, None).await.expect("req").json().await.expect("json");
    assert_eq!(v["models"], json!([]));
    let r = get("/v1beta/models/gamma-3.5-flash", CHAT_KEY, None).await.expect("req");
    assert_eq!(r.status(), 404);
}

#[tokio::test]
async fn upstream_failures_timeouts_errors_and_failover() {
    let mock = start_mock();
    let dead = free_port();
    let port = mock.port;
    let config = format!(
        r#"
providers:
  - {{ name: down, protocol: openai, base_url: "http://127.0.0.1:{dead}/down", api_key: {UPSTREAM_KEY}, models: [alpha-down, alpha-fo] }}
  - {{ name: slow, protocol: anthropic, base_url: "http://127.0.0.1:{port}/slow", api_key: {UPSTREAM_KEY}, models: [beta-slow], read_timeout_secs: 1 }}
  - {{ name: down-ge, protocol: gemini, base_url: "http://127.0.0.1:{dead}", api_key: {UPSTREAM_KEY}, models: [gamma-down] }}
  - {{ name: up, protocol: openai, base_url: "http://127.0.0.1:{port}/up", api_key: {UPSTREAM_KEY}, models: [alpha-fo, alpha-ok] }}
prices:
  alpha-down: {{ input: 1, output: 1 }}
  alpha-fo: {{ input: 1, output: 1 }}
  alpha-ok: {{ input: 1, output: 1 }}
  beta-slow: {{ input: 1, output: 1 }}
  gamma-down: {{ input: 1, output: 1 }}
keys:
  - {{ key: {CLIENT_KEY}, name: tester, group: default, balance: 5.0 }}
"#
    );
    let gw = start_gateway(&config);
    let auth = bearer(CLIENT_KEY);
    let leaks = |text: &str| text.contains("127.0.0.1") || text.contains(&dead.to_string()) || text.contains(UPSTREAM_KEY);

    let r = post(&gw.url("/v1/chat/completions"), (auth.0, &auth.1), "down", &chat_body("alpha-down")).await;
    assert_eq!(r.status(), 502);
    let text = r.text().await.expect("text");
    let v: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(v["error"]["type"], "api_error");
    assert!(!leaks(&text), "{text}");

    let r = post(&gw.url("/v1beta/models/gamma-down:generateContent"), (auth.0, &auth.1), "down", &json!({})).await;
    assert_eq!(r.status(), 502);
    let text = r.text().await.expect("text");
    assert_eq!(serde_json::from_str::<Value>(&text).expect("json")["error"]["status"], "UNAVAILABLE");
    assert!(!leaks(&text), "{text}");

    let r = client()
        .post(gw.url("/v1/messages"))
        .header("x-api-key", CLIENT_KEY)
        .header("x-mock-delay-ms", "3000")
        .json(&json!({"model": "beta-slow", "max_tokens": 1}))
        .send()
        .await
        .expect("req");
    assert_eq!(r.status(), 504);
    let text = r.text().await.expect("text");
    assert_eq!(serde_json::from_str::<Value>(&text).expect("json")["error"]["type"], "timeout_error");
    assert!(!leaks(&text), "{text}");

    // An upstream's 429 is tollgate's 429: the client's shape, a Retry-After, none of the
    // upstream's text (its account details) and none of its headers.
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .header("authorization", &auth.1)
        .header("x-mock-status", "429")
        .json(&chat_body("alpha-ok"))
        .send()
        .await
        .expect("req");
    assert_eq!(r.status(), 429);
    assert!(r.headers().get("x-mock-error").is_none(), "the upstream's own headers are not relayed");
    assert!(r.headers().get("retry-after").is_some());
    let v = r.json::<Value>().await.expect("json");
    assert_eq!((v["error"]["type"].as_str(), v["error"]["code"].as_str()), (Some("rate_limit_error"), Some("rate_limit_exceeded")), "{v}");
    assert!(!v.to_string().contains("mock says"), "{v}");

    // Two providers serve alpha-fo; the first refuses connections, the second answers.
    let r = post(&gw.url("/v1/chat/completions"), (auth.0, &auth.1), "failover", &chat_body("alpha-fo")).await;
    assert_eq!(r.status(), 200);
    let seen = mock_requests(&mock, "failover").await;
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0]["path"], "/up/v1/chat/completions");
}

/// Read from `stream` until `needle` has been seen (or the peer closes); returns all bytes.
async fn read_until(stream: &mut tokio::net::TcpStream, needle: &str) -> String {
    use tokio::io::AsyncReadExt;
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.read(&mut buf).await.expect("read");
        if n == 0 {
            break;
        }
        seen.extend_from_slice(&buf[..n]);
        if String::from_utf8_lossy(&seen).contains(needle) {
            break;
        }
    }
    String::from_utf8_lossy(&seen).into_owned()
}

#[tokio::test]
async fn expect_100_continue_is_answered_after_the_checks() {
    use tokio::io::AsyncWriteExt;
    let mock = start_mock();
    let gw = start_gateway(&standard_config(mock.port));
    let body = serde_json::to_vec(&chat_body("alpha-5.5")).expect("json");
    let head = |key: &str| {
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
            body.len()
        )
    };
    // A valid key: 100 Continue arrives before any body byte is sent, then the answer.
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", gw.proc.port)).await.expect("connect");
    s.write_all(head(CLIENT_KEY).as_bytes()).await.expect("head");
    let interim = tokio::time::timeout(Duration::from_secs(10), read_until(&mut s, "\r\n\r\n")).await.expect("100 in time");
    assert!(interim.starts_with("HTTP/1.1 100"), "{interim}");
    s.write_all(&body).await.expect("body");
    let answer = tokio::time::timeout(Duration::from_secs(10), read_until(&mut s, "chat.completion")).await.expect("answer");
    assert!(answer.contains("200 OK") && answer.contains("chat.completion"), "{answer}");

    // A wrong key: refused at once, no 100 Continue.
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", gw.proc.port)).await.expect("connect");
    s.write_all(head("sk-wrong-key-000").as_bytes()).await.expect("head");
    let answer = tokio::time::timeout(Duration::from_secs(10), read_until(&mut s, "\r\n\r\n")).await.expect("answer");
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
}

/// `HEAD /` and `GET /`: the reachability probe agent CLIs send to their base URL answers 200,
/// with or without a key, and shows nothing of the configuration.
#[tokio::test]
async fn the_base_url_answers_a_probe_without_secrets() {
    let mock = start_mock();
    let gw = start_gateway(&standard_config(mock.port));
    let c = client();
    for key in [None, Some(CLIENT_KEY)] {
        let mut get = c.get(gw.url("/"));
        let mut head = c.head(gw.url("/"));
        if let Some(k) = key {
            get = get.bearer_auth(k);
            head = head.bearer_auth(k);
        }
        let r = head.send().await.expect("head");
        assert_eq!(r.status(), 200);
        assert!(r.bytes().await.expect("body").is_empty(), "HEAD has no body");
        let r = get.send().await.expect("get");
        assert_eq!(r.status(), 200);
        let text = r.text().await.expect("body");
        let v: Value = serde_json::from_str(&text).expect("json");
        assert_eq!(v["status"], "ok");
        for secret in [UPSTREAM_KEY, CLIENT_KEY, "127.0.0.1", "alpha-5.5"] {
            assert!(!text.contains(secret), "{text}");
        }
    }
    // Other methods on the root are still unknown.
    assert_eq!(c.post(gw.url("/")).bearer_auth(CLIENT_KEY).send().await.expect("post").status(), 404);
}

/// Token counting (`anthropic` SDK `messages.count_tokens`, Claude Code; `google-genai`
/// `models.count_tokens`, Gemini CLI): relayed with the provider's key and the same group rules,
/// answered in the service's shape, not billed and not recorded.
#[tokio::test]
async fn token_counting_is_relayed_and_not_billed() {
    let mock = start_mock();
    let gw = start_gateway(&standard_config(mock.port));
    let before = balance(&gw, CLIENT_KEY).await;
    let tag = format!("count-{}", std::process::id());
    let body = json!({"model": "beta-opus-4-7", "messages": [{"role": "user", "content": "hello"}]});
    for path in ["/v1/messages/count_tokens", "/messages/count_tokens"] {
        let r = client()
            .post(gw.url(path))
            .header("x-api-key", CLIENT_KEY)
            .header("anthropic-version", "2023-06-01")
            .header("x-mock-usage", "42,0")
            .header("x-test-tag", &tag)
            .json(&body)
            .send()
            .await
            .expect("count");
        assert_eq!(r.status(), 200, "{path}");
        assert_eq!(r.json::<Value>().await.expect("json"), json!({"input_tokens": 42}));
    }
    let contents = json!({"contents": [{"role": "user", "parts": [{"text": "hello"}]}]});
    for path in ["/v1beta/models/gamma-3.5-flash:countTokens", "/v1/models/gamma-3.5-flash:countTokens"] {
        let r = client()
            .post(gw.url(path))
            .header("x-goog-api-key", CLIENT_KEY)
            .header("x-mock-usage", "7,0")
            .header("x-test-tag", &tag)
            .json(&contents)
            .send()
            .await
            .expect("count");
        assert_eq!(r.status(), 200, "{path}");
        assert_eq!(r.json::<Value>().await.expect("json")["totalTokens"], 7);
    }
    let seen = mock_requests(&mock, &tag).await;
    assert_eq!(seen.len(), 4);
    let text = serde_json::to_string(&seen).expect("json");
    assert!(!text.contains(CLIENT_KEY), "no client key reached the upstream: {text}");
    assert_eq!(seen[0]["path"], "/an/v1/messages/count_tokens");
    assert_eq!(seen[2]["path"], "/ge/v1beta/models/gamma-3.5-flash:countTokens");
    assert_eq!(seen[3]["path"], "/ge/v1/models/gamma-3.5-flash:countTokens");
    // Not billed, not recorded.
    assert_eq!(balance(&gw, CLIENT_KEY).await, before);
    assert_eq!(usage(&gw, CLIENT_KEY).await["total"]["requests"], 0);
    // The same group rules: a chat-only key cannot count messages tokens; unknown models are 404.
    let r = client().post(gw.url("/v1/messages/count_tokens")).header("x-api-key", CHAT_KEY).json(&body).send().await.expect("count");
    assert_eq!(r.status(), 404);
    let r = client()
        .post(gw.url("/v1/messages/count_tokens"))
        .header("x-api-key", CLIENT_KEY)
        .json(&json!({"model": "nope", "messages": []}))
        .send()
        .await
        .expect("count");
    assert_eq!(r.status(), 404);
    assert_eq!(r.json::<Value>().await.expect("json")["type"], "error", "the messages error shape");
}

/// `embedContent` / `batchEmbedContents` (google-genai `models.embed_content`): relayed to the
/// gemini provider with its key; the service reports no usage, so the input is estimated from
/// the request and the output (vectors) is 0.
#[tokio::test]
async fn gemini_embeddings_are_relayed_and_billed_by_estimate() {
    let mock = start_mock();
    let gw = start_gateway(&standard_config(mock.port));
    let tag = format!("embed-{}", std::process::id());
    let one = json!({"content": {"parts": [{"text": "hello embeddings"}]}});
    let r = post(&gw.url("/v1beta/models/gamma-3.5-flash:embedContent"), ("x-goog-api-key", CLIENT_KEY), &tag, &one).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.expect("json")["embedding"]["values"].as_array().map(Vec::len), Some(3));
    let batch = json!({"requests": [one.clone(), one.clone()]});
    let r = post(&gw.url("/v1/models/gamma-3.5-flash:batchEmbedContents"), ("x-goog-api-key", CLIENT_KEY), &tag, &batch).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.expect("json")["embeddings"].as_array().map(Vec::len), Some(2));
    let seen = mock_requests(&mock, &tag).await;
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0]["path"], "/ge/v1beta/models/gamma-3.5-flash:embedContent");
    assert!(!serde_json::to_string(&seen).expect("json").contains(CLIENT_KEY));
    let u = wait_requests(&gw, CLIENT_KEY, 2).await;
    let row = u["models"].as_array().and_then(|m| m.iter().find(|r| r["model"] == "gamma-3.5-flash")).expect("row");
    assert_eq!(row["requests"], 2);
    assert_eq!(row["output_tokens"], 0, "vectors are not output tokens: {u}");
    assert!(row["input_tokens"].as_u64().is_some_and(|n| n > 0), "input estimated from the request: {u}");
}
