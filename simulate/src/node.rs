//! One modelled node: its GPUs and their configuration, what the plugin publishes for
//! them (through the plugin's own [`resolve_offers`] and [`build_pool`]), and the
//! allocations the scheduler made there.
//!
//! The plugin republishes after a prepare changes the hardware (a MIG instance created or
//! destroyed) or the operator changes a GPU's strategy; the model republishes at exactly
//! those moments and before the next pod is scheduled (the real plugin does so within its
//! node loop's period: a pod scheduled in between sees the older order).

use std::collections::BTreeMap;

use tessera_api::{gpunode::GpuNodeSpec, policy::SharingStrategy};
use tessera_gpu::{
    Occupancy, Placement,
    backend::GpuInfo,
    catalog::{GpuModel, MigLayout},
    order,
};
use tessera_plugin::{
    config::DefaultStrategy,
    slices::{GpuView, build_pool, resolve_offers},
};

use crate::{
    allocator::{AllocatedState, Chosen, DeviceRequest, allocate},
    policy::{Knobs, gpu_config},
    pool::{self, DeviceType, Pool, PoolError},
    workload::NodeSpec,
};

/// Pods a node takes: the kubelet's `--max-pods` default, which the node reports as
/// its allocatable `pods`.
pub const MAX_PODS: usize = 110;

/// Which order the node's devices are published in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// The plugin's own order.
    Tessera,
    /// NVIDIA's canonical name order (the first-fit baseline).
    Canonical,
}

/// A device a pod holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// Device name.
    pub device: String,
    /// GPU index.
    pub gpu: u32,
    /// Device type.
    pub device_type: DeviceType,
    /// Compute it gives the pod in milli-GPU.
    pub milli: u32,
    /// MIG instance tag in the occupancy, for MIG devices.
    pub instance: Option<(Placement, u32)>,
    /// (capacity name, consumed) for shared devices.
    pub consumed: Vec<(String, u128)>,
}

/// A modelled node.
#[derive(Clone, Debug)]
pub struct SimNode {
    /// Node name (= the pool name).
    pub name: String,
    /// Allocatable CPU, millicores.
    pub cpu_milli: u64,
    /// Allocatable memory, MiB.
    pub memory_mib: u64,
    /// Requested CPU of the pods on it.
    pub cpu_used: u64,
    /// Requested memory of the pods on it, MiB.
    pub memory_used: u64,
    /// CPU of the pods on it as NodeResourcesFit's scorer counts it (`NonZeroRequested`).
    pub cpu_scored: u64,
    /// Memory of the pods on it as NodeResourcesFit's scorer counts it, bytes.
    pub memory_scored_bytes: u64,
    gpus: Vec<GpuInfo>,
    layout: Option<&'static MigLayout>,
    spec: GpuNodeSpec,
    occupancy: Vec<Occupancy>,
    next_tag: u32,
    order: Order,
    knobs: Knobs,
    /// The published pool.
    pub pool: Pool,
    /// Each GPU's part of it, as built alone.
    parts: Vec<Pool>,
    /// What the allocations hold of it.
    pub state: AllocatedState,
    /// Pod id → devices held.
    pub held: BTreeMap<usize, Vec<Held>>,
    /// Pod id → (cpu, memory) requested.
    requests: BTreeMap<usize, (u64, u64)>,
    /// Devices held on each GPU.
    holds: Vec<u32>,
}

impl SimNode {
    /// A node of `spec` with GPUs of `model`, each in `strategy`.
    pub fn new(
        spec: &NodeSpec,
        model: &'static GpuModel,
        strategy: SharingStrategy,
        order: Order,
        knobs: Knobs,
    ) -> Result<Self, PoolError> {
        let gpus: Vec<GpuInfo> = (0..spec.gpus)
            .map(|i| GpuInfo {
                // Hopper and newer switch MIG mode on an idle GPU at prepare time; the
                // model's GPUs start with MIG on, so A100s too offer partitions.
                mig_enabled: model.mig.is_some(),
                mig_pending: model.mig.is_some(),
                ..GpuInfo::from_model(model, i)
            })
            .collect();
        let spec_gpus = (0..spec.gpus)
            .map(|i| gpu_config(i, strategy, knobs))
            .collect();
        let mut node = Self {
            name: spec.name.clone(),
            cpu_milli: spec.cpu_milli,
            memory_mib: spec.memory_mib,
            cpu_used: 0,
            memory_used: 0,
            cpu_scored: 0,
            memory_scored_bytes: 0,
            occupancy: vec![Occupancy::new(); gpus.len()],
            gpus,
            layout: model.mig.as_ref(),
            spec: GpuNodeSpec { gpus: spec_gpus },
            next_tag: 0,
            order,
            knobs,
            pool: Pool::default(),
            parts: Vec::new(),
            state: AllocatedState::default(),
            held: BTreeMap::new(),
            requests: BTreeMap::new(),
            holds: vec![0; spec.gpus as usize],
        };
        node.republish()?;
        Ok(node)
    }

