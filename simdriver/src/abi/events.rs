//! Event sets: critical XID events of the GPUs registered in a set, from the simulator's
//! health events (injected in-process or through the fault file). A lost GPU reports XID
//! 79, "GPU has fallen off the bus", as the driver does before every call on it fails
//! with `NVML_ERROR_GPU_IS_LOST`.

use std::{
    collections::{BTreeSet, HashMap},
    ffi::{c_uint, c_ulonglong},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use nvml_wrapper_sys::bindings::*;
use tessera_gpu::backend::{GpuBackend, HealthEvent, HealthEventKind};
use tokio::sync::broadcast::{Receiver, error::TryRecvError};

use super::{View, call, device::gpu_index, driver, handle, pointer, put};
use crate::{codes, handles::Handle};

/// The XID a GPU that fell off the bus reports.
const XID_FALLEN_OFF_THE_BUS: u64 = 79;
/// How often a waiting set looks for an event.
const POLL: Duration = Duration::from_millis(20);

struct Set {
    gpus: BTreeSet<u32>,
    events: Receiver<HealthEvent>,
}

/// The event sets of a loaded driver.
#[derive(Default)]
pub(crate) struct Sets {
    next: Mutex<u32>,
    sets: Mutex<HashMap<u32, Arc<Mutex<Set>>>>,
}

impl Sets {
    fn get(&self, set: nvmlEventSet_t) -> Result<Arc<Mutex<Set>>, codes::Code> {
        let Handle::EventSet(n) = handle(set)? else {
            return Err(codes::INVALID_ARGUMENT);
        };
        self.sets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&n)
            .cloned()
            .ok_or(codes::INVALID_ARGUMENT)
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlEventSetCreate(set: *mut nvmlEventSet_t) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        if set.is_null() {
            return Err(codes::INVALID_ARGUMENT);
        }
        let n = {
            let mut next = d.events.next.lock().unwrap_or_else(|p| p.into_inner());
            *next += 1;
            *next
        };
        let s = Set {
            gpus: BTreeSet::new(),
            events: d.sim.health_events(),
        };
        d.events
            .sets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(n, Arc::new(Mutex::new(s)));
        put(set, pointer(Handle::EventSet(n)))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: nvmlDevice_t,
    types: *mut c_ulonglong,
) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        View::now(&d).gpu(gpu_index(device)?)?;
        put(types, c_ulonglong::from(nvmlEventTypeXidCriticalError))
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlDeviceRegisterEvents(
    device: nvmlDevice_t,
    types: c_ulonglong,
    set: nvmlEventSet_t,
) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        let gpu = gpu_index(device)?;
        View::now(&d).gpu(gpu)?;
        if types & !c_ulonglong::from(nvmlEventTypeXidCriticalError) != 0 {
            return Err(codes::NOT_SUPPORTED);
        }
        let s = d.events.get(set)?;
        s.lock().unwrap_or_else(|p| p.into_inner()).gpus.insert(gpu);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlEventSetWait_v2(
    set: nvmlEventSet_t,
    data: *mut nvmlEventData_t,
    timeout_ms: c_uint,
) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        if data.is_null() {
            return Err(codes::INVALID_ARGUMENT);
        }
        let s = d.events.get(set)?;
        drop(d);
        let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
        loop {
            let next = {
                let mut s = s.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    match s.events.try_recv() {
                        Ok(ev) if s.gpus.contains(&ev.gpu) => break Some(ev),
                        Ok(_) | Err(TryRecvError::Lagged(_)) => continue,
                        Err(TryRecvError::Empty | TryRecvError::Closed) => break None,
                    }
                }
            };
            if let Some(ev) = next {
                let code = match ev.kind {
                    HealthEventKind::Xid { code, .. } => code,
                    HealthEventKind::GpuLost => XID_FALLEN_OFF_THE_BUS,
                };
                return put(
                    data,
                    nvmlEventData_t {
                        device: pointer(Handle::Gpu(ev.gpu)),
                        eventType: c_ulonglong::from(nvmlEventTypeXidCriticalError),
                        eventData: code,
                        gpuInstanceId: 0xffff_ffff,
                        computeInstanceId: 0xffff_ffff,
                    },
                );
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(codes::TIMEOUT);
            }
            std::thread::sleep(POLL.min(deadline - now));
        }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlEventSetFree(set: nvmlEventSet_t) -> nvmlReturn_t {
    call(|| {
        let d = driver()?;
        let Handle::EventSet(n) = handle(set)? else {
            return Err(codes::INVALID_ARGUMENT);
        };
        d.events
            .sets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&n)
            .map(drop)
            .ok_or(codes::INVALID_ARGUMENT)
    })
}
