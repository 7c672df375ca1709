//! Video tasks on one node: `video_tasks` (public id → task), `video_open` (ids of
//! unfinished tasks, the poller's work list), `video_copy_pending` (completed tasks whose copy
//! to object storage is still to be done) and `video_idem` (owner + Idempotency-Key → task id
//! and time), `video_owner` (owner, creation time and id → nothing: a key's tasks in time
//! order, for `GET /v1/videos`). Every write that matters is flushed before it returns.
//!
//! No transaction (see `store::sled::money` on sled transactions): index entries are added
//! before the task and removed after it, so a crash between the writes leaves at worst an
//! index entry whose task says it needs nothing (the poller drops it), never a task the
//! poller misses.

use crate::records::task::Task;
use crate::records::task::{IdempotencyRow, IDEMPOTENCY_WINDOW_SECS};
use crate::store::ForwardTasks;
use crate::store::{DbSlot, Durable, StoreError, TaskStore};
use serde::{Deserialize, Serialize};
use std::sync::{Arc, OnceLock};

pub struct SledTasks {
    slot: DbSlot,
    durable: Durable,
    /// Where task writes go once the database was handed over (upgrade); injected at start.
    handover: OnceLock<Arc<dyn ForwardTasks>>,
}

#[derive(Serialize, Deserialize)]
struct IdemEntry {
    task_id: String,
    at: u64,
}

fn corrupt(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("{what}: {e}"))
}

fn idem_key(owner: &str, key: &str) -> Vec<u8> {
    let mut k = owner.as_bytes().to_vec();
    k.push(0);
    k.extend_from_slice(key.as_bytes());
    k
}

/// A task's entry in `video_owner`: its owner, a 0, its creation time (big-endian), its id.
fn owner_key(task: &Task) -> Vec<u8> {
    let mut k = owner_prefix(&task.owner);
    k.extend_from_slice(&task.created_at.to_be_bytes());
    k.extend_from_slice(task.id.as_bytes());
    k
}

fn owner_prefix(owner: &str) -> Vec<u8> {
    let mut k = owner.as_bytes().to_vec();
    k.push(0);
    k
}

fn ids(tree: &sled::Tree) -> Result<Vec<String>, StoreError> {
    tree.iter().keys().map(|k| k.map_err(StoreError::Db).map(|k| String::from_utf8_lossy(&k).into_owned())).collect()
}

impl SledTasks {
    pub fn new(db: impl Into<DbSlot>) -> Result<Self, StoreError> {
        let slot: DbSlot = db.into();
        for name in ["video_tasks", "video_open", "video_idem", "video_copy_pending", "video_owner"] {
            slot.tree(name)?;
        }
        let store = SledTasks { durable: Durable::new(&slot), slot, handover: OnceLock::new() };
        store.index_owners()?;
        Ok(store)
    }

    fn owners(&self) -> Result<sled::Tree, StoreError> {
        self.slot.tree("video_owner")
    }

    /// Tasks written before the owner index existed are indexed once, when it is still empty.
    fn index_owners(&self) -> Result<(), StoreError> {
        let (tasks, owners) = (self.tasks()?, self.owners()?);
        if !owners.is_empty() || tasks.is_empty() {
            return Ok(());
        }
        for item in tasks.iter() {
            let (k, v) = item?;
            match serde_json::from_slice::<Task>(&v) {
                Ok(task) => {
                    owners.insert(owner_key(&task), &[])?;
                }
                Err(e) => log::warn!("video: task {} is unreadable and left out of its owner's list: {e}", String::from_utf8_lossy(&k)),
            }
        }
        owners.flush()?;
        Ok(())
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

    /// Every task and every idempotency key `(owner, key, task id, unix time)` (`store copy`).
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
}

#[async_trait::async_trait]
impl TaskStore for SledTasks {
    fn shared(&self) -> bool {
        false
    }

    async fn get(&self, id: &str) -> Result<Option<Task>, StoreError> {
        match self.tasks()?.get(id.as_bytes())? {
            Some(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| corrupt(id, e)),
            None => Ok(None),
        }
    }