    /// An empty node like this one (which must be empty) with the name and resources of
    /// `spec`: the same GPUs publish the same devices on any node, so a cluster builds
    /// each node shape once.
    pub fn like(&self, spec: &NodeSpec) -> Self {
        Self {
            name: spec.name.clone(),
            cpu_milli: spec.cpu_milli,
            memory_mib: spec.memory_mib,
            ..self.clone()
        }
    }

    /// The `GpuNode.spec` the node's GPUs run (what the operator would write for it).
    pub fn gpu_node_spec(&self) -> &GpuNodeSpec {
        &self.spec
    }

    /// Number of GPUs.
    pub fn gpu_count(&self) -> u32 {
        u32::try_from(self.gpus.len()).unwrap_or(u32::MAX)
    }

    /// The strategy GPU `index` is in.
    pub fn strategy(&self, index: u32) -> Option<SharingStrategy> {
        self.spec
            .gpus
            .iter()
            .find(|g| g.index == index)
            .map(|g| g.strategy)
    }

    /// Whether any pod holds a device of GPU `index`.
    pub fn gpu_busy(&self, index: u32) -> bool {
        self.holds.get(index as usize).is_some_and(|n| *n > 0)
    }

    /// Moves GPU `index` to `strategy` (the operator's spec change) and republishes.
    pub fn set_strategy(&mut self, index: u32, strategy: SharingStrategy) -> Result<(), PoolError> {
        if let Some(g) = self.spec.gpus.iter_mut().find(|g| g.index == index) {
            *g = gpu_config(index, strategy, self.knobs);
        }
        let pos = self.gpus.iter().position(|g| g.index == index);
        self.republish_gpu(pos)
    }

    /// The plugin's pool of GPU `gpu` alone, in the order it publishes it (or the
    /// baseline order).
    fn build_part(&self, gpu: usize) -> Result<Pool, PoolError> {
        let layout = self.layout;
        let info = std::slice::from_ref(&self.gpus[gpu]);
        let (offers, _warnings) = resolve_offers(
            info,
            |_| layout,
            Some(&self.spec),
            DefaultStrategy::Exclusive,
        );
        let blocked = Occupancy::new();
        let view = GpuView {
            info: &info[0],
            layout,
            offer: &offers[0],
            occupancy: &self.occupancy[gpu],
            blocked: &blocked,
            // The simulator models the reactive planner; latent devices come last and
            // are never taken where a ready device fits.
            latent: &[],
        };
        let mut part = pool::compile(&build_pool(&[view], None), layout)?;
        if self.order == Order::Canonical {
            pool::canonical_order(&mut part);
        }
        Ok(part)
    }

    /// Rebuilds what the plugin publishes for GPU `gpu` (every GPU when `None`), then the
    /// node's pool and what the allocations hold of it.
    ///
    /// `build_pool` builds each GPU's devices and counter set from that GPU alone and
    /// lays the GPUs out in `order::gpu_order`; building one GPU at a time and laying the
    /// parts out with the same `gpu_order` gives the same pool (a test checks it) at a
    /// fraction of the cost, which is what keeps a trace of thousands of MIG pods fast.
    fn republish_gpu(&mut self, gpu: Option<usize>) -> Result<(), PoolError> {
        match gpu {
            Some(g) => self.parts[g] = self.build_part(g)?,
            None => {
                self.parts = (0..self.gpus.len())
                    .map(|g| self.build_part(g))
                    .collect::<Result<_, _>>()?;
            }
        }
        let positions: Vec<usize> = match self.order {
            Order::Tessera => self.tessera_positions(),
            Order::Canonical => (0..self.gpus.len()).collect(),
        };
        let mut devices = Vec::new();
        let mut counters = Vec::new();
        let mut counter_names = Vec::new();
        for p in positions {
            let part = &self.parts[p];
            let offset = counters.len();
            counters.extend_from_slice(&part.counters);
            counter_names.extend_from_slice(&part.counter_names);
            devices.extend(part.devices.iter().map(|d| {
                let mut d = d.clone();
                for (c, _) in &mut d.consumes {
                    if *c != usize::MAX {
                        *c += offset;
                    }
                }
                d
            }));
        }
        self.pool = Pool::new(devices, counters);
        self.pool.counter_names = counter_names;
        self.recompute_state();
        Ok(())
    }

