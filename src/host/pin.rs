//! Pins a hot-plugged image file for QEMU: the inode the launcher opened and checked
//! (`host::open_image`) is bind-mounted onto an empty file of the launcher's own, in QEMU's
//! mount namespace, and QEMU is given that path.
//!
//! Why: libvirt 9.0 cannot pass a descriptor on hot-plug (`fdgroup` + attach makes QEMU fail
//! with "Could not dup FD", libvirt bug 2193315), so QEMU opens a path. The hotplug dir is
//! written by the node daemon (and, through it, a tenant): between the launcher's check and
//! QEMU's open the image there could become a link to any file. A pin lies in a directory only
//! the launcher writes, and what is mounted there is the checked inode itself — the mount is
//! cloned from the launcher's descriptor (`open_tree`), no path is resolved again.
//!
//! Where: in the mount namespace of the process that will open it. A mount made in the
//! launcher's namespace is not seen by the private libvirtd (a namespace of its own) nor by
//! QEMU (libvirt's per-domain namespace, a copy of libvirtd's made as QEMU starts). So a
//! short-lived helper enters that namespace (`setns`) and moves the cloned mount onto the
//! placeholder there: QEMU's namespace for a hot-plug, libvirtd's for a start (QEMU's is copied
//! from it), the same rule in a pod, where they may all be one.
//!
//! Unpinning is an unlink of the placeholder from the launcher's namespace: the kernel detaches
//! mounts on an unlinked file in every other namespace (Linux 3.18, "lazily remove mounts on
//! unlinked files"), so it needs neither QEMU alive nor its namespace, and works the same for a
//! restarted launcher. Only a mount in the launcher's own namespace makes the unlink fail
//! (`EBUSY`); it is detached there first.
//!
//! The pins live in `<runtime dir>/pins`, named `<volume>.img` — not under the private dir,
//! whose writable disks a migration copies: a hot-plugged file is shared by contract.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The pins' directory under the launcher's runtime dir.
pub(crate) const PIN_DIR: &str = "pins";

/// What a pin could not do.
#[derive(Debug, thiserror::Error)]
pub enum PinError {
    /// The launcher may not mount here: no CAP_SYS_ADMIN, or CAP_SYS_CHROOT for `setns`
    /// (`EPERM`), or a kernel or seccomp filter without `open_tree`/`move_mount` (`ENOSYS`:
    /// podman's default filter answers unknown calls so).
    #[error("cannot pin the image at {path}: mounting is not available here")]
    Unavailable {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// No process whose namespace QEMU opens the image in (QEMU's pid file unreadable).
    #[error("cannot pin the image at {path}: QEMU's (or libvirtd's) process is not known")]
    NoProcess { path: PathBuf },
    #[error("cannot pin the image at {path}: {step}")]
    Failed {
        path: PathBuf,
        step: &'static str,
        #[source]
        source: io::Error,
    },
}

/// The pins of one launcher: `<dir>/<volume>.img`.
#[derive(Debug, Clone)]
pub(crate) struct Pins {
    dir: PathBuf,
}

impl Pins {
    /// The pins under `runtime_dir`.
    #[cfg(test)]
    pub(crate) fn under(runtime_dir: &Path) -> Pins {
        Pins {
            dir: runtime_dir.join(PIN_DIR),
        }
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The pins in `dir` itself.
    pub(crate) fn in_dir(dir: &Path) -> Pins {
        Pins { dir: dir.into() }
    }

    /// Where volume `volume` is pinned (`<dir>/<volume>.img`, the file name it has in the
    /// hotplug dir: a migration moves the one to the other by directory alone).
    pub(crate) fn path(&self, volume: &str) -> PathBuf {
        path_in(&self.dir, volume)
    }

    /// Where the backing of volume `volume`'s overlay is pinned (`<dir>/<volume>.backing.img`:
    /// a volume's name has no dot, so the two never meet). Its pin name ([`Pins::pin`]) is
    /// `<volume>.backing`.
    pub(crate) fn backing_path(&self, volume: &str) -> PathBuf {
        path_in(&self.dir, &backing_name(volume))
    }

    /// Pins `image` (opened and checked by the launcher) as `volume`'s pin, in the mount
    /// namespace of process `namespace_of`. A pin left from before is replaced.
    pub(crate) fn pin(
        &self,
        volume: &str,
        image: &fs::File,
        namespace_of: i32,
    ) -> Result<PathBuf, PinError> {
        let target = self.path(volume);
        let failed = |step| {
            let target = target.clone();
            move |source: io::Error| PinError::Failed {
                path: target,
                step,
                source,
            }
        };
        self.make_dir()
            .map_err(failed("cannot make the pins' directory"))?;
        // A pin left by a launcher killed before it unpinned: QEMU has no disk on it (the
        // volume is not in the domain, or it would not be attached again).
        remove_pin(&target).map_err(failed("cannot remove an earlier pin"))?;
        make_placeholder(&target).map_err(failed("cannot make the mount point"))?;
        let pinned = mount_in(image, namespace_of, &target);
        if pinned.is_err() {
            // Nothing may stay behind a refused pin; the placeholder alone is harmless.
            let _ = remove_pin(&target);
        }
        pinned.map(|()| target)
    }

    /// Removes `volume`'s pin, in every namespace that has it (see the module doc). Only once
    /// QEMU let go of the disk: after libvirt's device-removed event, or with QEMU gone.
    pub(crate) fn unpin(&self, volume: &str) -> io::Result<()> {
        remove_pin(&self.path(volume))
    }

    /// The pins there are, by pin name (a volume, or `<volume>.backing`): after a start's or a
    /// migration target's pinning, those made (a refused pin leaves no file).
    pub(crate) fn list(&self) -> std::collections::BTreeMap<String, PathBuf> {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return Default::default();
        };
        entries
            .flatten()
            .filter_map(|entry| {
                let file_name = entry.file_name();
                let name = file_name.to_string_lossy();
                volume_of(&name)?;
                Some((name.strip_suffix(".img")?.to_owned(), entry.path()))
            })
            .collect()
    }

