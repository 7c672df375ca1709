//! The charge floor: the money of a call, whatever its kind — a model call, a realtime turn,
//! an MCP tool call, a video task, a batch. Every kind goes through the same two halves, and
//! no kind touches the ledger or the limits itself:
//!
//! - **admission** ([`Charge`], `admission.rs`): the call is counted (`rpm`, or `tool_rpm` for
//!   a tool call: a [`Bucket`]), takes a `max_concurrent` slot, reserves its tokens under a
//!   `tpm`, and holds what it may cost in every purse the key pays from (its balance, its
//!   account's, its spend windows);
//! - **settlement** ([`Books`], `settlement.rs`): what the call used ([`Used`]) is made into
//!   its usage record — the one place a record is made — and debited once: a hold settled, an
//!   unheld turn debited, a price charged up front, or a refund given back.
//!
//! The checks a call goes through before it is admitted are the `checks` floor's list.

mod admission;
pub mod plans;
mod settlement;

pub use admission::{Bucket, Charge, Entry, Under};
pub use settlement::{Books, Payer, Payment, Used};
