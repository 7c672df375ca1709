//! SigV4 for a cloud seam (Bedrock), at a native relay's cost. The AWS SDK's signer
//! (`aws_sigv4::http_request::sign`) derives the signing key — four HMACs — on every request
//! and builds the canonical request and string to sign as strings; its API takes no key. Here
//! the key is derived by the SDK's own `v4::generate_signing_key` once per (date, region,
//! service, credentials) and kept keyed (the HMAC state with its pads absorbed), and the
//! canonical request and string to sign are fed to the hashes piece by piece, never built. The
//! signature is the SDK's `v4::calculate_signature` arithmetic on that key.
//!
//! Only the shape every seam request has is signed this way: a path of unreserved characters,
//! `/` and percent escapes, without dot segments or empty segments, no query, header values
//! without surrounding or doubled spaces. Anything else goes to the SDK's signer, whole
//! (`Signer::sign` decides). A unit test signs the same requests both ways and compares.

use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SigningSettings};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::time::SystemTime;

type HmacSha256 = Hmac<Sha256>;

/// The credentials and scope one seam signs with.
pub struct Signer {
    access_key_id: String,
    secret_access_key: String,
    session_token: Option<String>,
    region: String,
    service: &'static str,
    /// For the SDK's signer (requests of another shape).
    identity: Identity,
    /// The day's signing key, keyed: derived when the date (UTC) changes.
    day: arc_swap::ArcSwapOption<DayKey>,
}

struct DayKey {
    /// `YYYYMMDD`.
    date: [u8; 8],
    mac: HmacSha256,
}

/// A signature's headers, in the order the SDK gives them.
#[derive(Debug, PartialEq, Eq)]
pub struct Signed {
    pub amz_date: String,
    pub authorization: String,
    pub security_token: Option<String>,
}

/// What is signed of a request.
pub struct Request<'a> {
    pub method: &'a str,
    pub host: &'a str,
    /// Path and query, as sent.
    pub path_and_query: &'a str,
    pub content_type: Option<&'a str>,
    pub body: &'a [u8],
}

impl Signer {
    pub fn new(access_key_id: &str, secret_access_key: &str, session_token: Option<&str>, region: &str, service: &'static str) -> Signer {
        let credentials = aws_credential_types::Credentials::new(
            access_key_id,
            secret_access_key,
            session_token.map(str::to_string),
            None,
            "tollgate-config",
        );
        Signer {
            access_key_id: access_key_id.to_string(),
            secret_access_key: secret_access_key.to_string(),
            session_token: session_token.map(str::to_string),
            region: region.to_string(),
            service,
            identity: credentials.into(),
            day: arc_swap::ArcSwapOption::empty(),
        }
    }

    /// Sign `req` as of `time`.
    pub fn sign(&self, req: &Request<'_>, time: SystemTime) -> Result<Signed, String> {
        let plain_day = Stamp::of(time).filter(|_| plain(req)).and_then(|stamp| Some((self.key(&stamp, time)?, stamp)));
        match plain_day {
            Some((day, stamp)) => Ok(self.sign_plain(req, &stamp, &day)),
            None => self.sign_by_sdk(req, time),
        }
    }

    /// The day's key for `stamp`, derived by the SDK's function the first time that day.
    fn key(&self, stamp: &Stamp, time: SystemTime) -> Option<Arc<DayKey>> {
        if let Some(day) = self.day.load_full().filter(|d| d.date == stamp.date) {
            return Some(day);
        }
        let key = v4::generate_signing_key(&self.secret_access_key, time, &self.region, self.service);
        let mac = <HmacSha256 as Mac>::new_from_slice(key.as_ref()).ok()?;
        let day = Arc::new(DayKey { date: stamp.date, mac });
        self.day.store(Some(day.clone()));
        Some(day)
    }

