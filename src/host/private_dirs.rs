//! The directories the launcher keeps for one VM, and who may write each. Root works in the
//! private dir: the launcher makes its images there (through an opened directory,
//! `root_dir::RootDir`), and libvirt, as root, opens by path what a domain names. A directory
//! QEMU's user could write would let an escaped guest swap one of those paths for a link to any
//! host file, which root would then write or give to QEMU. So:
//! - the private dir, its subdirectories and the console dir are root's, `0710` with QEMU's
//!   group (search, never write), checked every time they are prepared: opened once, not
//!   through a link, and refused when not root's own (a dir QEMU put in place of one);
//! - QEMU's own dir (`HostPaths::qemu_dir`, `0700` its user's) holds only what QEMU creates
//!   itself: the VNC socket and a migration target's sockets. Root never writes into it by
//!   path; the console dir's `virt-vnc` is a link (root's) into it;
//! - as KubeVirt's launcher, where QEMU binds `virt-vnc` in the console dir itself, that dir is
//!   root's and sticky (`root:<gid> 1770`): QEMU's entries and root's live side by side, and
//!   neither QEMU nor anyone but root may remove, rename or replace root's.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

use super::devnode::NodeOwner;
use super::HostError;
use crate::volumes::{HostPaths, PRIVATE_SUBDIRS};

/// Makes the private dir, its subdirectories, the console dir and QEMU's own dir as the module
/// says, for QEMU running as `qemu`.
pub(crate) fn prepare(paths: &HostPaths, qemu: NodeOwner) -> Result<(), HostError> {
    let root_dirs = std::iter::once(paths.private_dir.clone())
        .chain(PRIVATE_SUBDIRS.iter().map(|d| paths.private_dir.join(d)));
    for dir in root_dirs {
        root_dir_qemu_searches(&dir, qemu.gid)?;
    }
    if paths.qemu_dir != paths.console_dir {
        qemu_own_dir(&paths.qemu_dir, qemu, 0o700)?;
        let console = root_dir_qemu_searches(&paths.console_dir, qemu.gid)?;
        link_vnc(&console, paths)?;
    } else {
        // As KubeVirt's launcher: virt-handler's console server takes `virt-vnc` only as the
        // socket itself, never through a link (`safepath`), so QEMU binds it in the console
        // dir, where libvirt (root) binds the serial socket and opens its log by path. The dir
        // is root's and sticky: QEMU adds its socket, and cannot remove, rename or replace
        // what root put there; the log is made root's here before libvirt opens it.
        let console = roots_dir(&paths.console_dir, Some(qemu.gid), STICKY_SHARED)?;
        if paths.console_log.parent() == Some(paths.console_dir.as_path()) {
            roots_log(&console, paths, qemu.gid)?;
        }
    }
    Ok(())
}

/// A dir root and QEMU's group both add to, where each may remove only its own entries.
const STICKY_SHARED: u32 = 0o1770;

/// The serial console's log in the (sticky) console dir: a regular file of root's,
/// `root:<gid> 0640` (KubeVirt's `guest-console-log` container reads it as QEMU's group).
/// Whatever else is at its name (what QEMU put there before root made it: a link to a file
/// libvirt would then append to) is removed first, never followed.
fn roots_log(console: &fs::File, paths: &HostPaths, gid: u32) -> Result<(), HostError> {
    use nix::fcntl::{openat, AtFlags, OFlag};
    use nix::sys::stat::{fstatat, Mode, SFlag};
    use nix::unistd::{unlinkat, UnlinkatFlags};
    let log = &paths.console_log;
    let name = log.file_name().unwrap_or_default();
    let failed = |e: nix::errno::Errno| inspect(log, e.into());
    let euid = nix::unistd::geteuid().as_raw();
    match fstatat(console, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) if super::walk::file_type(&st) == SFlag::S_IFREG && st.st_uid == euid => {}
        Ok(_) => unlinkat(console, name, UnlinkatFlags::NoRemoveDir).map_err(failed)?,
        Err(nix::errno::Errno::ENOENT) => {}
        Err(e) => return Err(failed(e)),
    }
    let file = openat(
        console,
        name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o640),
    )
    .map_err(failed)?;
    set_owner_mode(&fs::File::from(file), log, None, Some(gid), 0o640)
}

