//! One QEMU identity per VM on a host. A guest that escapes into QEMU acts with QEMU's uid; when
//! every VM's QEMU is the same user, one escape reads every other VM's RAM (`/proc/PID/mem`),
//! its cloud-init data and its VNC console. So each launcher on a host runs its QEMU under a
//! uid and gid of its own, taken from a range (`--qemu-ids`, default [`DEFAULT_RANGE`]) that no
//! account of the host uses: libvirt takes numeric ids (`user = "+UID"`), no passwd entry is
//! needed, and such an id has no supplementary groups.
//!
//! An id is the launcher's while it holds an `flock` on `<lock dir>/<uid>` (released by the
//! kernel when the launcher dies, kill -9 included) and no process runs as it (the QEMU of a
//! launcher that died is still that VM's). The id a runtime dir's VM ran as is recorded there,
//! so a launcher that adopts a running QEMU takes the same id back; otherwise the search starts
//! at a point derived from the runtime dir's path, so a dir tends to get its old id again and
//! two dirs seldom meet.
//!
//! In a pod the pod is the wall between VMs, and QEMU keeps KubeVirt's uid 107.

use std::collections::BTreeSet;
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::Flock;

use super::qemu_user::QemuUser;

/// 65,536 ids from 2,000,000,000: above every range Debian gives accounts (`SUB_UID_MAX`
/// 600,100,000 for user namespaces) and below 2^31, which some tools print signed.
pub const DEFAULT_RANGE: QemuIdRange = QemuIdRange {
    first: 2_000_000_000,
    last: 2_000_065_535,
};

/// Where the per-id locks live: one host, one set of ids.
pub(crate) const LOCK_DIR: &str = "/run/vmlauncher/qemu-ids";

/// The file in a runtime dir that records the id its QEMU runs as.
pub(crate) const RECORD: &str = "qemu-id";

/// A range of ids, both ends included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QemuIdRange {
    pub first: u32,
    pub last: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum QemuIdError {
    #[error("--qemu-ids {0}: expected FIRST-LAST, two uids with FIRST <= LAST")]
    BadRange(String),
    #[error("--qemu-ids {given}: {why}")]
    UnsafeRange { given: String, why: String },
    #[error("cannot use the QEMU id lock dir {path}")]
    LockDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("every QEMU id in {first}-{last} is taken by another launcher or a running process")]
    Exhausted { first: u32, last: u32 },
}

impl std::str::FromStr for QemuIdRange {
    type Err = QemuIdError;

    fn from_str(text: &str) -> Result<QemuIdRange, QemuIdError> {
        let bad = || QemuIdError::BadRange(text.into());
        let (first, last) = text.split_once('-').ok_or_else(bad)?;
        let first: u32 = first.trim().parse().map_err(|_| bad())?;
        let last: u32 = last.trim().parse().map_err(|_| bad())?;
        if first > last {
            return Err(bad());
        }
        let unsafe_range = |why: &str| QemuIdError::UnsafeRange {
            given: text.into(),
            why: why.into(),
        };
        // Ids below 1000 are the system's accounts; u32::MAX is "no id" to chown(2).
        if first < 1000 {
            return Err(unsafe_range(
                "ids below 1000 belong to the system's accounts",
            ));
        }
        if last >= u32::MAX - 1 {
            return Err(unsafe_range("4294967294 and 4294967295 are not ids"));
        }
        Ok(QemuIdRange { first, last })
    }
}

impl std::fmt::Display for QemuIdRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

impl QemuIdRange {
    fn count(self) -> u64 {
        u64::from(self.last - self.first) + 1
    }

    fn contains(self, id: u32) -> bool {
        (self.first..=self.last).contains(&id)
    }

    /// Every id once, from the one `seed` picks, wrapping around.
    fn starting_at(self, seed: u64) -> impl Iterator<Item = u32> {
        let count = self.count();
        let start = seed % count;
        (0..count).map(move |i| self.first + ((start + i) % count) as u32)
    }
}

/// A QEMU identity held for this launcher's life.
#[derive(Debug)]
pub(crate) struct QemuId {
    pub user: QemuUser,
    /// The id this runtime dir's VM ran as before, if another (what it was given may be
    /// taken back).
    pub previous: Option<u32>,
    _lock: Flock<fs::File>,
}

/// Takes an id of `range` for the VM of `runtime_dir`: the one recorded there if it is free
/// (or only its own QEMU runs as it), else the first free one from a point derived from the
/// dir's path. Records the id taken.
pub(crate) fn allocate(
    range: QemuIdRange,
    lock_dir: &Path,
    runtime_dir: &Path,
) -> Result<QemuId, QemuIdError> {
    let lock_dir_err = |source| QemuIdError::LockDir {
        path: lock_dir.into(),
        source,
    };
    open_lock_dir(lock_dir).map_err(lock_dir_err)?;
    let previous = read_record(runtime_dir);
    let recorded = previous.filter(|id| range.contains(*id));
    if let Some(id) = recorded {
        // Its QEMU may still run (a launcher restarted beside its VM): the id stays the VM's.
        if let Some(lock) = try_lock(lock_dir, id).map_err(lock_dir_err)? {
            return Ok(take(id, lock, runtime_dir, previous));
        }
    }
    // Read once, and only when a search is needed: a few hundred directories of /proc.
    let running = process_uids();
    for id in range.starting_at(seed_of(runtime_dir)) {
        if running.contains(&id) {
            continue;
        }
        if let Some(lock) = try_lock(lock_dir, id).map_err(lock_dir_err)? {
            return Ok(take(id, lock, runtime_dir, previous));
        }
    }
    Err(QemuIdError::Exhausted {
        first: range.first,
        last: range.last,
    })
}

