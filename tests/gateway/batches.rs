//! `/v1/batches` on one node against the mock's batch API: a batch checked line by line,
//! charged its worst case at the batch price, submitted with the provider's key, polled to its
//! end, its output and errors made the key's files, and settled line by line from the output's
//! usage; a cancelled batch refunded what was not done; a bad input file refused naming its
//! line; another key's batch unreachable.

use crate::common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const OTHER_KEY: &str = "sk-client-batch-other-01";
const STRICT_KEY: &str = "sk-client-batch-strict-1";
const POOR_KEY: &str = "sk-client-batch-poor-001";

fn config(mock: u16) -> String {
    let body = standard_config(mock) + "limits: { batch_poll_secs: 1 }\n";
    let body = with_key(&body, &format!("{{ key: {OTHER_KEY}, name: other, group: default, balance: 5.0 }}"));
    let body = with_key(
        &body,
        &format!("{{ key: {STRICT_KEY}, name: strict, group: default, balance: 5.0, models: {{ allow: [alpha-4o-mini] }} }}"),
    );
    with_key(&body, &format!("{{ key: {POOR_KEY}, name: poor, group: default, balance: 0.000001 }}"))
}

fn line(id: &str, body: Value) -> String {
    json!({"custom_id": id, "method": "POST", "url": "/v1/chat/completions", "body": body}).to_string()
}

