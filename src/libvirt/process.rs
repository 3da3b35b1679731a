//! Which program a process runs, whether it is still alive, and waiting for it to exit: how the
//! launcher knows a daemon it finds by its pid file (one it started, possibly through the dynamic
//! loader, or one a launcher before it started) from a pid that was reused.

use std::fs;
use std::io;
use std::os::fd::{AsFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags};

/// Process `pid` runs the program `name`: its executable's file name, or the program the dynamic
/// loader was started to run (` (deleted)` after an upgrade still counts).
pub(super) fn runs_program(pid: i32, name: &str) -> bool {
    runs_program_via(pid, name, Path::new(LOADER))
}

/// [`runs_program`], with `loader` as the dynamic loader.
fn runs_program_via(pid: i32, name: &str, loader: &Path) -> bool {
    let Ok(link) = fs::read_link(format!("/proc/{pid}/exe")) else {
        return false;
    };
    let link = link.as_os_str().as_bytes();
    let exe = Path::new(std::ffi::OsStr::from_bytes(
        link.strip_suffix(b" (deleted)").unwrap_or(link),
    ));
    let named = |path: &Path| path.file_name().is_some_and(|n| n == name);
    named(exe)
        || (fs::canonicalize(loader).is_ok_and(|loader| loader == exe)
            && program_of_loader(pid).is_some_and(|program| named(&program)))
}

/// The program a process started as `LOADER [OPTIONS] PROGRAM [ARGS]` runs: the loader's first
/// argument that is neither one of its options nor an option's value.
fn program_of_loader(pid: i32) -> Option<PathBuf> {
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let mut args = cmdline.split(|b| *b == 0).skip(1);
    while let Some(arg) = args.next() {
        match arg {
            b"--preload" | b"--argv0" | b"--library-path" | b"--audit" | b"--inhibit-rpath" => {
                args.next()?;
            }
            option if option.starts_with(b"--") => {}
            program => return Some(PathBuf::from(std::ffi::OsStr::from_bytes(program))),
        }
    }
    None
}

/// Waits until process `pid` has exited (a zombie has), at most until `deadline`; true if it
/// has. Any process, our child or not: woken by the kernel through a pidfd; where there are no
/// pidfds (Linux before 5.3), by a look at /proc every 20 ms.
pub fn wait_process_exit(pid: i32, deadline: Instant) -> bool {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor, or -1.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if raw < 0 {
        if io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
            return true;
        }
        loop {
            if !process_alive(pid) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    // SAFETY: a descriptor just made, owned by nothing else.
    let pidfd = unsafe { OwnedFd::from_raw_fd(raw as RawFd) };
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, crate::host::watch::poll_timeout(left)) {
            Ok(n) => return n > 0,
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return !process_alive(pid),
        }
    }
}

/// The process exists and is not a zombie.
pub fn process_alive(pid: i32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the command name, which is in parentheses and may contain spaces.
    let state = stat
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next());
    !matches!(state, Some('Z') | Some('X') | None)
}

/// The first `name` in `$PATH` that is a file.
pub(super) fn program_in_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
}

/// The dynamic loader of the launcher's own architecture, which is libvirtd's.
#[cfg(target_arch = "x86_64")]
pub(super) const LOADER: &str = "/lib64/ld-linux-x86-64.so.2";
#[cfg(target_arch = "aarch64")]
pub(super) const LOADER: &str = "/lib/ld-linux-aarch64.so.1";
/// Elsewhere, no loader is known: libvirtd starts as it is.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub(super) const LOADER: &str = "";

#[cfg(test)]
mod tests {
    use std::process::{Command, Stdio};

    use super::*;

    #[test]
    fn a_pid_is_taken_for_a_daemon_only_if_it_runs_that_program() {
        let me = std::process::id() as i32;
        let exe = std::env::current_exe().unwrap();
        let name = exe.file_name().unwrap().to_str().unwrap();
        assert!(runs_program(me, name));
        assert!(!runs_program(me, "libvirtd"));
        assert!(!runs_program(i32::MAX, "libvirtd"));
    }

    /// Runs `program` with `args`, again while it is "text file busy": a test thread that forks
    /// meanwhile may hold the copy's write descriptor until its child execs.
    fn spawn_copy(program: &Path, args: &[&std::ffi::OsStr]) -> std::process::Child {
        for _ in 0..50 {
            match Command::new(program)
                .args(args)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
            {
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => std::thread::yield_now(),
                spawned => return spawned.unwrap(),
            }
        }
        panic!("{} stayed busy", program.display());
    }

    /// `cat` run by `loader` (as `LOADER --argv0 cat /usr/bin/cat`), returned once it has
    /// echoed a line: until the loader hands over to the program, the process's
    /// /proc/PID/cmdline can read empty (seen in 165 of 300 reads right after the spawn).
    fn cat_through(loader: &Path) -> std::process::Child {
        use std::io::{BufRead, Write};
        let cat = program_in_path("cat").expect("cat in PATH");
        let mut child = spawn_copy(
            loader,
            &["--argv0".as_ref(), "cat".as_ref(), cat.as_os_str()],
        );
        writeln!(child.stdin.as_mut().unwrap(), "up").unwrap();
        let mut line = String::new();
        io::BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line, "up\n");
        child
    }

    #[test]
    fn a_program_whose_file_was_replaced_since_it_started_is_still_known() {
        let (_dir, copy) = crate::testing::temp_path("sleep");
        fs::copy(program_in_path("sleep").expect("sleep in PATH"), &copy).unwrap();
        let mut child = spawn_copy(&copy, &["60".as_ref()]);
        // An upgrade: the file the process runs is gone; its exe reads "PATH (deleted)".
        fs::remove_file(&copy).unwrap();
        let known = runs_program(child.id() as i32, "sleep");
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(known);
    }

    #[test]
    fn a_program_started_through_a_loader_replaced_since_is_still_known() {
        let (_dir, loader) = crate::testing::temp_path("ld.so");
        fs::copy(LOADER, &loader).unwrap();
        let loader = fs::canonicalize(&loader).unwrap();
        let mut child = cat_through(&loader);
        // A glibc upgrade replaced the loader (a new file at its path, as dpkg installs one):
        // the running process's exe link reads "LOADER (deleted)".
        fs::remove_file(&loader).unwrap();
        fs::copy(LOADER, &loader).unwrap();
        let pid = child.id() as i32;
        let known = (
            runs_program_via(pid, "cat", &loader),
            runs_program_via(pid, "libvirtd", &loader),
        );
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(known, (true, false));
    }

    #[test]
    fn a_program_started_through_the_dynamic_loader_is_known_by_that_program() {
        let mut child = cat_through(Path::new(LOADER));
        let pid = child.id() as i32;
        let ran = (runs_program(pid, "cat"), runs_program(pid, "libvirtd"));
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(ran, (true, false));
    }
}
