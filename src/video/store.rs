//! Video task persistence. On one node, in sled: `video_tasks` (public id → task),
//! `video_open` (ids of unfinished tasks, the poller's work list) and `video_idem` (owner +
//! Idempotency-Key → task id and time); every write that matters is flushed before it
//! returns. In a fleet, in the shared database (`store::postgres::tasks`): every node reads
//! every task, the poller's work list is the tasks this node holds the claim of, and every
//! write is fenced by that claim.

use super::task::Task;
use crate::store::StoreError;
use serde::{Deserialize, Serialize};

/// How long an Idempotency-Key keeps returning the same task.
pub const IDEMPOTENCY_WINDOW_SECS: u64 = 24 * 3600;

#[derive(Clone)]
pub struct VideoStore {
    slot: crate::store::DbSlot,
    durable: std::sync::Arc<crate::store::Durable>,
    /// Where task writes go once the database was handed over (upgrade); injected at start.
    handover: std::sync::Arc<std::sync::OnceLock<std::sync::Arc<dyn ForwardTasks>>>,
    /// In a fleet, tasks live in the shared database.
    fleet: Option<std::sync::Arc<crate::store::fleet::Fleet>>,
}

/// Tasks a poller round takes (claims) at most.
const CLAIM_BATCH: i64 = 1000;

/// Writes a task in the process that has the database now (after an upgrade hand-over);
/// returns once it is durable there. Implemented by `handover`.
#[async_trait::async_trait]
pub trait ForwardTasks: Send + Sync {
    async fn forward_task(&self, task: &Task) -> Result<(), StoreError>;
}

/// An idempotency key as `store copy` moves it: (key id, idempotency key, task id, unix time).
pub type IdempotencyRow = (String, String, String, u64);

#[derive(Serialize, Deserialize)]
struct IdemEntry {
    task_id: String,
    at: u64,
}

fn corrupt(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("{what}: {e}"))
}

impl VideoStore {
    /// Tasks in the fleet's database when `fleet` is given, else in sled.
    pub fn with_fleet(mut self, fleet: Option<std::sync::Arc<crate::store::fleet::Fleet>>) -> Self {
        self.fleet = fleet;
        self
    }

    /// Whether tasks are shared with other nodes.
    pub fn shared(&self) -> bool {
        self.fleet.is_some()
    }

    pub fn new(db: impl Into<crate::store::DbSlot>) -> Result<Self, StoreError> {
        let slot: crate::store::DbSlot = db.into();
        for name in ["video_tasks", "video_open", "video_idem", "video_copy_pending"] {
            slot.tree(name)?;
        }
        Ok(VideoStore {
            durable: std::sync::Arc::new(crate::store::Durable::new(&slot)),
            slot,
            handover: std::sync::Arc::new(std::sync::OnceLock::new()),
            fleet: None,
        })
    }

    pub fn set_handover(&self, to: std::sync::Arc<dyn ForwardTasks>) {
        let _ = self.handover.set(to);
    }

    fn tasks(&self) -> Result<sled::Tree, StoreError> {
        self.slot.tree("video_tasks")
    }
    fn open_tree(&self) -> Result<sled::Tree, StoreError> {
        self.slot.tree("video_open")
    }
    fn idem(&self) -> Result<sled::Tree, StoreError> {
        self.slot.tree("video_idem")
    }
    fn copies(&self) -> Result<sled::Tree, StoreError> {
        self.slot.tree("video_copy_pending")
    }

    pub async fn get(&self, id: &str) -> Result<Option<Task>, StoreError> {
        if let Some(fleet) = &self.fleet {
            return match fleet.tasks.get_any(id).await? {
                Some(text) => serde_json::from_str(&text).map(Some).map_err(|e| corrupt(id, e)),
                None => Ok(None),
            };
        }
        match self.tasks()?.get(id.as_bytes())? {
            Some(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| corrupt(id, e)),
            None => Ok(None),
        }
    }