async fn upload(gw: &Gateway, key: &str, lines: &[String]) -> String {
    let bytes = (lines.join("\n") + "\n").into_bytes();
    let (ct, body) = form(&[("purpose", "batch")], &[("file", "input.jsonl", "application/jsonl", bytes)]);
    let r = client().post(gw.url("/v1/files")).bearer_auth(key).header("content-type", ct).body(body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    r.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_string()
}

async fn create(gw: &Gateway, key: &str, file: &str, metadata: Value) -> reqwest::Response {
    let body = json!({"input_file_id": file, "endpoint": "/v1/chat/completions", "completion_window": "24h", "metadata": metadata});
    client().post(gw.url("/v1/batches")).bearer_auth(key).json(&body).send().await.unwrap()
}

async fn get(gw: &Gateway, key: &str, path: &str) -> reqwest::Response {
    client().get(gw.url(path)).bearer_auth(key).send().await.unwrap()
}

/// Read the batch until its status is `status` (the gateway asks the provider once a second).
async fn until(gw: &Gateway, id: &str, status: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let b: Value = get(gw, CLIENT_KEY, &format!("/v1/batches/{id}")).await.json().await.unwrap();
        if b["status"] == status {
            return b;
        }
        assert!(Instant::now() < deadline, "batch never reached {status}: {b}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The cost of an output file's answers at alpha-5.5's batch prices (half of $2 and $8 per 1M).
fn batch_cost(output: &str) -> (i64, usize) {
    let mut cost = 0;
    let mut n = 0;
    for l in output.lines() {
        let v: Value = serde_json::from_str(l).unwrap();
        let u = &v["response"]["body"]["usage"];
        cost += u["prompt_tokens"].as_i64().unwrap() * 1000 + u["completion_tokens"].as_i64().unwrap() * 4000;
        n += 1;
    }
    (cost, n)
}

#[tokio::test]
async fn a_batch_is_charged_its_worst_case_runs_upstream_and_is_settled_line_by_line_at_the_batch_price() {
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port));
    let before = balance(&gw, CLIENT_KEY).await;
    let lines = [
        line("one", json!({"model": "alpha-5.5", "messages": [{"role": "user", "content": "hello"}]})),
        line("two", json!({"model": "alpha-5.5", "messages": [{"role": "user", "content": "fails"}], "mock_fail": true})),
        line("three", json!({"model": "alpha-5.5", "messages": [{"role": "user", "content": "short"}], "max_tokens": 5})),
    ];
    let file = upload(&gw, CLIENT_KEY, &lines).await;
    let r = create(&gw, CLIENT_KEY, &file, json!({"job": "eval"})).await;
    assert_eq!(r.status(), 200);
    let batch: Value = r.json().await.unwrap();
    let id = batch["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("batch_"), "{batch}");
    assert_eq!((batch["object"].as_str(), batch["input_file_id"].as_str()), (Some("batch"), Some(file.as_str())));
    assert_eq!(batch["request_counts"]["total"], 3);
    assert_eq!(batch["metadata"]["job"], "eval");
    // Charged its worst case when accepted.
    let held = before - balance(&gw, CLIENT_KEY).await;
    assert!(held > 0, "nothing was charged");

    // Sent upstream with the provider's key, every line with an output maximum.
    let recorded: Vec<Value> = client().get(mock.url("/__mock/requests")).send().await.unwrap().json().await.unwrap();
    let upload_up = recorded.iter().find(|r| r["path"] == "/oa/v1/files").expect("the input went upstream");
    assert_eq!(upload_up["headers"]["authorization"][0], format!("Bearer {UPSTREAM_KEY}"));
    assert!(!upload_up.to_string().contains(CLIENT_KEY), "the client's key never goes upstream");
    let sent = upload_up["body"].as_str().unwrap();
    assert_eq!(sent.matches("\"max_completion_tokens\"").count(), 2, "the lines that named no maximum get one: {sent}");
    assert!(recorded.iter().any(|r| r["path"] == "/oa/v1/batches" && r["method"] == "POST"));

    let done = until(&gw, &id, "completed").await;
    assert_eq!(done["request_counts"], json!({"total": 3, "completed": 2, "failed": 1}));
    let out_id = done["output_file_id"].as_str().expect("output file").to_string();
    let err_id = done["error_file_id"].as_str().expect("error file").to_string();
    let output = get(&gw, CLIENT_KEY, &format!("/v1/files/{out_id}/content")).await.text().await.unwrap();
    let errors = get(&gw, CLIENT_KEY, &format!("/v1/files/{err_id}/content")).await.text().await.unwrap();
    assert_eq!(errors.lines().count(), 1);
    assert!(errors.contains("\"custom_id\":\"two\""), "{errors}");
    let (cost, answered) = batch_cost(&output);
    assert_eq!(answered, 2);
    assert!(output.contains("\"completion_tokens\":5"), "the named maximum held upstream: {output}");
    assert!(cost < held);
    // Settled: exactly what the answers cost at the batch price, the rest of the hold given back.
    assert_eq!(before - balance(&gw, CLIENT_KEY).await, cost);
    let usage = usage(&gw, CLIENT_KEY).await;
    assert_eq!(nanos(&usage["total"]["cost"]), cost, "{usage}");
    let tokens = |name: &str| {
        output.lines().map(|l| serde_json::from_str::<Value>(l).unwrap()["response"]["body"]["usage"][name].as_u64().unwrap()).sum::<u64>()
    };
    assert_eq!(usage["total"]["input_tokens"].as_u64(), Some(tokens("prompt_tokens")), "{usage}");
    assert_eq!(usage["total"]["output_tokens"].as_u64(), Some(tokens("completion_tokens")), "{usage}");
    // The usage report shows batch work as its own route: its charge and its settlement.
    let by_route: Value = get(&gw, CLIENT_KEY, "/v1/usage?group_by=route").await.json().await.unwrap();
    let rows = by_route["routes"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{by_route}");
    assert_eq!((rows[0]["route"].as_str(), rows[0]["requests"].as_u64()), (Some("batch"), Some(1)), "one request: {by_route}");
    assert_eq!(nanos(&rows[0]["cost"]), cost);
    // The files are the key's: listed among its files.
    let files: Value = get(&gw, CLIENT_KEY, "/v1/files").await.json().await.unwrap();
    assert!(files["data"].as_array().unwrap().iter().any(|f| f["id"] == out_id.as_str() && f["purpose"] == "batch_output"));

    // Another key sees none of it.
    assert_eq!(get(&gw, OTHER_KEY, &format!("/v1/batches/{id}")).await.status(), 404);
    assert_eq!(get(&gw, OTHER_KEY, &format!("/v1/files/{out_id}/content")).await.status(), 404);
    let theirs: Value = get(&gw, OTHER_KEY, "/v1/batches").await.json().await.unwrap();
    assert_eq!(theirs["data"].as_array().unwrap().len(), 0);
    let r = client().post(gw.url(&format!("/v1/batches/{id}/cancel"))).bearer_auth(OTHER_KEY).send().await.unwrap();
    assert_eq!(r.status(), 404);
    let mine: Value = get(&gw, CLIENT_KEY, "/v1/batches").await.json().await.unwrap();
    assert_eq!(mine["data"][0]["id"], id.as_str());
    // An ended batch cannot be cancelled.
    let r = client().post(gw.url(&format!("/v1/batches/{id}/cancel"))).bearer_auth(CLIENT_KEY).send().await.unwrap();
    assert_eq!(r.status(), 409);
}

#[tokio::test]
async fn a_cancelled_or_expired_batch_is_billed_for_what_was_done_and_refunded_the_rest() {
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port));
    let before = balance(&gw, CLIENT_KEY).await;
    let lines: Vec<String> =
        (0..4).map(|i| line(&format!("r{i}"), json!({"model": "alpha-5.5", "messages": [{"role": "user", "content": "x"}]}))).collect();
    let file = upload(&gw, CLIENT_KEY, &lines).await;
    let batch: Value = create(&gw, CLIENT_KEY, &file, json!({"mock_seconds": "600"})).await.json().await.unwrap();
    let id = batch["id"].as_str().unwrap();
    let r = client().post(gw.url(&format!("/v1/batches/{id}/cancel"))).bearer_auth(CLIENT_KEY).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["status"], "cancelling");
    let done = until(&gw, id, "cancelled").await;
    assert_eq!(done["request_counts"]["completed"], 2);
    let output =
        get(&gw, CLIENT_KEY, &format!("/v1/files/{}/content", done["output_file_id"].as_str().unwrap())).await.text().await.unwrap();
    let (cost, answered) = batch_cost(&output);
    assert_eq!(answered, 2, "half of the lines were done before the cancel");
    assert_eq!(before - balance(&gw, CLIENT_KEY).await, cost);
    // An expired batch alike: what was done is billed, the rest refunded.
    let before = balance(&gw, CLIENT_KEY).await;
    let batch: Value = create(&gw, CLIENT_KEY, &file, json!({"mock_expire": "true"})).await.json().await.unwrap();
    let done = until(&gw, batch["id"].as_str().unwrap(), "expired").await;
    let output =
        get(&gw, CLIENT_KEY, &format!("/v1/files/{}/content", done["output_file_id"].as_str().unwrap())).await.text().await.unwrap();
    let (cost, answered) = batch_cost(&output);
    assert_eq!(answered, 2);
    assert_eq!(before - balance(&gw, CLIENT_KEY).await, cost);
}

