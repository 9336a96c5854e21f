//! The modelled cluster of one run: its nodes, the scheduler, the Adaptive planner, and
//! what they placed.

use std::collections::BTreeMap;

use serde::Serialize;
use tessera_gpu::catalog::{GpuModel, MigLayout, find_model};
use tessera_plugin::slices::build::capacity;

use crate::{
    SimError,
    adaptive::{self, GpuSeen},
    allocator::DeviceRequest,
    node::{Order, SimNode},
    policy::{Ask, Knobs, Policy, ask},
    pool::{DeviceType, Selector},
    scheduler::{PodRequest, Scheduler},
    workload::{NodeSpec, PodSpec, WHOLE_GPU_MILLI},
};

/// What every run of one invocation shares: the GPU model and the knobs.
#[derive(Clone, Debug)]
pub struct Setup {
    /// The modelled GPU.
    pub model: &'static GpuModel,
    /// Its MIG geometry.
    pub layout: &'static MigLayout,
    /// Offer and ask settings.
    pub knobs: Knobs,
    /// Memory the plugin's MPS device advertises, MiB (read from a pool the plugin built).
    pub mps_memory_mib: u64,
}

impl Setup {
    /// The setup for GPU model `model` (a catalogue key or NVML product name).
    pub fn new(model: &str, knobs: Knobs) -> Result<Self, SimError> {
        let model = find_model(model)?;
        let layout = model.mig.as_ref().ok_or_else(|| SimError::NoMig {
            model: model.id.clone(),
        })?;
        let probe = SimNode::new(
            &NodeSpec {
                name: "probe".into(),
                cpu_milli: 1,
                memory_mib: 1,
                gpus: 1,
            },
            model,
            tessera_api::policy::SharingStrategy::Mps,
            Order::Tessera,
            knobs,
        )?;
        let mps_memory_mib = probe
            .pool
            .devices
            .iter()
            .filter(|d| d.device_type == DeviceType::Mps)
            .flat_map(|d| &d.capacity)
            .find(|c| c.name == capacity::MEMORY)
            .map(|c| u64::try_from(c.value >> 20).unwrap_or(u64::MAX))
            .ok_or(SimError::NoMpsMemory)?;
        Ok(Self {
            model,
            layout,
            knobs,
            mps_memory_mib,
        })
    }

    /// What `pod` asks under `policy`.
    pub fn ask(&self, policy: Policy, pod: &PodSpec) -> Ask {
        ask(policy, pod, self.layout, self.mps_memory_mib, self.knobs)
    }
}

/// The claim request for `ask`.
pub fn device_request(ask: &Ask) -> Option<DeviceRequest> {
    let (device_type, profile, count, capacity) = match ask {
        Ask::Nothing => return None,
        Ask::Whole { count } => (DeviceType::Gpu, None, *count, vec![]),
        Ask::Mig { profile } => (DeviceType::Mig, Some(profile.clone()), 1, vec![]),
        Ask::Mps { count, share } => (
            DeviceType::Mps,
            None,
            *count,
            vec![
                (
                    capacity::COMPUTE_PERCENT.to_string(),
                    u128::from(share.compute_percent),
                ),
                (
                    capacity::MEMORY.to_string(),
                    u128::from(share.memory_mib) << 20,
                ),
            ],
        ),
    };
    Some(DeviceRequest {
        selector: Selector {
            device_type,
            profile,
        },
        count,
        capacity,
    })
}

/// Use of the cluster at a moment.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// Nodes.
    pub nodes: usize,
    /// GPUs.
    pub gpus: u64,
    /// GPUs with at least one allocation.
    pub gpus_used: u64,
    /// GPUs with none.
    pub gpus_idle: u64,
    /// Pods placed.
    pub pods_placed: u64,
    /// GPU demand of the placed pods, milli-GPU.
    pub requested_milli: u64,
    /// Compute the placed pods hold, milli-GPU (a MIG profile's compute slices, an MPS
    /// share's percent, a whole GPU).
    pub allocated_milli: u64,
}

impl Usage {
    /// Held beyond the demand (profile rounding, whole GPUs for shares), milli-GPU.
    pub fn rounding_milli(&self) -> u64 {
        self.allocated_milli.saturating_sub(self.requested_milli)
    }

    /// Free compute on GPUs that hold something, milli-GPU: the fragmentation.
    pub fn stranded_milli(&self) -> u64 {
        (self.gpus_used * u64::from(WHOLE_GPU_MILLI)).saturating_sub(self.allocated_milli)
    }
}

/// One run's cluster.
#[derive(Clone)]
pub struct Cluster<'s> {
    setup: &'s Setup,
    policy: Policy,
    /// The nodes.
    pub nodes: Vec<SimNode>,
    scheduler: Scheduler,
    placed: BTreeMap<usize, (usize, u64)>,
    requested_milli: u64,
    /// GPUs the Adaptive planner moved.
    pub moves: u64,
    /// An empty node per GPU count, built once.
    empty: BTreeMap<u32, SimNode>,
}

