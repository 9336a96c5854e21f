//! How long a pod that needs a reshaped GPU waits, measured: a real `tessera-operator`
//! and a real plugin behind a real kubelet, one H100 with zero simulated hardware
//! latency, an Adaptive policy over MIG and MPS without cooldown. Each trial creates a pod
//! whose claim asks for the shape the GPU does not have (an MPS share while it is MIG, a
//! MIG partition while it is MPS) and times creation to `Running`; the pod then goes and
//! the next trial asks for the other shape, so every trial is one move. Both paths are
//! measured: the operator's planner, and binding conditions (the scheduler allocates the
//! GPU's latent device, the plugin switches the GPU).
//!
//! It reports; it never asserts a timing. It fails when a pod does not run or a move does
//! not end `Applied`: a bench that times errors is lying.

use std::{
    fmt,
    time::{Duration, Instant},
};

use anyhow::{Context, ensure};
use k8s_openapi::api::{core::v1::Pod, resource::v1::ResourceClaim};
use kube::{
    Api,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};
use serde::Serialize;
use serde_json::json;
use tessera_api::{GpuNode, GpuSharingPolicy, policy::SharingStrategy};

use crate::{cluster, operator::OperatorProcess, plugin::SimNode, wait::eventually};

/// Targets from the issue, with the batching window at zero.
const P50_TARGET: Duration = Duration::from_secs(2);
const P99_TARGET: Duration = Duration::from_secs(5);
const NS: &str = "bench";
/// How long one trial may take before the bench gives up on it.
const TRIAL_TIMEOUT: Duration = Duration::from_secs(120);
/// How often a trial looks at its pod.
const POLL: Duration = Duration::from_millis(20);

/// What to run.
#[derive(Clone, Debug)]
pub struct Options {
    /// Trials per configuration.
    pub trials: usize,
    /// The operator's (dwell, batching window) configurations to measure, in seconds;
    /// `None` is the operator's default.
    pub configs: Vec<Config>,
}

/// One operator configuration.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Config {
    /// What to call it.
    pub name: String,
    /// `--demand-dwell-seconds`, `None`: the default.
    pub dwell_seconds: Option<u64>,
    /// `--adaptive-batch-window-seconds`, `None`: the default.
    pub batch_window_seconds: Option<u64>,
    /// The policy's `adaptive.bindingConditions`: the scheduler switches the GPU through
    /// its latent devices instead of the operator's planner.
    pub binding_conditions: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            trials: 50,
            configs: [false, true]
                .into_iter()
                .flat_map(|binding_conditions| {
                    let path = if binding_conditions {
                        "binding conditions"
                    } else {
                        "planner"
                    };
                    [
                        Config {
                            name: format!("{path}, window zero (dwell 0 s, window 0 s)"),
                            dwell_seconds: Some(0),
                            batch_window_seconds: Some(0),
                            binding_conditions,
                        },
                        Config {
                            name: format!("{path}, defaults"),
                            dwell_seconds: None,
                            batch_window_seconds: None,
                            binding_conditions,
                        },
                    ]
                })
                .collect(),
        }
    }
}

/// The figures of one configuration.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Run {
    /// The configuration.
    pub config: Config,
    /// Pod created to `Running`, per trial, in ms.
    pub pod_ms: Vec<f64>,
    /// The operator's decision to the plugin reporting the new strategy, per trial, in ms
    /// (the policy's `lastChanges[].seconds`).
    pub move_ms: Vec<f64>,
    /// When each step of each trial was first seen, from pod creation.
    pub steps: Vec<Steps>,
}

/// When a trial's pod reached each step, in ms from its creation, as polled (`None`: not
/// seen, e.g. a pod the scheduler placed at its first attempt is never unschedulable).
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Steps {
    /// The claim controller made the pod's claim from its template.
    pub claim: Option<f64>,
    /// The scheduler reported the pod `PodScheduled=False`, `Unschedulable` (no device
    /// fit, or the claim was not made yet at its first attempt).
    pub unschedulable: Option<f64>,
    /// The claim has an allocation.
    pub allocated: Option<f64>,
    /// The pod is bound to the node.
    pub bound: Option<f64>,
    /// The pod is `Running`.
    pub running: Option<f64>,
}

impl Steps {
    /// In order: what [`Run::step_medians`] and the breakdown's columns follow.
    fn at(&self) -> [Option<f64>; 5] {
        [
            self.claim,
            self.unschedulable,
            self.allocated,
            self.bound,
            self.running,
        ]
    }
}

impl Run {
    fn pod(&self, q: f64) -> f64 {
        quantile(&self.pod_ms, q)
    }

    /// The median time from the step before (the last one seen) to each step, over the
    /// trials that saw it.
    fn step_medians(&self) -> [f64; 5] {
        let mut out = [f64::NAN; 5];
        for (i, slot) in out.iter_mut().enumerate() {
            let gaps: Vec<f64> = self
                .steps
                .iter()
                .filter_map(|s| {
                    let at = s.at();
                    let this = at[i]?;
                    let before = at[..i].iter().rev().find_map(|t| *t).unwrap_or(0.0);
                    Some(this - before)
                })
                .collect();
            *slot = quantile(&gaps, 0.5);
        }
        out
    }
}

