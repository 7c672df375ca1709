//! Operations against the real daemon: configuration reload on SIGHUP (and refusal of a bad
//! file), the access log (never a secret), /healthz, /readyz and /metrics, and graceful shutdown
//! on SIGTERM draining an open stream.

use crate::common::*;
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::time::Duration;

const ADMIN_TOKEN: &str = "admin-token-ops-0001";

fn config(mock_port: u16, admin_port: u16) -> String {
    format!("{}admin: {{ listen: 127.0.0.1:{admin_port}, token: {ADMIN_TOKEN} }}\n", standard_config(mock_port))
}

async fn model_ids(gw: &Gateway, key: &str) -> Vec<String> {
    let v: Value = client().get(gw.url("/v1/models")).bearer_auth(key).send().await.expect("models").json().await.expect("json");
    v["data"].as_array().map(|d| d.iter().filter_map(|m| m["id"].as_str().map(str::to_string)).collect()).unwrap_or_default()
}

#[tokio::test]
async fn sighup_reloads_routing_and_keys_and_refuses_a_bad_file() {
    let mock = start_mock();
    let gw = start_gateway_logged(&config(mock.port, free_port()));
    assert!(!model_ids(&gw, CLIENT_KEY).await.contains(&"alpha-6".to_string()));

    // A stream in flight across the reload keeps its provider.
    let token = format!("reload-{}", std::process::id());
    let held = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(CLIENT_KEY)
        .header("x-mock-hold", &token)
        .json(&json!({"model": "alpha-4o-mini", "stream": true, "messages": []}))
        .send()
        .await
        .expect("stream");
    assert_eq!(held.status(), 200);

    let path = gw.config_path();
    let original = std::fs::read_to_string(&path).expect("config");
    let changed = original
        .replace("models: [alpha-5.5, alpha-4o-mini, alpha-embed-3]", "models: [alpha-5.5, alpha-6, alpha-embed-3]")
        .replace("prices:\n", "prices:\n  alpha-6: { input: 1, output: 1 }\n")
        .replace("keys:\n", "keys:\n  - { key: sk-client-new-0001, name: newcomer, group: default, balance: 1.0 }\n");
    std::fs::write(&path, &changed).expect("write");
    gw.signal("HUP");
    until("the new model list", || async { model_ids(&gw, CLIENT_KEY).await.contains(&"alpha-6".to_string()) }).await;
    assert!(!model_ids(&gw, CLIENT_KEY).await.contains(&"alpha-4o-mini".to_string()));
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth("sk-client-new-0001")
        .json(&json!({"model": "alpha-6", "messages": []}))
        .send()
        .await
        .expect("new key");
    assert_eq!(r.status(), 200, "the new key and model work without a restart");
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(CLIENT_KEY)
        .json(&json!({"model": "alpha-4o-mini", "messages": []}))
        .send()
        .await
        .expect("old model");
    assert_eq!(r.status(), 404);

    client().post(mock.url(&format!("/__mock/release?token={token}"))).send().await.expect("release");
    let body = held.text().await.expect("the held stream finishes");
    assert!(body.contains("[DONE]"), "{body}");

    // A bad file is refused; the running configuration stays.
    std::fs::write(&path, changed.replace("protocol: gemini", "protocol: palm")).expect("write");
    gw.signal("HUP");
    until("the refusal in the log", || async { gw.log().contains("configuration reload refused") }).await;
    assert!(gw.log().contains("palm"), "the message names the problem");
    assert!(model_ids(&gw, CLIENT_KEY).await.contains(&"alpha-6".to_string()));
    let r = client()
        .post(gw.url("/v1beta/models/gamma-3.5-flash:generateContent"))
        .bearer_auth(CLIENT_KEY)
        .json(&json!({"contents": []}))
        .send()
        .await
        .expect("gemini");
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn the_access_log_names_keys_and_never_holds_a_secret() {
    let mock = start_mock();
    let gw = start_gateway_logged(&config(mock.port, free_port()));
    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(CLIENT_KEY)
        .header("x-api-key", CLIENT_KEY)
        .json(&json!({"model": "alpha-5.5", "messages": []}))
        .send()
        .await
        .expect("chat");
    assert_eq!(r.status(), 200);
    let request_id = r.headers().get("x-request-id").and_then(|v| v.to_str().ok()).expect("X-Request-Id").to_string();
    let r = client()
        .post(gw.url("/v1/messages?key=leaked-in-query"))
        .header("x-api-key", CLIENT_KEY)
        .json(&json!({"model": "beta-opus-4-7", "max_tokens": 5}))
        .send()
        .await
        .expect("query key");
    assert_eq!(r.status(), 400);
    let r = client().get(gw.url("/v1/models")).bearer_auth("sk-wrong-secret-1234").send().await.expect("bad key");
    assert_eq!(r.status(), 401);
    until("three access lines", || async { gw.log().matches("route=").count() >= 3 }).await;
    let log = gw.log();
    let chat = log.lines().find(|l| l.contains("route=chat_completions")).expect("chat line");
    // Issue 46, point 10: a client's request id finds its line (and the upstream's own id).
    let id_part = format!("request_id={request_id} ");
    for part in [
        "status=200",
        "key=\"tester\"",
        "model=\"alpha-5.5\"",
        "output_tokens=3",
        "latency_ms=",
        &id_part,
        "upstream_request_id=\"req_mock_0001\"",
    ] {
        assert!(chat.contains(part), "{part} in {chat}");
    }
    assert!(log.contains("status=401"), "{log}");
    for secret in [CLIENT_KEY, UPSTREAM_KEY, ADMIN_TOKEN, "sk-wrong-secret-1234", "leaked-in-query"] {
        assert!(!log.contains(secret), "{secret} reached the log");
    }
}

#[tokio::test]
async fn health_readiness_and_metrics() {
    let mock = start_mock();
    let admin_port = free_port();
    let dead = free_port();
    let body = config(mock.port, admin_port);
    let gw = start_gateway(&body);
    let admin = |p: &str| format!("http://127.0.0.1:{admin_port}{p}");
    assert_eq!(client().get(admin("/healthz")).send().await.expect("h").status(), 200);
    let r = client().get(admin("/readyz")).send().await.expect("ready");
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["database"], "ok");
    assert_eq!(v["upstreams"]["oa"], "resolved");

    let r = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(CLIENT_KEY)
        .json(&json!({"model": "alpha-5.5", "stream": true, "messages": []}))
        .send()
        .await
        .expect("stream");
    r.text().await.expect("body");
    let metrics = client().get(admin("/metrics")).bearer_auth(ADMIN_TOKEN).send().await.expect("m").text().await.expect("t");
    for name in [
        "tollgate_requests_total{route=\"chat_completions\",model=\"alpha-5.5\",status=\"200\"}",
        "tollgate_upstream_seconds_bucket{protocol=\"openai\"",
        "tollgate_first_byte_seconds_count{protocol=\"openai\"} 1",
        "tollgate_tokens_total{model=\"alpha-5.5\",kind=\"output\"} 3",
        "tollgate_cost_usd_total",
        "tollgate_open_streams 0",
        "tollgate_database_bytes",
        "tollgate_video_tasks_open 0",
        "tollgate_video_tasks{status=\"in_progress\"} 0",
        "tollgate_video_tasks_finished_total{status=\"completed\"} 0",
    ] {
        assert!(metrics.contains(name), "{name} missing:\n{metrics}");
    }
    drop(gw);

    // An upstream host that does not resolve makes the gateway not ready (it still starts).
    let unresolvable = body.replace(&format!("http://127.0.0.1:{}/ge", mock.port), &format!("http://no-such-host.invalid:{dead}/ge"));
    let gw = start_gateway(&unresolvable);
    let r = client().get(admin("/readyz")).send().await.expect("ready");
    assert_eq!(r.status(), 503);
    assert_eq!(r.json::<Value>().await.expect("json")["upstreams"]["ge"], "unresolved");
    drop(gw);
}

