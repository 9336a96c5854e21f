//! A simulated NVIDIA driver, so the plugin's production NVML backend runs in every test.
//!
//! - `libnvidia-ml.so.1` (this crate's cdylib): the NVML functions the NVML backend and
//!   nvml-wrapper call, with NVML's C ABI and return codes ([`abi`]).
//! - `libcuda.so.1` (the same cdylib under CUDA's name, [`soname`]): the CUDA driver
//!   calls a probe makes, by CUDA's rules ([`cuda`]); the driver's other libraries are
//!   stubs under their names ([`libraries`]).
//! - `nvidia-smi` (`compute-policy --set-timeslice`, `--gpu-reset`, `-L`) and
//!   `nvidia-cuda-mps-control` (the control daemon and its client) ([`smi`], [`mps`]).
//! - All three are front doors to one [`SimBackend`](tessera_gpu::backend::sim::SimBackend)
//!   per node: the same hardware rules, state file and fault injection the in-process
//!   simulated backend uses, shared between processes under a file lock.
//! - Installed into a driver root ([`root`]); the plugin loads it as it loads the real
//!   driver (`--nvidia-driver-root`), and nothing in the plugin knows it is simulated.

pub mod abi;
pub mod codes;
pub mod cuda;
pub mod handles;
pub mod libraries;
pub mod mps;
pub mod profiles;
pub mod root;
pub mod smi;
pub mod soname;

pub use root::SimRoot;
