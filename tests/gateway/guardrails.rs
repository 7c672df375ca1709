//! Guardrails (issue 65) against the real daemon and the mock: a secret masked before it
//! leaves (the mock echoes what it received) and restored in the answer, a card number refused
//! before anything is held, output blocked in a whole answer and in a stream (billed for what
//! the upstream produced), a webhook that hangs failing open or closed, `price_per_check`
//! billed, and what they did in the logs and metrics — never what they found.

use crate::common::*;
use serde_json::{json, Value};
use tokio::io::AsyncReadExt;

const ADMIN_TOKEN: &str = "guard-admin-token-000000001";
const MASK_KEY: &str = "sk-guard-mask-00000001";
const RESTORE_KEY: &str = "sk-guard-restore-0000001";
const OUT_KEY: &str = "sk-guard-output-0000001";
const HOOK_KEY: &str = "sk-guard-hook-00000001";
const CLOSED_KEY: &str = "sk-guard-closed-0000001";
const SECRET: &str = "AKIAIOSFODNN7EXAMPLE";
const CARD: &str = "4111 1111 1111 1111";

fn config(mock_port: u16, admin_port: u16, hook_port: u16) -> String {
    let base = standard_config(mock_port);
    let base = with_key(&base, &format!("{{ key: {MASK_KEY}, name: masked, group: default, balance: 5.0, guardrails: [secrets, cards] }}"));
    let base =
        with_key(&base, &format!("{{ key: {RESTORE_KEY}, name: restored, group: default, balance: 5.0, guardrails: [secrets-restore] }}"));
    let base = with_key(&base, &format!("{{ key: {OUT_KEY}, name: output, group: default, balance: 5.0, guardrails: [answers] }}"));
    let base = with_key(&base, &format!("{{ key: {HOOK_KEY}, name: hooked, group: default, balance: 5.0, guardrails: [hook-open] }}"));
    let base = with_key(&base, &format!("{{ key: {CLOSED_KEY}, name: closed, group: default, balance: 5.0, guardrails: [hook-closed] }}"));
    format!(
        "{base}admin: {{ listen: 127.0.0.1:{admin_port}, token: {ADMIN_TOKEN} }}
guardrails:
  - {{ name: secrets, kind: secrets, action: mask, price_per_check: 0.001 }}
  - {{ name: cards, kind: pii, recognisers: [card], action: block }}
  - {{ name: secrets-restore, kind: secrets, action: mask, restore: true }}
  - {{ name: answers, kind: secrets, phase: output, action: block }}
  - {{ name: hook-open, kind: webhook, url: 'http://127.0.0.1:{hook_port}/check', secret_env: GUARD_HOOK_SECRET, timeout_ms: 300, on_error: open }}
  - {{ name: hook-closed, kind: webhook, url: 'http://127.0.0.1:{hook_port}/check', secret_env: GUARD_HOOK_SECRET, timeout_ms: 300, on_error: closed }}
"
    )
}

async fn chat(gw: &Gateway, key: &str, text: &str, stream: bool) -> reqwest::Response {
    client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(key)
        .json(&json!({"model": "alpha-5.5", "stream": stream, "messages": [{"role": "user", "content": text}]}))
        .send()
        .await
        .expect("chat")
}

/// The text of a chat answer, whole or streamed.
async fn answer_text(resp: reqwest::Response) -> String {
    let body = resp.text().await.expect("body");
    match serde_json::from_str::<Value>(&body) {
        Ok(v) => v["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_string(),
        Err(_) => body
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .filter_map(|v| v["choices"][0]["delta"]["content"].as_str().map(str::to_string))
            .collect(),
    }
}

/// A webhook receiver that never answers (holds each connection until the test ends).
async fn hanging_hook() -> (u16, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut buf = vec![0u8; 4096];
            let _ = socket.read(&mut buf).await;
            held.push(socket);
        }
    });
    (port, task)
}

