//! Issue 24, point 1: one store interface, two backends. The same contract — keys, accounts,
//! holds, bookings, usage queries, response owners, retention, video tasks and idempotency
//! keys — is run through `Arc<dyn Store>` against the embedded sled store and against a fleet
//! node's store on a real PostgreSQL server, and must give the same answers on both.

use crate::common::postgres::Postgres;
use std::sync::Arc;
use std::time::Duration;
use tollgate::access::auth::{hash_key, hex};
use tollgate::billing::ledger::Ledger;
use tollgate::config::PgSettings;
use tollgate::config::{CommitPolicy, FleetConfig};
use tollgate::records::key::{KeyLookup, KeyOrigin, KeyRecord};
use tollgate::records::task::Capability;
use tollgate::records::task::{Status, Task};
use tollgate::records::usage::UsageRecord;
use tollgate::store::fleet::{Fleet, FleetStore};
use tollgate::store::sled::{SledDb, SledStore};
use tollgate::store::Store;
use tollgate::video::request::Submission;

fn key(id: &str, secret: &str, enabled: bool) -> KeyRecord {
    KeyRecord { enabled, created_at: 1, ..KeyRecord::new(id, format!("name of {id}"), "default", hex(&hash_key(secret)), KeyOrigin::Admin) }
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
        list_cost_nanos: None,
        status: 200,
        latency_ms: 1,
        estimated: false,
        seq: 0,
        balance_after: 0,
        provider: None,
        attempts: 0,
        response_id: None,
        upstream_protocol: None,
        charged: Vec::new(),
        tags: Default::default(),
        requested_model: None,
        fallbacks: None,
        cache: None,
        cache_saved_nanos: None,
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
    sub.task(id.into(), owner.into(), 100, 250_000_000)
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
        rotated: Some(tollgate::records::key::Rotation { previous_hash: hex(&hash_key("sk-contract-a")), until: u64::MAX }),
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
    // The console's list: every status, the most recently updated first, at most `limit`.
    let mut later = task("task_later", "key_b");
    later.updated_at = t.updated_at + 10;
    tasks.put(&later).await.expect("put later");
    let recent: Vec<String> = tasks.recent(10).await.expect("recent").into_iter().map(|t| t.id).collect();
    assert_eq!(recent, ["task_later", "task_contract"], "{backend}");
    assert_eq!(tasks.recent(1).await.expect("recent").len(), 1, "{backend}");
    let now = tollgate::base::clock::now_unix();
    assert_eq!(tasks.claim_idempotency("key_a", "idem-1", "task_contract", now).await.expect("claim"), "task_contract", "{backend}");
    assert_eq!(
        tasks.claim_idempotency("key_a", "idem-1", "task_other", now).await.expect("claim"),
        "task_contract",
        "{backend}: first wins"
    );
    assert_eq!(tasks.claim_idempotency("key_b", "idem-1", "task_b", now).await.expect("claim"), "task_b", "{backend}: per key");
    assert_eq!(tasks.idempotent_task("key_a", "idem-1", now).await.expect("idem"), Some("task_contract".into()), "{backend}");
    // A key's own tasks (`GET /v1/videos`): newest first, paged after a task, oldest first.
    for (id, at) in [("task_k1", 200), ("task_k2", 300), ("task_k3", 250)] {
        let mut mine = task(id, "key_list");
        mine.created_at = at;
        mine.status = Status::Completed;
        tasks.put(&mine).await.expect("put");
    }
    let ids = |v: Vec<Task>| v.into_iter().map(|t| t.id).collect::<Vec<_>>();
    assert_eq!(ids(tasks.of_owner("key_list", None, 10, true).await.expect("list")), ["task_k2", "task_k3", "task_k1"], "{backend}");
    assert_eq!(ids(tasks.of_owner("key_list", Some("task_k2"), 1, true).await.expect("list")), ["task_k3"], "{backend}");
    assert_eq!(ids(tasks.of_owner("key_list", Some("task_k3"), 10, false).await.expect("list")), ["task_k2"], "{backend}");
    assert!(tasks.of_owner("key_list", Some("task_contract"), 10, true).await.expect("list").is_empty(), "{backend}: not its task");
    assert_eq!(ids(tasks.of_owner("key_a", None, 10, true).await.expect("list")), ["task_contract"], "{backend}");
    // Deleted: gone from the list and for its owner.
    let gone = tasks.get("task_k3").await.expect("get").expect("task");
    tasks.delete(&gone).await.expect("delete");
    assert_eq!(tasks.get("task_k3").await.expect("get"), None, "{backend}");
    assert_eq!(ids(tasks.of_owner("key_list", None, 10, true).await.expect("list")), ["task_k2", "task_k1"], "{backend}");
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

/// Issue 29: spend windows and shared accounts through the store interface. `stores` are the
/// nodes (one for sled; two on one database for PostgreSQL); requests alternate between them.
async fn spend_contract(stores: Vec<Arc<dyn Store>>) {
    use tollgate::policy::budget::{account_purse, Budgets, Calendar, Window};
    use tollgate::records::key::AccountRecord;
    use tollgate::records::purse::purses;
    use tollgate::records::purse::{Purse, PurseKind};
    let backend = stores[0].backend();
    let ledgers: Vec<Arc<Ledger>> = stores.iter().map(|s| Arc::new(Ledger::new(s.money(), false))).collect();
    let keys = stores[0].keys();
    let now = tollgate::base::clock::now_unix();
    let calendar = Calendar::default();

    // An account, stored and found by name on every node.
    let account = AccountRecord {
        name: "team".into(),
        budgets: Budgets {
            day: Some(700),
            rolling: vec![tollgate::policy::budget::Rolling { secs: 18_000, cap: 900 }],
            ..Budgets::default()
        },
        created_at: 1,
        origin: KeyOrigin::Admin,
        seed_digest: None,
        member_limit: None,
        member_policy: None,
        people: Default::default(),
        // A team's guardrails are kept with it (issue 65), and its rate limits and a rolling
        // window (issue 66).
        guardrails: vec!["secrets".into()],
        rates: tollgate::policy::limits::RateLimits { rpm: Some(60), tpm: Some(5_000), max_concurrent: Some(4) },
        price_multiplier: tollgate::base::money::Multiplier::new(1.25),
        plan: Some(tollgate::policy::plan::PlanRef { name: "team-plan".into(), since: 1_700_000_000 }),
        claude_code: None,
        cache: None,
    };
    keys.put_account(&account).await.expect("put account");
    for s in &stores {
        s.keys().put(&[]).await.expect("refresh");
        assert_eq!(s.keys().account("team").as_deref(), Some(&account), "{backend}");
    }
    assert_eq!(keys.accounts().await.expect("accounts"), vec![account.clone()], "{backend}");

    // A key with a day budget of 1000 (and plenty of balance): of 40 parallel holds of 100,
    // exactly 10 fit the window, whatever node they come through.
    let mut solo = key("key_budget", "sk-budget-solo", true);
    solo.policy.budgets = Budgets { day: Some(1_000), ..Budgets::default() };
    ledgers[0].open_account(&solo.id, 1_000_000).await.expect("open");
    let solo_purses = purses(&solo, None, (&[], &[]), &calendar, now);
    let (start, end) = calendar.window(Window::Day, now);
    let window_id = tollgate::policy::budget::window_purse(&tollgate::policy::budget::Owner::Key(&solo.id), Window::Day, start);
    assert_eq!(solo_purses[0].id, window_id);
    let attempts = (0..40).map(|i| {
        let ledger = ledgers[i % ledgers.len()].clone();
        let purses = solo_purses.clone();
        tokio::spawn(async move { ledger.hold_from(purses, 100).await.expect("store") })
    });
    let results: Vec<_> = futures_util::future::join_all(attempts).await.into_iter().map(|r| r.expect("task")).collect();
    let mut holds = Vec::new();
    for r in results {
        match r {
            Ok(hold) => holds.push(hold),
            Err(refused) => {
                assert_eq!(refused.kind, PurseKind::Window { whose: None, window: Window::Day, end }, "{backend}");
            }
        }
    }
    assert_eq!(holds.len(), 10, "{backend}: exactly what the window's cap covers");
    // Each settles at 90: 900 spent, 100 left.
    for (i, hold) in holds.into_iter().enumerate() {
        ledgers[i % ledgers.len()].settle(hold, usage(&solo.id, "m1", 90, now * 1000)).await.expect("settle");
    }
    for l in &ledgers {
        l.commit_now().await.expect("commit");
    }
    assert_eq!(ledgers[0].balance(&window_id).await.expect("window"), -900, "{backend}: the window's spend");
    assert_eq!(ledgers[0].balance(&solo.id).await.expect("balance"), 1_000_000 - 900, "{backend}: and the key's balance");
    let err = ledgers[0].hold_from(solo_purses.clone(), 101).await.expect("store").expect_err("over the cap");
    // In a fleet what another node still leases of the window is not available here until
    // its sync round gives it back.
    assert!(err.short.available <= 100, "{backend}: {err:?}");
    for s in &stores {
        s.money().sync_round().await.expect("sync");
    }
    let last = ledgers[0].hold_from(solo_purses.clone(), 100).await.expect("store");
    assert!(
        last.is_ok(),
        "{backend}: exactly the cap's remainder is left: {last:?}; held here {:?}",
        ledgers.iter().map(|l| (l.held(&window_id), l.held(&solo.id))).collect::<Vec<_>>()
    );
    drop(last);
    let e = err.to_api_error("this request may cost up to", now);
    assert_eq!((e.status(), e.retry_after), (429, Some(end - now)), "{backend}: {e:?}");
    // A cap raised mid-window applies at once to what the window spent.
    solo.policy.budgets.day = Some(2_000);
    let raised = purses(&solo, None, (&[], &[]), &calendar, now);
    assert!(ledgers[0].hold_from(raised, 1_000).await.expect("store").is_ok(), "{backend}");
    // The next window starts empty: no reset job, a new name.
    let tomorrow = purses(&solo, None, (&[], &[]), &calendar, end);
    assert_ne!(tomorrow[0].id, window_id);
    assert!(ledgers[0].hold_from(tomorrow, 1_000).await.expect("store").is_ok(), "{backend}");

    // Two keys of the account (500 of balance, a day cap of 700): the account's balance is
    // the first cap reached; 30 parallel holds of 100 admit exactly 5.
    ledgers[0].open_account(&account_purse("team"), 500).await.expect("open account");
    let members: Vec<KeyRecord> = (0..2)
        .map(|i| {
            let mut k = key(&format!("key_member{i}"), &format!("sk-member-{i}"), true);
            k.policy.account = Some("team".into());
            k
        })
        .collect();
    for m in &members {
        ledgers[0].open_account(&m.id, 1_000_000).await.expect("open");
    }
    let attempts = (0..30).map(|i| {
        let ledger = ledgers[i % ledgers.len()].clone();
        let purses = purses(&members[i % 2], Some(&account), (&[], &[]), &calendar, now);
        tokio::spawn(async move { ledger.hold_from(purses, 100).await.expect("store") })
    });
    let results: Vec<_> = futures_util::future::join_all(attempts).await.into_iter().map(|r| r.expect("task")).collect();
    let mut held = Vec::new();
    for (i, r) in results.into_iter().enumerate() {
        match r {
            Ok(hold) => held.push((i, hold)),
            // One node checks its purses under one lock: the account's balance answers. In a
            // fleet, purses are held one after another, and what a hold given back leaves in
            // its node's lease of the window is not available to the other node until the
            // sync round: the window may answer first there, never letting more through.
            Err(refused) if stores.len() == 1 => assert_eq!(refused.kind, PurseKind::Account("team".into()), "{backend}"),
            Err(refused) => assert!(
                matches!(&refused.kind, PurseKind::Account(a) if &**a == "team")
                    || matches!(&refused.kind, PurseKind::Window { whose: Some(w), .. } if &**w == "the account 'team'"),
                "{backend}: {refused:?}"
            ),
        }
    }
    assert!(held.len() <= 5, "{backend}: never more than the account's balance covers");
    if stores.len() == 1 {
        assert_eq!(held.len(), 5, "{backend}: the account's balance covers five");
    }
    let mut admitted = held.len();
    for (i, hold) in held {
        ledgers[i % ledgers.len()].settle(hold, usage(&members[i % 2].id, "m1", 100, now * 1000)).await.expect("settle");
    }
    // Once the leases are given back, the rest is available, exactly: five in all.
    for s in &stores {
        s.money().commit().await.expect("commit");
        s.money().sync_round().await.expect("sync");
    }
    while let Ok(hold) = ledgers[0].hold_from(purses(&members[0], Some(&account), (&[], &[]), &calendar, now), 100).await.expect("store") {
        ledgers[0].settle(hold, usage(&members[0].id, "m1", 100, now * 1000)).await.expect("settle");
        admitted += 1;
        assert!(admitted <= 5, "{backend}: more than the account's balance");
    }
    assert_eq!(admitted, 5, "{backend}");
    for l in &ledgers {
        l.commit_now().await.expect("commit");
    }
    assert_eq!(ledgers[0].balance(&account_purse("team")).await.expect("account"), 0, "{backend}");
    let team_day = tollgate::policy::budget::window_purse(&tollgate::policy::budget::Owner::Account("team"), Window::Day, start);
    assert_eq!(ledgers[0].balance(&team_day).await.expect("window"), -500, "{backend}");
    // Topped up past the window: now the account's day window (700) is the first cap reached.
    let entry = ledgers[0].top_up_because(&account_purse("team"), 10_000, Some("invoice 7")).await.expect("top up");
    assert_eq!((entry.kind.as_str(), entry.id.as_str(), entry.balance_before, entry.balance_after), ("account", "team", 0, 10_000));
    ledgers[0].top_up_because(&solo.id, -5, None).await.expect("adjust");
    // The audit trail, newest first, from any node.
    let trail = ledgers[ledgers.len() - 1].audit(10, None).await.expect("audit");
    let seen: Vec<(&str, i64, Option<&str>)> = trail.iter().map(|e| (e.id.as_str(), e.delta, e.reason.as_deref())).collect();
    assert_eq!(seen, [("key_budget", -5, None), ("team", 10_000, Some("invoice 7"))], "{backend}");
    assert_eq!(trail[0].balance_after, trail[0].balance_before - 5, "{backend}");
    let after_first = ledgers[0].audit(10, Some(trail[0].cursor())).await.expect("audit");
    assert_eq!(after_first, trail[1..], "{backend}: paged by position, even within one millisecond");
    assert!(ledgers[0].audit(10, Some(trail[1].cursor())).await.expect("audit").is_empty(), "{backend}");
    let p = purses(&members[0], Some(&account), (&[], &[]), &calendar, now);
    let refused = ledgers[0].hold_from(p.clone(), 300).await.expect("store").expect_err("the account's day window");
    assert_eq!(refused.kind, PurseKind::Window { whose: Some("the account 'team'".into()), window: Window::Day, end }, "{backend}");

    // A video-style charge checks every purse at once and is refunded to the same purses.
    let charged = ledgers[0].charge_from(usage(&members[0].id, "genq", 150, now * 1000), &p).await.expect("store");
    assert!(charged.is_ok(), "{backend}: {charged:?}");
    assert_eq!(ledgers[0].balance(&team_day).await.expect("window"), -650, "{backend}");
    let over = ledgers[0].charge_from(usage(&members[0].id, "genq", 100, now * 1000), &p).await.expect("store");
    assert!(matches!(over, Err(ref r) if matches!(r.kind, PurseKind::Window { .. })), "{backend}: {over:?}");
    let mut refund = usage(&members[0].id, "genq", -150, now * 1000);
    refund.charged = tollgate::records::purse::charged(&p);
    ledgers[0].adjust(refund).await.expect("refund");
    assert_eq!(ledgers[0].balance(&team_day).await.expect("window"), -500, "{backend}: the refund credits the window");
    assert_eq!(ledgers[0].balance(&account_purse("team")).await.expect("account"), 10_000, "{backend}");
    assert!(p.iter().any(|x| *x == Purse::key(&members[0].id)), "{backend}: the key's own balance is one of them");

    // Marks (issue 67): a top-up made once for several marks — all new, or nothing written —,
    // a mark written alone, marks counted by a prefix that is no pattern.
    let (first, last) = (&ledgers[0], &ledgers[ledgers.len() - 1]);
    let before = first.balance(&solo.id).await.expect("balance");
    let once = |l: &'static str, slot: &'static str| [(l, 1_i64), (slot, 1_i64)];
    assert!(first.top_up_once(&solo.id, 7, "code 1", &once("code:b1:h1", "codeuse:b1:solo:0")).await.expect("store").is_some());
    let taken = last.top_up_once(&solo.id, 7, "code 2", &once("code:b1:h2", "codeuse:b1:solo:0")).await.expect("store");
    assert!(taken.is_none(), "{backend}: one of its marks was taken: nothing done");
    assert_eq!(last.mark("code:b1:h2").await.expect("store"), None, "{backend}: none of its marks written");
    assert!(last.top_up_once(&solo.id, 7, "code 2", &once("code:b1:h2", "codeuse:b1:solo:1")).await.expect("store").is_some());
    assert_eq!(first.balance(&solo.id).await.expect("balance") - before, 14, "{backend}");
    assert!(last.put_mark("codeoff:b1", 9).await.expect("store"), "{backend}");
    assert!(!first.put_mark("codeoff:b1", 10).await.expect("store"), "{backend}: written before");
    assert_eq!(first.mark("codeoff:b1").await.expect("store"), Some(9), "{backend}: the first value kept");
    assert_eq!(first.count_marks("code:b1:").await.expect("store"), 2, "{backend}");
    assert_eq!(last.count_marks("codeuse:b1:solo:").await.expect("store"), 2, "{backend}");
    assert_eq!(first.count_marks("code_b1").await.expect("store"), 0, "{backend}: `_` is a character, not a pattern");
}

#[test]
fn the_sled_store_keeps_spend_windows_and_accounts_across_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    {
        let db = SledDb::open(dir.path()).expect("open");
        let store: Arc<dyn Store> = Arc::new(SledStore::new(db.db(), CommitPolicy::default()).expect("store"));
        runtime.block_on(spend_contract(vec![store]));
    }
    // A restart in the middle of the window keeps its spend (and the account's).
    let db = SledDb::open_waiting(dir.path(), Duration::from_secs(20)).expect("reopen");
    let store: Arc<dyn Store> = Arc::new(SledStore::new(db.db(), CommitPolicy::default()).expect("store"));
    runtime.block_on(restarted(store));
}

