//! tollgate: an edge gateway for model APIs on Pingora.
//!
//! Module map (one concern each): [`base`] the ground floor (clock, money units; imports
//! nothing of the project); [`config`] file → typed config; [`route`] method+path →
//! route; [`auth`] keys; [`protocol`] wire shapes per protocol; [`relay`] providers, upstream
//! rewrite, DNS; [`affinity`] which provider of a tier a conversation goes to; [`store`] everything
//! persisted (one interface, sled and PostgreSQL backends); [`ledger`] prices, holds and bookings; [`meter`] usage extraction; [`limits`] rate limits; [`listener`] connection caps and the request-header phase; [`response`] local responses; [`gateway`] the Pingora hooks;
//! [`server`] wiring; [`video`] asynchronous video tasks; [`mock`] the mock upstream used by tests and benches.

/// `0.1.0 (commit)`: the version and the commit the binary was built from.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("TOLLGATE_COMMIT"), ")");

pub mod access;
pub mod admin;
pub mod base;
pub mod billing;
pub mod config;
pub mod edge;
pub mod handover;
pub mod observe;

pub mod policy;
pub mod protocol;
pub mod records;

pub mod route;
pub mod server;
pub mod store;
pub mod translate;
pub mod upstream;
pub mod video;
