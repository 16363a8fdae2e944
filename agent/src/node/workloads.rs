//! The agent's workloads: each environment's container, run with podman or docker on the
//! node's booked GPUs or MIG devices (`CUDA_VISIBLE_DEVICES` set to their UUIDs, the
//! devices handed in through CDI for podman and `--gpus` for docker, both needing the
//! NVIDIA Container Toolkit). Berth owns the containers named `berth-…`: those the plan no
//! longer lists are removed.
//!
//! Secrets (the notebook token, the endpoint's API key) reach the container through
//! `--env-file /dev/stdin`, never the command line, which every local user can read.
//!
//! A hard or hybrid tenant's container also joins its tenant's network: a container
//! network of the runtime's (`berth-vl100`, `berth-vx5000`) over the bridge the host
//! network code keeps (`bbr-…`), with the address the portal gave it. Its first network
//! stays the runtime's default, which publishes its port to Berth's proxy and gives it a
//! way out; the tenant's network carries no default route and, on the node, reaches
//! nothing but the tenant's other containers (the `inet berth` table). The runtime's
//! network is made when a container needs it and removed when none does.

use std::collections::BTreeMap;

use berth_domain::agent::Command;
use berth_domain::catalog::Offering;
use berth_domain::host_network::{TENANT_PREFIX_LEN, TenantAttachment, TenantSegment, is_berth_runtime_network};
use berth_domain::image::PullPolicy;
use berth_domain::node_plan::{
    CONTAINER_PREFIX, LOG_TAIL_LINES, NodeWorkload, WorkloadState, WorkloadStatus, container_port, tail_of,
};

use super::commands::{CommandError, CommandRunner};
use super::mig;
use crate::NodeError;

/// The container engine the agent drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    Podman,
    Docker,
}

impl Runtime {
    fn program(self) -> &'static str {
        match self {
            Runtime::Podman => "podman",
            Runtime::Docker => "docker",
        }
    }

    /// The runtime's own default network, which publishes ports.
    fn default_network(self) -> &'static str {
        match self {
            Runtime::Podman => "podman",
            Runtime::Docker => "bridge",
        }
    }

    /// `podman`, `docker`, or `auto` (podman when installed, else docker).
    pub fn choose(preference: &str, runner: &dyn CommandRunner) -> Result<Option<Runtime>, NodeError> {
        let installed = |r: Runtime| runner.run(&Command::new(r.program(), &["--version"])).is_ok();
        match preference.trim() {
            "podman" => Ok(Some(Runtime::Podman)),
            "docker" => Ok(Some(Runtime::Docker)),
            "auto" => Ok([Runtime::Podman, Runtime::Docker].into_iter().find(|r| installed(*r))),
            other => Err(NodeError::UnknownRuntime(other.to_owned())),
        }
    }
}

/// A container of Berth's on the node: name, state, exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Container {
    name: String,
    running: bool,
    /// Made but never started (a start that failed half-way): made again.
    created: bool,
    exit_code: Option<i64>,
}

/// Brings the node's containers (and their tenant networks) to `workloads`; each
/// workload's status (with its own error when it could not be pulled or started). An
/// error stops everything only when the runtime itself cannot be used, or a container or
/// network that should go cannot be removed, or a tenant network cannot be made.
/// `networks` are the tenant networks the node holds (the containers' segments among
/// them, as `NodePlan::validate` makes sure).
pub fn apply(
    runner: &dyn CommandRunner,
    runtime: Option<Runtime>,
    workloads: &[NodeWorkload],
    networks: &[TenantAttachment],
) -> Result<Vec<WorkloadStatus>, NodeError> {
    let Some(runtime) = runtime else {
        if workloads.is_empty() {
            return Ok(Vec::new());
        }
        return Err(NodeError::NoContainerRuntime);
    };
    let program = runtime.program();
    // A missing runtime reads "podman is not installed on this node" (`CommandError`).
    let run = |args: &[&str]| runner.run(&Command::new(program, args));
    let listing = run(&[
        "ps",
        "--all",
        "--filter",
        &format!("name={CONTAINER_PREFIX}"),
        "--format",
        "{{.Names}}\t{{.State}}\t{{.Status}}",
    ])?;
    let containers = parse_containers(&listing);
    for container in &containers {
        if container.created || !workloads.iter().any(|w| w.container_name() == container.name) {
            run(&["rm", "--force", &container.name])?;
        }
    }
    converge_networks(runtime, &run, workloads, networks)?;
    let mut statuses = Vec::new();
    for workload in workloads {
        let existing = containers.iter().find(|c| c.name == workload.container_name() && !c.created);
        let status = match existing {
            Some(c) if c.running => Ok(WorkloadState::Running),
            Some(c) if workload.run => {
                statuses.push(WorkloadStatus {
                    environment_id: workload.environment_id.clone(),
                    state: Some(WorkloadState::Exited),
                    exit_code: c.exit_code,
                    error: None,
                    log_tail: job_log(runner, program, workload),
                });
                continue;
            }
            _ => bring_up(runner, runtime, workload),
        };
        statuses.push(match status {
            Ok(state) => WorkloadStatus {
                environment_id: workload.environment_id.clone(),
                state: Some(state),
                exit_code: None,
                error: None,
                log_tail: if state == WorkloadState::Running { job_log(runner, program, workload) } else { Vec::new() },
            },
            Err(error) => WorkloadStatus {
                environment_id: workload.environment_id.clone(),
                state: None,
                exit_code: None,
                error: Some(error.to_string()),
                log_tail: Vec::new(),
            },
        });
    }
    Ok(statuses)
}

