//! The agent's MIG side: brings each GPU's instances to the plan's layout with
//! `nvidia-smi` (nvml-wrapper's safe API cannot create or destroy instances), and finds the
//! device UUIDs workloads are given.
//!
//! Only instances the plan does not list are destroyed, then the missing ones are created
//! largest first at their exact placement, so a neighbour's running instance never moves.
//! GPUs the plan lists without instances, or does not list, run without MIG.

use std::collections::BTreeMap;

use berth_domain::agent::Command;
use berth_domain::mig::{MigInstance, MigProfile};
use berth_domain::node_plan::{Device, GpuMig};

use super::commands::{CommandRunner, Failure};
use crate::NodeError;

/// One GPU instance on the node as `nvidia-smi mig -lgi` lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuInstance {
    pub gpu: u32,
    pub id: u32,
    pub instance: MigInstance,
}

fn run(runner: &dyn CommandRunner, program: &'static str, args: &[&str]) -> Result<String, NodeError> {
    runner.run(&Command::new(program, args)).map_err(|e| match e.failure {
        Failure::NotInstalled { .. } => NodeError::NoNvidiaSmi,
        Failure::Failed { .. } => NodeError::Command(e),
    })
}

/// Brings the node's GPUs to `layouts` (every GPU not listed: MIG off). Nothing is asked
/// of `nvidia-smi` when no GPU should have MIG and none has it: a node without the driver
/// can still run plans without MIG.
pub fn apply(runner: &dyn CommandRunner, layouts: &[GpuMig]) -> Result<Vec<String>, NodeError> {
    let modes = match mig_modes(runner) {
        Ok(modes) => modes,
        Err(NodeError::NoNvidiaSmi) if layouts.is_empty() => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut done = Vec::new();
    for layout in layouts {
        match modes.get(&layout.gpu) {
            None => {
                return Err(NodeError::GpuNotListed { gpu: layout.gpu, listed: modes.keys().copied().collect() });
            }
            Some(None) => return Err(NodeError::NoMigSupport(layout.gpu)),
            Some(Some(true)) => {}
            Some(Some(false)) => {
                let gpu = layout.gpu.to_string();
                run(runner, "nvidia-smi", &["-i", &gpu, "-mig", "1"])?;
                if mig_modes(runner)?.get(&layout.gpu) != Some(&Some(true)) {
                    return Err(NodeError::MigPending(layout.gpu));
                }
                done.push(format!("MIG enabled on GPU {gpu}"));
            }
        }
    }
    let current = instances(runner, &modes)?;
    for (&gpu, enabled) in &modes {
        let wanted: &[MigInstance] = layouts.iter().find(|l| l.gpu == gpu).map_or(&[], |l| &l.instances);
        let gpu_text = gpu.to_string();
        let mut have: Vec<&GpuInstance> = current.iter().filter(|i| i.gpu == gpu).collect();
        for gi in have.iter().filter(|gi| !wanted.contains(&gi.instance)) {
            let id = gi.id.to_string();
            // Compute instances first: a GPU instance with one cannot be destroyed.
            run(runner, "nvidia-smi", &["mig", "-i", &gpu_text, "-gi", &id, "-dci"])?;
            run(runner, "nvidia-smi", &["mig", "-i", &gpu_text, "-gi", &id, "-dgi"])?;
            done.push(format!("destroyed {} on GPU {gpu}", gi.instance));
        }
        have.retain(|gi| wanted.contains(&gi.instance));
        let mut missing: Vec<MigInstance> =
            wanted.iter().filter(|w| !have.iter().any(|gi| gi.instance == **w)).copied().collect();
        // Largest first, each at its placement: a small one made first can block a big one.
        missing.sort_by_key(|i| (std::cmp::Reverse(i.profile.memory_slices()), i.start));
        for instance in missing {
            let placement = format!("{}:{}", instance.profile.profile_id(), instance.start);
            run(runner, "nvidia-smi", &["mig", "-i", &gpu_text, "-cgi", &placement, "-C"])?;
            done.push(format!("created {instance} on GPU {gpu}"));
        }
        if *enabled == Some(true) && wanted.is_empty() && !layouts.iter().any(|l| l.gpu == gpu) {
            run(runner, "nvidia-smi", &["-i", &gpu_text, "-mig", "0"])?;
            done.push(format!("MIG disabled on GPU {gpu}"));
        }
    }
    Ok(done)
}

/// Each GPU's MIG mode: `Some(enabled)`, or `None` for a GPU without MIG.
fn mig_modes(runner: &dyn CommandRunner) -> Result<BTreeMap<u32, Option<bool>>, NodeError> {
    let text = run(runner, "nvidia-smi", &["--query-gpu=index,mig.mode.current", "--format=csv,noheader"])?;
    let mut modes = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let (index, mode) = line.split_once(',').ok_or_else(|| NodeError::NvidiaSmiSaid(line.to_owned()))?;
        let index: u32 = index.trim().parse().map_err(|_| NodeError::NvidiaSmiSaid(line.to_owned()))?;
        let mode = match mode.trim() {
            "Enabled" => Some(true),
            "Disabled" => Some(false),
            _ => None,
        };
        modes.insert(index, mode);
    }
    Ok(modes)
}

