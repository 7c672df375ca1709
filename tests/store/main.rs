//! The store's tests: one contract for both backends (`store`), a fleet's shared database
//! with several nodes (`fleet_store`, a real PostgreSQL) and three daemons on one database
//! (`fleet`). One test binary; run one file's tests with `cargo test --test store <file>::`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failure here is a failed run, not a client's answer
#![allow(clippy::too_many_lines)] // a test may tell a long scenario in one function

#[path = "../common/mod.rs"]
mod common;

mod fleet;
mod fleet_cache;
mod fleet_store;
mod store;
