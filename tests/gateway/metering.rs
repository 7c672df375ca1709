//! Metering against the real daemon: the exact balance change for each protocol (streaming and
//! not), 402 with nothing forwarded, 429, billing of cut and abandoned streams, the concurrency
//! invariant, the admin API, and balances and records surviving a hard restart.

use crate::common::*;
use futures_util::StreamExt;
use serde_json::{json, Value};

const ADMIN_TOKEN: &str = "admin-token-for-tests";
const POOR_KEY: &str = "sk-client-poor-0001";
const LIMITED_KEY: &str = "sk-client-rpm-0001";

fn config(mock_port: u16, admin_port: u16) -> String {
    let base = standard_config(mock_port).replace(
        "keys:\n",
        &format!(
            "keys:\n  - {{ key: {POOR_KEY}, name: poor, group: default, balance: 0.000001 }}\n  - {{ key: {LIMITED_KEY}, name: limited, group: default, balance: 1.0, rpm: 2 }}\n"
        ),
    );
    format!("{base}admin: {{ listen: 127.0.0.1:{admin_port}, token: {ADMIN_TOKEN} }}\n{}", video_section(mock_port))
}

struct Call {
    name: &'static str,
    path: &'static str,
    body: Value,
    model: &'static str,
    output: u64,
}

#[tokio::test]
async fn each_protocol_is_billed_exactly_streaming_and_not() {
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port, free_port()));
    let msgs = json!([{"role": "user", "content": "hello there"}]);
    let calls = [
        Call {
            name: "chat",
            path: "/v1/chat/completions",
            body: json!({"model": "alpha-5.5", "messages": msgs}),
            model: "alpha-5.5",
            output: 3,
        },
        Call {
            name: "chat-stream",
            path: "/v1/chat/completions",
            body: json!({"model": "alpha-5.5", "messages": msgs, "stream": true}),
            model: "alpha-5.5",
            output: 3,
        },
        Call {
            name: "chat-stream-usage",
            path: "/v1/chat/completions",
            body: json!({"model": "alpha-5.5", "messages": msgs, "stream": true, "stream_options": {"include_usage": true}}),
            model: "alpha-5.5",
            output: 3,
        },
        Call {
            name: "responses",
            path: "/v1/responses",
            body: json!({"model": "alpha-5.5", "input": "hi"}),
            model: "alpha-5.5",
            output: 3,
        },
        Call {
            name: "responses-stream",
            path: "/v1/responses",
            body: json!({"model": "alpha-5.5", "input": "hi", "stream": true}),
            model: "alpha-5.5",
            output: 3,
        },
        Call {
            name: "embeddings",
            path: "/v1/embeddings",
            body: json!({"model": "alpha-embed-3", "input": ["a", "b"]}),
            model: "alpha-embed-3",
            output: 0,
        },
        Call {
            name: "messages",
            path: "/v1/messages",
            body: json!({"model": "beta-opus-4-7", "max_tokens": 64, "messages": msgs}),
            model: "beta-opus-4-7",
            output: 3,
        },
        Call {
            name: "messages-stream",
            path: "/v1/messages",
            body: json!({"model": "beta-opus-4-7", "max_tokens": 64, "messages": msgs, "stream": true}),
            model: "beta-opus-4-7",
            output: 3,
        },
        Call {
            name: "gemini",
            path: "/v1beta/models/gamma-3.5-flash:generateContent",
            body: json!({"contents": [{"parts": [{"text": "hi"}]}]}),
            model: "gamma-3.5-flash",
            output: 3,
        },
        Call {
            name: "gemini-sse",
            path: "/v1beta/models/gamma-3.5-flash:streamGenerateContent?alt=sse",
            body: json!({"contents": [{"parts": [{"text": "hi"}]}]}),
            model: "gamma-3.5-flash",
            output: 3,
        },
        Call {
            name: "gemini-array",
            path: "/v1beta/models/gamma-3.5-flash:streamGenerateContent",
            body: json!({"contents": [{"parts": [{"text": "hi"}]}]}),
            model: "gamma-3.5-flash",
            output: 3,
        },
    ];
    for (i, call) in calls.iter().enumerate() {
        let before = balance(&gw, CLIENT_KEY).await;
        let r = client()
            .post(gw.url(call.path))
            .bearer_auth(CLIENT_KEY)
            .header("x-test-tag", call.name)
            .json(&call.body)
            .send()
            .await
            .expect("request");
        assert_eq!(r.status(), 200, "{}", call.name);
        let text = r.text().await.expect("body");
        if call.name == "chat-stream" {
            assert!(!text.contains("\"usage\""), "usage chunk the client did not ask for was withheld: {text}");
            assert!(text.contains("[DONE]"));
        }
        if call.name == "chat-stream-usage" {
            assert!(text.contains("\"usage\""), "the client asked for usage: {text}");
        }
        let u = wait_requests(&gw, CLIENT_KEY, i as u64 + 1).await;
        // The mock counts one input token per four bytes of the body it received.
        let seen = mock_requests(&mock, call.name).await;
        let input = seen[0]["body_len"].as_u64().expect("len").div_ceil(4);
        let expected = cost_nanos(call.model, input, call.output);
        assert!(expected > 0, "{}", call.name);
        assert_eq!(before - nanos(&u["balance"]), expected, "{}: balance change", call.name);
    }
    let u = usage(&gw, CLIENT_KEY).await;
    assert_eq!(u["object"], "usage");
    assert_eq!(u["key"], json!({"name": "tester", "group": "default"}));
    assert_eq!(u["total"]["requests"], calls.len());
    let models: Vec<&str> = u["models"].as_array().expect("models").iter().filter_map(|m| m["model"].as_str()).collect();
    assert_eq!(models, ["alpha-5.5", "alpha-embed-3", "beta-opus-4-7", "gamma-3.5-flash"]);
    // Time filters: nothing before, everything in range.
    let r: Value =
        client().get(gw.url("/v1/usage?start=0&end=1")).bearer_auth(CLIENT_KEY).send().await.expect("u").json().await.expect("json");
    assert_eq!(r["total"]["requests"], 0);
    let r: Value = client()
        .get(gw.url("/v1/usage?start=0&end=99999999999"))
        .bearer_auth(CLIENT_KEY)
        .send()
        .await
        .expect("u")
        .json()
        .await
        .expect("json");
    assert_eq!(r["total"]["requests"], calls.len());
    let r = client().get(gw.url("/v1/usage?start=yesterday")).bearer_auth(CLIENT_KEY).send().await.expect("u");
    assert_eq!(r.status(), 400);
    // Another key sees none of it.
    assert_eq!(usage(&gw, CHAT_KEY).await["total"]["requests"], 0);
}

