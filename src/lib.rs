//! tollgate: an edge gateway for model APIs on Pingora.
//!
//! The modules are floors: each may import only the floors listed before it, never one after
//! it (`farm-studio look` shows no arrow running back up and no circle). From the ground up:
//!
//! 1. [`base`]: helpers that know no rule of tollgate's — clock, money unit, ids and
//!    secrets, text, TLS files, the stored records' binary codec. Imports nothing of the project.
//! 2. [`protocol`]: each wire protocol's shapes (credential headers, error bodies, model
//!    lists, the request fields tollgate reads) and the builder of local answers.
//! 3. [`policy`]: a key's policy (expiry, models, addresses, budgets, spend windows).
//! 4. [`records`]: what is stored and shared — keys, accounts, usage, purses, audit entries,
//!    video tasks, request-log entries — with no service logic.
//! 5. [`config`]: the configuration file, one parser per section; builds values, opens nothing.
//! 6. [`store`]: everything persisted, one interface, the sled and PostgreSQL backends whole.
//! 7. [`billing`]: prices, holds and settlement (the ledger), the usage scanner of answers.
//! 8. [`observe`]: metrics, the process log, traces, the request id.
//! 9. [`access`]: key authentication, rate limits, owners of stored responses.
//! 10. [`route`], [`translate`]: which endpoint a request is for; translation between protocols.
//! 11. [`upstream`]: the providers — catalog, health, affinity, a call's draft, the upstream
//!     request — and the seam between kinds of upstream.
//! 12. [`video`]: the video task service.
//! 13. [`edge`]: client connections, request bodies, the proxy's request path as stages.
//! 14. [`admin`]: the admin API, the console, the metrics listener.
//! 15. [`handover`], [`server`]: upgrades and the wiring of it all (the app).
//!
//! The mock upstream of the tests and benchmarks is a binary of its own
//! (`src/bin/tollgate_mock/`), outside the library.

/// `0.1.0 (commit)`: the version and the commit the binary was built from.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("TOLLGATE_COMMIT"), ")");

pub mod base;

pub mod protocol;

pub mod policy;

pub mod records;

pub mod config;

pub mod store;

pub mod billing;

pub mod observe;

pub mod access;

pub mod route;
pub mod translate;

pub mod upstream;

pub mod video;

pub mod edge;

pub mod admin;

pub mod handover;
pub mod server;
