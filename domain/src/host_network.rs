//! Host network isolation on a bare-metal node: from the tenants attached to the node, the
//! Linux configuration `berth agent` keeps on it, and the changes that bring a node's
//! current configuration to it.
//!
//! Each hard or hybrid tenant on the node gets its network segment (a VXLAN device over the
//! node's underlay interface, or an 802.1Q VLAN device on it) enslaved to a bridge that
//! carries the node's address on the tenant network. An nftables table of Berth's own
//! (`inet berth`) keeps the segments apart: a tenant's bridge exchanges routed traffic with
//! nothing else on the node, reaches none of the node's own addresses but its own on that
//! segment (so not the management address), and VXLAN is accepted only from the tenants'
//! peer nodes.
//!
//! Everything here is data: [`plan`] says what should exist, [`changes`] compares it with
//! what the agent observed and lists the smallest set of [`Change`]s, and each change
//! knows its `ip`, `bridge` or `nft` commands. A second pass over an applied plan finds no
//! change; a tenant that leaves takes exactly its own devices, addresses and rules along.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr};

use serde::{Deserialize, Serialize};

use crate::Refusal;
use crate::agent::Command;
use crate::fabric::IdentifierKind;

/// The UDP port of VXLAN (IANA), on the wire between nodes.
pub const VXLAN_PORT: u16 = 4789;
/// Berth's own nftables table (family `inet`); nothing else in the ruleset is touched.
pub const NFT_TABLE: &str = "berth";
/// Tenant networks live in the shared address space of RFC 6598, which sites rarely route,
/// so they do not shadow a site's own networks.
pub const TENANT_NETWORKS: Ipv4Addr = Ipv4Addr::new(100, 64, 0, 0);
/// Each tenant segment is a /22 of [`TENANT_NETWORKS`] (a /10): 4096 segments of 1022 nodes.
pub const TENANT_PREFIX_LEN: u8 = 22;
const TENANT_SUBNETS: u32 = 1 << (TENANT_PREFIX_LEN - 10);
const HOSTS_PER_SUBNET: u32 = (1 << (32 - TENANT_PREFIX_LEN)) - 2;
/// The comment on Berth's table starts with this; the plan's fingerprint follows.
const FINGERPRINT_MARK: &str = "berth host network ";
/// Container networks Berth makes over its tenant bridges are named with this prefix.
pub const RUNTIME_NETWORK_PREFIX: &str = "berth-";
/// Linux's limit on interface names (IFNAMSIZ less the terminating zero).
const MAX_INTERFACE_NAME: usize = 15;

/// A tenant's network segment, from its fabric lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "kind", content = "id")]
pub enum TenantSegment {
    /// An 802.1Q VLAN id: the site's switches carry it to the tenant's nodes.
    Vlan(u16),
    /// A VXLAN network identifier: the nodes tunnel it over the underlay themselves.
    Vxlan(u32),
}

impl TenantSegment {
    /// The segment a lease of `kind` with `value` stands for; `None` for the other kinds
    /// (P_Keys, NVLink partitions and volumes are not host networking).
    pub fn from_lease(kind: IdentifierKind, value: u32) -> Option<TenantSegment> {
        match kind {
            IdentifierKind::Vlan => u16::try_from(value).ok().map(TenantSegment::Vlan),
            IdentifierKind::Vni => Some(TenantSegment::Vxlan(value)),
            _ => None,
        }
    }

    fn kind(self) -> IdentifierKind {
        match self {
            TenantSegment::Vlan(_) => IdentifierKind::Vlan,
            TenantSegment::Vxlan(_) => IdentifierKind::Vni,
        }
    }

    fn value(self) -> u32 {
        match self {
            TenantSegment::Vlan(id) => u32::from(id),
            TenantSegment::Vxlan(vni) => vni,
        }
    }

    /// `VLAN 100` or `VXLAN VNI 5000`, as operators read it.
    pub fn describe(self) -> String {
        match self {
            TenantSegment::Vlan(id) => format!("VLAN {id}"),
            TenantSegment::Vxlan(vni) => format!("VXLAN VNI {vni}"),
        }
    }

