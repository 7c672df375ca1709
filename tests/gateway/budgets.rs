//! Issue 29, the money half of key policy against the real daemon: spend windows (429
//! `budget_exceeded` with `Retry-After`, kept across a restart, never overspent by parallel
//! requests), shared accounts, tags on usage records and `group_by=tag:<name>`, the audit trail
//! of balance moves, and validation of all of it in the file and the admin API.

use crate::common::*;
use serde_json::{json, Value};

const ADMIN_TOKEN: &str = "budgets-admin-token-00000000001";
/// A day budget of $0.02 and plenty of balance.
const DAILY_KEY: &str = "sk-budget-daily-0001";
/// A day budget and no balance: which answers first?
const BROKE_KEY: &str = "sk-budget-broke-0001";
/// Two keys of the account `team` ($0.01 of balance, a week budget of $0.5), tagged.
const TEAM_A: &str = "sk-budget-team-a-001";
const TEAM_B: &str = "sk-budget-team-b-001";
/// A day budget of $0.02, for the parallel requests.
const PARALLEL_KEY: &str = "sk-budget-parallel-01";

/// alpha-5.5 ($2 in, $8 out per 1M) asked for 1000 output tokens is held at about $0.0081; the
/// mock reports 100 in and 500 out: $0.0042 each.
const USAGE: &str = "100,500";
const COST: i64 = 100 * 2_000 + 500 * 8_000;

fn config(mock_port: u16, admin_port: u16) -> String {
    let base = standard_config(mock_port);
    let base = with_key(&base, &format!("{{ key: {DAILY_KEY}, name: daily, group: default, balance: 5.0, budgets: {{ day: 0.02 }} }}"));
    let base = with_key(&base, &format!("{{ key: {BROKE_KEY}, name: broke, group: default, balance: 0, budgets: {{ day: 0.02 }} }}"));
    let base = with_key(
        &base,
        &format!("{{ key: {TEAM_A}, name: team-a, group: default, balance: 5.0, account: team, tags: {{ team: search, env: prod }} }}"),
    );
    let base =
        with_key(&base, &format!("{{ key: {TEAM_B}, name: team-b, group: default, balance: 5.0, account: team, tags: {{ team: ads }} }}"));
    let base =
        with_key(&base, &format!("{{ key: {PARALLEL_KEY}, name: parallel, group: default, balance: 5.0, budgets: {{ day: 0.02 }} }}"));
    format!(
        "{base}accounts:\n  - {{ name: team, balance: 0.01, budgets: {{ week: 0.5 }} }}\nadmin: {{ listen: 127.0.0.1:{admin_port}, token: {ADMIN_TOKEN} }}\n"
    )
}