/// After a restart: the day windows and the account as `spend_contract` left them.
async fn restarted(store: Arc<dyn Store>) {
    use tollgate::policy::budget::{account_purse, window_purse, Calendar, Owner, Window};
    let backend = store.backend();
    let ledger = Ledger::new(store.money(), false);
    let (start, _) = Calendar::default().window(Window::Day, tollgate::base::clock::now_unix());
    assert_eq!(
        ledger.balance(&window_purse(&Owner::Key("key_budget"), Window::Day, start)).await.expect("window"),
        -900,
        "{backend}: the window's spend survives"
    );
    assert_eq!(ledger.balance(&window_purse(&Owner::Account("team"), Window::Day, start)).await.expect("window"), -500, "{backend}");
    assert_eq!(ledger.balance(&account_purse("team")).await.expect("account"), 10_000, "{backend}");
    assert!(store.keys().account("team").is_some(), "{backend}: the account record survives");
    assert_eq!(ledger.audit(10, None).await.expect("audit").len(), 4, "{backend}: and the audit trail");
    assert_eq!(ledger.mark("codeoff:b1").await.expect("store"), Some(9), "{backend}: and the marks");
    assert_eq!(ledger.count_marks("code:b1:").await.expect("store"), 2, "{backend}");
    // Retention forgets windows that ended before its cut (nothing checks them again), and
    // only those.
    ledger.prune((start + 20 * 86_400) * 1000).await.expect("prune");
    let day = window_purse(&Owner::Key("key_budget"), Window::Day, start);
    assert_eq!(ledger.balance(&day).await.expect("window"), -900, "{backend}: not yet");
    ledger.prune((start + 40 * 86_400) * 1000).await.expect("prune");
    assert_eq!(ledger.balance(&day).await.expect("window"), 0, "{backend}: forgotten once it ended before the cut");
    assert_eq!(ledger.balance(&account_purse("team")).await.expect("account"), 10_000, "{backend}: balances are never pruned");
}

