//! NVML health events: critical XIDs → [`HealthEvent`]s on a broadcast channel.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use nvml_wrapper::{Nvml, bitmasks::event::EventTypes, enums::event::XidError, error::NvmlError};
use tokio::sync::broadcast;

use crate::backend::{HealthEvent, HealthEventKind};

/// XIDs caused by applications, not the GPU (NVIDIA's device plugin skips the same set):
/// they are reported, but not as fatal.
const APPLICATION_XIDS: &[u64] = &[13, 31, 43, 45, 68, 109];

/// Starts the watcher thread; it ends when `stop` is set.
pub fn spawn(nvml: Arc<Nvml>, events: broadcast::Sender<HealthEvent>, stop: Arc<AtomicBool>) {
    let spawned = std::thread::Builder::new()
        .name("nvml-health".into())
        .spawn(move || watch(&nvml, &events, &stop));
    if let Err(e) = spawned {
        tracing::warn!(error = %crate::backend::chain(&e), "no NVML health watcher");
    }
}

fn watch(nvml: &Nvml, events: &broadcast::Sender<HealthEvent>, stop: &AtomicBool) {
    let count = nvml.device_count().unwrap_or(0);
    let mut set = match nvml.create_event_set() {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %crate::backend::chain(&e), "NVML events unavailable; no health events");
            return;
        }
    };
    // Handle → (index, UUID), read while the GPUs answer: after XID 79 a lost GPU's
    // handle can no longer tell its index, yet the event must name the GPU.
    let mut watched: Vec<(usize, u32, Option<String>)> = Vec::new();
    for i in 0..count {
        let Ok(dev) = nvml.device_by_index(i) else {
            continue;
        };
        let id = super::raw::handle_id(&dev);
        let uuid = dev.uuid().ok();
        match dev.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
            Ok(s) => {
                set = s;
                watched.push((id, i, uuid));
            }
            Err(e) => {
                // A failed registration frees the set; a GPU without event support is
                // reported and the others are still watched with a fresh set.
                tracing::warn!(gpu = i, error = %crate::backend::chain(&e.error), "cannot watch XID events of this GPU");
                match nvml.create_event_set() {
                    Ok(s) => set = s,
                    Err(_) => return,
                }
                watched.clear();
            }
        }
    }
    if watched.is_empty() {
        return;
    }
    while !stop.load(Ordering::Relaxed) {
        match set.wait(1000) {
            Ok(data) => {
                let id = super::raw::handle_id(&data.device);
                let (gpu, uuid) = match watched.iter().find(|w| w.0 == id) {
                    Some((_, i, u)) => (*i, u.clone()),
                    None => (
                        data.device.index().unwrap_or(u32::MAX),
                        data.device.uuid().ok(),
                    ),
                };
                let code = match data.event_data {
                    Some(XidError::Value(v)) => v,
                    _ => 999,
                };
                let kind = HealthEventKind::Xid {
                    code,
                    fatal: !APPLICATION_XIDS.contains(&code),
                };
                let _ = events.send(HealthEvent { gpu, uuid, kind });
            }
            Err(NvmlError::Timeout) => {}
            Err(NvmlError::GpuLost) => {
                let _ = events.send(HealthEvent {
                    gpu: u32::MAX,
                    uuid: None,
                    kind: HealthEventKind::GpuLost,
                });
                std::thread::sleep(Duration::from_secs(1));
            }
            Err(e) => {
                tracing::warn!(error = %crate::backend::chain(&e), "NVML event wait failed; health watcher stops");
                return;
            }
        }
    }
}
