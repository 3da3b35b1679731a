//! What the unit tests share.

use std::path::{Path, PathBuf};

use tempfile::TempDir;

/// A fresh temporary directory and the path of `name` in it, not created. The directory is
/// removed when the `TempDir` drops: bind it (`_dir`, not `_`) for as long as the test needs it.
pub(crate) fn temp_path(name: impl AsRef<Path>) -> (TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    (dir, path)
}
