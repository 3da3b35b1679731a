//! The pod harness: podman with the project's `deploy/containers.conf`, a manifest played with
//! `podman kube play` and taken down when the test ends, and the container's log line by line.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

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

/// A pod played from a manifest under names of its own: the pod, each ConfigMap and each
/// emptyDir volume get the suffix `-<pid>-<n>` ([`super::unique`]), so the tests of one binary,
/// which run side by side, each play their own pod (its containers are `<pod>-<container>`).
/// Taken down with its volumes when the test ends; what an earlier run that was killed left (its
/// pid gone) is taken down before the pod is played.
pub struct PlayedPod {
    /// Where the renamed manifest is, for `podman kube down`.
    dir: tempfile::TempDir,
    pub name: String,
    /// The podman volumes the pod's emptyDirs and ConfigMaps became: `(name in the manifest,
    /// podman's name)`.
    volumes: Vec<(String, String)>,
}

impl PlayedPod {
    pub fn play(manifest: &Path) -> PlayedPod {
        let images = podman_ok(&["images", "--format", "{{.Repository}}:{{.Tag}}"]);
        assert!(
            images.lines().any(|i| i == IMAGE),
            "no {IMAGE}: run scripts/build-image.sh (scripts/test.sh does)"
        );
        let text = std::fs::read_to_string(manifest)
            .unwrap_or_else(|e| panic!("{}: {e}", manifest.display()));
        let renamed = Renamed::of(&text, &super::unique());
        remove_leftovers(&renamed.pod_base, &renamed.volumes);
        let dir = tempfile::Builder::new()
            .prefix("vml-pod-")
            .tempdir()
            .unwrap();
        std::fs::write(dir.path().join("pod.yaml"), &renamed.text).unwrap();
        let pod = PlayedPod {
            dir,
            name: renamed.pod,
            volumes: renamed.volumes,
        };
        podman_ok(&["kube", "play", pod.manifest().to_str().unwrap()]);
        pod
    }

    fn manifest(&self) -> PathBuf {
        self.dir.path().join("pod.yaml")
    }

    fn down(&self) {
        let _ = podman(&["kube", "down", self.manifest().to_str().unwrap()]);
        let _volumes = VOLUMES
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut rm = vec!["volume", "rm", "-f"];
        rm.extend(self.volumes.iter().map(|(_, podman)| podman.as_str()));
        let _ = podman(&rm);
    }

    /// The podman name of the manifest's container `name`.
    pub fn container(&self, name: &str) -> String {
        format!("{}-{name}", self.name)
    }

    /// The launcher's container in `deploy/pod.yaml` (container `launcher`).
    pub fn launcher(&self) -> String {
        self.container("launcher")
    }

    /// The podman volume of the manifest's emptyDir or ConfigMap `name`.
    pub fn volume(&self, name: &str) -> String {
        let (_, volume) = self
            .volumes
            .iter()
            .find(|(manifest, _)| manifest == name)
            .unwrap_or_else(|| panic!("no volume {name} in {:?}", self.volumes));
        volume.clone()
    }

    /// The `launcher` emptyDir (socket, hotplug dir) as a node daemon sees it: on the host.
    pub fn shared_dir(&self) -> PathBuf {
        let dir = podman_ok(&[
            "volume",
            "inspect",
            "--format",
            "{{.Mountpoint}}",
            &self.volume("launcher"),
        ]);
        PathBuf::from(dir.trim())
    }

    /// The log of the manifest's container `name`.
    pub fn logs(&self, container: &str) -> Logs {
        Logs::follow_container(&self.container(container))
    }

    /// The pod's infra container, which holds its network namespace.
    pub fn infra_container(&self) -> String {
        podman_ok(&[
            "pod",
            "inspect",
            "--format",
            "{{.InfraContainerID}}",
            &self.name,
        ])
        .trim()
        .to_string()
    }

    /// The process of the pod's infra container: its network namespace is the pod's.
    pub fn infra_pid(&self) -> u32 {
        podman_ok(&[
            "inspect",
            "--format",
            "{{.State.Pid}}",
            &self.infra_container(),
        ])
        .trim()
        .parse()
        .unwrap()
    }
}

impl Drop for PlayedPod {
    fn drop(&mut self) {
        self.down();
    }
}

