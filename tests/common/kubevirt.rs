//! KubeVirt's side of the drop-in: a `vmlauncher virt-launcher` started as KubeVirt's pod starts
//! it, in a directory that plays the pod's share, hotplug and ephemeral dirs, and the handler's
//! own code (`handler-replay`, built from KubeVirt's tree) to drive it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use super::bin;

/// Where KubeVirt's wire files are: `VMLAUNCHER_KUBEVIRT_WIRE`, else `shared/kubevirt-wire`
/// beside the checkout or in `/work/shared`.
pub fn kubevirt_wire() -> PathBuf {
    kubevirt_wire_with("handler-replay/handler-replay")
}

/// [`kubevirt_wire`], found by the one file a test needs from it (`marker`, relative to it).
pub fn kubevirt_wire_with(marker: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os("VMLAUNCHER_KUBEVIRT_WIRE") {
        return dir.into();
    }
    let beside = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/kubevirt-wire");
    for dir in [beside, PathBuf::from("/work/shared/kubevirt-wire")] {
        if dir.join(marker).exists() {
            return dir;
        }
    }
    panic!(
        "KubeVirt's wire files ({marker}) not found: set VMLAUNCHER_KUBEVIRT_WIRE to the \
         kubevirt-wire directory"
    )
}

/// Runs virt-handler's own code (`handler-replay`) against the launcher whose share dir is
/// `share`, until it ends or 10 minutes pass; panics with what it said, and `context`, unless its
/// last line is `HELD`.
pub fn handler_replay_holds(
    share: &Path,
    vmi: &Path,
    hotplug: &Path,
    console_dir: &Path,
    context: impl FnOnce() -> String,
) {
    let log = share.with_file_name("handler-replay.log");
    let mut replay = Command::new(kubevirt_wire().join("handler-replay/handler-replay"))
        .arg("-share")
        .arg(share)
        .arg("-vmi")
        .arg(vmi)
        .arg("-hotplug-dir")
        .arg(hotplug)
        .arg("-console-dir")
        .arg(console_dir)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run handler-replay");
    let ended = wait_child(&mut replay, Duration::from_secs(600));
    if ended.is_none() {
        let _ = replay.kill();
    }
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    let last = said.lines().last().unwrap_or("");
    assert!(
        ended.is_some_and(|s| s.success()) && last.starts_with("HELD"),
        "handler-replay did not hold ({ended:?}):\n{said}\n{}",
        context()
    );
}

/// A pod's directories, in a temp dir.
pub struct PodDirs {
    pub root: tempfile::TempDir,
}

impl PodDirs {
    pub fn new() -> PodDirs {
        let root = super::disk_dir("vml-kv-");
        for d in [
            "share/sockets",
            "hotplug",
            "ephemeral",
            "container-disks",
            "private",
        ] {
            std::fs::create_dir_all(root.path().join(d)).unwrap();
        }
        PodDirs { root }
    }
    pub fn share(&self) -> PathBuf {
        self.root.path().join("share")
    }
    pub fn hotplug(&self) -> PathBuf {
        self.root.path().join("hotplug")
    }
    pub fn runtime(&self) -> PathBuf {
        self.root.path().join("runtime")
    }
    pub fn sockets(&self) -> PathBuf {
        self.share().join("sockets")
    }
    /// KubeVirt's private dir of the VMI `uid`: its serial and VNC sockets.
    pub fn consoles(&self, uid: &str) -> PathBuf {
        self.root.path().join("private").join(uid)
    }
    /// Where QEMU copies the serial console of the VMI `uid`, as KubeVirt's launcher has it.
    pub fn console_log(&self, uid: &str) -> PathBuf {
        self.consoles(uid).join("virt-serial0-log")
    }

    /// The flags KubeVirt's pod template gives, pointed at these dirs, and TCG.
    pub fn flags(&self, name: &str, namespace: &str, uid: &str) -> Vec<String> {
        self.flags_at(self.root.path(), name, namespace, uid)
    }

