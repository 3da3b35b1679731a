//! The host's own files a spec names (`hostDisk.path`, `kernelPath`, `initrdPath`), opened by the
//! launcher at every start of the domain, never only when a spec is taken: whoever owns the
//! file's directory (the VM's owner, say `/home/alice/vms`) can swap the file between two boots.
//!
//! A path is walked one component at a time from `/`, each step relative to the directory
//! opened before it (`openat`), so what was checked is what is opened. A symbolic link is
//! followed only where nobody but root can have put it (a directory owned by root that neither
//! its group nor others may write: `/dev/disk/by-id`, `/var/run`); any other is refused, naming
//! the link. The file's own directory must be writable by nobody but root and its owner: a
//! group- or world-writable one (sticky or not) lets others replace the file.
//!
//! A hostDisk is then handed to QEMU by descriptor, and a kernel or an initrd is copied into
//! the launcher's own `boot` directory and that copy given to QEMU's user ([`copy_boot_file`]):
//! libvirt has no descriptor for `<kernel>`/`<initrd>`. No host file's owner or mode is changed.
//! Nothing here knows the spec: paths and owners come in as parameters.

use std::ffi::OsStr;
use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fstat, fstatat, mkdirat, FileStat, Mode, SFlag};
use nix::unistd::{fchown, Gid, Uid};

use super::root_dir::RootDir;
use super::walk::{file_type, walk_to_parent};
use super::{devnode::NodeOwner, HostError};

/// The largest kernel or initrd copied (a distribution's initrd with every module is ~100 MiB).
pub(crate) const MAX_BOOT_FILE: u64 = 512 << 20;
/// Whether QEMU's user (`qemu`) may open the hostDisk `file` (at `path`) as it will, by its
/// path and as itself: where no descriptor reaches QEMU (a Sync's attach, which libvirt 9.0
/// cannot give one; a migration target; `--connect`), the launcher changes no host file's
/// owner, so the file's own mode must let QEMU in. A file with an ACL is left to the kernel's
/// judgement when QEMU opens it.
pub(crate) fn qemu_may_open(
    file: &fs::File,
    path: &Path,
    qemu: NodeOwner,
    writable: bool,
) -> Result<(), HostError> {
    use std::os::unix::fs::MetadataExt;
    if qemu.uid == 0 || super::acl::has_acl(file) {
        return Ok(());
    }
    let meta = file.metadata().map_err(|source| HostError::Inspect {
        path: path.into(),
        source,
    })?;
    let wanted = if writable { 0o6 } else { 0o4 };
    if super::qemu_user::mode_permits(&meta, qemu.uid, &[qemu.gid], wanted) {
        return Ok(());
    }
    Err(HostError::QemuMayNotOpen {
        path: path.into(),
        mode: meta.mode() & 0o7777,
        owner: meta.uid(),
        group: meta.gid(),
        qemu: qemu.uid,
        access: if writable { "read and write" } else { "read" },
    })
}

/// The launcher's copies of kernels and initrds, in its private dir.
pub(crate) const BOOT_DIR: &str = "boot";

/// What a host file is opened as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A disk image or a block device; `create`: a sparse file of that many bytes where none is
    /// (`DiskOrCreate`), with the missing directories.
    Disk { writable: bool, create: Option<u64> },
    /// A kernel or an initrd: a regular file of at most [`MAX_BOOT_FILE`] bytes, read only.
    Boot,
}

