//! Writing what a prepare made into `ResourceClaim.status.devices`, off the kubelet's path.
//!
//! The status is informational: the kubelet has its CDI ids before the write starts, and
//! nothing waits on it. So the writes go out on the background runtime, at most
//! [`STATUS_WRITES_IN_FLIGHT`] at a time and `--claim-status-qps` on average; a write whose
//! claim was unprepared before its turn is skipped (its devices are gone, and the API
//! server refuses status for devices no longer allocated); a write the API server could
//! not take for a passing reason (overload, unavailable, connection lost) is retried a few
//! times with backoff.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::json;
use tessera_api::conditions::{reasons, types};
use tokio::sync::Semaphore;
use tracing::{debug, warn};

use super::ClaimApi;
use crate::{
    checkpoint::{ClaimRecord, DeviceKind},
    kubelet::ClaimRef,
    metrics::Metrics,
    ratelimit::RateLimiter,
    state::ClaimsView,
};

/// How many `status.devices` writes the plugin has in flight at once. A burst of prepares
/// queues its writes instead of opening one request each, which would have the API server
/// take every core it can; two keep one slow write from holding up the rest.
pub const STATUS_WRITES_IN_FLIGHT: usize = 2;

/// Attempts per write, and the wait before the first retry (multiplied by four each time):
/// 1 s, 4 s, 16 s cover an API server restart without keeping a write queued for long.
const ATTEMPTS: u32 = 4;
const FIRST_RETRY: Duration = Duration::from_secs(1);

/// Queues and sends the status writes of one plugin.
pub(super) struct ClaimStatusWriter {
    api: Arc<dyn ClaimApi>,
    driver_name: String,
    metrics: Arc<Metrics>,
    runtime: tokio::runtime::Handle,
    in_flight: Arc<Semaphore>,
    rate: Arc<RateLimiter>,
    claims: ClaimsView,
}

impl ClaimStatusWriter {
    pub(super) fn new(
        api: Arc<dyn ClaimApi>,
        driver_name: String,
        metrics: Arc<Metrics>,
        runtime: tokio::runtime::Handle,
        rate: RateLimiter,
        claims: ClaimsView,
    ) -> Self {
        Self {
            api,
            driver_name,
            metrics,
            runtime,
            in_flight: Arc::new(Semaphore::new(STATUS_WRITES_IN_FLIGHT)),
            rate: Arc::new(rate),
            claims,
        }
    }

    /// Queues the write of `record` (just completed) into `claim`'s status.
    pub(super) fn queue(&self, claim: &ClaimRef, record: &ClaimRecord) {
        self.queue_with(claim, record, BTreeMap::new());
    }

    /// Queues the write of `record` with `restarts`: how often the MPS control daemon of
    /// each of its devices (by device name) was restarted under it, which the device's
    /// `MPSServerReady` condition tells the claim's pods.
    pub(super) fn queue_with(
        &self,
        claim: &ClaimRef,
        record: &ClaimRecord,
        restarts: BTreeMap<String, u32>,
    ) {
        let (api, driver_name, metrics) = (
            self.api.clone(),
            self.driver_name.clone(),
            self.metrics.clone(),
        );
        let (in_flight, rate, claims) = (
            self.in_flight.clone(),
            self.rate.clone(),
            self.claims.clone(),
        );
        let (claim, record) = (claim.clone(), record.clone());
        metrics.status_writes_pending.inc();
        self.runtime.spawn(async move {
            let still_prepared = || claims.is_prepared(&claim.uid);
            let mut retry_in = FIRST_RETRY;
            for attempt in 1..=ATTEMPTS {
                // Closed only if the driver is gone, and then the write does not matter.
                let Ok(permit) = in_flight.clone().acquire_owned().await else {
                    break;
                };
                if still_prepared().await {
                    // Taken while holding the permit, so tokens go out in prepare order.
                    rate.acquire().await;
                }
                if !still_prepared().await {
                    debug!(claim = %claim, "claim unprepared before its status write; not written");
                    metrics.status_writes_skipped.inc();
                    break;
                }
                match api.apply_status(&claim.namespace, &claim.name, patch(&driver_name, &claim, &record, &restarts)).await {
                    Ok(()) => break,
                    Err(kube::Error::Api(s)) if s.code == 404 => {
                        debug!(claim = %claim, "claim deleted before its status write");
                        metrics.status_writes_skipped.inc();
                        break;
                    }
                    Err(e) if attempt < ATTEMPTS && worth_retrying(&e) => {
                        // The wait gives the slot to the writes queued behind this one.
                        drop(permit);
                        debug!(claim = %claim, error = %crate::error_chain(&e), ?retry_in, "status.devices write failed; retrying");
                        tokio::time::sleep(retry_in).await;
                        retry_in *= 4;
                    }
                    Err(e) => {
                        warn!(claim = %claim, error = %crate::error_chain(&e), attempts = attempt, "could not record status.devices on the claim");
                        metrics.status_write_failures.inc();
                        break;
                    }
                }
            }
            metrics.status_writes_pending.dec();
        });
    }
}