#[test]
fn the_postgres_store_keeps_spend_windows_and_accounts_over_two_nodes() {
    let server = Postgres::start();
    let node = |name: &str, dir: &std::path::Path| fleet_node(&server, name, dir);
    let (dir_a, dir_b, dir_c) = (tempfile::tempdir().expect("dir"), tempfile::tempdir().expect("dir"), tempfile::tempdir().expect("dir"));
    let (fleet_a, a, _db_a) = node("a", dir_a.path());
    let (_fleet_b, b, _db_b) = node("b", dir_b.path());
    fleet_a.block_on(spend_contract(vec![a, b]));
    // A node that starts later sees the same spend.
    let (fleet_c, c, _db_c) = node("c", dir_c.path());
    fleet_c.block_on(restarted(c));
}

/// Issue 30: the request log through the store interface. `stores` are the nodes (one for
/// sled; two on one database for PostgreSQL): entries appended on either are read, filtered and
/// paged together, and pruned by age and by count.
async fn request_log_contract(stores: Vec<Arc<dyn Store>>) {
    use tollgate::records::log::{Filter, LogEntry};
    let backend = stores[0].backend();
    for i in 0..30u64 {
        let entry = LogEntry {
            id: format!("req_{i:02}"),
            // 0.4 s apart: one node keeps the entries of about a second in one batch.
            time_ms: 1_000 + i * 400,
            key_id: Some(if i % 3 == 0 { "key_x".into() } else { "key_y".into() }),
            model: Some("m".into()),
            status: if i % 5 == 0 { 429 } else { 200 },
            route: "chat_completions".into(),
            protocol: "openai".into(),
            ..LogEntry::default()
        };
        stores[i as usize % stores.len()].requests().append(entry.line());
    }
    let log = stores[0].requests();
    let all = Filter { end_ms: u64::MAX, limit: 100, ..Filter::default() };
    let (entries, next) = log.query(&all).await.expect("query");
    // Every node's entries (the other node's are shipped by its sync round).
    let entries = if entries.len() < 30 {
        for s in &stores {
            s.money().sync_round().await.expect("sync");
        }
        log.query(&all).await.expect("query").0
    } else {
        entries
    };
    let ids: Vec<&str> = entries.iter().map(|e| e.id.as_str()).collect();
    let expected: Vec<String> = (0..30).rev().map(|i| format!("req_{i:02}")).collect();
    assert_eq!(ids, expected, "{backend}: newest first");
    assert_eq!(next, None, "{backend}");
    let (fours, _) = log.query(&Filter { status_class: Some(4), ..all.clone() }).await.expect("query");
    assert_eq!(fours.len(), 6, "{backend}");
    let (x, _) = log
        .query(&Filter { key_id: Some("key_x".into()), start_ms: 1_000 + 12 * 400, end_ms: 1_000 + 19 * 400, ..all.clone() })
        .await
        .expect("query");
    assert_eq!(x.iter().map(|e| e.id.as_str()).collect::<Vec<_>>(), ["req_18", "req_15", "req_12"], "{backend}");
    // Pages of 7 cover the log once.
    let mut paged = Vec::new();
    let mut before = None;
    loop {
        let (page, next) = log.query(&Filter { limit: 7, before, ..all.clone() }).await.expect("page");
        paged.extend(page.into_iter().map(|e| e.id));
        match next {
            Some(c) => before = Some(c),
            None => break,
        }
    }
    assert_eq!(paged, expected, "{backend}");
    let (one, _) = log.query(&Filter { id: Some("req_07".into()), ..all.clone() }).await.expect("by id");
    assert_eq!(one.len(), 1, "{backend}");
    // Retention: by age, then by count. One node deletes whole batches (an entry goes once
    // every entry of its batch is past the cut; the count keeps whole batches, the newest).
    let cut = 1_000 + 10 * 400;
    log.prune_log(cut, 1_000_000).await.expect("prune");
    let left: Vec<u64> = log.query(&all).await.expect("query").0.into_iter().map(|e| e.time_ms).collect();
    assert!(left.iter().all(|t| *t + 1_000 >= cut), "{backend}: every batch wholly older than the cut is gone: {left:?}");
    assert_eq!(left.iter().filter(|t| **t >= cut).count(), 20, "{backend}: nothing newer went");
    log.prune_log(0, 5).await.expect("prune");
    let left: Vec<String> = log.query(&all).await.expect("query").0.into_iter().map(|e| e.id).collect();
    assert!((5..=8).contains(&left.len()) && left[..] == expected[..left.len()], "{backend}: the newest kept: {left:?}");
}

