//! The admin API's refusals of a request's fields, shared by the API and the team settings.

use crate::protocol::{ApiError, ErrorKind};

/// 400 with `msg`.
pub(crate) fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::new(ErrorKind::BadRequest, msg)
}

/// A policy refused: 400 naming its field (`expires_at: …`, `models.allow: …`, `ip_allow: …`).
pub(crate) fn policy_error(e: crate::policy::PolicyError) -> ApiError {
    bad(e.to_string()).with_param(e.top())
}