/// A training job's last log lines (`podman logs --tail`), for the portal to show and keep.
/// Best effort: a log that cannot be read is reported as none, not as the job's failure.
fn job_log(runner: &dyn CommandRunner, program: &'static str, w: &NodeWorkload) -> Vec<String> {
    if w.offering != Offering::TrainingJob {
        return Vec::new();
    }
    let tail = LOG_TAIL_LINES.to_string();
    let command = Command::new(program, &["logs", "--tail", &tail, &w.container_name()]);
    match runner.run(&command) {
        Ok(output) => tail_of(&output.lines().map(str::to_owned).collect::<Vec<_>>()),
        Err(e) => {
            tracing::warn!(container = %w.container_name(), error = %e, "cannot read the job's log");
            Vec::new()
        }
    }
}

/// Pulls the image when the node lacks it and, when the workload should run, starts it.
fn bring_up(runner: &dyn CommandRunner, runtime: Runtime, w: &NodeWorkload) -> Result<WorkloadState, NodeError> {
    let program = runtime.program();
    if runner.run(&Command::new(program, &["image", "inspect", "--format", "{{.Id}}", &w.image])).is_err() {
        runner
            .run(&Command::new(program, &["pull", &w.image]))
            .map_err(|source| NodeError::CommandFailed { doing: format!("pull {}", w.image), source })?;
    }
    if !w.run {
        return Ok(WorkloadState::Pulled);
    }
    let uuids = mig::device_uuids(runner, &w.devices)?;
    for command in start_commands(runtime, w, &uuids) {
        runner
            .run(&command)
            .map_err(|source| NodeError::CommandFailed { doing: format!("start {}", w.container_name()), source })?;
    }
    Ok(WorkloadState::Running)
}

/// Makes the tenant networks the workloads need and removes Berth's others (their
/// containers are gone by now).
fn converge_networks(
    runtime: Runtime,
    run: &dyn Fn(&[&str]) -> Result<String, CommandError>,
    workloads: &[NodeWorkload],
    networks: &[TenantAttachment],
) -> Result<(), NodeError> {
    let needed: BTreeMap<String, &TenantAttachment> = workloads
        .iter()
        .filter_map(|w| w.network.as_ref())
        .filter_map(|n| networks.iter().find(|a| a.segment == n.segment))
        .map(|a| (a.segment.runtime_network_name(), a))
        .collect();
    let listing = run(&["network", "ls", "--format", "{{.Name}}"])?;
    let present: Vec<&str> = listing.lines().map(str::trim).filter(|n| is_berth_runtime_network(n)).collect();
    for name in &present {
        if !needed.contains_key(*name) {
            run(&["network", "rm", name]).map_err(|source| NodeError::CommandFailed {
                doing: format!("remove the container network {name}"),
                source,
            })?;
        }
    }
    for (name, attachment) in &needed {
        if !present.contains(&name.as_str()) {
            let command = network_create_command(runtime, attachment);
            let args: Vec<&str> = command.args.iter().map(String::as_str).collect();
            run(&args).map_err(|source| NodeError::CommandFailed {
                doing: format!("make the container network {name}"),
                source,
            })?;
        }
    }
    Ok(())
}

