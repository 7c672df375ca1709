//! Cloud upstreams through the real daemon, against `tollgate-mock` checking what the clouds
//! check: Bedrock's SigV4 signature recomputed from each request and its date against the
//! service's clock, its event-stream frames; Vertex AI's token from a service account's
//! RS256 assertion verified with the account's public key; Azure OpenAI's deployment and v1
//! URLs with `api-key` or an Entra ID token. Billing, failover, aliasing and errors as for the
//! native protocols.

use crate::common::*;
use serde_json::{json, Value};
use std::time::Duration;

const KEY: &str = "sk-cloud-test-0001";
const ADMIN: &str = "admin-token-cloud-0001";
const AWS_ID: &str = "AKIDMOCKTOLLGATE";
const AWS_SECRET: &str = "mock-aws-secret-access-key";
const SONNET: &str = "anthropic.claude-sonnet-4-6-v1:0";
const FAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

fn aws_env(secret: &str) -> Vec<(&'static str, String)> {
    vec![("T_AWS_ID", AWS_ID.into()), ("T_AWS_SECRET", secret.into()), ("T_AWS_TOKEN", "session-token-xyz".into())]
}

/// A gateway config: `providers` (YAML list items), every test model priced, one key.
fn config(providers: &str, admin_port: u16) -> String {
    format!(
        "providers:\n{providers}groups:\n  default: {{ platforms: [openai, anthropic, gemini], translate: true }}\n{}keys:\n  - {{ key: {KEY}, name: cloud, group: default, balance: 5.0 }}\nadmin: {{ listen: 127.0.0.1:{admin_port}, token: {ADMIN} }}\n",
        prices_section()
    )
}

fn bedrock_provider(name: &str, mock: &Proc, prefix: &str, priority: u32) -> String {
    format!(
        "  - {{ name: {name}, protocol: bedrock, region: us-east-1, endpoint_url: \"{}\", priority: {priority},\n      aws: {{ access_key_id_env: T_AWS_ID, secret_access_key_env: T_AWS_SECRET, session_token_env: T_AWS_TOKEN }},\n      models: [ {{ name: beta-sonnet-4-6, upstream: \"{SONNET}\" }} ] }}\n",
        mock.url(prefix)
    )
}

