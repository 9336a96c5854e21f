//! GPU demand the scheduler could not place: which pending claims ask for which device
//! shapes (pure).
//!
//! A claim counts when its pod waits unbound with `PodScheduled=False` and reason
//! `Unschedulable` (object state the scheduler writes; its message text is never
//! parsed), the claim has no allocation, and it asks one of Tessera's DeviceClasses. Each
//! request becomes its alternatives (`firstAvailable` order kept), each a [`Shape`] and a
//! count. Only what the shipped DeviceClasses and the selector forms the README documents
//! say is recognised; a claim asking anything else is never guessed at: it is reported
//! as unmodelled, with why.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
};

use k8s_openapi::{
    api::{
        core::v1::Pod,
        resource::v1::{CapacityRequirements, DeviceSelector, ResourceClaim, ResourceClaimSpec},
    },
    jiff::Timestamp,
};
use tessera_api::{constants::DRIVER_NAME, policy::SharingStrategy, quantity};

/// The DeviceClasses Tessera ships, by the shape they ask for.
pub mod classes {
    /// A whole GPU.
    pub const WHOLE: &str = "gpu.tessera.dev";
    /// A MIG partition.
    pub const MIG: &str = "mig.tessera.dev";
    /// An MPS share.
    pub const MPS: &str = "mps.tessera.dev";
    /// A time-sliced GPU.
    pub const TIME_SLICE: &str = "timeslice.tessera.dev";
}

/// A device shape a request asks for.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Shape {
    /// A whole GPU.
    Whole,
    /// A MIG partition of this profile (`None`: any profile).
    Mig {
        /// The profile the selector names.
        profile: Option<String>,
    },
    /// An MPS share, with the capacity it requests (`None`: the GPU's default).
    Mps {
        /// Percent of the GPU's threads.
        compute_percent: Option<u32>,
        /// Pinned memory in MiB.
        memory_mib: Option<u64>,
    },
    /// A time-sliced GPU.
    TimeSlice,
}

impl Shape {
    /// The strategy a GPU must have to offer this shape.
    pub fn strategy(&self) -> SharingStrategy {
        match self {
            Shape::Whole => SharingStrategy::Exclusive,
            Shape::Mig { .. } => SharingStrategy::Mig,
            Shape::Mps { .. } => SharingStrategy::Mps,
            Shape::TimeSlice => SharingStrategy::TimeSlicing,
        }
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Shape::Whole => write!(f, "whole GPU"),
            Shape::Mig { profile: Some(p) } => write!(f, "MIG {p}"),
            Shape::Mig { profile: None } => write!(f, "MIG (any profile)"),
            Shape::Mps {
                compute_percent,
                memory_mib,
            } => {
                write!(f, "MPS share")?;
                match (compute_percent, memory_mib) {
                    (None, None) => Ok(()),
                    (c, m) => {
                        let mut parts = Vec::new();
                        if let Some(c) = c {
                            parts.push(format!("{c}%"));
                        }
                        if let Some(m) = m {
                            parts.push(format!("{m} MiB"));
                        }
                        write!(f, " ({})", parts.join(", "))
                    }
                }
            }
            Shape::TimeSlice => write!(f, "time-slice"),
        }
    }
}

/// One request of a claim: the shapes that would satisfy it, most preferred first, each
/// with the number of devices it needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestDemand {
    /// The request's name.
    pub name: String,
    /// (shape, count) alternatives in `firstAvailable` order (one for an exact request).
    pub alternatives: Vec<(Shape, u32)>,
}

/// What a claim asks of Tessera.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Asks {
    /// Nothing: no request names one of Tessera's DeviceClasses.
    Nothing,
    /// These requests (only those of Tessera's classes).
    Shapes(Vec<RequestDemand>),
    /// Something Tessera's classes serve, in a form Tessera cannot model, and why.
    Unmodelled(String),
}

