//! The PostgreSQL end of `store copy` (see `store::copy`).

use super::{Pg, PgError};
use crate::store::snapshot::Snapshot;

/// Whether tollgate's schema is in the database (read only: nothing is created).
pub async fn has_schema(pg: &Pg) -> Result<bool, PgError> {
    let client = pg.client().await?;
    Ok(client.query_one("SELECT to_regclass('tollgate_schema') IS NOT NULL", &[]).await?.get(0))
}

/// Whether the database holds no tollgate data (keys, balances, records or tasks).
pub async fn is_empty(pg: &Pg) -> Result<bool, PgError> {
    let client = pg.client().await?;
    let n: i64 = client
        .query_one(
            "SELECT (SELECT count(*) FROM keys) + (SELECT count(*) FROM accounts)
                  + (SELECT count(*) FROM usage_records) + (SELECT count(*) FROM video_tasks)",
            &[],
        )
        .await?
        .get(0);
    Ok(n == 0)
}

fn text<T: serde::Serialize>(v: &T) -> Result<String, PgError> {
    serde_json::to_string(v).map_err(|e| PgError::Query(e.to_string()))
}

fn parse<T: serde::de::DeserializeOwned>(what: &str, text: &str) -> Result<T, PgError> {
    serde_json::from_str(text).map_err(|e| PgError::Query(format!("{what}: {e}")))
}

/// Everything the database holds.
pub async fn read(pg: &Pg) -> Result<Snapshot, PgError> {
    let client = pg.client().await?;
    let mut s = Snapshot::default();
    for row in client.query("SELECT record FROM keys ORDER BY id", &[]).await? {
        s.keys.push(parse("key", &row.get::<_, String>(0))?);
    }
    for row in client.query("SELECT record FROM key_accounts ORDER BY name", &[]).await? {
        s.accounts.push(parse("account", &row.get::<_, String>(0))?);
    }
    for row in client.query("SELECT key_id, balance FROM accounts ORDER BY key_id", &[]).await? {
        s.balances.push((row.get(0), row.get(1)));
    }
    for row in client.query("SELECT record FROM audit_log ORDER BY time_ms, seq", &[]).await? {
        s.audit.push(parse("audit entry", &row.get::<_, String>(0))?);
    }
    for row in client.query("SELECT record, bin FROM usage_records ORDER BY time_ms, node_id, seq", &[]).await? {
        s.records.push(super::usage::read(&row)?);
    }
    for row in client.query("SELECT id, owner FROM response_owners ORDER BY id", &[]).await? {
        s.owners.push((row.get(0), parse("response owner", &row.get::<_, String>(1))?));
    }
    for row in client.query("SELECT record FROM video_tasks ORDER BY id", &[]).await? {
        s.tasks.push(parse("video task", &row.get::<_, String>(0))?);
    }
    for row in client.query("SELECT key_id, idem_key, task_id, extract(epoch FROM created_at)::BIGINT FROM idempotency_keys", &[]).await? {
        s.idempotency.push((row.get(0), row.get(1), row.get(2), u64::try_from(row.get::<_, i64>(3)).unwrap_or(0)));
    }
    for row in client.query("SELECT id, value FROM marks ORDER BY id", &[]).await? {
        s.marks.push((row.get(0), row.get(1)));
    }
    Ok(s)
}

/// Write a snapshot into an empty database, in one transaction. The records are numbered in a
/// journal of their own (`copy/<unix ms>`), so nodes' journals never collide with them.
pub async fn write(pg: &Pg, s: &Snapshot) -> Result<(), PgError> {
    let mut client = pg.client().await?;
    let tx = client.transaction().await?;
    for k in &s.keys {
        tx.execute("INSERT INTO keys (id, key_hash, record) VALUES ($1, $2, $3)", &[&k.id, &k.key_hash, &text(k)?]).await?;
    }
    for a in &s.accounts {
        tx.execute("INSERT INTO key_accounts (name, record) VALUES ($1, $2)", &[&a.name, &text(a)?]).await?;
    }
    for (key_id, balance) in &s.balances {
        tx.execute("INSERT INTO accounts (key_id, balance) VALUES ($1, $2)", &[key_id, balance]).await?;
    }
    for e in &s.audit {
        tx.execute("INSERT INTO audit_log (time_ms, record) VALUES ($1, $2)", &[&i64::try_from(e.time_ms).unwrap_or(i64::MAX), &text(e)?])
            .await?;
    }
    let journal = format!("copy/{}", crate::base::clock::now_ms());
    let records: Vec<_> = s.records.iter().enumerate().map(|(i, r)| super::usage::Journaled::of(i as i64, r, false)).collect();
    super::usage::insert(&tx, &journal, records.iter()).await?;
    for (id, owner) in &s.owners {
        tx.execute(
            "INSERT INTO response_owners (id, owner, time_ms) VALUES ($1, $2, $3)",
            &[id, &text(owner)?, &i64::try_from(owner.time_ms).unwrap_or(i64::MAX)],
        )
        .await?;
    }
    for t in &s.tasks {
        // Unclaimed: the first node's poller takes the open ones.
        let open = !t.status.is_terminal() || t.copy_pending;
        tx.execute("INSERT INTO video_tasks (id, key_id, record, open) VALUES ($1, $2, $3, $4)", &[&t.id, &t.owner, &text(t)?, &open])
            .await?;
    }
    for (key_id, idem, task_id, at) in &s.idempotency {
        tx.execute(
            "INSERT INTO idempotency_keys (key_id, idem_key, task_id, created_at) VALUES ($1, $2, $3, to_timestamp($4))",
            &[key_id, idem, task_id, &(*at as f64)],
        )
        .await?;
    }
    let now = i64::try_from(crate::base::clock::now_ms()).unwrap_or(i64::MAX);
    for (mark, value) in &s.marks {
        tx.execute("INSERT INTO marks (id, value, time_ms) VALUES ($1, $2, $3)", &[mark, value, &now]).await?;
    }
    tx.commit().await?;
    Ok(())
}
