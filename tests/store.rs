//! Issue 24, point 1: one store interface, two backends. The same contract — keys, accounts,
//! holds, bookings, usage queries, response owners, retention, video tasks and idempotency
//! keys — is run through `Arc<dyn Store>` against the embedded sled store and against a fleet
//! node's store on a real PostgreSQL server, and must give the same answers on both.

mod common;

use common::postgres::Postgres;
use std::sync::Arc;
use std::time::Duration;
use tollgate::auth::{hash_key, hex};
use tollgate::config::{CommitPolicy, FleetConfig};
use tollgate::ledger::{Ledger, UsageRecord};
use tollgate::store::fleet::{Fleet, FleetStore};
use tollgate::store::postgres::PgSettings;
use tollgate::store::sled::{SledDb, SledStore};
use tollgate::store::{KeyLookup, KeyOrigin, KeyRecord, Store};
use tollgate::video::request::{Capability, Submission};
use tollgate::video::task::{Status, Task};

fn key(id: &str, secret: &str, enabled: bool) -> KeyRecord {
    KeyRecord {
        id: id.into(),
        name: format!("name of {id}"),
        group: "default".into(),
        key_hash: hex(&hash_key(secret)),
        rpm: None,
        tpm: None,
        enabled,
        created_at: 1,
        max_concurrent: None,
        origin: KeyOrigin::Admin,
        seed_digest: None,
        revoked_at: None,
        rotated: None,
        policy: Default::default(),
    }
}

fn usage(key_id: &str, model: &str, cost: i64, time_ms: u64) -> UsageRecord {
    UsageRecord {
        time_ms,
        key_id: key_id.into(),
        model: model.into(),
        protocol: "openai".into(),
        route: "chat_completions".into(),
        input_tokens: 10,
        cached_tokens: 0,
        cache_write_tokens: 0,
        output_tokens: 5,
        cost_nanos: cost,
        status: 200,
        latency_ms: 1,
        estimated: false,
        seq: 0,
        balance_after: 0,
        provider: None,
        attempts: 0,
        response_id: None,
        upstream_protocol: None,
    }
}

fn task(id: &str, owner: &str) -> Task {
    let sub = Submission {
        capability: Capability::TextToVideo,
        api_model: "genq3-pro".into(),
        upstream_model: "genq3-pro".into(),
        duration: 5,
        off_peak: false,
        payload: Default::default(),
        uploads: Vec::new(),
    };
    Task::new(id.into(), owner.into(), &sub, 100, 250_000_000)
}

