//! QEMU's capability cache, shared by every launcher on a host.
//!
//! libvirtd probes each QEMU binary (starts it, asks QMP what it can do) the first time it needs
//! its capabilities and caches the answer as `<cache>/qemu/capabilities/<hash>.xml`. A private
//! libvirtd's cache lives in its runtime dir, so without sharing every `run` pays the probe: 4.7 s
//! to phase Running here, against 0.7 s with a warm cache. So the files are kept in one
//! persistent directory (`--qemu-cache-dir`, default [`DEFAULT_DIR`]):
//!
//! - before its libvirtd starts, a launcher **seeds** its private cache with the shared files;
//! - once libvirtd answers, the launcher has it load the capabilities (probing if the seeded
//!   file is missing or stale) and **publishes** every file that differs from the shared one.
//!
//! libvirt itself decides whether a cached file is still valid (QEMU's and libvirt's binaries
//! and versions, the kernel, microcode, whether KVM is usable) and probes again when it is not,
//! so a stale shared file costs one probe, never a wrong answer. Publishing writes a temporary
//! file and renames it into place: two launchers starting at once each read either the old or
//! the new complete file, never a torn one, and the last rename wins with a file as good as the
//! other.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// The shared cache on a host, and in the image (warmed at build time).
pub const DEFAULT_DIR: &str = "/var/cache/vmlauncher/qemu-capabilities";

/// The private libvirtd's cache directory, relative to its libvirt dir (`/var/cache/libvirt` is
/// its `cache` subdirectory, see `daemon.rs`).
pub const PRIVATE_SUBDIR: &str = "cache/qemu/capabilities";

#[derive(Debug, thiserror::Error)]
pub enum CapCacheError {
    #[error("cannot read the capability cache {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write the capability cache file {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The cache files (`*.xml`) in `dir`, by name; none if `dir` does not exist.
fn cache_files(dir: &Path) -> Result<Vec<(std::ffi::OsString, PathBuf)>, CapCacheError> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(CapCacheError::Read {
                path: dir.into(),
                source,
            })
        }
    };
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| CapCacheError::Read {
            path: dir.into(),
            source,
        })?;
        let path = entry.path();
        let is_file = entry.file_type().is_ok_and(|t| t.is_file());
        if is_file && path.extension().is_some_and(|e| e == "xml") {
            files.push((entry.file_name(), path));
        }
    }
    Ok(files)
}

/// Writes `text` to `dir/name` whole or not at all (a reader never sees half a capability file),
/// with `write`: `durable::write_durably` for the shared cache, which outlives the machine's
/// crashes, `durable::write_atomically` for a launcher's private copy, made again at every start.
fn put(
    dir: &Path,
    name: &std::ffi::OsStr,
    text: &[u8],
    write: fn(&Path, &[u8]) -> std::io::Result<()>,
) -> Result<(), CapCacheError> {
    let target = dir.join(name);
    write(&target, text).map_err(|source| CapCacheError::Write {
        path: target.clone(),
        source,
    })
}

/// Copies every shared cache file into the private cache `private` (made if missing). Returns
/// how many were copied.
pub fn seed(shared: &Path, private: &Path) -> Result<usize, CapCacheError> {
    copy_files(shared, private, Which::Every)
}

/// Publishes every private cache file that the shared cache lacks or holds differently.
/// Returns how many were written.
pub fn publish(private: &Path, shared: &Path) -> Result<usize, CapCacheError> {
    copy_files(private, shared, Which::Changed)
}

/// Which cache files [`copy_files`] writes, and how.
enum Which {
    /// All of them, atomically: a private cache is seeded whole.
    Every,
    /// Those the target lacks or holds differently, durably (synced to disk): the shared cache,
    /// which every launcher's start would otherwise pay the sync for files that are the same.
    Changed,
}

/// The cache files of `from` written into `to` (made if missing; see [`put`]). Returns how
/// many were written.
fn copy_files(from: &Path, to: &Path, which: Which) -> Result<usize, CapCacheError> {
    let write = match which {
        Which::Every => crate::durable::write_atomically,
        Which::Changed => crate::durable::write_durably,
    };
    let files = cache_files(from)?;
    if files.is_empty() {
        return Ok(0);
    }
    fs::create_dir_all(to).map_err(|source| CapCacheError::Write {
        path: to.into(),
        source,
    })?;
    let mut written = 0;
    for (name, path) in files {
        let text = fs::read(&path).map_err(|source| CapCacheError::Read {
            path: path.clone(),
            source,
        })?;
        if matches!(which, Which::Changed)
            && fs::read(to.join(&name)).ok().as_deref() == Some(text.as_slice())
        {
            continue;
        }
        put(to, &name, &text, write)?;
        written += 1;
    }
    Ok(written)
}

/// Has libvirtd at `uri` load QEMU's capabilities (probing QEMU if its cache has no valid file),
/// through the domain capabilities every start asks for anyway.
pub fn load_capabilities(uri: &str) -> Result<(), virt::error::Error> {
    let conn = super::connect(uri)?;
    // One cache file per QEMU binary, whatever the virt type: "qemu" is always available.
    conn.domain_capabilities(None, Some("x86_64"), None, Some("qemu"), 0)
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_and_publish_move_only_cache_files_and_only_changes() {
        let shared = tempfile::tempdir().unwrap();
        let (_private, private_caps) = crate::testing::temp_path(PRIVATE_SUBDIR);
        // Nothing shared yet: nothing seeded, and the private dir is not even made.
        assert_eq!(seed(&shared.path().join("none"), &private_caps).unwrap(), 0);
        assert!(!private_caps.exists());

        // A first launcher probed: its file is published, a stray file is not.
        fs::create_dir_all(&private_caps).unwrap();
        fs::write(private_caps.join("abc.xml"), "<qemuCaps>1</qemuCaps>").unwrap();
        fs::write(private_caps.join("notes.txt"), "x").unwrap();
        assert_eq!(publish(&private_caps, shared.path()).unwrap(), 1);
        assert_eq!(
            fs::read_to_string(shared.path().join("abc.xml")).unwrap(),
            "<qemuCaps>1</qemuCaps>"
        );
        assert!(!shared.path().join("notes.txt").exists());
        // Unchanged: nothing rewritten.
        assert_eq!(publish(&private_caps, shared.path()).unwrap(), 0);

        // A second launcher starts from the shared file.
        let (_second, second_caps) = crate::testing::temp_path(PRIVATE_SUBDIR);
        assert_eq!(seed(shared.path(), &second_caps).unwrap(), 1);
        assert_eq!(
            fs::read_to_string(second_caps.join("abc.xml")).unwrap(),
            "<qemuCaps>1</qemuCaps>"
        );
        // libvirt found it stale and probed again: the new file replaces the shared one, and no
        // temporary file is left behind.
        fs::write(second_caps.join("abc.xml"), "<qemuCaps>2</qemuCaps>").unwrap();
        assert_eq!(publish(&second_caps, shared.path()).unwrap(), 1);
        assert_eq!(
            fs::read_to_string(shared.path().join("abc.xml")).unwrap(),
            "<qemuCaps>2</qemuCaps>"
        );
        let names: Vec<_> = fs::read_dir(shared.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["abc.xml"]);
    }
}
