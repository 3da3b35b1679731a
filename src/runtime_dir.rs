//! The runtime dir: everything the launcher owns for one VM (socket, console log, private
//! libvirtd, hotplug records, the last Sync). Root acts on what is in it — writes config files,
//! signals pids, unlinks nodes — so it must be the launcher's own: a directory, not a
//! symlink, owned by the launcher's user, writable by no one else, under directories no one else
//! can rename it out of (`owned_dir`). And one launcher at a time: a second `run` on the same
//! dir would adopt the first one's VM and stop it on exit. The lock is an `flock` held for the launcher's life, released by the kernel when it dies
//! (kill -9 included), so a restarted launcher never finds a stale lock.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use crate::owned_dir::{self, OwnedDirError};

#[derive(Debug, thiserror::Error)]
pub enum RuntimeDirError {
    #[error("cannot create or inspect the runtime dir {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("--runtime-dir: {path} is not safe to use: {why}")]
    Unsafe { path: PathBuf, why: String },
    #[error("--runtime-dir: another vmlauncher (pid {holder}) runs on {path}")]
    Busy { path: PathBuf, holder: String },
}

impl RuntimeDirError {
    /// The dir given cannot be this launcher's (someone else's, or in use): the operator's input
    /// is refused, as a bad spec is, not a failure of the launcher.
    pub fn is_refusal(&self) -> bool {
        matches!(self, Self::Unsafe { .. } | Self::Busy { .. })
    }
}

/// Where the launcher keeps what it owns for one VM.
#[derive(Debug, Clone)]
pub(crate) struct RuntimeDir(pub PathBuf);

/// The runtime dir's lock; the dir is this launcher's while it lives.
#[derive(Debug)]
pub(crate) struct RuntimeDirLock(#[allow(dead_code)] Flock<fs::File>);

impl RuntimeDir {
    /// Creates (0700) or checks the runtime dir and locks it for this launcher.
    pub(crate) fn claim(path: &Path) -> Result<(RuntimeDir, RuntimeDirLock), RuntimeDirError> {
        let io_err = |source| RuntimeDirError::Io {
            path: path.into(),
            source,
        };
        // Before anything is made: a directory made under an ancestor someone else could rename
        // would be theirs to redirect.
        owned_dir::check_ancestors(path).map_err(refused)?;
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)
            .map_err(io_err)?;
        let dir = RuntimeDir(path.into());
        take_fresh_shared_dir(path)?;
        check_owned(path)?;
        for sub in [dir.libvirt_dir(), dir.0.join("hotplug")] {
            if fs::symlink_metadata(&sub).is_ok() {
                check_owned(&sub)?;
            }
        }
        let lock_path = path.join("lock");
        let Some(mut lock) = try_lock(&lock_path).map_err(io_err)? else {
            let holder = fs::read_to_string(&lock_path).unwrap_or_default();
            return Err(RuntimeDirError::Busy {
                path: path.into(),
                holder: holder.trim().to_string(),
            });
        };
        // Who holds it, for the message a second launcher prints.
        lock.set_len(0).map_err(io_err)?;
        write!(&mut *lock, "{}", std::process::id()).map_err(io_err)?;
        Ok((dir, RuntimeDirLock(lock)))
    }

    pub(crate) fn socket(&self) -> PathBuf {
        self.0.join("launcher.sock")
    }
    pub(crate) fn libvirt_dir(&self) -> PathBuf {
        self.0.join("libvirt")
    }
}

/// An exclusive `flock` on the file `path` (made 0600 if missing, never through a link), held
/// while the returned value lives and released by the kernel when the process dies; `None`
/// when another process holds it.
pub(crate) fn try_lock(path: &Path) -> io::Result<Option<Flock<fs::File>>> {
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(Some(lock)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, errno)) => Err(errno.into()),
    }
}

/// A pod's runtime dir is an emptyDir, which Kubernetes makes 0777. One of ours that others
/// may write is taken only while it is empty: it is made 0700 first (from then on no one else
/// can add to it), then found empty (no one did before). Anything else is left to
/// [`check_owned`] to refuse.
fn take_fresh_shared_dir(path: &Path) -> Result<(), RuntimeDirError> {
    use std::os::unix::fs::PermissionsExt;
    let io_err = |source| RuntimeDirError::Io {
        path: path.into(),
        source,
    };
    let meta = fs::symlink_metadata(path).map_err(io_err)?;
    let ours = meta.uid() == nix::unistd::geteuid().as_raw();
    if !meta.file_type().is_dir() || !ours || meta.mode() & 0o022 == 0 {
        return Ok(());
    }
    fs::set_permissions(path, fs::Permissions::from_mode(0o700)).map_err(io_err)?;
    if fs::read_dir(path).map_err(io_err)?.next().is_some() {
        return Err(RuntimeDirError::Unsafe {
            path: path.into(),
            why: format!(
                "mode {:o} let others write it, and it is not empty",
                meta.mode() & 0o7777
            ),
        });
    }
    Ok(())
}