/// The GPU instances of every MIG-enabled GPU, from `nvidia-smi mig -lgi`'s table:
/// `|   0  MIG 3g.40gb        9        1          4:4     |`.
fn instances(runner: &dyn CommandRunner, modes: &BTreeMap<u32, Option<bool>>) -> Result<Vec<GpuInstance>, NodeError> {
    if !modes.values().any(|m| *m == Some(true)) {
        return Ok(Vec::new());
    }
    listed_instances(runner)
}

/// Every GPU instance `nvidia-smi mig -lgi` lists now, for a node with GPUs in MIG mode
/// (the caller knows they are: asking `nvidia-smi` for the modes again would be waste).
pub fn listed_instances(runner: &dyn CommandRunner) -> Result<Vec<GpuInstance>, NodeError> {
    match run(runner, "nvidia-smi", &["mig", "-lgi"]) {
        Ok(text) => Ok(parse_instances(&text)),
        Err(e) if e.to_string().contains("No GPU instances found") => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

pub fn parse_instances(text: &str) -> Vec<GpuInstance> {
    text.lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.trim().trim_matches('|').split_whitespace().collect();
            let [gpu, "MIG", _name, profile, id, placement] = cells[..] else { return None };
            let profile_id: u32 = profile.parse().ok()?;
            let profile = MigProfile::ALL.into_iter().find(|p| p.profile_id() == profile_id)?;
            let (start, _) = placement.split_once(':')?;
            Some(GpuInstance {
                gpu: gpu.parse().ok()?,
                id: id.parse().ok()?,
                instance: MigInstance { profile, start: start.parse().ok()? },
            })
        })
        .collect()
}

/// The UUIDs `devices` have on this node (`GPU-…` for a GPU, `MIG-…` for a MIG device),
/// as `CUDA_VISIBLE_DEVICES` and the container runtimes take them.
///
/// A MIG device's UUID is listed by `nvidia-smi -L` under its "MIG Dev" number; the
/// `nvidia-smi` overview maps that number to its GPU instance, and `-lgi` the instance to
/// its placement.
pub fn device_uuids(runner: &dyn CommandRunner, devices: &[Device]) -> Result<Vec<String>, NodeError> {
    if devices.is_empty() {
        return Ok(Vec::new());
    }
    let listing = run(runner, "nvidia-smi", &["-L"])?;
    let (gpus, migs) = parse_listing(&listing);
    let needs_mig = devices.iter().any(|d| matches!(d, Device::Mig { .. }));
    let (placements, mig_devices) = if needs_mig {
        (
            parse_instances(&run(runner, "nvidia-smi", &["mig", "-lgi"])?),
            parse_mig_devices(&run(runner, "nvidia-smi", &[])?),
        )
    } else {
        (Vec::new(), Vec::new())
    };
    devices
        .iter()
        .map(|device| match device {
            Device::Gpu(gpu) => gpus.get(gpu).cloned().ok_or(NodeError::UnknownGpu(*gpu)),
            Device::Mig { gpu, instance } => {
                let gi = placements
                    .iter()
                    .find(|p| p.gpu == *gpu && p.instance == *instance)
                    .ok_or(NodeError::NoMigInstance { gpu: *gpu, instance: *instance })?;
                let dev = mig_devices
                    .iter()
                    .find(|(g, id, _)| *g == *gpu && *id == gi.id)
                    .map(|(_, _, dev)| *dev)
                    .ok_or(NodeError::NoComputeInstance { gpu: *gpu, instance: *instance })?;
                migs.get(&(*gpu, dev)).cloned().ok_or(NodeError::NoMigDevice { gpu: *gpu, dev })
            }
        })
        .collect()
}

