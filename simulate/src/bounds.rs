//! Lower bounds on the GPUs any placement needs (gpu-hardware.md §3):
//!
//! - **MIG bound**: every pod in its mapped profile (whole-GPU pods in the whole-GPU
//!   profile, one per GPU): ⌈Σ compute slices / C⌉, ⌈Σ memory slices / M⌉, and
//!   `n_whole + max(n_big, ⌈(n_half + n_big) / 2⌉)`: at most one instance of more than
//!   half the compute per GPU (4g and up, `n_big`) and at most two of half the memory
//!   (3g and 4g, `n_half` counts the 3g-like ones).
//! - **Fractional bound**: ⌈Σ shares / 1000⌉, what perfect fractional sharing needs.

use serde::Serialize;
use tessera_gpu::catalog::MigLayout;

use crate::{
    mapping::mig_profile,
    workload::{PodSpec, WHOLE_GPU_MILLI},
};

/// The bounds of a pod list on a GPU model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Bounds {
    /// GPUs whole-GPU-per-pod needs (every GPU pod rounded to whole GPUs).
    pub whole: u64,
    /// The MIG bound.
    pub mig: u64,
    /// Its compute-slice term.
    pub mig_compute: u64,
    /// Its memory-slice term.
    pub mig_memory: u64,
    /// Its large-instance term.
    pub mig_instances: u64,
    /// The fractional bound.
    pub fractional: u64,
}

/// The bounds of `pods` on `layout`.
pub fn bounds<'a>(layout: &MigLayout, pods: impl IntoIterator<Item = &'a PodSpec>) -> Bounds {
    let (c_total, m_total) = (
        u64::from(layout.compute_slices),
        u64::from(layout.memory_slices),
    );
    let (mut compute, mut memory, mut milli, mut whole) = (0u64, 0u64, 0u64, 0u64);
    let (mut n_whole, mut n_big, mut n_half) = (0u64, 0u64, 0u64);
    for p in pods {
        if p.gpus == 0 {
            continue;
        }
        milli += p.gpu_demand_milli();
        whole += u64::from(p.gpus);
        let profile = if p.is_sharing() {
            mig_profile(layout, p.gpu_milli)
        } else {
            None
        };
        let n = u64::from(p.gpus);
        match profile {
            Some(pr) if pr.memory_slices < layout.memory_slices => {
                compute += u64::from(pr.compute_slices);
                memory += u64::from(pr.memory_slices);
                if 2 * u64::from(pr.compute_slices) > c_total {
                    n_big += 1;
                } else if 2 * u64::from(pr.memory_slices) >= m_total {
                    n_half += 1;
                }
            }
            _ => {
                compute += n * c_total;
                memory += n * m_total;
                n_whole += n;
            }
        }
    }
    let mig_compute = compute.div_ceil(c_total.max(1));
    let mig_memory = memory.div_ceil(m_total.max(1));
    let mig_instances = n_whole + n_big.max((n_half + n_big).div_ceil(2));
    Bounds {
        whole,
        mig: mig_compute.max(mig_memory).max(mig_instances),
        mig_compute,
        mig_memory,
        mig_instances,
        fractional: milli.div_ceil(u64::from(WHOLE_GPU_MILLI)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_gpu::find_model;

    fn pod(gpus: u32, milli: u32) -> PodSpec {
        PodSpec {
            name: "p".into(),
            cpu_milli: 0,
            memory_mib: 0,
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
    fn two_4g_need_two_gpus_though_their_slices_fit_one_and_a_bit() {
        // 4g + 4g: 8 compute slices → 2, 8 memory slices → 1, one 4g per GPU → 2.
        let b = bounds(layout(), &[pod(1, 500), pod(1, 500)]);
        assert_eq!((b.mig_compute, b.mig_memory, b.mig_instances), (2, 1, 2));
        assert_eq!(b.mig, 2);
        assert_eq!(b.fractional, 1);
        assert_eq!(b.whole, 2);
    }

    #[test]
    fn three_3g_need_two_gpus_by_the_half_memory_rule() {
        let pods = [pod(1, 400), pod(1, 400), pod(1, 400)];
        let b = bounds(layout(), &pods);
        assert_eq!((b.mig_compute, b.mig_memory, b.mig_instances), (2, 2, 2));
        // A 4g and a 3g share a GPU: one GPU.
        let b = bounds(layout(), &[pod(1, 500), pod(1, 400)]);
        assert_eq!(b.mig, 1);
    }

    #[test]
    fn whole_gpus_and_cpu_pods_count_as_they_should() {
        let b = bounds(layout(), &[pod(8, 1000), pod(0, 0), pod(1, 100)]);
        assert_eq!(b.whole, 9);
        assert_eq!(b.mig_instances, 8);
        // 8 whole + a 1g.10gb: 57 compute slices → 9 GPUs.
        assert_eq!(b.mig, 9);
        assert_eq!(b.fractional, 9);
    }

    #[test]
    fn seven_1g_pack_into_one_gpu() {
        let pods = vec![pod(1, 100); 7];
        let b = bounds(layout(), &pods);
        assert_eq!((b.mig, b.fractional), (1, 1));
        let pods = vec![pod(1, 100); 8];
        assert_eq!(bounds(layout(), &pods).mig, 2);
    }
}
