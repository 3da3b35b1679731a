//! The logs QEMU writes, kept bounded by the launcher instead of a virtlogd.
//!
//! The private libvirtd runs with `stdio_handler = "file"`: it opens the guest's serial console
//! log and QEMU's own log (its stderr) itself and hands QEMU the descriptors, both opened with
//! `O_APPEND`. No virtlogd runs beside it (17 MiB RSS, a process to start and supervise), so
//! something else must stop a guest that writes its console without end from filling the disk.
//! A log over its bound is copied to `NAME.1` (the one older generation kept, replaced each
//! time) and truncated to nothing; QEMU's next append starts it again at 0 (logrotate's
//! `copytruncate`). A log and its copy therefore hold at most twice the bound, plus what QEMU
//! writes in one `CHECK_SPACING`; a log found over `COPY_LIMIT` times its bound, or one
//! that cannot be copied (a full disk), is emptied without a copy.
//!
//! A thread waits on inotify for the logs to change and checks them at most once per
//! `CHECK_SPACING`: a guest writing its console flat out costs one check (a directory
//! listing, an `lstat` per log) per 0.25 s, not one per write, and a quiet guest costs
//! nothing. Without inotify it checks every `POLL_INTERVAL`. While no launcher runs (killed, being
//! restarted), nothing bounds the logs; the next launcher brings them under the bound at once.
//! What QEMU appends between the copy's last read and the truncation is lost, as with
//! logrotate.

use std::ffi::OsStr;
use std::fs::{self, OpenOptions};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::durable::remove_if_present;
use crate::host::watch::poll_timeout;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

/// virtlogd's default `max_size`: the bound of each log unless the owner gives another.
pub const DEFAULT_MAX_SIZE: u64 = 2 * 1024 * 1024;
/// The smallest bound accepted: below a page, a copy per check would be most of the work.
pub const MIN_MAX_SIZE: u64 = 4096;
/// The least time between two checks.
pub(crate) const CHECK_SPACING: Duration = Duration::from_millis(250);
/// Between two checks when inotify is not available.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Which files are bounded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Bounded {
    /// One file (the serial console log).
    File(PathBuf),
    /// Every `*.log` in a directory (libvirt's `<domain>.log` files of QEMU's output).
    LogsIn(PathBuf),
}

impl Bounded {
    /// The directory watched for the file(s) to appear.
    fn dir(&self) -> &Path {
        match self {
            Bounded::File(path) => path.parent().unwrap_or(Path::new(".")),
            Bounded::LogsIn(dir) => dir,
        }
    }

    /// The files bounded now (those that exist).
    fn files(&self) -> Vec<PathBuf> {
        match self {
            Bounded::File(path) => vec![path.clone()],
            Bounded::LogsIn(dir) => fs::read_dir(dir)
                .map(|entries| {
                    entries
                        .filter_map(Result::ok)
                        .map(|e| e.path())
                        .filter(|p| p.extension() == Some(OsStr::new("log")))
                        .collect()
                })
                .unwrap_or_default(),
        }
    }
}