    fn sign_plain(&self, req: &Request<'_>, stamp: &Stamp, day: &DayKey) -> Signed {
        let signed_headers = match (req.content_type.is_some(), self.session_token.is_some()) {
            (true, true) => "content-type;host;x-amz-date;x-amz-security-token",
            (true, false) => "content-type;host;x-amz-date",
            (false, true) => "host;x-amz-date;x-amz-security-token",
            (false, false) => "host;x-amz-date",
        };
        let amz_date = std::str::from_utf8(&stamp.date_time).unwrap_or_default();
        // The canonical request, hashed as it is written.
        let mut creq = Sha256::new();
        creq.update(req.method.as_bytes());
        creq.update(b"\n");
        // The path encoded once more (the SDK's double encoding: `%` becomes `%25`).
        for part in req.path_and_query.as_bytes().split_inclusive(|b| *b == b'%') {
            match part.split_last() {
                Some((b'%', head)) => {
                    creq.update(head);
                    creq.update(b"%25");
                }
                _ => creq.update(part),
            }
        }
        creq.update(b"\n\n");
        if let Some(ct) = req.content_type {
            header_line(&mut creq, "content-type", ct);
        }
        header_line(&mut creq, "host", req.host);
        header_line(&mut creq, "x-amz-date", amz_date);
        if let Some(token) = &self.session_token {
            header_line(&mut creq, "x-amz-security-token", token);
        }
        creq.update(b"\n");
        creq.update(signed_headers.as_bytes());
        creq.update(b"\n");
        creq.update(hex(&Sha256::digest(req.body)));
        // The string to sign, into the day's keyed HMAC.
        let mut mac = day.mac.clone();
        let date = stamp.date;
        mac.update(b"AWS4-HMAC-SHA256\n");
        mac.update(amz_date.as_bytes());
        mac.update(b"\n");
        mac.update(&date);
        for part in ["/", &self.region, "/", self.service, "/aws4_request\n"] {
            mac.update(part.as_bytes());
        }
        mac.update(&hex(&creq.finalize()));
        let signature = hex(&mac.finalize().into_bytes());
        let date = std::str::from_utf8(&date).unwrap_or_default();
        let signature = std::str::from_utf8(&signature).unwrap_or_default();
        let authorization = format!(
            "AWS4-HMAC-SHA256 Credential={}/{date}/{}/{}/aws4_request, SignedHeaders={signed_headers}, Signature={signature}",
            self.access_key_id, self.region, self.service
        );
        Signed { amz_date: amz_date.to_string(), authorization, security_token: self.session_token.clone() }
    }

    /// The SDK's signer, whole: for a request of another shape.
    fn sign_by_sdk(&self, req: &Request<'_>, time: SystemTime) -> Result<Signed, String> {
        let mut headers: Vec<(&str, &str)> = vec![("host", req.host)];
        if let Some(ct) = req.content_type {
            headers.push(("content-type", ct));
        }
        let uri = format!("https://{}{}", req.host, req.path_and_query);
        let request =
            SignableRequest::new(req.method, uri, headers.into_iter(), SignableBody::Bytes(req.body)).map_err(|e| e.to_string())?;
        let params = v4::SigningParams::builder()
            .identity(&self.identity)
            .region(&self.region)
            .name(self.service)
            .time(time)
            .settings(SigningSettings::default())
            .build()
            .map_err(|e| e.to_string())?
            .into();
        let (instructions, _signature) = sign(request, &params).map_err(|e| e.to_string())?.into_parts();
        let (headers, _params) = instructions.into_parts();
        let mut signed = Signed { amz_date: String::new(), authorization: String::new(), security_token: None };
        for h in headers {
            match h.name() {
                "x-amz-date" => signed.amz_date = h.value().to_string(),
                "authorization" => signed.authorization = h.value().to_string(),
                "x-amz-security-token" => signed.security_token = Some(h.value().to_string()),
                other => return Err(format!("the signer asked for a header this seam does not send: {other}")),
            }
        }
        Ok(signed)
    }
}

/// `name:value\n` of the canonical headers.
fn header_line(h: &mut Sha256, name: &str, value: &str) {
    h.update(name.as_bytes());
    h.update(b":");
    h.update(value.as_bytes());
    h.update(b"\n");
}

/// A request the plain signer signs exactly as the SDK would (see the module's note).
fn plain(req: &Request<'_>) -> bool {
    let path = req.path_and_query.as_bytes();
    let path_ok = path.first() == Some(&b'/')
        && path.iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/' | b'%'))
        && path[1..].split(|b| *b == b'/').all(|seg| !seg.is_empty() && seg != b"." && seg != b"..")
        && escapes_ok(path);
    let value_ok = |v: &str| {
        !v.is_empty()
            && v.bytes().all(|b| (0x21..0x7f).contains(&b) || b == b' ')
            && !v.starts_with(' ')
            && !v.ends_with(' ')
            && !v.contains("  ")
    };
    path_ok && req.method.bytes().all(|b| b.is_ascii_uppercase()) && value_ok(req.host) && req.content_type.is_none_or(value_ok)
}

