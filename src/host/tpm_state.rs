//! swtpm's persistent state, which libvirt, as root, chowns to swtpm's user file by file at
//! every start of the domain: `virFileChownFiles` takes each entry of the state dir that `stat`
//! (following links) calls a regular file and `chown`s it by path. swtpm runs as the VM's QEMU
//! user and its state dir is that user's, so a guest escaped into QEMU could put a link to any
//! host file there (`/etc/shadow`) and have libvirt give it that file at the next start. Before
//! each start the launcher removes from the state dir every entry that is neither a regular
//! file nor a directory, through descriptors (no path of the dir is followed). A hard link to
//! another user's file cannot be made there (`fs.protected_hardlinks`, on by default).

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fstatat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};

use super::HostError;

/// Where libvirt keeps a domain's TPM 2.0 state under its swtpm dir: `<uuid>/tpm2`.
const TPM2: &str = "tpm2";

/// Removes every entry of the domain `uuid`'s TPM state dir under `swtpm_dir` (libvirt's
/// `/var/lib/libvirt/swtpm`) that is not a regular file or a directory, and returns their
/// names. No state dir (a first start, a TPM that keeps none) is nothing to do.
pub(crate) fn remove_planted(swtpm_dir: &Path, uuid: &str) -> Result<Vec<OsString>, HostError> {
    let state = swtpm_dir.join(uuid).join(TPM2);
    let failed = |e: Errno| HostError::Inspect {
        path: state.clone(),
        source: e.into(),
    };
    if !crate::spec::looks_like_uuid(uuid) {
        return Err(failed(Errno::EINVAL));
    }
    // libvirt names the dir by the UUID it formats, in lower case.
    let uuid = uuid.to_ascii_lowercase();
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let open_in = |dir: Option<&OwnedFd>, name: &Path| -> Result<Option<OwnedFd>, HostError> {
        let opened = match dir {
            Some(dir) => openat(dir, name, flags, Mode::empty()),
            None => openat(nix::fcntl::AT_FDCWD, name, flags, Mode::empty()),
        };
        match opened {
            Ok(fd) => Ok(Some(fd)),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(failed(e)),
        }
    };
    let Some(root) = open_in(None, swtpm_dir)? else {
        return Ok(Vec::new());
    };
    let Some(domain) = open_in(Some(&root), Path::new(&uuid))? else {
        return Ok(Vec::new());
    };
    let Some(tpm2) = open_in(Some(&domain), Path::new(TPM2))? else {
        return Ok(Vec::new());
    };
    let names: Vec<OsString> = {
        let copy = tpm2.try_clone().map_err(|e| HostError::Inspect {
            path: state.clone(),
            source: e,
        })?;
        let mut names = Vec::new();
        for entry in nix::dir::Dir::from_fd(copy).map_err(failed)? {
            let entry = entry.map_err(failed)?;
            let name = entry.file_name().to_bytes();
            if name != b"." && name != b".." {
                names.push(std::os::unix::ffi::OsStringExt::from_vec(name.to_vec()));
            }
        }
        names
    };
    let mut removed = Vec::new();
    for name in names {
        let st = match fstatat(&tpm2, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::ENOENT) => continue,
            Err(e) => return Err(failed(e)),
        };
        let kind = super::walk::file_type(&st);
        if kind == SFlag::S_IFREG || kind == SFlag::S_IFDIR {
            continue;
        }
        match unlinkat(&tpm2, name.as_os_str(), UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => removed.push(name),
            Err(e) => return Err(failed(e)),
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    const UUID: &str = "2f1d0a8e-6c1b-4e55-9a34-5b0f6f7c1a09";

    #[test]
    fn links_and_fifos_go_and_the_state_and_the_links_targets_stay() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("root-only");
        fs::write(&target, b"keep").unwrap();
        let state = tmp.path().join("swtpm").join(UUID).join(TPM2);
        fs::create_dir_all(state.join("sub")).unwrap();
        fs::write(state.join("tpm2-00.permall"), b"state").unwrap();
        std::os::unix::fs::symlink(&target, state.join("planted")).unwrap();
        nix::unistd::mkfifo(&state.join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        let mut removed = remove_planted(&tmp.path().join("swtpm"), &UUID.to_uppercase()).unwrap();
        removed.sort();
        assert_eq!(removed, [OsString::from("fifo"), OsString::from("planted")]);
        assert_eq!(fs::read(&target).unwrap(), b"keep");
        assert_eq!(fs::read(state.join("tpm2-00.permall")).unwrap(), b"state");
        assert!(state.join("sub").is_dir());
        assert_eq!(fs::read_dir(&state).unwrap().count(), 2);
    }

    #[test]
    fn no_state_is_nothing_to_do_and_a_linked_state_dir_is_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let swtpm = tmp.path().join("swtpm");
        assert!(remove_planted(&swtpm, UUID).unwrap().is_empty());
        fs::create_dir_all(swtpm.join(UUID)).unwrap();
        assert!(remove_planted(&swtpm, UUID).unwrap().is_empty());
        // `tpm2` itself a link: libvirt's virDirCreate would refuse it; the launcher lists
        // nothing through it.
        let elsewhere = tmp.path().join("elsewhere");
        fs::create_dir(&elsewhere).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", elsewhere.join("x")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, swtpm.join(UUID).join(TPM2)).unwrap();
        assert!(remove_planted(&swtpm, UUID).is_err());
        assert!(fs::symlink_metadata(elsewhere.join("x")).is_ok());
        assert!(remove_planted(&swtpm, "../../etc").is_err());
    }
}
