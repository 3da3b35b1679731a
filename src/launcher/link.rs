//! The launcher's link to libvirt: the connector (which starts a private daemon again when it
//! died) and the current connection, gone while libvirt is unreachable. The lock is taken
//! after the task slot when both are held, and only for a clone, a swap or a take. A planned
//! restart of the private libvirtd (`daemon_restart.rs`) holds `planned` while it replaces the
//! connection: a loss heard meanwhile is judged after it, against the new connection.

use std::sync::{Arc, RwLock};

use super::error::LauncherError;
use crate::libvirt::{Connector, Hypervisor};

#[derive(Debug)]
pub(super) struct Link {
    connector: Arc<Connector>,
    current: RwLock<Option<Arc<Hypervisor>>>,
    planned: tokio::sync::Mutex<()>,
}

impl Link {
    pub(super) fn new(connector: Arc<Connector>, hv: Hypervisor) -> Link {
        Link {
            connector,
            current: RwLock::new(Some(Arc::new(hv))),
            planned: tokio::sync::Mutex::new(()),
        }
    }

    pub(super) fn connector(&self) -> &Arc<Connector> {
        &self.connector
    }

    /// The current connection; `Unreachable` while there is none.
    pub(super) fn hypervisor(&self) -> Result<Arc<Hypervisor>, LauncherError> {
        self.current
            .read()
            .expect("link lock")
            .clone()
            .ok_or(LauncherError::Unreachable)
    }

    /// The connection is lost (or the launcher is ending): taken, for the caller to drop off
    /// the async threads.
    pub(super) fn take(&self) -> Option<Arc<Hypervisor>> {
        self.current.write().expect("link lock").take()
    }

    /// A new connection replaces whatever there was.
    pub(super) fn connected(&self, hv: Hypervisor) {
        drop(self.replace(hv));
    }

    /// A new connection replaces the current one, returned for the caller to drop off the
    /// async threads: never a moment without a connection.
    pub(super) fn replace(&self, hv: Hypervisor) -> Option<Arc<Hypervisor>> {
        self.current
            .write()
            .expect("link lock")
            .replace(Arc::new(hv))
    }

    /// Held for a planned replacement of the connection; waited for by whoever heard of a
    /// loss before judging it.
    pub(super) async fn planned(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.planned.lock().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_connection_is_unreachable_until_a_new_one() {
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let connector = Arc::new(Connector::new(
            crate::libvirt::Backend::Uri("test:///default".into()),
            tx,
        ));
        let link = Link::new(connector.clone(), connector.connect().unwrap());
        assert!(link.hypervisor().is_ok());
        assert!(link.take().is_some());
        assert!(matches!(link.hypervisor(), Err(LauncherError::Unreachable)));
        assert!(link.take().is_none());
        link.connected(link.connector().connect().unwrap());
        assert!(link.hypervisor().is_ok());
    }
}
