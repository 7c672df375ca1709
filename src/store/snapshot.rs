//! What `store copy` moves from one store to another (see `store::copy`), read by each end
//! (`store::copy` for sled, `store::postgres::copy` for PostgreSQL).

use crate::records::audit::AuditEntry;
use crate::records::key::{AccountRecord, KeyRecord};
use crate::records::task::IdempotencyRow;
use crate::records::task::Task;
use crate::records::usage::{ResponseOwner, UsageRecord};

/// Everything a copy moves.
#[derive(Default)]
pub struct Snapshot {
    pub keys: Vec<KeyRecord>,
    pub accounts: Vec<AccountRecord>,
    /// Key id, `acct:<name>` or spend window → balance (nano-USD).
    pub balances: Vec<(String, i64)>,
    /// Oldest first.
    pub audit: Vec<AuditEntry>,
    pub records: Vec<UsageRecord>,
    pub owners: Vec<(String, ResponseOwner)>,
    pub tasks: Vec<Task>,
    pub idempotency: Vec<IdempotencyRow>,
    /// What was done once (plans' grants and closes): mark → value.
    pub marks: Vec<(String, i64)>,
}

impl Snapshot {
    /// What a copy prints.
    pub fn summary(&self) -> String {
        format!(
            "{} key(s), {} account(s), {} balance(s), {} audit entr(y/ies), {} usage record(s), {} response owner(s), {} video task(s), {} idempotency key(s), {} mark(s)",
            self.keys.len(),
            self.accounts.len(),
            self.balances.len(),
            self.audit.len(),
            self.records.len(),
            self.owners.len(),
            self.tasks.len(),
            self.idempotency.len(),
            self.marks.len()
        )
    }
}