    /// Positions of the GPUs in the plugin's order (`order::gpu_order`, most used first).
    fn tessera_positions(&self) -> Vec<usize> {
        let occ: Vec<(u32, &Occupancy)> = self
            .gpus
            .iter()
            .zip(&self.occupancy)
            .map(|(g, o)| (g.index, o))
            .collect();
        order::gpu_order(&occ)
            .into_iter()
            .filter_map(|i| self.gpus.iter().position(|g| g.index == i))
            .collect()
    }

    fn republish(&mut self) -> Result<(), PoolError> {
        self.republish_gpu(None)
    }

    /// The pool `build_pool` gives for the whole node in one call (what the plugin runs).
    #[cfg(test)]
    pub(crate) fn pool_in_one_build(&self) -> Result<Pool, PoolError> {
        let layout = self.layout;
        let (offers, _) = resolve_offers(
            &self.gpus,
            |_| layout,
            Some(&self.spec),
            DefaultStrategy::Exclusive,
        );
        let blocked = Occupancy::new();
        let views: Vec<GpuView<'_>> = self
            .gpus
            .iter()
            .zip(&offers)
            .zip(&self.occupancy)
            .map(|((info, offer), occupancy)| GpuView {
                info,
                layout,
                offer,
                occupancy,
                blocked: &blocked,
                latent: &[],
            })
            .collect();
        let mut pool = pool::compile(&build_pool(&views, None), layout)?;
        if self.order == Order::Canonical {
            pool::canonical_order(&mut pool);
        }
        Ok(pool)
    }

    fn recompute_state(&mut self) {
        let mut state = AllocatedState::empty(&self.pool);
        for h in self.held.values().flatten() {
            let Some(i) = self.pool.position(&h.device) else {
                continue;
            };
            let consumed = self.pool.devices[i]
                .capacity
                .iter()
                .map(|c| {
                    h.consumed
                        .iter()
                        .find(|(n, _)| *n == c.name)
                        .map_or(0, |(_, v)| *v)
                })
                .collect();
            state.add(
                &self.pool,
                &Chosen {
                    device: i,
                    consumed,
                },
            );
        }
        self.state = state;
    }

    /// Whether the node holds one more pod of `cpu` and `memory` (NodeResourcesFit's
    /// filter, `noderesources/fit.go` `fitsRequest`: the pod count, then each resource).
    pub fn fits(&self, cpu: u64, memory: u64) -> bool {
        self.requests.len() < MAX_PODS
            && self.cpu_used + cpu <= self.cpu_milli
            && self.memory_used + memory <= self.memory_mib
    }

    /// The allocator's answer for `request` on this node.
    pub fn try_allocate(&self, request: &DeviceRequest) -> Option<Vec<Chosen>> {
        allocate(&self.pool, &self.state, request)
    }

    /// Records pod `pod` on this node with `chosen` devices; republishes when a MIG
    /// instance was created.
    pub fn commit(
        &mut self,
        pod: usize,
        cpu: u64,
        memory: u64,
        chosen: &[Chosen],
    ) -> Result<(), PoolError> {
        let mut held = Vec::with_capacity(chosen.len());
        let mut created: Option<usize> = None;
        for c in chosen {
            let d = &self.pool.devices[c.device];
            let mut instance = None;
            if let (Some(pl), Some(layout)) = (d.placement, self.layout)
                && let Some(occ) = self.occupancy.get_mut(d.gpu as usize)
            {
                let tag = self.next_tag;
                self.next_tag += 1;
                // The counters accepted it, so the geometry does (gpu/src/counters.rs
                // proves the two agree); a refusal here would be a bug in that proof.
                if occ.place(layout, pl, tag).is_ok() {
                    instance = Some((pl, tag));
                    created = Some(d.gpu as usize);
                }
            }
            let consumed: Vec<(String, u128)> = d
                .capacity
                .iter()
                .zip(&c.consumed)
                .map(|(cap, v)| (cap.name.clone(), *v))
                .collect();
            held.push(Held {
                device: d.name.clone(),
                gpu: d.gpu,
                device_type: d.device_type,
                milli: given_milli(d, &consumed, self.layout),
                instance,
                consumed,
            });
            self.state.add(&self.pool, c);
        }
        self.cpu_used += cpu;
        self.memory_used += memory;
        let (scored_cpu, scored_memory) = non_zero_requests(cpu, memory);
        self.cpu_scored += scored_cpu;
        self.memory_scored_bytes += scored_memory;
        for h in &held {
            if let Some(n) = self.holds.get_mut(h.gpu as usize) {
                *n += 1;
            }
        }
        self.held.insert(pod, held);
        self.requests.insert(pod, (cpu, memory));
        if let Some(gpu) = created
            && self.order == Order::Tessera
        {
            self.republish_gpu(Some(gpu))?;
        }
        Ok(())
    }

