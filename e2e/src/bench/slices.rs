//! The slice half of the benchmark: building the desired ResourceSlices of an 8×H100 node
//! with dynamic MIG, and publishing them to the API server.

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use kube::{Client, ResourceExt};
use tessera_api::constants::DRIVER_NAME;
use tessera_gpu::{MigLayout, Occupancy, Placement, backend::GpuInfo, find_model};
use tessera_plugin::slices::{GpuOffer, GpuView, build_pool, publish::Publisher};

use super::{Metric, PUBLISH_NODE, PUBLISH_P99_TARGET, reference::apiserver_time};
use crate::cluster;

/// What the publish rounds measured.
pub(super) struct PublishFigures {
    /// Client-side figures (build + API call).
    pub metrics: Vec<Metric>,
    /// The API server's own mean time per slice update over the rounds.
    pub server_mean: Duration,
}

/// The GPUs of an 8×H100-80GB node with dynamic MIG and every profile allowed: the
/// largest pool the plugin publishes for one node (8 × 26 devices, 8 counter sets).
pub(super) struct H100x8 {
    infos: Vec<GpuInfo>,
    layout: &'static MigLayout,
    offer: GpuOffer,
    empty: Occupancy,
    /// GPU 0 with one 1g instance: alternating it with `empty` makes every publish write.
    one_instance: Occupancy,
}

impl H100x8 {
    pub(super) fn new() -> anyhow::Result<Self> {
        let model = find_model("h100-80gb")?;
        let layout = model
            .mig
            .as_ref()
            .context("the H100 model has no MIG layout")?;
        let infos = (0..8u32)
            .map(|index| GpuInfo {
                pci_bus_id: format!("00000000:{:02x}:00.0", 0x18 + index),
                mig_enabled: true,
                mig_pending: true,
                driver_version: Some("580.159.04".into()),
                ..GpuInfo::from_model(model, index)
            })
            .collect();
        let placement = layout
            .all_placements()
            .find(|(p, _)| p.name == "1g.10gb")
            .map(|(p, start)| Placement {
                profile_id: p.profile_id,
                start,
            })
            .context("the H100 layout has no 1g.10gb placement")?;
        Ok(Self {
            infos,
            layout,
            offer: GpuOffer::DynamicMig {
                allowed_profile_ids: vec![],
            },
            empty: Occupancy::new(),
            one_instance: Occupancy::from_placements(layout, &[placement])?,
        })
    }

    /// The pool with GPU 0 empty or holding one instance.
    fn pool(&self, gpu0_busy: bool) -> tessera_plugin::slices::DesiredPool {
        let views: Vec<GpuView<'_>> = self
            .infos
            .iter()
            .map(|info| GpuView {
                info,
                layout: Some(self.layout),
                offer: &self.offer,
                occupancy: if gpu0_busy && info.index == 0 {
                    &self.one_instance
                } else {
                    &self.empty
                },
                blocked: &self.empty,
            })
            .collect();
        build_pool(&views, Some("580.159.04"))
    }

    /// Building the desired pool alone, in this process.
    pub(super) fn build_only(&self, iterations: usize) -> Metric {
        let mut samples = Vec::with_capacity(iterations);
        for _ in 0..iterations {
            let started = Instant::now();
            std::hint::black_box(self.pool(false));
            samples.push(started.elapsed());
        }
        Metric::new("slices: build 8×H100 pool", &samples, None)
    }

    /// Build + publish to the API server, as the plugin's node loop does.
    ///
    /// - The first publish creates the slices and is reported on its own.
    /// - `rounds` publishes after a prepare or unprepare: each alternates GPU 0's
    ///   occupancy, which reorders that GPU's placements, so exactly one slice (18 KB, 26
    ///   devices) is updated in place. This is the publish the target is about.
    /// - `rounds / 5` full republishes, as after a `GpuNode.spec` change or a resync:
    ///   list, then all nine slices updated concurrently under a new pool generation.
    pub(super) async fn publish(
        &self,
        client: &Client,
        rounds: usize,
    ) -> anyhow::Result<PublishFigures> {
        let node = cluster::create_node(client, PUBLISH_NODE, &[]).await?;
        let uid = node.uid().context("the created Node has no UID")?;
        let mut publisher = Publisher::new(client.clone(), PUBLISH_NODE, &uid, DRIVER_NAME);
        let first = self.publish_once(&mut publisher, false).await?;
        let before = apiserver_time(client, "PUT", "resourceslices").await?;
        let mut samples = Vec::with_capacity(rounds);
        for round in 0..rounds {
            samples.push(self.publish_once(&mut publisher, round % 2 == 0).await?);
        }
        let after = apiserver_time(client, "PUT", "resourceslices").await?;
        // Only this bench's publisher and the idle bench node's plugin write slices now;
        // the count check keeps a stray write from passing as ours.
        let updates = after.1.saturating_sub(before.1);
        ensure!(
            updates >= u64::try_from(rounds)?,
            "the API server counted {updates} slice updates for {rounds} publishes"
        );
        #[allow(clippy::cast_precision_loss)]
        let server_mean = Duration::from_secs_f64((after.0 - before.0).max(0.0) / updates as f64);
        let full_rounds = (rounds / 5).max(1);
        let mut full = Vec::with_capacity(full_rounds);
        for round in 0..full_rounds {
            publisher.invalidate();
            full.push(self.publish_once(&mut publisher, round % 2 == 0).await?);
        }
        Ok(PublishFigures {
            metrics: vec![
                Metric::new("slices: first publish (creates)", &[first], None),
                Metric::new("slices: build + publish (one slice)", &samples, None)
                    .with_target(PUBLISH_P99_TARGET),
                Metric::new("slices: build + full republish (9 slices)", &full, None),
            ],
            server_mean,
        })
    }

    async fn publish_once(
        &self,
        publisher: &mut Publisher,
        gpu0_busy: bool,
    ) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let pool = self.pool(gpu0_busy);
        let outcome = publisher.publish(&pool).await?;
        let took = started.elapsed();
        ensure!(
            outcome.changed,
            "a publish wrote nothing; the bench would time a no-op"
        );
        ensure!(
            outcome.dropped_fields.is_empty(),
            "the API server dropped {:?}: the control plane lacks a DRA feature gate",
            outcome.dropped_fields
        );
        Ok(took)
    }
}
