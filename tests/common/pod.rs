//! The pod harness: podman with the project's `deploy/containers.conf`, a manifest played with
//! `podman kube play` and taken down when the test ends, and the container's log line by line.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The launcher's container in `deploy/pod.yaml` (pod `vmlauncher`, container `launcher`).
pub const CONTAINER: &str = "vmlauncher-launcher";
pub const IMAGE: &str = "localhost/vmlauncher:dev";

pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

pub fn podman(args: &[&str]) -> Output {
    Command::new("podman")
        .args(args)
        .env("CONTAINERS_CONF", repo().join("deploy/containers.conf"))
        .stdin(Stdio::null())
        .output()
        .expect("run podman (scripts/setup.sh installs it)")
}

pub fn podman_ok(args: &[&str]) -> String {
    let out = super::succeeded(podman(args), format_args!("podman {args:?}"));
    String::from_utf8(out.stdout).unwrap()
}

/// A pod played from `manifest`; removed with its volumes before it is played and when the
/// test ends.
pub struct PlayedPod {
    manifest: PathBuf,
}

impl PlayedPod {
    pub fn play(manifest: &Path) -> PlayedPod {
        let images = podman_ok(&["images", "--format", "{{.Repository}}:{{.Tag}}"]);
        assert!(
            images.lines().any(|i| i == IMAGE),
            "no {IMAGE}: run scripts/build-image.sh (scripts/test.sh does)"
        );
        let pod = PlayedPod {
            manifest: manifest.to_path_buf(),
        };
        pod.down();
        podman_ok(&["kube", "play", manifest.to_str().unwrap()]);
        pod
    }

    fn down(&self) {
        let _ = podman(&["kube", "down", self.manifest.to_str().unwrap()]);
        let _ = podman(&["volume", "rm", "-f", "launcher", "vmlauncher-vm"]);
    }

    /// The `launcher` emptyDir (socket, hotplug dir) as a node daemon sees it: on the host.
    pub fn shared_dir(&self) -> PathBuf {
        let dir = podman_ok(&[
            "volume",
            "inspect",
            "--format",
            "{{.Mountpoint}}",
            "launcher",
        ]);
        PathBuf::from(dir.trim())
    }
}

impl Drop for PlayedPod {
    fn drop(&mut self) {
        self.down();
    }
}

/// The container's log (the launcher's lines and the guest's console), line by line.
pub struct Logs(mpsc::Receiver<String>);

impl Logs {
    pub fn follow() -> Logs {
        Self::follow_container(CONTAINER)
    }

    /// The log of the container `name`.
    pub fn follow_container(name: &str) -> Logs {
        let mut child = Command::new("podman")
            .args(["logs", "-f", name])
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

    pub fn wait_for(&self, what: &str, within: Duration, wanted: impl Fn(&str) -> bool) -> String {
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

/// The pod's infra container, which holds its network namespace.
pub fn infra_container() -> String {
    podman_ok(&[
        "pod",
        "inspect",
        "--format",
        "{{.InfraContainerID}}",
        "vmlauncher",
    ])
    .trim()
    .to_string()
}

/// The process of the pod's infra container: its network namespace is the pod's.
pub fn infra_pid() -> u32 {
    podman_ok(&["inspect", "--format", "{{.State.Pid}}", &infra_container()])
        .trim()
        .parse()
        .unwrap()
}
