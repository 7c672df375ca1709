//! Plans (issue 66): a credit granted at each period's start, spent before the balance, what is
//! unused expiring or rolling over up to the cap at the period's close — each exactly once,
//! with the node killed across the boundary (libfaketime moves the wall clock; nothing sleeps).
//! A plan assigned and changed through the admin API, its limits applied beside the key's.

use crate::common::*;
use serde_json::{json, Value};

const ADMIN_TOKEN: &str = "plans-admin-token-0000001";
const DAILY: &str = "sk-plan-daily-00000001";
const SWITCH: &str = "sk-plan-switch-0000001";
/// 2026-12-01 10:00 UTC, and the next two midnights plus ten minutes (past the close's grace).
const T0: u64 = 1_796_119_200;
const DEC2: u64 = 1_796_169_600;
const DEC3: u64 = DEC2 + 86_400;
const GRACE: u64 = 600;

fn config(mock_port: u16, admin_port: u16) -> String {
    // Output at $8 per 1M and nothing for input: 25,000 output tokens are $0.20.
    let listed = format!("  alpha-5.5: {{ input: {}, output: {} }}\n", 2.0f64, 8.0f64);
    let body = standard_config(mock_port).replacen(&listed, "  alpha-5.5: { input: 0, output: 8 }\n", 1);
    assert!(body.contains("alpha-5.5: { input: 0, output: 8 }"));
    let body = with_key(&body, &format!("{{ key: {DAILY}, name: daily, group: default, balance: 0, plan: daily }}"));
    let body = with_key(&body, &format!("{{ key: {SWITCH}, name: switch, group: default, balance: 0 }}"));
    format!(
        "{body}plans:
  - {{ name: daily, credit: 1.0, period: day, rollover: 0.3 }}
  - {{ name: small, credit: 0.05, period: 12h, models: {{ allow: [alpha-4o-mini] }}, rpm: 4, price_multiplier: 2 }}
admin: {{ listen: 127.0.0.1:{admin_port}, token: {ADMIN_TOKEN} }}\n"
    )
}

