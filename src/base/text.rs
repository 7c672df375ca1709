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

/// A URL as it may be logged: any `user:password@` removed (a collector's or a database's
/// credentials never reach a log line). Text that is not a URL is returned as it is.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_string() };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
        None => url.to_string(),
    }
}

#[cfg(test)]
mod redact_tests {
    use super::redact_url;

    #[test]
    fn userinfo_never_survives() {
        assert_eq!(redact_url("https://user:s3cret@collector:4318/v1/traces"), "https://collector:4318/v1/traces");
        assert_eq!(redact_url("http://tok@host"), "http://host");
        assert_eq!(redact_url("http://host/a@b"), "http://host/a@b", "an @ in the path is not userinfo");
        assert_eq!(redact_url("postgres://u:p%40ss@db/x?sslmode=require"), "postgres://db/x?sslmode=require");
        assert_eq!(redact_url("not a url"), "not a url");
    }
}