/// What a claim's spec asks of Tessera.
pub fn asks(spec: &ResourceClaimSpec) -> Asks {
    let requests = spec
        .devices
        .as_ref()
        .and_then(|d| d.requests.as_ref())
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut ours = Vec::new();
    for r in requests {
        let alternatives: Vec<Alternative<'_>> = match (&r.exactly, &r.first_available) {
            (Some(e), _) => vec![Alternative {
                class: &e.device_class_name,
                selectors: e.selectors.as_deref().unwrap_or_default(),
                capacity: e.capacity.as_ref(),
                count: e.count,
                mode: e.allocation_mode.as_deref(),
            }],
            (None, Some(subs)) => subs
                .iter()
                .map(|s| Alternative {
                    class: &s.device_class_name,
                    selectors: s.selectors.as_deref().unwrap_or_default(),
                    capacity: s.capacity.as_ref(),
                    count: s.count,
                    mode: s.allocation_mode.as_deref(),
                })
                .collect(),
            (None, None) => Vec::new(),
        };
        if !alternatives.iter().any(|a| is_ours(a.class)) {
            continue;
        }
        let mut shapes = Vec::new();
        for a in &alternatives {
            match shape_of(a) {
                Ok(s) => shapes.push(s),
                Err(why) => return Asks::Unmodelled(format!("request {}: {why}", r.name)),
            }
        }
        ours.push(RequestDemand {
            name: r.name.clone(),
            alternatives: shapes,
        });
    }
    if ours.is_empty() {
        Asks::Nothing
    } else {
        Asks::Shapes(ours)
    }
}

struct Alternative<'a> {
    class: &'a str,
    selectors: &'a [DeviceSelector],
    capacity: Option<&'a CapacityRequirements>,
    count: Option<i64>,
    mode: Option<&'a str>,
}

fn is_ours(class: &str) -> bool {
    [
        classes::WHOLE,
        classes::MIG,
        classes::MPS,
        classes::TIME_SLICE,
    ]
    .contains(&class)
}

fn shape_of(a: &Alternative<'_>) -> Result<(Shape, u32), String> {
    if !is_ours(a.class) {
        return Err(format!(
            "it may also be served by DeviceClass {}, which is not Tessera's",
            a.class
        ));
    }
    if a.mode.is_some_and(|m| m != "ExactCount") {
        return Err(format!(
            "allocationMode {} asks for every matching device",
            a.mode.unwrap_or_default()
        ));
    }
    let count = u32::try_from(a.count.unwrap_or(1).max(1)).unwrap_or(u32::MAX);
    let shape = match a.class {
        classes::MIG => {
            let profile = match a.selectors {
                [] => None,
                [one] => Some(mig_profile(one)?),
                _ => return Err("a MIG request has more than one selector".into()),
            };
            Shape::Mig { profile }
        }
        classes::MPS => {
            no_selectors(a)?;
            let (compute_percent, memory_mib) = mps_capacity(a.capacity)?;
            Shape::Mps {
                compute_percent,
                memory_mib,
            }
        }
        classes::WHOLE => {
            no_selectors(a)?;
            Shape::Whole
        }
        _ => {
            no_selectors(a)?;
            Shape::TimeSlice
        }
    };
    if !matches!(shape, Shape::Mps { .. }) && a.capacity.is_some_and(|c| c.requests.is_some()) {
        return Err(format!(
            "DeviceClass {} devices have no capacity to request",
            a.class
        ));
    }
    Ok((shape, count))
}

fn no_selectors(a: &Alternative<'_>) -> Result<(), String> {
    if a.selectors.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "selectors on DeviceClass {} are not modelled (only a MIG profile selector is)",
            a.class
        ))
    }
}

/// The profile of the documented MIG selector:
/// `device.attributes['gpu.tessera.dev'].profile == '<profile>'` (either quotes, either
/// attribute syntax, optionally after `device.driver == 'gpu.tessera.dev' &&`).
fn mig_profile(selector: &DeviceSelector) -> Result<String, String> {
    let unmodelled = || {
        "its selector is not the documented form device.attributes['gpu.tessera.dev'].profile == '<profile>'".to_string()
    };
    let expr = selector
        .cel
        .as_ref()
        .ok_or_else(unmodelled)?
        .expression
        .as_str();
    let compact: String = expr.chars().filter(|c| !c.is_whitespace()).collect();
    let compact = compact.replace('"', "'");
    let driver = format!("device.driver=='{DRIVER_NAME}'&&");
    let rest = compact.strip_prefix(&driver).unwrap_or(&compact);
    let rest = [
        format!("device.attributes['{DRIVER_NAME}'].profile=="),
        format!("device.attributes['{DRIVER_NAME}']['profile']=="),
    ]
    .iter()
    .find_map(|p| rest.strip_prefix(p.as_str()))
    .ok_or_else(unmodelled)?;
    let profile = rest
        .strip_prefix('\'')
        .and_then(|r| r.strip_suffix('\''))
        .filter(|p| !p.is_empty() && !p.contains('\''))
        .ok_or_else(unmodelled)?;
    Ok(profile.to_string())
}