/// Opens `path` as `kind` (see the module's paragraph): the open file, checked to be what
/// `kind` asks for.
pub(crate) fn open_host_file(path: &Path, kind: Kind) -> Result<fs::File, HostError> {
    let create = match kind {
        Kind::Disk { create, .. } => create,
        Kind::Boot => None,
    };
    let make_dirs = create.map(|_| Mode::from_bits_truncate(0o755));
    let (dir, name) = walk_to_parent(path, make_dirs)?;
    let failed = |e: Errno| match e {
        Errno::ENOENT => HostError::Missing { path: path.into() },
        Errno::ELOOP => HostError::Link { path: path.into() },
        e => HostError::Inspect {
            path: path.into(),
            source: e.into(),
        },
    };
    let seen = fstatat(
        &dir,
        name.as_os_str(),
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    );
    let writable = matches!(kind, Kind::Disk { writable: true, .. }) || create.is_some();
    let access = if writable {
        OFlag::O_RDWR
    } else {
        OFlag::O_RDONLY
    };
    let flags = access | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC;
    check_dir(&dir, path)?;
    let file: fs::File = match (seen, create) {
        (Err(Errno::ENOENT), Some(capacity)) => {
            let fd = openat(
                &dir,
                name.as_os_str(),
                flags | OFlag::O_CREAT | OFlag::O_EXCL,
                Mode::from_bits_truncate(0o660),
            )
            .map_err(failed)?;
            let file = fs::File::from(fd);
            file.set_len(capacity).map_err(|source| HostError::Create {
                path: path.into(),
                source,
            })?;
            return Ok(file);
        }
        (Err(e), _) => return Err(failed(e)),
        // Refused before it is opened: opening a device may do something by itself.
        (Ok(st), _) if !fits(&st, kind) => return Err(not_what(path, kind)),
        (Ok(_), _) => openat(&dir, name.as_os_str(), flags, Mode::empty())
            .map_err(failed)?
            .into(),
    };
    let st = fstat(&file).map_err(failed)?;
    if !fits(&st, kind) {
        return Err(not_what(path, kind));
    }
    if kind == Kind::Boot && st.st_size as u64 > MAX_BOOT_FILE {
        return Err(HostError::TooLarge {
            path: path.into(),
            size: st.st_size as u64,
            max: MAX_BOOT_FILE,
        });
    }
    Ok(file)
}

fn fits(st: &FileStat, kind: Kind) -> bool {
    let t = file_type(st);
    match kind {
        Kind::Disk { .. } => t == SFlag::S_IFREG || t == SFlag::S_IFBLK,
        Kind::Boot => t == SFlag::S_IFREG,
    }
}

fn not_what(path: &Path, kind: Kind) -> HostError {
    match kind {
        Kind::Disk { .. } => HostError::NotADisk { path: path.into() },
        Kind::Boot => HostError::NotAFile { path: path.into() },
    }
}

/// Nobody but root and the owner may write `dir`, the file's directory: anyone else could put
/// another file (or a link) in the file's place between two starts.
fn check_dir(dir: &OwnedFd, path: &Path) -> Result<(), HostError> {
    let st = fstat(dir).map_err(|e| HostError::Inspect {
        path: path.into(),
        source: e.into(),
    })?;
    if st.st_mode & 0o022 != 0 {
        return Err(HostError::DirWritableByOthers {
            path: path.into(),
            mode: st.st_mode & 0o7777,
            owner: st.st_uid,
        });
    }
    Ok(())
}

/// Opens (making it if needed) the launcher's `boot` directory in `private_dir`: root's, 0711,
/// so that QEMU's user reaches the copies by name and cannot add, remove or rename any. One
/// that is not so (someone else made it) is refused.
pub(crate) fn boot_dir(private_dir: &Path) -> Result<RootDir, HostError> {
    let path = private_dir.join(BOOT_DIR);
    let failed = |e: Errno| HostError::Inspect {
        path: path.clone(),
        source: e.into(),
    };
    let dir_flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let private =
        openat(nix::fcntl::AT_FDCWD, private_dir, dir_flags, Mode::empty()).map_err(|e| {
            HostError::Inspect {
                path: private_dir.into(),
                source: e.into(),
            }
        })?;
    match mkdirat(&private, BOOT_DIR, Mode::from_bits_truncate(0o711)) {
        Ok(()) | Err(Errno::EEXIST) => {}
        Err(e) => {
            return Err(HostError::Create {
                path,
                source: e.into(),
            })
        }
    }
    let dir = openat(&private, BOOT_DIR, dir_flags, Mode::empty()).map_err(failed)?;
    let st = fstat(&dir).map_err(failed)?;
    if st.st_uid != nix::unistd::geteuid().as_raw() {
        return Err(HostError::NotOurs {
            path,
            owner: st.st_uid,
        });
    }
    // A umask may have taken bits: the mode is set, not asked for.
    nix::sys::stat::fchmod(&dir, Mode::from_bits_truncate(0o711)).map_err(failed)?;
    Ok(RootDir::opened(dir, path))
}

