//! The records floor: what is stored and shared across the house, with no service logic —
//! keys and accounts ([`key`]), usage and its counters ([`usage`]), the purses a request is
//! paid from ([`purse`]), the audit trail ([`audit`]) and the video task ([`task`]).
//!
//! May import `base`, `protocol` and `policy` (a key's policy is part of its record);
//! imported by the stores, the ledger and everything above. Their stored forms live beside
//! the backends (`store::usage_codec`, `store::sled`, `store::postgres`).

pub mod audit;
pub mod key;
pub mod log;
pub mod purse;
pub mod task;
pub mod usage;
