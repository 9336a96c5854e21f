//! What Tessera's binaries (`tessera-plugin`, `tessera-operator`) run the same way.
//!
//! - [`http`]: the small endpoint serving `/metrics`, `/healthz` and `/readyz`, in the
//!   [`exposition`] format the scraper asks for.
//! - [`build_info`]: the version and git revision, and the `tessera_build_info` gauge.
//! - [`client`]: the API client, from a kubeconfig or the pod's ServiceAccount.
//! - [`process`]: logging set-up and the shutdown signal.
//! - [`error_chain`]: an error with its sources on one line.

pub mod build_info;
pub mod client;
pub mod exposition;
pub mod http;
pub mod process;

/// An error with its whole source chain (`a: b: c`), for logs and per-claim messages:
/// `Display` of a wrapping error shows only the outermost layer.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}