#[tokio::test]
async fn insufficient_balance_is_402_and_nothing_is_forwarded() {
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port, free_port()));
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(POOR_KEY)
        .header("x-test-tag", "poor")
        .json(&json!({"model": "alpha-5.5", "messages": [], "max_tokens": 1000}))
        .send()
        .await
        .expect("req");
    assert_eq!(r.status(), 402);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["error"]["type"], "insufficient_quota", "{v}");
    let r = client()
        .post(gw.url("/v1/messages"))
        .header("x-api-key", POOR_KEY)
        .header("x-test-tag", "poor")
        .json(&json!({"model": "beta-opus-4-7", "max_tokens": 1000}))
        .send()
        .await
        .expect("req");
    assert_eq!(r.status(), 402);
    assert_eq!(r.json::<Value>().await.expect("json")["error"]["type"], "billing_error");
    let r = client()
        .post(gw.url("/v1beta/models/gamma-3.5-flash:generateContent"))
        .header("x-goog-api-key", POOR_KEY)
        .header("x-test-tag", "poor")
        .json(&json!({"contents": []}))
        .send()
        .await
        .expect("req");
    assert_eq!(r.status(), 402);
    assert_eq!(r.json::<Value>().await.expect("json")["error"]["status"], "FAILED_PRECONDITION");
    let r = client()
        .post(gw.url("/v1/videos"))
        .bearer_auth(POOR_KEY)
        .json(&json!({"model": "genq3-pro", "prompt": "p [poor]"}))
        .send()
        .await
        .expect("req");
    assert_eq!(r.status(), 402);
    assert!(mock_requests(&mock, "poor").await.is_empty(), "nothing reached the upstream");
    let calls: Vec<Value> = client().get(mock.url("/__mock/tc_calls")).send().await.expect("c").json().await.expect("j");
    assert!(calls.is_empty(), "no video was submitted");
    assert_eq!(balance(&gw, POOR_KEY).await, 1000);
}