#[tokio::test]
async fn sigterm_drains_an_open_stream_then_exits_with_its_record() {
    let mock = start_mock();
    let mut gw = start_gateway(&config(mock.port, free_port()));
    let token = format!("term-{}", std::process::id());
    let r = client()
        .post(gw.url("/v1/messages"))
        .bearer_auth(CLIENT_KEY)
        .header("x-mock-hold", &token)
        .json(&json!({"model": "beta-opus-4-7", "max_tokens": 16, "stream": true, "messages": []}))
        .send()
        .await
        .expect("stream");
    let mut stream = r.bytes_stream();
    let first = stream.next().await.expect("first").expect("bytes");
    assert!(String::from_utf8_lossy(&first).contains("message_start"));
    gw.signal("TERM");
    // New connections are refused while the stream drains.
    until("the listener to close", || async { std::net::TcpStream::connect(("127.0.0.1", gw.proc.port)).is_err() }).await;
    client().post(mock.url(&format!("/__mock/release?token={token}"))).send().await.expect("release");
    let mut rest = Vec::new();
    while let Some(chunk) = stream.next().await {
        rest.extend_from_slice(&chunk.expect("the stream is not cut"));
    }
    assert!(String::from_utf8_lossy(&rest).contains("message_stop"));
    // The process exits once drained (well before Pingora's 300 s default grace period).
    let status = wait_exit(&mut gw.proc.child, Duration::from_secs(20), "did not exit after draining").await;
    assert!(status.success(), "{status}");
    gw.start_again();
    let u: Value = client().get(gw.url("/v1/usage")).bearer_auth(CLIENT_KEY).send().await.expect("usage").json().await.expect("json");
    assert_eq!(u["total"]["requests"], 1, "the drained request was billed and kept: {u}");
}

