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
