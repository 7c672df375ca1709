//! Billing integrity against the real daemon and the mock: each way a client could get service
//! without paying for it, or beyond its balance, is closed (issue: billing integrity).

use crate::common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const ADMIN_TOKEN: &str = "admin-token-billing-0001";
/// $0.20: the key, on alpha-5.5 at $8 per 1M output tokens.
const SMALL_KEY: &str = "sk-client-small-0001";
/// One request in flight at a time.
const SERIAL_KEY: &str = "sk-client-serial-0001";
/// Enough for one $0.25 video, not two.
const VIDEO_KEY: &str = "sk-client-video-0001";

fn config(mock_port: u16, admin_port: u16) -> String {
    let base = standard_config(mock_port)
        .replace(
            "keys:\n",
            &format!(
                "keys:\n  - {{ key: {SMALL_KEY}, name: small, group: default, balance: 0.20 }}\n  - {{ key: {SERIAL_KEY}, name: serial, group: default, balance: 5.0, max_concurrent: 1 }}\n  - {{ key: {VIDEO_KEY}, name: video, group: default, balance: 0.30 }}\n"
            ),
        )
        // Prompt-cache prices apart, and an output limit for the Gemini model.
        .replace("  beta-opus-4-7: { input: 3, output: 15 }", "  beta-opus-4-7: { input: 3, output: 15, cached_input: 0.3, cache_write_input: 3.75 }")
        .replace("  gamma-3.5-flash: { input: 0.5, output: 1.5 }", "  gamma-3.5-flash: { input: 0.5, output: 1.5, max_output_tokens: 65536 }");
    assert!(base.contains("cache_write_input") && base.contains("max_output_tokens"), "price rows changed: {base}");
    format!("{base}admin: {{ listen: 127.0.0.1:{admin_port}, token: {ADMIN_TOKEN} }}\n{}", video_section(mock_port))
}

struct Setup {
    mock: Proc,
    gw: Gateway,
    admin_port: u16,
}

fn setup() -> Setup {
    let mock = start_mock();
    let admin_port = free_port();
    let gw = start_gateway(&config(mock.port, admin_port));
    Setup { mock, gw, admin_port }
}

async fn post(gw: &Gateway, path: &str, key: &str, body: &Value, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut rb = client().post(gw.url(path)).bearer_auth(key).json(body);
    for (k, v) in headers {
        rb = rb.header(*k, *v);
    }
    rb.send().await.expect("request")
}

async fn metrics(s: &Setup) -> String {
    admin_metrics(s.admin_port, ADMIN_TOKEN).await
}

/// Point 1: whatever `stream_options` holds, tollgate asks for usage, bills the upstream's
/// count, and shows the usage chunk only to a client that asked for it. Before: a stream the
/// upstream counted as 1,000 / 5,000 tokens was billed 30 / 6 with `stream_options: null`.
#[tokio::test]
async fn streamed_chat_usage_is_obtained_whatever_stream_options_holds() {
    let s = setup();
    let variants: [(&str, Option<Value>, bool); 8] = [
        ("absent", None, false),
        ("null", Some(Value::Null), false),
        ("string", Some(json!("on")), false),
        ("number", Some(json!(1)), false),
        ("array", Some(json!([{"include_usage": true}])), false),
        ("false", Some(json!({"include_usage": false})), false),
        ("usage-null", Some(json!({"include_usage": null, "other": 1})), false),
        ("asked", Some(json!({"include_usage": true})), true),
    ];
    let mut expected_requests = 0;
    for (name, opts, asked) in variants {
        let before = balance(&s.gw, CLIENT_KEY).await;
        let mut body = json!({"model": "alpha-5.5", "messages": [{"role": "user", "content": "hi"}], "stream": true, "max_tokens": 6000});
        if let Some(o) = opts {
            body["stream_options"] = o;
        }
        let tag = format!("so-{name}");
        let r = post(&s.gw, "/v1/chat/completions", CLIENT_KEY, &body, &[("x-test-tag", &tag), ("x-mock-usage", "1000,5000")]).await;
        assert_eq!(r.status(), 200, "{name}");
        let text = r.text().await.expect("stream");
        assert!(text.contains("[DONE]"), "{name}: {text}");
        assert_eq!(text.contains("\"usage\""), asked, "{name}: the usage chunk is the client's only if it asked: {text}");
        let seen = mock_requests(&s.mock, &tag).await;
        assert_eq!(seen.len(), 1, "{name}");
        assert_eq!(seen[0]["stream_options"]["include_usage"], true, "{name}: {}", seen[0]);
        if name == "usage-null" {
            assert_eq!(seen[0]["stream_options"]["other"], 1, "the client's other options are kept");
        }
        expected_requests += 1;
        let u = wait_requests(&s.gw, CLIENT_KEY, expected_requests).await;
        assert_eq!(before - nanos(&u["balance"]), cost_nanos("alpha-5.5", 1000, 5000), "{name}: billed as the upstream counted");
    }
    let m = metrics(&s).await;
    assert_eq!(metric(&m, "tollgate_estimated_bills_total{model=\"alpha-5.5\"}"), 0.0, "nothing estimated:\n{m}");
}

