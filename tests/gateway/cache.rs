//! The response cache (`cache:`, `x-tollgate-cache`): the same call answered again from the
//! gateway, whole or streamed, never reaching the mock (`/__mock/requests` by tag), billed at
//! its hit price with what it saved recorded, kept only within its scope, only when it ended
//! well, for its time (libfaketime moves the wall clock), within `max_bytes`.

use crate::common::*;
use serde_json::{json, Value};
use std::time::Duration;

const ADMIN: &str = "admin-token-cache-0001";
const OTHER_KEY: &str = "sk-client-cache-other-01";
const TEAM_A: &str = "sk-client-cache-team-a-01";
const TEAM_B: &str = "sk-client-cache-team-b-01";
const MASKED_KEY: &str = "sk-client-cache-masked-01";
const READ_KEY: &str = "sk-client-cache-read-0001";
const TPM_KEY: &str = "sk-client-cache-tpm-00001";

/// Group `default` caches per key for 60 s; the account `team` shares per account (its two
/// keys); alpha-5.5's hits cost a tenth of the original, beta-sonnet's are free.
fn config(mock: u16, admin: u16, cache: &str) -> String {
    format!(
        r#"
providers:
  - {{ name: oa, protocol: openai, base_url: "http://127.0.0.1:{mock}/oa", api_key: {UPSTREAM_KEY}, models: [alpha-5.5, alpha-embed-3] }}
  - {{ name: an, protocol: anthropic, base_url: "http://127.0.0.1:{mock}/an", api_key: {UPSTREAM_KEY}, models: [beta-sonnet-4-6] }}
  - {{ name: ge, protocol: gemini, base_url: "http://127.0.0.1:{mock}/ge", api_key: {UPSTREAM_KEY}, models: [gamma-3.5-flash] }}
groups:
  default: {{ platforms: [openai, anthropic, gemini], cache: {{ ttl: 60, scope: key }} }}
cache: {cache}
guardrails:
  - {{ name: secrets, kind: secrets, phase: input, action: mask }}
  - {{ name: watch, kind: secrets, phase: output, action: monitor }}
admin: {{ listen: 127.0.0.1:{admin}, token: {ADMIN} }}
prices:
  alpha-5.5: {{ input: 2.0, output: 8.0, cache_hit_ratio: 0.1 }}
  alpha-embed-3: {{ input: 0.1, output: 0.0 }}
  beta-sonnet-4-6: {{ input: 3.0, output: 15.0 }}
  gamma-3.5-flash: {{ input: 0.5, output: 1.5, cache_hit: 0.25 }}
accounts:
  - {{ name: team, balance: 5.0, cache: {{ ttl: 60, scope: account }} }}
keys:
  - {{ key: {CLIENT_KEY}, name: tester, group: default, balance: 5.0 }}
  - {{ key: {OTHER_KEY}, name: other, group: default, balance: 5.0 }}
  - {{ key: {TEAM_A}, name: team-a, group: default, balance: 5.0, account: team }}
  - {{ key: {TEAM_B}, name: team-b, group: default, balance: 5.0, account: team }}
  - {{ key: {MASKED_KEY}, name: masked, group: default, balance: 5.0, guardrails: [secrets] }}
  - {{ key: {READ_KEY}, name: read, group: default, balance: 5.0, guardrails: [watch] }}
  - {{ key: {TPM_KEY}, name: tpm, group: default, balance: 5.0, rpm: 5, tpm: 1500 }}
"#
    )
}

struct Setup {
    mock: Proc,
    gw: Gateway,
    admin: u16,
}

fn setup(cache: &str, env: &[(&str, &str)]) -> Setup {
    let mock = start_mock();
    let admin = free_port();
    let gw = start_gateway_env(&config(mock.port, admin, cache), env);
    Setup { mock, gw, admin }
}

/// What one call got: status, `x-tollgate-cache`, `age`, body.
struct Got {
    status: u16,
    cache: Option<String>,
    age: Option<u64>,
    body: String,
}

fn chat_body(text: &str, stream: bool) -> Value {
    json!({"model": "alpha-5.5", "messages": [{"role": "user", "content": text}], "temperature": 0, "stream": stream})
}

