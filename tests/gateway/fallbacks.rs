//! Fallbacks across models (`routing.fallbacks`, a body's `models`, `x-tollgate-fallbacks`):
//! before the first byte a call that its model cannot take goes on to the next — skipped
//! without a call when its `context_window` cannot hold the input, else on the upstream's own
//! error in a class the chain falls back on (`x-mock-error`, `x-mock-status`, scoped to one
//! model with `x-mock-only-model`) — held at the dearest candidate, billed at the one that served.

use crate::common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const ADMIN: &str = "admin-token-fallbacks-01";
const SMALL_KEY: &str = "sk-client-small-0001";
const RULED_KEY: &str = "sk-client-ruled-0001";

/// `alpha-5.5` (window 200 tokens) falls back to `alpha-4o-mini`, then to `beta-sonnet-4-6`
/// (another protocol: reached through translation though the group does not translate);
/// `beta-opus-4-7` falls back to `alpha-5.5` on a rate limit only.
fn config(mock: u16, admin: u16, extra: &str) -> String {
    format!(
        r#"
providers:
  - {{ name: oa, protocol: openai, base_url: "http://127.0.0.1:{mock}/oa", api_key: {UPSTREAM_KEY}, models: [alpha-5.5, alpha-4o-mini] }}
  - {{ name: an, protocol: anthropic, base_url: "http://127.0.0.1:{mock}/an", api_key: {UPSTREAM_KEY}, models: [beta-opus-4-7, beta-sonnet-4-6] }}
  - {{ name: ge, protocol: gemini, base_url: "http://127.0.0.1:{mock}/ge", api_key: {UPSTREAM_KEY}, models: [gamma-3.5-flash] }}
groups:
  default: {{ platforms: [openai, anthropic, gemini] }}
routing:
  fallbacks:
    alpha-5.5: {{ to: [alpha-4o-mini, beta-sonnet-4-6] }}
    beta-opus-4-7: {{ to: [alpha-5.5], on: [rate_limited] }}
{extra}admin: {{ listen: 127.0.0.1:{admin}, token: {ADMIN} }}
prices:
  alpha-5.5: {{ input: 2.0, output: 8.0, context_window: 200 }}
  alpha-4o-mini: {{ input: 0.15, output: 0.6 }}
  beta-opus-4-7: {{ input: 3.0, output: 15.0 }}
  beta-sonnet-4-6: {{ input: 3.0, output: 15.0 }}
  gamma-3.5-flash: {{ input: 0.5, output: 1.5 }}
keys:
  - {{ key: {CLIENT_KEY}, name: tester, group: default, balance: 5.0 }}
  - {{ key: {SMALL_KEY}, name: small, group: default, balance: 0.0001 }}
  - {{ key: {RULED_KEY}, name: ruled, group: default, balance: 5.0, models: {{ deny: [gamma-3.5-flash] }} }}
"#
    )
}

struct Setup {
    mock: Proc,
    gw: Gateway,
    admin: u16,
}

fn setup(extra: &str) -> Setup {
    let mock = start_mock();
    let admin = free_port();
    let gw = start_gateway_logged(&config(mock.port, admin, extra));
    Setup { mock, gw, admin }
}

impl Setup {
    /// A chat completion of `body` with `x-test-tag: tag` and `headers`: status, served-model
    /// header, body text.
    async fn chat(&self, key: &str, tag: &str, body: Value, headers: &[(&str, &str)]) -> (u16, Option<String>, String) {
        let mut req = client().post(self.gw.url("/v1/chat/completions")).bearer_auth(key).header("x-test-tag", tag);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let r = req.json(&body).send().await.expect("request");
        let served = r.headers().get("x-tollgate-served-model").and_then(|v| v.to_str().ok()).map(str::to_string);
        (r.status().as_u16(), served, r.text().await.unwrap_or_default())
    }

    /// The model of each request the mock saw with `tag`, in order.
    async fn models_seen(&self, tag: &str) -> Vec<String> {
        mock_requests(&self.mock, tag).await.iter().map(|r| r["model"].as_str().unwrap_or_default().to_string()).collect()
    }