    /// The device that carries the segment: `bvl100` or `bvx5000` (at most 11 characters).
    pub fn device_name(self) -> String {
        match self {
            TenantSegment::Vlan(id) => format!("bvl{id}"),
            TenantSegment::Vxlan(vni) => format!("bvx{vni}"),
        }
    }

    /// The bridge the node's address and the tenant's workloads sit on: `bbr-vl100` or
    /// `bbr-vx5000` (at most 14 characters).
    pub fn bridge_name(self) -> String {
        format!("bbr-{}", &self.device_name()[1..])
    }

    /// The container runtime's network over the bridge: `berth-vl100`, `berth-vx5000`.
    pub fn runtime_network_name(self) -> String {
        format!("{RUNTIME_NETWORK_PREFIX}{}", &self.device_name()[1..])
    }

    /// The tenant network's first address: `100.64.0.0/10` cut into /22s, the segment's
    /// id picking one (VLAN ids never share one; VNIs 4096 apart do, see [`plan`]).
    pub fn subnet(self) -> Ipv4Addr {
        let index = self.value() % TENANT_SUBNETS;
        Ipv4Addr::from(u32::from(TENANT_NETWORKS) + (index << (32 - TENANT_PREFIX_LEN)))
    }

    fn contains(self, address: Ipv4Addr) -> bool {
        let mask = u32::MAX << (32 - TENANT_PREFIX_LEN);
        u32::from(address) & mask == u32::from(self.subnet())
    }
}

/// The node's address on a tenant's network: the segment's subnet, host part the node's
/// number in the fleet (stable for the node's life, unlike its rank among the tenant's
/// nodes, which would renumber running nodes when one joins).
pub fn tenant_address(segment: TenantSegment, node_number: i64) -> Result<Ipv4Addr, Refusal> {
    match u32::try_from(node_number) {
        Ok(host @ 1..) if host <= HOSTS_PER_SUBNET => Ok(Ipv4Addr::from(u32::from(segment.subnet()) + host)),
        _ => Err(Refusal::InvalidHostNetwork(format!(
            "node number {node_number} has no address on a tenant network (1 to {HOSTS_PER_SUBNET})"
        ))),
    }
}

/// A container's address on its tenant's network, for a hard or hybrid tenant's workload:
/// node addresses count up from the bottom of the segment's /22 (host part = node number,
/// at most `highest_node`), containers' down from its top, each unique on the segment
/// (`taken` are the others'). A container keeps its address for its life, so neither
/// renumbers when the other grows.
pub fn container_address(segment: TenantSegment, highest_node: i64, taken: &[Ipv4Addr]) -> Result<Ipv4Addr, Refusal> {
    let lowest = u32::try_from(highest_node.max(0)).unwrap_or(u32::MAX).saturating_add(1);
    (lowest..=HOSTS_PER_SUBNET)
        .rev()
        .map(|host| Ipv4Addr::from(u32::from(segment.subnet()) + host))
        .find(|address| !taken.contains(address))
        .ok_or_else(|| {
            Refusal::InvalidHostNetwork(format!(
                "{} has no address left for another container ({} containers; node addresses take the first {})",
                segment.describe(),
                taken.len(),
                highest_node
            ))
        })
}

/// Whether `address` is a host address of `segment`'s subnet.
pub fn is_host_of(segment: TenantSegment, address: Ipv4Addr) -> bool {
    let host = u32::from(address).wrapping_sub(u32::from(segment.subnet()));
    segment.contains(address) && host != 0 && host <= HOSTS_PER_SUBNET
}

/// The node's own network the segments run over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Underlay {
    /// e.g. `eth0` or `bond0`: VXLAN leaves through it, VLAN devices sit on it.
    pub interface: String,
    /// The node's address on it: VXLAN's source, and what peers send the tenant's VXLAN to.
    pub address: Ipv4Addr,
}