    /// Write the task and its index entries, then flush to disk.
    ///
    /// No transaction (see `ledger` on sled transactions): index entries are added before the
    /// task and removed after it, so a crash between the writes leaves at worst an index entry
    /// whose task says it needs nothing (the poller drops it), never a task the poller misses.
    pub async fn put(&self, task: &Task) -> Result<(), StoreError> {
        if let Some(fleet) = &self.fleet {
            let text = serde_json::to_string(task).map_err(|e| corrupt(&task.id, e))?;
            let open = !task.status.is_terminal() || task.copy_pending;
            if !fleet.tasks.put(&task.id, &task.owner, &text, open).await? {
                return Err(StoreError::Shared(format!("video task {}: another node holds it now; this write was refused", task.id)));
            }
            return Ok(());
        }
        if self.slot.is_released() {
            return self.handover.get().ok_or(StoreError::Released)?.forward_task(task).await;
        }
        let value = serde_json::to_vec(task).map_err(|e| corrupt(&task.id, e))?;
        let id = task.id.as_bytes();
        let open = !task.status.is_terminal();
        let (tasks, open_tree, copies) = (self.tasks()?, self.open_tree()?, self.copies()?);
        if open {
            open_tree.insert(id, &[])?;
        }
        if task.copy_pending {
            copies.insert(id, &[])?;
        }
        tasks.insert(id, value)?;
        if !open {
            open_tree.remove(id)?;
        }
        if !task.copy_pending {
            copies.remove(id)?;
        }
        self.durable.flush().await?;
        Ok(())
    }

    /// Drop an open-index entry whose task is finished or gone (after a crash between writes).
    pub fn drop_open(&self, id: &str) -> Result<(), StoreError> {
        if self.fleet.is_some() {
            return Ok(());
        }
        self.open_tree()?.remove(id.as_bytes())?;
        Ok(())
    }

    /// Drop a copy-index entry whose task needs no copy or is gone.
    pub fn drop_copy(&self, id: &str) -> Result<(), StoreError> {
        if self.fleet.is_some() {
            return Ok(());
        }
        self.copies()?.remove(id.as_bytes())?;
        Ok(())
    }

    /// Remove a task that never became visible (lost an idempotency race).
    pub async fn discard(&self, id: &str) -> Result<(), StoreError> {
        if let Some(fleet) = &self.fleet {
            return Ok(fleet.tasks.discard(id).await?);
        }
        self.tasks()?.remove(id.as_bytes())?;
        self.open_tree()?.remove(id.as_bytes())?;
        self.durable.flush().await?;
        Ok(())
    }

    /// Ids of unfinished tasks (in a fleet: those this node holds, claiming the ones whose
    /// claim lapsed — a dead node's).
    pub async fn open_ids(&self) -> Result<Vec<String>, StoreError> {
        if let Some(fleet) = &self.fleet {
            return Ok(fleet.tasks.claim(CLAIM_BATCH).await?.into_iter().map(|(id, _)| id).collect());
        }
        Self::ids(&self.open_tree()?)
    }

    /// Unfinished tasks, for metrics (in a fleet: those this node holds; nothing is claimed).
    pub async fn open_tasks(&self) -> Result<Vec<Task>, StoreError> {
        if let Some(fleet) = &self.fleet {
            return Ok(fleet.tasks.held().await?.into_iter().filter_map(|(_, text)| serde_json::from_str(&text).ok()).collect());
        }
        let mut out = Vec::new();
        for id in Self::ids(&self.open_tree()?)? {
            if let Some(task) = self.get(&id).await? {
                out.push(task);
            }
        }
        Ok(out)
    }

    /// Ids of completed tasks whose copy to object storage is still to be done (in a fleet:
    /// of those this node holds).
    pub async fn copy_pending_ids(&self) -> Result<Vec<String>, StoreError> {
        if let Some(fleet) = &self.fleet {
            let held = fleet.tasks.claim(CLAIM_BATCH).await?;
            return Ok(held
                .into_iter()
                .filter(|(_, text)| serde_json::from_str::<Task>(text).is_ok_and(|t| t.copy_pending))
                .map(|(id, _)| id)
                .collect());
        }
        Self::ids(&self.copies()?)
    }

    fn ids(tree: &sled::Tree) -> Result<Vec<String>, StoreError> {
        tree.iter().keys().map(|k| k.map_err(StoreError::Db).map(|k| String::from_utf8_lossy(&k).into_owned())).collect()
    }

