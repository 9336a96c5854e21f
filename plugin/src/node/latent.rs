//! Latent devices (see [`crate::latent`]): switching a GPU whose latent device the
//! scheduler allocated, and writing the verdicts to the claims.

use std::collections::{BTreeMap, BTreeSet};

use tracing::{info, warn};

use super::{NodeLoop, pass::GpuUsers};
use crate::{
    binding_report::{self, Verdict},
    latent,
    slices::{self},
    status::{self},
};

impl NodeLoop {
    /// Switches the GPUs on whose latent devices the scheduler allocated claims (see
    /// [`crate::latent`]) and keeps a GPU that serves such claims in their shape, whatever
    /// the spec says, until they end (the operator follows it into the spec). Returns the
    /// verdicts to report once the pass has published.
    pub(super) fn switch_for_latent(
        &mut self,
        gpus: &[tessera_gpu::backend::GpuInfo],
        layouts: &BTreeMap<u32, tessera_gpu::catalog::MigLayout>,
        spec: &tessera_api::GpuNodeSpec,
        offers: &mut [slices::GpuOffer],
        users: &GpuUsers,
    ) -> Vec<(latent::LatentClaim, Verdict)> {
        let all = latent::latent_claims(
            self.claims.state().iter().map(AsRef::as_ref),
            self.state.driver_name(),
            self.state.node(),
        );
        let live: BTreeSet<(String, String, String)> =
            all.iter().map(latent::LatentClaim::allocation).collect();
        self.reported.retain(|k| live.contains(k));
        if all.is_empty() {
            return Vec::new();
        }
        let (mut allocated, mut prepared) = (users.allocated.clone(), users.prepared.clone());
        let candidates = slices::latent_offers(
            gpus,
            |g| layouts.get(&g.index),
            Some(spec),
            |i| self.handover.applied(i).cloned(),
        );
        let mut verdicts = Vec::new();
        for (index, claims) in latent::by_gpu(all) {
            let Some(pos) = gpus.iter().position(|g| g.index == index) else {
                continue;
            };
            let info = &gpus[pos];
            let layout = layouts.get(&index);
            let applied = self.handover.applied(index).cloned();
            let applied_names = applied
                .as_ref()
                .map(|o| slices::offer_device_names(info, layout, o));
            if let (Some(a), Some(names)) = (&applied, &applied_names)
                && claims
                    .iter()
                    .any(|c| c.reported != latent::Reported::Failed && names.contains(&c.device))
            {
                offers[pos] = a.clone();
            }
            let pending: Vec<latent::LatentClaim> = claims
                .into_iter()
                .filter(|c| {
                    c.reported == latent::Reported::Nothing
                        && !self.reported.contains(&c.allocation())
                })
                .collect();
            if pending.is_empty() {
                continue;
            }
            let side = latent::GpuSide {
                applied: applied.as_ref().zip(applied_names),
                candidates: candidates[pos]
                    .iter()
                    .map(|o| (o, slices::offer_device_names(info, layout, o)))
                    .collect(),
                unpreparing: prepared
                    .remove(&index)
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|c| !allocated.get(&index).is_some_and(|a| a.contains(c)))
                    .collect(),
                allocated: allocated.remove(&index).unwrap_or_default(),
                healthy: self.health.get(&index).is_none_or(|h| h.healthy),
            };
            let decision = latent::decide(&side, &pending);
            if let Some(to) = decision.switch_to {
                info!(
                    gpu = index,
                    claims = ?pending.iter().map(latent::LatentClaim::key).collect::<Vec<_>>(),
                    "the scheduler allocated a latent device: switching the GPU to its shape"
                );
                self.handover.switch_now(index, to.clone());
                offers[pos] = to;
            }
            let shape = status::strategy_of(&offers[pos]);
            for c in decision.switched {
                let msg = format!(
                    "GPU {index} of node {} offers {} now",
                    self.state.node(),
                    shape.as_str()
                );
                verdicts.push((c, Verdict::Switched(msg)));
            }
            for (c, why) in decision.failed {
                warn!(gpu = index, claim = %c.key(), device = %c.device, why = %why, "cannot switch the GPU for a latent device");
                verdicts.push((c, Verdict::Failed(why)));
            }
        }
        verdicts
    }

    /// Writes the verdicts (see [`crate::binding_report`]); one that fails is written
    /// again by a later pass, since its claim still has none.
    pub(super) async fn report_latent(&mut self, verdicts: Vec<(latent::LatentClaim, Verdict)>) {
        let client = &self.client;
        let driver = self.state.driver_name();
        let node = self.state.node();
        let results = futures::future::join_all(verdicts.iter().map(|(c, v)| async move {
            (
                c,
                v,
                binding_report::report(client, driver, node, c, v).await,
            )
        }))
        .await;
        for (c, v, r) in results {
            match r {
                Ok(()) => {
                    self.metrics
                        .latent_verdict(matches!(v, Verdict::Switched(_)));
                    self.reported.insert(c.allocation());
                }
                Err(e) => warn!(
                    claim = %c.key(),
                    error = %crate::error_chain(&e),
                    "cannot write the binding condition; the next pass tries again"
                ),
            }
        }
    }

    /// Whether a claim the cache holds waits for this node's verdict on a latent device.
    pub(super) fn latent_pending(&self) -> bool {
        latent::latent_claims(
            self.claims.state().iter().map(AsRef::as_ref),
            self.state.driver_name(),
            self.state.node(),
        )
        .iter()
        .any(|c| {
            c.reported == latent::Reported::Nothing && !self.reported.contains(&c.allocation())
        })
    }
}
