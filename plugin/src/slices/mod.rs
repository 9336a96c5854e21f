//! What this node advertises: building the desired ResourceSlices from the GPUs, their
//! configuration and their occupancy ([`build`]), and reconciling them with the API server
//! ([`publish`]).

pub mod build;
pub mod offer;
pub mod publish;

pub use build::{DesiredPool, GpuView, build_pool, offer_device_names};
pub use offer::{GpuOffer, latent_offers, resolve_offers};