/// One tenant attached to the node, as the portal plans it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantAttachment {
    /// The tenant's short name (for comments and logs; never a security decision).
    pub tenant: String,
    pub segment: TenantSegment,
    /// The node's address on the tenant network ([`tenant_address`]).
    pub address: Ipv4Addr,
    /// The underlay addresses of the tenant's other nodes (VXLAN floods to them).
    pub peers: Vec<Ipv4Addr>,
}

/// A network device Berth keeps on the node.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Link {
    pub name: String,
    pub kind: LinkKind,
    /// The bridge a segment device is enslaved to.
    pub master: Option<String>,
    pub up: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum LinkKind {
    Bridge,
    Vxlan {
        vni: u32,
        local: Ipv4Addr,
        parent: String,
        port: u16,
    },
    Vlan {
        id: u16,
        parent: String,
    },
    /// A device with one of Berth's names but of another kind (`dummy`, `veth`, ...): never
    /// planned, so it is deleted and made again.
    Other(String),
}

/// An IPv4 address on one of Berth's devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct LinkAddress {
    pub address: Ipv4Addr,
    pub prefix_len: u8,
}

/// VXLAN head-end replication: broadcast and unknown traffic of the device goes to `peer`
/// (an all-zero MAC entry of the device's forwarding database).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct FloodEntry {
    pub device: String,
    pub peer: Ipv4Addr,
}

/// What the node's network should look like.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct HostNetworkPlan {
    /// Bridges first, then the segment devices that are their ports.
    pub links: Vec<Link>,
    /// Device name and address.
    pub addresses: Vec<(String, LinkAddress)>,
    pub flood: Vec<FloodEntry>,
    /// The `nft -f` script that replaces Berth's table atomically; `None` when no tenant
    /// is attached (the table should then not exist).
    pub ruleset: Option<String>,
    /// Names the ruleset; the table's comment carries it, so the agent can tell whether the
    /// table in the kernel is this plan's.
    pub fingerprint: Option<String>,
}

/// The node's network as the agent found it: only Berth's devices (see [`is_berth_link`]),
/// their addresses and flood entries, and the fingerprint in Berth's table if it exists.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ObservedNetwork {
    pub links: Vec<Link>,
    pub addresses: Vec<(String, LinkAddress)>,
    pub flood: Vec<FloodEntry>,
    /// `None`: no table. `Some("")`: a table without Berth's fingerprint.
    pub table_fingerprint: Option<String>,
}

impl ObservedNetwork {
    /// The state a node is in once `plan` is applied.
    pub fn applied(plan: &HostNetworkPlan) -> ObservedNetwork {
        ObservedNetwork {
            links: plan.links.clone(),
            addresses: plan.addresses.clone(),
            flood: plan.flood.clone(),
            table_fingerprint: plan.fingerprint.clone(),
        }
    }
}

/// Whether a device name is one Berth makes (`bvx…`, `bvl…`, `bbr-vx…`, `bbr-vl…` with a
/// number): the agent changes or deletes no other device.
pub fn is_berth_link(name: &str) -> bool {
    let rest = name.strip_prefix("bbr-v").or_else(|| name.strip_prefix("bv"));
    rest.and_then(|r| r.strip_prefix('x').or_else(|| r.strip_prefix('l')))
        .is_some_and(|n| !n.is_empty() && n.len() <= 8 && n.bytes().all(|b| b.is_ascii_digit()) && !n.starts_with('0'))
}

/// Whether a container network is one Berth makes (`berth-vx…`, `berth-vl…` with a number):
/// the agent removes no other.
pub fn is_berth_runtime_network(name: &str) -> bool {
    name.strip_prefix(RUNTIME_NETWORK_PREFIX).is_some_and(|rest| is_berth_link(&format!("b{rest}")))
}

