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
//!
//! The shared files are trusted input to every later VM on the host: libvirt checks a cached file
//! only by versions and timestamps, which anyone can copy from the real one, and the file decides
//! the host-model CPU (which mitigations the guest sees), what `q35` stands for and QEMU's
//! capability flags. So the shared dir must be the launcher's own as the runtime dir is
//! (`owned_dir`: its user's, writable by no one else, under directories no one else can rename);
//! one that is not is neither read nor written. Its files are read bounded and never through a
//! link, so a link to `/dev/zero` or a FIFO planted there cannot exhaust memory or hang a start.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::durable::{self, Contents};
use crate::owned_dir::{self, OwnedDirError};

/// The shared cache on a host, and in the image (warmed at build time).
pub const DEFAULT_DIR: &str = "/var/cache/vmlauncher/qemu-capabilities";

/// The private libvirtd's cache directory, relative to its libvirt dir (`/var/cache/libvirt` is
/// its `cache` subdirectory, see `daemon.rs`).
pub(crate) const PRIVATE_SUBDIR: &str = "cache/qemu/capabilities";

/// The largest capability file read: libvirt's are about 200 KiB (209 468 bytes for Debian 12's
/// QEMU 7.2), so this leaves room for far larger QEMUs and still stops a planted giant.
const MAX_FILE: u64 = 4 << 20;

#[derive(Debug, thiserror::Error)]
pub(crate) enum CapCacheError {
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
    #[error("the capability cache file {path} is larger than {max} bytes")]
    TooLarge { path: PathBuf, max: u64 },
    #[error("the shared capability cache {dir} is not safe to use")]
    Unsafe {
        dir: PathBuf,
        #[source]
        source: OwnedDirError,
    },
}

/// The shared cache `dir` is the launcher's own: see the module's notes.
fn check_shared(dir: &Path) -> Result<(), CapCacheError> {
    let refused = |source| CapCacheError::Unsafe {
        dir: dir.into(),
        source,
    };
    owned_dir::check_ancestors(dir).map_err(refused)?;
    owned_dir::check_owned(dir).map_err(refused)
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
/// how many were copied; none from a shared dir that is not the launcher's own.
pub(crate) fn seed(shared: &Path, private: &Path) -> Result<usize, CapCacheError> {
    match fs::symlink_metadata(shared) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        _ => check_shared(shared)?,
    }
    copy_files(shared, private, Which::Every)
}

/// Publishes every private cache file that the shared cache lacks or holds differently.
/// Returns how many were written; none into a shared dir that is not the launcher's own (checked
/// above it before it is made, and itself once it exists).
pub(crate) fn publish(private: &Path, shared: &Path) -> Result<usize, CapCacheError> {
    owned_dir::check_ancestors(shared).map_err(|source| CapCacheError::Unsafe {
        dir: shared.into(),
        source,
    })?;
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
    if matches!(which, Which::Changed) {
        check_shared(to)?;
    }
    let mut written = 0;
    for (name, path) in files {
        let text = match durable::read_bounded(&path, MAX_FILE) {
            Ok(Contents::Read(text)) => text,
            // Gone since the directory was listed (another launcher's rename): nothing to copy.
            Ok(Contents::Missing) => continue,
            Ok(Contents::TooLarge) => {
                return Err(CapCacheError::TooLarge {
                    path,
                    max: MAX_FILE,
                })
            }
            Err(source) => return Err(CapCacheError::Read { path, source }),
        };
        // Whatever is not a readable file of the same bytes (a link, a FIFO, a giant) is
        // replaced: the rename takes its place without reading or following it.
        if matches!(which, Which::Changed)
            && matches!(durable::read_bounded(&to.join(&name), MAX_FILE),
                        Ok(Contents::Read(old)) if old == text)
        {
            continue;
        }
        put(to, &name, &text, write)?;
        written += 1;
    }
    Ok(written)
}