async fn chat(gw: &Gateway, key: &str) -> reqwest::Response {
    client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(key)
        .header("x-mock-usage", USAGE)
        .json(&json!({"model": "alpha-5.5", "max_tokens": 1000, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("request")
}

async fn admin(port: u16, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
    admin_call(port, ADMIN_TOKEN, method, path, body).await
}

/// Seconds from now to the next UTC midnight.
fn to_midnight() -> u64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs();
    86_400 - now % 86_400
}

#[tokio::test]
async fn a_day_budget_answers_429_until_the_window_ends_and_survives_a_restart() {
    let mock = start_mock();
    let admin_port = free_port();
    let mut gw = start_gateway(&config(mock.port, admin_port));
    for _ in 0..3 {
        assert_eq!(chat(&gw, DAILY_KEY).await.status(), 200);
    }
    // $0.0126 spent: the next hold ($0.0081) does not fit the $0.0074 left.
    let resp = chat(&gw, DAILY_KEY).await;
    assert_eq!(resp.status(), 429);
    let retry: u64 = resp.headers().get("retry-after").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok()).expect("Retry-After");
    let expected = to_midnight();
    assert!(retry.abs_diff(expected) <= 5, "Retry-After {retry}, the window ends in {expected} s");
    let body: Value = resp.json().await.expect("json");
    assert_eq!(body["error"]["code"], "budget_exceeded", "{body}");
    // The key's usage shows the window.
    let u = usage(&gw, DAILY_KEY).await;
    assert_eq!(nanos(&u["budgets"]["day"]["spent"]), 3 * COST, "{u}");
    assert_eq!(nanos(&u["budgets"]["day"]["cap"]), 20_000_000);
    // In the other protocols' shapes too.
    let resp = client()
        .post(gw.url("/v1/messages"))
        .header("x-api-key", DAILY_KEY)
        .json(&json!({"model": "beta-opus-4-7", "max_tokens": 1000, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.json::<Value>().await.expect("json")["error"]["type"], "rate_limit_error");
    let resp = client()
        .post(gw.url("/v1beta/models/gamma-3.5-flash:generateContent"))
        .header("x-goog-api-key", DAILY_KEY)
        .json(&json!({"contents": [{"parts": [{"text": "hi"}]}], "generationConfig": {"maxOutputTokens": 8000}}))
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.json::<Value>().await.expect("json")["error"]["status"], "RESOURCE_EXHAUSTED");
    let metrics = admin_metrics(admin_port, ADMIN_TOKEN).await;
    assert_eq!(metric(&metrics, "tollgate_refusals_total{code=\"budget_exceeded\"}"), 3.0, "{metrics}");

    // Killed and started again in the middle of the window: the spend is kept.
    gw.kill_hard();
    gw.start_again();
    assert_eq!(chat(&gw, DAILY_KEY).await.status(), 429, "a restart resets nothing");
    // Raising the cap through the admin API applies at once to what the window spent.
    let id = tollgate::access::auth::seed_key_id(DAILY_KEY);
    let (status, view) =
        admin(admin_port, reqwest::Method::PATCH, &format!("/admin/keys/{id}"), Some(json!({"budgets": {"day": 1.0}}))).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(nanos(&view["budgets"]["day"]["spent"]), 3 * COST, "{view}");
    assert_eq!(chat(&gw, DAILY_KEY).await.status(), 200);
    // `null` clears the budgets.
    let (_, view) = admin(admin_port, reqwest::Method::PATCH, &format!("/admin/keys/{id}"), Some(json!({"budgets": null}))).await;
    assert_eq!(view["budgets"], json!({}), "{view}");
}

#[tokio::test]
async fn a_window_is_checked_before_the_balance() {
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port, free_port()));
    // No balance, window untouched: the balance answers.
    let resp = chat(&gw, BROKE_KEY).await;
    assert_eq!(resp.status(), 402);
    assert_eq!(resp.json::<Value>().await.expect("json")["error"]["code"], "insufficient_quota");
    // A request that would not fit the window even empty: the window answers first.
    let resp = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(BROKE_KEY)
        .json(&json!({"model": "alpha-5.5", "max_tokens": 3000, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.json::<Value>().await.expect("json")["error"]["code"], "budget_exceeded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parallel_requests_never_take_a_window_past_its_cap() {
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port, free_port()));
    // The mock holds each answer 300 ms, so the requests overlap.
    let requests = (0..24).map(|_| {
        client()
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(PARALLEL_KEY)
            .header("x-mock-usage", USAGE)
            .header("x-mock-delay-ms", "300")
            .json(&json!({"model": "alpha-5.5", "max_tokens": 1000, "messages": [{"role": "user", "content": "hi"}]}))
            .send()
    });
    let statuses: Vec<u16> =
        futures_util::future::join_all(requests).await.into_iter().map(|r| r.expect("request").status().as_u16()).collect();
    let served = statuses.iter().filter(|s| **s == 200).count() as i64;
    assert!(statuses.iter().all(|s| *s == 200 || *s == 429), "{statuses:?}");
    assert!(served >= 2 && statuses.contains(&429), "{statuses:?}");
    let u = wait_requests(&gw, PARALLEL_KEY, served as u64).await;
    let spent = nanos(&u["budgets"]["day"]["spent"]);
    assert_eq!(spent, served * COST, "{u}");
    assert!(spent <= 20_000_000, "the window's cap was passed: {u}");
}

#[tokio::test]
async fn keys_of_an_account_share_its_balance_tags_group_usage_and_top_ups_are_audited() {
    let mock = start_mock();
    let admin_port = free_port();
    let gw = start_gateway(&config(mock.port, admin_port));
    // The account has $0.01: one request of either key is held at $0.0081, then $0.0058 is left.
    assert_eq!(chat(&gw, TEAM_A).await.status(), 200);
    let resp = chat(&gw, TEAM_B).await;
    assert_eq!(resp.status(), 402, "the other key draws on the same account");
    let body: Value = resp.json().await.expect("json");
    assert!(body["error"]["message"].as_str().unwrap_or_default().contains("account 'team'"), "{body}");
    let (status, account) = admin(admin_port, reqwest::Method::GET, "/admin/accounts/team", None).await;
    assert_eq!(status, 200, "{account}");
    assert_eq!(nanos(&account["balance"]), 10_000_000 - COST, "{account}");
    assert_eq!(nanos(&account["budgets"]["week"]["spent"]), COST);
    assert_eq!(account["keys"].as_array().map(Vec::len), Some(2));

    // A top-up with its reason, then both keys are served.
    let (status, _) =
        admin(admin_port, reqwest::Method::PATCH, "/admin/accounts/team", Some(json!({"balance_delta": 1.0, "reason": "invoice 2026-11"})))
            .await;
    assert_eq!(status, 200);
    assert_eq!(chat(&gw, TEAM_B).await.status(), 200);
    assert_eq!(chat(&gw, TEAM_A).await.status(), 200);
    let key_a = tollgate::access::auth::seed_key_id(TEAM_A);
    let (status, _) = admin(
        admin_port,
        reqwest::Method::PATCH,
        &format!("/admin/keys/{key_a}"),
        Some(json!({"balance_delta": -0.5, "reason": "refund to card", "tags": {"team": "search-v2"}})),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(chat(&gw, TEAM_A).await.status(), 200);
    let (_, audit) = admin(admin_port, reqwest::Method::GET, "/admin/audit", None).await;
    let entries: Vec<(&str, &str, f64, Option<&str>)> = audit["data"]
        .as_array()
        .expect("list")
        .iter()
        .map(|e| {
            (e["kind"].as_str().unwrap_or(""), e["id"].as_str().unwrap_or(""), e["delta"].as_f64().unwrap_or(0.0), e["reason"].as_str())
        })
        .collect();
    assert_eq!(entries, [("key", key_a.as_str(), -0.5, Some("refund to card")), ("account", "team", 1.0, Some("invoice 2026-11"))]);
    assert_eq!(nanos(&audit["data"][1]["balance_before"]), 10_000_000 - COST);
    // Pages of one: the newest, then the other, then no next page.
    let (_, first) = admin(admin_port, reqwest::Method::GET, "/admin/audit?limit=1", None).await;
    assert_eq!(first["data"][0], audit["data"][0]);
    let next = first["next"].as_str().expect("a next page").to_string();
    let (_, second) = admin(admin_port, reqwest::Method::GET, &format!("/admin/audit?limit=1&cursor={next}"), None).await;
    assert_eq!((&second["data"][0], &second["next"]), (&audit["data"][1], &Value::Null), "{second}");
    assert_eq!(nanos(&audit["data"][1]["balance_after"]), 1_010_000_000 - COST);

    // Tags: each record keeps the tags its key had when it was written.
    let u: Value =
        client().get(gw.url("/v1/usage?group_by=tag:team")).bearer_auth(TEAM_A).send().await.expect("usage").json().await.expect("json");
    let rows: Vec<(String, u64)> = u["tags"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| (r["value"].as_str().unwrap_or("-").to_string(), r["requests"].as_u64().unwrap_or(0)))
        .collect();
    assert_eq!(rows, [("search".to_string(), 2), ("search-v2".to_string(), 1)], "{u}");
    let (status, all) = admin(admin_port, reqwest::Method::GET, "/admin/usage?group_by=tag:env", None).await;
    assert_eq!(status, 200, "{all}");
    let rows: Vec<(Value, u64)> =
        all["data"].as_array().expect("rows").iter().map(|r| (r["value"].clone(), r["requests"].as_u64().unwrap_or(0))).collect();
    // team-b has no env tag, and the later team-a tags dropped it.
    assert_eq!(rows, [(Value::Null, 2), (json!("prod"), 2)], "{all}");
    let (status, bad) = admin(admin_port, reqwest::Method::GET, "/admin/usage?group_by=tags", None).await;
    assert_eq!((status, bad["error"]["param"].as_str()), (400, Some("group_by")));
}

#[tokio::test]
async fn accounts_and_budgets_are_validated_on_write() {
    let mock = start_mock();
    let admin_port = free_port();
    let _gw = start_gateway(&config(mock.port, admin_port));
    let tags: serde_json::Map<String, Value> = (0..17).map(|i| (format!("t{i}"), json!("v"))).collect();
    for (body, field) in [
        (json!({"name": "x", "budgets": {"year": 5}}), Some("budgets")),
        (json!({"name": "x", "budgets": {"day": -1}}), Some("budgets")),
        (json!({"name": "x", "account": "nobody"}), Some("account")),
        (json!({"name": "x", "tags": tags}), Some("tags")),
        (json!({"name": "x", "tags": {"a".repeat(65): "v"}}), Some("tags")),
    ] {
        let (status, answer) = admin(admin_port, reqwest::Method::POST, "/admin/keys", Some(body.clone())).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert_eq!(answer["error"]["param"].as_str(), field, "{body}: {answer}");
    }
    let (_, keys) = admin(admin_port, reqwest::Method::GET, "/admin/keys", None).await;
    assert_eq!(keys["data"].as_array().map(Vec::len), Some(8), "nothing stored");
    // Accounts.
    let (status, created) =
        admin(admin_port, reqwest::Method::POST, "/admin/accounts", Some(json!({"name": "ops", "balance": 2.0, "budgets": {"month": 10}})))
            .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(nanos(&created["budgets"]["month"]["cap"]), 10_000_000_000);
    assert_eq!(admin(admin_port, reqwest::Method::POST, "/admin/accounts", Some(json!({"name": "ops"}))).await.0, 409);
    assert_eq!(admin(admin_port, reqwest::Method::POST, "/admin/accounts", Some(json!({"name": "a b"}))).await.0, 400);
    let (status, _) = admin(admin_port, reqwest::Method::PATCH, "/admin/accounts/ops", Some(json!({"budgets": {"week": 0}}))).await;
    assert_eq!(status, 400);
    let (status, _) = admin(admin_port, reqwest::Method::PATCH, "/admin/accounts/ops", Some(json!({"reason": "no delta"}))).await;
    assert_eq!(status, 400);
    let (_, ops) = admin(admin_port, reqwest::Method::GET, "/admin/accounts/ops", None).await;
    assert_eq!(nanos(&ops["budgets"]["month"]["cap"]), 10_000_000_000, "a refused patch changes nothing: {ops}");
    let (_, list) = admin(admin_port, reqwest::Method::GET, "/admin/accounts", None).await;
    let names: Vec<&str> = list["data"].as_array().expect("list").iter().filter_map(|a| a["name"].as_str()).collect();
    assert_eq!(names, ["ops", "team"]);
    // A key created into the account.
    let (status, key) =
        admin(admin_port, reqwest::Method::POST, "/admin/keys", Some(json!({"name": "o", "balance": 1.0, "account": "ops"}))).await;
    assert_eq!((status, key["account"].as_str()), (201, Some("ops")), "{key}");
    assert_eq!(admin(admin_port, reqwest::Method::GET, "/admin/accounts/nobody", None).await.0, 404);
}

#[test]
fn the_file_is_refused_naming_the_entry_and_field() {
    for (extra, entry, expected) in [
        ("", "{ key: sk-bad-budget-01, name: b, group: default, budgets: { year: 1 } }", "year"),
        ("", "{ key: sk-bad-budget-01, name: b, group: default, budgets: { day: -2 } }", "keys[0].budgets.day"),
        ("", "{ key: sk-bad-budget-01, name: b, group: default, account: nobody }", "keys[0].account"),
        ("", "{ key: sk-bad-budget-01, name: b, group: default, tags: { \"\": x } }", "keys[0].tags"),
        ("billing: { timezone: Mars/Olympus }\n", "{ key: sk-ok-budget-01, name: b, group: default }", "billing.timezone"),
        ("accounts:\n  - { name: \"a b\" }\n", "{ key: sk-ok-budget-01, name: b, group: default }", "accounts[0].name"),
        (
            "accounts:\n  - { name: t, budgets: { week: 0 } }\n",
            "{ key: sk-ok-budget-01, name: b, group: default }",
            "accounts[0].budgets.week",
        ),
    ] {
        let (dir, path, _) = write_config(&format!("{}{extra}", with_key(&standard_config(1), entry)));
        let (code, out) = run_tollgate(&["-t", "-c", path.to_str().expect("path")], &[]);
        assert_eq!(code, 2, "{entry}: {out}");
        assert!(out.contains(expected), "{extra}{entry}: {out}");
        drop(dir);
    }
    let (dir, path, _) = write_config(&format!(
        "{}billing: {{ timezone: Europe/Berlin }}\naccounts:\n  - {{ name: t, balance: 1, budgets: {{ month: 3 }} }}\n",
        with_key(&standard_config(1), "{ key: sk-ok-budget-01, name: b, group: default, account: t, budgets: { day: 1 } }")
    ));
    let (code, out) = run_tollgate(&["-t", "-c", path.to_str().expect("path")], &[]);
    assert_eq!(code, 0, "{out}");
    drop(dir);
}

#[tokio::test]
async fn video_tasks_follow_the_keys_model_rules_and_windows() {
    const RULES_KEY: &str = "sk-budget-video-rules-1";
    const WINDOW_KEY: &str = "sk-budget-video-window1";
    let mock = start_mock();
    let base = with_key(
        &standard_config(mock.port),
        &format!("{{ key: {RULES_KEY}, name: vr, group: default, balance: 5.0, models: {{ allow: [\"alpha-*\"] }} }}"),
    );
    let base = with_key(
        &base,
        &format!("{{ key: {WINDOW_KEY}, name: vw, group: default, balance: 5.0, budgets: {{ day: 0.3 }}, tags: {{ team: film }} }}"),
    );
    let gw = start_gateway(&format!("{base}{}", video_section(mock.port)));
    let submit = |key: &'static str| {
        client().post(gw.url("/v1/videos")).bearer_auth(key).json(&json!({"model": "genq3-pro", "prompt": "a budgeted video"})).send()
    };
    let resp = submit(RULES_KEY).await.expect("create");
    assert_eq!(resp.status(), 403);
    assert_eq!(resp.json::<Value>().await.expect("json")["error"]["code"], "model_not_allowed");
    // genq3-pro costs $0.25 (5 s at $0.05): one fits the day's $0.30, the second does not, and
    // nothing more is charged.
    let resp = submit(WINDOW_KEY).await.expect("create");
    let status = resp.status();
    assert!(status.is_success(), "{status}: {}", resp.text().await.unwrap_or_default());
    let resp = submit(WINDOW_KEY).await.expect("create");
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.json::<Value>().await.expect("json")["error"]["code"], "budget_exceeded");
    let u: Value = client()
        .get(gw.url("/v1/usage?group_by=tag:team"))
        .bearer_auth(WINDOW_KEY)
        .send()
        .await
        .expect("usage")
        .json()
        .await
        .expect("json");
    assert_eq!(nanos(&u["budgets"]["day"]["spent"]), 250_000_000, "{u}");
    assert_eq!(u["tags"][0]["value"], "film", "the charge carries the key's tags: {u}");
    assert_eq!(nanos(&u["balance"]), 5_000_000_000 - 250_000_000);
}