/// Copies `source` (opened by [`open_host_file`] as [`Kind::Boot`]) to `name` in `dir` (from
/// [`boot_dir`]), at most [`MAX_BOOT_FILE`] bytes, and gives the copy to `owner` (QEMU's user),
/// 0400, through its descriptor. Replaces an earlier copy by rename
/// ([`RootDir::replace_with`]): what a running QEMU has open is never written. Returns the
/// copy's path.
pub(crate) fn copy_boot_file(
    source: &fs::File,
    dir: &RootDir,
    name: &str,
    owner: NodeOwner,
) -> Result<PathBuf, HostError> {
    let path = dir.path().join(name);
    let failed = |source: io::Error| HostError::Create {
        path: path.clone(),
        source,
    };
    dir.replace_with(OsStr::new(name), 0o400, |copy| {
        let copied = io::copy(&mut source.take(MAX_BOOT_FILE + 1), copy).map_err(failed)?;
        if copied > MAX_BOOT_FILE {
            return Err(HostError::TooLarge {
                path: path.clone(),
                size: copied,
                max: MAX_BOOT_FILE,
            });
        }
        copy.flush().map_err(failed)?;
        fchown(
            copy.as_fd(),
            Some(Uid::from_raw(owner.uid)),
            Some(Gid::from_raw(owner.gid)),
        )
        .map_err(|e| failed(e.into()))
    })?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    const NOBODY: u32 = 65534;

    /// A temp dir root owns (0755 here), as the walk's start for each test.
    fn tmp() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        dir
    }

    fn mode(path: &Path, mode: u32) {
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }

    fn disk() -> Kind {
        Kind::Disk {
            writable: true,
            create: None,
        }
    }

    #[test]
    fn a_file_opens_as_itself_and_a_link_only_where_root_alone_writes() {
        let t = tmp();
        let file = t.path().join("disk.img");
        fs::write(&file, b"disk").unwrap();
        let mut opened = open_host_file(&file, disk()).unwrap();
        let mut text = String::new();
        opened.read_to_string(&mut text).unwrap();
        assert_eq!(text, "disk");

        // In a root-owned 0755 dir (as /dev/disk/by-id): followed.
        let root_link = t.path().join("by-id");
        std::os::unix::fs::symlink("disk.img", &root_link).unwrap();
        assert!(open_host_file(&root_link, disk()).is_ok());

        // In a dir its user owns: refused, naming the link, whatever it leads to.
        let users = t.path().join("alice");
        fs::create_dir(&users).unwrap();
        std::os::unix::fs::chown(&users, Some(NOBODY), Some(NOBODY)).unwrap();
        let link = users.join("disk.img");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let err = open_host_file(&link, disk()).unwrap_err();
        assert!(
            matches!(&err, HostError::UntrustedLink { link: l, .. } if *l == link.display().to_string()),
            "{err}"
        );
        // A directory on the way that its user made a link: refused too.
        std::os::unix::fs::symlink(t.path(), users.join("dir")).unwrap();
        let err = open_host_file(&users.join("dir/disk.img"), disk()).unwrap_err();
        assert!(
            matches!(&err, HostError::UntrustedLink { link, .. } if link == "dir"),
            "{err}"
        );
        // A FIFO or a directory is no disk.
        fs::create_dir(t.path().join("sub")).unwrap();
        assert!(matches!(
            open_host_file(&t.path().join("sub"), disk()),
            Err(HostError::NotADisk { .. })
        ));
        nix::unistd::mkfifo(&t.path().join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        assert!(matches!(
            open_host_file(&t.path().join("fifo"), disk()),
            Err(HostError::NotADisk { .. })
        ));
    }

    #[test]
    fn a_directory_others_may_write_is_refused_sticky_or_not() {
        let t = tmp();
        for bits in [0o775, 0o757, 0o1777, 0o1770] {
            let dir = t.path().join(format!("d{bits:o}"));
            fs::create_dir(&dir).unwrap();
            mode(&dir, bits);
            fs::write(dir.join("disk.img"), b"").unwrap();
            let err = open_host_file(&dir.join("disk.img"), disk()).unwrap_err();
            assert!(
                matches!(err, HostError::DirWritableByOthers { mode, .. } if mode == bits),
                "{bits:o}: {err}"
            );
        }
        // Its owner's, not root's, and 0755: accepted (the owner may swap only for its own).
        let own = t.path().join("own");
        fs::create_dir(&own).unwrap();
        std::os::unix::fs::chown(&own, Some(NOBODY), Some(NOBODY)).unwrap();
        fs::write(own.join("disk.img"), b"").unwrap();
        assert!(open_host_file(&own.join("disk.img"), disk()).is_ok());
    }

    #[test]
    fn disk_or_create_makes_a_sparse_file_and_keeps_an_existing_one() {
        let t = tmp();
        let path = t.path().join("a/b/disk.img");
        let kind = Kind::Disk {
            writable: true,
            create: Some(1 << 20),
        };
        open_host_file(&path, kind).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().len(), 1 << 20);
        fs::write(&path, b"kept").unwrap();
        open_host_file(&path, kind).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"kept");
        // Not made through a link in a dir its user owns.
        let users = t.path().join("u");
        fs::create_dir(&users).unwrap();
        std::os::unix::fs::chown(&users, Some(NOBODY), Some(NOBODY)).unwrap();
        std::os::unix::fs::symlink(t.path().join("elsewhere.img"), users.join("d.img")).unwrap();
        assert!(matches!(
            open_host_file(&users.join("d.img"), kind),
            Err(HostError::UntrustedLink { .. })
        ));
        assert!(!t.path().join("elsewhere.img").exists());
    }

    #[test]
    fn a_boot_file_is_a_regular_file_of_bounded_size() {
        let t = tmp();
        let big = t.path().join("vmlinuz");
        fs::File::create(&big)
            .unwrap()
            .set_len(MAX_BOOT_FILE + 1)
            .unwrap();
        assert!(matches!(
            open_host_file(&big, Kind::Boot),
            Err(HostError::TooLarge { size, .. }) if size == MAX_BOOT_FILE + 1
        ));
        let dev = Path::new("/dev/null");
        assert!(matches!(
            open_host_file(dev, Kind::Boot),
            Err(HostError::NotAFile { .. })
        ));
    }

    #[test]
    fn a_boot_file_is_copied_to_qemus_user_and_the_original_is_untouched() {
        let t = tmp();
        let original = t.path().join("vmlinuz");
        fs::write(&original, b"a kernel").unwrap();
        std::os::unix::fs::chown(&original, Some(NOBODY), Some(NOBODY)).unwrap();
        mode(&original, 0o640);
        let private = t.path().join("private");
        fs::create_dir(&private).unwrap();
        let owner = NodeOwner {
            uid: 4242,
            gid: 4343,
        };
        let dir = boot_dir(&private).unwrap();
        let dir_path = private.join(BOOT_DIR);
        for _ in 0..2 {
            // Again at the next start: replaced.
            let source = open_host_file(&original, Kind::Boot).unwrap();
            let copy = copy_boot_file(&source, &dir, "kernel", owner).unwrap();
            assert_eq!(copy, dir_path.join("kernel"));
            assert_eq!(fs::read(&copy).unwrap(), b"a kernel");
            let meta = fs::metadata(&copy).unwrap();
            assert_eq!(
                (meta.uid(), meta.gid(), meta.mode() & 0o7777),
                (4242, 4343, 0o400)
            );
        }
        let meta = fs::metadata(&original).unwrap();
        assert_eq!(
            (meta.uid(), meta.gid(), meta.mode() & 0o7777),
            (NOBODY, NOBODY, 0o640)
        );
        let boot = fs::metadata(&dir_path).unwrap();
        assert_eq!((boot.uid(), boot.mode() & 0o7777), (0, 0o711));
        assert_eq!(fs::read_dir(&dir_path).unwrap().count(), 1);

        // A boot dir someone else made is not used.
        std::os::unix::fs::chown(&dir_path, Some(NOBODY), None).unwrap();
        assert!(matches!(
            boot_dir(&private),
            Err(HostError::NotOurs { owner, .. }) if owner == NOBODY
        ));
    }
}