#[tokio::test]
async fn a_bad_input_file_is_refused_naming_its_line_and_nothing_is_charged_or_sent() {
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port));
    let ok = line("a", json!({"model": "alpha-5.5", "messages": []}));
    let cases: Vec<(String, &str, &str)> = vec![
        (line("b", json!({"model": "alpha-4o-mini", "messages": []})), CLIENT_KEY, "line 2: body.model"),
        (line("a", json!({"model": "alpha-5.5", "messages": []})), CLIENT_KEY, "line 2: custom_id"),
        (
            json!({"custom_id": "b", "method": "POST", "url": "/v1/embeddings", "body": {"model": "alpha-5.5"}}).to_string(),
            CLIENT_KEY,
            "line 2: url",
        ),
        (line("b", json!({"model": "alpha-5.5", "messages": [], "stream": true})), CLIENT_KEY, "line 2: body.stream"),
        (line("b", json!({"model": "alpha-5.5", "messages": [], "max_tokens": 1u64 << 40})), CLIENT_KEY, "line 2: body.max_tokens"),
        ("{not json".to_string(), CLIENT_KEY, "line 2: "),
        (line("b", json!({"model": "alpha-5.5", "messages": []})), STRICT_KEY, "line 1: body.model"),
    ];
    for (second, key, param) in cases {
        let before = balance(&gw, key).await;
        let file = upload(&gw, key, &[ok.clone(), second.clone()]).await;
        let r = create(&gw, key, &file, Value::Null).await;
        assert_eq!(r.status(), 400, "{second}");
        let e: Value = r.json().await.unwrap();
        assert_eq!(e["error"]["param"], param, "{second}: {e}");
        assert_eq!(balance(&gw, key).await, before, "{second}: nothing charged");
    }
    // Other refusals name their field.
    let file = upload(&gw, CLIENT_KEY, std::slice::from_ref(&ok)).await;
    for (body, param) in [
        (json!({"input_file_id": file, "endpoint": "/v1/chat/completions", "completion_window": "1h"}), "completion_window"),
        (json!({"input_file_id": file, "endpoint": "/v1/images/generations", "completion_window": "24h"}), "endpoint"),
        (json!({"input_file_id": "file-nope", "endpoint": "/v1/chat/completions", "completion_window": "24h"}), "input_file_id"),
    ] {
        let r = client().post(gw.url("/v1/batches")).bearer_auth(CLIENT_KEY).json(&body).send().await.unwrap();
        assert!(r.status().is_client_error(), "{body}");
        assert_eq!(r.json::<Value>().await.unwrap()["error"]["param"], param, "{body}");
    }
    // A key that cannot cover the worst case is refused before anything is sent.
    let file = upload(&gw, POOR_KEY, std::slice::from_ref(&ok)).await;
    let r = create(&gw, POOR_KEY, &file, Value::Null).await;
    assert_eq!(r.status(), 402);
    let listed: Value = get(&gw, CLIENT_KEY, "/v1/batches").await.json().await.unwrap();
    assert_eq!(listed["data"].as_array().unwrap().len(), 0);
    let recorded: Vec<Value> = client().get(mock.url("/__mock/requests")).send().await.unwrap().json().await.unwrap();
    assert!(!recorded.iter().any(|r| r["path"].as_str().is_some_and(|p| p.contains("/batches") || p.contains("/files"))));
}

