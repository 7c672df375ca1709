//! Address blocks (`10.0.0.0/8`, `2001:db8::/32`, one address) and the one rule for IPv4
//! written as IPv6: the shared floor of the address rules (`ip_allow`, `trusted_proxies`) and of
//! the client address's derivation (`forwarded`). Imports nothing of tollgate's.

use std::net::IpAddr;

/// An address block: `10.0.0.0/8`, `2001:db8::/32`, or one address (`192.0.2.7`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

/// An IPv4 address written as IPv6 (`::ffff:a.b.c.d`) is that IPv4 address.
pub fn normalize(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

impl Cidr {
    pub fn parse(text: &str) -> Result<Cidr, String> {
        let text = text.trim();
        let (addr, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let parsed: IpAddr = addr.parse().map_err(|_| format!("'{text}' is not an address or address block (CIDR)"))?;
        let mapped = matches!(parsed, IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some());
        let addr = normalize(parsed);
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => {
                let p: u8 = p.parse().map_err(|_| format!("'{text}': the prefix length must be a number"))?;
                // A mapped block's prefix counts the 96 bits of the mapping.
                let p = if mapped {
                    p.checked_sub(96).ok_or_else(|| format!("'{text}': prefix below /96 for a mapped IPv4 block"))?
                } else {
                    p
                };
                if p > max {
                    return Err(format!("'{text}': the prefix length is at most {max}"));
                }
                p
            }
        };
        Ok(Cidr { addr, prefix })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, normalize(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = if self.prefix == 0 { 0 } else { u32::MAX << (32 - u32::from(self.prefix)) };
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = if self.prefix == 0 { 0 } else { u128::MAX << (128 - u32::from(self.prefix)) };
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl serde::Serialize for Cidr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Cidr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Cidr, D::Error> {
        let text = <String as serde::Deserialize>::deserialize(d)?;
        Cidr::parse(&text).map_err(serde::de::Error::custom)
    }
}
