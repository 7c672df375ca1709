//! The cloud kinds of provider: `protocol: bedrock`, `vertex` and `azure-openai` — their
//! settings and credentials, read and checked when the file is loaded (so `-t` finds a missing
//! variable, an unreadable service-account file or a key that does not parse) without calling
//! out. Secrets are kept out of `Debug`.

use super::{err, secret, ConfigError, Protocol};
use serde::Deserialize;
use std::path::PathBuf;

/// What a provider's `protocol:` names: one of the three wire protocols with a static key, or
/// a cloud service that speaks one (or two) of them behind its own addressing and credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProviderKind {
    Openai,
    Anthropic,
    Gemini,
    Bedrock,
    Vertex,
    AzureOpenai,
}

impl ProviderKind {
    /// The wire protocol its requests are written in (Vertex: per model, see
    /// [`Cloud::wire_of`]; this is the one its Gemini models speak).
    pub fn protocol(self) -> Protocol {
        match self {
            ProviderKind::Openai | ProviderKind::AzureOpenai => Protocol::Openai,
            ProviderKind::Anthropic | ProviderKind::Bedrock => Protocol::Anthropic,
            ProviderKind::Gemini | ProviderKind::Vertex => Protocol::Gemini,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Openai => "openai",
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::Gemini => "gemini",
            ProviderKind::Bedrock => "bedrock",
            ProviderKind::Vertex => "vertex",
            ProviderKind::AzureOpenai => "azure-openai",
        }
    }
}

/// A cloud provider's own settings.
#[derive(Debug, Clone)]
pub enum Cloud {
    Bedrock(Bedrock),
    Vertex(Vertex),
    Azure(Azure),
}

impl Cloud {
    /// The wire protocol of requests for `upstream_model` (the name the cloud knows it by):
    /// Vertex serves Anthropic's models (`claude-…`) in the messages protocol through
    /// `rawPredict`, and Google's in generate-content; the others speak one protocol.
    pub fn wire_of(cloud: Option<&Cloud>, default: Protocol, upstream_model: &str) -> Protocol {
        match cloud {
            Some(Cloud::Vertex(_)) if is_anthropic_on_vertex(upstream_model) => Protocol::Anthropic,
            _ => default,
        }
    }
}

/// Whether a Vertex model is one of Anthropic's (published under `publishers/anthropic`).
pub fn is_anthropic_on_vertex(upstream_model: &str) -> bool {
    upstream_model.starts_with("claude")
}

/// `protocol: bedrock`: the region and the signing credentials.
#[derive(Debug, Clone)]
pub struct Bedrock {
    pub region: String,
    pub credentials: AwsCredentials,
}

/// An AWS access key (and session token, for temporary credentials).
#[derive(Clone)]
pub struct AwsCredentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

impl std::fmt::Debug for AwsCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsCredentials").field("access_key_id", &self.access_key_id).finish_non_exhaustive()
    }
}

/// `protocol: vertex`: the project, the location and the service account that signs in.
#[derive(Debug, Clone)]
pub struct Vertex {
    pub project: String,
    pub location: String,
    pub account: ServiceAccount,
}

/// A Google service account's key file, as far as signing in needs it.
#[derive(Clone)]
pub struct ServiceAccount {
    pub client_email: String,
    pub private_key_id: Option<String>,
    /// PEM (PKCS#8) RSA private key.
    pub private_key: String,
    pub token_uri: String,
}

impl std::fmt::Debug for ServiceAccount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAccount")
            .field("client_email", &self.client_email)
            .field("token_uri", &self.token_uri)
            .finish_non_exhaustive()
    }
}

/// `protocol: azure-openai`: the API version (None: the v1 API, `/openai/v1/…`) and how it signs in.
#[derive(Debug, Clone)]
pub struct Azure {
    pub api_version: Option<String>,
    /// None: the provider's `api_key` pool in the `api-key` header.
    pub entra: Option<Entra>,
}

/// Microsoft Entra ID client credentials.
#[derive(Clone)]
pub struct Entra {
    pub tenant_id: String,
    pub client_id: String,
    pub client_secret: String,
    /// `https://login.microsoftonline.com` unless set.
    pub authority_host: String,
}