impl Setup {
    async fn call(&self, key: &str, path: &str, tag: &str, body: &Value, headers: &[(&str, &str)]) -> Got {
        let mut req = client().post(self.gw.url(path)).bearer_auth(key).header("x-test-tag", tag);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let r = req.json(body).send().await.expect("request");
        let header = |name: &str| r.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
        let (cache, age) = (header("x-tollgate-cache"), header("age").and_then(|a| a.parse().ok()));
        Got { status: r.status().as_u16(), cache, age, body: r.text().await.unwrap_or_default() }
    }

    async fn chat(&self, key: &str, tag: &str, body: &Value, headers: &[(&str, &str)]) -> Got {
        self.call(key, "/v1/chat/completions", tag, body, headers).await
    }

    /// Requests the mock received with `tag`.
    async fn reached(&self, tag: &str) -> usize {
        mock_requests(&self.mock, tag).await.len()
    }

    async fn metrics(&self) -> String {
        admin_metrics(self.admin, ADMIN).await
    }

    async fn requests(&self, query: &str) -> Value {
        let url = format!("http://127.0.0.1:{}/admin/requests?{query}", self.admin);
        client().get(url).bearer_auth(ADMIN).send().await.expect("requests").json().await.expect("json")
    }
}

/// The answer with its own id taken out (a hit's is new).
fn without_id(body: &str) -> Value {
    let mut v: Value = serde_json::from_str(body).expect("json");
    v.as_object_mut().expect("object").remove("id");
    v
}

/// A stream's `data:` payloads, each without its id.
fn events(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| {
            let mut v: Value = serde_json::from_str(d).expect("event json");
            if let Some(o) = v.as_object_mut() {
                o.remove("id");
            }
            if let Some(m) = v.get_mut("message").and_then(Value::as_object_mut) {
                m.remove("id");
            }
            v
        })
        .collect()
}

