//! Placement scoring for 10,000 GPUs with random occupancy, and counter generation for
//! a node of 8 GPUs.

use std::{hint::black_box, time::Duration};

use criterion::{Criterion, criterion_group, criterion_main};
use rand::{Rng, SeedableRng, rngs::StdRng};
use tessera_gpu::{
    Occupancy, Placement,
    counters::CounterScheme,
    find_model,
    naming::mig_device_name,
    order::{choose_placement, gpu_order, publishing_order},
};

fn random_occupancies(n: usize) -> Vec<Occupancy> {
    let layout = find_model("h100-80gb").ok().and_then(|m| m.mig.clone());
    let Some(layout) = layout else {
        return Vec::new();
    };
    let all: Vec<Placement> = layout
        .all_placements()
        .map(|(p, start)| Placement {
            profile_id: p.profile_id,
            start,
        })
        .collect();
    let mut rng = StdRng::seed_from_u64(42);
    (0..n)
        .map(|_| {
            let mut occ = Occupancy::new();
            let tries = rng.random_range(0..6);
            for tag in 0..tries {
                let pl = all[rng.random_range(0..all.len())];
                let _ = occ.place(&layout, pl, tag);
            }
            occ
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let Ok(model) = find_model("h100-80gb") else {
        return;
    };
    let Some(layout) = model.mig.clone() else {
        return;
    };
    let occs = random_occupancies(10_000);

    c.bench_function("choose a 1g placement on each of 10k GPUs", |b| {
        b.iter(|| {
            occs.iter()
                .filter_map(|o| choose_placement(&layout, o, 19))
                .count()
        })
    });
    c.bench_function(
        "publishing order of all 25 placements on each of 10k GPUs",
        |b| {
            b.iter(|| {
                occs.iter()
                    .map(|o| publishing_order(&layout, o).len())
                    .sum::<usize>()
            })
        },
    );
    c.bench_function("order 10k GPUs most-used first", |b| {
        let gpus: Vec<(u32, &Occupancy)> = (0u32..).zip(occs.iter()).collect();
        b.iter(|| gpu_order(black_box(&gpus)).len())
    });
    c.bench_function(
        "counter sets and device consumptions for a node of 8 GPUs",
        |b| {
            b.iter(|| {
                let scheme = CounterScheme::new(&layout);
                let mut n = 0;
                for gpu in 0..8u32 {
                    n += scheme.counter_set(gpu).counters.len();
                    n += scheme.full_gpu_consumption(gpu).counters.len();
                    for (p, start) in layout.all_placements() {
                        let pl = Placement {
                            profile_id: p.profile_id,
                            start,
                        };
                        if let Ok(c) = scheme.placement_consumption(gpu, &layout, pl) {
                            n += c.counters.len();
                        }
                        if let Ok(name) = mig_device_name(gpu, &p.name, start) {
                            n += name.len();
                        }
                    }
                }
                black_box(n)
            })
        },
    );
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    targets = bench
}
criterion_main!(benches);
