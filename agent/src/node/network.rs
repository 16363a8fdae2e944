//! The agent's side of host network isolation: reads Berth's devices, addresses, flood
//! entries and nftables table from the node, and runs the changes
//! `berth_domain::host_network` plans, so applying the same plan again changes nothing.

use std::net::{IpAddr, Ipv4Addr};

use berth_domain::agent::Command;
use berth_domain::host_network::{
    self, Change, FloodEntry, HostNetworkPlan, Link, LinkAddress, LinkKind, NFT_TABLE, ObservedNetwork,
    TenantAttachment, Underlay,
};
use serde_json::Value;

use super::commands::{CommandRunner, Failure};
use crate::NodeError;

/// Where the node's tenant networks run and which of its addresses tenants may not reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeNetwork {
    pub underlay: Underlay,
    /// Besides the underlay address (always protected).
    pub management: Vec<IpAddr>,
}

/// Brings the node's network to what `attachments` need; the changes it made (none when
/// the node already matched). Stops at the first command that fails, saying which and
/// why; the next apply picks up from what is then on the node.
pub fn apply(
    runner: &dyn CommandRunner,
    node: &NodeNetwork,
    attachments: &[TenantAttachment],
) -> Result<Vec<Change>, NodeError> {
    let plan = host_network::plan(&node.underlay, &node.management, attachments)?;
    apply_plan(runner, &plan)
}

pub fn apply_plan(runner: &dyn CommandRunner, plan: &HostNetworkPlan) -> Result<Vec<Change>, NodeError> {
    let observed = observe(runner)?;
    let changes = host_network::changes(&observed, plan);
    for change in &changes {
        for command in change.commands() {
            runner.run(&command).map_err(|e| match e.failure {
                Failure::NotInstalled { program } => NodeError::NoNetworkTool(program),
                Failure::Failed { .. } => {
                    NodeError::CommandFailed { doing: "set up the tenant networks".into(), source: e }
                }
            })?;
        }
    }
    Ok(changes)
}

/// Berth's part of the node's network as it is now.
pub fn observe(runner: &dyn CommandRunner) -> Result<ObservedNetwork, NodeError> {
    let read = |program: &'static str, args: &[&str]| -> Result<Value, NodeError> {
        let text = runner
            .run(&Command::new(program, args))
            .map_err(|source| NodeError::CommandFailed { doing: "read the node's network".into(), source })?;
        serde_json::from_str(&text).map_err(|e| NodeError::Unreadable {
            what: format!("`{program} {}`'s answer", args.join(" ")),
            reason: e.to_string(),
        })
    };
    let links = parse_links(&read("ip", &["-details", "-json", "link", "show"])?);
    let addresses = parse_addresses(&read("ip", &["-json", "address", "show"])?);
    let flood = parse_flood(&read("bridge", &["-json", "fdb", "show"])?);
    let table_fingerprint = match runner.run(&Command::new("nft", &["list", "table", "inet", NFT_TABLE])) {
        Ok(listing) => Some(host_network::fingerprint_in(&listing)),
        // Without nft there is no table of Berth's; a plan that needs one says so when it
        // tries to write it.
        Err(e) if matches!(e.failure, Failure::NotInstalled { .. }) => None,
        Err(e) if e.to_string().contains("No such file or directory") => None,
        Err(source) => return Err(NodeError::CommandFailed { doing: "read the node's nftables".into(), source }),
    };
    Ok(ObservedNetwork { links, addresses, flood, table_fingerprint })
}

/// Berth's devices from `ip -details -json link show`.
fn parse_links(json: &Value) -> Vec<Link> {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    json.as_array()
        .into_iter()
        .flatten()
        .filter(|link| link["ifname"].as_str().is_some_and(host_network::is_berth_link))
        .map(|link| {
            let info = &link["linkinfo"];
            let data = &info["info_data"];
            let number = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
            let kind = match info["info_kind"].as_str().unwrap_or_default() {
                "bridge" => Some(LinkKind::Bridge),
                "vxlan" => (|| {
                    Some(LinkKind::Vxlan {
                        vni: number(&data["id"])?,
                        local: data["local"].as_str()?.parse().ok()?,
                        parent: text(&data["link"]),
                        port: u16::try_from(number(&data["port"])?).ok()?,
                    })
                })(),
                "vlan" => (|| {
                    Some(LinkKind::Vlan { id: u16::try_from(number(&data["id"])?).ok()?, parent: text(&link["link"]) })
                })(),
                _ => None,
            };
            Link {
                name: text(&link["ifname"]),
                // A device Berth cannot read the settings of is made again.
                kind: kind.unwrap_or_else(|| LinkKind::Other(text(&info["info_kind"]))),
                master: link["master"].as_str().map(str::to_owned),
                up: link["flags"].as_array().is_some_and(|flags| flags.iter().any(|f| f == "UP")),
            }
        })
        .collect()
}

