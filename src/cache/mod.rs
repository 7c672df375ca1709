//! The response cache (issue 70), in progress: what identifies a call that may be answered
//! again ([`key`]) and what its client asks of the cache ([`directive`]), the answer kept as it goes to the client ([`capture`]) and as it is stored
//! ([`entry`]; on one node in `store::sled::cache`), and replayed with a fresh id ([`replay`]). Not wired into the request path
//! yet, and no configuration key opens it: until it is, nothing is cached.

pub mod capture;
pub mod directive;
pub mod entry;
pub mod key;
pub mod replay;