type Listing = (BTreeMap<u32, String>, BTreeMap<(u32, u32), String>);

/// GPU UUIDs by index and MIG device UUIDs by (GPU, MIG Dev) from `nvidia-smi -L`:
/// `GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-…)` then `  MIG 3g.40gb Device  0: (UUID: MIG-…)`.
fn parse_listing(text: &str) -> Listing {
    let uuid =
        |line: &str| line.split_once("(UUID: ").and_then(|(_, rest)| rest.split_once(')')).map(|(u, _)| u.to_owned());
    let (mut gpus, mut migs) = (BTreeMap::new(), BTreeMap::new());
    let mut current = None;
    for line in text.lines() {
        let trimmed = line.trim();
        if let Some(rest) = trimmed.strip_prefix("GPU ") {
            current = rest.split_once(':').and_then(|(i, _)| i.trim().parse::<u32>().ok());
            if let (Some(gpu), Some(uuid)) = (current, uuid(trimmed)) {
                gpus.insert(gpu, uuid);
            }
        } else if trimmed.starts_with("MIG ")
            && let (Some(gpu), Some(uuid)) = (current, uuid(trimmed))
            && let Some(dev) = trimmed
                .split_once("Device")
                .and_then(|(_, rest)| rest.split_once(':'))
                .and_then(|(n, _)| n.trim().parse::<u32>().ok())
        {
            migs.insert((gpu, dev), uuid);
        }
    }
    (gpus, migs)
}

