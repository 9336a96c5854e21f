//! The plugin's hand-written copies of the kubelet's gRPC protos (`plugin/proto/`) say the
//! same as the kubelet's own `.proto` files of the release under test, read from the Go
//! module cache the test bed's build filled: same packages, messages, fields (name,
//! number, type, label), enums and services. Comments and `go_package` options may differ.

// Test fixtures outside #[test] functions panic on purpose: a failed setup step is a failed test.
#![allow(
    clippy::unwrap_used,
    reason = "a test fails loudly on the first unexpected error"
)]

use std::{collections::BTreeMap, path::PathBuf, process::Command};

use prost_types::{DescriptorProto, FileDescriptorProto};
use tessera_e2e::{BinDir, repo_root};

/// The kubelet API files the plugin speaks, relative to both roots, with the first minor
/// release that has each (older kubelets ignore what they do not know).
const FILES: [(&str, u32); 5] = [
    ("pluginregistration/v1/api.proto", 0),
    ("dra/v1/api.proto", 0),
    ("dra/v1beta1/api.proto", 0),
    ("dra-health/v1alpha1/api.proto", 34),
    ("dra-health/v1/api.proto", 37),
];

/// `<GOMODCACHE>/k8s.io/kubelet@v0.<minor>.<patch>/pkg/apis` of the release under test,
/// and its minor.
fn kubelet_apis() -> (PathBuf, u32) {
    let version = BinDir::for_tests().unwrap().version;
    let out = Command::new("go")
        .args(["env", "GOMODCACHE"])
        .output()
        .expect("go is installed (the test bed builds with it)");
    let cache = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    let dir = cache
        .join("k8s.io")
        .join(format!("kubelet@{}", version.staging_tag()))
        .join("pkg/apis");
    assert!(
        dir.is_dir(),
        "{} is missing: the test bed's build of Kubernetes {version} downloads it (cargo xtask controlplane build --version {version})",
        dir.display()
    );
    (dir, version.minor)
}

/// What a file declares, without comments, options or source positions.
fn shape(file: &FileDescriptorProto) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    out.insert("package".into(), file.package().to_string());
    for m in &file.message_type {
        message(m, "", &mut out);
    }
    for e in &file.enum_type {
        let values: Vec<String> = e
            .value
            .iter()
            .map(|v| format!("{}={}", v.name(), v.number()))
            .collect();
        out.insert(format!("enum {}", e.name()), values.join(","));
    }
    for s in &file.service {
        for m in &s.method {
            out.insert(
                format!("rpc {}.{}", s.name(), m.name()),
                format!(
                    "{}{} -> {}{}",
                    if m.client_streaming() { "stream " } else { "" },
                    m.input_type(),
                    if m.server_streaming() { "stream " } else { "" },
                    m.output_type()
                ),
            );
        }
    }
    out
}

fn message(m: &DescriptorProto, prefix: &str, out: &mut BTreeMap<String, String>) {
    let name = format!("{prefix}{}", m.name());
    for f in &m.field {
        out.insert(
            format!("field {name}.{}", f.name()),
            format!(
                "#{} {:?} {:?} {}",
                f.number(),
                f.label(),
                f.r#type(),
                f.type_name()
            ),
        );
    }
    for nested in &m.nested_type {
        message(nested, &format!("{name}."), out);
    }
}

fn compile(root: &PathBuf, file: &str) -> BTreeMap<String, String> {
    let set = protox::compile([file], [root])
        .unwrap_or_else(|e| panic!("compiling {}/{file}: {e}", root.display()));
    let fd = set
        .file
        .iter()
        .find(|f| f.name() == file)
        .unwrap_or_else(|| panic!("{file} not in its own descriptor set"));
    shape(fd)
}

#[test]
fn the_plugins_protos_match_the_kubelets_of_the_release_under_test() {
    let (upstream, minor) = kubelet_apis();
    let ours = repo_root().join("plugin/proto");
    for (file, since) in FILES {
        if minor < since {
            println!("{file}: not in 1.{minor} (since 1.{since}); compared on newer releases");
            continue;
        }
        let theirs = compile(&upstream, file);
        let mine = compile(&ours, file);
        assert!(theirs.len() > 2, "{file}: nothing parsed from upstream");
        assert_eq!(
            mine,
            theirs,
            "plugin/proto/{file} differs from the kubelet's {}",
            upstream.join(file).display()
        );
    }
}
