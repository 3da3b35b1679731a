//! A POSIX ACL entry that lets one uid search a directory, and only that: how QEMU passes
//! through the operator's runtime dir (and a hotplug dir) to what the launcher gives it inside,
//! without the dir's mode changing for anyone else (`o+x` would let every local user in).
//! The entry is removed again when the launcher ends; a later launcher removes one a killed
//! launcher left (`revoke` of every id of the QEMU range).
//!
//! The kernel's `system.posix_acl_access` xattr is read and written directly (its format:
//! `include/uapi/linux/posix_acl_xattr.h`): a version, then (tag, perm, id) entries sorted by
//! tag and id. While a named entry exists the mode's group bits show the ACL's mask; once the
//! ACL is only the three base entries again, the kernel drops it and the mode is as before.

use std::ffi::CStr;
use std::fs;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

const XATTR: &CStr = c"system.posix_acl_access";
const VERSION: u32 = 2;
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;
const UNDEFINED_ID: u32 = u32::MAX;
const SEARCH: u16 = 0o1;
/// An ACL holds at most this many entries here (ext4 fits ~500 in a block; more is not ours).
const MAX_ENTRIES: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    tag: u16,
    id: u32,
    perm: u16,
}

/// Lets `uid` search `dir`, whatever the dir's mode, by a named ACL entry (`u:UID:--x`).
pub fn grant_search(dir: &Path, uid: u32) -> io::Result<()> {
    let file = open_dir(dir)?;
    let mut entries = read(&file)?;
    entries.retain(|e| !(e.tag == USER && e.id == uid));
    entries.push(Entry {
        tag: USER,
        id: uid,
        perm: SEARCH,
    });
    write(&file, entries)
}

/// Removes the named entries of every uid `drop` picks; the dir's mode is as it was before
/// they were added once no named entry is left.
pub(crate) fn revoke(dir: &Path, drop: impl Fn(u32) -> bool) -> io::Result<()> {
    let file = open_dir(dir)?;
    let mut entries = read(&file)?;
    let before = entries.len();
    entries.retain(|e| !(e.tag == USER && drop(e.id)));
    if entries.len() == before {
        return Ok(());
    }
    write(&file, entries)
}

/// The named uids of `dir`'s ACL (none when it has no ACL).
#[cfg(test)]
pub(crate) fn named_users(dir: &Path) -> io::Result<Vec<u32>> {
    let file = open_dir(dir)?;
    Ok(read(&file)?
        .into_iter()
        .filter(|e| e.tag == USER)
        .map(|e| e.id)
        .collect())
}

/// Whether `file` has an access ACL beyond its mode.
pub(crate) fn has_acl(file: &fs::File) -> bool {
    get_xattr(file, &mut []).is_ok_and(|n| n > 0)
}

