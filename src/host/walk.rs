//! Walking a host path one component at a time from `/`, each step relative to the directory
//! opened before it (`openat`), so that what was checked is what is opened: a symbolic link is
//! followed only where nobody but root can have put it (a directory owned by root that neither
//! its group nor others may write). Used for the host's own files (`host_files`) and the
//! launcher's own directories (`root_dir`).

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat, readlinkat, OFlag};
use nix::sys::stat::{fstat, fstatat, mkdirat, FileStat, Mode, SFlag};

use super::HostError;

/// As the kernel's own limit on links followed in one lookup.
const MAX_LINKS: usize = 40;

/// The kind of file `st` describes.
pub(super) fn file_type(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits())
}

/// Whether a link in `dir` can only have been put there by root.
fn only_root_writes(dir: &OwnedFd) -> bool {
    fstat(dir).is_ok_and(|st| st.st_uid == 0 && st.st_mode & 0o022 == 0)
}

/// The directory `path`'s last component is in, opened, and that component (after following
/// links root put there). `make_dirs`: directories on the way that are not there are made
/// root's with that mode (`DiskOrCreate` makes them 0755; the launcher's own, 0711).
pub(super) fn walk_to_parent(
    path: &Path,
    make_dirs: Option<Mode>,
) -> Result<(OwnedFd, OsString), HostError> {
    let failed = |e: Errno| HostError::Inspect {
        path: path.into(),
        source: e.into(),
    };
    let dir_flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let root = || openat(nix::fcntl::AT_FDCWD, "/", dir_flags, Mode::empty()).map_err(failed);
    if !path.is_absolute() {
        return Err(HostError::Inspect {
            path: path.into(),
            source: io::Error::new(io::ErrorKind::InvalidInput, "not an absolute path"),
        });
    }
    let mut pending: VecDeque<OsString> = components(path);
    // The directories walked through, for "..".
    let mut stack: Vec<OwnedFd> = vec![root()?];
    let mut links = 0;
    while let Some(name) = pending.pop_front() {
        if name == ".." {
            if stack.len() > 1 {
                stack.pop();
            }
            continue;
        }
        let dir = stack.last().expect("the root stays");
        let st = match fstatat(
            dir,
            name.as_os_str(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        ) {
            Ok(st) => Some(st),
            Err(Errno::ENOENT) => None,
            Err(e) => return Err(failed(e)),
        };
        if st.as_ref().map(file_type) == Some(SFlag::S_IFLNK) {
            let link = shown(path, &pending, &name);
            if !only_root_writes(dir) {
                return Err(HostError::UntrustedLink {
                    path: path.into(),
                    link,
                });
            }
            links += 1;
            if links > MAX_LINKS {
                return Err(failed(Errno::ELOOP));
            }
            let target = readlinkat(dir, name.as_os_str()).map_err(failed)?;
            let target = PathBuf::from(target);
            if target.is_absolute() {
                stack.truncate(1);
            }
            for c in components(&target).into_iter().rev() {
                pending.push_front(c);
            }
            continue;
        }
        if pending.is_empty() {
            let dir = stack.pop().expect("the root stays");
            return Ok((dir, name));
        }
        if let (None, Some(mode)) = (&st, make_dirs) {
            match mkdirat(dir, name.as_os_str(), mode) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => {
                    return Err(HostError::Create {
                        path: path.into(),
                        source: e.into(),
                    })
                }
            }
        }
        let next =
            openat(dir, name.as_os_str(), dir_flags, Mode::empty()).map_err(|e| match e {
                Errno::ENOENT => HostError::Missing { path: path.into() },
                // Made a link since it was looked at.
                Errno::ELOOP => HostError::UntrustedLink {
                    path: path.into(),
                    link: name.to_string_lossy().into_owned(),
                },
                e => failed(e),
            })?;
        stack.push(next);
    }
    // "/" or a path of ".." only: no file.
    Err(HostError::NotADisk { path: path.into() })
}

/// `path`'s components after the root, `.` left out.
fn components(path: &Path) -> VecDeque<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect()
}

/// How a link met on the way is named in an error: the spec's path when it is its last
/// component, else its name (links already followed make a full path unknowable cheaply).
fn shown(path: &Path, pending: &VecDeque<OsString>, name: &OsStr) -> String {
    if pending.is_empty() && path.file_name() == Some(name) {
        path.display().to_string()
    } else {
        name.to_string_lossy().into_owned()
    }
}