/// `prepare` for a host run's runtime dir (`HostPaths::local`).
pub fn prepare_local(runtime_dir: &Path, qemu: NodeOwner) -> Result<(), HostError> {
    prepare(&HostPaths::local(runtime_dir), qemu)
}

/// `dir` made (or found) root's, `root:<gid> 0710`, and opened.
fn root_dir_qemu_searches(dir: &Path, gid: u32) -> Result<fs::File, HostError> {
    roots_dir(dir, Some(gid), 0o710)
}

/// `dir` made (or found) with `mode`, refused unless it is root's (the launcher's user's);
/// `gid`: its group then. Returns it opened.
fn roots_dir(dir: &Path, gid: Option<u32>, mode: u32) -> Result<fs::File, HostError> {
    let file = open_made(dir, mode)?;
    let meta = file.metadata().map_err(|e| inspect(dir, e))?;
    let euid = nix::unistd::geteuid().as_raw();
    if meta.uid() != euid {
        return Err(HostError::NotOurs {
            path: dir.into(),
            owner: meta.uid(),
        });
    }
    set_owner_mode(&file, dir, None, gid, mode)?;
    Ok(file)
}

/// QEMU's own dir, `<uid>:<gid>` with `mode` (0700; 0711 where another QEMU reaches a socket
/// in it by name).
pub(crate) fn qemu_own_dir(dir: &Path, qemu: NodeOwner, mode: u32) -> Result<(), HostError> {
    let file = open_made(dir, mode)?;
    set_owner_mode(&file, dir, Some(qemu.uid), Some(qemu.gid), mode)
}

/// `fchown` and `fchmod` of the opened `dir`; `None` leaves its owner or group.
fn set_owner_mode(
    file: &fs::File,
    dir: &Path,
    uid: Option<u32>,
    gid: Option<u32>,
    mode: u32,
) -> Result<(), HostError> {
    nix::unistd::fchown(
        file,
        uid.map(nix::unistd::Uid::from_raw),
        gid.map(nix::unistd::Gid::from_raw),
    )
    .map_err(|e| inspect(dir, e.into()))?;
    nix::sys::stat::fchmod(file, nix::sys::stat::Mode::from_bits_truncate(mode))
        .map_err(|e| inspect(dir, e.into()))
}

/// `dir`, made with `mode` if missing, opened as itself (a link there is refused).
fn open_made(dir: &Path, mode: u32) -> Result<fs::File, HostError> {
    if let Err(e) = fs::DirBuilder::new().recursive(true).mode(mode).create(dir) {
        return Err(HostError::Create {
            path: dir.into(),
            source: e,
        });
    }
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) || e.raw_os_error() == Some(libc::ENOTDIR) {
                HostError::Link { path: dir.into() }
            } else {
                inspect(dir, e)
            }
        })
}

/// Where a migration target's QEMU listens on a host, for a source on the same host:
/// `/run/vmlauncher/migration/<launcher pid>`, its QEMU user's, `0711`. The source's QEMU, another
/// uid, connects to the disks' socket there (its libvirt gives it that socket), which it could
/// not in the target's runtime dir; no one else may list the dir or add to it, and a socket
/// takes a connection only from its owner. Removed when dropped.
#[derive(Debug)]
pub(crate) struct MigrationSockets(PathBuf);

/// The host's directory for every launcher's migration sockets.
pub(crate) const MIGRATION_SOCKETS: &str = "/run/vmlauncher/migration";