/// (GPU, GPU instance id, MIG Dev) from the "MIG devices" table of `nvidia-smi`:
/// `|  0    1   0   0  |   11MiB / 20224MiB | …`.
fn parse_mig_devices(text: &str) -> Vec<(u32, u32, u32)> {
    let Some((_, table)) = text.split_once("MIG devices:") else { return Vec::new() };
    table
        .lines()
        .filter_map(|line| {
            let first = line.trim().strip_prefix('|')?.split('|').next()?;
            let numbers: Vec<u32> = first.split_whitespace().map(|n| n.parse().ok()).collect::<Option<_>>()?;
            let [gpu, gi, _ci, dev] = numbers[..] else { return None };
            Some((gpu, gi, dev))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::commands::recording::Recording;

    const LGI: &str = "\
+-------------------------------------------------------+
| GPU instances:                                        |
| GPU   Name             Profile  Instance   Placement  |
|                          ID       ID       Start:Size |
|=======================================================|
|   0  MIG 3g.40gb          9        2          0:4     |
+-------------------------------------------------------+
|   0  MIG 1g.10gb         19        9          6:1     |
+-------------------------------------------------------+
|   1  MIG 7g.80gb          0        0          0:8     |
+-------------------------------------------------------+
";

    fn g(profile: MigProfile, start: u8) -> MigInstance {
        MigInstance { profile, start }
    }

    fn node(modes: &str) -> Recording {
        let node = Recording::default();
        node.answer("nvidia-smi --query-gpu", modes).answer("nvidia-smi mig -lgi", LGI);
        node
    }

    #[test]
    fn instances_not_planned_go_and_missing_ones_are_made_largest_first_in_place() {
        let node = node("0, Enabled\n1, Enabled\n2, Disabled\n");
        // GPU 0 keeps its 3g@0; its 1g.10gb at 6 becomes a 1g.20gb there, and a 2g joins at 4.
        let layouts = vec![
            GpuMig {
                gpu: 0,
                instances: vec![g(MigProfile::G3, 0), g(MigProfile::G1DoubleMemory, 6), g(MigProfile::G2, 4)],
            },
            GpuMig { gpu: 1, instances: vec![g(MigProfile::G7, 0)] },
        ];
        let done = apply(&node, &layouts).expect("applied");
        let ran: Vec<String> =
            node.take().into_iter().filter(|c| !c.contains("--query-gpu") && !c.ends_with("-lgi")).collect();
        assert_eq!(
            ran,
            [
                "nvidia-smi mig -i 0 -gi 9 -dci",
                "nvidia-smi mig -i 0 -gi 9 -dgi",
                "nvidia-smi mig -i 0 -cgi 14:4 -C",
                "nvidia-smi mig -i 0 -cgi 15:6 -C",
            ]
        );
        assert_eq!(done.len(), 3);
    }

    #[test]
    fn an_applied_layout_runs_no_command_that_changes_anything() {
        let node = node("0, Enabled\n1, Enabled\n");
        let layouts = vec![
            GpuMig { gpu: 0, instances: vec![g(MigProfile::G1, 6), g(MigProfile::G3, 0)] },
            GpuMig { gpu: 1, instances: vec![g(MigProfile::G7, 0)] },
        ];
        assert_eq!(apply(&node, &layouts), Ok(Vec::new()));
        assert!(node.take().iter().all(|c| c.contains("--query-gpu") || c.ends_with("-lgi")));
    }

    #[test]
    fn gpus_left_out_of_the_plan_lose_their_instances_and_mig() {
        let node = node("0, Enabled\n1, Enabled\n2, [N/A]\n");
        let layouts = vec![GpuMig { gpu: 0, instances: vec![g(MigProfile::G1, 6), g(MigProfile::G3, 0)] }];
        apply(&node, &layouts).expect("applied");
        let ran: Vec<String> =
            node.take().into_iter().filter(|c| !c.contains("--query-gpu") && !c.ends_with("-lgi")).collect();
        assert_eq!(ran, ["nvidia-smi mig -i 1 -gi 0 -dci", "nvidia-smi mig -i 1 -gi 0 -dgi", "nvidia-smi -i 1 -mig 0"]);
    }

    #[test]
    fn mig_is_enabled_first_and_a_pending_mode_is_explained() {
        let node = Recording::default();
        node.answer("nvidia-smi --query-gpu", "0, Disabled\n");
        let layouts = vec![GpuMig { gpu: 0, instances: vec![g(MigProfile::G7, 0)] }];
        let error = apply(&node, &layouts).expect_err("pending");
        assert_eq!(error, NodeError::MigPending(0));
        assert_eq!(
            error.to_string(),
            "MIG mode on GPU 0 is pending: the GPU is in use or needs a reset (nvidia-smi -i 0 -r)"
        );
        assert!(node.take().contains(&"nvidia-smi -i 0 -mig 1".to_owned()));
    }

    #[test]
    fn without_the_driver_mig_plans_fail_clearly_and_others_pass() {
        let node = Recording::default();
        node.fail("nvidia-smi", Failure::NotInstalled { program: "nvidia-smi".into() });
        assert_eq!(apply(&node, &[]), Ok(Vec::new()));
        let layouts = vec![GpuMig { gpu: 0, instances: vec![g(MigProfile::G7, 0)] }];
        assert_eq!(apply(&node, &layouts), Err(NodeError::NoNvidiaSmi));
        assert_eq!(device_uuids(&node, &[Device::Gpu(0)]), Err(NodeError::NoNvidiaSmi));
        assert_eq!(
            NodeError::NoNvidiaSmi.to_string(),
            "nvidia-smi is not installed on this node: MIG layouts and GPU workloads need the NVIDIA driver"
        );
    }

    #[test]
    fn devices_map_to_their_uuids_through_the_mig_device_table() {
        let node = Recording::default();
        node.answer(
            "nvidia-smi -L",
            "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-aaaa)\n  MIG 3g.40gb     Device  0: (UUID: MIG-3g-at-0)\n  \
             MIG 1g.10gb     Device  1: (UUID: MIG-1g-at-6)\nGPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-bbbb)\n  \
             MIG 7g.80gb     Device  0: (UUID: MIG-7g)\n",
        )
        .answer("nvidia-smi mig -lgi", LGI)
        .answer(
            "nvidia-smi",
            "+---------------------------------------------------------+\n| MIG devices:                    |\n\
             | GPU  GI  CI  MIG |  Memory-Usage |\n|      ID  ID  Dev |               |\n|==================+======|\n\
             |  0    2   0   0  |  11MiB / 40192MiB |\n|                  |  0MiB / 65535MiB  |\n\
             |  0    9   0   1  |  5MiB / 9856MiB   |\n|  1    0   0   0  |  13MiB / 80000MiB |\n",
        );
        let devices = [
            Device::Mig { gpu: 0, instance: g(MigProfile::G1, 6) },
            Device::Gpu(1),
            Device::Mig { gpu: 1, instance: g(MigProfile::G7, 0) },
        ];
        assert_eq!(
            device_uuids(&node, &devices),
            Ok(vec!["MIG-1g-at-6".to_owned(), "GPU-bbbb".to_owned(), "MIG-7g".to_owned()])
        );
        let missing = [Device::Mig { gpu: 0, instance: g(MigProfile::G2, 4) }];
        let error = device_uuids(&node, &missing).expect_err("no such instance");
        assert_eq!(error.to_string(), "GPU 0 has no MIG instance 2g@4");
    }
}