    /// [`flags`](Self::flags) for a launcher that sees these dirs at `root` (its own mount
    /// namespace: [`VirtLauncher::start_in_pod`]).
    pub fn flags_at(&self, root: &Path, name: &str, namespace: &str, uid: &str) -> Vec<String> {
        let p = |d: &str| root.join(d).display().to_string();
        [
            "--qemu-timeout",
            "5m",
            "--name",
            name,
            "--uid",
            uid,
            "--namespace",
            namespace,
            "--kubevirt-share-dir",
            &p("share"),
            "--ephemeral-disk-dir",
            &p("ephemeral"),
            "--container-disk-dir",
            &p("container-disks"),
            "--hotplug-disk-dir",
            &p("hotplug"),
            "--grace-period-seconds",
            "45",
            "--hook-sidecars",
            "0",
            "--ovmf-path",
            "/usr/share/OVMF",
            "--runtime-dir",
            &p("runtime"),
            "--kubevirt-private-dir",
            &p("private"),
            "--emulation",
            "tcg",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }
}

/// A running `vmlauncher virt-launcher`.
pub struct VirtLauncher {
    pub child: Child,
    stderr: PathBuf,
    exited: Option<ExitStatus>,
}

impl VirtLauncher {
    pub fn start(dirs: &PodDirs, flags: &[String]) -> VirtLauncher {
        Self::spawn(dirs, flags, &mut Command::new(bin()))
    }

    /// Started in a mount namespace of its own in which `seen_at` (an empty dir) is `dirs`' root,
    /// as a pod's container sees its volumes: launchers given the same [`PodDirs::flags_at`]
    /// each see their own pod at the same paths, as two KubeVirt pods do. The test reaches each
    /// pod's files at their real place, as virt-handler reaches them through `/proc/<pid>/root`.
    pub fn start_in_pod(dirs: &PodDirs, seen_at: &Path, flags: &[String]) -> VirtLauncher {
        use nix::mount::{mount, MsFlags};
        use std::ffi::{CStr, CString};
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::process::CommandExt;
        let pod = CString::new(dirs.root.path().as_os_str().as_bytes()).unwrap();
        let at = CString::new(seen_at.as_os_str().as_bytes()).unwrap();
        let mut command = Command::new(bin());
        // SAFETY: between fork and exec the child only makes system calls (unshare, mount) on
        // strings made before the fork: no allocation, no lock.
        unsafe {
            command.pre_exec(move || {
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)?;
                mount(
                    None::<&CStr>,
                    c"/",
                    None::<&CStr>,
                    MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                    None::<&CStr>,
                )?;
                mount(
                    Some(pod.as_c_str()),
                    at.as_c_str(),
                    None::<&CStr>,
                    MsFlags::MS_BIND | MsFlags::MS_REC,
                    None::<&CStr>,
                )?;
                Ok(())
            });
        }
        Self::spawn(dirs, flags, &mut command)
    }

    fn spawn(dirs: &PodDirs, flags: &[String], command: &mut Command) -> VirtLauncher {
        let stderr = dirs.root.path().join("launcher.stderr");
        let child = command
            .arg("virt-launcher")
            .args(flags)
            .env(
                "VMLAUNCHER_LOG",
                std::env::var("VMLAUNCHER_TEST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dirs.root.path().join("launcher.stdout")).unwrap())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("spawn vmlauncher virt-launcher");
        VirtLauncher {
            child,
            stderr,
            exited: None,
        }
    }

    pub fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        if self.exited.is_none() {
            let _ = super::signal_pid(self.child.id() as i32, signal);
        }
    }

    /// SIGTERM, and its exit within `within` (then SIGKILL): what a test that ends early does,
    /// so that the launcher stops its guest and libvirtd instead of leaving them running.
    pub fn terminate(&mut self, within: Duration) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.signal(nix::sys::signal::Signal::SIGTERM);
            self.exited = wait_child(&mut self.child, within);
        }
        self.exited
    }

    /// Its exit status within `within`, or a panic with its log.
    pub fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        if let Some(s) = self.exited {
            return s;
        }
        let status = wait_child(&mut self.child, within).unwrap_or_else(|| {
            panic!(
                "virt-launcher did not exit within {within:?}; stderr:\n{}",
                self.stderr_text()
            )
        });
        self.exited = Some(status);
        status
    }
}

