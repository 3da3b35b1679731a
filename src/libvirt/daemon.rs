//! A private libvirtd for one launcher: its own configuration, sockets, state and logs under the
//! runtime directory, so that it never collides with a system libvirtd.
//!
//! A root libvirtd keeps state at fixed paths (`/run/libvirt`, `/var/lib/libvirt`, ...); a second
//! one fails on its pid files. So the daemon runs in a mount namespace of its own in which those
//! paths are the runtime directory's subdirectories — what a container gives it for free. Its
//! client socket lives outside the covered paths, so `virsh -c <uri>` works from the host.
//!
//! No virtlogd runs beside it: with `stdio_handler = "file"` libvirtd opens QEMU's log and the
//! console log itself, and the launcher keeps them bounded (`crate::logs`).
//!
//! The daemon the launcher starts is watched by a thread blocked in `wait()`: when it exits, the
//! launcher hears of it at once (no polling) and `PrivateDaemon::ensure_running` starts it again.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::capcache;
use super::daemon_conf::{self, libvirtd_conf, qemu_conf_text};
pub use super::daemon_conf::{DaemonOptions, DaemonTls};
use super::kvm_node;
use super::lean::{self, LIBVIRTD};
use super::process::{process_alive, runs_program, wait_process_exit};
use super::start_pin;
use crate::tricks::{enabled, Trick};

/// How long a fresh daemon may take to answer (the first libvirtd start probes QEMU).
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a daemon may take to stop on SIGTERM before it gets SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// The host paths a root libvirtd insists on, and the subdirectory of ours that covers each.
const COVERED: [(&str, &str); 7] = [
    ("/etc/libvirt", "etc"),
    ("/run/libvirt", "run"),
    ("/var/lib/libvirt", "lib"),
    ("/var/cache/libvirt", "cache"),
    ("/var/log/libvirt", "log"),
    // swtpm's logs, named by domain: the host's dir would be shared with every other libvirt.
    ("/var/log/swtpm", "log-swtpm"),
    // The local CA that signs a new vTPM's certificates: swtpm_setup, as QEMU's user, writes its
    // key there; the host's belongs to another user (Debian's `tss`), or to root.
    ("/var/lib/swtpm-localca", "swtpm-localca"),
];

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("cannot prepare {path}")]
    Prepare {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot start {daemon} (is libvirt-daemon installed?)")]
    Spawn {
        daemon: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("{daemon} exited during start-up; its log {log} ends with:\n{tail}")]
    Exited {
        daemon: &'static str,
        log: PathBuf,
        tail: String,
    },
    #[error("{daemon} did not answer within {timeout:?}; see {log}")]
    Timeout {
        daemon: &'static str,
        timeout: Duration,
        log: PathBuf,
    },
}

