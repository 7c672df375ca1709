//! The ground floor: helpers every other module may use and that import nothing of the project
//! (only the standard library). Add here only what has no rule of tollgate's in it.
//!
//! * [`clock`]: the wall clock in Unix seconds and milliseconds.
//! * [`money`]: the money unit (nano-USD) and its conversions.

pub mod clock;
pub mod money;
