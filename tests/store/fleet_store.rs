//! Issue 24, the store's parts: the fleet's money, keys, records, tasks and limits on a real
//! PostgreSQL server (started by the test in a temporary directory), several nodes as several
//! `FleetAccounts` / `FleetKeys` / … on one database. `tests/store/fleet.rs` runs whole nodes.

use crate::common::postgres::Postgres;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tollgate::config::PgSettings;
use tollgate::records::key::{KeyOrigin, KeyRecord};
use tollgate::records::usage::UsageRecord;
use tollgate::store::postgres::accounts::FleetAccounts;
use tollgate::store::postgres::keys::{FleetKeys, KeyLookup};
use tollgate::store::postgres::rates::{Admission, FleetRates, FleetSlots};
use tollgate::store::postgres::tasks::{Created, FleetTasks};
use tollgate::store::postgres::usage::FleetRecords;
use tollgate::store::postgres::usage::Journaled;
use tollgate::store::postgres::{Pg, PgError};

const CENT: i64 = 10_000_000;

/// A journal's records of `cost` each on `key`, numbered from `first`.
fn journal(first: i64, key: &str, costs: &[i64]) -> Vec<Journaled<'static>> {
    costs.iter().enumerate().map(|(i, cost)| Journaled::of(first + i as i64, &usage(key, "m", *cost, 1_000 + i as u64), true)).collect()
}

