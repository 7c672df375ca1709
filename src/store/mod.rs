//! The store. A single node keeps everything in the sled database here (one file lock, opened
//! once, trees by concern). A node of a fleet (`store.postgres`) keeps keys, money, limits,
//! usage records, response owners and video tasks in [`postgres`], shared by every node, and
//! only its journal in sled; [`fleet`] puts the two together, and the ledger, key index, limits
//! and video store each pick their backend from it. [`copy`] moves data between the two.
//!
//! `keys`: key id → [`KeyRecord`] (JSON). Secrets are never stored, only their SHA-256.
//! Balances live in the ledger's tree, not in the key record.

pub mod copy;
pub mod fleet;
pub mod postgres;

use arc_swap::ArcSwapOption;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::Path;
use std::sync::Arc;

/// One API key as persisted.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct KeyRecord {
    pub id: String,
    pub name: String,
    pub group: String,
    /// Hex SHA-256 of the secret.
    pub key_hash: String,
    #[serde(default)]
    pub rpm: Option<u32>,
    #[serde(default)]
    pub tpm: Option<u64>,
    pub enabled: bool,
    pub created_at: u64,
    /// Requests of this key in flight at once (None: no cap).
    #[serde(default)]
    pub max_concurrent: Option<u32>,
    /// Where the key comes from: the configuration file or the admin API.
    #[serde(default)]
    pub origin: KeyOrigin,
    /// For a key from the file: a digest of the file entry last applied. While the entry is
    /// unchanged, changes made through the admin API stand; None once the file dropped the key.
    #[serde(default)]
    pub seed_digest: Option<String>,
}

/// Where a key record comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyOrigin {
    /// Written before origins were recorded: the file never disables it.
    #[default]
    Unknown,
    /// Seeded from `keys:` in the configuration file.
    Config,
    /// Created through the admin API; the file never changes it.
    Admin,
}