    /// Removes every pin but those of `keep` (a restarted launcher adopting a domain keeps the
    /// pins of the volumes it still has; `keep` empty at the VM's end).
    pub(crate) fn keep_only(&self, keep: &std::collections::BTreeSet<String>) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let volume = volume_of(&name);
            if volume.is_some_and(|v| keep.contains(v)) {
                continue;
            }
            if let Err(e) = remove_pin(&entry.path()) {
                tracing::warn!(pin = %entry.path().display(), error = %e, "cannot remove a pin");
            }
        }
    }

    /// The directory: the launcher's alone (its runtime dir is), searchable by QEMU's user, who
    /// opens the pins in it.
    fn make_dir(&self) -> io::Result<()> {
        match fs::DirBuilder::new().mode(0o711).create(&self.dir) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                // Made by this launcher or an earlier one on this runtime dir, which no one
                // else writes; a link there would still not be followed to pin elsewhere.
                if fs::symlink_metadata(&self.dir)?.is_dir() {
                    Ok(())
                } else {
                    Err(io::Error::other("not a directory"))
                }
            }
            done => done,
        }
    }
}

/// `<dir>/<volume>.img`.
fn path_in(dir: &Path, volume: &str) -> PathBuf {
    dir.join(format!("{volume}.img"))
}

/// The pin name of volume `volume`'s backing.
pub(crate) fn backing_name(volume: &str) -> String {
    format!("{volume}{BACKING}")
}

const BACKING: &str = ".backing";

/// The volume a pin's file name names (its own, or its backing's).
fn volume_of(file_name: &str) -> Option<&str> {
    let name = file_name.strip_suffix(".img")?;
    name.strip_suffix(BACKING)
        .unwrap_or(name)
        .split('.')
        .next()
        .filter(|v| !v.is_empty())
}

/// The empty file the image is mounted on, the launcher's (root's, 0600): what QEMU sees is
/// the mounted inode, with the owner the launcher gave it.
fn make_placeholder(path: &Path) -> io::Result<()> {
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map(drop)
}

/// Unlinks a pin: its mounts in other namespaces go with it; one in the launcher's own
/// namespace refuses the unlink (`EBUSY`) and is detached first.
fn remove_pin(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            nix::mount::umount2(
                path,
                nix::mount::MntFlags::MNT_DETACH | nix::mount::MntFlags::UMOUNT_NOFOLLOW,
            )?;
            fs::remove_file(path)
        }
        done => done,
    }
}

/// Mounts `image` on `target` in the mount namespace of process `pid`.
fn mount_in(image: &fs::File, pid: i32, target: &Path) -> Result<(), PinError> {
    let failed = |step| {
        move |source: io::Error| match source.raw_os_error() {
            Some(libc::EPERM | libc::ENOSYS) => PinError::Unavailable {
                path: target.into(),
                source,
            },
            _ => PinError::Failed {
                path: target.into(),
                step,
                source,
            },
        }
    };
    let tree = clone_mount(image).map_err(failed("cannot clone a mount of the image"))?;
    let namespace = fs::File::open(format!("/proc/{pid}/ns/mnt"))
        .map_err(failed("cannot open the mount namespace to pin in"))?;
    move_mount_in(&namespace, &tree, target).map_err(failed("cannot mount in that namespace"))
}

