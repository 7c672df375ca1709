//! Issue 70 in a fleet: the response cache of three daemons on one PostgreSQL server (real,
//! started by the test) is the shared database's, so an answer one node kept is served by
//! every node, emptied once for all, and bounded once for all.

use crate::common::postgres::Postgres;
use crate::common::*;
use serde_json::{json, Value};

const ADMIN_TOKEN: &str = "fleet-cache-admin-token-0123";
const KEY: &str = "sk-fleet-cache-key-000000000001";

/// Node `name`: group `default` caches per key; hits cost nothing (no `cache_hit`).
fn node(mock: u16, pg: &Postgres, name: &str) -> (Gateway, u16) {
    let admin = free_port();
    let body = format!(
        r#"
admin: {{ listen: "127.0.0.1:{admin}", token: {ADMIN_TOKEN} }}
providers:
  - {{ name: oa, protocol: openai, base_url: "http://127.0.0.1:{mock}/oa", api_key: {UPSTREAM_KEY}, models: [alpha-5.5] }}
groups:
  default: {{ platforms: [openai], cache: {{ ttl: 300 }} }}
cache: {{ max_bytes: 3000 }}
prices:
  alpha-5.5: {{ input: 2.0, output: 8.0 }}
billing: {{ commit_interval_ms: 20, sync_commit: true }}
store: {{ postgres: {{ url: "{url}", pool_size: 4 }}, node_id: {name} }}
keys:
  - {{ key: {KEY}, name: cached, group: default, balance: 5.0 }}
"#,
        url = pg.url()
    );
    (start_gateway_logged(&body), admin)
}

async fn chat(gw: &Gateway, text: &str, tag: &str, stream: bool) -> (Option<String>, String) {
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(KEY)
        .header("x-test-tag", tag)
        .header("x-mock-usage", "100,10")
        .json(&json!({"model": "alpha-5.5", "temperature": 0, "stream": stream, "messages": [{"role": "user", "content": text}]}))
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 200);
    let cache = r.headers().get("x-tollgate-cache").and_then(|v| v.to_str().ok()).map(str::to_string);
    (cache, r.text().await.expect("body"))
}

fn content(body: &str) -> Value {
    serde_json::from_str::<Value>(body).expect("json")["choices"][0]["message"]["content"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_answer_kept_by_one_node_is_served_by_the_others_and_emptied_for_all() {
    let pg = Postgres::start();
    let mock = start_mock();
    let nodes: Vec<(Gateway, u16)> = ["node-a", "node-b", "node-c"].iter().map(|n| node(mock.port, &pg, n)).collect();
    let (a, b, c) = (&nodes[0].0, &nodes[1].0, &nodes[2].0);
    let (miss, first) = chat(a, "shared", "fleet", false).await;
    let (on_b, second) = chat(b, "shared", "fleet", false).await;
    let (on_c, third) = chat(c, "shared", "fleet", false).await;
    assert_eq!((miss.as_deref(), on_b.as_deref(), on_c.as_deref()), (Some("miss"), Some("hit"), Some("hit")));
    assert_eq!((content(&second), content(&third)), (content(&first), content(&first)));
    // A stream kept on c is replayed on a.
    let (s_miss, s_first) = chat(c, "streamed", "fleet-s", true).await;
    let (s_hit, s_again) = chat(a, "streamed", "fleet-s", true).await;
    assert_eq!((s_miss.as_deref(), s_hit.as_deref()), (Some("miss"), Some("hit")));
    let texts = |body: &str| -> Vec<Value> {
        body.lines()
            .filter_map(|l| l.strip_prefix("data: ").and_then(|d| serde_json::from_str::<Value>(d).ok()))
            .map(|e| e["choices"][0]["delta"]["content"].clone())
            .collect()
    };
    assert_eq!(texts(&s_again), texts(&s_first));
    assert!(texts(&s_first).len() > 2, "{s_first}");
    assert_eq!((mock_requests(&mock, "fleet").await.len(), mock_requests(&mock, "fleet-s").await.len()), (1, 1));
    // Billed once each (hits are free here), whichever node is asked.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let u = usage(b, KEY).await;
        if u["total"]["requests"] == 5 {
            assert_eq!(nanos(&u["total"]["cost"]), 2 * cost_nanos("alpha-5.5", 100, 10), "{u}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{u}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // Emptied on b: gone for a too.
    let (status, out) = admin_call(nodes[1].1, ADMIN_TOKEN, reqwest::Method::DELETE, "/admin/cache?model=alpha-5.5", None).await;
    assert_eq!((status, out["deleted"].as_u64()), (200, Some(2)), "{out}");
    assert_eq!(chat(a, "shared", "fleet", false).await.0.as_deref(), Some("miss"));
    // One bound for all: 3,000 bytes kept over the nodes, the least recently used gone.
    for (i, gw) in [a, b, c].iter().cycle().take(12).enumerate() {
        chat(gw, &format!("filler {i}"), "fill", false).await;
    }
    let bytes = metric(&admin_metrics(nodes[2].1, ADMIN_TOKEN).await, "tollgate_cache_bytes");
    assert!(bytes > 0.0 && bytes <= 3000.0, "{bytes}: {}", c.log());
    assert_eq!(chat(c, "shared", "fleet", false).await.0.as_deref(), Some("miss"), "the oldest answer went");
}