/// Issue 46, point 6: a clean stop checkpoints, so the next start applies nothing again and
/// says nothing that reads like a crash; after a kill -9 the warning stays (a real crash).
#[tokio::test]
async fn a_clean_stop_leaves_nothing_to_apply_again_and_a_crash_still_says_so() {
    let mock = start_mock();
    let mut gw = start_gateway_logged(&config(mock.port, free_port()));
    for _ in 0..5 {
        assert_eq!(post_chat(&gw, CLIENT_KEY).await.status(), 200);
    }
    wait_requests(&gw, CLIENT_KEY, 5).await;
    gw.signal("TERM");
    let status = wait_exit(&mut gw.proc.child, Duration::from_secs(20), "did not exit").await;
    assert!(status.success(), "{status}");
    gw.start_again();
    assert_eq!(wait_requests(&gw, CLIENT_KEY, 5).await["total"]["requests"], 5, "every record kept");
    assert!(!gw.log().contains("applied again"), "a clean stop reads like a crash: {}", gw.log());
    // A crash right after three requests (the journal's idle checkpoint is a second away):
    // what the journal holds is applied again, and the start says so.
    for _ in 0..3 {
        assert_eq!(post_chat(&gw, CLIENT_KEY).await.status(), 200);
    }
    gw.kill_hard();
    gw.start_again();
    assert!(gw.log().contains("applied again"), "{}", gw.log());
}

/// The unit's reload command line: with a broken file it fails (non-zero, a line saying why)
/// and the running process keeps serving, its records intact; with a good file the new process
/// takes over and the old one drains and exits.
#[tokio::test]
async fn a_reload_with_a_broken_config_fails_and_the_old_process_keeps_serving() {
    let mock = start_mock();
    let mut gw = start_gateway(&config(mock.port, free_port()));
    assert_eq!(post_chat(&gw, CLIENT_KEY).await.status(), 200);
    let good = std::fs::read_to_string(gw.config_path()).expect("config");
    std::fs::write(gw.config_path(), format!("{good}\nproviders: [ this is not yaml\n")).expect("break the config");
    let stderr_path = gw.dir.path().join("reload.err");
    let _new_process = ReloadedGuard(stderr_path.clone());
    let run_reload = |gw: &Gateway| {
        let err = std::fs::File::create(&stderr_path).expect("stderr file");
        let status = reload_command(gw).stdout(std::process::Stdio::null()).stderr(err).status().expect("run the reload");
        (status, std::fs::read_to_string(&stderr_path).unwrap_or_default())
    };
    let (status, stderr) = run_reload(&gw);
    assert!(!status.success(), "a broken file fails the reload: {stderr}");
    assert!(stderr.contains("configuration is not valid") && stderr.contains("keeps serving"), "{stderr}");
    assert!(gw.proc.child.try_wait().expect("wait").is_none(), "the old process was not signalled");
    assert!(!gw.dir.path().join("upgrade.sock").exists(), "no new process was started");
    assert_eq!(post_chat(&gw, CLIENT_KEY).await.status(), 200, "the old process serves");

    // Mended, the same command line upgrades.
    std::fs::write(gw.config_path(), &good).expect("mend the config");
    let (status, stderr) = run_reload(&gw);
    assert!(status.success(), "{stderr}");
    let old_status = wait_exit(&mut gw.proc.child, Duration::from_secs(30), "the old process did not hand over and exit").await;
    assert!(old_status.success(), "{old_status}");
    // The new process serves on the same port (the listener was handed over), with every record.
    assert_eq!(post_chat(&gw, CLIENT_KEY).await.status(), 200);
    assert_eq!(usage(&gw, CLIENT_KEY).await["total"]["requests"], 3, "nothing lost across the failed and the good reload");
}

