//! A node health check as a Kubernetes Job pinned to the node: the same command a
//! bare-metal node's agent runs (`CheckKind::command`), in an image that has the tool.
//!
//! The Job is named by node and check kind (one run of a kind per node at a time: a node
//! under test takes no other run), lives in a namespace of its own that allows privileged
//! pods (reading the kernel log and the InfiniBand ports needs the host), and is bound to
//! its node by `nodeName`, past the scheduler: a degraded or cordoned node, or one tainted
//! for a tenant, is checked all the same.
//!
//! The checks that exercise GPUs (DCGM diagnostics, the NCCL sweep) ask for every GPU of
//! the node, so the kubelet admits them only where nothing else holds one, which is also
//! the only time their figures mean anything. Those that read counters (ECC, XID, ports)
//! ask for none and see every GPU through the NVIDIA runtime's `NVIDIA_VISIBLE_DEVICES=all`,
//! so a tenant's running cluster can be checked without being stopped.

use berth_domain::node_checks::{CheckKind, CheckLevel};

use super::*;

/// The pods' label naming the Job that made them (Kubernetes' own `job-name` label is
/// there too, but this one is Berth's and survives a rename upstream).
pub const CHECK_JOB_LABEL: &str = "berth.dev/node-check";
/// The one container of a check's pod.
pub const CHECK_CONTAINER: &str = "check";
/// How long a finished check's Job stays before Kubernetes removes it, should Berth stop
/// before it deletes it itself.
const FINISHED_JOB_TTL_SECONDS: i64 = 3600;
/// Time for the node to pull a check's image (DCGM's and the NCCL tests' are gigabytes),
/// on top of the check's own time limit: Kubernetes' deadline counts from the Job's start.
const PULL_ALLOWANCE_SECONDS: i64 = 600;
/// The most a Job or label name holds.
const MAX_NAME: usize = 63;

/// The images the checks run in, one per tool; a site with its own registry sets them
/// (`--kube-check-images`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckImages {
    /// Has `nv-hostengine` and `dcgmi` (NVIDIA's DCGM image).
    pub dcgm: String,
    /// Has `nvidia-smi` (put there by the NVIDIA runtime) and util-linux's `dmesg`.
    pub cuda: String,
    /// Has `all_reduce_perf` on its `PATH`.
    pub nccl: String,
    /// Has `ibstat` (infiniband-diags).
    pub infiniband: String,
}

impl Default for CheckImages {
    fn default() -> CheckImages {
        CheckImages {
            dcgm: "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04".into(),
            cuda: "nvcr.io/nvidia/cuda:12.8.1-base-ubuntu22.04".into(),
            nccl: "ghcr.io/coreweave/nccl-tests:12.8.1-devel-ubuntu22.04-nccl2.26.2-1-0708d2e".into(),
            infiniband: "ghcr.io/coreweave/nccl-tests:12.8.1-devel-ubuntu22.04-nccl2.26.2-1-0708d2e".into(),
        }
    }
}

impl CheckImages {
    /// Sets images from `tool=image` pairs separated by commas (`dcgm`, `cuda`, `nccl`,
    /// `infiniband`), keeping the others.
    pub fn with_overrides(mut self, text: &str) -> Result<CheckImages, String> {
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (tool, image) = pair.split_once('=').ok_or_else(|| format!("`{pair}` is not TOOL=IMAGE"))?;
            let image = image.trim();
            if image.is_empty() || image.contains(char::is_whitespace) {
                return Err(format!("`{pair}`: the image is empty or has spaces"));
            }
            let slot = match tool.trim() {
                "dcgm" => &mut self.dcgm,
                "cuda" => &mut self.cuda,
                "nccl" => &mut self.nccl,
                "infiniband" => &mut self.infiniband,
                other => return Err(format!("`{other}` is not a check tool: dcgm, cuda, nccl or infiniband")),
            };
            *slot = image.to_owned();
        }
        Ok(self)
    }

    fn of(&self, kind: CheckKind) -> &str {
        match kind {
            CheckKind::GpuDiagnostics => &self.dcgm,
            CheckKind::MemoryErrors | CheckKind::XidEvents => &self.cuda,
            CheckKind::NcclBandwidth => &self.nccl,
            CheckKind::Infiniband => &self.infiniband,
        }
    }
}

/// The namespace the checks run in: Pod Security lets its pods be privileged.
pub fn check_namespace(settings: &ClusterSettings) -> Manifest {
    Manifest::new(
        NAMESPACE,
        json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": settings.check_namespace,
                "labels": { "pod-security.kubernetes.io/enforce": "privileged" },
            },
        }),
    )
}

/// `check-<kind>-<node>`, or, for a node name too long for that, its start and a hash of
/// the whole (names are at most 63 characters, and must stay apart per node).
pub fn check_job_name(node: &str, kind: CheckKind) -> String {
    let prefix = format!("check-{}-", kind.as_str().replace('_', "-"));
    let node_part: String = node
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '-' })
        .collect();
    let whole = format!("{prefix}{node_part}");
    if whole.len() <= MAX_NAME && whole == format!("{prefix}{node}") {
        return whole;
    }
    let digest = Sha256::digest(node.as_bytes());
    let hash: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
    let room = MAX_NAME - prefix.len() - hash.len() - 1;
    let start: String = node_part.chars().take(room).collect();
    format!("{prefix}{}-{hash}", start.trim_end_matches('-'))
}

