//! A check for the test suites only: with `TOLLGATE_TEST_REFUSE_MARK` set in the process's
//! environment, a call whose text contains that mark is refused, whatever its kind. It shows
//! that one check, registered once, reaches a chat call, a realtime turn, an MCP tool call and
//! a batch line. Never set in production (the start-up log warns when it is).

use super::{Check, Looks, Subject, Verdict};
use crate::protocol::{ApiError, ErrorKind};

const VARIABLE: &str = "TOLLGATE_TEST_REFUSE_MARK";

pub(super) struct Marked {
    mark: String,
}

/// The check, when the variable names a mark of 4 to 64 characters.
pub(super) fn from_env() -> Option<Box<dyn Check>> {
    let mark = std::env::var(VARIABLE).ok().filter(|m| (4..=64).contains(&m.chars().count()))?;
    log::warn!("{VARIABLE} is set: calls whose text contains its mark are refused (a test-only check)");
    Some(Box::new(Marked { mark }))
}

impl Check for Marked {
    fn name(&self) -> &'static str {
        "test_mark"
    }

    fn looks_at(&self) -> Looks {
        Looks::TEXT
    }

    fn check(&self, call: &Subject) -> Verdict {
        match call.text.is_some_and(|t| t.any(&mut |s| s.contains(&self.mark))) {
            true => Verdict::Refuse(ApiError::new(
                ErrorKind::BadRequest,
                format!("This {} was refused by the gateway's check 'test_mark'.", call.kind.label().replace('_', " ")),
            )),
            false => Verdict::Continue,
        }
    }
}
