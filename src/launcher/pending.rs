//! Volumes waiting for their source (Pending): their paths watched, and a Sync retried as soon
//! as one appears.

use super::coordinator::Launcher;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Watches the sources pending volumes wait for, and syncs again as soon as one appears.
pub(super) async fn pending_watcher(launcher: std::sync::Weak<Launcher>) {
    let Some(mut pending) = launcher.upgrade().map(|l| l.pending.subscribe()) else {
        return;
    };
    loop {
        let waiting: BTreeMap<String, PathBuf> = pending.borrow_and_update().clone();
        if waiting.is_empty() {
            if pending.changed().await.is_err() {
                return;
            }
            continue;
        }
        let paths: Vec<PathBuf> = waiting.values().cloned().collect();
        // Armed before looking, so that nothing appearing in between is missed.
        let mut watch = match crate::host::watch::PathWatch::new(&paths) {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(error = %crate::error_chain(&e), "cannot watch pending volumes' sources; the next Sync retries them");
                None
            }
        };
        if !paths.iter().any(|p| p.exists()) {
            tokio::select! {
                changed = pending.changed() => {
                    if changed.is_err() { return; }
                    continue;
                }
                woke = async { match watch.as_mut() {
                    Some(w) => w.changed().await,
                    None => std::future::pending().await,
                } } => {
                    if let Err(e) = woke {
                        tracing::warn!(error = %crate::error_chain(&e), "watching pending volumes failed");
                    }
                }
            }
            if !paths.iter().any(|p| p.exists()) {
                // Something else changed there (or a directory on the way appeared): re-arm.
                continue;
            }
        }
        let Some(l) = launcher.upgrade() else {
            return;
        };
        l.retry_pending().await;
        drop(l);
        // If the retry could not settle them (the VM is stopped, say), wait for a change rather
        // than retrying in a loop.
        if *pending.borrow() == waiting && pending.changed().await.is_err() {
            return;
        }
    }
}
