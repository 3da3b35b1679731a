//! Reading the guest's serial console log as it grows, line by line, woken by inotify rather than
//! by polling. `run --console` mirrors it to the terminal; tests wait on its lines.

use std::collections::VecDeque;
use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

/// The longest console line kept whole; a longer one is cut (a serial console is 80 columns).
pub(crate) const MAX_LINE: usize = 4096;

#[derive(Debug)]
pub struct ConsoleLog {
    path: PathBuf,
    inotify: Inotify,
    file: Option<File>,
    /// Where to start reading when the file first appears: 0, or the end at open time.
    start_at: u64,
    /// The identity of the log's older generation (NAME.1) when last looked at.
    older_seen: Option<(u64, i64, i64)>,
    partial: Vec<u8>,
    lines: VecDeque<String>,
    /// The last lines returned, for error messages.
    recent: VecDeque<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    #[error("cannot watch {path}")]
    Watch {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("timed out waiting for {what} on the console {path}; its last lines were:\n{recent}")]
    Timeout {
        what: String,
        path: PathBuf,
        recent: String,
    },
}

impl ConsoleLog {
    /// Follows `path` from its beginning (it need not exist yet).
    pub fn from_start(path: &Path) -> Result<Self, ConsoleError> {
        Self::open(path, false)
    }

    /// Follows `path` from what is appended after now.
    pub fn from_end(path: &Path) -> Result<Self, ConsoleError> {
        Self::open(path, true)
    }

    fn open(path: &Path, at_end: bool) -> Result<Self, ConsoleError> {
        let watch_err = |source| ConsoleError::Watch {
            path: path.into(),
            source,
        };
        let dir = path.parent().unwrap_or(Path::new("."));
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .map_err(|e| watch_err(e.into()))?;
        inotify
            .add_watch(
                dir,
                // IN_DELETE and IN_MOVED_FROM too: a rotation's leftover copy that a new
                // launcher removes (or renames) ends the wait for it (see `read_available`).
                AddWatchFlags::IN_CREATE
                    | AddWatchFlags::IN_MODIFY
                    | AddWatchFlags::IN_MOVED_TO
                    | AddWatchFlags::IN_MOVED_FROM
                    | AddWatchFlags::IN_DELETE,
            )
            .map_err(|e| watch_err(e.into()))?;
        let older_seen = generation(&crate::logs::older_generation(path));
        let start_at = if at_end {
            std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
        } else {
            0
        };
        Ok(ConsoleLog {
            path: path.into(),
            inotify,
            file: None,
            start_at,
            older_seen,
            partial: Vec::new(),
            lines: VecDeque::new(),
            recent: VecDeque::new(),
        })
    }

