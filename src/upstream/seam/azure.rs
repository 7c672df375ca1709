//! Azure OpenAI: the chat-completions protocol under a resource's own paths, with an `api-key`
//! header or a Microsoft Entra ID token.
//!
//! * The v1 API (no `api_version`, or `api_version: v1`): `/openai/v1/…`, the OpenAI paths with
//!   the model (the deployment's name) in the body.
//! * Deployment URLs (`api_version: 2024-10-21` and the like):
//!   `/openai/deployments/{deployment}/chat/completions?api-version=…` (and `embeddings`); the
//!   responses API, which has no deployment path, at `/openai/responses?api-version=…` with the
//!   deployment in the body; images and audio under their deployment too
//!   (`/openai/deployments/{deployment}/images/generations`, `…/audio/transcriptions`).
//!
//! A model's `upstream` name is its deployment's name.

use super::token::{Grant, TokenRequest, TokenSource};
use super::{native_target, set, Call, Seam, SeamError, StaticKeys};
use crate::config::cloud::{Entra, AZURE_SCOPE};
use crate::route::Route;
use crate::upstream::path::{upstream_query, Destination};
use pingora_http::RequestHeader;

/// The header Azure OpenAI reads a key from.
const KEY_HEADER: &str = "api-key";

pub struct Azure {
    api_version: Option<String>,
    keys: StaticKeys,
    tokens: Option<TokenSource>,
}

impl Azure {
    pub fn new(config: &crate::config::cloud::Azure, keys: &[String], provider: &str) -> Azure {
        Azure {
            api_version: config.api_version.clone(),
            keys: StaticKeys::new(keys, str::to_string),
            tokens: config.entra.as_ref().map(|e| TokenSource::new(provider, Box::new(ClientCredentials(e.clone())))),
        }
    }
}

impl Seam for Azure {
    /// Azure OpenAI has no moderations endpoint, and its realtime API has paths of its own
    /// that tollgate does not write.
    fn serves(&self, route: &Route, _wire: crate::config::Protocol, _translated: bool) -> bool {
        !matches!(route, Route::Moderations | Route::Realtime)
    }

    fn target(&self, call: &Call<'_>, prefix: &str) -> String {
        let Some(version) = &self.api_version else {
            // The v1 API: the OpenAI paths under `/openai`.
            return native_target(call, &format!("{prefix}/openai"));
        };
        let (path, query) = match call.to {
            Destination::Translated(_) => (format!("{prefix}/openai/deployments/{}/chat/completions", call.model), None),
            Destination::Relayed(route) => {
                let rest = call.client.uri.path().strip_prefix("/v1").unwrap_or(call.client.uri.path());
                let path = match route {
                    Route::ChatCompletions => format!("{prefix}/openai/deployments/{}/chat/completions", call.model),
                    Route::Embeddings => format!("{prefix}/openai/deployments/{}/embeddings", call.model),
                    // Images and audio live under their deployment too.
                    Route::Images { .. } | Route::Speech | Route::Transcription { .. } => {
                        format!("{prefix}/openai/deployments/{}{rest}", call.model)
                    }
                    _ => format!("{prefix}/openai{rest}"),
                };
                (path, upstream_query(call.client.uri.query(), route))
            }
        };
        match query {
            Some(q) => format!("{path}?api-version={version}&{q}"),
            None => format!("{path}?api-version={version}"),
        }
    }

    fn tokens(&self) -> Option<&TokenSource> {
        self.tokens.as_ref()
    }

    fn authenticate(
        &self,
        req: &mut RequestHeader,
        key: usize,
        token: Option<&http::HeaderValue>,
        _call: &Call<'_>,
        _body: &[u8],
    ) -> Result<(), SeamError> {
        match (&self.tokens, token) {
            (Some(_), Some(bearer)) => set(req, "authorization", bearer.clone()),
            (Some(_), None) => Err(SeamError::Credentials("no Entra ID token".into())),
            (None, _) => set(req, KEY_HEADER, self.keys.get(key)),
        }
    }
}

/// Entra ID's client-credentials grant for Azure OpenAI's scope.
struct ClientCredentials(Entra);

