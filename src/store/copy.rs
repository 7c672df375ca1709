//! `tollgate store copy --from A --to B`: moving a node's data into the fleet's database
//! (`sled:DIR` → `postgres:URL`) and back. Keys (hashes only, as stored), shared accounts,
//! balances (keys', accounts' and spend windows'), usage records, response owners, video tasks,
//! idempotency keys and the audit trail; the target must be empty, and
//! the nodes of the source stopped (a running node may still book what it holds).

use super::postgres::Pg;
use super::sled::{SledDb, SledStore};
use super::snapshot::Snapshot;
use super::{KeyStore, MoneyStore, StoreError, TaskStore};
use crate::config::PgSettings;
use std::path::PathBuf;

/// One end of a copy.
pub enum Place {
    Sled(PathBuf),
    Postgres(PgSettings),
}

impl Place {
    /// `sled:DIR`, or `postgres:URL` (`postgres:postgres://…`, `postgres:host=… dbname=…`) or the
    /// URL alone (`postgres://…`, `postgresql://…`).
    pub fn parse(text: &str, ca_pem: Option<String>) -> Result<Place, String> {
        if let Some(dir) = text.strip_prefix("sled:") {
            if dir.is_empty() {
                return Err(format!("'{text}': give the directory after sled:"));
            }
            return Ok(Place::Sled(PathBuf::from(dir)));
        }
        let url = if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            Some(text.to_string())
        } else {
            text.strip_prefix("postgres:").filter(|rest| !rest.trim().is_empty()).map(|rest| {
                // `postgres://…` split at its own colon reads `//…`: the URL it was.
                if rest.starts_with("//") {
                    format!("postgres:{rest}")
                } else {
                    rest.to_string()
                }
            })
        };
        match url {
            Some(url) => Ok(Place::Postgres(PgSettings { url, pool_size: 2, ca_pem })),
            None => Err(format!("'{text}': give sled:DIR or postgres://user@host/db")),
        }
    }
}

#[derive(Debug)]
pub enum CopyError {
    NotEmpty(String),
    /// The source holds no tollgate store (a mistyped path, an empty database).
    NoSource(String),
    Store(StoreError),
}

impl std::fmt::Display for CopyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CopyError::NotEmpty(what) => write!(f, "the target is not empty ({what}); nothing was copied"),
            CopyError::NoSource(what) => write!(f, "the source holds no tollgate store ({what}); nothing was copied or created"),
            CopyError::Store(e) => write!(f, "{e}"),
        }
    }
}

impl From<StoreError> for CopyError {
    fn from(e: StoreError) -> Self {
        CopyError::Store(e)
    }
}

impl From<super::postgres::PgError> for CopyError {
    fn from(e: super::postgres::PgError) -> Self {
        CopyError::Store(e.into())
    }
}

/// Copy everything from `from` to `to` (refused unless `from` holds a store and `to` is
/// empty); what was copied.
pub async fn copy(from: &Place, to: &Place) -> Result<Snapshot, CopyError> {
    // The source is checked before anything is created, the target before anything is read,
    // and the target is written in one go.
    match from {
        Place::Sled(dir) => {
            // A sled database is a directory with its `db` file; opening a missing one would
            // create it, empty.
            if !dir.join("db").is_file() {
                return Err(CopyError::NoSource(format!("sled:{} has no database", dir.display())));
            }
        }
        Place::Postgres(settings) => {
            if !super::postgres::copy::has_schema(&Pg::new(settings)?).await? {
                return Err(CopyError::NoSource("the PostgreSQL database has no tollgate schema".into()));
            }
        }
    }
    match to {
        Place::Sled(dir) => {
            let store = SledDb::open(dir)?;
            if !sled_is_empty(&store)? {
                return Err(CopyError::NotEmpty(format!("sled:{}", dir.display())));
            }
        }
        Place::Postgres(settings) => {
            let pg = Pg::new(settings)?;
            pg.migrate().await?;
            if !super::postgres::copy::is_empty(&pg).await? {
                return Err(CopyError::NotEmpty("the PostgreSQL database has tollgate data".into()));
            }
        }
    }
    let snapshot = match from {
        Place::Sled(dir) => read_sled(dir).await?,
        Place::Postgres(settings) => {
            let pg = Pg::new(settings)?;
            pg.migrate().await?;
            super::postgres::copy::read(&pg).await?
        }
    };
    match to {
        Place::Sled(dir) => write_sled(dir, &snapshot).await?,
        Place::Postgres(settings) => super::postgres::copy::write(&Pg::new(settings)?, &snapshot).await?,
    }
    Ok(snapshot)
}

fn sled_is_empty(store: &SledDb) -> Result<bool, StoreError> {
    let db = store.db();
    for tree in ["keys", "balances", "usage_records", "video_tasks"] {
        if !db.tree(tree)?.is_empty() {
            return Ok(false);
        }
    }
    Ok(true)
}

