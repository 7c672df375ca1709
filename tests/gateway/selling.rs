//! Selling access (issue 67): redemption codes made by batch through the admin API and
//! redeemed by keys into their account (or themselves) exactly once, throttled against
//! guessing, withdrawn, expiring, bounded per account; a plan code subscribes its holder.

use crate::common::*;
use serde_json::{json, Value};

const ADMIN_TOKEN: &str = "selling-admin-token-0000001";
const LONE: &str = "sk-sell-lone-000000001";
const TEAM_A: &str = "sk-sell-team-a-0000001";
const TEAM_B: &str = "sk-sell-team-b-0000001";
const BROKE: &str = "sk-sell-broke-00000001";

fn config(mock_port: u16, admin_port: u16) -> String {
    let body = with_key(&standard_config(mock_port), &format!("{{ key: {LONE}, name: lone, group: default, balance: 1.0 }}"));
    let body = with_key(&body, &format!("{{ key: {TEAM_A}, name: team-a, group: default, balance: 1.0, account: shop }}"));
    let body = with_key(&body, &format!("{{ key: {TEAM_B}, name: team-b, group: default, balance: 1.0, account: shop }}"));
    let body = with_key(&body, &format!("{{ key: {BROKE}, name: broke, group: default, balance: 0 }}"));
    format!(
        "{body}accounts:\n  - {{ name: shop, balance: 2.0 }}\nplans:\n  - {{ name: monthly, credit: 3.0, period: month }}\n\
         admin: {{ listen: 127.0.0.1:{admin_port}, token: {ADMIN_TOKEN} }}\n"
    )
}

async fn admin(port: u16, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
    admin_call(port, ADMIN_TOKEN, method, path, body).await
}

async fn redeem(gw: &Gateway, key: &str, code: &str) -> (u16, Value) {
    let r = client().post(gw.url("/v1/redeem")).bearer_auth(key).json(&json!({"code": code})).send().await.expect("redeem");
    let retry = r.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_string);
    let status = r.status().as_u16();
    let mut body: Value = r.json().await.unwrap_or(Value::Null);
    if let Some(s) = retry {
        body["retry_after_header"] = json!(s);
    }
    (status, body)
}

fn codes_of(batch: &Value) -> Vec<String> {
    batch["codes"].as_array().expect("codes").iter().map(|c| c.as_str().expect("code").to_string()).collect()
}

async fn account_balance(port: u16, name: &str) -> i64 {
    nanos(&admin(port, reqwest::Method::GET, &format!("/admin/accounts/{name}"), None).await.1["balance"])
}

