//! The simulated driver's `nvidia-smi`: the commands the plugin runs, on the same
//! hardware the library drives.
//!
//! - `compute-policy -i <gpu> --set-timeslice=<0-3>` (NVML has no call for it)
//! - `--gpu-reset -i <gpu>` / `-r -i <gpu>` (nor for this)
//! - `-L`: the GPUs, for a person looking at a simulated node
//!
//! Anything else is refused with exit status 2, so a new command the plugin starts to
//! run fails loudly in tests instead of passing unnoticed.

use std::io::Write;

use tessera_gpu::backend::{BackendError, GpuBackend, TimeSlice, chain};

use crate::root::SimRoot;

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum SmiError {
    /// Arguments the simulated `nvidia-smi` does not take.
    #[error("{0}")]
    Usage(String),
    /// The hardware refused.
    #[error("{}", chain(.0))]
    Backend(#[source] BackendError),
    /// Writing the output failed.
    #[error("writing the output")]
    Output(#[source] std::io::Error),
}

impl SmiError {
    /// The exit status, as the real tool's: 2 for bad arguments, 1 for a refusal.
    pub fn exit_code(&self) -> i32 {
        match self {
            SmiError::Usage(_) => 2,
            _ => 1,
        }
    }
}

/// What the arguments ask for.
#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    /// `-L`.
    List,
    /// `compute-policy -i N --set-timeslice=L`.
    SetTimeSlice {
        /// GPU index.
        gpu: u32,
        /// Length.
        slice: TimeSlice,
    },
    /// `--gpu-reset -i N`.
    Reset {
        /// GPU index.
        gpu: u32,
    },
}

fn gpu_arg(args: &[String]) -> Result<u32, SmiError> {
    let pos = args
        .iter()
        .position(|a| a == "-i" || a == "--id")
        .ok_or_else(|| SmiError::Usage("-i <gpu index> is required".into()))?;
    args.get(pos + 1)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| SmiError::Usage("-i takes a GPU index".into()))
}

/// Parses the arguments (without the program name).
pub fn parse(args: &[String]) -> Result<Command, SmiError> {
    let has = |flag: &str| args.iter().any(|a| a == flag);
    if has("-L") || has("--list-gpus") {
        return Ok(Command::List);
    }
    if has("-r") || has("--gpu-reset") {
        return Ok(Command::Reset {
            gpu: gpu_arg(args)?,
        });
    }
    if args.first().map(String::as_str) == Some("compute-policy") {
        let level = args
            .iter()
            .enumerate()
            .find_map(|(i, a)| {
                a.strip_prefix("--set-timeslice=")
                    .map(str::to_string)
                    .or_else(|| (a == "--set-timeslice").then(|| args.get(i + 1).cloned())?)
            })
            .ok_or_else(|| SmiError::Usage("compute-policy needs --set-timeslice".into()))?;
        let slice = match level.as_str() {
            "0" => TimeSlice::Default,
            "1" => TimeSlice::Short,
            "2" => TimeSlice::Medium,
            "3" => TimeSlice::Long,
            other => {
                return Err(SmiError::Usage(format!(
                    "--set-timeslice takes 0-3, not {other:?}"
                )));
            }
        };
        return Ok(Command::SetTimeSlice {
            gpu: gpu_arg(args)?,
            slice,
        });
    }
    Err(SmiError::Usage(format!(
        "the simulated driver's nvidia-smi does not implement `{}`",
        args.join(" ")
    )))
}

/// Runs `args` against the hardware of `root`, printing to `out`.
pub fn run(root: &SimRoot, args: &[String], out: &mut impl Write) -> Result<(), SmiError> {
    let command = parse(args)?;
    let sim = root.open().map_err(SmiError::Backend)?;
    match command {
        Command::List => {
            for g in sim.gpus().map_err(SmiError::Backend)? {
                writeln!(
                    out,
                    "GPU {}: {} (UUID: {})",
                    g.index, g.product_name, g.uuid
                )
                .map_err(SmiError::Output)?;
            }
        }
        Command::SetTimeSlice { gpu, slice } => {
            sim.set_time_slice(gpu, slice).map_err(SmiError::Backend)?;
            writeln!(out, "Set timeslice to {} for GPU {gpu}.", slice.level())
                .map_err(SmiError::Output)?;
        }
        Command::Reset { gpu } => {
            sim.reset_gpu(gpu).map_err(SmiError::Backend)?;
            writeln!(out, "GPU {gpu} was successfully reset.").map_err(SmiError::Output)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split(' ').map(str::to_string).collect()
    }

    #[test]
    fn the_commands_the_plugin_runs_are_understood() {
        assert_eq!(
            parse(&args("compute-policy -i 1 --set-timeslice=3")).expect("parses"),
            Command::SetTimeSlice {
                gpu: 1,
                slice: TimeSlice::Long
            }
        );
        assert_eq!(
            parse(&args("--gpu-reset -i 0")).expect("parses"),
            Command::Reset { gpu: 0 }
        );
        assert_eq!(parse(&args("-L")).expect("parses"), Command::List);
    }

    #[test]
    fn anything_else_is_refused_with_usage_status() {
        for bad in [
            "-q",
            "compute-policy -i 0",
            "compute-policy -i x --set-timeslice=1",
            "compute-policy -i 0 --set-timeslice=9",
        ] {
            let err = parse(&args(bad)).expect_err(bad);
            assert_eq!(err.exit_code(), 2, "{bad}: {err}");
        }
    }
}