/// Point 2: a successful answer without usage (tool calls, JSON) is billed from every byte the
/// client received, never zero, and counted as estimated; its input at the hold's estimate.
#[tokio::test]
async fn answers_without_usage_are_billed_for_every_byte_received() {
    let s = setup();
    let msgs = json!([{"role": "user", "content": "weather in Paris?"}]);
    let cases = [
        ("tool-stream", json!({"model": "alpha-5.5", "messages": msgs, "stream": true, "max_tokens": 100})),
        ("tool-whole", json!({"model": "alpha-5.5", "messages": msgs, "max_tokens": 100})),
    ];
    for (i, (name, body)) in cases.iter().enumerate() {
        let before = balance(&s.gw, CLIENT_KEY).await;
        let r = post(&s.gw, "/v1/chat/completions", CLIENT_KEY, body, &[("x-mock-no-usage", "1"), ("x-mock-tool-calls", "1")]).await;
        assert_eq!(r.status(), 200, "{name}");
        let received = r.bytes().await.expect("body");
        assert!(String::from_utf8_lossy(&received).contains("celsius"), "{name}: a tool call came back");
        assert!(!String::from_utf8_lossy(&received).contains("\"content\":\"Hello"), "{name}: no text at all");
        let u = wait_requests(&s.gw, CLIENT_KEY, i as u64 + 1).await;
        let output = (received.len() as u64).div_ceil(4);
        assert!(output > 10, "{name}");
        // Input fails closed too: the estimate the hold was made from (a token per 3 bytes).
        let input = (serde_json::to_vec(body).expect("json").len() as u64).div_ceil(3);
        assert_eq!(before - nanos(&u["balance"]), cost_nanos("alpha-5.5", input, output), "{name}");
    }
    let m = metrics(&s).await;
    assert_eq!(metric(&m, "tollgate_estimated_bills_total{model=\"alpha-5.5\"}"), 2.0, "{m}");
}

