//! `kubectl-tessera`: thin wrapper over [`tessera_cli::run`].

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut out = std::io::stdout().lock();
    match tessera_cli::run(std::env::args_os(), &mut out) {
        Ok(()) => ExitCode::SUCCESS,
        // `kubectl tessera profiles … | head` closes the pipe early; that is not an error.
        Err(e)
            if e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
