//! Where Berth may send a request that someone other than its operator chose the address
//! of (a tenant's identity provider): only to the public internet, unless the operator
//! says otherwise. Otherwise a tenant admin could make Berth reach its own loopback, the
//! cloud's metadata service or the private network behind it (server-side request forgery).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use url::{Host, Url};

/// Which addresses a tenant-chosen URL may reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// Public addresses only, over https.
    Public,
    /// Private and loopback addresses too (plain http on loopback), as the operator allowed.
    Private,
}

/// Why a URL is not one Berth may fetch under a [`Reach`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unreachable {
    /// Not an absolute http(s) URL, or plain http where https is needed.
    Scheme,
    /// Its host is, or resolves to, an address that is not public.
    PrivateAddress(String),
}

/// Whether `url` may be fetched under `reach`, as far as its text tells (a host name's
/// addresses are checked when it is resolved: see [`is_public`]).
pub fn check_url(url: &str, reach: Reach) -> Result<(), Unreachable> {
    let url = Url::parse(url).map_err(|_| Unreachable::Scheme)?;
    let host = url.host().ok_or(Unreachable::Scheme)?;
    let private = match &host {
        Host::Ipv4(ip) => !is_public(IpAddr::V4(*ip)),
        Host::Ipv6(ip) => !is_public(IpAddr::V6(*ip)),
        Host::Domain(name) => {
            let name = name.trim_end_matches('.').to_ascii_lowercase();
            name == "localhost" || name.ends_with(".localhost") || !name.contains('.')
        }
    };
    let loopback = match &host {
        Host::Ipv4(ip) => ip.is_loopback(),
        Host::Ipv6(ip) => ip.is_loopback(),
        Host::Domain(name) => name.eq_ignore_ascii_case("localhost"),
    };
    match (url.scheme(), reach) {
        ("https", Reach::Private) => Ok(()),
        ("http", Reach::Private) if loopback => Ok(()),
        ("https", Reach::Public) if !private => Ok(()),
        ("https" | "http", Reach::Public) if private => Err(Unreachable::PrivateAddress(host.to_string())),
        _ => Err(Unreachable::Scheme),
    }
}

/// An address on the public internet: not loopback, private (RFC 1918, unique local),
/// link-local (cloud metadata services live there), shared (carrier NAT), multicast,
/// reserved, documentation or unspecified, nor an IPv4 address wrapped in IPv6.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(ip) => is_public_v4(ip),
        IpAddr::V6(ip) => {
            if let Some(v4) = embedded_v4(ip) {
                return is_public_v4(v4);
            }
            let first = ip.segments()[0];
            !(ip.is_unspecified()
                || ip.is_loopback()
                || ip.is_multicast()
                || (first & 0xfe00) == 0xfc00 // unique local fc00::/7
                || (first & 0xffc0) == 0xfe80 // link-local fe80::/10
                || (first & 0xffc0) == 0xfec0 // site-local fec0::/10 (deprecated)
                || (first == 0x2001 && ip.segments()[1] == 0x0db8) // documentation
                || first == 0x0100 && ip.segments()[1..4] == [0, 0, 0]) // discard-only 100::/64
        }
    }
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_documentation()
        || ip.is_multicast()
        || a == 0 // "this network"
        || (a == 100 && (64..128).contains(&b)) // shared address space (carrier NAT)
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 198 && (18..20).contains(&b)) // benchmarking
        || a >= 240) // reserved
}

/// The IPv4 address inside an IPv4-mapped, IPv4-compatible or NAT64 (64:ff9b::/96) address.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let v4 = || Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    match s {
        [0, 0, 0, 0, 0, 0xffff, _, _] => Some(v4()),
        [0, 0, 0, 0, 0, 0, _, _] if !ip.is_loopback() && !ip.is_unspecified() => Some(v4()),
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(v4()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_public_addresses_are_public() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "0.1.2.3",
            "255.255.255.255",
            "224.0.0.1",
            "240.0.0.1",
            "198.18.0.1",
            "192.0.0.8",
            "::1",
            "::",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::10.0.0.1",
            "64:ff9b::a00:1",
            "2001:db8::1",
            "ff02::1",
        ] {
            assert!(!is_public(private.parse().expect("address")), "{private}");
        }
        for public in ["8.8.8.8", "1.1.1.1", "140.82.112.3", "2606:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808"] {
            assert!(is_public(public.parse().expect("address")), "{public}");
        }
    }

    #[test]
    fn tenant_chosen_urls_are_https_and_public_unless_the_operator_allows_private_ones() {
        let public = |url| check_url(url, Reach::Public);
        assert_eq!(public("https://login.example.com/realms/acme"), Ok(()));
        assert_eq!(public("https://8.8.8.8/"), Ok(()));
        assert_eq!(public("http://login.example.com"), Err(Unreachable::Scheme));
        assert_eq!(public("ftp://login.example.com"), Err(Unreachable::Scheme));
        for private in [
            "https://127.0.0.1:9400",
            "http://127.0.0.1:9400",
            "https://localhost:9400",
            "http://localhost:9400",
            "https://idp.localhost",
            "https://169.254.169.254/latest",
            "https://[::1]:8443",
            "https://[::ffff:10.0.0.1]/",
            "https://0x7f.1/",
            "https://2130706433/",
            "https://intranet/",
            "https://LOCALHOST./",
        ] {
            assert!(matches!(public(private), Err(Unreachable::PrivateAddress(_))), "{private}");
        }
        let private = |url| check_url(url, Reach::Private);
        assert_eq!(private("http://127.0.0.1:9400"), Ok(()));
        assert_eq!(private("http://localhost:9400"), Ok(()));
        assert_eq!(private("https://10.0.0.5"), Ok(()));
        assert_eq!(private("http://10.0.0.5"), Err(Unreachable::Scheme), "plain http only on loopback");
    }
}
