//! Host network plans tested: segments, addresses, the nftables ruleset, the changes, and properties.
use super::*;

fn underlay(last: u8) -> Underlay {
    Underlay { interface: "eth0".into(), address: Ipv4Addr::new(10, 0, 0, last) }
}

fn vxlan(tenant: &str, vni: u32, node: i64, peers: &[u8]) -> TenantAttachment {
    let segment = TenantSegment::Vxlan(vni);
    TenantAttachment {
        tenant: tenant.into(),
        segment,
        address: tenant_address(segment, node).expect("address"),
        peers: peers.iter().map(|p| Ipv4Addr::new(10, 0, 0, *p)).collect(),
    }
}

fn vlan(tenant: &str, id: u16, node: i64) -> TenantAttachment {
    let segment = TenantSegment::Vlan(id);
    TenantAttachment {
        tenant: tenant.into(),
        segment,
        address: tenant_address(segment, node).expect("address"),
        peers: Vec::new(),
    }
}

/// What the kernel would hold after `change`: the model the properties run against.
fn apply(state: &mut ObservedNetwork, change: &Change) {
    match change {
        Change::DeleteLink { name } => {
            state.links.retain(|l| &l.name != name);
            state.addresses.retain(|(d, _)| d != name);
            state.flood.retain(|e| &e.device != name);
            // Deleting a bridge frees its ports.
            for l in &mut state.links {
                if l.master.as_ref() == Some(name) {
                    l.master = None;
                }
            }
        }
        Change::AddLink { link } => {
            assert!(state.links.iter().all(|l| l.name != link.name), "{} added twice", link.name);
            if let Some(master) = &link.master {
                assert!(state.links.iter().any(|l| &l.name == master), "{master} missing for {}", link.name);
            }
            state.links.push(link.clone());
        }
        Change::SetMaster { name, master } => {
            state.links.iter_mut().filter(|l| &l.name == name).for_each(|l| l.master = Some(master.clone()))
        }
        Change::SetUp { name } => state.links.iter_mut().filter(|l| &l.name == name).for_each(|l| l.up = true),
        Change::DeleteAddress { device, address } => state.addresses.retain(|a| a != &(device.clone(), *address)),
        Change::AddAddress { device, address } => {
            assert!(state.links.iter().any(|l| &l.name == device));
            state.addresses.push((device.clone(), *address));
        }
        Change::DeleteFlood { entry } => state.flood.retain(|e| e != entry),
        Change::AddFlood { entry } => {
            assert!(state.links.iter().any(|l| l.name == entry.device));
            state.flood.push(entry.clone());
        }
        Change::ReplaceRuleset { script } => state.table_fingerprint = Some(fingerprint_in(script)),
        Change::DeleteRuleset => state.table_fingerprint = None,
    }
}

fn converge(state: &mut ObservedNetwork, plan: &HostNetworkPlan) -> Vec<Change> {
    let changes = changes(state, plan);
    for change in &changes {
        apply(state, change);
    }
    changes
}

fn sorted(mut state: ObservedNetwork) -> ObservedNetwork {
    state.links.sort();
    state.addresses.sort();
    state.flood.sort();
    state
}

#[test]
fn a_vxlan_tenant_gets_a_device_a_bridge_an_address_and_its_peers() {
    let plan = plan(&underlay(1), &[], &[vxlan("acme", 5000, 1, &[2, 3, 1])]).expect("plan");
    let mut empty = ObservedNetwork::default();
    let commands: Vec<String> =
        converge(&mut empty, &plan).iter().flat_map(Change::commands).map(|c| c.to_string()).collect();
    let subnet = TenantSegment::Vxlan(5000).subnet();
    assert_eq!(subnet, Ipv4Addr::new(100, 78, 32, 0));
    assert_eq!(
        commands,
        [
            "nft -f -",
            "ip link add bbr-vx5000 type bridge",
            "ip link set dev bbr-vx5000 up",
            "ip link add bvx5000 type vxlan id 5000 local 10.0.0.1 dev eth0 dstport 4789 nolearning",
            "ip link set dev bvx5000 master bbr-vx5000",
            "ip link set dev bvx5000 up",
            "ip address add 100.78.32.1/22 dev bbr-vx5000",
            // The node itself (10.0.0.1) is no peer of its own.
            "bridge fdb append 00:00:00:00:00:00 dev bvx5000 dst 10.0.0.2",
            "bridge fdb append 00:00:00:00:00:00 dev bvx5000 dst 10.0.0.3",
        ]
    );
}