/// The `MPSServerReady` condition of an MPS device whose daemon was restarted `restarts`
/// times under the claim.
fn mps_condition(restarts: u32) -> serde_json::Value {
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let now = k8s_openapi::jiff::Timestamp::from_second(now).unwrap_or_default();
    let (reason, message) = if restarts == 0 {
        (
            reasons::DAEMON_RUNNING,
            "the claim's MPS control daemon runs with the claim's limits".to_string(),
        )
    } else {
        (
            reasons::DAEMON_RESTARTED,
            format!(
                "the claim's MPS control daemon stopped and was restarted ({restarts} time(s)); CUDA processes connected before a restart lost their server and must be restarted"
            ),
        )
    };
    json!({
        "type": types::MPS_SERVER_READY,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastTransitionTime": now.to_string(),
    })
}

/// Whether a failed write may succeed when sent again unchanged: the API server was
/// overloaded, unavailable or unreachable. A refusal (invalid, forbidden) stays a refusal.
fn worth_retrying(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code == 429 || s.code >= 500,
        _ => true,
    }
}

/// Our entries of `status.devices` (one per device we prepared), to server-side apply as
/// our own field manager: other drivers' entries on the same claim are left alone.
fn patch(
    driver_name: &str,
    c: &ClaimRef,
    rec: &ClaimRecord,
    restarts: &BTreeMap<String, u32>,
) -> serde_json::Value {
    let devices: Vec<serde_json::Value> = rec
        .devices
        .iter()
        .map(|d| {
            let data = match &d.kind {
                DeviceKind::Mig {
                    profile,
                    start,
                    size,
                    created,
                    ..
                } => json!({
                    "type": "mig", "profile": profile,
                    "placement": {"start": start, "size": size},
                    "uuid": created.as_ref().map(|m| m.uuid.clone()),
                    "gpuInstanceId": created.as_ref().map(|m| m.gpu_instance_id),
                    "computeInstanceId": created.as_ref().map(|m| m.compute_instance_id),
                }),
                DeviceKind::Mps {
                    uuid,
                    active_thread_percentage,
                    pinned_memory_limit_mib,
                } => json!({
                    "type": "mps", "uuid": uuid,
                    "activeThreadPercentage": active_thread_percentage,
                    "pinnedMemoryLimitMiB": pinned_memory_limit_mib,
                }),
                DeviceKind::Gpu { uuid } => json!({"type": "gpu", "uuid": uuid}),
                DeviceKind::TimeSlice { uuid } => json!({"type": "timeslice", "uuid": uuid}),
            };
            let mut v =
                json!({"driver": driver_name, "pool": d.pool, "device": d.device, "data": data});
            if let Some(s) = &d.share_id {
                v["shareID"] = json!(s);
            }
            if matches!(d.kind, DeviceKind::Mps { .. }) {
                v["conditions"] =
                    json!([mps_condition(restarts.get(&d.device).copied().unwrap_or(0))]);
            }
            v
        })
        .collect();
    json!({
        "apiVersion": <ResourceClaim as k8s_openapi::Resource>::API_VERSION,
        "kind": <ResourceClaim as k8s_openapi::Resource>::KIND,
        "metadata": {"name": c.name, "namespace": c.namespace},
        "status": {"devices": devices},
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        checkpoint::{Checkpoint, ClaimPhase},
        driver::fake::FakeClaims,
        state::ClaimsMirror,
    };

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(kube::core::Status::failure("", "").with_code(code).boxed())
    }

    /// A writer whose API server answers every write with `status` (none: accepts it),
    /// for a checkpoint holding `prepared` claims as completed.
    fn writer(
        prepared: &[&str],
        status: Option<u16>,
    ) -> (ClaimStatusWriter, Arc<Metrics>, Arc<FakeClaims>) {
        let api = Arc::new(FakeClaims::default());
        *api.fail_with.lock().unwrap() = status;
        let mut cp = Checkpoint::default();
        for uid in prepared {
            cp.claims.insert((*uid).to_string(), record(uid));
        }
        let metrics = Arc::new(Metrics::new());
        let w = ClaimStatusWriter::new(
            Arc::new(api.clone()),
            "gpu.tessera.dev".into(),
            metrics.clone(),
            tokio::runtime::Handle::current(),
            RateLimiter::new(0.0, 1),
            ClaimsMirror::new(cp).view(),
        );
        (w, metrics, api)
    }

    fn record(uid: &str) -> ClaimRecord {
        ClaimRecord {
            namespace: "ns".into(),
            name: format!("claim-{uid}"),
            uid: uid.into(),
            phase: ClaimPhase::PrepareCompleted,
            devices: vec![],
        }
    }

    fn claim(uid: &str) -> ClaimRef {
        ClaimRef {
            namespace: "ns".into(),
            name: format!("claim-{uid}"),
            uid: uid.into(),
        }
    }

    async fn settled(metrics: &Metrics) {
        while metrics.status_writes_pending.get() != 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn a_claim_unprepared_before_its_turn_is_skipped_without_a_request() {
        let (w, metrics, api) = writer(&[], None);
        w.queue(&claim("gone"), &record("gone"));
        settled(&metrics).await;
        assert_eq!(metrics.status_writes_skipped.get(), 1);
        assert_eq!(metrics.status_write_failures.get(), 0);
        assert!(api.patches.lock().unwrap().is_empty());
    }

    // Paused time: the retries' waits pass at once, and the elapsed virtual time shows
    // that all of them were waited.
    #[tokio::test(start_paused = true)]
    async fn an_unavailable_api_server_is_retried_then_counted_as_a_failure() {
        let (w, metrics, _) = writer(&["a"], Some(503));
        let started = tokio::time::Instant::now();
        w.queue(&claim("a"), &record("a"));
        settled(&metrics).await;
        assert_eq!(metrics.status_write_failures.get(), 1);
        assert_eq!(metrics.status_writes_skipped.get(), 0);
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_secs(1 + 4 + 16),
            "three retries wait 1 + 4 + 16 s; waited {waited:?}"
        );
    }

    #[tokio::test]
    async fn a_prepared_claim_gets_our_entries_by_server_side_apply() {
        let (w, metrics, api) = writer(&["a"], None);
        w.queue(&claim("a"), &record("a"));
        settled(&metrics).await;
        let patches = api.patches.lock().unwrap();
        assert_eq!(patches.len(), 1);
        assert_eq!(patches[0].0, "ns/claim-a");
        assert_eq!(patches[0].1["kind"], "ResourceClaim");
        assert!(patches[0].1["status"]["devices"].is_array());
    }

    #[test]
    fn only_passing_failures_are_retried() {
        for code in [429, 500, 503, 504] {
            assert!(worth_retrying(&api_error(code)), "{code}");
        }
        for code in [400, 403, 409, 422] {
            assert!(!worth_retrying(&api_error(code)), "{code}");
        }
    }
}