/// A detached mount of the very file `image` is (`open_tree(OPEN_TREE_CLONE)` on the
/// descriptor, no path). A plain `mount --bind /proc/self/fd/N` made in another namespace is
/// refused (`EINVAL`: the source mount is not in the caller's namespace); a detached mount may
/// be attached in any namespace the caller enters.
fn clone_mount(image: &fs::File) -> io::Result<OwnedFd> {
    const OPEN_TREE_CLOEXEC: libc::c_uint = libc::O_CLOEXEC as libc::c_uint;
    let empty = c"";
    // SAFETY: a raw system call on a descriptor we hold and a NUL-terminated empty path; the
    // descriptor it returns is new and ours.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            image.as_raw_fd(),
            empty.as_ptr(),
            libc::OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | libc::AT_EMPTY_PATH as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a descriptor the kernel just gave us and nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Attaches the detached mount `tree` at `target` in `namespace`. A helper process does it:
/// `setns` into a mount namespace is refused to a multi-threaded process, and the launcher is
/// one. `std::process::Command` forks it and runs the two system calls before exec (nothing
/// else: no allocation, the path prepared here), and hands back their error through its
/// close-on-exec pipe, so `spawn` fails exactly when the mount did; exec'ing `/bin/true` ends
/// the helper.
fn move_mount_in(namespace: &fs::File, tree: &OwnedFd, target: &Path) -> io::Result<()> {
    let target = CString::new(target.as_os_str().as_bytes()).map_err(io::Error::other)?;
    let (ns, tree) = (namespace.as_raw_fd(), tree.as_raw_fd());
    let mut helper = Command::new("/bin/true");
    helper
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: the closure runs in the forked child before exec and makes only raw system calls
    // on descriptors and a path prepared before the fork; it allocates nothing.
    unsafe {
        helper.pre_exec(move || {
            if libc::setns(ns, libc::CLONE_NEWNS) != 0 {
                return Err(io::Error::last_os_error());
            }
            let empty = c"";
            let moved = libc::syscall(
                libc::SYS_move_mount,
                tree,
                empty.as_ptr(),
                libc::AT_FDCWD,
                target.as_ptr(),
                libc::MOVE_MOUNT_F_EMPTY_PATH,
            );
            if moved != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = helper.spawn()?;
    // The mount is made once `spawn` returned; the wait only collects the helper (a PID-1
    // reaper may have collected it first: an error then says nothing about the mount).
    let _ = child.wait();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn a_pin_is_named_after_its_volume_as_in_the_hotplug_dir() {
        let pins = Pins::under(Path::new("/run/vml"));
        assert_eq!(pins.path("data"), Path::new("/run/vml/pins/data.img"));
        assert_eq!(volume_of("data.img"), Some("data"));
        // An overlay's backing is its volume's (a volume's name has no dot).
        assert_eq!(
            pins.backing_path("data"),
            Path::new("/run/vml/pins/data.backing.img")
        );
        assert_eq!(volume_of("data.backing.img"), Some("data"));
        assert_eq!(volume_of(".img"), None);
        assert_eq!(volume_of("data"), None);
    }

    fn may_mount() -> bool {
        crate::host::caps::effective().is_ok_and(|c| c.contains(&caps::Capability::CAP_SYS_ADMIN))
    }

    /// The pin is the inode the descriptor was, whatever happens to the path after; unpinning
    /// removes it from the namespace that had it. Made in this process's own namespace (the
    /// helper enters it again), so the unpin goes through the `EBUSY` path.
    #[test]
    fn a_pin_keeps_the_checked_inode_when_the_path_is_swapped() {
        // The suite runs as root (scripts/test.sh): without CAP_SYS_ADMIN this test fails
        // rather than pass without testing the pin.
        assert!(
            may_mount(),
            "mounting is not permitted here: run the tests as root with CAP_SYS_ADMIN"
        );
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("data.img");
        let other = dir.path().join("other");
        fs::write(&image, b"checked").unwrap();
        fs::write(&other, b"swapped").unwrap();
        let file = fs::File::open(&image).unwrap();
        let pins = Pins::under(dir.path());
        let pin = pins.pin("data", &file, std::process::id() as i32).unwrap();
        // The path where the image was becomes a link to another file.
        fs::remove_file(&image).unwrap();
        std::os::unix::fs::symlink(&other, &image).unwrap();
        let mut seen = String::new();
        fs::File::open(&pin)
            .unwrap()
            .read_to_string(&mut seen)
            .unwrap();
        assert_eq!(seen, "checked");
        let (a, b) = (fs::metadata(&pin).unwrap(), file.metadata().unwrap());
        assert_eq!((a.dev(), a.ino()), (b.dev(), b.ino()));
        // Pinning again replaces the pin.
        let mut again = tempfile::NamedTempFile::new_in(dir.path()).unwrap();
        again.write_all(b"again").unwrap();
        pins.pin("data", again.as_file(), std::process::id() as i32)
            .unwrap();
        assert_eq!(fs::read(&pin).unwrap(), b"again");
        pins.unpin("data").unwrap();
        assert!(!pin.exists());
        let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!mounts.contains(pin.to_str().unwrap()), "{mounts}");
        // Unpinning what is not pinned is no error.
        pins.unpin("data").unwrap();
    }

    #[test]
    fn keep_only_removes_the_other_pins() {
        let dir = tempfile::tempdir().unwrap();
        let pins = Pins::under(dir.path());
        pins.make_dir().unwrap();
        for volume in ["a", "b"] {
            make_placeholder(&pins.path(volume)).unwrap();
        }
        pins.keep_only(&["a".to_string()].into());
        assert!(pins.path("a").exists());
        assert!(!pins.path("b").exists());
    }
}