async fn read_sled(dir: &std::path::Path) -> Result<Snapshot, StoreError> {
    let db = SledDb::open(dir)?;
    let store = SledStore::new(db.db(), crate::config::CommitPolicy::default())?;
    let keys = store.keys.all().await?;
    let mut ids: std::collections::BTreeSet<String> = keys.iter().map(|k| k.id.clone()).collect();
    ids.extend(store.money.balance_ids()?);
    let mut balances = Vec::with_capacity(ids.len());
    for id in ids {
        let balance = store.money.balance(&id).await?;
        balances.push((id, balance));
    }
    let (records, owners) = store.money.export()?;
    let (tasks, idempotency) = store.tasks.export()?;
    let accounts = store.keys.accounts().await?;
    let audit = store.money.export_audit()?;
    let mut marks = Vec::new();
    for item in db.db().tree(crate::store::commit::MARKS)?.iter() {
        let (k, v) = item?;
        let value =
            v.as_ref().try_into().map(i64::from_be_bytes).map_err(|_| StoreError::Corrupt("a mark's value is not 8 bytes".into()))?;
        marks.push((String::from_utf8_lossy(&k).into_owned(), value));
    }
    Ok(Snapshot { keys, accounts, balances, audit, records, owners, tasks, idempotency, marks })
}

async fn write_sled(dir: &std::path::Path, s: &Snapshot) -> Result<(), StoreError> {
    let db = SledDb::open(dir)?;
    let store = SledStore::new(db.db(), crate::config::CommitPolicy::default())?;
    store.keys.put(&s.keys).await?;
    for account in &s.accounts {
        store.keys.put_account(account).await?;
    }
    for (key_id, balance) in &s.balances {
        store.money.open_account(key_id, *balance).await?;
    }
    store.money.import_audit(&s.audit)?;
    let marks = db.db().tree(crate::store::commit::MARKS)?;
    for (mark, value) in &s.marks {
        marks.insert(mark.as_bytes(), &value.to_be_bytes())?;
    }
    store.money.import(&s.records, &s.owners)?;
    for task in &s.tasks {
        store.tasks.put(task).await?;
    }
    for (owner, key, task_id, at) in &s.idempotency {
        store.tasks.claim_idempotency(owner, key, task_id, *at).await?;
    }
    db.flush()
}

/// `tollgate store copy --from A --to B [--ca-file F]`: exit code and what to print.
pub fn cli(args: &[String]) -> (i32, String) {
    const USAGE: &str = "usage: tollgate store copy --from sled:DIR|postgres:URL --to sled:DIR|postgres:URL [--ca-file FILE] (a URL alone, postgres://…, is taken too)";
    let mut from = None;
    let mut to = None;
    let mut ca_file = None;
    let mut it = args.iter();
    match it.next().map(String::as_str) {
        Some("copy") => {}
        _ => return (2, USAGE.into()),
    }
    while let Some(arg) = it.next() {
        let slot = match arg.as_str() {
            "--from" => &mut from,
            "--to" => &mut to,
            "--ca-file" => &mut ca_file,
            _ => return (2, format!("unknown argument '{arg}'\n{USAGE}")),
        };
        match it.next() {
            Some(v) => *slot = Some(v.clone()),
            None => return (2, format!("{arg} needs a value\n{USAGE}")),
        }
    }
    let (Some(from), Some(to)) = (from, to) else { return (2, USAGE.into()) };
    let ca_pem = match ca_file.map(std::fs::read_to_string).transpose() {
        Ok(pem) => pem,
        Err(e) => return (2, format!("--ca-file: {e}")),
    };
    let (from, to) = match (Place::parse(&from, ca_pem.clone()), Place::parse(&to, ca_pem)) {
        (Ok(f), Ok(t)) => (f, t),
        (Err(e), _) | (_, Err(e)) => return (2, format!("{e}\n{USAGE}")),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => return (2, format!("cannot start a runtime: {e}")),
    };
    match runtime.block_on(copy(&from, &to)) {
        Ok(snapshot) => (0, format!("copied {}", snapshot.summary())),
        Err(e) => (2, e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(place: Result<Place, String>) -> Option<String> {
        match place {
            Ok(Place::Postgres(s)) => Some(s.url),
            _ => None,
        }
    }

    #[test]
    fn both_postgres_spellings_and_sled_are_read() {
        let want = Some("postgres://u@db:5432/tollgate".to_string());
        assert_eq!(url(Place::parse("postgres://u@db:5432/tollgate", None)), want);
        assert_eq!(url(Place::parse("postgres:postgres://u@db:5432/tollgate", None)), want);
        assert_eq!(url(Place::parse("postgres:host=db dbname=tollgate", None)).as_deref(), Some("host=db dbname=tollgate"));
        assert_eq!(url(Place::parse("postgresql://db/t", None)).as_deref(), Some("postgresql://db/t"));
        assert!(
            matches!(Place::parse("sled:/var/lib/tollgate", None), Ok(Place::Sled(d)) if d == std::path::Path::new("/var/lib/tollgate"))
        );
        for bad in ["sled:", "postgres:", "mysql://db", "/var/lib/tollgate"] {
            assert!(Place::parse(bad, None).is_err(), "{bad}");
        }
    }
}