/// `computePercent` and `memory` of an MPS request, with or without the driver's domain.
fn mps_capacity(c: Option<&CapacityRequirements>) -> Result<(Option<u32>, Option<u64>), String> {
    let mut compute = None;
    let mut memory = None;
    for (k, v) in c.and_then(|c| c.requests.as_ref()).into_iter().flatten() {
        let name = k
            .strip_prefix(&format!("{DRIVER_NAME}/"))
            .unwrap_or(k.as_str());
        match name {
            "computePercent" => {
                compute =
                    Some(v.0.parse::<u32>().map_err(|_| {
                        format!("computePercent {} is not a whole percentage", v.0)
                    })?);
            }
            "memory" => {
                memory = Some(
                    quantity::parse_mib(&v.0)
                        .ok_or_else(|| format!("memory {} is not a quantity", v.0))?,
                );
            }
            other => return Err(format!("MPS shares have no capacity {other}")),
        }
    }
    Ok((compute, memory))
}

/// The extended resource name a DeviceClass has when its spec names none (KEP-5004):
/// this prefix and the class's name.
pub const IMPLICIT_EXTENDED_PREFIX: &str = "deviceclass.resource.kubernetes.io/";

/// The extended resource names pods may ask Tessera's DeviceClasses by, name → class:
/// each of `classes` (name, `spec.extendedResourceName`) that is Tessera's, by its
/// implicit name and by the one its spec gives.
pub fn extended_names<'a>(
    classes: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (class, named) in classes {
        if !is_ours(class) {
            continue;
        }
        out.insert(
            format!("{IMPLICIT_EXTENDED_PREFIX}{class}"),
            class.to_string(),
        );
        if let Some(n) = named {
            out.insert(n.to_string(), class.to_string());
        }
    }
    out
}

/// The shape a request of `class` with no selectors and no capacity asks for.
fn class_shape(class: &str) -> Option<Shape> {
    Some(match class {
        classes::WHOLE => Shape::Whole,
        classes::MIG => Shape::Mig { profile: None },
        classes::MPS => Shape::Mps {
            compute_percent: None,
            memory_mib: None,
        },
        classes::TIME_SLICE => Shape::TimeSlice,
        _ => return None,
    })
}

/// What a pod asks of Tessera through extended resources (`names`: see
/// [`extended_names`]), one request per resource, as the scheduler counts a pod's
/// resources: the larger of its containers' sum and its largest init container.
fn extended_requests(pod: &Pod, names: &BTreeMap<String, String>) -> Vec<RequestDemand> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let asked = |c: &k8s_openapi::api::core::v1::Container, name: &str| -> u32 {
        let r = c.resources.as_ref();
        r.and_then(|r| r.requests.as_ref()?.get(name))
            .or_else(|| r.and_then(|r| r.limits.as_ref()?.get(name)))
            .and_then(|q| q.0.parse().ok())
            .unwrap_or(0)
    };
    let mut out = Vec::new();
    for (name, class) in names {
        let sum: u32 = spec.containers.iter().map(|c| asked(c, name)).sum();
        let init = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| asked(c, name))
            .max()
            .unwrap_or(0);
        let count = sum.max(init);
        if count == 0 {
            continue;
        }
        if let Some(shape) = class_shape(class) {
            out.push(RequestDemand {
                name: name.clone(),
                alternatives: vec![(shape, count)],
            });
        }
    }
    out
}

/// A pending claim and what it asks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingClaim {
    /// `namespace/name`.
    pub claim: String,
    /// The pods waiting for it, `namespace/name`.
    pub pods: BTreeSet<String>,
    /// What it asks.
    pub requests: Vec<RequestDemand>,
}

/// The demand of a snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Demand {
    /// Claims Tessera could serve that wait, by `namespace/name`.
    pub pending: BTreeMap<String, PendingClaim>,
    /// Claims of waiting pods that ask Tessera's classes in a form it cannot model, with
    /// the pods and why.
    pub unmodelled: BTreeMap<String, (BTreeSet<String>, String)>,
    /// When the next unschedulable pod's dwell ends, from `now`: demand can change then
    /// without any event.
    pub recheck_in: Option<std::time::Duration>,
    /// Waiting claims the free devices could hold, left to the scheduler (see
    /// [`crate::free`]): not in `pending`.
    pub placeable: BTreeSet<String>,
}

