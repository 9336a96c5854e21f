//! Tessera's kubelet plugin for the `gpu.tessera.dev` DRA driver.
//!
//! - [`kubelet`]: the kubelet-facing gRPC layer (registration, DRA node service v1 and
//!   v1beta1, device health stream) on Unix sockets.
//! - [`slices`]: what the node advertises — counters and every allowed MIG placement in an
//!   anti-fragmentation order, MPS shares with capacity, whole GPUs — and publishing it.
//! - [`driver`]: prepare/unprepare on the hardware, made idempotent and crash-safe by the
//!   two-phase [`checkpoint`], with per-claim [`cdi`] specs.
//! - [`status`]: `GpuNode.status`; [`metrics`]: Prometheus metrics; [`node`]: the loop that
//!   keeps slices and status in step with the hardware and the operator's spec.
//! - [`state`]: what the driver and the node loop share (the GPUs, read access to the
//!   hardware and the prepared claims); [`handover`]: which instance serves the node
//!   and how a new one takes over; [`app`]: the wiring [`run`] starts.

pub mod app;
pub mod atomic_file;
pub mod binding_report;
pub mod cdi;
pub mod checkpoint;
pub mod config;
pub mod crash_points;
pub mod device_edits;
pub mod devnodes;
pub mod driver;
pub mod driver_files;
pub mod fence;
pub mod handover;
pub mod health_store;
pub mod kubelet;
pub mod latent;
pub mod metrics;
pub mod node;
pub mod offer_store;
pub use tessera_api::quantity;
pub mod ratelimit;
pub mod record_file;
pub mod slices;
pub mod state;
pub mod status;

pub use app::{Error as RunError, run};

pub use tessera_kit::error_chain;