    async fn put(&self, task: &Task) -> Result<(), StoreError> {
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
        self.owners()?.insert(owner_key(task), &[])?;
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

    fn drop_open(&self, id: &str) -> Result<(), StoreError> {
        self.open_tree()?.remove(id.as_bytes())?;
        Ok(())
    }

    fn drop_copy(&self, id: &str) -> Result<(), StoreError> {
        self.copies()?.remove(id.as_bytes())?;
        Ok(())
    }

    async fn discard(&self, id: &str) -> Result<(), StoreError> {
        if let Some(task) = self.get(id).await? {
            self.owners()?.remove(owner_key(&task))?;
        }
        self.tasks()?.remove(id.as_bytes())?;
        self.open_tree()?.remove(id.as_bytes())?;
        self.durable.flush().await?;
        Ok(())
    }

    async fn of_owner(&self, owner: &str, after: Option<&str>, limit: usize, newest_first: bool) -> Result<Vec<Task>, StoreError> {
        let owners = self.owners()?;
        let prefix = owner_prefix(owner);
        let mut end = prefix.clone();
        end.push(0xff);
        let bound = match after {
            Some(id) => match self.get(id).await? {
                Some(t) if t.owner == owner => Some(owner_key(&t)),
                // Not a task of this key: an empty page, as for a cursor past the end.
                _ => return Ok(Vec::new()),
            },
            None => None,
        };
        use std::ops::Bound::{Excluded, Included};
        let range = match (&bound, newest_first) {
            (Some(b), true) => owners.range::<&[u8], _>((Included(prefix.as_slice()), Excluded(b.as_slice()))),
            (Some(b), false) => owners.range::<&[u8], _>((Excluded(b.as_slice()), Excluded(end.as_slice()))),
            (None, _) => owners.range::<&[u8], _>((Included(prefix.as_slice()), Excluded(end.as_slice()))),
        };
        let keys: Box<dyn Iterator<Item = sled::Result<(sled::IVec, sled::IVec)>> + Send> =
            if newest_first { Box::new(range.rev()) } else { Box::new(range) };
        let mut ids = Vec::with_capacity(limit.min(100));
        for item in keys {
            let (k, _) = item?;
            if !k.starts_with(&prefix) || ids.len() >= limit {
                break;
            }
            ids.push(String::from_utf8_lossy(&k[prefix.len() + 8..]).into_owned());
        }
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(task) = self.get(&id).await? {
                out.push(task);
            }
        }
        Ok(out)
    }

    async fn delete(&self, task: &Task) -> Result<(), StoreError> {
        if self.slot.is_released() {
            return Err(StoreError::Released);
        }
        self.owners()?.remove(owner_key(task))?;
        self.tasks()?.remove(task.id.as_bytes())?;
        self.open_tree()?.remove(task.id.as_bytes())?;
        self.copies()?.remove(task.id.as_bytes())?;
        self.durable.flush().await?;
        Ok(())
    }

    async fn open_ids(&self) -> Result<Vec<String>, StoreError> {
        ids(&self.open_tree()?)
    }

    async fn open_tasks(&self) -> Result<Vec<Task>, StoreError> {
        let mut out = Vec::new();
        for id in ids(&self.open_tree()?)? {
            if let Some(task) = self.get(&id).await? {
                out.push(task);
            }
        }
        Ok(out)
    }

    /// Ids are random, not ordered by time: every task is read (the console's list, not a
    /// request path).
    async fn recent(&self, limit: usize) -> Result<Vec<Task>, StoreError> {
        let mut all = Vec::new();
        for item in self.tasks()?.iter() {
            let (_, v) = item?;
            match serde_json::from_slice::<Task>(&v) {
                Ok(task) => all.push(task),
                Err(e) => log::warn!("video: an unreadable task is left out of the list: {e}"),
            }
        }
        all.sort_by_key(|t| std::cmp::Reverse(t.updated_at));
        all.truncate(limit);
        Ok(all)
    }

    async fn copy_pending_ids(&self) -> Result<Vec<String>, StoreError> {
        ids(&self.copies()?)
    }

    async fn idempotent_task(&self, owner: &str, key: &str, now: u64) -> Result<Option<String>, StoreError> {
        let Some(bytes) = self.idem()?.get(idem_key(owner, key))? else { return Ok(None) };
        let entry: IdemEntry = serde_json::from_slice(&bytes).map_err(|e| corrupt("idempotency entry", e))?;
        Ok((now.saturating_sub(entry.at) < IDEMPOTENCY_WINDOW_SECS).then_some(entry.task_id))
    }

