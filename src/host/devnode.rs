//! Block device nodes for hot-plugged volumes: the launcher makes `<hotplug-dir>/<volume>` itself
//! with `mknodat` relative to an open handle on the hotplug dir (no path is followed through a
//! symlink, nothing is made outside that dir), owned by the user QEMU runs as, mode 0660, and
//! removes it again. Only block devices; the hotplug dir is a parameter, so unit tests run this on
//! a temp dir.

use std::fmt;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{open, AtFlags, OFlag};
use nix::sys::stat::{fstatat, makedev, mknodat, Mode, SFlag};
use nix::unistd::{fchownat, unlinkat, Gid, Uid, UnlinkatFlags};

/// A block device number.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct DevNumber {
    pub major: u32,
    pub minor: u32,
}

impl fmt::Display for DevNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

/// Text that does not name a device number.
#[derive(Debug, thiserror::Error)]
#[error("{text:?} is not MAJOR:MINOR (e.g. 7:0)")]
pub struct NotADevNumber {
    text: String,
}

impl std::str::FromStr for DevNumber {
    type Err = NotADevNumber;

    /// `MAJOR:MINOR`, as `/sys/dev/block` and `ls -l` name a device.
    fn from_str(text: &str) -> Result<DevNumber, NotADevNumber> {
        let parsed = text
            .split_once(':')
            .and_then(|(major, minor)| Some((major.parse().ok()?, minor.parse().ok()?)));
        match parsed {
            Some((major, minor)) => Ok(DevNumber { major, minor }),
            None => Err(NotADevNumber { text: text.into() }),
        }
    }
}

impl DevNumber {
    pub(crate) fn from_rdev(rdev: u64) -> DevNumber {
        DevNumber {
            major: libc::major(rdev),
            minor: libc::minor(rdev),
        }
    }

    fn rdev(self) -> u64 {
        makedev(self.major.into(), self.minor.into())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DevNodeError {
    #[error("volume name {name:?} cannot name a device node: {why}")]
    InvalidName { name: String, why: &'static str },
    #[error("{path} is not a block device")]
    NotABlockDevice { path: PathBuf },
    #[error("{path} does not exist")]
    Missing { path: PathBuf },
    #[error("cannot inspect {path}")]
    Stat {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no block device {dev} on this host ({sysfs} does not exist)")]
    NoSuchDevice { dev: DevNumber, sysfs: PathBuf },
    #[error("{dir} is on a nodev mount: device nodes there cannot be opened")]
    NodevMount { dir: PathBuf },
    #[error("cannot allow device nodes in {dir} (a nodev mount): {step}")]
    Remount {
        dir: PathBuf,
        step: &'static str,
        #[source]
        source: Errno,
    },
    #[error("no block device {dev} on this host ({table} does not list it)")]
    NotListed { dev: DevNumber, table: PathBuf },
    #[error("cannot open the hotplug dir {dir}")]
    OpenDir {
        dir: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("{path} already exists and is not block device {dev}")]
    Occupied { path: PathBuf, dev: DevNumber },
    #[error("cannot make block node {path} ({dev})")]
    Mknod {
        path: PathBuf,
        dev: DevNumber,
        #[source]
        source: Errno,
    },
    #[error("cannot give {path} to uid {uid} gid {gid} with mode 0660")]
    Own {
        path: PathBuf,
        uid: u32,
        gid: u32,
        #[source]
        source: Errno,
    },
    #[error("cannot remove {path}")]
    Unlink {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error(transparent)]
    NotGiven(#[from] NotGiven),
}

/// A device the node daemon did not give this launcher (`host::block_allow`).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "block device {dev} was not given to this launcher: no node for it in {hotplug_dir}, and it is not an --allow-block-device"
)]
pub struct NotGiven {
    pub dev: DevNumber,
    pub hotplug_dir: PathBuf,
}

/// A volume name becomes one path component inside the hotplug dir, nothing else.
pub(crate) fn check_name(name: &str) -> Result<(), DevNodeError> {
    let why = if name.is_empty() {
        Some("it is empty")
    } else if name.contains('/') {
        Some("it contains '/'")
    } else if name.contains("..") {
        Some("it contains '..'")
    } else if name.starts_with('.') {
        Some("it starts with '.'")
    } else if name.contains('\0') {
        Some("it contains a NUL byte")
    } else {
        None
    };
    match why {
        Some(why) => Err(DevNodeError::InvalidName {
            name: name.into(),
            why,
        }),
        None => Ok(()),
    }
}

/// The device number of the block device at `path` (a host path a node daemon names).
pub(crate) fn device_of(path: &Path) -> Result<DevNumber, DevNodeError> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(DevNodeError::Missing { path: path.into() })
        }
        Err(source) => {
            return Err(DevNodeError::Stat {
                path: path.into(),
                source,
            })
        }
    };
    if !meta.file_type().is_block_device() {
        return Err(DevNodeError::NotABlockDevice { path: path.into() });
    }
    Ok(DevNumber::from_rdev(meta.rdev()))
}

