//! The trace simulator behind `kubectl tessera simulate`.
//!
//! It replays a workload against a modelled cluster and reports, per sharing policy and
//! side by side, pods placed, GPUs used and idle, and fragmentation. It is not a second
//! Tessera: what each GPU offers and in which order comes from the plugin's own code
//! ([`tessera_plugin::slices::resolve_offers`], [`tessera_plugin::slices::build_pool`],
//! which use `tessera-gpu`'s counters, placements and ordering); only the scheduler side
//! is a model, of kube-scheduler's node choice ([`scheduler`]) and DRA structured
//! allocator ([`allocator`]), each citing the upstream source it follows.
//!
//! - [`workload`], [`input`]: pods and nodes, and the openb and CSV parsers;
//! - [`mapping`], [`policy`]: from a trace's GPU share to a claim, per policy;
//! - [`pool`], [`node`], [`cluster`], [`adaptive`]: the modelled nodes and cluster;
//! - [`bounds`], [`measure`], [`report`], [`chart`]: lower bounds, the measures, output.
//!
//! Pure: no files, no terminal. The CLI reads the inputs and writes the outputs.

pub mod adaptive;
pub mod allocator;
pub mod bounds;
pub mod chart;
pub mod cluster;
pub mod input;
pub mod mapping;
pub mod measure;
pub mod node;
pub mod policy;
pub mod pool;
pub mod report;
pub mod rng;
pub mod scheduler;
pub mod workload;

pub use input::InputError;
pub use pool::PoolError;

/// Why a simulation could not run.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The GPU model is unknown.
    #[error("GPU model of the modelled nodes")]
    Model(#[from] tessera_gpu::catalog::UnknownModel),
    /// The GPU model has no MIG.
    #[error("GPU model {model} has no MIG; the comparison needs a MIG-capable model")]
    NoMig {
        /// The model.
        model: String,
    },
    /// The plugin published no MPS memory capacity (a change in the plugin the model
    /// must follow).
    #[error("the plugin's MPS device carries no memory capacity")]
    NoMpsMemory,
    /// The plugin's pool could not be read.
    #[error("reading the plugin's pool")]
    Pool(#[from] PoolError),
    /// The workload has no node with GPUs.
    #[error("the workload has no node with GPUs to model the cluster on")]
    NoGpuNodes,
    /// A measure needs pods and nodes.
    #[error("the workload has no pods or no nodes")]
    EmptyWorkload,
}
