//! The simulated driver's `nvidia-cuda-mps-control` (see `tessera_simdriver::mps`):
//! `-f` runs the control daemon in the foreground; without arguments, commands on stdin
//! go to the running daemon.

use tessera_simdriver::{SimRoot, mps};

fn main() {
    let env = mps::Env::from_process();
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("-f") => {
            let Some(root) = std::env::current_exe()
                .ok()
                .and_then(|exe| SimRoot::of_tool(&exe))
            else {
                eprintln!(
                    "nvidia-cuda-mps-control (simulated) must run from <driver root>/usr/bin"
                );
                std::process::exit(1);
            };
            if let Err(e) = mps::daemon(&root, &env) {
                mps::log(&env, &e.to_string());
                eprintln!("{e}");
                std::process::exit(1);
            }
        }
        None => {
            let stdin = std::io::stdin();
            let code = mps::client(
                &env,
                stdin.lock(),
                &mut std::io::stdout(),
                &mut std::io::stderr(),
            );
            std::process::exit(code);
        }
        Some(other) => {
            eprintln!(
                "the simulated nvidia-cuda-mps-control takes -f or commands on stdin, not {other:?}"
            );
            std::process::exit(2);
        }
    }
}