/// A whole and a streamed chat completion: the second of each is a hit the mock never sees,
/// the same answer (a new id, its `age`), billed a tenth of the original (`cache_hit_ratio`),
/// its record saying `cache: hit` and what it saved; no `tpm` spent; the metrics count it.
#[tokio::test(flavor = "multi_thread")]
async fn a_hit_answers_again_whole_and_streamed_without_the_upstream_billed_at_its_hit_price() {
    let s = setup("{}", &[]);
    let body = chat_body("cache me", false);
    let usage_header = [("x-mock-usage", "1000,200")];
    let before = balance(&s.gw, CLIENT_KEY).await;
    let miss = s.chat(CLIENT_KEY, "whole", &body, &usage_header).await;
    assert_eq!((miss.status, miss.cache.as_deref()), (200, Some("miss")), "{}", miss.body);
    let hit = s.chat(CLIENT_KEY, "whole", &body, &usage_header).await;
    assert_eq!((hit.status, hit.cache.as_deref()), (200, Some("hit")), "{}", hit.body);
    assert!(hit.age.is_some_and(|a| a < 60), "age: {:?}", hit.age);
    assert_eq!(s.reached("whole").await, 1, "the hit never reached the upstream");
    assert_eq!(without_id(&hit.body), without_id(&miss.body), "the same answer");
    let (miss_id, hit_id) = (without_id_of(&miss.body), without_id_of(&hit.body));
    assert!(hit_id.starts_with("chatcmpl-") && hit_id != miss_id, "a fresh id: {hit_id} after {miss_id}");
    // Billed: the miss at list, the hit at a tenth of it.
    let list = cost_nanos("alpha-5.5", 1000, 200);
    let u = wait_requests(&s.gw, CLIENT_KEY, 2).await;
    assert_eq!(nanos(&u["total"]["cost"]), list + list / 10, "{u}");
    assert_eq!(before - balance(&s.gw, CLIENT_KEY).await, list + list / 10);
    // The request log says which was which and what the hit saved.
    let page = s.requests("model=alpha-5.5").await;
    let logged: Vec<(&str, Option<i64>)> = page["data"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| (e["cache"].as_str().unwrap_or("-"), e["cache_saved_nanos"].as_i64()))
        .collect();
    assert_eq!(logged, [("hit", Some(list - list / 10)), ("miss", None)], "{page}");

    // Streamed: the events again, at once, the usage event only for a client that asks for it.
    let stream = chat_body("stream me", true);
    let miss = s.chat(CLIENT_KEY, "stream", &stream, &usage_header).await;
    assert_eq!(miss.cache.as_deref(), Some("miss"));
    let hit = s.chat(CLIENT_KEY, "stream", &stream, &usage_header).await;
    assert_eq!(hit.cache.as_deref(), Some("hit"), "{}", hit.body);
    assert_eq!(events(&hit.body), events(&miss.body), "the same events");
    assert!(hit.body.ends_with("data: [DONE]\n\n"), "{}", hit.body);
    assert!(!hit.body.contains("\"usage\""), "the client asked for no usage: {}", hit.body);
    let mut asks_usage = stream.clone();
    asks_usage["stream_options"] = json!({"include_usage": true});
    let with_usage = s.chat(CLIENT_KEY, "stream", &asks_usage, &usage_header).await;
    assert_eq!(with_usage.cache.as_deref(), Some("hit"), "stream_options does not change the key");
    assert!(with_usage.body.contains("\"prompt_tokens\":1000"), "its usage event: {}", with_usage.body);
    assert_eq!(s.reached("stream").await, 1);

    let m = s.metrics().await;
    assert_eq!(metric(&m, "tollgate_cache_lookups_total{result=\"hit\"}"), 3.0, "{m}");
    assert_eq!(metric(&m, "tollgate_cache_lookups_total{result=\"miss\"}"), 2.0, "{m}");
    assert_eq!(metric(&m, "tollgate_cache_stores_total{outcome=\"kept\"}"), 2.0, "{m}");
    let saved = metric(&m, "tollgate_cache_saved_usd_total{model=\"alpha-5.5\"}");
    assert!((saved - 3.0 * (list - list / 10) as f64 / 1e9).abs() < 1e-9, "{saved}: {m}");
    assert!(metric(&m, "tollgate_cache_bytes") > 0.0, "{m}");
    assert!(s.gw.log().contains("cache=hit"), "the access log");
    // The operator's usage by model counts the hits and what they saved.
    let (status, by_model) = admin_call(s.admin, ADMIN, reqwest::Method::GET, "/admin/usage?group_by=model", None).await;
    let row = by_model["data"].as_array().expect("rows").iter().find(|r| r["model"] == "alpha-5.5").cloned().unwrap_or_default();
    assert_eq!((status, row["cache_hits"].as_u64()), (200, Some(3)), "{by_model}");
    assert_eq!(nanos(&row["cache_saved"]), 3 * (list - list / 10), "{row}");

    // The usage records as stored: the hits say so, with what they saved.
    let mut s = s;
    s.gw.signal("TERM");
    wait_exit(&mut s.gw.proc.child, Duration::from_secs(20), "tollgate").await;
    let db = sled::open(s.gw.dir.path().join("data")).expect("data");
    let mut records: Vec<tollgate::records::usage::UsageRecord> = Vec::new();
    for entry in db.open_tree("usage_records").expect("tree").iter() {
        let (_, value) = entry.expect("entry");
        records.extend(tollgate::store::usage_codec::decode_records(&value).expect("records"));
    }
    records.sort_by_key(|r| r.seq);
    let kept: Vec<(Option<&str>, Option<i64>, u64, i64)> =
        records.iter().map(|r| (r.cache.as_deref(), r.cache_saved_nanos, r.input_tokens, r.cost_nanos)).collect();
    let hit = (Some("hit"), Some(list - list / 10), 1000, list / 10);
    assert_eq!(kept, [(None, None, 1000, list), hit, (None, None, 1000, list), hit, hit]);
}

fn without_id_of(body: &str) -> String {
    serde_json::from_str::<Value>(body).expect("json")["id"].as_str().unwrap_or_default().to_string()
}