    /// A page of the request log (`GET /admin/requests?{query}`).
    async fn requests(&self, query: &str) -> Value {
        let url = format!("http://127.0.0.1:{}/admin/requests?{query}", self.admin);
        client().get(url).bearer_auth(ADMIN).send().await.expect("requests").json().await.expect("json")
    }

    /// The request log's entry of the latest request of `model` (waits for it to be written).
    async fn logged(&self, model: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let page = self.requests(&format!("limit=50&model={model}")).await;
            if let Some(entry) = page["data"].as_array().and_then(|d| d.first()) {
                return entry.clone();
            }
            assert!(Instant::now() < deadline, "no request of {model} logged: {page}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn chat_body(model: &str, prompt: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": prompt}]})
}

/// A prompt too long for `alpha-5.5`'s window (200 tokens) is never sent to it: the next model
/// serves it, named in the answer and its header, billed at its price to the nano-dollar with
/// the hold released (the balance moves by the charge alone); the request log and the access
/// log keep the model asked for and why it was left.
#[tokio::test]
async fn a_prompt_too_long_for_the_first_model_is_served_by_the_next_without_calling_the_first() {
    let s = setup("");
    let before = balance(&s.gw, CLIENT_KEY).await;
    let long = "tell me more ".repeat(80);
    let (status, served, body) = s.chat(CLIENT_KEY, "window", chat_body("alpha-5.5", &long), &[("x-mock-usage", "900,40")]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(served.as_deref(), Some("alpha-4o-mini"));
    let answer: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(answer["model"], "alpha-4o-mini", "{answer}");
    assert_eq!(s.models_seen("window").await, ["alpha-4o-mini"], "alpha-5.5 never got the prompt");
    let usage = wait_requests(&s.gw, CLIENT_KEY, 1).await;
    let cost = cost_nanos("alpha-4o-mini", 900, 40);
    assert_eq!(nanos(&usage["total"]["cost"]), cost, "{usage}");
    assert_eq!(before - balance(&s.gw, CLIENT_KEY).await, cost, "the hold was released exactly");
    let entry = s.logged("alpha-4o-mini").await;
    assert_eq!(entry["fallbacks"], "alpha-5.5:context_window", "{entry}");
    let access = s.gw.log();
    assert!(access.contains(r#"requested_model="alpha-5.5" fallbacks="alpha-5.5:context_window""#), "{access}");
    // A prompt that fits goes to the model asked for, whose answer then names no other.
    let (status, served, _) = s.chat(CLIENT_KEY, "short", chat_body("alpha-5.5", "hi"), &[]).await;
    assert_eq!((status, served.as_deref()), (200, Some("alpha-5.5")));
    assert_eq!(s.models_seen("short").await, ["alpha-5.5"]);
    wait_requests(&s.gw, CLIENT_KEY, 2).await;
    // The usage records as stored: the served model, and the model asked for with why it was left.
    let mut s = s;
    s.gw.signal("TERM");
    wait_exit(&mut s.gw.proc.child, Duration::from_secs(20), "tollgate").await;
    let db = sled::open(s.gw.dir.path().join("data")).expect("data");
    let mut records: Vec<tollgate::records::usage::UsageRecord> = Vec::new();
    for entry in db.open_tree("usage_records").expect("tree").iter() {
        let (_, value) = entry.expect("entry");
        records.extend(tollgate::store::usage_codec::decode_records(&value).expect("records"));
    }
    records.sort_by_key(|r| r.time_ms);
    let kept: Vec<(&str, Option<&str>, Option<&str>)> =
        records.iter().map(|r| (r.model.as_str(), r.requested_model.as_deref(), r.fallbacks.as_deref())).collect();
    assert_eq!(kept, [("alpha-4o-mini", Some("alpha-5.5"), Some("alpha-5.5:context_window")), ("alpha-5.5", None, None)]);
}

/// The upstream's own context-length error (OpenAI's `context_length_exceeded`) moves the call
/// to the next model; a content-policy refusal of both OpenAI models moves it on to the
/// Anthropic one, streamed with its tool call in the client's (OpenAI) shape.
#[tokio::test]
async fn upstream_errors_fall_through_to_the_next_model_even_of_another_protocol_streamed_with_tools() {
    let s = setup("");
    let headers = [("x-mock-error", "context_length"), ("x-mock-only-model", "alpha-5.5"), ("x-mock-usage", "30,7")];
    let (status, served, body) = s.chat(CLIENT_KEY, "ctx", chat_body("alpha-5.5", "hi"), &headers).await;
    assert_eq!((status, served.as_deref()), (200, Some("alpha-4o-mini")), "{body}");
    assert_eq!(s.models_seen("ctx").await, ["alpha-5.5", "alpha-4o-mini"]);
    wait_requests(&s.gw, CLIENT_KEY, 1).await;
    assert_eq!(s.logged("alpha-4o-mini").await["fallbacks"], "alpha-5.5:context_length");

    let mut body = chat_body("alpha-5.5", "weather in Paris?");
    body["stream"] = json!(true);
    body["tools"] = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]);
    let headers = [
        ("x-mock-error", "content_policy"),
        ("x-mock-only-model", "alpha-5.5,alpha-4o-mini"),
        ("x-mock-tool-calls", "1"),
        ("x-mock-usage", "50,9"),
    ];
    let (status, served, text) = s.chat(CLIENT_KEY, "policy", body, &headers).await;
    assert_eq!((status, served.as_deref()), (200, Some("beta-sonnet-4-6")), "{text}");
    assert!(text.starts_with("data: "), "an OpenAI stream: {text}");
    assert!(text.contains(r#""name":"get_weather""#) && text.contains(r#""finish_reason":"tool_calls""#), "{text}");
    assert!(text.contains(r#""model":"beta-sonnet-4-6""#), "{text}");
    let seen = mock_requests(&s.mock, "policy").await;
    let paths: Vec<&str> = seen.iter().map(|r| r["path"].as_str().unwrap_or_default()).collect();
    assert_eq!(paths, ["/oa/v1/chat/completions", "/oa/v1/chat/completions", "/an/v1/messages"]);
    assert_eq!(seen[2]["stream"], true);
    let usage = wait_requests(&s.gw, CLIENT_KEY, 2).await;
    assert_eq!(nanos(&usage["total"]["cost"]), cost_nanos("alpha-4o-mini", 30, 7) + cost_nanos("beta-sonnet-4-6", 50, 9), "{usage}");
    let entry = s.logged("beta-sonnet-4-6").await;
    assert_eq!(entry["fallbacks"], "alpha-5.5:content_policy,alpha-4o-mini:content_policy", "{entry}");
    assert_eq!(entry["upstream_protocol"], "anthropic", "{entry}");
}

/// 429 and 503 fall through; a class the chain does not fall back on (`beta-opus-4-7` only on
/// `rate_limited`) is the client's answer; a malformed request is never taken elsewhere.
#[tokio::test]
async fn rate_limits_and_outages_fall_through_and_other_errors_do_not() {
    let s = setup("");
    for status in ["429", "503"] {
        let tag = format!("s{status}");
        let headers = [("x-mock-status", status), ("x-mock-only-model", "alpha-5.5")];
        let (code, served, body) = s.chat(CLIENT_KEY, &tag, chat_body("alpha-5.5", "hi"), &headers).await;
        assert_eq!((code, served.as_deref()), (200, Some("alpha-4o-mini")), "{status}: {body}");
        let seen = s.models_seen(&tag).await;
        assert_eq!(seen.last().map(String::as_str), Some("alpha-4o-mini"), "{status}: {seen:?}");
        assert!(seen.iter().all(|m| m == "alpha-5.5" || m == "alpha-4o-mini"), "{seen:?}");
    }
    // Messages: opus falls back on a rate limit only.
    let messages = |tag: &'static str, headers: Vec<(&'static str, &'static str)>| {
        let mut req = client()
            .post(s.gw.url("/v1/messages"))
            .header("x-api-key", CLIENT_KEY)
            .header("anthropic-version", "2023-06-01")
            .header("x-test-tag", tag);
        for (k, v) in headers {
            req = req.header(k, v);
        }
        req.json(&json!({"model": "beta-opus-4-7", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]})).send()
    };
    let r = messages("opus-503", vec![("x-mock-status", "503"), ("x-mock-only-model", "beta-opus-4-7")]).await.expect("send");
    assert_eq!(r.status(), 503, "not a class opus falls back on");
    assert!(r.headers().get("x-tollgate-served-model").is_none());
    let r = messages("opus-429", vec![("x-mock-status", "429"), ("x-mock-only-model", "beta-opus-4-7")]).await.expect("send");
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers().get("x-tollgate-served-model").and_then(|v| v.to_str().ok()), Some("alpha-5.5"));
    let answer: Value = r.json().await.expect("json");
    assert_eq!((answer["type"].as_str(), answer["model"].as_str()), (Some("message"), Some("alpha-5.5")), "messages shape: {answer}");
    // A 400 that is no class of failure is the client's, from the model asked for.
    let headers = [("x-mock-status", "400"), ("x-mock-only-model", "alpha-5.5")];
    let (code, served, body) = s.chat(CLIENT_KEY, "bad", chat_body("alpha-5.5", "hi"), &headers).await;
    assert_eq!((code, served), (400, None), "{body}");
    assert!(body.contains("mock says 400"), "the upstream's message, read once, passed on: {body}");
    assert_eq!(s.models_seen("bad").await, ["alpha-5.5"]);
}

/// The client's own list: a body's `models` (its first the model when `model` is left out) or
/// `x-tollgate-fallbacks`, within the key's model rules (a model its key may not call refuses
/// the call before anything is sent); the call holds the dearest candidate's cost.
#[tokio::test]
async fn a_clients_models_list_is_honoured_within_its_keys_rules_and_held_at_the_dearest() {
    let s = setup("");
    let body = json!({"models": ["alpha-4o-mini", "gamma-3.5-flash"], "messages": [{"role": "user", "content": "hi"}]});
    let headers = [("x-mock-status", "503"), ("x-mock-only-model", "alpha-4o-mini"), ("x-mock-usage", "11,3")];
    let (status, served, text) = s.chat(CLIENT_KEY, "list", body.clone(), &headers).await;
    assert_eq!((status, served.as_deref()), (200, Some("gamma-3.5-flash")), "{text}");
    let seen = mock_requests(&s.mock, "list").await;
    assert!(seen.last().is_some_and(|r| r["path"].as_str().is_some_and(|p| p.starts_with("/ge/"))), "{seen:?}");
    assert_eq!(serde_json::from_str::<Value>(&text).expect("json")["model"], "gamma-3.5-flash");
    // The same list from a key whose rules deny gamma: refused, naming the list, nothing sent.
    let (status, _, text) = s.chat(RULED_KEY, "ruled", body, &[]).await;
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("gamma-3.5-flash") && text.contains(r#""param":"models""#), "{text}");
    assert!(s.models_seen("ruled").await.is_empty());
    // The header, on any protocol; an unknown model in it is refused.
    let headers = [("x-tollgate-fallbacks", "gamma-3.5-flash"), ("x-mock-status", "429"), ("x-mock-only-model", "alpha-4o-mini")];
    let (status, served, _) = s.chat(CLIENT_KEY, "hdr", chat_body("alpha-4o-mini", "hi"), &headers).await;
    assert_eq!((status, served.as_deref()), (200, Some("gamma-3.5-flash")));
    let (status, _, text) =
        s.chat(CLIENT_KEY, "nope", chat_body("alpha-4o-mini", "hi"), &[("x-tollgate-fallbacks", "no-such-model")]).await;
    assert_eq!(status, 404, "{text}");
    // Held at the dearest: 100 output tokens of alpha-4o-mini fit the small key's 0.0001 USD,
    // of beta-opus-4-7 they do not.
    let mut body = chat_body("alpha-4o-mini", "hi");
    body["max_tokens"] = json!(100);
    let (status, _, text) = s.chat(SMALL_KEY, "small", body.clone(), &[]).await;
    assert_eq!(status, 200, "{text}");
    let (status, _, text) = s.chat(SMALL_KEY, "small-dear", body, &[("x-tollgate-fallbacks", "beta-opus-4-7")]).await;
    assert_eq!(status, 402, "{text}");
    assert!(s.models_seen("small-dear").await.is_empty());
}

/// Retries and fallbacks share `routing.max_attempts`; nothing falls back once the answer's
/// first byte went out.
#[tokio::test]
async fn retries_and_fallbacks_share_one_bound_and_none_follows_the_first_byte() {
    let mock = start_mock();
    let admin = free_port();
    let text = config(mock.port, admin, "retry: { attempts: 1 }\n").replace("routing:\n", "routing:\n  max_attempts: 2\n");
    let gw = start_gateway_logged(&text);
    let s = Setup { mock, gw, admin };
    let headers = [("x-mock-status", "503")];
    let (status, served, _) = s.chat(CLIENT_KEY, "bound", chat_body("alpha-5.5", "hi"), &headers).await;
    assert_eq!((status, served), (503, None));
    assert_eq!(s.models_seen("bound").await, ["alpha-5.5", "alpha-4o-mini"], "two attempts in all, the third model never tried");

    let mut body = chat_body("alpha-5.5", "hi");
    body["stream"] = json!(true);
    let (status, served, _) = s.chat(CLIENT_KEY, "cut", body, &[("x-mock-cut-after", "2")]).await;
    assert_eq!((status, served.as_deref()), (200, Some("alpha-5.5")));
    assert_eq!(s.models_seen("cut").await, ["alpha-5.5"], "no fallback after the first byte");
}

/// No fallback starts after `routing.max_fallback_secs`: a model that has not answered by then
/// is given up (its attempt waits for a header only until then), and the next is never asked.
#[tokio::test]
async fn no_fallback_starts_after_max_fallback_secs() {
    let mock = start_mock();
    let admin = free_port();
    let text = config(mock.port, admin, "").replace("routing:\n", "routing:\n  max_fallback_secs: 1\n");
    let gw = start_gateway_logged(&text);
    let s = Setup { mock, gw, admin };
    let headers = [("x-mock-delay-ms", "2500"), ("x-mock-only-model", "alpha-5.5")];
    let (status, served, body) = s.chat(CLIENT_KEY, "slow", chat_body("alpha-5.5", "hi"), &headers).await;
    assert_eq!((status, served), (504, None), "{body}");
    assert_eq!(s.models_seen("slow").await, ["alpha-5.5"], "the next model was never asked");
}

/// Every row of the table of error classes (docs/fallbacks.md), as each kind of upstream
/// answers it (the mock words it as the service does): OpenAI, Azure OpenAI, Anthropic, Gemini
/// and Bedrock (its `x-amzn-ErrorType`, its signature checked) each fall back to a safe model
/// on a context too long, a content-policy refusal, a 429, a 5xx and no answer in time; the
/// request log names the class.
#[tokio::test]
async fn each_kind_of_upstream_falls_back_on_each_class_of_its_errors() {
    const AWS_ID: &str = "AKIDMOCKTOLLGATE";
    const SONNET: &str = "anthropic.claude-sonnet-4-6-v1:0";
    let mock = start_mock();
    let admin = free_port();
    let m = mock.port;
    let text = format!(
        r#"
providers:
  - {{ name: oa, protocol: openai, base_url: "http://127.0.0.1:{m}/oa", api_key: {UPSTREAM_KEY}, models: [alpha-5.5], read_timeout_secs: 1 }}
  - {{ name: az, protocol: azure-openai, base_url: "http://127.0.0.1:{m}/dep", api_version: 2024-10-21, api_key: {UPSTREAM_KEY},
      models: [{{ name: alpha-4o-mini, upstream: dep-gpt }}], read_timeout_secs: 1 }}
  - {{ name: an, protocol: anthropic, base_url: "http://127.0.0.1:{m}/an", api_key: {UPSTREAM_KEY}, models: [beta-opus-4-7], read_timeout_secs: 1 }}
  - {{ name: ge, protocol: gemini, base_url: "http://127.0.0.1:{m}/ge", api_key: {UPSTREAM_KEY}, models: [gamma-3.5-flash], read_timeout_secs: 1 }}
  - {{ name: br, protocol: bedrock, region: us-east-1, endpoint_url: "http://127.0.0.1:{m}/east", read_timeout_secs: 1,
      aws: {{ access_key_id_env: T_AWS_ID, secret_access_key_env: T_AWS_SECRET }}, models: [{{ name: beta-sonnet-4-6, upstream: "{SONNET}" }}] }}
  - {{ name: safe, protocol: openai, base_url: "http://127.0.0.1:{m}/safe", api_key: {UPSTREAM_KEY}, models: [alpha-5.4] }}
groups:
  default: {{ platforms: [openai, anthropic, gemini], translate: true }}
retry: {{ attempts: 1 }}
routing:
  fallbacks:
    alpha-5.5: {{ to: [alpha-5.4] }}
    alpha-4o-mini: {{ to: [alpha-5.4] }}
    beta-opus-4-7: {{ to: [alpha-5.4] }}
    gamma-3.5-flash: {{ to: [alpha-5.4] }}
    beta-sonnet-4-6: {{ to: [alpha-5.4] }}
admin: {{ listen: 127.0.0.1:{admin}, token: {ADMIN} }}
{prices}keys:
  - {{ key: {CLIENT_KEY}, name: tester, group: default, balance: 5.0 }}
"#,
        prices = prices_section()
    );
    let gw = start_gateway_env(&text, &[("T_AWS_ID", AWS_ID), ("T_AWS_SECRET", "mock-aws-secret-access-key")]);
    let s = Setup { mock, gw, admin };
    let kinds = [
        ("alpha-5.5", "/oa"),
        ("alpha-4o-mini", "/dep"),
        ("beta-opus-4-7", "/an"),
        ("gamma-3.5-flash", "/ge"),
        ("beta-sonnet-4-6", "/east"),
    ];
    let classes: [(&str, (&str, &str)); 5] = [
        ("context_length", ("x-mock-error", "context_length")),
        ("content_policy", ("x-mock-error", "content_policy")),
        ("rate_limited", ("x-mock-status", "429")),
        ("unavailable", ("x-mock-status", "503")),
        ("timeout", ("x-mock-delay-ms", "2500")),
    ];
    for (model, prefix) in kinds {
        for (class, control) in classes {
            // No answer in time is one row per kind of reading, not per upstream: twice is enough.
            if class == "timeout" && !matches!(model, "alpha-5.5" | "beta-sonnet-4-6") {
                continue;
            }
            let tag = format!("{model}-{class}");
            let (status, served, body) = s.chat(CLIENT_KEY, &tag, chat_body(model, &tag), &[control, ("x-mock-only", prefix)]).await;
            assert_eq!((status, served.as_deref()), (200, Some("alpha-5.4")), "{tag}: {body}");
            let seen = mock_requests(&s.mock, &tag).await;
            let paths: Vec<&str> = seen.iter().map(|r| r["path"].as_str().unwrap_or_default()).collect();
            assert!(paths.len() == 2 && paths[0].starts_with(prefix) && paths[1].starts_with("/safe/"), "{tag}: {paths:?}");
        }
    }
    // Each reason, as the request log keeps it.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let page = s.requests("limit=100&model=alpha-5.4").await;
        let mut logged: Vec<String> =
            page["data"].as_array().into_iter().flatten().filter_map(|e| e["fallbacks"].as_str().map(str::to_string)).collect();
        logged.sort();
        let mut want: Vec<String> = kinds
            .iter()
            .flat_map(|(model, _)| {
                classes
                    .iter()
                    .filter(move |(c, _)| *c != "timeout" || matches!(*model, "alpha-5.5" | "beta-sonnet-4-6"))
                    .map(move |(c, _)| format!("{model}:{c}"))
            })
            .collect();
        want.sort();
        if logged == want {
            break;
        }
        assert!(Instant::now() < deadline, "logged {logged:?}, want {want:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
