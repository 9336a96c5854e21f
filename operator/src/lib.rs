//! Tessera's operator: the cluster-wide half of Tessera.
//!
//! - [`selector`]: Kubernetes label selectors, and which GPUs a policy's `gpuSelector`
//!   picks.
//! - [`resolve`]: which policy governs each GPU and the `GpuNode.spec` that follows (pure
//!   functions of a [`resolve::Snapshot`]); [`static_plan`]: the placements of a static
//!   MIG layout; [`policy_status`]: what each policy's status says; [`usage`]: what its
//!   GPUs publish and what claims hold; [`events`]: which decisions become events.
//! - [`room`]: whether a waiting pod could run on a node, devices aside.
//! - [`runtime`]: the watch caches ([`watch`]) and the loop whose pass reads as observe →
//!   plan → apply → report ([`spec_writes`]: the spec writes it waits to see echoed;
//!   [`leadership`]: whether this replica may write); [`app`]: the
//!   wiring [`run`] starts; [`config`], [`metrics`].

pub mod adaptive;
pub mod app;
pub mod batch;
pub mod config;
pub mod demand;
pub mod events;
pub mod free;
pub mod latent;
pub mod leadership;
pub mod metrics;
pub mod policy_status;
pub mod resolve;
pub mod room;
pub mod runtime;
pub mod selector;
pub mod spec_writes;
pub mod static_plan;
pub mod transitions;
pub mod usage;
pub mod watch;

pub use app::{Error as RunError, run};