impl std::fmt::Debug for Entra {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entra")
            .field("tenant_id", &self.tenant_id)
            .field("client_id", &self.client_id)
            .field("authority_host", &self.authority_host)
            .finish_non_exhaustive()
    }
}

/// The scope an Entra token is asked for: Azure OpenAI's.
pub const AZURE_SCOPE: &str = "https://cognitiveservices.azure.com/.default";

/// The scope a Vertex token is asked for.
pub const VERTEX_SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";

/// Microsoft's public cloud sign-in host.
const DEFAULT_AUTHORITY_HOST: &str = "https://login.microsoftonline.com";

/// `aws: { access_key_id_env, secret_access_key_env, session_token_env }` (or the literal
/// `access_key_id`, `secret_access_key`, `session_token`: for the offline demo and tests).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAws {
    #[serde(default)]
    access_key_id: Option<String>,
    #[serde(default)]
    secret_access_key: Option<String>,
    #[serde(default)]
    session_token: Option<String>,
    #[serde(default)]
    access_key_id_env: Option<String>,
    #[serde(default)]
    secret_access_key_env: Option<String>,
    #[serde(default)]
    session_token_env: Option<String>,
}

/// `entra: { tenant_id, client_id, client_secret_env (or client_secret, as a provider's
/// api_key may be written: for a demo or a test), authority_host }`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEntra {
    #[serde(default)]
    tenant_id: Option<String>,
    #[serde(default)]
    client_id: Option<String>,
    #[serde(default)]
    client_secret_env: Option<String>,
    #[serde(default)]
    client_secret: Option<String>,
    #[serde(default)]
    authority_host: Option<String>,
}

/// A provider's cloud settings as written (all optional: which apply depends on its kind).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCloud {
    #[serde(default)]
    pub region: Option<String>,
    #[serde(default)]
    pub endpoint_url: Option<String>,
    #[serde(default)]
    pub aws: Option<RawAws>,
    #[serde(default)]
    pub project: Option<String>,
    #[serde(default)]
    pub location: Option<String>,
    #[serde(default)]
    pub credentials_file: Option<PathBuf>,
    #[serde(default)]
    pub api_version: Option<String>,
    #[serde(default)]
    pub entra: Option<RawEntra>,
}

/// The cloud settings of a provider of `kind` and its base URL (derived where the cloud has a
/// standard endpoint), or refusals naming the key at fault.
pub(super) fn cloud(
    at: &str,
    kind: ProviderKind,
    raw: RawCloud,
    base_url: Option<String>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(Option<Cloud>, String), ConfigError> {
    let only = |key: &str, set: bool, kinds: &str| if set { err(format!("{at}.{key}: only for protocol {kinds}")) } else { Ok(()) };
    only("region", raw.region.is_some() && kind != ProviderKind::Bedrock, "bedrock")?;
    only("endpoint_url", raw.endpoint_url.is_some() && kind != ProviderKind::Bedrock, "bedrock (elsewhere: base_url)")?;
    only("aws", raw.aws.is_some() && kind != ProviderKind::Bedrock, "bedrock")?;
    let vertex = kind == ProviderKind::Vertex;
    only("project", raw.project.is_some() && !vertex, "vertex")?;
    only("location", raw.location.is_some() && !vertex, "vertex")?;
    only("credentials_file", raw.credentials_file.is_some() && !vertex, "vertex")?;
    let azure = kind == ProviderKind::AzureOpenai;
    only("api_version", raw.api_version.is_some() && !azure, "azure-openai")?;
    only("entra", raw.entra.is_some() && !azure, "azure-openai")?;
    match kind {
        ProviderKind::Bedrock => bedrock(at, raw, base_url, env),
        ProviderKind::Vertex => vertex_settings(at, raw, base_url, env),
        ProviderKind::AzureOpenai => {
            let Some(url) = base_url else {
                return err(format!("{at}.base_url: required: the resource's endpoint (https://<resource>.openai.azure.com)"));
            };
            if let Some(v) = &raw.api_version {
                if v.is_empty() || !v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.') {
                    return err(format!("{at}.api_version: '{v}' is not an API version (like 2024-10-21, or v1)"));
                }
            }
            let api_version = raw.api_version.filter(|v| v != "v1");
            let entra = raw.entra.map(|e| entra(at, e, env)).transpose()?;
            Ok((Some(Cloud::Azure(Azure { api_version, entra })), url))
        }
        _ => match base_url {
            Some(url) => Ok((None, url)),
            None => err(format!("{at}.base_url: required")),
        },
    }
}

