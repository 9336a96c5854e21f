//! The slice half of the benchmark: building the desired ResourceSlices of an 8×H100 node
//! with dynamic MIG, and publishing them to the API server.

use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams},
};
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
    /// One 1g instance: alternating it with `empty` on a GPU makes every publish write.
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
        self.pool_with(|gpu| gpu0_busy && gpu == 0)
    }

    /// The pool with the GPUs `busy` says holding one instance each.
    fn pool_with(&self, busy: impl Fn(u32) -> bool) -> tessera_plugin::slices::DesiredPool {
        let views: Vec<GpuView<'_>> = self
            .infos
            .iter()
            .map(|info| GpuView {
                info,
                layout: Some(self.layout),
                offer: &self.offer,
                occupancy: if busy(info.index) {
                    &self.one_instance
                } else {
                    &self.empty
                },
                blocked: &self.empty,
                latent: &[],
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
    ///   occupancy, which reorders that GPU's placements, so exactly one slice (26
    ///   devices) is updated in place.
    /// - Then `rounds / 5` each of: a spec change of every GPU (each GPU's slice changes,
    ///   no device moves: eight updates in place, no list); GPUs trading positions
    ///   (devices move between slices: nine updates under a new generation); a restarted
    ///   plugin finding its slices up to date (a list, no write); a resync that finds one
    ///   slice out of date (a list, one update); and a republish after the kubelet wiped
    ///   the slices (a list, nine creates).
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
        let server_mean = Duration::from_secs_f64((after.0 - before.0).max(0.0) / updates as f64);
        let other_rounds = (rounds / 5).max(1);
        // A spec change of every GPU: every device slice changes, none moves.
        let every_gpu = self
            .rounds(&mut publisher, other_rounds, |round| {
                let busy = round % 2 == 0;
                self.pool_with(|_| busy)
            })
            .await?;
        // GPU 7 and GPU 0 trade the first position: devices move between slices.
        let reorder = self
            .rounds(&mut publisher, other_rounds, |round| {
                let first = if round % 2 == 0 { 7 } else { 0 };
                self.pool_with(|gpu| gpu == first)
            })
            .await?;
        // Whether the last reorder round left GPU 0 busy (odd rounds do).
        let mut gpu0_busy = (other_rounds - 1) % 2 == 1;
        let mut startup = Vec::with_capacity(other_rounds);
        let mut resync = Vec::with_capacity(other_rounds);
        for _ in 0..other_rounds {
            // A restarted plugin: the slices it finds are already right.
            publisher.invalidate();
            let started = Instant::now();
            let outcome = publisher.publish(&self.pool(gpu0_busy)).await?;
            startup.push(started.elapsed());
            ensure!(
                !outcome.changed,
                "a restart republished slices that were up to date"
            );
            publisher.invalidate();
            gpu0_busy = !gpu0_busy;
            resync.push(self.publish_once(&mut publisher, gpu0_busy).await?);
        }
        let api: Api<ResourceSlice> = Api::all(client.clone());
        let mut wiped = Vec::with_capacity(other_rounds);
        for round in 0..other_rounds {
            // What the kubelet does at start-up: delete every slice of its node.
            api.delete_collection(
                &DeleteParams::default(),
                &ListParams::default().fields(&format!("spec.nodeName={PUBLISH_NODE}")),
            )
            .await?;
            publisher.invalidate();
            wiped.push(self.publish_once(&mut publisher, round % 2 == 0).await?);
        }
        Ok(PublishFigures {
            metrics: vec![
                Metric::new("slices: first publish (creates)", &[first], None),
                Metric::new("slices: build + publish (one slice)", &samples, None)
                    .with_target(PUBLISH_P99_TARGET),
                Metric::new(
                    "slices: spec change of every GPU (8 slices in place)",
                    &every_gpu,
                    None,
                )
                .with_target(PUBLISH_P99_TARGET),
                Metric::new(
                    "slices: GPUs reordered (9 slices, new generation)",
                    &reorder,
                    None,
                ),
                Metric::new(
                    "slices: restart, slices up to date (list only)",
                    &startup,
                    None,
                )
                .with_target(PUBLISH_P99_TARGET),
                Metric::new("slices: resync (list + one slice)", &resync, None),
                Metric::new("slices: after a wipe (list + 9 creates)", &wiped, None)
                    .with_target(PUBLISH_P99_TARGET),
            ],
            server_mean,
        })
    }

    /// `rounds` timed publishes of the pools `pool(round)` builds, each expected to write.
    async fn rounds(
        &self,
        publisher: &mut Publisher,
        rounds: usize,
        pool: impl Fn(usize) -> tessera_plugin::slices::DesiredPool,
    ) -> anyhow::Result<Vec<Duration>> {
        let mut samples = Vec::with_capacity(rounds);
        for round in 0..rounds {
            let started = Instant::now();
            let outcome = publisher.publish(&pool(round)).await?;
            samples.push(started.elapsed());
            ensure!(
                outcome.changed,
                "a publish wrote nothing; the bench would time a no-op"
            );
        }
        Ok(samples)
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