/// The kernel's sequence number of the disk that has device number `dev` now (`diskseq`, Linux
/// 5.15 and later), if `known` is a sysfs directory that shows it: a number is reused when its
/// disk goes (a loop device detached, a device-mapper table removed), a disk sequence never is,
/// within one boot. For a partition, its disk's. `None` where it cannot be read (inside a
/// container, whose sysfs lists no block devices; an older kernel).
pub(crate) fn disk_sequence(known: &Path, dev: DevNumber) -> Option<u64> {
    if !known.is_dir() {
        return None;
    }
    let sysfs = known.join(dev.to_string());
    [sysfs.join("diskseq"), sysfs.join("../diskseq")]
        .iter()
        .find_map(|path| std::fs::read_to_string(path).ok()?.trim().parse().ok())
}

/// The kernel knows block device `dev`. `known` is either a sysfs directory of device numbers
/// (`/sys/dev/block` on a host: `<major>:<minor>` exists) or a `/proc/partitions` table — inside
/// a container sysfs lists no block devices, while `/proc/partitions` lists the host's.
pub(crate) fn check_exists(known: &Path, dev: DevNumber) -> Result<(), DevNodeError> {
    let missing = |sysfs: PathBuf| DevNodeError::NoSuchDevice { dev, sysfs };
    if known.is_dir() {
        let sysfs = known.join(dev.to_string());
        return if sysfs.exists() {
            Ok(())
        } else {
            Err(missing(sysfs))
        };
    }
    let table = std::fs::read_to_string(known).map_err(|_| missing(known.into()))?;
    // major minor #blocks name
    let listed = table.lines().any(|line| {
        let mut fields = line.split_whitespace();
        fields.next().and_then(|m| m.parse().ok()) == Some(dev.major)
            && fields.next().and_then(|m| m.parse().ok()) == Some(dev.minor)
    });
    if listed {
        Ok(())
    } else {
        Err(DevNodeError::NotListed {
            dev,
            table: known.into(),
        })
    }
}

/// Where this machine lists its block devices: `/sys/dev/block`, or `/proc/partitions` where
/// sysfs lists none (a container).
pub(crate) fn block_device_list() -> PathBuf {
    let sys = Path::new("/sys/dev/block");
    let listed = std::fs::read_dir(sys).is_ok_and(|mut entries| entries.next().is_some());
    if listed {
        sys.into()
    } else {
        PathBuf::from("/proc/partitions")
    }
}

/// Device nodes in `dir` can be opened: its mount is not `nodev`. Container engines mount
/// volumes `nodev` (podman does for every volume, an emptyDir included; Kubernetes' kubelet does
/// not), and a node there fails QEMU's open with EACCES. So when `dir` is on a `nodev` mount it
/// is bind-mounted onto itself and that bind remounted with device nodes allowed (still
/// `nosuid,noexec`): the change covers `dir` alone, in this mount namespace alone (libvirtd and
/// QEMU, started later, inherit it). Needs CAP_SYS_ADMIN, which block hotplug needs anyway.
/// Only where the launcher owns its mount namespace (`may_remount`: PID 1 of a container); on a
/// host the bind would outlive the launcher, so a `nodev` dir is an error there. Returns whether
/// it remounted.
pub(crate) fn allow_device_nodes(dir: &Path, may_remount: bool) -> Result<bool, DevNodeError> {
    use nix::mount::{mount, MsFlags};
    use nix::sys::statvfs::{statvfs, FsFlags};
    let err = |step: &'static str| {
        move |source| DevNodeError::Remount {
            dir: dir.into(),
            step,
            source,
        }
    };
    let flags = statvfs(dir).map_err(err("statvfs"))?.flags();
    if !flags.contains(FsFlags::ST_NODEV) {
        return Ok(false);
    }
    if !may_remount {
        return Err(DevNodeError::NodevMount { dir: dir.into() });
    }
    mount(Some(dir), dir, None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .map_err(err("bind-mount onto itself"))?;
    let mut keep = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC;
    if flags.contains(FsFlags::ST_RDONLY) {
        keep |= MsFlags::MS_RDONLY;
    }
    mount(None::<&str>, dir, None::<&str>, keep, None::<&str>)
        .map_err(err("remount with device nodes allowed"))?;
    Ok(true)
}