impl Grant for ClientCredentials {
    fn request(&self) -> Result<TokenRequest, SeamError> {
        let e = &self.0;
        let url = format!("{}/{}/oauth2/v2.0/token", e.authority_host, e.tenant_id);
        let form = vec![
            ("grant_type", "client_credentials".to_string()),
            ("client_id", e.client_id.clone()),
            ("client_secret", e.client_secret.clone()),
            ("scope", AZURE_SCOPE.to_string()),
        ];
        Ok((url, form))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{call, header};
    use super::*;
    use crate::config::Protocol;

    fn azure(version: Option<&str>) -> Azure {
        let config = crate::config::cloud::Azure { api_version: version.map(str::to_string), entra: None };
        Azure::new(&config, &["az-key-1".into()], "az")
    }

    #[test]
    fn deployment_urls_carry_the_deployment_and_the_api_version() {
        let seam = azure(Some("2024-10-21"));
        let client = RequestHeader::build("POST", b"/v1/chat/completions", None).unwrap();
        let chat = Route::ChatCompletions;
        let c = call(&client, &chat, "my-gpt", "gpt-x", Protocol::Openai);
        assert_eq!(seam.target(&c, ""), "/openai/deployments/my-gpt/chat/completions?api-version=2024-10-21");
        let embed_client = RequestHeader::build("POST", b"/v1/embeddings", None).unwrap();
        let embed = Route::Embeddings;
        assert_eq!(
            seam.target(&call(&embed_client, &embed, "emb", "emb", Protocol::Openai), "/x"),
            "/x/openai/deployments/emb/embeddings?api-version=2024-10-21"
        );
        let responses_client = RequestHeader::build("GET", b"/v1/responses/resp_1?include[]=a&secret=1", None).unwrap();
        let stored = Route::StoredResponse { id: "resp_1".into(), op: crate::route::ResponseOp::Get };
        assert_eq!(
            seam.target(&call(&responses_client, &stored, "d", "d", Protocol::Openai), ""),
            "/openai/responses/resp_1?api-version=2024-10-21&include[]=a"
        );
    }

    #[test]
    fn images_and_audio_go_under_their_deployment_and_moderations_are_not_offered() {
        let seam = azure(Some("2024-10-21"));
        for (path, route) in [
            ("/v1/images/generations", Route::Images { op: crate::route::ImageOp::Generate }),
            ("/v1/images/edits", Route::Images { op: crate::route::ImageOp::Edit }),
            ("/v1/audio/speech", Route::Speech),
            ("/v1/audio/transcriptions", Route::Transcription { translate: false }),
        ] {
            let client = RequestHeader::build("POST", path.as_bytes(), None).unwrap();
            let c = call(&client, &route, "dep", "m", Protocol::Openai);
            let rest = path.strip_prefix("/v1").unwrap();
            assert_eq!(seam.target(&c, ""), format!("/openai/deployments/dep{rest}?api-version=2024-10-21"));
            assert!(seam.serves(&route, Protocol::Openai, false));
        }
        assert!(!seam.serves(&Route::Moderations, Protocol::Openai, false));
        assert!(!seam.serves(&Route::Realtime, Protocol::Openai, false));
    }

    #[test]
    fn the_v1_api_keeps_the_openai_paths_under_openai_and_the_key_goes_in_api_key() {
        let seam = azure(None);
        let client = RequestHeader::build("POST", b"/v1/chat/completions", None).unwrap();
        let chat = Route::ChatCompletions;
        let c = call(&client, &chat, "my-gpt", "gpt-x", Protocol::Openai);
        assert_eq!(seam.target(&c, ""), "/openai/v1/chat/completions");
        let mut req = RequestHeader::build("POST", b"/", None).unwrap();
        seam.authenticate(&mut req, 0, None, &c, b"").unwrap();
        assert_eq!(header(&req, "api-key"), Some("az-key-1"));
        assert!(req.headers.get("api-key").unwrap().is_sensitive());
        assert_eq!(header(&req, "authorization"), None);
    }

    #[test]
    fn entra_asks_for_azure_openais_scope_at_the_tenants_endpoint() {
        let grant = ClientCredentials(Entra {
            tenant_id: "t-1".into(),
            client_id: "c-1".into(),
            client_secret: "s-1".into(),
            authority_host: "https://login.example".into(),
        });
        let (url, form) = grant.request().unwrap();
        assert_eq!(url, "https://login.example/t-1/oauth2/v2.0/token");
        assert!(form.contains(&("grant_type", "client_credentials".into())));
        assert!(form.contains(&("scope", "https://cognitiveservices.azure.com/.default".into())));
        assert!(!format!("{:?}", grant.0).contains("s-1"), "the secret is not in Debug");
    }
}
