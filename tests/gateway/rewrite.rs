//! Rewrite rules (`providers[].rewrite`, `groups.<g>.rewrite`) seen at the mock: headers set
//! and removed, body paths set, defaulted and removed, the model renamed upstream and named
//! back to the client; a Bedrock provider's rewritten body still signed as sent (the mock
//! checks SigV4); a group's rules before the hold; the ids in the access log; `-t` refusing a
//! provider rule on what a call is held by; `--explain-rewrite`.

use crate::common::*;
use serde_json::{json, Value};

const ADMIN: &str = "admin-token-rewrite-0001";
const GROUP_KEY: &str = "sk-client-rewrite-grp1";
const SONNET: &str = "anthropic.claude-sonnet-4-6-v1:0";

fn config(mock: u16, admin: u16) -> String {
    format!(
        r#"
providers:
  - name: oa
    protocol: openai
    base_url: "http://127.0.0.1:{mock}/oa"
    api_key: {UPSTREAM_KEY}
    models: [alpha-5.5, alpha-4o-mini]
    rewrite:
      - {{ id: effort, when: {{ model: "alpha-5*", route: chat_completions }}, default: {{ reasoning_effort: medium }}, set_header: {{ x-team: blue }} }}
      - {{ id: dated, when: {{ model: alpha-5.5, header: {{ x-pin: "*" }} }}, rename_model: alpha-5.5-2026-01-01, remove: [user, "metadata.trace"] }}
  - name: br
    protocol: bedrock
    region: us-east-1
    endpoint_url: "http://127.0.0.1:{mock}/east"
    aws: {{ access_key_id_env: T_AWS_ID, secret_access_key_env: T_AWS_SECRET }}
    models: [{{ name: beta-sonnet-4-6, upstream: "{SONNET}" }}]
    rewrite:
      - {{ id: no-betas, remove_header: [anthropic-beta], remove: [anthropic_beta], set: {{ "metadata.user_id": tollgate }}, default: {{ temperature: 0.3 }} }}
groups:
  default: {{ platforms: [openai, anthropic] }}
  capped:
    platforms: [openai]
    rewrite:
      - {{ id: cap, when: {{ route: chat_completions }}, set: {{ max_tokens: 50 }} }}
      - {{ id: mini, when: {{ model: alpha-5.5 }}, rename_model: alpha-4o-mini, set_header: {{ x-from: capped }} }}
admin: {{ listen: 127.0.0.1:{admin}, token: {ADMIN} }}
{prices}keys:
  - {{ key: {CLIENT_KEY}, name: tester, group: default, balance: 5.0 }}
  - {{ key: {GROUP_KEY}, name: grouped, group: capped, balance: 5.0 }}
"#,
        prices = prices_section()
    )
}

fn start() -> (Proc, Gateway) {
    let mock = start_mock();
    let gw = start_gateway_env(
        &config(mock.port, free_port()),
        &[("T_AWS_ID", "AKIDMOCKTOLLGATE"), ("T_AWS_SECRET", "mock-aws-secret-access-key")],
    );
    (mock, gw)
}

async fn chat(gw: &Gateway, key: &str, tag: &str, body: Value, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut req = client().post(gw.url("/v1/chat/completions")).bearer_auth(key).header("x-test-tag", tag).header("x-mock-keep-body", "1");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let r = req.json(&body).send().await.expect("send");
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// The one request the mock saw with `tag`: its headers (lower-case names) and its body.
async fn seen(mock: &Proc, tag: &str) -> (Value, Value) {
    let all = mock_requests(mock, tag).await;
    assert_eq!(all.len(), 1, "{tag}: {all:?}");
    let body = all[0]["body"].as_str().map(|b| serde_json::from_str(b).expect("json body")).unwrap_or(Value::Null);
    (all[0]["headers"].clone(), body)
}

fn header<'a>(headers: &'a Value, name: &str) -> Option<&'a str> {
    let (_, v) = headers.as_object()?.iter().find(|(k, _)| k.eq_ignore_ascii_case(name))?;
    v.as_str().or_else(|| v.get(0).and_then(Value::as_str))
}

