//! The embedded backend: one node, everything in the sled database of `data_dir`.
//!
//! * [`SledDb`]: the open database (opened once, private to its user, handed over whole in an
//!   upgrade).
//! * [`keys::SledKeys`]: tree `keys` and the in-memory index.
//! * [`money::SledMoney`]: trees `balances`, `usage_records` and `response_owners`, with the
//!   in-memory accounts and the group-commit writer.
//! * [`tasks::SledTasks`]: trees `video_tasks`, `video_open`, `video_idem` and
//!   `video_copy_pending`.
//! * [`jobs::SledJobs`]: trees `jobs`, `jobs_open` and `jobs_owner` (batches).
//! * [`cache::SledCache`]: tree `response_cache` (the response cache).
//!
//! [`SledStore`] puts them together as the [`Store`] of one node.

pub mod cache;
pub mod jobs;
pub mod keys;
pub mod money;
pub mod requests;
pub mod tasks;

use super::{DbSlot, JobStore, KeyStore, MoneyStore, Store, StoreError, TaskStore};
use std::path::Path;
use std::sync::Arc;

/// Everything of one node, in its sled database.
pub struct SledStore {
    pub keys: Arc<keys::SledKeys>,
    pub money: Arc<money::SledMoney>,
    pub tasks: Arc<tasks::SledTasks>,
    pub jobs: Arc<jobs::SledJobs>,
    /// The database (the response cache is opened on it when configured).
    slot: DbSlot,
}

impl SledStore {
    /// The store on an open database, bookings committed by `policy`.
    pub fn new(db: impl Into<DbSlot>, policy: crate::config::CommitPolicy) -> Result<SledStore, StoreError> {
        let slot: DbSlot = db.into();
        Ok(SledStore {
            keys: Arc::new(keys::SledKeys::new(&slot)?),
            money: Arc::new(money::SledMoney::open(&slot, policy)?),
            tasks: Arc::new(tasks::SledTasks::new(&slot)?),
            jobs: Arc::new(jobs::SledJobs::new(&slot)?),
            slot,
        })
    }
}

impl Store for SledStore {
    fn backend(&self) -> &'static str {
        "sled"
    }
    fn keys(&self) -> Arc<dyn KeyStore> {
        self.keys.clone()
    }
    fn money(&self) -> Arc<dyn MoneyStore> {
        self.money.clone()
    }
    fn tasks(&self) -> Arc<dyn TaskStore> {
        self.tasks.clone()
    }
    fn jobs(&self) -> Arc<dyn JobStore> {
        self.jobs.clone()
    }
    fn requests(&self) -> Arc<dyn super::RequestLogStore> {
        self.money.clone()
    }
    fn cache(&self, max_bytes: u64) -> Result<Arc<dyn super::CacheStore>, StoreError> {
        Ok(Arc::new(cache::SledCache::open(&self.slot, max_bytes)?))
    }
}

/// The open sled database of `data_dir`.
#[derive(Clone)]
pub struct SledDb {
    slot: DbSlot,
}

/// Make the data directory private to this user before anything is written into it: created
/// 0700, and an existing one (and what it holds) stripped of group and other permissions. The
/// database holds key hashes, balances, usage and video payloads. Files created later are
/// 0600 through the process umask (`server` sets 0077 at start).
pub fn make_private(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    fn tighten(path: &Path, depth: usize) -> std::io::Result<()> {
        let meta = std::fs::symlink_metadata(path)?;
        if meta.file_type().is_symlink() {
            return Ok(());
        }
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & 0o7700))?;
        }
        if meta.is_dir() && depth < 4 {
            for entry in std::fs::read_dir(path)? {
                tighten(&entry?.path(), depth + 1)?;
            }
        }
        Ok(())
    }
    let loose = std::fs::metadata(dir)?.permissions().mode() & 0o077 != 0;
    if loose {
        log::warn!("data_dir {}: was readable by other users; now 0700 (files 0600)", dir.display());
    }
    tighten(dir, 0)
}

impl SledDb {
    pub fn open(dir: &Path) -> Result<SledDb, StoreError> {
        make_private(dir).map_err(|e| StoreError::Db(sled::Error::Io(e)))?;
        let db = sled::Config::new().path(dir).open()?;
        let (journal, _) = crate::store::commit::journal::Journal::open(dir, &db)?;
        Ok(SledDb { slot: DbSlot::with_journal(db, journal) })
    }

    /// Open, retrying while another process (the one being upgraded away) holds the lock.
    pub fn open_waiting(dir: &Path, patience: std::time::Duration) -> Result<SledDb, StoreError> {
        let deadline = std::time::Instant::now() + patience;
        loop {
            match SledDb::open(dir) {
                Ok(s) => return Ok(s),
                Err(StoreError::Db(sled::Error::Io(e))) if std::time::Instant::now() < deadline => {
                    log::debug!("database busy ({e}); waiting for the previous process to hand it over");
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The database slot, for modules with trees of their own.
    pub fn db(&self) -> &DbSlot {
        &self.slot
    }

    pub fn flush(&self) -> Result<(), StoreError> {
        self.slot.db()?.flush()?;
        Ok(())
    }

    pub fn size_on_disk(&self) -> u64 {
        self.slot.db().ok().and_then(|db| db.size_on_disk().ok()).unwrap_or(0)
    }
}
