//! Compiles `proto/` into tonic servers and clients.
//!
//! protox parses the files in pure Rust and hands tonic-prost-build a
//! `FileDescriptorSet`, so no system `protoc` is needed. Each proto package becomes
//! `$OUT_DIR/<package>.rs`; `src/kubelet/proto.rs` includes them into separate modules
//! because the health packages are the bare `v1` and `v1alpha1`.

use std::error::Error;

const PROTOS: &[&str] = &[
    "proto/pluginregistration/v1/api.proto",
    "proto/dra/v1/api.proto",
    "proto/dra/v1beta1/api.proto",
    "proto/dra-health/v1alpha1/api.proto",
    "proto/dra-health/v1/api.proto",
];

fn main() -> Result<(), Box<dyn Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(PROTOS, ["proto"])?;
    // Both sides: the plugin serves; tests and the bench call it directly as clients.
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
