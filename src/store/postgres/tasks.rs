//! Video tasks that belong to the fleet: created on any node, readable on every node (by their
//! owner only), worked on by exactly one node at a time.
//!
//! A node works on a task (submits it, polls it) only while it holds the task's **claim**, which
//! lasts `claim_for` by the database's clock. The creating node holds it from creation; the
//! pollers take open tasks whose claim lapsed with `FOR UPDATE SKIP LOCKED`, so two nodes never
//! take the same one, and a dead node's tasks are taken by another once its claims expire.
//! Every write of a task's state is **fenced** by the claim: it applies only while the writer
//! still holds an unexpired claim, so a node that stalled past its claim cannot overwrite (or
//! submit again) what another node took over. Idempotency keys are a table of their own: the
//! first task created with a key is the one every node returns for it.

use super::{Pg, PgError};
use crate::records::task::Task;
use std::time::Duration;

/// What a create found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created {
    /// The task was created, claimed by this node.
    New,
    /// The idempotency key was used before: that task.
    Existing(String),
}

pub struct FleetTasks {
    pg: Pg,
    node: String,
    claim_for: Duration,
}

impl FleetTasks {
    pub fn new(pg: Pg, node: &str, claim_for: Duration) -> Self {
        FleetTasks { pg, node: node.to_string(), claim_for }
    }

    fn claim_ms(&self) -> f64 {
        self.claim_for.as_millis() as f64
    }

    /// Create task `id` of `key_id` (its state as JSON text), claimed by this node; with an
    /// idempotency key, the task first created with it instead, if any.
    pub async fn create(&self, id: &str, key_id: &str, record: &str, idem: Option<&str>) -> Result<Created, PgError> {
        if let Some(idem) = idem {
            let holder = self.claim_idempotency(key_id, idem, id).await?;
            if holder != id {
                return Ok(Created::Existing(holder));
            }
        }
        self.put(id, key_id, record, true).await?;
        Ok(Created::New)
    }

    /// Write task `id`'s state (`open`: still to be worked on): a new task is created claimed by
    /// this node; an existing one is written, and its claim extended (or dropped once closed),
    /// only while this node holds an unexpired claim on it. Whether it was written.
    pub async fn put(&self, id: &str, key_id: &str, record: &str, open: bool) -> Result<bool, PgError> {
        let client = self.pg.client().await?;
        let n = client
            .execute(
                "INSERT INTO video_tasks (id, key_id, record, open, claimed_by, claim_until)
                 VALUES ($1, $2, $3, $4, CASE WHEN $4 THEN $5 END, CASE WHEN $4 THEN now() + $6 * interval '1 millisecond' END)
                 ON CONFLICT (id) DO UPDATE SET record = EXCLUDED.record, open = EXCLUDED.open, updated_at = now(),
                        claim_until = EXCLUDED.claim_until, claimed_by = EXCLUDED.claimed_by
                 WHERE video_tasks.claimed_by = $5 AND video_tasks.claim_until > now()",
                &[&id, &key_id, &record, &open, &self.node, &self.claim_ms()],
            )
            .await?;
        self.pg.count(1);
        Ok(n == 1)
    }

