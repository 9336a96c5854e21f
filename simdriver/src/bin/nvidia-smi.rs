//! The simulated driver's `nvidia-smi` (see `tessera_simdriver::smi`).

use tessera_simdriver::{SimRoot, smi};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(root) = std::env::current_exe()
        .ok()
        .and_then(|exe| SimRoot::of_tool(&exe))
    else {
        eprintln!("nvidia-smi (simulated) must run from <driver root>/usr/bin");
        std::process::exit(1);
    };
    if let Err(e) = smi::run(&root, &args, &mut std::io::stdout()) {
        eprintln!("{e}");
        std::process::exit(e.exit_code());
    }
}
