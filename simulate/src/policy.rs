//! The sharing policies compared, what each makes the GPUs offer (as a `GpuNode.spec`
//! entry the plugin resolves with its own code) and what a pod's claim asks under it.

use serde::Serialize;
use tessera_api::{
    gpunode::{GpuConfig, GpuMigConfig},
    policy::{MpsPolicy, SharingStrategy},
};
use tessera_gpu::catalog::MigLayout;

use crate::{
    mapping::{MpsShare, mig_profile, mig_waste, mps_share},
    workload::PodSpec,
};

/// A sharing policy of the comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Whole GPU per pod, what the device plugin gives today.
    Whole,
    /// Dynamic MIG in the canonical name order NVIDIA's DRA driver publishes.
    MigFirstFit,
    /// Dynamic MIG in Tessera's publishing order.
    MigTessera,
    /// MPS only.
    Mps,
    /// MIG where it wastes little, MPS elsewhere, GPUs moved between them on demand the
    /// way the operator's Adaptive planner does (on nodes where the waiting pod fits).
    Adaptive,
}

impl Policy {
    /// The strategies of the Adaptive policy, most preferred first. `Exclusive` lets
    /// whole-GPU demand move an idle MPS GPU back (a MIG GPU offers the whole GPU too).
    pub const ADAPTIVE_STRATEGIES: [SharingStrategy; 3] = [
        SharingStrategy::Mig,
        SharingStrategy::Mps,
        SharingStrategy::Exclusive,
    ];

    /// Every policy, in report order.
    pub const ALL: [Policy; 5] = [
        Policy::Whole,
        Policy::MigFirstFit,
        Policy::MigTessera,
        Policy::Mps,
        Policy::Adaptive,
    ];

    /// Whether the Adaptive planner moves GPUs under this policy.
    pub fn adapts(self) -> bool {
        matches!(self, Policy::Adaptive)
    }

    /// Short label for tables and charts.
    pub fn label(self) -> &'static str {
        match self {
            Policy::Whole => "whole GPU",
            Policy::MigFirstFit => "MIG first-fit",
            Policy::MigTessera => "MIG Tessera",
            Policy::Mps => "MPS",
            Policy::Adaptive => "MIG+MPS",
        }
    }

    /// The strategy a GPU starts in.
    pub fn initial_strategy(self) -> SharingStrategy {
        match self {
            Policy::Whole => SharingStrategy::Exclusive,
            Policy::Mps => SharingStrategy::Mps,
            // Adaptive starts in its first, most preferred strategy (the operator's
            // `resolve::adaptive_strategy`).
            Policy::MigFirstFit | Policy::MigTessera | Policy::Adaptive => SharingStrategy::Mig,
        }
    }
}

/// Settings of a run that shape offers and asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Knobs {
    /// MPS clients per GPU (the policy's `mps.maxClients`).
    pub mps_max_clients: u32,
    /// Adaptive: a sharing pod takes MIG when its profile gives it at most this much
    /// compute beyond its share (milli-GPU), else MPS.
    pub mig_waste_milli: u32,
    /// The scheduler's NodeResourcesFit scoring strategy.
    pub scoring: Scoring,
}

/// NodeResourcesFit's `scoringStrategy.type` (KubeSchedulerConfiguration).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Scoring {
    /// `LeastAllocated`, the default: spread pods over nodes.
    #[default]
    LeastAllocated,
    /// `MostAllocated`: pack pods onto the fullest nodes.
    MostAllocated,
}

impl Default for Knobs {
    fn default() -> Self {
        Self {
            // NVIDIA documents 48 clients per server on Volta and newer
            // (gpu-hardware.md §8.1); the default covers the trace's smallest shares.
            mps_max_clients: 48,
            mig_waste_milli: 50,
            scoring: Scoring::LeastAllocated,
        }
    }
}

/// The `GpuNode.spec` entry for GPU `index` in `strategy`.
pub fn gpu_config(index: u32, strategy: SharingStrategy, knobs: Knobs) -> GpuConfig {
    GpuConfig {
        index,
        uuid: None,
        strategy,
        policy: Some("simulate".into()),
        mig: (strategy == SharingStrategy::Mig).then(GpuMigConfig::default),
        mps: (strategy == SharingStrategy::Mps).then(|| MpsPolicy {
            max_clients: knobs.mps_max_clients,
            ..MpsPolicy::default()
        }),
        time_slicing: None,
        allow_gpu_reset: false,
        alternatives: Vec::new(),
    }
}

/// What a pod's claim asks for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Ask {
    /// Nothing (a CPU-only pod).
    Nothing,
    /// `count` whole GPUs (DeviceClass `gpu.tessera.dev`).
    Whole {
        /// Devices.
        count: u32,
    },
    /// One MIG device of `profile` (`mig.tessera.dev` with a profile selector).
    Mig {
        /// Profile name.
        profile: String,
    },
    /// `count` MPS devices with a share of each (`mps.tessera.dev` with capacity).
    Mps {
        /// Devices.
        count: u32,
        /// The share of each.
        share: MpsShare,
    },
}

