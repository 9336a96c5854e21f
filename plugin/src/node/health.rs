//! GPU health: faults from the backend's stream and unreadable GPUs, kept across
//! restarts, turned into device taints and the kubelet's health stream.

use std::collections::BTreeMap;

use k8s_openapi::{api::resource::v1::DeviceTaint, jiff::Timestamp};
use tessera_gpu::backend::{HealthEvent, HealthEventKind};
use tracing::{info, warn};

use super::{NodeLoop, RECONFIGURING_TAINT, UNHEALTHY_TAINT};
use crate::{
    kubelet::{DeviceHealthEntry, DeviceHealthStatus},
    slices::DesiredPool,
    status::GpuHealthState,
};

impl NodeLoop {
    /// Marks GPUs that could not be read as unhealthy (once), so they are tainted and
    /// reported while the others keep serving.
    pub(super) fn note_unreadable(&mut self, unreadable: &BTreeMap<u32, String>) {
        let mut changed = false;
        for (gpu, error) in self.state.gpus().unreadable.iter().chain(unreadable) {
            if self.health.get(gpu).is_some_and(|h| !h.healthy) {
                continue;
            }
            warn!(gpu, %error, "cannot read the GPU; tainting its devices");
            self.health.insert(
                *gpu,
                GpuHealthState {
                    healthy: false,
                    message: Some("gpu-unreadable".into()),
                },
            );
            changed = true;
        }
        if changed {
            self.save_health();
        }
    }

    pub(super) fn save_health(&self) {
        if let Err(e) = self
            .health_store
            .save(&self.health, &self.state.gpus().gpus)
        {
            warn!(
                error = %crate::error_chain(&e),
                "cannot record the GPUs' health; a restart would forget a fault"
            );
        }
    }

    pub(super) fn apply_taints(&self, pool: &mut DesiredPool) {
        for (gpu, devices) in &mut pool.device_slices {
            let mut taints = Vec::new();
            if let Some(h) = self.health.get(gpu).filter(|h| !h.healthy) {
                taints.push(DeviceTaint {
                    key: UNHEALTHY_TAINT.into(),
                    value: h.message.as_deref().map(taint_value),
                    effect: "NoSchedule".into(),
                    time_added: None,
                });
            }
            if self.fenced.contains(gpu) {
                taints.push(DeviceTaint {
                    key: RECONFIGURING_TAINT.into(),
                    value: None,
                    effect: "NoSchedule".into(),
                    time_added: None,
                });
            }
            if taints.is_empty() {
                continue;
            }
            for d in devices {
                d.taints = Some(taints.clone());
            }
        }
    }

    pub(super) fn publish_health(&self, pool: &DesiredPool) {
        let now = Timestamp::now().as_second();
        let entries = pool
            .device_slices
            .iter()
            .flat_map(|(gpu, devices)| {
                let h = self.health.get(gpu).cloned().unwrap_or(GpuHealthState {
                    healthy: true,
                    message: None,
                });
                devices.iter().map(move |d| DeviceHealthEntry {
                    pool_name: self.state.node().to_string(),
                    device_name: d.name.clone(),
                    health: if h.healthy {
                        DeviceHealthStatus::Healthy
                    } else {
                        DeviceHealthStatus::Unhealthy
                    },
                    message: h.message.clone().unwrap_or_default(),
                    last_updated: now,
                    health_check_timeout_seconds: 0,
                })
            })
            .collect();
        let _ = self.health_tx.send(entries);
    }

    /// Records a fault the backend reported; whether it changed the GPU's health (a
    /// non-fatal XID does not).
    pub(super) fn on_health_event(&mut self, ev: HealthEvent) -> bool {
        let (healthy, message) = match ev.kind {
            HealthEventKind::Xid { code, fatal: true } => (false, format!("xid-{code}")),
            HealthEventKind::Xid { code, fatal: false } => {
                info!(gpu = ev.gpu, code, "non-fatal XID; the GPU stays healthy");
                return false;
            }
            HealthEventKind::GpuLost => (false, "gpu-lost".to_string()),
        };
        warn!(gpu = ev.gpu, %message, "GPU reported a fault; tainting its devices");
        self.health.insert(
            ev.gpu,
            GpuHealthState {
                healthy,
                message: Some(message),
            },
        );
        self.save_health();
        true
    }
}

/// Taint values are label values: ≤ 63 characters of `[A-Za-z0-9_.-]` that start and end
/// alphanumeric (or empty); anything else makes the API server reject the whole slice.
pub(super) fn taint_value(s: &str) -> String {
    let v: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    v.trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Kubernetes label value: empty, or ≤ 63 characters of `[A-Za-z0-9_.-]` that start
    /// and end alphanumeric (what the API server checks on `DeviceTaint.value`).
    pub(super) fn is_label_value(v: &str) -> bool {
        v.is_empty()
            || (v.len() <= 63
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
                && v.starts_with(|c: char| c.is_ascii_alphanumeric())
                && v.ends_with(|c: char| c.is_ascii_alphanumeric()))
    }

    #[test]
    pub(super) fn health_messages_we_produce_pass_unchanged() {
        for m in ["xid-79", "xid-48", "gpu-lost"] {
            assert_eq!(taint_value(m), m);
        }
    }

    #[test]
    pub(super) fn taint_values_keep_only_label_value_characters() {
        assert_eq!(
            taint_value("Xid 79: fell off the bus"),
            "Xid-79--fell-off-the-bus"
        );
        assert_eq!(taint_value("ECC_dbe.vol"), "ECC_dbe.vol");
        let v = taint_value("ünïcödé / 中文 \t\n !@#$%^&*() ok");
        assert!(
            v.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)),
            "{v}"
        );
    }

    #[test]
    pub(super) fn taint_values_are_at_most_63_characters() {
        let v = taint_value(&"a".repeat(200));
        assert_eq!(v.len(), 63);
        // Multi-byte input: the limit is on the output, which is ASCII.
        let v = taint_value(&"é".repeat(100));
        assert!(v.len() <= 63, "{} bytes", v.len());
    }

    #[test]
    pub(super) fn taint_values_are_valid_label_values() {
        for m in [
            "Xid 79: GPU has fallen off the bus.",
            "-leading and trailing-",
            "!!!",
            "",
            "é",
            &format!("{}!", "b".repeat(62)),
            &format!("{}x", "a-".repeat(40)),
        ] {
            let v = taint_value(m);
            assert!(is_label_value(&v), "{m:?} became {v:?}");
        }
    }
}
