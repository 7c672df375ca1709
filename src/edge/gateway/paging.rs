//! The paging of a key's lists (`GET /v1/videos`, `/v1/files`, `/v1/batches`): `after` (an
//! id), `limit` (1 to the list's most, its default when absent) and, where the list takes it,
//! `order` (`desc`, newest first, by default; or `asc`).

use crate::protocol::{ApiError, ErrorKind};

pub(super) struct Page {
    pub after: Option<String>,
    pub limit: usize,
    pub newest_first: bool,
}

impl Page {
    /// The page `query` asks for: `limit` up to `most` (`default` when absent); `order` read
    /// only when `ordered` (other lists ignore it, as any unknown parameter).
    pub fn of(query: Option<&str>, most: usize, default: usize, ordered: bool) -> Result<Page, ApiError> {
        let mut page = Page { after: None, limit: default, newest_first: true };
        for pair in query.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = crate::base::text::decode_component(value);
            let bad = |rule: &str| ApiError::new(ErrorKind::BadRequest, format!("'{name}': {rule}.")).with_param(name);
            match name {
                "after" if !value.is_empty() => page.after = Some(value),
                "limit" => {
                    page.limit = value.parse().ok().filter(|n| (1..=most).contains(n)).ok_or_else(|| bad(&format!("1 to {most}")))?
                }
                "order" if ordered => {
                    page.newest_first = match value.as_str() {
                        "desc" => true,
                        "asc" => false,
                        _ => return Err(bad("asc or desc")),
                    }
                }
                _ => {}
            }
        }
        Ok(page)
    }
}