    /// Removes pod `pod` (it left); destroys its MIG instances and republishes.
    pub fn release(&mut self, pod: usize) -> Result<(), PoolError> {
        let Some(held) = self.held.remove(&pod) else {
            return Ok(());
        };
        for h in &held {
            if let Some(n) = self.holds.get_mut(h.gpu as usize) {
                *n -= 1;
            }
        }
        if let Some((cpu, memory)) = self.requests.remove(&pod) {
            self.cpu_used -= cpu;
            self.memory_used -= memory;
            let (scored_cpu, scored_memory) = non_zero_requests(cpu, memory);
            self.cpu_scored -= scored_cpu;
            self.memory_scored_bytes -= scored_memory;
        }
        let mut freed = None;
        for h in &held {
            if let (Some((_, tag)), Some(occ), Some(layout)) = (
                h.instance,
                self.occupancy.get_mut(h.gpu as usize),
                self.layout,
            ) {
                // The tag was placed by `commit`; freeing it cannot fail.
                let _ = occ.free(layout, tag);
                freed = Some(h.gpu as usize);
            }
        }
        match freed {
            Some(gpu) if self.order == Order::Tessera => self.republish_gpu(Some(gpu)),
            _ => {
                self.recompute_state();
                Ok(())
            }
        }
    }

    /// GPUs holding at least one device.
    pub fn gpus_used(&self) -> u64 {
        self.holds.iter().filter(|n| **n > 0).count() as u64
    }

    /// Milli-GPU held on each GPU.
    pub fn gpu_milli_held(&self) -> Vec<u32> {
        let mut out = vec![0u32; self.gpus.len()];
        for h in self.held.values().flatten() {
            if let Some(v) = out.get_mut(h.gpu as usize) {
                *v += h.milli;
            }
        }
        out
    }
}

/// Compute a device gives its holder, in milli-GPU.
fn given_milli(
    d: &pool::PoolDevice,
    consumed: &[(String, u128)],
    layout: Option<&MigLayout>,
) -> u32 {
    match d.device_type {
        DeviceType::Mig => layout.map_or(0, |l| {
            u32::from(d.compute_slices) * crate::workload::WHOLE_GPU_MILLI
                / u32::from(l.compute_slices.max(1))
        }),
        DeviceType::Mps => consumed
            .iter()
            .find(|(n, _)| n == tessera_plugin::slices::build::capacity::COMPUTE_PERCENT)
            .map_or(0, |(_, v)| u32::try_from(*v * 10).unwrap_or(u32::MAX)),
        DeviceType::Gpu | DeviceType::TimeSlice => crate::workload::WHOLE_GPU_MILLI,
    }
}

/// Requests NodeResourcesFit's scorer counts for a container that asks none
/// (`schedutil.DefaultMilliCPURequest`, `DefaultMemoryRequest`: "200 MB", which
/// `pkg/scheduler/util/pod_resources.go` defines as 200 × 1024 × 1024 bytes).
const DEFAULT_CPU_MILLI: u64 = 100;
const DEFAULT_MEMORY_BYTES: u64 = 200 * 1024 * 1024;
const MIB: u64 = 1 << 20;

/// What NodeResourcesFit's scorer counts of a one-container pod requesting `cpu_milli`
/// and `memory_mib` (`NonMissingContainerRequests`): (millicores, bytes).
pub fn non_zero_requests(cpu_milli: u64, memory_mib: u64) -> (u64, u64) {
    (
        if cpu_milli == 0 {
            DEFAULT_CPU_MILLI
        } else {
            cpu_milli
        },
        if memory_mib == 0 {
            DEFAULT_MEMORY_BYTES
        } else {
            memory_mib * MIB
        },
    )
}

#[cfg(test)]
mod tests;
