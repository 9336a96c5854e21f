//! The openb format of the Alibaba GPU-sharing trace (cluster-trace-gpu-v2023, published
//! with the FGD paper, USENIX ATC'23): a pod list
//! `name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time]`
//! and a node list `sn,cpu_milli,memory_mib,gpu,model`. Columns are found by header name,
//! so the shorter `multigpu20` list reads too; `gpu_spec` and `model` are ignored (the
//! modelled GPU is a flag of the run).

use super::{Fields, Header, InputError, check_gpu_fields, data_lines};
use crate::workload::{NodeSpec, PodSpec};

/// Parses an openb pod list. Pods keep the list's order (the FGD simulator's arrival
/// order); `creation_time` and `deletion_time`, when present, become arrival and
/// departure.
pub fn parse_pods(source_name: &str, text: &str) -> Result<Vec<PodSpec>, InputError> {
    let mut lines = data_lines(text);
    let Some((_, header)) = lines.next() else {
        return Err(InputError::Empty {
            source_name: source_name.to_string(),
        });
    };
    let h = Header::new(source_name, header);
    let (name, cpu, mem, gpus, milli) = (
        h.index("name")?,
        h.index("cpu_milli")?,
        h.index("memory_mib")?,
        h.index("num_gpu")?,
        h.index("gpu_milli")?,
    );
    let (created, deleted) = (h.optional("creation_time"), h.optional("deletion_time"));
    let mut pods = Vec::new();
    for (n, line) in lines {
        let f = Fields::split(source_name, n, line, h.len())?;
        let g = f.u32("num_gpu", gpus)?;
        let m = f.u32("gpu_milli", milli)?;
        check_gpu_fields(&f, g, m, milli)?;
        let arrival = match created {
            Some(i) => f.u64("creation_time", i)?,
            None => 0,
        };
        let departure = match deleted {
            Some(i) => f.optional_u64("deletion_time", i)?,
            None => None,
        };
        pods.push(PodSpec {
            name: f.text(name).to_string(),
            cpu_milli: f.u64("cpu_milli", cpu)?,
            memory_mib: f.u64("memory_mib", mem)?,
            gpus: g,
            gpu_milli: m,
            arrival,
            departure,
        });
    }
    Ok(pods)
}

/// Parses an openb node list.
pub fn parse_nodes(source_name: &str, text: &str) -> Result<Vec<NodeSpec>, InputError> {
    let mut lines = data_lines(text);
    let Some((_, header)) = lines.next() else {
        return Err(InputError::Empty {
            source_name: source_name.to_string(),
        });
    };
    let h = Header::new(source_name, header);
    let (name, cpu, mem, gpus) = (
        h.index("sn")?,
        h.index("cpu_milli")?,
        h.index("memory_mib")?,
        h.index("gpu")?,
    );
    let mut nodes = Vec::new();
    for (n, line) in lines {
        let f = Fields::split(source_name, n, line, h.len())?;
        nodes.push(NodeSpec {
            name: f.text(name).to_string(),
            cpu_milli: f.u64("cpu_milli", cpu)?,
            memory_mib: f.u64("memory_mib", mem)?,
            gpus: f.u32("gpu", gpus)?,
        });
    }
    Ok(nodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PODS: &str = "\
name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
openb-pod-0000,12000,16384,1,1000,,LS,Running,0,12537496,0
openb-pod-0001,6000,12288,1,460,,LS,Running,427061,12902960,427061
openb-pod-0002,8000,30517,0,0,,BE,Running,9565025,,9565025
openb-pod-0003,32000,65536,8,1000,V100M32,LS,Running,9565030,9566000,9565030
";

    #[test]
    fn a_pod_list_reads_shares_whole_gpus_and_cpu_pods() {
        let pods = parse_pods("pods.csv", PODS).unwrap();
        assert_eq!(pods.len(), 4);
        assert_eq!(
            pods[1],
            PodSpec {
                name: "openb-pod-0001".into(),
                cpu_milli: 6000,
                memory_mib: 12288,
                gpus: 1,
                gpu_milli: 460,
                arrival: 427061,
                departure: Some(12902960),
            }
        );
        assert!(pods[1].is_sharing() && !pods[0].is_sharing());
        assert_eq!(pods[2].departure, None);
        assert_eq!(pods[3].gpu_demand_milli(), 8000);
    }

    #[test]
    fn the_short_multigpu_list_reads_without_times() {
        let pods = parse_pods(
            "m.csv",
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,1024,2,1000\n",
        )
        .unwrap();
        assert_eq!(
            (pods[0].gpus, pods[0].arrival, pods[0].departure),
            (2, 0, None)
        );
    }

    #[test]
    fn a_bad_share_names_the_line_and_column() {
        let text = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,1,500\np1,1,1,2,500\n";
        let err = parse_pods("pods.csv", text).unwrap_err();
        assert_eq!(
            err.to_string(),
            "pods.csv line 3: gpu_milli = \"500\": a pod of several GPUs asks for whole GPUs (1000)"
        );
        let err = parse_pods(
            "pods.csv",
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,x,1,0,0\n",
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("pods.csv line 2: cpu_milli = \"x\""),
            "{err}"
        );
    }

    #[test]
    fn a_missing_column_or_short_line_is_refused() {
        let err = parse_pods("p.csv", "name,cpu_milli,memory_mib,gpu_milli\n").unwrap_err();
        assert!(matches!(
            err,
            InputError::MissingColumn {
                column: "num_gpu",
                ..
            }
        ));
        let err = parse_pods(
            "p.csv",
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1\n",
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "p.csv line 2: 3 fields, the header has 5");
        assert!(matches!(
            parse_pods("p.csv", ""),
            Err(InputError::Empty { .. })
        ));
    }

    #[test]
    fn a_node_list_reads_gpu_counts() {
        let nodes = parse_nodes(
            "nodes.csv",
            "sn,cpu_milli,memory_mib,gpu,model\nopenb-node-0000,64000,262144,2,P100\n",
        )
        .unwrap();
        assert_eq!(
            nodes,
            vec![NodeSpec {
                name: "openb-node-0000".into(),
                cpu_milli: 64000,
                memory_mib: 262144,
                gpus: 2
            }]
        );
        let err = parse_nodes(
            "nodes.csv",
            "sn,cpu_milli,memory_mib,gpu,model\nn,1,1,-2,T4\n",
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "nodes.csv line 2: gpu = \"-2\": not a non-negative integer"
        );
    }
}
