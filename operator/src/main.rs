//! `tessera-operator`: parses the flags, sets up logging and runs the operator until
//! SIGTERM or Ctrl-C; the logic lives in the library ([`tessera_operator::run`]).

use clap::Parser;
use tessera_kit::process::{init_tracing, shutdown_signal};
use tessera_operator::config::Args;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    init_tracing(args.log_format, "info,tessera_operator=debug");
    tessera_operator::run(args, shutdown_signal()).await?;
    Ok(())
}
