//! Hand-written schemas for string fields whose shape the API server must check.
//!
//! Each string carries a `maxLength`: the API server estimates the cost of every CEL rule
//! from the largest value a field may hold and refuses a CRD whose rules could be too
//! expensive, so unbounded strings under a rule make the CRD itself invalid.

use schemars::{Schema, SchemaGenerator, json_schema};

/// A MIG profile name such as `1g.10gb`, `3g.40gb` or `1g.10gb+me`.
pub(crate) fn mig_profile_name(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "maxLength": 32,
        "x-kubernetes-validations": [{
            "rule": "self.matches('^[1-8]g\\\\.[0-9]+gb(\\\\+me)?$')",
            "messageExpression": "'MIG profile ' + self + ' is not a profile name: use <compute slices>g.<memory GB>gb with an optional +me, e.g. 1g.10gb, 3g.40gb or 1g.10gb+me (see kubectl tessera profiles)'"
        }, {
            "rule": format!("!self.matches('^[1-8]g\\\\.[0-9]+gb(\\\\+me)?$') || self in [{}]", known_profiles()),
            "messageExpression": format!("'no GPU Tessera supports has MIG profile ' + self + '; the profiles are {}'", crate::constants::MIG_PROFILES.join(", "))
        }]
    })
}

/// [`crate::constants::MIG_PROFILES`] as a CEL list body.
fn known_profiles() -> String {
    crate::constants::MIG_PROFILES
        .iter()
        .map(|p| format!("'{p}'"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A memory size as a Kubernetes quantity, e.g. `8Gi`.
pub(crate) fn memory_quantity(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "maxLength": 32,
        "x-kubernetes-validations": [{
            "rule": "isQuantity(self) && quantity(self).isGreaterThan(quantity('0'))",
            "messageExpression": "'memory limit ' + self + ' is not a positive quantity: write it like 8Gi or 512Mi'"
        }]
    })
}

/// A duration such as `90s`, `10m` or `1h30m` (Go duration syntax).
pub(crate) fn duration(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "maxLength": 32,
        "x-kubernetes-validations": [{
            "rule": "self.matches('^([0-9]+(ms|s|m|h))+$')",
            "messageExpression": "'duration ' + self + ' is not valid: write it like 90s, 10m or 1h30m'"
        }]
    })
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63
/// characters (what the API server checks on a Node's labels).
const LABEL_KEY: &str = "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$";
/// A label value: empty, or at most 63 characters that start and end alphanumeric.
const LABEL_VALUE: &str = "^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$";

/// CEL: whether the string `s` is a label key.
fn is_label_key(s: &str) -> String {
    format!("{s}.matches('{LABEL_KEY}') && size({s}) - ({s}.lastIndexOf('/') + 1) <= 63")
}

/// A `metav1.LabelSelector` (the Node selector of a policy), with what the API server
/// checks on Deployments' selectors checked here too: operators, their values, label keys
/// and values. Without it a typo would only show later, as the operator's
/// `InvalidSelector`.
pub(crate) fn label_selector(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "description": "A label selector: matchLabels and matchExpressions, ANDed.",
        "properties": {
            "matchLabels": {
                "type": "object",
                "description": "Labels the Node must have, with these values.",
                "maxProperties": 32,
                "additionalProperties": {"type": "string", "maxLength": 63},
                "x-kubernetes-validations": [{
                    "rule": format!("self.all(k, size(k) <= 317 && {})", is_label_key("k")),
                    "message": "nodeSelector.matchLabels has a key that is not a label key: use an optional DNS prefix and '/', then up to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit (e.g. tessera.dev/pool)"
                }, {
                    "rule": format!("self.all(k, self[k].matches('{LABEL_VALUE}'))"),
                    "message": "nodeSelector.matchLabels has a value that is not a label value: up to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
                }]
            },
            "matchExpressions": {
                "type": "array",
                "description": "Requirements on the Node's labels.",
                "maxItems": 32,
                "items": {
                    "type": "object",
                    "required": ["key", "operator"],
                    "properties": {
                        "key": {
                            "type": "string",
                            "description": "The label key.",
                            "maxLength": 317,
                            "x-kubernetes-validations": [{
                                "rule": is_label_key("self"),
                                "messageExpression": "'nodeSelector.matchExpressions: ' + self + ' is not a label key: use an optional DNS prefix and \\'/\\', then up to 63 letters, digits, \\'-\\', \\'_\\' or \\'.\\', starting and ending with a letter or digit'"
                            }]
                        },
                        "operator": {
                            "type": "string",
                            "description": "In, NotIn, Exists or DoesNotExist.",
                            "enum": ["In", "NotIn", "Exists", "DoesNotExist"]
                        },
                        "values": {
                            "type": "array",
                            "description": "With In and NotIn, the values (at least one); with Exists and DoesNotExist, none.",
                            "maxItems": 64,
                            "items": {
                                "type": "string",
                                "maxLength": 63,
                                "x-kubernetes-validations": [{
                                    "rule": format!("self.matches('{LABEL_VALUE}')"),
                                    "messageExpression": "'nodeSelector.matchExpressions: ' + self + ' is not a label value: up to 63 letters, digits, \\'-\\', \\'_\\' or \\'.\\', starting and ending with a letter or digit'"
                                }]
                            }
                        }
                    },
                    "x-kubernetes-validations": [{
                        "rule": "!(self.operator in ['In', 'NotIn']) || (has(self.values) && size(self.values) > 0)",
                        "messageExpression": "'nodeSelector.matchExpressions: operator ' + self.operator + ' on ' + self.key + ' needs at least one value'"
                    }, {
                        "rule": "self.operator in ['In', 'NotIn'] || !has(self.values) || size(self.values) == 0",
                        "messageExpression": "'nodeSelector.matchExpressions: operator ' + self.operator + ' on ' + self.key + ' takes no values: remove them, or use In or NotIn'"
                    }]
                }
            }
        }
    })
}
