//! The ground floor: helpers every other module may use and that import nothing of the project
//! (only the standard library and outside crates). Add here only what has no rule of tollgate's in it.
//!
//! * [`clock`]: the wall clock in Unix seconds and milliseconds.
//! * [`money`]: the money unit (nano-USD) and its conversions.
//! * [`usage`]: what one call used and said (token counts, model, stop reasons), and the
//!   largest output a request may be allowed.
//! * [`codec`]: the compact binary form the stored records are written in.
//! * [`spool`]: a file read back in chunks (spooled uploads).
//! * [`throttle`]: pauses that grow with each wrong guess of a secret.
//! * [`outbound`]: the one builder of clients for tollgate's own outbound HTTP calls.

pub mod clock;
pub mod codec;
pub mod marks;
pub mod money;
pub mod outbound;
pub mod secrets;
pub mod spool;
pub mod text;
pub mod throttle;
pub mod tls;
pub mod usage;