#[tokio::test]
async fn over_rpm_is_429_with_retry_after() {
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port, free_port()));
    for _ in 0..2 {
        let r = post_chat(&gw, LIMITED_KEY).await;
        assert_eq!(r.status(), 200);
    }
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(LIMITED_KEY)
        .header("x-test-tag", "limited")
        .json(&json!({"model": "alpha-5.5", "messages": []}))
        .send()
        .await
        .expect("req");
    assert_eq!(r.status(), 429);
    let retry: u64 = r.headers()["retry-after"].to_str().expect("ascii").parse().expect("seconds");
    assert!((1..=60).contains(&retry), "{retry}");
    assert_eq!(r.json::<Value>().await.expect("json")["error"]["type"], "rate_limit_error");
    let r = client()
        .post(gw.url("/v1/messages"))
        .header("x-api-key", LIMITED_KEY)
        .json(&json!({"model": "beta-opus-4-7", "max_tokens": 1}))
        .send()
        .await
        .expect("req");
    assert_eq!(r.status(), 429);
    assert_eq!(r.json::<Value>().await.expect("json")["error"]["type"], "rate_limit_error");
    assert!(mock_requests(&mock, "limited").await.is_empty());
    // Other keys are not affected.
    let r = post_chat(&gw, CLIENT_KEY).await;
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn a_cut_stream_is_billed_for_what_it_produced_once() {
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port, free_port()));
    let body = json!({"model": "alpha-5.5", "messages": [], "stream": true});
    let before = balance(&gw, CLIENT_KEY).await;
    // The upstream sends the role chunk, "Hello", " from", then drops the connection.
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(CLIENT_KEY)
        .header("x-mock-deltas", "6")
        .header("x-mock-cut-after", "3")
        .json(&body)
        .send()
        .await
        .expect("req");
    assert_eq!(r.status(), 200);
    let mut got = Vec::new();
    let mut stream = r.bytes_stream();
    while let Some(Ok(chunk)) = stream.next().await {
        got.extend_from_slice(&chunk);
    }
    assert!(String::from_utf8_lossy(&got).contains(" from"));
    let u = wait_requests(&gw, CLIENT_KEY, 1).await;
    // No usage was reported: billing fails closed on every byte the client received (one
    // token per four bytes); the input at the hold's estimate (one token per three bytes sent).
    let client_len = serde_json::to_vec(&body).expect("json").len() as u64;
    let output = (got.len() as u64).div_ceil(4);
    let expected = cost_nanos("alpha-5.5", client_len.div_ceil(3), output);
    assert_eq!(u["total"]["output_tokens"], output);
    assert_eq!(before - nanos(&u["balance"]), expected);

    // A client that goes away mid-stream is billed once, for a non-zero amount.
    let token = format!("gone-{}", std::process::id());
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(CLIENT_KEY)
        .header("x-mock-hold", &token)
        .header("x-mock-hold-after", "2")
        .json(&body)
        .send()
        .await
        .expect("req");
    let mut stream = r.bytes_stream();
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("Hello") {
        seen.extend_from_slice(&stream.next().await.expect("chunk").expect("bytes"));
    }
    drop(stream);
    client().post(mock.url(&format!("/__mock/release?token={token}"))).send().await.expect("release");
    let u = wait_requests(&gw, CLIENT_KEY, 2).await;
    let second = u["models"][0]["output_tokens"].as_u64().expect("tokens") - 3;
    assert!(second >= 2, "at least what the client received (\"Hello\"): {u}");
    // Still exactly two records after the upstream finished.
    let r = post_chat(&gw, CLIENT_KEY).await;
    assert_eq!(r.status(), 200);
    wait_requests(&gw, CLIENT_KEY, 3).await;
}

