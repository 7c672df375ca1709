//! The open sled database and its errors, at the bottom of the store: the handle every module
//! reaches its trees through ([`DbSlot`], released whole in an upgrade), the group flush
//! ([`Durable`]) and [`StoreError`]. It knows no record: the commit writer builds on it.

use crate::store::commit::journal::Journal;
use arc_swap::ArcSwapOption;
use std::fmt;
use std::sync::Arc;

#[derive(Debug, Clone)]
pub enum StoreError {
    Db(::sled::Error),
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

impl From<::sled::Error> for StoreError {
    fn from(e: ::sled::Error) -> Self {
        StoreError::Db(e)
    }
}

/// The one open database, shared by every module, which can be let go of as a whole: the old
/// process of an upgrade releases it so the new one can open it (sled holds an exclusive file
/// lock). Modules reach their trees through it per operation and never keep a tree.
#[derive(Clone)]
pub struct DbSlot {
    db: Arc<ArcSwapOption<::sled::Db>>,
    /// The data directory's commit journal, until the commit writer takes it.
    journal: Arc<std::sync::Mutex<Option<Journal>>>,
}

impl DbSlot {
    /// A database without a commit journal: its commit writer flushes sled for every batch.
    pub fn new(db: ::sled::Db) -> Self {
        DbSlot { db: Arc::new(ArcSwapOption::from_pointee(db)), journal: Arc::default() }
    }

    /// A database whose commit writer makes batches durable through `journal`.
    pub fn with_journal(db: ::sled::Db, journal: Journal) -> Self {
        DbSlot { db: Arc::new(ArcSwapOption::from_pointee(db)), journal: Arc::new(std::sync::Mutex::new(Some(journal))) }
    }

    /// The commit journal, for the one commit writer of this database (later callers get none).
    pub fn take_journal(&self) -> Option<Journal> {
        self.journal.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    pub fn db(&self) -> Result<::sled::Db, StoreError> {
        self.db.load_full().map(|db| (*db).clone()).ok_or(StoreError::Released)
    }

    pub fn tree(&self, name: &str) -> Result<::sled::Tree, StoreError> {
        Ok(self.db()?.open_tree(name)?)
    }

    /// Let go of the database: once operations in progress finish, sled closes and its lock
    /// is free. Later operations answer `StoreError::Released`.
    pub fn release(&self) {
        self.db.store(None);
    }

    pub fn is_released(&self) -> bool {
        self.db.load().is_none()
    }
}

impl From<&::sled::Db> for DbSlot {
    fn from(db: &::sled::Db) -> Self {
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

/// Reopen a database a test just closed: sled's background threads may hold its lock for a
/// moment after the last handle is dropped.
#[cfg(test)]
pub(crate) fn reopen(path: &std::path::Path) -> ::sled::Db {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        match ::sled::open(path) {
            Ok(db) => return db,
            Err(e) if std::time::Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => panic!("reopen {}: {e}", path.display()),
        }
    }
}