/// The node's network for `attachments`: one segment device and one bridge per tenant,
/// the node's address on each bridge, VXLAN flood entries for the peers and the nftables
/// table that keeps the tenants apart and away from `management` (the node's own
/// addresses for operators and the portal; the underlay address is one of them whether
/// listed or not).
///
/// Refused: a malformed underlay interface, a tenant or segment attached twice, two
/// tenants whose networks would share a subnet on this node, or an address outside its
/// segment's subnet.
pub fn plan(
    underlay: &Underlay,
    management: &[IpAddr],
    attachments: &[TenantAttachment],
) -> Result<HostNetworkPlan, Refusal> {
    validate_interface(&underlay.interface)?;
    if underlay.address.is_unspecified() || underlay.address.is_broadcast() || underlay.address.is_multicast() {
        return Err(Refusal::InvalidHostNetwork(format!("{} is not a usable underlay address", underlay.address)));
    }
    let mut attachments: Vec<&TenantAttachment> = attachments.iter().collect();
    attachments.sort_by_key(|a| a.segment);
    let mut tenants = BTreeSet::new();
    let mut subnets: BTreeMap<Ipv4Addr, &TenantAttachment> = BTreeMap::new();
    for a in &attachments {
        validate_attachment(a)?;
        if !tenants.insert(a.tenant.as_str()) {
            return Err(Refusal::InvalidHostNetwork(format!("tenant {} is attached twice", a.tenant)));
        }
        if let Some(other) = subnets.insert(a.segment.subnet(), a) {
            let what = if other.segment == a.segment { "share" } else { "would share the subnet of" };
            return Err(Refusal::InvalidHostNetwork(format!(
                "tenants {} and {} {what} {} on this node",
                other.tenant,
                a.tenant,
                a.segment.describe()
            )));
        }
    }

    let mut result = HostNetworkPlan::default();
    for a in &attachments {
        let bridge = a.segment.bridge_name();
        result.links.push(Link { name: bridge.clone(), kind: LinkKind::Bridge, master: None, up: true });
        result.addresses.push((bridge, LinkAddress { address: a.address, prefix_len: TENANT_PREFIX_LEN }));
    }
    for a in &attachments {
        let device = a.segment.device_name();
        let kind = match a.segment {
            TenantSegment::Vlan(id) => LinkKind::Vlan { id, parent: underlay.interface.clone() },
            TenantSegment::Vxlan(vni) => {
                let peers: BTreeSet<Ipv4Addr> = a.peers.iter().copied().filter(|p| *p != underlay.address).collect();
                result.flood.extend(peers.into_iter().map(|peer| FloodEntry { device: device.clone(), peer }));
                LinkKind::Vxlan { vni, local: underlay.address, parent: underlay.interface.clone(), port: VXLAN_PORT }
            }
        };
        result.links.push(Link { name: device, kind, master: Some(a.segment.bridge_name()), up: true });
    }
    if !attachments.is_empty() {
        let (ruleset, fingerprint) = ruleset(underlay, management, &attachments);
        result.ruleset = Some(ruleset);
        result.fingerprint = Some(fingerprint);
    }
    Ok(result)
}

fn validate_interface(name: &str) -> Result<(), Refusal> {
    let fine = !name.is_empty()
        && name.len() <= MAX_INTERFACE_NAME
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'@' | b':'));
    if !fine {
        return Err(Refusal::InvalidHostNetwork(format!(
            "\"{name}\" is not a network interface name (1 to 15 letters, digits, - _ . : @)"
        )));
    }
    if is_berth_link(name) {
        return Err(Refusal::InvalidHostNetwork(format!(
            "the underlay interface {name} is named like one of Berth's tenant devices"
        )));
    }
    Ok(())
}

fn validate_attachment(a: &TenantAttachment) -> Result<(), Refusal> {
    crate::tenancy::validate_slug(&a.tenant)
        .map_err(|_| Refusal::InvalidHostNetwork(format!("\"{}\" is not a tenant's short name", a.tenant)))?;
    if !a.segment.kind().valid().contains(&a.segment.value()) {
        return Err(Refusal::InvalidHostNetwork(format!(
            "{} of tenant {} is outside {}",
            a.segment.describe(),
            a.tenant,
            crate::fabric::Pool::whole(a.segment.kind()).range()
        )));
    }
    if !is_host_of(a.segment, a.address) {
        return Err(Refusal::InvalidHostNetwork(format!(
            "{} is not a host address of tenant {}'s network {}/{TENANT_PREFIX_LEN}",
            a.address,
            a.tenant,
            a.segment.subnet()
        )));
    }
    Ok(())
}

