//! The kinds of call stage 2 answers itself — a video task, files, batches, a realtime
//! session and its turns, MCP and its tool calls, a redemption code — each a file implementing [`Answered`]: the
//! platform its key's group must allow, what it is admitted with before it runs (the charge
//! floor's [`Entry`]: counted, solvent, in a slot), and how it runs. Inside, each holds,
//! settles and checks through the charge and checks floors (`gw.charge`, `gw.checks`), never
//! the ledger or the limits themselves. The model call is the chain's own kind (stages 3 to 7).
//!
//! A new kind is a file here, an arm of [`of`], and its route.

mod batches;
mod files;
pub(super) mod mcp;
pub(super) mod realtime;
mod redeem;
mod video;

use super::admit::Caller;
use super::{Gateway, Outcome, RequestCtx};
use crate::charge::Entry;
use crate::config::Platform;
use crate::protocol::ApiError;
use crate::route::Route;
use async_trait::async_trait;
use pingora_proxy::Session;

/// A kind of call answered here.
#[async_trait]
pub(super) trait Answered: Sync {
    /// The platform the key's group must allow (None: any group).
    fn platform(&self) -> Option<Platform>;
    /// What the call is admitted with before it runs.
    fn entry(&self) -> Entry;
    /// Run it: its answer, or [`Outcome::Done`] when it wrote its own.
    async fn run(&self, gw: &Gateway, session: &mut Session, ctx: &mut RequestCtx, caller: &Caller) -> Result<Outcome, ApiError>;
}

/// The kind that answers `route`, if one does.
pub(super) fn of(route: &Route) -> Option<&'static dyn Answered> {
    match route {
        Route::VideoCreate { .. } | Route::VideoGet { .. } | Route::VideoContent { .. } | Route::VideoList | Route::VideoDelete { .. } => {
            Some(&video::Video)
        }
        Route::Files { .. } => Some(&files::Files),
        Route::Batches { .. } => Some(&batches::Batches),
        Route::Realtime => Some(&realtime::Realtime),
        Route::Mcp => Some(&mcp::Mcp),
        Route::Redeem => Some(&redeem::Redeem),
        _ => None,
    }
}
