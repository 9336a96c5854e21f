//! What a binary was built from, and the `tessera_build_info` gauge that says it, as
//! Prometheus' own `prometheus_build_info` does: `count by (version, revision)
//! (tessera_build_info)` shows a half-finished rollout.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{family::Family, gauge::Gauge},
    registry::Registry,
};

/// The workspace version (`Cargo.toml`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit it was built from (see `kit/build.rs`): a full SHA-1, or `unknown`
/// outside a git checkout, or what `TESSERA_REVISION` said at build time.
pub const REVISION: &str = env!("TESSERA_REVISION");

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    revision: &'static str,
}

/// Registers `build_info` (always 1, labelled `version` and `revision`) in `registry`,
/// the binary's root registry: with the prefix `tessera` it is `tessera_build_info`.
pub fn register(registry: &mut Registry) {
    let info = Family::<BuildLabels, Gauge>::default();
    info.get_or_create(&BuildLabels {
        version: VERSION,
        revision: REVISION,
    })
    .set(1);
    registry.register(
        "build_info",
        "Always 1; the version and git revision this binary was built from",
        info,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_revision_is_a_commit_or_unknown() {
        let inside_git = std::process::Command::new("git")
            .args(["rev-parse", "HEAD"])
            .output()
            .is_ok_and(|o| o.status.success());
        if let Some(set) = std::env::var("TESSERA_REVISION")
            .ok()
            .filter(|r| !r.trim().is_empty())
        {
            assert_eq!(REVISION, set.trim());
        } else if inside_git {
            assert_eq!(REVISION.len(), 40, "{REVISION}");
            assert!(
                REVISION.chars().all(|c| c.is_ascii_hexdigit()),
                "{REVISION}"
            );
        } else {
            assert_eq!(REVISION, "unknown");
        }
    }

    #[test]
    fn build_info_is_one_series_labelled_with_version_and_revision() {
        let mut registry = Registry::with_prefix("tessera");
        register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(&format!(
                "tessera_build_info{{version=\"{VERSION}\",revision=\"{REVISION}\"}} 1\n"
            )),
            "{text}"
        );
        assert!(text.contains("# TYPE tessera_build_info gauge\n"), "{text}");
    }
}