impl Ask {
    /// The strategy the operator counts this ask's demand under (the operator's
    /// `demand::Shape::strategy`): a whole GPU is `Exclusive` demand, even though the
    /// dynamic-MIG offer includes the whole GPU.
    pub fn strategy(&self) -> Option<SharingStrategy> {
        match self {
            Ask::Nothing => None,
            Ask::Whole { .. } => Some(SharingStrategy::Exclusive),
            Ask::Mig { .. } => Some(SharingStrategy::Mig),
            Ask::Mps { .. } => Some(SharingStrategy::Mps),
        }
    }
}

/// What `pod` asks under `policy` on GPUs with `layout` whose MPS device advertises
/// `mps_memory_mib`.
pub fn ask(
    policy: Policy,
    pod: &PodSpec,
    layout: &MigLayout,
    mps_memory_mib: u64,
    knobs: Knobs,
) -> Ask {
    if pod.gpus == 0 {
        return Ask::Nothing;
    }
    let whole = Ask::Whole { count: pod.gpus };
    let mps = Ask::Mps {
        count: pod.gpus,
        share: mps_share(pod.gpu_milli, mps_memory_mib),
    };
    if !pod.is_sharing() {
        return match policy {
            Policy::Mps => mps,
            _ => whole,
        };
    }
    let profile = mig_profile(layout, pod.gpu_milli);
    let mig = |p: &tessera_gpu::MigProfile| Ask::Mig {
        profile: p.name.clone(),
    };
    match (policy, profile) {
        (Policy::Whole, _) | (_, None) => whole,
        (Policy::MigFirstFit | Policy::MigTessera, Some(p)) => mig(p),
        (Policy::Mps, _) => mps,
        (Policy::Adaptive, Some(p)) => {
            if mig_waste(layout, p, pod.gpu_milli) <= knobs.mig_waste_milli
                && p.memory_slices < layout.memory_slices
            {
                mig(p)
            } else {
                mps
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_gpu::find_model;

    fn pod(gpus: u32, milli: u32) -> PodSpec {
        PodSpec {
            name: "p".into(),
            cpu_milli: 1000,
            memory_mib: 1024,
            gpus,
            gpu_milli: milli,
            arrival: 0,
            departure: None,
        }
    }

    fn layout() -> &'static MigLayout {
        find_model("h100-80gb").unwrap().mig.as_ref().unwrap()
    }

    #[test]
    fn each_policy_asks_its_own_shape_for_a_sharing_pod() {
        let k = Knobs::default();
        let p = pod(1, 470);
        assert_eq!(
            ask(Policy::Whole, &p, layout(), 81408, k),
            Ask::Whole { count: 1 }
        );
        assert_eq!(
            ask(Policy::MigTessera, &p, layout(), 81408, k),
            Ask::Mig {
                profile: "4g.40gb".into()
            }
        );
        assert!(matches!(
            ask(Policy::Mps, &p, layout(), 81408, k),
            Ask::Mps { count: 1, share } if share.compute_percent == 47
        ));
        // 4g gives 101 milli beyond 470: over the default waste, so Adaptive uses MPS.
        assert!(matches!(
            ask(Policy::Adaptive, &p, layout(), 81408, k),
            Ask::Mps { .. }
        ));
        // 140 fits a 1g.20gb with 2 milli to spare: MIG.
        assert_eq!(
            ask(Policy::Adaptive, &pod(1, 140), layout(), 81408, k),
            Ask::Mig {
                profile: "1g.20gb".into()
            }
        );
    }

    #[test]
    fn whole_gpu_pods_ask_whole_gpus_except_under_mps() {
        let k = Knobs::default();
        let p = pod(4, 1000);
        for policy in [
            Policy::Whole,
            Policy::MigFirstFit,
            Policy::MigTessera,
            Policy::Adaptive,
        ] {
            assert_eq!(ask(policy, &p, layout(), 81408, k), Ask::Whole { count: 4 });
        }
        assert!(matches!(
            ask(Policy::Mps, &p, layout(), 81408, k),
            Ask::Mps { count: 4, share } if share.compute_percent == 100
        ));
        assert_eq!(
            ask(Policy::Mps, &pod(0, 0), layout(), 81408, k),
            Ask::Nothing
        );
    }

    #[test]
    fn a_gpu_config_carries_the_strategy_block() {
        let c = gpu_config(3, SharingStrategy::Mps, Knobs::default());
        assert_eq!(c.mps.unwrap().max_clients, 48);
        assert!(
            gpu_config(0, SharingStrategy::Mig, Knobs::default())
                .mig
                .is_some()
        );
    }
}
