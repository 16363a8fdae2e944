//! The agent's workloads: each environment's container, run with podman or docker on the
//! node's booked GPUs or MIG devices (`CUDA_VISIBLE_DEVICES` set to their UUIDs, the
//! devices handed in through CDI for podman and `--gpus` for docker, both needing the
//! NVIDIA Container Toolkit). Berth owns the containers named `berth-…`: those the plan no
//! longer lists are removed.
//!
//! Secrets (the notebook token, the endpoint's API key) reach the container through
//! `--env-file /dev/stdin`, never the command line, which every local user can read.

use berth_domain::agent::Command;
use berth_domain::catalog::Offering;
use berth_domain::node_plan::{
    CONTAINER_PREFIX, LOG_TAIL_LINES, NodeWorkload, WorkloadState, WorkloadStatus, container_port, tail_of,
};

use super::commands::{CommandRunner, Failure};
use super::mig;

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

    /// `podman`, `docker`, or `auto` (podman when installed, else docker).
    pub fn choose(preference: &str, runner: &dyn CommandRunner) -> Result<Option<Runtime>, String> {
        let installed = |r: Runtime| runner.run(&Command::new(r.program(), &["--version"])).is_ok();
        match preference.trim() {
            "podman" => Ok(Some(Runtime::Podman)),
            "docker" => Ok(Some(Runtime::Docker)),
            "auto" => Ok([Runtime::Podman, Runtime::Docker].into_iter().find(|r| installed(*r))),
            other => Err(format!("--container-runtime must be auto, podman or docker, not \"{other}\"")),
        }
    }
}

/// A container of Berth's on the node: name, state, exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Container {
    name: String,
    running: bool,
    exit_code: Option<i64>,
}

