//! The operator's side: the admin API ([`api`], loopback only, behind its token), the
//! console ([`console`], the same listener's pages) and the metrics listener ([`scrape`]).

pub mod accounts;
pub mod api;
mod cache;
mod codes;
pub mod console;
pub mod guard;
mod prices;
pub mod refusal;
pub mod scrape;
pub mod teams;
mod usage;
