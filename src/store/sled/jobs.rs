//! Jobs on one node (batches): `jobs` (id → state as JSON), `jobs_open` (kind, 0, id → nothing:
//! the poller's work list) and `jobs_owner` (kind, 0, owner, 0, creation time big-endian, id →
//! nothing: a key's jobs in time order). Each write is flushed before it returns; index entries
//! are added before the job and removed after it, as for video tasks (`sled::tasks`).

use crate::store::{DbSlot, Durable, JobRow, JobStore, StoreError};

pub struct SledJobs {
    slot: DbSlot,
    durable: Durable,
}

fn prefix(parts: &[&str]) -> Vec<u8> {
    let mut k = Vec::new();
    for p in parts {
        k.extend_from_slice(p.as_bytes());
        k.push(0);
    }
    k
}

fn owner_key(row: &JobRow) -> Vec<u8> {
    let mut k = prefix(&[row.kind, &row.owner]);
    k.extend_from_slice(&row.created_at.to_be_bytes());
    k.extend_from_slice(row.id.as_bytes());
    k
}

impl SledJobs {
    pub fn new(db: impl Into<DbSlot>) -> Result<Self, StoreError> {
        let slot: DbSlot = db.into();
        for name in ["jobs", "jobs_open", "jobs_owner"] {
            slot.tree(name)?;
        }
        Ok(SledJobs { durable: Durable::new(&slot), slot })
    }

    fn text(bytes: &[u8], id: &str) -> Result<String, StoreError> {
        String::from_utf8(bytes.to_vec()).map_err(|e| StoreError::Corrupt(format!("job {id}: {e}")))
    }
}

#[async_trait::async_trait]
impl JobStore for SledJobs {
    fn shared(&self) -> bool {
        false
    }

    async fn get(&self, id: &str) -> Result<Option<String>, StoreError> {
        match self.slot.tree("jobs")?.get(id.as_bytes())? {
            Some(bytes) => Self::text(&bytes, id).map(Some),
            None => Ok(None),
        }
    }

    async fn put(&self, row: &JobRow) -> Result<(), StoreError> {
        if self.slot.is_released() {
            return Err(StoreError::Released);
        }
        let (jobs, open) = (self.slot.tree("jobs")?, self.slot.tree("jobs_open")?);
        let mut open_key = prefix(&[row.kind]);
        open_key.extend_from_slice(row.id.as_bytes());
        if row.open {
            open.insert(open_key.as_slice(), &[])?;
        }
        self.slot.tree("jobs_owner")?.insert(owner_key(row), &[])?;
        jobs.insert(row.id.as_bytes(), row.record.as_bytes())?;
        if !row.open {
            open.remove(open_key.as_slice())?;
        }
        self.durable.flush().await
    }

    async fn open(&self, kind: &'static str) -> Result<Vec<String>, StoreError> {
        let open = self.slot.tree("jobs_open")?;
        let head = prefix(&[kind]);
        let mut out = Vec::new();
        for item in open.scan_prefix(&head) {
            let (k, _) = item?;
            let id = String::from_utf8_lossy(&k[head.len()..]).into_owned();
            match self.get(&id).await? {
                Some(text) => out.push(text),
                // Its job is gone: an index entry left by a crash.
                None => {
                    open.remove(&k)?;
                }
            }
        }
        Ok(out)
    }

    async fn prune_closed(&self, kind: &'static str, created_before: u64, max: usize) -> Result<usize, StoreError> {
        if self.slot.is_released() {
            return Err(StoreError::Released);
        }
        let (jobs, open, owners) = (self.slot.tree("jobs")?, self.slot.tree("jobs_open")?, self.slot.tree("jobs_owner")?);
        let head = prefix(&[kind]);
        let mut pruned = 0;
        for item in owners.scan_prefix(&head) {
            if pruned >= max {
                break;
            }
            let (k, _) = item?;
            // kind \0 owner \0 created (8 bytes) id
            let Some(owner_end) = k[head.len()..].iter().position(|b| *b == 0).map(|p| head.len() + p + 1) else { continue };
            let Some(created) = k.get(owner_end..owner_end + 8).and_then(|b| b.try_into().ok()).map(u64::from_be_bytes) else { continue };
            if created >= created_before {
                continue;
            }
            let id = &k[owner_end + 8..];
            let mut open_key = head.clone();
            open_key.extend_from_slice(id);
            if open.contains_key(&open_key)? {
                continue;
            }
            // The job before its index entry: a crash between the two leaves an entry that
            // names nothing (skipped by the listings) rather than a job nothing lists.
            jobs.remove(id)?;
            owners.remove(&k)?;
            pruned += 1;
        }
        if pruned > 0 {
            self.durable.flush().await?;
        }
        Ok(pruned)
    }