/// `podman network create` / `docker network create` for the tenant network of
/// `attachment`, over its existing bridge, in the segment's subnet, with no default route
/// through it. Podman's `mode=unmanaged` (5.3 or later, netavark) leaves the bridge, its
/// address and the firewall to Berth; docker's `inhibit_ipv4` keeps its hands off the
/// bridge's address, which docker takes for the gateway.
pub fn network_create_command(runtime: Runtime, attachment: &TenantAttachment) -> Command {
    let segment: TenantSegment = attachment.segment;
    let name = segment.runtime_network_name();
    let bridge = segment.bridge_name();
    let subnet = format!("{}/{TENANT_PREFIX_LEN}", segment.subnet());
    let label = format!("berth.tenant={}", attachment.tenant);
    let args: Vec<String> = match runtime {
        Runtime::Podman => [
            "network",
            "create",
            "--driver",
            "bridge",
            "--interface-name",
            &bridge,
            "--subnet",
            &subnet,
            "--internal",
            "--disable-dns",
            "--opt",
            "mode=unmanaged",
            "--label",
            &label,
            &name,
        ]
        .map(str::to_owned)
        .to_vec(),
        Runtime::Docker => [
            "network",
            "create",
            "--driver",
            "bridge",
            "--subnet",
            &subnet,
            "--gateway",
            &attachment.address.to_string(),
            "--internal",
            "--opt",
            &format!("com.docker.network.bridge.name={bridge}"),
            "--opt",
            "com.docker.network.bridge.inhibit_ipv4=true",
            "--label",
            &label,
            &name,
        ]
        .map(str::to_owned)
        .to_vec(),
    };
    Command { program: runtime.program(), args, stdin: None }
}

/// The commands that start `w` on the devices `uuids`: one `podman run` (its tenant
/// network given with its address), or `docker run`, or for docker on a tenant network
/// `docker create`, `docker network connect --ip` and `docker start` (docker takes one
/// network at `run`).
pub fn start_commands(runtime: Runtime, w: &NodeWorkload, uuids: &[String]) -> Vec<Command> {
    let name = w.container_name();
    // A volume's directory on the shared filesystem is made on its first use.
    let mut commands: Vec<Command> =
        w.volumes.iter().filter(|v| v.bind().is_some()).map(|v| Command::new("mkdir", &["-p", &v.host_path])).collect();
    commands.extend(container_start_commands(runtime, w, uuids, &name));
    commands
}

fn container_start_commands(runtime: Runtime, w: &NodeWorkload, uuids: &[String], name: &str) -> Vec<Command> {
    let name = name.to_owned();
    match (&w.network, runtime) {
        (Some(network), Runtime::Docker) => {
            let address = network.address.to_string();
            let net = network.segment.runtime_network_name();
            vec![
                run_command(runtime, w, uuids, "create"),
                Command::new("docker", &["network", "connect", "--ip", &address, &net, &name]),
                Command::new("docker", &["start", &name]),
            ]
        }
        _ => vec![run_command(runtime, w, uuids, "run")],
    }
}