#[test]
fn the_ruleset_keeps_tenants_apart_and_off_the_management_address() {
    let management = [IpAddr::V4(Ipv4Addr::new(192, 168, 1, 5)), "fd00::5".parse().expect("ip")];
    let plan =
        plan(&underlay(1), &management, &[vxlan("acme", 100, 1, &[2]), vxlan("globex", 200, 1, &[3])]).expect("plan");
    let script = plan.ruleset.expect("ruleset");
    let fingerprint = plan.fingerprint.expect("fingerprint");
    assert_eq!(
        script,
        format!(
            r#"table inet berth
delete table inet berth
table inet berth {{
	comment "berth host network {fingerprint}"
	set vxlan_peers {{
		type ipv4_addr
		elements = {{ 10.0.0.2, 10.0.0.3 }}
	}}
	chain input {{
		type filter hook input priority filter; policy accept;
		iifname "eth0" udp dport 4789 ip saddr != @vxlan_peers drop comment "VXLAN only from the tenants' nodes"
		iifname "bbr-vx100" ip daddr {{ 10.0.0.1, 192.168.1.5 }} drop comment "acme: not the node's management address"
		iifname "bbr-vx100" ip6 daddr {{ fd00::5 }} drop comment "acme: not the node's management address"
		iifname "bbr-vx100" ip daddr != 100.65.144.1 fib daddr type local drop comment "acme: only its own address on this node"
		iifname "bbr-vx100" meta nfproto ipv6 fib daddr type local drop comment "acme: no IPv6 to the node"
		iifname "bbr-vx200" ip daddr {{ 10.0.0.1, 192.168.1.5 }} drop comment "globex: not the node's management address"
		iifname "bbr-vx200" ip6 daddr {{ fd00::5 }} drop comment "globex: not the node's management address"
		iifname "bbr-vx200" ip daddr != 100.67.32.1 fib daddr type local drop comment "globex: only its own address on this node"
		iifname "bbr-vx200" meta nfproto ipv6 fib daddr type local drop comment "globex: no IPv6 to the node"
	}}
	chain forward {{
		type filter hook forward priority filter; policy accept;
		iifname "bbr-vx100" oifname != "bbr-vx100" drop comment "acme: routed nowhere"
		oifname "bbr-vx100" iifname != "bbr-vx100" drop comment "acme: nothing routed in"
		iifname "bbr-vx200" oifname != "bbr-vx200" drop comment "globex: routed nowhere"
		oifname "bbr-vx200" iifname != "bbr-vx200" drop comment "globex: nothing routed in"
	}}
}}
"#
        )
    );
    assert_eq!(fingerprint_in(&script), fingerprint);
    assert_eq!(fingerprint_in("table inet berth {\n}"), "");
}

#[test]
fn a_vlan_tenant_sits_on_the_underlay_without_tunnel_rules() {
    let plan = plan(&underlay(1), &[], &[vlan("acme", 100, 7)]).expect("plan");
    assert_eq!(
        plan.links[1],
        Link {
            name: "bvl100".into(),
            kind: LinkKind::Vlan { id: 100, parent: "eth0".into() },
            master: Some("bbr-vl100".into()),
            up: true,
        }
    );
    assert_eq!(
        plan.addresses,
        [("bbr-vl100".into(), LinkAddress { address: Ipv4Addr::new(100, 65, 144, 7), prefix_len: 22 })]
    );
    let commands: Vec<String> =
        changes(&ObservedNetwork::default(), &plan).iter().flat_map(Change::commands).map(|c| c.to_string()).collect();
    assert!(commands.contains(&"ip link add link eth0 name bvl100 type vlan id 100".to_owned()));
    let script = plan.ruleset.expect("ruleset");
    assert!(!script.contains("vxlan_peers") && !script.contains("4789"), "{script}");
    assert!(plan.flood.is_empty());
}

