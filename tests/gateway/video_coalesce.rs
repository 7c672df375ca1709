//! Concurrent GETs of a task whose last poll is stale trigger exactly one describe call.
//! Runs the video service in-process (no background poller) against the mock video service.

use crate::common::*;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use tollgate::billing::ledger::Ledger;
use tollgate::config::{BaseUrl, VideoConfig};
use tollgate::records::key::KeyRecord;
use tollgate::video::VideoService;

#[tokio::test]
async fn stale_gets_coalesce_into_one_describe() {
    let mock = start_mock();
    let dir = tempfile::tempdir().expect("tempdir");
    let db = sled::open(dir.path()).expect("db");
    let ledger = Arc::new(Ledger::open(&db).expect("ledger"));
    let cfg = VideoConfig {
        base_url: BaseUrl::parse(&mock.url("")).expect("url"),
        secret_id: "mock-tc-secret-id".into(),
        secret_key: "mock-tc-secret-key".into(),
        region: "ap-guangzhou".into(),
        version: "2024-05-23".into(),
        brand: "Gen".into(),
        timeout_secs: 10,
        rate_per_sec: 100,
        ca_pem: None,
        poll_interval_secs: 1,
        poll_concurrency: 4,
        prices: [("genq3-pro".to_string(), 0.0)].into_iter().collect(),
        models: vec!["genq3-pro".to_string()],
        max_task_hours: 24,
    };
    let svc = Arc::new(
        VideoService::new(
            cfg,
            Arc::new(tollgate::store::sled::tasks::SledTasks::new(&db).expect("tasks")),
            tollgate::charge::Books::new(ledger),
            Arc::default(),
            None,
        )
        .expect("service"),
    );
    let key = KeyRecord {
        created_at: 0,
        ..KeyRecord::new("key_coalesce", "c", "default", String::new(), tollgate::records::key::KeyOrigin::Admin)
    };
    let payment = tollgate::charge::Payment {
        purses: vec![tollgate::records::purse::Purse::key(&key.id)],
        rate: Default::default(),
        plan_models: Vec::new(),
    };
    let (task, _) = svc.create(&key, &payment, br#"{"model":"genq3-pro","prompt":"coalesce"}"#, (None, 0)).await.expect("created");
    // Staleness is a matter of time: let the one-second poll interval pass.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let gets = (0..8).map(|_| {
        let svc = svc.clone();
        let key = key.clone();
        let id = task.id.clone();
        tokio::spawn(async move { svc.get(&key, &id).await })
    });
    for g in futures_util::future::join_all(gets).await {
        let t = g.expect("join").expect("get");
        assert_eq!(t.status.public(), "queued", "the first describe answers WAIT");
    }
    let calls: Vec<Value> = client().get(mock.url("/__mock/tc_calls")).send().await.expect("calls").json().await.expect("json");
    let describes = calls.iter().filter(|c| c["action"] == json!("DescribeTextToVideoGenJob")).count();
    assert_eq!(describes, 1, "eight concurrent stale GETs, one describe");
}
