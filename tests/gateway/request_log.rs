//! Issue 30, point 1 against the real daemon: `X-Request-Id` on every answer of the public
//! listener (the client's when well-formed), and the request log behind `GET /admin/requests`:
//! relayed, refused and failed requests, their filters and pages, never a prompt.

use crate::common::*;
use serde_json::{json, Value};

const ADMIN_TOKEN: &str = "request-log-admin-token-000001";

async fn admin(port: u16, path: &str) -> (u16, Value) {
    let resp = client().get(format!("http://127.0.0.1:{port}{path}")).bearer_auth(ADMIN_TOKEN).send().await.expect("admin");
    (resp.status().as_u16(), resp.json().await.unwrap_or(Value::Null))
}

fn request_id(resp: &reqwest::Response) -> String {
    resp.headers().get("x-request-id").and_then(|v| v.to_str().ok()).expect("X-Request-Id").to_string()
}

#[tokio::test]
async fn every_answer_has_a_request_id_and_the_log_keeps_each_request() {
    let mock = start_mock();
    let admin_port = free_port();
    let gw = start_gateway(&format!("{}admin: {{ listen: 127.0.0.1:{admin_port}, token: {ADMIN_TOKEN} }}\n", standard_config(mock.port)));
    let secret_prompt = "a prompt the log must never keep";
    // Relayed: the upstream's own id (the mock sends req_mock_0001) is replaced by tollgate's,
    // and kept in the entry.
    let relayed = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(CLIENT_KEY)
        .header("x-mock-usage", "12,7")
        .json(&json!({"model": "alpha-5.5", "messages": [{"role": "user", "content": secret_prompt}]}))
        .send()
        .await
        .expect("request");
    assert_eq!(relayed.status(), 200);
    let relayed_id = request_id(&relayed);
    assert!(relayed_id.starts_with("req_") && relayed_id.len() == 28, "{relayed_id}");
    // A client's well-formed id is kept; a malformed one is replaced.
    let mine = client()
        .post(gw.url("/v1/messages"))
        .header("x-api-key", CLIENT_KEY)
        .header("x-request-id", "client-trace.42_a")
        .json(&json!({"model": "beta-opus-4-7", "max_tokens": 10, "stream": true, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("request");
    assert_eq!(request_id(&mine), "client-trace.42_a");
    assert!(mine.text().await.expect("stream").contains("message_stop"));
    let odd = client().get(gw.url("/v1/models")).bearer_auth(CLIENT_KEY).header("x-request-id", "has space").send().await.expect("models");
    assert_ne!(request_id(&odd), "has space");
    // Refusals and local answers have one too.
    let refused = client().get(gw.url("/v1/models")).bearer_auth("sk-not-a-key-000001").send().await.expect("refused");
    assert_eq!(refused.status(), 401);
    let refused_id = request_id(&refused);
    let broke = client().get(gw.url("/v1/nothing-here")).send().await.expect("404");
    assert!(broke.headers().contains_key("x-request-id"));
    let failed = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(CLIENT_KEY)
        .header("x-mock-status", "500")
        .json(&json!({"model": "alpha-4o-mini", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("failed");
    let failed_status = failed.status().as_u16();
    assert!(failed_status >= 500, "{failed_status}");
    let failed_id = request_id(&failed);

    // The log, newest first.
    let (status, page) = admin(admin_port, "/admin/requests?limit=50").await;
    assert_eq!(status, 200, "{page}");
    let entries = page["data"].as_array().expect("entries").clone();
    assert!(!page.to_string().contains(secret_prompt), "no prompt in the log");
    let by_id = |id: &str| entries.iter().find(|e| e["id"] == id).unwrap_or_else(|| panic!("{id} not in the log: {page}")).clone();
    let r = by_id(&relayed_id);
    assert_eq!((r["status"].as_u64(), r["model"].as_str(), r["provider"].as_str()), (Some(200), Some("alpha-5.5"), Some("oa")));
    assert_eq!((r["input_tokens"].as_u64(), r["output_tokens"].as_u64()), (Some(12), Some(7)));
    assert_eq!(nanos(&r["cost"]), cost_nanos("alpha-5.5", 12, 7));
    assert_eq!(r["key_name"], "tester");
    assert_eq!(r["upstream_request_id"], "req_mock_0001");
    assert_eq!(r["attempts"], 1);
    let s = by_id("client-trace.42_a");
    assert_eq!((s["protocol"].as_str(), s["route"].as_str()), (Some("anthropic"), Some("messages")), "{s}");
    assert!(s["first_byte_ms"].is_u64(), "a streamed answer's first byte: {s}");
    let x = by_id(&refused_id);
    assert_eq!((x["status"].as_u64(), x["refusal"].as_str(), x.get("key_id")), (Some(401), Some("unauthorized"), None), "{x}");
    let f = by_id(&failed_id);
    assert_eq!(f["status"].as_u64(), Some(u64::from(failed_status)), "{f}");
    // A request that never reached a key check is not a request of the log.
    assert_eq!(entries.len(), 5, "{page}");
    let newest_first: Vec<u64> = entries.iter().filter_map(|e| e["time_ms"].as_u64()).collect();
    assert!(newest_first.windows(2).all(|w| w[0] >= w[1]), "{newest_first:?}");

    // Filters and pages.
    let (_, fours) = admin(admin_port, "/admin/requests?status=4xx").await;
    assert_eq!(fours["data"].as_array().map(Vec::len), Some(1));
    let key_id = tollgate::access::auth::seed_key_id(CLIENT_KEY);
    let (_, mine) = admin(admin_port, &format!("/admin/requests?key={key_id}&model=alpha-5.5")).await;
    assert_eq!(mine["data"].as_array().map(Vec::len), Some(1), "{mine}");
    let mut seen = Vec::new();
    let mut path = "/admin/requests?limit=2".to_string();
    loop {
        let (_, page) = admin(admin_port, &path).await;
        let ids: Vec<String> = page["data"].as_array().expect("page").iter().filter_map(|e| e["id"].as_str().map(str::to_string)).collect();
        assert!(ids.len() <= 2);
        seen.extend(ids);
        match page["next"].as_str() {
            Some(next) => path = format!("/admin/requests?limit=2&cursor={next}"),
            None => break,
        }
    }
    let all: Vec<String> = entries.iter().filter_map(|e| e["id"].as_str().map(str::to_string)).collect();
    assert_eq!(seen, all, "pages cover the log once, in order");
    let (status, one) = admin(admin_port, &format!("/admin/requests/{relayed_id}")).await;
    assert_eq!((status, one["id"].as_str()), (200, Some(relayed_id.as_str())));
    assert_eq!(admin(admin_port, "/admin/requests/req_unknown").await.0, 404);
    assert_eq!(admin(admin_port, "/admin/requests?status=9xx").await.0, 400);
}

#[test]
fn the_console_section_is_validated() {
    for (section, expected) in [
        ("console: { request_log_days: 0 }\n", "console.request_log_days"),
        ("console: { request_log_max: 10 }\n", "console.request_log_max"),
        ("console: { request_logs: true }\n", "request_logs"),
    ] {
        let (dir, path, _) = write_config(&format!("{}{section}", standard_config(1)));
        let (code, out) = run_tollgate(&["-t", "-c", path.to_str().expect("path")], &[]);
        assert!(code == 2 && out.contains(expected), "{section}: {out}");
        drop(dir);
    }
}

#[tokio::test]
async fn the_log_can_be_turned_off_and_ids_stay() {
    let mock = start_mock();
    let admin_port = free_port();
    let gw = start_gateway(&format!(
        "{}admin: {{ listen: 127.0.0.1:{admin_port}, token: {ADMIN_TOKEN} }}\nconsole: {{ request_log: false }}\n",
        standard_config(mock.port)
    ));
    let resp = client().get(gw.url("/v1/models")).bearer_auth(CLIENT_KEY).send().await.expect("models");
    assert!(resp.headers().contains_key("x-request-id"));
    let (status, page) = admin(admin_port, "/admin/requests").await;
    assert_eq!((status, page["data"].as_array().map(Vec::len)), (200, Some(0)), "{page}");
}

/// The key holder's page is off unless `console.key_page: true`, and its data needs the key.
#[tokio::test]
async fn the_key_page_is_off_by_default_and_its_data_needs_a_key() {
    let mock = start_mock();
    let gw = start_gateway(&standard_config(mock.port));
    for path in ["/me", "/me/app.js", "/me/data"] {
        let r = client().get(gw.url(path)).bearer_auth(CLIENT_KEY).send().await.expect("me");
        assert_eq!(r.status(), 404, "{path} while console.key_page is off");
    }
    let on = start_gateway(&format!("console: {{ key_page: true }}\n{}", standard_config(mock.port)));
    let page = client().get(on.url("/me")).send().await.expect("page");
    assert_eq!(page.status(), 200);
    let csp = page.headers().get("content-security-policy").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    assert!(csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"), "{csp}");
    assert!(page.text().await.expect("html").contains("/me/app.js"));
    assert_eq!(client().get(on.url("/me/data")).send().await.expect("data").status(), 401);
    let data: Value = client().get(on.url("/me/data")).bearer_auth(CLIENT_KEY).send().await.expect("data").json().await.expect("json");
    assert_eq!(data["object"], "key_page");
    assert!(data["balance"].as_f64().is_some() && data["requests"].is_array() && data["days"].is_array());
}
