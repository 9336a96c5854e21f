//! Kubernetes versions of the test bed and the per-version settings that differ between them.

use std::{fmt, str::FromStr};

/// A Kubernetes release `1.<minor>.<patch>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct K8sVersion {
    /// Minor version (36, 37, …).
    pub minor: u32,
    /// Patch version.
    pub patch: u32,
}

/// The version string is not `1.<minor>.<patch>`.
#[derive(Debug, thiserror::Error)]
#[error("'{0}' is not a Kubernetes release: write it as 1.<minor>.<patch>, e.g. 1.37.2")]
pub struct ParseVersionError(String);

impl FromStr for K8sVersion {
    type Err = ParseVersionError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseVersionError(s.to_string());
        let rest = s.trim().trim_start_matches('v');
        let mut parts = rest.split('.');
        let (Some(major), Some(minor), Some(patch), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(err());
        };
        if major != "1" {
            return Err(err());
        }
        Ok(Self {
            minor: minor.parse().map_err(|_| err())?,
            patch: patch.parse().map_err(|_| err())?,
        })
    }
}

impl fmt::Display for K8sVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "1.{}.{}", self.minor, self.patch)
    }
}

impl K8sVersion {
    /// The oldest minor Tessera supports (`resource.k8s.io/v1` with partitionable devices,
    /// consumable capacity and device taints on by default).
    pub const MIN_MINOR: u32 = 36;

    /// The matching version of the staging modules (`k8s.io/api` etc.): `v0.<minor>.<patch>`.
    pub fn staging_tag(&self) -> String {
        format!("v0.{}.{}", self.minor, self.patch)
    }

    /// `v1.<minor>.<patch>`.
    pub fn tag(&self) -> String {
        format!("v{self}")
    }

    /// Feature gates for kube-apiserver, kube-scheduler and kube-controller-manager.
    ///
    /// Gates are set on all three because the API server silently drops fields behind a
    /// disabled gate and the scheduler ignores them. Only gates whose default is off in
    /// this minor are listed; naming a gate a release does not know makes it refuse to
    /// start, so this table is per minor.
    pub fn feature_gates(&self) -> Vec<&'static str> {
        match self.minor {
            // 1.36: DeviceTaintRule is beta but off by default.
            36 => vec!["DRADeviceTaintRules=true"],
            // 1.37: everything Tessera uses is on by default.
            _ => vec![],
        }
    }

    /// `--runtime-config` for kube-apiserver: API versions that are off by default but used.
    pub fn runtime_config(&self) -> Vec<&'static str> {
        match self.minor {
            // DeviceTaintRule is served from v1beta2 in 1.36 (v1 from 1.37).
            36 => vec!["resource.k8s.io/v1beta2=true"],
            _ => vec![],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_with_and_without_a_v() {
        assert_eq!(
            "1.37.2".parse::<K8sVersion>().unwrap(),
            K8sVersion {
                minor: 37,
                patch: 2
            }
        );
        assert_eq!(
            "v1.36.3".parse::<K8sVersion>().unwrap().staging_tag(),
            "v0.36.3"
        );
    }

    #[test]
    fn malformed_versions_are_refused_with_the_expected_shape() {
        for bad in ["1.37", "2.0.1", "1.x.2", "1.37.2.1", ""] {
            let err = bad.parse::<K8sVersion>().unwrap_err().to_string();
            assert!(err.contains("1.<minor>.<patch>"), "{bad}: {err}");
        }
    }

    #[test]
    fn versions_order_by_minor_then_patch() {
        let a: K8sVersion = "1.36.9".parse().unwrap();
        let b: K8sVersion = "1.37.0".parse().unwrap();
        assert!(a < b);
    }
}
