//! MPS per-client settings: what a client of a shared GPU gets, as environment variables.
//!
//! MPS limits are per client and fixed when the client starts: the active-thread
//! percentage caps the SMs a client may use, the pinned-memory limit caps its device
//! memory (`gpu-hardware.md` §8.1). The plugin puts these into the container's CDI edits.

use serde::{Deserialize, Serialize};

/// Environment variable for the SM share.
pub const ENV_ACTIVE_THREAD_PERCENTAGE: &str = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";
/// Environment variable for the memory limit.
pub const ENV_PINNED_DEVICE_MEM_LIMIT: &str = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT";
/// Environment variable pointing clients at the control daemon's pipe directory.
pub const ENV_PIPE_DIRECTORY: &str = "CUDA_MPS_PIPE_DIRECTORY";

/// What a claim asks of a shared GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MpsRequest {
    /// Percentage of the GPU's threads (1–100); `None` = the daemon's default.
    pub compute_percent: Option<u32>,
    /// Device memory in bytes; `None` = no limit.
    pub memory_bytes: Option<u64>,
}

/// The settings for one client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MpsClientSettings {
    /// Active thread percentage, if limited.
    pub active_thread_percentage: Option<u8>,
    /// Pinned device-memory limit in MiB, if limited.
    pub pinned_memory_limit_mib: Option<u64>,
    /// The environment variables that carry these settings.
    pub env: Vec<(String, String)>,
}

/// Why a request cannot be honoured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MpsError {
    /// Percent outside 1–100.
    #[error("MPS compute share must be 1–100 %, got {0}")]
    BadPercent(u32),
    /// More memory than the GPU has, or less than 1 MiB.
    #[error("MPS memory limit of {requested_mib} MiB is outside 1..={available_mib} MiB")]
    BadMemory {
        /// Requested MiB (rounded up).
        requested_mib: u64,
        /// GPU memory in MiB.
        available_mib: u64,
    },
}

/// Computes a client's settings on a GPU with `gpu_memory_mib` of memory. `device` is the
/// device as the client sees it (`0` when the container sees one GPU, or its UUID).
/// Memory is rounded up to whole MiB, since MPS takes sizes with a unit suffix.
pub fn client_settings(
    gpu_memory_mib: u64,
    device: &str,
    request: MpsRequest,
) -> Result<MpsClientSettings, MpsError> {
    let pct = match request.compute_percent {
        Some(p @ 1..=100) => Some(u8::try_from(p).map_err(|_| MpsError::BadPercent(p))?),
        Some(p) => return Err(MpsError::BadPercent(p)),
        None => None,
    };
    let mib = match request.memory_bytes {
        Some(b) => {
            let mib = b.div_ceil(1 << 20);
            if mib == 0 || mib > gpu_memory_mib {
                return Err(MpsError::BadMemory {
                    requested_mib: mib,
                    available_mib: gpu_memory_mib,
                });
            }
            Some(mib)
        }
        None => None,
    };
    let mut env = Vec::new();
    if let Some(p) = pct {
        env.push((ENV_ACTIVE_THREAD_PERCENTAGE.to_string(), p.to_string()));
    }
    if let Some(m) = mib {
        env.push((
            ENV_PINNED_DEVICE_MEM_LIMIT.to_string(),
            format!("{device}={m}M"),
        ));
    }
    Ok(MpsClientSettings {
        active_thread_percentage: pct,
        pinned_memory_limit_mib: mib,
        env,
    })
}

/// An even split of a GPU among `clients` clients: percent and MiB per client (rounded
/// down, at least 1 % each). `None` for zero clients.
pub fn even_split(gpu_memory_mib: u64, clients: u32) -> Option<(u32, u64)> {
    (clients > 0).then(|| ((100 / clients).max(1), gpu_memory_mib / u64::from(clients)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_gets_thread_percentage_and_memory_limit_as_env() {
        let s = client_settings(
            81559,
            "0",
            MpsRequest {
                compute_percent: Some(25),
                memory_bytes: Some(8 << 30),
            },
        )
        .unwrap();
        assert_eq!(s.active_thread_percentage, Some(25));
        assert_eq!(
            s.env,
            vec![
                ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(), "25".into()),
                ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(), "0=8192M".into()),
            ]
        );
    }

    #[test]
    fn out_of_range_requests_are_refused() {
        assert_eq!(
            client_settings(
                1000,
                "0",
                MpsRequest {
                    compute_percent: Some(0),
                    memory_bytes: None
                }
            ),
            Err(MpsError::BadPercent(0))
        );
        assert!(
            client_settings(
                1000,
                "0",
                MpsRequest {
                    compute_percent: None,
                    memory_bytes: Some(2000 << 20)
                }
            )
            .is_err()
        );
    }

    #[test]
    fn an_even_split_rounds_down() {
        assert_eq!(even_split(81559, 3), Some((33, 27186)));
        assert_eq!(even_split(100, 0), None);
    }
}
