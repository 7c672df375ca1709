//! The client's address, derived rather than read: the TCP peer's, unless the peer is a trusted
//! proxy (`trusted_proxies`). Then every `X-Forwarded-For` line (joined in order as one list)
//! and every `Forwarded` line (RFC 7239: `for=` with quotes, IPv6 in brackets, ports) are walked
//! from the right while the hop is a trusted proxy; the first hop that is not is the client.
//!
//! Fail closed: behind a trusted proxy, a header that is not ASCII, a hop the walk reaches that
//! is not an address, or the two headers naming different clients is refused (400) — a proxy
//! that appends a second header line (HAProxy) or passes a client's `Forwarded` untouched can
//! no longer be used to choose the address. A hop named `unknown` or an obfuscated identifier
//! (`_hidden`) leaves the client unknown: no address rule admits it. An untrusted peer's
//! headers are never read.

use super::cidr::{normalize, Cidr};
use std::net::IpAddr;

/// Who the client is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAddr {
    Known(IpAddr),
    /// A trusted proxy said it does not know (`unknown`, an obfuscated identifier).
    Unknown,
}

/// A forwarding header from a trusted proxy that cannot be believed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub String);

/// One hop of a forwarding list.
enum Hop {
    Addr(IpAddr),
    Unknown,
}

/// An address as forwarding headers write it: bare, `[v6]`, `[v6]:port`, `v4:port`, quoted.
fn parse_node(text: &str) -> Option<Hop> {
    let text = text.trim().trim_matches('"').trim();
    if text.eq_ignore_ascii_case("unknown") || text.starts_with('_') {
        return Some(Hop::Unknown);
    }
    if let Some(rest) = text.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        if !(after.is_empty()
            || after.strip_prefix(':').is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')))
        {
            return None;
        }
        return inside.parse::<std::net::Ipv6Addr>().ok().map(|v6| Hop::Addr(IpAddr::V6(v6)));
    }
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(Hop::Addr(ip));
    }
    // An IPv4 address with a port (one colon; an IPv6 address has several).
    let (host, port) = text.split_once(':')?;
    if port.is_empty() || port.contains(':') || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    host.parse::<std::net::Ipv4Addr>().ok().map(|v4| Hop::Addr(IpAddr::V4(v4)))
}

/// The `for=` of one `Forwarded` element (`for=192.0.2.60;proto=http;by=203.0.113.43`).
fn forwarded_for(element: &str) -> Option<&str> {
    element.split(';').find_map(|pair| {
        let (name, value) = pair.split_once('=')?;
        name.trim().eq_ignore_ascii_case("for").then_some(value.trim())
    })
}

/// Walk `hops` (nearest last) from the right past trusted proxies.
fn walk<'a>(
    hops: impl DoubleEndedIterator<Item = &'a str>,
    parse: impl Fn(&'a str) -> Option<Hop>,
    peer: IpAddr,
    trusted: &impl Fn(IpAddr) -> bool,
    header: &str,
) -> Result<ClientAddr, Malformed> {
    let mut nearest = peer;
    for raw in hops.rev() {
        if raw.trim().is_empty() {
            continue;
        }
        match parse(raw) {
            Some(Hop::Addr(ip)) => {
                let ip = normalize(ip);
                if !trusted(ip) {
                    return Ok(ClientAddr::Known(ip));
                }
                nearest = ip;
            }
            Some(Hop::Unknown) => return Ok(ClientAddr::Unknown),
            None => return Err(Malformed(format!("{header}: '{}' is not an address", raw.trim()))),
        }
    }
    Ok(ClientAddr::Known(nearest))
}

/// Every line of header `name` joined as one list, or None when absent. Not ASCII: refused.
fn joined(headers: &http::HeaderMap, name: &str) -> Result<Option<String>, Malformed> {
    let mut out: Option<String> = None;
    for value in headers.get_all(name) {
        let text = value.to_str().map_err(|_| Malformed(format!("{name}: not ASCII")))?;
        match &mut out {
            Some(list) => {
                list.push(',');
                list.push_str(text);
            }
            None => out = Some(text.to_string()),
        }
    }
    Ok(out)
}