impl Demand {
    /// Devices and claims per shape, each request counted under its first alternative
    /// that `offers` accepts (every shape, for the cluster's own figure).
    pub fn by_shape(&self, offers: impl Fn(&Shape) -> bool) -> BTreeMap<Shape, (u32, u32)> {
        let mut out: BTreeMap<Shape, (u32, u32)> = BTreeMap::new();
        for c in self.pending.values() {
            let mut shapes = BTreeSet::new();
            for r in &c.requests {
                if let Some((shape, count)) = r.alternatives.iter().find(|(s, _)| offers(s)) {
                    out.entry(shape.clone()).or_default().0 += count;
                    shapes.insert(shape.clone());
                }
            }
            for s in shapes {
                out.entry(s).or_default().1 += 1;
            }
        }
        out
    }
}

/// The claims the pods wait for: pods that have waited unschedulable for at least `dwell`
/// by `now`, their claims that exist and are unallocated (a shared claim once), and what
/// those ask of Tessera. `claim` looks a claim up by namespace and name. What a pod asks
/// through the extended resources of `extended` (see [`extended_names`]) counts as one
/// more claim, `<namespace>/<pod> (extended resources)`: the scheduler makes that claim
/// only once it has found the devices.
pub fn demand<'c>(
    pods: &[&Pod],
    claim: impl Fn(&str, &str) -> Option<&'c ResourceClaim>,
    extended: &BTreeMap<String, String>,
    now: Timestamp,
    dwell: std::time::Duration,
) -> Demand {
    let mut out = Demand::default();
    for pod in pods {
        match waited(pod, now) {
            Some(w) if w >= dwell => {}
            Some(w) => {
                let left = dwell - w;
                out.recheck_in = Some(out.recheck_in.map_or(left, |r| r.min(left)));
                continue;
            }
            None => continue,
        }
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        let pod_name = format!("{ns}/{}", pod.metadata.name.as_deref().unwrap_or_default());
        let by_extended = extended_requests(pod, extended);
        if !by_extended.is_empty() {
            let key = format!("{pod_name} (extended resources)");
            out.pending.insert(
                key.clone(),
                PendingClaim {
                    claim: key,
                    pods: BTreeSet::from([pod_name.clone()]),
                    requests: by_extended,
                },
            );
        }
        for name in claim_names(pod) {
            let Some(c) = claim(ns, &name) else {
                continue;
            };
            if c.status
                .as_ref()
                .and_then(|s| s.allocation.as_ref())
                .is_some()
            {
                continue;
            }
            let key = format!("{ns}/{name}");
            match asks(&c.spec) {
                Asks::Nothing => {}
                Asks::Shapes(requests) => {
                    out.pending
                        .entry(key.clone())
                        .or_insert_with(|| PendingClaim {
                            claim: key,
                            pods: BTreeSet::new(),
                            requests,
                        })
                        .pods
                        .insert(pod_name.clone());
                }
                Asks::Unmodelled(why) => {
                    out.unmodelled
                        .entry(key)
                        .or_insert_with(|| (BTreeSet::new(), why))
                        .0
                        .insert(pod_name.clone());
                }
            }
        }
    }
    out
}

/// How long the pod has waited for the scheduler, if it does: unbound, not being
/// deleted, not gated, no node nominated (preemption under way), and
/// `PodScheduled=False/Unschedulable`.
fn waited(pod: &Pod, now: Timestamp) -> Option<std::time::Duration> {
    let spec = pod.spec.as_ref();
    if spec.is_some_and(|s| s.node_name.is_some())
        || pod.metadata.deletion_timestamp.is_some()
        || spec
            .and_then(|s| s.scheduling_gates.as_ref())
            .is_some_and(|g| !g.is_empty())
    {
        return None;
    }
    let status = pod.status.as_ref();
    if status
        .and_then(|s| s.nominated_node_name.as_ref())
        .is_some()
    {
        return None;
    }
    let since = status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled")
        .filter(|c| c.status == "False" && c.reason.as_deref() == Some("Unschedulable"))
        .map(|c| c.last_transition_time.as_ref().map(|t| t.0))?;
    // Without a transition time the wait is unknown: taken as long enough.
    Some(since.map_or(std::time::Duration::MAX, |t| {
        std::time::Duration::try_from(now.duration_since(t)).unwrap_or_default()
    }))
}

/// The names of the claims a pod uses: named directly, or made from a template (known
/// once the claim exists, from the pod's status).
fn claim_names(pod: &Pod) -> Vec<String> {
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref());
    pod.spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|rc| {
            rc.resource_claim_name.clone().or_else(|| {
                statuses?
                    .iter()
                    .find(|s| s.name == rc.name)?
                    .resource_claim_name
                    .clone()
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
