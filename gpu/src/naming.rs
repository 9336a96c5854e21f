//! Device names in ResourceSlices and their inverse.
//!
//! - `gpu-<i>`: the whole GPU;
//! - `gpu-<i>-mig-<profile label>-<start>`: a MIG placement, e.g. `gpu-0-mig-3g-40gb-4`;
//! - `gpu-<i>-mps`: the GPU shared through MPS.
//!
//! Device names are DNS labels (≤ 63 characters, `[a-z0-9-]`). A profile label replaces
//! `.` and `+` with `-` (`1g.10gb+me` → `1g-10gb-me`); a literal `-` in a profile name (the
//! `-me` "no media engine" suffix of newer GPUs) becomes `-no-` so that `1g.23gb-me` and
//! `1g.23gb+me` stay distinct (`1g-23gb-no-me` vs `1g-23gb-me`).

use crate::catalog::{MigLayout, MigProfile};

/// Longest DNS label.
pub const MAX_DNS_LABEL: usize = 63;

/// Errors of naming and parsing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NamingError {
    /// The name is not a Tessera device name.
    #[error(
        "{0:?} is not a Tessera device name (gpu-<i>, gpu-<i>-mps, gpu-<i>-mig-<profile>-<start>)"
    )]
    NotOurs(String),
    /// The profile name has characters that cannot become a DNS label.
    #[error("MIG profile name {0:?} cannot be turned into a DNS label")]
    BadProfileName(String),
    /// The resulting name is too long.
    #[error("device name {0:?} is longer than 63 characters")]
    TooLong(String),
    /// The label matches no profile of the GPU.
    #[error("no MIG profile of this GPU has the label {0:?}")]
    UnknownProfileLabel(String),
}

/// A parsed device name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DeviceName {
    /// `gpu-<i>`.
    Gpu {
        /// GPU index.
        gpu: u32,
    },
    /// `gpu-<i>-mps`.
    Mps {
        /// GPU index.
        gpu: u32,
    },
    /// `gpu-<i>-mig-<label>-<start>`.
    Mig {
        /// GPU index.
        gpu: u32,
        /// Profile label (resolve with [`resolve_profile_label`]).
        profile_label: String,
        /// Placement start.
        start: u8,
    },
}

impl DeviceName {
    /// The GPU index the device belongs to.
    pub fn gpu(&self) -> u32 {
        match self {
            DeviceName::Gpu { gpu } | DeviceName::Mps { gpu } | DeviceName::Mig { gpu, .. } => *gpu,
        }
    }
}

/// The DNS-label form of a profile name.
pub fn profile_label(name: &str) -> Result<String, NamingError> {
    let mut out = String::with_capacity(name.len() + 4);
    for c in name.chars() {
        match c {
            'a'..='z' | '0'..='9' => out.push(c),
            'A'..='Z' => out.push(c.to_ascii_lowercase()),
            '.' | '+' => out.push('-'),
            '-' => out.push_str("-no-"),
            _ => return Err(NamingError::BadProfileName(name.to_string())),
        }
    }
    let valid =
        !out.is_empty() && !out.starts_with('-') && !out.ends_with('-') && !out.contains("--");
    if valid {
        Ok(out)
    } else {
        Err(NamingError::BadProfileName(name.to_string()))
    }
}

/// `gpu-<i>`.
pub fn gpu_device_name(gpu: u32) -> String {
    format!("gpu-{gpu}")
}

/// `gpu-<i>-mps`.
pub fn mps_device_name(gpu: u32) -> String {
    format!("gpu-{gpu}-mps")
}

/// `gpu-<i>-mig-<label>-<start>`.
pub fn mig_device_name(gpu: u32, profile_name: &str, start: u8) -> Result<String, NamingError> {
    let name = format!("gpu-{gpu}-mig-{}-{start}", profile_label(profile_name)?);
    if name.len() > MAX_DNS_LABEL {
        return Err(NamingError::TooLong(name));
    }
    Ok(name)
}

fn parse_index(s: &str) -> Option<u32> {
    // No sign, no leading zeros: exactly what `format!` produces, so names round-trip.
    let ok =
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    if ok { s.parse().ok() } else { None }
}

