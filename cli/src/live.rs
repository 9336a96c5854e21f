//! What the commands that read a live cluster share: the client, a runtime of their own
//! (the CLI is synchronous), and printing a view as a table or as JSON.

use std::{future::Future, io::Write, path::Path};

use anyhow::Context;
use serde::Serialize;

use crate::Output;

/// A client from `kubeconfig`, else as kubectl finds one (`KUBECONFIG`, `~/.kube/config`,
/// in-cluster).
pub async fn client(kubeconfig: Option<&Path>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?
        }
        None => kube::Config::infer()
            .await
            .context("finding a kubeconfig (set KUBECONFIG or --kubeconfig)")?,
    };
    Ok(kube::Client::try_from(config)?)
}

/// Runs `read` to completion on a runtime of its own.
pub fn block_on<T>(read: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?
        .block_on(read)
}

/// Prints `view` as pretty JSON, or as `table` draws it.
pub fn print<T: Serialize>(
    out: &mut dyn Write,
    output: Output,
    view: &T,
    table: impl FnOnce(&mut dyn Write, &T) -> std::io::Result<()>,
) -> anyhow::Result<()> {
    match output {
        Output::Json => {
            serde_json::to_writer_pretty(&mut *out, view)?;
            writeln!(out)?;
        }
        Output::Table => table(out, view)?,
    }
    Ok(())
}