async fn create_at(gw: &Gateway, key: &str, file: &str, endpoint: &str) -> reqwest::Response {
    let body = json!({"input_file_id": file, "endpoint": endpoint, "completion_window": "24h"});
    client().post(gw.url("/v1/batches")).bearer_auth(key).json(&body).send().await.unwrap()
}

#[tokio::test]
async fn a_line_is_held_for_the_images_and_files_it_references_as_the_same_body_alone_would_be() {
    // 2,000 input tokens held per image (billing.image_input_tokens' default), 100,000 per file:
    // the worst case counted a line at one token per three bytes, images and files nothing.
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port));
    let image = json!({"type": "image_url", "image_url": {"url": "https://example.com/cat.png", "detail": "high"}});
    let mut content = vec![json!({"type": "text", "text": "what is this?"})];
    content.extend(std::iter::repeat_n(image, 10));
    content.push(json!({"type": "file", "file": {"file_id": "file-abc"}}));
    let body = json!({"model": "alpha-5.5", "messages": [{"role": "user", "content": content}], "max_tokens": 1});
    let before = balance(&gw, CLIENT_KEY).await;
    let file = upload(&gw, CLIENT_KEY, &[line("pics", body.clone())]).await;
    let r = create(&gw, CLIENT_KEY, &file, Value::Null).await;
    assert_eq!(r.status(), 200);
    let held = before - balance(&gw, CLIENT_KEY).await;
    // alpha-5.5 at the batch prices: $1 per 1M input (1,000 nano-USD a token), $4 output.
    let input = (body.to_string().len() as i64 + 2) / 3 + 10 * 2_000 + 100_000;
    assert_eq!(held, input * 1_000 + 4_000, "held as the same body sent alone");
}

