//! Messages upstreams: `x-api-key: <key>`, and the `anthropic-version` every request must
//! carry (the client's, else the provider's configured one).

use super::{set, Call, Seam, SeamError, StaticKeys};
use crate::protocol::anthropic::{CREDENTIAL_HEADER, VERSION_HEADER};
use pingora_http::RequestHeader;

pub struct Anthropic {
    keys: StaticKeys,
    /// `anthropic_version` of the provider: sent when the client sends none.
    version: String,
}

impl Anthropic {
    pub fn new(keys: &[String], version: &str) -> Anthropic {
        Anthropic { keys: StaticKeys::new(keys, str::to_string), version: version.to_string() }
    }
}

impl Seam for Anthropic {
    fn authenticate(
        &self,
        req: &mut RequestHeader,
        key: usize,
        _token: Option<&http::HeaderValue>,
        call: &Call<'_>,
        _body: &[u8],
    ) -> Result<(), SeamError> {
        set(req, CREDENTIAL_HEADER, self.keys.get(key))?;
        set(req, VERSION_HEADER, call.client_version.unwrap_or(&self.version))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{authenticated, header};
    use super::*;

    #[test]
    fn the_key_and_a_version_go_in_their_headers() {
        let seam = Anthropic::new(&["ak-1".into()], "2023-06-01");
        let req = authenticated(&seam, 0, None);
        assert_eq!(header(&req, "x-api-key"), Some("ak-1"));
        assert_eq!(header(&req, "anthropic-version"), Some("2023-06-01"), "the provider's version when the client sent none");
        let req = authenticated(&seam, 3, Some("2024-01-01"));
        assert_eq!(header(&req, "anthropic-version"), Some("2024-01-01"), "the client's own version");
        assert_eq!(header(&req, "x-api-key"), Some("ak-1"), "a key out of the pool falls back to the first");
        assert_eq!(header(&req, "authorization"), None);
    }
}
