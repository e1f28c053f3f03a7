//! Stopping: the watch every long-running task ends on.

use tokio::sync::watch;

/// Resolves once `stop` turns true. (The guard `wait_for` returns is not
/// `Send`, so it is dropped here rather than held across a `select!`.)
/// A channel whose sender is gone (e.g. no admin API to request a drain)
/// never stops anything.
pub async fn stopped(stop: &mut watch::Receiver<bool>) {
    if stop.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await;
    }
}