/// Key scope: another key's identical call is its own miss. Account scope: the account's keys
/// share. Each protocol's calls are cached in their own shape (messages, generate-content,
/// embeddings); a free hit (`cache_hit` unset) and a per-token one (`cache_hit`).
#[tokio::test(flavor = "multi_thread")]
async fn a_hit_never_crosses_its_scope_and_every_protocol_is_cached_in_its_shape() {
    let s = setup("{}", &[]);
    let body = chat_body("scoped", false);
    assert_eq!(s.chat(CLIENT_KEY, "scope", &body, &[]).await.cache.as_deref(), Some("miss"));
    assert_eq!(s.chat(OTHER_KEY, "scope", &body, &[]).await.cache.as_deref(), Some("miss"), "key scope: never another key's");
    assert_eq!(s.chat(CLIENT_KEY, "scope", &body, &[]).await.cache.as_deref(), Some("hit"));
    assert_eq!(s.reached("scope").await, 2);
    // The account's entry (scope: account) is nearer than the group's: its keys share.
    assert_eq!(s.chat(TEAM_A, "team", &body, &[]).await.cache.as_deref(), Some("miss"));
    assert_eq!(s.chat(TEAM_B, "team", &body, &[]).await.cache.as_deref(), Some("hit"), "account scope: shared");
    assert_eq!(s.reached("team").await, 1);

    // Messages (a free hit), streamed.
    let messages = json!({"model": "beta-sonnet-4-6", "max_tokens": 64, "temperature": 0, "stream": true,
        "messages": [{"role": "user", "content": "hi"}]});
    let headers = [("anthropic-version", "2023-06-01"), ("x-mock-usage", "300,20")];
    let miss = s.call(CLIENT_KEY, "/v1/messages", "msg", &messages, &headers).await;
    let hit = s.call(CLIENT_KEY, "/v1/messages", "msg", &messages, &headers).await;
    assert_eq!((miss.cache.as_deref(), hit.cache.as_deref()), (Some("miss"), Some("hit")), "{} {}", miss.status, miss.body);
    assert_eq!(events(&hit.body), events(&miss.body));
    assert!(hit.body.contains("event: message_stop"), "{}", hit.body);
    // Generate-content at $0.25 per 1M tokens of the original usage.
    let gemini = json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "generationConfig": {"temperature": 0}});
    let path = "/v1beta/models/gamma-3.5-flash:generateContent";
    let miss = s.call(CLIENT_KEY, path, "ge", &gemini, &[("x-mock-usage", "4000,0")]).await;
    let hit = s.call(CLIENT_KEY, path, "ge", &gemini, &[("x-mock-usage", "4000,0")]).await;
    assert_eq!((miss.cache.as_deref(), hit.cache.as_deref()), (Some("miss"), Some("hit")), "{}", hit.body);
    // Embeddings do not sample: cached without a temperature.
    let embed = json!({"model": "alpha-embed-3", "input": "vector"});
    let miss = s.call(CLIENT_KEY, "/v1/embeddings", "emb", &embed, &[]).await;
    let hit = s.call(CLIENT_KEY, "/v1/embeddings", "emb", &embed, &[]).await;
    assert_eq!((miss.cache.as_deref(), hit.cache.as_deref()), (Some("miss"), Some("hit")));
    assert_eq!(miss.body, hit.body);
    assert_eq!((s.reached("msg").await, s.reached("ge").await, s.reached("emb").await), (1, 1, 1));
    let u = wait_requests(&s.gw, CLIENT_KEY, 8).await;
    let by_model = |m: &str| u["models"].as_array().expect("models").iter().find(|r| r["model"] == m).cloned().expect("model row");
    let sonnet = by_model("beta-sonnet-4-6");
    assert_eq!(nanos(&sonnet["cost"]), cost_nanos("beta-sonnet-4-6", 300, 20), "a free hit: {sonnet}");
    let flash = by_model("gamma-3.5-flash");
    assert_eq!(nanos(&flash["cost"]), cost_nanos("gamma-3.5-flash", 4000, 0) + 1_000_000, "4,000 tokens at $0.25/1M: {flash}");
    // A call that samples is not cached, and says so.
    let sampled = json!({"model": "alpha-5.5", "messages": [{"role": "user", "content": "x"}], "temperature": 0.7});
    for _ in 0..2 {
        assert_eq!(s.chat(CLIENT_KEY, "sampled", &sampled, &[]).await.cache.as_deref(), Some("bypass"));
    }
    assert_eq!(s.reached("sampled").await, 2);
    // Input guardrails that let a call through (its secret masked in what is sent and keyed):
    // cached. Guardrails that read the answer: never.
    let secret = chat_body("my key is AKIAIOSFODNN7EXAMPLE", false);
    assert_eq!(s.chat(MASKED_KEY, "masked", &secret, &[]).await.cache.as_deref(), Some("miss"));
    assert_eq!(s.chat(MASKED_KEY, "masked", &secret, &[]).await.cache.as_deref(), Some("hit"));
    assert_eq!(s.reached("masked").await, 1);
    for _ in 0..2 {
        assert_eq!(s.chat(READ_KEY, "read", &body, &[]).await.cache.as_deref(), Some("bypass"));
    }
    assert_eq!(s.reached("read").await, 2);
}