    fn read_available(&mut self) -> Result<(), ConsoleError> {
        let read_err = |source| ConsoleError::Read {
            path: self.path.clone(),
            source,
        };
        if self.file.is_none() {
            match File::open(&self.path) {
                Ok(mut f) => {
                    f.seek(SeekFrom::Start(self.start_at)).map_err(read_err)?;
                    self.file = Some(f);
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(read_err(e)),
            }
        }
        let file = self.file.as_mut().expect("opened above");
        let mut chunk = Vec::new();
        // The launcher bounds the log by copying it and truncating it, then putting the copy
        // in place as NAME.1 (`crate::logs`). A new NAME.1 since the last read means just
        // that: what this reader had not read yet is in the copy from where it stood, and
        // the log started again at 0. A rotation during a read sends it round again from
        // where that read began. Lost: all but the last of two rotations between two reads.
        //
        // While a rotation is under way (its copy, `NAME.1.partial`, not yet renamed into place)
        // the log may be truncated already and written again by QEMU: bytes read at this
        // reader's old position would be the new generation's middle, and its start would come
        // after them. So nothing is read from the log then; the rename wakes the reader (the
        // directory's IN_MOVED_TO). The copy is looked at before the generation after a read: a
        // rotation that ends between the two looks still shows in the second.
        let older_path = crate::logs::older_generation(&self.path);
        let partial_path = crate::logs::partial_copy(&self.path);
        let rotating = || fs::symlink_metadata(&partial_path).is_ok();
        for _ in 0..4 {
            let older_now = generation(&older_path);
            if older_now != self.older_seen {
                self.older_seen = older_now;
                let position = file.stream_position().map_err(read_err)?;
                if let Ok(mut older) = File::open(&older_path) {
                    // The copy opened is the one that counts: another rotation's rename
                    // between the look and the open must not look like one more rotation
                    // later (its lines would be read again from 0).
                    if let Ok(m) = older.metadata() {
                        self.older_seen = Some(identity(&m));
                    }
                    older.seek(SeekFrom::Start(position)).map_err(read_err)?;
                    older.read_to_end(&mut chunk).map_err(read_err)?;
                }
                file.seek(SeekFrom::Start(0)).map_err(read_err)?;
            }
            if rotating() {
                break;
            }
            let before = file.stream_position().map_err(read_err)?;
            let mut fresh = Vec::new();
            file.read_to_end(&mut fresh).map_err(read_err)?;
            if !rotating() && generation(&older_path) == self.older_seen {
                chunk.extend_from_slice(&fresh);
                break;
            }
            file.seek(SeekFrom::Start(before)).map_err(read_err)?;
        }
        // A log rotated by renaming (virtlogd's way, with a `--connect`ed libvirt: a new file
        // at the path): the rest of the old one was just read, so the new one is read from its
        // start.
        let current = file.metadata().map(|m| m.ino()).ok();
        if fs::metadata(&self.path).map(|m| m.ino()).ok() != current {
            self.file = None;
            self.start_at = 0;
        }
        self.split_lines(&chunk);
        Ok(())
    }

    /// Moves each complete line of `chunk` to `lines`. A guest that never prints a newline gets
    /// its output cut into lines of [`MAX_LINE`] bytes (no unbounded buffer, no
    /// rescanning it).
    fn split_lines(&mut self, chunk: &[u8]) {
        for &byte in chunk {
            if byte != b'\n' {
                self.partial.push(byte);
                if self.partial.len() < MAX_LINE {
                    continue;
                }
            }
            let line = std::mem::take(&mut self.partial);
            let text = String::from_utf8_lossy(&line);
            self.lines
                .push_back(text.trim_end_matches('\r').to_string());
        }
    }

    /// The next complete line, or `None` if none came before `deadline`.
    pub(crate) fn next_line(&mut self, deadline: Instant) -> Result<Option<String>, ConsoleError> {
        loop {
            self.read_available()?;
            if let Some(line) = self.lines.pop_front() {
                self.recent.push_back(line.clone());
                if self.recent.len() > 20 {
                    self.recent.pop_front();
                }
                return Ok(Some(line));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            // Which file changed does not matter: the next read tells.
            crate::host::watch::wait_and_drain(&self.inotify, deadline).map_err(|source| {
                ConsoleError::Read {
                    path: self.path.clone(),
                    source,
                }
            })?;
        }
    }

    /// Reads lines until one satisfies `matches`, returning it; fails at `deadline` with the
    /// last lines seen, so a failing test says what the guest did instead.
    pub fn wait_for(
        &mut self,
        what: &str,
        deadline: Instant,
        mut matches: impl FnMut(&str) -> bool,
    ) -> Result<String, ConsoleError> {
        loop {
            match self.next_line(deadline)? {
                Some(line) if matches(&line) => return Ok(line),
                Some(_) => {}
                None => {
                    return Err(ConsoleError::Timeout {
                        what: what.into(),
                        path: self.path.clone(),
                        recent: self.recent.iter().cloned().collect::<Vec<_>>().join("\n"),
                    })
                }
            }
        }
    }
}

/// A file's identity: its inode and when it last changed (an inode number alone comes back).
fn generation(path: &Path) -> Option<(u64, i64, i64)> {
    fs::symlink_metadata(path).ok().map(|m| identity(&m))
}

fn identity(m: &fs::Metadata) -> (u64, i64, i64) {
    (m.ino(), m.ctime(), m.ctime_nsec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::time::Duration;

    /// A console log in a temp dir (kept while the first value lives), and QEMU's way of
    /// appending to it.
    fn qemu_log() -> (tempfile::TempDir, std::path::PathBuf, File) {
        let (dir, path) = crate::testing::temp_path("console.log");
        let qemu = crate::logs::qemu_appender(&path);
        (dir, path, qemu)
    }

    /// The next `n` lines, each within `deadline`.
    fn next_lines(console: &mut ConsoleLog, n: usize, deadline: Instant) -> Vec<String> {
        std::iter::from_fn(|| console.next_line(deadline).unwrap())
            .take(n)
            .collect()
    }

    #[test]
    fn follows_a_file_that_appears_and_grows() {
        let (_dir, path) = crate::testing::temp_path("console.log");
        let mut console = ConsoleLog::from_start(&path).unwrap();
        let writer = {
            let path = path.clone();
            std::thread::spawn(move || {
                let mut f = File::create(&path).unwrap();
                f.write_all(b"first\r\nsec").unwrap();
                f.flush().unwrap();
                f.write_all(b"ond\nBOOTED\n").unwrap();
            })
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let line = console
            .wait_for("boot marker", deadline, |l| l == "BOOTED")
            .unwrap();
        assert_eq!(line, "BOOTED");
        writer.join().unwrap();
        assert!(console
            .recent
            .iter()
            .eq(["first", "second", "BOOTED"].iter()));
    }

    #[test]
    fn times_out_with_the_last_lines() {
        let (_dir, path) = crate::testing::temp_path("console.log");
        std::fs::write(&path, "old line\n").unwrap();
        let mut console = ConsoleLog::from_end(&path).unwrap();
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"new line\n")
            .unwrap();
        let err = console
            .wait_for("never", Instant::now() + Duration::from_millis(300), |_| {
                false
            })
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("new line") && !text.contains("old line"),
            "{text}"
        );
    }

    #[test]
    fn a_line_without_end_is_cut_at_the_bound() {
        let (_dir, path) = crate::testing::temp_path("console.log");
        let mut text = vec![b'x'; MAX_LINE * 2 + 10];
        text.extend_from_slice(b"\nEND\n");
        std::fs::write(&path, &text).unwrap();
        let mut console = ConsoleLog::from_start(&path).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let lengths: Vec<usize> = std::iter::from_fn(|| console.next_line(deadline).unwrap())
            .take(4)
            .map(|l| l.len())
            .collect();
        assert_eq!(lengths, [MAX_LINE, MAX_LINE, 10, 3]);
    }

    /// The launcher bounds the log by copy and truncation: the follower reads what it had not
    /// read yet from the copy, then the log again from its start, losing no line.
    #[test]
    fn follows_a_log_bounded_by_copy_and_truncation() {
        let (_dir, path, mut qemu) = qemu_log();
        qemu.write_all(b"one\n").unwrap();
        let mut console = ConsoleLog::from_start(&path).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        assert_eq!(console.next_line(deadline).unwrap().as_deref(), Some("one"));
        qemu.write_all(b"two\n").unwrap();
        assert!(crate::logs::bound_one(&path, 4).unwrap());
        qemu.write_all(b"three\n").unwrap();
        let lines = next_lines(&mut console, 2, deadline);
        assert_eq!(lines, ["two", "three"]);
    }

    /// The launcher truncates the log before it renames the copy into place, and QEMU may
    /// write the new generation past this reader's position in between: nothing is read from
    /// the log until the rename, so the lines still come in order (a CI run of the console-flood
    /// e2e test once saw them out of order).
    #[test]
    fn waits_out_a_rotation_caught_between_its_truncation_and_its_rename() {
        let (_dir, path, mut qemu) = qemu_log();
        qemu.write_all(b"old-1\nold-2\n").unwrap();
        let mut console = ConsoleLog::from_start(&path).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        assert_eq!(
            console.next_line(deadline).unwrap().as_deref(),
            Some("old-1")
        );
        assert_eq!(
            console.next_line(deadline).unwrap().as_deref(),
            Some("old-2")
        );
        qemu.write_all(b"old-3\n").unwrap();
        // `bound_one`'s steps, stopped before the rename: the copy, the truncation, and QEMU
        // writing the new generation past where the reader stands (12 bytes in).
        let partial = crate::logs::partial_copy(&path);
        fs::copy(&path, &partial).unwrap();
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(0)
            .unwrap();
        qemu.write_all(b"new-1\nnew-2\nnew-3\n").unwrap();
        // One read, no waiting: nothing while the rotation is under way.
        assert_eq!(console.next_line(Instant::now()).unwrap(), None);
        fs::rename(&partial, crate::logs::older_generation(&path)).unwrap();
        let lines = next_lines(&mut console, 4, deadline);
        assert_eq!(lines, ["old-3", "new-1", "new-2", "new-3"]);
    }

    /// From the end: only what came after the follower opened, across a rotation.
    #[test]
    fn follows_from_the_end_across_a_rotation() {
        let (_dir, path, mut qemu) = qemu_log();
        qemu.write_all(b"old\n").unwrap();
        let mut console = ConsoleLog::from_end(&path).unwrap();
        qemu.write_all(b"new1\n").unwrap();
        assert!(crate::logs::bound_one(&path, 4).unwrap());
        qemu.write_all(b"new2\n").unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let lines = next_lines(&mut console, 2, deadline);
        assert_eq!(lines, ["new1", "new2"]);
    }

    /// A log emptied with no copy kept (too large to copy): an empty NAME.1 tells the follower,
    /// which starts the log again at 0.
    #[test]
    fn follows_a_log_emptied_without_a_copy() {
        let (_dir, path, mut qemu) = qemu_log();
        qemu.write_all(b"a long line, longer than the bound times four\n")
            .unwrap();
        let mut console = ConsoleLog::from_start(&path).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        assert!(console.next_line(deadline).unwrap().is_some());
        assert!(crate::logs::bound_one(&path, 4).unwrap());
        assert_eq!(
            std::fs::read(crate::logs::older_generation(&path)).unwrap(),
            b""
        );
        qemu.write_all(b"b\n").unwrap();
        assert_eq!(console.next_line(deadline).unwrap().as_deref(), Some("b"));
    }

    /// A log rotated by renaming (a new file at the path, virtlogd's way): the follower reads
    /// the new file from its start.
    #[test]
    fn follows_a_rotated_log() {
        let (dir, path) = crate::testing::temp_path("console.log");
        std::fs::write(&path, "before\n").unwrap();
        let mut console = ConsoleLog::from_start(&path).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        assert_eq!(
            console.next_line(deadline).unwrap().as_deref(),
            Some("before")
        );
        std::fs::rename(&path, dir.path().join("console.log.0")).unwrap();
        std::fs::write(&path, "after\n").unwrap();
        let line = console
            .wait_for("the new file's line", deadline, |l| l == "after")
            .unwrap();
        assert_eq!(line, "after");
    }
}
