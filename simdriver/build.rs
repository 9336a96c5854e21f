//! Gives the NVML cdylib the SONAME the real library has (`libnvidia-ml.so.1`; a Rust
//! cdylib has none by default), and builds the stub shared object the simulated driver
//! installs under the names of its other libraries (see `src/libraries.rs`).

use std::{env, path::PathBuf};

/// The stub's own name: longer than every name it is installed under, which replaces it
/// in place (`src/soname.rs`).
const STUB_SONAME: &str = "libtessera-simdriver-stub.so.placeholder-for-the-installed-name";

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
    println!("cargo:rerun-if-changed=build.rs");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let src = out.join("stub.c");
    std::fs::write(
        &src,
        "/* A driver library of the simulated NVIDIA driver: a real shared object with the\n   library's SONAME and no code anyone calls. */\nint tessera_simdriver_stub;\n",
    )
    .expect("writing stub.c");
    let lib = out.join("libstub.so");
    // The C compiler cargo links with (cc, or $CC), as the `cc` crate finds it.
    let compiler = cc::Build::new().cargo_metadata(false).get_compiler();
    let status = compiler
        .to_command()
        .args(["-shared", "-fPIC", "-nostdlib", "-Wl,--hash-style=both"])
        .arg(format!("-Wl,-soname,{STUB_SONAME}"))
        .arg("-o")
        .arg(&lib)
        .arg(&src)
        .status();
    match status {
        Ok(s) if s.success() => {}
        other => panic!(
            "building the stub driver library with {:?} failed: {other:?}",
            compiler.path()
        ),
    }
}