impl<'s> Cluster<'s> {
    /// An empty cluster for `policy`; `seed` drives the scheduler's tie-breaks.
    pub fn new(setup: &'s Setup, policy: Policy, seed: u64) -> Self {
        Self {
            setup,
            policy,
            nodes: Vec::new(),
            scheduler: Scheduler::new(seed, setup.knobs.scoring),
            placed: BTreeMap::new(),
            requested_milli: 0,
            moves: 0,
            empty: BTreeMap::new(),
        }
    }

    /// The same cluster with the scheduler's tie-breaks drawn from `seed`.
    pub fn reseeded(&self, seed: u64) -> Self {
        Self {
            scheduler: Scheduler::new(seed, self.setup.knobs.scoring),
            ..self.clone()
        }
    }

    /// Adds a node.
    pub fn add_node(&mut self, spec: &NodeSpec) -> Result<(), SimError> {
        let node = match self.empty.get(&spec.gpus) {
            Some(template) => template.like(spec),
            None => {
                let order = match self.policy {
                    Policy::MigFirstFit => Order::Canonical,
                    _ => Order::Tessera,
                };
                let node = SimNode::new(
                    spec,
                    self.setup.model,
                    self.policy.initial_strategy(),
                    order,
                    self.setup.knobs,
                )?;
                self.empty.insert(spec.gpus, node.clone());
                node
            }
        };
        self.nodes.push(node);
        Ok(())
    }

    /// Schedules pod `id` now; `Ok(false)` when it fits nowhere (after the Adaptive
    /// planner had its say).
    pub fn place(&mut self, id: usize, pod: &PodSpec) -> Result<bool, SimError> {
        let ask = self.setup.ask(self.policy, pod);
        let request = device_request(&ask);
        let pr = PodRequest {
            cpu_milli: pod.cpu_milli,
            memory_mib: pod.memory_mib,
            claim: request.as_ref(),
        };
        let mut decision = self.scheduler.schedule(&self.nodes, &pr);
        if decision.is_none()
            && self.policy.adapts()
            && let Some(wanted) = ask.strategy()
            && self.adapt(wanted, pod)?
        {
            decision = self.scheduler.schedule(&self.nodes, &pr);
        }
        let Some(d) = decision else {
            return Ok(false);
        };
        self.nodes[d.node].commit(id, pod.cpu_milli, pod.memory_mib, &d.devices)?;
        self.placed.insert(id, (d.node, pod.gpu_demand_milli()));
        self.requested_milli += pod.gpu_demand_milli();
        Ok(true)
    }

    /// Removes pod `id` (it left).
    pub fn remove(&mut self, id: usize) -> Result<(), SimError> {
        if let Some((node, milli)) = self.placed.remove(&id) {
            self.nodes[node].release(id)?;
            self.requested_milli -= milli;
        }
        Ok(())
    }

    /// Whether pod `id` is placed.
    pub fn is_placed(&self, id: usize) -> bool {
        self.placed.contains_key(&id)
    }

    fn adapt(
        &mut self,
        wanted: tessera_api::policy::SharingStrategy,
        pod: &PodSpec,
    ) -> Result<bool, SimError> {
        let mut seen = Vec::new();
        // The operator lists governed GPUs as `node/index`, node names in order, and its
        // planner looks only at nodes where the waiting pod could run
        // (`tessera_operator::room`; the trace has CPU and memory).
        let mut order: Vec<usize> = (0..self.nodes.len())
            .filter(|n| self.nodes[*n].fits(pod.cpu_milli, pod.memory_mib))
            .collect();
        order.sort_by(|a, b| self.nodes[*a].name.cmp(&self.nodes[*b].name));
        for n in order {
            let node = &self.nodes[n];
            for gpu in 0..node.gpu_count() {
                if let Some(strategy) = node.strategy(gpu) {
                    seen.push(GpuSeen {
                        node: n,
                        gpu,
                        strategy,
                        idle: !node.gpu_busy(gpu),
                    });
                }
            }
        }
        let Some(change) = adaptive::plan(&seen, wanted, &Policy::ADAPTIVE_STRATEGIES) else {
            return Ok(false);
        };
        self.nodes[change.node].set_strategy(change.gpu, wanted)?;
        self.moves += 1;
        Ok(true)
    }

    /// GPUs holding at least one device now.
    pub fn gpus_used(&self) -> u64 {
        self.nodes.iter().map(SimNode::gpus_used).sum()
    }

    /// The cluster's use now.
    pub fn usage(&self) -> Usage {
        let mut u = Usage {
            nodes: self.nodes.len(),
            pods_placed: self.placed.len() as u64,
            requested_milli: self.requested_milli,
            ..Usage::default()
        };
        for n in &self.nodes {
            for held in n.gpu_milli_held() {
                u.gpus += 1;
                if held > 0 {
                    u.gpus_used += 1;
                }
                u.allocated_milli += u64::from(held);
            }
        }
        u.gpus_idle = u.gpus - u.gpus_used;
        u
    }
}
