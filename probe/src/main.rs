//! `tessera-probe`: see the crate's library.

fn main() {
    let report = tessera_probe::run(&tessera_probe::Env::from_process());
    print!("{}", report.text());
    if let Some(reason) = report.failure() {
        eprintln!("tessera-probe: FAILED: {reason}");
        std::process::exit(1);
    }
    println!("tessera-probe: OK");
}
