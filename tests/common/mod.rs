//! Test harness: starts the real `vmlauncher` binary against a real private libvirtd and a real
//! (TCG) test guest, and waits on what it prints, its guest's console, or its exit — each with a
//! deadline that fails with a clear message. Never a sleep.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use vmlauncher::console::ConsoleLog;

/// Generous: a TCG guest boots in 5 s on an idle machine, 8–13 s under load.
pub const BOOT_DEADLINE: Duration = Duration::from_secs(180);
pub const GUEST_DEADLINE: Duration = Duration::from_secs(60);

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_vmlauncher")
}

/// The test guest built by `scripts/build-test-guest.sh`.
pub fn guest_dir() -> PathBuf {
    let dir = std::env::var_os("VMLAUNCHER_GUEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/vmlauncher/test-guest"));
    assert!(
        dir.join("vmlinuz").exists() && dir.join("initrd.img").exists(),
        "no test guest in {} — run scripts/setup.sh first",
        dir.display()
    );
    dir
}

/// A VMI for the test guest with the given disks: `(volume, serial, image path)`, all on scsi.
pub fn guest_spec(name: &str, kernel_args: &str, disks: &[(&str, &str, &Path)]) -> String {
    let guest = guest_dir();
    let mut text = format!(
        r#"apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 60
  domain:
    memory:
      guest: 256Mi
    firmware:
      kernelBoot:
        kernelArgs: console=ttyS0 {kernel_args}
        container:
          kernelPath: {kernel}
          initrdPath: {initrd}
    devices:
      disks:
"#,
        kernel = guest.join("vmlinuz").display(),
        initrd = guest.join("initrd.img").display(),
    );
    if disks.is_empty() {
        text = text.replace("      disks:\n", "      disks: []\n");
    }
    for (volume, serial, _) in disks {
        text += &format!(
            "      - name: {volume}\n        disk: {{bus: scsi}}\n        serial: {serial}\n"
        );
    }
    text += "  volumes:\n";
    if disks.is_empty() {
        text = text.replace("  volumes:\n", "  volumes: []\n");
    }
    for (volume, _, path) in disks {
        text += &format!(
            "  - name: {volume}\n    hostDisk: {{path: {}, type: Disk}}\n",
            path.display()
        );
    }
    text
}

/// A running `vmlauncher run`, with its runtime dir.
pub struct Launched {
    pub child: Child,
    pub runtime_dir: tempfile::TempDir,
    stdout: mpsc::Receiver<String>,
    pub stdout_seen: Vec<String>,
    exited: Option<ExitStatus>,
}

impl Launched {
    pub fn start(spec: &str, extra_args: &[&str]) -> Launched {
        let runtime_dir = tempfile::Builder::new()
            .prefix("vml-e2e-")
            .tempdir()
            .expect("temp dir");
        let spec_path = runtime_dir.path().join("spec.yaml");
        std::fs::write(&spec_path, spec).unwrap();
        let stderr = std::fs::File::create(runtime_dir.path().join("launcher.stderr")).unwrap();
        let mut child = Command::new(bin())
            .arg("run")
            .arg(&spec_path)
            .arg("--runtime-dir")
            .arg(runtime_dir.path())
            .args(["--emulation", "tcg"])
            .args(extra_args)
            .env("VMLAUNCHER_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn vmlauncher");
        let (tx, stdout) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Launched {
            child,
            runtime_dir,
            stdout,
            stdout_seen: Vec::new(),
            exited: None,
        }
    }

    pub fn dir(&self) -> &Path {
        self.runtime_dir.path()
    }

    pub fn socket(&self) -> PathBuf {
        self.dir().join("launcher.sock")
    }

    pub fn console(&self) -> ConsoleLog {
        ConsoleLog::from_start(&self.dir().join("console.log")).unwrap()
    }

    pub fn libvirt_uri(&self) -> String {
        vmlauncher::libvirt::daemon::PrivateDaemon::uri_for(&self.dir().join("libvirt"))
    }

    fn stderr_text(&self) -> String {
        std::fs::read_to_string(self.dir().join("launcher.stderr")).unwrap_or_default()
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
                use std::os::unix::process::ExitStatusExt;
                let status = ExitStatus::from_raw(code << 8);
                self.exited = Some(status);
                status
            }
            Ok(other) => panic!(
                "vmlauncher ended unexpectedly: {other:?}\nstderr:\n{}",
                self.stderr_text()
            ),
            Err(_) => panic!(
                "vmlauncher did not exit within {within:?}; stdout:\n{}\nstderr:\n{}",
                self.stdout_seen.join("\n"),
                self.stderr_text()
            ),
        }
    }

    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), signal).unwrap();
    }

    /// The pid of a process from a pid file under the runtime dir.
    pub fn pid_from(&self, relative: &str) -> Option<i32> {
        std::fs::read_to_string(self.dir().join(relative))
            .ok()?
            .trim()
            .parse()
            .ok()
    }
}

/// The process exists and is not a zombie waiting to be reaped.
pub fn alive(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the command name, which is in parentheses and may contain spaces.
    let state = stat
        .rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next());
    !matches!(state, Some('Z') | Some('X') | None)
}

impl Drop for Launched {
    /// A failed test must not leave a launcher, a libvirtd or a QEMU behind.
    fn drop(&mut self) {
        if self.exited.is_some() {
            return;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
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
        for pid in qemu_pids.chain(daemon) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}
