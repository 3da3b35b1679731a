//! A directory the launcher (root) makes files in: opened once as itself, checked to be root's
//! and writable by no one else, and then worked in only relative to that descriptor (`openat`,
//! `renameat`, `unlinkat`, `fstatat`, never a path), so a name in it can never be resolved
//! through a directory or a link someone else put on the way after the check. The images the
//! launcher makes (empty disks, overlays, cloud-init ISOs) are written here.

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat, renameat, AtFlags, OFlag};
use nix::sys::stat::{fchmod, fstat, fstatat, mkdirat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};

use super::walk::file_type;
use super::HostError;

/// Who may do what in a directory the launcher makes on the way: root writes, anyone searches
/// (QEMU's user reaches the images by name), no one lists.
const MADE_DIR_MODE: u32 = 0o711;

/// An opened directory of the launcher's own (see the module).
#[derive(Debug)]
pub(crate) struct RootDir {
    fd: OwnedFd,
    path: PathBuf,
}

impl RootDir {
    /// `dir`, made (with what is missing on the way, `0711`) if it is not there, walked to from
    /// `/` one component at a time (a link only where root alone writes), opened without
    /// following a link, and refused unless it is the launcher's user's and writable by no one
    /// else.
    pub(crate) fn open(dir: &Path) -> Result<RootDir, HostError> {
        let mode = Mode::from_bits_truncate(MADE_DIR_MODE);
        let (parent, name) = super::walk::walk_to_parent(dir, Some(mode))?;
        match mkdirat(&parent, name.as_os_str(), mode) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => {
                return Err(HostError::Create {
                    path: dir.into(),
                    source: e.into(),
                })
            }
        }
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let fd = openat(&parent, name.as_os_str(), flags, Mode::empty()).map_err(|e| match e {
            Errno::ELOOP | Errno::ENOTDIR => HostError::Link { path: dir.into() },
            e => inspect(dir, e),
        })?;
        let st = fstat(&fd).map_err(|e| inspect(dir, e))?;
        if st.st_uid != nix::unistd::geteuid().as_raw() {
            return Err(HostError::NotOurs {
                path: dir.into(),
                owner: st.st_uid,
            });
        }
        if st.st_mode & 0o022 != 0 {
            return Err(HostError::DirWritableByOthers {
                path: dir.into(),
                mode: st.st_mode & 0o7777,
                owner: st.st_uid,
            });
        }
        Ok(RootDir {
            fd,
            path: dir.into(),
        })
    }

    /// `fd`, a directory its opener already checked as [`RootDir::open`] does, at `path`.
    pub(super) fn opened(fd: OwnedFd, path: PathBuf) -> RootDir {
        RootDir { fd, path }
    }

    /// The directory of `file` opened as [`RootDir::open`] does, and `file`'s name in it.
    pub(crate) fn of_file(file: &Path) -> Result<(RootDir, &OsStr), HostError> {
        match (file.parent(), file.file_name()) {
            (Some(dir), Some(name)) => Ok((RootDir::open(dir)?, name)),
            _ => Err(HostError::Create {
                path: file.into(),
                source: io::Error::new(io::ErrorKind::InvalidInput, "no file name"),
            }),
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// What `name` in this directory is, itself (a link is a link): `None` when nothing is.
    pub(crate) fn kind_of(&self, name: &OsStr) -> Result<Option<SFlag>, HostError> {
        match fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(file_type(&st))),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(inspect(&self.path.join(name), e)),
        }
    }

    /// Replaces `name` with a file of `mode` that `write` fills: made aside under a name of its
    /// own (exclusively, never through a link) and renamed over `name`, so a half-written file
    /// is never found under `name` and a file that QEMU has open is never written. Not synced
    /// (as `durable::write_atomically`): a launcher killed part-way leaves the old file or the
    /// new, and the images made here are remade at every start or read only while this kernel
    /// runs. Returns the new file, open for reading and writing.
    pub(crate) fn replace_with(
        &self,
        name: &OsStr,
        mode: u32,
        write: impl FnOnce(&mut fs::File) -> Result<(), HostError>,
    ) -> Result<fs::File, HostError> {
        let path = self.path.join(name);
        let failed = |source: io::Error| HostError::Create {
            path: path.clone(),
            source,
        };
        let mut aside = std::ffi::OsString::from(".");
        aside.push(name);
        aside.push(format!(".new-{}", std::process::id()));
        // Left by a launcher of this pid that died part-way.
        self.remove(&aside)?;
        let fd = openat(
            &self.fd,
            aside.as_os_str(),
            OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(mode),
        )
        .map_err(|e| failed(e.into()))?;
        let mut file = fs::File::from(fd);
        let written = write(&mut file).and_then(|()| {
            // A umask may have taken bits: the mode is set, not asked for.
            fchmod(file.as_fd(), Mode::from_bits_truncate(mode))
                .and_then(|()| renameat(&self.fd, aside.as_os_str(), &self.fd, name))
                .map_err(|e| failed(e.into()))
        });
        if let Err(e) = written {
            let _ = unlinkat(&self.fd, aside.as_os_str(), UnlinkatFlags::NoRemoveDir);
            return Err(e);
        }
        Ok(file)
    }

    /// Removes the file `name` if it is there (a link is removed, never followed).
    pub(crate) fn remove(&self, name: &OsStr) -> Result<(), HostError> {
        match unlinkat(&self.fd, name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(HostError::Create {
                path: self.path.join(name),
                source: e.into(),
            }),
        }
    }
}

