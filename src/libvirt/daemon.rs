//! A private libvirtd for one launcher: its own configuration, sockets, state and logs under the
//! runtime directory, so that it never collides with a system libvirtd on the same machine.
//!
//! A root libvirtd keeps state at fixed paths (`/run/libvirt`, `/var/lib/libvirt`, ...); a second
//! one fails on its pid files. So the daemon runs in a mount namespace of its own in which those
//! paths are the runtime directory's subdirectories — what a container gives it for free. Its
//! client socket lives outside the covered paths, so `virsh -c <uri>` reaches it from the host.
//!
//! QEMU's standard output goes to files (`stdio_handler = "file"`), so no virtlogd is needed.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};

/// How long a fresh daemon may take to answer (the first start probes QEMU's capabilities).
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The host paths a root libvirtd insists on, and the subdirectory of ours that covers each.
const COVERED: [(&str, &str); 5] = [
    ("/etc/libvirt", "etc"),
    ("/run/libvirt", "run"),
    ("/var/lib/libvirt", "lib"),
    ("/var/cache/libvirt", "cache"),
    ("/var/log/libvirt", "log"),
];

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("cannot prepare {path}")]
    Prepare {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot start libvirtd (is libvirt-daemon installed?)")]
    Spawn(#[source] io::Error),
    #[error("libvirtd exited during start-up ({status}); its log {log} ends with:\n{tail}")]
    Exited {
        status: std::process::ExitStatus,
        log: PathBuf,
        tail: String,
    },
    #[error("libvirtd did not answer on {uri} within {timeout:?}; see {log}")]
    Timeout {
        uri: String,
        timeout: Duration,
        log: PathBuf,
    },
}

/// Settings of the daemon's QEMU driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DaemonOptions {
    /// Leave cgroups alone (`cgroup_controllers = [ ]`): in a pod the launcher owns device rules.
    pub pod_cgroups: bool,
}

/// A running private libvirtd: one this launcher started (its child), or one an earlier launcher
/// of the same runtime directory left running (adopted). `stop` ends it; QEMU outlives it.
#[derive(Debug)]
pub struct PrivateDaemon {
    child: Option<Child>,
    /// The daemon's pid, also for an adopted one (from its pid file).
    pid: Option<i32>,
    dir: PathBuf,
    uri: String,
}

impl PrivateDaemon {
    /// The URI of the daemon whose files live in `dir`.
    pub fn uri_for(dir: &Path) -> String {
        format!(
            "qemu+unix:///system?socket={}",
            dir.join("sock/libvirt-sock").display()
        )
    }

    /// Reuses the daemon of `dir` if one answers there (an earlier launcher's, after that launcher
    /// died), else starts one.
    pub fn adopt_or_start(dir: &Path, options: DaemonOptions) -> Result<Self, DaemonError> {
        let uri = Self::uri_for(dir);
        if dir.join("sock/libvirt-sock").exists() && answers(&uri) {
            let pid = fs::read_to_string(dir.join("libvirtd.pid"))
                .ok()
                .and_then(|p| p.trim().parse().ok());
            tracing::info!(%uri, ?pid, "adopted the running private libvirtd");
            return Ok(PrivateDaemon {
                child: None,
                pid,
                dir: dir.into(),
                uri,
            });
        }
        Self::start(dir, options)
    }

    /// The daemon process still exists (a zombie counts as gone).
    pub fn is_alive(&mut self) -> bool {
        if let Some(child) = self.child.as_mut() {
            return matches!(child.try_wait(), Ok(None));
        }
        self.pid.is_some_and(process_alive)
    }

