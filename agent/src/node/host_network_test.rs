//! Tenant network isolation on real Linux networking: three hosts in network namespaces
//! on a bridge that plays the underlay switch, each set up by the agent's own code through
//! the real `ip`, `bridge` and `nft`, then probed with `ping`.
//!
//! host 1 carries tenants acme (VXLAN 100) and globex (VXLAN 200), host 2 acme, host 3
//! globex. Needs root and network namespaces; `make test` installs nftables and ping.

use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;

use berth_domain::host_network::{Change, TenantAttachment, TenantSegment, Underlay, tenant_address};

use super::commands::SystemRunner;
use super::network::{NodeNetwork, apply};

/// Network namespaces named after this process, deleted however the test ends.
struct Lab {
    prefix: String,
    namespaces: Vec<String>,
}

impl Lab {
    /// The lab, or `None` after saying loudly why this machine cannot have one. In CI as
    /// root (`CI=true`, uid 0) there is no excuse: no lab fails the test instead.
    fn open() -> Option<Lab> {
        let root = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(1) == Some("0")))
            .unwrap_or(false);
        if !root {
            return skipped("it needs root (network namespaces)", false);
        }
        let mut lab = Lab { prefix: format!("berth-t{}-", std::process::id()), namespaces: Vec::new() };
        if let Err(error) = lab.namespace("probe") {
            return skipped(&format!("no network namespaces here ({error})"), true);
        }
        Some(lab)
    }

    fn name(&self, host: &str) -> String {
        format!("{}{host}", self.prefix)
    }

    fn namespace(&mut self, host: &str) -> Result<String, String> {
        let name = self.name(host);
        run("ip", &["netns", "add", &name])?;
        self.namespaces.push(name.clone());
        run("ip", &["-n", &name, "link", "set", "lo", "up"])?;
        Ok(name)
    }

    /// Runs `program args` inside `host`'s namespace; panics with what it said on failure.
    fn on(&self, host: &str, program: &str, args: &[&str]) -> String {
        let ns = self.name(host);
        let mut all = vec!["netns", "exec", ns.as_str(), program];
        all.extend_from_slice(args);
        run("ip", &all).unwrap_or_else(|e| panic!("on {host}: {e}"))
    }

    /// Whether `from` gets an answer from `to` (a few tries for a reachable one: the
    /// first packets wait for ARP across the tunnel).
    fn reaches(&self, from: &str, to: Ipv4Addr, tries: u32) -> bool {
        let ns = self.name(from);
        let to = to.to_string();
        (0..tries).any(|_| run("ip", &["netns", "exec", &ns, "ping", "-c", "1", "-W", "1", "-q", &to]).is_ok())
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for ns in self.namespaces.iter().rev() {
            let _ = run("ip", &["netns", "delete", ns]);
        }
    }
}

/// Says on the terminal that the test did not run, and why; or, where it must run (CI as
/// root), fails it. Straight to stderr: libtest hides a passing test's `eprintln!`.
fn skipped(why: &str, root: bool) -> Option<Lab> {
    let ci = std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
    assert!(!(ci && root), "the tenant network isolation test must run in CI as root, but: {why}");
    let line = format!("\n!!!!!!!! SKIPPED tenant network isolation test: {why} !!!!!!!!\n");
    let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    None
}

fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {program} (install iproute2, nftables and iputils-ping): {e}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!("{program} {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr).trim()))
    }
}

fn underlay(host: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, host)
}

fn vxlan(tenant: &str, vni: u32, node: u8, peers: &[u8]) -> TenantAttachment {
    let segment = TenantSegment::Vxlan(vni);
    TenantAttachment {
        tenant: tenant.into(),
        segment,
        address: tenant_address(segment, i64::from(node)).expect("address"),
        peers: peers.iter().map(|p| underlay(*p)).collect(),
    }
}

