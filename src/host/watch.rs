//! Waiting for paths to appear or change, woken by inotify — never by polling. A path whose
//! directory does not exist yet is watched through its nearest existing ancestor; whoever waits
//! re-arms the watch after each wake-up, so the next level is watched once it exists.

use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Instant;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::io::unix::AsyncFd;

#[derive(Debug, thiserror::Error)]
pub(crate) enum WatchError {
    #[error("cannot watch {path}")]
    Watch {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// An inotify instance watching the directories in which `paths` will appear.
#[derive(Debug)]
pub(crate) struct PathWatch {
    fd: AsyncFd<OwnedInotify>,
}

/// The inotify instance, which owns its descriptor, as tokio's reactor wants to see it.
#[derive(Debug)]
struct OwnedInotify(ClosedAside);

impl AsRawFd for OwnedInotify {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// An inotify instance that is closed on a thread of its own when dropped. Closing an instance
/// that had watches waits until the kernel has destroyed their marks, which waits for an SRCU
/// grace period: 5–13 ms on this project's test host, the closing thread asleep (D state) and
/// both CPUs idle meanwhile, traced in a start right after libvirtd answered
/// (`docs/performance.md`). Whoever waited on a path goes on at once; a thread costs ~0.1 ms
/// and ends with the close (the runtime's blocking pool would keep one for seconds).
#[derive(Debug)]
pub(crate) struct ClosedAside(Option<Inotify>);

impl ClosedAside {
    pub(crate) fn new(inotify: Inotify) -> ClosedAside {
        ClosedAside(Some(inotify))
    }
}

impl std::ops::Deref for ClosedAside {
    type Target = Inotify;

    fn deref(&self) -> &Inotify {
        self.0.as_ref().expect("taken only by drop")
    }
}

impl Drop for ClosedAside {
    fn drop(&mut self) {
        let Some(inotify) = self.0.take() else {
            return;
        };
        // A thread that cannot be made drops the closure, and with it the instance, here.
        let _ = std::thread::Builder::new()
            .name("inotify-close".into())
            .spawn(move || drop(inotify));
    }
}

/// The nearest directory of `path` (its parent, or higher) that exists now.
fn nearest_existing_dir(path: &Path) -> Option<&Path> {
    path.ancestors().skip(1).find(|p| p.is_dir())
}

impl PathWatch {
    /// Must be called from within a tokio runtime.
    pub(crate) fn new(paths: &[PathBuf]) -> Result<PathWatch, WatchError> {
        let err = |path: &Path, e: nix::Error| WatchError::Watch {
            path: path.into(),
            source: e.into(),
        };
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .map_err(|e| err(Path::new("(inotify)"), e))?;
        for path in paths {
            let Some(dir) = nearest_existing_dir(path) else {
                continue;
            };
            inotify
                .add_watch(
                    dir,
                    AddWatchFlags::IN_CREATE
                        | AddWatchFlags::IN_MOVED_TO
                        | AddWatchFlags::IN_CLOSE_WRITE
                        | AddWatchFlags::IN_ATTRIB,
                )
                .map_err(|e| err(dir, e))?;
        }
        // SAFETY: the descriptor is owned by the `Inotify` inside the `AsyncFd`: it stays open,
        // and is the same one, for as long as the `AsyncFd` lives.
        let fd =
            unsafe { AsyncFd::register(OwnedInotify(ClosedAside::new(inotify))) }.map_err(|e| {
                WatchError::Watch {
                    path: "(inotify)".into(),
                    source: e.into(),
                }
            })?;
        Ok(PathWatch { fd })
    }

    /// Waits until something is created, moved in or changed in a watched directory.
    pub(crate) async fn changed(&mut self) -> Result<(), WatchError> {
        loop {
            let mut ready = self
                .fd
                .readable()
                .await
                .map_err(|source| WatchError::Watch {
                    path: "(inotify)".into(),
                    source,
                })?;
            match ready.get_inner().0.read_events() {
                Ok(events) if !events.is_empty() => return Ok(()),
                Ok(_) | Err(nix::errno::Errno::EAGAIN) => ready.clear_ready(),
                Err(e) => {
                    return Err(WatchError::Watch {
                        path: "(inotify)".into(),
                        source: e.into(),
                    })
                }
            }
        }
    }
}

/// Blocks until `done` holds, checking it now and again each time something in one of `dirs`
/// changes (a file created, written, truncated, renamed or removed), until `deadline`. Returns
/// whether it held. The blocking counterpart of `PathWatch`, for waiting on files another
/// process or thread changes (the tests wait on the log bound with it).
pub fn wait_for_change_in(
    dirs: &[&Path],
    deadline: Instant,
    mut done: impl FnMut() -> bool,
) -> io::Result<bool> {
    let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
    for dir in dirs {
        inotify.add_watch(
            *dir,
            AddWatchFlags::IN_CREATE
                | AddWatchFlags::IN_MODIFY
                | AddWatchFlags::IN_MOVED_TO
                | AddWatchFlags::IN_MOVED_FROM
                | AddWatchFlags::IN_DELETE
                | AddWatchFlags::IN_ATTRIB,
        )?;
    }
    // Watched before the first look: a change between the look and the wait still wakes it.
    loop {
        if done() {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        wait_and_drain(&inotify, deadline)?;
    }
}

/// Waits until `inotify` has notifications or `deadline` passes (an interrupted wait counts as a
/// wake-up), then drains them: which file changed is for the caller's next look to find out.
pub(crate) fn wait_and_drain(inotify: &Inotify, deadline: Instant) -> io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    let mut fds = [PollFd::new(inotify.as_fd(), PollFlags::POLLIN)];
    match poll(&mut fds, poll_timeout(left)) {
        Ok(_) | Err(nix::errno::Errno::EINTR) => {}
        Err(e) => return Err(e.into()),
    }
    while inotify.read_events().is_ok_and(|events| !events.is_empty()) {}
    Ok(())
}

/// `d` as a poll timeout; one too long for poll waits as long as poll can.
pub(crate) fn poll_timeout(d: std::time::Duration) -> PollTimeout {
    PollTimeout::try_from(d).unwrap_or(PollTimeout::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_blocking_wait_wakes_on_a_change_and_ends_at_its_deadline() {
        let (dir, file) = crate::testing::temp_path("log");
        std::fs::write(&file, [b'x'; 100]).unwrap();
        let truncater = {
            let file = file.clone();
            std::thread::spawn(move || {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&file)
                    .unwrap()
                    .set_len(0)
                    .unwrap()
            })
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let empty = || std::fs::metadata(&file).unwrap().len() == 0;
        assert!(wait_for_change_in(&[dir.path()], deadline, empty).unwrap());
        truncater.join().unwrap();
        let soon = Instant::now() + Duration::from_millis(50);
        assert!(!wait_for_change_in(&[dir.path()], soon, || false).unwrap());
    }

    #[tokio::test]
    async fn wakes_when_a_file_appears_even_in_a_directory_made_later() {
        let (dir, target) = crate::testing::temp_path("later/disk.img");
        let mut watch = PathWatch::new(std::slice::from_ref(&target)).unwrap();
        let sub = dir.path().join("later");
        let maker = tokio::spawn(async move { std::fs::create_dir(&sub).unwrap() });
        tokio::time::timeout(Duration::from_secs(10), watch.changed())
            .await
            .expect("woken by the new directory")
            .unwrap();
        maker.await.unwrap();
        // Re-armed one level down, it sees the file itself.
        let mut watch = PathWatch::new(std::slice::from_ref(&target)).unwrap();
        std::fs::write(&target, b"x").unwrap();
        tokio::time::timeout(Duration::from_secs(10), watch.changed())
            .await
            .expect("woken by the file")
            .unwrap();
    }
}