/// Point 3: holds cover every choice and the model's own output limit; `max_concurrent` caps
/// requests in flight. Before: a $0.20 key was admitted for `n: 8, max_tokens: 10000` ($0.64).
#[tokio::test]
async fn holds_cover_every_choice_and_the_model_limit() {
    let s = setup();
    let chat = |n: u64| json!({"model": "alpha-5.5", "messages": [{"role": "user", "content": "hi"}], "n": n, "max_tokens": 10000});
    let r = post(&s.gw, "/v1/chat/completions", SMALL_KEY, &chat(8), &[("x-test-tag", "n8")]).await;
    assert_eq!(r.status(), 402);
    assert!(r.text().await.expect("text").contains("0.64"), "the hold names the most it may cost");
    assert!(mock_requests(&s.mock, "n8").await.is_empty(), "nothing forwarded");
    let r = post(&s.gw, "/v1/chat/completions", SMALL_KEY, &chat(1), &[]).await;
    assert_eq!(r.status(), 200, "one choice ($0.08) fits");

    // generate-content: candidateCount multiplies; no maxOutputTokens holds the model's limit
    // (65,536 × $1.5/M ≈ $0.098 per candidate), lowered to what the key can afford — and the
    // upstream is told the lowered maximum, so it cannot generate past the hold.
    let gen = |count: u64| json!({"contents": [{"parts": [{"text": "hi"}]}], "generationConfig": {"candidateCount": count}});
    let path = "/v1beta/models/gamma-3.5-flash:generateContent";
    let left = balance(&s.gw, SMALL_KEY).await;
    assert_eq!(post(&s.gw, path, SMALL_KEY, &gen(3), &[("x-test-tag", "gen3")]).await.status(), 200);
    let sent = mock_requests(&s.mock, "gen3").await;
    let asked = sent[0]["max_output"].as_u64().expect("a maximum is always sent");
    assert!((256..65_536).contains(&asked), "lowered to the balance: {asked}");
    assert!(cost_nanos("gamma-3.5-flash", 0, 3 * asked) <= left, "three candidates of {asked} fit ${left}");
    assert_eq!(post(&s.gw, path, SMALL_KEY, &gen(1), &[]).await.status(), 200);
    let over = json!({"contents": [], "generationConfig": {"maxOutputTokens": 70000}});
    let r = post(&s.gw, path, CLIENT_KEY, &over, &[]).await;
    assert_eq!(r.status(), 400, "more than the model can produce");
    assert_eq!(r.json::<Value>().await.expect("json")["error"]["status"], "INVALID_ARGUMENT");

    // max_concurrent: 1 — a second request while one streams is refused with 429.
    let held = json!({"model": "alpha-5.5", "messages": [], "stream": true, "max_tokens": 10});
    let first = post(&s.gw, "/v1/chat/completions", SERIAL_KEY, &held, &[("x-mock-hold", "serial")]).await;
    assert_eq!(first.status(), 200);
    let second = post(&s.gw, "/v1/chat/completions", SERIAL_KEY, &held, &[]).await;
    assert_eq!(second.status(), 429);
    assert!(second.headers().contains_key("retry-after"));
    client().post(s.mock.url("/__mock/release?token=serial")).send().await.expect("release");
    assert!(first.text().await.expect("stream").contains("[DONE]"));
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let r = post(&s.gw, "/v1/chat/completions", SERIAL_KEY, &held, &[]).await;
        if r.status() == 200 {
            break;
        }
        assert_eq!(r.status(), 429);
        assert!(Instant::now() < deadline, "the slot is given back when the first request ends");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Point 4: numbers from a client cannot overflow the bill: an allowance no model can produce
/// is a 400, never admitted for free, and the daemon keeps serving.
#[tokio::test]
async fn client_numbers_cannot_overflow_the_hold() {
    let s = setup();
    let msgs = json!([{"role": "user", "content": "hi"}]);
    for (name, body) in [
        ("float", json!({"model": "alpha-5.5", "messages": msgs, "max_tokens": 1e15})),
        ("huge", json!({"model": "alpha-5.5", "messages": msgs, "max_tokens": 1_000_000_000_000_000u64})),
        ("u64-max", json!({"model": "alpha-5.5", "messages": msgs, "max_completion_tokens": u64::MAX})),
        ("many-choices", json!({"model": "alpha-5.5", "messages": msgs, "n": 1_000_000_000u64, "max_tokens": 10})),
        ("responses", json!({"model": "alpha-5.5", "input": "hi", "max_output_tokens": 1u64 << 40})),
    ] {
        let path = if name == "responses" { "/v1/responses" } else { "/v1/chat/completions" };
        let r = post(&s.gw, path, CLIENT_KEY, &body, &[("x-test-tag", name)]).await;
        assert_eq!(r.status(), 400, "{name}");
        assert!(mock_requests(&s.mock, name).await.is_empty(), "{name}: nothing forwarded");
    }
    let ok = json!({"model": "alpha-5.5", "messages": msgs, "max_tokens": 16});
    assert_eq!(post(&s.gw, "/v1/chat/completions", CLIENT_KEY, &ok, &[]).await.status(), 200);
    assert_eq!(usage(&s.gw, CLIENT_KEY).await["total"]["requests"], 1, "only the valid request was billed");
}

/// Point 6: `video` is a platform: a key whose group lacks it gets 404 on every video endpoint
/// and nothing reaches the video service.
#[tokio::test]
async fn video_endpoints_follow_the_group() {
    let s = setup();
    let body = json!({"model": "genq3-pro", "prompt": "a cat"});
    for path in ["/v1/videos", "/v1/video/generations"] {
        let r = post(&s.gw, path, CHAT_KEY, &body, &[]).await;
        assert_eq!(r.status(), 404, "{path}");
        assert_eq!(r.json::<Value>().await.expect("json")["error"]["type"], "invalid_request_error");
    }
    let r = client().get(s.gw.url("/v1/videos/task_x")).bearer_auth(CHAT_KEY).send().await.expect("get");
    assert_eq!(r.status(), 404);
    let calls: Value = client().get(s.mock.url("/__mock/tc_calls")).send().await.expect("calls").json().await.expect("json");
    assert_eq!(calls.as_array().map(Vec::len), Some(0), "no video call made: {calls}");
    assert_eq!(post(&s.gw, "/v1/videos", CLIENT_KEY, &body, &[]).await.status(), 200, "the default group has video");
}

/// Point 8: prompt-cache writes are billed at `cache_write_input`, reads at `cached_input`.
#[tokio::test]
async fn cache_writes_are_priced_apart() {
    let s = setup();
    let before = balance(&s.gw, CLIENT_KEY).await;
    let body = json!({"model": "beta-opus-4-7", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]});
    for (i, stream) in [false, true].into_iter().enumerate() {
        let mut b = body.clone();
        b["stream"] = json!(stream);
        let r = post(&s.gw, "/v1/messages", CLIENT_KEY, &b, &[("x-mock-usage", "100,20"), ("x-mock-cache", "4000,8000")]).await;
        assert_eq!(r.status(), 200);
        r.bytes().await.expect("body");
        wait_requests(&s.gw, CLIENT_KEY, i as u64 + 1).await;
    }
    // 100 input at $3, 4,000 written at $3.75, 8,000 read at $0.30, 20 output at $15 — per 1M.
    let one = 300_000 + 15_000_000 + 2_400_000 + 300_000;
    let u = usage(&s.gw, CLIENT_KEY).await;
    assert_eq!(before - nanos(&u["balance"]), 2 * one);
    assert_eq!(u["total"]["cache_write_input_tokens"], 8000);
    assert_eq!(u["total"]["cached_input_tokens"], 16000);
    assert_eq!(u["total"]["input_tokens"], 2 * (100 + 4000 + 8000));
}

