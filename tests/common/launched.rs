//! A launched `vmlauncher run`: its runtime dir, its output, its exit, the processes it owns
//! (killed on drop, so a failed test leaves nothing behind).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use vmlauncher::console::ConsoleLog;

use super::*;

/// A runtime dir prepared for a launcher not started yet.
pub struct Pending {
    owned: Option<tempfile::TempDir>,
}

impl Pending {
    pub fn run(&mut self, spec: &str, extra_args: &[&str]) -> Launched {
        let owned = self.owned.take().expect("run once");
        let mut launched = Launched::start_in(owned.path(), spec, extra_args);
        launched._owned = Some(owned);
        launched
    }
}

/// A running `vmlauncher run`, with its runtime dir.
pub struct Launched {
    pub child: Child,
    runtime_dir: PathBuf,
    /// The temp dir, when this launcher made it (a second launcher may reuse the first one's).
    _owned: Option<tempfile::TempDir>,
    /// Where the test keeps its host disks: outside the runtime dir, which no spec may point
    /// into. Shared with a successor.
    scratch: std::sync::Arc<tempfile::TempDir>,
    stdout: mpsc::Receiver<String>,
    stdout_seen: Vec<String>,
    exited: Option<ExitStatus>,
    /// SIGKILLed with its daemons left running and no successor to adopt them yet: dropping it
    /// stops them.
    killed: bool,
}

impl Launched {
    pub fn start(spec: &str, extra_args: &[&str]) -> Launched {
        let owned = tempfile::Builder::new()
            .prefix("vml-e2e-")
            .tempdir()
            .expect("temp dir");
        let mut launched = Self::start_in(owned.path(), spec, extra_args);
        launched._owned = Some(owned);
        launched
    }

    /// A migration target: `run --incoming` with no spec, in a fresh runtime dir prepared by
    /// `prepare` (e.g. the container disks a pod of the same VMI would have).
    pub fn incoming(prepare: impl FnOnce(&Path), extra_args: &[&str]) -> Launched {
        let owned = tempfile::Builder::new()
            .prefix("vml-e2e-")
            .tempdir()
            .expect("temp dir");
        prepare(owned.path());
        let mut args = vec!["--incoming"];
        args.extend_from_slice(extra_args);
        let mut launched = Self::spawn(&[], owned.path(), "", &args, &[]);
        launched._owned = Some(owned);
        launched
    }

    /// A launcher-to-be with a fresh runtime dir that `prepare` may adjust; `run` starts it.
    pub fn start_owned(prepare: impl FnOnce(&Path)) -> Pending {
        let owned = tempfile::Builder::new()
            .prefix("vml-e2e-")
            .tempdir()
            .expect("temp dir");
        prepare(owned.path());
        Pending { owned: Some(owned) }
    }

    /// Starts a launcher that runs in the cgroups whose `cgroup.procs` files are given: it
    /// joins them between fork and exec, so its private libvirtd and QEMU (which libvirt leaves
    /// where it is, `cgroup_controllers = [ ]`) run there too.
    pub fn start_in_cgroups(spec: &str, extra_args: &[&str], cgroup_procs: &[PathBuf]) -> Launched {
        let owned = tempfile::Builder::new()
            .prefix("vml-e2e-")
            .tempdir()
            .expect("temp dir");
        let mut launched = Self::spawn(&[], owned.path(), spec, extra_args, cgroup_procs);
        launched._owned = Some(owned);
        launched
    }

    /// Starts a launcher on an existing runtime dir (e.g. the one a killed launcher left).
    pub fn start_in(runtime_dir: &Path, spec: &str, extra_args: &[&str]) -> Launched {
        Self::spawn(&[], runtime_dir, spec, extra_args, &[])
    }

    /// Starts the launcher through `wrapper` (a command and its arguments that run it, e.g.
    /// `unshare --pid --fork` to make it PID 1).
    pub fn start_wrapped(
        wrapper: &[&str],
        runtime_dir: &Path,
        spec: &str,
        extra_args: &[&str],
    ) -> Launched {
        Self::spawn(wrapper, runtime_dir, spec, extra_args, &[])
    }