/// Told the name of a daemon the launcher started when it exits.
pub(crate) type ExitNotifier = Arc<dyn Fn(&'static str) + Send + Sync>;

/// One daemon process: started by us (watched by a thread) or adopted from its pid file.
#[derive(Debug)]
struct DaemonProcess {
    name: &'static str,
    pid: i32,
    /// Set by the watching thread when our child exits; `None` for an adopted process.
    exited: Option<Arc<(Mutex<bool>, Condvar)>>,
}

impl DaemonProcess {
    fn is_alive(&self) -> bool {
        match &self.exited {
            Some(flag) => !*flag.0.lock().expect("exit flag"),
            // An adopted pid may have been reused by anything since.
            None => process_alive(self.pid) && runs_program(self.pid, self.name),
        }
    }

    /// Waits until the process is gone, at most `limit`; true if it is.
    fn wait_gone(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        match &self.exited {
            Some(flag) => {
                let (lock, cv) = &**flag;
                let guard = lock.lock().expect("exit flag");
                let (guard, _) = cv
                    .wait_timeout_while(guard, limit, |exited| !*exited)
                    .expect("exit flag");
                *guard
            }
            // Not our child: no exit status of ours to wait on.
            None => wait_process_exit(self.pid, deadline),
        }
    }

    /// SIGTERM, then SIGKILL if it does not go within the stop timeout.
    fn stop(&self) {
        if !self.is_alive() {
            return;
        }
        let _ = kill(Pid::from_raw(self.pid), Signal::SIGTERM);
        if !self.wait_gone(STOP_TIMEOUT) {
            tracing::warn!(daemon = self.name, "did not stop on SIGTERM; killing it");
            let _ = kill(Pid::from_raw(self.pid), Signal::SIGKILL);
            self.wait_gone(STOP_TIMEOUT);
        }
    }
}

/// The private libvirtd of one runtime directory.
pub struct PrivateDaemon {
    dir: PathBuf,
    uri: String,
    options: DaemonOptions,
    libvirtd: Option<DaemonProcess>,
    /// A virtlogd an earlier launcher started in this runtime dir (before virtlogd went), found
    /// still running: the running QEMU's logs and the adopted libvirtd (`stdio_handler =
    /// "logd"` until it restarts) depend on it. Kept running, never restarted, stopped last.
    legacy_virtlogd: Option<DaemonProcess>,
    /// Shared with the watching threads, so that `stop` can silence them before it kills.
    on_exit: Arc<Mutex<Option<ExitNotifier>>>,
    /// The connection that found the daemon this struct started answering, kept for the
    /// launcher ([`PrivateDaemon::take_connection`]) unless the capability load took it:
    /// opening another costs its handshake again (five round trips, each 10–25 ms on a loaded
    /// machine).
    answered: Option<virt::connect::Connect>,
    /// Loads QEMU's capabilities and publishes them (`publish_capabilities`), beside the
    /// launcher's own first calls; joined before the daemon stops.
    publishing: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for PrivateDaemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrivateDaemon")
            .field("dir", &self.dir)
            .field("libvirtd", &self.libvirtd)
            .field("legacy_virtlogd", &self.legacy_virtlogd)
            .finish()
    }
}

impl PrivateDaemon {
    /// The URI of the libvirtd whose files live in `dir`.
    pub fn uri_for(dir: &Path) -> String {
        format!(
            "qemu+unix:///system?socket={}",
            Self::socket_for(dir).display()
        )
    }

    /// The client socket of the libvirtd whose files live in `dir`.
    pub(crate) fn socket_for(dir: &Path) -> PathBuf {
        dir.join("sock/libvirt-sock")
    }

    /// Starts libvirtd with everything under `dir` and waits until it answers.
    pub fn start(dir: &Path, options: DaemonOptions) -> Result<Self, DaemonError> {
        Self::adopt_or_start(dir, options, None)
    }

    /// Reuses the daemons of `dir` that still run (an earlier launcher's, after it died) and
    /// starts the others. `on_exit` hears of every daemon this call (or a later
    /// [`ensure_running`](Self::ensure_running)) starts when it exits.
    pub(crate) fn adopt_or_start(
        dir: &Path,
        options: DaemonOptions,
        on_exit: Option<ExitNotifier>,
    ) -> Result<Self, DaemonError> {
        let mut daemon = PrivateDaemon {
            dir: dir.into(),
            uri: Self::uri_for(dir),
            options,
            libvirtd: None,
            legacy_virtlogd: None,
            on_exit: Arc::new(Mutex::new(on_exit)),
            answered: None,
            publishing: None,
        };
        daemon.libvirtd = daemon.adopt(LIBVIRTD, |d| answers(&d.uri));
        // An earlier launcher's may still be held where it started.
        if let Some(adopted) = &daemon.libvirtd {
            start_pin::release(adopted.pid);
        }
        daemon.legacy_virtlogd = daemon.adopt("virtlogd", |d| {
            UnixStream::connect(d.dir.join("run/virtlogd-sock")).is_ok()
        });
        daemon.ensure_running()?;
        Ok(daemon)
    }

    fn adopt(&self, name: &'static str, answers: impl Fn(&Self) -> bool) -> Option<DaemonProcess> {
        let pid = fs::read_to_string(self.dir.join(format!("{name}.pid")))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        if !process_alive(pid) || !runs_program(pid, name) || !answers(self) {
            return None;
        }
        tracing::info!(daemon = name, pid, "adopted the running private daemon");
        Some(DaemonProcess {
            name,
            pid,
            exited: None,
        })
    }

