//! The response cache (issue 70), in progress: what identifies a call that may be answered
//! again ([`key`]) and the answer as it is kept ([`entry`]). Not wired into the request path
//! yet, and no configuration key opens it: until it is, nothing is cached.

pub mod entry;
pub mod key;
