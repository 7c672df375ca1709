//! What a crash (kill -9) may cost in each commit mode (`billing.commit_interval_ms`,
//! `billing.sync_commit`): the default mode loses at most the records of one commit window,
//! `sync_commit: true` loses none. A balance always agrees with the records that survived.

use crate::common::*;
use std::time::{Duration, Instant};

async fn chat(gw: &Gateway) {
    let r = post_chat(gw, CLIENT_KEY).await;
    assert_eq!(r.status(), 200);
    r.bytes().await.expect("body");
}

/// After the restart: records present, and the balance is the opening one minus exactly their cost.
async fn survivors(gw: &Gateway) -> u64 {
    let u = usage(gw, CLIENT_KEY).await;
    assert_eq!(nanos(&u["balance"]), 5_000_000_000 - nanos(&u["total"]["cost"]), "balance and surviving records agree: {u}");
    u["total"]["requests"].as_u64().expect("requests")
}

#[tokio::test]
async fn sync_commit_loses_nothing_to_kill_9() {
    let mock = start_mock();
    // A window far longer than the test: only the synchronous commit can save the records.
    let mut gw = start_gateway(&format!("{}billing: {{ commit_interval_ms: 1000, sync_commit: true }}\n", standard_config(mock.port)));
    for _ in 0..20 {
        chat(&gw).await;
    }
    // No /v1/usage before the kill (it would commit what is queued).
    gw.kill_hard();
    gw.start_again();
    assert_eq!(survivors(&gw).await, 20, "every answered request was on disk before its response ended");
}

#[tokio::test]
async fn the_default_mode_loses_at_most_one_commit_window_to_kill_9() {
    const WINDOW: Duration = Duration::from_millis(200);
    // Time a commit may take beyond its window on a loaded shared machine (one flush).
    const FLUSH_SLACK: Duration = Duration::from_millis(1500);
    let mock = start_mock();
    let mut gw = start_gateway(&format!("{}billing: {{ commit_interval_ms: 200 }}\n", standard_config(mock.port)));
    // Requests one after another for a while; each one's completion time is noted.
    let start = Instant::now();
    let mut completed = Vec::new();
    while start.elapsed() < WINDOW + FLUSH_SLACK + Duration::from_secs(1) {
        chat(&gw).await;
        completed.push(Instant::now());
    }
    let killed = Instant::now();
    gw.kill_hard();
    gw.start_again();
    let kept = survivors(&gw).await;
    let must_survive = completed.iter().filter(|t| killed.duration_since(**t) > WINDOW + FLUSH_SLACK).count() as u64;
    let answered = completed.len() as u64;
    eprintln!("answered {answered}, kept {kept} after kill -9, {must_survive} answered more than one window + flush before the kill");
    assert!(must_survive > 0, "the test ran long enough to have records that must survive");
    assert!(
        kept >= must_survive,
        "records older than one commit window were lost: kept {kept} of {answered}, {must_survive} had to survive"
    );
    assert!(kept <= answered);
}