    /// Starts libvirtd if it is not running, and waits until it answers.
    pub(crate) fn ensure_running(&mut self) -> Result<(), DaemonError> {
        self.prepare()?;
        if !self.libvirtd.as_ref().is_some_and(DaemonProcess::is_alive) {
            if self.libvirtd.is_some() {
                tracing::warn!("the private libvirtd is gone; starting it again");
            }
            self.seed_capabilities();
            let process = self.spawn_libvirtd()?;
            let pid = process.pid;
            self.libvirtd = Some(process);
            let conn = self.wait_ready()?;
            start_pin::release(pid);
            self.answered = self.publish_capabilities(conn);
        }
        Ok(())
    }

    /// The connection that found the daemon answering at its last start, if nobody took it:
    /// the caller's own from now on.
    pub(crate) fn take_connection(&mut self) -> Option<virt::connect::Connect> {
        self.answered.take()
    }

    /// Waits until QEMU's capabilities started loading at the last start are loaded and
    /// published (`warm-cache` exits then).
    pub(crate) fn wait_capabilities(&mut self) {
        if let Some(publishing) = self.publishing.take() {
            let _ = publishing.join();
        }
    }

    /// The shared QEMU capability cache, if there is one and the trick is played.
    fn shared_capabilities(&self) -> Option<&PathBuf> {
        (self.options.capability_cache.as_ref()).filter(|_| enabled(Trick::CapabilityCache))
    }

    /// Copies the shared QEMU capability cache into this daemon's, before it starts. A failure
    /// costs a probe, nothing else: it is logged.
    fn seed_capabilities(&self) {
        let Some(shared) = self.shared_capabilities() else {
            return;
        };
        let started = Instant::now();
        match capcache::seed(shared, &self.dir.join(capcache::PRIVATE_SUBDIR)) {
            Ok(n) => {
                tracing::debug!(files = n, took = ?started.elapsed(), shared = %shared.display(), "seeded QEMU's capability cache")
            }
            Err(e) => {
                tracing::warn!(error = %crate::error_chain(&e), "cannot seed QEMU's capability cache; libvirtd will probe QEMU")
            }
        }
    }

    /// Has the fresh libvirtd load QEMU's capabilities (probing if the seeded cache was missing
    /// or stale) on `conn`, then publishes what changed for the next launcher. With the
    /// `parallel-start` trick, on a thread of its own: the load takes libvirtd 0.1–0.2 s, in
    /// which the launcher registers for events and readies its disks, and asks libvirt for the
    /// same capabilities (its call waits for this load, never repeats it). Returns `conn` unless
    /// the thread took it: libvirt's client held the launcher's calls on the same connection back
    /// while the load's one long call was outstanding (`docs/performance.md`), so the launcher
    /// opens its own meanwhile.
    fn publish_capabilities(
        &mut self,
        conn: virt::connect::Connect,
    ) -> Option<virt::connect::Connect> {
        self.wait_capabilities();
        let Some(shared) = self.shared_capabilities().cloned() else {
            return Some(conn);
        };
        let private = self.dir.join(capcache::PRIVATE_SUBDIR);
        let publish = move |conn: &virt::connect::Connect| {
            // As the launcher's own has (`Hypervisor::open_on`): a daemon that stops answering
            // mid-load fails the call within seconds, and `stop`, which joins this, goes on.
            let _ = conn.set_keep_alive(5, 3);
            let started = Instant::now();
            if let Err(e) = capcache::load_capabilities(conn) {
                tracing::warn!(error = %e, "cannot load QEMU's capabilities");
                return;
            }
            let loaded = started.elapsed();
            match capcache::publish(&private, &shared) {
                Ok(n) => {
                    tracing::info!(published = n, ?loaded, shared = %shared.display(), "QEMU's capabilities loaded")
                }
                Err(e) => {
                    tracing::warn!(error = %crate::error_chain(&e), "cannot publish QEMU's capability cache")
                }
            }
        };
        if !enabled(Trick::ParallelStart) {
            publish(&conn);
            return Some(conn);
        }
        // A reference, no call: kept should the thread not start.
        let kept = conn.clone();
        match std::thread::Builder::new()
            .name("capabilities".into())
            .spawn(move || publish(&conn))
        {
            Ok(handle) => {
                self.publishing = Some(handle);
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot publish QEMU's capability cache");
                Some(kept)
            }
        }
    }

    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// libvirtd's pid.
    pub fn pid(&self) -> Option<i32> {
        self.libvirtd.as_ref().map(|p| p.pid)
    }