/// Has libvirtd on `conn` load QEMU's capabilities (probing QEMU if its cache has no valid file)
/// and nothing else: it compares a CPU every x86 QEMU has (`qemu64`) with what QEMU can run,
/// which needs those capabilities and no more. The domain capabilities, which the launcher asked
/// for before (issue 46), load them too, but also run swtpm's and swtpm_setup's capability
/// probes and read every firmware descriptor: 10–25 ms more on a fresh daemon, on the start's
/// path, for nothing a start uses (`docs/performance.md`). The comparison's answer is not used.
pub(crate) fn load_capabilities(conn: &virt::connect::Connect) -> Result<(), virt::error::Error> {
    let (arch, virt_type) = (c"x86_64", c"qemu");
    let cpu = c"<cpu><model>qemu64</model></cpu>";
    // SAFETY: `conn` is an open connection for the call's length; the strings are NUL-terminated
    // and outlive it; a null emulator and machine are libvirt's defaults. The `virt` crate has no
    // wrapper for this call.
    let rc = unsafe {
        virt::sys::virConnectCompareHypervisorCPU(
            conn.as_ptr(),
            std::ptr::null(),
            arch.as_ptr(),
            std::ptr::null(),
            virt_type.as_ptr(),
            cpu.as_ptr(),
            0,
        )
    };
    if rc < 0 {
        return Err(virt::error::Error::last_error());
    }
    Ok(())
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

    #[test]
    fn links_and_fifos_in_the_cache_are_never_read() {
        use nix::sys::stat::Mode;
        let shared = tempfile::tempdir().unwrap();
        let (_private, private_caps) = crate::testing::temp_path(PRIVATE_SUBDIR);
        fs::create_dir_all(&private_caps).unwrap();
        fs::write(private_caps.join("a.xml"), "<qemuCaps>1</qemuCaps>").unwrap();
        fs::write(private_caps.join("b.xml"), "<qemuCaps>2</qemuCaps>").unwrap();
        // Planted under the names the launcher publishes: a link to a file of the very same
        // bytes (read through, it would look up to date and stay), and a FIFO (opened, it
        // would wait for a writer forever).
        let elsewhere = tempfile::tempdir().unwrap();
        fs::write(elsewhere.path().join("a.xml"), "<qemuCaps>1</qemuCaps>").unwrap();
        std::os::unix::fs::symlink(elsewhere.path().join("a.xml"), shared.path().join("a.xml"))
            .unwrap();
        nix::unistd::mkfifo(&shared.path().join("b.xml"), Mode::S_IRWXU).unwrap();
        let (from, to) = (private_caps.clone(), shared.path().to_path_buf());
        let published =
            crate::testing::without_blocking("publishing over a FIFO", move || publish(&from, &to));
        assert_eq!(published.unwrap(), 2);
        for name in ["a.xml", "b.xml"] {
            assert!(fs::symlink_metadata(shared.path().join(name))
                .unwrap()
                .is_file());
        }

        // A link or a FIFO in the shared dir is not seeded.
        fs::remove_file(shared.path().join("a.xml")).unwrap();
        std::os::unix::fs::symlink("/dev/zero", shared.path().join("a.xml")).unwrap();
        fs::remove_file(shared.path().join("b.xml")).unwrap();
        nix::unistd::mkfifo(&shared.path().join("b.xml"), Mode::S_IRWXU).unwrap();
        fs::write(shared.path().join("c.xml"), "<qemuCaps>3</qemuCaps>").unwrap();
        let (_second, second_caps) = crate::testing::temp_path(PRIVATE_SUBDIR);
        assert_eq!(seed(shared.path(), &second_caps).unwrap(), 1);
        assert!(second_caps.join("c.xml").exists());
        assert!(!second_caps.join("a.xml").exists());
    }

    #[test]
    fn a_giant_file_is_not_copied() {
        let shared = tempfile::tempdir().unwrap();
        let giant = shared.path().join("a.xml");
        fs::File::create(&giant)
            .unwrap()
            .set_len(MAX_FILE + 1)
            .unwrap();
        let (_private, private_caps) = crate::testing::temp_path(PRIVATE_SUBDIR);
        let err = seed(shared.path(), &private_caps).unwrap_err();
        assert!(matches!(err, CapCacheError::TooLarge { .. }), "{err}");
        assert!(!private_caps.join("a.xml").exists());
    }

    #[test]
    fn a_shared_dir_others_may_write_or_someone_elses_is_neither_read_nor_written() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let shared = tmp.path().join("shared");
        fs::create_dir(&shared).unwrap();
        fs::write(shared.join("abc.xml"), "<qemuCaps>planted</qemuCaps>").unwrap();
        let (_private, private_caps) = crate::testing::temp_path(PRIVATE_SUBDIR);
        fs::create_dir_all(&private_caps).unwrap();
        fs::write(private_caps.join("abc.xml"), "<qemuCaps>1</qemuCaps>").unwrap();

        fs::set_permissions(&shared, fs::Permissions::from_mode(0o777)).unwrap();
        let err = seed(&shared, &private_caps).unwrap_err();
        assert!(
            crate::error_chain(&err).contains("mode 777"),
            "{}",
            crate::error_chain(&err)
        );
        assert_eq!(
            fs::read_to_string(private_caps.join("abc.xml")).unwrap(),
            "<qemuCaps>1</qemuCaps>"
        );
        assert!(publish(&private_caps, &shared).is_err());

        fs::set_permissions(&shared, fs::Permissions::from_mode(0o755)).unwrap();
        let other = nix::unistd::geteuid().as_raw() + 4242;
        nix::unistd::chown(&shared, Some(other.into()), None).unwrap();
        let err = publish(&private_caps, &shared).unwrap_err();
        assert!(matches!(err, CapCacheError::Unsafe { .. }), "{err}");
        assert_eq!(
            fs::read_to_string(shared.join("abc.xml")).unwrap(),
            "<qemuCaps>planted</qemuCaps>"
        );
        // An ancestor others may write: the shared dir is not even made.
        let open = tmp.path().join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(publish(&private_caps, &open.join("caps")).is_err());
        assert!(!open.join("caps").exists());
    }
}
