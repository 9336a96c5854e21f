//! The operator's Adaptive planner (`operator/src/adaptive.rs` `plan`) for one waiting
//! claim, the way the simulator meets it: a pod that fits nowhere is the demand.
//!
//! Its rules for a strategy of `adaptive.strategies` that the demand asks for:
//! - if a GPU of the policy already offers the strategy and holds nothing, nothing changes
//!   (free capacity is the scheduler's);
//! - else enough idle GPUs move to it, taken in the order the operator lists the GPUs it
//!   governs (node, then index), skipping GPUs already in it and at most one per node.
//!
//! One claim needs one GPU's worth (`gpus_for`: ⌈units / units per GPU⌉ is 1 for any
//! single share), so exactly one GPU moves. The cooldown and the hand-over fence do not
//! apply: the model has no clock between a pod's failure and its retry.

use tessera_api::policy::SharingStrategy;

/// A GPU as the planner sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuSeen {
    /// Index of its node.
    pub node: usize,
    /// Its index on the node.
    pub gpu: u32,
    /// Strategy now.
    pub strategy: SharingStrategy,
    /// Whether no claim holds any of it.
    pub idle: bool,
}

/// The GPU to move to `wanted`, if the planner moves one. `gpus` are in the operator's
/// order.
pub fn plan(
    gpus: &[GpuSeen],
    wanted: SharingStrategy,
    strategies: &[SharingStrategy],
) -> Option<GpuSeen> {
    if !strategies.contains(&wanted) {
        return None;
    }
    if gpus.iter().any(|g| g.strategy == wanted && g.idle) {
        return None;
    }
    gpus.iter()
        .find(|g| g.idle && g.strategy != wanted)
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use SharingStrategy::{Exclusive, Mig, Mps};

    fn g(node: usize, gpu: u32, strategy: SharingStrategy, idle: bool) -> GpuSeen {
        GpuSeen {
            node,
            gpu,
            strategy,
            idle,
        }
    }

    #[test]
    fn the_first_idle_gpu_of_another_strategy_moves() {
        let gpus = [g(0, 0, Mig, false), g(0, 1, Mig, true), g(1, 0, Mig, true)];
        assert_eq!(plan(&gpus, Mps, &[Mig, Mps]), Some(gpus[1]));
    }

    #[test]
    fn an_idle_gpu_already_offering_the_strategy_stops_the_move() {
        let gpus = [g(0, 0, Mig, true), g(1, 0, Mps, true)];
        assert_eq!(plan(&gpus, Mps, &[Mig, Mps]), None);
    }

    #[test]
    fn demand_outside_the_policys_strategies_moves_nothing() {
        let gpus = [g(0, 0, Mps, true)];
        assert_eq!(plan(&gpus, Exclusive, &[Mig, Mps]), None);
        assert_eq!(plan(&[g(0, 0, Mig, false)], Mps, &[Mig, Mps]), None);
    }
}