fn bedrock(
    at: &str,
    raw: RawCloud,
    base_url: Option<String>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(Option<Cloud>, String), ConfigError> {
    if base_url.is_some() {
        return err(format!("{at}.base_url: a bedrock provider is addressed by its region (or endpoint_url for tests and VPC endpoints)"));
    }
    let Some(region) = raw.region else {
        return err(format!("{at}.region: required for protocol bedrock (like us-east-1)"));
    };
    if region.is_empty() || !region.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-') {
        return err(format!("{at}.region: '{region}' is not an AWS region (like us-east-1)"));
    }
    let aws = raw.aws.unwrap_or_default();
    // The literal, else the named variable (as every secret of the file), else the standard one.
    let var = |key: &str,
               literal: Option<String>,
               given: Option<String>,
               standard: &str,
               required: bool|
     -> Result<Option<String>, ConfigError> {
        if let Some(v) = secret(&format!("{at}.aws.{key}"), literal, given, env)? {
            return Ok(Some(v));
        }
        match env(standard).filter(|v| !v.is_empty()) {
            Some(v) => Ok(Some(v)),
            None if required => err(format!("{at}.aws.{key}_env: environment variable {standard} is not set")),
            None => Ok(None),
        }
    };
    let credentials = AwsCredentials {
        access_key_id: var("access_key_id", aws.access_key_id, aws.access_key_id_env, "AWS_ACCESS_KEY_ID", true)?.unwrap_or_default(),
        secret_access_key: var("secret_access_key", aws.secret_access_key, aws.secret_access_key_env, "AWS_SECRET_ACCESS_KEY", true)?
            .unwrap_or_default(),
        session_token: var("session_token", aws.session_token, aws.session_token_env, "AWS_SESSION_TOKEN", false)?,
    };
    let url = raw.endpoint_url.unwrap_or_else(|| format!("https://bedrock-runtime.{region}.amazonaws.com"));
    Ok((Some(Cloud::Bedrock(Bedrock { region, credentials })), url))
}

