//! The MPS fault: the control daemon of a running MPS pod's claim is killed (SIGKILL, as
//! an OOM kill or a crash would). Recovery is the claim's daemon running again, started by
//! the plugin's next pass with the claim's limits, and the claim's status telling its pods
//! (`MPSServerReady`, reason `DaemonRestarted`).

use std::time::Instant;

use anyhow::Context;
use k8s_openapi::api::{core::v1::Pod, resource::v1::ResourceClaim};
use kube::Api;
use nix::{sys::signal::Signal, unistd::Pid};
use tessera_gpu::backend::sim::state::load_state;

use super::{Campaign, Fault, NAMESPACE, SETTLE, shapes};
use crate::wait::eventually;

/// The node whose GPU the MPS shape shares.
const MPS_NODE: &str = "chaos-l4";

impl Campaign<'_> {
    pub(super) async fn kill_mps_daemon(&mut self) -> anyhow::Result<()> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), NAMESPACE);
        let running =
            |p: &Pod| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        let mut target = None;
        for name in self.live.iter().filter(|p| p.starts_with("mps-")) {
            if pods.get_opt(name).await?.is_some_and(|p| running(&p)) {
                target = Some(name.clone());
                break;
            }
        }
        let pod = match target {
            Some(p) => p,
            None => {
                let all = shapes();
                let shape = all
                    .iter()
                    .find(|s| s.name == "mps")
                    .context("no MPS shape")?;
                let name = self.create_pod(shape).await?;
                eventually(&format!("{name} to run"), SETTLE, || async {
                    pods.get_opt(&name)
                        .await
                        .ok()
                        .flatten()
                        .filter(running)
                        .map(|_| ())
                })
                .await?;
                name
            }
        };
        let claim_name = pods
            .get(&pod)
            .await?
            .status
            .and_then(|s| s.resource_claim_statuses)
            .and_then(|c| c.into_iter().next())
            .and_then(|c| c.resource_claim_name)
            .with_context(|| format!("{pod} has no claim"))?;
        let claims: Api<ResourceClaim> = Api::namespaced(self.client.clone(), NAMESPACE);
        let uid = claims
            .get(&claim_name)
            .await?
            .metadata
            .uid
            .context("a claim without UID")?;
        let state_file = self.node_mut(MPS_NODE)?.sim_state();
        let daemon_of = |uid: &str| {
            load_state(&state_file).ok().flatten().and_then(|s| {
                s.gpus
                    .into_iter()
                    .flat_map(|g| g.mps)
                    .find(|m| m.config.pipe_dir.to_string_lossy().contains(uid))
            })
        };
        let killed = daemon_of(&uid).with_context(|| format!("no MPS daemon for {pod}'s claim"))?;
        let t0 = Instant::now();
        let pid = i32::try_from(killed.pid).context("pid")?;
        nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL)
            .with_context(|| format!("killing the MPS daemon {pid}"))?;
        eventually(
            &format!("{pod}'s MPS daemon to run again and its claim to say so"),
            SETTLE,
            || async {
                let again = daemon_of(&uid).filter(|m| {
                    m.pid != killed.pid
                        && tessera_simdriver::cuda::mps_daemon_reachable(&m.config.pipe_dir)
                })?;
                let told = claims
                    .get(&claim_name)
                    .await
                    .ok()?
                    .status?
                    .devices?
                    .iter()
                    .flat_map(|d| d.conditions.iter().flatten())
                    .any(|c| c.type_ == "MPSServerReady" && c.reason == "DaemonRestarted");
                told.then_some(again)
            },
        )
        .await
        .map_err(|e| {
            let log = self
                .node_mut(MPS_NODE)
                .map(|n| n.log_tail(60))
                .unwrap_or_default();
            anyhow::Error::from(e).context(format!("{MPS_NODE}'s plugin log (last lines):\n{log}"))
        })?;
        self.report
            .recovered(Fault::MpsDaemonKilled.name(), t0.elapsed());
        Ok(())
    }
}
