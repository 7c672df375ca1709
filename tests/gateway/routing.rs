//! Resilient routing: retries before the first byte, cooldowns with half-open probes, weights,
//! priority tiers and upstream key pools, against `tollgate-mock` with per-provider failures
//! (`x-mock-only: /prefix` scopes a failure to one provider, `x-mock-only-key` to one key).

use crate::common::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const ADMIN_TOKEN: &str = "admin-token-routing-01";

/// Providers `p1`… (prefix `/p1`…) serving `alpha-5.5` over chat completions, each with the
/// extra settings given, an admin listener, and `extra` top-level lines.
fn config(mock_port: u16, admin_port: u16, providers: &[&str], extra: &str) -> String {
    let mut list = String::new();
    for (i, settings) in providers.iter().enumerate() {
        let n = i + 1;
        list.push_str(&format!(
            "  - {{ name: p{n}, protocol: openai, base_url: \"http://127.0.0.1:{mock_port}/p{n}\", models: [alpha-5.5, alpha-embed-3], {settings} }}\n"
        ));
    }
    format!(
        "providers:\n{list}{extra}admin: {{ listen: 127.0.0.1:{admin_port}, token: {ADMIN_TOKEN} }}\n{prices}keys:\n  - {{ key: {CLIENT_KEY}, name: tester, group: default, balance: 5.0 }}\n",
        prices = prices_section()
    )
}

fn key() -> String {
    format!("api_key: {UPSTREAM_KEY}")
}

struct Setup {
    mock: Proc,
    gw: Gateway,
    admin_port: u16,
}

fn setup(providers: &[&str], extra: &str) -> Setup {
    let mock = start_mock();
    let admin_port = free_port();
    let gw = start_gateway_logged(&config(mock.port, admin_port, providers, extra));
    Setup { mock, gw, admin_port }
}

impl Setup {
    /// A chat completion with extra headers; returns the status and the body text.
    async fn chat(&self, tag: &str, headers: &[(&str, &str)], conversation: &str) -> (u16, String) {
        let mut req = client().post(self.gw.url("/v1/chat/completions")).bearer_auth(CLIENT_KEY).header("x-test-tag", tag);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let body = json!({"model": "alpha-5.5", "messages": [{"role": "user", "content": conversation}]});
        let r = req.json(&body).send().await.expect("request");
        let status = r.status().as_u16();
        (status, r.text().await.unwrap_or_default())
    }

    /// The provider prefix of each request the mock saw with `tag`, in order.
    async fn seen(&self, tag: &str) -> Vec<String> {
        mock_requests(&self.mock, tag)
            .await
            .iter()
            .map(|r| r["path"].as_str().unwrap_or_default().split("/v1/").next().unwrap_or_default().to_string())
            .collect()
    }

    async fn metrics(&self) -> String {
        let url = format!("http://127.0.0.1:{}/metrics", self.admin_port);
        client().get(url).bearer_auth(ADMIN_TOKEN).send().await.expect("metrics").text().await.expect("text")
    }

