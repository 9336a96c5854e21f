//! The kubelet's calls to an instance that does not own the node yet (see
//! [`crate::handover`]): they wait until it does, instead of failing while the old
//! instance hands over.

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;

use super::DriverHandle;
use crate::kubelet::{ClaimRef, DraDriver, PrepareResults, UnprepareResults};

/// What a call to an instance that stopped serving before it owned the node says.
pub const STOPPING: &str =
    "this tessera-plugin instance is stopping and serves no more calls; the kubelet retries";

/// The driver once this instance owns the node; `None` until then.
#[derive(Clone)]
pub struct PendingDriver {
    driver: watch::Receiver<Option<DriverHandle>>,
    waiting: Gauge,
}

impl PendingDriver {
    /// Calls wait for `driver` to hold a driver, counted in `waiting` meanwhile.
    pub fn new(driver: watch::Receiver<Option<DriverHandle>>, waiting: Gauge) -> Self {
        Self { driver, waiting }
    }

    async fn driver(&self) -> Option<DriverHandle> {
        let mut rx = self.driver.clone();
        if let Some(d) = rx.borrow().clone() {
            return Some(d);
        }
        tracing::info!("a kubelet call waits until this instance owns the node");
        self.waiting.inc();
        let ready = rx
            .wait_for(Option::is_some)
            .await
            .ok()
            .and_then(|d| d.clone());
        self.waiting.dec();
        ready
    }
}

impl DraDriver for PendingDriver {
    async fn prepare(&self, claims: Vec<ClaimRef>) -> PrepareResults {
        match self.driver().await {
            Some(d) => d.prepare(claims).await,
            None => claims
                .into_iter()
                .map(|c| (c.uid, Err(STOPPING.to_string())))
                .collect(),
        }
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> UnprepareResults {
        match self.driver().await {
            Some(d) => d.unprepare(claims).await,
            None => claims
                .into_iter()
                .map(|c| (c.uid, Err(STOPPING.to_string())))
                .collect(),
        }
    }
}