#[derive(Debug, Clone)]
pub enum StoreError {
    Db(sled::Error),
    Corrupt(String),
    /// The database was handed over to the process that replaces this one.
    Released,
    /// The shared database (PostgreSQL) failed or cannot be reached.
    Shared(String),
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Db(e) => write!(f, "database error: {e}"),
            StoreError::Corrupt(what) => write!(f, "database record is unreadable: {what}"),
            StoreError::Released => write!(f, "the database was handed over to the new process"),
            StoreError::Shared(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for StoreError {}

impl From<sled::Error> for StoreError {
    fn from(e: sled::Error) -> Self {
        StoreError::Db(e)
    }
}

/// The one open database, shared by every module, which can be let go of as a whole: the old
/// process of an upgrade releases it so the new one can open it (sled holds an exclusive file
/// lock). Modules reach their trees through it per operation and never keep a tree.
#[derive(Clone)]
pub struct DbSlot(Arc<ArcSwapOption<sled::Db>>);

impl DbSlot {
    pub fn new(db: sled::Db) -> Self {
        DbSlot(Arc::new(ArcSwapOption::from_pointee(db)))
    }

    pub fn db(&self) -> Result<sled::Db, StoreError> {
        self.0.load_full().map(|db| (*db).clone()).ok_or(StoreError::Released)
    }

    pub fn tree(&self, name: &str) -> Result<sled::Tree, StoreError> {
        Ok(self.db()?.open_tree(name)?)
    }

    /// Let go of the database: once operations in progress finish, sled closes and its lock
    /// is free. Later operations answer `StoreError::Released`.
    pub fn release(&self) {
        self.0.store(None);
    }

    pub fn is_released(&self) -> bool {
        self.0.load().is_none()
    }
}

impl From<&sled::Db> for DbSlot {
    fn from(db: &sled::Db) -> Self {
        DbSlot::new(db.clone())
    }
}

impl From<&DbSlot> for DbSlot {
    fn from(slot: &DbSlot) -> Self {
        slot.clone()
    }
}

/// Group commit: makes writes durable with at most one `flush` in flight per instance, run on
/// a blocking thread. Calling sled's `flush_async` from many tasks at once starves sled's own
/// thread pool (every pool thread waits in a flush for IO that needs a pool thread) and the
/// process hangs; this was seen under load.
pub struct Durable {
    db: DbSlot,
    /// Writes announced so far (a write takes a ticket after it is applied).
    written: std::sync::atomic::AtomicU64,
    /// Every ticket below this is on disk.
    flushed: std::sync::atomic::AtomicU64,
    lock: tokio::sync::Mutex<()>,
}

impl Durable {
    pub fn new(db: &DbSlot) -> Self {
        Durable {
            db: db.clone(),
            written: std::sync::atomic::AtomicU64::new(0),
            flushed: std::sync::atomic::AtomicU64::new(0),
            lock: tokio::sync::Mutex::new(()),
        }
    }

    /// Return once everything written before this call is on disk. Concurrent callers share
    /// one flush.
    pub async fn flush(&self) -> Result<(), StoreError> {
        use std::sync::atomic::Ordering::SeqCst;
        let ticket = self.written.fetch_add(1, SeqCst);
        let _turn = self.lock.lock().await;
        if self.flushed.load(SeqCst) > ticket {
            return Ok(());
        }
        let upto = self.written.load(SeqCst);
        let db = match self.db.db() {
            Ok(db) => db,
            // Handed over: this process writes nothing more itself.
            Err(StoreError::Released) => return Ok(()),
            Err(e) => return Err(e),
        };
        tokio::task::spawn_blocking(move || db.flush()).await.map_err(|e| StoreError::Corrupt(format!("flush task: {e}")))??;
        self.flushed.fetch_max(upto, SeqCst);
        Ok(())
    }
}

/// Handle to the open database.
#[derive(Clone)]
pub struct Store {
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

impl Store {
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        make_private(dir).map_err(|e| StoreError::Db(sled::Error::Io(e)))?;
        let db = sled::Config::new().path(dir).open()?;
        Ok(Store { slot: DbSlot::new(db) })
    }

    /// Open, retrying while another process (the one being upgraded away) holds the lock.
    pub fn open_waiting(dir: &Path, patience: std::time::Duration) -> Result<Store, StoreError> {
        let deadline = std::time::Instant::now() + patience;
        loop {
            match Store::open(dir) {
                Ok(s) => return Ok(s),
                Err(StoreError::Db(sled::Error::Io(e))) if std::time::Instant::now() < deadline => {
                    log::debug!("database busy ({e}); waiting for the previous process to hand it over");
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Every key record.
    pub fn all_keys(&self) -> Result<Vec<KeyRecord>, StoreError> {
        let mut out = Vec::new();
        for item in self.slot.tree("keys")?.iter() {
            let (id, value) = item?;
            let rec: KeyRecord =
                serde_json::from_slice(&value).map_err(|e| StoreError::Corrupt(format!("key {}: {e}", String::from_utf8_lossy(&id))))?;
            out.push(rec);
        }
        Ok(out)
    }

    pub fn put_key(&self, rec: &KeyRecord) -> Result<(), StoreError> {
        let value = serde_json::to_vec(rec).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        self.slot.tree("keys")?.insert(rec.id.as_bytes(), value)?;
        Ok(())
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

/// Reopen a database a test just closed: sled's background threads may hold its lock for a
/// moment after the last handle is dropped.
#[cfg(test)]
pub(crate) fn reopen(path: &Path) -> sled::Db {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        match sled::open(path) {
            Ok(db) => return db,
            Err(e) if std::time::Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => panic!("reopen {}: {e}", path.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_across_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let rec = KeyRecord {
            id: "key_1".into(),
            name: "demo".into(),
            group: "default".into(),
            key_hash: "ab".into(),
            rpm: Some(60),
            tpm: None,
            enabled: true,
            created_at: 1,
            max_concurrent: None,
            origin: KeyOrigin::Admin,
            seed_digest: None,
        };
        {
            let s = Store::open(dir.path()).expect("open");
            s.put_key(&rec).expect("put");
            s.flush().expect("flush");
        }
        let s = Store::open_waiting(dir.path(), std::time::Duration::from_secs(20)).expect("reopen");
        assert_eq!(s.all_keys().expect("read"), vec![rec]);
    }
}