    async fn of_owner(&self, kind: &'static str, owner: &str, after: Option<&str>, limit: usize) -> Result<Vec<String>, StoreError> {
        let owners = self.slot.tree("jobs_owner")?;
        let head = prefix(&[kind, owner]);
        let mut end = head.clone();
        end.push(0xff);
        let upper = match after {
            Some(id) => {
                // The cursor's entry: the one of this owner whose id it is.
                let found = owners
                    .scan_prefix(&head)
                    .keys()
                    .filter_map(Result::ok)
                    .find(|k| k.len() > head.len() + 8 && &k[head.len() + 8..] == id.as_bytes());
                match found {
                    Some(k) => k.to_vec(),
                    None => return Ok(Vec::new()),
                }
            }
            None => end,
        };
        let mut out = Vec::new();
        for item in owners.range(head.clone()..upper).rev() {
            if out.len() >= limit {
                break;
            }
            let (k, _) = item?;
            let id = String::from_utf8_lossy(&k[head.len() + 8..]).into_owned();
            if let Some(text) = self.get(&id).await? {
                out.push(text);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, owner: &str, at: u64, open: bool) -> JobRow {
        JobRow {
            kind: "batch",
            id: id.into(),
            owner: owner.into(),
            created_at: at,
            open,
            record: format!("{{\"id\":\"{id}\",\"open\":{open}}}"),
        }
    }

    #[tokio::test]
    async fn jobs_are_kept_listed_per_owner_newest_first_and_leave_the_work_list_once_closed() {
        let dir = tempfile::tempdir().expect("dir");
        let jobs = SledJobs::new(DbSlot::new(sled::open(dir.path()).expect("db"))).expect("jobs");
        for (id, owner, at) in [("b1", "k1", 10), ("b2", "k1", 20), ("b3", "k2", 15), ("b4", "k1", 30)] {
            jobs.put(&row(id, owner, at, true)).await.expect("put");
        }
        jobs.put(&row("b2", "k1", 20, false)).await.expect("close");
        let mut open = jobs.open("batch").await.expect("open");
        open.sort();
        assert_eq!(open.len(), 3);
        assert!(open.iter().all(|t| !t.contains("\"b2\"")), "{open:?}");
        assert!(jobs.open("other").await.expect("open").is_empty());
        let ids = |texts: Vec<String>| texts.iter().map(|t| t[7..9].to_string()).collect::<Vec<_>>();
        assert_eq!(ids(jobs.of_owner("batch", "k1", None, 10).await.expect("list")), ["b4", "b2", "b1"]);
        assert_eq!(ids(jobs.of_owner("batch", "k1", None, 2).await.expect("list")), ["b4", "b2"]);
        assert_eq!(ids(jobs.of_owner("batch", "k1", Some("b2"), 10).await.expect("list")), ["b1"]);
        assert!(jobs.of_owner("batch", "k1", Some("b3"), 10).await.expect("list").is_empty(), "another key's cursor");
        assert_eq!(ids(jobs.of_owner("batch", "k2", None, 10).await.expect("list")), ["b3"]);
        assert_eq!(jobs.get("b2").await.expect("get").as_deref(), Some("{\"id\":\"b2\",\"open\":false}"));
        // Closed and old enough: forgotten; open, or newer, or another kind's: kept.
        jobs.put(&row("b1", "k1", 10, false)).await.expect("close");
        assert_eq!(jobs.prune_closed("other", 100, 10).await.expect("prune"), 0);
        assert_eq!(jobs.prune_closed("batch", 15, 10).await.expect("prune"), 1, "b1 only (b2 is newer)");
        assert_eq!(jobs.get("b1").await.expect("get"), None);
        assert_eq!(ids(jobs.of_owner("batch", "k1", None, 10).await.expect("list")), ["b4", "b2"]);
        assert_eq!(jobs.prune_closed("batch", 100, 10).await.expect("prune"), 1, "b2; b3 and b4 are open");
        assert_eq!(jobs.open("batch").await.expect("open").len(), 2);
    }
}