/// Point 9: only allowlisted query parameters and client headers reach the upstream, so no
/// client can mask the usage away or select the operator's upstream organisation.
#[tokio::test]
async fn clients_cannot_shape_the_upstream_answer() {
    let s = setup();
    let before = balance(&s.gw, CLIENT_KEY).await;
    let body = json!({"contents": [{"parts": [{"text": "hi"}]}]});
    let path = "/v1beta/models/gamma-3.5-flash:streamGenerateContent?alt=sse&fields=candidates&%24fields=candidates&prettyPrint=false";
    let r = post(&s.gw, path, CLIENT_KEY, &body, &[("x-test-tag", "mask"), ("x-goog-fieldmask", "candidates"), ("x-mock-usage", "700,90")])
        .await;
    assert_eq!(r.status(), 200);
    let text = r.text().await.expect("stream");
    assert!(text.contains("usageMetadata"), "the answer keeps its usage: {text}");
    let seen = mock_requests(&s.mock, "mask").await;
    assert_eq!(seen[0]["query"], "alt=sse", "{}", seen[0]);
    assert!(seen[0]["headers"].get("x-goog-fieldmask").is_none(), "{}", seen[0]);
    let u = wait_requests(&s.gw, CLIENT_KEY, 1).await;
    assert_eq!(before - nanos(&u["balance"]), cost_nanos("gamma-3.5-flash", 700, 90));

    let chat = json!({"model": "alpha-5.5", "messages": [], "max_tokens": 8});
    let headers = [
        ("x-test-tag", "org"),
        ("openai-organization", "org-client"),
        ("openai-project", "proj-client"),
        ("x-goog-user-project", "p"),
        ("cookie", "session=1"),
        ("x-forwarded-for", "10.0.0.1"),
        ("x-stainless-lang", "python"),
    ];
    assert_eq!(post(&s.gw, "/v1/chat/completions?api-version=1&user=x", CLIENT_KEY, &chat, &headers).await.status(), 200);
    let seen = mock_requests(&s.mock, "org").await;
    let sent = &seen[0]["headers"];
    for dropped in ["openai-organization", "openai-project", "x-goog-user-project", "cookie", "x-forwarded-for"] {
        assert!(sent.get(dropped).is_none(), "{dropped} reached the upstream: {sent}");
    }
    assert_eq!(sent["x-stainless-lang"][0], "python", "SDK headers pass");
    assert!(seen[0]["query"].is_null(), "{}", seen[0]);
}