/// Brings the node's containers to `workloads`; each workload's status (with its own
/// error when it could not be pulled or started). An error stops everything only when the
/// runtime itself cannot be used or a container that should go cannot be removed.
pub fn apply(
    runner: &dyn CommandRunner,
    runtime: Option<Runtime>,
    workloads: &[NodeWorkload],
) -> Result<Vec<WorkloadStatus>, String> {
    let Some(runtime) = runtime else {
        if workloads.is_empty() {
            return Ok(Vec::new());
        }
        return Err(
            "no container runtime on this node: install podman or docker with the NVIDIA Container Toolkit".into()
        );
    };
    let program = runtime.program();
    let run = |args: &[&str]| {
        runner.run(&Command::new(program, args)).map_err(|e| match e.failure {
            Failure::NotInstalled { .. } => format!("{program} is not installed on this node"),
            Failure::Failed { .. } => e.to_string(),
        })
    };
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
        if !workloads.iter().any(|w| w.container_name() == container.name) {
            run(&["rm", "--force", &container.name])?;
        }
    }
    let mut statuses = Vec::new();
    for workload in workloads {
        let existing = containers.iter().find(|c| c.name == workload.container_name());
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
                error: Some(error),
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
fn bring_up(runner: &dyn CommandRunner, runtime: Runtime, w: &NodeWorkload) -> Result<WorkloadState, String> {
    let program = runtime.program();
    if runner.run(&Command::new(program, &["image", "inspect", "--format", "{{.Id}}", &w.image])).is_err() {
        runner.run(&Command::new(program, &["pull", &w.image])).map_err(|e| format!("cannot pull {}: {e}", w.image))?;
    }
    if !w.run {
        return Ok(WorkloadState::Pulled);
    }
    let uuids = mig::device_uuids(runner, &w.devices)?;
    runner.run(&run_command(runtime, w, &uuids)).map_err(|e| format!("cannot start {}: {e}", w.container_name()))?;
    Ok(WorkloadState::Running)
}

/// `podman run` / `docker run` for `w` on the devices `uuids`.
pub fn run_command(runtime: Runtime, w: &NodeWorkload, uuids: &[String]) -> Command {
    let name = w.container_name();
    let mut args: Vec<String> = ["run", "--detach", "--name", &name, "--label"].map(str::to_owned).to_vec();
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
    args.push(w.image.clone());
    if let Some(command) = &w.command {
        args.extend(["/bin/sh".into(), "-c".into(), command.clone()]);
    }
    let mut env = format!("CUDA_VISIBLE_DEVICES={}\n", uuids.join(","));
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
                exit_code,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use berth_domain::mig::{MigInstance, MigProfile};
    use berth_domain::node_plan::Device;

    use super::*;
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
        }
    }

    fn node() -> Recording {
        let node = Recording::default();
        node.answer("nvidia-smi -L", "GPU 0: NVIDIA H100 (UUID: GPU-0)\nGPU 1: NVIDIA H100 (UUID: GPU-1)\n");
        node
    }

    #[test]
    fn a_notebook_is_pulled_then_started_with_its_gpu_and_token_off_the_command_line() {
        let node = node();
        node.fail("podman image inspect", Failure::Failed { message: "no such image".into() });
        let pulled = apply(&node, Some(Runtime::Podman), &[notebook(false)]).expect("applied");
        assert_eq!(pulled[0].state, Some(WorkloadState::Pulled));
        assert!(node.take().contains(&"podman pull quay.io/jupyter/pytorch-notebook:cuda12-latest".to_owned()));

        let command = run_command(Runtime::Podman, &notebook(true), &["GPU-1".into()]);
        assert_eq!(
            command.to_string(),
            "podman run --detach --name berth-e1 --label berth.environment=e1 --env-file /dev/stdin \
             --cap-drop ALL --security-opt no-new-privileges --device nvidia.com/gpu=GPU-1 --cpus 4 --memory 32g --publish 30000:8888 quay.io/jupyter/pytorch-notebook:cuda12-latest"
        );
        assert_eq!(command.stdin.as_deref(), Some("CUDA_VISIBLE_DEVICES=GPU-1\nJUPYTER_TOKEN=s3cret\n"));
        node.answer("podman image inspect", "sha256:1");
        let started = apply(&node, Some(Runtime::Podman), &[notebook(true)]).expect("applied");
        assert_eq!(started[0].state, Some(WorkloadState::Running));
        assert!(node.take().iter().any(|c| c.starts_with("podman run --detach --name berth-e1")));
    }

    #[test]
    fn running_containers_are_left_alone_and_unplanned_ones_removed() {
        let node = node();
        node.answer("podman ps", "berth-e1\trunning\tUp 3 minutes\nberth-old\texited\tExited (0) 1 hour ago\n");
        let statuses = apply(&node, Some(Runtime::Podman), &[notebook(true)]).expect("applied");
        assert_eq!(statuses[0].state, Some(WorkloadState::Running));
        let ran = node.take();
        assert_eq!(ran[1..], ["podman rm --force berth-old"]);
    }

    #[test]
    fn a_finished_job_is_not_started_again_and_its_exit_code_is_reported() {
        let node = node();
        node.answer("docker ps", "berth-e1\texited\tExited (3) 2 seconds ago\n");
        let statuses = apply(&node, Some(Runtime::Docker), &[notebook(true)]).expect("applied");
        assert_eq!((statuses[0].state, statuses[0].exit_code), (Some(WorkloadState::Exited), Some(3)));
        assert_eq!(node.take().len(), 1);
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
        let command = run_command(Runtime::Docker, &job, &["MIG-a".into(), "MIG-b".into()]);
        assert!(command.args.windows(2).any(|w| w == ["--gpus", "\"device=MIG-a,MIG-b\""]), "{command}");
        assert!(command.to_string().ends_with("/bin/sh -c python train.py"), "{command}");
        assert_eq!(command.stdin.as_deref(), Some("CUDA_VISIBLE_DEVICES=MIG-a,MIG-b\n"));
    }

    #[test]
    fn one_workloads_trouble_is_its_own_and_no_runtime_is_named() {
        let node = node();
        node.fail("podman image inspect", Failure::Failed { message: "no such image".into() });
        node.fail("podman pull", Failure::Failed { message: "manifest unknown".into() });
        let statuses = apply(&node, Some(Runtime::Podman), &[notebook(true)]).expect("applied");
        assert_eq!(
            statuses[0].error.as_deref(),
            Some(
                "cannot pull quay.io/jupyter/pytorch-notebook:cuda12-latest: `podman pull quay.io/jupyter/pytorch-notebook:cuda12-latest` failed: manifest unknown"
            )
        );
        assert_eq!(
            apply(&node, None, &[notebook(true)]),
            Err("no container runtime on this node: install podman or docker with the NVIDIA Container Toolkit".into())
        );
        assert_eq!(apply(&node, None, &[]), Ok(Vec::new()));
    }
}
