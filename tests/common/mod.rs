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

pub mod kubevirt;
pub mod kubevirt_notify;
pub mod net;
pub mod pod;
pub mod python;

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

/// The test guest's VMI, booted from the guest in `guest`: `domain` (lines indented 4, under
/// `spec.domain`) follows its memory and kernel boot, `rest` (indented 2, under `spec`) follows
/// the domain. The kernel logs at `loglevel=1` only: its messages would otherwise interleave with
/// the guest's report lines on the one serial console.
pub fn guest_vmi_from(
    guest: &Path,
    name: &str,
    kernel_args: &str,
    domain: &str,
    rest: &str,
) -> String {
    let kernel_args = format!("console=ttyS0 loglevel=1 {kernel_args}");
    format!(
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
        kernelArgs: {kernel_args}
        container:
          kernelPath: {kernel}
          initrdPath: {initrd}
{domain}{rest}"#,
        kernel_args = kernel_args.trim_end(),
        kernel = guest.join("vmlinuz").display(),
        initrd = guest.join("initrd.img").display(),
    )
}

/// [`guest_vmi_from`] the test guest built by `scripts/build-test-guest.sh`.
pub fn guest_vmi(name: &str, kernel_args: &str, domain: &str, rest: &str) -> String {
    guest_vmi_from(&guest_dir(), name, kernel_args, domain, rest)
}

/// A VMI for the test guest with the given disks: `(volume, serial, image path)`, all on scsi.
pub fn guest_spec(name: &str, kernel_args: &str, disks: &[(&str, &str, &Path)]) -> String {
    let mut devices = String::from("    devices:\n      disks:");
    let mut volumes = String::from("  volumes:");
    if disks.is_empty() {
        devices += " []";
        volumes += " []";
    }
    devices += "\n";
    volumes += "\n";
    for (volume, serial, path) in disks {
        devices += &format!(
            "      - name: {volume}\n        disk: {{bus: scsi}}\n        serial: {serial}\n"
        );
        volumes += &format!(
            "  - name: {volume}\n    hostDisk: {{path: {}, type: Disk}}\n",
            path.display()
        );
    }
    guest_vmi(name, kernel_args, &devices, &volumes)
}

/// `text`, a VMI with `disks: []` and `volumes: []`, with hot-pluggable claims
/// `(volume, serial)` on scsi.
pub fn with_claims(text: String, claims: &[(&str, &str)]) -> String {
    if claims.is_empty() {
        return text;
    }
    let mut disks = String::new();
    let mut volumes = String::new();
    for (volume, serial) in claims {
        disks += &format!(
            "      - name: {volume}\n        disk: {{bus: scsi}}\n        serial: {serial}\n"
        );
        volumes += &format!(
            "  - name: {volume}\n    persistentVolumeClaim: {{claimName: {volume}, hotpluggable: true}}\n"
        );
    }
    text.replace("      disks: []\n", &format!("      disks:\n{disks}"))
        .replace("  volumes: []\n", &format!("  volumes:\n{volumes}"))
}

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

