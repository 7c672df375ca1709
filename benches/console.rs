//! How long the console's usage page takes over a year of records: 100,000 usage records of 20
//! keys spread over the last 365 days are written into a data directory, then tollgate (the
//! release binary) serves `/console/usage` for the whole year grouped by day, key, model and
//! tag. Reports the median of 3 loads of each (wall-clock, this machine; the bar is
//! 2 s). `TOLLGATE_BENCH_RECORDS` changes the count. Writes target/bench/console.json.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark: a failure here is a failed run, not a client's answer
#![allow(clippy::too_many_lines)] // a benchmark's main tells its run in order

use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ADMIN_TOKEN: &str = "bench-console-admin-token-0001";
const KEYS: usize = 20;

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("port")
}

fn wait_port(port: u16) {
    for _ in 0..600 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("nothing listens on {port}");
}

fn start(config: &std::path::Path, port: u16, admin: u16) -> Proc {
    let child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["-c", config.to_str().expect("path")])
        .env("RUST_LOG", "warn")
        .spawn()
        .expect("tollgate");
    wait_port(port);
    wait_port(admin);
    Proc(child)
}

fn main() {
    let records: usize = std::env::var("TOLLGATE_BENCH_RECORDS").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    let dir = tempfile::tempdir().expect("tempdir");
    let (port, admin) = (free_port(), free_port());
    let mut keys = String::new();
    for i in 0..KEYS {
        keys.push_str(&format!(
            "  - {{ key: sk-bench-console-{i:04}-long-enough-secret, name: key-{i}, group: default, balance: 1000.0, tags: {{ team: t{} }} }}\n",
            i % 4
        ));
    }
    let config = dir.path().join("tollgate.yaml");
    std::fs::write(
        &config,
        format!(
            "listen: 127.0.0.1:{port}\ndata_dir: {}/data\nadmin: {{ listen: 127.0.0.1:{admin}, token: {ADMIN_TOKEN} }}\n\
pingora: {{ threads: 2, pid_file: {0}/pid, upgrade_sock: {0}/upgrade.sock }}\nbilling: {{ usage_retention_days: 400 }}\n\
providers:\n  - {{ name: oa, protocol: openai, base_url: \"http://127.0.0.1:9\", api_key: x, models: [alpha-5.5, alpha-mini] }}\n\
groups:\n  default: {{ platforms: [openai] }}\nprices:\n  alpha-5.5: {{ input: 2.0, output: 8.0 }}\n  alpha-mini: {{ input: 0.5, output: 1.0 }}\nkeys:\n{keys}",
            dir.path().display()
        ),
    )
    .expect("config");
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");
        // The keys (and their ids) as the gateway made them.
        let ids: Vec<String> = {
            let _gw = start(&config, port, admin);
            let keys: serde_json::Value = http
                .get(format!("http://127.0.0.1:{admin}/admin/keys"))
                .bearer_auth(ADMIN_TOKEN)
                .send()
                .await
                .expect("keys")
                .json()
                .await
                .expect("json");
            keys["data"].as_array().expect("list").iter().filter_map(|k| k["id"].as_str().map(str::to_string)).collect()
        };
        assert_eq!(ids.len(), KEYS);
        // A year of records, written the way the gateway books them.
        let seeded = Instant::now();
        {
            let db = sled::open(dir.path().join("data")).expect("data_dir");
            let ledger = Arc::new(tollgate::billing::ledger::Ledger::open(&db).expect("ledger"));
            let now_ms = tollgate::base::clock::now_ms();
            let year_ms = 365 * 86_400_000u64;
            let mut pending = Vec::new();
            for i in 0..records {
                let key = &ids[i % KEYS];
                let time_ms = now_ms - year_ms + (i as u64 * year_ms / records as u64);
                let record = tollgate::records::usage::UsageRecord {
                    time_ms,
                    key_id: key.clone(),
                    model: if i % 3 == 0 { "alpha-mini".into() } else { "alpha-5.5".into() },
                    protocol: "openai".into(),
                    route: "chat_completions".into(),
                    input_tokens: 100,
                    cached_tokens: 0,
                    cache_write_tokens: 0,
                    output_tokens: 20,
                    cost_nanos: 360_000,
                    list_cost_nanos: None,
                    status: 200,
                    latency_ms: 5,
                    estimated: false,
                    seq: 0,
                    balance_after: 0,
                    provider: Some("oa".into()),
                    attempts: 1,
                    response_id: None,
                    upstream_protocol: None,
                    charged: Vec::new(),
                    tags: [("team".to_string(), format!("t{}", i % KEYS % 4))].into_iter().collect(),
                    requested_model: None,
                    fallbacks: None,
                    cache: None,
                    cache_saved_nanos: None,
                };
                let ledger = ledger.clone();
                pending.push(tokio::spawn(async move { ledger.adjust(record).await }));
                if pending.len() == 2000 {
                    for p in pending.drain(..) {
                        p.await.expect("join").expect("booked");
                    }
                }
            }
            for p in pending {
                p.await.expect("join").expect("booked");
            }
            ledger.commit_now().await.expect("commit");
            ledger.leave().await;
            db.flush().expect("flush");
        }
        println!("seeded {records} records of {KEYS} keys over 365 days in {:.1} s", seeded.elapsed().as_secs_f64());
        let _gw = start(&config, port, admin);
        let console = format!("http://127.0.0.1:{admin}/console");
        let signed =
            http.post(format!("{console}/login")).form(&[("token", ADMIN_TOKEN), ("next", "/console")]).send().await.expect("sign in");
        let cookie =
            signed.headers().get("set-cookie").and_then(|v| v.to_str().ok()).and_then(|v| v.split(';').next()).expect("cookie").to_string();
        let today = jiff::Zoned::now().with_time_zone(jiff::tz::TimeZone::UTC).date();
        let from = today.checked_sub(jiff::Span::new().days(364)).expect("date");
        let mut report = serde_json::Map::new();
        println!("\n| usage page, 365 days, {records} records | median of 3 (s) | rows |\n|---|---|---|");
        for group in ["day", "key", "model", "tag&tag=team"] {
            let url = format!("{console}/usage?group={group}&from={from}&to={today}");
            let mut times = Vec::new();
            let mut rows = 0;
            for _ in 0..3 {
                let t = Instant::now();
                let page = http.get(&url).header("cookie", &cookie).send().await.expect("usage");
                assert_eq!(page.status(), 200, "{url}");
                let body = page.text().await.expect("body");
                times.push(t.elapsed().as_secs_f64());
                rows = body.matches("<tr>").count().saturating_sub(2);
            }
            times.sort_by(f64::total_cmp);
            let median = times[1];
            println!("| group={group} | {median:.3} | {rows} |");
            report.insert(group.to_string(), serde_json::json!({"median_s": median, "runs_s": times, "rows": rows}));
        }
        let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
        let _ = std::fs::create_dir_all(&out);
        let json = serde_json::json!({"records": records, "keys": KEYS, "days": 365, "usage_page": report});
        let _ = std::fs::write(out.join("console.json"), serde_json::to_vec_pretty(&json).unwrap_or_default());
    });
}