#[test]
fn the_request_log_keeps_its_contract_on_both_backends() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = SledDb::open(dir.path()).expect("open");
    let store: Arc<dyn Store> = Arc::new(SledStore::new(db.db(), CommitPolicy::default()).expect("store"));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    runtime.block_on(request_log_contract(vec![store]));

    let server = Postgres::start();
    let node = |name: &str, dir: &std::path::Path| fleet_node(&server, name, dir);
    let (dir_a, dir_b) = (tempfile::tempdir().expect("dir"), tempfile::tempdir().expect("dir"));
    let (fleet_a, a, _db_a) = node("a", dir_a.path());
    let (_fleet_b, b, _db_b) = node("b", dir_b.path());
    fleet_a.block_on(request_log_contract(vec![a, b]));
}

/// A fleet node on `server` named `name`, its journal in `dir`: its fleet (whose runtime runs
/// its work), its store and its sled database.
fn fleet_node(server: &Postgres, name: &str, dir: &std::path::Path) -> (Arc<Fleet>, Arc<dyn Store>, SledDb) {
    let conf = FleetConfig {
        postgres: PgSettings { url: server.url(), pool_size: 4, ca_pem: None },
        node_id: name.into(),
        lease: Duration::from_secs(30),
        sync: Duration::from_millis(200),
    };
    let fleet = Fleet::connect(&conf).expect("connect");
    let db = SledDb::open(dir).expect("open");
    let store: Arc<dyn Store> = Arc::new(FleetStore::new(fleet.clone(), db.db(), CommitPolicy::default()).expect("store"));
    (fleet, store, db)
}