    /// Every task and every idempotency key `(owner, key, task id, unix time)` of the sled
    /// store (`store copy`).
    pub fn export(&self) -> Result<(Vec<Task>, Vec<IdempotencyRow>), StoreError> {
        let mut tasks = Vec::new();
        for item in self.tasks()?.iter() {
            let (k, v) = item?;
            tasks.push(serde_json::from_slice(&v).map_err(|e| corrupt(&String::from_utf8_lossy(&k), e))?);
        }
        let mut idem = Vec::new();
        for item in self.idem()?.iter() {
            let (k, v) = item?;
            let entry: IdemEntry = serde_json::from_slice(&v).map_err(|e| corrupt("idempotency entry", e))?;
            let mut parts = k.splitn(2, |b| *b == 0);
            let owner = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
            let key = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
            idem.push((owner, key, entry.task_id, entry.at));
        }
        Ok((tasks, idem))
    }

    fn idem_key(owner: &str, key: &str) -> Vec<u8> {
        let mut k = owner.as_bytes().to_vec();
        k.push(0);
        k.extend_from_slice(key.as_bytes());
        k
    }

    /// The task an Idempotency-Key already names (within the window), if any.
    pub async fn idempotent_task(&self, owner: &str, key: &str, now: u64) -> Result<Option<String>, StoreError> {
        if let Some(fleet) = &self.fleet {
            return Ok(fleet.tasks.idempotent_task(owner, key).await?);
        }
        let Some(bytes) = self.idem()?.get(Self::idem_key(owner, key))? else { return Ok(None) };
        let entry: IdemEntry = serde_json::from_slice(&bytes).map_err(|e| corrupt("idempotency entry", e))?;
        Ok((now.saturating_sub(entry.at) < IDEMPOTENCY_WINDOW_SECS).then_some(entry.task_id))
    }

    /// Claim `key` for `task_id`. Returns the task id that holds it: ours, or an earlier one.
    pub async fn claim_idempotency(&self, owner: &str, key: &str, task_id: &str, now: u64) -> Result<String, StoreError> {
        if let Some(fleet) = &self.fleet {
            return Ok(fleet.tasks.claim_idempotency(owner, key, task_id).await?);
        }
        let k = Self::idem_key(owner, key);
        let ours = serde_json::to_vec(&IdemEntry { task_id: task_id.to_string(), at: now }).map_err(|e| corrupt("idem", e))?;
        let idem = self.idem()?;
        loop {
            let current = idem.get(&k)?;
            if let Some(bytes) = &current {
                let entry: IdemEntry = serde_json::from_slice(bytes).map_err(|e| corrupt("idempotency entry", e))?;
                if now.saturating_sub(entry.at) < IDEMPOTENCY_WINDOW_SECS {
                    return Ok(entry.task_id);
                }
            }
            if idem.compare_and_swap(&k, current, Some(ours.clone()))?.is_ok() {
                self.durable.flush().await?;
                return Ok(task_id.to_string());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::video::task::{tests::task, Status};

    #[tokio::test]
    async fn open_index_follows_status_and_survives_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let db = sled::open(dir.path()).expect("open");
            let s = VideoStore::new(&db).expect("store");
            let mut t = task();
            s.put(&t).await.expect("put");
            assert_eq!(s.open_ids().await.expect("ids"), vec!["task_x".to_string()]);
            t.status = Status::Completed;
            s.put(&t).await.expect("put");
            assert!(s.open_ids().await.expect("ids").is_empty());
        }
        let db = crate::store::reopen(dir.path());
        let s = VideoStore::new(&db).expect("store");
        assert_eq!(s.get("task_x").await.expect("get").map(|t| t.status), Some(Status::Completed));
    }

    #[tokio::test]
    async fn idempotency_claims_are_first_wins_within_the_window() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("open");
        let s = VideoStore::new(&db).expect("store");
        assert_eq!(s.claim_idempotency("k1", "abc", "task_1", 1000).await.expect("claim"), "task_1");
        assert_eq!(s.claim_idempotency("k1", "abc", "task_2", 1001).await.expect("claim"), "task_1");
        assert_eq!(s.claim_idempotency("k2", "abc", "task_3", 1001).await.expect("claim"), "task_3", "per key");
        assert_eq!(s.idempotent_task("k1", "abc", 1002).await.expect("get"), Some("task_1".into()));
        let later = 1000 + IDEMPOTENCY_WINDOW_SECS;
        assert_eq!(s.idempotent_task("k1", "abc", later).await.expect("get"), None);
        assert_eq!(s.claim_idempotency("k1", "abc", "task_4", later).await.expect("claim"), "task_4");
    }
}
