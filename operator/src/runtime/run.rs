//! The loop: a pass after every burst of events and every [`RESYNC`], while this replica
//! leads; a failed pass is retried after a backoff.

use std::{
    future::Future,
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use tokio::sync::{Notify, watch};
use tracing::{info, warn};

use super::{DEBOUNCE, Error, Operator, RESYNC};

/// The wait after a failed pass, doubled on each further failure up to [`BACKOFF_MAX`].
const BACKOFF_START: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

impl Operator {
    /// Runs until `shutdown` resolves: a pass after every burst of events and every
    /// [`RESYNC`], while this replica leads. `ready` turns `Ok` once the caches are
    /// filled.
    pub async fn run(
        mut self,
        changed: Arc<Notify>,
        ready: watch::Sender<Result<(), String>>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), Error> {
        tokio::pin!(shutdown);
        tokio::select! {
            () = &mut shutdown => return Ok(()),
            r = self.caches.ready() => r?,
        }
        info!("watch caches filled");
        let _ = ready.send(Ok(()));
        let mut tick = tokio::time::interval(RESYNC);
        let mut backoff = BACKOFF_START;
        loop {
            self.writer.leadership.mark_seen();
            let lead_for = self.writer.leadership.writes_for(SystemTime::now());
            self.metrics.leader.set(i64::from(lead_for.is_some()));
            let started = Instant::now();
            // Waiting after an event for the rest of its burst would delay every reaction
            // by the wait; pacing the starts coalesces a burst just as well.
            let mut not_before = started + DEBOUNCE;
            let mut recheck = RESYNC;
            if let Some(lead_for) = lead_for {
                let result = self.pass().await;
                self.metrics.observe_pass(started.elapsed(), result.is_ok());
                match &result {
                    Ok(next) => {
                        backoff = BACKOFF_START;
                        if let Some(next) = next {
                            recheck = *next;
                        }
                    }
                    Err(Error::NotLeading) => {
                        info!(
                            "the Lease may have run out unrenewed; stopped writing until it is renewed"
                        );
                    }
                    Err(e) => {
                        warn!(error = %tessera_kit::error_chain(e), retry_in = ?backoff, "pass failed; retrying");
                        // Retried after the backoff, not sooner, and even if nothing
                        // else happens.
                        not_before = Instant::now() + backoff;
                        recheck = backoff;
                        backoff = (backoff * 2).min(BACKOFF_MAX);
                    }
                }
                // Unrenewed, the Lease runs out without any event: the gauge says so.
                recheck = recheck.min(lead_for);
            }
            tokio::select! {
                () = &mut shutdown => return Ok(()),
                () = changed.notified() => {}
                r = self.writer.leadership.changed() => {
                    if r.is_err() {
                        self.metrics.leader.set(0);
                        return Err(Error::LeaseLost);
                    }
                }
                _ = tick.tick() => {}
                // A pod's dwell ends, or a failed pass's backoff, without any event.
                () = tokio::time::sleep(recheck) => {}
            }
            tokio::time::sleep_until(not_before.into()).await;
        }
    }
}
