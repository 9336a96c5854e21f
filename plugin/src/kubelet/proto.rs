//! Generated gRPC code for the kubelet APIs (see `proto/` and `build.rs`).
//!
//! Each proto package gets its own module: the health packages are the bare `v1` and
//! `v1alpha1`, which would otherwise be confusing next to the DRA `…dra.v1` package.

// Generated code is not ours to lint: prost/tonic emit items without docs, large enum
// variants and the like, and clippy runs with -D warnings on all targets.
#![allow(missing_docs, clippy::all, clippy::pedantic, rust_2018_idioms)]

/// `pluginregistration` (kubelet plugin watcher registration).
pub mod registration {
    include!(concat!(env!("OUT_DIR"), "/pluginregistration.rs"));
}

/// `k8s.io.kubelet.pkg.apis.dra.v1` (DRA node service, Kubernetes 1.34+).
pub mod dra_v1 {
    include!(concat!(
        env!("OUT_DIR"),
        "/k8s.io.kubelet.pkg.apis.dra.v1.rs"
    ));
}

/// `k8s.io.kubelet.pkg.apis.dra.v1beta1` (DRA node service, Kubernetes 1.32+).
pub mod dra_v1beta1 {
    include!(concat!(
        env!("OUT_DIR"),
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.rs"
    ));
}

/// `v1alpha1` (DRA device health, Kubernetes 1.34+).
pub mod health_v1alpha1 {
    include!(concat!(env!("OUT_DIR"), "/v1alpha1.rs"));
}

/// `v1` (DRA device health, Kubernetes 1.37+).
pub mod health_v1 {
    include!(concat!(env!("OUT_DIR"), "/v1.rs"));
}
