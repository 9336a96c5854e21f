//! Which nodes a `nodeSelector` picks (Kubernetes `LabelSelector` semantics) and which
//! GPUs a `gpuSelector` picks.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use tessera_api::policy::GpuSelector;

/// A selector the API server stored but that selects nothing sensible (the CRD schema
/// cannot check `LabelSelector` operators).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// An operator other than `In`, `NotIn`, `Exists`, `DoesNotExist`.
    #[error(
        "matchExpressions key {key:?}: operator {operator:?} is not one of In, NotIn, Exists, DoesNotExist"
    )]
    UnknownOperator {
        /// The requirement's key.
        key: String,
        /// The operator given.
        operator: String,
    },
    /// `In`/`NotIn` without values, or `Exists`/`DoesNotExist` with some.
    #[error("matchExpressions key {key:?}: operator {operator} {}", if *.needs_values { "needs at least one value" } else { "takes no values" })]
    Values {
        /// The requirement's key.
        key: String,
        /// The operator given.
        operator: String,
        /// Whether the operator needs values (else it takes none).
        needs_values: bool,
    },
}

/// Whether `labels` satisfy `selector`; `None` selects everything, as does an empty
/// selector (the Kubernetes rule for `LabelSelector`).
pub fn matches_labels(
    selector: Option<&LabelSelector>,
    labels: &BTreeMap<String, String>,
) -> Result<bool, SelectorError> {
    let Some(selector) = selector else {
        return Ok(true);
    };
    let by_labels = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let mut by_expressions = true;
    for req in selector.match_expressions.iter().flatten() {
        // Every requirement is checked, so a malformed one is reported even when an
        // earlier one already failed.
        by_expressions &= requirement(req, labels)?;
    }
    Ok(by_labels && by_expressions)
}

fn requirement(
    req: &LabelSelectorRequirement,
    labels: &BTreeMap<String, String>,
) -> Result<bool, SelectorError> {
    let values = req.values.as_deref().unwrap_or_default();
    let value = labels.get(&req.key);
    let check_values = |needs: bool| {
        if needs == values.is_empty() {
            Err(SelectorError::Values {
                key: req.key.clone(),
                operator: req.operator.clone(),
                needs_values: needs,
            })
        } else {
            Ok(())
        }
    };
    match req.operator.as_str() {
        "In" => {
            check_values(true)?;
            Ok(value.is_some_and(|v| values.contains(v)))
        }
        "NotIn" => {
            check_values(true)?;
            Ok(value.is_none_or(|v| !values.contains(v)))
        }
        "Exists" => {
            check_values(false)?;
            Ok(value.is_some())
        }
        "DoesNotExist" => {
            check_values(false)?;
            Ok(value.is_none())
        }
        other => Err(SelectorError::UnknownOperator {
            key: req.key.clone(),
            operator: other.to_string(),
        }),
    }
}

/// What a `gpuSelector` looks at: a GPU's identity as its node's plugin reports it.
#[derive(Clone, Copy, Debug)]
pub struct GpuIdentity<'a> {
    /// NVML index on the node.
    pub index: u32,
    /// NVML product name.
    pub product_name: &'a str,
}

/// Whether `selector` (none: every GPU) picks the GPU.
pub fn matches_gpu(selector: Option<&GpuSelector>, gpu: GpuIdentity<'_>) -> bool {
    let Some(s) = selector else {
        return true;
    };
    (s.product_names.is_empty()
        || s.product_names
            .iter()
            .any(|p| names_product(p, gpu.product_name)))
        && (s.indices.is_empty() || s.indices.contains(&gpu.index))
}