/// The Job that runs one check on `node`, which has `gpus` GPUs.
pub fn check_job(node: &str, gpus: u32, kind: CheckKind, level: CheckLevel, settings: &ClusterSettings) -> Manifest {
    let name = check_job_name(node, kind);
    let command = kind.command(level, gpus);
    let argv: Vec<String> = std::iter::once(command.program.to_owned()).chain(command.args).collect();
    let argv = match kind {
        // `dcgmi` talks to a host engine; the check starts its own (it forks into the
        // background), so no DCGM DaemonSet is needed.
        CheckKind::GpuDiagnostics => {
            let mut wrapped = vec![
                "/bin/sh".to_owned(),
                "-c".to_owned(),
                "nv-hostengine >/dev/null 2>&1; exec \"$@\"".to_owned(),
                "sh".to_owned(),
            ];
            wrapped.extend(argv);
            wrapped
        }
        _ => argv,
    };
    let exercises_gpus = matches!(kind, CheckKind::GpuDiagnostics | CheckKind::NcclBandwidth);
    let mut container = json!({
        "name": CHECK_CONTAINER,
        "image": settings.check_images.of(kind),
        "command": argv,
        "securityContext": { "privileged": true },
    });
    if exercises_gpus {
        container["resources"] = json!({ "limits": { "nvidia.com/gpu": gpus } });
    } else {
        container["env"] = json!([{ "name": "NVIDIA_VISIBLE_DEVICES", "value": "all" }]);
    }
    if kind == CheckKind::Infiniband {
        container["volumeMounts"] = json!([{ "name": "sys", "mountPath": "/sys", "readOnly": true }]);
    }
    let labels = json!({ MANAGED_BY_LABEL: FIELD_MANAGER, CHECK_JOB_LABEL: name });
    let mut pod = json!({
        "restartPolicy": "Never",
        "nodeName": node,
        "tolerations": [{ "operator": "Exists" }],
        "containers": [container],
    });
    if kind == CheckKind::Infiniband {
        pod["volumes"] = json!([{ "name": "sys", "hostPath": { "path": "/sys" } }]);
    }
    let deadline = i64::try_from(kind.time_limit(level).as_secs()).unwrap_or(i64::MAX) + PULL_ALLOWANCE_SECONDS;
    Manifest::new(
        JOB,
        json!({
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": { "name": name, "namespace": settings.check_namespace, "labels": labels },
            "spec": {
                "backoffLimit": 0,
                "activeDeadlineSeconds": deadline,
                "ttlSecondsAfterFinished": FINISHED_JOB_TTL_SECONDS,
                "template": { "metadata": { "labels": labels }, "spec": pod },
            },
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_is_named_by_kind_and_node_within_63_characters() {
        assert_eq!(check_job_name("dgx-01", CheckKind::GpuDiagnostics), "check-gpu-diagnostics-dgx-01");
        let long = "a-very-long-node-name.with.dots.in.a.datacenter.example.com";
        let name = check_job_name(long, CheckKind::NcclBandwidth);
        assert!(name.len() <= 63, "{name}");
        assert!(name.starts_with("check-nccl-bandwidth-a-very-long-node-name-with"), "{name}");
        assert_ne!(name, check_job_name(&format!("{long}x"), CheckKind::NcclBandwidth));
        assert!(name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'), "{name}");
    }

    #[test]
    fn gpu_exercising_checks_ask_for_every_gpu_and_counter_reads_for_none() {
        let settings = ClusterSettings::default();
        let dcgm = check_job("dgx-01", 8, CheckKind::GpuDiagnostics, CheckLevel::Medium, &settings).object;
        let container = &dcgm["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(container["resources"]["limits"]["nvidia.com/gpu"], 8);
        let argv = container["command"].as_array().unwrap();
        assert_eq!(argv[argv.len() - 5..], json!(["dcgmi", "diag", "-r", "2", "-j"]).as_array().unwrap()[..]);
        assert_eq!(dcgm["spec"]["template"]["spec"]["nodeName"], "dgx-01");
        assert_eq!(dcgm["spec"]["activeDeadlineSeconds"], 20 * 60 + PULL_ALLOWANCE_SECONDS);
        let ecc = check_job("dgx-01", 8, CheckKind::MemoryErrors, CheckLevel::Quick, &settings).object;
        let container = &ecc["spec"]["template"]["spec"]["containers"][0];
        assert!(container.get("resources").is_none());
        assert_eq!(container["command"], json!(["nvidia-smi", "-q", "-d", "ECC,ROW_REMAPPER"]));
    }

    #[test]
    fn images_are_overridden_per_tool_and_a_bad_override_says_why() {
        let images =
            CheckImages::default().with_overrides("nccl=registry.local/nccl:1, cuda=registry.local/cuda:12").unwrap();
        assert_eq!(images.nccl, "registry.local/nccl:1");
        assert_eq!(images.cuda, "registry.local/cuda:12");
        assert_eq!(images.dcgm, CheckImages::default().dcgm);
        assert!(CheckImages::default().with_overrides("gpu=x").unwrap_err().contains("not a check tool"));
        assert!(CheckImages::default().with_overrides("nccl").unwrap_err().contains("TOOL=IMAGE"));
    }
}
