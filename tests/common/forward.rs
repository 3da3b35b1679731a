//! A unix-socket byte forwarder: what virt-handler's migration proxy is between two pods (a
//! unix socket in the source pod, TCP between the nodes, a unix socket in the target pod), for
//! two launchers on one machine. Each connection is joined to a new one to `to`, both ways,
//! until either side closes.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Forwards while it lives.
pub struct Forwarder {
    listen: PathBuf,
    stop: Arc<AtomicBool>,
}

impl Forwarder {
    /// Listens at `listen` (open to QEMU's user, which connects to some of these sockets) and
    /// joins each connection to `to`.
    pub fn start(listen: &Path, to: &Path) -> Forwarder {
        let listener =
            UnixListener::bind(listen).unwrap_or_else(|e| panic!("bind {}: {e}", listen.display()));
        std::fs::set_permissions(listen, std::fs::Permissions::from_mode(0o666)).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (to, stopped) = (to.to_path_buf(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                // Nothing there (the target not listening yet, or gone): the caller sees its
                // connection closed, as through virt-handler's proxy.
                let Ok(upstream) = UnixStream::connect(&to) else {
                    continue;
                };
                join(conn, upstream);
            }
        });
        Forwarder {
            listen: listen.to_path_buf(),
            stop,
        }
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accepting thread, which then sees the stop.
        let _ = UnixStream::connect(&self.listen);
        let _ = std::fs::remove_file(&self.listen);
    }
}

fn join(a: UnixStream, b: UnixStream) {
    let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) else {
        return;
    };
    std::thread::spawn(move || pump(a, b));
    std::thread::spawn(move || pump(b2, a2));
}

/// Copies until `from` ends, then says so to `to` (its write side closed).
fn pump(mut from: UnixStream, mut to: UnixStream) {
    let _ = io::copy(&mut from, &mut to);
    let _ = to.shutdown(std::net::Shutdown::Write);
}
