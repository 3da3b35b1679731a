//! The launcher's own small state files (the hotplug records, the last Sync, the shared capability
//! cache): replaced whole or not at all (durably where a machine crash matters), or overwritten
//! in place where the content itself shows whether it is whole (`overwrite_in_place`, the last
//! Sync's framed slots); read back bounded and never through a symlink. One place for the
//! crash-safety rules, so no file gets them half right.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// What reading one of the launcher's files found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Contents {
    /// No file there (yet).
    Missing,
    /// The whole file, at most the bound.
    Read(Vec<u8>),
    /// More than the bound: not read further.
    TooLarge,
}

/// The launcher's own file at `path`, at most `max` bytes, never through a symlink (a link
/// there is an error, not followed) and only if it is a regular file: a FIFO or a device planted
/// there is an error too, found without waiting (the open does not block on a FIFO's writer).
pub(crate) fn read_bounded(path: &Path, max: u64) -> io::Result<Contents> {
    let file = match fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Contents::Missing),
        Err(e) => return Err(e),
    };
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    let mut bytes = Vec::new();
    file.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Ok(Contents::TooLarge);
    }
    Ok(Contents::Read(bytes))
}

/// Removes `path` if it is there; a path already gone is not an error.
pub(crate) fn remove_if_present(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Replaces `path` with `bytes` so that a crash at any point leaves the old content or the new:
/// a new temp file in the same directory (created exclusively, mode 0600), fsync, rename, fsync
/// of the directory (which makes the rename itself durable).
pub(crate) fn write_durably(path: &Path, bytes: &[u8]) -> io::Result<()> {
    replace(path, bytes, true)
}

/// Like [`write_durably`] without the two fsyncs: a *process* killed at any point leaves the old
/// content or the new, a machine crash may leave either or none. For files read only while the
/// kernel that wrote them still runs (a launcher's private copy of the capability cache).
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    replace(path, bytes, false)
}

/// Writes `bytes` over the file at `path` in place (created private if missing; anything but a
/// regular file there is removed first, never followed): no temp file, no rename, no fsync. A
/// process killed part-way can leave a mix of old and new, so the content must show whether it
/// is whole (`launcher::saved` writes two such files in turn, each framed by its generation).
/// Why not [`write_atomically`]: a rename over an existing file makes ext4 start writing the new
/// file back at once (its `auto_da_alloc` rule), 0.35–0.5 ms on this machine, where writing in
/// place costs a few microseconds.
pub(crate) fn overwrite_in_place(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    match fs::symlink_metadata(path) {
        Ok(meta) if !meta.is_file() => fs::remove_file(path)?,
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    file.write_all_at(bytes, 0)?;
    file.set_len(bytes.len() as u64)
}

fn replace(path: &Path, bytes: &[u8], sync: bool) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".tmp-")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    if sync {
        tmp.as_file().sync_all()?;
    }
    tmp.persist(path).map_err(|e| e.error)?;
    if sync {
        fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn reads_missing_whole_and_too_large_files() {
        let (_dir, path) = crate::testing::temp_path("f");
        assert_eq!(read_bounded(&path, 4).unwrap(), Contents::Missing);
        fs::write(&path, b"1234").unwrap();
        assert_eq!(
            read_bounded(&path, 4).unwrap(),
            Contents::Read(b"1234".to_vec())
        );
        fs::write(&path, b"12345").unwrap();
        assert_eq!(read_bounded(&path, 4).unwrap(), Contents::TooLarge);
    }

    #[test]
    fn never_reads_through_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("target"), b"secret").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(dir.path().join("target"), &link).unwrap();
        let err = read_bounded(&link, 100).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ELOOP), "{err}");
    }

    #[test]
    fn never_reads_a_fifo_or_a_device() {
        let (_dir, path) = crate::testing::temp_path("fifo");
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::S_IRWXU).unwrap();
        // Opening a FIFO for reading waits for a writer, which never comes.
        let err =
            crate::testing::without_blocking("reading a FIFO", move || read_bounded(&path, 100))
                .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
        let err = read_bounded(Path::new("/dev/zero"), 100).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
    }

    #[test]
    fn a_write_replaces_the_file_private_and_leaves_no_temp_file() {
        let (dir, path) = crate::testing::temp_path("state.json");
        fs::write(&path, b"old").unwrap();
        write_durably(&path, b"new").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"new");
        write_atomically(&path, b"newer").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"newer");
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["state.json"]);
    }

    #[test]
    fn an_overwrite_in_place_shortens_and_never_follows_or_blocks() {
        let (dir, path) = crate::testing::temp_path("slot");
        overwrite_in_place(&path, b"a longer first text").unwrap();
        overwrite_in_place(&path, b"short").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"short");
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        // A link there is replaced, its target untouched.
        let victim = dir.path().join("victim");
        fs::write(&victim, b"precious").unwrap();
        fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        overwrite_in_place(&path, b"new").unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"precious");
        assert!(fs::symlink_metadata(&path).unwrap().is_file());
        // A FIFO (where opening for writing would wait for a reader) is replaced too.
        fs::remove_file(&path).unwrap();
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::S_IRWXU).unwrap();
        overwrite_in_place(&path, b"newer").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"newer");
    }
}