fn vertex_settings(
    at: &str,
    raw: RawCloud,
    base_url: Option<String>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(Option<Cloud>, String), ConfigError> {
    let name_ok = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    let Some(project) = raw.project.filter(|p| name_ok(p)) else {
        return err(format!("{at}.project: required for protocol vertex (the Google Cloud project id)"));
    };
    let Some(location) = raw.location.filter(|l| name_ok(l)) else {
        return err(format!("{at}.location: required for protocol vertex (like us-central1, us-east5 or global)"));
    };
    let (path, from) = match raw.credentials_file {
        Some(p) => (p, "credentials_file"),
        None => match env("GOOGLE_APPLICATION_CREDENTIALS").filter(|v| !v.is_empty()) {
            Some(p) => (PathBuf::from(p), "GOOGLE_APPLICATION_CREDENTIALS"),
            None => {
                return err(format!(
                    "{at}.credentials_file: required (or GOOGLE_APPLICATION_CREDENTIALS): a service account's JSON key file"
                ))
            }
        },
    };
    let account =
        service_account(&path).map_err(|e| ConfigError(format!("{at}.credentials_file: {} (from {from}): {e}", path.display())))?;
    let url = base_url.unwrap_or_else(|| match location.as_str() {
        "global" => "https://aiplatform.googleapis.com".to_string(),
        l => format!("https://{l}-aiplatform.googleapis.com"),
    });
    Ok((Some(Cloud::Vertex(Vertex { project, location, account })), url))
}

/// A service account's key file, read and its key parsed (a key that cannot sign is refused
/// now, not at the first request).
pub fn service_account(path: &std::path::Path) -> Result<ServiceAccount, String> {
    #[derive(Deserialize)]
    struct File {
        #[serde(rename = "type")]
        kind: Option<String>,
        client_email: Option<String>,
        private_key_id: Option<String>,
        private_key: Option<String>,
        token_uri: Option<String>,
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read it ({e})"))?;
    let file: File = serde_json::from_str(&text).map_err(|e| format!("not a JSON key file ({e})"))?;
    if let Some(kind) = file.kind.as_deref().filter(|k| *k != "service_account") {
        return Err(format!("a '{kind}' credential; only service-account keys are supported"));
    }
    let (Some(client_email), Some(private_key)) = (file.client_email, file.private_key) else {
        return Err("no client_email or private_key in it".into());
    };
    jsonwebtoken::EncodingKey::from_rsa_pem(private_key.as_bytes())
        .map_err(|e| format!("its private_key is not an RSA key in PEM ({e})"))?;
    let token_uri = file.token_uri.unwrap_or_else(|| "https://oauth2.googleapis.com/token".to_string());
    if !(token_uri.starts_with("https://") || token_uri.starts_with("http://")) {
        return Err(format!("token_uri '{token_uri}' is not an http(s) URL"));
    }
    Ok(ServiceAccount { client_email, private_key_id: file.private_key_id, private_key, token_uri })
}

/// `entra:`, its gaps filled from the standard `AZURE_*` variables.
fn entra(at: &str, raw: RawEntra, env: &dyn Fn(&str) -> Option<String>) -> Result<Entra, ConfigError> {
    let from = |given: Option<String>, standard: &str, key: &str| -> Result<String, ConfigError> {
        match given.or_else(|| env(standard)).filter(|v| !v.is_empty()) {
            Some(v) => Ok(v),
            None => err(format!("{at}.entra.{key}: required (or the environment variable {standard})")),
        }
    };
    let tenant_id = from(raw.tenant_id, "AZURE_TENANT_ID", "tenant_id")?;
    let client_id = from(raw.client_id, "AZURE_CLIENT_ID", "client_id")?;
    let client_secret = match (raw.client_secret_env, raw.client_secret.filter(|s| !s.is_empty())) {
        (Some(_), Some(_)) => return err(format!("{at}.entra: client_secret or client_secret_env, not both")),
        (None, Some(secret)) => secret,
        (Some(name), None) => match env(&name).filter(|v| !v.is_empty()) {
            Some(v) => v,
            None => return err(format!("{at}.entra.client_secret_env: environment variable {name} is not set")),
        },
        (None, None) => from(None, "AZURE_CLIENT_SECRET", "client_secret_env")?,
    };
    let authority_host = raw
        .authority_host
        .or_else(|| env("AZURE_AUTHORITY_HOST"))
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| DEFAULT_AUTHORITY_HOST.to_string())
        .trim_end_matches('/')
        .to_string();
    if !(authority_host.starts_with("https://") || authority_host.starts_with("http://")) {
        return err(format!("{at}.entra.authority_host: '{authority_host}' is not an http(s) URL"));
    }
    if !tenant_id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.') {
        return err(format!("{at}.entra.tenant_id: '{tenant_id}' is not a tenant id or domain"));
    }
    Ok(Entra { tenant_id, client_id, client_secret, authority_host })
}

#[cfg(test)]
mod tests {
    use crate::config::{Cloud, Config, Protocol, ProviderKind};

