//! Whether a directory is the launcher's own: the directory itself (its user's, writable by no
//! one else, not a symlink) and every directory on the way to it (root's or its user's, and
//! writable by others only when sticky, as `/tmp` is). Root writes config files into such
//! directories and trusts what it reads back from them, so someone who could rename one of
//! them — or any directory above — could swap in a symlink and redirect every later write or
//! read. The runtime dir and the shared capability cache are checked here; what to say when one
//! is refused is theirs.

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub(crate) enum OwnedDirError {
    #[error("cannot inspect {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// `path` is the offending directory: the one checked, or one of its ancestors.
    #[error("{path}: {why}")]
    Unsafe { path: PathBuf, why: String },
}

const STICKY: u32 = 0o1000;

/// `path` is a directory (not a symlink to one) of the launcher's user that no one else can
/// write.
pub(crate) fn check_owned(path: &Path) -> Result<(), OwnedDirError> {
    let meta = fs::symlink_metadata(path).map_err(|source| OwnedDirError::Io {
        path: path.into(),
        source,
    })?;
    let unsafe_because = |why: String| OwnedDirError::Unsafe {
        path: path.into(),
        why,
    };
    if !meta.file_type().is_dir() {
        return Err(unsafe_because("not a directory (a symlink?)".into()));
    }
    let euid = nix::unistd::geteuid().as_raw();
    if meta.uid() != euid {
        return Err(unsafe_because(format!(
            "owned by uid {}, not this launcher's {euid}",
            meta.uid()
        )));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(unsafe_because(format!(
            "mode {:o}: group or others may write it",
            meta.mode() & 0o7777
        )));
    }
    Ok(())
}

/// Every existing directory above `path` is root's or the launcher's user's, and no one else
/// may write it unless it is sticky (then others may add entries but not rename ours). Those
/// not there yet are the launcher's to make. A symlink on the way is judged by the directory
/// it sits in (which decides who may replace it) and by every directory it leads through (the
/// resolved path's ancestors), so all directories the kernel walks to reach `path` are checked.
pub(crate) fn check_ancestors(path: &Path) -> Result<(), OwnedDirError> {
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| OwnedDirError::Io { path, source }
    };
    let absolute = std::path::absolute(path).map_err(io_err(path))?;
    let mut dirs: Vec<PathBuf> = absolute
        .ancestors()
        .skip(1)
        .map(Path::to_path_buf)
        .collect();
    // `ancestors` runs deepest first: the first that exists, resolved.
    if let Some(deepest) = dirs.iter().find(|d| d.exists()) {
        let real = fs::canonicalize(deepest).map_err(io_err(deepest))?;
        dirs.extend(real.ancestors().map(Path::to_path_buf));
    }
    let euid = nix::unistd::geteuid().as_raw();
    for dir in &dirs {
        let meta = match fs::metadata(dir) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(source) => return Err(io_err(dir)(source)),
        };
        if let Some(why) = ancestor_unsafe_because(meta.uid(), meta.mode(), euid) {
            return Err(OwnedDirError::Unsafe {
                path: dir.clone(),
                why: format!("above {}, {why}", path.display()),
            });
        }
    }
    Ok(())
}

/// Why a directory owned by `uid` with `mode` lets someone other than root or `euid` rename
/// what is in it; `None` if it does not.
fn ancestor_unsafe_because(uid: u32, mode: u32, euid: u32) -> Option<String> {
    if uid != 0 && uid != euid {
        return Some(format!(
            "owned by uid {uid}, neither root nor this launcher's {euid}: its owner may rename \
             what is in it"
        ));
    }
    if mode & 0o022 != 0 && mode & STICKY == 0 {
        return Some(format!(
            "mode {:o}: group or others may write it, and it is not sticky",
            mode & 0o7777
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(path: &Path, mode: u32) {
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn an_ancestor_others_may_write_is_refused_unless_sticky() {
        let tmp = tempfile::tempdir().unwrap();
        let open = tmp.path().join("open");
        fs::create_dir(&open).unwrap();
        chmod(&open, 0o777);
        let target = open.join("a/b");
        let err = check_ancestors(&target).unwrap_err();
        assert!(
            matches!(&err, OwnedDirError::Unsafe { path, why }
                if *path == open && why.contains("mode 777") && why.contains("not sticky")),
            "{err}"
        );
        // Sticky, like /tmp: others may add entries but not rename ours.
        chmod(&open, 0o1777);
        check_ancestors(&target).unwrap();
        check_ancestors(Path::new("/tmp/vmlauncher-test")).unwrap();
    }

    #[test]
    fn an_ancestor_owned_by_someone_else_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().join("home");
        fs::create_dir(&home).unwrap();
        chmod(&home, 0o755);
        let other = nix::unistd::geteuid().as_raw() + 4242;
        nix::unistd::chown(&home, Some(other.into()), None).unwrap();
        let err = check_ancestors(&home.join("vm")).unwrap_err();
        assert!(
            matches!(&err, OwnedDirError::Unsafe { path, why }
                if *path == home && why.contains(&format!("uid {other}"))),
            "{err}"
        );
    }

    #[test]
    fn the_directories_a_symlink_leads_through_are_checked() {
        let tmp = tempfile::tempdir().unwrap();
        let open = tmp.path().join("open");
        fs::create_dir_all(open.join("real")).unwrap();
        chmod(&open, 0o777);
        let safe = tmp.path().join("safe");
        fs::create_dir(&safe).unwrap();
        std::os::unix::fs::symlink(open.join("real"), safe.join("link")).unwrap();
        let err = check_ancestors(&safe.join("link/vm")).unwrap_err();
        assert!(
            matches!(&err, OwnedDirError::Unsafe { path, .. } if path.ends_with("open")),
            "{err}"
        );
    }

    #[test]
    fn the_rule_on_owner_mode_and_sticky_bit() {
        let (root, me, other) = (0, 1000, 1001);
        assert_eq!(ancestor_unsafe_because(root, 0o40755, me), None);
        assert_eq!(ancestor_unsafe_because(me, 0o40700, me), None);
        assert_eq!(ancestor_unsafe_because(root, 0o41777, me), None);
        assert!(ancestor_unsafe_because(other, 0o40755, me).is_some());
        assert!(ancestor_unsafe_because(root, 0o40775, me).is_some());
        assert!(ancestor_unsafe_because(root, 0o40757, me).is_some());
        // Sticky does not excuse a stranger's directory: its owner may still rename.
        assert!(ancestor_unsafe_because(other, 0o41777, me).is_some());
    }
}
