//! The admin API's refusals of a request's fields, shared by the API and the team settings.

use crate::protocol::{ApiError, ErrorKind};

/// 400 with `msg`.
pub(crate) fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::new(ErrorKind::BadRequest, msg)
}

/// A policy refused: 400 naming its field (`expires_at: …`, `models.allow: …`, `ip_allow: …`).
pub(crate) fn policy_error(message: String) -> ApiError {
    let field = message.split([':', '.']).next().unwrap_or_default().to_string();
    bad(message).with_param(&field)
}