#[test]
fn no_tenants_means_no_devices_and_no_table() {
    let plan = plan(&underlay(1), &[], &[]).expect("plan");
    assert_eq!(plan, HostNetworkPlan::default());
    assert_eq!(changes(&ObservedNetwork::default(), &plan), []);
    let mut stale =
        ObservedNetwork::applied(&super::plan(&underlay(1), &[], &[vxlan("acme", 9, 1, &[2])]).expect("plan"));
    // Devices that are not Berth's are never touched.
    stale.links.push(Link { name: "eth0".into(), kind: LinkKind::Bridge, master: None, up: true });
    let changes = changes(&stale, &plan);
    assert_eq!(
        changes,
        [
            Change::DeleteLink { name: "bbr-vx9".into() },
            Change::DeleteLink { name: "bvx9".into() },
            Change::DeleteRuleset
        ]
    );
}

#[test]
fn addresses_follow_the_segment_and_the_node_number() {
    assert_eq!(tenant_address(TenantSegment::Vlan(2), 1), Ok(Ipv4Addr::new(100, 64, 8, 1)));
    assert_eq!(tenant_address(TenantSegment::Vlan(4094), 1022), Ok(Ipv4Addr::new(100, 127, 251, 254)));
    assert!(tenant_address(TenantSegment::Vlan(2), 0).is_err());
    assert!(tenant_address(TenantSegment::Vlan(2), 1023).is_err());
    // Every VLAN id has a subnet of its own.
    let subnets: BTreeSet<Ipv4Addr> = (2..=4094).map(|id| TenantSegment::Vlan(id).subnet()).collect();
    assert_eq!(subnets.len(), 4093);
}

#[test]
fn clashes_and_bad_input_are_refused_with_the_reason() {
    let refusal = |underlay: &Underlay, attachments: &[TenantAttachment]| {
        plan(underlay, &[], attachments).expect_err("refused").to_string()
    };
    assert_eq!(
        refusal(&underlay(1), &[vxlan("acme", 100, 1, &[]), vxlan("globex", 100 + 4096, 1, &[])]),
        "host network: tenants acme and globex would share the subnet of VXLAN VNI 4196 on this node"
    );
    assert_eq!(
        refusal(&underlay(1), &[vxlan("acme", 100, 1, &[]), vxlan("globex", 100, 1, &[])]),
        "host network: tenants acme and globex share VXLAN VNI 100 on this node"
    );
    assert_eq!(
        refusal(&underlay(1), &[vxlan("acme", 100, 1, &[]), vxlan("acme", 200, 1, &[])]),
        "host network: tenant acme is attached twice"
    );
    let wrong_address = TenantAttachment { address: Ipv4Addr::new(100, 64, 0, 1), ..vxlan("acme", 100, 1, &[]) };
    assert_eq!(
        refusal(&underlay(1), &[wrong_address]),
        "host network: 100.64.0.1 is not a host address of tenant acme's network 100.65.144.0/22"
    );
    let bad_vlan = TenantAttachment { segment: TenantSegment::Vlan(1), ..vlan("acme", 2, 1) };
    assert!(refusal(&underlay(1), &[bad_vlan]).contains("VLAN 1 of tenant acme is outside 2-4094"));
    let shell = Underlay { interface: "eth0; reboot".into(), ..underlay(1) };
    assert!(refusal(&shell, &[]).contains("is not a network interface name"));
    let ours = Underlay { interface: "bvx7".into(), ..underlay(1) };
    assert!(refusal(&ours, &[]).contains("named like one of Berth's tenant devices"));
    let quoted = TenantAttachment { tenant: "a\"b".into(), ..vxlan("acme", 100, 1, &[]) };
    assert!(refusal(&underlay(1), &[quoted]).contains("is not a tenant's short name"));
}

