//! What the simulator replays: pods and the nodes they run on, as the inputs describe them
//! (no GPU model here; the modelled GPU is a choice of the run).

use serde::Serialize;

/// Milli-GPU of a whole GPU.
pub const WHOLE_GPU_MILLI: u32 = 1000;

/// One pod of a workload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    /// Name, for reports and errors.
    pub name: String,
    /// CPU request in millicores.
    pub cpu_milli: u64,
    /// Memory request in MiB.
    pub memory_mib: u64,
    /// GPUs asked for (0: a CPU-only pod).
    pub gpus: u32,
    /// Share of each GPU in milli-GPU (1000: the whole GPU); 0 for CPU-only pods.
    pub gpu_milli: u32,
    /// Arrival time in seconds.
    pub arrival: u64,
    /// Departure time in seconds, when the input has one.
    pub departure: Option<u64>,
}

impl PodSpec {
    /// Whether the pod shares a GPU (asks for less than one whole GPU).
    pub fn is_sharing(&self) -> bool {
        self.gpus == 1 && self.gpu_milli < WHOLE_GPU_MILLI
    }

    /// GPU demand in milli-GPU (what the FGD allocation ratio counts).
    pub fn gpu_demand_milli(&self) -> u64 {
        u64::from(self.gpus) * u64::from(self.gpu_milli)
    }
}

/// One node of a workload's cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSpec {
    /// Name.
    pub name: String,
    /// Allocatable CPU in millicores.
    pub cpu_milli: u64,
    /// Allocatable memory in MiB.
    pub memory_mib: u64,
    /// GPUs on the node (all of the modelled GPU model).
    pub gpus: u32,
}

/// A workload: pods in arrival order and the cluster's nodes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Workload {
    /// Pods, in the order they arrive.
    pub pods: Vec<PodSpec>,
    /// Nodes.
    pub nodes: Vec<NodeSpec>,
}
