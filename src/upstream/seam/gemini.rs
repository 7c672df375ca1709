//! Generate-content upstreams: `x-goog-api-key: <key>` (never the `key` query parameter,
//! which would put the operator's key in URLs and logs).

use super::{set, Call, Seam, SeamError, StaticKeys};
use crate::protocol::gemini::CREDENTIAL_HEADER;
use pingora_http::RequestHeader;

pub struct Gemini {
    keys: StaticKeys,
}

impl Gemini {
    pub fn new(keys: &[String]) -> Gemini {
        Gemini { keys: StaticKeys::new(keys, str::to_string) }
    }
}

impl Seam for Gemini {
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
    fn the_key_goes_in_its_header() {
        let seam = Gemini::new(&["g-1".into(), "g-2".into()]);
        let req = authenticated(&seam, 1, None);
        assert_eq!(header(&req, "x-goog-api-key"), Some("g-2"));
        assert_eq!(req.headers.len(), 1, "{:?}", req.headers);
    }
}