/// Only answers that ended well are kept: a stream cut by the upstream and an error are not;
/// `no-store` neither reads nor keeps, `refresh` goes upstream and keeps the new answer; a
/// bad directive is refused naming it; `DELETE /admin/cache` empties by key.
#[tokio::test(flavor = "multi_thread")]
async fn a_cut_stream_an_error_and_no_store_are_never_kept_and_refresh_and_delete_are_honoured() {
    let s = setup("{}", &[]);
    let stream = chat_body("cut", true);
    let cut = client()
        .post(s.gw.url("/v1/chat/completions"))
        .bearer_auth(CLIENT_KEY)
        .header("x-test-tag", "cut")
        .header("x-mock-cut-after", "2")
        .header("x-mock-deltas", "6")
        .json(&stream)
        .send()
        .await
        .expect("request");
    assert_eq!(cut.status(), 200);
    // The client's stream ends broken (what it read is not the point).
    let _ = cut.text().await;
    assert_eq!(s.chat(CLIENT_KEY, "cut", &stream, &[]).await.cache.as_deref(), Some("miss"), "the cut stream was not kept");
    assert_eq!(s.reached("cut").await, 2);
    let body = chat_body("error", false);
    let failed = s.chat(CLIENT_KEY, "err", &body, &[("x-mock-status", "500")]).await;
    assert_eq!((failed.status, failed.cache.as_deref()), (502, None), "the upstream's 500: {}", failed.body);
    assert_eq!(s.chat(CLIENT_KEY, "err", &body, &[]).await.cache.as_deref(), Some("miss"), "the 500 was not kept");
    assert_eq!(s.chat(CLIENT_KEY, "err", &body, &[]).await.cache.as_deref(), Some("hit"));
    // no-store: upstream, nothing kept.
    let plain = chat_body("no-store", false);
    assert_eq!(s.chat(CLIENT_KEY, "ns", &plain, &[("x-tollgate-cache", "no-store")]).await.cache.as_deref(), Some("bypass"));
    assert_eq!(s.chat(CLIENT_KEY, "ns", &plain, &[]).await.cache.as_deref(), Some("miss"), "nothing was kept");
    assert_eq!(s.chat(CLIENT_KEY, "ns", &plain, &[("x-tollgate-cache", "no-store")]).await.cache.as_deref(), Some("bypass"), "nor read");
    assert_eq!(s.reached("ns").await, 3);
    // refresh: upstream, and its answer replaces the kept one (its usage now).
    let r = s.chat(CLIENT_KEY, "ns", &plain, &[("x-tollgate-cache", "refresh"), ("x-mock-usage", "77,7")]).await;
    assert_eq!(r.cache.as_deref(), Some("miss"));
    let again = s.chat(CLIENT_KEY, "ns", &plain, &[]).await;
    assert_eq!(again.cache.as_deref(), Some("hit"));
    assert_eq!(serde_json::from_str::<Value>(&again.body).expect("json")["usage"]["prompt_tokens"], 77, "the refreshed answer");
    assert_eq!(s.reached("ns").await, 4);
    // A directive tollgate does not know is refused, named.
    let bad = s.chat(CLIENT_KEY, "bad", &plain, &[("x-tollgate-cache", "forever")]).await;
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert!(bad.body.contains("x-tollgate-cache") && bad.body.contains("'forever'"), "{}", bad.body);
    // Emptied for the key: its calls go upstream again; another key's answers stay.
    assert_eq!(s.chat(OTHER_KEY, "del", &plain, &[]).await.cache.as_deref(), Some("miss"));
    let (status, out) = admin_call(s.admin, ADMIN, reqwest::Method::DELETE, "/admin/cache?key=tester", None).await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["deleted"], 3, "tester's three answers: {out}");
    assert_eq!(s.chat(CLIENT_KEY, "ns", &plain, &[]).await.cache.as_deref(), Some("miss"));
    assert_eq!(s.chat(OTHER_KEY, "del", &plain, &[]).await.cache.as_deref(), Some("hit"));
    let (status, out) = admin_call(s.admin, ADMIN, reqwest::Method::DELETE, "/admin/cache?model=alpha-5.5", None).await;
    assert_eq!((status, out["deleted"].as_u64()), (200, Some(2)), "{out}");
}