impl MigrationSockets {
    pub(crate) fn make(qemu: NodeOwner) -> Result<MigrationSockets, HostError> {
        let parent = Path::new(MIGRATION_SOCKETS);
        for dir in [parent.parent().unwrap_or(parent), parent] {
            roots_dir(dir, None, 0o711)?;
        }
        let dir = parent.join(std::process::id().to_string());
        // A launcher killed before it removed its own, whose pid this one has now.
        if fs::symlink_metadata(&dir).is_ok() {
            fs::remove_dir_all(&dir).map_err(|e| inspect(&dir, e))?;
        }
        qemu_own_dir(&dir, qemu, 0o711)?;
        Ok(MigrationSockets(dir))
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for MigrationSockets {
    fn drop(&mut self) {
        if let Err(e) = fs::remove_dir_all(&self.0) {
            tracing::warn!(dir = %self.0.display(), error = %e, "cannot remove the migration sockets' dir");
        }
    }
}

/// `console_dir/virt-vnc`, a link into QEMU's dir, relative: virt-handler reaches it through
/// `/proc/<pid>/root`, where an absolute link would resolve in its own root. Whatever was
/// there (an older layout's socket, a link) is replaced: the console dir (`console`, opened)
/// is root's.
fn link_vnc(console: &fs::File, paths: &HostPaths) -> Result<(), HostError> {
    use nix::unistd::{symlinkat, unlinkat, UnlinkatFlags};
    let link = paths.vnc_link();
    let name = link.file_name().unwrap_or_default();
    let target = relative(&paths.console_dir, &paths.vnc_socket());
    if nix::fcntl::readlinkat(console, name).is_ok_and(|t| Path::new(&t) == target) {
        return Ok(());
    }
    match unlinkat(console, name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(nix::errno::Errno::ENOENT) => {}
        Err(e) => return Err(inspect(&link, e.into())),
    }
    symlinkat(target.as_path(), console, name).map_err(|e| HostError::Create {
        path: link.clone(),
        source: e.into(),
    })
}

/// `to` as a path relative to the directory `from` (both absolute).
pub(crate) fn relative(from: &Path, to: &Path) -> PathBuf {
    let from: Vec<Component> = from.components().collect();
    let to: Vec<Component> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut out = PathBuf::new();
    for _ in common..from.len() {
        out.push("..");
    }
    for c in &to[common..] {
        out.push(c);
    }
    out
}

fn inspect(path: &Path, source: io::Error) -> HostError {
    HostError::Inspect {
        path: path.into(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_relative_link_leads_from_one_dir_into_another() {
        assert_eq!(
            relative(
                Path::new("/var/run/kubevirt-private/uid-1"),
                Path::new("/var/run/kubevirt-private/vmlauncher-qemu/virt-vnc")
            ),
            PathBuf::from("../vmlauncher-qemu/virt-vnc")
        );
        assert_eq!(
            relative(Path::new("/rt/private"), Path::new("/rt/qemu/virt-vnc")),
            PathBuf::from("../qemu/virt-vnc")
        );
    }

    #[test]
    fn relative_paths_climb_to_the_common_dir() {
        let r = |a: &str, b: &str| relative(Path::new(a), Path::new(b));
        assert_eq!(r("/a/b", "/a/b/c"), Path::new("c"));
        assert_eq!(r("/a/b", "/x"), Path::new("../../x"));
    }

    fn paths_in(rt: &Path) -> HostPaths {
        HostPaths::local(rt)
    }

    fn stat(path: &Path) -> (u32, u32, u32) {
        let m = fs::symlink_metadata(path).unwrap();
        (m.uid(), m.gid(), m.mode() & 0o7777)
    }

    #[test]
    fn the_private_dirs_are_roots_and_qemus_dir_is_its_own() {
        let tmp = tempfile::tempdir().unwrap();
        let paths = paths_in(tmp.path());
        // Ids no account has on any machine this runs on.
        let qemu = NodeOwner {
            uid: 3_999_301,
            gid: 3_999_302,
        };
        prepare(&paths, qemu).unwrap();
        assert_eq!(stat(&paths.private_dir), (0, 3_999_302, 0o710));
        for sub in PRIVATE_SUBDIRS {
            assert_eq!(
                stat(&paths.private_dir.join(sub)),
                (0, 3_999_302, 0o710),
                "{sub}"
            );
        }
        assert_eq!(stat(&paths.qemu_dir), (3_999_301, 3_999_302, 0o700));
        assert_eq!(
            fs::read_link(paths.private_dir.join("virt-vnc")).unwrap(),
            PathBuf::from("../qemu/virt-vnc")
        );
        // An older layout's modes are put right.
        fs::set_permissions(&paths.private_dir, fs::Permissions::from_mode(0o770)).unwrap();
        prepare(&paths, qemu).unwrap();
        assert_eq!(stat(&paths.private_dir), (0, 3_999_302, 0o710));
    }

    /// Runs `script` with `sh -c` as `uid`, its group `gid` only (`setpriv`): QEMU's user.
    fn sh_as(uid: u32, gid: u32, script: &str) -> bool {
        std::process::Command::new("setpriv")
            .args([
                &format!("--reuid={uid}"),
                &format!("--regid={gid}"),
                "--clear-groups",
                "sh",
                "-c",
                script,
            ])
            .status()
            .expect("setpriv")
            .success()
    }

    #[test]
    fn kubevirts_console_dir_is_roots_and_sticky_and_its_log_roots_whatever_qemu_put_there() {
        let tmp = tempfile::tempdir().unwrap();
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let console_dir = tmp.path().join("kubevirt-private/uid-1");
        let paths = HostPaths {
            private_dir: tmp.path().join("ephemeral/vmlauncher"),
            console_log: console_dir.join("virt-serial0-log"),
            qemu_dir: console_dir.clone(),
            console_dir: console_dir.clone(),
            ..HostPaths::local(tmp.path())
        };
        let qemu = NodeOwner {
            uid: 3_999_301,
            gid: 3_999_302,
        };
        let target = tmp.path().join("root-only");
        fs::write(&target, "keep").unwrap();
        fs::create_dir_all(&console_dir).unwrap();
        // What QEMU would have put at the log's name before root made it.
        std::os::unix::fs::symlink(&target, &paths.console_log).unwrap();
        prepare(&paths, qemu).unwrap();
        assert_eq!(stat(&console_dir), (0, 3_999_302, 0o1770));
        assert_eq!(stat(&paths.console_log), (0, 3_999_302, 0o640));
        assert_eq!(stat(&target), (0, 0, 0o644));
        assert_eq!(fs::read_to_string(&target).unwrap(), "keep");

        // QEMU adds its own entries (the VNC socket), and cannot touch root's.
        let (d, l, t) = (
            console_dir.display(),
            paths.console_log.display(),
            target.display(),
        );
        assert!(sh_as(3_999_301, 3_999_302, &format!("touch {d}/virt-vnc")));
        for attack in [
            format!("rm -f {l}"),
            format!("mv {l} {d}/moved"),
            format!("ln -sf {t} {l}"),
            format!("echo x >> {l}"),
        ] {
            assert!(
                !sh_as(3_999_301, 3_999_302, &attack),
                "QEMU could: {attack}"
            );
        }
        // A second start keeps what is root's and the guest's output in it.
        fs::write(&paths.console_log, "boot line\n").unwrap();
        prepare(&paths, qemu).unwrap();
        assert_eq!(
            fs::read_to_string(&paths.console_log).unwrap(),
            "boot line\n"
        );
    }

    #[test]
    fn a_subdirectory_someone_else_put_in_place_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let paths = paths_in(tmp.path());
        let qemu = NodeOwner {
            uid: 3_999_301,
            gid: 3_999_301,
        };
        prepare(&paths, qemu).unwrap();
        // What an escaped QEMU did where the private dir was writable to it.
        let ci = paths.private_dir.join("cloud-init");
        fs::remove_dir(&ci).unwrap();
        fs::create_dir(&ci).unwrap();
        nix::unistd::chown(&ci, Some(nix::unistd::Uid::from_raw(3_999_301)), None).unwrap();
        let e = prepare(&paths, qemu).unwrap_err();
        assert!(
            matches!(
                e,
                HostError::NotOurs {
                    owner: 3_999_301,
                    ..
                }
            ),
            "{e}"
        );
        // And a link there is never followed.
        let etc = stat(Path::new("/etc"));
        fs::remove_dir(&ci).unwrap();
        std::os::unix::fs::symlink("/etc", &ci).unwrap();
        let e = prepare(&paths, qemu).unwrap_err();
        assert!(matches!(e, HostError::Link { .. }), "{e}");
        assert_eq!(stat(Path::new("/etc")), etc, "/etc is untouched");
    }
}
