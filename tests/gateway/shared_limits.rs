//! Limits many keys share (issue 66): an account's `rpm`, `tpm` and `max_concurrent`, and a tag
//! value's (`tag_limits`) rate limits and spend windows — every call of every key under them
//! counts; the key's own limits answer first, then the account's, then the tags'. Set in the
//! file and through the admin API, refused by name when wrong.

use crate::common::*;
use serde_json::{json, Value};

const ADMIN_TOKEN: &str = "shared-limits-admin-token-0001";
const TEAM_A: &str = "sk-shared-team-a-0001";
const TEAM_B: &str = "sk-shared-team-b-0001";
const SEARCH_A: &str = "sk-shared-search-a-01";
const SEARCH_B: &str = "sk-shared-search-b-01";

fn config(mock_port: u16, admin_port: u16) -> String {
    let base = standard_config(mock_port);
    let base = with_key(&base, &format!("{{ key: {TEAM_A}, name: team-a, group: default, balance: 5.0, account: team }}"));
    let base = with_key(&base, &format!("{{ key: {TEAM_B}, name: team-b, group: default, balance: 5.0, account: team }}"));
    let base = with_key(
        &base,
        &format!("{{ key: {SEARCH_A}, name: search-a, group: default, balance: 5.0, tags: {{ team: search, env: prod }} }}"),
    );
    let base = with_key(
        &base,
        &format!("{{ key: {SEARCH_B}, name: search-b, group: default, balance: 5.0, tags: {{ team: search, env: prod }} }}"),
    );
    format!(
        "{base}accounts:\n  - {{ name: team, balance: 10, rpm: 3, tpm: 1000 }}
tag_limits:
  \"team=search\": {{ max_concurrent: 1 }}
  \"env=prod\": {{ budgets: {{ day: 0.01 }} }}
admin: {{ listen: 127.0.0.1:{admin_port}, token: {ADMIN_TOKEN} }}\n"
    )
}

async fn chat(gw: &Gateway, key: &str, max_tokens: u32, extra: &[(&str, &str)]) -> reqwest::Response {
    let mut r = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(key)
        .json(&json!({"model": "alpha-5.5", "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hi"}]}));
    for (k, v) in extra {
        r = r.header(*k, *v);
    }
    r.send().await.expect("request")
}

async fn refusal(resp: reqwest::Response) -> (u16, String) {
    let status = resp.status().as_u16();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    (status, body["error"]["message"].as_str().unwrap_or_default().to_string())
}

#[tokio::test]
async fn an_accounts_rpm_and_tpm_count_every_key_of_the_account() {
    let mock = start_mock();
    let admin = free_port();
    let gw = start_gateway(&config(mock.port, admin));
    // rpm 3 for the team: two keys share it.
    for key in [TEAM_A, TEAM_B, TEAM_A] {
        assert_eq!(chat(&gw, key, 10, &[("x-mock-usage", "5,5")]).await.status(), 200);
    }
    let (status, message) = refusal(chat(&gw, TEAM_B, 10, &[]).await).await;
    assert_eq!(status, 429);
    assert!(message.contains("3 requests per minute for the account 'team'"), "{message}");
    // Through the admin API: rpm raised, tpm left; the view shows them.
    let c = client();
    let view: Value = c
        .patch(format!("http://127.0.0.1:{admin}/admin/accounts/team"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"rpm": 100}))
        .send()
        .await
        .expect("patch")
        .json()
        .await
        .expect("json");
    assert_eq!((view["rpm"].as_u64(), view["tpm"].as_u64()), (Some(100), Some(1000)), "{view}");
    // tpm 1000: 800 tokens used by one key leave no room for the other's call held at 600.
    assert_eq!(chat(&gw, TEAM_A, 10, &[("x-mock-usage", "0,800")]).await.status(), 200);
    let (status, message) = refusal(chat(&gw, TEAM_B, 600, &[]).await).await;
    assert_eq!(status, 429);
    assert!(message.contains("tokens per minute for the account 'team'"), "{message}");
    // A call larger than the account's tpm is refused as such.
    let (status, message) = refusal(chat(&gw, TEAM_B, 5000, &[]).await).await;
    assert_eq!(status, 429);
    assert!(message.contains("more than the limit of 1000 tokens per minute of the account 'team'"), "{message}");
    // `null` clears a limit; 0 is refused naming it.
    let r = c
        .patch(format!("http://127.0.0.1:{admin}/admin/accounts/team"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"rpm": 0}))
        .send()
        .await
        .expect("patch");
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.expect("json");
    assert_eq!(body["error"]["param"], "rpm", "{body}");
    let view: Value = c
        .patch(format!("http://127.0.0.1:{admin}/admin/accounts/team"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"tpm": null}))
        .send()
        .await
        .expect("patch")
        .json()
        .await
        .expect("json");
    assert_eq!(view["tpm"], Value::Null, "{view}");
    assert_eq!(chat(&gw, TEAM_B, 600, &[]).await.status(), 200);
}