async fn pg(server: &Postgres) -> Pg {
    let pg = Pg::new(&PgSettings { url: server.url(), pool_size: 8, ca_pem: None }).expect("pool");
    pg.migrate().await.expect("migrate");
    pg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_one_cent_requests_over_three_nodes_on_ten_cents_serve_exactly_ten() {
    let server = Postgres::start();
    let nodes: Vec<Arc<FleetAccounts>> = {
        let mut v = Vec::new();
        for name in ["a", "b", "c"] {
            v.push(Arc::new(FleetAccounts::new(pg(&server).await, name, Duration::from_secs(30))));
        }
        v
    };
    assert!(nodes[0].open_account("k", 10 * CENT).await.expect("open"));
    assert!(!nodes[1].open_account("k", 99 * CENT).await.expect("open"), "a balance applies once");
    let requests = (0..30).map(|i| {
        let node = nodes[i % 3].clone();
        tokio::spawn(async move {
            match node.hold("k", CENT).await.expect("database") {
                Ok(hold) => {
                    node.settle(hold, CENT).await;
                    Some(i % 3)
                }
                Err(_) => None,
            }
        })
    });
    let served: Vec<usize> = futures_util::future::join_all(requests).await.into_iter().filter_map(|r| r.expect("task")).collect();
    assert_eq!(served.len(), 10);
    for (n, node) in nodes.iter().enumerate() {
        let mine = served.iter().filter(|s| **s == n).count();
        node.book(&format!("{n}/j"), &journal(0, "k", &vec![CENT; mine])).await.expect("book");
        node.release_unused("k").await.expect("release");
    }
    assert_eq!(nodes[2].balance("k").await.expect("balance"), (0, 0), "spent exactly, nothing left leased");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn holds_are_served_from_the_lease_without_the_database_and_settle_in_batches() {
    let server = Postgres::start();
    let db = pg(&server).await;
    let node = FleetAccounts::new(db.clone(), "a", Duration::from_secs(30));
    node.open_account("k", 100 * 100 * CENT).await.expect("open"); // $100
    let before = db.statements();
    for _ in 0..200 {
        let hold = node.hold("k", CENT).await.expect("database").expect("covered");
        node.settle(hold, CENT / 2).await;
    }
    let statements = db.statements() - before;
    // The first hold leases $1 (an eighth of $100, at most $1), good for 100 holds of a cent;
    // the second lease covers the rest.
    assert!(statements <= 8, "{statements} statements for 200 holds");
    let records = journal(0, "k", &[CENT / 2; 200]);
    let before = db.statements();
    assert_eq!(node.book("a/j", &records).await.expect("book"), 200);
    assert!(db.statements() - before <= 8, "200 records booked in one transaction of a few statements");
    let (balance, leased) = node.balance("k").await.expect("balance");
    assert_eq!(balance, 100 * 100 * CENT - 200 * CENT / 2);
    assert!(leased > 0 && leased <= 2 * 1_000_000_000, "{leased}");
    assert_eq!(node.book("a/j", &records).await.expect("the reply was lost: booked again"), 0);
    assert_eq!(node.balance("k").await.expect("balance").0, balance, "nothing applied twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_nodes_lease_comes_back_after_lease_secs_by_the_databases_clock() {
    let server = Postgres::start();
    let lease = Duration::from_secs(2);
    let a = FleetAccounts::new(pg(&server).await, "a", lease);
    let b = FleetAccounts::new(pg(&server).await, "b", lease);
    a.open_account("k", 80 * CENT).await.expect("open");
    // A leases a tenth of the money (an eighth of what is free, here), holds and dies.
    let held = a.hold("k", CENT).await.expect("database").expect("covered");
    let (_, leased) = b.balance("k").await.expect("balance");
    assert_eq!(leased, 10 * CENT);
    drop(held);
    drop(a);
    // B cannot take all of it while A's lease lives…
    assert!(b.hold("k", 80 * CENT).await.expect("database").is_err());
    let died = Instant::now();
    // …and can once it expired (B's renewals reclaim expired leases).
    loop {
        b.renew().await.expect("renew");
        if b.balance("k").await.expect("balance").1 == 0 {
            break;
        }
        assert!(died.elapsed() < Duration::from_secs(20), "the dead node's lease never came back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(died.elapsed() >= lease / 2, "reclaimed before it could have expired");
    let _all = b.hold("k", 80 * CENT).await.expect("database").expect("all the money is B's to hold now");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_stops_spending_a_lease_it_could_not_renew_at_half_its_lifetime() {
    let server = Postgres::start();
    let db = pg(&server).await;
    let lease = Duration::from_secs(2);
    let a = FleetAccounts::new(db.clone(), "a", lease);
    a.open_account("k", 100 * 100 * CENT).await.expect("open");
    let h = a.hold("k", CENT).await.expect("database").expect("covered");
    a.settle(h, CENT).await;
    let local = db.statements();
    let h = a.hold("k", CENT).await.expect("database").expect("from the lease");
    a.settle(h, CENT).await;
    assert_eq!(db.statements(), local, "a fresh lease is spent without the database");
    // No renewal for half the lease: the lease is stale, the next hold goes to the database.
    tokio::time::sleep(lease / 2 + Duration::from_millis(50)).await;
    let h = a.hold("k", CENT).await.expect("database").expect("leased again");
    a.settle(h, CENT).await;
    assert!(db.statements() > local, "a stale lease was spent");
    // A renewal makes it fresh again.
    a.renew().await.expect("renew");
    let renewed = db.statements();
    let h = a.hold("k", CENT).await.expect("database").expect("from the lease");
    a.settle(h, CENT).await;
    assert_eq!(db.statements(), renewed);
}

#[tokio::test]
async fn the_schema_is_migrated_once_and_a_newer_one_is_refused() {
    let server = Postgres::start();
    let db = pg(&server).await;
    assert_eq!(db.migrate().await.expect("again"), 14, "migrating twice changes nothing");
    assert_eq!(db.version().await.expect("version"), 14);
    let client = db.client().await.expect("client");
    client.execute("INSERT INTO tollgate_schema (version) VALUES (99)", &[]).await.expect("insert");
    match db.migrate().await {
        Err(PgError::Schema(m)) => assert!(m.contains("version 99"), "{m}"),
        other => panic!("a newer schema was accepted: {:?}", other.map_err(|e| e.to_string())),
    }
    let unreachable = Pg::new(&PgSettings { url: "postgres://postgres@127.0.0.1:1/x".into(), pool_size: 1, ca_pem: None }).expect("pool");
    assert!(matches!(unreachable.migrate().await, Err(PgError::Unavailable(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sync_round_renews_and_gives_back_quiet_and_exact_leases_and_costs_over_the_hold_are_debited() {
    let server = Postgres::start();
    let lease = Duration::from_secs(2);
    let a = FleetAccounts::new(pg(&server).await, "a", lease);
    a.open_account("k", 40 * CENT).await.expect("open");
    let h = a.hold("k", CENT).await.expect("database").expect("covered");
    a.settle(h, 3 * CENT).await; // the upstream counted more than the hold
    a.book("a/j", &journal(0, "k", &[3 * CENT])).await.expect("book");
    // A key with room for fewer than 64 holds leases exactly the hold; a round gives back
    // what is left of it at once.
    a.round().await.expect("round");
    assert_eq!(a.balance("k").await.expect("balance"), (37 * CENT, 0));
    // A roomy key leases a chunk, kept while it is used, given back once quiet.
    a.top_up("k", 10_000 * CENT, None).await.expect("top up");
    let h = a.hold("k", CENT).await.expect("database").expect("covered");
    a.settle(h, CENT).await;
    a.book("a/j", &journal(1, "k", &[CENT])).await.expect("book");
    a.round().await.expect("round");
    assert!(a.balance("k").await.expect("balance").1 > 0, "a lease in use is kept");
    let started = Instant::now();
    loop {
        a.round().await.expect("round");
        if a.balance("k").await.expect("balance").1 == 0 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "a quiet lease was never given back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(started.elapsed() >= lease / 2 - Duration::from_millis(150), "given back before it was quiet");
    assert_eq!(a.balance("k").await.expect("balance").0, 10_036 * CENT);
}

/// A key hash as the index keeps it (hex of the secret's SHA-256).
fn h(secret: &str) -> String {
    tollgate::access::auth::hex(&tollgate::access::auth::hash_key(secret))
}

fn record(id: &str, hash: &str, enabled: bool) -> KeyRecord {
    KeyRecord { enabled, created_at: 1, ..KeyRecord::new(id, id, "default", hash, KeyOrigin::Admin) }
}

fn enabled(lookup: KeyLookup) -> Option<bool> {
    match lookup {
        KeyLookup::Found(r) => Some(r.enabled),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_disabled_on_one_node_is_refused_by_another_within_sync_ms() {
    let server = Postgres::start();
    let sync = Duration::from_millis(1000);
    let a = Arc::new(FleetKeys::new(pg(&server).await, sync));
    let c = Arc::new(FleetKeys::new(pg(&server).await, sync));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    for node in [&a, &c] {
        let node = node.clone();
        let stopped = stopped.clone();
        tokio::spawn(async move { node.follow(stopped).await });
    }
    a.put(&record("key_1", &h("hash-1"), true)).await.expect("put");
    let wait = |want: Option<bool>| {
        let c = c.clone();
        async move {
            let at = Instant::now();
            while enabled(c.lookup(&h("hash-1"))) != want {
                assert!(at.elapsed() < Duration::from_secs(10), "node C never saw {want:?}");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            at.elapsed()
        }
    };
    wait(Some(true)).await;
    let delay = wait_after(a.put(&record("key_1", &h("hash-1"), false)), wait(Some(false))).await;
    eprintln!("revocation reached node C after {delay:?} (sync_ms {sync:?})");
    assert!(delay <= sync + Duration::from_millis(500), "{delay:?}");
    // Rotation: the old secret's hash stops working everywhere.
    a.put(&record("key_1", &h("hash-2"), true)).await.expect("rotate");
    let at = Instant::now();
    while c.lookup(&h("hash-2")) == KeyLookup::Unknown {
        assert!(at.elapsed() < sync + Duration::from_millis(500));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(c.lookup(&h("hash-1")), KeyLookup::Unknown);
    stop.send(true).expect("stop");
}

/// Runs `first`, then measures `then`.
async fn wait_after<F: std::future::Future<Output = Result<(), PgError>>, G: std::future::Future<Output = Duration>>(
    first: F,
    then: G,
) -> Duration {
    first.await.expect("put");
    then.await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_change_committed_after_a_later_read_is_still_found_and_a_node_that_cannot_sync_goes_stale() {
    let server = Postgres::start();
    let db = pg(&server).await;
    let c = FleetKeys::new(pg(&server).await, Duration::from_millis(100));
    assert_eq!(c.lookup(&h("hash-9")), KeyLookup::Stale, "never synced: nothing is trusted");
    c.sync().await.expect("first sync");
    assert_eq!(c.lookup(&h("hash-9")), KeyLookup::Unknown);
    // A writer's transaction starts (its change row carries this time), C reads the log, then
    // the writer commits: the next read must still find it (no notification is listened to).
    let mut writer = db.client().await.expect("client");
    let tx = writer.transaction().await.expect("begin");
    tx.execute(
        "INSERT INTO keys (id, key_hash, record) VALUES ($1, $2, $3)",
        &[&"key_9", &h("hash-9"), &serde_json::to_string(&record("key_9", &h("hash-9"), true)).expect("json")],
    )
    .await
    .expect("insert");
    tx.execute("INSERT INTO key_changes (key_id) VALUES ('key_9')", &[]).await.expect("change");
    tokio::time::sleep(Duration::from_millis(200)).await;
    c.sync().await.expect("sync before the commit");
    assert_eq!(c.lookup(&h("hash-9")), KeyLookup::Unknown);
    tx.commit().await.expect("commit");
    c.sync().await.expect("sync after the commit");
    assert_eq!(enabled(c.lookup(&h("hash-9"))), Some(true), "a change that committed late was missed");
    // No sync for longer than the staleness bound: refused, not guessed.
    tokio::time::sleep(c.stale_after() + Duration::from_millis(100)).await;
    assert_eq!(c.lookup(&h("hash-9")), KeyLookup::Stale);
}

fn usage(key: &str, model: &str, cost: i64, time_ms: u64) -> UsageRecord {
    UsageRecord {
        time_ms,
        key_id: key.into(),
        model: model.into(),
        protocol: "openai".into(),
        route: "chat_completions".into(),
        input_tokens: 10,
        cached_tokens: 2,
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
        attempts: 1,
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_nodes_records_count_on_every_node_and_a_retried_batch_counts_once() {
    let server = Postgres::start();
    let db = pg(&server).await;
    let nodes = [
        FleetAccounts::new(db.clone(), "a", Duration::from_secs(30)),
        FleetAccounts::new(db.clone(), "b", Duration::from_secs(30)),
        FleetAccounts::new(db.clone(), "c", Duration::from_secs(30)),
    ];
    nodes[0].open_account("k", 100 * CENT).await.expect("open");
    for (i, node) in nodes.iter().enumerate() {
        let batch: Vec<Journaled> = (0..4)
            .map(|j| Journaled::of(j, &usage("k", if j % 2 == 0 { "m1" } else { "m2" }, 100, 1_000 + (i as u64 * 4 + j as u64)), false))
            .collect();
        let journal_id = format!("{i}/j");
        assert_eq!(node.book(&journal_id, &batch).await.expect("book"), 4);
        // The reply was lost and the batch is sent again: nothing is counted twice.
        assert_eq!(node.book(&journal_id, &batch).await.expect("book again"), 0);
    }
    let records = FleetRecords::new(db.clone());
    let (total, by_model) = records.summary("k", 0, u64::MAX >> 1, &tollgate::records::usage::Grouping::Model).await.expect("summary");
    assert_eq!(total.requests, 12);
    assert_eq!(total.cost_nanos, 1_200);
    assert_eq!(nodes[1].balance("k").await.expect("balance").0, 100 * CENT - 1_200, "the records' money, once");
    assert_eq!(total.input_tokens, 12 * 12, "plain, cached and cache-write input together");
    assert_eq!((by_model["m1"].requests, by_model["m2"].requests), (6, 6));
    let (window, _) = records.summary("k", 1_004, 1_008, &tollgate::records::usage::Grouping::Model).await.expect("summary");
    assert_eq!(window.requests, 4, "the time range is [start, end)");
    // A node whose data directory was replaced has a new journal id: its numbers start over.
    let batch = vec![Journaled::of(0, &usage("k", "m1", 100, 2_000), false)];
    assert_eq!(nodes[0].book("0/another", &batch).await.expect("book"), 1);
    assert_eq!(records.summary("k", 0, u64::MAX >> 1, &tollgate::records::usage::Grouping::Model).await.expect("summary").0.requests, 13);
    assert_eq!(records.prune(1_008).await.expect("prune"), 8);
    assert_eq!(records.summary("k", 0, u64::MAX >> 1, &tollgate::records::usage::Grouping::Model).await.expect("summary").0.requests, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_record_is_new_by_the_journals_mark_or_looked_up_when_below_it() {
    let server = Postgres::start();
    let db = pg(&server).await;
    let node = FleetAccounts::new(db.clone(), "a", Duration::from_secs(30));
    node.open_account("k", 100 * CENT).await.expect("open");
    let all = journal(0, "k", &[1, 10, 100, 1_000, 10_000]);
    let pick = |seqs: &[i64]| all.iter().filter(|j| seqs.contains(&j.seq)).cloned().collect::<Vec<_>>();
    assert_eq!(node.book("a/j", &pick(&[0, 1, 3])).await.expect("book"), 3);
    // Number 2 was drawn before 3 but reached the journal after 3 was booked: below the
    // mark, yet new.
    assert_eq!(node.book("a/j", &pick(&[2])).await.expect("late record"), 1);
    // A batch sent again with one more record: only that one counts.
    assert_eq!(node.book("a/j", &pick(&[0, 1, 2, 3, 4])).await.expect("retried batch"), 1);
    assert_eq!(node.balance("k").await.expect("balance").0, 100 * CENT - 11_111, "each cost once");
    let (total, _) =
        FleetRecords::new(db.clone()).summary("k", 0, u64::MAX >> 1, &tollgate::records::usage::Grouping::Model).await.expect("summary");
    assert_eq!(total.requests, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn records_booked_before_the_marks_existed_are_not_booked_again() {
    let server = Postgres::start();
    let db = Pg::new(&PgSettings { url: server.url(), pool_size: 4, ca_pem: None }).expect("pool");
    assert_eq!(db.migrate_to(7).await.expect("migrate to 7"), 7);
    let node = FleetAccounts::new(db.clone(), "a", Duration::from_secs(30));
    node.open_account("k", 100 * CENT).await.expect("open");
    // What version 7 left: records keyed by (journal, number) with their money debited.
    let old = journal(0, "k", &[1, 10, 100, 1_000, 10_000]);
    let client = db.client().await.expect("client");
    for (i, j) in old[..4].iter().enumerate() {
        let text = serde_json::to_string(&usage("k", "m", [1, 10, 100, 1_000][i], 1_000 + i as u64)).expect("json");
        client
            .execute(
                "INSERT INTO usage_records (node_id, seq, key_id, time_ms, record) VALUES ('a/j', $1, 'k', $2, $3)",
                &[&j.seq, &(j.head.time_ms as i64), &text],
            )
            .await
            .expect("insert");
    }
    client.execute("UPDATE accounts SET balance = balance - 1111 WHERE key_id = 'k'", &[]).await.expect("debit");
    assert_eq!(db.migrate().await.expect("migrate"), 14);
    // The node's journal still holds the first four (their reply was lost) and a fifth.
    assert_eq!(node.book("a/j", &old).await.expect("book"), 1);
    assert_eq!(node.balance("k").await.expect("balance").0, 100 * CENT - 11_111);
    assert_eq!(
        FleetRecords::new(db.clone())
            .summary("k", 0, u64::MAX >> 1, &tollgate::records::usage::Grouping::Model)
            .await
            .expect("summary")
            .0
            .requests,
        5
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_task_belongs_to_the_fleet_one_node_at_a_time() {
    let server = Postgres::start();
    let claim = Duration::from_secs(1);
    let a = FleetTasks::new(pg(&server).await, "a", claim);
    let c = FleetTasks::new(pg(&server).await, "c", claim);
    // Created on A, readable on C by its owner only; the same idempotency key on C returns it.
    assert_eq!(a.create("task_1", "k", r#"{"status":"submitting"}"#, Some("idem-1")).await.expect("create"), Created::New);
    assert_eq!(c.get("task_1", "k").await.expect("get").as_deref(), Some(r#"{"status":"submitting"}"#));
    assert_eq!(c.get("task_1", "other-key").await.expect("get"), None);
    assert_eq!(c.create("task_2", "k", "{}", Some("idem-1")).await.expect("create"), Created::Existing("task_1".into()));
    assert_eq!(c.get("task_2", "k").await.expect("get"), None, "no second task (and no second submission)");
    // A holds it: C cannot take it, nor write it.
    assert!(c.claim(10).await.expect("claim").is_empty());
    assert!(!c.put("task_1", "k", r#"{"status":"x"}"#, true).await.expect("update"));
    assert!(a.put("task_1", "k", r#"{"status":"queued"}"#, true).await.expect("update"));
    // A dies: once its claim lapses C takes the task over, and A's late write is refused.
    let died = Instant::now();
    let taken = loop {
        let got = c.claim(10).await.expect("claim");
        if !got.is_empty() {
            break got;
        }
        assert!(died.elapsed() < Duration::from_secs(10), "never taken over");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(taken, vec![("task_1".to_string(), r#"{"status":"queued"}"#.to_string())]);
    assert!(!a.put("task_1", "k", r#"{"status":"stale"}"#, true).await.expect("update"), "a node past its claim wrote");
    assert!(c.put("task_1", "k", r#"{"status":"completed"}"#, false).await.expect("update"));
    assert!(c.claim(10).await.expect("claim").is_empty(), "a finished task is not polled");
    assert_eq!(a.get("task_1", "k").await.expect("get").as_deref(), Some(r#"{"status":"completed"}"#));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_pollers_never_take_the_same_task() {
    let server = Postgres::start();
    let claim = Duration::from_millis(300);
    let creator = FleetTasks::new(pg(&server).await, "creator", claim);
    for i in 0..40 {
        assert_eq!(creator.create(&format!("t{i}"), "k", "{}", None).await.expect("create"), Created::New);
    }
    tokio::time::sleep(claim + Duration::from_millis(100)).await; // the creator's claims lapse
    let a = Arc::new(FleetTasks::new(pg(&server).await, "a", Duration::from_secs(30)));
    let c = Arc::new(FleetTasks::new(pg(&server).await, "c", Duration::from_secs(30)));
    // Four rounds each, at once: a node may take its own tasks again (renewing its claim),
    // never one the other holds.
    let mut rounds = Vec::new();
    for _ in 0..4 {
        for (name, node) in [("a", a.clone()), ("c", c.clone())] {
            rounds.push(tokio::spawn(async move { (name, node.claim(10).await.expect("claim")) }));
        }
    }
    let mut holder: std::collections::HashMap<String, &str> = std::collections::HashMap::new();
    for round in rounds {
        let (name, got) = round.await.expect("task");
        for (id, _) in got {
            let first = *holder.entry(id.clone()).or_insert(name);
            assert_eq!(first, name, "{id} was taken by both nodes");
        }
    }
    assert!(holder.len() <= 40);
}

/// The database's minute number now.
async fn db_minute(db: &Pg) -> i64 {
    let client = db.client().await.expect("client");
    client.query_one("SELECT floor(extract(epoch FROM now()) / 60)::BIGINT", &[]).await.expect("now").get(0)
}

/// `n` requests of `key` at once, spread over `nodes` in turn, against `rpm`.
async fn admit_spread(nodes: &[Arc<FleetRates>], key: &str, n: usize, rpm: u32) -> Vec<Admission> {
    let calls = (0..n).map(|i| {
        let node = nodes[i % nodes.len()].clone();
        let key = key.to_string();
        tokio::spawn(async move { node.admit_request(&key, rpm).await.expect("database") })
    });
    futures_util::future::join_all(calls).await.into_iter().map(|r| r.expect("task")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rpm_holds_exactly_for_the_sum_of_the_nodes() {
    let server = Postgres::start();
    let db = pg(&server).await;
    let nodes: Vec<Arc<FleetRates>> = vec![
        Arc::new(FleetRates::new(pg(&server).await)),
        Arc::new(FleetRates::new(pg(&server).await)),
        Arc::new(FleetRates::new(pg(&server).await)),
    ];
    // A run that straddles a minute boundary (a new window) is tried again with a new key.
    for attempt in 0..3 {
        let key = format!("k{attempt}");
        let minute = db_minute(&db).await;
        let outcomes = admit_spread(&nodes, &key, 90, 30).await;
        if db_minute(&db).await != minute {
            continue;
        }
        let admitted = outcomes.iter().filter(|o| **o == Admission::Admitted).count();
        assert_eq!(admitted, 30, "{outcomes:?}");
        assert!(outcomes.iter().all(|o| match o {
            Admission::Refused { retry_after_secs } => (1..=60).contains(retry_after_secs),
            Admission::Admitted => true,
        }));
        return;
    }
    panic!("three runs in a row straddled a minute boundary");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tpm_holds_for_the_fleet_within_one_flush_of_the_other_nodes() {
    let server = Postgres::start();
    let a = FleetRates::new(pg(&server).await);
    let c = FleetRates::new(pg(&server).await);
    assert_eq!(c.admit_tokens("k", 1000).await, Admission::Admitted);
    // A spends 900, C 200: each alone is under 1000, the fleet is over once both flushed.
    a.spend_tokens("k", 900).await;
    c.spend_tokens("k", 200).await;
    assert_eq!(c.admit_tokens("k", 1000).await, Admission::Admitted, "before the flush C knows only its own 200");
    a.flush().await.expect("flush");
    c.flush().await.expect("flush");
    assert!(matches!(c.admit_tokens("k", 1000).await, Admission::Refused { .. }));
    a.flush().await.expect("flush");
    assert!(matches!(a.admit_tokens("k", 1000).await, Admission::Refused { .. }), "A read the fleet's total back");
}

/// Issue 45: a minute boundary opens no second full window for the fleet. The previous
/// minute's 30 grants count for the part of it still inside the sliding minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rpm_counts_the_previous_minute_across_its_boundary() {
    let server = Postgres::start();
    let db = pg(&server).await;
    let nodes: Vec<Arc<FleetRates>> = vec![Arc::new(FleetRates::new(pg(&server).await)), Arc::new(FleetRates::new(pg(&server).await))];
    for attempt in 0..3 {
        let key = format!("b{attempt}");
        let client = db.client().await.expect("client");
        let row = client
            .query_one("SELECT floor(extract(epoch FROM now()) / 60)::BIGINT, 60 - (extract(epoch FROM now())::numeric % 60)::float8", &[])
            .await
            .expect("now");
        let (minute, secs_left): (i64, f64) = (row.get(0), row.get(1));
        if secs_left < 10.0 {
            // Too close to the next boundary for the share to be read: wait it out.
            tokio::time::sleep(Duration::from_secs_f64(secs_left + 0.5)).await;
            continue;
        }
        // The previous minute granted all 30, as a burst at its end would.
        client
            .execute("INSERT INTO rate_windows (key_id, window_start, requests_granted) VALUES ($1, $2, 30)", &[&key, &(minute - 1)])
            .await
            .expect("previous window");
        let outcomes = admit_spread(&nodes, &key, 60, 30).await;
        if db_minute(&db).await != minute {
            continue;
        }
        let admitted = outcomes.iter().filter(|o| **o == Admission::Admitted).count();
        // At least a sixth of the minute (10 s) was left: at least 5 of the previous 30 still count.
        let carried_at_least = (30.0 * 10.0 / 60.0) as usize;
        assert!(admitted <= 30 - carried_at_least, "{admitted} admitted right after a full minute ({secs_left:.1} s left)");
        assert!(admitted >= 1, "the minute is not closed entirely");
        return;
    }
    panic!("three runs in a row met a minute boundary");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tpm_reservations_in_flight_hold_on_a_fleet_node() {
    let server = Postgres::start();
    let node = FleetRates::new(pg(&server).await);
    // 20 requests at once, each held for 120 tokens, against 1,000: 8 fit.
    let admitted = (0..20).filter(|_| node.reserve_tokens("k", 1000, 120) == Admission::Admitted).count();
    assert_eq!(admitted, 8);
    for _ in 0..8 {
        node.spend_tokens("k", 100).await;
        node.release_tokens("k", 120);
    }
    assert_eq!(node.reserve_tokens("k", 1000, 150), Admission::Admitted, "800 spent, 200 free");
    assert!(matches!(node.reserve_tokens("k", 1000, 100), Admission::Refused { .. }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn max_concurrent_holds_for_the_fleet_and_a_dead_nodes_slots_come_back() {
    let server = Postgres::start();
    let lease = Duration::from_secs(2);
    let nodes: Vec<Arc<FleetSlots>> = vec![
        Arc::new(FleetSlots::new(pg(&server).await, "a", lease)),
        Arc::new(FleetSlots::new(pg(&server).await, "b", lease)),
        Arc::new(FleetSlots::new(pg(&server).await, "c", lease)),
    ];
    // 15 requests at once over three nodes, none ending: exactly 5 get in.
    let entries = (0..15).map(|i| {
        let node = nodes[i % 3].clone();
        tokio::spawn(async move { (i % 3, node.enter("k", 5).await.expect("database")) })
    });
    let outcomes: Vec<(usize, bool)> = futures_util::future::join_all(entries).await.into_iter().map(|r| r.expect("task")).collect();
    assert_eq!(outcomes.iter().filter(|(_, ok)| *ok).count(), 5, "{outcomes:?}");
    // The requests end on every node but A, which dies with its slots.
    let on_a = outcomes.iter().filter(|(n, ok)| *ok && *n == 0).count();
    for (n, ok) in &outcomes {
        if *ok && *n != 0 {
            nodes[*n].exit("k");
        }
    }
    // Once A's lease expired (and the others gave back their quiet slots), C has all five.
    let started = Instant::now();
    let c = nodes[2].clone();
    let mut got = 0;
    while got < 5 {
        if c.enter("k", 5).await.expect("database") {
            got += 1;
            continue;
        }
        for n in &nodes[1..] {
            n.renew().await.expect("renew");
        }
        assert!(started.elapsed() < Duration::from_secs(15), "slots never came back (A held {on_a}, C got {got})");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!c.enter("k", 5).await.expect("database"), "a sixth slot");
}

/// Issue 24, point 2 ("the per-request path must not wait for a database round trip"): a key
/// served from this node's share is admitted while another key's lease request is stuck in the
/// database (its rows locked by another session), for `rpm` and for `max_concurrent`; and a
/// flush of token counts that is stuck holds up no admission either.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_served_locally_never_waits_for_another_keys_statement() {
    let server = Postgres::start();
    let db = pg(&server).await;
    let rates = Arc::new(FleetRates::new(pg(&server).await));
    let slots = Arc::new(FleetSlots::new(pg(&server).await, "a", Duration::from_secs(30)));
    // Shares for "fast" first (rpm 800: a share of 100; 800 slots: a lease of 100).
    assert_eq!(rates.admit_request("fast", 800).await.expect("database"), Admission::Admitted);
    assert!(slots.enter("fast", 800).await.expect("database"));
    assert_eq!(rates.admit_tokens("fast", 1_000_000).await, Admission::Admitted);
    rates.spend_tokens("fast", 10).await;
    // "capped" (tpm 100) knows its window after one flush, then spends over its limit.
    assert_eq!(rates.admit_tokens("capped", 100).await, Admission::Admitted);
    rates.spend_tokens("capped", 10).await;
    rates.flush().await.expect("flush");
    rates.spend_tokens("capped", 200).await;
    // Another session locks what a lease of "slow" and a flush of "fast" need.
    let mut blocker = db.client().await.expect("client");
    let tx = blocker.transaction().await.expect("begin");
    let minute = db_minute(&db).await;
    // This minute's windows and the next's, so that a minute boundary changes nothing: those
    // not there yet are inserted, those there already (flushed above) locked.
    tx.execute(
        "INSERT INTO rate_windows (key_id, window_start)
         VALUES ('slow', $1), ('fast', $1), ('capped', $1), ('slow', $1 + 1), ('fast', $1 + 1), ('capped', $1 + 1)
         ON CONFLICT DO NOTHING",
        &[&minute],
    )
    .await
    .expect("window");
    tx.execute("SELECT 1 FROM rate_windows WHERE key_id IN ('slow', 'fast', 'capped') FOR UPDATE", &[]).await.expect("lock rows");
    tx.execute("SELECT pg_advisory_xact_lock(hashtext('slow'))", &[]).await.expect("lock");
    let stuck_rate = tokio::spawn({
        let rates = rates.clone();
        async move { rates.admit_request("slow", 800).await }
    });
    let stuck_slot = tokio::spawn({
        let slots = slots.clone();
        async move { slots.enter("slow", 800).await }
    });
    let stuck_flush = tokio::spawn({
        let rates = rates.clone();
        async move { rates.flush().await }
    });
    let fast = async {
        for _ in 0..50 {
            assert_eq!(rates.admit_request("fast", 800).await.expect("database"), Admission::Admitted);
            assert!(slots.enter("fast", 800).await.expect("database"));
            assert_eq!(rates.admit_tokens("fast", 1_000_000).await, Admission::Admitted);
            rates.spend_tokens("fast", 10).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), fast).await.expect("a local admission waited for another key's statement");
    // While the flush is under way (its statement waits for the blocker's lock), the spend
    // it carries still counts here.
    let monitor = db.client().await.expect("client");
    let waiting = async {
        loop {
            let n: i64 = monitor
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                     WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO rate_windows (key_id, window_start, tokens)%'",
                    &[],
                )
                .await
                .expect("activity")
                .get(0);
            if n > 0 {
                break;
            }
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("the flush never reached the database");
    assert!(matches!(rates.admit_tokens("capped", 100).await, Admission::Refused { .. }), "a flush in flight hid this node's own spend");
    assert!(!stuck_rate.is_finished() && !stuck_slot.is_finished() && !stuck_flush.is_finished(), "the blocker holds them");
    tx.rollback().await.expect("rollback");
    assert_eq!(stuck_rate.await.expect("task").expect("database"), Admission::Admitted);
    assert!(stuck_slot.await.expect("task").expect("database"));
    stuck_flush.await.expect("task").expect("flush");
}

/// Issue 24, point 2: a steady key's lease is refilled ahead of need, off the request path —
/// its holds keep being served from memory while the database is busy (the key's row locked by
/// another session), beyond the first chunk.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_running_low_is_refilled_in_the_background_and_holds_never_wait() {
    let server = Postgres::start();
    let db = pg(&server).await;
    let node = Arc::new(FleetAccounts::new(db.clone(), "a", Duration::from_secs(30)));
    let mut refills = node.take_refills().expect("the refill queue");
    node.open_account("k", 100 * 100 * CENT).await.expect("open"); // $100: chunks of $1
                                                                   // The first hold leases a chunk of $1 (100 cents); holds up to half of it ask no refill.
    for _ in 0..50 {
        let hold = node.hold("k", CENT).await.expect("database").expect("covered");
        node.settle(hold, CENT).await;
    }
    assert!(refills.try_recv().is_err(), "half the chunk is still free");
    let hold = node.hold("k", CENT).await.expect("database").expect("covered");
    node.settle(hold, CENT).await;
    assert_eq!(refills.try_recv().expect("below half a chunk: a refill is asked for"), "k");
    // Another session holds the key's row: the refill waits, the holds do not.
    let mut blocker = db.client().await.expect("client");
    let tx = blocker.transaction().await.expect("begin");
    tx.execute("SELECT 1 FROM accounts WHERE key_id = 'k' FOR UPDATE", &[]).await.expect("lock");
    let refill = tokio::spawn({
        let node = node.clone();
        async move { node.refill("k").await }
    });
    let rest_of_chunk = async {
        for _ in 0..49 {
            let hold = node.hold("k", CENT).await.expect("database").expect("covered");
            node.settle(hold, CENT).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), rest_of_chunk).await.expect("a hold waited for the database");
    assert!(!refill.is_finished(), "the blocker holds the refill");
    tx.rollback().await.expect("rollback");
    refill.await.expect("task").expect("refill");
    // The refill took a second chunk: another 90 holds from memory, the row locked again.
    let tx = blocker.transaction().await.expect("begin");
    tx.execute("SELECT 1 FROM accounts WHERE key_id = 'k' FOR UPDATE", &[]).await.expect("lock");
    let next_chunk = async {
        for _ in 0..90 {
            let hold = node.hold("k", CENT).await.expect("database").expect("covered");
            node.settle(hold, CENT).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), next_chunk).await.expect("the refilled chunk was not there");
    tx.rollback().await.expect("rollback");
    let (balance, leased) = node.balance("k").await.expect("balance");
    assert_eq!(balance, 100 * 100 * CENT, "nothing booked yet");
    assert!(leased <= 3 * 100 * CENT / 2 + 100 * CENT, "{leased}: at most the chunks taken");
}

/// A key whose only hold so far took its lease is in use: the next sync round keeps its lease
/// (a round gives back only the leases of keys quiet for half a lease), so the node can go on
/// serving it from memory — through an outage, too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_just_leased_keeps_its_lease_through_the_next_round() {
    let server = Postgres::start();
    let db = pg(&server).await;
    let node = FleetAccounts::new(db.clone(), "a", Duration::from_secs(30));
    node.open_account("k", 100 * 100 * CENT).await.expect("open");
    let hold = node.hold("k", CENT).await.expect("database").expect("leased");
    node.settle(hold, CENT).await;
    assert_eq!(node.book("a/j", &journal(0, "k", &[CENT])).await.expect("book"), 1);
    node.round().await.expect("round");
    let (_, leased) = node.balance("k").await.expect("balance");
    assert!(leased > 0, "the lease of a key used a moment ago was given back");
}

/// A node forgets the purses it no longer leases, holds or owes once they are quiet for half a
/// lease (a spend window is a purse per key and period: kept forever, they would grow without
/// bound), and serves a forgotten one again as new.
#[tokio::test]
async fn a_node_forgets_the_purses_it_no_longer_uses() {
    let server = Postgres::start();
    let lease = Duration::from_millis(400);
    let node = FleetAccounts::new(pg(&server).await, "a", lease);
    node.open_account("k", 10 * CENT).await.expect("open");
    let hold = node.hold("k", CENT).await.expect("database").expect("covered");
    node.settle(hold, CENT).await;
    node.book("a/j", &journal(0, "k", &[CENT])).await.expect("book");
    assert_eq!(node.tracked(), 1);
    node.round().await.expect("round");
    assert_eq!(node.tracked(), 1, "used moments ago: kept");
    // Being quiet for half a lease is the condition itself: let that time pass.
    tokio::time::sleep(lease / 2).await;
    node.round().await.expect("round");
    assert_eq!(node.tracked(), 0, "nothing leased, held or owed, and quiet: forgotten");
    let hold = node.hold("k", CENT).await.expect("database").expect("served again");
    node.settle(hold, 0).await;
    assert_eq!(node.balance("k").await.expect("balance").0, 9 * CENT);
}

/// Issue 46, point 5: bookings, leases, releases and renewals of two nodes on the same keys, all
/// at once, never deadlock: every transaction locks account rows (by key) before lease rows.
/// On the previous order (a booking locked its lease row, then the account row; a lease the
/// account row, then the lease row) PostgreSQL reported `deadlock detected` under this load.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_syncs_and_leases_never_deadlock() {
    let server = Postgres::start();
    let db = pg(&server).await;
    let keys = ["k0", "k1", "k2", "k3"];
    let nodes: Vec<Arc<FleetAccounts>> = vec![
        Arc::new(FleetAccounts::new(pg(&server).await, "a", Duration::from_secs(30))),
        Arc::new(FleetAccounts::new(pg(&server).await, "b", Duration::from_secs(30))),
    ];
    for k in keys {
        nodes[0].open_account(k, 1_000 * CENT).await.expect("open");
    }
    let deadline = Instant::now() + Duration::from_secs(4);
    let mut tasks = Vec::new();
    for (n, node) in nodes.iter().enumerate() {
        // Holds that lease from the database (and give the lease back at once, so the next
        // one leases again).
        for worker in 0..2 {
            let node = node.clone();
            tasks.push(tokio::spawn(async move {
                let mut i = 0usize;
                while Instant::now() < deadline {
                    let key = keys[(i + worker) % keys.len()];
                    if let Ok(hold) = node.hold(key, CENT).await.expect("hold: no database error") {
                        node.settle(hold, CENT / 2).await;
                    }
                    node.release_unused(key).await.expect("release: no database error");
                    i += 1;
                }
            }));
        }
        // Bookings whose records charge several purses, named in every order.
        let node_b = node.clone();
        tasks.push(tokio::spawn(async move {
            let mut seq = 0i64;
            while Instant::now() < deadline {
                let batch: Vec<Journaled> = (0..4)
                    .map(|j| {
                        let mut record = usage(keys[(seq as usize + j) % 4], "m", 10, 1_000 + seq as u64);
                        record.charged = vec![keys[(seq as usize + j + 3) % 4].to_string(), keys[(seq as usize + j + 1) % 4].to_string()];
                        let entry = Journaled::of(seq, &record, false);
                        seq += 1;
                        entry
                    })
                    .collect();
                node_b.book(&format!("{n}/stress"), &batch).await.expect("book: no database error");
            }
        }));
        let node_r = node.clone();
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                node_r.renew().await.expect("renew: no database error");
            }
        }));
    }
    for t in tasks {
        t.await.expect("a task failed (a deadlock is a database error)");
    }
    // And the money adds up: every purse lost what its records say, nothing is leased now.
    for node in &nodes {
        for k in keys {
            node.release_unused(k).await.expect("release");
        }
    }
    let client = db.client().await.expect("client");
    let leased: i64 = client.query_one("SELECT COALESCE(SUM(leased), 0)::BIGINT FROM accounts", &[]).await.expect("sum").get(0);
    let in_leases: i64 = client.query_one("SELECT COALESCE(SUM(amount), 0)::BIGINT FROM leases", &[]).await.expect("sum").get(0);
    assert_eq!(leased, in_leases, "accounts.leased is the sum of the leases");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_log_rows_of_either_form_read_back() {
    use tollgate::records::log::{Filter, LogEntry};
    let server = Postgres::start();
    let db = pg(&server).await;
    let old = LogEntry {
        id: "req_old".into(),
        time_ms: 1_000,
        seq: 1,
        key_id: Some("k".into()),
        route: "chat_completions".into(),
        status: 200,
        ..LogEntry::default()
    };
    let new = LogEntry {
        id: "req_new".into(),
        time_ms: 2_000,
        seq: 2,
        key_id: Some("k".into()),
        route: "messages".into(),
        status: 429,
        ..LogEntry::default()
    };
    // A row as versions before schema 10 wrote it (JSON in `record`), and a batch as a node ships
    // it now (the stored form as it is).
    let client = db.client().await.expect("client");
    client
        .execute(
            "INSERT INTO request_log (node_id, node_seq, id, time_ms, key_id, record) VALUES ('a', 1, 'req_old', 1000, 'k', $1)",
            &[&serde_json::to_string(&old).expect("json")],
        )
        .await
        .expect("insert");
    let mut batch = b"[".to_vec();
    new.encode(&mut batch);
    batch.push(b']');
    assert_eq!(tollgate::store::postgres::requests::ship(&db, "b", &[batch.clone()]).await.expect("ship"), (1, 1));
    assert_eq!(tollgate::store::postgres::requests::ship(&db, "b", &[batch]).await.expect("again"), (0, 1), "shipped twice, stored once");
    let stored: Option<Vec<u8>> = client.query_one("SELECT bin FROM request_log WHERE id = 'req_new'", &[]).await.expect("row").get(0);
    assert!(stored.is_some_and(|b| LogEntry::decode(&b).as_ref() == Some(&new)), "stored in binary");
    let (page, _) = tollgate::store::postgres::requests::query(&db, &Filter { end_ms: u64::MAX >> 1, limit: 10, ..Filter::default() })
        .await
        .expect("query");
    assert_eq!(page, vec![new, old]);
}