#[tokio::test]
async fn a_rolling_window_admits_what_fits_and_frees_at_the_second_its_retry_after_names() {
    const ROLLING_KEY: &str = "sk-budget-rolling-0001";
    let mock = start_mock();
    let dir = tempfile::tempdir().expect("dir");
    let clock = FakeClock::new(dir.path());
    // 10:00 UTC: a bucket of the 5-hour window (10 minutes) starts.
    let t0 = 1_795_860_000;
    assert_eq!(t0 % 600, 0);
    clock.set(t0);
    // Output at $8 per 1M and nothing for input: 12,500 tokens are held at exactly $0.10.
    let listed = format!("  alpha-5.5: {{ input: {}, output: {} }}\n", 2.0f64, 8.0f64);
    let body = standard_config(mock.port).replacen(&listed, "  alpha-5.5: { input: 0, output: 8 }\n", 1);
    assert!(body.contains("alpha-5.5: { input: 0, output: 8 }"));
    let body = with_key(&body, &format!("{{ key: {ROLLING_KEY}, name: rolling, group: default, balance: 100.0, budgets: {{ 5h: 2.0 }} }}"));
    let env = clock.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut gw = start_gateway_env(&body, &env);
    let url = gw.url("/v1/chat/completions");
    let call = |held: Option<usize>| {
        let mut r = client()
            .post(&url)
            .bearer_auth(ROLLING_KEY)
            .header("x-mock-usage", "0,12500")
            .json(&json!({"model": "alpha-5.5", "max_tokens": 12500, "stream": true, "messages": [{"role": "user", "content": "hi"}]}));
        if let Some(i) = held {
            r = r.header("x-mock-hold", format!("rolling-{i}"));
        }
        r.send()
    };
    // 40 at once, each held at $0.10 while the mock holds its answer: exactly 20 fit $2.
    let answers = futures_util::future::join_all((0..40).map(|i| call(Some(i)))).await;
    let statuses: Vec<u16> = answers.iter().map(|r| r.as_ref().expect("answer").status().as_u16()).collect();
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 20, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 20, "{statuses:?}");
    for i in 0..40 {
        client().post(mock.url(&format!("/__mock/release?token=rolling-{i}"))).send().await.expect("release");
    }
    for answer in answers.into_iter().flatten() {
        let _ = answer.text().await;
    }
    // Spent $2: refused until the first bucket ages out, 5 hours and one bucket after it began.
    let refused = call(None).await.expect("call");
    assert_eq!(refused.status(), 429);
    let retry: u64 = refused.headers().get("retry-after").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok()).expect("Retry-After");
    assert_eq!(retry, 5 * 3600 + 600);
    let err: Value = refused.json().await.expect("json");
    assert_eq!(err["error"]["code"], "budget_exceeded", "{err}");
    let usage: Value = client().get(gw.url("/v1/usage")).bearer_auth(ROLLING_KEY).send().await.expect("usage").json().await.expect("json");
    assert_eq!(usage["budgets"]["5h"]["spent"], 2.0, "{usage}");
    assert_eq!(usage["budgets"]["5h"]["next_frees_at"], "2026-11-28T15:10:00Z", "{usage}");
    // Killed and started again: the window's spend is kept.
    gw.kill_hard();
    gw.start_again_env(&env);
    let again = call(None).await.expect("call");
    assert_eq!(again.status(), 429, "a restart resets nothing");
    assert_eq!(again.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some(retry.to_string().as_str()));
    // One second before: still refused; at the second it named: admitted.
    clock.set(t0 + retry - 1);
    let before = call(None).await.expect("call");
    assert_eq!(before.status(), 429);
    assert_eq!(before.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
    clock.set(t0 + retry);
    let after = call(None).await.expect("call");
    assert_eq!(after.status(), 200);
    let _ = after.text().await;
}