/// Many concurrent requests against a balance that covers only a few: the balance never goes
/// below zero and equals the opening balance minus exactly what the successful calls cost.
#[tokio::test]
async fn concurrent_requests_never_overdraw() {
    let mock = start_mock();
    let admin_port = free_port();
    let gw = start_gateway(&config(mock.port, admin_port));
    let admin = |p: &str| format!("http://127.0.0.1:{admin_port}{p}");
    // A hold is about 1000 × $8/M = $0.008; $0.03 covers three at a time.
    let created: Value = client()
        .post(admin("/admin/keys"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"name": "burst", "group": "default", "balance": 0.03}))
        .send()
        .await
        .expect("create")
        .json()
        .await
        .expect("json");
    let key = created["key"].as_str().expect("secret").to_string();
    let body = json!({"model": "alpha-5.5", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1000});
    let requests = (0..24)
        .map(|_| client().post(gw.url("/v1/chat/completions")).bearer_auth(&key).header("x-mock-delay-ms", "200").json(&body).send());
    let results = futures_util::future::join_all(requests).await;
    let ok = results.iter().filter(|r| r.as_ref().is_ok_and(|r| r.status() == 200)).count() as u64;
    let refused = results.iter().filter(|r| r.as_ref().is_ok_and(|r| r.status() == 402)).count();
    assert!(ok >= 1 && refused >= 1, "ok {ok}, refused {refused}");
    assert_eq!(ok as usize + refused, 24);
    let u = wait_requests(&gw, &key, ok).await;
    let final_balance = nanos(&u["balance"]);
    assert!(final_balance >= 0, "overdrawn: {u}");
    assert_eq!(final_balance, 30_000_000 - nanos(&u["total"]["cost"]), "{u}");
}

#[tokio::test]
async fn admin_api_manages_keys_live() {
    let mock = start_mock();
    let admin_port = free_port();
    let gw = start_gateway(&config(mock.port, admin_port));
    let admin = |p: &str| format!("http://127.0.0.1:{admin_port}{p}");
    assert_eq!(client().get(admin("/healthz")).send().await.expect("h").status(), 200);
    assert_eq!(client().get(admin("/admin/keys")).send().await.expect("no token").status(), 401);
    assert_eq!(client().get(admin("/admin/keys")).bearer_auth("wrong").send().await.expect("wrong").status(), 401);

    let r = client()
        .post(admin("/admin/keys"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"name": "ci", "group": "chat", "balance": 2.5, "rpm": 100}))
        .send()
        .await
        .expect("create");
    assert_eq!(r.status(), 201);
    let created: Value = r.json().await.expect("json");
    let secret = created["key"].as_str().expect("secret shown once").to_string();
    let id = created["id"].as_str().expect("id").to_string();
    assert_eq!(created["balance"], 2.5);
    let list = client().get(admin("/admin/keys")).bearer_auth(ADMIN_TOKEN).send().await.expect("list").text().await.expect("t");
    assert!(list.contains(&id) && !list.contains(&secret), "the list never shows a secret");
    let bad = client()
        .post(admin("/admin/keys"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"name": "x", "group": "nope"}))
        .send()
        .await
        .expect("bad");
    assert_eq!(bad.status(), 400);

    let chat =
        || client().post(gw.url("/v1/chat/completions")).bearer_auth(&secret).json(&json!({"model": "alpha-5.5", "messages": []})).send();
    assert_eq!(chat().await.expect("chat").status(), 200);
    let messages =
        || client().post(gw.url("/v1/messages")).bearer_auth(&secret).json(&json!({"model": "beta-opus-4-7", "max_tokens": 1})).send();
    assert_eq!(messages().await.expect("messages").status(), 404, "chat group");

    let patch = |v: Value| client().patch(admin(&format!("/admin/keys/{id}"))).bearer_auth(ADMIN_TOKEN).json(&v).send();
    assert_eq!(patch(json!({"enabled": false})).await.expect("p").status(), 200);
    assert_eq!(chat().await.expect("chat").status(), 401, "disabled at once");
    assert_eq!(patch(json!({"enabled": true, "group": "default"})).await.expect("p").status(), 200);
    assert_eq!(chat().await.expect("chat").status(), 200);
    assert_eq!(messages().await.expect("messages").status(), 200, "group change applies");
    wait_requests(&gw, &secret, 3).await;
    let before = balance(&gw, &secret).await;
    let v: Value = patch(json!({"balance_delta": 1.25})).await.expect("p").json().await.expect("json");
    assert_eq!(nanos(&v["balance"]), before + 1_250_000_000);
    assert_eq!(balance(&gw, &secret).await, before + 1_250_000_000);
    assert_eq!(patch(json!({"rpm": 0})).await.expect("p").status(), 200);
    assert_eq!(chat().await.expect("chat").status(), 429);
    assert_eq!(patch(json!({"rpm": null})).await.expect("p").status(), 200);
    assert_eq!(chat().await.expect("chat").status(), 200);
    assert_eq!(patch(json!({"colour": "red"})).await.expect("p").status(), 400);
    let missing = client().patch(admin("/admin/keys/key_nope")).bearer_auth(ADMIN_TOKEN).json(&json!({})).send().await.expect("p");
    assert_eq!(missing.status(), 404);

    let metrics = client().get(admin("/metrics")).bearer_auth(ADMIN_TOKEN).send().await.expect("m").text().await.expect("t");
    assert!(metrics.contains("tollgate_requests_total{route=\"chat_completions\",model=\"alpha-5.5\",status=\"200\"}"), "{metrics}");
    assert!(metrics.contains("tollgate_tokens_total{model=\"alpha-5.5\",kind=\"output\"}"), "{metrics}");
    assert!(!metrics.contains(&secret) && !metrics.contains(ADMIN_TOKEN));
}