/// The `nft -f` script for Berth's table and its fingerprint.
///
/// Declaring, deleting and redefining the table in one script replaces it atomically: the
/// kernel never holds a half-written table, and rules of tenants that left are gone.
fn ruleset(underlay: &Underlay, management: &[IpAddr], attachments: &[&TenantAttachment]) -> (String, String) {
    let mut management: BTreeSet<IpAddr> = management.iter().copied().collect();
    management.insert(IpAddr::V4(underlay.address));
    let v4: Vec<String> = management.iter().filter(|a| a.is_ipv4()).map(ToString::to_string).collect();
    let v6: Vec<String> = management.iter().filter(|a| a.is_ipv6()).map(ToString::to_string).collect();
    let peers: BTreeSet<Ipv4Addr> = attachments
        .iter()
        .filter(|a| matches!(a.segment, TenantSegment::Vxlan(_)))
        .flat_map(|a| a.peers.iter().copied())
        .filter(|p| *p != underlay.address)
        .collect();
    let any_vxlan = attachments.iter().any(|a| matches!(a.segment, TenantSegment::Vxlan(_)));

    // `writeln!` into a String cannot fail.
    let mut body = String::new();
    if any_vxlan {
        let _ = writeln!(body, "\tset vxlan_peers {{\n\t\ttype ipv4_addr");
        if !peers.is_empty() {
            let list: Vec<String> = peers.iter().map(ToString::to_string).collect();
            let _ = writeln!(body, "\t\telements = {{ {} }}", list.join(", "));
        }
        let _ = writeln!(body, "\t}}");
    }
    let _ = writeln!(body, "\tchain input {{\n\t\ttype filter hook input priority filter; policy accept;");
    if any_vxlan {
        let _ = writeln!(
            body,
            "\t\tiifname \"{}\" udp dport {VXLAN_PORT} ip saddr != @vxlan_peers drop comment \"VXLAN only from the tenants' nodes\"",
            underlay.interface
        );
    }
    for a in attachments {
        let bridge = a.segment.bridge_name();
        let tenant = &a.tenant;
        if !v4.is_empty() {
            let _ = writeln!(
                body,
                "\t\tiifname \"{bridge}\" ip daddr {{ {} }} drop comment \"{tenant}: not the node's management address\"",
                v4.join(", ")
            );
        }
        if !v6.is_empty() {
            let _ = writeln!(
                body,
                "\t\tiifname \"{bridge}\" ip6 daddr {{ {} }} drop comment \"{tenant}: not the node's management address\"",
                v6.join(", ")
            );
        }
        // Linux answers for any of its addresses on any interface: without this a tenant
        // reaches the node's addresses on other tenants' networks through its own.
        let _ = writeln!(
            body,
            "\t\tiifname \"{bridge}\" ip daddr != {} fib daddr type local drop comment \"{tenant}: only its own address on this node\"",
            a.address
        );
        let _ = writeln!(
            body,
            "\t\tiifname \"{bridge}\" meta nfproto ipv6 fib daddr type local drop comment \"{tenant}: no IPv6 to the node\""
        );
    }
    let _ = writeln!(body, "\t}}\n\tchain forward {{\n\t\ttype filter hook forward priority filter; policy accept;");
    for a in attachments {
        let bridge = a.segment.bridge_name();
        let tenant = &a.tenant;
        // The node routes nothing between a tenant's segment and anything else: not other
        // tenants' bridges, not the underlay where every node's management address lives.
        let _ = writeln!(
            body,
            "\t\tiifname \"{bridge}\" oifname != \"{bridge}\" drop comment \"{tenant}: routed nowhere\""
        );
        let _ = writeln!(
            body,
            "\t\toifname \"{bridge}\" iifname != \"{bridge}\" drop comment \"{tenant}: nothing routed in\""
        );
    }
    let _ = writeln!(body, "\t}}");
    let fingerprint = format!("{:016x}", fnv1a(body.as_bytes()));
    let script = format!(
        "table inet {NFT_TABLE}\ndelete table inet {NFT_TABLE}\ntable inet {NFT_TABLE} {{\n\tcomment \"{FINGERPRINT_MARK}{fingerprint}\"\n{body}}}\n"
    );
    (script, fingerprint)
}