    /// `spec` empty: no SPEC argument (a migration target).
    fn spawn(
        wrapper: &[&str],
        runtime_dir: &Path,
        spec: &str,
        extra_args: &[&str],
        cgroup_procs: &[PathBuf],
    ) -> Launched {
        let spec_path = runtime_dir.join("spec.yaml");
        if !spec.is_empty() {
            std::fs::write(&spec_path, spec).unwrap();
        }
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(runtime_dir.join("launcher.stderr"))
            .unwrap();
        // VMLAUNCHER_TEST_WRAPPER: a command that runs every launcher a test or bench starts
        // (e.g. valgrind), split at white space.
        let from_env = std::env::var("VMLAUNCHER_TEST_WRAPPER").unwrap_or_default();
        let wrapper: Vec<&str> = if wrapper.is_empty() {
            from_env.split_whitespace().collect()
        } else {
            wrapper.to_vec()
        };
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(bin());
                c
            }
            None => Command::new(bin()),
        };
        let procs: Vec<std::ffi::CString> = cgroup_procs
            .iter()
            .map(|p| {
                use std::os::unix::ffi::OsStrExt;
                std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap()
            })
            .collect();
        if !procs.is_empty() {
            use std::os::unix::process::CommandExt;
            // SAFETY: runs in the forked child before exec; only open/write/close system calls
            // on memory prepared before the fork, no allocation.
            unsafe {
                command.pre_exec(move || {
                    for path in &procs {
                        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                        if fd < 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        // "0" moves the writing process itself.
                        let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                        libc::close(fd);
                        if written != 1 {
                            return Err(std::io::Error::last_os_error());
                        }
                    }
                    Ok(())
                });
            }
        }
        command.arg("run");
        if !spec.is_empty() {
            command.arg(&spec_path);
        }
        let mut child = command
            .arg("--runtime-dir")
            .arg(runtime_dir)
            .args(["--emulation", "tcg"])
            .args(extra_args)
            // VMLAUNCHER_TEST_LOG: a finer filter for the launcher under test, when chasing a failure.
            .env(
                "VMLAUNCHER_LOG",
                std::env::var("VMLAUNCHER_TEST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn vmlauncher");
        let stdout = lines_of(child.stdout.take().unwrap());
        Launched {
            child,
            runtime_dir: runtime_dir.to_path_buf(),
            _owned: None,
            scratch: std::sync::Arc::new(disk_dir("vml-e2e-disks-")),
            stdout,
            stdout_seen: Vec::new(),
            exited: None,
            killed: false,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.runtime_dir
    }

    /// SIGKILL, as a crash would: nothing of the launcher's cleanup runs, and this handle's
    /// own cleanup will not touch what it left (QEMU, libvirtd) either.
    pub fn kill9(&mut self) {
        self.child.kill().unwrap();
        let status = self.child.wait().unwrap();
        self.exited = Some(status);
        self.killed = true;
    }

    /// A new launcher in this (killed) one's runtime dir, as a restarted container's: it adopts
    /// what is left there and takes over the dir's cleanup.
    pub fn successor(&mut self, spec: &str, extra_args: &[&str]) -> Launched {
        self.killed = false;
        let mut next = Launched::start_in(self.dir(), spec, extra_args);
        next._owned = self._owned.take();
        next.scratch = self.scratch.clone();
        next
    }

    /// A dir for the test's host disk images (a spec may not point into the runtime dir).
    pub fn scratch(&self) -> &Path {
        self.scratch.path()
    }

    pub fn socket(&self) -> PathBuf {
        self.dir().join("launcher.sock")
    }

    /// Waits for phase Running and the guest's boot line; returns the console, read past it.
    pub fn boot(&mut self) -> ConsoleLog {
        self.wait_stdout("phase Running", BOOT_DEADLINE);
        let mut console = self.console();
        wait_booted(&mut console);
        console
    }

    pub fn console(&self) -> ConsoleLog {
        ConsoleLog::from_start(&self.dir().join("console.log")).unwrap()
    }

    pub fn libvirt_uri(&self) -> String {
        vmlauncher::libvirt::daemon::PrivateDaemon::uri_for(&self.dir().join("libvirt"))
    }

    /// What the launchers of this runtime dir wrote on standard error (they append to one file).
    pub fn stderr_text(&self) -> String {
        std::fs::read_to_string(self.dir().join("launcher.stderr")).unwrap_or_default()
    }

    /// Asserts that a line the launcher printed so far contains `needle`.
    pub fn assert_printed(&self, needle: &str) {
        assert!(
            self.stdout_seen.iter().any(|l| l.contains(needle)),
            "no {needle:?} in the launcher's output: {:#?}",
            self.stdout_seen
        );
    }

    /// The lines the launcher printed that a wait (or its exit) read so far.
    pub fn printed(&self) -> &[String] {
        &self.stdout_seen
    }

    /// Waits for a line on the launcher's standard output that contains `needle`.
    pub fn wait_stdout(&mut self, needle: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.stdout.recv_timeout(left) {
                Ok(line) => {
                    self.stdout_seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "no {needle:?} from vmlauncher within {within:?}; stdout so far:\n{}\nstderr:\n{}",
                    self.stdout_seen.join("\n"),
                    self.stderr_text()
                ),
            }
        }
    }

    /// Collects what is left of standard output (after exit), for assertions on it.
    fn stdout_rest(&mut self) {
        while let Ok(line) = self.stdout.recv_timeout(Duration::from_secs(5)) {
            self.stdout_seen.push(line);
        }
    }

    /// Waits for the launcher to exit.
    pub fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        if let Some(status) = self.exited {
            return status;
        }
        let pid = self.child.id();
        let (tx, rx) = mpsc::channel();
        // The child handle stays ours; a waiter thread blocks in waitpid on the same pid.
        std::thread::spawn(move || {
            let status = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid as i32), None);
            let _ = tx.send(status);
        });
        match rx.recv_timeout(within) {
            Ok(Ok(nix::sys::wait::WaitStatus::Exited(_, code))) => {
                self.stdout_rest();
                use std::os::unix::process::ExitStatusExt;
                let status = ExitStatus::from_raw(code << 8);
                self.exited = Some(status);
                status
            }
            Ok(other) => panic!(
                "vmlauncher ended unexpectedly: {other:?}\nstderr:\n{}",
                self.stderr_text()
            ),
            Err(_) => {
                // Every line it printed, not only those a wait read.
                let unread: Vec<String> = self.stdout.try_iter().collect();
                self.stdout_seen.extend(unread);
                panic!(
                    "vmlauncher did not exit within {within:?}; stdout:\n{}\nstderr:\n{}",
                    self.stdout_seen.join("\n"),
                    self.stderr_text()
                )
            }
        }
    }

    /// SIGTERM, as a pod's stop sends it: the guest powers off within the grace period and the
    /// launcher exits 0 (its stderr shown otherwise).
    pub fn terminate_ok(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        let code = self.wait_exit(super::GUEST_DEADLINE).code();
        assert_eq!(code, Some(0), "{}", self.stderr_text());
    }

    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        signal_pid(self.child.id() as i32, signal).unwrap();
    }

    /// The pid of a process from a pid file under the runtime dir.
    pub fn pid_from(&self, relative: &str) -> Option<i32> {
        std::fs::read_to_string(self.dir().join(relative))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// The pid of the QEMU running domain `default_<name>` under the private libvirtd.
    pub fn qemu_pid(&self, name: &str) -> i32 {
        self.pid_from(&format!("libvirt/run/qemu/default_{name}.pid"))
            .expect("QEMU's pid file")
    }
}

pub use vmlauncher::libvirt::process::process_alive as alive;

/// Sends `signal` to process `pid`: a test's crash of a QEMU or a daemon (by its pid file), or
/// a stop of a launcher.
pub fn signal_pid(pid: i32, signal: nix::sys::signal::Signal) -> nix::Result<()> {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal)
}

impl Drop for Launched {
    /// A failed test must not leave a launcher, a libvirtd or a QEMU behind; nor a test that
    /// SIGKILLed its launcher and started no successor to adopt what it left.
    fn drop(&mut self) {
        if self.exited.is_some() && !self.killed {
            return;
        }
        if self.exited.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let qemu_pids = std::fs::read_dir(self.dir().join("libvirt/run/qemu"))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "pid"))
            .filter_map(|e| {
                std::fs::read_to_string(e.path())
                    .ok()?
                    .trim()
                    .parse::<i32>()
                    .ok()
            });
        let daemon = self.pid_from("libvirt/libvirtd.pid");
        for pid in qemu_pids.chain(daemon).filter(|p| alive(*p)) {
            let _ = signal_pid(pid, nix::sys::signal::Signal::SIGKILL);
        }
    }
}