/// Whether a `gpuSelector.productNames` entry names the product NVML calls
/// `product_name`, in any of the three ways users write it: NVML's own string
/// (`NVIDIA H100 80GB HBM3`), GPU feature discovery's `nvidia.com/gpu.product` label
/// (spaces made dashes: `NVIDIA-H100-80GB-HBM3`), or Tessera's model id (`h100-80gb`,
/// `kubectl tessera profiles`). Case does not matter.
pub fn names_product(entry: &str, product_name: &str) -> bool {
    let label = |s: &str| s.trim().replace(' ', "-").to_ascii_lowercase();
    label(entry) == label(product_name)
        || tessera_gpu::find_model(product_name)
            .is_ok_and(|m| m.id.eq_ignore_ascii_case(entry.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect()
    }

    fn expr(key: &str, operator: &str, values: &[&str]) -> LabelSelector {
        LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: key.into(),
                operator: operator.into(),
                values: (!values.is_empty())
                    .then(|| values.iter().map(|v| (*v).to_string()).collect()),
            }]),
            match_labels: None,
        }
    }

    #[test]
    fn no_selector_and_an_empty_one_select_every_node() {
        let node = labels(&[("zone", "a")]);
        assert!(matches_labels(None, &node).unwrap());
        assert!(matches_labels(Some(&LabelSelector::default()), &node).unwrap());
        assert!(matches_labels(Some(&LabelSelector::default()), &labels(&[])).unwrap());
    }

    #[test]
    fn match_labels_need_every_pair() {
        let sel = LabelSelector {
            match_labels: Some(
                [("gpu", "h100"), ("zone", "a")]
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .into(),
            ),
            match_expressions: None,
        };
        assert!(matches_labels(Some(&sel), &labels(&[("gpu", "h100"), ("zone", "a")])).unwrap());
        assert!(!matches_labels(Some(&sel), &labels(&[("gpu", "h100")])).unwrap());
        assert!(!matches_labels(Some(&sel), &labels(&[("gpu", "a100"), ("zone", "a")])).unwrap());
    }

    #[test]
    fn each_operator_follows_the_kubernetes_rule() {
        let h100 = labels(&[("gpu", "h100")]);
        let a100 = labels(&[("gpu", "a100")]);
        let none = labels(&[]);
        let cases = [
            (expr("gpu", "In", &["h100", "h200"]), [true, false, false]),
            (expr("gpu", "NotIn", &["h100"]), [false, true, true]),
            (expr("gpu", "Exists", &[]), [true, true, false]),
            (expr("gpu", "DoesNotExist", &[]), [false, false, true]),
        ];
        for (sel, want) in cases {
            let got = [&h100, &a100, &none].map(|l| matches_labels(Some(&sel), l).unwrap());
            assert_eq!(got, want, "{sel:?}");
        }
    }

    #[test]
    fn labels_and_expressions_must_both_hold() {
        let mut sel = expr("zone", "In", &["a"]);
        sel.match_labels = Some([("gpu".to_string(), "h100".to_string())].into());
        assert!(matches_labels(Some(&sel), &labels(&[("gpu", "h100"), ("zone", "a")])).unwrap());
        assert!(!matches_labels(Some(&sel), &labels(&[("gpu", "h100"), ("zone", "b")])).unwrap());
    }

    #[test]
    fn malformed_requirements_are_errors_that_name_them() {
        let err = matches_labels(Some(&expr("gpu", "Equals", &["x"])), &labels(&[])).unwrap_err();
        assert!(
            err.to_string().contains("\"Equals\" is not one of"),
            "{err}"
        );
        let err = matches_labels(Some(&expr("gpu", "In", &[])), &labels(&[])).unwrap_err();
        assert!(
            err.to_string().contains("needs at least one value"),
            "{err}"
        );
        let err = matches_labels(Some(&expr("gpu", "Exists", &["x"])), &labels(&[])).unwrap_err();
        assert!(err.to_string().contains("takes no values"), "{err}");
    }

    #[test]
    fn gpu_selectors_match_product_and_index() {
        let gpu = GpuIdentity {
            index: 2,
            product_name: "NVIDIA H100 80GB HBM3",
        };
        assert!(matches_gpu(None, gpu));
        assert!(matches_gpu(Some(&GpuSelector::default()), gpu));
        let by_product = GpuSelector {
            product_names: vec![
                "NVIDIA A100-SXM4-40GB".into(),
                "NVIDIA H100 80GB HBM3".into(),
            ],
            indices: vec![],
        };
        assert!(matches_gpu(Some(&by_product), gpu));
        let both = GpuSelector {
            indices: vec![0, 1],
            ..by_product
        };
        assert!(!matches_gpu(Some(&both), gpu), "the index does not match");
    }

    #[test]
    fn product_names_are_matched_as_nvml_feature_discovery_or_tessera_write_them() {
        let h100 = "NVIDIA H100 80GB HBM3";
        for entry in [
            "NVIDIA H100 80GB HBM3",
            "NVIDIA-H100-80GB-HBM3",
            "nvidia-h100-80gb-hbm3",
            "h100-80gb",
            "H100-80GB",
        ] {
            assert!(names_product(entry, h100), "{entry}");
        }
        for entry in [
            "h200-141gb",
            "NVIDIA-H100",
            "NVIDIA H100",
            "h100",
            "NVIDIA-A100-SXM4-40GB",
        ] {
            assert!(!names_product(entry, h100), "{entry}");
        }
        assert!(names_product("a100-40gb", "NVIDIA A100-SXM4-40GB"));
        assert!(names_product(
            "NVIDIA-A100-SXM4-40GB",
            "NVIDIA A100-SXM4-40GB"
        ));
        let gpu = GpuIdentity {
            index: 0,
            product_name: h100,
        };
        let by_id = GpuSelector {
            product_names: vec!["l4".into(), "h100-80gb".into()],
            indices: vec![],
        };
        assert!(matches_gpu(Some(&by_id), gpu));
    }
}