async fn audited(port: u16, text: &str) -> Vec<String> {
    let (_, page) = admin(port, reqwest::Method::GET, "/admin/audit?limit=1000", None).await;
    let all = page["data"].as_array().cloned().unwrap_or_default();
    all.iter().filter_map(|e| e["reason"].as_str()).filter(|r| r.contains(text)).map(str::to_string).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_codes_each_credit_once_and_only_as_the_batch_allows() {
    let mock = start_mock();
    let admin_port = free_port();
    let gw = start_gateway(&config(mock.port, admin_port));
    let post = reqwest::Method::POST;

    // A batch of 1,000 codes of $2.50: shown once, unique, none stored in the clear.
    let (status, batch) =
        admin(admin_port, post.clone(), "/admin/codes", Some(json!({"count": 1000, "amount": 2.5, "note": "launch promo"}))).await;
    assert_eq!(status, 201, "{batch}");
    let codes = codes_of(&batch);
    assert_eq!(codes.len(), 1000);
    assert_eq!(codes.iter().collect::<std::collections::HashSet<_>>().len(), 1000, "every code differs");
    let (_, list) = admin(admin_port, reqwest::Method::GET, "/admin/codes", None).await;
    let listed = &list["data"][0];
    assert_eq!(
        (listed["count"].as_u64(), listed["redeemed"].as_u64(), listed["amount"].as_f64()),
        (Some(1000), Some(0), Some(2.5)),
        "{list}"
    );
    assert!(listed.get("codes").is_none() && !list.to_string().contains(&codes[0]), "a listing never shows a code");

    // A key without an account is credited itself, once; the same code again is refused.
    let before = balance(&gw, LONE).await;
    let (status, done) = redeem(&gw, LONE, &codes[0]).await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["credited"]["key"], "lone", "{done}");
    assert_eq!(balance(&gw, LONE).await - before, 2_500_000_000);
    let (status, again) = redeem(&gw, LONE, &codes[0]).await;
    assert_eq!((status, again["error"]["param"].as_str()), (409, Some("code")), "{again}");
    let (status, other) = redeem(&gw, TEAM_A, &codes[0]).await;
    assert_eq!(status, 409, "another key cannot use it either: {other}");

    // A key of an account credits the account; a key below zero may redeem (that is how it pays).
    let shop = account_balance(admin_port, "shop").await;
    assert_eq!(redeem(&gw, TEAM_A, &codes[1]).await.0, 200);
    assert_eq!(account_balance(admin_port, "shop").await - shop, 2_500_000_000);
    let broke_id = tollgate::access::auth::seed_key_id(BROKE);
    let (status, _) =
        admin(admin_port, reqwest::Method::PATCH, &format!("/admin/keys/{broke_id}"), Some(json!({"balance_delta": -0.5}))).await;
    assert_eq!(status, 200);
    assert_eq!(post_chat(&gw, BROKE).await.status(), 402, "below zero it cannot call");
    let (status, done) = redeem(&gw, BROKE, &codes[2]).await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(nanos(&done["balance"]), 2_000_000_000, "{done}");
    assert_eq!(post_chat(&gw, BROKE).await.status(), 200, "topped up, it can");

    // Fifty concurrent redemptions of one code: one credit.
    let before = balance(&gw, LONE).await;
    let tries = futures_util::future::join_all((0..50).map(|_| redeem(&gw, LONE, &codes[3]))).await;
    assert_eq!(tries.iter().filter(|(s, _)| *s == 200).count(), 1, "{tries:?}");
    assert_eq!(tries.iter().filter(|(s, _)| *s == 409).count(), 49, "{tries:?}");
    assert_eq!(balance(&gw, LONE).await - before, 2_500_000_000);

    // Each redemption audited with its batch and key; the listing counts them.
    let id = batch["id"].as_str().expect("id");
    assert_eq!(audited(admin_port, &format!("code of batch {id} redeemed")).await.len(), 4);
    let (_, list) = admin(admin_port, reqwest::Method::GET, "/admin/codes", None).await;
    assert_eq!(list["data"][0]["redeemed"], 4, "{list}");

    // Withdrawn: the batch's unused codes are refused from now on.
    let (status, off) = admin(admin_port, reqwest::Method::DELETE, &format!("/admin/codes/{id}"), None).await;
    assert_eq!((status, off["disabled"].as_bool()), (200, Some(true)), "{off}");
    assert_eq!(redeem(&gw, LONE, &codes[4]).await.0, 410);
    assert_eq!(admin(admin_port, reqwest::Method::DELETE, "/admin/codes/nosuchbatch1", None).await.0, 404);

    // One use per account: the account's second key cannot use a second code of the batch.
    let (_, one) = admin(admin_port, post.clone(), "/admin/codes", Some(json!({"count": 3, "amount": 1, "max_uses_per_account": 1}))).await;
    let one = codes_of(&one);
    assert_eq!(redeem(&gw, TEAM_A, &one[0]).await.0, 200);
    let (status, refused) = redeem(&gw, TEAM_B, &one[1]).await;
    assert_eq!(status, 409, "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap_or_default().contains("already redeemed 1"), "{refused}");
    assert_eq!(redeem(&gw, LONE, &one[1]).await.0, 200, "another holder may");

    // A plan code subscribes the holder to the plan, whose credit is granted.
    let (_, plan) = admin(admin_port, post.clone(), "/admin/codes", Some(json!({"count": 1, "plan": "monthly"}))).await;
    let (status, done) = redeem(&gw, LONE, &codes_of(&plan)[0]).await;
    assert_eq!((status, done["plan"].as_str()), (200, Some("monthly")), "{done}");
    until("the plan's credit granted", || async {
        let u = usage(&gw, LONE).await;
        u["plans"][0]["name"] == "monthly" && u["plans"][0]["granted"] == true
    })
    .await;

    // Batches that cannot be made are refused with the field named.
    for (body, param) in [
        (json!({"count": 0, "amount": 1}), "count"),
        (json!({"count": 10001, "amount": 1}), "count"),
        (json!({"count": 1}), "amount"),
        (json!({"count": 1, "amount": 1, "plan": "monthly"}), "give either amount or plan, not both"),
        (json!({"count": 1, "plan": "nope"}), "plan"),
        (json!({"count": 1, "amount": 1, "expires_at": "2001-01-01T00:00:00Z"}), "expires_at"),
        (json!({"count": 1, "amount": -1}), "amount"),
    ] {
        let (status, e) = admin(admin_port, post.clone(), "/admin/codes", Some(body.clone())).await;
        assert_eq!((status, e["error"]["param"].as_str()), (400, Some(param)), "{body}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn guessing_codes_is_throttled_per_key_and_per_address() {
    let mock = start_mock();
    let admin_port = free_port();
    let gw = start_gateway(&config(mock.port, admin_port));
    let (_, batch) = admin(admin_port, reqwest::Method::POST, "/admin/codes", Some(json!({"count": 2, "amount": 1}))).await;
    let real = codes_of(&batch);
    // A guess shaped like a code of the same batch, and garbage: each a 400, until the key's
    // pauses begin (after three); then even the right code waits, so a guesser learns nothing.
    let guess = format!("{}{}", &real[0][..real[0].len() - 4], "zzzz");
    for attempt in [guess.as_str(), "not-a-code", "tgc_x", guess.as_str()] {
        let (status, e) = redeem(&gw, LONE, attempt).await;
        assert_eq!(status, 400, "{attempt}: {e}");
    }
    let (status, paused) = redeem(&gw, LONE, &real[0]).await;
    assert_eq!(status, 429, "{paused}");
    assert!(paused["retry_after_header"].as_str().is_some_and(|s| s.parse::<u64>().is_ok_and(|n| n >= 1)), "{paused}");
    // Another key from the same address is not paused by this one's guesses.
    let (status, done) = redeem(&gw, TEAM_A, &real[0]).await;
    assert_eq!(status, 200, "{done}");
    // Many keys guessing from one address: after ten wrong codes the address pauses, each key
    // having stayed within its own three.
    let mut keys = Vec::new();
    for i in 0..5 {
        let (status, k) =
            admin(admin_port, reqwest::Method::POST, "/admin/keys", Some(json!({"name": format!("guesser-{i}"), "group": "default"})))
                .await;
        assert_eq!(status, 201, "{k}");
        keys.push(k["key"].as_str().expect("secret").to_string());
    }
    let mut statuses = Vec::new();
    for key in &keys[..4] {
        for _ in 0..3 {
            statuses.push(redeem(&gw, key, &guess).await.0);
        }
    }
    assert_eq!(&statuses[..11], &[400; 11], "{statuses:?}");
    assert_eq!(statuses[11], 429, "the address is paused after ten: {statuses:?}");
    assert_eq!(redeem(&gw, &keys[4], &real[1]).await.0, 429, "a fresh key from that address waits too");
}

/// nano-USD per 1M tokens of a LiteLLM per-token price times `multiplier`, as tollgate rounds it.
fn fed_per_million(per_token: &Value, multiplier: f64) -> i64 {
    tollgate::base::money::usd_to_nanos(per_token.as_f64().expect("a number") * 1e6 * multiplier)
}

/// What `tokens` cost at `per_million` nano-USD, rounded half up to the nano-dollar.
fn cost_of(tokens: i64, per_million: i64) -> i64 {
    (i128::from(tokens) * i128::from(per_million) + 500_000).div_euclid(1_000_000) as i64
}

fn feed_config(mock_port: u16, admin_port: u16, feed_port: u16, extra_models: &str) -> String {
    let body = config(mock_port, admin_port).replacen(
        "models: [alpha-5.5, alpha-4o-mini, alpha-embed-3]",
        &format!("models: [alpha-5.5, alpha-4o-mini, alpha-embed-3, {{ name: alpha-fed, upstream: gpt-4o }}, {{ name: alpha-fed-mini, upstream: gpt-4o-mini }}{extra_models}]"),
        1,
    );
    assert!(body.contains("alpha-fed"));
    format!(
        "{body}price_feed: {{ url: \"http://127.0.0.1:{feed_port}/model_prices_and_context_window.json\", format: litellm, refresh: 1h, multiplier: 1.1, models: [\"alpha-fed*\"] }}\n"
    )
}

async fn chat_cost(gw: &Gateway, model: &str, usage: &str) -> (u16, i64) {
    let before = nanos(&usage_of(gw).await["total"]["cost"]);
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(LONE)
        .header("x-mock-usage", usage)
        .json(&json!({"model": model, "max_tokens": 200, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("chat");
    let status = r.status().as_u16();
    let _ = r.bytes().await;
    let n = usage_of(gw).await["total"]["requests"].as_u64().unwrap_or(0);
    let after = nanos(&wait_requests(gw, LONE, n).await["total"]["cost"]);
    (status, after - before)
}

async fn usage_of(gw: &Gateway) -> Value {
    let u = usage(gw, LONE).await;
    assert!(u["total"]["cost"].is_number(), "{u}");
    u
}

/// Issue 67: prices from LiteLLM's real table (the file its PyPI package ships), served
/// locally: the mapped models billed at the fed price times the multiplier to the nano-dollar;
/// the feed changed and read again while calls run, none dropped; a corrupt feed keeps the last
/// table; `-t` says what it would apply; a covered model the feed lacks is refused at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn prices_follow_litellms_table_and_a_corrupt_feed_keeps_the_last_good_one() {
    let original = litellm_prices();
    let table: Value = serde_json::from_slice(&original).expect("LiteLLM's table is JSON");
    let body = std::sync::Arc::new(std::sync::Mutex::new(original.clone()));
    let feed_port = serve_bytes(body.clone());
    let mock = start_mock();
    let admin_port = free_port();
    let config = feed_config(mock.port, admin_port, feed_port, "");
    // `-t` reads the feed once and says what it would apply.
    let (dir, path, _) = write_config(&config);
    let (code, out) = run_tollgate(&["-t", "-c", path.to_str().expect("path")], &[]);
    let gpt4o = &table["gpt-4o"];
    let (input, output) = (fed_per_million(&gpt4o["input_cost_per_token"], 1.1), fed_per_million(&gpt4o["output_cost_per_token"], 1.1));
    assert_eq!(code, 0, "{out}");
    let shown = format!("price_feed would price alpha-fed: input {} output {} USD/1M", input as f64 / 1e9, output as f64 / 1e9);
    assert!(out.contains(&shown), "{shown}\n{out}");
    drop(dir);

    let gw = start_gateway(&config);
    let (status, cost) = chat_cost(&gw, "alpha-fed", "1000,200").await;
    assert_eq!(status, 200);
    assert_eq!(cost, cost_of(1000, input) + cost_of(200, output), "billed at the fed price times 1.1");
    let mini = &table["gpt-4o-mini"];
    let (_, cost) = chat_cost(&gw, "alpha-fed-mini", "3000,70").await;
    assert_eq!(
        cost,
        cost_of(3000, fed_per_million(&mini["input_cost_per_token"], 1.1))
            + cost_of(70, fed_per_million(&mini["output_cost_per_token"], 1.1))
    );
    let (_, prices) = admin(admin_port, reqwest::Method::GET, "/admin/prices", None).await;
    let source = |m: &str| prices["data"].as_array().expect("data").iter().find(|p| p["model"] == m).map(|p| p["source"].clone());
    assert_eq!((source("alpha-fed"), source("alpha-5.5")), (Some(json!("feed")), Some(json!("file"))), "{prices}");

    // The feed changes (gpt-4o's input doubles) and is read again while calls run: none dropped.
    let mut changed = table.clone();
    let doubled = gpt4o["input_cost_per_token"].as_f64().expect("number") * 2.0;
    changed["gpt-4o"]["input_cost_per_token"] = json!(doubled);
    *body.lock().expect("body") = serde_json::to_vec(&changed).expect("json");
    let running = {
        let url = gw.url("/v1/chat/completions");
        tokio::spawn(async move {
            let c = client();
            let mut statuses = Vec::new();
            for _ in 0..40 {
                let r = c
                    .post(&url)
                    .bearer_auth(LONE)
                    .json(&json!({"model": "alpha-fed", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}))
                    .send()
                    .await;
                statuses.push(r.map(|r| r.status().as_u16()).unwrap_or(0));
            }
            statuses
        })
    };
    let (status, refreshed) = admin(admin_port, reqwest::Method::POST, "/admin/prices/refresh", None).await;
    assert_eq!(status, 200, "{refreshed}");
    let statuses = running.await.expect("calls");
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let new_input = fed_per_million(&json!(doubled), 1.1);
    let (_, cost) = chat_cost(&gw, "alpha-fed", "1000,200").await;
    assert_eq!(cost, cost_of(1000, new_input) + cost_of(200, output), "billed at the new price");
    let audited = audited(admin_port, "price of alpha-fed from the feed").await;
    let change = format!(
        "input {} output {} USD/1M → input {} output {} USD/1M",
        input as f64 / 1e9,
        output as f64 / 1e9,
        new_input as f64 / 1e9,
        output as f64 / 1e9
    );
    assert!(audited.iter().any(|r| r.ends_with(&change)), "{change}: {audited:?}");

    // A corrupt feed: refused, the last good table stays, readiness untouched.
    *body.lock().expect("body") = b"{\"gpt-4o\": {\"input_cost_per_token\": 1e-06, ".to_vec();
    let (status, refused) = admin(admin_port, reqwest::Method::POST, "/admin/prices/refresh", None).await;
    assert_eq!(status, 502, "{refused}");
    let (_, prices) = admin(admin_port, reqwest::Method::GET, "/admin/prices", None).await;
    assert!(prices["feed"]["last_failure"]["error"].as_str().is_some_and(|e| e.contains("not JSON")), "{prices}");
    let (_, cost) = chat_cost(&gw, "alpha-fed", "1000,200").await;
    assert_eq!(cost, cost_of(1000, new_input) + cost_of(200, output), "the last good price");
    let ready = client().get(format!("http://127.0.0.1:{admin_port}/readyz")).send().await.expect("readyz");
    assert_eq!(ready.status(), 200);

    // A model the feed covers but does not have, and the file does not price: refused at start.
    let nowhere = feed_config(mock.port, free_port(), feed_port, ", { name: alpha-fed-nowhere, upstream: no-such-model-anywhere }");
    *body.lock().expect("body") = original.clone();
    let (dir, path, _) = write_config(&nowhere);
    let (code, out) = run_tollgate(&["-t", "-c", path.to_str().expect("path")], &[]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("no price for the served model(s) alpha-fed-nowhere"), "{out}");
    let (code, out) = run_tollgate(&["-c", path.to_str().expect("path")], &[]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("alpha-fed-nowhere"), "{out}");
    drop(dir);
}

/// Issue 67: an account's statement for this month — opening balance, credits, charges by day
/// and model, closing balance — in nano-USD that add up to the ledger's balance, its charges
/// equal to `/admin/usage`'s and its credits to the audit trail's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_statement_adds_up_to_the_ledger_the_usage_and_the_audit_trail() {
    let mock = start_mock();
    let admin_port = free_port();
    let gw = start_gateway(&config(mock.port, admin_port));
    let (status, _) =
        admin(admin_port, reqwest::Method::PATCH, "/admin/accounts/shop", Some(json!({"balance_delta": 1.5, "reason": "invoice 17"})))
            .await;
    assert_eq!(status, 200);
    let (_, batch) = admin(admin_port, reqwest::Method::POST, "/admin/codes", Some(json!({"count": 1, "amount": 2.5}))).await;
    assert_eq!(redeem(&gw, TEAM_A, &codes_of(&batch)[0]).await.0, 200);
    for (key, model, tokens) in [(TEAM_A, "alpha-5.5", "1234,567"), (TEAM_B, "alpha-5.5", "10,20"), (TEAM_B, "alpha-4o-mini", "999,1")] {
        let r = client()
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(key)
            .header("x-mock-usage", tokens)
            .json(&json!({"model": model, "max_tokens": 600, "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .expect("chat");
        assert_eq!(r.status(), 200);
    }
    wait_requests(&gw, TEAM_B, 2).await;
    let month = tollgate::base::clock::date_in(tollgate::base::clock::now_unix(), &jiff::tz::TimeZone::UTC)[..7].to_string();
    let r = client()
        .get(format!("http://127.0.0.1:{admin_port}/admin/accounts/shop/statement?month={month}"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("statement");
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"].to_str().unwrap_or_default().starts_with("text/csv"));
    let csv = r.text().await.expect("csv");
    let lines: Vec<Vec<String>> = csv.lines().skip(1).map(|l| l.split(',').map(str::to_string).collect()).collect();
    let amount = |l: &Vec<String>| l.last().and_then(|n| n.parse::<i64>().ok()).expect("amount_nanos");
    let of = |kind: &str| lines.iter().filter(|l| l[0] == kind).map(amount).sum::<i64>();
    assert_eq!(of("opening"), 2_000_000_000, "{csv}");
    let closing = of("closing");
    let items: i64 = lines.iter().filter(|l| !l[0].starts_with("total_") && l[0] != "closing").map(amount).sum();
    assert_eq!(items, closing, "the lines add up: {csv}");
    let (_, shop) = admin(admin_port, reqwest::Method::GET, "/admin/accounts/shop", None).await;
    assert_eq!(closing, nanos(&shop["balance"]), "the closing balance is the ledger's: {csv}");
    // The charges are the usage of the account's keys; the credits are the audit trail's.
    let (_, usage) = admin(admin_port, reqwest::Method::GET, "/admin/usage?group_by=account", None).await;
    let shop_cost =
        usage["data"].as_array().expect("rows").iter().find(|r| r["account"] == "shop").map(|r| nanos(&r["cost"])).expect("shop");
    assert_eq!(of("total_charge"), -shop_cost, "{csv}\n{usage}");
    assert_eq!(lines.iter().filter(|l| l[0] == "charge").count(), 2, "a line per day and model: {csv}");
    let (_, trail) = admin(admin_port, reqwest::Method::GET, "/admin/audit?limit=1000", None).await;
    let audited: i64 = trail["data"]
        .as_array()
        .expect("audit")
        .iter()
        .filter(|e| e["kind"] == "account" && e["id"] == "shop")
        .map(|e| nanos(&e["delta"]))
        .sum();
    assert_eq!(of("adjustment") + of("code"), audited, "{csv}");
    assert_eq!((of("adjustment"), of("code")), (1_500_000_000, 2_500_000_000), "{csv}");
    assert!(csv.contains("invoice 17"), "{csv}");
    // JSON too; a month that is not one, or has not begun, is refused.
    let (status, json) =
        admin(admin_port, reqwest::Method::GET, &format!("/admin/accounts/shop/statement?month={month}&format=json"), None).await;
    assert_eq!((status, json["closing_nanos"].as_i64()), (200, Some(closing)), "{json}");
    for bad in ["2026-13", "2999-01", "nope"] {
        let (status, e) = admin(admin_port, reqwest::Method::GET, &format!("/admin/accounts/shop/statement?month={bad}"), None).await;
        assert_eq!((status, e["error"]["param"].as_str()), (400, Some("month")), "{bad}: {e}");
    }
    assert_eq!(admin(admin_port, reqwest::Method::GET, &format!("/admin/accounts/nobody/statement?month={month}"), None).await.0, 404);
}
