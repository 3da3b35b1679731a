//! The pod, for real: `podman kube play deploy/pod.yaml` (the manifest unchanged, the image
//! `scripts/build-image.sh` built), then from the host, as a node daemon would, through the
//! emptyDir that holds the socket and the hotplug dir: a stock Python gRPC client (default
//! options) hot-plugs a file disk and a loop device passed by major:minor; the guest reports both
//! serials; the device rule shows in the container's devices cgroup; removal leaves no node and
//! no rule; `podman stop` powers the guest off through ACPI and the container exits 0.
//!
//! `scripts/test.sh` builds the image before `cargo test`; run `scripts/build-image.sh` first
//! when running this test alone.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{Loop, BOOT_DEADLINE, GUEST_DEADLINE};

const CONTAINER: &str = "vmlauncher-launcher";
const IMAGE: &str = "localhost/vmlauncher:dev";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn podman(args: &[&str]) -> std::process::Output {
    Command::new("podman")
        .args(args)
        .env("CONTAINERS_CONF", repo().join("deploy/containers.conf"))
        .stdin(Stdio::null())
        .output()
        .expect("run podman (scripts/setup.sh installs it)")
}

fn podman_ok(args: &[&str]) -> String {
    let out = podman(args);
    assert!(
        out.status.success(),
        "podman {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn python_client(args: &[&str]) -> serde_json::Value {
    let python = std::env::var_os("VMLAUNCHER_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/vmlauncher/python/bin/python3"));
    let out = Command::new(python)
        .arg(repo().join("tests/python/launcher_client.py"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run the Python client (scripts/setup.sh makes its venv)");
    assert!(
        out.status.success(),
        "python client {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Removes the pod and its volumes, now and when the test ends.
struct PlayedPod;

impl PlayedPod {
    fn down() {
        let yaml = repo().join("deploy/pod.yaml");
        let _ = podman(&["kube", "down", yaml.to_str().unwrap()]);
        let _ = podman(&["volume", "rm", "-f", "launcher", "vmlauncher-vm"]);
    }
}

impl Drop for PlayedPod {
    fn drop(&mut self) {
        Self::down();
    }
}

/// The container's log (the launcher's lines and the guest's console), line by line.
struct Logs(mpsc::Receiver<String>);

impl Logs {
    fn follow() -> Logs {
        let mut child = Command::new("podman")
            .args(["logs", "-f", CONTAINER])
            .env("CONTAINERS_CONF", repo().join("deploy/containers.conf"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, rx) = mpsc::channel();
        for out in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        std::thread::spawn(move || child.wait());
        Logs(rx)
    }

    fn wait_for(&self, what: &str, within: Duration, wanted: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.0.recv_timeout(left) {
                Ok(line) if wanted(&line) => return line,
                Ok(_) => {}
                Err(e) => panic!("no log line {what} within {within:?}: {e}"),
            }
        }
    }
}

/// The container's device cgroup (v1) on the host.
fn devices_list() -> String {
    let pid = podman_ok(&["inspect", "--format", "{{.State.Pid}}", CONTAINER]);
    let cgroups = std::fs::read_to_string(format!("/proc/{}/cgroup", pid.trim())).unwrap();
    let path = cgroups
        .lines()
        .find_map(|l| l.split_once(":devices:").map(|(_, p)| p.to_string()))
        .expect("a v1 devices cgroup");
    std::fs::read_to_string(format!("/sys/fs/cgroup/devices{path}/devices.list")).unwrap()
}

fn spec(disks: &[(&str, &str)]) -> String {
    let mut text = String::from(
        "apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: pod-vm
spec:
  terminationGracePeriodSeconds: 60
  domain:
    memory:
      guest: 256Mi
    firmware:
      kernelBoot:
        kernelArgs: console=ttyS0 loglevel=1
        container:
          kernelPath: /var/cache/vmlauncher/test-guest/vmlinuz
          initrdPath: /var/cache/vmlauncher/test-guest/initrd.img
    devices:
      disks:
",
    );
    for (name, serial) in disks {
        text += &format!("      - {{name: {name}, disk: {{bus: scsi}}, serial: {serial}}}\n");
    }
    text += "  volumes:\n";
    for (name, _) in disks {
        text += &format!(
            "  - {{name: {name}, persistentVolumeClaim: {{claimName: {name}, hotpluggable: true}}}}\n"
        );
    }
    if disks.is_empty() {
        text = text.replace("disks:\n", "disks: []\n");
        text = text.replace("volumes:\n", "volumes: []\n");
    }
    text
}

#[test]
fn the_pod_manifest_runs_and_hotplug_works_inside_the_container() {
    let images = podman_ok(&["images", "--format", "{{.Repository}}:{{.Tag}}"]);
    assert!(
        images.lines().any(|i| i == IMAGE),
        "no {IMAGE}: run scripts/build-image.sh (scripts/test.sh does)"
    );
    PlayedPod::down();
    let _pod = PlayedPod;
    let yaml = repo().join("deploy/pod.yaml");
    podman_ok(&["kube", "play", yaml.to_str().unwrap()]);
    let logs = Logs::follow();
    let running = logs.wait_for("phase Running", BOOT_DEADLINE, |l| {
        l.contains("phase Running")
    });
    eprintln!("{running}");
    logs.wait_for("the guest's boot line", BOOT_DEADLINE, |l| {
        l.contains("VMLTEST-BOOTED")
    });

    // The node daemon's view: the emptyDir on the host.
    let shared = PathBuf::from(
        podman_ok(&[
            "volume",
            "inspect",
            "--format",
            "{{.Mountpoint}}",
            "launcher",
        ])
        .trim(),
    );
    let socket = shared.join("launcher.sock");
    let socket = socket.to_str().unwrap();
    assert_eq!(
        python_client(&["health", socket])["status"],
        "SERVING",
        "health through the pod's socket"
    );

    let work = tempfile::tempdir().unwrap();
    std::fs::File::create(shared.join("hotplug-disks/data.img"))
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let block = Loop::new(work.path(), "pod-blk", 16, false);
    let with_both = work.path().join("both.yaml");
    std::fs::write(
        &with_both,
        spec(&[("data", "PODFILE-1"), ("blk", "PODBLK-1")]),
    )
    .unwrap();
    let synced = python_client(&[
        "sync",
        socket,
        with_both.to_str().unwrap(),
        "--block",
        &format!("blk={}", block.number()),
        "--ready",
        "data",
        "--ready",
        "blk",
    ]);
    eprintln!("{synced}");
    let disks = logs.wait_for("the guest reporting both disks", GUEST_DEADLINE, |l| {
        l.contains("VMLTEST-DISKS") && l.contains(":PODFILE-1:") && l.contains(":PODBLK-1:")
    });
    eprintln!("{disks}");
    let rule = format!("b {} rwm", block.number());
    assert!(
        devices_list().lines().any(|l| l == rule),
        "{rule} not in the container's devices.list"
    );
    let node = shared.join("hotplug-disks/blk");
    assert!(node.exists(), "the launcher made {}", node.display());

    let without = work.path().join("none.yaml");
    std::fs::write(&without, spec(&[])).unwrap();
    python_client(&[
        "sync",
        socket,
        without.to_str().unwrap(),
        "--gone",
        "data",
        "--gone",
        "blk",
    ]);
    logs.wait_for("the guest reporting no disk", GUEST_DEADLINE, |l| {
        l.trim() == "[console] VMLTEST-DISKS"
    });
    assert!(!node.exists(), "the node is gone");
    assert!(
        !devices_list().lines().any(|l| l == rule),
        "the rule is gone"
    );

    // podman stop: SIGTERM to PID 1 -> ACPI power-off -> exit 0 (README's table).
    podman_ok(&["stop", "-t", "90", CONTAINER]);
    logs.wait_for("the guest's ACPI power-off", GUEST_DEADLINE, |l| {
        l.contains("VMLTEST-ACPI-POWEROFF")
    });
    let code = podman_ok(&["inspect", "--format", "{{.State.ExitCode}}", CONTAINER]);
    assert_eq!(code.trim(), "0", "the container's exit code");
}