/// 64-bit FNV-1a: a stable fingerprint (not a security measure: only Berth and root write
/// the table).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| (hash ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// The fingerprint in `nft list table inet berth`'s output: `Some("")` when the table
/// carries none (made by hand, or by an older agent).
pub fn fingerprint_in(listing: &str) -> String {
    listing
        .split_once(&format!("comment \"{FINGERPRINT_MARK}"))
        .and_then(|(_, rest)| rest.split_once('"'))
        .map(|(fingerprint, _)| fingerprint.to_owned())
        .unwrap_or_default()
}

/// One step from the observed network towards the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    DeleteLink {
        name: String,
    },
    /// Creates the device, enslaves it and brings it up.
    AddLink {
        link: Link,
    },
    SetMaster {
        name: String,
        master: String,
    },
    SetUp {
        name: String,
    },
    DeleteAddress {
        device: String,
        address: LinkAddress,
    },
    AddAddress {
        device: String,
        address: LinkAddress,
    },
    DeleteFlood {
        entry: FloodEntry,
    },
    AddFlood {
        entry: FloodEntry,
    },
    ReplaceRuleset {
        script: String,
    },
    DeleteRuleset,
}

const ZERO_MAC: &str = "00:00:00:00:00:00";

impl Change {
    /// The commands that make the change, in order.
    pub fn commands(&self) -> Vec<Command> {
        match self {
            Change::DeleteLink { name } => vec![Command::new("ip", &["link", "delete", name])],
            Change::AddLink { link } => {
                let mut add = Command::new("ip", &["link", "add"]);
                match &link.kind {
                    LinkKind::Bridge => add.args.extend([link.name.clone(), "type".into(), "bridge".into()]),
                    LinkKind::Vxlan { vni, local, parent, port } => add.args.extend([
                        link.name.clone(),
                        "type".into(),
                        "vxlan".into(),
                        "id".into(),
                        vni.to_string(),
                        "local".into(),
                        local.to_string(),
                        "dev".into(),
                        parent.clone(),
                        "dstport".into(),
                        port.to_string(),
                        // Peers are listed, not learned: a forged packet teaches nothing.
                        "nolearning".into(),
                    ]),
                    LinkKind::Other(kind) => add.args.extend([link.name.clone(), "type".into(), kind.clone()]),
                    LinkKind::Vlan { id, parent } => add.args.extend([
                        "link".into(),
                        parent.clone(),
                        "name".into(),
                        link.name.clone(),
                        "type".into(),
                        "vlan".into(),
                        "id".into(),
                        id.to_string(),
                    ]),
                }
                let mut commands = vec![add];
                if let Some(master) = &link.master {
                    commands.push(Command::new("ip", &["link", "set", "dev", &link.name, "master", master]));
                }
                if link.up {
                    commands.push(Command::new("ip", &["link", "set", "dev", &link.name, "up"]));
                }
                commands
            }
            Change::SetMaster { name, master } => {
                vec![Command::new("ip", &["link", "set", "dev", name, "master", master])]
            }
            Change::SetUp { name } => vec![Command::new("ip", &["link", "set", "dev", name, "up"])],
            Change::DeleteAddress { device, address } => {
                vec![Command::new("ip", &["address", "delete", &cidr(address), "dev", device])]
            }
            Change::AddAddress { device, address } => {
                vec![Command::new("ip", &["address", "add", &cidr(address), "dev", device])]
            }
            Change::DeleteFlood { entry } => vec![Command::new(
                "bridge",
                &["fdb", "delete", ZERO_MAC, "dev", &entry.device, "dst", &entry.peer.to_string()],
            )],
            Change::AddFlood { entry } => vec![Command::new(
                "bridge",
                &["fdb", "append", ZERO_MAC, "dev", &entry.device, "dst", &entry.peer.to_string()],
            )],
            Change::ReplaceRuleset { script } => {
                vec![Command { program: "nft", args: vec!["-f".into(), "-".into()], stdin: Some(script.clone()) }]
            }
            Change::DeleteRuleset => vec![Command::new("nft", &["delete", "table", "inet", NFT_TABLE])],
        }
    }
}

