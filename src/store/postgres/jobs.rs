//! Jobs that belong to the fleet (batches): created on any node, readable on every node (their
//! owner checks who reads), worked on by one node at a time — the claims of video tasks
//! (`postgres::tasks`): the creating node holds a job's claim from its creation for
//! `claim_for` by the database's clock, renews it each time it works on it, and every write
//! is fenced by it; a job whose claim lapsed (its node died or stalled) is taken by the next
//! poller round of any node, with `FOR UPDATE SKIP LOCKED` so two nodes never take the same.

use super::Pg;
use crate::store::{JobRow, JobStore, StoreError};
use std::time::Duration;

/// Jobs a poller round takes at most.
const CLAIM_BATCH: i64 = 1000;

pub struct FleetJobs {
    pg: Pg,
    node: String,
    claim_for: Duration,
}

impl FleetJobs {
    pub fn new(pg: Pg, node: &str, claim_for: Duration) -> Self {
        FleetJobs { pg, node: node.to_string(), claim_for }
    }

    fn claim_ms(&self) -> f64 {
        self.claim_for.as_millis() as f64
    }
}

#[async_trait::async_trait]
impl JobStore for FleetJobs {
    fn shared(&self) -> bool {
        true
    }

    async fn get(&self, id: &str) -> Result<Option<String>, StoreError> {
        let client = self.pg.client().await?;
        let row = client.query_opt("SELECT record FROM jobs WHERE id = $1", &[&id]).await.map_err(super::PgError::from)?;
        self.pg.count(1);
        Ok(row.map(|r| r.get(0)))
    }

    /// A new job is created claimed by this node; an existing one is written (its claim
    /// renewed, or dropped once closed) only while this node holds an unexpired claim on it.
    async fn put(&self, row: &JobRow) -> Result<(), StoreError> {
        let client = self.pg.client().await?;
        let created = i64::try_from(row.created_at).unwrap_or(i64::MAX);
        let n = client
            .execute(
                "INSERT INTO jobs (id, kind, key_id, created_at, record, open, claimed_by, claim_until)
                 VALUES ($1, $2, $3, $4, $5, $6, CASE WHEN $6 THEN $7 END, CASE WHEN $6 THEN now() + $8 * interval '1 millisecond' END)
                 ON CONFLICT (id) DO UPDATE SET record = EXCLUDED.record, open = EXCLUDED.open, updated_at = now(),
                        claim_until = EXCLUDED.claim_until, claimed_by = EXCLUDED.claimed_by
                 WHERE jobs.claimed_by = $7 AND jobs.claim_until > now()",
                &[&row.id, &row.kind, &row.owner, &created, &row.record, &row.open, &self.node, &self.claim_ms()],
            )
            .await
            .map_err(super::PgError::from)?;
        self.pg.count(1);
        if n != 1 {
            return Err(StoreError::Shared(format!("job {}: another node holds it now; this write was refused", row.id)));
        }
        Ok(())
    }

    async fn open(&self, kind: &'static str) -> Result<Vec<String>, StoreError> {
        let client = self.pg.client().await?;
        let rows = client
            .query(
                "UPDATE jobs SET claimed_by = $1, claim_until = now() + $2 * interval '1 millisecond'
                 WHERE id IN (
                     SELECT id FROM jobs
                     WHERE open AND kind = $3 AND (claim_until IS NULL OR claim_until < now() OR claimed_by = $1)
                     ORDER BY updated_at LIMIT $4
                     FOR UPDATE SKIP LOCKED)
                 RETURNING record",
                &[&self.node, &self.claim_ms(), &kind, &CLAIM_BATCH],
            )
            .await
            .map_err(super::PgError::from)?;
        self.pg.count(1);
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    async fn prune_closed(&self, kind: &'static str, created_before: u64, max: usize) -> Result<usize, StoreError> {
        let client = self.pg.client().await?;
        let before = i64::try_from(created_before).unwrap_or(i64::MAX);
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        let n = client
            .execute(
                "DELETE FROM jobs WHERE id IN (
                     SELECT id FROM jobs WHERE kind = $1 AND NOT open AND created_at < $2 LIMIT $3)",
                &[&kind, &before, &max],
            )
            .await
            .map_err(super::PgError::from)?;
        self.pg.count(1);
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }

    async fn of_owner(&self, kind: &'static str, owner: &str, after: Option<&str>, limit: usize) -> Result<Vec<String>, StoreError> {
        let client = self.pg.client().await?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = client
            .query(
                "SELECT record FROM jobs WHERE kind = $1 AND key_id = $2
                   AND ($3::text IS NULL OR (created_at, id) <
                        (SELECT created_at, id FROM jobs WHERE id = $3 AND key_id = $2 AND kind = $1))
                 ORDER BY created_at DESC, id DESC LIMIT $4",
                &[&kind, &owner, &after, &limit],
            )
            .await
            .map_err(super::PgError::from)?;
        self.pg.count(1);
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }
}