    /// Starts libvirtd with everything under `dir` and waits until an API call succeeds.
    pub fn start(dir: &Path, options: DaemonOptions) -> Result<Self, DaemonError> {
        let prepare = |path: &Path, source| DaemonError::Prepare {
            path: path.to_path_buf(),
            source,
        };
        for sub in ["etc", "run", "lib", "cache", "log", "sock"] {
            let path = dir.join(sub);
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&path)
                .map_err(|e| prepare(&path, e))?;
        }
        for (host, _) in COVERED {
            fs::create_dir_all(host).map_err(|e| prepare(Path::new(host), e))?;
        }
        let config = dir.join("libvirtd.conf");
        fs::write(&config, libvirtd_conf(dir)).map_err(|e| prepare(&config, e))?;
        let qemu_conf = dir.join("etc/qemu.conf");
        fs::write(&qemu_conf, qemu_conf_text(options)).map_err(|e| prepare(&qemu_conf, e))?;
        let log = dir.join("libvirtd.log");
        // Appended to: a restarted daemon keeps the story of the one before.
        let log_file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| prepare(&log, e))?;
        fs::set_permissions(&log, fs::Permissions::from_mode(0o600))
            .map_err(|e| prepare(&log, e))?;

        // Everything the child needs after fork is allocated here, before it.
        let binds: Vec<(CString, CString)> = COVERED
            .iter()
            .map(|(host, sub)| {
                (
                    CString::new(dir.join(sub).as_os_str().as_bytes()).expect("no NUL in paths"),
                    CString::new(*host).expect("no NUL"),
                )
            })
            .collect();
        let mut command = Command::new("libvirtd");
        command
            .arg("--config")
            .arg(&config)
            .arg("--pid-file")
            .arg(dir.join("libvirtd.pid"))
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().map_err(|e| prepare(&log, e))?)
            .stderr(log_file)
            // Its own process group: a Ctrl-C at the terminal is the launcher's to handle.
            .process_group(0);
        // SAFETY: the closure runs in the forked child before exec and only makes raw system calls
        // (unshare, mount) on memory prepared before the fork; it allocates nothing.
        unsafe {
            command.pre_exec(move || {
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
                Ok(())
            });
        }
        let child = command.spawn().map_err(DaemonError::Spawn)?;
        let mut daemon = PrivateDaemon {
            pid: Some(child.id() as i32),
            child: Some(child),
            dir: dir.to_path_buf(),
            uri: Self::uri_for(dir),
        };
        daemon.wait_ready()?;
        Ok(daemon)
    }

    pub fn uri(&self) -> &str {
        &self.uri
    }

    pub fn pid(&self) -> Option<i32> {
        self.pid
    }

    /// Ready means an API call succeeds, not that the socket exists.
    fn wait_ready(&mut self) -> Result<(), DaemonError> {
        crate::libvirt::events::ensure_event_loop().ok();
        let deadline = Instant::now() + START_TIMEOUT;
        let mut backoff = Duration::from_millis(10);
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    let log = self.dir.join("libvirtd.log");
                    return Err(DaemonError::Exited {
                        status,
                        tail: log_tail(&log),
                        log,
                    });
                }
            }
            if answers(&self.uri) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(DaemonError::Timeout {
                    uri: self.uri.clone(),
                    timeout: START_TIMEOUT,
                    log: self.dir.join("libvirtd.log"),
                });
            }
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_millis(200));
        }
    }

    /// Stops the daemon (SIGTERM, then SIGKILL after five seconds) and waits for it.
    pub fn stop(&mut self) {
        let Some(pid) = self.pid.take() else {
            return;
        };
        let mut child = self.child.take();
        use nix::sys::signal::{kill, Signal};
        let target = nix::unistd::Pid::from_raw(pid);
        let _ = kill(target, Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut gone = || match child.as_mut() {
            // Our child: reap it. An error means someone else (a PID-1 reaper) already did.
            Some(c) => !matches!(c.try_wait(), Ok(None)),
            None => !process_alive(pid),
        };
        while !gone() {
            if Instant::now() >= deadline {
                let _ = kill(target, Signal::SIGKILL);
                if let Some(c) = child.as_mut() {
                    let _ = c.wait();
                }
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
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
    match virt::connect::Connect::open(Some(uri)) {
        Ok(conn) => conn.lib_version().is_ok(),
        Err(_) => false,
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

fn log_tail(log: &Path) -> String {
    let text = fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(10)..].join("\n")
}

fn libvirtd_conf(dir: &Path) -> String {
    format!(
        r#"# Written by vmlauncher for its private libvirtd; rewritten at every start.
unix_sock_dir = "{sock}"
unix_sock_group = "root"
unix_sock_ro_perms = "0700"
unix_sock_rw_perms = "0700"
unix_sock_admin_perms = "0700"
auth_unix_ro = "none"
auth_unix_rw = "none"
log_outputs = "3:stderr"
"#,
        sock = dir.join("sock").display()
    )
}

fn qemu_conf_text(options: DaemonOptions) -> String {
    let cgroups = if options.pod_cgroups {
        "cgroup_controllers = [ ]\n"
    } else {
        ""
    };
    format!(
        r#"# Written by vmlauncher for its private libvirtd; rewritten at every start.
user = "root"
group = "root"
dynamic_ownership = 0
remember_owner = 0
namespaces = [ ]
stdio_handler = "file"
security_driver = "none"
{cgroups}"#
    )
}