/// An answer is served for its time only (the wall clock moved by libfaketime), and the least
/// recently used go once more than `max_bytes` is kept.
#[tokio::test(flavor = "multi_thread")]
async fn an_answer_expires_with_its_ttl_and_the_least_recently_used_go_at_max_bytes() {
    const T0: u64 = 1_796_000_000;
    let dir = tempfile::tempdir().expect("dir");
    let clock = FakeClock::new(dir.path());
    clock.set(T0);
    let env = clock.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let s = setup("{ max_bytes: 2000 }", &env);
    let body = chat_body("ttl", false);
    assert_eq!(s.chat(CLIENT_KEY, "ttl", &body, &[]).await.cache.as_deref(), Some("miss"));
    clock.set(T0 + 59);
    let hit = s.chat(CLIENT_KEY, "ttl", &body, &[]).await;
    assert_eq!((hit.cache.as_deref(), hit.age), (Some("hit"), Some(59)));
    // A request's ttl sets its own.
    let short = chat_body("short ttl", false);
    assert_eq!(s.chat(CLIENT_KEY, "ttl", &short, &[("x-tollgate-cache", "ttl=5")]).await.cache.as_deref(), Some("miss"));
    clock.set(T0 + 60);
    assert_eq!(s.chat(CLIENT_KEY, "ttl", &body, &[]).await.cache.as_deref(), Some("miss"), "expired at 60 s");
    assert_eq!(s.chat(CLIENT_KEY, "ttl", &short, &[]).await.cache.as_deref(), Some("hit"), "5 s from T0+59");
    clock.set(T0 + 65);
    assert_eq!(s.chat(CLIENT_KEY, "ttl", &short, &[]).await.cache.as_deref(), Some("miss"), "expired at T0+64");
    assert_eq!(s.reached("ttl").await, 4);

    // ~600 bytes an answer, 2,000 kept: a fourth answer evicts the least recently used.
    let (status, _) = admin_call(s.admin, ADMIN, reqwest::Method::DELETE, "/admin/cache", None).await;
    assert_eq!(status, 200);
    let long = |i: usize| chat_body(&format!("answer {i}"), false);
    let deltas = [("x-mock-deltas", "60")];
    for i in 0..3 {
        assert_eq!(s.chat(CLIENT_KEY, "lru", &long(i), &deltas).await.cache.as_deref(), Some("miss"));
    }
    assert_eq!(s.chat(CLIENT_KEY, "lru", &long(0), &deltas).await.cache.as_deref(), Some("hit"), "0 is now the most recently used");
    let bytes = metric(&s.metrics().await, "tollgate_cache_bytes");
    assert!(bytes > 1500.0 && bytes <= 2000.0, "three answers kept: {bytes}");
    assert_eq!(s.chat(CLIENT_KEY, "lru", &long(3), &deltas).await.cache.as_deref(), Some("miss"));
    assert_eq!(s.chat(CLIENT_KEY, "lru", &long(1), &deltas).await.cache.as_deref(), Some("miss"), "1 went first");
    assert_eq!(s.chat(CLIENT_KEY, "lru", &long(0), &deltas).await.cache.as_deref(), Some("hit"));
    assert!(metric(&s.metrics().await, "tollgate_cache_bytes") <= 2000.0);
}

/// A hit is counted under `rpm` like any call, and spends nothing of a `tpm`: a key whose
/// minute's tokens are spent is still answered from the cache, until its requests run out.
#[tokio::test(flavor = "multi_thread")]
async fn a_hit_counts_under_rpm_and_spends_no_tpm() {
    let s = setup("{}", &[]);
    let body = json!({"model": "alpha-5.5", "max_tokens": 100, "temperature": 0, "messages": [{"role": "user", "content": "tpm"}]});
    let spend = [("x-mock-usage", "1300,100")];
    assert_eq!(s.chat(TPM_KEY, "tpm", &body, &spend).await.cache.as_deref(), Some("miss"));
    // 1,400 of the minute's 1,500 tokens are spent: another call is refused for its tokens...
    let other = json!({"model": "alpha-5.5", "max_tokens": 100, "temperature": 0, "messages": [{"role": "user", "content": "another"}]});
    let refused = s.chat(TPM_KEY, "tpm", &other, &[]).await;
    assert_eq!(refused.status, 429, "{}", refused.body);
    // ...while the kept answer is served, three times, then rpm (5) refuses.
    for _ in 0..3 {
        let hit = s.chat(TPM_KEY, "tpm", &body, &spend).await;
        assert_eq!((hit.status, hit.cache.as_deref()), (200, Some("hit")), "{}", hit.body);
    }
    let limited = s.chat(TPM_KEY, "tpm", &body, &spend).await;
    assert_eq!(limited.status, 429, "the sixth request of the minute: {}", limited.body);
    assert_eq!(s.reached("tpm").await, 1);
}