fn take(id: u32, lock: Flock<fs::File>, runtime_dir: &Path, previous: Option<u32>) -> QemuId {
    if let Err(e) = write_record(runtime_dir, id) {
        // Only a later launcher's preference is lost: it finds the id by its lock and the
        // running QEMU's uid instead.
        tracing::warn!(dir = %runtime_dir.display(), error = %e, "cannot record the QEMU id");
    }
    QemuId {
        user: QemuUser::new(id.to_string(), id, id),
        previous: previous.filter(|p| *p != id),
        _lock: lock,
    }
}

/// Makes the lock dir root's and 0700, or checks it is: a lock file someone else could
/// replace would let them hold ids.
fn open_lock_dir(dir: &Path) -> io::Result<()> {
    // Its parent, `/run/vmlauncher`, is searched by QEMU (`private_dirs::MigrationSockets`).
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o711)
        .create(dir)?;
    let meta = fs::symlink_metadata(dir)?;
    if !meta.file_type().is_dir() || meta.uid() != nix::unistd::geteuid().as_raw() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "not a directory of this launcher's user",
        ));
    }
    if meta.mode() & 0o077 != 0 {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// The lock of `id`, or `None` when another launcher holds it.
fn try_lock(dir: &Path, id: u32) -> io::Result<Option<Flock<fs::File>>> {
    crate::runtime_dir::try_lock(&dir.join(id.to_string()))
}

/// The uids processes run as now (the owner of `/proc/PID` is its effective uid).
fn process_uids() -> BTreeSet<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return BTreeSet::new();
    };
    entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.uid())
        .collect()
}

/// FNV-1a of the path: stable across runs and machines, unlike std's hasher.
fn seed_of(runtime_dir: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    runtime_dir
        .as_os_str()
        .as_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
        })
}

fn read_record(runtime_dir: &Path) -> Option<u32> {
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(runtime_dir.join(RECORD))
        .ok()?;
    let mut text = String::new();
    file.take(16).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

fn write_record(runtime_dir: &Path, id: u32) -> io::Result<()> {
    crate::durable::write_atomically(&runtime_dir.join(RECORD), id.to_string().as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_is_read_and_checked() {
        assert_eq!(
            "3000000-3000009".parse::<QemuIdRange>().unwrap(),
            QemuIdRange {
                first: 3_000_000,
                last: 3_000_009
            }
        );
        for bad in ["3000000", "9-1", "a-b", "3000009-3000000", ""] {
            assert!(
                matches!(bad.parse::<QemuIdRange>(), Err(QemuIdError::BadRange(_))),
                "{bad}"
            );
        }
        let low = "100-200".parse::<QemuIdRange>().unwrap_err();
        assert_eq!(
            low.to_string(),
            "--qemu-ids 100-200: ids below 1000 belong to the system's accounts"
        );
        assert!("4000000000-4294967295".parse::<QemuIdRange>().is_err());
    }

    #[test]
    fn two_launchers_get_two_ids_and_a_dir_gets_its_recorded_id_back() {
        let locks = tempfile::tempdir().unwrap();
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        // No process on any machine this runs on has these ids.
        let range: QemuIdRange = "3999000-3999001".parse().unwrap();
        let first = allocate(range, locks.path(), a.path()).unwrap();
        let second = allocate(range, locks.path(), b.path()).unwrap();
        assert_ne!(first.user.uid, second.user.uid);
        assert_eq!(first.user.uid, first.user.gid);
        // Both taken: a third launcher finds none.
        let c = tempfile::tempdir().unwrap();
        assert!(matches!(
            allocate(range, locks.path(), c.path()),
            Err(QemuIdError::Exhausted { .. })
        ));
        // Released with the launcher; the dir's next launcher takes the same id back, even
        // where the search from its seed would reach the other one first.
        let uid = first.user.uid;
        drop(first);
        drop(second);
        assert_eq!(read_record(a.path()), Some(uid));
        assert_eq!(
            allocate(range, locks.path(), a.path()).unwrap().user.uid,
            uid
        );
    }

    #[test]
    fn an_id_a_process_runs_as_is_not_taken() {
        let locks = tempfile::tempdir().unwrap();
        let dir = tempfile::tempdir().unwrap();
        // This test runs as root: uid 0's processes are there. A range of 1000 alone is
        // refused by the parser, so it is built here to stand for "an id in use".
        let in_use = *process_uids().iter().next().unwrap();
        let range = QemuIdRange {
            first: in_use,
            last: in_use,
        };
        assert!(matches!(
            allocate(range, locks.path(), dir.path()),
            Err(QemuIdError::Exhausted { .. })
        ));
    }
}
