//! Access: who is calling and what they may do now — keys and their authentication
//! ([`auth`]), rate limits and requests in flight ([`limits`]), and the owners of stored
//! responses ([`owners`]). A key's policy (expiry, models, addresses, budgets) is `policy`'s.

pub mod auth;
pub mod limits;
pub mod owners;