/// If `path` is a regular file over `max_size` bytes, copies it to `path.1` and truncates it.
/// Returns whether it did. Anything but a regular file at `path` (a link, a FIFO, a socket, a
/// directory) is left alone: the runtime dir is the launcher's, and such a thing there is not a
/// log it asked for. A link at `path.1` is replaced, never written through. The copy is
/// written as `path.1.partial` and renamed into place after the truncation.
///
/// The log is truncated even when no copy can be made: a log larger than [`COPY_LIMIT`] times
/// the bound (one that grew while no launcher ran) is not copied, and neither is one whose copy
/// fails (a full disk is when the bound matters most). Then an empty `path.1` replaces the old
/// one (or, if even that cannot be made, the old one goes), so that what is left never looks
/// like a newer generation than it is and a reader still sees that the log started again.
pub(crate) fn bound_one(path: &Path, max_size: u64) -> io::Result<bool> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_file() && meta.len() > max_size => {}
        Ok(_) => return Ok(false),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    }
    // Opened without following a link or blocking on a FIFO put there since the look above,
    // and looked at again through the descriptor.
    let log = match OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Ok(false),
        Err(e) => return Err(e),
    };
    let meta = log.metadata()?;
    if !meta.file_type().is_file() || meta.len() <= max_size {
        return Ok(false);
    }
    let older = older_generation(path);
    let partial = partial_copy(path);
    let copied = if meta.len() <= max_size.saturating_mul(COPY_LIMIT) {
        copy_to(&log, meta.len(), &partial)
    } else {
        Err(io::Error::other(format!(
            "{} bytes, over {COPY_LIMIT} times the bound",
            meta.len()
        )))
    };
    // With no copy, an empty NAME.1 takes the old one's place all the same: a new NAME.1 is
    // how a reader knows that the log started again.
    let replacement = match &copied {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(log = %path.display(), error = %e, "log emptied without keeping a copy");
            remove_if_present(&partial)?;
            let empty = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&partial);
            if empty.is_err() {
                remove_if_present(&older)?;
            }
            empty.is_ok()
        }
    };
    log.set_len(0)?;
    if replacement {
        // Put in place only now that the log is truncated: a reader that sees a new NAME.1
        // finds it whole and the log started again (`crate::console` relies on it). Replaces
        // whatever is at NAME.1, a link included, without following it.
        if let Err(e) = fs::rename(&partial, &older) {
            // A copy left in place would keep every reader waiting for this rotation to end
            // (`crate::console`). Without it and without NAME.1, a reader still sees that the
            // log started again (NAME.1 gone), and reads it from 0.
            let _ = remove_if_present(&partial);
            let _ = remove_if_present(&older);
            return Err(e);
        }
    }
    Ok(true)
}

/// How many times its bound a log may have grown and still be copied before it is emptied.
pub(crate) const COPY_LIMIT: u64 = 4;

/// Copies `log` to a new file at `to`: to its end, including what QEMU appends while this
/// copies (at most as much again as `len`, should a writer outrun the copy), so that only what
/// it appends between the last read and the truncation is lost.
fn copy_to(log: &fs::File, len: u64, to: &Path) -> io::Result<()> {
    remove_if_present(to)?;
    let mut copy = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)?;
    io::copy(&mut io::Read::take(log, 2 * len), &mut copy)?;
    Ok(())
}

/// `NAME.1.partial`: the copy while it is written. It is there from before the copy until the
/// rename after the truncation, so while it is there a reader cannot tell the log's bytes from
/// the next generation's (`crate::console` waits for it to go).
pub(crate) fn partial_copy(path: &Path) -> PathBuf {
    let mut name = older_generation(path).into_os_string();
    name.push(".partial");
    PathBuf::from(name)
}

/// `NAME.1` beside `NAME`.
pub(crate) fn older_generation(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".1");
    path.with_file_name(name)
}

/// The thread that keeps the logs bounded; stopped and joined when dropped.
#[derive(Debug)]
pub(crate) struct LogBound {
    stop: Option<OwnedFd>,
    thread: Option<JoinHandle<()>>,
}

impl LogBound {
    /// Checks the logs once now (a launcher that adopts a VM finds them as QEMU left them),
    /// then on every change. Where inotify cannot watch (no instance left: the limit is per
    /// user, shared by every root container of a node; a directory missing), the logs are
    /// checked every [`POLL_INTERVAL`] instead: they stay bounded either way.
    pub(crate) fn start(bounded: Vec<Bounded>, max_size: u64) -> io::Result<LogBound> {
        let inotify = match Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC) {
            Ok(inotify) => {
                // A file that appears or is put in place: watched for writes from then on.
                let watched = bounded.iter().map(Bounded::dir).all(|dir| {
                    inotify
                        .add_watch(dir, AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO)
                        .inspect_err(|e| tracing::warn!(dir = %dir.display(), error = %e, "cannot watch for logs; checking them every second"))
                        .is_ok()
                });
                watched.then_some(inotify)
            }
            Err(e) => {
                tracing::warn!(error = %e, "no inotify for the logs; checking them every second");
                None
            }
        };
        let (stop_read, stop_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let thread = std::thread::Builder::new()
            .name("log-bound".into())
            .spawn(move || watch(&bounded, max_size, inotify.as_ref(), &stop_read))?;
        Ok(LogBound {
            stop: Some(stop_write),
            thread: Some(thread),
        })
    }
}