/// Point 10: the key-in-query ban decodes parameter names.
#[tokio::test]
async fn percent_encoded_key_parameters_are_refused() {
    let s = setup();
    let body = json!({"model": "alpha-5.5", "messages": []});
    for q in ["%6Bey", "%6b%65%79", "API%5FKEY", "access%5Ftoken", "Ke%79"] {
        let r = post(&s.gw, &format!("/v1/chat/completions?{q}={CLIENT_KEY}"), CLIENT_KEY, &body, &[("x-test-tag", "qk")]).await;
        assert_eq!(r.status(), 400, "{q}");
    }
    assert!(mock_requests(&s.mock, "qk").await.is_empty());
}

/// Point 13: concurrent video creations cannot both pass one balance check: a $0.30 key gets
/// exactly one $0.25 video out of eight simultaneous tries.
#[tokio::test]
async fn concurrent_video_charges_never_overdraw() {
    let s = setup();
    let tries: Vec<_> = (0..8)
        .map(|i| {
            let url = s.gw.url("/v1/videos");
            tokio::spawn(async move {
                let body = json!({"model": "genq3-pro", "prompt": format!("race {i}"), "duration": 5});
                client().post(url).bearer_auth(VIDEO_KEY).json(&body).send().await.expect("create").status().as_u16()
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tries {
        statuses.push(t.await.expect("join"));
    }
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 402, 402, 402, 402, 402, 402, 402]);
    assert_eq!(balance(&s.gw, VIDEO_KEY).await, 50_000_000);
}

/// Point 11: revocation sticks across reloads and restarts: a key dropped from the file is
/// disabled, an admin change to a seeded key outlives a reload of the unchanged file, and a
/// key created through the admin API is never touched by the file.
#[tokio::test]
async fn revocation_sticks_across_reload_and_restart() {
    let mut s = setup();
    let admin = format!("http://127.0.0.1:{}", s.admin_port);
    let created: Value = client()
        .post(format!("{admin}/admin/keys"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"name": "by-admin", "group": "default", "balance": 1.0}))
        .send()
        .await
        .expect("create")
        .json()
        .await
        .expect("json");
    let admin_secret = created["key"].as_str().expect("secret").to_string();
    let keys: Value =
        client().get(format!("{admin}/admin/keys")).bearer_auth(ADMIN_TOKEN).send().await.expect("list").json().await.expect("json");
    let chat_id = keys["data"].as_array().expect("keys").iter().find(|k| k["name"] == "chatter").expect("chatter")["id"].clone();
    let r = client()
        .patch(format!("{admin}/admin/keys/{}", chat_id.as_str().expect("id")))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"enabled": false}))
        .send()
        .await
        .expect("patch");
    assert_eq!(r.status(), 200);

    let models_url = s.gw.url("/v1/models");
    let models = |key: String| {
        let url = models_url.clone();
        async move { client().get(url).bearer_auth(key).send().await.expect("models").status().as_u16() }
    };
    // The file drops the tester key and keeps the chatter entry unchanged.
    let path = s.gw.config_path();
    let text = std::fs::read_to_string(&path).expect("config");
    let line = text.lines().find(|l| l.contains(CLIENT_KEY)).expect("tester line").to_string();
    std::fs::write(&path, text.replace(&format!("{line}\n"), "")).expect("write");
    s.gw.signal("HUP");
    let deadline = Instant::now() + Duration::from_secs(20);
    while models(CLIENT_KEY.into()).await != 401 {
        assert!(Instant::now() < deadline, "the dropped key still works after the reload");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(models(CHAT_KEY.into()).await, 401, "disabled through the admin API: stays disabled");
    assert_eq!(models(admin_secret.clone()).await, 200, "admin-created key untouched");
    assert_eq!(models(VIDEO_KEY.into()).await, 200);

    // An upgrade or restart reads the same file: nothing comes back.
    s.gw.kill_hard();
    s.gw.start_again();
    assert_eq!(models(CLIENT_KEY.into()).await, 401);
    assert_eq!(models(CHAT_KEY.into()).await, 401);
    assert_eq!(models(admin_secret).await, 200);
}