    fn parse(provider: &str, env: &[(&str, &str)]) -> Result<crate::config::ProviderConfig, String> {
        let text = format!(
            "listen: 127.0.0.1:1\nproviders:\n  - {provider}\nprices: {{m: {{input: 1, output: 1}}, c: {{input: 1, output: 1}}}}\n"
        );
        let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Config::parse(&text, &|name| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
            .map(|mut c| c.providers.remove(0))
            .map_err(|e| e.0)
    }

    fn fixture() -> String {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("conf/demo/vertex-sa.json").display().to_string()
    }

    #[test]
    fn bedrock_takes_its_region_and_the_standard_variables_and_refuses_a_key() {
        let aws = [("AWS_ACCESS_KEY_ID", "AKID1"), ("AWS_SECRET_ACCESS_KEY", "s3cret")];
        let p = parse("{name: b, protocol: bedrock, region: eu-west-1, models: [{name: m, upstream: 'anthropic.claude-x-v1:0'}]}", &aws)
            .unwrap();
        assert_eq!((p.kind, p.protocol), (ProviderKind::Bedrock, Protocol::Anthropic));
        assert_eq!(p.base_url.host, "bedrock-runtime.eu-west-1.amazonaws.com");
        assert_eq!(p.upstream_model("m"), "anthropic.claude-x-v1:0");
        let Some(Cloud::Bedrock(b)) = &p.cloud else { panic!("{:?}", p.cloud) };
        assert_eq!((b.credentials.access_key_id.as_str(), b.credentials.session_token.as_deref()), ("AKID1", None));
        assert!(!format!("{p:?}").contains("s3cret"), "no secret in Debug");
        let missing = parse("{name: b, protocol: bedrock, region: eu-west-1, models: [m]}", &[]).unwrap_err();
        assert!(missing.contains("providers[0].aws.access_key_id_env: environment variable AWS_ACCESS_KEY_ID is not set"), "{missing}");
        let named = parse("{name: b, protocol: bedrock, region: eu-west-1, aws: {session_token_env: TOK}, models: [m]}", &aws).unwrap_err();
        assert!(named.contains("session_token_env: environment variable TOK is not set"), "{named}");
        let keyed = parse("{name: b, protocol: bedrock, region: eu-west-1, api_key: k, models: [m]}", &aws).unwrap_err();
        assert!(keyed.contains("api_key: not used"), "{keyed}");
        assert!(parse("{name: b, protocol: bedrock, models: [m]}", &aws).unwrap_err().contains("region: required"));
        assert!(parse("{name: b, protocol: bedrock, region: 'us east', models: [m]}", &aws).unwrap_err().contains("not an AWS region"));
        let local =
            parse("{name: b, protocol: bedrock, region: us-east-1, endpoint_url: 'http://127.0.0.1:9/x', models: [m]}", &aws).unwrap();
        assert_eq!((local.base_url.port, local.base_url.prefix.as_str()), (9, "/x"));
        assert!(parse("{name: o, protocol: openai, base_url: 'http://h', api_key: k, region: us-east-1, models: [m]}", &[])
            .unwrap_err()
            .contains("region: only for protocol bedrock"));
    }

    #[test]
    fn vertex_reads_its_service_account_now_and_serves_claude_over_messages() {
        let p = parse(&format!("{{name: v, protocol: vertex, project: p1, location: global, credentials_file: '{}', models: [m, {{name: c, upstream: 'claude-x@1'}}]}}", fixture()), &[]).unwrap();
        assert_eq!(p.base_url.host, "aiplatform.googleapis.com");
        assert_eq!((p.wire("m"), p.wire("c")), (Protocol::Gemini, Protocol::Anthropic));
        let from_env = parse(
            "{name: v, protocol: vertex, project: p1, location: us-east5, models: [m]}",
            &[("GOOGLE_APPLICATION_CREDENTIALS", &fixture())],
        )
        .unwrap();
        assert_eq!(from_env.base_url.host, "us-east5-aiplatform.googleapis.com");
        let missing = parse("{name: v, protocol: vertex, project: p1, location: l, credentials_file: /nonexistent.json, models: [m]}", &[])
            .unwrap_err();
        assert!(missing.contains("credentials_file: /nonexistent.json (from credentials_file): cannot read it"), "{missing}");
        let dir = tempfile::tempdir().unwrap();
        let user = dir.path().join("adc.json");
        std::fs::write(&user, r#"{"type":"authorized_user","client_id":"x","refresh_token":"y"}"#).unwrap();
        let e = parse(
            &format!("{{name: v, protocol: vertex, project: p1, location: l, credentials_file: '{}', models: [m]}}", user.display()),
            &[],
        )
        .unwrap_err();
        assert!(e.contains("only service-account keys are supported"), "{e}");
        let bad_key = dir.path().join("bad.json");
        std::fs::write(&bad_key, r#"{"type":"service_account","client_email":"a@b","private_key":"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"}"#).unwrap();
        let e = parse(
            &format!("{{name: v, protocol: vertex, project: p1, location: l, credentials_file: '{}', models: [m]}}", bad_key.display()),
            &[],
        )
        .unwrap_err();
        assert!(e.contains("private_key is not an RSA key"), "{e}");
    }

    #[test]
    fn azure_takes_a_key_or_entra_and_refuses_a_base_url_that_names_openai() {
        let p = parse("{name: a, protocol: azure-openai, base_url: 'https://r.openai.azure.com', api_key_env: AZ, api_version: 2024-10-21, models: [{name: m, upstream: dep-1}]}", &[("AZ", "k1")]).unwrap();
        assert_eq!((p.kind, p.protocol, p.api_keys.clone()), (ProviderKind::AzureOpenai, Protocol::Openai, vec!["k1".to_string()]));
        let Some(Cloud::Azure(a)) = &p.cloud else { panic!() };
        assert_eq!(a.api_version.as_deref(), Some("2024-10-21"));
        let v1 = parse(
            "{name: a, protocol: azure-openai, base_url: 'https://r.openai.azure.com', api_key: k, api_version: v1, models: [m]}",
            &[],
        )
        .unwrap();
        assert!(matches!(&v1.cloud, Some(Cloud::Azure(a)) if a.api_version.is_none()), "v1 is the v1 API");
        let e = parse("{name: a, protocol: azure-openai, base_url: 'https://r.openai.azure.com/openai/v1', api_key: k, models: [m]}", &[])
            .unwrap_err();
        assert!(e.contains("write base_url: https://r.openai.azure.com"), "{e}");
        let entra_env = [("AZURE_TENANT_ID", "t1"), ("AZURE_CLIENT_ID", "c1"), ("AZURE_CLIENT_SECRET", "shh")];
        let p =
            parse("{name: a, protocol: azure-openai, base_url: 'https://r.openai.azure.com', entra: {}, models: [m]}", &entra_env).unwrap();
        let Some(Cloud::Azure(a)) = &p.cloud else { panic!() };
        let e = a.entra.as_ref().unwrap();
        assert_eq!(
            (e.tenant_id.as_str(), e.client_secret.as_str(), e.authority_host.as_str()),
            ("t1", "shh", "https://login.microsoftonline.com")
        );
        assert!(p.api_keys.is_empty());
        let e = parse("{name: a, protocol: azure-openai, base_url: 'https://r', entra: {tenant_id: t, client_id: c}, models: [m]}", &[])
            .unwrap_err();
        assert!(e.contains("entra.client_secret_env: required (or the environment variable AZURE_CLIENT_SECRET)"), "{e}");
        // A secret written in the file (the demo's), or its variable: one of them.
        let p = parse(
            "{name: a, protocol: azure-openai, base_url: 'https://r', entra: {tenant_id: t, client_id: c, client_secret: s3}, models: [m]}",
            &[],
        )
        .unwrap();
        let Some(Cloud::Azure(a)) = &p.cloud else { panic!() };
        assert_eq!(a.entra.as_ref().map(|e| e.client_secret.as_str()), Some("s3"));
        let both = "{name: a, protocol: azure-openai, base_url: 'https://r', entra: {tenant_id: t, client_id: c, client_secret: s3, client_secret_env: X}, models: [m]}";
        assert!(parse(both, &[("X", "y")]).unwrap_err().contains("client_secret or client_secret_env, not both"));
    }

    #[test]
    fn an_upstream_name_must_be_usable_in_a_path() {
        let e =
            parse("{name: o, protocol: openai, base_url: 'http://h', api_key: k, models: [{name: m, upstream: 'a/b'}]}", &[]).unwrap_err();
        assert!(e.contains("upstream name 'a/b' of 'm' is not a valid model id"), "{e}");
        let same = parse("{name: o, protocol: openai, base_url: 'http://h', api_key: k, models: [{name: m, upstream: m}]}", &[]).unwrap();
        assert!(same.upstream_names.is_empty(), "the same name is no alias");
    }
}
