//! What every console page shares: its result type, refusals, the billing calendar and
//! today in it, and small formatters.

use super::html::{self, enc, esc};
use super::{html as reply, Form};
use crate::admin::api::AdminApi;
use crate::protocol::response::LocalResponse;
use crate::protocol::{ApiError, ErrorKind};
use serde_json::{json, Value};
use std::collections::BTreeMap;

pub(super) type Page = Result<LocalResponse, ApiError>;

pub(super) fn bad(param: &str, message: impl Into<String>) -> ApiError {
    ApiError::new(ErrorKind::BadRequest, message).with_param(param)
}

pub(super) fn internal(e: impl std::fmt::Display) -> ApiError {
    log::error!("console: {e}");
    ApiError::new(ErrorKind::Internal, "Internal error while reading the store.")
}

/// The billing calendar and today's date in it.
pub(super) struct Clock {
    pub(super) calendar: crate::policy::budget::Calendar,
    pub(super) today: String,
}

impl Clock {
    pub(super) fn now(api: &AdminApi) -> Clock {
        let calendar = api.routing.load().calendar.clone();
        let today = crate::base::clock::date_in(crate::base::clock::now_unix(), calendar.tz());
        Clock { calendar, today }
    }

    pub(super) fn tz(&self) -> &jiff::tz::TimeZone {
        self.calendar.tz()
    }

    /// `[start, end)` in unix ms of the dates `from..=to`.
    pub(super) fn range_ms(&self, from: &str, to: &str) -> Option<(u64, u64)> {
        let start = self.calendar.day_start(from)?;
        let end = self.calendar.day_start(&crate::policy::budget::Calendar::add_days(to, 1)?)?;
        Some((start * 1000, end * 1000))
    }

    pub(super) fn days_before(&self, n: i64) -> String {
        crate::policy::budget::Calendar::add_days(&self.today, -n).unwrap_or_else(|| self.today.clone())
    }

    pub(super) fn page(&self, title: &str, current: &str, csrf: &str, body: &str) -> LocalResponse {
        reply(200, html::page(title, current, csrf, self.calendar.name(), body))
    }
}

pub(super) fn key_names(keys: &[crate::records::key::KeyRecord]) -> BTreeMap<String, String> {
    keys.iter().map(|k| (k.id.clone(), k.name.clone())).collect()
}

pub(super) fn key_link(id: &str, names: &BTreeMap<String, String>) -> String {
    let name = names.get(id).map_or(id, String::as_str);
    format!("<a href=\"/console/keys/{}\">{}</a> <span class=\"mono\">{}</span>", enc(id), esc(name), esc(id))
}

/// The reason a balance move is audited with: the form's, and the operator who signed in by
/// their role (`by`), when there is one.
pub(super) fn operator_reason(by: Option<&str>, reason: &str) -> String {
    match (by, reason) {
        (Some(by), "") => format!("by {by} (operator)"),
        (Some(by), r) => format!("{r} (by {by}, operator)"),
        (None, r) => r.to_string(),
    }
}

/// The notice a page shows after a post redirected to it (`?done=`), or nothing.
pub(super) fn done_notice(query: &str) -> String {
    match Form::parse(query).get("done") {
        "" => String::new(),
        d => format!("<p class=\"notice\" role=\"status\">{}</p>", esc(d)),
    }
}

/// A form's number (empty: absent).
pub(super) fn number(form: &Form, name: &str, whole: bool) -> Result<Option<Value>, ApiError> {
    let text = form.get(name);
    if text.is_empty() {
        return Ok(None);
    }
    if whole {
        return text.parse::<u64>().map(|n| Some(json!(n))).map_err(|_| bad(name, format!("{name}: a whole number, not '{text}'")));
    }
    match text.trim_start_matches('$').parse::<f64>() {
        Ok(n) if n.is_finite() => Ok(Some(json!(n))),
        _ => Err(bad(name, format!("{name}: an amount in USD, not '{text}'"))),
    }
}

/// The field of the edit form a policy error is about (`models.allow` → `models_allow`).
pub(super) fn form_param(e: &mut ApiError) {
    let Some(param) = e.param.as_deref() else { return };
    let mapped = match param {
        "models" if e.message.contains("deny") => "models_deny",
        "models" => "models_allow",
        "budgets" if e.message.contains("week") => "budget_week",
        "budgets" if e.message.contains("month") => "budget_month",
        "budgets" if e.message.starts_with("budgets.day") => "budget_day",
        "budgets" => "budget_rolling",
        "balance_delta" => "amount",
        _ => return,
    };
    e.param = Some(mapped.to_string());
}

pub(super) const DAY_MS: u64 = 86_400_000;

/// Most request-log entries a page reads to count failures and latencies.
pub(super) const MAX_LOG_SCAN: usize = 1_000_000;

/// Longest date range of the usage page.
pub(super) const MAX_RANGE_DAYS: i64 = 3660;