fn job(id: &str, owner: &str, at: u64, open: bool, state: &str) -> tollgate::store::JobRow {
    tollgate::store::JobRow {
        kind: "batch",
        id: id.into(),
        owner: owner.into(),
        created_at: at,
        open,
        record: format!("{{\"id\":\"{id}\",\"state\":\"{state}\"}}"),
    }
}

/// Jobs (batches): kept, listed per key newest first, the open ones the poller's; with several
/// stores (fleet nodes), an open job is worked on by the node that holds it, and taken over by
/// another once that node's claim lapsed — after which the first node's writes are refused.
async fn jobs_contract(stores: Vec<Arc<dyn Store>>) {
    let a = stores[0].jobs();
    for (id, owner, at) in [("batch_1", "k1", 10), ("batch_2", "k1", 20), ("batch_3", "k2", 15)] {
        a.put(&job(id, owner, at, true, "running")).await.expect("put");
    }
    a.put(&job("batch_2", "k1", 20, false, "done")).await.expect("closed");
    let mut open = a.open("batch").await.expect("open");
    open.sort();
    assert_eq!(open, ["{\"id\":\"batch_1\",\"state\":\"running\"}", "{\"id\":\"batch_3\",\"state\":\"running\"}"]);
    assert!(a.open("other").await.expect("open").is_empty());
    let listed = a.of_owner("batch", "k1", None, 10).await.expect("list");
    assert_eq!(listed, ["{\"id\":\"batch_2\",\"state\":\"done\"}", "{\"id\":\"batch_1\",\"state\":\"running\"}"]);
    assert_eq!(a.of_owner("batch", "k1", Some("batch_2"), 10).await.expect("page").len(), 1);
    assert!(a.of_owner("batch", "k1", Some("batch_3"), 10).await.expect("another key's cursor").is_empty());
    assert_eq!(a.get("batch_2").await.expect("get").as_deref(), Some("{\"id\":\"batch_2\",\"state\":\"done\"}"));
    // Old closed jobs are forgotten, open ones whatever their age are kept; another kind's too.
    a.put(&job("batch_0", "k1", 5, false, "done")).await.expect("old, closed");
    assert_eq!(a.prune_closed("other", 1_000, 10).await.expect("prune"), 0);
    assert_eq!(a.prune_closed("batch", 20, 10).await.expect("prune"), 1, "batch_0 (batch_2 is not older than 20)");
    assert_eq!(a.get("batch_0").await.expect("get"), None);
    assert_eq!(a.of_owner("batch", "k1", None, 10).await.expect("list").len(), 2);
    assert_eq!(a.prune_closed("batch", 21, 10).await.expect("prune"), 1, "batch_2; batch_1 and batch_3 are open");
    assert_eq!(a.of_owner("batch", "k1", None, 10).await.expect("list"), ["{\"id\":\"batch_1\",\"state\":\"running\"}"]);
    let Some(b) = stores.get(1).map(|s| s.jobs()) else { return };
    // Node b sees every job, works on none that a holds, and cannot write them.
    assert!(b.get("batch_1").await.expect("get").is_some());
    assert!(b.open("batch").await.expect("open").is_empty(), "a holds them");
    assert!(b.put(&job("batch_1", "k1", 10, true, "stolen")).await.is_err(), "fenced by a's claim");
    // a stops renewing (its claims lapse): b takes its open jobs, and a's writes are refused.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let taken = loop {
        let taken = b.open("batch").await.expect("open");
        if !taken.is_empty() || std::time::Instant::now() > deadline {
            break taken;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(taken.len(), 2, "b took both open jobs once a's claims lapsed");
    b.put(&job("batch_1", "k1", 10, false, "finished by b")).await.expect("b holds it now");
    assert!(a.put(&job("batch_1", "k1", 10, true, "late write of a")).await.is_err(), "a lost its claim");
    assert_eq!(a.get("batch_1").await.expect("get").as_deref(), Some("{\"id\":\"batch_1\",\"state\":\"finished by b\"}"));
}

#[test]
fn jobs_keep_their_contract_on_both_backends_and_move_to_another_node_when_their_claim_lapses() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = SledDb::open(dir.path()).expect("open");
    let store: Arc<dyn Store> = Arc::new(SledStore::new(db.db(), CommitPolicy::default()).expect("store"));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    runtime.block_on(jobs_contract(vec![store]));

    let server = Postgres::start();
    let node = |name: &str, dir: &std::path::Path| {
        let conf = FleetConfig {
            postgres: PgSettings { url: server.url(), pool_size: 4, ca_pem: None },
            node_id: name.into(),
            lease: Duration::from_secs(2),
            sync: Duration::from_millis(200),
        };
        let fleet = Fleet::connect(&conf).expect("connect");
        let db = SledDb::open(dir).expect("open");
        let store: Arc<dyn Store> = Arc::new(FleetStore::new(fleet.clone(), db.db(), CommitPolicy::default()).expect("store"));
        (fleet, store, db)
    };
    let (dir_a, dir_b) = (tempfile::tempdir().expect("dir"), tempfile::tempdir().expect("dir"));
    let (fleet_a, a, _db_a) = node("a", dir_a.path());
    let (_fleet_b, b, _db_b) = node("b", dir_b.path());
    fleet_a.block_on(jobs_contract(vec![a, b]));
}