    async fn metric(&self, series: &str) -> f64 {
        let text = self.metrics().await;
        text.lines().find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok())).unwrap_or(0.0)
    }

    /// Wait (polling the state gauge) until provider `p` is in `state` (0 healthy, 1 cooling,
    /// 2 half-open).
    async fn wait_state(&self, p: &str, state: f64, within: Duration) {
        let deadline = Instant::now() + within;
        let series = format!("tollgate_provider_state{{provider=\"{p}\"}}");
        while self.metric(&series).await != state {
            assert!(Instant::now() < deadline, "{p} never reached state {state}:\n{}", self.metrics().await);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A 5xx from the first provider is retried on the next before any byte reached the client;
/// the request is held once and billed once, and the record and the access log note 2 attempts.
#[tokio::test]
async fn a_failed_attempt_is_retried_on_the_next_provider_and_billed_once() {
    let s = setup(&[&format!("{}, priority: 0, read_timeout_secs: 1", key()), &format!("{}, priority: 1", key())], "");
    let before = balance(&s.gw, CLIENT_KEY).await;
    let (status, body) = s.chat("retry", &[("x-mock-only", "/p1"), ("x-mock-status", "503")], "hi").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(s.seen("retry").await, ["/p1", "/p2"]);
    let usage = wait_requests(&s.gw, CLIENT_KEY, 1).await;
    assert_eq!(usage["total"]["requests"], 1, "one record: {usage}");
    let (inp, out) = (usage["total"]["input_tokens"].as_u64().unwrap_or(0), usage["total"]["output_tokens"].as_u64().unwrap_or(0));
    assert_eq!(before - balance(&s.gw, CLIENT_KEY).await, cost_nanos("alpha-5.5", inp, out), "billed once, the answer's usage");
    assert!(s.gw.log().contains("provider=\"p2\" attempts=2"), "{}", s.gw.log());
    assert_eq!(s.metric("tollgate_provider_retries_total{provider=\"p1\"}").await, 1.0);
    assert_eq!(s.metric("tollgate_upstream_responses_total{provider=\"p1\",status=\"503\"}").await, 1.0);
    assert_eq!(s.metric("tollgate_upstream_responses_total{provider=\"p2\",status=\"200\"}").await, 1.0);

    // A timeout before the response header is retried too.
    let (status, _) = s.chat("slow", &[("x-mock-only", "/p1"), ("x-mock-delay-ms", "3000")], "hi").await;
    assert_eq!(status, 200);
    assert_eq!(s.seen("slow").await, ["/p1", "/p2"]);
}

/// Not retried: a status outside `on_status` (a 400 the client caused), and anything after the
/// first byte reached the client (a stream cut midway).
#[tokio::test]
async fn no_retry_of_a_client_error_or_after_the_first_byte() {
    let s = setup(&[&format!("{}, read_timeout_secs: 1", key()), &format!("{}, priority: 1", key())], "");
    let (status, body) = s.chat("bad", &[("x-mock-only", "/p1"), ("x-mock-status", "400")], "hi").await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(s.seen("bad").await, ["/p1"]);

    let r = client()
        .post(s.gw.url("/v1/chat/completions"))
        .bearer_auth(CLIENT_KEY)
        .header("x-test-tag", "cut")
        .header("x-mock-only", "/p1")
        .header("x-mock-cut-after", "2")
        .json(&json!({"model": "alpha-5.5", "stream": true, "messages": []}))
        .send()
        .await
        .expect("stream");
    assert_eq!(r.status(), 200);
    let mut r = r;
    let mut got = Vec::new();
    let ended = loop {
        match r.chunk().await {
            Ok(Some(chunk)) => got.extend_from_slice(&chunk),
            Ok(None) => break "complete",
            Err(_) => break "cut",
        }
    };
    let text = String::from_utf8_lossy(&got);
    assert!(text.contains("Hello") && !text.contains("[DONE]"), "the stream as far as it went: {text}");
    assert_eq!(ended, "cut", "the client sees the cut as a cut, not as an end");
    assert_eq!(s.seen("cut").await, ["/p1"], "never retried once bytes went out");
}

/// `retry.deadline_secs` bounds all attempts together: with every provider too slow, attempts
/// stop once the deadline is spent, not after `attempts`; the client gets the timeout (504 in
/// its protocol's shape), billed nothing. (How long the last attempt may wait is
/// `gateway::tests::an_attempt_waits_for_its_header_at_most_until_the_deadline`.)
#[tokio::test]
async fn retries_stop_at_the_deadline() {
    let slow = format!("{}, read_timeout_secs: 1", key());
    let s = setup(&[&slow, &slow], "retry: { attempts: 5, deadline_secs: 2 }\n");
    let before = balance(&s.gw, CLIENT_KEY).await;
    let (status, body) = s.chat("deadline", &[("x-mock-delay-ms", "1500")], "hi").await;
    assert_eq!(status, 504, "{body}");
    let v: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(v["error"]["message"], "The upstream service did not answer in time.", "{v}");
    let seen = s.seen("deadline").await;
    assert_eq!(seen.len(), 2, "1 s per attempt, 2 s in all: two attempts of five ({seen:?})");
    assert_ne!(seen[0], seen[1], "the retry went to the other provider");
    wait_requests(&s.gw, CLIENT_KEY, 1).await;
    assert_eq!(balance(&s.gw, CLIENT_KEY).await, before, "billed nothing");
}

/// Everywhere failing: the last upstream's error in the protocol's shape (its status, none of its
/// text), billed nothing.
#[tokio::test]
async fn a_request_failing_everywhere_gets_the_last_error_and_no_bill() {
    let s = setup(&[&key(), &key()], "retry: { attempts: 3 }\n");
    let before = balance(&s.gw, CLIENT_KEY).await;
    let (status, body) = s.chat("fail", &[("x-mock-status", "503")], "hi").await;
    assert_eq!(status, 503);
    let v: Value = serde_json::from_str(&body).expect("json");
    assert_eq!(v["error"]["code"], "overloaded", "{v}");
    assert!(!v.to_string().contains("mock says"), "no upstream text: {v}");
    let seen = s.seen("fail").await;
    assert_eq!(seen.len(), 3, "attempts: 3 ({seen:?})");
    assert_ne!(seen[0], seen[1], "the second attempt goes to the other provider");
    wait_requests(&s.gw, CLIENT_KEY, 1).await;
    assert_eq!(balance(&s.gw, CLIENT_KEY).await, before, "billed nothing");
}

/// A 429 rests its provider for its `Retry-After`; then one request probes it (half-open) while
/// the others keep away, and its success brings the provider back. A reload keeps the state.
#[tokio::test]
async fn a_throttled_provider_rests_for_its_retry_after_then_one_probe_brings_it_back() {
    let s = setup(&[&format!("{}, priority: 0", key()), &format!("{}, priority: 1", key())], "");
    let throttled_at = Instant::now();
    let (status, _) = s.chat("429", &[("x-mock-only", "/p1"), ("x-mock-status", "429"), ("x-mock-retry-after", "3")], "hi").await;
    assert_eq!(status, 200, "retried on p2");
    assert_eq!(s.seen("429").await, ["/p1", "/p2"]);
    assert_eq!(s.metric("tollgate_provider_state{provider=\"p1\"}").await, 1.0, "cooling");
    assert_eq!(s.metric("tollgate_provider_cooldowns_total{provider=\"p1\"}").await, 1.0);

    // A reload keeps the rest.
    s.gw.signal("HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !s.gw.log().contains("configuration reloaded") {
        assert!(Instant::now() < deadline, "no reload: {}", s.gw.log());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if throttled_at.elapsed() < Duration::from_millis(2500) {
        assert_eq!(s.metric("tollgate_provider_state{provider=\"p1\"}").await, 1.0, "still cooling after the reload");
    }
    for i in 0..4 {
        let (status, _) = s.chat("resting", &[], &format!("c{i}")).await;
        assert_eq!(status, 200);
    }
    let seen = s.seen("resting").await;
    if throttled_at.elapsed() < Duration::from_secs(3) {
        assert!(seen.iter().all(|p| p == "/p2"), "p1 rests: {seen:?}");
    }

    s.wait_state("p1", 2.0, Duration::from_secs(10)).await;
    assert!(throttled_at.elapsed() >= Duration::from_secs(3), "not before its Retry-After");
    // The probe: its answer held back at p1 (before the response header, which decides it).
    let probe = {
        let (url, tag) = (s.gw.url("/v1/chat/completions"), "probe");
        tokio::spawn(async move {
            client()
                .post(url)
                .bearer_auth(CLIENT_KEY)
                .header("x-test-tag", tag)
                .header("x-mock-only", "/p1")
                .header("x-mock-delay-ms", "1500")
                .json(&json!({"model": "alpha-5.5", "messages": []}))
                .send()
                .await
                .expect("probe")
                .status()
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.seen("probe").await.is_empty() {
        assert!(Instant::now() < deadline, "the probe never reached the mock");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(s.seen("probe").await, ["/p1"]);
    let (status, _) = s.chat("during", &[], "during the probe").await;
    assert_eq!(status, 200);
    assert_eq!(s.seen("during").await, ["/p2"], "one probe at a time");
    assert_eq!(probe.await.expect("probe task"), 200);
    s.wait_state("p1", 0.0, Duration::from_secs(5)).await;
    let (status, _) = s.chat("back", &[], "after").await;
    assert_eq!(status, 200);
    assert_eq!(s.seen("back").await, ["/p1"], "healthy again: the first tier");
}

/// Repeated failures rest a provider (`failures_before_cooldown`); a model whose providers all
/// rest still tries the one whose rest ends first.
#[tokio::test]
async fn failures_in_a_row_rest_a_provider_and_all_resting_still_tries_one() {
    let s = setup(
        &[&format!("{}, failures_before_cooldown: 2, cooldown_secs: 60", key()), &format!("{}, priority: 1, cooldown_secs: 30", key())],
        "retry: { attempts: 1 }\n",
    );
    for _ in 0..2 {
        let (status, _) = s.chat("fail", &[("x-mock-only", "/p1"), ("x-mock-status", "500")], "hi").await;
        assert_eq!(status, 502, "attempts: 1, no retry; an upstream 500 is the client's 502");
    }
    assert_eq!(s.metric("tollgate_provider_state{provider=\"p1\"}").await, 1.0);
    let (status, _) = s.chat("next", &[], "hi").await;
    assert_eq!(status, 200);
    assert_eq!(s.seen("next").await, ["/p2"], "the next tier while the first rests");
    // p2 throttled too: both rest; p2's rest (30 s) ends before p1's (60 s).
    let (status, _) = s.chat("p2", &[("x-mock-only", "/p2"), ("x-mock-status", "429")], "hi").await;
    assert_eq!(status, 429);
    assert_eq!(s.metric("tollgate_provider_state{provider=\"p2\"}").await, 1.0);
    let (status, _) = s.chat("all", &[], "hi").await;
    assert_eq!(status, 200, "tried rather than refused");
    assert_eq!(s.seen("all").await, ["/p2"]);
}

/// Within a tier, `weight` splits the traffic: 3 to 1 over 200 requests (within ±10%), for
/// conversations (each kept on its provider) and for requests without one.
#[tokio::test]
async fn weights_split_a_tier() {
    let s = setup(&[&format!("{}, weight: 3", key()), &key(), &format!("{}, priority: 1", key())], "");
    for i in 0..200 {
        let (status, _) = s.chat("weights", &[], &format!("conversation {i}")).await;
        assert_eq!(status, 200);
    }
    let seen = s.seen("weights").await;
    let heavy = seen.iter().filter(|p| *p == "/p1").count();
    let light = seen.iter().filter(|p| *p == "/p2").count();
    eprintln!("conversations: p1 {heavy}, p2 {light}, p3 {}", 200 - heavy - light);
    assert_eq!(heavy + light, 200, "the backup tier is never used while the first is healthy");
    assert!((135..=165).contains(&heavy), "p1 {heavy} of 200, expected 150 ± 15");
    for i in 0..200 {
        let r = client()
            .post(s.gw.url("/v1/embeddings"))
            .bearer_auth(CLIENT_KEY)
            .header("x-test-tag", "embed")
            .json(&json!({"model": "alpha-embed-3", "input": format!("text {i}")}))
            .send()
            .await
            .expect("embed");
        assert_eq!(r.status(), 200);
    }
    let seen = s.seen("embed").await;
    let heavy = seen.iter().filter(|p| *p == "/p1").count();
    eprintln!("without a conversation: p1 {heavy}, p2 {}", 200 - heavy);
    assert_eq!(heavy, 150, "smooth weighted round-robin");
}

/// A key pool: requests rotate through the keys; a key answered 429 rests alone (the provider
/// keeps serving with the others), and the request is retried with the next key.
#[tokio::test]
async fn pool_keys_rotate_and_a_throttled_key_rests_alone() {
    let keys = ["up-pool-key-a1", "up-pool-key-b2", "up-pool-key-c3"];
    let mock = start_mock_with_keys(&keys.join(","));
    let admin_port = free_port();
    let pool = format!("api_keys: [{}]", keys.join(", "));
    let s = Setup { gw: start_gateway_logged(&config(mock.port, admin_port, &[&pool], "")), mock, admin_port };
    let used = |seen: &[Value]| -> Vec<String> {
        seen.iter()
            .map(|r| r["headers"]["authorization"][0].as_str().unwrap_or_default().trim_start_matches("Bearer ").to_string())
            .collect()
    };
    for i in 0..6 {
        assert_eq!(s.chat("rotate", &[], &format!("r{i}")).await.0, 200);
    }
    let rotated = used(&mock_requests(&s.mock, "rotate").await);
    assert_eq!(rotated, [keys[0], keys[1], keys[2], keys[0], keys[1], keys[2]], "in turn");

    let headers = [("x-mock-only-key", keys[1]), ("x-mock-status", "429"), ("x-mock-retry-after", "60")];
    let mut throttled = false;
    for i in 0..3 {
        assert_eq!(s.chat("throttle", &headers, &format!("t{i}")).await.0, 200, "retried with another key");
        throttled |= used(&mock_requests(&s.mock, "throttle").await).contains(&keys[1].to_string());
    }
    assert!(throttled, "the second key got its 429");
    assert_eq!(s.metric("tollgate_provider_key_state{provider=\"p1\",key=\"1\"}").await, 1.0);
    assert_eq!(s.metric("tollgate_provider_key_cooldowns_total{provider=\"p1\",key=\"1\"}").await, 1.0);
    assert_eq!(s.metric("tollgate_provider_state{provider=\"p1\"}").await, 0.0, "the provider stays in");
    for i in 0..6 {
        assert_eq!(s.chat("after", &[], &format!("a{i}")).await.0, 200);
    }
    let after = used(&mock_requests(&s.mock, "after").await);
    assert!(!after.contains(&keys[1].to_string()) && after.len() == 6, "the resting key is skipped: {after:?}");
    let text = s.metrics().await;
    assert!(!keys.iter().any(|k| text.contains(k)), "metrics name keys by index only");
}

/// A conversation pinned to a provider leaves it only while that provider rests, and comes back
/// once it is healthy again.
#[tokio::test]
async fn a_pinned_conversation_leaves_its_provider_only_while_it_rests() {
    let s = setup(&[&key(), &key()], "");
    let (status, _) = s.chat("pin", &[], "the pinned conversation").await;
    assert_eq!(status, 200);
    let home = s.seen("pin").await[0].clone();
    let other = if home == "/p1" { "/p2" } else { "/p1" };
    for _ in 0..3 {
        s.chat("pin", &[], "the pinned conversation").await;
    }
    assert!(s.seen("pin").await.iter().all(|p| *p == home), "pinned");
    // Its provider answers 429 (rest 2 s): the turn is retried on the other, and so are the
    // next turns while it rests.
    let (status, _) = s
        .chat("moved", &[("x-mock-only", home.as_str()), ("x-mock-status", "429"), ("x-mock-retry-after", "2")], "the pinned conversation")
        .await;
    assert_eq!(status, 200);
    assert_eq!(s.seen("moved").await, [home.clone(), other.to_string()]);
    let (status, _) = s.chat("resting", &[], "the pinned conversation").await;
    assert_eq!(status, 200);
    let name = home.trim_start_matches('/');
    if s.metric(&format!("tollgate_provider_state{{provider=\"{name}\"}}")).await == 1.0 {
        assert_eq!(s.seen("resting").await, [other.to_string()], "away while its provider rests");
    }
    s.wait_state(name, 2.0, Duration::from_secs(10)).await;
    let (status, _) = s.chat("back", &[], "the pinned conversation").await;
    assert_eq!(status, 200);
    assert_eq!(s.seen("back").await, [home], "back once its provider may take requests again");
}

/// The providers of a tier in a prompt's rendezvous order, as tollgate computes it (the body
/// sent by `Setup::chat`), given `(name, weight)` of each.
fn rendezvous_order(prompt: &str, providers: &[(&str, u32)]) -> Vec<String> {
    let body = json!({"model": "alpha-5.5", "messages": [{"role": "user", "content": prompt}]}).to_string();
    let fields = tollgate::protocol::body_fields(body.as_bytes()).expect("parse");
    let conversation = tollgate::protocol::conversation::conversation_key(&fields).expect("a conversation");
    let mut order: Vec<(f64, &str)> =
        providers.iter().map(|(name, w)| (tollgate::upstream::affinity::rendezvous_score(conversation, name, *w), *name)).collect();
    order.sort_by(|a, b| b.0.total_cmp(&a.0));
    order.into_iter().map(|(_, name)| format!("/{name}")).collect()
}

/// The first prompt `hot prompt {n}` whose rendezvous order starts with `first`.
fn prompt_preferring(first: &str, providers: &[(&str, u32)]) -> String {
    (0..).map(|n| format!("hot prompt {n}")).find(|p| rendezvous_order(p, providers)[0] == first).expect("some prompt")
}

/// Share of `provider` among the requests the mock saw with `tag`.
async fn share(s: &Setup, tag: &str, provider: &str) -> f64 {
    let seen = s.seen(tag).await;
    seen.iter().filter(|p| *p == provider).count() as f64 / seen.len() as f64
}

/// Issue 26: 200 identical single-turn requests on a 3:1 tier. Without a bound all went to the
/// provider the prompt hashes to (200 to 0). With it, the prompt's first provider takes at
/// most (1 + ε) times its weighted share, and the rest goes to the next in its order: at the
/// default ε = 0.25, 0.9375 when it prefers the weight-3 provider, 0.3125 (the heavy one
/// 0.6875) when it prefers the weight-1 one; at ε = 0.1, 0.825 and 0.725.
#[tokio::test]
async fn identical_prompts_split_within_the_bound() {
    let tier = [("p1", 3), ("p2", 1)];
    let providers = [format!("{}, weight: 3", key()), key()];
    let providers: Vec<&str> = providers.iter().map(String::as_str).collect();
    for (extra, epsilon) in [("", 0.25), ("routing: { balance_factor: 0.1 }\n", 0.1)] {
        for (home, tag) in [("/p1", "prefers-heavy"), ("/p2", "prefers-light")] {
            // A gateway of its own: the tier's load is this prompt's alone.
            let s = setup(&providers, extra);
            let prompt = prompt_preferring(home, &tier);
            // As a batch job sends them: eight at a time.
            for _ in 0..25 {
                let batch = (0..8).map(|_| s.chat(tag, &[], &prompt));
                for (status, _) in futures_util::future::join_all(batch).await {
                    assert_eq!(status, 200);
                }
            }
            let weight_share = if home == "/p1" { 0.75 } else { 0.25 };
            let at_home = share(&s, tag, home).await;
            let heavy = share(&s, tag, "/p1").await;
            eprintln!("ε {epsilon}, {tag}: home {home} {at_home:.3}, heavy share {heavy:.3}");
            // The share is the bound's, within the few requests a quiet provider takes anyway.
            let bound = (1.0 + epsilon) * weight_share;
            assert!(at_home <= bound + 0.03, "ε {epsilon}, {tag}: {at_home} over the bound {bound}");
            assert!(at_home >= bound - 0.08, "ε {epsilon}, {tag}: {at_home}: affinity kept up to the bound {bound}");
            if epsilon <= 0.1 || home == "/p2" {
                assert!((0.65..=0.85).contains(&heavy), "ε {epsilon}, {tag}: heavy share {heavy}");
            }
            let name = home.trim_start_matches('/');
            let overflow = s.metric(&format!("tollgate_affinity_overflow_total{{provider=\"{name}\"}}")).await;
            assert!(overflow > 0.0, "the overflow of {name} is counted:\n{}", s.metrics().await);
        }
    }
}

/// Requests without a conversation (embeddings), spread by smooth weighted round-robin:
/// load on every provider exactly by weight.
async fn even_load(s: &Setup, tag: &str, n: usize) {
    for i in 0..n {
        let r = client()
            .post(s.gw.url("/v1/embeddings"))
            .bearer_auth(CLIENT_KEY)
            .header("x-test-tag", tag)
            .json(&json!({"model": "alpha-embed-3", "input": format!("text {i}")}))
            .send()
            .await
            .expect("embed");
        assert_eq!(r.status(), 200);
    }
}

/// A conversation keeps its provider while that provider is within its bound (here under
/// traffic spread evenly), a hot prompt's overflow goes to the next provider in its own
/// rendezvous order, and a provider back under its bound gets its conversations back.
#[tokio::test]
async fn affinity_holds_within_the_bound_and_overflow_follows_the_order() {
    let tier = [("p1", 1), ("p2", 1), ("p3", 1)];
    let s = setup(&[&key(), &key(), &key()], "");
    // Sticky: 10 turns of one conversation among 400 requests spread evenly.
    let sticky = "a conversation that goes on";
    let home = rendezvous_order(sticky, &tier)[0].clone();
    for i in 0..400 {
        even_load(&s, "spread", 1).await;
        if i % 40 == 0 {
            assert_eq!(s.chat("sticky", &[], sticky).await.0, 200);
        }
    }
    let seen = s.seen("sticky").await;
    assert!(seen.iter().all(|p| *p == home), "every turn on {home}: {seen:?}");

    // A hot prompt: its first provider fills to its bound, the overflow goes to the second in
    // its order, the third gets only what is left over after both are at their bounds.
    let prompt = "one popular prompt";
    let order = rendezvous_order(prompt, &tier);
    for _ in 0..300 {
        assert_eq!(s.chat("hot", &[], prompt).await.0, 200);
    }
    let seen = s.seen("hot").await;
    let count = |p: &String| seen.iter().filter(|q| *q == p).count();
    let (first, second, third) = (count(&order[0]), count(&order[1]), count(&order[2]));
    eprintln!("hot prompt over {order:?}: {first} {second} {third}");
    assert!(first >= second && second > third, "overflow follows the order {order:?}: {first} {second} {third}");
    let first_away = seen.iter().position(|p| *p != order[0]).expect("some overflow");
    assert_eq!(seen[first_away], order[1], "the first overflow goes to the second in the order");
    let name = order[0].trim_start_matches('/');
    assert!(s.metric(&format!("tollgate_affinity_overflow_total{{provider=\"{name}\"}}")).await > 0.0);

    // Traffic spread evenly brings the first provider back under its bound: the hot prompt
    // comes back to it.
    even_load(&s, "calm", 300).await;
    assert_eq!(s.chat("back", &[], prompt).await.0, 200);
    assert_eq!(s.seen("back").await, [order[0].clone()], "back on its first provider once under its bound");
}
