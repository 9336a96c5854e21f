//! Tessera's GPU hardware model.
//!
//! Everything the plugin, operator and simulator need to know about a GPU: the catalogue
//! of models and MIG profiles ([`catalog`](mod@catalog)), per-GPU occupancy and placement rules
//! ([`geometry`]), the DRA counter scheme that mirrors those rules exactly ([`counters`]),
//! ResourceSlice device names ([`naming`]), the placement order that fights
//! fragmentation ([`order`]), MPS client settings ([`mps`]) and the [`backend::GpuBackend`]
//! trait with its NVML and simulated implementations. No Kubernetes client here.

pub mod backend;
pub mod catalog;
pub mod counters;
pub mod geometry;
pub mod mps;
pub mod naming;
pub mod order;

pub use catalog::{Architecture, GpuModel, MigLayout, MigProfile, StartSet, catalog, find_model};
pub use geometry::{Occupancy, Placement, PlacementError};