/// The report.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Kubernetes version.
    pub kubernetes: String,
    /// Trials per configuration.
    pub trials: usize,
    /// One per configuration.
    pub runs: Vec<Run>,
}

impl Report {
    /// Whether the default path (the planner) met its targets with the window at zero;
    /// `None` when that configuration was not run (`--only`). The binding-conditions path
    /// is not judged: the scheduler looks at binding conditions every five seconds (its
    /// figures are reported).
    pub fn all_targets_met(&self) -> Option<bool> {
        let judged: Vec<&Run> = self.runs.iter().filter(|r| is_judged(&r.config)).collect();
        (!judged.is_empty()).then(|| {
            judged
                .iter()
                .all(|r| r.pod(0.5) < ms(P50_TARGET) && r.pod(0.99) < ms(P99_TARGET))
        })
    }
}

fn is_zero(c: &Config) -> bool {
    c.dwell_seconds == Some(0) && c.batch_window_seconds == Some(0)
}

/// The configuration the targets are for.
fn is_judged(c: &Config) -> bool {
    is_zero(c) && !c.binding_conditions
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The `q` quantile of `v` (nearest rank).
fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let rank = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len());
    s[rank - 1]
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "Kubernetes {}; one H100, zero simulated hardware latency; {} trials per configuration, each one move (MIG <-> MPS)",
            self.kubernetes, self.trials
        )?;
        writeln!(
            f,
            "{:<58} {:>9} {:>9} {:>9} {:>11} {:>11}  target (window zero: p50 < 2 s, p99 < 5 s)",
            "configuration", "pod p50", "pod p99", "pod max", "move p50", "move p99"
        )?;
        for r in &self.runs {
            let verdict = if is_judged(&r.config) {
                if r.pod(0.5) < ms(P50_TARGET) && r.pod(0.99) < ms(P99_TARGET) {
                    "ok"
                } else {
                    "MISSED"
                }
            } else {
                "-"
            };
            writeln!(
                f,
                "{:<58} {:>7.0}ms {:>7.0}ms {:>7.0}ms {:>9.0}ms {:>9.0}ms  {verdict}",
                r.config.name,
                r.pod(0.5),
                r.pod(0.99),
                r.pod(1.0),
                quantile(&r.move_ms, 0.5),
                quantile(&r.move_ms, 0.99),
            )?;
        }
        writeln!(
            f,
            "\nwhere the time goes (median ms from the step before; a step not seen in a trial is left out):"
        )?;
        write!(f, "{:<58}", "configuration")?;
        for n in [
            "created->claim",
            "->unschedulable",
            "->allocated",
            "->bound",
            "->running",
        ] {
            write!(f, " {n:>15}")?;
        }
        writeln!(f)?;
        for r in &self.runs {
            write!(f, "{:<58}", r.config.name)?;
            for m in r.step_medians() {
                write!(f, " {m:>15.0}")?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

/// Runs every configuration on a fresh control plane each.
pub async fn adaptive_latency(
    opts: &Options,
    progress: &(dyn Fn(&str) + Sync),
) -> anyhow::Result<Report> {
    let mut runs = Vec::new();
    let mut kubernetes = String::new();
    for config in &opts.configs {
        progress(&format!("{}: starting a control plane", config.name));
        let (cp, client) = crate::start_for_workloads(NS).await?;
        kubernetes = cp.bins().version.to_string();
        let _node = SimNode::start(
            &cp,
            "h100-1",
            "gpus: [{model: h100-80gb}]\nlatencies: zero\n",
        )
        .await?;
        let mut args = Vec::new();
        if let Some(d) = config.dwell_seconds {
            args.extend(["--demand-dwell-seconds".to_string(), d.to_string()]);
        }
        if let Some(w) = config.batch_window_seconds {
            args.extend(["--adaptive-batch-window-seconds".to_string(), w.to_string()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let op = OperatorProcess::start_with(&cp, "bench-operator", false, &args).await?;
        let policy: GpuSharingPolicy = serde_json::from_value(json!({
            "apiVersion": "tessera.dev/v1alpha1", "kind": "GpuSharingPolicy",
            "metadata": {"name": "adaptive"},
            "spec": {"strategy": "Adaptive", "nodeSelector": {}, "mig": {"mode": "Dynamic"},
                     "adaptive": {"strategies": ["MIG", "MPS"], "cooldown": "0s",
                                  "bindingConditions": config.binding_conditions}}
        }))?;
        Api::<GpuSharingPolicy>::all(client.clone())
            .patch(
                "adaptive",
                &PatchParams::apply("bench").force(),
                &Patch::Apply(&policy),
            )
            .await?;
        let gpunodes: Api<GpuNode> = Api::all(client.clone());
        eventually("the GPU to run MIG", TRIAL_TIMEOUT, || async {
            (strategy(&gpunodes).await == Some(SharingStrategy::Mig)).then_some(())
        })
        .await?;
        let mut now = SharingStrategy::Mig;
        let mut run = Run {
            config: config.clone(),
            pod_ms: Vec::new(),
            move_ms: Vec::new(),
            steps: Vec::new(),
        };
        for i in 0..opts.trials {
            let want = if now == SharingStrategy::Mig {
                SharingStrategy::Mps
            } else {
                SharingStrategy::Mig
            };
            let name = format!("trial-{i}");
            let (took, steps) = trial(&client, &name, want)
                .await
                .with_context(|| format!("trial {i} ({})\n{}", want.as_str(), op.log_tail(30)))?;
            run.pod_ms.push(ms(took));
            run.steps.push(steps);
            let moved = last_move(&client).await;
            ensure!(
                moved.as_ref().is_some_and(
                    |(to, result, _)| *to == want && result.as_deref() == Some("Applied")
                ),
                "trial {i}: the last move is {moved:?}, not an applied move to {}",
                want.as_str()
            );
            if let Some((_, _, Some(s))) = moved {
                run.move_ms.push(s * 1000.0);
            }
            now = want;
            if (i + 1) % 10 == 0 {
                progress(&format!(
                    "{}: {} trials, pod p50 {:.0} ms",
                    config.name,
                    i + 1,
                    run.pod(0.5)
                ));
            }
        }
        runs.push(run);
    }
    Ok(Report {
        kubernetes,
        trials: opts.trials,
        runs,
    })
}

/// The strategy the plugin reports for GPU 0.
async fn strategy(gpunodes: &Api<GpuNode>) -> Option<SharingStrategy> {
    gpunodes
        .get("h100-1")
        .await
        .ok()?
        .status?
        .gpus
        .first()?
        .strategy
}

/// The policy's newest move: its target, result and seconds, once it has a result.
async fn last_move(
    client: &kube::Client,
) -> Option<(SharingStrategy, Option<String>, Option<f64>)> {
    let policies: Api<GpuSharingPolicy> = Api::all(client.clone());
    eventually("the move's result", TRIAL_TIMEOUT, || async {
        let c = policies
            .get("adaptive")
            .await
            .ok()?
            .status?
            .last_changes
            .into_iter()
            .next()?;
        c.result.is_some().then_some((c.to, c.result, c.seconds))
    })
    .await
    .ok()
}

/// Creates a pod asking for `want`, times it to `Running` (and each step on the way),
/// then deletes it and waits until its claim is gone (the GPU idle again).
async fn trial(
    client: &kube::Client,
    name: &str,
    want: SharingStrategy,
) -> anyhow::Result<(Duration, Steps)> {
    let request = match want {
        SharingStrategy::Mps => cluster::GpuRequest {
            class: "mps.tessera.dev",
            selector: None,
            capacity: Some(json!({"computePercent": "25", "memory": "4Gi"})),
        },
        _ => cluster::GpuRequest {
            class: "mig.tessera.dev",
            selector: Some("device.attributes['gpu.tessera.dev'].profile == '1g.10gb'"),
            capacity: None,
        },
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let mut steps = Steps::default();
    let t0 = Instant::now();
    cluster::create_claim_pod(client, NS, name, request).await?;
    let took = loop {
        let pod = pods.get(name).await.ok();
        let now = ms(t0.elapsed());
        let mark = |slot: &mut Option<f64>, seen: bool| {
            if seen && slot.is_none() {
                *slot = Some(now);
            }
        };
        if steps.allocated.is_none() {
            let listed = claims.list(&ListParams::default()).await.ok();
            let claim = listed.as_ref().and_then(|l| l.items.first());
            mark(&mut steps.claim, claim.is_some());
            mark(
                &mut steps.allocated,
                claim.is_some_and(|c| c.status.as_ref().is_some_and(|s| s.allocation.is_some())),
            );
        }
        mark(
            &mut steps.unschedulable,
            pod.as_ref().is_some_and(cluster::unschedulable),
        );
        mark(
            &mut steps.bound,
            pod.as_ref()
                .is_some_and(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some())),
        );
        let running = pod
            .and_then(|p| p.status?.phase)
            .is_some_and(|p| p == "Running");
        if running {
            steps.running = Some(now);
            break t0.elapsed();
        }
        ensure!(
            t0.elapsed() < TRIAL_TIMEOUT,
            "pod {name} not running after {TRIAL_TIMEOUT:?}"
        );
        tokio::time::sleep(POLL).await;
    };
    // A graceful delete, as a finished workload's: the pod object goes only once its
    // kubelet has unprepared the claim, so the next trial finds the GPU idle. A forced
    // one removes the claim while the node still holds it, and the next trial would time
    // the previous pod's teardown too.
    pods.delete(name, &DeleteParams::default()).await?;
    eventually("the trial's claim to be gone", TRIAL_TIMEOUT, || async {
        claims
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .is_empty()
            .then_some(())
    })
    .await?;
    Ok((took, steps))
}