/// `vmlauncher status --output json` through `socket`, as a client sees it.
pub fn cli_status(socket: &Path) -> serde_json::Value {
    let out = cli_ok(socket, &["status", "--output", "json"]);
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `vmlauncher ARGS --socket SOCKET`, which must succeed: its output.
pub fn cli_ok(socket: &Path, args: &[&str]) -> std::process::Output {
    let out = Command::new(bin())
        .args(args)
        .arg("--socket")
        .arg(socket)
        .output()
        .unwrap();
    succeeded(out, format_args!("vmlauncher {args:?}"))
}

/// The output `out` of the command `what`, which must have succeeded; else a panic that shows
/// what it printed (a tool like `virt-xml-validate` gives its verdict on stdout).
pub fn succeeded(out: std::process::Output, what: impl std::fmt::Display) -> std::process::Output {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The serials in the test guest's `VMLTEST-DISKS <dev>:<serial>:<sectors> ...` line, in the
/// guest's order (by device name).
pub fn guest_serials(line: &str) -> Vec<String> {
    line.split_whitespace()
        .skip(1)
        .filter_map(|d| d.split(':').nth(1).map(str::to_string))
        .collect()
}

/// `items` as a set of owned strings, to compare with what the guest or the launcher lists.
pub fn set<S: AsRef<str>>(items: &[S]) -> std::collections::BTreeSet<String> {
    items.iter().map(|s| s.as_ref().to_string()).collect()
}

/// A hot-plugged claim's image, `<dir>/<volume>.img` of `bytes`, where the launcher looks for it.
pub fn hotplug_image(dir: &Path, volume: &str, bytes: u64) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::File::create(dir.join(format!("{volume}.img")))
        .unwrap()
        .set_len(bytes)
        .unwrap();
}

/// The live XML of `domain`, straight from libvirt at `uri`.
pub fn live_xml(uri: &str, domain: &str) -> String {
    let conn = virt::connect::Connect::open(Some(uri)).expect("connect to the private libvirtd");
    let dom = conn.lookup_domain_by_name(domain).expect("domain exists");
    dom.xml_desc(0).expect("live XML")
}

/// A temp dir for disk images: QEMU runs as an unprivileged user, which must pass through the
/// dir (tempfile makes them 0700).
pub fn disk_dir(prefix: &str) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("temp dir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// A sparse file of `mib` MiB at `path`: a raw disk image.
pub fn sparse_file(path: impl AsRef<Path>, mib: u64) {
    std::fs::File::create(path)
        .unwrap()
        .set_len(mib << 20)
        .unwrap();
}

/// Waiting on the guest's console with a deadline counted from now.
pub trait ConsoleWait {
    /// The first line `wanted` accepts within `within`; a panic naming `what` otherwise.
    fn line(&mut self, what: &str, within: Duration, wanted: impl FnMut(&str) -> bool) -> String;
}

impl ConsoleWait for ConsoleLog {
    fn line(&mut self, what: &str, within: Duration, wanted: impl FnMut(&str) -> bool) -> String {
        self.wait_for(what, Instant::now() + within, wanted)
            .unwrap()
    }
}

/// Waits for the test guest's next boot line on `console`.
pub fn wait_booted(console: &mut ConsoleLog) {
    console.line("the guest's boot line", BOOT_DEADLINE, |l| {
        l.contains("VMLTEST-BOOTED")
    });
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

    fn spawn(
        wrapper: &[&str],
        runtime_dir: &Path,
        spec: &str,
        extra_args: &[&str],
        cgroup_procs: &[PathBuf],
    ) -> Launched {
        let spec_path = runtime_dir.join("spec.yaml");
        std::fs::write(&spec_path, spec).unwrap();
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(runtime_dir.join("launcher.stderr"))
            .unwrap();
        // VMLAUNCHER_TEST_WRAPPER: a command that runs every launcher a test or bench starts
        // (e.g. valgrind, for scripts/hot-symbols.sh), split at white space.
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
        let mut child = command
            .arg("run")
            .arg(&spec_path)
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
            runtime_dir: runtime_dir.to_path_buf(),
            _owned: None,
            scratch: std::sync::Arc::new(disk_dir("vml-e2e-disks-")),
            stdout,
            stdout_seen: Vec::new(),
            exited: None,
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
    }

    /// A new launcher in this (killed) one's runtime dir, as a restarted container's: it adopts
    /// what is left there and takes over the dir's cleanup.
    pub fn successor(&mut self, spec: &str, extra_args: &[&str]) -> Launched {
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

/// Follows the launcher's gRPC event stream in the background.
pub struct EventWatcher {
    rx: tokio::sync::mpsc::UnboundedReceiver<vmlauncher::api::proto::Event>,
    pub seen: Vec<vmlauncher::api::proto::Event>,
}

impl EventWatcher {
    pub async fn start(socket: &Path) -> EventWatcher {
        let mut client = vmlauncher::api::connect(socket).await.expect("connect");
        let mut stream = client
            .watch_events(vmlauncher::api::proto::WatchEventsRequest {})
            .await
            .expect("WatchEvents")
            .into_inner();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(event)) = stream.message().await {
                if tx.send(event).is_err() {
                    return;
                }
            }
        });
        EventWatcher {
            rx,
            seen: Vec::new(),
        }
    }

    /// Waits for an event that satisfies `matches`, failing with everything seen so far.
    pub async fn wait_for(
        &mut self,
        what: &str,
        within: Duration,
        mut matches: impl FnMut(&vmlauncher::api::proto::Event) -> bool,
    ) -> vmlauncher::api::proto::Event {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(event)) => {
                    self.seen.push(event.clone());
                    if matches(&event) {
                        return event;
                    }
                }
                Ok(None) => panic!(
                    "the event stream ended before {what}; seen: {:#?}",
                    self.seen
                ),
                Err(_) => panic!("no {what} within {within:?}; seen: {:#?}", self.seen),
            }
        }
    }

    /// Waits for a status (or resync) event whose phase is `phase`.
    pub async fn wait_phase(
        &mut self,
        what: &str,
        within: Duration,
        phase: &str,
    ) -> vmlauncher::api::proto::Event {
        self.wait_for(what, within, |e| {
            event_status(e).is_some_and(|s| s.phase == phase)
        })
        .await
    }
}

/// A gRPC client of the launcher.
pub type Client =
    vmlauncher::api::proto::launcher_client::LauncherClient<tonic::transport::Channel>;

/// The launcher's status through `client`; the call must succeed.
pub async fn status(client: &mut Client) -> vmlauncher::api::proto::Status {
    client
        .get_status(vmlauncher::api::proto::GetStatusRequest {})
        .await
        .unwrap()
        .into_inner()
}

