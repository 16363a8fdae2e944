//! The fleet description an operator writes (`config/fleet.toml`): sites, and pools of
//! identical nodes in each. The simulated backend runs this fleet; real backends report
//! theirs and are checked against it.

use serde::Deserialize;

use crate::Refusal;
use crate::gpu::GpuModel;
use crate::node_checks::{BandwidthTable, Interconnect};
use crate::node_health::{RepairTier, default_repair_tiers};
use crate::placement::TIME_SLICE_WAYS;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct FleetFile {
    #[serde(rename = "site", default)]
    sites: Vec<SiteFile>,
    /// The repair ladder a degraded node climbs; absent: `default_repair_tiers`.
    #[serde(rename = "repair_tier", default)]
    repair_tiers: Option<Vec<RepairTier>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct SiteFile {
    name: String,
    #[serde(rename = "pool", default)]
    pools: Vec<PoolFile>,
    /// What this site's nodes reach in NCCL's all-reduce where it differs from Berth's
    /// typical figures (`node_checks::BandwidthTable`).
    #[serde(default)]
    expected_bandwidth: Vec<BandwidthFile>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct BandwidthFile {
    model: String,
    /// `nvlink` or `pcie`.
    interconnect: String,
    /// Bus bandwidth in GB/s.
    gbps: u32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct PoolFile {
    /// Node names are `<prefix>-01`, `<prefix>-02`, ...
    prefix: String,
    model: String,
    nodes: u32,
    gpus_per_node: u32,
    /// Whether the GPUs of a node share an NVLink/NVSwitch domain.
    #[serde(default)]
    nvlink: bool,
    /// Lets an operator keep MIG off on capable GPUs.
    #[serde(default = "yes")]
    mig: bool,
    /// Time-slices each GPU into this many development shares (2, 4 or 8); such GPUs
    /// serve only the development tier.
    #[serde(default)]
    time_slices: Option<u8>,
    /// Nodes per multi-node NVLink domain (an NVL72 rack is 18 trays of 4 GPUs): a
    /// multi-node request stays inside one domain.
    #[serde(default)]
    nvlink_domain_nodes: Option<u32>,
    /// InfiniBand rails, rail-optimized: GPU `i` of every node is cabled to rail
    /// `i % ib_rails`. Absent for nodes without InfiniBand.
    #[serde(default)]
    ib_rails: Option<u32>,
    /// Nodes per InfiniBand scalable unit (the nodes under one set of rail leaf switches,
    /// one hop apart on every rail); a multi-node request prefers one unit. All the
    /// pool's nodes by default.
    #[serde(default)]
    ib_unit_nodes: Option<u32>,
    /// Nodes of this pool that Berth has not seen before start `new` and take bookings
    /// only after passing acceptance. Off by default: nodes an operator lists are taken as
    /// in service already (the demo and existing sites book at once).
    #[serde(default)]
    acceptance: bool,
}

fn yes() -> bool {
    true
}

/// One node of the fleet, fully expanded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    pub site: String,
    pub name: String,
    pub model: GpuModel,
    pub gpus: u32,
    pub mig_enabled: bool,
    /// NVLink domain name: the node itself when its GPUs share NVSwitch, or a multi-node
    /// domain (`<prefix>-nvl01`) shared with other nodes.
    pub nvlink_domain: Option<String>,
    /// The InfiniBand scalable unit the node is in (`<prefix>-su01`), if it has InfiniBand.
    pub ib_unit: Option<String>,
    /// InfiniBand rails its GPUs are cabled to (GPU `i` on rail `i % ib_rails`); 0 without.
    pub ib_rails: u32,
    /// 1, or the ways its GPUs are time-sliced for the development tier.
    pub time_slices: u8,
    /// A node first seen starts `new` (acceptance before bookings) rather than `available`.
    pub needs_acceptance: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetSpec {
    pub nodes: Vec<NodeSpec>,
    /// The operator's repair tiers, in order.
    pub repair_tiers: Vec<RepairTier>,
    /// Per-site expected NCCL bus bandwidth: (site, model, interconnect, GB/s).
    pub expected_bandwidth: Vec<(String, GpuModel, Interconnect, u32)>,
}

impl FleetSpec {
    pub fn parse(text: &str) -> Result<FleetSpec, Refusal> {
        let invalid = |m: String| Refusal::InvalidFleet(m);
        let file: FleetFile = toml::from_str(text).map_err(|e| invalid(e.message().to_owned()))?;
        let repair_tiers = file.repair_tiers.clone().unwrap_or_else(default_repair_tiers);
        for tier in &repair_tiers {
            if tier.name.trim().is_empty() || tier.command.as_deref().is_some_and(|c| c.trim().is_empty()) {
                return Err(invalid("a repair tier needs a name, and its command (if any) must not be empty".into()));
            }
        }
        if repair_tiers.len() > 10 {
            return Err(invalid("at most 10 repair tiers".into()));
        }
        let mut expected_bandwidth = Vec::new();
        for site in &file.sites {
            for b in &site.expected_bandwidth {
                let model = GpuModel::parse(&b.model)
                    .ok_or_else(|| invalid(format!("site {}: unknown GPU model \"{}\"", site.name, b.model)))?;
                let interconnect = match b.interconnect.as_str() {
                    "nvlink" => Interconnect::Nvlink,
                    "pcie" => Interconnect::Pcie,
                    other => {
                        return Err(invalid(format!(
                            "site {}: interconnect is nvlink or pcie, not \"{other}\"",
                            site.name
                        )));
                    }
                };
                if b.gbps == 0 {
                    return Err(invalid(format!("site {}: expected bandwidth must be above 0", site.name)));
                }
                expected_bandwidth.push((site.name.clone(), model, interconnect, b.gbps));
            }
        }
        let mut nodes = Vec::new();
        for site in &file.sites {
            if site.name.trim().is_empty() {
                return Err(invalid("a site needs a name".into()));
            }
            for pool in &site.pools {
                let model = GpuModel::parse(&pool.model).ok_or_else(|| {
                    invalid(format!(
                        "unknown GPU model \"{}\" (known: {})",
                        pool.model,
                        GpuModel::ALL.map(GpuModel::name).join(", ")
                    ))
                })?;
                if !(1..=16).contains(&pool.gpus_per_node) {
                    return Err(invalid(format!("pool {}: gpus_per_node must be 1 to 16", pool.prefix)));
                }
                if !(1..=10_000).contains(&pool.nodes) {
                    return Err(invalid(format!("pool {}: nodes must be 1 to 10000", pool.prefix)));
                }
                let group = |what: &str, size: Option<u32>| -> Result<Option<u32>, Refusal> {
                    match size {
                        Some(size) if size == 0 || size > pool.nodes || pool.nodes % size != 0 => Err(invalid(
                            format!("pool {}: {what} must divide its {} nodes evenly", pool.prefix, pool.nodes),
                        )),
                        other => Ok(other),
                    }
                };
                let domain_nodes = group("nvlink_domain_nodes", pool.nvlink_domain_nodes)?;
                let unit_nodes = group("ib_unit_nodes", pool.ib_unit_nodes)?.unwrap_or(pool.nodes);
                if domain_nodes.is_some() && !pool.nvlink {
                    return Err(invalid(format!("pool {}: nvlink_domain_nodes needs nvlink = true", pool.prefix)));
                }
                let ib_rails = pool.ib_rails.unwrap_or(0);
                if ib_rails > pool.gpus_per_node {
                    return Err(invalid(format!("pool {}: ib_rails must be at most gpus_per_node", pool.prefix)));
                }
                let time_slices = match pool.time_slices {
                    None => 1,
                    Some(ways) if TIME_SLICE_WAYS.contains(&ways) => ways,
                    Some(ways) => {
                        return Err(invalid(format!(
                            "pool {}: time_slices must be 2, 4 or 8, not {ways}",
                            pool.prefix
                        )));
                    }
                };
                for n in 1..=pool.nodes {
                    let name = format!("{}-{n:02}", pool.prefix);
                    let nvlink_domain = match domain_nodes {
                        Some(size) => Some(format!("{}-nvl{:02}", pool.prefix, (n - 1) / size + 1)),
                        None => pool.nvlink.then(|| name.clone()),
                    };
                    let ib_unit = (ib_rails > 0).then(|| format!("{}-su{:02}", pool.prefix, (n - 1) / unit_nodes + 1));
                    nodes.push(NodeSpec {
                        site: site.name.clone(),
                        nvlink_domain,
                        ib_unit,
                        ib_rails,
                        name,
                        model,
                        gpus: pool.gpus_per_node,
                        // A time-sliced GPU is shared whole; it is never partitioned.
                        mig_enabled: pool.mig && model.mig_capable() && time_slices == 1,
                        time_slices,
                        needs_acceptance: pool.acceptance,
                    });
                }
            }
        }
        if nodes.is_empty() {
            return Err(invalid("the fleet has no nodes".into()));
        }
        for (i, node) in nodes.iter().enumerate() {
            if nodes[i + 1..].iter().any(|other| other.name == node.name) {
                return Err(invalid(format!("node name {} is used twice", node.name)));
            }
        }
        Ok(FleetSpec { nodes, repair_tiers, expected_bandwidth })
    }

    /// Berth's typical bandwidths with this fleet's per-site figures over them.
    pub fn bandwidth_table(&self) -> BandwidthTable {
        let mut table = BandwidthTable::default();
        for (site, model, interconnect, gbps) in &self.expected_bandwidth {
            table.set(Some(site), *model, *interconnect, f64::from(*gbps));
        }
        table
    }

    pub fn gpu_count(&self) -> u32 {
        self.nodes.iter().map(|n| n.gpus).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"
        [[site]]
        name = "fra-1"
        [[site.pool]]
        prefix = "fra1-h100"
        model = "H100-80GB"
        nodes = 2
        gpus_per_node = 8
        nvlink = true

        [[site]]
        name = "ams-1"
        [[site.pool]]
        prefix = "ams1-l40s"
        model = "L40S"
        nodes = 1
        gpus_per_node = 4
    "#;

    #[test]
    fn repair_tiers_and_site_bandwidths_come_from_the_file() {
        let fleet = FleetSpec::parse(EXAMPLE).unwrap();
        assert_eq!(fleet.repair_tiers, default_repair_tiers(), "absent: the default ladder");
        let text = r#"
            [[repair_tier]]
            name = "power cycle"
            command = "curl -X POST https://bmc/redfish/v1/Systems/1/Actions/ComputerSystem.Reset"
            [[repair_tier]]
            name = "vendor"
            [[site]]
            name = "fra-1"
            expected_bandwidth = [{ model = "H100-80GB", interconnect = "nvlink", gbps = 380 }]
            [[site.pool]]
            prefix = "fra1-h100"
            model = "H100-80GB"
            nodes = 1
            gpus_per_node = 8
            nvlink = true
            acceptance = true
        "#;
        let fleet = FleetSpec::parse(text).unwrap();
        assert_eq!(fleet.repair_tiers.len(), 2);
        assert_eq!(fleet.repair_tiers[1].command, None, "a manual step");
        assert!(fleet.nodes[0].needs_acceptance);
        let table = fleet.bandwidth_table();
        assert_eq!(table.expected("fra-1", GpuModel::H100_80GB, Interconnect::Nvlink), Some(380.0));
        assert_eq!(table.expected("ams-1", GpuModel::H100_80GB, Interconnect::Nvlink), Some(450.0));
        let wrong = text.replace("\"nvlink\", gbps", "\"infiniband\", gbps");
        assert!(FleetSpec::parse(&wrong).is_err());
        let nameless = text.replace("name = \"vendor\"", "name = \" \"");
        assert!(FleetSpec::parse(&nameless).is_err());
    }

    #[test]
    fn pools_expand_into_named_nodes() {
        let fleet = FleetSpec::parse(EXAMPLE).expect("valid");
        let names: Vec<&str> = fleet.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["fra1-h100-01", "fra1-h100-02", "ams1-l40s-01"]);
        assert_eq!(fleet.gpu_count(), 20);
        assert_eq!(fleet.nodes[0].nvlink_domain.as_deref(), Some("fra1-h100-01"));
        assert!(fleet.nodes[0].mig_enabled);
        assert!(!fleet.nodes[2].mig_enabled, "L40S has no MIG");
    }

    #[test]
    fn nvlink_domains_and_infiniband_units_group_nodes() {
        let text = EXAMPLE.replace(
            "nodes = 2\n        gpus_per_node = 8\n        nvlink = true",
            "nodes = 4\n        gpus_per_node = 8\n        nvlink = true\n        nvlink_domain_nodes = 2\n        ib_rails = 8\n        ib_unit_nodes = 2",
        );
        let fleet = FleetSpec::parse(&text).expect("valid");
        let domains: Vec<_> = fleet.nodes[..4].iter().map(|n| n.nvlink_domain.as_deref().unwrap_or("")).collect();
        assert_eq!(domains, ["fra1-h100-nvl01", "fra1-h100-nvl01", "fra1-h100-nvl02", "fra1-h100-nvl02"]);
        let units: Vec<_> = fleet.nodes[..4].iter().map(|n| n.ib_unit.as_deref().unwrap_or("")).collect();
        assert_eq!(units, ["fra1-h100-su01", "fra1-h100-su01", "fra1-h100-su02", "fra1-h100-su02"]);
        assert_eq!((fleet.nodes[0].ib_rails, fleet.nodes[4].ib_rails, fleet.nodes[4].ib_unit.clone()), (8, 0, None));
        let uneven = FleetSpec::parse(&text.replace("nvlink_domain_nodes = 2", "nvlink_domain_nodes = 3"));
        assert!(
            uneven
                .expect_err("3 does not divide 4")
                .to_string()
                .contains("nvlink_domain_nodes must divide its 4 nodes")
        );
    }

    #[test]
    fn mistakes_are_explained() {
        let unknown = FleetSpec::parse(&EXAMPLE.replace("L40S", "V100")).expect_err("unknown model");
        assert!(unknown.to_string().contains("unknown GPU model \"V100\""), "{unknown}");
        let dup = FleetSpec::parse(&EXAMPLE.replace("ams1-l40s", "fra1-h100")).expect_err("duplicate");
        assert!(dup.to_string().contains("fra1-h100-01 is used twice"), "{dup}");
        let typo = FleetSpec::parse(&EXAMPLE.replace("gpus_per_node = 4", "gpu_per_node = 4")).expect_err("typo");
        let ways = FleetSpec::parse(&EXAMPLE.replace("gpus_per_node = 4", "gpus_per_node = 4\ntime_slices = 3"));
        assert_eq!(
            ways.expect_err("3 ways").to_string().rsplit(": ").next(),
            Some("time_slices must be 2, 4 or 8, not 3")
        );
        let shared =
            FleetSpec::parse(&EXAMPLE.replace("nvlink = true", "nvlink = true\ntime_slices = 4")).expect("valid");
        assert_eq!(shared.nodes[0].time_slices, 4);
        assert!(!shared.nodes[0].mig_enabled, "time-sliced GPUs are never partitioned");
        assert!(typo.to_string().contains("gpu_per_node"), "{typo}");
        assert!(FleetSpec::parse("").is_err());
    }
}