/// The contract, through the interface only (and the ledger the gateway builds on it).
async fn contract(store: Arc<dyn Store>) {
    let backend = store.backend();

    // Keys: written, found by the secret's hash, changed, listed.
    let keys = store.keys();
    keys.put(&[key("key_a", "sk-contract-a", true), key("key_b", "sk-contract-b", true)]).await.expect("put keys");
    match keys.lookup(&hash_key("sk-contract-a")) {
        KeyLookup::Found(rec) => assert_eq!(rec.id, "key_a", "{backend}"),
        other => panic!("{backend}: key_a not found: {other:?}"),
    }
    assert_eq!(keys.lookup(&hash_key("sk-unknown")), KeyLookup::Unknown, "{backend}");
    keys.put(&[key("key_b", "sk-contract-b", false)]).await.expect("disable");
    match keys.lookup(&hash_key("sk-contract-b")) {
        KeyLookup::Found(rec) => assert!(!rec.enabled, "{backend}: the change is in force when put returns"),
        other => panic!("{backend}: key_b not found: {other:?}"),
    }
    // A rotated key is found by its previous secret too (authentication checks the grace).
    let rotated = KeyRecord {
        key_hash: hex(&hash_key("sk-contract-a-new")),
        rotated: Some(tollgate::store::Rotation { previous_hash: hex(&hash_key("sk-contract-a")), until: u64::MAX }),
        ..key("key_a", "sk-contract-a", true)
    };
    keys.put(std::slice::from_ref(&rotated)).await.expect("rotate");
    for secret in ["sk-contract-a", "sk-contract-a-new"] {
        match keys.lookup(&hash_key(secret)) {
            KeyLookup::Found(rec) => assert_eq!(*rec, rotated, "{backend}: {secret}"),
            other => panic!("{backend}: {secret} not found after the rotation: {other:?}"),
        }
    }
    let mut ids: Vec<String> = keys.all().await.expect("all").into_iter().map(|k| k.id).collect();
    ids.sort();
    assert_eq!(ids, ["key_a", "key_b"], "{backend}");

    // Money, through the ledger built on the store (as the gateway builds it).
    let ledger = Arc::new(Ledger::new(store.money(), false));
    assert!(ledger.open_account("key_a", 1_000).await.expect("open"), "{backend}");
    assert!(!ledger.open_account("key_a", 5).await.expect("open again"), "{backend}: an opening balance applies once");
    assert_eq!(ledger.balance("key_a").await.expect("balance"), 1_000, "{backend}");
    let first = ledger.hold("key_a", 600).await.expect("store").expect("600 of 1000 is covered");
    assert!(ledger.hold("key_a", 600).await.expect("store").is_err(), "{backend}: 1200 held of 1000");
    drop(first);
    // A dropped hold is given back (in a fleet, on the store's runtime: wait for it).
    let mut second = None;
    for _ in 0..200 {
        if let Ok(hold) = ledger.hold("key_a", 600).await.expect("store") {
            second = Some(hold);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let second = second.unwrap_or_else(|| panic!("{backend}: a released hold frees its money"));
    ledger.settle(second, usage("key_a", "m1", 250, 1_000)).await.expect("settle");
    let owned = UsageRecord { provider: Some("p1".into()), response_id: Some("resp_1".into()), ..usage("key_a", "m2", 100, 10_000) };
    let hold = ledger.hold("key_a", 100).await.expect("store").expect("covered");
    ledger.settle(hold, owned).await.expect("settle");
    assert!(ledger.charge(usage("key_a", "m1", 10_000, 20_000)).await.expect("store").is_err(), "{backend}: a charge over the balance");
    assert!(ledger.charge(usage("key_a", "m1", 50, 20_000)).await.expect("store").is_ok(), "{backend}");
    ledger.adjust(usage("key_a", "m1", -20, 30_000)).await.expect("refund");
    ledger.top_up("key_a", 1_000).await.expect("top up");
    ledger.commit_now().await.expect("commit");
    assert_eq!(ledger.balance("key_a").await.expect("balance"), 1_000 - 250 - 100 - 50 + 20 + 1_000, "{backend}");

    // Usage, owners, retention.
    let (total, by_model) = ledger.usage_summary("key_a", 0, u64::MAX).await.expect("summary");
    assert_eq!((total.requests, total.cost_nanos), (3, 250 + 100 + 50 - 20), "{backend}: a refund is money, not a request");
    assert_eq!(by_model["m2"].requests, 1, "{backend}");
    let (window, _) = ledger.usage_summary("key_a", 5_000, 25_000).await.expect("window");
    assert_eq!(window.requests, 2, "{backend}");
    let owner = ledger.response_owner("resp_1").await.expect("owner").unwrap_or_else(|| panic!("{backend}: resp_1 has an owner"));
    assert_eq!((owner.key_id.as_str(), owner.provider.as_str()), ("key_a", "p1"), "{backend}");
    assert_eq!(ledger.response_owner("resp_unknown").await.expect("owner"), None, "{backend}");
    ledger.forget_response("resp_1").await.expect("forget");
    assert_eq!(ledger.response_owner("resp_1").await.expect("owner"), None, "{backend}");
    assert_eq!(ledger.prune(15_000).await.expect("prune"), 2, "{backend}: the records before the cut");
    let (total, _) = ledger.usage_summary("key_a", 0, u64::MAX).await.expect("summary");
    assert_eq!(total.requests, 1, "{backend}");
    assert_eq!(ledger.balance("key_a").await.expect("balance"), 1_620, "{backend}: pruning never changes a balance");

    // Video tasks and idempotency keys.
    let tasks = store.tasks();
    let mut t = task("task_contract", "key_a");
    tasks.put(&t).await.expect("put task");
    assert_eq!(tasks.get("task_contract").await.expect("get").as_ref(), Some(&t), "{backend}");
    assert_eq!(tasks.get("task_missing").await.expect("get"), None, "{backend}");
    assert_eq!(tasks.open_ids().await.expect("open"), ["task_contract"], "{backend}");
    t.status = Status::Completed;
    tasks.put(&t).await.expect("put completed");
    assert!(tasks.open_ids().await.expect("open").is_empty(), "{backend}: a finished task is not polled");
    let now = tollgate::auth::now_unix();
    assert_eq!(tasks.claim_idempotency("key_a", "idem-1", "task_contract", now).await.expect("claim"), "task_contract", "{backend}");
    assert_eq!(
        tasks.claim_idempotency("key_a", "idem-1", "task_other", now).await.expect("claim"),
        "task_contract",
        "{backend}: first wins"
    );
    assert_eq!(tasks.claim_idempotency("key_b", "idem-1", "task_b", now).await.expect("claim"), "task_b", "{backend}: per key");
    assert_eq!(tasks.idempotent_task("key_a", "idem-1", now).await.expect("idem"), Some("task_contract".into()), "{backend}");
}

#[test]
fn the_sled_store_keeps_the_contract() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = SledDb::open(dir.path()).expect("open");
    let store: Arc<dyn Store> = Arc::new(SledStore::new(db.db(), CommitPolicy::default()).expect("store"));
    assert_eq!(store.backend(), "sled");
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    runtime.block_on(contract(store));
}

#[test]
fn the_postgres_store_keeps_the_contract() {
    let server = Postgres::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let db = SledDb::open(dir.path()).expect("open");
    let conf = FleetConfig {
        postgres: PgSettings { url: server.url(), pool_size: 4, ca_pem: None },
        node_id: "contract".into(),
        lease: Duration::from_secs(30),
        sync: Duration::from_millis(200),
    };
    let fleet = Fleet::connect(&conf).expect("connect");
    let node = Arc::new(FleetStore::new(fleet.clone(), db.db(), CommitPolicy::default()).expect("store"));
    let store: Arc<dyn Store> = node.clone();
    assert_eq!(store.backend(), "postgres");
    assert!(store.statements().is_some());
    // Run where the store's connections live, as the gateway does.
    fleet.block_on(contract(store));
}
