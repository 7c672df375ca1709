//! Stored responses belong to the key that created them.
//!
//! Every key shares the operator's upstream account, so the upstream would let any key read,
//! cancel, delete or continue any response stored there. tollgate therefore books, with the
//! usage record of the request that created a response, which key created it on which
//! provider ([`ResponseOwner`], kept as long as usage records are), and lets only that key
//! reach it: `GET`/`DELETE /v1/responses/{id}`, `…/cancel`, `…/input_items` and a new turn's
//! `previous_response_id` go to the provider that stored it; any other key is told the
//! response does not exist, exactly as for an id nobody created.
//!
//! A stream names its response in its first event, long before the request is settled: from
//! then until the request ends (its usage record booked, or the request dropped), the owner is
//! known from memory, through a guard the request holds.

use crate::billing::ledger::Ledger;
use crate::protocol::{ApiError, ErrorKind};
use crate::records::usage::ResponseOwner;
use crate::store::StoreError;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

type Streaming = Arc<Mutex<HashMap<String, ResponseOwner>>>;

fn lock(map: &Streaming) -> std::sync::MutexGuard<'_, HashMap<String, ResponseOwner>> {
    map.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub struct Owners {
    ledger: Arc<Ledger>,
    /// Responses whose stream is still being relayed (not booked yet).
    streaming: Streaming,
}

/// Keeps a streamed response's owner known while its request lives; dropped with the request
/// (by then settled: its usage record names the owner).
pub struct StreamingOwner {
    streaming: Streaming,
    id: String,
}

impl Drop for StreamingOwner {
    fn drop(&mut self) {
        lock(&self.streaming).remove(&self.id);
    }
}

impl Owners {
    pub fn new(ledger: Arc<Ledger>) -> Self {
        Owners { ledger, streaming: Arc::new(Mutex::new(HashMap::new())) }
    }

    /// A stream being relayed named its response: its owner is known before it is booked, for
    /// as long as the returned guard lives.
    pub fn started(&self, id: &str, owner: ResponseOwner) -> StreamingOwner {
        lock(&self.streaming).insert(id.to_string(), owner);
        StreamingOwner { streaming: self.streaming.clone(), id: id.to_string() }
    }

    /// The response `id` if `key_id` created it; None for a response of another key, an
    /// expired one and an id nobody created alike.
    pub async fn owned_by(&self, id: &str, key_id: &str) -> Result<Option<ResponseOwner>, StoreError> {
        let relaying = lock(&self.streaming).get(id).cloned();
        let owner = match relaying {
            Some(owner) => Some(owner),
            None => self.ledger.response_owner(id).await?,
        };
        Ok(owner.filter(|o| o.key_id == key_id))
    }

    /// The response was deleted upstream.
    pub async fn deleted(&self, id: &str) {
        if let Err(e) = self.ledger.forget_response(id).await {
            log::warn!("could not forget the owner of a deleted response: {e}");
        }
    }
}

/// The answer for a stored response the caller does not own (or that does not exist).
pub fn not_found(id: &str) -> ApiError {
    ApiError::new(ErrorKind::NotFound, format!("No response with id '{id}' was found."))
}

/// The answer for a `previous_response_id` the caller does not own (or that does not exist).
pub fn previous_not_found(id: &str) -> ApiError {
    ApiError::new(ErrorKind::BadRequest, format!("Previous response with id '{id}' not found.")).with_param("previous_response_id")
}

/// Reading the owners failed.
pub fn unavailable(e: StoreError) -> ApiError {
    log::error!("response owners: {e}");
    ApiError::new(ErrorKind::Internal, "Internal error while looking up the response.")
}
