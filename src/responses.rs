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
//! then until the usage record is booked, the owner is known from memory.

use crate::ledger::{Ledger, ResponseOwner};
use crate::protocol::{ApiError, ErrorKind};
use crate::store::StoreError;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

pub struct Owners {
    ledger: Arc<Ledger>,
    /// Responses whose stream is still being relayed (not booked yet).
    streaming: Mutex<HashMap<String, ResponseOwner>>,
}

impl Owners {
    pub fn new(ledger: Arc<Ledger>) -> Self {
        Owners { ledger, streaming: Mutex::new(HashMap::new()) }
    }

    fn streaming(&self) -> std::sync::MutexGuard<'_, HashMap<String, ResponseOwner>> {
        self.streaming.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A stream being relayed named its response: its owner is known before it is booked.
    pub fn started(&self, id: &str, owner: ResponseOwner) {
        self.streaming().insert(id.to_string(), owner);
    }

    /// The request that created `id` was settled (its record, which names the owner, is booked).
    pub fn settled(&self, id: &str) {
        self.streaming().remove(id);
    }

    /// The response `id` if `key_id` created it; None for a response of another key, an
    /// expired one and an id nobody created alike.
    pub async fn owned_by(&self, id: &str, key_id: &str) -> Result<Option<ResponseOwner>, StoreError> {
        let relaying = self.streaming().get(id).cloned();
        let owner = match relaying {
            Some(owner) => Some(owner),
            None => self.ledger.response_owner(id).await?,
        };
        Ok(owner.filter(|o| o.key_id == key_id))
    }

    /// The response was deleted upstream.
    pub fn deleted(&self, id: &str) {
        if let Err(e) = self.ledger.forget_response(id) {
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
