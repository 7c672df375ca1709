//! Text helpers that know no rule of tollgate's.

/// A query-string component percent-decoded (`+` is a space); invalid UTF-8 is replaced.
pub fn decode_component(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex_digit = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match (hex_digit(bytes[i + 1]), hex_digit(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A path segment or query component percent-encoded: everything but RFC 3986's unreserved
/// characters (`anthropic.claude-…-v1:0` → `…-v1%3A0`, as the AWS SDKs write a model id).
pub fn encode_component(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The most characters of a string a client chose (a model or tool name, a field's name) that
/// reach any sink: a log line, the request log, a span, a metric label, an error's `param`.
pub const MAX_CLIENT_STRING: usize = 256;

/// The most characters of an error message a client is answered with (it may quote what the
/// client sent).
pub const MAX_ERROR_MESSAGE: usize = 2048;

/// `s` cut to at most `max` characters, with `…` in place of the rest; borrowed when it fits.
pub fn clip(s: &str, max: usize) -> std::borrow::Cow<'_, str> {
    match s.char_indices().nth(max) {
        None => std::borrow::Cow::Borrowed(s),
        Some((at, _)) => std::borrow::Cow::Owned(format!("{}…", &s[..at])),
    }
}

/// Cut a client's string in place (see [`clip`]).
pub fn clip_in_place(s: &mut String, max: usize) {
    if let std::borrow::Cow::Owned(cut) = clip(s, max) {
        *s = cut;
    }
}

/// A URL as it may be logged or shown: any `user:password@` removed and every query value
/// replaced (`?api_key=redacted`) — a server's, a collector's or a database's credentials never
/// reach a log line or an answer, whichever part of the URL carries them. Text that is not a URL
/// is returned as it is.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let host_at = rest[..authority_end].rfind('@').map_or(0, |at| at + 1);
    let rest = &rest[host_at..];
    let (before, fragment) = match rest.find('#') {
        Some(at) => rest.split_at(at),
        None => (rest, ""),
    };
    let Some((path, query)) = before.split_once('?') else { return format!("{scheme}://{before}{fragment}") };
    let names: Vec<String> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((name, _)) => format!("{name}=redacted"),
            None => pair.to_string(),
        })
        .collect();
    format!("{scheme}://{path}?{}{fragment}", names.join("&"))
}

/// Text made safe for HTML content and attribute values.
pub fn esc_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Whether `url`'s host is a loopback name or address (a local provider may speak plain HTTP).
pub fn loopback_url(url: &str) -> bool {
    let Ok(uri) = url.parse::<http::Uri>() else { return false };
    let host = uri.host().unwrap_or_default().trim_start_matches('[').trim_end_matches(']');
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Lowercase hex of `bytes` into `out` (its first `2 * bytes.len()` bytes; what does not fit
/// is left out).
pub fn hex_into(bytes: &[u8], out: &mut [u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (pair, b) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 15)];
    }
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    let mut out = vec![0u8; bytes.len() * 2];
    hex_into(bytes, &mut out);
    // Only ASCII digits were written.
    String::from_utf8(out).unwrap_or_default()
}

#[cfg(test)]
mod redact_tests {
    use super::{clip, hex, hex_into, redact_url};

    #[test]
    fn hex_is_lowercase_two_digits_a_byte() {
        assert_eq!(hex(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
        let mut out = [b'-'; 5];
        hex_into(&[0xab, 0xcd, 0xef], &mut out);
        assert_eq!(&out, b"abcd-", "what does not fit is left out");
    }

    #[test]
    fn client_strings_are_clipped_at_a_character_boundary() {
        assert_eq!(clip("short", 10), "short");
        assert_eq!(clip("ééééé", 3), "ééé…");
        assert_eq!(clip(&"x".repeat(8 << 20), 256).chars().count(), 257);
    }

    #[test]
    fn userinfo_never_survives() {
        assert_eq!(redact_url("https://user:s3cret@collector:4318/v1/traces"), "https://collector:4318/v1/traces");
        assert_eq!(redact_url("http://tok@host"), "http://host");
        assert_eq!(redact_url("http://host/a@b"), "http://host/a@b", "an @ in the path is not userinfo");
        assert_eq!(redact_url("postgres://u:p%40ss@db/x?sslmode=require"), "postgres://db/x?sslmode=redacted");
        assert_eq!(redact_url("https://u:pw@mcp.example/sse?api_key=SECRET&x"), "https://mcp.example/sse?api_key=redacted&x");
        assert_eq!(redact_url("not a url"), "not a url");
    }
}
