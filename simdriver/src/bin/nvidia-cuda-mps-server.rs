//! The simulated driver's `nvidia-cuda-mps-server`. A driver installation has it next to
//! `nvidia-cuda-mps-control`, which starts it for the clients of one user; it is not run by
//! hand. In the simulator the control daemon serves its clients itself
//! (`tessera_simdriver::mps`), so this file is there for what looks for it (the plugin's
//! DaemonSet mounts it, CDI specs name it) and refuses to run on its own.

fn main() {
    eprintln!(
        "nvidia-cuda-mps-server (simulated): the server is started by nvidia-cuda-mps-control, not run directly"
    );
    std::process::exit(1);
}
