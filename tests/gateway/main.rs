//! The daemon's tests: each starts the real `tollgate` and `tollgate-mock` binaries as child
//! processes (see `tests/common`) and talks to them as clients, operators and attackers do.
//! One test binary: the crate and its dependencies are linked once for all of them. Run one
//! file's tests with `cargo test --test gateway <file>::`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failure here is a failed run, not a client's answer
#![allow(clippy::too_many_lines)] // a test may tell a long scenario in one function

#[path = "../common/mod.rs"]
mod common;

mod agent_clis;
mod agents;
mod batches;
mod billing;
mod budgets;
mod cache;
mod cloud;
mod config_cli;
mod durability;
mod fallbacks;
mod files;
mod gateway;
mod guardrails;
mod hardening;
mod mcp_client;
mod media;
mod metering;
mod operations;
mod plans;
mod policy;
mod request_log;
mod rewrite;
mod routing;
mod security;
mod security_round2;
mod security_round3;
mod selling;
mod shared_limits;
mod storage;
mod telemetry;
mod tls;
mod translate;
mod upgrade;
mod video;
mod video_coalesce;