/// `podman run` / `docker run` (or `create`) for `w` on the devices `uuids`.
fn run_command(runtime: Runtime, w: &NodeWorkload, uuids: &[String], verb: &str) -> Command {
    let name = w.container_name();
    let mut args: Vec<String> = vec![verb.to_owned()];
    if verb == "run" {
        args.push("--detach".into());
    }
    args.extend(["--name", &name, "--label"].map(str::to_owned));
    args.push(format!("berth.environment={}", w.environment_id));
    args.extend(["--env-file".into(), "/dev/stdin".into()]);
    // As Kubernetes' restricted pods: no capabilities, no way to gain privileges.
    args.extend(["--cap-drop".into(), "ALL".into(), "--security-opt".into(), "no-new-privileges".into()]);
    if !uuids.is_empty() {
        match runtime {
            Runtime::Podman => {
                args.extend(uuids.iter().flat_map(|u| ["--device".to_owned(), format!("nvidia.com/gpu={u}")]))
            }
            // Docker splits --gpus on commas unless the list is quoted inside the value.
            Runtime::Docker => args.extend(["--gpus".to_owned(), format!("\"device={}\"", uuids.join(","))]),
        }
    }
    if w.vcpus > 0 {
        args.extend(["--cpus".into(), w.vcpus.to_string()]);
    }
    if w.memory_gb > 0 {
        args.extend(["--memory".into(), format!("{}g", w.memory_gb)]);
    }
    if let (Some(host), Some(port)) = (w.host_port, container_port(w.offering)) {
        args.extend(["--publish".into(), format!("{host}:{port}")]);
    }
    // Berth's volumes, bind-mounted from the shared filesystem (see `NodeVolume::bind`).
    args.extend(w.volumes.iter().filter_map(|v| v.bind()).flat_map(|bind| ["--volume".to_owned(), bind]));
    if let Some(network) = &w.network {
        // The default network first: it publishes the port and gives the way out.
        args.extend(["--network".into(), runtime.default_network().to_owned()]);
        if runtime == Runtime::Podman {
            let tenant = network.segment.runtime_network_name();
            args.extend(["--network".into(), format!("{tenant}:ip={}", network.address)]);
        }
    }
    // A tag may have moved since the pull step: look again, as Kubernetes' `Always` does.
    args.extend(["--pull".into(), PullPolicy::of(&w.image).container_cli().into()]);
    args.push(w.image.clone());
    if let Some(command) = &w.command {
        args.extend(["/bin/sh".into(), "-c".into(), command.clone()]);
    }
    // An endpoint's model server arguments, after the image (its entrypoint runs them).
    args.extend(w.args.iter().cloned());
    let mut env = String::new();
    // The plan's variables first, each one line (a value with a line break, which Berth's
    // launch refuses, is left out): Berth's own come after and win.
    for var in w.env.iter().filter(|v| v.fits_env_file()) {
        env.push_str(&format!("{}={}\n", var.name, var.value));
    }
    env.push_str(&format!("CUDA_VISIBLE_DEVICES={}\n", uuids.join(",")));
    if let Some(secret) = &w.secret {
        let variable = if w.offering == Offering::Notebook { "JUPYTER_TOKEN" } else { "BERTH_API_KEY" };
        env.push_str(&format!("{variable}={secret}\n"));
    }
    Command { program: runtime.program(), args, stdin: Some(env) }
}