#[tokio::test]
async fn a_line_continues_only_the_keys_own_stored_response_and_is_held_for_it() {
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port));
    let respond = |key: &'static str| {
        let gw = &gw;
        async move {
            let r = client()
                .post(gw.url("/v1/responses"))
                .bearer_auth(key)
                .json(&json!({"model": "alpha-5.5", "input": "remember this", "store": true}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let v: Value = r.json().await.unwrap();
            let u = &v["usage"];
            (v["id"].as_str().unwrap().to_string(), u["input_tokens"].as_i64().unwrap() + u["output_tokens"].as_i64().unwrap())
        }
    };
    let (victims, _) = respond(OTHER_KEY).await;
    let (mine, context) = respond(CLIENT_KEY).await;
    let continuing = |id: &str| {
        json!({"custom_id": "c", "method": "POST", "url": "/v1/responses",
               "body": {"model": "alpha-5.5", "input": "and then?", "previous_response_id": id, "max_output_tokens": 16}})
        .to_string()
    };
    // Another key's response: refused, naming the line; nothing charged, nothing sent.
    let before = balance(&gw, CLIENT_KEY).await;
    let file = upload(&gw, CLIENT_KEY, &[continuing(&victims)]).await;
    let r = create_at(&gw, CLIENT_KEY, &file, "/v1/responses").await;
    assert_eq!(r.status(), 400);
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["param"], "line 1: body.previous_response_id");
    assert_eq!(balance(&gw, CLIENT_KEY).await, before);
    let recorded: Vec<Value> = client().get(mock.url("/__mock/requests")).send().await.unwrap().json().await.unwrap();
    assert!(!recorded.iter().any(|r| r["path"].as_str().is_some_and(|p| p.contains("/batches"))));
    // A stored conversation object: refused (tollgate cannot tell whose it is).
    let conv = json!({"custom_id": "c", "method": "POST", "url": "/v1/responses",
                      "body": {"model": "alpha-5.5", "input": "hi", "conversation": "conv_someone", "max_output_tokens": 16}});
    let file = upload(&gw, CLIENT_KEY, &[conv.to_string()]).await;
    let r = create_at(&gw, CLIENT_KEY, &file, "/v1/responses").await;
    assert_eq!(r.json::<Value>().await.unwrap()["error"]["param"], "line 1: body.conversation");
    // Its own: accepted, and held for the conversation it continues as well.
    let own = continuing(&mine);
    let body_len = serde_json::from_str::<Value>(&own).unwrap()["body"].to_string().len() as i64;
    let file = upload(&gw, CLIENT_KEY, &[own]).await;
    let before = balance(&gw, CLIENT_KEY).await;
    let r = create_at(&gw, CLIENT_KEY, &file, "/v1/responses").await;
    assert_eq!(r.status(), 200);
    let held = before - balance(&gw, CLIENT_KEY).await;
    let input = (body_len + 2) / 3 + context;
    assert_eq!(held, input * 1_000 + 16 * 4_000);
}

#[tokio::test]
async fn a_key_holds_at_most_its_share_of_open_batches() {
    // Batches are polled once an hour here: every one created stays open.
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port).replace("limits: { batch_poll_secs: 1 }", "limits: { batch_poll_secs: 3600 }"));
    let file = upload(&gw, CLIENT_KEY, &[line("a", json!({"model": "alpha-5.5", "messages": [], "max_tokens": 1}))]).await;
    for i in 0..tollgate::batch::MAX_OPEN_BATCHES_PER_KEY {
        assert_eq!(create(&gw, CLIENT_KEY, &file, Value::Null).await.status(), 200, "batch {i}");
    }
    let before = balance(&gw, CLIENT_KEY).await;
    let refused = create(&gw, CLIENT_KEY, &file, Value::Null).await;
    assert_eq!(refused.status(), 429);
    assert!(refused.headers().contains_key("retry-after"));
    assert_eq!(balance(&gw, CLIENT_KEY).await, before, "nothing charged");
    // Another key is not held up by it.
    let theirs = upload(&gw, OTHER_KEY, &[line("a", json!({"model": "alpha-5.5", "messages": [], "max_tokens": 1}))]).await;
    assert_eq!(create(&gw, OTHER_KEY, &theirs, Value::Null).await.status(), 200);
}

/// A process's peak resident memory (VmHWM), in KiB.
fn peak_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok()).unwrap()
}