fn cidr(address: &LinkAddress) -> String {
    format!("{}/{}", address.address, address.prefix_len)
}

/// The changes that turn `observed` into `plan`, in a safe order: devices of tenants that
/// left go first, then the new table (so a new tenant's bridge is never up without its
/// rules), then devices, addresses and flood entries. Empty when the node already matches.
pub fn changes(observed: &ObservedNetwork, plan: &HostNetworkPlan) -> Vec<Change> {
    let wanted: BTreeMap<&str, &Link> = plan.links.iter().map(|l| (l.name.as_str(), l)).collect();
    let present: BTreeMap<&str, &Link> =
        observed.links.iter().filter(|l| is_berth_link(&l.name)).map(|l| (l.name.as_str(), l)).collect();
    let mut result = Vec::new();

    // A device of the wrong kind or settings is made again: a VXLAN's id, source or port
    // cannot be changed in place.
    let mut recreated = BTreeSet::new();
    for (name, link) in &present {
        match wanted.get(name) {
            Some(want) if want.kind == link.kind => {}
            Some(_) => {
                recreated.insert(*name);
                result.push(Change::DeleteLink { name: (*name).to_owned() });
            }
            None => result.push(Change::DeleteLink { name: (*name).to_owned() }),
        }
    }
    if plan.ruleset.is_some() && observed.table_fingerprint != plan.fingerprint {
        result.push(Change::ReplaceRuleset { script: plan.ruleset.clone().unwrap_or_default() });
    }
    // Bridges come first in a plan, so a port's master exists when it is enslaved.
    for want in &plan.links {
        match present.get(want.name.as_str()) {
            Some(link) if !recreated.contains(want.name.as_str()) => {
                if let Some(master) = want.master.as_ref().filter(|m| link.master.as_ref() != Some(*m)) {
                    result.push(Change::SetMaster { name: want.name.clone(), master: master.clone() });
                }
                if want.up && !link.up {
                    result.push(Change::SetUp { name: want.name.clone() });
                }
            }
            _ => result.push(Change::AddLink { link: want.clone() }),
        }
    }
    // What was on a device that is deleted went with it.
    let kept =
        |device: &str| present.contains_key(device) && wanted.contains_key(device) && !recreated.contains(device);
    let have_addresses: BTreeSet<&(String, LinkAddress)> =
        observed.addresses.iter().filter(|(device, _)| kept(device)).collect();
    let want_addresses: BTreeSet<&(String, LinkAddress)> = plan.addresses.iter().collect();
    for (device, address) in have_addresses.difference(&want_addresses) {
        result.push(Change::DeleteAddress { device: device.clone(), address: *address });
    }
    for (device, address) in want_addresses.difference(&have_addresses) {
        result.push(Change::AddAddress { device: device.clone(), address: *address });
    }
    let have_flood: BTreeSet<&FloodEntry> = observed.flood.iter().filter(|e| kept(&e.device)).collect();
    let want_flood: BTreeSet<&FloodEntry> = plan.flood.iter().collect();
    for entry in have_flood.difference(&want_flood) {
        result.push(Change::DeleteFlood { entry: (*entry).clone() });
    }
    for entry in want_flood.difference(&have_flood) {
        result.push(Change::AddFlood { entry: (*entry).clone() });
    }
    if plan.ruleset.is_none() && observed.table_fingerprint.is_some() {
        result.push(Change::DeleteRuleset);
    }
    result
}

#[cfg(test)]
mod tests;