/// IPv4 addresses on Berth's devices from `ip -json address show`.
fn parse_addresses(json: &Value) -> Vec<(String, LinkAddress)> {
    let mut result = Vec::new();
    for link in json.as_array().into_iter().flatten() {
        let Some(name) = link["ifname"].as_str().filter(|n| host_network::is_berth_link(n)) else { continue };
        for info in link["addr_info"].as_array().into_iter().flatten().filter(|i| i["family"] == "inet") {
            let address = info["local"].as_str().and_then(|a| a.parse::<Ipv4Addr>().ok());
            let prefix_len = info["prefixlen"].as_u64().and_then(|p| u8::try_from(p).ok());
            if let (Some(address), Some(prefix_len)) = (address, prefix_len) {
                result.push((name.to_owned(), LinkAddress { address, prefix_len }));
            }
        }
    }
    result
}

/// VXLAN flood entries (all-zero MAC with a destination) on Berth's devices from
/// `bridge -json fdb show`.
fn parse_flood(json: &Value) -> Vec<FloodEntry> {
    json.as_array()
        .into_iter()
        .flatten()
        .filter(|entry| entry["mac"] == "00:00:00:00:00:00")
        .filter_map(|entry| {
            let device = entry["ifname"].as_str().filter(|n| host_network::is_berth_link(n))?;
            Some(FloodEntry { device: device.to_owned(), peer: entry["dst"].as_str()?.parse().ok()? })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use berth_domain::host_network::{TenantSegment, tenant_address};

    use super::*;
    use crate::node::commands::recording::Recording;

    fn this_node() -> NodeNetwork {
        NodeNetwork {
            underlay: Underlay { interface: "eth0".into(), address: Ipv4Addr::new(10, 0, 0, 1) },
            management: Vec::new(),
        }
    }

    fn acme() -> TenantAttachment {
        let segment = TenantSegment::Vxlan(5000);
        TenantAttachment {
            tenant: "acme".into(),
            segment,
            address: tenant_address(segment, 1).expect("address"),
            peers: vec![Ipv4Addr::new(10, 0, 0, 2)],
        }
    }

    const READS: [&str; 4] =
        ["ip -details -json link show", "ip -json address show", "bridge -json fdb show", "nft list table inet berth"];

    /// A node with only its underlay, as `ip`, `bridge` and `nft` describe it.
    fn bare_node() -> Recording {
        let node = Recording::default();
        node.answer(
            "ip -details -json link show",
            r#"[{"ifname":"lo","flags":["LOOPBACK","UP"]},
                {"ifname":"eth0","flags":["UP"],"linkinfo":{"info_kind":"veth"}}]"#,
        )
        .answer(
            "ip -json address show",
            r#"[{"ifname":"eth0","addr_info":[{"family":"inet","local":"10.0.0.1","prefixlen":24}]}]"#,
        )
        .answer("bridge -json fdb show", r#"[{"mac":"33:33:00:00:00:01","ifname":"eth0","flags":["self"]}]"#)
        .fail(
            "nft list table",
            Failure::Failed { message: "Error: No such file or directory\nlist table inet berth".into() },
        );
        node
    }

    /// The same node once acme's network is on it (the answers of a real node, trimmed).
    fn node_with_acme(fingerprint: &str) -> Recording {
        let node = bare_node();
        node.answer(
            "ip -details -json link show",
            r#"[{"ifname":"eth0","flags":["UP"],"linkinfo":{"info_kind":"veth"}},
                {"ifname":"bbr-vx5000","flags":["BROADCAST","MULTICAST","UP","LOWER_UP"],
                 "linkinfo":{"info_kind":"bridge","info_data":{"stp_state":0}}},
                {"ifname":"bvx5000","flags":["BROADCAST","MULTICAST","UP","LOWER_UP"],"master":"bbr-vx5000",
                 "linkinfo":{"info_kind":"vxlan","info_data":{"id":5000,"local":"10.0.0.1","link":"eth0","port":4789,"learning":false}}}]"#,
        )
        .answer(
            "ip -json address show",
            r#"[{"ifname":"bbr-vx5000","addr_info":[{"family":"inet","local":"100.78.32.1","prefixlen":22},
                                                 {"family":"inet6","local":"fe80::1","prefixlen":64}]}]"#,
        )
        .answer(
            "bridge -json fdb show",
            r#"[{"mac":"2a:80:24:5a:f7:f0","ifname":"bvx5000","master":"bbr-vx5000","state":"permanent"},
                {"mac":"00:00:00:00:00:00","ifname":"bvx5000","dst":"10.0.0.2","flags":["self"],"state":"permanent"}]"#,
        )
        .answer("nft list table", &format!("table inet berth {{\n\tcomment \"berth host network {fingerprint}\"\n}}"));
        node
    }

    #[test]
    fn a_bare_node_gets_the_tenants_network_in_order() {
        let node = bare_node();
        apply(&node, &this_node(), &[acme()]).expect("applied");
        let ran = node.take();
        assert_eq!(ran[..4], READS);
        assert_eq!(
            ran[4..],
            [
                "nft -f -",
                "ip link add bbr-vx5000 type bridge",
                "ip link set dev bbr-vx5000 up",
                "ip link add bvx5000 type vxlan id 5000 local 10.0.0.1 dev eth0 dstport 4789 nolearning",
                "ip link set dev bvx5000 master bbr-vx5000",
                "ip link set dev bvx5000 up",
                "ip address add 100.78.32.1/22 dev bbr-vx5000",
                "bridge fdb append 00:00:00:00:00:00 dev bvx5000 dst 10.0.0.2",
            ]
        );
    }

    #[test]
    fn a_node_that_matches_is_only_read() {
        let plan = host_network::plan(&this_node().underlay, &[], &[acme()]).expect("plan");
        let fingerprint = plan.fingerprint.clone().expect("fingerprint");
        let node = node_with_acme(&fingerprint);
        assert_eq!(observe(&node).expect("observed"), ObservedNetwork::applied(&plan));
        node.take();
        assert_eq!(apply(&node, &this_node(), &[acme()]), Ok(Vec::new()));
        assert_eq!(node.take(), READS);
    }

    #[test]
    fn detaching_the_last_tenant_removes_its_devices_and_the_table() {
        let node = node_with_acme("0123456789abcdef");
        apply(&node, &this_node(), &[]).expect("applied");
        assert_eq!(
            node.take()[4..],
            ["ip link delete bbr-vx5000", "ip link delete bvx5000", "nft delete table inet berth"]
        );
    }

    #[test]
    fn missing_tools_and_failing_commands_are_named() {
        let node = bare_node();
        node.fail("nft", Failure::NotInstalled { program: "nft".into() });
        let error = apply(&node, &this_node(), &[acme()]).expect_err("no nft");
        assert_eq!(error, NodeError::NoNetworkTool("nft".into()));
        assert_eq!(
            error.to_string(),
            "nft is not installed on this node; tenant networks need iproute2 and nftables (Debian and Ubuntu: apt-get install iproute2 nftables)"
        );
        // Without tenants, a node without nft is fine.
        assert_eq!(apply(&node, &this_node(), &[]), Ok(Vec::new()));

        let node = bare_node();
        node.fail("ip link add bvx5000", Failure::Failed { message: "Error: Unknown device type.".into() });
        let error = apply(&node, &this_node(), &[acme()]).expect_err("no vxlan");
        assert_eq!(
            error.to_string(),
            "cannot set up the tenant networks: `ip link add bvx5000 type vxlan id 5000 local 10.0.0.1 dev eth0 dstport 4789 nolearning` failed: Error: Unknown device type."
        );
        // A plan the domain refuses never reaches the node.
        let node = bare_node();
        let twice = [acme(), TenantAttachment { tenant: "globex".into(), ..acme() }];
        let error = apply(&node, &this_node(), &twice).expect_err("refused");
        assert!(matches!(error, NodeError::Refused(_)), "{error:?}");
        assert_eq!(error.to_string(), "host network: tenants acme and globex share VXLAN VNI 5000 on this node");
        assert_eq!(node.take(), Vec::<String>::new());
    }

    #[test]
    fn devices_of_other_kinds_with_berths_names_are_made_again() {
        let node = bare_node();
        node.answer(
            "ip -details -json link show",
            r#"[{"ifname":"bvx5000","flags":[],"linkinfo":{"info_kind":"dummy"}}]"#,
        );
        let links = observe(&node).expect("observed").links;
        assert_eq!(links[0].kind, LinkKind::Other("dummy".into()));
        node.take();
        apply(&node, &this_node(), &[acme()]).expect("applied");
        assert!(node.take().contains(&"ip link delete bvx5000".to_owned()));
    }
}