    async fn claim_idempotency(&self, owner: &str, key: &str, task_id: &str, now: u64) -> Result<String, StoreError> {
        let k = idem_key(owner, key);
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

    fn set_handover(&self, to: Arc<dyn ForwardTasks>) {
        let _ = self.handover.set(to);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::task::{tests::task, Status};

    #[tokio::test]
    async fn open_index_follows_status_and_survives_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let db = sled::open(dir.path()).expect("open");
            let s = SledTasks::new(&db).expect("store");
            let mut t = task();
            s.put(&t).await.expect("put");
            assert_eq!(s.open_ids().await.expect("ids"), vec!["task_x".to_string()]);
            t.status = Status::Completed;
            s.put(&t).await.expect("put");
            assert!(s.open_ids().await.expect("ids").is_empty());
        }
        let db = crate::store::db::reopen(dir.path());
        let s = SledTasks::new(&db).expect("store");
        assert_eq!(s.get("task_x").await.expect("get").map(|t| t.status), Some(Status::Completed));
    }

    #[tokio::test]
    async fn a_keys_tasks_are_listed_newest_first_paged_deleted_and_indexed_after_an_upgrade() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("open");
        let s = SledTasks::new(&db).expect("store");
        let made = |id: &str, owner: &str, at: u64| Task { id: id.into(), owner: owner.into(), created_at: at, ..task() };
        for (id, owner, at) in [("t_a", "k1", 10), ("t_b", "k1", 30), ("t_c", "k2", 20), ("t_d", "k1", 20), ("t_e", "k10", 5)] {
            s.put(&made(id, owner, at)).await.expect("put");
        }
        let ids = |tasks: Vec<Task>| tasks.into_iter().map(|t| t.id).collect::<Vec<_>>();
        assert_eq!(ids(s.of_owner("k1", None, 10, true).await.expect("list")), ["t_b", "t_d", "t_a"]);
        assert_eq!(ids(s.of_owner("k1", None, 2, true).await.expect("list")), ["t_b", "t_d"]);
        assert_eq!(ids(s.of_owner("k1", Some("t_d"), 2, true).await.expect("list")), ["t_a"]);
        assert_eq!(ids(s.of_owner("k1", None, 10, false).await.expect("list")), ["t_a", "t_d", "t_b"]);
        assert_eq!(ids(s.of_owner("k1", Some("t_a"), 10, false).await.expect("list")), ["t_d", "t_b"]);
        // Another key's task is no cursor.
        assert!(s.of_owner("k1", Some("t_c"), 10, true).await.expect("list").is_empty());
        s.delete(&made("t_d", "k1", 20)).await.expect("delete");
        assert_eq!(ids(s.of_owner("k1", None, 10, true).await.expect("list")), ["t_b", "t_a"]);
        assert!(s.get("t_d").await.expect("get").is_none());
        // A database from before the index: indexed when opened.
        s.owners().expect("tree").clear().expect("clear");
        drop(s);
        let s = SledTasks::new(&db).expect("store");
        assert_eq!(ids(s.of_owner("k1", None, 10, true).await.expect("list")), ["t_b", "t_a"]);
        assert_eq!(ids(s.of_owner("k2", None, 10, true).await.expect("list")), ["t_c"]);
    }

    #[tokio::test]
    async fn idempotency_claims_are_first_wins_within_the_window() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("open");
        let s = SledTasks::new(&db).expect("store");
        assert_eq!(s.claim_idempotency("k1", "abc", "task_1", 1000).await.expect("claim"), "task_1");
        assert_eq!(s.claim_idempotency("k1", "abc", "task_2", 1001).await.expect("claim"), "task_1");
        assert_eq!(s.claim_idempotency("k2", "abc", "task_3", 1001).await.expect("claim"), "task_3", "per key");
        assert_eq!(s.idempotent_task("k1", "abc", 1002).await.expect("get"), Some("task_1".into()));
        let later = 1000 + IDEMPOTENCY_WINDOW_SECS;
        assert_eq!(s.idempotent_task("k1", "abc", later).await.expect("get"), None);
        assert_eq!(s.claim_idempotency("k1", "abc", "task_4", later).await.expect("claim"), "task_4");
    }
}