#[tokio::test]
async fn input_is_masked_before_it_leaves_and_refused_before_anything_is_held() {
    let mock = start_mock();
    let admin = free_port();
    let (hook, _task) = hanging_hook().await;
    let gw = start_gateway_env(&config(mock.port, admin, hook), &[("GUARD_HOOK_SECRET", "whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQ=")]);

    // Masked: the mock echoes what it received, the key replaced by its placeholder.
    let before = balance(&gw, MASK_KEY).await;
    for stream in [false, true] {
        let resp = chat(&gw, MASK_KEY, &format!("[[echo]] my key {SECRET} please"), stream).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(answer_text(resp).await, "my key [AWS_KEY_1] please", "stream {stream}");
    }
    let u = wait_requests(&gw, MASK_KEY, 2).await;
    // The guardrail's price is billed with each call, beside its tokens.
    let spent = before - balance(&gw, MASK_KEY).await;
    assert!(spent > 2 * 1_000_000, "two checks at 0.001 USD and the tokens: {spent}");
    assert_eq!(nanos(&u["total"]["cost"]), spent);

    // With restore: the model saw the placeholder; this client gets its own key back.
    for stream in [false, true] {
        let resp = chat(&gw, RESTORE_KEY, &format!("[[echo:5]] my key {SECRET} please"), stream).await;
        assert_eq!(answer_text(resp).await, format!("my key {SECRET} please"), "stream {stream}");
    }

    // Blocked: 400 content_policy_violation naming the guardrail, never the number; nothing
    // held or billed; counted against rpm like any refused call.
    let before = balance(&gw, MASK_KEY).await;
    let resp = chat(&gw, MASK_KEY, &format!("[[echo]] card {CARD}"), false).await;
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.expect("json");
    assert_eq!(body["error"]["code"], "content_policy_violation", "{body}");
    assert!(body["error"]["message"].as_str().unwrap_or_default().contains("'cards'"), "{body}");
    assert!(!body.to_string().contains("4111"), "{body}");
    assert_eq!(balance(&gw, MASK_KEY).await, before);
    assert_eq!(usage(&gw, MASK_KEY).await["total"]["requests"], 2);
    // The mock never saw it.
    let seen: Vec<Value> = client().get(mock.url("/__mock/requests")).send().await.expect("mock").json().await.expect("json");
    assert!(!seen.iter().any(|r| r.to_string().contains("4111")));

    // What they did is in the metrics, the access log and the request log; what they found is
    // in none of them.
    let metrics = admin_metrics(admin, ADMIN_TOKEN).await;
    assert_eq!(metric(&metrics, "tollgate_guardrail_actions_total{guardrail=\"secrets\",phase=\"input\",action=\"mask\"}"), 2.0);
    assert_eq!(metric(&metrics, "tollgate_guardrail_actions_total{guardrail=\"cards\",phase=\"input\",action=\"block\"}"), 1.0);
    assert!(metrics.contains("tollgate_guardrail_seconds_count{guardrail=\"secrets\"}"));
    let log: Value = client()
        .get(format!("http://127.0.0.1:{admin}/admin/requests?guardrail=block"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("log")
        .json()
        .await
        .expect("json");
    let blocked = log["data"].as_array().expect("entries");
    assert_eq!(blocked.len(), 1, "{log}");
    assert_eq!(blocked[0]["guardrail"], "cards:input:block:card");
    assert_eq!(blocked[0]["refusal"], "content_policy_violation");
    assert_eq!(blocked[0]["model"], "alpha-5.5", "a refused call names the model it asked for");
    let all: Value = client()
        .get(format!("http://127.0.0.1:{admin}/admin/requests?limit=500"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("log")
        .json()
        .await
        .expect("json");
    for text in [SECRET, "4111", "1111 1111"] {
        assert!(!all.to_string().contains(text), "request log: {text}");
        assert!(!metrics.contains(text), "metrics: {text}");
    }
}

#[tokio::test]
async fn output_is_blocked_whole_and_as_it_streams_and_billed_for_what_was_produced() {
    let mock = start_mock();
    let admin = free_port();
    let (hook, _task) = hanging_hook().await;
    let gw = start_gateway_env(&config(mock.port, admin, hook), &[("GUARD_HOOK_SECRET", "whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQ=")]);

    // A whole answer is replaced by the error.
    let resp = chat(&gw, OUT_KEY, &format!("[[echo]] the key is {SECRET}"), false).await;
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.expect("json");
    assert_eq!(body["error"]["code"], "content_policy_violation");
    assert!(body["error"]["message"].as_str().unwrap_or_default().contains("answer"), "{body}");

    // A stream ends with the protocol's error chunk; the key split over pieces of 4
    // characters is still found, and none of it reaches the client.
    let resp = chat(&gw, OUT_KEY, &format!("[[echo:4]] the key is {SECRET} and more text after it"), true).await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.expect("body");
    assert!(text.contains("content_policy_violation"), "{text}");
    assert!(!text.contains("AKIA") && !text.contains("EXAMPLE"), "{text}");
    // Both billed for exactly what the upstream reported it produced.
    wait_requests(&gw, OUT_KEY, 2).await;
    let all: Value = client()
        .get(format!("http://127.0.0.1:{admin}/admin/requests?limit=500"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("log")
        .json()
        .await
        .expect("json");
    let records: Vec<&Value> =
        all["data"].as_array().expect("entries").iter().filter(|e| e["key_name"] == "output" && e["route"] == "chat_completions").collect();
    assert_eq!(records.len(), 2, "{records:?}");
    for r in &records {
        assert_eq!(r["estimated"], false, "{r}");
        assert!(r["output_tokens"].as_u64().unwrap_or(0) > 0, "{r}");
        assert_eq!(r["guardrail"], "answers:output:block:aws_key", "{r}");
    }
    // The whole answer's refusal is named as any refusal.
    assert!(records.iter().any(|r| r["status"] == 400 && r["refusal"] == "content_policy_violation"), "{records:?}");
    let log = gw.log();
    assert!(log.contains("guardrail=\"answers:output:block:aws_key\""), "{log}");
    assert!(!log.contains(SECRET) && !log.contains("AKIAIOSF"), "the access log");
}

#[tokio::test]
async fn a_webhook_that_hangs_fails_open_or_closed() {
    let mock = start_mock();
    let admin = free_port();
    let (hook, _task) = hanging_hook().await;
    let gw = start_gateway_env(&config(mock.port, admin, hook), &[("GUARD_HOOK_SECRET", "whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQ=")]);
    let resp = chat(&gw, HOOK_KEY, "[[echo]] hello", false).await;
    assert_eq!(resp.status(), 200, "open: the call goes on");
    assert_eq!(answer_text(resp).await, "hello");
    let resp = chat(&gw, CLOSED_KEY, "[[echo]] hello", false).await;
    assert_eq!(resp.status(), 503, "closed: refused");
    let body: Value = resp.json().await.expect("json");
    assert_eq!(body["error"]["code"], "guardrail_unavailable", "{body}");
    let metrics = admin_metrics(admin, ADMIN_TOKEN).await;
    assert_eq!(metric(&metrics, "tollgate_guardrail_actions_total{guardrail=\"hook-open\",phase=\"input\",action=\"error\"}"), 1.0);
    assert_eq!(metric(&metrics, "tollgate_guardrail_actions_total{guardrail=\"hook-closed\",phase=\"input\",action=\"error\"}"), 1.0);
    // A refused call is not billed.
    assert_eq!(usage(&gw, CLOSED_KEY).await["total"]["requests"], 0);
}

#[test]
fn the_configuration_check_names_a_bad_guardrail_field() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("bad.yaml");
    std::fs::write(&path, "listen: 127.0.0.1:0\nguardrails: [{name: g, kind: pii, action: shout}]\n").expect("write");
    let (code, out) = run_tollgate(&["-t", "-c", path.to_str().expect("path")], &[]);
    assert_ne!(code, 0);
    assert!(out.contains("guardrails[0].action"), "{out}");
}

#[tokio::test]
async fn a_teams_list_set_through_the_admin_api_applies_to_its_keys() {
    let mock = start_mock();
    let admin = free_port();
    let (hook, _task) = hanging_hook().await;
    let gw = start_gateway_env(&config(mock.port, admin, hook), &[("GUARD_HOOK_SECRET", "whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQ=")]);
    let api =
        |method: reqwest::Method, path: &str| client().request(method, format!("http://127.0.0.1:{admin}{path}")).bearer_auth(ADMIN_TOKEN);
    let team = api(reqwest::Method::POST, "/admin/accounts")
        .json(&json!({"name": "payments", "balance": 5, "guardrails": ["cards"]}))
        .send()
        .await
        .expect("team");
    assert_eq!(team.status(), 201);
    assert_eq!(team.json::<Value>().await.expect("json")["guardrails"], json!(["cards"]));
    let made: Value = api(reqwest::Method::POST, "/admin/keys")
        .json(&json!({"name": "payer", "balance": 5, "account": "payments"}))
        .send()
        .await
        .expect("key")
        .json()
        .await
        .expect("json");
    let secret = made["key"].as_str().expect("secret").to_string();
    assert_eq!(chat(&gw, &secret, &format!("card {CARD}"), false).await.status(), 400, "the team's guardrail applies to its key");
    // An undeclared name is refused, naming the field; null clears the list.
    let refused =
        api(reqwest::Method::PATCH, "/admin/accounts/payments").json(&json!({"guardrails": ["nope"]})).send().await.expect("patch");
    assert_eq!(refused.status(), 400);
    assert_eq!(refused.json::<Value>().await.expect("json")["error"]["param"], "guardrails");
    let cleared = api(reqwest::Method::PATCH, "/admin/accounts/payments").json(&json!({"guardrails": null})).send().await.expect("patch");
    assert_eq!(cleared.status(), 200);
    assert_eq!(chat(&gw, &secret, &format!("card {CARD}"), false).await.status(), 200);
}

#[tokio::test]
async fn a_moderation_model_of_the_gateways_own_provider_blocks_or_only_notes() {
    let mock = start_mock();
    let admin = free_port();
    let body = standard_config(mock.port)
        .replace("models: [alpha-5.5, alpha-4o-mini, alpha-embed-3]", "models: [alpha-5.5, alpha-4o-mini, alpha-embed-3, alpha-moderation]")
        .replacen("prices:\n", "prices:\n  alpha-moderation: { input: 0, output: 0 }\n", 1);
    let body = with_key(&body, &format!("{{ key: {MASK_KEY}, name: moderated, group: default, balance: 5.0, guardrails: [violence] }}"));
    let body = with_key(&body, &format!("{{ key: {OUT_KEY}, name: watched, group: default, balance: 5.0, guardrails: [watch] }}"));
    let gw = start_gateway(&format!(
        "{body}admin: {{ listen: 127.0.0.1:{admin}, token: {ADMIN_TOKEN} }}
guardrails:
  - {{ name: violence, kind: moderation, model: alpha-moderation, thresholds: {{ violence: 0.5 }}, on_error: closed }}
  - {{ name: watch, kind: moderation, model: alpha-moderation, action: monitor }}
"
    ));
    // The mock's moderation model flags a text holding [[flag]] (violence 0.97).
    let resp = chat(&gw, MASK_KEY, "[[echo]] [[flag]] something", false).await;
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.expect("json");
    assert_eq!(body["error"]["code"], "content_policy_violation", "{body}");
    assert_eq!(chat(&gw, MASK_KEY, "[[echo]] something calm", false).await.status(), 200);
    // Monitor: the call goes on; what it would have done is counted.
    assert_eq!(chat(&gw, OUT_KEY, "[[echo]] [[flag]] something", false).await.status(), 200);
    let metrics = admin_metrics(admin, ADMIN_TOKEN).await;
    assert_eq!(metric(&metrics, "tollgate_guardrail_actions_total{guardrail=\"violence\",phase=\"input\",action=\"block\"}"), 1.0);
    assert_eq!(metric(&metrics, "tollgate_guardrail_actions_total{guardrail=\"violence\",phase=\"input\",action=\"allow\"}"), 1.0);
    assert_eq!(metric(&metrics, "tollgate_guardrail_actions_total{guardrail=\"watch\",phase=\"input\",action=\"monitor\"}"), 1.0);
    // The moderation call went to the provider with the provider's key.
    let seen: Vec<Value> = client().get(mock.url("/__mock/requests")).send().await.expect("mock").json().await.expect("json");
    let asked = seen.iter().find(|r| r["path"] == "/oa/v1/moderations").expect("moderation asked");
    assert_eq!(asked["headers"]["authorization"][0], format!("Bearer {UPSTREAM_KEY}"));
    // A moderation guardrail names a model a provider serves.
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("bad.yaml");
    std::fs::write(&path, "listen: 127.0.0.1:0\nguardrails: [{name: m, kind: moderation, model: nope}]\n").expect("write");
    let (code, out) = run_tollgate(&["-t", "-c", path.to_str().expect("path")], &[]);
    assert!(code != 0 && out.contains("guardrails[0].model"), "{out}");
}

#[tokio::test]
async fn an_aws_bedrock_guardrail_is_asked_through_the_providers_signature() {
    let mock = start_mock();
    let admin = free_port();
    let bedrock = |name: &str, secret_env: &str| {
        format!(
            "  - {{ name: {name}, protocol: bedrock, region: us-east-1, endpoint_url: \"{}\",\n      aws: {{ access_key_id_env: G_AWS_ID, secret_access_key_env: {secret_env} }},\n      models: [ {{ name: beta-sonnet-4-6, upstream: \"anthropic.claude-sonnet-4-6-v1:0\" }} ] }}\n",
            mock.url(&format!("/{name}"))
        )
    };
    let body = standard_config(mock.port).replacen(
        "providers:\n",
        &format!("providers:\n{}{}", bedrock("br", "G_AWS_SECRET"), bedrock("br-bad", "G_AWS_WRONG")),
        1,
    );
    let body = with_key(&body, &format!("{{ key: {MASK_KEY}, name: aws-in, group: default, balance: 5.0, guardrails: [aws-in] }}"));
    let body = with_key(&body, &format!("{{ key: {OUT_KEY}, name: aws-out, group: default, balance: 5.0, guardrails: [aws-out] }}"));
    let body = with_key(&body, &format!("{{ key: {CLOSED_KEY}, name: aws-bad, group: default, balance: 5.0, guardrails: [aws-bad] }}"));
    let gw = start_gateway_env(
        &format!(
            "{body}admin: {{ listen: 127.0.0.1:{admin}, token: {ADMIN_TOKEN} }}
guardrails:
  - {{ name: aws-in, kind: bedrock, provider: br, guardrail_id: gr-123, guardrail_version: '2', action: mask }}
  - {{ name: aws-out, kind: bedrock, provider: br, guardrail_id: gr-123, guardrail_version: DRAFT, phase: output, price_per_check: 0.002 }}
  - {{ name: aws-bad, kind: bedrock, provider: br-bad, guardrail_id: gr-123, guardrail_version: '2', on_error: closed }}
"
        ),
        &[("G_AWS_ID", "AKIDMOCKTOLLGATE"), ("G_AWS_SECRET", "mock-aws-secret-access-key"), ("G_AWS_WRONG", "not-the-secret")],
    );
    // Bedrock anonymizes the address: the model gets (and echoes) its placeholder.
    let resp = chat(&gw, MASK_KEY, "[[echo]] write to ann@example.com today", false).await;
    assert_eq!(resp.status(), 200);
    let text = answer_text(resp).await;
    assert!(text.contains("{EMAIL}") && !text.contains("ann@example.com"), "{text}");
    // Its content policy blocks: refused before anything is sent, though the guardrail masks.
    let resp = chat(&gw, MASK_KEY, "[[echo]] [[flag]] now", false).await;
    assert_eq!(resp.status(), 400);
    let err: Value = resp.json().await.expect("json");
    assert_eq!(err["error"]["code"], "content_policy_violation", "{err}");
    assert!(err["error"]["message"].as_str().unwrap_or_default().contains("aws-in"), "{err}");
    // On output: the model's answer (echoing the flagged text) replaced by the error.
    let before = balance(&gw, OUT_KEY).await;
    assert_eq!(chat(&gw, OUT_KEY, "[[echo]] calm words", false).await.status(), 200);
    let resp = chat(&gw, OUT_KEY, "[[echo]] [[flag]] words", false).await;
    assert_eq!(resp.status(), 400);
    // As it streams: read in segments by Bedrock; a flagged one never reaches the client, the
    // stream ends with the protocol's error chunk.
    let calm = answer_text(chat(&gw, OUT_KEY, "[[echo:3]] calm words, all of them. And more calm words follow.", true).await).await;
    assert_eq!(calm, "calm words, all of them. And more calm words follow.");
    let cut = chat(&gw, OUT_KEY, "[[echo:3]] calm words first [[flag]] then more", true).await.text().await.expect("body");
    assert!(!cut.contains("flag") && !cut.contains("calm"), "the held segment is dropped whole: {cut}");
    assert!(cut.contains("content_policy_violation") && cut.contains("aws-out"), "{cut}");
    // An output guardrail's price is billed with each call whose answer it read, blocked or not.
    let u = wait_requests(&gw, OUT_KEY, 4).await;
    let spent = before - balance(&gw, OUT_KEY).await;
    assert!(spent > 4 * 2_000_000, "four checks at 0.002 USD and the tokens: {spent}");
    assert_eq!(nanos(&u["total"]["cost"]), spent);
    // A signature Bedrock refuses: the guardrail cannot check, and fails closed.
    assert_eq!(chat(&gw, CLOSED_KEY, "hello", false).await.status(), 503);

    let seen: Vec<Value> = client().get(mock.url("/__mock/requests")).send().await.expect("mock").json().await.expect("json");
    let applied: Vec<&Value> = seen.iter().filter(|r| r["path"].as_str().is_some_and(|p| p.ends_with("/apply"))).collect();
    assert!(applied.iter().any(|r| r["path"] == "/br/guardrail/gr-123/version/2/apply"), "{applied:?}");
    assert!(applied.iter().any(|r| r["path"] == "/br/guardrail/gr-123/version/DRAFT/apply"), "{applied:?}");
    let auth = applied[0]["headers"]["authorization"][0].as_str().unwrap_or_default();
    assert!(
        auth.starts_with("AWS4-HMAC-SHA256 Credential=AKIDMOCKTOLLGATE/") && auth.contains("/us-east-1/bedrock/aws4_request"),
        "{auth}"
    );
    // The model was asked five times: the masked call and the four whose answers were read;
    // the flagged input and the call no guardrail could check were never sent.
    assert_eq!(seen.iter().filter(|r| r["path"] == "/oa/v1/chat/completions").count(), 5);
    let metrics = admin_metrics(admin, ADMIN_TOKEN).await;
    assert_eq!(metric(&metrics, "tollgate_guardrail_actions_total{guardrail=\"aws-in\",phase=\"input\",action=\"mask\"}"), 1.0);
    assert_eq!(metric(&metrics, "tollgate_guardrail_actions_total{guardrail=\"aws-in\",phase=\"input\",action=\"block\"}"), 1.0);
    assert_eq!(metric(&metrics, "tollgate_guardrail_actions_total{guardrail=\"aws-out\",phase=\"output\",action=\"block\"}"), 2.0);
    assert_eq!(metric(&metrics, "tollgate_guardrail_actions_total{guardrail=\"aws-bad\",phase=\"input\",action=\"error\"}"), 1.0);
}

#[tokio::test]
async fn a_video_tasks_prompt_is_masked_and_its_check_charged_with_the_task() {
    let mock = start_mock();
    let admin = free_port();
    let (hook, _task) = hanging_hook().await;
    let body = format!("{}{}", config(mock.port, admin, hook), video_section(mock.port));
    let gw = start_gateway_env(&body, &[("GUARD_HOOK_SECRET", "whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQ=")]);
    let task = |key: &'static str, prompt: String| {
        let url = gw.url("/v1/videos");
        async move {
            let r =
                client().post(url).bearer_auth(key).json(&json!({"model": "genq3-pro", "prompt": prompt})).send().await.expect("create");
            assert_eq!(r.status(), 200);
        }
    };
    let (guarded, plain) = (balance(&gw, MASK_KEY).await, balance(&gw, CLIENT_KEY).await);
    task(MASK_KEY, format!("a cat guarding {SECRET}")).await;
    task(CLIENT_KEY, "a cat guarding nothing".to_string()).await;
    // The same task, and the guardrail's 0.001 USD check charged with it.
    let spent_guarded = guarded - balance(&gw, MASK_KEY).await;
    let spent_plain = plain - balance(&gw, CLIENT_KEY).await;
    assert!(spent_plain > 0);
    assert_eq!(spent_guarded - spent_plain, 1_000_000);
    let calls: Vec<Value> = client().get(mock.url("/__mock/tc_calls")).send().await.expect("calls").json().await.expect("json");
    let prompts: Vec<&str> = calls.iter().filter_map(|c| c["payload"]["Prompt"].as_str()).collect();
    assert!(prompts.contains(&"a cat guarding [AWS_KEY_1]"), "{prompts:?}");
    assert!(!prompts.iter().any(|p| p.contains(SECRET)), "{prompts:?}");
}

#[tokio::test]
async fn a_whole_answer_read_for_the_guardrails_is_held_against_the_process_budget() {
    let mock = start_mock();
    let admin = free_port();
    let (hook, _task) = hanging_hook().await;
    let body = format!("max_body_bytes: 65536\nmax_buffered_body_bytes: 65536\n{}", config(mock.port, admin, hook));
    let gw = start_gateway_env(&body, &[("GUARD_HOOK_SECRET", "whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQ=")]);
    let ask = |deltas: u32| {
        client()
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(OUT_KEY)
            .header("x-mock-deltas", deltas.to_string())
            .json(&json!({"model": "alpha-5.5", "messages": [{"role": "user", "content": "hello"}]}))
            .send()
    };
    // About 80 KB of answer: more than the budget of bytes held for clients.
    let resp = ask(16_000).await.expect("chat");
    assert_eq!(resp.status(), 503);
    assert!(resp.headers().get("retry-after").is_some());
    // Billed for what the upstream produced, as a cut answer is.
    let u = wait_requests(&gw, OUT_KEY, 1).await;
    assert_eq!(u["total"]["output_tokens"], 16_000, "{u}");
    // What it held was given back: an answer within the budget goes through.
    assert_eq!(ask(3).await.expect("chat").status(), 200);
}