#[test]
fn tenants_reach_their_own_hosts_and_nothing_of_other_tenants() {
    let Some(mut lab) = Lab::open() else { return };
    // The underlay: a switch (a bridge in its own namespace) and a port per host.
    let switch = lab.namespace("switch").expect("namespace");
    run("ip", &["-n", &switch, "link", "add", "sw0", "type", "bridge"]).expect("switch");
    run("ip", &["-n", &switch, "link", "set", "sw0", "up"]).expect("switch up");
    for host in 1..=3u8 {
        let name = format!("h{host}");
        let ns = lab.namespace(&name).expect("namespace");
        let port = format!("p{host}");
        run("ip", &["-n", &switch, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &ns])
            .expect("cable");
        run("ip", &["-n", &switch, "link", "set", &port, "master", "sw0", "up"]).expect("port");
        run("ip", &["-n", &ns, "address", "add", &format!("{}/24", underlay(host)), "dev", "eth0"]).expect("address");
        run("ip", &["-n", &ns, "link", "set", "eth0", "up"]).expect("up");
    }
    // Host 1's management address is on its loopback, as on many sites; and it forwards
    // (as any node running containers does), which is what a tenant would abuse.
    lab.on("h1", "ip", &["address", "add", "192.168.100.1/32", "dev", "lo"]);
    lab.on("h1", "sh", &["-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"]);
    let management = IpAddr::V4(Ipv4Addr::new(192, 168, 100, 1));

    let node = |host: u8| NodeNetwork {
        underlay: Underlay { interface: "eth0".into(), address: underlay(host) },
        management: if host == 1 { vec![management] } else { Vec::new() },
    };
    let runner = |host: u8| SystemRunner::in_namespace(&lab.name(&format!("h{host}")));
    let acme = |host: u8| vxlan("acme", 100, host, &[1, 2]);
    let globex = |host: u8| vxlan("globex", 200, host, &[1, 3]);
    let attached = [(1, vec![acme(1), globex(1)]), (2, vec![acme(2)]), (3, vec![globex(3)])];
    for (host, tenants) in &attached {
        let changes = apply(&runner(*host), &node(*host), tenants).expect("applied");
        assert!(!changes.is_empty());
        // What the agent reads back is what it wrote: a second pass changes nothing.
        assert_eq!(apply(&runner(*host), &node(*host), tenants), Ok(Vec::new()), "host {host}");
    }

    // Each tenant reaches its own hosts over its own network.
    assert!(lab.reaches("h2", acme(1).address, 5), "acme: host 2 cannot reach host 1");
    assert!(lab.reaches("h1", acme(2).address, 5), "acme: host 1 cannot reach host 2");
    assert!(lab.reaches("h3", globex(1).address, 5), "globex: host 3 cannot reach host 1");

    // globex's host 3 tries to use host 1, which it shares with acme, as a router into
    // acme's network and to the node's management address; acme's host 2 would answer
    // through host 1 too.
    let acme_subnet = format!("{}/22", TenantSegment::Vxlan(100).subnet());
    let globex_subnet = format!("{}/22", TenantSegment::Vxlan(200).subnet());
    let via_globex = globex(1).address.to_string();
    lab.on("h3", "ip", &["route", "add", &acme_subnet, "via", &via_globex]);
    lab.on("h3", "ip", &["route", "add", "192.168.100.1/32", "via", &via_globex]);
    lab.on("h2", "ip", &["route", "add", &globex_subnet, "via", &acme(1).address.to_string()]);
    let attacks = [
        ("acme's address on host 1", acme(1).address),
        ("acme's host 2", acme(2).address),
        ("host 1's management address", Ipv4Addr::new(192, 168, 100, 1)),
    ];
    for (what, target) in attacks {
        assert!(!lab.reaches("h3", target, 1), "globex's host 3 reaches {what}");
    }
    // The control: without Berth's table every one of those works, so the rules are what
    // stops them, not the lab's routing.
    lab.on("h1", "nft", &["delete", "table", "inet", "berth"]);
    for (what, target) in attacks {
        assert!(lab.reaches("h3", target, 3), "without the rules globex should reach {what}: the lab is wrong");
    }
    let repaired = apply(&runner(1), &node(1), &attached[0].1).expect("applied");
    assert!(matches!(repaired[..], [Change::ReplaceRuleset { .. }]), "{repaired:?}");
    for (what, target) in attacks {
        assert!(!lab.reaches("h3", target, 1), "after the repair globex's host 3 reaches {what}");
    }

    // globex leaves host 1: its devices and rules go, acme's stay and work.
    let changes = apply(&runner(1), &node(1), &[acme(1)]).expect("applied");
    assert!(changes.contains(&Change::DeleteLink { name: "bbr-vx200".into() }), "{changes:?}");
    assert!(changes.contains(&Change::DeleteLink { name: "bvx200".into() }), "{changes:?}");
    let links = lab.on("h1", "ip", &["-brief", "link", "show"]);
    assert!(links.contains("bbr-vx100") && links.contains("bvx100"), "{links}");
    assert!(!links.contains("vx200"), "globex's devices are still on host 1:\n{links}");
    let table = lab.on("h1", "nft", &["list", "table", "inet", "berth"]);
    assert!(table.contains("bbr-vx100") && !table.contains("vx200") && !table.contains("globex"), "{table}");
    assert!(lab.reaches("h2", acme(1).address, 3), "acme lost its network when globex left");
    assert!(!lab.reaches("h3", globex(1).address, 1), "globex's old address on host 1 still answers");
    assert_eq!(apply(&runner(1), &node(1), &[acme(1)]), Ok(Vec::new()));

    // The last tenant leaves: nothing of Berth's is left on host 1.
    apply(&runner(1), &node(1), &[]).expect("applied");
    let links = lab.on("h1", "ip", &["-brief", "link", "show"]);
    assert!(!links.contains("bbr-") && !links.contains("bvx"), "{links}");
    assert!(run("ip", &["netns", "exec", &lab.name("h1"), "nft", "list", "table", "inet", "berth"]).is_err());
    assert_eq!(apply(&runner(1), &node(1), &[]), Ok(Vec::new()));
}