/// A manifest with every name a pod takes on the host suffixed.
struct Renamed {
    text: String,
    pod: String,
    pod_base: String,
    volumes: Vec<(String, String)>,
}

impl Renamed {
    fn of(text: &str, suffix: &str) -> Renamed {
        use serde::Deserialize;
        use serde_yaml_ng::Value;
        let mut docs: Vec<Value> = serde_yaml_ng::Deserializer::from_str(text)
            .map(|d| Value::deserialize(d).expect("a YAML manifest"))
            .filter(|d| !d.is_null())
            .collect();
        let new = |name: &str| format!("{name}-{suffix}");
        let name_of = |v: &Value| v["name"].as_str().expect("a name").to_string();
        let mut config_maps = Vec::new();
        let mut volumes = Vec::new();
        for doc in docs.iter_mut().filter(|d| d["kind"] == "ConfigMap") {
            let name = name_of(&doc["metadata"]);
            doc["metadata"]["name"] = new(&name).into();
            volumes.push((name.clone(), new(&name)));
            config_maps.push(name);
        }
        let mut pods = docs.iter_mut().filter(|d| d["kind"] == "Pod");
        let pod = pods.next().expect("a Pod in the manifest");
        assert!(pods.next().is_none(), "one Pod in the manifest");
        let pod_base = name_of(&pod["metadata"]);
        pod["metadata"]["name"] = new(&pod_base).into();
        let mut mounts_renamed = Vec::new();
        if let Some(list) = pod["spec"]["volumes"].as_sequence_mut() {
            for volume in list {
                let name = name_of(volume);
                if volume.get("emptyDir").is_some() {
                    volume["name"] = new(&name).into();
                    volumes.push((name.clone(), new(&name)));
                    mounts_renamed.push(name);
                } else if let Some(map) = volume.get_mut("configMap") {
                    let map_name = name_of(map);
                    if config_maps.contains(&map_name) {
                        map["name"] = new(&map_name).into();
                    }
                }
            }
        }
        for containers in ["initContainers", "containers"] {
            let Some(list) = pod["spec"][containers].as_sequence_mut() else {
                continue;
            };
            for mount in list
                .iter_mut()
                .filter_map(|c| c.get_mut("volumeMounts")?.as_sequence_mut())
                .flatten()
            {
                let name = name_of(mount);
                if mounts_renamed.contains(&name) {
                    mount["name"] = new(&name).into();
                }
            }
        }
        let text = docs
            .iter()
            .map(|d| serde_yaml_ng::to_string(d).unwrap())
            .collect::<Vec<_>>()
            .join("---\n");
        Renamed {
            text,
            pod: new(&pod_base),
            pod_base,
            volumes,
        }
    }
}

/// Held while this process lists or removes podman volumes: `podman volume ls` fails ("no such
/// volume") when a volume it listed is removed before it reads it, and the tests of one binary
/// take their pods down side by side.
static VOLUMES: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Takes down the pods `<pod_base>-<pid>-<n>` and volumes `<volume_base>-<pid>-<n>` whose test
/// process is gone: what a run that was killed before its drops ran left behind.
fn remove_leftovers(pod_base: &str, volumes: &[(String, String)]) {
    let stale = |name: &str, base: &str| {
        name.strip_prefix(base)
            .and_then(|rest| rest.strip_prefix('-'))
            .and_then(|rest| rest.split_once('-'))
            .filter(|(pid, n)| n.parse::<u32>().is_ok() && pid.parse::<u32>().is_ok())
            .is_some_and(|(pid, _)| !Path::new("/proc").join(pid).exists())
    };
    for pod in podman_ok(&["pod", "ls", "--format", "{{.Name}}"]).lines() {
        if stale(pod, pod_base) {
            let _ = podman(&["pod", "rm", "-f", pod]);
        }
    }
    let _volumes = VOLUMES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    for volume in podman_ok(&["volume", "ls", "--format", "{{.Name}}"]).lines() {
        if volumes.iter().any(|(base, _)| stale(volume, base)) {
            let _ = podman(&["volume", "rm", "-f", volume]);
        }
    }
}

/// The container's log (the launcher's lines and the guest's console), line by line.
pub struct Logs(mpsc::Receiver<String>);

impl Logs {
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
