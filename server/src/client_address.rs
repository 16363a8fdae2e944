//! The address a request came from when Berth runs behind reverse proxies (an ingress, a
//! load balancer). Their peer address is the proxy's, so per-address rate limits, sign-in
//! throttles and the audit log's `source` would lump every user into one. With
//! `--trusted-proxies`, a request whose peer is one of them is taken to come from the
//! address its `X-Forwarded-For` names: the right-most entry that is not itself a trusted
//! proxy (what a client writes to the left of its proxies' entries is never believed).
//! Without the flag the header is ignored, so nobody can choose their own address.

use std::net::{IpAddr, SocketAddr};

use axum::extract::ConnectInfo;
use http::HeaderMap;
use ipnet::IpNet;

/// The proxies whose `X-Forwarded-For` Berth believes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<IpNet>);

impl TrustedProxies {
    /// `--trusted-proxies`: addresses or networks (`10.0.0.0/8`, `192.0.2.10`, `fd00::/8`)
    /// separated by commas or spaces; empty trusts none.
    pub fn parse(text: &str) -> Result<TrustedProxies, String> {
        let mut networks = Vec::new();
        for item in text.split([',', ' ']).map(str::trim).filter(|i| !i.is_empty()) {
            let network = match item.parse::<IpNet>() {
                Ok(network) => network,
                Err(_) => item.parse::<IpAddr>().map(IpNet::from).map_err(|_| {
                    format!("\"{item}\" is not an address or a network (like 10.0.0.0/8 or 192.0.2.10)")
                })?,
            };
            networks.push(network.trunc());
        }
        Ok(TrustedProxies(networks))
    }

    fn trusts(&self, address: IpAddr) -> bool {
        self.0.iter().any(|network| network.contains(&address.to_canonical()))
    }

    /// Where a request from `peer` with `headers` came from.
    pub fn client(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        if !self.trusts(peer) {
            return peer;
        }
        // Every `X-Forwarded-For` line in order, each a list: the nearest hop is last.
        let hops: Vec<&str> = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .collect();
        let mut client = peer;
        for hop in hops.iter().rev() {
            // An entry that is not an address (`unknown`, garbage): nothing to its left can
            // be believed, so the last trusted hop's word stands.
            let Some(address) = parse_hop(hop) else { return client };
            client = address.to_canonical();
            if !self.trusts(client) {
                return client;
            }
        }
        client
    }

    /// `request` as coming from its client rather than its proxy.
    pub fn apply(&self, request: &mut http::Request<axum::body::Body>) {
        if self.0.is_empty() {
            return;
        }
        let Some(ConnectInfo(peer)) = request.extensions().get::<ConnectInfo<SocketAddr>>().copied() else { return };
        let client = self.client(peer.ip(), request.headers());
        if client != peer.ip() {
            // The client's port is not known; 0 says so.
            request.extensions_mut().insert(ConnectInfo(SocketAddr::new(client, 0)));
        }
    }
}

/// An `X-Forwarded-For` entry: an address, possibly with a port (`192.0.2.1:443`,
/// `[2001:db8::1]:443`).
fn parse_hop(hop: &str) -> Option<IpAddr> {
    hop.parse::<IpAddr>().ok().or_else(|| hop.parse::<SocketAddr>().ok().map(|s| s.ip()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forwarded(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append("x-forwarded-for", value.parse().expect("header"));
        }
        headers
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("ip")
    }

    #[test]
    fn only_a_trusted_proxys_word_is_taken_and_only_up_to_the_first_untrusted_hop() {
        let proxies = TrustedProxies::parse("10.0.0.0/8, 192.0.2.10").expect("flag");
        // A peer that is no proxy: its header is the client's own say-so.
        assert_eq!(proxies.client(ip("198.51.100.7"), &forwarded(&["203.0.113.5"])), ip("198.51.100.7"));
        // Through one proxy.
        assert_eq!(proxies.client(ip("10.1.2.3"), &forwarded(&["203.0.113.5"])), ip("203.0.113.5"));
        // What the client wrote itself stays to the left of what its proxies added.
        let chain = forwarded(&["1.2.3.4, 203.0.113.5", "10.9.9.9"]);
        assert_eq!(proxies.client(ip("192.0.2.10"), &chain), ip("203.0.113.5"));
        // No header, or one that says nothing usable: the proxy (or the last hop it vouched for).
        assert_eq!(proxies.client(ip("10.1.2.3"), &HeaderMap::new()), ip("10.1.2.3"));
        assert_eq!(proxies.client(ip("10.1.2.3"), &forwarded(&["unknown"])), ip("10.1.2.3"));
        assert_eq!(proxies.client(ip("10.1.2.3"), &forwarded(&["garbage, 10.4.4.4"])), ip("10.4.4.4"));
        // Ports and IPv6, and an IPv4 peer seen on a dual-stack socket.
        assert_eq!(proxies.client(ip("10.1.2.3"), &forwarded(&["[2001:db8::1]:443"])), ip("2001:db8::1"));
        assert_eq!(proxies.client(ip("::ffff:10.1.2.3"), &forwarded(&["203.0.113.9:5000"])), ip("203.0.113.9"));
    }

    #[test]
    fn the_flag_names_addresses_and_networks() {
        assert_eq!(TrustedProxies::parse("").expect("none"), TrustedProxies::default());
        assert_eq!(
            TrustedProxies::parse("10.0.0.1/8").expect("masked").0,
            vec!["10.0.0.0/8".parse::<IpNet>().expect("net")]
        );
        let refused = TrustedProxies::parse("10.0.0.0/8,proxy.internal").expect_err("a name");
        assert!(refused.contains("\"proxy.internal\" is not an address or a network"), "{refused}");
    }
}
