//! Node health checks on Kubernetes: each check a Job pinned to its node (see
//! `manifests::check_job`), its pod's log the check's output, judged by the platform with
//! the same parsers as a bare-metal agent's answer.
//!
//! | request | why |
//! |---|---|
//! | apply the checks' namespace | it may have been removed since the last check |
//! | create the Job | a leftover of a run cut short (409) is deleted and waited out first |
//! | read the Job until it has succeeded or failed | a failing check exits non-zero and its output says why |
//! | list its pods, read the newest one's log | the output; without one, why the pod did not run |
//! | delete the Job (background: its pods go too) | whatever the outcome |

use std::time::{Duration, Instant};

use berth_domain::node_checks::{CheckAnswer, CheckKind, CheckLevel};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams, LogParams, PostParams};

use super::manifests::{self, CHECK_CONTAINER, CHECK_JOB_LABEL, JOB};
use super::{Kubernetes, api_failure};
use crate::provisioning::backend::{BackendError, CheckedNode};

/// What Berth waits beyond the Job's own deadline (which Kubernetes enforces) before it
/// gives up on the API server reporting it.
const DEADLINE_SLACK: Duration = Duration::from_secs(60);

impl Kubernetes {
    /// Runs one check on the node as a Job and answers what it printed.
    pub(super) async fn run_check_job(
        &self,
        node: &CheckedNode,
        kind: CheckKind,
        level: CheckLevel,
    ) -> Result<String, BackendError> {
        let settings = &self.config.cluster;
        self.apply(&manifests::check_namespace(settings)).await?;
        let manifest = manifests::check_job(&node.name, node.gpus, kind, level, settings);
        let job: Job = serde_json::from_value(manifest.object.clone())
            .map_err(|e| BackendError(format!("the check's Job is not valid: {e}")))?;
        let jobs: Api<Job> = Api::namespaced(self.client.clone(), &settings.check_namespace);
        self.create_check_job(&jobs, &job, &manifest).await?;
        let outcome = self.check_output(&jobs, &job, &node.name, kind.time_limit(level)).await;
        // Whatever came of it: the next run of this check makes a Job of the same name.
        let removed = self.delete(&JOB, manifest.namespace(), manifest.name(), false).await;
        let output = outcome?;
        removed?;
        Ok(output)
    }

    async fn create_check_job(
        &self,
        jobs: &Api<Job>,
        job: &Job,
        manifest: &manifests::Manifest,
    ) -> Result<(), BackendError> {
        let name = manifest.name();
        match jobs.create(&PostParams::default(), job).await {
            Ok(_) => return Ok(()),
            // A run cut short (Berth stopped mid-check) left its Job: it goes first.
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(e) => return Err(api_failure(&format!("create the check Job {name}"), e)),
        }
        // In the background, so its pods go too; one gone meanwhile counts as deleted.
        self.delete(&JOB, manifest.namespace(), name, false).await?;
        self.wait_gone(manifest).await?;
        jobs.create(&PostParams::default(), job)
            .await
            .map_err(|e| api_failure(&format!("create the check Job {name}"), e))?;
        Ok(())
    }

    /// Waits for the Job to finish and reads its pod's log.
    async fn check_output(
        &self,
        jobs: &Api<Job>,
        job: &Job,
        node: &str,
        time_limit: Duration,
    ) -> Result<String, BackendError> {
        let name = job.name_any();
        let deadline = job
            .spec
            .as_ref()
            .and_then(|s| s.active_deadline_seconds)
            .and_then(|s| u64::try_from(s).ok())
            .map_or(time_limit, Duration::from_secs);
        let give_up = Instant::now() + deadline + DEADLINE_SLACK;
        let finished = loop {
            let read = jobs.get_opt(&name).await.map_err(|e| api_failure(&format!("read the check Job {name}"), e))?;
            let read = read.ok_or_else(|| BackendError(format!("the check Job {name} was deleted while it ran")))?;
            let status = read.status.unwrap_or_default();
            if status.succeeded.unwrap_or(0) > 0 || status.failed.unwrap_or(0) > 0 {
                break status;
            }
            if Instant::now() >= give_up {
                return Err(BackendError(format!(
                    "the check did not finish on {node} within {} minutes",
                    deadline.as_secs().div_ceil(60)
                )));
            }
            tokio::time::sleep(self.config.poll_interval).await;
        };
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.config.cluster.check_namespace);
        let mut found = pods
            .list(&ListParams::default().labels(&format!("{CHECK_JOB_LABEL}={name}")))
            .await
            .map_err(|e| api_failure(&format!("list the pods of the check Job {name}"), e))?
            .items;
        // With backoffLimit 0 there is one; the newest ran last.
        found.sort_by_key(|p| p.metadata.creation_timestamp.clone());
        let pod = found.pop();
        let container = pod
            .as_ref()
            .and_then(|p| p.status.as_ref())
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.iter().find(|c| c.name == CHECK_CONTAINER).cloned());
        let ran = container.and_then(|c| c.state).is_some_and(|s| s.terminated.is_some() || s.running.is_some());
        if let Some(pod) = pod.as_ref().filter(|_| ran) {
            let params = LogParams { container: Some(CHECK_CONTAINER.to_owned()), ..LogParams::default() };
            let log = pods
                .logs(&pod.name_any(), &params)
                .await
                .map_err(|e| api_failure(&format!("read the log of the check on {node}"), e))?;
            return Ok(CheckAnswer::printed(log).output);
        }
        // It never ran: say why, as the pod or the Job puts it (no room for its GPUs, an
        // image that cannot be pulled, the deadline).
        let pod_reason = pod
            .and_then(|p| p.status)
            .map(|s| [s.reason, s.message].into_iter().flatten().collect::<Vec<_>>().join(": "));
        let job_reason = finished
            .conditions
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.status == "True")
            .map(|c| [c.reason, c.message].into_iter().flatten().collect::<Vec<_>>().join(": "));
        let why = pod_reason.filter(|r| !r.is_empty()).or(job_reason.filter(|r| !r.is_empty()));
        Err(BackendError(match why {
            Some(why) => format!("the check's pod did not run on {node}: {why}"),
            None => format!("the check's pod did not run on {node}"),
        }))
    }
}