/// Sends `request` through `client`; the Sync must succeed (else a panic naming the step,
/// `what`). The reply.
pub async fn sync_ok(
    client: &mut Client,
    request: vmlauncher::api::proto::SyncRequest,
    what: impl std::fmt::Display,
) -> vmlauncher::api::proto::SyncResponse {
    client
        .sync(request)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e:?}"))
        .into_inner()
}

/// The spec (and block devices) the launcher last took, through `client`; the call must succeed.
pub async fn spec(client: &mut Client) -> vmlauncher::api::proto::GetSpecResponse {
    client
        .get_spec(vmlauncher::api::proto::GetSpecRequest {})
        .await
        .unwrap()
        .into_inner()
}

/// The status inside a status or resync event.
pub fn event_status(e: &vmlauncher::api::proto::Event) -> Option<&vmlauncher::api::proto::Status> {
    use vmlauncher::api::proto::event::Kind;
    match &e.kind {
        Some(Kind::Status(s)) | Some(Kind::Resync(s)) => Some(s),
        _ => None,
    }
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
        for pid in qemu_pids.chain(daemon).filter(|p| alive(*p)) {
            let _ = signal_pid(pid, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// A loop device on a file in a temp dir, detached on drop.
pub struct Loop {
    pub dev: PathBuf,
    pub major: u32,
    pub minor: u32,
}

impl Loop {
    pub fn new(dir: &Path, name: &str, mib: u64, read_only: bool) -> Loop {
        let file = dir.join(format!("{name}.raw"));
        sparse_file(&file, mib);
        let mut cmd = std::process::Command::new("losetup");
        cmd.args(["--find", "--show"]);
        if read_only {
            cmd.arg("--read-only");
        }
        let out = succeeded(cmd.arg(&file).output().expect("losetup"), "losetup");
        let dev = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
        let rdev = std::os::unix::fs::MetadataExt::rdev(&std::fs::metadata(&dev).unwrap());
        Loop {
            dev,
            major: libc::major(rdev),
            minor: libc::minor(rdev),
        }
    }

    pub fn number(&self) -> String {
        format!("{}:{}", self.major, self.minor)
    }

    /// Gives the device to a launcher the way a node daemon gives a pod one: a node of it in
    /// the launcher's hotplug dir, as `name`.
    pub fn give_to(&self, hotplug_dir: &Path, name: &str) {
        nix::sys::stat::mknod(
            &hotplug_dir.join(name),
            nix::sys::stat::SFlag::S_IFBLK,
            nix::sys::stat::Mode::from_bits_truncate(0o600),
            nix::sys::stat::makedev(self.major.into(), self.minor.into()),
        )
        .expect("mknod in the hotplug dir");
    }

    pub fn block_device(&self) -> vmlauncher::api::proto::BlockDevice {
        use vmlauncher::api::proto;
        proto::BlockDevice {
            source: Some(proto::block_device::Source::Number(proto::DeviceNumber {
                major: self.major,
                minor: self.minor,
            })),
        }
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup")
            .arg("-d")
            .arg(&self.dev)
            .status();
    }
}

/// A private libvirtd of the test's own under `dir/libvirt`, leaving QEMU's cgroups alone.
pub fn private_libvirtd(dir: &Path) -> vmlauncher::libvirt::daemon::PrivateDaemon {
    use vmlauncher::libvirt::daemon::{DaemonOptions, PrivateDaemon};
    PrivateDaemon::start(
        &dir.join("libvirt"),
        DaemonOptions {
            pod_cgroups: true,
            ..Default::default()
        },
    )
    .expect("a private libvirtd")
}

/// libvirt as the judge of an XML: `virt-xml-validate`, then `defineXML` (and undefine) on a
/// private libvirtd of its own.
pub struct LibvirtJudge {
    state: tempfile::TempDir,
    _daemon: vmlauncher::libvirt::daemon::PrivateDaemon,
    pub hv: vmlauncher::libvirt::Hypervisor,
}

impl LibvirtJudge {
    pub fn start() -> LibvirtJudge {
        let state = tempfile::tempdir().unwrap();
        let daemon = private_libvirtd(state.path());
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let hv = vmlauncher::libvirt::Hypervisor::open(daemon.uri(), tx).expect("connect to it");
        LibvirtJudge {
            state,
            _daemon: daemon,
            hv,
        }
    }

    /// Panics, naming `what`, if libvirt rejects the domain XML.
    pub fn accept(&self, what: &str, name: &str, xml: &str) {
        let file = self.state.path().join("domain.xml");
        std::fs::write(&file, xml).unwrap();
        let out = std::process::Command::new("virt-xml-validate")
            .arg(&file)
            .arg("domain")
            .output()
            .unwrap();
        succeeded(out, format_args!("{what}: virt-xml-validate"));
        self.hv.define_and_undefine(name, xml).unwrap_or_else(|e| {
            panic!(
                "{what}: libvirt refused it: {}\n{xml}",
                vmlauncher::error_chain(&e)
            )
        });
    }
}