/// Parses a device name produced by this module.
pub fn parse_device_name(name: &str) -> Result<DeviceName, NamingError> {
    let not_ours = || NamingError::NotOurs(name.to_string());
    let rest = name.strip_prefix("gpu-").ok_or_else(not_ours)?;
    let (index, tail) = match rest.split_once('-') {
        Some((i, t)) => (i, Some(t)),
        None => (rest, None),
    };
    let gpu = parse_index(index).ok_or_else(not_ours)?;
    match tail {
        None => Ok(DeviceName::Gpu { gpu }),
        Some("mps") => Ok(DeviceName::Mps { gpu }),
        Some(t) => {
            let mig = t.strip_prefix("mig-").ok_or_else(not_ours)?;
            let (label, start) = mig.rsplit_once('-').ok_or_else(not_ours)?;
            let start = parse_index(start)
                .and_then(|s| u8::try_from(s).ok())
                .ok_or_else(not_ours)?;
            let label_ok = !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.contains("--");
            if !label_ok {
                return Err(not_ours());
            }
            Ok(DeviceName::Mig {
                gpu,
                profile_label: label.to_string(),
                start,
            })
        }
    }
}

/// Finds the profile of `layout` whose label is `label`.
pub fn resolve_profile_label<'l>(
    layout: &'l MigLayout,
    label: &str,
) -> Result<&'l MigProfile, NamingError> {
    layout
        .profiles
        .iter()
        .find(|p| profile_label(&p.name).is_ok_and(|l| l == label))
        .ok_or_else(|| NamingError::UnknownProfileLabel(label.to_string()))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::catalog::{catalog, find_model};

    #[test]
    fn mig_device_names_follow_the_documented_shape() {
        assert_eq!(
            mig_device_name(0, "1g.10gb+me", 3).unwrap(),
            "gpu-0-mig-1g-10gb-me-3"
        );
        assert_eq!(
            mig_device_name(0, "3g.40gb", 4).unwrap(),
            "gpu-0-mig-3g-40gb-4"
        );
        assert_eq!(
            mig_device_name(2, "1g.23gb-me", 0).unwrap(),
            "gpu-2-mig-1g-23gb-no-me-0"
        );
        assert_eq!(gpu_device_name(7), "gpu-7");
        assert_eq!(mps_device_name(7), "gpu-7-mps");
    }

    #[test]
    fn every_catalogue_placement_round_trips_through_its_device_name() {
        for m in catalog() {
            let Some(l) = &m.mig else { continue };
            for (p, start) in l.all_placements() {
                let name = mig_device_name(15, &p.name, start).unwrap();
                assert!(name.len() <= MAX_DNS_LABEL);
                let DeviceName::Mig {
                    gpu,
                    profile_label,
                    start: s,
                } = parse_device_name(&name).unwrap()
                else {
                    panic!("{name} did not parse as MIG");
                };
                assert_eq!((gpu, s), (15, start));
                assert_eq!(
                    resolve_profile_label(l, &profile_label).unwrap().profile_id,
                    p.profile_id
                );
            }
        }
    }

    #[test]
    fn names_that_are_not_ours_are_rejected() {
        for bad in [
            "gpu",
            "gpu-",
            "gpu-x",
            "gpu-01",
            "gpu-0-",
            "gpu-0-mig",
            "gpu-0-mig-3g-40gb",
            "gpu-0-mig-3g-40gb-x",
            "gpu-0-mig--4",
            "gpu-0-mps-1",
            "mig-0",
            "GPU-0",
            "gpu-0-mig-3g_40gb-4",
            "gpu-0-mig-3g-40gb-256",
            "gpu-99999999999-mps",
        ] {
            assert!(
                matches!(parse_device_name(bad), Err(NamingError::NotOurs(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn an_unknown_label_is_an_error() {
        let l = find_model("h100-80gb").unwrap().mig.as_ref().unwrap();
        assert!(resolve_profile_label(l, "1g-5gb").is_err());
    }

    #[test]
    fn profile_names_that_cannot_be_labels_are_rejected() {
        assert!(profile_label("1g.5gb_x").is_err());
        assert!(profile_label(".1g").is_err());
        assert!(profile_label("").is_err());
    }

    proptest! {
        #[test]
        fn whole_gpu_and_mps_names_round_trip(gpu in any::<u32>()) {
            prop_assert_eq!(parse_device_name(&gpu_device_name(gpu)), Ok(DeviceName::Gpu { gpu }));
            prop_assert_eq!(parse_device_name(&mps_device_name(gpu)), Ok(DeviceName::Mps { gpu }));
        }

        #[test]
        fn mig_names_round_trip(gpu in any::<u32>(), c in 1u8..8, gb in 1u32..1000, me in any::<bool>(), start in any::<u8>()) {
            let profile = format!("{c}g.{gb}gb{}", if me { "+me" } else { "" });
            let name = mig_device_name(gpu, &profile, start).unwrap();
            let parsed = parse_device_name(&name).unwrap();
            prop_assert_eq!(parsed, DeviceName::Mig { gpu, profile_label: profile_label(&profile).unwrap(), start });
        }
    }
}