/// `fgetxattr` of the ACL into `buf` (empty: its size only).
fn get_xattr(file: &fs::File, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: the name is NUL-terminated and the buffer is as long as said (a null pointer
    // with length 0 asks for the size).
    let n = unsafe {
        libc::fgetxattr(
            file.as_raw_fd(),
            XATTR.as_ptr(),
            if buf.is_empty() {
                std::ptr::null_mut()
            } else {
                buf.as_mut_ptr().cast()
            },
            buf.len(),
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

fn open_dir(dir: &Path) -> io::Result<fs::File> {
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir)
}

/// The dir's ACL, or the one its mode stands for when it has none.
fn read(file: &fs::File) -> io::Result<Vec<Entry>> {
    let mut buf = vec![0u8; 4 + 8 * MAX_ENTRIES];
    let n = match get_xattr(file, &mut buf) {
        Ok(n) => n,
        Err(e) if e.raw_os_error() == Some(libc::ENODATA) => {
            let mode = file.metadata()?.mode();
            let bits = |shift: u32| ((mode >> shift) & 0o7) as u16;
            return Ok(vec![
                base(USER_OBJ, bits(6)),
                base(GROUP_OBJ, bits(3)),
                base(OTHER, bits(0)),
            ]);
        }
        Err(e) => return Err(e),
    };
    decode(&buf[..n])
}

fn base(tag: u16, perm: u16) -> Entry {
    Entry {
        tag,
        id: UNDEFINED_ID,
        perm,
    }
}

/// Writes `entries` with a mask that covers the group class when a named entry needs one,
/// and none otherwise (the kernel then keeps the mode alone).
fn write(file: &fs::File, mut entries: Vec<Entry>) -> io::Result<()> {
    entries.retain(|e| e.tag != MASK);
    let named = entries.iter().any(|e| e.tag == USER || e.tag == GROUP);
    if named {
        let perm = entries
            .iter()
            .filter(|e| matches!(e.tag, USER | GROUP_OBJ | GROUP))
            .fold(0, |p, e| p | e.perm);
        entries.push(base(MASK, perm));
    }
    entries.sort();
    let bytes = encode(&entries);
    // SAFETY: as in `read`; the buffer holds `bytes.len()` bytes.
    let rc = unsafe {
        libc::fsetxattr(
            file.as_raw_fd(),
            XATTR.as_ptr(),
            bytes.as_ptr().cast(),
            bytes.len(),
            0,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn decode(bytes: &[u8]) -> io::Result<Vec<Entry>> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "malformed POSIX ACL");
    let (header, body) = bytes.split_at_checked(4).ok_or_else(bad)?;
    if u32::from_le_bytes(header.try_into().map_err(|_| bad())?) != VERSION || body.len() % 8 != 0 {
        return Err(bad());
    }
    Ok(body
        .chunks_exact(8)
        .map(|c| Entry {
            tag: u16::from_le_bytes([c[0], c[1]]),
            perm: u16::from_le_bytes([c[2], c[3]]),
            id: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
        })
        .collect())
}

fn encode(entries: &[Entry]) -> Vec<u8> {
    let mut out = VERSION.to_le_bytes().to_vec();
    for e in entries {
        out.extend_from_slice(&e.tag.to_le_bytes());
        out.extend_from_slice(&e.perm.to_le_bytes());
        out.extend_from_slice(&e.id.to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(dir: &Path) -> u32 {
        fs::metadata(dir).unwrap().mode() & 0o7777
    }

    /// Whether `uid` (no groups, no capabilities) may list what is under `dir` by a known name.
    fn reaches(uid: u32, path: &Path) -> bool {
        std::process::Command::new("setpriv")
            .args([
                &format!("--reuid={uid}"),
                &format!("--regid={uid}"),
                "--clear-groups",
                "--inh-caps=-all",
                "--bounding-set=-all",
                "test",
                "-e",
            ])
            .arg(path)
            .status()
            .expect("setpriv")
            .success()
    }

    #[test]
    fn a_granted_uid_passes_through_and_the_mode_comes_back_when_revoked() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("rt");
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        let inside = dir.join("inside");
        fs::write(&inside, "x").unwrap();
        // Ids no account has on any machine this runs on.
        let (qemu, other) = (3_999_101, 3_999_102);
        assert!(!reaches(qemu, &inside));

        grant_search(&dir, qemu).unwrap();
        assert!(reaches(qemu, &inside), "the granted uid passes");
        assert!(!reaches(other, &inside), "another uid does not");
        assert_eq!(named_users(&dir).unwrap(), vec![qemu]);
        // The group bits show the mask (search), the group's own entry is still none.
        assert_eq!(mode(&dir), 0o710);

        revoke(&dir, |uid| uid == qemu).unwrap();
        assert!(!reaches(qemu, &inside));
        assert_eq!(mode(&dir), 0o700, "the mode is the operator's again");
        assert_eq!(named_users(&dir).unwrap(), Vec::<u32>::new());
    }

    #[test]
    fn an_operators_own_entries_are_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        fs::set_permissions(dir, fs::Permissions::from_mode(0o750)).unwrap();
        let status = std::process::Command::new("setfacl")
            .args(["-m", "u:3999201:rx"])
            .arg(dir)
            .status()
            .expect("setfacl (Debian's acl package)");
        assert!(status.success());
        grant_search(dir, 3_999_202).unwrap();
        revoke(dir, |uid| uid == 3_999_202).unwrap();
        assert_eq!(named_users(dir).unwrap(), vec![3_999_201]);
        assert_eq!(mode(dir), 0o750, "mask r-x: the operator's entry and group");
    }
}