/// The mock upstream stops on SIGTERM even with a client connection open (tests and the bench
/// stop it that way).
#[tokio::test]
async fn the_mock_exits_on_sigterm_with_a_connection_open() {
    let mut mock = start_mock();
    let c = client();
    let r = c
        .post(mock.url("/v1/chat/completions"))
        .bearer_auth(UPSTREAM_KEY)
        .json(&json!({"model": "alpha-gpt-4o", "messages": []}))
        .send()
        .await
        .expect("request");
    assert_eq!(r.status(), 200);
    let _ = r.bytes().await;
    let status = std::process::Command::new("kill").args(["-TERM", &mock.child.id().to_string()]).status().expect("kill");
    assert!(status.success());
    let status = wait_exit(&mut mock.child, Duration::from_secs(20), "tollgate-mock ignored SIGTERM").await;
    assert!(status.success(), "{status}");
    drop(c);
}

/// The shipped unit passes `systemd-analyze verify` (with ExecStart pointed at the built binary).
#[test]
fn the_systemd_unit_verifies() {
    let Ok(out) = std::process::Command::new("systemd-analyze").arg("--version").output() else {
        eprintln!("systemd-analyze is not installed here: the unit is not verified");
        return;
    };
    assert!(out.status.success());
    let unit = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/systemd/tollgate.service")).expect("unit");
    for needed in [
        "NoNewPrivileges=true",
        "ProtectSystem=strict",
        "ReadWritePaths=",
        "PrivateTmp=true",
        "LimitNOFILE=",
        "EnvironmentFile=",
        "ExecReload=",
    ] {
        assert!(unit.contains(needed), "{needed}");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("tollgate.service");
    let unit = unit
        .replace("/usr/local/lib/tollgate/tollgate-reload", concat!(env!("CARGO_MANIFEST_DIR"), "/systemd/tollgate-reload"))
        .replace("/usr/local/bin/tollgate", env!("CARGO_BIN_EXE_tollgate"));
    std::fs::write(&path, unit).expect("write");
    let out = std::process::Command::new("systemd-analyze").arg("verify").arg(&path).output().expect("verify");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Under systemd (Type=notify, NotifyAccess=all) the process reports READY and its MAINPID,
/// which is how systemd follows the new process after an upgrade.
#[test]
fn systemd_is_notified_with_ready_and_mainpid() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("notify.sock");
    let listener = std::os::unix::net::UnixDatagram::bind(&socket).expect("bind");
    listener.set_read_timeout(Some(Duration::from_secs(20))).expect("timeout");
    let (_cfg_dir, path, _port) = write_config(&standard_config(free_port()));
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("-c")
        .arg(&path)
        .env("NOTIFY_SOCKET", &socket)
        .env("RUST_LOG", "error")
        .spawn()
        .expect("spawn");
    let pid = child.id();
    let _guard = Proc { child, port: 0 };
    let mut buf = [0u8; 256];
    let n = listener.recv(&mut buf).expect("a notification");
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(text.contains("READY=1"), "{text}");
    assert!(text.contains(&format!("MAINPID={pid}")), "{text}");
}

/// Issue 27: the access log agrees with the ledger. A refused request names the model it asked
/// for and why; a video submission its model, seconds and charge; the poller logs the task's
/// end; `log.format: json` writes the same fields as one JSON object per line.
#[tokio::test]
async fn the_access_log_tells_refusals_and_videos_as_the_ledger_does() {
    let mock = start_mock();
    let gw = start_gateway_logged(&format!("{}{}", config(mock.port, free_port()), video_section(mock.port)));
    let chat = |model: &str, n: u64| {
        client()
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(CLIENT_KEY)
            .json(&json!({"model": model, "max_tokens": 100_000, "n": n, "messages": [{"role": "user", "content": "x"}]}))
            .send()
    };
    assert_eq!(chat("no-such-model", 1).await.expect("chat").status(), 404);
    // Eight answers of up to 100,000 tokens at $10 per million: $8 held of $5.
    assert_eq!(chat("alpha-5.5", 8).await.expect("chat").status(), 402);
    let create = || {
        client()
            .post(gw.url("/v1/videos"))
            .bearer_auth(CLIENT_KEY)
            .header("Idempotency-Key", "log-once")
            .json(&json!({"model": "genq3-pro", "prompt": "a cat", "duration": 4}))
            .send()
    };
    let r = create().await.expect("video");
    assert_eq!(r.status(), 200);
    let task: Value = r.json().await.expect("json");
    // The same Idempotency-Key again: the same task, charged once, logged as charged once.
    let again: Value = create().await.expect("video").json().await.expect("json");
    assert_eq!(again["id"], task["id"]);
    let id = task["id"].as_str().expect("id").to_string();
    assert_eq!(task["seconds"], 4, "{task}");
    until("the poller's end-of-task line", || async { gw.log().contains(&format!("video: task {id} of key")) }).await;
    let log = gw.log();
    let line =
        |needle: &str| log.lines().find(|l| l.contains(needle)).unwrap_or_else(|| panic!("no line with {needle}:\n{log}")).to_string();
    let unknown = line("model=\"no-such-model\"");
    assert!(unknown.contains("status=404") && unknown.contains("reason=unknown_model"), "{unknown}");
    let unknown_param = unknown.contains("param=\"model\"");
    assert!(unknown_param, "the field the refusal is about: {unknown}");
    let poor = line("reason=insufficient_balance");
    assert!(poor.contains("status=402") && poor.contains("model=\"alpha-5.5\""), "{poor}");
    let video = line("route=video_create");
    let charged = (4.0 * 0.05 * 1e9_f64).round() as i64;
    for part in
        ["status=200".to_string(), "model=\"genq3-pro\"".into(), format!("cost_usd={:.9}", charged as f64 / 1e9), "video_seconds=4".into()]
    {
        assert!(video.contains(&part), "{part} in {video}");
    }
    let creates: Vec<&str> = log.lines().filter(|l| l.contains("route=video_create")).collect();
    assert_eq!(creates.len(), 2, "{creates:?}");
    assert!(
        creates[1].contains("cost_usd=0.000000000") && !creates[1].contains("video_seconds"),
        "the replay charged nothing: {}",
        creates[1]
    );
    let ended = line(&format!("video: task {id} of key"));
    assert!(ended.contains("completed") && ended.contains("model=genq3-pro") && ended.contains("seconds=4"), "{ended}");

    // The same fields as JSON, one object per line.
    let gw = start_gateway_logged(&format!("{}log: {{ format: json }}\n", config(mock.port, free_port())));
    let json_chat = |model: &'static str| {
        client().post(gw.url("/v1/chat/completions")).bearer_auth(CLIENT_KEY).json(&json!({"model": model, "messages": []})).send()
    };
    assert_eq!(json_chat("alpha-5.5").await.expect("chat").status(), 200);
    assert_eq!(json_chat("no-such-model").await.expect("chat").status(), 404);
    until("two JSON access lines", || async { gw.log().matches("\"target\":\"access\"").count() >= 2 }).await;
    let log = gw.log();
    let lines: Vec<Value> = log.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))).collect();
    let access: Vec<&Value> = lines.iter().filter(|v| v["target"] == "access").collect();
    let ok = access.iter().find(|v| v["status"] == 200).expect("the 200");
    assert_eq!(
        (ok["key"].as_str(), ok["model"].as_str(), ok["output_tokens"].as_u64()),
        (Some("tester"), Some("alpha-5.5"), Some(3)),
        "{ok}"
    );
    assert!(ok["cost_usd"].as_f64().is_some_and(|c| c > 0.0) && ok["ts"].is_string() && ok["level"] == "INFO", "{ok}");
    assert!(ok["request_id"].as_str().is_some_and(|id| id.starts_with("req_")), "{ok}");
    let refused = access.iter().find(|v| v["status"] == 404).expect("the 404");
    assert_eq!((refused["model"].as_str(), refused["reason"].as_str()), (Some("no-such-model"), Some("unknown_model")), "{refused}");
    assert!(lines.iter().any(|v| v["target"] != "access" && v["message"].is_string()), "other lines are JSON too");
}