    /// The open tasks this node holds now, without claiming any: `(id, state)`.
    pub async fn held(&self) -> Result<Vec<(String, String)>, PgError> {
        let client = self.pg.client().await?;
        let rows = client
            .query("SELECT id, record FROM video_tasks WHERE open AND claimed_by = $1 AND claim_until > now()", &[&self.node])
            .await?;
        self.pg.count(1);
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    /// Any task's state (for the node that works on it).
    pub async fn get_any(&self, id: &str) -> Result<Option<String>, PgError> {
        let client = self.pg.client().await?;
        let row = client.query_opt("SELECT record FROM video_tasks WHERE id = $1", &[&id]).await?;
        self.pg.count(1);
        Ok(row.map(|r| r.get(0)))
    }

    /// The most recently updated tasks of every node.
    pub async fn recent_records(&self, limit: usize) -> Result<Vec<String>, PgError> {
        let client = self.pg.client().await?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = client.query("SELECT record FROM video_tasks ORDER BY updated_at DESC LIMIT $1", &[&limit]).await?;
        self.pg.count(1);
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// Tasks of `key_id`, newest first (or oldest, `newest_first: false`), after the task `after`
    /// in that order, at most `limit`.
    pub async fn of_key(&self, key_id: &str, after: Option<&str>, limit: usize, newest_first: bool) -> Result<Vec<String>, PgError> {
        let client = self.pg.client().await?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        // Creation time is in the record; a key's tasks are few enough to order by it.
        let (order, cmp) = if newest_first { ("DESC", "<") } else { ("ASC", ">") };
        let created = "(record::jsonb->>'created_at')::bigint";
        let sql = format!(
            "SELECT record FROM video_tasks t WHERE key_id = $1
               AND ($2::text IS NULL OR ({created}, id) {cmp}
                    (SELECT {created}, id FROM video_tasks WHERE id = $2 AND key_id = $1))
             ORDER BY {created} {order}, id {order} LIMIT $3"
        );
        let rows = client.query(&sql, &[&key_id, &after, &limit]).await?;
        self.pg.count(1);
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// Delete a finished task of `key_id`. Whether there was one.
    pub async fn delete(&self, id: &str, key_id: &str) -> Result<bool, PgError> {
        let client = self.pg.client().await?;
        let n = client.execute("DELETE FROM video_tasks WHERE id = $1 AND key_id = $2 AND NOT open", &[&id, &key_id]).await?;
        self.pg.count(1);
        Ok(n == 1)
    }

    /// Remove a task that never became visible (it lost an idempotency race).
    pub async fn discard(&self, id: &str) -> Result<(), PgError> {
        let client = self.pg.client().await?;
        client.execute("DELETE FROM video_tasks WHERE id = $1 AND claimed_by = $2", &[&id, &self.node]).await?;
        self.pg.count(1);
        Ok(())
    }

    /// The task an idempotency key of `key_id` names, if used within the last 24 hours.
    pub async fn idempotent_task(&self, key_id: &str, idem: &str) -> Result<Option<String>, PgError> {
        let client = self.pg.client().await?;
        let row = client
            .query_opt(
                "SELECT task_id FROM idempotency_keys WHERE key_id = $1 AND idem_key = $2 AND created_at > now() - interval '24 hours'",
                &[&key_id, &idem],
            )
            .await?;
        self.pg.count(1);
        Ok(row.map(|r| r.get(0)))
    }

    /// Claim an idempotency key of `key_id` for `task_id`: the task that holds it, ours or one
    /// created with it within the last 24 hours. Two nodes claiming at once: one wins.
    pub async fn claim_idempotency(&self, key_id: &str, idem: &str, task_id: &str) -> Result<String, PgError> {
        let client = self.pg.client().await?;
        let won = client
            .query_opt(
                "INSERT INTO idempotency_keys (key_id, idem_key, task_id) VALUES ($1, $2, $3)
                 ON CONFLICT (key_id, idem_key) DO UPDATE SET task_id = EXCLUDED.task_id, created_at = now()
                 WHERE idempotency_keys.created_at <= now() - interval '24 hours'
                 RETURNING task_id",
                &[&key_id, &idem, &task_id],
            )
            .await?;
        self.pg.count(1);
        if let Some(row) = won {
            return Ok(row.get(0));
        }
        let holder: String =
            client.query_one("SELECT task_id FROM idempotency_keys WHERE key_id = $1 AND idem_key = $2", &[&key_id, &idem]).await?.get(0);
        self.pg.count(1);
        Ok(holder)
    }

    /// The task's state, for its owner only (another key's task is unknown).
    pub async fn get(&self, id: &str, key_id: &str) -> Result<Option<String>, PgError> {
        let client = self.pg.client().await?;
        let row = client.query_opt("SELECT record FROM video_tasks WHERE id = $1 AND key_id = $2", &[&id, &key_id]).await?;
        self.pg.count(1);
        Ok(row.map(|r| r.get(0)))
    }

    /// Take up to `limit` open tasks that no node holds (their claim lapsed) or that this node
    /// holds already, and (re)claim them for `claim_for`: `(id, state)`.
    pub async fn claim(&self, limit: i64) -> Result<Vec<(String, String)>, PgError> {
        let client = self.pg.client().await?;
        let rows = client
            .query(
                "UPDATE video_tasks SET claimed_by = $1, claim_until = now() + $2 * interval '1 millisecond'
                 WHERE id IN (
                     SELECT id FROM video_tasks
                     WHERE open AND (claim_until IS NULL OR claim_until < now() OR claimed_by = $1)
                     ORDER BY updated_at LIMIT $3
                     FOR UPDATE SKIP LOCKED)
                 RETURNING id, record",
                &[&self.node, &self.claim_ms(), &limit],
            )
            .await?;
        self.pg.count(1);
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }
}

/// Tasks a poller round takes (claims) at most.
const CLAIM_BATCH: i64 = 1000;

fn corrupt(id: &str, e: serde_json::Error) -> crate::store::StoreError {
    crate::store::StoreError::Corrupt(format!("video task {id}: {e}"))
}

/// The fleet's side of the one store interface: tasks as JSON text in `video_tasks`.
#[async_trait::async_trait]
impl crate::store::TaskStore for FleetTasks {
    fn shared(&self) -> bool {
        true
    }

    async fn get(&self, id: &str) -> Result<Option<Task>, crate::store::StoreError> {
        match self.get_any(id).await? {
            Some(text) => serde_json::from_str(&text).map(Some).map_err(|e| corrupt(id, e)),
            None => Ok(None),
        }
    }

    async fn put(&self, task: &Task) -> Result<(), crate::store::StoreError> {
        let text = serde_json::to_string(task).map_err(|e| corrupt(&task.id, e))?;
        let open = !task.status.is_terminal() || task.copy_pending;
        if !FleetTasks::put(self, &task.id, &task.owner, &text, open).await? {
            return Err(crate::store::StoreError::Shared(format!(
                "video task {}: another node holds it now; this write was refused",
                task.id
            )));
        }
        Ok(())
    }

    /// The work list is the claimed tasks themselves: nothing to drop.
    fn drop_open(&self, _id: &str) -> Result<(), crate::store::StoreError> {
        Ok(())
    }

    fn drop_copy(&self, _id: &str) -> Result<(), crate::store::StoreError> {
        Ok(())
    }

    async fn discard(&self, id: &str) -> Result<(), crate::store::StoreError> {
        Ok(FleetTasks::discard(self, id).await?)
    }

    async fn open_ids(&self) -> Result<Vec<String>, crate::store::StoreError> {
        Ok(self.claim(CLAIM_BATCH).await?.into_iter().map(|(id, _)| id).collect())
    }

    async fn open_tasks(&self) -> Result<Vec<Task>, crate::store::StoreError> {
        Ok(self.held().await?.into_iter().filter_map(|(_, text)| serde_json::from_str(&text).ok()).collect())
    }

    async fn recent(&self, limit: usize) -> Result<Vec<Task>, crate::store::StoreError> {
        Ok(self.recent_records(limit).await?.into_iter().filter_map(|text| serde_json::from_str(&text).ok()).collect())
    }

    async fn of_owner(
        &self,
        owner: &str,
        after: Option<&str>,
        limit: usize,
        newest_first: bool,
    ) -> Result<Vec<Task>, crate::store::StoreError> {
        let records = self.of_key(owner, after, limit, newest_first).await?;
        Ok(records.into_iter().filter_map(|text| serde_json::from_str(&text).ok()).collect())
    }

    async fn delete(&self, task: &Task) -> Result<(), crate::store::StoreError> {
        if !FleetTasks::delete(self, &task.id, &task.owner).await? {
            return Err(crate::store::StoreError::Shared(format!("video task {}: not deleted (gone, or still worked on)", task.id)));
        }
        Ok(())
    }

    async fn copy_pending_ids(&self) -> Result<Vec<String>, crate::store::StoreError> {
        let held = self.claim(CLAIM_BATCH).await?;
        Ok(held
            .into_iter()
            .filter(|(_, text)| serde_json::from_str::<Task>(text).is_ok_and(|t| t.copy_pending))
            .map(|(id, _)| id)
            .collect())
    }

    /// The window is the database's (rows expire by its clock), not `now`.
    async fn idempotent_task(&self, owner: &str, key: &str, _now: u64) -> Result<Option<String>, crate::store::StoreError> {
        Ok(FleetTasks::idempotent_task(self, owner, key).await?)
    }

    async fn claim_idempotency(&self, owner: &str, key: &str, task_id: &str, _now: u64) -> Result<String, crate::store::StoreError> {
        Ok(FleetTasks::claim_idempotency(self, owner, key, task_id).await?)
    }
}