#[test]
fn containers_count_down_from_the_top_of_the_segment_above_the_nodes() {
    let segment = TenantSegment::Vlan(100);
    assert_eq!(segment.subnet(), Ipv4Addr::new(100, 65, 144, 0));
    let first = container_address(segment, 3, &[]).expect("address");
    assert_eq!(first, Ipv4Addr::new(100, 65, 147, 254));
    assert_eq!(container_address(segment, 3, &[first]), Ok(Ipv4Addr::new(100, 65, 147, 253)));
    assert!(is_host_of(segment, first) && !is_host_of(segment, Ipv4Addr::new(100, 65, 147, 255)));
    // Every address above the nodes taken: refused, naming the segment.
    let all: Vec<Ipv4Addr> = (1021..=1022).map(|h| Ipv4Addr::from(u32::from(segment.subnet()) + h)).collect();
    assert_eq!(
        container_address(segment, 1020, &all).expect_err("full").to_string(),
        "host network: VLAN 100 has no address left for another container (2 containers; node addresses take the first 1020)"
    );
    assert_eq!(segment.runtime_network_name(), "berth-vl100");
    assert!(is_berth_runtime_network("berth-vx5000") && is_berth_runtime_network(&segment.runtime_network_name()));
    for name in ["podman", "bridge", "berth-v", "berth-vl01", "berth-acme", "berth-vlx"] {
        assert!(!is_berth_runtime_network(name), "{name}");
    }
}

#[test]
fn berth_owns_exactly_its_device_names() {
    for name in ["bvx1", "bvl4094", "bbr-vx16777215", "bbr-vl2"] {
        assert!(is_berth_link(name), "{name}");
    }
    for name in ["eth0", "bvx", "bvx01", "bbr-vx", "bvxa", "bbr0", "bvx123456789", "docker0", "bvl1x"] {
        assert!(!is_berth_link(name), "{name}");
    }
    assert!(is_berth_link(&TenantSegment::Vxlan(16_777_215).bridge_name()));
    assert!(TenantSegment::Vxlan(16_777_215).bridge_name().len() <= MAX_INTERFACE_NAME);
}

#[test]
fn a_device_with_other_settings_is_made_again_with_its_address_and_peers() {
    let plan = plan(&underlay(1), &[], &[vxlan("acme", 100, 1, &[2])]).expect("plan");
    let mut state = ObservedNetwork::applied(&plan);
    // The node's underlay address changed since the device was made, and the bridge
    // was brought down by hand.
    if let LinkKind::Vxlan { local, .. } = &mut state.links[1].kind {
        *local = Ipv4Addr::new(10, 0, 0, 99);
    }
    state.links[0].up = false;
    let changes = converge(&mut state, &plan);
    assert_eq!(
        changes,
        [
            Change::DeleteLink { name: "bvx100".into() },
            Change::SetUp { name: "bbr-vx100".into() },
            Change::AddLink { link: plan.links[1].clone() },
            Change::AddFlood { entry: plan.flood[0].clone() },
        ]
    );
    assert_eq!(sorted(state), sorted(ObservedNetwork::applied(&plan)));
}

mod properties {
    use proptest::prelude::*;

    use super::*;

    const TENANTS: [&str; 6] = ["acme", "globex", "initech", "umbrella", "hooli", "stark"];

