//! The user QEMU runs as. A guest that escapes into QEMU acts with QEMU's rights, so QEMU runs
//! as a dedicated unprivileged user, as libvirt's system daemon and KubeVirt (uid 107) do: with
//! no capabilities (libvirt clears them for a non-root emulator), unable to open the launcher's
//! and libvirtd's root-only sockets or anything else of root's. On a host each VM's QEMU has an
//! id of its own (`qemu_ids`). The launcher gives this user exactly what QEMU must reach: search
//! through its private dirs (`private_dirs`) and, by an ACL entry, the runtime and hotplug dirs
//! (`acl`); the images it makes and the block nodes, by descriptor; a dir of its own for the
//! sockets it creates.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The accounts QEMU runs as by default, the first that exists: Debian's and Ubuntu's
/// (`libvirt-qemu`), then Fedora's and KubeVirt's images' (`qemu`).
pub(crate) const DEFAULT_NAMES: [&str; 2] = ["libvirt-qemu", "qemu"];

/// `Default` is root: what a daemon that only judges XML, or a `--qemu-user root` run, uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QemuUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// Its primary and supplementary groups, looked up once, when the launcher resolves the
    /// user: libvirt gives QEMU both, as they are whenever it starts QEMU, so a group changed
    /// while a launcher runs is seen by the QEMU of its next start (a restart, a Start) and by
    /// the launcher's checks only once a new launcher runs. Looked up for every check, they cost
    /// each Sync a read of `/etc/group` through NSS per host path.
    groups: Vec<u32>,
}

#[derive(Debug, thiserror::Error)]
pub enum QemuUserError {
    #[error("--qemu-user {0}: no such user here")]
    Unknown(String),
    #[error("--qemu-user {name}: cannot look it up")]
    Lookup {
        name: String,
        #[source]
        source: nix::Error,
    },
}

impl Default for QemuUser {
    fn default() -> QemuUser {
        QemuUser::root()
    }
}

impl QemuUser {
    pub fn root() -> QemuUser {
        QemuUser::new("root".into(), 0, 0)
    }

    /// The user `name` of `uid` and primary group `gid`, its supplementary groups looked up
    /// now (none for a name without an account).
    pub(crate) fn new(name: String, uid: u32, gid: u32) -> QemuUser {
        let mut groups = vec![gid];
        // Root reaches everything: its groups are never asked.
        if uid != 0 {
            groups.extend(supplementary_groups(&name, gid));
        }
        QemuUser {
            name,
            uid,
            gid,
            groups,
        }
    }

    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// The user named by `--qemu-user` (a name, or `root`), or the first of `DEFAULT_NAMES`
    /// that exists. `Ok(None)`: nothing was named and no default account exists.
    pub fn resolve(requested: Option<&str>) -> Result<Option<QemuUser>, QemuUserError> {
        match requested {
            Some(name) => match lookup(name)? {
                Some(user) => Ok(Some(user)),
                None => Err(QemuUserError::Unknown(name.into())),
            },
            None => {
                for name in DEFAULT_NAMES {
                    if let Some(user) = lookup(name)? {
                        return Ok(Some(user));
                    }
                }
                Ok(None)
            }
        }
    }
}

/// Whether `meta`'s mode gives the user `uid` with `groups` all of `wanted`, by the class the
/// kernel picks: owner, else group, else others ([`QemuUser::permits`]).
pub(crate) fn mode_permits(meta: &fs::Metadata, uid: u32, groups: &[u32], wanted: u32) -> bool {
    let shift = if meta.uid() == uid {
        6
    } else if groups.contains(&meta.gid()) {
        3
    } else {
        0
    };
    (meta.mode() >> shift) & wanted == wanted
}

/// A directory on a path that QEMU's user cannot pass through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Blocked {
    pub dir: PathBuf,
    pub mode: u32,
    pub owner: u32,
    pub group: u32,
}

impl QemuUser {
    /// The first directory on the way to `path` (which need not exist yet) that this user may
    /// not search; `None` where it may reach it (root reaches everything).
    pub(crate) fn blocked_on_the_way(&self, path: &Path) -> Option<Blocked> {
        if self.is_root() {
            return None;
        }
        let mut dirs: Vec<&Path> = path.ancestors().skip(1).collect();
        dirs.reverse();
        dirs.into_iter().find_map(|dir| {
            let meta = fs::metadata(dir).ok()?;
            (!self.permits(&meta, 0o1)).then(|| Blocked {
                dir: dir.into(),
                mode: meta.mode() & 0o7777,
                owner: meta.uid(),
                group: meta.gid(),
            })
        })
    }

