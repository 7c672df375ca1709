//! Zero-downtime upgrade (`tollgate -u`, then SIGQUIT to the old process) under load: short
//! requests, a long stream and a video task being polled cross the upgrade; no answered request
//! fails (see the loader for the one exception Pingora leaves),
//! the stream is not cut, every usage record is kept, and the new process polls the task.

use crate::common::*;
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[tokio::test]
async fn an_upgrade_under_load_loses_nothing() {
    let mock = start_mock();
    // With the response cache's store (sled): the old process lets go of it with the database.
    let mut old = start_gateway(&format!("{}{}cache: {{}}\n", standard_config(mock.port), video_section(mock.port)));
    let path = old.config_path();

    // A video task held running upstream.
    let token = format!("upgrade-{}", std::process::id());
    let task: Value = client()
        .post(old.url("/v1/videos"))
        .bearer_auth(CLIENT_KEY)
        .json(&json!({"model": "genq3-pro", "prompt": format!("across [hold:{token}]")}))
        .send()
        .await
        .expect("create")
        .json()
        .await
        .expect("json");
    let task_id = task["id"].as_str().expect("id").to_string();
    poll_task(&old, CLIENT_KEY, &task_id, |v| v["status"] == "in_progress").await;

    // A long stream (80 deltas, 100 ms apart: 8 s) that starts on the old process.
    let stream_url = old.url("/v1/chat/completions");
    let stream = tokio::spawn(async move {
        let r = client()
            .post(stream_url)
            .bearer_auth(CLIENT_KEY)
            .header("x-mock-deltas", "80")
            .header("x-mock-interval-ms", "100")
            .json(&json!({"model": "alpha-5.5", "stream": true, "messages": []}))
            .send()
            .await
            .expect("stream");
        assert_eq!(r.status(), 200);
        let mut body = Vec::new();
        let mut s = r.bytes_stream();
        while let Some(chunk) = s.next().await {
            body.extend_from_slice(&chunk.expect("the stream is not cut"));
        }
        String::from_utf8_lossy(&body).into_owned()
    });

    // Short requests back to back, each on a new connection, until told to stop. A request
    // whose connection the old process accepted but had not read when it stopped accepting is
    // dropped unanswered by Pingora 0.9 (issue 13, point 8; the ignored test below demands
    // none): such send errors are counted apart and tolerated up to two. They cannot hide a
    // processed request: the usage check below wants exactly one record per answered request.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed, dropped) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let loader = {
        let (stop, ok, failed, dropped, url) = (stop.clone(), ok.clone(), failed.clone(), dropped.clone(), old.url("/v1/chat/completions"));
        tokio::spawn(async move {
            let c = reqwest::Client::builder().pool_max_idle_per_host(0).timeout(Duration::from_secs(60)).build().expect("client");
            while !stop.load(Ordering::SeqCst) {
                match short_chat(&c, &url).await {
                    Outcome::Answered => ok.fetch_add(1, Ordering::SeqCst),
                    Outcome::Unanswered(e) => {
                        eprintln!("request dropped before any answer: {e}");
                        dropped.fetch_add(1, Ordering::SeqCst)
                    }
                    Outcome::Failed(e) => {
                        eprintln!("failed request: {e}");
                        failed.fetch_add(1, Ordering::SeqCst)
                    }
                };
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The upgrade: new process with -u (it waits for the sockets), then SIGQUIT to the old one.
    let upgrade_sock = old.dir.path().join("upgrade.sock");
    // Killed on drop, whatever happens below.
    let _new = Proc {
        child: Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["-u", "-c"])
            .arg(&path)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the new process"),
        port: old.proc.port,
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !upgrade_sock.exists() {
        assert!(Instant::now() < deadline, "the new process never waited for the sockets");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    old.signal("QUIT");

    // The old process drains (the stream) and exits by itself.
    let status = wait_exit(&mut old.proc.child, Duration::from_secs(60), "the old process did not exit").await;
    assert!(status.success(), "{status}");
    let body = stream.await.expect("stream task");
    assert!(body.contains("[DONE]"), "the stream that began before the upgrade finished: {body}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::SeqCst);
    loader.await.expect("loader");
    let (ok, failed, dropped) = (ok.load(Ordering::SeqCst), failed.load(Ordering::SeqCst), dropped.load(Ordering::SeqCst));
    assert_eq!(failed, 0, "{ok} ok, {failed} failed");
    assert!(dropped <= 2, "{dropped} requests dropped unanswered: more than Pingora's accept race explains");
    assert!(ok > 20, "load ran across the upgrade: {ok}");

    // The new process has every record: the short requests, the stream, the video charge.
    let u: Value = client().get(old.url("/v1/usage")).bearer_auth(CLIENT_KEY).send().await.expect("usage").json().await.expect("json");
    let chat = u["models"].as_array().and_then(|m| m.iter().find(|r| r["model"] == "alpha-5.5")).expect("chat row");
    assert_eq!(chat["requests"].as_u64(), Some(ok + 1), "{u}");
    assert_eq!(chat["output_tokens"].as_u64(), Some(ok * 3 + 80), "the stream's 80 tokens were billed: {u}");
    eprintln!(
        "upgrade under load: {ok} short requests ok, {failed} failed, 1 stream of 80 deltas completed, {} records",
        u["total"]["requests"]
    );

    // And it polls the task the old process started.
    client().post(mock.url(&format!("/__mock/release?token={token}"))).send().await.expect("release");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v: Value = client()
            .get(old.url(&format!("/v1/videos/{task_id}")))
            .bearer_auth(CLIENT_KEY)
            .send()
            .await
            .expect("get")
            .json()
            .await
            .expect("json");
        if v["status"] == "completed" {
            break;
        }
        assert!(Instant::now() < deadline, "{v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Keep-alive clients (each reuses its connection, as the SDKs do) across an upgrade run by the
/// unit's reload command line. Known to fail: answers after the upgrade began carry
/// `Connection: close` (so no connection is reused into the old process's shutdown), which took
/// failures from 5 of 6 runs (10 requests) to 4 of 6 (6 requests) here, but Pingora 0.9 drops a
/// connection it accepted whose request it has not read yet when it broadcasts the shutdown
/// (`HttpProxy::handle_new_request` selects on `await_shutdown`), and during the 5 s overlap
/// both processes accept on the same socket. Run with `--ignored`.
#[tokio::test]
#[ignore = "Pingora drops connections accepted just before its shutdown broadcast (issue 13, point 8)"]
async fn keep_alive_clients_see_no_error_across_an_upgrade() {
    let mock = start_mock();
    let mut old = start_gateway(&standard_config(mock.port));
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let loaders: Vec<_> = (0..4)
        .map(|_| {
            let (stop, ok, failed, url) = (stop.clone(), ok.clone(), failed.clone(), old.url("/v1/chat/completions"));
            tokio::spawn(async move {
                let c = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().expect("client");
                while !stop.load(Ordering::SeqCst) {
                    match short_chat(&c, &url).await {
                        Outcome::Answered => ok.fetch_add(1, Ordering::SeqCst),
                        Outcome::Unanswered(e) | Outcome::Failed(e) => {
                            eprintln!("failed request: {e}");
                            failed.fetch_add(1, Ordering::SeqCst)
                        }
                    };
                }
            })
        })
        .collect();
    let reach = |n: u64| {
        let ok = ok.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            while ok.load(Ordering::SeqCst) < n {
                assert!(Instant::now() < deadline, "the load stalled");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    reach(100).await;
    let log = old.dir.path().join("reload.err");
    let _new_process = ReloadedGuard(log.clone());
    let status = reload_command(&old).stdout(Stdio::null()).stderr(std::fs::File::create(&log).expect("log")).status().expect("reload");
    assert!(status.success(), "{}", std::fs::read_to_string(&log).unwrap_or_default());
    wait_exit(&mut old.proc.child, Duration::from_secs(60), "the old process did not exit").await;
    let served = ok.load(Ordering::SeqCst);
    reach(served + 200).await;
    stop.store(true, Ordering::SeqCst);
    for l in loaders {
        l.await.expect("loader");
    }
    let (ok, failed) = (ok.load(Ordering::SeqCst), failed.load(Ordering::SeqCst));
    assert_eq!(failed, 0, "keep-alive clients across an upgrade: {ok} ok, {failed} failed");
}