fn start(providers: &str, env: &[(&'static str, String)]) -> (Gateway, u16) {
    let admin_port = free_port();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    (start_gateway_env(&config(providers, admin_port), &env), admin_port)
}

async fn messages(gw: &Gateway, model: &str, stream: bool, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut req = client()
        .post(gw.url("/v1/messages"))
        .header("x-api-key", KEY)
        .header("anthropic-version", "2023-06-01")
        .json(&json!({"model": model, "max_tokens": 64, "stream": stream, "messages": [{"role": "user", "content": "hello"}]}));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

/// The `data:` JSON of each SSE event, with its `event:` name.
fn sse_events(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter_map(|block| {
            let name = block.lines().find_map(|l| l.strip_prefix("event: ")).unwrap_or_default().to_string();
            let data = block.lines().find_map(|l| l.strip_prefix("data: "))?;
            Some((name, serde_json::from_str(data).ok()?))
        })
        .collect()
}

async fn all_requests(mock: &Proc) -> Vec<Value> {
    client().get(mock.url("/__mock/requests")).send().await.unwrap().json().await.unwrap()
}

#[tokio::test]
async fn bedrock_relays_messages_signed_whole_and_streamed_under_the_clients_model_name_and_bills_them() {
    let mock = start_mock();
    let (gw, admin) = start(&bedrock_provider("br", &mock, "/east", 0), &aws_env(AWS_SECRET));

    let whole = messages(&gw, "beta-sonnet-4-6", false, &[("x-mock-usage", "40,7"), ("x-test-tag", "whole")]).await;
    assert_eq!(whole.status(), 200);
    // Renamed, it keeps an exact length (not chunked).
    let length = whole.headers().get("content-length").map(|v| v.to_str().unwrap().to_string());
    assert!(whole.headers().get("transfer-encoding").is_none(), "{:?}", whole.headers());
    let raw = whole.bytes().await.unwrap();
    assert_eq!(length, Some(raw.len().to_string()));
    let body: Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(body["model"], "beta-sonnet-4-6", "the client's name, not Bedrock's: {body}");
    assert_eq!(body["usage"], json!({"input_tokens": 40, "output_tokens": 7}));
    assert_eq!(body["content"][0]["text"], "Hello from the");

    let streamed = messages(&gw, "beta-sonnet-4-6", true, &[("x-mock-usage", "30,5"), ("x-test-tag", "stream")]).await;
    assert_eq!(streamed.status(), 200);
    assert_eq!(streamed.headers()["content-type"], "text/event-stream");
    let events = sse_events(&streamed.text().await.unwrap());
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"message_start"), "{names:?}");
    assert_eq!(names.last(), Some(&"message_stop"), "{names:?}");
    assert!(names.contains(&"content_block_delta"), "{names:?}");
    assert_eq!(events[0].1["message"]["model"], "beta-sonnet-4-6");
    for (name, data) in &events {
        assert_eq!(data["type"], name.as_str(), "each event is the JSON Bedrock framed: {data}");
    }

    // Both billed from Bedrock's own counts.
    let usage = wait_requests(&gw, KEY, 2).await;
    assert_eq!(nanos(&usage["balance"]), 5_000_000_000 - cost_nanos("beta-sonnet-4-6", 40, 7) - cost_nanos("beta-sonnet-4-6", 30, 5));

    // What Bedrock got: the model in the path, its own body, a SigV4 signature (verified by the
    // mock, which refuses a wrong one) with the session token, and no client key.
    let seen = all_requests(&mock).await;
    let paths: Vec<&str> = seen.iter().map(|r| r["path"].as_str().unwrap()).collect();
    assert_eq!(
        paths,
        [
            "/east/model/anthropic.claude-sonnet-4-6-v1%3A0/invoke",
            "/east/model/anthropic.claude-sonnet-4-6-v1%3A0/invoke-with-response-stream"
        ]
    );
    for r in &seen {
        let sent: Value = serde_json::from_str(r["body"].as_str().unwrap()).unwrap();
        assert_eq!(sent["anthropic_version"], "bedrock-2023-05-31");
        assert!(sent.get("model").is_none() && sent.get("stream").is_none(), "{sent}");
        assert_eq!(sent["max_tokens"], 64);
        let auth = r["headers"]["authorization"][0].as_str().unwrap();
        assert!(
            auth.starts_with(&format!("AWS4-HMAC-SHA256 Credential={AWS_ID}/")) && auth.contains("/us-east-1/bedrock/aws4_request"),
            "{auth}"
        );
        assert!(auth.contains("x-amz-security-token"), "{auth}");
        assert!(!r["headers"].to_string().contains(KEY), "the client's key reached Bedrock: {}", r["headers"]);
    }

    // The request log and the metrics name Bedrock's model and system.
    let log = gw.log();
    assert!(log.contains(&format!("upstream_model=\"{SONNET}\"")), "{log}");
    let metrics = admin_metrics(admin, ADMIN).await;
    assert!(metrics.contains("gen_ai_provider_name=\"aws.bedrock\""), "{metrics}");
    let page = client().get(format!("http://127.0.0.1:{admin}/admin/requests?limit=5")).bearer_auth(ADMIN).send().await.unwrap();
    let text = page.text().await.unwrap();
    assert!(text.contains(SONNET), "the request log keeps the upstream's name too: {text}");
}

#[tokio::test]
async fn other_protocols_reach_bedrock_through_translation() {
    let mock = start_mock();
    let (gw, _) = start(&bedrock_provider("br", &mock, "", 0), &aws_env(AWS_SECRET));
    let resp = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(KEY)
        .header("x-mock-usage", "12,3")
        .json(&json!({"model": "beta-sonnet-4-6", "stream": true, "stream_options": {"include_usage": true},
                      "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(text.contains("chat.completion.chunk") && text.contains("Hello") && text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert!(text.contains(r#""prompt_tokens":12"#), "{text}");
    let gemini = client()
        .post(gw.url("/v1beta/models/beta-sonnet-4-6:generateContent"))
        .header("x-goog-api-key", KEY)
        .json(&json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(gemini.status(), 200);
    let g: Value = gemini.json().await.unwrap();
    assert_eq!(g["candidates"][0]["content"]["parts"][0]["text"], "Hello from the", "{g}");
    // Token counting is not a Bedrock endpoint: a clear refusal, nothing sent.
    let count = client()
        .post(gw.url("/v1/messages/count_tokens"))
        .header("x-api-key", KEY)
        .json(&json!({"model": "beta-sonnet-4-6", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(count.status(), 400);
    let e: Value = count.json().await.unwrap();
    assert!(e["error"]["message"].as_str().unwrap().contains("(bedrock) that do not offer this endpoint"), "{e}");
    assert_eq!(all_requests(&mock).await.len(), 2);
}

#[tokio::test]
async fn bedrock_errors_reach_the_client_in_its_shape_and_a_throttled_region_fails_over() {
    let mock = start_mock();
    let providers = format!("{}{}", bedrock_provider("east", &mock, "/east", 0), bedrock_provider("west", &mock, "/west", 0));
    let (gw, _) = start(&providers, &aws_env(AWS_SECRET));

    // East throttles: every request is answered by west (retried before the first byte).
    for i in 0..4 {
        let tag = format!("fo{i}");
        let r = messages(&gw, "beta-sonnet-4-6", true, &[("x-mock-only", "/east"), ("x-mock-status", "429"), ("x-test-tag", &tag)]).await;
        assert_eq!(r.status(), 200, "request {i}");
        assert!(r.text().await.unwrap().contains("message_stop"));
        let seen = mock_requests(&mock, &tag).await;
        assert_eq!(seen.last().unwrap()["path"].as_str().unwrap().split('/').nth(1), Some("west"), "{seen:?}");
    }

    // A validation error is the client's: its status and message, in the messages shape.
    let r = messages(&gw, "beta-sonnet-4-6", false, &[("x-mock-status", "400")]).await;
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["type"], "error");
    assert_eq!(e["error"]["message"], "mock says 400", "{e}");
    // Throttled everywhere: 429 with Retry-After.
    let r = messages(&gw, "beta-sonnet-4-6", false, &[("x-mock-status", "429")]).await;
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));

    // An exception inside the stream ends it with the protocol's error event; what came is billed.
    let before = balance(&gw, KEY).await;
    let r = messages(&gw, "beta-sonnet-4-6", true, &[("x-mock-bedrock-exception", "4"), ("x-mock-usage", "50,9")]).await;
    assert_eq!(r.status(), 200);
    let events = sse_events(&r.text().await.unwrap());
    let (last_name, last) = events.last().unwrap();
    assert_eq!(last_name, "error", "{events:?}");
    assert_eq!(last["error"]["type"], "api_error");
    assert!(last["error"]["message"].as_str().unwrap().contains("model stream failed"), "{last}");
    assert!(!events.iter().any(|(n, _)| n == "message_stop"));
    let after = wait_for_balance_below(&gw, before).await;
    assert!(before - after >= cost_nanos("beta-sonnet-4-6", 50, 0), "the input Bedrock counted is billed: {}", before - after);

    // A stream cut by the upstream is billed too, and the client's connection ends.
    let before = balance(&gw, KEY).await;
    let r = messages(&gw, "beta-sonnet-4-6", true, &[("x-mock-cut-after", "3"), ("x-mock-only", "/east,/west")]).await;
    assert!(r.text().await.is_err(), "a cut stream is not ended cleanly");
    assert!(wait_for_balance_below(&gw, before).await < before);
}

async fn wait_for_balance_below(gw: &Gateway, before: i64) -> i64 {
    for _ in 0..200 {
        let now = balance(gw, KEY).await;
        if now < before {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("nothing was billed");
}

#[tokio::test]
async fn a_wrong_aws_secret_is_the_operators_problem_and_a_skewed_clock_is_corrected() {
    let mock = start_mock();
    // This host's clock is an hour behind AWS's (the gateway runs under libfaketime): the first
    // signature is refused as expired, the answer's Date corrects the clock, the request is
    // signed again and served.
    assert!(
        std::path::Path::new(FAKETIME).exists(),
        "libfaketime is needed ({FAKETIME}, Debian package faketime; tests/run_all.sh installs it)"
    );
    let mut env = aws_env(AWS_SECRET);
    env.extend([
        ("LD_PRELOAD", FAKETIME.to_string()),
        ("FAKETIME", "-3600".to_string()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_string()),
    ]);
    let (gw, _) = start(&bedrock_provider("br", &mock, "", 0), &env);
    let r = messages(&gw, "beta-sonnet-4-6", false, &[("x-test-tag", "skew")]).await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    assert_eq!(mock_requests(&mock, "skew").await.len(), 2, "one refused, one re-dated");
    let r = messages(&gw, "beta-sonnet-4-6", false, &[("x-test-tag", "skew2")]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(mock_requests(&mock, "skew2").await.len(), 1, "dated right from then on");
    assert!(
        gw.log().contains("clock is 3600 s off the service's") || gw.log().contains("clock is 3599 s off the service's"),
        "{}",
        gw.log()
    );

    let (wrong, _) = start(&bedrock_provider("br", &mock, "", 0), &aws_env("not-the-secret"));
    let r = messages(&wrong, "beta-sonnet-4-6", false, &[]).await;
    assert_eq!(r.status(), 502);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "upstream_auth_failed", "{e}");
}

/// The fixture service account with its token endpoint at the mock.
fn service_account(mock: &Proc, dir: &std::path::Path) -> std::path::PathBuf {
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("conf/demo/vertex-sa.json");
    let mut sa: Value = serde_json::from_slice(&std::fs::read(fixture).unwrap()).unwrap();
    sa["token_uri"] = json!(mock.url("/token"));
    let path = dir.join("sa.json");
    std::fs::write(&path, sa.to_string()).unwrap();
    path
}

fn public_key() -> String {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("conf/demo/vertex-sa.pub.pem").display().to_string()
}

async fn token_requests(mock: &Proc) -> Vec<Value> {
    client().get(mock.url("/__mock/tokens")).send().await.unwrap().json().await.unwrap()
}

#[tokio::test]
async fn vertex_serves_gemini_and_claude_with_a_service_account_token_refreshed_and_failing_closed() {
    let mock = start_mock_with(&["--key", UPSTREAM_KEY, "--google-public-key", &public_key(), "--token-lifetime-secs", "2"]);
    let dir = tempfile::tempdir().unwrap();
    let sa = service_account(&mock, dir.path());
    let provider = format!(
        "  - {{ name: vx, protocol: vertex, project: proj-1, location: us-east5, credentials_file: \"{}\", base_url: \"{}\",\n      models: [gamma-3.5-flash, {{ name: beta-opus-4-7, upstream: \"claude-opus-4-7@20260101\" }}] }}\n",
        sa.display(),
        mock.url("")
    );
    let (gw, admin) = start(&provider, &[]);

    let gen = client()
        .post(gw.url("/v1beta/models/gamma-3.5-flash:streamGenerateContent?alt=sse"))
        .header("x-goog-api-key", KEY)
        .header("x-mock-usage", "20,4")
        .json(&json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(gen.status(), 200);
    assert!(gen.text().await.unwrap().contains("usageMetadata"));
    let claude = messages(&gw, "beta-opus-4-7", true, &[("x-mock-usage", "15,6")]).await;
    assert_eq!(claude.status(), 200);
    let events = sse_events(&claude.text().await.unwrap());
    assert_eq!(events[0].1["message"]["model"], "beta-opus-4-7");
    assert_eq!(events.last().unwrap().0, "message_stop");
    let usage = wait_requests(&gw, KEY, 2).await;
    assert_eq!(nanos(&usage["balance"]), 5_000_000_000 - cost_nanos("gamma-3.5-flash", 20, 4) - cost_nanos("beta-opus-4-7", 15, 6));

    let seen = all_requests(&mock).await;
    assert_eq!(seen[0]["path"], "/v1/projects/proj-1/locations/us-east5/publishers/google/models/gamma-3.5-flash:streamGenerateContent");
    assert_eq!(seen[0]["query"], "alt=sse");
    assert_eq!(
        seen[1]["path"],
        "/v1/projects/proj-1/locations/us-east5/publishers/anthropic/models/claude-opus-4-7@20260101:streamRawPredict"
    );
    let sent: Value = serde_json::from_str(seen[1]["body"].as_str().unwrap()).unwrap();
    assert_eq!(sent["anthropic_version"], "vertex-2023-10-16");
    assert!(sent.get("model").is_none());
    for r in &seen {
        assert_eq!(r["headers"]["authorization"][0], "Bearer ya29.mock-1", "one token for both: {r}");
    }
    let tokens = token_requests(&mock).await;
    assert_eq!(tokens.len(), 1, "{tokens:?}");
    assert_eq!(tokens[0]["ok"], true, "the assertion verified with the account's public key: {tokens:?}");

    // The token lives 2 s: once it has expired, the next request signs in again.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert_eq!(messages(&gw, "beta-opus-4-7", false, &[]).await.status(), 200);
    assert_eq!(token_requests(&mock).await.len(), 2);
    assert_eq!(all_requests(&mock).await.last().unwrap()["headers"]["authorization"][0], "Bearer ya29.mock-2");

    // The token endpoint fails: requests are refused 503, clearly, and the next ones at once
    // without calling the failing endpoint again.
    client().post(mock.url("/__mock/token_fail?n=100")).send().await.unwrap();
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let r = messages(&gw, "beta-opus-4-7", false, &[]).await;
    assert_eq!(r.status(), 503);
    let e: Value = r.json().await.unwrap();
    assert!(e["error"]["message"].as_str().unwrap().contains("could not sign in to the upstream service"), "{e}");
    assert_eq!(token_requests(&mock).await.len(), 3);
    assert_eq!(messages(&gw, "beta-opus-4-7", false, &[]).await.status(), 503);
    assert_eq!(token_requests(&mock).await.len(), 3, "no second call to a failing endpoint within the pause");
    assert!(!gw.log().contains("BEGIN PRIVATE KEY"));
    let metrics = admin_metrics(admin, ADMIN).await;
    assert!(metrics.contains("gen_ai_provider_name=\"gcp.vertex_ai\""), "{metrics}");
}

#[tokio::test]
async fn azure_openai_takes_deployment_urls_with_a_key_and_the_v1_api_with_an_entra_token() {
    let mock = start_mock();
    let providers = format!(
        "  - {{ name: az-dep, protocol: azure-openai, base_url: \"{}\", api_version: 2024-10-21, api_key: {UPSTREAM_KEY},\n      models: [{{ name: alpha-5.5, upstream: dep-gpt }}, {{ name: alpha-embed-3, upstream: dep-embed }}] }}\n  - {{ name: az-v1, protocol: azure-openai, base_url: \"{}\",\n      entra: {{ tenant_id: tenant-1, client_id: client-1, client_secret_env: T_AZ_SECRET, authority_host: \"{}\" }},\n      models: [{{ name: alpha-4o-mini, upstream: v1-gpt }}] }}\n",
        mock.url("/dep"),
        mock.url("/v1x"),
        mock.url("/login")
    );
    let (gw, admin) = start(&providers, &[("T_AZ_SECRET", "mock-entra-client-secret".to_string())]);
    let chat = |model: &'static str| {
        client()
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(KEY)
            .header("x-mock-usage", "11,2")
            .json(&json!({"model": model, "stream": true, "messages": [{"role": "user", "content": "hi"}]}))
            .send()
    };
    let r = chat("alpha-5.5").await.unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.contains(r#""model":"alpha-5.5""#) && !text.contains("dep-gpt"), "{text}");
    let r = client()
        .post(gw.url("/v1/embeddings"))
        .bearer_auth(KEY)
        .json(&json!({"model": "alpha-embed-3", "input": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = chat("alpha-4o-mini").await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains(r#""model":"alpha-4o-mini""#));

    let seen = all_requests(&mock).await;
    assert_eq!(
        (seen[0]["path"].as_str(), seen[0]["query"].as_str()),
        (Some("/dep/openai/deployments/dep-gpt/chat/completions"), Some("api-version=2024-10-21"))
    );
    assert_eq!(seen[0]["headers"]["api-key"][0], UPSTREAM_KEY);
    assert!(seen[0]["headers"].get("authorization").is_none());
    assert_eq!(seen[1]["path"], "/dep/openai/deployments/dep-embed/embeddings");
    assert_eq!(seen[2]["path"], "/v1x/openai/v1/chat/completions");
    assert_eq!(seen[2]["model"], "v1-gpt", "the v1 API takes the deployment in the body");
    assert_eq!(seen[2]["headers"]["authorization"][0], "Bearer entra-mock-1");
    assert!(seen[2]["headers"].get("api-key").is_none());
    let tokens = token_requests(&mock).await;
    assert_eq!(tokens.len(), 1);
    assert_eq!((tokens[0]["path"].as_str(), tokens[0]["ok"].as_bool()), (Some("/login/tenant-1/oauth2/v2.0/token"), Some(true)));
    let metrics = admin_metrics(admin, ADMIN).await;
    assert!(metrics.contains("gen_ai_provider_name=\"az.ai.openai\""), "{metrics}");
}

#[test]
fn check_mode_checks_cloud_settings_without_calling_out() {
    let dir = tempfile::tempdir().unwrap();
    let write = |body: &str| {
        let path = dir.path().join("t.yaml");
        std::fs::write(&path, format!("listen: 127.0.0.1:1\n{}", config(body, 2))).unwrap();
        path.display().to_string()
    };
    let bedrock = write("  - { name: br, protocol: bedrock, region: us-west-2, aws: { access_key_id_env: T_AWS_ID, secret_access_key_env: T_AWS_SECRET }, models: [beta-sonnet-4-6] }\n");
    let (code, out) = run_tollgate(&["-t", "-c", &bedrock], &[("T_AWS_ID", AWS_ID), ("T_AWS_SECRET", AWS_SECRET)]);
    assert_eq!(code, 0, "{out}");
    let (code, out) = run_tollgate(&["-t", "-c", &bedrock], &[("T_AWS_ID", AWS_ID)]);
    assert_ne!(code, 0);
    assert!(out.contains("aws.secret_access_key_env: environment variable T_AWS_SECRET is not set"), "{out}");
    assert!(!out.contains(AWS_ID) || out.contains("is not set"), "{out}");
    let vertex = write("  - { name: vx, protocol: vertex, project: p, location: us-east5, credentials_file: /nonexistent/sa.json, models: [gamma-3.5-flash] }\n");
    let (code, out) = run_tollgate(&["-t", "-c", &vertex], &[]);
    assert_ne!(code, 0);
    assert!(out.contains("credentials_file: /nonexistent/sa.json (from credentials_file): cannot read it"), "{out}");
    let azure = write(
        "  - { name: az, protocol: azure-openai, base_url: \"https://r.openai.azure.com\", api_key_env: T_AZ_KEY, models: [alpha-5.5] }\n",
    );
    let (code, out) = run_tollgate(&["-t", "-c", &azure], &[]);
    assert_ne!(code, 0);
    assert!(out.contains("api_key_env: environment variable T_AZ_KEY is not set"), "{out}");
}

#[tokio::test]
async fn concurrent_holds_on_a_bedrock_provider_never_overdraw_a_key() {
    let mock = start_mock();
    let admin_port = free_port();
    let body = config(&bedrock_provider("br", &mock, "", 0), admin_port)
        .replace("keys:\n", "keys:\n  - { key: sk-cloud-small-0001, name: small, group: default, balance: 0.001 }\n");
    let env: Vec<(&str, String)> = aws_env(AWS_SECRET);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let gw = start_gateway_env(&body, &env);
    // Each holds its input estimate and 20 output tokens (~$0.0004): two fit in $0.001, not three.
    let send = |i: usize| {
        client()
            .post(gw.url("/v1/messages"))
            .header("x-api-key", "sk-cloud-small-0001")
            .header("x-mock-hold", format!("small-{i}"))
            .header("x-mock-usage", "10,5")
            .json(&json!({"model": "beta-sonnet-4-6", "max_tokens": 20, "stream": true, "messages": [{"role": "user", "content": "hi"}]}))
            .send()
    };
    let answers = futures_util::future::join_all((0..5).map(send)).await;
    let statuses: Vec<u16> = answers.iter().map(|r| r.as_ref().unwrap().status().as_u16()).collect();
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 2, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == 402).count(), 3, "{statuses:?}");
    for i in 0..5 {
        client().post(mock.url(&format!("/__mock/release?token=small-{i}"))).send().await.unwrap();
    }
    for r in answers.into_iter().flatten().filter(|r| r.status() == 200) {
        assert!(r.text().await.unwrap().contains("message_stop"));
    }
    let usage = wait_requests(&gw, "sk-cloud-small-0001", 2).await;
    assert_eq!(nanos(&usage["balance"]), 1_000_000 - 2 * cost_nanos("beta-sonnet-4-6", 10, 5), "{usage}");
}

#[tokio::test]
async fn other_bedrock_models_go_through_converse_for_every_client_protocol_and_are_billed_from_its_usage() {
    let mock = start_mock();
    let llama = "us.meta.llama4-maverick-17b-instruct-v1:0";
    let provider = format!(
        "  - {{ name: br, protocol: bedrock, region: us-east-1, endpoint_url: \"{}\",\n      aws: {{ access_key_id_env: T_AWS_ID, secret_access_key_env: T_AWS_SECRET }},\n      models: [ {{ name: delta-llama-4, upstream: \"{llama}\" }} ] }}\n",
        mock.url("")
    );
    let admin_port = free_port();
    let body = config(&provider, admin_port).replace("prices:\n", "prices:\n  delta-llama-4: { input: 1.0, output: 2.0 }\n");
    let env = aws_env(AWS_SECRET);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let gw = start_gateway_env(&body, &env);
    // USD 1 and 2 per million tokens: 1,000 and 2,000 nano-USD a token.
    let cost = |i: i64, o: i64| i * 1000 + o * 2000;

    // A messages client, streamed: Converse's frames become the messages events.
    let r = messages(&gw, "delta-llama-4", true, &[("x-mock-usage", "21,6")]).await;
    assert_eq!(r.status(), 200);
    let events = sse_events(&r.text().await.unwrap());
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"message_start"));
    assert_eq!(&names[names.len() - 2..], ["message_delta", "message_stop"], "{names:?}");
    assert_eq!(events[0].1["message"]["model"], "delta-llama-4");
    let text: String = events.iter().filter_map(|(_, d)| d.pointer("/delta/text").and_then(Value::as_str)).collect();
    assert_eq!(text, "Hello from the");
    assert_eq!(events[names.len() - 2].1["usage"]["input_tokens"], 21);
    // Whole, and a chat-completions client asking for a tool call.
    let r = messages(&gw, "delta-llama-4", false, &[("x-mock-usage", "8,3")]).await;
    let whole: Value = r.json().await.unwrap();
    assert_eq!(whole["content"][0]["text"], "Hello from the", "{whole}");
    assert_eq!(whole["usage"]["input_tokens"], 8);
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(KEY)
        .header("x-mock-tool-calls", "1")
        .header("x-mock-usage", "30,9")
        .json(&json!({"model": "delta-llama-4", "stream": true, "stream_options": {"include_usage": true},
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
            "messages": [{"role": "user", "content": "weather?"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    assert!(text.contains(r#""name":"get_weather""#) && text.contains(r#""finish_reason":"tool_calls""#), "{text}");
    assert!(text.contains(r#""prompt_tokens":30"#), "{text}");
    let usage = wait_requests(&gw, KEY, 3).await;
    assert_eq!(nanos(&usage["balance"]), 5_000_000_000 - cost(21, 6) - cost(8, 3) - cost(30, 9), "{usage}");

    let seen = all_requests(&mock).await;
    let paths: Vec<&str> = seen.iter().map(|r| r["path"].as_str().unwrap()).collect();
    assert_eq!(paths[0], "/model/us.meta.llama4-maverick-17b-instruct-v1%3A0/converse-stream");
    assert_eq!(paths[1], "/model/us.meta.llama4-maverick-17b-instruct-v1%3A0/converse");
    let sent: Value = serde_json::from_str(seen[2]["body"].as_str().unwrap()).unwrap();
    assert_eq!(sent["toolConfig"]["tools"][0]["toolSpec"]["name"], "get_weather", "{sent}");
    assert!(sent.get("anthropic_version").is_none() && sent.get("model").is_none());
    assert!(sent["inferenceConfig"]["maxTokens"].as_u64().is_some(), "the output maximum held is sent: {sent}");

    // An image by URL cannot go to Converse: a clear 400, nothing sent.
    let r = client()
        .post(gw.url("/v1/messages"))
        .header("x-api-key", KEY)
        .json(&json!({"model": "delta-llama-4", "max_tokens": 10, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.unwrap();
    assert!(e["error"]["message"].as_str().unwrap().contains("base64"), "{e}");
    assert_eq!(all_requests(&mock).await.len(), 3);
}

/// A token close to expiring is refreshed in the background: the requests that see it go on
/// with the current token (a refresh that fails fails none of them), once however many they are.
#[tokio::test]
async fn a_vertex_token_is_refreshed_in_the_background_once_before_it_expires() {
    // Lifetime 4 s: refreshed from 2 s on, used until 3.6 s.
    let mock = start_mock_with(&["--key", UPSTREAM_KEY, "--google-public-key", &public_key(), "--token-lifetime-secs", "4"]);
    let dir = tempfile::tempdir().unwrap();
    let sa = service_account(&mock, dir.path());
    let provider = format!(
        "  - {{ name: vx, protocol: vertex, project: p, location: us-east5, credentials_file: \"{}\", base_url: \"{}\", models: [{{ name: beta-opus-4-7, upstream: \"claude-opus-4-7@1\" }}] }}\n",
        sa.display(),
        mock.url("")
    );
    let (gw, _) = start(&provider, &[]);
    assert_eq!(messages(&gw, "beta-opus-4-7", false, &[]).await.status(), 200);
    assert_eq!(token_requests(&mock).await.len(), 1);
    // In the refresh window, with the token endpoint failing: a request that waited for the
    // refresh would fail; these go on with the current token.
    client().post(mock.url("/__mock/token_fail?n=1")).send().await.unwrap();
    tokio::time::sleep(Duration::from_millis(2300)).await;
    let tags: Vec<String> = (0..6).map(|i| format!("refresh-{i}")).collect();
    let gw_ref = &gw;
    let answers = futures_util::future::join_all(
        tags.iter().map(|t| async move { messages(gw_ref, "beta-opus-4-7", false, &[("x-test-tag", t.as_str())]).await }),
    )
    .await;
    assert!(answers.iter().all(|r| r.status() == 200), "{:?}", answers.iter().map(|r| r.status()).collect::<Vec<_>>());
    for t in &tags {
        assert_eq!(mock_requests(&mock, t).await[0]["headers"]["authorization"][0], "Bearer ya29.mock-1");
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while token_requests(&mock).await.len() < 2 {
        assert!(std::time::Instant::now() < deadline, "no background refresh");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(messages(&gw, "beta-opus-4-7", false, &[]).await.status(), 200);
    assert_eq!(
        token_requests(&mock).await.len(),
        2,
        "one refresh for all the requests that saw the old token, none again during the pause"
    );
}