#[tokio::test]
async fn video_is_charged_at_submission_and_refunded_on_failure() {
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port, free_port()));
    let start = balance(&gw, CLIENT_KEY).await;
    // genq3-pro: $0.05 a second × 4 s.
    let r = client()
        .post(gw.url("/v1/videos"))
        .bearer_auth(CLIENT_KEY)
        .json(&json!({"model": "genq3-pro", "prompt": "ok", "duration": 4}))
        .send()
        .await
        .expect("req");
    assert_eq!(r.status(), 200);
    assert_eq!(balance(&gw, CLIENT_KEY).await, start - 200_000_000);
    let r = client()
        .post(gw.url("/v1/videos"))
        .bearer_auth(CLIENT_KEY)
        .json(&json!({"model": "genq3-pro", "prompt": "x [submit-error]", "duration": 4}))
        .send()
        .await
        .expect("req");
    assert_eq!(r.status(), 400);
    assert_eq!(balance(&gw, CLIENT_KEY).await, start - 200_000_000, "a refused submission costs nothing");
    let r = client()
        .post(gw.url("/v1/videos"))
        .bearer_auth(CLIENT_KEY)
        .json(&json!({"model": "genq3-pro", "prompt": "y [fail]", "duration": 4}))
        .send()
        .await
        .expect("req");
    let id = r.json::<Value>().await.expect("json")["id"].as_str().expect("id").to_string();
    assert_eq!(balance(&gw, CLIENT_KEY).await, start - 400_000_000);
    poll_task(&gw, CLIENT_KEY, &id, |v| v["status"] == "failed").await;
    assert_eq!(balance(&gw, CLIENT_KEY).await, start - 200_000_000, "refunded once on FAIL");
}

#[tokio::test]
async fn balances_and_records_survive_a_hard_restart() {
    let mock = start_mock();
    let mut gw = start_gateway(&config(mock.port, free_port()));
    for _ in 0..3 {
        let r = post_chat(&gw, CLIENT_KEY).await;
        assert_eq!(r.status(), 200);
    }
    let before = wait_requests(&gw, CLIENT_KEY, 3).await;
    assert!(nanos(&before["balance"]) < 5_000_000_000);
    gw.kill_hard();
    gw.start_again();
    let after = usage(&gw, CLIENT_KEY).await;
    assert_eq!(after, before, "the configured balance is not applied again, and no record is lost");
}