#[tokio::test]
async fn a_providers_rules_edit_what_it_is_sent_and_never_what_the_client_sees() {
    let (mock, gw) = start();
    // The first rule: a default effort and a header; the client's own effort is kept.
    let (status, answer) =
        chat(&gw, CLIENT_KEY, "effort", json!({"model": "alpha-5.5", "messages": [{"role": "user", "content": "hi"}], "user": "u1"}), &[])
            .await;
    assert_eq!(status, 200, "{answer}");
    let (headers, body) = seen(&mock, "effort").await;
    assert_eq!((body["reasoning_effort"].as_str(), header(&headers, "x-team")), (Some("medium"), Some("blue")), "{body} {headers}");
    assert_eq!(body["user"], "u1", "the second rule does not apply without x-pin");
    let (_, body) = {
        chat(&gw, CLIENT_KEY, "own", json!({"model": "alpha-5.5", "reasoning_effort": "high", "messages": []}), &[]).await;
        seen(&mock, "own").await
    };
    assert_eq!(body["reasoning_effort"], "high", "a default leaves the client's value");
    // The second: the model renamed upstream, named back to the client; paths removed.
    let pinned = json!({"model": "alpha-5.5", "messages": [], "user": "u1", "metadata": {"trace": "t", "keep": "k"}});
    let (status, answer) = chat(&gw, CLIENT_KEY, "pin", pinned, &[("x-pin", "yes")]).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["model"], "alpha-5.5", "the client's name: {answer}");
    let (_, body) = seen(&mock, "pin").await;
    assert_eq!(body["model"], "alpha-5.5-2026-01-01");
    assert!(body.get("user").is_none() && body["metadata"] == json!({"keep": "k"}), "{body}");
    // Both rules' ids in the access log.
    let log = gw.log();
    assert!(log.contains(r#"rewrites="effort,dated""#), "{log}");
    // Not a chat completion of alpha-5*: no rule.
    let r = client()
        .post(gw.url("/v1/embeddings"))
        .bearer_auth(CLIENT_KEY)
        .header("x-test-tag", "emb")
        .json(&json!({"model": "alpha-4o-mini", "input": "x"}))
        .send()
        .await
        .expect("send");
    let _ = r.status();
    let seen_emb = mock_requests(&mock, "emb").await;
    assert!(seen_emb.iter().all(|r| header(&r["headers"], "x-team").is_none()), "{seen_emb:?}");
}

#[tokio::test]
async fn a_bedrock_providers_rewritten_body_is_the_one_signed() {
    let (mock, gw) = start();
    let r = client()
        .post(gw.url("/v1/messages"))
        .header("x-api-key", CLIENT_KEY)
        .header("anthropic-version", "2023-06-01")
        .header("anthropic-beta", "context-1m-2025-08-07")
        .header("x-test-tag", "br")
        .json(&json!({"model": "beta-sonnet-4-6", "max_tokens": 64, "anthropic_beta": ["context-1m-2025-08-07"], "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("send");
    // The mock recomputes the signature over the body it got: a 200 says it was the one signed.
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap_or_default());
    let (headers, body) = seen(&mock, "br").await;
    assert!(header(&headers, "anthropic-beta").is_none(), "{headers}");
    assert!(body.get("anthropic_beta").is_none(), "{body}");
    assert_eq!((body["metadata"]["user_id"].as_str(), body["temperature"].as_f64()), (Some("tollgate"), Some(0.3)), "{body}");
    assert_eq!(body["anthropic_version"], "bedrock-2023-05-31", "the kind's own fields stay");
}

#[tokio::test]
async fn a_groups_rules_run_before_the_hold_and_rename_the_model_billed() {
    let (mock, gw) = start();
    let (status, answer) =
        chat(&gw, GROUP_KEY, "grp", json!({"model": "alpha-5.5", "max_tokens": 4000, "messages": []}), &[("x-mock-usage", "20,5")]).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["model"], "alpha-4o-mini", "the group's rename is the model called: {answer}");
    let all = mock_requests(&mock, "grp").await;
    assert_eq!((all[0]["model"].as_str(), all[0]["max_output"].as_u64()), (Some("alpha-4o-mini"), Some(50)), "{all:?}");
    assert_eq!(header(&all[0]["headers"], "x-from"), Some("capped"));
    // Billed at the model called, and held for 50 output tokens (the balance a call of 4000
    // at alpha-5.5 would not have fit is beside the point: the record says what was used).
    let usage = wait_requests(&gw, GROUP_KEY, 1).await;
    assert_eq!(nanos(&usage["total"]["cost"]), cost_nanos("alpha-4o-mini", 20, 5), "{usage}");
    let log = gw.log();
    assert!(log.contains(r#"rewrites="cap,mini""#), "{log}");
}

#[test]
fn the_check_refuses_a_provider_rule_on_what_a_call_is_held_by_and_explains_the_rules() {
    let dir = tempfile::tempdir().expect("dir");
    let write = |text: &str| {
        let path = dir.path().join("t.yaml");
        std::fs::write(&path, format!("listen: 127.0.0.1:1\ndata_dir: {}\n{text}", dir.path().display())).expect("write");
        path.display().to_string()
    };
    let good = write(&config(9, 10));
    let env = [("T_AWS_ID", "AKIDMOCKTOLLGATE"), ("T_AWS_SECRET", "mock-aws-secret-access-key")];
    let (code, out) = run_tollgate(&["-t", "-c", &good], &env);
    assert_eq!(code, 0, "{out}");
    let (code, out) = run_tollgate(&["-c", &good, "-t", "--explain-rewrite", "br"], &env);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("rule no-betas: applies (always)"), "{out}");
    assert!(out.contains("removed header anthropic-beta") && out.contains("removed anthropic_beta"), "{out}");
    assert!(out.contains(&format!("model sent: {SONNET}")), "{out}");
    let body = out.lines().find_map(|l| l.strip_prefix("body sent: ")).expect("body line");
    let body: Value = serde_json::from_str(body).expect("json");
    assert_eq!((body["temperature"].as_f64(), body["metadata"]["user_id"].as_str()), (Some(0.3), Some("tollgate")), "{out}");
    let (code, out) = run_tollgate(&["-c", &good, "-t", "--explain-rewrite", "oa"], &env);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("rule effort: applies (when model alpha-5*, route chat_completions)"), "{out}");
    assert!(out.contains("rule dated: does not apply to this sample (when model alpha-5.5, header x-pin: *)"), "{out}");
    let (code, out) = run_tollgate(&["-c", &good, "-t", "--explain-rewrite", "nope"], &env);
    assert_eq!(code, 2);
    assert!(out.contains("no provider 'nope'"), "{out}");
    // A provider rule on the output maximum: refused, pointing to a group's rules.
    let bad = write(&config(9, 10).replace("default: { reasoning_effort: medium }", "set: { max_tokens: 10 }"));
    let (code, out) = run_tollgate(&["-t", "-c", &bad], &env);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("providers.oa.rewrite[0].set: 'max_tokens': the call is held for it; set it in a group's rewrite"), "{out}");
    let bad = write(&config(9, 10).replace("remove: [user, \"metadata.trace\"]", "remove: [stream_options]"));
    let (code, out) = run_tollgate(&["-t", "-c", &bad], &env);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("'stream_options': tollgate meters the call by it"), "{out}");
}