/// Who owns the nodes: the user and group QEMU runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeOwner {
    pub uid: u32,
    pub gid: u32,
}

fn open_dir(dir: &Path) -> Result<OwnedFd, DevNodeError> {
    let open_err = |source| DevNodeError::OpenDir {
        dir: dir.into(),
        source,
    };
    if let Err(e) = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(dir)
    {
        return Err(open_err(Errno::from_raw(e.raw_os_error().unwrap_or(0))));
    }
    open(
        dir,
        OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY,
        Mode::empty(),
    )
    .map_err(open_err)
}

/// What is at `name` in the open dir, without following a symlink.
fn node_at(dirfd: &OwnedFd, name: &str) -> Result<Option<(SFlag, u64)>, Errno> {
    match fstatat(dirfd.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some((super::walk::file_type(&st), st.st_rdev))),
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A node the launcher made; removed on drop unless `keep` is called (the undo of a failed attach).
#[derive(Debug)]
#[must_use = "dropping the guard removes the node"]
pub(crate) struct NodeGuard {
    dir: PathBuf,
    name: String,
    dev: DevNumber,
    armed: bool,
}

impl NodeGuard {
    pub(crate) fn path(&self) -> PathBuf {
        self.dir.join(&self.name)
    }

    /// The attach succeeded: the node stays.
    pub(crate) fn keep(mut self) {
        self.armed = false;
    }
}

impl Drop for NodeGuard {
    fn drop(&mut self) {
        if self.armed {
            if let Err(e) = remove_node(&self.dir, &self.name, self.dev) {
                tracing::warn!(error = %crate::error_chain(&e), "undo: cannot remove the node");
            }
        }
    }
}

/// Makes the block node `<dir>/<name>` for `dev`, owned by `owner`, mode 0660. A node that is
/// already there for the same device is taken as it is (a retried attach); anything else at that
/// name is refused.
pub(crate) fn make_node(
    dir: &Path,
    name: &str,
    dev: DevNumber,
    owner: NodeOwner,
) -> Result<NodeGuard, DevNodeError> {
    check_name(name)?;
    let path = dir.join(name);
    let dirfd = open_dir(dir)?;
    let mknod_err = |source| DevNodeError::Mknod {
        path: path.clone(),
        dev,
        source,
    };
    let created = match node_at(&dirfd, name).map_err(mknod_err)? {
        Some((kind, rdev)) if kind == SFlag::S_IFBLK && rdev == dev.rdev() => false,
        Some(_) => return Err(DevNodeError::Occupied { path, dev }),
        None => mknodat(
            dirfd.as_fd(),
            name,
            SFlag::S_IFBLK,
            Mode::from_bits_truncate(0o660),
            dev.rdev(),
        )
        .map(|()| true)
        .map_err(mknod_err)?,
    };
    // From here on a node made here is ours to remove if anything fails; one that was there
    // already is left as it was found.
    let guard = NodeGuard {
        dir: dir.into(),
        name: name.into(),
        dev,
        armed: created,
    };
    let own_err = |source| DevNodeError::Own {
        path: path.clone(),
        uid: owner.uid,
        gid: owner.gid,
        source,
    };
    fchownat(
        dirfd.as_fd(),
        name,
        Some(Uid::from_raw(owner.uid)),
        Some(Gid::from_raw(owner.gid)),
        AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .map_err(own_err)?;
    // mknod applied the umask. Linux cannot chmod a name without following a symlink, so the
    // node is pinned first (O_PATH, no follow), checked through that fd, and chmod'ed through
    // /proc/self/fd: whatever is renamed into its place meanwhile is never touched.
    let pinned = nix::fcntl::openat(
        dirfd.as_fd(),
        name,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(own_err)?;
    let stat = nix::sys::stat::fstat(&pinned).map_err(own_err)?;
    if super::walk::file_type(&stat) != SFlag::S_IFBLK || stat.st_rdev != dev.rdev() {
        return Err(DevNodeError::Occupied { path, dev });
    }
    let through_fd = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&pinned));
    std::fs::set_permissions(
        through_fd,
        std::os::unix::fs::PermissionsExt::from_mode(0o660),
    )
    .map_err(|e| own_err(Errno::from_raw(e.raw_os_error().unwrap_or(0))))?;
    Ok(guard)
}

/// Removes `<dir>/<name>` if it is the block node for `dev`; a node already gone is fine, and
/// anything else at that name is left alone.
pub(crate) fn remove_node(dir: &Path, name: &str, dev: DevNumber) -> Result<(), DevNodeError> {
    check_name(name)?;
    let path = dir.join(name);
    let dirfd = match open(
        dir,
        OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(()),
        Err(source) => {
            return Err(DevNodeError::OpenDir {
                dir: dir.into(),
                source,
            })
        }
    };
    let unlink_err = |source| DevNodeError::Unlink {
        path: path.clone(),
        source,
    };
    match node_at(&dirfd, name).map_err(unlink_err)? {
        Some((kind, rdev)) if kind == SFlag::S_IFBLK && rdev == dev.rdev() => {
            match unlinkat(dirfd.as_fd(), name, UnlinkatFlags::NoRemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => Ok(()),
                Err(e) => Err(unlink_err(e)),
            }
        }
        None => Ok(()),
        Some(_) => Err(DevNodeError::Occupied { path, dev }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    const LOOP0: DevNumber = DevNumber { major: 7, minor: 0 };
    const ROOT: NodeOwner = NodeOwner { uid: 0, gid: 0 };

    /// A node that was there before is not the launcher's to remove when the plug
    /// it was taken for is undone.
    #[test]
    fn an_undone_plug_leaves_a_node_it_found() {
        let (_dir, hp) = crate::testing::temp_path("hotplug");
        make_node(&hp, "vol-a", LOOP0, ROOT).unwrap().keep();
        drop(make_node(&hp, "vol-a", LOOP0, ROOT).unwrap());
        assert!(std::fs::symlink_metadata(hp.join("vol-a")).is_ok());
        drop(make_node(&hp, "vol-b", LOOP0, ROOT).unwrap());
        assert!(std::fs::symlink_metadata(hp.join("vol-b")).is_err());
    }

    #[test]
    fn makes_a_0660_block_node_and_removes_it() {
        let (_dir, hp) = crate::testing::temp_path("hotplug");
        let guard = make_node(&hp, "vol-a", LOOP0, NodeOwner { uid: 107, gid: 108 }).unwrap();
        let meta = std::fs::symlink_metadata(hp.join("vol-a")).unwrap();
        assert!(meta.file_type().is_block_device());
        assert_eq!(meta.permissions().mode() & 0o7777, 0o660);
        assert_eq!((meta.uid(), meta.gid()), (107, 108));
        assert_eq!(device_of(&hp.join("vol-a")).unwrap(), LOOP0);
        guard.keep();
        assert!(hp.join("vol-a").exists());
        // Same device again: taken as it is.
        make_node(&hp, "vol-a", LOOP0, ROOT).unwrap().keep();
        remove_node(&hp, "vol-a", LOOP0).unwrap();
        assert!(!hp.join("vol-a").exists());
        remove_node(&hp, "vol-a", LOOP0).unwrap();
    }

    #[test]
    fn a_dropped_guard_removes_the_node() {
        let dir = tempfile::tempdir().unwrap();
        drop(make_node(dir.path(), "v", LOOP0, ROOT).unwrap());
        assert!(std::fs::symlink_metadata(dir.path().join("v")).is_err());
    }

    #[test]
    fn refuses_names_that_leave_the_dir() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["a/b", "..", "../x", "", ".hidden"] {
            let err = make_node(dir.path(), name, LOOP0, ROOT).unwrap_err();
            assert!(
                matches!(err, DevNodeError::InvalidName { .. }),
                "{name}: {err}"
            );
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn never_follows_or_replaces_what_is_there() {
        let (dir, outside) = crate::testing::temp_path("outside");
        std::fs::write(&outside, b"x").unwrap();
        std::os::unix::fs::symlink(&outside, dir.path().join("link")).unwrap();
        let err = make_node(dir.path(), "link", LOOP0, ROOT).unwrap_err();
        assert!(matches!(err, DevNodeError::Occupied { .. }), "{err}");
        let err = remove_node(dir.path(), "link", LOOP0).unwrap_err();
        assert!(matches!(err, DevNodeError::Occupied { .. }), "{err}");
        assert_eq!(std::fs::read(&outside).unwrap(), b"x");
        // A node for another device is not ours either.
        make_node(dir.path(), "n", LOOP0, ROOT).unwrap().keep();
        let other = DevNumber { major: 7, minor: 1 };
        assert!(make_node(dir.path(), "n", other, ROOT).is_err());
        assert!(remove_node(dir.path(), "n", other).is_err());
        // A symlinked hotplug dir is refused.
        std::os::unix::fs::symlink(dir.path(), dir.path().join("dirlink")).unwrap();
        let err = make_node(&dir.path().join("dirlink"), "x", LOOP0, ROOT).unwrap_err();
        assert!(matches!(err, DevNodeError::OpenDir { .. }), "{err}");
    }

    #[test]
    fn char_devices_and_unknown_numbers_are_refused() {
        let err = device_of(Path::new("/dev/null")).unwrap_err();
        assert!(matches!(err, DevNodeError::NotABlockDevice { .. }), "{err}");
        let err = device_of(Path::new("/nonexistent/disk")).unwrap_err();
        assert!(matches!(err, DevNodeError::Missing { .. }), "{err}");
        let sys = tempfile::tempdir().unwrap();
        std::fs::create_dir(sys.path().join("7:0")).unwrap();
        check_exists(sys.path(), LOOP0).unwrap();
        let err = check_exists(
            sys.path(),
            DevNumber {
                major: 7,
                minor: 99,
            },
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "no block device 7:99 on this host ({}/7:99 does not exist)",
                sys.path().display()
            )
        );
        // Inside a container: /proc/partitions.
        let partitions = sys.path().join("partitions");
        std::fs::write(
            &partitions,
            "major minor  #blocks  name\n\n   7        0      16384 loop0\n 254        0  268435456 vda\n",
        )
        .unwrap();
        check_exists(&partitions, LOOP0).unwrap();
        let err = check_exists(
            &partitions,
            DevNumber {
                major: 7,
                minor: 99,
            },
        )
        .unwrap_err();
        assert!(matches!(err, DevNodeError::NotListed { .. }), "{err}");
    }

    #[test]
    fn a_disk_sequence_is_read_for_a_disk_and_a_partitions_disk_and_not_from_a_table() {
        let sys = tempfile::tempdir().unwrap();
        std::fs::create_dir(sys.path().join("7:0")).unwrap();
        std::fs::write(sys.path().join("7:0/diskseq"), "926\n").unwrap();
        assert_eq!(disk_sequence(sys.path(), LOOP0), Some(926));
        // A partition's sysfs dir sits in its disk's, as /sys/dev/block's links lead.
        let disk = sys.path().join("devices/nvme0n1");
        std::fs::create_dir_all(disk.join("nvme0n1p1")).unwrap();
        std::fs::write(disk.join("diskseq"), "3").unwrap();
        std::os::unix::fs::symlink(disk.join("nvme0n1p1"), sys.path().join("259:1")).unwrap();
        assert_eq!(
            disk_sequence(
                sys.path(),
                DevNumber {
                    major: 259,
                    minor: 1
                }
            ),
            Some(3)
        );
        assert_eq!(
            disk_sequence(sys.path(), DevNumber { major: 7, minor: 9 }),
            None
        );
        let table = sys.path().join("partitions");
        std::fs::write(&table, "   7        0      16384 loop0\n").unwrap();
        assert_eq!(disk_sequence(&table, LOOP0), None);
    }
}
