//! The reconcile loop: warm watch caches of the objects resolution reads, and, on the
//! leader, a pass after every change that writes what differs.
//!
//! A pass ([`Operator::pass`]) has four stages, each in its own module:
//!
//! 1. **observe** ([`caches`]): reads the watch caches, once: demand, where pods could
//!    run, what the GPUs publish, and the resolution snapshot.
//! 2. **plan** ([`planner`]): decides, without I/O: which policy governs each GPU and the
//!    `GpuNode.spec` that follows (see [`crate::resolve`]), which idle GPUs an Adaptive
//!    policy moves for waiting claims, which moves ended, and which specs differ from the
//!    stored ones. The planner's memory (cooldowns, moves in flight, the batch window,
//!    each policy's last moves) lives in [`planner::Planner`].
//! 3. **apply** ([`apply`]): the spec writes (server-side apply, field manager
//!    `tessera-operator`), a few at a time.
//! 4. **report** ([`report`]): events, policy statuses whose content differs (transition
//!    times aside), gauges.
//!
//! So a resync, a restart or an unrelated event writes nothing, and every pass may be
//! repeated or interrupted. Passes start at most once per [`DEBOUNCE`] ([`run`]): the
//! first event after a quiet spell is acted on at once, and the rest of its burst, however
//! long, becomes one more pass.

mod apply;
mod caches;
mod planner;
mod report;
mod run;

use std::{sync::Arc, time::Duration};

use kube::Client;

pub use self::caches::Caches;
use self::{apply::Writer, planner::Planner, report::Told};
use crate::{events::Events, leadership::Leadership, metrics::Metrics};

/// How long a pod must have been unschedulable before its claims count as demand, when
/// not configured.
pub const DEFAULT_DWELL: Duration = Duration::from_secs(2);
/// The planner's batching window when not configured (see [`crate::batch`]).
pub const DEFAULT_BATCH_WINDOW: Duration = Duration::from_secs(5);

/// The shortest time from the start of one pass to the start of the next.
pub const DEBOUNCE: Duration = Duration::from_millis(200);
/// How often a pass runs without any event (it writes nothing unless something changed).
pub const RESYNC: Duration = Duration::from_secs(300);

/// A pass could not finish.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A write was refused or failed.
    #[error("writing {what} {name}")]
    Write {
        /// `GpuNode spec` or `GpuSharingPolicy status`.
        what: &'static str,
        /// The object.
        name: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// Leader election stopped: this replica can no longer tell whether it leads, so it
    /// stops (and is restarted) rather than risk writing next to another leader.
    #[error("leader election stopped")]
    LeaseLost,
    /// The Lease may have run out since its last renewal this replica saw (see
    /// [`crate::leadership`]): another replica may lead, so nothing is written.
    #[error("the Lease may have run out unrenewed; not writing")]
    NotLeading,
    /// A watch cache stopped before it was filled.
    #[error("the {0} watch stopped before its cache was filled")]
    CacheNeverReady(&'static str),
}

/// The loop's state.
pub struct Operator {
    caches: Caches,
    metrics: Arc<Metrics>,
    events: Events,
    /// How long a pod must have been unschedulable to count as demand.
    dwell: Duration,
    /// What the planner remembers between passes.
    planner: Planner,
    /// The writes, and what this process wrote whose echo has not arrived.
    writer: Writer,
    /// The waiting claims whose pods were told why nothing moves for them.
    told: Told,
}

impl Operator {
    /// An operator on `caches`; its events name it `identity`.
    pub fn new(client: Client, caches: Caches, metrics: Arc<Metrics>, identity: &str) -> Self {
        Self {
            events: Events::new(client.clone(), identity),
            caches,
            metrics,
            dwell: DEFAULT_DWELL,
            planner: Planner::new(DEFAULT_BATCH_WINDOW),
            writer: Writer::new(client, Leadership::always()),
            told: Told::default(),
        }
    }

    /// How long the planner gathers new unmet claims before it acts (see
    /// [`crate::batch`]).
    #[must_use]
    pub fn with_batch_window(mut self, window: Duration) -> Self {
        self.planner = Planner::new(window);
        self
    }

    /// How long a pod must have been unschedulable before its claims count as demand.
    #[must_use]
    pub fn with_demand_dwell(mut self, dwell: Duration) -> Self {
        self.dwell = dwell;
        self
    }

    /// Writes only while `leadership` lets it (see [`crate::leadership`]); without, it
    /// always writes.
    #[must_use]
    pub fn with_leadership(mut self, leadership: Leadership) -> Self {
        self.writer.leadership = leadership;
        self
    }

    /// One pass: observe → plan → apply → report. Returns when demand changes next
    /// without an event (a pod's dwell ending, a batch window closing, a move timing out,
    /// a cooldown ending), if it does.
    pub async fn pass(&mut self) -> Result<Option<Duration>, Error> {
        let (seen, snapshot) = self.observe();
        // The gauges first: whoever reads an event or a status this pass writes finds
        // them already saying the same.
        self.metrics.set_unmet(&seen.demand);
        let plan = self.planner.plan(&seen, snapshot);
        let applied = self.writer.apply_specs(&plan.writes, &self.metrics).await;
        self.planner.record(&plan, &applied.written);
        let reported = self.report(&seen, &plan, &applied).await;
        match applied.error.or(reported) {
            Some(e) => Err(e),
            None => Ok(self.planner.recheck(&seen.demand, &plan)),
        }
    }

    /// Reads what the pass decides from, once.
    fn observe(&mut self) -> (caches::Observed, crate::resolve::Snapshot) {
        let gpunode_meta = self.caches.gpunode_meta();
        self.writer
            .spec_writes
            .forget_echoed(|name| gpunode_meta.get(name));
        self.caches
            .observe(self.dwell, self.planner.waiting(), &self.writer.spec_writes)
    }
}