impl Drop for VirtLauncher {
    fn drop(&mut self) {
        if self.exited.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Waits for `child` without sleeping: a thread blocks in `wait` and reports back.
pub fn wait_child(child: &mut Child, within: Duration) -> Option<ExitStatus> {
    let pid = child.id() as i32;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let status = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
        let _ = tx.send(status);
    });
    match rx.recv_timeout(within) {
        Ok(Ok(nix::sys::wait::WaitStatus::Exited(_, code))) => {
            use std::os::unix::process::ExitStatusExt;
            Some(ExitStatus::from_raw(code << 8))
        }
        Ok(Ok(nix::sys::wait::WaitStatus::Signaled(_, sig, _))) => {
            use std::os::unix::process::ExitStatusExt;
            Some(ExitStatus::from_raw(sig as i32))
        }
        Ok(other) => panic!("unexpected wait status {other:?}"),
        Err(_) => None,
    }
}

/// The test guest's VMI as JSON, as a KubeVirt API server would hand it to virt-handler.
pub fn guest_vmi_json(name: &str, namespace: &str, uid: &str) -> serde_json::Value {
    let guest = super::guest_dir();
    serde_json::json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {
            "terminationGracePeriodSeconds": 30,
            "domain": {
                "memory": {"guest": "256Mi"},
                "firmware": {"kernelBoot": {
                    "kernelArgs": "console=ttyS0 loglevel=1",
                    "container": {
                        "kernelPath": guest.join("vmlinuz"),
                        "initrdPath": guest.join("initrd.img"),
                    },
                }},
                "devices": {"disks": []},
            },
            "volumes": [],
        },
        "status": {"phase": "Scheduled"},
    })
}

/// Long enough for the private libvirtd to come up under load.
pub const SERVING_DEADLINE: Duration = Duration::from_secs(60);

impl VirtLauncher {
    /// Waits for KubeVirt's only readiness signal, `launcher-sock` (renamed from
    /// `launcher-init-sock` once the launcher serves), polling until [`SERVING_DEADLINE`]; a
    /// launcher that exits first, or never serves, fails with its log.
    pub fn wait_serving(&mut self, dirs: &PodDirs) -> PathBuf {
        let socket = dirs.sockets().join("launcher-sock");
        let deadline = std::time::Instant::now() + SERVING_DEADLINE;
        // Woken by every change in the sockets dir (the rename among them); an exit is seen
        // at the next change or at the deadline.
        let mut exited = None;
        let serving =
            vmlauncher::host::watch::wait_for_change_in(&[&dirs.sockets()], deadline, || {
                exited = self.child.try_wait().ok().flatten();
                socket.exists() || exited.is_some()
            })
            .unwrap();
        if let Some(status) = exited.filter(|_| !socket.exists()) {
            self.exited = Some(status);
            panic!(
                "virt-launcher exited ({status}) before serving; stderr:\n{}",
                self.stderr_text()
            );
        }
        assert!(
            serving,
            "no {} within {SERVING_DEADLINE:?}; stderr:\n{}",
            socket.display(),
            self.stderr_text()
        );
        socket
    }
}

/// A `kubevirt.cmd.v1.Cmd` client with tonic's default options on the launcher's socket.
pub async fn cmd_client(
    socket: &Path,
) -> vmlauncher::kubevirt::proto::cmd::cmd_client::CmdClient<tonic::transport::Channel> {
    let channel = vmlauncher::api::channel(socket)
        .await
        .unwrap_or_else(|e| panic!("connect to {}: {e}", socket.display()));
    vmlauncher::kubevirt::proto::cmd::cmd_client::CmdClient::new(channel)
}

/// A `VMIRequest` carrying `vmi_json` as virt-handler sends a VMI.
pub fn vmi_request(vmi_json: Vec<u8>) -> vmlauncher::kubevirt::proto::cmd::VmiRequest {
    use vmlauncher::kubevirt::proto::cmd::{Vmi, VmiRequest};
    VmiRequest {
        vmi: Some(Vmi { vmi_json }),
        ..VmiRequest::default()
    }
}