/// `path` is a directory (not a symlink to one) of the launcher's user that no one else can
/// write.
fn check_owned(path: &Path) -> Result<(), RuntimeDirError> {
    owned_dir::check_owned(path).map_err(refused)
}

/// The runtime dir, a directory in it or one above it cannot be the launcher's: `e` names
/// which directory and why.
fn refused(e: OwnedDirError) -> RuntimeDirError {
    match e {
        OwnedDirError::Io { path, source } => RuntimeDirError::Io { path, source },
        OwnedDirError::Unsafe { path, why } => RuntimeDirError::Unsafe { path, why },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_fresh_dir_is_made_private_and_locked_once() {
        let (_tmp, path) = crate::testing::temp_path("rt");
        let (_dir, lock) = RuntimeDir::claim(&path).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o700);
        let second = RuntimeDir::claim(&path).unwrap_err();
        let pid = std::process::id().to_string();
        assert!(
            matches!(&second, RuntimeDirError::Busy { holder, .. } if *holder == pid),
            "{second}"
        );
        drop(lock);
        RuntimeDir::claim(&path).unwrap();
    }

    #[test]
    fn a_dir_others_may_write_or_a_symlink_is_refused() {
        let (tmp, open) = crate::testing::temp_path("open");
        fs::create_dir(&open).unwrap();
        fs::write(open.join("libvirtd.conf"), "planted").unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        let err = RuntimeDir::claim(&open).unwrap_err();
        assert!(err.to_string().contains("mode 777"), "{err}");
        assert_eq!(
            fs::read_to_string(open.join("libvirtd.conf")).unwrap(),
            "planted"
        );

        // An empty one (a pod's emptyDir is 0777) is taken, and made private first.
        let empty_dir = tmp.path().join("empty-dir");
        fs::create_dir(&empty_dir).unwrap();
        fs::set_permissions(&empty_dir, fs::Permissions::from_mode(0o777)).unwrap();
        RuntimeDir::claim(&empty_dir).unwrap();
        assert_eq!(fs::metadata(&empty_dir).unwrap().mode() & 0o777, 0o700);

        let real = tmp.path().join("real");
        fs::create_dir(&real).unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let err = RuntimeDir::claim(&link).unwrap_err();
        assert!(err.to_string().contains("not a directory"), "{err}");

        // A planted libvirt dir inside an otherwise good runtime dir.
        let rt = tmp.path().join("rt");
        fs::create_dir_all(rt.join("libvirt")).unwrap();
        fs::set_permissions(&rt, fs::Permissions::from_mode(0o700)).unwrap();
        fs::set_permissions(rt.join("libvirt"), fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(
            RuntimeDir::claim(&rt),
            Err(RuntimeDirError::Unsafe { .. })
        ));
    }

    #[test]
    fn a_dir_under_an_ancestor_others_may_write_is_refused_and_not_made() {
        let tmp = tempfile::tempdir().unwrap();
        let open = tmp.path().join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        let rt = open.join("vm/rt");
        let err = RuntimeDir::claim(&rt).unwrap_err();
        assert!(err.is_refusal(), "{err}");
        let text = err.to_string();
        assert!(
            text.contains(&format!("{} is not safe", open.display())) && text.contains("mode 777"),
            "{text}"
        );
        assert!(!open.join("vm").exists());

        // Sticky, as /tmp is (where the tests' runtime dirs live): others cannot rename ours.
        fs::set_permissions(&open, fs::Permissions::from_mode(0o1777)).unwrap();
        RuntimeDir::claim(&rt).unwrap();
    }

    #[test]
    fn a_planted_lock_symlink_is_not_followed() {
        let (tmp, rt) = crate::testing::temp_path("rt");
        fs::create_dir(&rt).unwrap();
        fs::set_permissions(&rt, fs::Permissions::from_mode(0o700)).unwrap();
        let victim = tmp.path().join("victim");
        fs::write(&victim, "precious").unwrap();
        std::os::unix::fs::symlink(&victim, rt.join("lock")).unwrap();
        assert!(RuntimeDir::claim(&rt).is_err());
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
    }
}