/// Berth's containers from `ps --format '{{.Names}}\t{{.State}}\t{{.Status}}'`
/// (`berth-…`, tab, `exited`, tab, `Exited (1) 3 minutes ago`).
fn parse_containers(listing: &str) -> Vec<Container> {
    listing
        .lines()
        .filter_map(|line| {
            let mut cells = line.split('\t');
            let name = cells.next()?.trim();
            let state = cells.next().unwrap_or_default().trim().to_ascii_lowercase();
            let status = cells.next().unwrap_or_default();
            let exit_code = status
                .split_once("Exited (")
                .and_then(|(_, rest)| rest.split_once(')'))
                .and_then(|(code, _)| code.parse().ok());
            name.starts_with(CONTAINER_PREFIX).then(|| Container {
                name: name.to_owned(),
                running: state == "running",
                created: state == "created",
                exit_code,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use berth_domain::host_network::tenant_address;
    use berth_domain::mig::{MigInstance, MigProfile};
    use berth_domain::node_plan::{ContainerNetwork, Device, NodeVolume};

    use super::*;
    use crate::node::commands::Failure;
    use crate::node::commands::recording::Recording;

    fn notebook(run: bool) -> NodeWorkload {
        NodeWorkload {
            environment_id: "e1".into(),
            offering: Offering::Notebook,
            image: "quay.io/jupyter/pytorch-notebook:cuda12-latest".into(),
            command: None,
            devices: vec![Device::Gpu(1)],
            run,
            host_port: Some(30_000),
            secret: Some("s3cret".into()),
            vcpus: 4,
            memory_gb: 32,
            network: None,
            volumes: vec![],
            args: vec![],
            env: vec![],
        }
    }

    /// acme's VLAN 100 on node 3 (the node's address .3, the container's at the top).
    fn acme() -> TenantAttachment {
        let segment = TenantSegment::Vlan(100);
        TenantAttachment {
            tenant: "acme".into(),
            segment,
            address: tenant_address(segment, 3).expect("address"),
            peers: vec![],
        }
    }

    fn on_acme(w: NodeWorkload) -> NodeWorkload {
        let network = ContainerNetwork {
            tenant: "acme".into(),
            segment: TenantSegment::Vlan(100),
            address: Ipv4Addr::new(100, 65, 147, 254),
        };
        NodeWorkload { network: Some(network), ..w }
    }

    fn node() -> Recording {
        let node = Recording::default();
        node.answer("nvidia-smi -L", "GPU 0: NVIDIA H100 (UUID: GPU-0)\nGPU 1: NVIDIA H100 (UUID: GPU-1)\n");
        node
    }

    fn one(commands: Vec<Command>) -> Command {
        let [command] = <[Command; 1]>::try_from(commands).expect("one command");
        command
    }

    #[test]
    fn a_notebook_is_pulled_then_started_with_its_gpu_and_token_off_the_command_line() {
        let node = node();
        node.fail("podman image inspect", Failure::Failed { message: "no such image".into() });
        let pulled = apply(&node, Some(Runtime::Podman), &[notebook(false)], &[]).expect("applied");
        assert_eq!(pulled[0].state, Some(WorkloadState::Pulled));
        assert!(node.take().contains(&"podman pull quay.io/jupyter/pytorch-notebook:cuda12-latest".to_owned()));

        let command = one(start_commands(Runtime::Podman, &notebook(true), &["GPU-1".into()]));
        assert_eq!(
            command.to_string(),
            "podman run --detach --name berth-e1 --label berth.environment=e1 --env-file /dev/stdin \
             --cap-drop ALL --security-opt no-new-privileges --device nvidia.com/gpu=GPU-1 --cpus 4 --memory 32g --publish 30000:8888 --pull always quay.io/jupyter/pytorch-notebook:cuda12-latest"
        );
        assert_eq!(command.stdin.as_deref(), Some("CUDA_VISIBLE_DEVICES=GPU-1\nJUPYTER_TOKEN=s3cret\n"));
        node.answer("podman image inspect", "sha256:1");
        let started = apply(&node, Some(Runtime::Podman), &[notebook(true)], &[]).expect("applied");
        assert_eq!(started[0].state, Some(WorkloadState::Running));
        assert!(node.take().iter().any(|c| c.starts_with("podman run --detach --name berth-e1")));
    }

    #[test]
    fn an_endpoints_arguments_follow_the_image_and_its_variables_go_through_standard_input() {
        use berth_domain::serving::EnvVar;
        let var = |name: &str, value: &str| EnvVar { name: name.into(), value: value.into() };
        let w = NodeWorkload {
            offering: Offering::InferenceEndpoint,
            image: "vllm/vllm-openai:v0.6.3".into(),
            args: vec!["--model".into(), "org/m".into(), "--chat-template".into(), "a b".into()],
            env: vec![
                var("HF_TOKEN", "hf_secret"),
                var("BERTH_MODEL", "org/m"),
                // Never in a plan of Berth's; the agent leaves them out all the same.
                var("INJECTED", "x\nCUDA_VISIBLE_DEVICES=all"),
                var("CUDA_VISIBLE_DEVICES", "all"),
            ],
            ..notebook(true)
        };
        let command = one(start_commands(Runtime::Podman, &w, &["GPU-1".into()]));
        assert_eq!(
            &command.args[command.args.len() - 5..],
            ["vllm/vllm-openai:v0.6.3", "--model", "org/m", "--chat-template", "a b"],
            "one argument each, as typed: no shell between"
        );
        assert!(!command.to_string().contains("hf_secret"), "values never on the command line");
        assert_eq!(
            command.stdin.as_deref(),
            Some("HF_TOKEN=hf_secret\nBERTH_MODEL=org/m\nCUDA_VISIBLE_DEVICES=GPU-1\nBERTH_API_KEY=s3cret\n")
        );
    }

    #[test]
    fn volumes_are_made_on_the_shared_filesystem_and_bind_mounted() {
        let volume = |host: &str, mount: &str| NodeVolume { host_path: host.into(), mount_path: mount.into() };
        let w = NodeWorkload {
            volumes: vec![
                volume("/mnt/berth/berth-vol-7", "/home/jovyan/work"),
                volume("/mnt/berth/berth-vol-8", "/data/datasets"),
                volume("/mnt/../etc", "/data/etc"),
            ],
            ..notebook(true)
        };
        let commands: Vec<String> =
            start_commands(Runtime::Podman, &w, &["GPU-1".into()]).iter().map(ToString::to_string).collect();
        assert_eq!(commands[..2], ["mkdir -p /mnt/berth/berth-vol-7", "mkdir -p /mnt/berth/berth-vol-8"]);
        assert_eq!(
            commands[2],
            "podman run --detach --name berth-e1 --label berth.environment=e1 --env-file /dev/stdin \
             --cap-drop ALL --security-opt no-new-privileges --device nvidia.com/gpu=GPU-1 --cpus 4 --memory 32g --publish 30000:8888 \
             --volume /mnt/berth/berth-vol-7:/home/jovyan/work --volume /mnt/berth/berth-vol-8:/data/datasets \
             --pull always quay.io/jupyter/pytorch-notebook:cuda12-latest"
        );
        assert_eq!(commands.len(), 3, "a path that climbs is neither made nor mounted");
    }

    #[test]
    fn running_containers_are_left_alone_and_unplanned_ones_removed() {
        let node = node();
        node.answer(
            "podman ps",
            "berth-e1\trunning\tUp 3 minutes\nberth-old\texited\tExited (0) 1 hour ago\nberth-half\tcreated\tCreated\n",
        );
        let statuses = apply(&node, Some(Runtime::Podman), &[notebook(true)], &[]).expect("applied");
        assert_eq!(statuses[0].state, Some(WorkloadState::Running));
        let ran = node.take();
        assert_eq!(
            ran[1..],
            ["podman rm --force berth-old", "podman rm --force berth-half", "podman network ls --format {{.Name}}"]
        );
    }

    #[test]
    fn a_finished_job_is_not_started_again_and_its_exit_code_is_reported() {
        let node = node();
        node.answer("docker ps", "berth-e1\texited\tExited (3) 2 seconds ago\n");
        let statuses = apply(&node, Some(Runtime::Docker), &[notebook(true)], &[]).expect("applied");
        assert_eq!((statuses[0].state, statuses[0].exit_code), (Some(WorkloadState::Exited), Some(3)));
        assert_eq!(node.take().len(), 2, "read the containers and the networks, nothing else");
    }

    #[test]
    fn a_container_that_never_started_is_made_again() {
        let node = node();
        node.answer("podman ps", "berth-e1\tcreated\tCreated\n").answer("podman image inspect", "sha256:1");
        let statuses = apply(&node, Some(Runtime::Podman), &[notebook(true)], &[]).expect("applied");
        assert_eq!(statuses[0].state, Some(WorkloadState::Running));
        let ran = node.take();
        assert_eq!(ran[1], "podman rm --force berth-e1");
        assert!(ran.last().is_some_and(|c| c.starts_with("podman run --detach --name berth-e1")), "{ran:?}");
    }

    #[test]
    fn docker_gets_its_gpus_quoted_and_mig_devices_by_uuid() {
        let job = NodeWorkload {
            offering: Offering::TrainingJob,
            command: Some("python train.py".into()),
            devices: vec![Device::Mig { gpu: 0, instance: MigInstance { profile: MigProfile::G3, start: 0 } }],
            host_port: None,
            secret: None,
            ..notebook(true)
        };
        let command = one(start_commands(Runtime::Docker, &job, &["MIG-a".into(), "MIG-b".into()]));
        assert!(command.args.windows(2).any(|w| w == ["--gpus", "\"device=MIG-a,MIG-b\""]), "{command}");
        assert!(command.to_string().ends_with("/bin/sh -c python train.py"), "{command}");
        assert_eq!(command.stdin.as_deref(), Some("CUDA_VISIBLE_DEVICES=MIG-a,MIG-b\n"));
    }

    #[test]
    fn one_workloads_trouble_is_its_own_and_no_runtime_is_named() {
        let node = node();
        node.fail("podman image inspect", Failure::Failed { message: "no such image".into() });
        node.fail("podman pull", Failure::Failed { message: "manifest unknown".into() });
        let statuses = apply(&node, Some(Runtime::Podman), &[notebook(true)], &[]).expect("applied");
        assert_eq!(
            statuses[0].error.as_deref(),
            Some(
                "cannot pull quay.io/jupyter/pytorch-notebook:cuda12-latest: `podman pull quay.io/jupyter/pytorch-notebook:cuda12-latest` failed: manifest unknown"
            )
        );
        let error = apply(&node, None, &[notebook(true)], &[]).expect_err("no runtime");
        assert_eq!(
            error.to_string(),
            "no container runtime on this node: install podman or docker with the NVIDIA Container Toolkit"
        );
        assert_eq!(apply(&node, None, &[], &[]), Ok(Vec::new()));
    }

    #[test]
    fn a_hard_tenants_container_joins_its_tenant_network_made_over_its_bridge_with_podman() {
        let node = node();
        node.answer("podman image inspect", "sha256:1");
        node.answer("podman network ls", "podman\n");
        apply(&node, Some(Runtime::Podman), &[on_acme(notebook(true))], &[acme()]).expect("applied");
        let ran = node.take();
        assert_eq!(
            ran,
            [
                "podman ps --all --filter name=berth- --format {{.Names}}\t{{.State}}\t{{.Status}}",
                "podman network ls --format {{.Name}}",
                "podman network create --driver bridge --interface-name bbr-vl100 --subnet 100.65.144.0/22 \
                 --internal --disable-dns --opt mode=unmanaged --label berth.tenant=acme berth-vl100",
                "podman image inspect --format {{.Id}} quay.io/jupyter/pytorch-notebook:cuda12-latest",
                "nvidia-smi -L",
                "podman run --detach --name berth-e1 --label berth.environment=e1 --env-file /dev/stdin \
                 --cap-drop ALL --security-opt no-new-privileges --device nvidia.com/gpu=GPU-1 --cpus 4 --memory 32g \
                 --publish 30000:8888 --network podman --network berth-vl100:ip=100.65.147.254 \
                 --pull always quay.io/jupyter/pytorch-notebook:cuda12-latest",
            ]
        );

        // Applied again on the node as it now is: only read.
        node.answer("podman ps", "berth-e1\trunning\tUp 1 second\n");
        node.answer("podman network ls", "podman\nberth-vl100\n");
        apply(&node, Some(Runtime::Podman), &[on_acme(notebook(true))], &[acme()]).expect("applied");
        assert_eq!(
            node.take(),
            [
                "podman ps --all --filter name=berth- --format {{.Names}}\t{{.State}}\t{{.Status}}",
                "podman network ls --format {{.Name}}",
            ]
        );

        // The tenant leaves the node: its container goes, then its network (nobody else's).
        node.answer("podman network ls", "podman\nberth-vl100\nberth-vx7\nsomeone-elses\n");
        apply(&node, Some(Runtime::Podman), &[], &[]).expect("applied");
        assert_eq!(
            node.take()[1..],
            [
                "podman rm --force berth-e1",
                "podman network ls --format {{.Name}}",
                "podman network rm berth-vl100",
                "podman network rm berth-vx7",
            ]
        );
    }

    #[test]
    fn with_docker_the_container_is_made_then_connected_at_its_address_then_started() {
        let node = node();
        node.answer("docker image inspect", "sha256:1");
        node.answer("docker network ls", "bridge\nhost\nnone\n");
        apply(&node, Some(Runtime::Docker), &[on_acme(notebook(true))], &[acme()]).expect("applied");
        let ran = node.take();
        assert_eq!(
            ran[2],
            "docker network create --driver bridge --subnet 100.65.144.0/22 --gateway 100.65.144.3 --internal \
             --opt com.docker.network.bridge.name=bbr-vl100 --opt com.docker.network.bridge.inhibit_ipv4=true \
             --label berth.tenant=acme berth-vl100"
        );
        let start = &ran[ran.len() - 3..];
        assert!(start[0].starts_with("docker create --name berth-e1 "), "{start:?}");
        assert!(start[0].contains(" --publish 30000:8888 --network bridge --pull always quay.io/"), "{}", start[0]);
        assert_eq!(
            start[1..],
            ["docker network connect --ip 100.65.147.254 berth-vl100 berth-e1", "docker start berth-e1"]
        );
        // The secret still goes through standard input only.
        let commands = start_commands(Runtime::Docker, &on_acme(notebook(true)), &["GPU-1".into()]);
        assert_eq!(commands[0].stdin.as_deref(), Some("CUDA_VISIBLE_DEVICES=GPU-1\nJUPYTER_TOKEN=s3cret\n"));
    }

    #[test]
    fn a_tenant_network_that_cannot_be_made_is_the_nodes_error() {
        let node = node();
        node.fail("podman network create", Failure::Failed { message: "unknown bridge mode \"unmanaged\"".into() });
        let error = apply(&node, Some(Runtime::Podman), &[on_acme(notebook(true))], &[acme()])
            .expect_err("refused")
            .to_string();
        assert!(error.starts_with("cannot make the container network berth-vl100: `podman network create"), "{error}");
        assert!(error.ends_with("failed: unknown bridge mode \"unmanaged\""), "{error}");
    }
}
