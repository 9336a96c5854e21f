//! Tessera's own scenario CSV: nodes and pods in one file, so a scenario is one artefact.
//!
//! ```text
//! # kind,name,cpu_milli,memory_mib,gpus,gpu_milli,arrival,departure
//! kind,name,cpu_milli,memory_mib,gpus,gpu_milli,arrival,departure
//! node,node-a,96000,786432,8,,,
//! pod,train-0,8000,65536,2,1000,0,
//! pod,infer-0,4000,16384,1,250,10,3600
//! ```
//!
//! - `node` lines: allocatable CPU (millicores), memory (MiB) and the number of GPUs; the
//!   last three fields stay empty.
//! - `pod` lines: requests, GPUs (0 for a CPU-only pod), the share of each GPU in
//!   milli-GPU (1000 = whole; below 1000 only with one GPU), arrival and optional
//!   departure in seconds. Pods are replayed in arrival order, ties in file order.
//! - Blank lines and lines starting with `#` are skipped; the header line is required.

use super::{Fields, Header, InputError, check_gpu_fields, data_lines};
use crate::workload::{NodeSpec, PodSpec, Workload};

/// The columns, in order.
pub const COLUMNS: [&str; 8] = [
    "kind",
    "name",
    "cpu_milli",
    "memory_mib",
    "gpus",
    "gpu_milli",
    "arrival",
    "departure",
];

/// Parses a scenario.
pub fn parse(source_name: &str, text: &str) -> Result<Workload, InputError> {
    let mut lines = data_lines(text);
    let Some((_, header)) = lines.next() else {
        return Err(InputError::Empty {
            source_name: source_name.to_string(),
        });
    };
    let h = Header::new(source_name, header);
    let [kind, name, cpu, mem, gpus, milli, arrival, departure] = [
        h.index(COLUMNS[0])?,
        h.index(COLUMNS[1])?,
        h.index(COLUMNS[2])?,
        h.index(COLUMNS[3])?,
        h.index(COLUMNS[4])?,
        h.index(COLUMNS[5])?,
        h.index(COLUMNS[6])?,
        h.index(COLUMNS[7])?,
    ];
    let mut w = Workload::default();
    for (n, line) in lines {
        let f = Fields::split(source_name, n, line, h.len())?;
        match f.text(kind) {
            "node" => w.nodes.push(NodeSpec {
                name: f.text(name).to_string(),
                cpu_milli: f.u64("cpu_milli", cpu)?,
                memory_mib: f.u64("memory_mib", mem)?,
                gpus: f.u32("gpus", gpus)?,
            }),
            "pod" => {
                let g = f.u32("gpus", gpus)?;
                let m = if g == 0 && f.text(milli).is_empty() {
                    0
                } else {
                    f.u32("gpu_milli", milli)?
                };
                check_gpu_fields(&f, g, m, milli)?;
                let arrives = f.u64("arrival", arrival)?;
                let leaves = f.optional_u64("departure", departure)?;
                if leaves.is_some_and(|d| d < arrives) {
                    return Err(f.error("departure", departure, "leaves before it arrives"));
                }
                w.pods.push(PodSpec {
                    name: f.text(name).to_string(),
                    cpu_milli: f.u64("cpu_milli", cpu)?,
                    memory_mib: f.u64("memory_mib", mem)?,
                    gpus: g,
                    gpu_milli: m,
                    arrival: arrives,
                    departure: leaves,
                });
            }
            other => {
                return Err(f.line_error(format!("kind {other:?} is neither \"node\" nor \"pod\"")));
            }
        }
    }
    // Stable: equal arrivals keep the file's order.
    w.pods.sort_by_key(|p| p.arrival);
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "kind,name,cpu_milli,memory_mib,gpus,gpu_milli,arrival,departure\n";

    #[test]
    fn a_scenario_reads_nodes_and_pods_in_arrival_order() {
        let text = format!(
            "{HEADER}# two nodes\nnode,a,96000,786432,8,,,\nnode,b,16000,65536,1,,,\n\
             pod,late,1000,1024,1,250,20,30\npod,early,1000,1024,2,1000,5,\npod,cpu,500,512,0,,5,9\n"
        );
        let w = parse("s.csv", &text).unwrap();
        assert_eq!(w.nodes.len(), 2);
        assert_eq!(w.nodes[1].gpus, 1);
        let names: Vec<&str> = w.pods.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, vec!["early", "cpu", "late"]);
        assert_eq!(w.pods[2].departure, Some(30));
        assert_eq!(w.pods[1].gpu_milli, 0);
    }

    #[test]
    fn an_unknown_kind_names_its_line() {
        let err = parse(
            "s.csv",
            &format!("{HEADER}node,a,1,1,1,,,\ngpu,x,1,1,1,1,1,1\n"),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "s.csv line 3: kind \"gpu\" is neither \"node\" nor \"pod\""
        );
    }

    #[test]
    fn a_pod_leaving_before_it_arrives_is_refused() {
        let err = parse("s.csv", &format!("{HEADER}pod,p,1,1,1,500,10,5\n")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "s.csv line 2: departure = \"5\": leaves before it arrives"
        );
    }

    #[test]
    fn a_share_above_one_gpu_is_refused() {
        let err = parse("s.csv", &format!("{HEADER}pod,p,1,1,1,1500,0,\n")).unwrap_err();
        assert!(
            err.to_string().contains("a GPU share is at most 1000"),
            "{err}"
        );
    }
}
