//! `tessera-cdi-hook`: see the crate's library.

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let code = match tessera_cdi_hook::run(&args, std::io::stdin().lock()) {
        Ok(()) => 0,
        Err(e) => {
            // The runtime shows a failed hook's stderr in the container's error.
            eprintln!("tessera-cdi-hook: {}", tessera_cdi_hook::error_chain(&e));
            1
        }
    };
    std::process::exit(code);
}
