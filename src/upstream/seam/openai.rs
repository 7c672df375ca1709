//! Chat-completions upstreams: `Authorization: Bearer <key>`.

use super::{set, Call, Seam, SeamError, StaticKeys};
use crate::protocol::openai::CREDENTIAL_HEADER;
use pingora_http::RequestHeader;

pub struct OpenAi {
    keys: StaticKeys,
}

impl OpenAi {
    pub fn new(keys: &[String]) -> OpenAi {
        OpenAi { keys: StaticKeys::new(keys, |k| format!("Bearer {k}")) }
    }
}

impl Seam for OpenAi {
    fn authenticate(
        &self,
        req: &mut RequestHeader,
        key: usize,
        _token: Option<&http::HeaderValue>,
        _call: &Call<'_>,
        _body: &[u8],
    ) -> Result<(), SeamError> {
        set(req, CREDENTIAL_HEADER, self.keys.get(key))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{authenticated, header};
    use super::*;

    #[test]
    fn the_key_goes_as_a_bearer_token_and_nothing_else_is_added() {
        let seam = OpenAi::new(&["sk-1".into(), "sk-2".into()]);
        let req = authenticated(&seam, 1, Some("2023-06-01"));
        assert_eq!(header(&req, "authorization"), Some("Bearer sk-2"));
        assert_eq!(req.headers.len(), 1, "{:?}", req.headers);
    }
}