async fn chat(gw: &Gateway, key: &str, model: &str, output: u64) -> reqwest::Response {
    client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(key)
        .header("x-mock-usage", format!("0,{output}"))
        .json(&json!({"model": model, "max_tokens": output, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("request")
}

async fn usage(gw: &Gateway, key: &str) -> Value {
    client().get(gw.url("/v1/usage")).bearer_auth(key).send().await.expect("usage").json().await.expect("json")
}

fn nanos(v: &Value) -> i64 {
    (v.as_f64().expect("a number") * 1e9).round() as i64
}

async fn admin(port: u16, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
    admin_call(port, ADMIN_TOKEN, method, path, body).await
}

/// The audit trail's reasons that mention `text`.
async fn audited(admin_port: u16, text: &str) -> Vec<String> {
    let (_, page) = admin(admin_port, reqwest::Method::GET, "/admin/audit?limit=1000", None).await;
    let all = page["data"].as_array().cloned().unwrap_or_default();
    all.iter().filter_map(|e| e["reason"].as_str()).filter(|r| r.contains(text)).map(str::to_string).collect()
}

/// Wait until `check` holds of the audit trail (the plan clock's tick at start is what it waits
/// for: its grant is an audited, durable write).
async fn until_audited(admin_port: u16, text: &str, count: usize) -> Vec<String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let found = audited(admin_port, text).await;
        if found.len() >= count || std::time::Instant::now() > deadline {
            return found;
        }
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn a_plans_credit_is_granted_once_per_period_across_kills_and_what_is_unused_rolls_over_up_to_its_cap() {
    let mock = start_mock();
    let admin_port = free_port();
    let dir = tempfile::tempdir().expect("dir");
    let clock = FakeClock::new(dir.path());
    clock.set(T0);
    let env = clock.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut gw = start_gateway_env(&config(mock.port, admin_port), &env);
    // The first period's credit is granted at start: the key, with a balance of 0, has $1.
    let granted = until_audited(admin_port, "plan daily: credit $1.000000 for the day period from 2026-12-01", 1).await;
    assert_eq!(granted.len(), 1, "{granted:?}");
    let u = usage(&gw, DAILY).await;
    assert_eq!(nanos(&u["balance"]), 1_000_000_000, "{u}");
    assert_eq!((u["plans"][0]["name"].as_str(), u["plans"][0]["renews_at"].as_str()), (Some("daily"), Some("2026-12-02T00:00:00Z")), "{u}");
    // Spent first: $0.20 of it.
    assert_eq!(chat(&gw, DAILY, "alpha-5.5", 25_000).await.status(), 200);
    let u = usage(&gw, DAILY).await;
    assert_eq!(
        (nanos(&u["balance"]), nanos(&u["plans"][0]["left"]), nanos(&u["plans"][0]["spent"])),
        (800_000_000, 800_000_000, 200_000_000),
        "{u}"
    );
    // A call the credit left cannot cover is refused (the balance itself is 0).
    assert_eq!(chat(&gw, DAILY, "alpha-5.5", 150_000).await.status(), 402);

    // Killed before midnight, started after it (and after the close's grace): the new day's
    // credit is granted and yesterday closed, once each: $0.80 unused, $0.30 rolls over,
    // $0.50 expires.
    gw.kill_hard();
    clock.set(DEC2 + GRACE);
    gw.start_again_env(&env);
    let closed = until_audited(admin_port, "plan daily: period from 2026-12-01T00:00:00Z closed", 1).await;
    assert_eq!(closed.len(), 1, "{closed:?}");
    assert!(closed[0].contains("$0.200000 of $1.000000 spent, $0.300000 rolls over, $0.500000 expires"), "{closed:?}");
    let second = until_audited(admin_port, "for the day period from 2026-12-02", 1).await;
    assert_eq!(second.len(), 1, "{second:?}");
    assert_eq!(nanos(&usage(&gw, DAILY).await["balance"]), 800_000_000 + 1_000_000_000 - 500_000_000);
    let u = usage(&gw, DAILY).await;
    assert_eq!((nanos(&u["plans"][0]["carried_over"]), nanos(&u["plans"][0]["left"])), (300_000_000, 1_300_000_000), "{u}");

    // Killed and started again at the same time: nothing granted or closed twice.
    gw.kill_hard();
    gw.start_again_env(&env);
    // Then on the third day: the second closes with $1.30 unused, of which only the cap rolls over.
    gw.kill_hard();
    clock.set(DEC3 + GRACE);
    gw.start_again_env(&env);
    let third = until_audited(admin_port, "for the day period from 2026-12-03", 1).await;
    assert_eq!(third.len(), 1, "{third:?}");
    let closed = until_audited(admin_port, "plan daily: period from 2026-12-02T00:00:00Z closed", 1).await;
    assert_eq!(closed.len(), 1, "{closed:?}");
    assert!(closed[0].contains("$0.000000 of $1.300000 spent, $0.300000 rolls over, $1.000000 expires"), "{closed:?}");
    assert_eq!(audited(admin_port, "for the day period from 2026-12-02").await.len(), 1, "granted once across the restarts");
    assert_eq!(audited(admin_port, "plan daily: period from 2026-12-01T00:00:00Z closed").await.len(), 1);
    assert_eq!(nanos(&usage(&gw, DAILY).await["balance"]), 1_300_000_000 - 1_000_000_000 + 1_000_000_000);
}

#[tokio::test]
async fn a_plan_set_through_the_admin_api_applies_its_limits_and_leaving_it_expires_its_credit() {
    let mock = start_mock();
    let admin_port = free_port();
    let gw = start_gateway(&config(mock.port, admin_port));
    let (_, keys) = admin(admin_port, reqwest::Method::GET, "/admin/keys", None).await;
    let id = keys["data"].as_array().expect("keys").iter().find(|k| k["name"] == "switch").expect("switch")["id"]
        .as_str()
        .expect("id")
        .to_string();
    // An unknown plan is refused naming the field.
    let (status, body) = admin(admin_port, reqwest::Method::PATCH, &format!("/admin/keys/{id}"), Some(json!({"plan": "gold"}))).await;
    assert_eq!((status, body["error"]["param"].as_str()), (400, Some("plan")), "{body}");
    // Set: its first period's credit at once, its multiplier, its model rules, its rpm.
    let (status, view) = admin(admin_port, reqwest::Method::PATCH, &format!("/admin/keys/{id}"), Some(json!({"plan": "small"}))).await;
    assert_eq!((status, view["plan"].as_str(), view["price_multiplier_from"].as_str()), (200, Some("small"), Some("plan")), "{view}");
    // Its balance as the operator sees it (reads of /v1/usage would count against the rpm).
    let balance = || async { nanos(&admin(admin_port, reqwest::Method::GET, &format!("/admin/keys/{id}"), None).await.1["balance"]) };
    assert_eq!(balance().await, 50_000_000);
    let refused = chat(&gw, SWITCH, "alpha-5.5", 10).await;
    assert_eq!(refused.status(), 403);
    let err: Value = refused.json().await.expect("json");
    assert!(err["error"]["message"].as_str().unwrap_or_default().contains("the plan 'small' of this API key"), "{err}");
    // alpha-4o-mini at $0.60 per 1M output tokens: 1,000 are $0.0006, charged twice that.
    assert_eq!(chat(&gw, SWITCH, "alpha-4o-mini", 1000).await.status(), 200);
    assert_eq!(balance().await, 50_000_000 - 1_200_000);
    // Four requests a minute (the refused one counted): the fifth is refused naming the plan.
    for _ in 0..2 {
        assert_eq!(chat(&gw, SWITCH, "alpha-4o-mini", 10).await.status(), 200);
    }
    let fifth = chat(&gw, SWITCH, "alpha-4o-mini", 10).await;
    assert_eq!(fifth.status(), 429);
    let err: Value = fifth.json().await.expect("json");
    assert!(err["error"]["message"].as_str().unwrap_or_default().contains("the plan 'small'"), "{err}");
    // Left: what is unused of its credit expires at once (all it had was the credit).
    assert!(balance().await > 0);
    let (status, view) = admin(admin_port, reqwest::Method::PATCH, &format!("/admin/keys/{id}"), Some(json!({"plan": null}))).await;
    assert_eq!((status, &view["plan"]), (200, &Value::Null), "{view}");
    assert_eq!(balance().await, 0, "the unused credit expired");
    assert_eq!(audited(admin_port, "plan of key").await.len(), 2, "set and left, audited");
    assert_eq!(audited(admin_port, "plan small: period from").await.len(), 1, "its period closed early");
}