    /// Stops libvirtd (then an earlier launcher's virtlogd, if one was found) and waits for
    /// them. QEMU outlives them.
    pub fn stop(&mut self) {
        // No more restarts: the exit that follows is ours.
        *self.on_exit.lock().expect("notifier lock") = None;
        // A publish under way finishes first: a cache half loaded is not published, and its
        // call would fail on the daemon stopped under it.
        self.wait_capabilities();
        self.answered = None;
        for process in [self.libvirtd.take(), self.legacy_virtlogd.take()]
            .into_iter()
            .flatten()
        {
            process.stop();
        }
    }

    /// A migration target's libvirtd, started again without its TLS listener once the migration
    /// is over: libvirt 9.0 cannot close a listener of a running daemon (its admin API sets
    /// client limits, which stop every socket accepting, the unix one too, and leave the port in
    /// LISTEN). QEMU runs on and the new daemon takes it back, as after a crash; the exit of the
    /// old one is not reported (it is planned). False if there was no listener.
    pub(crate) fn close_tls_listener(&mut self) -> Result<bool, DaemonError> {
        let Some(tls) = self
            .options
            .migration_tls
            .as_mut()
            .filter(|t| t.listen.is_some())
        else {
            return Ok(false);
        };
        tls.listen = None;
        let notify = self.on_exit.lock().expect("notifier lock").take();
        if let Some(process) = self.libvirtd.take() {
            process.stop();
        }
        let started = self.ensure_running();
        *self.on_exit.lock().expect("notifier lock") = notify;
        started.map(|()| true)
    }

    /// Where libvirtd writes each domain's QEMU log (`/var/log/libvirt/qemu` in its namespace).
    pub(crate) fn qemu_log_dir(dir: &Path) -> PathBuf {
        dir.join("log/qemu")
    }

    /// Where libvirtd keeps swtpm's state (`/var/lib/libvirt/swtpm` in its namespace).
    pub(crate) fn swtpm_dir(dir: &Path) -> PathBuf {
        dir.join("lib/swtpm")
    }

