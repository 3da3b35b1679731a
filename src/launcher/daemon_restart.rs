//! A planned restart of the private libvirtd, under the running guest: a migration target's,
//! to close its TLS listener once the incoming migration is over (security review N-4). Unlike
//! a lost libvirtd (`reconciler.rs`: phase Unknown until it is back), the status stays what it
//! was: no task runs, no state is read and no loss is judged until the new connection is in
//! place.
use super::coordinator::Launcher;
use super::error::LauncherError;

impl Launcher {
    /// Starts the private libvirtd again without its TLS listener; false if it had none. The
    /// caller made sure no one still needs it (`run/incoming.rs`: the source's libvirtd gone).
    pub(crate) async fn close_tls_listener(&self) -> Result<bool, LauncherError> {
        // In this order, the launcher's: the task slot, then the link, then the reads.
        let _slot = self.tasks.take().await;
        let planned = self.link.planned().await;
        let reading = self.live.reading().await;
        if self.signals.is_closing() {
            return Ok(false);
        }
        let c = self.link.connector().clone();
        let restarted = tokio::task::spawn_blocking(move || c.close_tls_listener())
            .await
            .map_err(LauncherError::Join)??;
        if !restarted {
            return Ok(false);
        }
        let c = self.link.connector().clone();
        let connected = tokio::task::spawn_blocking(move || c.connect())
            .await
            .map_err(LauncherError::Join)?;
        match connected {
            Ok(hv) => {
                let old = self.link.replace(hv);
                // Dropping it deregisters its callbacks: a libvirt call, off the async threads.
                let _ = tokio::task::spawn_blocking(move || drop(old)).await;
                drop((reading, planned));
                // One look at the guest through the new daemon, as after any event.
                self.signals.wake();
                Ok(true)
            }
            Err(e) => {
                // The new daemon does not answer: a loss like any other, reported as one.
                tracing::error!(error = %crate::error_chain(&e), "cannot reconnect to the restarted libvirtd");
                drop((reading, planned));
                self.reconnect().await;
                Ok(true)
            }
        }
    }
}