impl AsFd for RootDir {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

fn inspect(path: &Path, e: Errno) -> HostError {
    HostError::Inspect {
        path: path.into(),
        source: e.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn a_file_is_replaced_whole_with_its_mode_and_the_missing_dirs_are_made_roots() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b");
        let opened = RootDir::open(&dir).unwrap();
        for made in [tmp.path().join("a"), dir.clone()] {
            assert_eq!(fs::metadata(&made).unwrap().mode() & 0o7777, 0o711);
        }
        let name = OsStr::new("disk.img");
        assert_eq!(opened.kind_of(name).unwrap(), None);
        for content in [&b"first"[..], b"second, longer"] {
            let mut file = opened
                .replace_with(name, 0o600, |f| {
                    f.write_all(content).unwrap();
                    Ok(())
                })
                .unwrap();
            let mut back = Vec::new();
            file.rewind().unwrap();
            file.read_to_end(&mut back).unwrap();
            assert_eq!(back, content);
            assert_eq!(fs::read(dir.join("disk.img")).unwrap(), content);
        }
        let meta = fs::metadata(dir.join("disk.img")).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o600);
        assert_eq!(opened.kind_of(name).unwrap(), Some(SFlag::S_IFREG));
        // Nothing is left aside.
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1);
    }

    #[test]
    fn a_write_that_fails_leaves_the_old_file_and_nothing_aside() {
        let tmp = tempfile::tempdir().unwrap();
        let opened = RootDir::open(tmp.path()).unwrap();
        let name = OsStr::new("cidata.iso");
        opened
            .replace_with(name, 0o600, |f| {
                f.write_all(b"old").unwrap();
                Ok(())
            })
            .unwrap();
        let e = opened
            .replace_with(name, 0o600, |_| {
                Err(HostError::Tool {
                    tool: "genisoimage",
                    path: "cidata.iso".into(),
                    stderr: "failed".into(),
                })
            })
            .unwrap_err();
        assert!(matches!(e, HostError::Tool { .. }), "{e}");
        assert_eq!(fs::read(tmp.path().join("cidata.iso")).unwrap(), b"old");
        assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_link_a_writable_dir_or_someone_elses_dir_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("real");
        fs::create_dir(&real).unwrap();
        // A link in a directory others write: anyone could have put it there.
        let open = tmp.path().join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o1777)).unwrap();
        std::os::unix::fs::symlink(&real, open.join("link")).unwrap();
        let e = RootDir::open(&open.join("link")).unwrap_err();
        assert!(matches!(e, HostError::UntrustedLink { .. }), "{e}");

        fs::set_permissions(&real, fs::Permissions::from_mode(0o773)).unwrap();
        let e = RootDir::open(&real).unwrap_err();
        assert!(matches!(e, HostError::DirWritableByOthers { .. }), "{e}");

        fs::set_permissions(&real, fs::Permissions::from_mode(0o711)).unwrap();
        nix::unistd::chown(&real, Some(nix::unistd::Uid::from_raw(3_999_303)), None).unwrap();
        let e = RootDir::open(&real).unwrap_err();
        assert!(
            matches!(
                e,
                HostError::NotOurs {
                    owner: 3_999_303,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn a_link_in_place_of_the_file_is_replaced_and_its_target_untouched() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("target");
        fs::write(&target, b"keep").unwrap();
        let dir = tmp.path().join("d");
        let opened = RootDir::open(&dir).unwrap();
        std::os::unix::fs::symlink(&target, dir.join("disk.img")).unwrap();
        assert_eq!(
            opened.kind_of(OsStr::new("disk.img")).unwrap(),
            Some(SFlag::S_IFLNK)
        );
        opened
            .replace_with(OsStr::new("disk.img"), 0o600, |f| {
                f.write_all(b"new").unwrap();
                Ok(())
            })
            .unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"keep");
        assert_eq!(fs::read(dir.join("disk.img")).unwrap(), b"new");
        opened.remove(OsStr::new("disk.img")).unwrap();
        opened.remove(OsStr::new("disk.img")).unwrap();
        assert_eq!(opened.kind_of(OsStr::new("disk.img")).unwrap(), None);
    }
}