#[tokio::test]
async fn a_tag_values_requests_in_flight_and_spend_window_count_every_key_carrying_it() {
    let mock = start_mock();
    let admin = free_port();
    let gw = start_gateway(&config(mock.port, admin));
    // team=search: one request in flight for both keys together.
    let held = {
        let url = gw.url("/v1/chat/completions");
        tokio::spawn(async move {
            client()
                .post(url)
                .bearer_auth(SEARCH_A)
                .header("x-mock-hold", "shared-search")
                .header("x-mock-usage", "0,10")
                .json(&json!({"model": "alpha-5.5", "max_tokens": 10, "stream": true, "messages": [{"role": "user", "content": "hi"}]}))
                .send()
                .await
                .expect("held")
                .text()
                .await
        })
    };
    // Once the mock holds the first call (its slot taken before it was sent), the other key's
    // call is refused for it.
    loop {
        let seen: Vec<Value> = client().get(mock.url("/__mock/requests")).send().await.expect("mock").json().await.expect("json");
        if seen.iter().any(|r| r["headers"]["x-mock-hold"][0] == "shared-search") {
            break;
        }
        tokio::task::yield_now().await;
    }
    let (status, message) = refusal(chat(&gw, SEARCH_B, 10, &[("x-mock-usage", "0,10")]).await).await;
    assert_eq!(status, 429, "{message}");
    assert!(message.contains("the tag team=search may have 1 at once"), "{message}");
    client().post(mock.url("/__mock/release?token=shared-search")).send().await.expect("release");
    held.await.expect("task").expect("body");
    // env=prod: a day window of $0.01 for both keys together (alpha-5.5 at $8 per 1M out).
    let (mut spent_ok, mut last) = (0, (0, String::new()));
    for key in [SEARCH_A, SEARCH_B].iter().cycle().take(12) {
        let resp = chat(&gw, key, 200, &[("x-mock-usage", "0,200")]).await;
        if resp.status() == 200 {
            spent_ok += 1;
        } else {
            last = refusal(resp).await;
            break;
        }
    }
    assert!(spent_ok >= 3, "{spent_ok}");
    assert_eq!(last.0, 429, "{last:?}");
    assert!(last.1.contains("day budget of the tag env=prod"), "{last:?}");
}

#[test]
fn tag_limits_and_account_limits_are_refused_by_name_in_the_file() {
    for (extra, named) in [
        ("tag_limits: { team: { rpm: 3 } }\n", "tag_limits.\"team\""),
        ("tag_limits: { \"team=a\": { rpm: 0 } }\n", "tag_limits.\"team=a\".rpm"),
        ("tag_limits: { \"team=a\": { budgets: { year: 1 } } }\n", "tag_limits"),
        ("accounts: [{ name: t, max_concurrent: 0 }]\n", "accounts[0].max_concurrent"),
    ] {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("bad.yaml");
        std::fs::write(&path, format!("listen: 127.0.0.1:0\n{extra}")).expect("write");
        let (code, out) = run_tollgate(&["-t", "-c", path.to_str().expect("path")], &[]);
        assert!(code != 0 && out.contains(named), "{extra}: {out}");
    }
}
