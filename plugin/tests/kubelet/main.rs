//! Kubelet-facing servers on real Unix sockets in a temporary directory, driven by the
//! crate's own client the way the kubelet drives them. A fake `DraDriver` stands in for
//! the plugin proper. Synchronisation is by channels and timeouts, never sleeps.

// Fixtures outside `#[test]` functions are test code too: a failed unwrap there is a
// failed test, and clippy's allow-unwrap-in-tests does not see them as tests.
#![allow(
    clippy::unwrap_used,
    reason = "a test fails loudly on the first unexpected error"
)]

mod authority;
mod common;
mod dra;
mod health;
mod registration;
mod sockets;