/// Issue 46, point 6: at INFO, a start says one summary line (plus any warnings); Pingora's
/// list of the services it starts is debug.
#[tokio::test]
async fn a_start_says_one_line_at_info() {
    let mock = start_mock();
    let gw = start_gateway_logged(&config(mock.port, free_port()));
    assert_eq!(post_chat(&gw, CLIENT_KEY).await.status(), 200);
    let log = gw.log();
    let info: Vec<&str> = log.lines().filter(|l| l.contains(" INFO ") && !l.contains(" access]") && !l.contains("INFO  access")).collect();
    assert!(!log.contains("Starting service"), "{log}");
    assert_eq!(info.len(), 1, "one INFO line at start: {info:#?}");
    assert!(info[0].contains("listening on"), "{info:#?}");
}

/// Issue 46, point 8: `/metrics` on a listener of its own, bound to a non-loopback address (all
/// interfaces here), behind a bearer token and an address allowlist; every family has its
/// `# HELP`.
#[tokio::test]
async fn the_metrics_listener_serves_prometheus_from_another_address_with_help_on_every_family() {
    let mock = start_mock();
    let port = free_port();
    let token = "metrics-scrape-token-000000000001";
    let body = format!(
        "metrics: {{ listen: \"0.0.0.0:{port}\", token_env: TOLLGATE_TEST_METRICS_TOKEN, allow: [127.0.0.2/32] }}\n{}",
        config(mock.port, free_port())
    );
    let (dir, path, gw_port) = write_config(&body);
    let proc = {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .arg("-c")
            .arg(&path)
            .env("RUST_LOG", "warn")
            .env("TOLLGATE_TEST_METRICS_TOKEN", token)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("spawn");
        wait_listening(gw_port, &mut child, "tollgate");
        Proc { child, port: gw_port }
    };
    let gw = Gateway { proc, dir };
    assert_eq!(post_chat(&gw, CLIENT_KEY).await.status(), 200);
    let from = |source: [u8; 4]| reqwest::Client::builder().local_address(std::net::IpAddr::from(source)).build().expect("client");
    let url = format!("http://127.0.0.1:{port}/metrics");
    // From an address the allowlist names, with the token: the text.
    let r = from([127, 0, 0, 2]).get(&url).bearer_auth(token).send().await.expect("scrape");
    assert_eq!(r.status(), 200);
    let text = r.text().await.expect("text");
    assert!(text.contains("tollgate_requests_total{route=\"chat_completions\""), "{text}");
    let types: Vec<&str> =
        text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).map(|l| l.split(' ').next().unwrap_or_default()).collect();
    assert!(types.len() > 10, "{text}");
    for name in types {
        let help = text.lines().find_map(|l| l.strip_prefix(&format!("# HELP {name} "))).unwrap_or_default();
        assert!(!help.is_empty() && help != name, "{name} has no help text");
    }
    // Without the token, from another address, or another path: refused.
    assert_eq!(from([127, 0, 0, 2]).get(&url).send().await.expect("no token").status(), 401);
    assert_eq!(from([127, 0, 0, 1]).get(&url).bearer_auth(token).send().await.expect("address").status(), 403);
    let keys = format!("http://127.0.0.1:{port}/admin/keys");
    assert_eq!(from([127, 0, 0, 2]).get(&keys).bearer_auth(token).send().await.expect("other").status(), 404);
}