/// Every `%` starts an escape of two hex digits.
fn escapes_ok(path: &[u8]) -> bool {
    path.iter()
        .enumerate()
        .filter(|(_, b)| **b == b'%')
        .all(|(i, _)| path.get(i + 1..i + 3).is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)))
}

/// Lowercase hex of a 32-byte digest.
fn hex(bytes: &[u8]) -> [u8; 64] {
    let mut out = [0u8; 64];
    crate::base::text::hex_into(bytes, &mut out);
    out
}

/// A signature's time, in UTC: `YYYYMMDD` and `YYYYMMDDTHHMMSSZ`.
struct Stamp {
    date: [u8; 8],
    date_time: [u8; 16],
}

impl Stamp {
    fn of(time: SystemTime) -> Option<Stamp> {
        let at = jiff::Timestamp::try_from(time).ok()?.to_zoned(jiff::tz::TimeZone::UTC).datetime();
        let year = u16::try_from(at.year()).ok().filter(|y| *y <= 9999)?;
        let mut date_time = *b"00000000T000000Z";
        let fields = [(0, 4, u32::from(year)), (4, 2, at.month() as u32), (6, 2, at.day() as u32)];
        let clock = [(9, 2, at.hour() as u32), (11, 2, at.minute() as u32), (13, 2, at.second() as u32)];
        for (at, width, mut n) in fields.into_iter().chain(clock) {
            for i in (at..at + width).rev() {
                date_time[i] = b'0' + (n % 10) as u8;
                n /= 10;
            }
        }
        let mut date = [0u8; 8];
        date.copy_from_slice(&date_time[..8]);
        Some(Stamp { date, date_time })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn signer(token: Option<&str>) -> Signer {
        Signer::new("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token, "us-east-1", "bedrock")
    }

    fn request<'a>(path: &'a str, content_type: Option<&'a str>, body: &'a [u8]) -> Request<'a> {
        Request { method: "POST", host: "bedrock-runtime.us-east-1.amazonaws.com", path_and_query: path, content_type, body }
    }

    #[test]
    fn the_plain_signer_signs_exactly_as_the_sdks_signer_and_keeps_one_key_a_day() {
        let paths = [
            "/model/anthropic.claude-sonnet-4-6-v1%3A0/invoke",
            "/model/us.anthropic.claude-bench-v1%3A0/invoke-with-response-stream",
            "/vpc/model/meta.llama3-70b-instruct-v1%3A0/converse",
            "/model/m/invoke",
        ];
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_764_000_000);
        for token in [None, Some("session-token-1")] {
            let s = signer(token);
            for (i, path) in paths.iter().enumerate() {
                for ct in [Some("application/json"), None] {
                    // Across midnight: the day's key is derived again.
                    for t in [start, start + Duration::from_secs(86_400 * i as u64 + 3_599)] {
                        let body = format!(r#"{{"max_tokens":{i},"messages":[]}}"#);
                        let req = request(path, ct, body.as_bytes());
                        assert!(plain(&req), "{path}");
                        let ours = s.sign(&req, t).unwrap();
                        assert_eq!(ours, s.sign_by_sdk(&req, t).unwrap(), "{path} {ct:?} {token:?}");
                        let date = &ours.amz_date[..8];
                        assert_eq!(s.day.load_full().map(|d| d.date.to_vec()), Some(date.as_bytes().to_vec()));
                    }
                }
            }
        }
    }

    #[test]
    fn requests_of_another_shape_go_to_the_sdks_signer() {
        let s = signer(None);
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_764_000_000);
        for path in ["/model/a/invoke?x=1", "/model//invoke", "/model/./invoke", "/a/"] {
            let req = request(path, Some("application/json"), b"{}");
            assert!(!plain(&req), "{path}");
            let signed = s.sign(&req, t).unwrap();
            assert_eq!(signed, s.sign_by_sdk(&req, t).unwrap(), "{path}");
        }
        let spaced = request("/model/a/invoke", Some(" application/json"), b"{}");
        assert!(!plain(&spaced));
        assert!(s.day.load_full().is_none(), "the SDK's signer keeps no key here");
    }
}