impl Drop for LogBound {
    fn drop(&mut self) {
        // Closing the write end wakes the thread (the read end turns readable at end of file).
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn watch(bounded: &[Bounded], max_size: u64, inotify: Option<&Inotify>, stop: &OwnedFd) {
    // A copy a launcher was killed in the middle of.
    for path in bounded.iter().flat_map(Bounded::files) {
        let _ = remove_if_present(&partial_copy(&path));
    }
    loop {
        for path in bounded.iter().flat_map(Bounded::files) {
            if let Some(inotify) = inotify {
                // Re-adding a watch to a file already watched only refreshes it.
                let _ = inotify.add_watch(&path, AddWatchFlags::IN_MODIFY);
            }
            match bound_one(&path, max_size) {
                Ok(true) => {
                    tracing::info!(log = %path.display(), max_size, "log over its bound: kept as .1 and started again")
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(log = %path.display(), error = %e, "cannot bound the log"),
            }
        }
        // The spacing (without notifications, the whole interval), ended early only by a stop.
        let spacing = if inotify.is_some() {
            CHECK_SPACING
        } else {
            POLL_INTERVAL
        };
        if readable(stop, poll_timeout(spacing)) {
            return;
        }
        let Some(inotify) = inotify else {
            continue;
        };
        let mut fds = [
            PollFd::new(inotify.as_fd(), PollFlags::POLLIN),
            PollFd::new(stop.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => {}
            Err(e) => {
                tracing::warn!(error = %e, "cannot wait for the logs to change; they are no longer bounded");
                return;
            }
        }
        if fds[1].revents().is_some_and(|r| !r.is_empty()) {
            return;
        }
        // Which file changed does not matter: every one is checked (an overflowed queue
        // included).
        while inotify.read_events().is_ok_and(|events| !events.is_empty()) {}
    }
}

/// Whether `fd` turns readable (or hung up) within `timeout`.
fn readable(fd: &OwnedFd, timeout: PollTimeout) -> bool {
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    matches!(poll(&mut fds, timeout), Ok(n) if n > 0)
}

/// A log opened as QEMU holds it, once and with `O_APPEND` (for the tests here and the console
/// follower's).
#[cfg(test)]
pub(crate) fn qemu_appender(path: &Path) -> std::fs::File {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::time::Instant;

    /// The thread, on the console log and a directory of QEMU logs, bounded at the minimum.
    fn start_on(console: &Path, logs: &Path) -> LogBound {
        LogBound::start(
            vec![Bounded::File(console.into()), Bounded::LogsIn(logs.into())],
            MIN_MAX_SIZE,
        )
        .unwrap()
    }

    /// Waits until `path` is within the minimum bound and nothing is `pending` any more, woken
    /// by each change in the directories of `path` and `others`, with a deadline.
    fn wait_bounded(path: &Path, others: &[&Path], pending: impl Fn() -> bool) {
        let mut dirs = vec![path.parent().unwrap()];
        dirs.extend(others);
        let bounded = || !pending() && fs::metadata(path).unwrap().len() <= MIN_MAX_SIZE;
        let deadline = Instant::now() + Duration::from_secs(10);
        let done = crate::host::watch::wait_for_change_in(&dirs, deadline, bounded).unwrap();
        assert!(done, "{} not bounded", path.display());
    }

    #[test]
    fn a_log_over_its_bound_is_kept_as_the_older_generation_and_started_again() {
        let (dir, path) = crate::testing::temp_path("console.log");
        // QEMU's descriptor: opened once with O_APPEND and kept.
        let mut qemu = qemu_appender(&path);
        qemu.write_all(&[b'a'; 5000]).unwrap();
        assert!(bound_one(&path, 4096).unwrap());
        assert_eq!(
            fs::read(dir.path().join("console.log.1")).unwrap(),
            [b'a'; 5000]
        );
        assert_eq!(fs::metadata(&path).unwrap().len(), 0);
        // The next append lands at the start of the emptied file, not at offset 5000.
        qemu.write_all(b"after\n").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"after\n");
    }

    #[test]
    fn a_log_within_its_bound_is_left_as_it_is() {
        let (dir, path) = crate::testing::temp_path("console.log");
        fs::write(&path, [b'a'; 4096]).unwrap();
        assert!(!bound_one(&path, 4096).unwrap());
        assert_eq!(fs::metadata(&path).unwrap().len(), 4096);
        assert!(!dir.path().join("console.log.1").exists());
        assert!(!bound_one(&dir.path().join("missing.log"), 4096).unwrap());
    }

    #[test]
    fn the_older_generation_is_replaced_and_links_are_not_followed() {
        let (dir, path) = crate::testing::temp_path("console.log");
        let elsewhere = dir.path().join("elsewhere");
        fs::write(&elsewhere, "not a log").unwrap();
        // A link at NAME.1 is replaced, not written through.
        std::os::unix::fs::symlink(&elsewhere, dir.path().join("console.log.1")).unwrap();
        fs::write(&path, [b'b'; 5000]).unwrap();
        assert!(bound_one(&path, 4096).unwrap());
        assert_eq!(fs::read(&elsewhere).unwrap(), b"not a log");
        let copy = fs::symlink_metadata(dir.path().join("console.log.1")).unwrap();
        assert!(copy.file_type().is_file());
        // A link at NAME is not a log: left alone, its target untouched.
        let linked = dir.path().join("linked.log");
        fs::write(&elsewhere, [b'c'; 5000]).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &linked).unwrap();
        assert!(!bound_one(&linked, 4096).unwrap());
        assert_eq!(fs::metadata(&elsewhere).unwrap().len(), 5000);
    }

    #[test]
    fn a_log_too_large_to_copy_is_emptied_and_the_older_copy_is_replaced_by_nothing() {
        let (_dir, path) = crate::testing::temp_path("console.log");
        fs::write(older_generation(&path), "an older generation").unwrap();
        fs::write(&path, vec![b'a'; (COPY_LIMIT * 4096 + 1) as usize]).unwrap();
        assert!(bound_one(&path, 4096).unwrap());
        assert_eq!(fs::metadata(&path).unwrap().len(), 0);
        assert_eq!(fs::read(older_generation(&path)).unwrap(), b"");
        assert!(!partial_copy(&path).exists());
    }

    #[test]
    fn what_is_not_a_regular_file_is_left_alone() {
        let (dir, fifo) = crate::testing::temp_path("fifo.log");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let socket = dir.path().join("socket.log");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let directory = dir.path().join("dir.log");
        fs::create_dir(&directory).unwrap();
        for path in [&fifo, &socket, &directory] {
            assert!(!bound_one(path, 0).unwrap(), "{}", path.display());
            assert!(!older_generation(path).exists());
        }
    }

    /// Without inotify for a directory (here: it does not exist yet) the thread checks every
    /// POLL_INTERVAL, and a copy a killed launcher left half-written is removed at start.
    #[test]
    fn without_a_watch_the_logs_are_checked_periodically() {
        let (dir, console) = crate::testing::temp_path("console.log");
        let leftover = partial_copy(&console);
        fs::write(&leftover, "half a copy").unwrap();
        let logs = dir.path().join("qemu");
        let bound = start_on(&console, &logs);
        fs::create_dir(&logs).unwrap();
        let domain_log = logs.join("vm.log");
        qemu_appender(&domain_log)
            .write_all(&[b'x'; 2 * MIN_MAX_SIZE as usize])
            .unwrap();
        wait_bounded(&domain_log, &[dir.path()], || leftover.exists());
        assert_eq!(
            fs::metadata(older_generation(&domain_log)).unwrap().len(),
            2 * MIN_MAX_SIZE
        );
        drop(bound);
    }

    /// The thread: a log that appears after it starts and then grows past the bound is brought
    /// back under it, woken by the writes (the test waits on the effect, with a deadline).
    #[test]
    fn the_thread_bounds_logs_that_appear_and_grow() {
        let (dir, logs) = crate::testing::temp_path("qemu");
        fs::create_dir(&logs).unwrap();
        let console = dir.path().join("console.log");
        let domain_log = logs.join("vm.log");
        let bound = start_on(&console, &logs);
        let mut writers = [qemu_appender(&console), qemu_appender(&domain_log)];
        // The first round may be caught by the thread's first check; the second can only be
        // caught by a notification of the writes.
        for round in [3, 2] {
            for writer in &mut writers {
                writer
                    .write_all(&vec![b'x'; round * MIN_MAX_SIZE as usize])
                    .unwrap();
            }
            for path in [&console, &domain_log] {
                // The copy takes its name only after the log is emptied: wait for both.
                let copied = round as u64 * MIN_MAX_SIZE;
                let older_len = || fs::metadata(older_generation(path)).map(|m| m.len()).ok();
                wait_bounded(path, &[], || older_len() != Some(copied));
                assert_eq!(older_len(), Some(copied));
            }
        }
        drop(bound);
    }
}