/// The client address of a request from `peer` with `headers` (see the module doc).
pub fn client_address(peer: IpAddr, headers: &http::HeaderMap, trusted: &[Cidr]) -> Result<ClientAddr, Malformed> {
    let peer = normalize(peer);
    let is_trusted = |ip: IpAddr| trusted.iter().any(|c| c.contains(ip));
    if !is_trusted(peer) {
        return Ok(ClientAddr::Known(peer));
    }
    let xff = joined(headers, "x-forwarded-for")?;
    let fwd = joined(headers, "forwarded")?;
    let by_xff = xff.as_deref().map(|list| walk(list.split(','), parse_node, peer, &is_trusted, "X-Forwarded-For")).transpose()?;
    let by_fwd = match fwd.as_deref() {
        Some(list) => Some(walk(list.split(','), |element| forwarded_for(element).and_then(parse_node), peer, &is_trusted, "Forwarded")?),
        None => None,
    };
    match (by_xff, by_fwd) {
        (Some(a), Some(b)) if a != b => Err(Malformed("X-Forwarded-For and Forwarded name different clients".to_string())),
        (Some(a), _) | (None, Some(a)) => Ok(a),
        (None, None) => Ok(ClientAddr::Known(peer)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    fn headers(lines: &[(&str, &[u8])]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for (name, value) in lines {
            h.append(http::HeaderName::from_bytes(name.as_bytes()).expect("name"), http::HeaderValue::from_bytes(value).expect("value"));
        }
        h
    }

    fn trusted() -> Vec<Cidr> {
        vec![Cidr::parse("10.0.0.0/8").expect("cidr"), Cidr::parse("2001:db8::/32").expect("cidr")]
    }

    fn known(peer: &str, lines: &[(&str, &[u8])]) -> Result<ClientAddr, Malformed> {
        client_address(ip(peer), &headers(lines), &trusted())
    }

    #[test]
    fn an_untrusted_peers_headers_are_never_read() {
        let spoof: &[(&str, &[u8])] = &[("x-forwarded-for", b"198.51.100.7"), ("forwarded", b"for=1.2.3.4")];
        assert_eq!(known("203.0.113.9", spoof), Ok(ClientAddr::Known(ip("203.0.113.9"))));
        // Not even a malformed one.
        assert_eq!(known("203.0.113.9", &[("x-forwarded-for", b"\xff garbage")]), Ok(ClientAddr::Known(ip("203.0.113.9"))));
        assert_eq!(
            client_address(ip("::ffff:10.0.0.2"), &headers(&[("x-forwarded-for", b"1.1.1.1")]), &[]),
            Ok(ClientAddr::Known(ip("10.0.0.2")))
        );
    }

    #[test]
    fn every_x_forwarded_for_line_is_walked_from_the_right() {
        // HAProxy appends a line: the client's own first line is the left end of the list.
        let two_lines: &[(&str, &[u8])] = &[("x-forwarded-for", b"198.51.100.7"), ("x-forwarded-for", b"203.0.113.9")];
        assert_eq!(known("10.0.0.2", two_lines), Ok(ClientAddr::Known(ip("203.0.113.9"))));
        // Spoofed left entries behind proxies: the first untrusted from the right.
        assert_eq!(
            known("10.0.0.2", &[("x-forwarded-for", b"1.2.3.4, 198.51.100.7, 10.0.0.9")]),
            Ok(ClientAddr::Known(ip("198.51.100.7")))
        );
        // Only proxies, or no header: the nearest proxy.
        assert_eq!(known("10.0.0.2", &[("x-forwarded-for", b"10.0.0.9")]), Ok(ClientAddr::Known(ip("10.0.0.9"))));
        assert_eq!(known("10.0.0.2", &[]), Ok(ClientAddr::Known(ip("10.0.0.2"))));
        // IPv4-mapped IPv6, brackets and ports.
        assert_eq!(known("10.0.0.2", &[("x-forwarded-for", b"::ffff:198.51.100.8")]), Ok(ClientAddr::Known(ip("198.51.100.8"))));
        assert_eq!(known("10.0.0.2", &[("x-forwarded-for", b"198.51.100.9:5123")]), Ok(ClientAddr::Known(ip("198.51.100.9"))));
        assert_eq!(known("10.0.0.2", &[("x-forwarded-for", b"[2001:db9::7]:443, 10.1.1.1")]), Ok(ClientAddr::Known(ip("2001:db9::7"))));
        // Left of the client, anything goes: it is the client's own claim, never read.
        assert_eq!(known("10.0.0.2", &[("x-forwarded-for", b"nonsense, 198.51.100.7")]), Ok(ClientAddr::Known(ip("198.51.100.7"))));
    }

    #[test]
    fn forwarded_is_read_per_rfc_7239() {
        let f = |v: &'static [u8]| known("10.0.0.2", &[("forwarded", v)]);
        assert_eq!(f(b"for=198.51.100.7;proto=https"), Ok(ClientAddr::Known(ip("198.51.100.7"))));
        assert_eq!(f(b"for=\"[2001:db9::1]:4711\""), Ok(ClientAddr::Known(ip("2001:db9::1"))));
        assert_eq!(f(b"for=\"198.51.100.7:80\", for=10.0.0.3;by=10.0.0.2"), Ok(ClientAddr::Known(ip("198.51.100.7"))));
        assert_eq!(
            f(b"For=1.2.3.4, FOR=\"[2001:db8::5]\""),
            Ok(ClientAddr::Known(ip("1.2.3.4"))),
            "names are case-insensitive; the v6 proxy is trusted"
        );
        assert_eq!(f(b"for=unknown"), Ok(ClientAddr::Unknown));
        assert_eq!(f(b"for=_hidden"), Ok(ClientAddr::Unknown));
        assert!(f(b"proto=https").is_err(), "an element without for= cannot be walked");
        // Two lines are one list.
        let two: &[(&str, &[u8])] = &[("forwarded", b"for=198.51.100.7"), ("forwarded", b"for=203.0.113.9")];
        assert_eq!(known("10.0.0.2", two), Ok(ClientAddr::Known(ip("203.0.113.9"))));
    }

    #[test]
    fn what_cannot_be_believed_is_refused_behind_a_trusted_proxy() {
        // A non-ASCII byte anywhere in either header.
        assert!(known("10.0.0.2", &[("x-forwarded-for", b"198.51.100.7\xc3\xa9")]).is_err());
        assert!(known("10.0.0.2", &[("forwarded", b"for=\xff")]).is_err());
        // A hop the walk reaches that is no address.
        assert!(known("10.0.0.2", &[("x-forwarded-for", b"198.51.100.7, garbage")]).is_err());
        assert!(known("10.0.0.2", &[("x-forwarded-for", b"1.2.3.4:")]).is_err());
        assert!(known("10.0.0.2", &[("x-forwarded-for", b"[::1")]).is_err());
        // The two headers naming different clients: a client's `Forwarded` passed through
        // untouched by a proxy that only appends X-Forwarded-For.
        let both: &[(&str, &[u8])] = &[("x-forwarded-for", b"203.0.113.9"), ("forwarded", b"for=198.51.100.7")];
        assert!(known("10.0.0.2", both).is_err());
        let agree: &[(&str, &[u8])] = &[("x-forwarded-for", b"203.0.113.9"), ("forwarded", b"for=203.0.113.9")];
        assert_eq!(known("10.0.0.2", agree), Ok(ClientAddr::Known(ip("203.0.113.9"))));
    }
}
