//! What the video service keeps, whatever the backend: tasks, the poller's work lists and
//! idempotency keys go through [`crate::store::TaskStore`] (on one node in sled,
//! `store::sled::tasks`; in a fleet in the shared database, `store::postgres::tasks`, where
//! every node reads every task, the poller's work list is the tasks this node holds the claim
//! of, and every write is fenced by that claim).

/// The tasks of the video service.
pub type VideoStore = std::sync::Arc<dyn crate::store::TaskStore>;
