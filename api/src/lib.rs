//! Tessera's Kubernetes API (group `tessera.dev`, version `v1alpha1`).
//!
//! Two cluster-scoped custom resources:
//! - [`GpuSharingPolicy`]: how GPUs on matching nodes may be shared (written by people or GitOps).
//! - [`GpuNode`]: one per GPU node; `spec` is the per-GPU configuration the operator resolved,
//!   `status` is what the node's plugin observes on the hardware.
//!
//! This crate holds types and constants only; it never talks to a cluster. The validation a
//! bad object must fail lives in the CRD itself (CEL rules, see [`policy`]), so the API server
//! rejects it before anything is stored.

pub mod claims;
pub mod conditions;
pub mod constants;
pub mod crds;
pub mod defaults;
pub mod duration;
pub mod gpunode;
pub mod policy;
pub mod quantity;
mod schema;

pub use gpunode::{GpuNode, GpuNodeSpec, GpuNodeStatus};
pub use policy::{GpuSharingPolicy, GpuSharingPolicySpec, GpuSharingPolicyStatus};