    /// Whether the file's mode gives this user all of `wanted` (`0o4` read, `0o2` write, `0o1`
    /// search or execute), by the class the kernel picks: owner, else one of its groups, else
    /// others.
    pub(crate) fn permits(&self, meta: &fs::Metadata, wanted: u32) -> bool {
        mode_permits(meta, self.uid, &self.groups, wanted)
    }
}

/// The groups `/etc/group` (or NSS) lists `name` in besides `gid`; none if it cannot tell.
fn supplementary_groups(name: &str, gid: u32) -> Vec<u32> {
    let Ok(c_name) = std::ffi::CString::new(name) else {
        return Vec::new();
    };
    let all = nix::unistd::getgrouplist(&c_name, nix::unistd::Gid::from_raw(gid));
    all.unwrap_or_default()
        .iter()
        .map(|g| g.as_raw())
        .filter(|g| *g != gid)
        .collect()
}

fn lookup(name: &str) -> Result<Option<QemuUser>, QemuUserError> {
    let lookup_error = |source| QemuUserError::Lookup {
        name: name.into(),
        source,
    };
    if let Ok(uid) = name.parse::<u32>() {
        // A bare uid (KubeVirt's 107 in an image without the account): its own group.
        let user =
            nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)).map_err(lookup_error)?;
        return Ok(Some(match user {
            Some(user) => QemuUser::new(user.name, uid, user.gid.as_raw()),
            None => QemuUser::new(uid.to_string(), uid, uid),
        }));
    }
    Ok(nix::unistd::User::from_name(name)
        .map_err(lookup_error)?
        .map(|user| QemuUser::new(user.name, user.uid.as_raw(), user.gid.as_raw())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn root_is_found_by_name_and_by_uid() {
        assert_eq!(
            QemuUser::resolve(Some("root")).unwrap(),
            Some(QemuUser::root())
        );
        assert_eq!(
            QemuUser::resolve(Some("0")).unwrap(),
            Some(QemuUser::root())
        );
    }

    #[test]
    fn an_unknown_name_is_refused_naming_it() {
        let e = QemuUser::resolve(Some("no-such-user-vmltest")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--qemu-user no-such-user-vmltest: no such user here"
        );
    }

    #[test]
    fn its_groups_are_the_ones_id_lists() {
        // The default account (Debian's libvirt-daemon-system makes `libvirt-qemu`, in the
        // `kvm` group besides its own), as every launcher of this machine resolves it.
        let user = QemuUser::resolve(None)
            .unwrap()
            .expect("a default QEMU account (libvirt's packages make it)");
        let id = std::process::Command::new("id")
            .args(["-G", &user.name])
            .output()
            .unwrap();
        assert!(id.status.success());
        let mut listed: Vec<u32> = String::from_utf8(id.stdout)
            .unwrap()
            .split_whitespace()
            .map(|g| g.parse().unwrap())
            .collect();
        assert!(listed.len() > 1, "{} has supplementary groups", user.name);
        let mut groups = user.groups.clone();
        assert_eq!(groups[0], user.gid, "its own group first");
        for list in [&mut groups, &mut listed] {
            list.sort_unstable();
            list.dedup();
        }
        assert_eq!(groups, listed);
    }

    #[test]
    fn a_uid_without_an_account_runs_with_its_own_group() {
        // No account has this uid on any machine this runs on.
        let user = QemuUser::resolve(Some("3999999")).unwrap().unwrap();
        assert_eq!((user.uid, user.gid), (3_999_999, 3_999_999));
    }

    #[test]
    fn the_first_dir_it_cannot_search_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let closed = tmp.path().join("closed");
        let open = closed.join("open");
        fs::create_dir_all(&open).unwrap();
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(&closed, fs::Permissions::from_mode(0o750)).unwrap();
        let qemu = QemuUser::new("no-such-user-vmltest".into(), 3_999_999, 3_999_999);
        let disk = open.join("not-yet/disk.img");
        assert_eq!(
            qemu.blocked_on_the_way(&disk),
            Some(Blocked {
                dir: closed.clone(),
                mode: 0o750,
                owner: 0,
                group: 0
            })
        );
        fs::set_permissions(&closed, fs::Permissions::from_mode(0o751)).unwrap();
        assert_eq!(qemu.blocked_on_the_way(&disk), None);
        // Its group may search where others may not.
        nix::unistd::chown(&closed, None, Some(nix::unistd::Gid::from_raw(3_999_999))).unwrap();
        fs::set_permissions(&closed, fs::Permissions::from_mode(0o710)).unwrap();
        assert_eq!(qemu.blocked_on_the_way(&disk), None);
        assert_eq!(QemuUser::root().blocked_on_the_way(&disk), None);
    }
}