    fn log_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.log"))
    }

    fn host_uuid(&self) -> Result<String, DaemonError> {
        daemon_conf::host_uuid_in(&self.dir)
            .map_err(|(path, source)| DaemonError::Prepare { path, source })
    }

    /// Directories and configuration files, rewritten at every start.
    fn prepare(&self) -> Result<(), DaemonError> {
        let prepare = |path: &Path, source| DaemonError::Prepare {
            path: path.to_path_buf(),
            source,
        };
        for sub in [
            "etc",
            "run",
            "lib",
            "cache",
            "log/qemu",
            "log-swtpm",
            "swtpm-localca",
            "sock",
            "drivers",
            "bin",
        ] {
            let path = self.dir.join(sub);
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&path)
                .map_err(|e| prepare(&path, e))?;
            // A non-root QEMU (and libvirt's probe of it) makes and opens its monitor socket, pid
            // file and per-domain dirs under libvirt's run, lib and cache dirs, as under the
            // system daemon's /run/libvirt (0755); swtpm, as the same user, writes its log. The
            // daemon's own sockets and config stay in root-only dirs.
            let mode = match sub {
                "run" | "lib" | "cache" | "log-swtpm" if !self.options.qemu_user.is_root() => 0o755,
                _ => 0o700,
            };
            fs::set_permissions(&path, fs::Permissions::from_mode(mode))
                .map_err(|e| prepare(&path, e))?;
            if sub == "swtpm-localca" {
                let qemu = &self.options.qemu_user;
                nix::unistd::chown(
                    &path,
                    Some(nix::unistd::Uid::from_raw(qemu.uid)),
                    Some(nix::unistd::Gid::from_raw(qemu.gid)),
                )
                .map_err(|e| prepare(&path, e.into()))?;
            }
        }
        for (host, _) in COVERED {
            fs::create_dir_all(host).map_err(|e| prepare(Path::new(host), e))?;
        }
        let files = [
            (
                self.dir.join("libvirtd.conf"),
                libvirtd_conf(
                    &self.dir,
                    &self.host_uuid()?,
                    self.options.migration_tls.as_deref(),
                ),
            ),
            (
                self.dir.join("etc/qemu.conf"),
                qemu_conf_text(&self.options),
            ),
        ];
        for (path, text) in files {
            fs::write(&path, text).map_err(|e| prepare(&path, e))?;
        }
        lean::prepare(&self.dir).map_err(|(path, e)| prepare(&path, e))?;
        Ok(())
    }

    /// Starts libvirtd in a mount namespace of its own that covers libvirt's fixed paths with
    /// ours, and a thread that reports its exit.
    fn spawn_libvirtd(&self) -> Result<DaemonProcess, DaemonError> {
        let name = LIBVIRTD;
        let log = self.log_path(name);
        let prepare = |source| DaemonError::Prepare {
            path: log.clone(),
            source,
        };
        // Appended to: a restarted daemon keeps the story of the one before.
        let log_file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(prepare)?;
        fs::set_permissions(&log, fs::Permissions::from_mode(0o600)).map_err(prepare)?;
        // Everything the child needs after fork is allocated here, before it.
        let binds = self.covered_binds();
        // Started on one CPU, so that the capability cache holds wherever cores differ; given
        // the launcher's CPUs back once it answers (`start_pin`).
        let one_cpu = start_pin::start_cpu();
        let kvm = kvm_node::for_qemu(&self.dir, &self.options.qemu_user);
        let mut command = lean::libvirtd_command(&self.dir);
        if self
            .options
            .migration_tls
            .as_ref()
            .is_some_and(|t| t.listen.is_some())
        {
            // Its TLS listener (`libvirtd_conf`): without `--listen` it serves the unix socket only.
            command.arg("--listen");
        }
        command
            .arg("--config")
            .arg(self.dir.join(format!("{name}.conf")))
            .arg("--pid-file")
            .arg(self.dir.join(format!("{name}.pid")))
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().map_err(prepare)?)
            .stderr(log_file)
            // Its own process group: a Ctrl-C at the terminal is the launcher's to handle.
            .process_group(0);
        // SAFETY: the closure runs in the forked child before exec and only makes raw system calls
        // (unshare, mount) on memory prepared before the fork; it allocates nothing.
        unsafe {
            command.pre_exec(move || {
                if let Some(cpus) = &one_cpu {
                    nix::sched::sched_setaffinity(Pid::from_raw(0), cpus)?;
                }
                unshare(CloneFlags::CLONE_NEWNS)?;
                mount(
                    None::<&str>,
                    "/",
                    None::<&str>,
                    MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                    None::<&str>,
                )?;
                for (source, target) in &binds {
                    mount(
                        Some(source.as_c_str()),
                        target.as_c_str(),
                        None::<&str>,
                        MsFlags::MS_BIND,
                        None::<&str>,
                    )?;
                }
                if let Some(kvm) = &kvm {
                    kvm.cover()?;
                }
                Ok(())
            });
        }
        let child = command.spawn().map_err(|source| DaemonError::Spawn {
            daemon: name,
            source,
        })?;
        let pid = child.id() as i32;
        let exited = self.watch_exit(name, child)?;
        Ok(DaemonProcess {
            name,
            pid,
            exited: Some(exited),
        })
    }

    /// The bind mounts of libvirtd's namespace: each of libvirt's fixed paths covered by ours.
    fn covered_binds(&self) -> Vec<(CString, CString)> {
        COVERED
            .iter()
            .map(|(host, sub)| {
                (
                    CString::new(self.dir.join(sub).as_os_str().as_bytes())
                        .expect("no NUL in paths"),
                    CString::new(*host).expect("no NUL"),
                )
            })
            .collect()
    }

    /// A thread that waits for the daemon `child` to exit, marks it exited and reports it.
    fn watch_exit(
        &self,
        name: &'static str,
        mut child: std::process::Child,
    ) -> Result<Arc<(Mutex<bool>, Condvar)>, DaemonError> {
        let exited = Arc::new((Mutex::new(false), Condvar::new()));
        let flag = exited.clone();
        let on_exit = self.on_exit.clone();
        std::thread::Builder::new()
            .name(format!("watch-{name}"))
            .spawn(move || {
                // An error means a PID-1 reaper got there first: it exited all the same.
                let status = child.wait();
                tracing::debug!(daemon = name, ?status, "exited");
                // Read before the exit is marked: whoever silenced the notifier, stopped the
                // daemon and saw it gone (`close_tls_listener`) may then restore it, and this
                // exit is not reported.
                let notify = on_exit.lock().expect("notifier lock").clone();
                *flag.0.lock().expect("exit flag") = true;
                flag.1.notify_all();
                if let Some(notify) = notify {
                    notify(name);
                }
            })
            .map_err(|source| DaemonError::Spawn {
                daemon: name,
                source,
            })?;
        Ok(exited)
    }

    /// Ready means libvirtd answers, not that its socket exists: libvirtd listens on its socket
    /// before its drivers are up, and accepts the connections waiting there only once they are.
    /// So a connection made as soon as the socket appears is answered the moment the daemon is
    /// ready, without polling: the socket's appearance is waited for on inotify, and that first
    /// connection is returned (for the capability load, or as the launcher's own). The daemon's
    /// death is checked between waits. The watch is closed aside: its close would hold the start
    /// up for an RCU grace period.
    fn wait_ready(&self) -> Result<virt::connect::Connect, DaemonError> {
        use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
        let name = LIBVIRTD;
        crate::libvirt::events::ensure_event_loop().ok();
        let process = self.libvirtd.as_ref();
        let deadline = Instant::now() + START_TIMEOUT;
        let sock_dir = self.dir.join("sock");
        // Made before the first look: a socket made in between is an event, never missed.
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .and_then(|i| {
                i.add_watch(
                    &sock_dir,
                    AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO,
                )
                .map(|_| i)
            })
            .inspect_err(
                |e| tracing::debug!(error = %e, "no inotify: waiting for libvirtd by polling"),
            )
            .ok()
            .map(crate::host::watch::ClosedAside::new);
        let mut backoff = Duration::from_millis(10);
        loop {
            if !process.is_some_and(DaemonProcess::is_alive) {
                let log = self.log_path(name);
                return Err(DaemonError::Exited {
                    daemon: name,
                    tail: log_tail(&log),
                    log,
                });
            }
            // Blocks, once the socket is there, until libvirtd serves it.
            if let Some(conn) = answering(&self.uri) {
                return Ok(conn);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(DaemonError::Timeout {
                    daemon: name,
                    timeout: START_TIMEOUT,
                    log: self.log_path(name),
                });
            }
            match &inotify {
                // Woken by the socket's creation; at the latest after a while, to see whether
                // the daemon died before it made its socket.
                Some(inotify) => {
                    let slice = (deadline - now).min(Duration::from_millis(250));
                    let _ = crate::host::watch::wait_and_drain(inotify, now + slice);
                }
                None => {
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_millis(200));
                }
            }
        }
    }
}

impl Drop for PrivateDaemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// An API call on `uri` succeeds.
fn answers(uri: &str) -> bool {
    answering(uri).is_some()
}

/// A connection to `uri`: its opening is itself calls libvirtd answered (the remote driver's
/// `CONNECT_OPEN` among them), so no other call is needed to know.
fn answering(uri: &str) -> Option<virt::connect::Connect> {
    super::connect(uri).ok()
}

fn log_tail(log: &Path) -> String {
    let text = fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(10)..].join("\n")
}