/// Sustained concurrent settlement: every request completes and is recorded. (Written after the
/// load harness hung tollgate: sled transactions plus concurrent flushes deadlocked.)
#[tokio::test]
async fn sustained_concurrent_settlement_completes() {
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port, free_port()));
    let workers = (0..64).map(|_| {
        let url = gw.url("/v1/chat/completions");
        tokio::spawn(async move {
            let c = client();
            for _ in 0..10 {
                let r =
                    c.post(&url).bearer_auth(CLIENT_KEY).json(&json!({"model": "alpha-5.5", "messages": []})).send().await.expect("req");
                assert_eq!(r.status(), 200);
                r.bytes().await.expect("body");
            }
        })
    });
    for w in futures_util::future::join_all(workers).await {
        w.expect("worker");
    }
    let u = wait_requests(&gw, CLIENT_KEY, 640).await;
    assert_eq!(u["total"]["output_tokens"], 640 * 3);
}

/// Issue 27: the admin API complete for keys — read one, rename, revoke (for good, records
/// kept), rotate with a grace period, `group` defaulting to `default`, field errors named, and
/// the operator's usage views without the key's secret.
#[tokio::test]
async fn admin_api_reads_renames_revokes_rotates_and_reports_usage() {
    let mock = start_mock();
    let admin_port = free_port();
    let gw = start_gateway(&config(mock.port, admin_port));
    let admin = |p: &str| format!("http://127.0.0.1:{admin_port}{p}");
    let send = |m: reqwest::Method, p: &str, body: Option<Value>| {
        let r = client().request(m, admin(p)).bearer_auth(ADMIN_TOKEN);
        let r = match body {
            Some(b) => r.json(&b),
            None => r,
        };
        async move {
            let r = r.send().await.expect("admin");
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    use reqwest::Method;

    // No group: the `default` group. A field error says which field.
    let (status, created) = send(Method::POST, "/admin/keys", Some(json!({"name": "ops", "balance": 1.0}))).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["group"], "default");
    let (id, secret) = (created["id"].as_str().expect("id").to_string(), created["key"].as_str().expect("secret").to_string());
    let (status, e) = send(Method::POST, "/admin/keys", Some(json!({"name": "x", "balance": "lots"}))).await;
    assert_eq!(status, 400);
    assert!(e["error"]["message"].as_str().is_some_and(|m| m.starts_with("Invalid field")), "{e}");
    let (status, e) = send(Method::POST, "/admin/keys", Some(json!({"group": "default"}))).await;
    assert!(status == 400 && e["error"]["message"].as_str().is_some_and(|m| m.contains("name")), "{e}");

    // Read one; rename.
    let (status, one) = send(Method::GET, &format!("/admin/keys/{id}"), None).await;
    assert_eq!((status, one["name"].as_str(), one.get("key")), (200, Some("ops"), None), "{one}");
    let (status, renamed) = send(Method::PATCH, &format!("/admin/keys/{id}"), Some(json!({"name": "ops-2"}))).await;
    assert_eq!((status, renamed["name"].as_str()), (200, Some("ops-2")));
    assert_eq!(send(Method::GET, "/admin/keys/key_nope", None).await.0, 404);

    // Usage seen by the operator, without the secret: per key, and over every key.
    let chat = |key: &str| {
        client()
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(key.to_string())
            .json(&json!({"model": "alpha-5.5", "messages": [{"role": "user", "content": "x"}]}))
            .send()
    };
    assert_eq!(chat(&secret).await.expect("chat").status(), 200);
    assert_eq!(chat(CLIENT_KEY).await.expect("chat").status(), 200);
    let own = wait_requests(&gw, &secret, 1).await;
    let (status, seen) = send(Method::GET, &format!("/admin/keys/{id}/usage"), None).await;
    assert_eq!(status, 200);
    assert_eq!(seen["total"], own["total"], "the operator sees what the key sees");
    assert_eq!(seen["models"], own["models"]);
    let (status, by_key) = send(Method::GET, "/admin/usage?group_by=key", None).await;
    assert_eq!(status, 200, "{by_key}");
    let row = by_key["data"].as_array().and_then(|rows| rows.iter().find(|r| r["key"]["id"] == id.as_str())).expect("a row for the key");
    assert_eq!(row["requests"], 1);
    assert!(by_key["total"]["requests"].as_u64().is_some_and(|n| n >= 2), "{by_key}");
    let (_, by_model) = send(Method::GET, "/admin/usage?group_by=model", None).await;
    assert!(by_model["data"].as_array().is_some_and(|rows| rows.iter().any(|r| r["model"] == "alpha-5.5")), "{by_model}");
    let today = tollgate::base::clock::now_unix() / 86_400 * 86_400;
    let (status, by_day) = send(Method::GET, &format!("/admin/usage?group_by=day&start={today}"), None).await;
    assert_eq!(status, 200, "{by_day}");
    assert_eq!(by_day["data"].as_array().map(Vec::len), Some(1), "{by_day}");
    assert_eq!(by_day["data"][0]["requests"], by_day["total"]["requests"]);
    // Without start: the last 30 days (today's row the same).
    let (status, recent) = send(Method::GET, "/admin/usage?group_by=day", None).await;
    assert_eq!(status, 200, "{recent}");
    assert_eq!(
        (recent["data"].clone(), recent["total"]["requests"].clone()),
        (by_day["data"].clone(), by_day["total"]["requests"].clone()),
        "{recent}"
    );
    let year_ago = today - 400 * 86_400;
    assert_eq!(send(Method::GET, &format!("/admin/usage?group_by=day&start={year_ago}"), None).await.0, 400, "at most 366 days");
    assert_eq!(send(Method::GET, "/admin/usage?group_by=colour", None).await.0, 400);

    // Rotation: a new secret at once, the old one accepted during the grace period only.
    let (status, rotated) = send(Method::POST, &format!("/admin/keys/{id}/rotate"), Some(json!({"grace_secs": 2}))).await;
    assert_eq!(status, 200, "{rotated}");
    let new_secret = rotated["key"].as_str().expect("new secret").to_string();
    assert_ne!(new_secret, secret);
    assert_eq!(rotated["id"].as_str(), Some(id.as_str()), "the same key: its balance and usage stay");
    assert_eq!(chat(&new_secret).await.expect("chat").status(), 200);
    assert_eq!(chat(&secret).await.expect("chat").status(), 200, "the old secret within the grace period");
    let until = rotated["previous_key_valid_until"].as_u64().expect("grace end");
    while tollgate::base::clock::now_unix() < until {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let r = chat(&secret).await.expect("chat");
    assert_eq!(r.status(), 401, "the old secret after the grace period");
    assert!(r.text().await.unwrap_or_default().contains("rotated"));
    assert_eq!(chat(&new_secret).await.expect("chat").status(), 200);
    let (status, now_usage) = send(Method::GET, &format!("/admin/keys/{id}/usage"), None).await;
    assert_eq!((status, now_usage["total"]["requests"].as_u64()), (200, Some(4)), "{now_usage}");
    let (status, _) = send(Method::POST, &format!("/admin/keys/{id}/rotate"), Some(json!({"grace_secs": 9_999_999}))).await;
    assert_eq!(status, 400);

    // Revocation: refused at once and for good; the records stay.
    let (status, revoked) = send(Method::DELETE, &format!("/admin/keys/{id}"), None).await;
    assert_eq!(status, 200);
    assert!(revoked["revoked_at"].as_u64().is_some(), "{revoked}");
    let r = chat(&new_secret).await.expect("chat");
    assert_eq!(r.status(), 401);
    assert!(r.text().await.unwrap_or_default().contains("revoked"));
    let (status, e) = send(Method::PATCH, &format!("/admin/keys/{id}"), Some(json!({"enabled": true}))).await;
    assert_eq!(status, 409, "{e}");
    assert_eq!(send(Method::POST, &format!("/admin/keys/{id}/rotate"), Some(json!({}))).await.0, 409);
    let (_, kept) = send(Method::GET, &format!("/admin/keys/{id}/usage"), None).await;
    assert_eq!(kept["total"]["requests"], 4, "records kept: {kept}");
    // A key from the file is rotated in the file.
    let file_key = tollgate::access::auth::seed_key_id(CLIENT_KEY);
    assert_eq!(send(Method::POST, &format!("/admin/keys/{file_key}/rotate"), Some(json!({}))).await.0, 409);
}
