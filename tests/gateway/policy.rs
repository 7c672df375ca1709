//! Key policy (issue 29, first part) against the real daemon: expiry, model rules (after
//! translation resolves the model), address allowlists with and without trusted proxies
//! (spoofed `X-Forwarded-For`), validation in the file and in the admin API.

use crate::common::*;
use serde_json::{json, Value};

const ADMIN_TOKEN: &str = "policy-admin-token-0000000001";
const MODELS_KEY: &str = "sk-policy-models-0001";
const IP_KEY: &str = "sk-policy-ip-000001";
const LOCAL_KEY: &str = "sk-policy-local-0001";
const LIMITS_KEY: &str = "sk-policy-limits-0001";
const STRICT_KEY: &str = "sk-policy-strict-0001";

fn config(mock_port: u16, admin_port: u16, trusted: &str) -> String {
    let base = standard_config(mock_port).replace(
        "  chat: { platforms: [openai] }\n",
        "  chat: { platforms: [openai] }\n  bridge: { platforms: [openai, anthropic, gemini], translate: true }\n",
    );
    let base = with_key(&base, &format!("{{ key: {MODELS_KEY}, name: models, group: bridge, balance: 5.0, models: {{ allow: [\"alpha-*\", beta-opus-4-7], deny: [alpha-4o-mini] }} }}"));
    let base = with_key(
        &base,
        &format!("{{ key: {IP_KEY}, name: office, group: default, balance: 5.0, ip_allow: [10.0.0.0/8, \"2001:db8::/32\"] }}"),
    );
    let base = with_key(&base, &format!("{{ key: {LOCAL_KEY}, name: local, group: default, balance: 5.0, ip_allow: [127.0.0.1] }}"));
    let base = with_key(
        &base,
        &format!("{{ key: {LIMITS_KEY}, name: limits, group: default, balance: 5.0, max_output_tokens: 100, default_output_tokens: 20, max_request_cost: 0.0005 }}"),
    );
    // One request a minute, alpha-5* only: shows the order of the checks.
    let base = with_key(
        &base,
        &format!("{{ key: {STRICT_KEY}, name: strict, group: default, balance: 5.0, rpm: 1, models: {{ allow: [\"alpha-5*\"] }} }}"),
    );
    format!("{base}admin: {{ listen: 127.0.0.1:{admin_port}, token: {ADMIN_TOKEN} }}\n{trusted}")
}

