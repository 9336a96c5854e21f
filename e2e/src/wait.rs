//! Waiting for a condition, the one way tests and the test bed wait for anything that
//! happens in other processes.

use std::{future::Future, time::Duration};

/// How often a condition is checked.
const POLL: Duration = Duration::from_millis(100);

/// A condition that did not hold in time.
#[derive(Debug, thiserror::Error)]
#[error("timed out after {timeout:?} waiting for {what}")]
pub struct TimedOut {
    /// What was waited for, as a person would say it.
    pub what: String,
    /// How long.
    pub timeout: Duration,
}

/// Checks `check` every 100 ms until it yields `Some`, for at most `timeout`.
pub async fn eventually<T, F, Fut>(
    what: &str,
    timeout: Duration,
    mut check: F,
) -> Result<T, TimedOut>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(TimedOut {
                what: what.to_string(),
                timeout,
            });
        }
        tokio::time::sleep(POLL).await;
    }
}
