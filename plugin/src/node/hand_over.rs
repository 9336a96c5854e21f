//! The hand-over of each GPU from one offer to the next (see [`crate::fence`]).

use std::collections::BTreeMap;

use tracing::{info, warn};

use super::{NodeLoop, RECONFIGURING_TAINT, pass::GpuUsers};
use crate::{
    fence::Publish,
    slices::{self},
};

impl NodeLoop {
    /// Steps each GPU's offer through the hand-over (see [`crate::fence`]): the offers to
    /// publish, and per GPU what holds its change back.
    pub(super) fn hand_over(
        &mut self,
        gpus: &[tessera_gpu::backend::GpuInfo],
        desired: Vec<slices::GpuOffer>,
        users: &GpuUsers,
    ) -> (Vec<slices::GpuOffer>, BTreeMap<u32, String>) {
        let binding = crate::fence::being_bound(
            self.nominated.state().iter().map(AsRef::as_ref),
            self.state.node(),
        );
        let now = std::time::Instant::now();
        self.fenced.clear();
        self.recheck = None;
        self.held_back = false;
        let mut notes = BTreeMap::new();
        let mut offers = Vec::with_capacity(desired.len());
        for (gpu, want) in gpus.iter().zip(desired) {
            let step = self
                .handover
                .step(gpu.index, &want, users.of(gpu.index), &binding, now);
            if let Some(r) = step.recheck_in {
                self.recheck = Some(self.recheck.map_or(r, |x| x.min(r)));
            }
            if !step.held_by.is_empty() {
                self.held_back = true;
                notes.insert(
                    gpu.index,
                    format!(
                        "GPU {}: its new configuration waits for claim(s) {} allocated on it",
                        gpu.index,
                        step.held_by.join(", ")
                    ),
                );
            }
            if !step.binding.is_empty() || step.users_unknown {
                // Their allocations or bindings, and the caches' first list, end with an
                // event of the claim or pod caches: wake on those.
                self.held_back = true;
            }
            offers.push(match step.publish {
                Publish::Offer(o) => o,
                Publish::Fenced(o) if step.users_unknown => {
                    notes.insert(
                        gpu.index,
                        format!(
                            "GPU {}: changing shape; its devices stay fenced ({RECONFIGURING_TAINT}, NoSchedule) until the plugin has read the cluster's claims and the pods being bound, to know whether one holds the GPU",
                            gpu.index
                        ),
                    );
                    self.fenced.insert(gpu.index);
                    o
                }
                Publish::Fenced(o) if !step.binding.is_empty() => {
                    notes.insert(
                        gpu.index,
                        format!(
                            "GPU {}: changing shape; its devices stay fenced ({RECONFIGURING_TAINT}, NoSchedule) while pod(s) {} being bound to this node may get one of them",
                            gpu.index,
                            step.binding.join(", ")
                        ),
                    );
                    self.fenced.insert(gpu.index);
                    o
                }
                Publish::Fenced(o) => {
                    info!(gpu = gpu.index, "GPU changes shape: fencing its devices while allocations in flight settle");
                    notes.insert(
                        gpu.index,
                        format!(
                            "GPU {}: changing shape; its devices are fenced ({RECONFIGURING_TAINT}, NoSchedule) until allocations in flight have settled",
                            gpu.index
                        ),
                    );
                    self.fenced.insert(gpu.index);
                    o
                }
            });
        }
        (offers, notes)
    }

    /// Records the offers the hand-over applied, so a restart during a change fences it
    /// again instead of applying it at once.
    pub(super) fn save_offers(&self, gpus: &[tessera_gpu::backend::GpuInfo]) {
        if let Err(e) = self.offer_store.save(self.handover.applied_all(), gpus) {
            warn!(
                error = %crate::error_chain(&e),
                "cannot record the GPUs' offers; a restart during a change would apply it at once"
            );
        }
    }
}
