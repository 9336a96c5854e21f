//! `tessera-plugin`: parses the flags, sets up logging and runs the plugin until SIGTERM
//! or Ctrl-C; the logic lives in the library ([`tessera_plugin::run`]).

use clap::Parser;
use tessera_kit::process::{init_tracing, shutdown_signal};
use tessera_plugin::config::Args;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    init_tracing(args.log_format, "info,tessera_plugin=debug");
    tessera_plugin::run(args, shutdown_signal()).await?;
    Ok(())
}