async fn chat(gw: &Gateway, key: &str, model: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut r = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(key)
        .json(&json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}));
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    let resp = r.send().await.expect("request");
    (resp.status().as_u16(), resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn model_rules_apply_after_translation_and_shape_the_model_lists() {
    let mock = start_mock();
    let gw = start_gateway(&config(mock.port, free_port(), ""));
    assert_eq!(chat(&gw, MODELS_KEY, "alpha-5.5", &[]).await.0, 200);
    // Reached through translation, allowed by name.
    assert_eq!(chat(&gw, MODELS_KEY, "beta-opus-4-7", &[]).await.0, 200);
    for model in ["alpha-4o-mini", "beta-sonnet-4-6", "gamma-3.5-flash"] {
        let (status, body) = chat(&gw, MODELS_KEY, model, &[]).await;
        assert_eq!(status, 403, "{model}: {body}");
        assert_eq!(body["error"]["code"], "model_not_allowed", "{body}");
    }
    // An unknown model stays a 404.
    assert_eq!(chat(&gw, MODELS_KEY, "alpha-none", &[]).await.0, 404);
    // In the messages shape too.
    let resp = client()
        .post(gw.url("/v1/messages"))
        .header("x-api-key", MODELS_KEY)
        .json(&json!({"model": "gamma-3.5-flash", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 403);
    assert_eq!(resp.json::<Value>().await.expect("json")["error"]["type"], "permission_error");
    let list: Value = client().get(gw.url("/v1/models")).bearer_auth(MODELS_KEY).send().await.expect("list").json().await.expect("json");
    let mut ids: Vec<&str> = list["data"].as_array().into_iter().flatten().filter_map(|m| m["id"].as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["alpha-5.5", "alpha-embed-3", "beta-opus-4-7"]);
    let resp = client().get(gw.url("/v1beta/models/gamma-3.5-flash")).header("x-goog-api-key", MODELS_KEY).send().await.expect("get");
    assert_eq!(resp.status(), 404, "a model the key may not call is not shown");
}

#[tokio::test]
async fn an_address_allowlist_believes_forwarded_for_only_from_trusted_proxies() {
    let mock = start_mock();
    // No trusted proxies: the TCP peer (127.0.0.1) is the client, whatever the header says.
    let gw = start_gateway(&config(mock.port, free_port(), ""));
    let (status, body) = chat(&gw, IP_KEY, "alpha-5.5", &[]).await;
    assert_eq!((status, body["error"]["code"].as_str()), (403, Some("ip_not_allowed")), "{body}");
    let (status, _) = chat(&gw, IP_KEY, "alpha-5.5", &[("x-forwarded-for", "10.1.2.3")]).await;
    assert_eq!(status, 403, "a spoofed X-Forwarded-For is not believed from an untrusted peer");
    let (status, _) = chat(&gw, IP_KEY, "alpha-5.5", &[("x-real-ip", "10.1.2.3"), ("forwarded", "for=10.1.2.3")]).await;
    assert_eq!(status, 403, "no other header is believed");
    assert_eq!(chat(&gw, LOCAL_KEY, "alpha-5.5", &[]).await.0, 200);
    // The model list is refused too: the key may not be used from here at all.
    assert_eq!(client().get(gw.url("/v1/models")).bearer_auth(IP_KEY).send().await.expect("list").status(), 403);
    drop(gw);

    // Behind a trusted proxy (127.0.0.1 plays it): the right-most hop that is not a proxy.
    let gw = start_gateway(&config(mock.port, free_port(), "trusted_proxies: [127.0.0.0/8]\n"));
    assert_eq!(chat(&gw, IP_KEY, "alpha-5.5", &[("x-forwarded-for", "10.1.2.3")]).await.0, 200);
    assert_eq!(chat(&gw, IP_KEY, "alpha-5.5", &[("x-forwarded-for", "::ffff:10.9.9.9")]).await.0, 200, "mapped IPv4 normalised");
    assert_eq!(chat(&gw, IP_KEY, "alpha-5.5", &[("x-forwarded-for", "2001:db8::7")]).await.0, 200);
    // A client that prepends an allowed address gains nothing: the proxy appended the real one.
    let (status, _) = chat(&gw, IP_KEY, "alpha-5.5", &[("x-forwarded-for", "10.1.2.3, 203.0.113.5")]).await;
    assert_eq!(status, 403);
    // Without the header, the client is the proxy itself (not allowed for IP_KEY).
    assert_eq!(chat(&gw, IP_KEY, "alpha-5.5", &[]).await.0, 403);
}

async fn admin(gw_admin: u16, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut r = client().request(method, format!("http://127.0.0.1:{gw_admin}{path}")).bearer_auth(ADMIN_TOKEN);
    if let Some(b) = body {
        r = r.json(&b);
    }
    let resp = r.send().await.expect("admin");
    (resp.status().as_u16(), resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn the_admin_api_validates_policy_fields_and_null_clears_them() {
    let mock = start_mock();
    let admin_port = free_port();
    let gw = start_gateway(&config(mock.port, admin_port, ""));
    for (body, field) in [
        (json!({"name": "x", "ip_allow": ["10.0.0.0/33"]}), "ip_allow"),
        (json!({"name": "x", "ip_allow": []}), "ip_allow"),
        (json!({"name": "x", "models": {"allow": []}}), "models"),
        (json!({"name": "x", "models": {"deny": ["al*pha"]}}), "models"),
        (json!({"name": "x", "expires_at": "2020-01-01T00:00:00Z"}), "expires_at"),
        (json!({"name": "x", "expires_at": "tomorrow"}), "expires_at"),
        (json!({"name": "x", "expires_at": "2099-01-01T00:00:00Z", "ttl_secs": 5}), "ttl_secs"),
    ] {
        let (status, answer) = admin(admin_port, reqwest::Method::POST, "/admin/keys", Some(body.clone())).await;
        assert_eq!((status, answer["error"]["param"].as_str()), (400, Some(field)), "{body}: {answer}");
    }
    let (_, before) = admin(admin_port, reqwest::Method::GET, "/admin/keys", None).await;
    assert_eq!(before["data"].as_array().map(Vec::len), Some(8), "nothing stored: {before}");

    // A key usable from 10/8 only; then the allowlist is cleared with null.
    let (status, created) = admin(
        admin_port,
        reqwest::Method::POST,
        "/admin/keys",
        Some(json!({"name": "k", "balance": 1.0, "ip_allow": ["10.0.0.0/8"], "expires_at": "2099-01-01T00:00:00Z"})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["ip_allow"], json!(["10.0.0.0/8"]));
    assert_eq!(created["expires_at"], "2099-01-01T00:00:00Z");
    let secret = created["key"].as_str().expect("secret").to_string();
    let id = created["id"].as_str().expect("id").to_string();
    assert_eq!(chat(&gw, &secret, "alpha-5.5", &[]).await.0, 403);
    let (status, patched) = admin(admin_port, reqwest::Method::PATCH, &format!("/admin/keys/{id}"), Some(json!({"ip_allow": null}))).await;
    assert_eq!((status, &patched["ip_allow"]), (200, &Value::Null), "{patched}");
    assert_eq!(patched["expires_at"], "2099-01-01T00:00:00Z", "other fields kept");
    assert_eq!(chat(&gw, &secret, "alpha-5.5", &[]).await.0, 200);
    // A bad patch changes nothing.
    let (status, _) =
        admin(admin_port, reqwest::Method::PATCH, &format!("/admin/keys/{id}"), Some(json!({"name": "renamed", "models": {"allow": []}})))
            .await;
    assert_eq!(status, 400);
    let (_, view) = admin(admin_port, reqwest::Method::GET, &format!("/admin/keys/{id}"), None).await;
    assert_eq!(view["name"], "k");

    // Expiry: a key with one second to live answers 401 key_expired once it passed.
    let (_, short) =
        admin(admin_port, reqwest::Method::POST, "/admin/keys", Some(json!({"name": "short", "balance": 1.0, "ttl_secs": 1}))).await;
    let short_secret = short["key"].as_str().expect("secret").to_string();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let body = loop {
        let (status, body) = chat(&gw, &short_secret, "alpha-5.5", &[]).await;
        if status == 401 {
            break body;
        }
        assert_eq!(status, 200);
        assert!(std::time::Instant::now() < deadline, "still accepted after its expiry");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(body["error"]["code"], "key_expired", "{body}");
}

#[test]
fn the_file_is_refused_naming_the_key_and_field() {
    for (entry, expected) in [
        ("{ key: sk-bad-policy-01, name: b, group: default, ip_allow: [300.1.1.1] }", "keys[0].ip_allow"),
        ("{ key: sk-bad-policy-01, name: b, group: default, models: { allow: [] } }", "keys[0].models.allow"),
        ("{ key: sk-bad-policy-01, name: b, group: default, models: { deny: [\"a*b*\"] } }", "keys[0].models.deny"),
        ("{ key: sk-bad-policy-01, name: b, group: default, expires_at: \"tomorrow\" }", "keys[0].expires_at"),
    ] {
        let (dir, path, _) = write_config(&with_key(&standard_config(1), entry));
        let (code, out) = run_tollgate(&["-t", "-c", path.to_str().expect("path")], &[]);
        assert_eq!(code, 2, "{entry}: {out}");
        assert!(out.contains(expected), "{entry}: {out}");
        drop(dir);
    }
    let (dir, path, _) = write_config(&format!("{}trusted_proxies: [10.0.0.0/99]\n", standard_config(1)));
    let (code, out) = run_tollgate(&["-t", "-c", path.to_str().expect("path")], &[]);
    assert!(code == 2 && out.contains("trusted_proxies[0]"), "{out}");
    drop(dir);
}

/// Issue 46, point 1: a date never takes the gateway down. A key in the file that expired a
/// second ago is a warning at `-t`, at start and at reload; the gateway serves, and that key is
/// refused 401 `key_expired`.
#[tokio::test]
async fn a_file_key_that_expired_is_a_warning_never_an_outage() {
    let mock = start_mock();
    let past = {
        let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs() - 1;
        let (days, rest) = (secs / 86_400, secs % 86_400);
        // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
        let z = days as i64 + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let d = doy - (153 * mp + 2) / 5 + 1;
        let m = if mp < 10 { mp + 3 } else { mp - 9 };
        let y = yoe + era * 400 + i64::from(m <= 2);
        format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rest / 3600, rest / 60 % 60, rest % 60)
    };
    let expired = "sk-policy-expired-000000000000000001";
    let body = with_key(
        &standard_config(mock.port),
        &format!("{{ key: {expired}, name: gone, group: default, balance: 1.0, expires_at: \"{past}\" }}"),
    );
    let (dir, path, port) = write_config(&body);
    let (code, out) = run_tollgate(&["-t", "-c", path.to_str().expect("path")], &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("warning") && out.contains("(gone): expired at"), "{out}");
    std::fs::File::create(dir.path().join("tollgate.log")).expect("log file");
    let gw = start_written(dir, &path, port);
    let (status, ok) = chat(&gw, CLIENT_KEY, "alpha-5.5", &[]).await;
    assert_eq!(status, 200, "the gateway serves: {ok}");
    let (status, refused) = chat(&gw, expired, "alpha-5.5", &[]).await;
    assert_eq!((status, refused["error"]["code"].as_str()), (401, Some("key_expired")), "{refused}");
    assert!(gw.log().contains("(gone): expired at"), "a warning at start: {}", gw.log());
    // A reload applies other changes, and warns again.
    let changed = std::fs::read_to_string(&path).expect("config").replace("name: tester", "name: tester-renamed");
    std::fs::write(&path, changed).expect("write");
    let pid = gw.proc.child.id();
    // SAFETY: kill only sends a signal to the daemon this test started; no memory is involved.
    #[allow(unsafe_code)]
    unsafe {
        libc::kill(pid as i32, libc::SIGHUP)
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !gw.log().contains("configuration reloaded") && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(gw.log().contains("configuration reloaded") && !gw.log().contains("reload refused"), "{}", gw.log());
    assert_eq!(gw.log().matches("(gone): expired at").count(), 2, "{}", gw.log());
}

#[tokio::test]
async fn output_limits_are_refused_or_set_and_a_request_may_not_cost_more_than_its_cap() {
    let mock = start_mock();
    let admin_port = free_port();
    let gw = start_gateway(&config(mock.port, admin_port, ""));
    let ask = |model: &str, max: Option<u64>, tag: &str| {
        let mut body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
        if let Some(m) = max {
            body["max_tokens"] = json!(m);
        }
        client().post(gw.url("/v1/chat/completions")).bearer_auth(LIMITS_KEY).header("x-test-tag", tag).json(&body).send()
    };
    let resp = ask("alpha-4o-mini", Some(101), "over").await.expect("request");
    assert_eq!(resp.status(), 400);
    assert_eq!(resp.json::<Value>().await.expect("json")["error"]["param"], "max_tokens");
    assert!(mock_requests(&mock, "over").await.is_empty(), "nothing sent");
    // Named within the cap: as asked. Named nowhere: the key's default, in the protocol's field.
    assert_eq!(ask("alpha-4o-mini", Some(100), "within").await.expect("request").status(), 200);
    assert_eq!(mock_requests(&mock, "within").await[0]["max_output"], 100);
    assert_eq!(ask("alpha-4o-mini", None, "default").await.expect("request").status(), 200);
    assert_eq!(mock_requests(&mock, "default").await[0]["max_output"], 20);
    let resp = client()
        .post(gw.url("/v1beta/models/gamma-3.5-flash:generateContent"))
        .header("x-goog-api-key", LIMITS_KEY)
        .header("x-test-tag", "gemini-default")
        .json(&json!({"contents": [{"parts": [{"text": "hi"}]}], "generationConfig": {"temperature": 0.1}}))
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 200);
    assert_eq!(mock_requests(&mock, "gemini-default").await[0]["max_output"], 20);
    // The cost cap ($0.0005): 100 output tokens of alpha-5.5 ($8 per 1M in the test prices) are
    // $0.0008 at worst: refused before anything is sent, in the protocol's shape.
    let resp = ask("alpha-5.5", Some(100), "costly").await.expect("request");
    assert_eq!(resp.status(), 402);
    assert_eq!(resp.json::<Value>().await.expect("json")["error"]["code"], "request_cost_cap_exceeded");
    assert!(mock_requests(&mock, "costly").await.is_empty());
    assert_eq!(ask("alpha-5.5", Some(20), "cheap").await.expect("request").status(), 200);
    let metrics = admin_metrics(admin_port, ADMIN_TOKEN).await;
    assert_eq!(metric(&metrics, "tollgate_refusals_total{code=\"request_cost_cap_exceeded\"}"), 1.0, "{metrics}");
    assert_eq!(metric(&metrics, "tollgate_refusals_total{code=\"invalid_request\"}"), 1.0);
}

#[tokio::test]
async fn checks_come_in_one_order() {
    let mock = start_mock();
    let admin_port = free_port();
    let gw = start_gateway(&config(mock.port, admin_port, ""));
    // Rate limits come first, and every request of a known key counts against them, a refused
    // one included: the one request of this minute is refused by the key's model rules...
    let (status, body) = chat(&gw, STRICT_KEY, "alpha-4o-mini", &[]).await;
    assert_eq!((status, body["error"]["code"].as_str()), (403, Some("model_not_allowed")), "{body}");
    // ...and spent the minute: an allowed model, and an unknown one, meet the rate limit.
    let (status, body) = chat(&gw, STRICT_KEY, "alpha-5.5", &[]).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(chat(&gw, STRICT_KEY, "alpha-none", &[]).await.0, 429, "an unknown model is no way around rpm");
    let metrics = admin_metrics(admin_port, ADMIN_TOKEN).await;
    assert_eq!(metric(&metrics, "tollgate_refusals_total{code=\"model_not_allowed\"}"), 1.0, "{metrics}");
    assert_eq!(metric(&metrics, "tollgate_refusals_total{code=\"rate_limited\"}"), 2.0, "{metrics}");
}

/// A reload says what it changed — keys added and removed, prices — and that a balance changed
/// in the file is not applied (a key's balance is set only when it is first created), naming
/// the admin API's `balance_delta`; the balance stays what it was.
#[tokio::test]
async fn a_reload_says_what_changed_and_that_a_changed_file_balance_is_not_applied() {
    let mock = start_mock();
    let gw = start_gateway_logged(&standard_config(mock.port));
    let usage = |key: &'static str| {
        let url = gw.url("/v1/usage");
        async move {
            let r = client().get(url).bearer_auth(key).send().await.expect("usage");
            nanos(&r.json::<Value>().await.expect("json")["balance"])
        }
    };
    assert_eq!(usage(CLIENT_KEY).await, 5_000_000_000);
    let path = gw.config_path();
    let changed = std::fs::read_to_string(&path)
        .expect("config")
        .replace(
            &format!("{{ key: {CLIENT_KEY}, name: tester, group: default, balance: 5.0 }}"),
            &format!("{{ key: {CLIENT_KEY}, name: tester, group: default, balance: 9.0 }}"),
        )
        .replace(
            &format!("  - {{ key: {CHAT_KEY}, name: chatter, group: chat, balance: 5.0 }}\n"),
            "  - { key: sk-reload-newcomer-0001, name: newcomer, group: default, balance: 1.0 }\n",
        );
    std::fs::write(&path, changed).expect("write");
    gw.signal("HUP");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !gw.log().contains("configuration reloaded") && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let log = gw.log();
    assert!(log.contains("configuration reloaded") && log.contains("keys +1 (newcomer) -1 (chatter)"), "{log}");
    assert!(log.contains("key 'tester': its balance in the file changed (5 → 9 USD) and is not applied"), "{log}");
    assert!(log.contains("balance_delta") && !log.contains(CLIENT_KEY), "{log}");
    assert_eq!(usage(CLIENT_KEY).await, 5_000_000_000, "the stored balance stands");
}

/// A reload that names a secret variable the process was not started with is refused, saying
/// that an upgrade (-u) or a restart reads it (a reload does not).
#[tokio::test]
async fn a_reload_naming_a_new_secret_variable_says_an_upgrade_reads_it() {
    let mock = start_mock();
    let gw = start_gateway_logged(&standard_config(mock.port));
    let path = gw.config_path();
    let changed = std::fs::read_to_string(&path).expect("config").replacen(
        &format!("api_key: {UPSTREAM_KEY}"),
        "api_key_env: TOLLGATE_RELOAD_NEW_SECRET",
        1,
    );
    std::fs::write(&path, changed).expect("write");
    // Asked again each second: a reload asked for before the daemon listens for SIGHUP is lost.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut asked = std::time::Instant::now() - std::time::Duration::from_secs(1);
    while !gw.log().contains("reload refused") && std::time::Instant::now() < deadline {
        if asked.elapsed() >= std::time::Duration::from_secs(1) {
            gw.signal("HUP");
            asked = std::time::Instant::now();
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let log = gw.log();
    assert!(log.contains("environment variable TOLLGATE_RELOAD_NEW_SECRET is not set") && log.contains("upgrade (-u)"), "{log}");
}
