//! The user-space libraries of the simulated driver install, as NVIDIA's R580 installer
//! lays them out in the distribution's library directory: each library is
//! `<name>.so.<driver version>` with its `SONAME` (`libcuda.so.1`, or the versioned file
//! name itself for the driver's private libraries), a `SONAME` link to the file (what
//! `ldconfig` makes) and, for the libraries programs link against by name, a `.so` link.
//!
//! Two of them work: `libnvidia-ml` (NVML, [`crate::abi`]) and `libcuda` (the few CUDA
//! driver calls a probe makes, [`crate::cuda`]); both are this crate's cdylib. The others
//! are one stub under each library's name: what a container needs of them is that they are
//! there, under the right names, for its loader and for NVIDIA's tools that pick libraries
//! by version and read their `SONAME`s. The set is the compute and utility libraries
//! NVIDIA's legacy runtime gives a CUDA container (libnvidia-container `nvc_info.c`), plus
//! a video library, two graphics-stack ones and VDPAU in its subdirectory, so that every
//! rule of library discovery (all of the version, the `vdpau/` directory, versioned
//! `SONAME`s) has a case.

/// The stub shared object (built by `build.rs`); renamed per library by
/// [`crate::soname::with_soname`].
pub const STUB: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libstub.so"));

/// What a library's file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Body {
    /// This crate's cdylib, as NVML.
    Nvml,
    /// This crate's cdylib renamed `libcuda.so.1`.
    Cuda,
    /// The stub.
    Stub,
}

/// One library of the install.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Library {
    /// The name before `.so`: `libcuda`.
    pub name: &'static str,
    /// Subdirectory of the library directory (`vdpau`), or none.
    pub subdir: Option<&'static str>,
    /// The `SONAME`'s suffix after `.so.` (`1` for `libcuda.so.1`); `None`: the versioned
    /// file name is the `SONAME`.
    pub soname_suffix: Option<&'static str>,
    /// Whether the install has a `<name>.so` link.
    pub dev_link: bool,
    /// What the file holds.
    pub body: Body,
}

const fn lib(name: &'static str, soname_suffix: Option<&'static str>, dev_link: bool) -> Library {
    Library {
        name,
        subdir: None,
        soname_suffix,
        dev_link,
        body: Body::Stub,
    }
}

/// The install's libraries.
pub const LIBRARIES: &[Library] = &[
    Library {
        body: Body::Nvml,
        ..lib("libnvidia-ml", Some("1"), true)
    },
    Library {
        body: Body::Cuda,
        ..lib("libcuda", Some("1"), true)
    },
    lib("libcudadebugger", Some("1"), false),
    lib("libnvidia-ptxjitcompiler", Some("1"), true),
    lib("libnvidia-nvvm", Some("4"), true),
    lib("libnvidia-opencl", Some("1"), false),
    lib("libnvidia-cfg", Some("1"), true),
    lib("libnvidia-allocator", Some("1"), true),
    lib("libnvidia-gpucomp", None, false),
    lib("libnvidia-pkcs11-openssl3", None, false),
    lib("libnvidia-encode", Some("1"), true),
    lib("libnvidia-glcore", None, false),
    lib("libnvidia-tls", None, false),
    Library {
        subdir: Some("vdpau"),
        ..lib("libvdpau_nvidia", Some("1"), false)
    },
];

impl Library {
    /// `<name>.so.<version>`.
    pub fn file(&self, version: &str) -> String {
        format!("{}.so.{version}", self.name)
    }

    /// The `SONAME`.
    pub fn soname(&self, version: &str) -> String {
        match self.soname_suffix {
            Some(s) => format!("{}.so.{s}", self.name),
            None => self.file(version),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_installers() {
        let cuda = LIBRARIES.iter().find(|l| l.body == Body::Cuda).unwrap();
        assert_eq!(cuda.file("580.95.05"), "libcuda.so.580.95.05");
        assert_eq!(cuda.soname("580.95.05"), "libcuda.so.1");
        let gpucomp = LIBRARIES
            .iter()
            .find(|l| l.name == "libnvidia-gpucomp")
            .unwrap();
        assert_eq!(
            gpucomp.soname("580.95.05"),
            "libnvidia-gpucomp.so.580.95.05"
        );
    }
}