    /// Up to six tenants on node 1 (underlay 10.0.0.1), each VLAN or VXLAN with distinct
    /// segments, some peers among 10.0.0.1..=10.0.0.6.
    fn attachments() -> impl Strategy<Value = Vec<TenantAttachment>> {
        proptest::sample::subsequence((0..TENANTS.len()).collect::<Vec<_>>(), 0..=TENANTS.len()).prop_flat_map(
            |tenants| {
                let n = tenants.len();
                (
                    Just(tenants),
                    proptest::collection::vec(any::<bool>(), n),
                    proptest::collection::vec(proptest::collection::vec(1u8..=6, 0..4), n),
                )
                    .prop_map(|(tenants, vlans, peers)| {
                        tenants
                            .iter()
                            .zip(vlans)
                            .zip(peers)
                            .map(|((t, is_vlan), peers)| {
                                let id = 10 + *t as u16;
                                if is_vlan {
                                    vlan(TENANTS[*t], id, 1)
                                } else {
                                    vxlan(TENANTS[*t], u32::from(id) + 5000, 1, &peers)
                                }
                            })
                            .collect()
                    })
            },
        )
    }

    proptest! {
        #[test]
        fn applying_twice_changes_nothing(attachments in attachments()) {
            let plan = plan(&underlay(1), &[], &attachments).expect("plan");
            let mut state = ObservedNetwork::default();
            converge(&mut state, &plan);
            prop_assert_eq!(sorted(state.clone()), sorted(ObservedNetwork::applied(&plan)));
            prop_assert_eq!(converge(&mut state, &plan), []);
        }

        #[test]
        fn removing_a_tenant_removes_exactly_its_devices_and_rules(
            attachments in attachments().prop_filter("a tenant to remove", |a| !a.is_empty()),
            pick in any::<proptest::sample::Index>(),
        ) {
            let before = plan(&underlay(1), &[], &attachments).expect("plan");
            let mut state = ObservedNetwork::applied(&before);
            let gone = attachments[pick.index(attachments.len())].clone();
            let rest: Vec<TenantAttachment> = attachments.iter().filter(|a| a.tenant != gone.tenant).cloned().collect();
            let after = plan(&underlay(1), &[], &rest).expect("plan");
            let changes = converge(&mut state, &after);
            let (bridge, device) = (gone.segment.bridge_name(), gone.segment.device_name());
            for change in &changes {
                match change {
                    Change::DeleteLink { name } => prop_assert!(name == &bridge || name == &device),
                    Change::ReplaceRuleset { .. } | Change::DeleteRuleset => {}
                    other => prop_assert!(false, "{other:?} touches a tenant that stays"),
                }
            }
            prop_assert_eq!(sorted(state.clone()), sorted(ObservedNetwork::applied(&after)));
            prop_assert!(state.links.iter().all(|l| l.name != bridge && l.name != device));
            if let Some(script) = &after.ruleset {
                prop_assert!(!script.contains(&bridge) && !script.contains(&gone.tenant));
            } else {
                prop_assert_eq!(state.table_fingerprint, None);
            }
        }

        #[test]
        fn any_state_of_berths_devices_converges_in_one_pass(
            from in attachments(),
            to in attachments(),
            down in any::<bool>(),
        ) {
            let mut state = ObservedNetwork::applied(&plan(&underlay(2), &[], &from).expect("plan"));
            if down {
                state.links.iter_mut().for_each(|l| l.up = false);
            }
            let target = plan(&underlay(1), &[], &to).expect("plan");
            converge(&mut state, &target);
            prop_assert_eq!(sorted(state.clone()), sorted(ObservedNetwork::applied(&target)));
            prop_assert_eq!(converge(&mut state, &target), []);
        }

        #[test]
        fn fingerprints_tell_plans_apart(a in attachments(), b in attachments()) {
            let (pa, pb) = (plan(&underlay(1), &[], &a).expect("plan"), plan(&underlay(1), &[], &b).expect("plan"));
            prop_assert_eq!(pa.ruleset == pb.ruleset, pa.fingerprint == pb.fingerprint);
        }
    }
}
