//! What the unit tests share.

use std::path::{Path, PathBuf};

use tempfile::TempDir;

/// The smallest valid instance, named `name` (64 MiB of memory, nothing else), with `domain`
/// lines (indented 4) under `spec.domain` and `spec` lines (indented 2) under `spec`. The one
/// minimal-spec builder of the unit tests: a field every instance comes to need is added here once.
pub(crate) fn minimal_vmi(name: &str, domain: &str, spec: &str) -> String {
    format!(
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata: {{name: {name}}}\n\
         spec:\n  domain:\n    memory: {{guest: 64Mi}}\n{domain}\n{spec}\n"
    )
}

/// A fresh temporary directory and the path of `name` in it, not created. The directory is
/// removed when the `TempDir` drops: bind it (`_dir`, not `_`) for as long as the test needs it.
pub(crate) fn temp_path(name: impl AsRef<Path>) -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    (dir, path)
}

/// Runs `f` on its own thread and returns its result, failing the test with `what` if it has
/// not returned within ten seconds: for code that must not block, where a regression would
/// otherwise hang the test run instead of failing it.
pub(crate) fn without_blocking<T: Send + 'static>(
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(10))
        .unwrap_or_else(|_| panic!("{what} blocked (no answer within 10 s)"))
}

/// A block device node for `dev` at `path`, mode 0600 (the tests run as root, as the launcher).
pub(crate) fn block_node(path: &Path, dev: crate::host::DevNumber) {
    nix::sys::stat::mknod(
        path,
        nix::sys::stat::SFlag::S_IFBLK,
        nix::sys::stat::Mode::from_bits_truncate(0o600),
        nix::sys::stat::makedev(dev.major.into(), dev.minor.into()),
    )
    .expect("mknod (the tests run as root)");
}