#[tokio::test]
async fn a_batch_of_a_large_input_file_is_checked_and_sent_without_holding_it_in_memory() {
    // 10 MiB of input, 20,000 lines: read, checked, written again and sent from disk — the
    // gateway's peak memory grows by far less than the file (it held it twice before).
    const RICH_KEY: &str = "sk-client-batch-rich-001";
    let mock = start_mock();
    let gw = start_gateway(&with_key(&config(mock.port), &format!("{{ key: {RICH_KEY}, name: rich, group: default, balance: 100.0 }}")));
    let pad = "p".repeat(400);
    let lines: Vec<String> = (0..20_000)
        .map(|i| line(&format!("r{i}"), json!({"model": "alpha-5.5", "messages": [{"role": "user", "content": pad}], "max_tokens": 1})))
        .collect();
    let file = upload(&gw, RICH_KEY, &lines).await;
    // Warm the path once with a small batch.
    let small = upload(&gw, RICH_KEY, &lines[..10]).await;
    assert_eq!(create(&gw, RICH_KEY, &small, Value::Null).await.status(), 200);
    let pid = gw.proc.child.id();
    let before = peak_kib(pid);
    let r = create(&gw, RICH_KEY, &file, Value::Null).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["request_counts"]["total"], 20_000);
    let grown = peak_kib(pid).saturating_sub(before);
    println!("gateway peak memory grew {grown} KiB for a batch of a 10 MiB input file");
    assert!(grown < 6 << 10, "peak memory grew {grown} KiB");
    let recorded: Vec<Value> = client().get(mock.url("/__mock/requests")).send().await.unwrap().json().await.unwrap();
    let sent = recorded.iter().rev().find(|r| r["path"] == "/oa/v1/files").expect("the input went upstream");
    assert!(sent["body"].as_str().unwrap().matches("\"custom_id\"").count() == 20_000);
}

#[tokio::test]
async fn a_line_a_guardrail_blocks_is_in_the_error_file_and_not_charged_and_a_masked_one_goes_masked() {
    let mock = start_mock();
    let body = config(mock.port).replace(
        "  default: { platforms: [openai, anthropic, gemini, video] }\n",
        "  default: { platforms: [openai, anthropic, gemini, video], guardrails: [cards, secrets] }\n",
    ) + "guardrails:\n  - { name: cards, kind: pii, recognisers: [card], action: block }\n  - { name: secrets, kind: secrets, action: mask }\n";
    let gw = start_gateway(&body);
    let before = balance(&gw, CLIENT_KEY).await;
    let lines = [
        line("one", json!({"model": "alpha-5.5", "messages": [{"role": "user", "content": "hello"}]})),
        line("card", json!({"model": "alpha-5.5", "messages": [{"role": "user", "content": "pay with 4111 1111 1111 1111"}]})),
        line("key", json!({"model": "alpha-5.5", "messages": [{"role": "user", "content": "key AKIAIOSFODNN7EXAMPLE"}]})),
    ];
    let file = upload(&gw, CLIENT_KEY, &lines).await;
    let r = create(&gw, CLIENT_KEY, &file, json!({})).await;
    assert_eq!(r.status(), 200);
    let batch: Value = r.json().await.unwrap();
    assert_eq!(batch["request_counts"], json!({"total": 3, "completed": 0, "failed": 1}), "the blocked line failed at once: {batch}");
    // The provider got two lines: the card never, the key masked.
    let recorded: Vec<Value> = client().get(mock.url("/__mock/requests")).send().await.unwrap().json().await.unwrap();
    let sent =
        recorded.iter().find(|r| r["path"] == "/oa/v1/files").expect("the input went upstream")["body"].as_str().unwrap().to_string();
    assert_eq!(sent.lines().filter(|l| l.starts_with('{')).count(), 2, "{sent}");
    assert!(!sent.contains("4111") && !sent.contains("AKIAIOSF") && sent.contains("[AWS_KEY_1]"), "{sent}");

    let done = until(&gw, batch["id"].as_str().unwrap(), "completed").await;
    assert_eq!(done["request_counts"], json!({"total": 3, "completed": 2, "failed": 1}), "{done}");
    let err_id = done["error_file_id"].as_str().expect("error file");
    let errors = get(&gw, CLIENT_KEY, &format!("/v1/files/{err_id}/content")).await.text().await.unwrap();
    assert_eq!(errors.lines().count(), 1, "{errors}");
    let blocked: Value = serde_json::from_str(errors.lines().next().unwrap()).unwrap();
    assert_eq!((blocked["custom_id"].as_str(), blocked["error"]["code"].as_str()), (Some("card"), Some("content_policy_violation")));
    assert!(!errors.contains("4111"), "{errors}");
    // Charged for the two answered lines only.
    let output =
        get(&gw, CLIENT_KEY, &format!("/v1/files/{}/content", done["output_file_id"].as_str().unwrap())).await.text().await.unwrap();
    let (cost, answered) = batch_cost(&output);
    assert_eq!(answered, 2);
    assert_eq!(before - balance(&gw, CLIENT_KEY).await, cost);
}
