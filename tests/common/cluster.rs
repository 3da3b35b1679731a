//! A real KubeVirt node on this machine (`../shared/kubevirt-cluster`): etcd, kube-apiserver with
//! KubeVirt's CRDs, and KubeVirt's own virt-handler, unmodified, prebuilt. The harness plays only
//! what is faked there: virt-controller (a VMI's finalizer and its `Scheduled` status with the
//! launcher pod, one `kubectl patch`; the finalizer taken off once the VMI is final) and the
//! kubelet (the launcher pod under `podman kube play`, its `sockets` emptyDir a host dir at the
//! kubelet's layout, its containerDisk a file where KubeVirt's image volume puts it).
//!
//! Everything a test asserts comes from what KubeVirt writes: the VMI as kube-apiserver serves it
//! (watched, every version kept), virt-handler's log and its REST answers, and the guest's console.

use std::collections::VecDeque;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::pod::{podman, repo, IMAGE};
pub use super::unique;

/// How long the cluster's scripts may take (etcd, kube-apiserver, CRDs, virt-handler).
const UP_WITHIN: Duration = Duration::from_secs(240);

/// The cluster's scripts and prebuilt binaries: `VMLAUNCHER_KUBEVIRT_CLUSTER`, else
/// `shared/kubevirt-cluster` beside the checkout or in `/work/shared`. Missing is a failure.
pub fn cluster_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("VMLAUNCHER_KUBEVIRT_CLUSTER") {
        return PathBuf::from(dir);
    }
    let beside = repo().join("../shared/kubevirt-cluster");
    [beside, PathBuf::from("/work/shared/kubevirt-cluster")]
        .into_iter()
        .find(|d| d.join("cluster-up.sh").exists())
        .expect("no kubevirt-cluster (../shared/kubevirt-cluster or VMLAUNCHER_KUBEVIRT_CLUSTER)")
}

/// The node: brought up once per test binary, torn down (with every pod it played) on drop.
#[derive(Debug)]
pub struct Cluster {
    scripts: PathBuf,
    /// The cluster's RUN dir: kubeconfig, logs, the node's dirs (`node/pods` is virt-handler's
    /// `/pods`).
    pub run: PathBuf,
    kubectl: PathBuf,
    /// A client certificate virt-handler's REST server takes (its CA in `kubevirt-ca`).
    rest_cert: PathBuf,
    rest_key: PathBuf,
}

impl Cluster {
    /// Stops what a previous run may have left, then brings the cluster and virt-handler up.
    pub fn up() -> Cluster {
        let scripts = cluster_dir();
        let root = PathBuf::from(
            std::env::var_os("CLUSTER_ROOT").unwrap_or("/var/tmp/kubevirt-cluster".into()),
        );
        let run = root.join("run-e2e");
        let cluster = Cluster {
            kubectl: root.join("bin/kubectl"),
            rest_cert: run.join("rest-client/tls.crt"),
            rest_key: run.join("rest-client/tls.key"),
            scripts,
            run,
        };
        cluster.down();
        let _ = std::fs::remove_dir_all(&cluster.run);
        std::fs::create_dir_all(&cluster.run).unwrap();
        // cluster-up.sh's `kubectl wait --for condition=established crd --all` fails at once
        // when it reads a CRD before its first status (".status.conditions accessor error"):
        // the script is idempotent, so a second run waits again on what the first started.
        let mut tries = 0;
        while let Err(why) = cluster.script(&cluster.scripts.join("cluster-up.sh"), &[]) {
            tries += 1;
            assert!(tries < 3, "the cluster cannot come up: {why}");
            eprintln!("cluster-up.sh failed; once more: {why}");
        }
        // virt-handler with the mount propagation of KubeVirt's DaemonSet, which the hot-plug
        // path needs: tests/kubevirt-node/handler-up.sh says how it differs from the cluster's
        // own handler-up.sh, and why.
        let handler_up = repo().join("tests/kubevirt-node/handler-up.sh");
        cluster
            .script(&handler_up, &[cluster.scripts.as_os_str()])
            .unwrap_or_else(|why| panic!("virt-handler cannot come up: {why}"));
        cluster.trust_rest_client();
        cluster
    }

    fn script(&self, path: &Path, args: &[&std::ffi::OsStr]) -> Result<(), String> {
        let name = path.file_name().unwrap().to_string_lossy();
        let started = Instant::now();
        let out = Command::new("timeout")
            .arg(UP_WITHIN.as_secs().to_string())
            .arg(path)
            .args(args)
            .env("RUN", &self.run)
            .env("CONTAINERS_CONF", repo().join("deploy/containers.conf"))
            .current_dir(repo())
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        if !out.status.success() {
            let tail = |b: &[u8]| {
                let text = String::from_utf8_lossy(b).to_string();
                let lines: Vec<&str> = text.lines().collect();
                lines[lines.len().saturating_sub(15)..].join("\n")
            };
            return Err(format!(
                "{name}: {}\n{}\n{}",
                out.status,
                tail(&out.stdout),
                tail(&out.stderr)
            ));
        }
        eprintln!("{name}: {:.1} s", started.elapsed().as_secs_f64());
        Ok(())
    }

    /// Stops the cluster's processes and every launcher pod this harness played.
    fn down(&self) {
        for pod in std::fs::read_dir(self.run.join("pods"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let _ = podman(&["kube", "down", pod.path().to_str().unwrap()]);
        }
        let _ = Command::new(self.scripts.join("cluster-down.sh"))
            .env("RUN", &self.run)
            .env("CONTAINERS_CONF", repo().join("deploy/containers.conf"))
            .current_dir(repo())
            .stdin(Stdio::null())
            .output();
        // The node dir's shared mount (tests/kubevirt-node/handler-up.sh), with any hot-plug
        // mount virt-handler left under it.
        let _ = Command::new("umount")
            .args(["--recursive", "--lazy"])
            .arg(self.run.join("node"))
            .stderr(Stdio::null())
            .status();
    }

    pub fn kubectl(&self, args: &[&str]) -> Output {
        Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(self.run.join("admin.kubeconfig"))
            .arg("--request-timeout=60s")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// A JSON patch of the VMI `name`, as virt-controller and users write them.
    pub fn json_patch(&self, namespace: &str, name: &str, patch: &Value) {
        self.kubectl_ok(&[
            "-n",
            namespace,
            "patch",
            "vmi",
            name,
            "--type=json",
            "-p",
            &patch.to_string(),
        ]);
    }

    /// `kubectl create` of `manifest` (YAML or JSON).
    pub fn create(&self, manifest: &str) {
        let path = self.run.join(format!("create-{}.yaml", unique()));
        std::fs::write(&path, manifest).unwrap();
        self.kubectl_ok(&["create", "-f", path.to_str().unwrap()]);
    }

    pub fn handler_log_path(&self) -> PathBuf {
        self.run.join("logs/virt-handler.log")
    }

    /// virt-handler's log lines about the VMI `name` (its JSON lines carry the name).
    pub fn handler_lines(&self, name: &str) -> Vec<Value> {
        let text = std::fs::read_to_string(self.handler_log_path()).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|l| {
                l["name"] == name
                    || l["msg"]
                        .as_str()
                        .is_some_and(|m| m.contains(&format!("/{name}")))
            })
            .collect()
    }

    /// The lines about `name` that say `msg` (exactly), logged at `since` (RFC 3339, UTC) or later.
    pub fn handler_said_since(&self, name: &str, msg: &str, since: &str) -> usize {
        self.handler_lines(name)
            .iter()
            .filter(|l| l["msg"] == msg && l["timestamp"].as_str().is_some_and(|t| t >= since))
            .count()
    }

    /// How many lines about `name` say `msg` (exactly).
    pub fn handler_count(&self, name: &str, msg: &str) -> usize {
        self.handler_lines(name)
            .iter()
            .filter(|l| l["msg"] == msg)
            .count()
    }

    /// Waits until virt-handler's log has more than `after` lines about `name` that say `msg`;
    /// woken by each write to the log.
    pub fn wait_handler(&self, name: &str, msg: &str, after: usize, within: Duration) {
        let logs = self.run.join("logs");
        let held =
            vmlauncher::host::watch::wait_for_change_in(&[&logs], Instant::now() + within, || {
                self.handler_count(name, msg) > after
            })
            .unwrap();
        assert!(
            held,
            "virt-handler did not log {msg:?} for {name} within {within:?}; its lines:\n{}",
            self.handler_digest(name)
        );
    }

    /// virt-handler's failures about the VMI: a sync that failed, and every error or warning
    /// line that names it, but the API server's optimistic-concurrency conflict on a status
    /// update (virt-handler's informer cache was one version behind; it retries with the next
    /// one, and the VMI's versions are checked by the tests themselves).
    pub fn handler_failures(&self, name: &str) -> Vec<String> {
        const CONFLICT: &str = "the object has been modified; please apply your changes to the latest version and try again";
        self.handler_lines(name)
            .iter()
            .filter(|l| {
                l["msg"] == "Synchronizing the VirtualMachineInstance failed."
                    || ((l["level"] == "error" || l["level"] == "warning")
                        && !(l["msg"] == "Updating the VirtualMachineInstance status failed."
                            && l["reason"].as_str().is_some_and(|r| r.contains(CONFLICT))))
            })
            .map(|l| l.to_string())
            .collect()
    }

    /// The last lines about `name`, their level, message and reason, for a failure's message.
    pub fn handler_digest(&self, name: &str) -> String {
        let lines = self.handler_lines(name);
        lines[lines.len().saturating_sub(40)..]
            .iter()
            .map(|l| {
                format!(
                    "  {} {} {} {}\n",
                    l["timestamp"].as_str().unwrap_or(""),
                    l["level"].as_str().unwrap_or(""),
                    l["msg"].as_str().unwrap_or(""),
                    l["reason"].as_str().unwrap_or("")
                )
            })
            .collect()
    }

    /// Makes a CA and a client certificate as virt-operator's `kubevirt-virt-handler-certs`
    /// (CN `kubevirt.io:system:client:virt-handler`, client auth), and publishes the CA where
    /// virt-handler's REST server takes its client CAs from: ConfigMap `kubevirt-ca`.
    fn trust_rest_client(&self) {
        let dir = self.rest_cert.parent().unwrap();
        std::fs::create_dir_all(dir).unwrap();
        let ca_key = dir.join("ca.key");
        let ca = dir.join("ca.crt");
        let csr = dir.join("client.csr");
        let ext = dir.join("client.ext");
        std::fs::write(
            &ext,
            "extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n",
        )
        .unwrap();
        let p = |p: &Path| p.to_str().unwrap().to_string();
        for args in [
            vec![
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                "/CN=vmlauncher-test-ca",
                "-keyout",
                &p(&ca_key),
                "-out",
                &p(&ca),
            ],
            vec![
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                "/CN=kubevirt.io:system:client:virt-handler",
                "-keyout",
                &p(&self.rest_key),
                "-out",
                &p(&csr),
            ],
            vec![
                "x509",
                "-req",
                "-in",
                &p(&csr),
                "-CA",
                &p(&ca),
                "-CAkey",
                &p(&ca_key),
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &p(&ext),
                "-out",
                &p(&self.rest_cert),
            ],
        ] {
            let out = Command::new("openssl").args(&args).output().unwrap();
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        self.kubectl_ok(&[
            "-n",
            "kubevirt",
            "create",
            "configmap",
            "kubevirt-ca",
            &format!("--from-file=ca-bundle={}", p(&ca)),
        ]);
    }

    /// virt-handler's console server for the VMI (`console` or `vnc`), as virt-api reaches it.
    pub fn websocket(
        &self,
        namespace: &str,
        name: &str,
        verb: &str,
    ) -> super::websocket::WebSocket {
        super::websocket::WebSocket::open(
            "127.0.0.1:8186",
            &format!("/v1/namespaces/{namespace}/virtualmachineinstances/{name}/{verb}?preserveSession=false"),
            &self.rest_cert,
            &self.rest_key,
        )
    }

    /// A call to virt-handler's REST server (loopback, port 8186) as virt-api makes it, with
    /// the client certificate: the HTTP status and the body.
    pub fn rest(
        &self,
        method: &str,
        namespace: &str,
        name: &str,
        verb: &str,
        body: Option<&str>,
    ) -> (u16, String) {
        let url = format!(
            "https://127.0.0.1:8186/v1/namespaces/{namespace}/virtualmachineinstances/{name}/{verb}"
        );
        let mut cmd = Command::new("curl");
        cmd.args([
            "-sS",
            "-k",
            "--max-time",
            "90",
            "-X",
            method,
            "-w",
            "\n%{http_code}",
        ])
        .arg("--cert")
        .arg(&self.rest_cert)
        .arg("--key")
        .arg(&self.rest_key);
        if let Some(body) = body {
            cmd.args(["-H", "Content-Type: application/json", "-d", body]);
        }
        let out = cmd.arg(&url).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        let code = code.trim().parse().unwrap_or_else(|_| {
            panic!(
                "{method} {url}: no HTTP answer: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (code, body.to_string())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.down();
    }
}

/// Every version of one VMI as kube-apiserver serves it (`kubectl get --watch`), kept in order.
#[derive(Debug)]
pub struct VmiWatch {
    pub namespace: String,
    pub name: String,
    seen: Arc<Mutex<Vec<Value>>>,
    changed: mpsc::Receiver<()>,
    child: Child,
}

impl VmiWatch {
    pub fn start(cluster: &Cluster, namespace: &str, name: &str) -> VmiWatch {
        let mut child = Command::new(&cluster.kubectl)
            .arg("--kubeconfig")
            .arg(cluster.run.join("admin.kubeconfig"))
            .args([
                "-n",
                namespace,
                "get",
                "vmi",
                name,
                "-o",
                "json",
                "--watch",
                "--output-watch-events",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (tx, changed) = mpsc::channel();
        let keep = seen.clone();
        std::thread::spawn(move || {
            let events =
                serde_json::Deserializer::from_reader(BufReader::new(stdout)).into_iter::<Value>();
            for event in events.map_while(Result::ok) {
                keep.lock().unwrap().push(event);
                if tx.send(()).is_err() {
                    break;
                }
            }
        });
        VmiWatch {
            namespace: namespace.into(),
            name: name.into(),
            seen,
            changed,
            child,
        }
    }

    /// How many versions were seen so far: a mark for [`VmiWatch::since`].
    pub fn mark(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    /// Every version seen from `mark` on (deletions left out).
    pub fn since(&self, mark: usize) -> Vec<Value> {
        let seen = self.seen.lock().unwrap();
        seen[mark.min(seen.len())..]
            .iter()
            .filter(|e| e["type"] != "DELETED")
            .map(|e| e["object"].clone())
            .collect()
    }

    /// The latest version (None once deleted, or before the first).
    pub fn latest(&self) -> Option<Value> {
        let seen = self.seen.lock().unwrap();
        let last = seen.last()?;
        (last["type"] != "DELETED").then(|| last["object"].clone())
    }

    /// Waits for a version for which `wanted` holds (the latest one is looked at first).
    pub fn until(&self, what: &str, within: Duration, wanted: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + within;
        loop {
            if let Some(vmi) = self.latest().filter(|v| wanted(v)) {
                return vmi;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if self.changed.recv_timeout(left).is_err() {
                panic!(
                    "the VMI {} never was {what} within {within:?}; its last version:\n{}",
                    self.name,
                    serde_json::to_string_pretty(&self.latest()).unwrap()
                );
            }
        }
    }

    /// Waits for the phase `phase`.
    pub fn phase(&self, phase: &str, within: Duration) -> Value {
        self.until(&format!("in phase {phase}"), within, |v| {
            v["status"]["phase"] == phase
        })
    }

    /// Waits until the VMI is gone.
    pub fn gone(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            if self
                .seen
                .lock()
                .unwrap()
                .last()
                .is_some_and(|e| e["type"] == "DELETED")
            {
                return;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                self.changed.recv_timeout(left).is_ok(),
                "the VMI {} is not gone within {within:?}",
                self.name
            );
        }
    }

    /// Every `Synchronized=False` condition any version carried: virt-handler's sync failed.
    pub fn sync_failures(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .flat_map(|e| {
                e["object"]["status"]["conditions"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .filter(|c| c["type"] == "Synchronized" && c["status"] == "False")
            .map(|c| c.to_string())
            .collect()
    }

    /// The phases the volume `name` went through in the VMI's status, in order, each once.
    pub fn volume_phases(&self, name: &str) -> Vec<String> {
        let mut phases: Vec<String> = Vec::new();
        for e in self.seen.lock().unwrap().iter() {
            let volumes = e["object"]["status"]["volumeStatus"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let phase = volumes
                .iter()
                .find(|v| v["name"] == name)
                .and_then(|v| v["phase"].as_str().map(String::from));
            if let Some(p) = phase.filter(|p| phases.last() != Some(p)) {
                phases.push(p);
            }
        }
        phases
    }

    /// The phases the VMI went through, in order, each once.
    pub fn phases(&self) -> Vec<String> {
        let mut phases: Vec<String> = Vec::new();
        for e in self.seen.lock().unwrap().iter() {
            if let Some(p) = e["object"]["status"]["phase"].as_str() {
                if phases.last().map(String::as_str) != Some(p) {
                    phases.push(p.to_string());
                }
            }
        }
        phases
    }
}

impl Drop for VmiWatch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A VMI's condition of `kind`, if it has one.
pub fn condition<'a>(vmi: &'a Value, kind: &str) -> Option<&'a Value> {
    vmi["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

/// The launcher pod of one VMI, as KubeVirt's virt-controller would have the kubelet run it:
/// the `compute` container running `/usr/bin/virt-launcher-monitor` with virt-launcher's flags.
#[derive(Debug)]
pub struct LauncherPod {
    manifest: PathBuf,
    pub container: String,
    pub uid: String,
    /// The `sockets` emptyDir on the host, where virt-handler looks for `launcher-sock`.
    pub sockets: PathBuf,
    /// The guest's console log, KubeVirt's `virt-serial0-log` in the `private` emptyDir (read
    /// from the host: it outlives the container, whose last lines a reader inside would lose).
    console_log: PathBuf,
    /// The `hotplug-disks` emptyDir on the host, where virt-handler mounts a hot-plugged volume's
    /// image as `<volume>.img`.
    pub hotplug: PathBuf,
}

impl LauncherPod {
    /// Plays the pod for the VMI `name` (uid `vmi_uid`) with `disk` as its containerDisk and
    /// waits until the launcher serves on `launcher-sock`.
    pub fn play(
        cluster: &Cluster,
        namespace: &str,
        name: &str,
        vmi_uid: &str,
        disk: &Path,
    ) -> LauncherPod {
        let images =
            String::from_utf8(podman(&["images", "--format", "{{.Repository}}:{{.Tag}}"]).stdout)
                .unwrap();
        assert!(
            images.lines().any(|i| i == IMAGE),
            "no {IMAGE}: run scripts/build-image.sh (scripts/test.sh does)"
        );
        let uid = uuid();
        // The pod's emptyDirs where the kubelet keeps them (virt-handler's `/pods`).
        let empty_dir = |name: &str| {
            let dir = cluster.run.join(format!(
                "node/pods/{uid}/volumes/kubernetes.io~empty-dir/{name}"
            ));
            std::fs::create_dir_all(&dir).unwrap();
            dir
        };
        let sockets = empty_dir("sockets");
        let private = empty_dir("private");
        let hotplug = empty_dir("hotplug-disks");
        std::fs::create_dir_all(cluster.run.join("pods")).unwrap();
        let pod = format!("virt-launcher-{name}");
        let manifest = cluster.run.join(format!("pods/{pod}.yaml"));
        std::fs::write(
            &manifest,
            format!(
                r#"apiVersion: v1
kind: Pod
metadata:
  name: {pod}
  labels: {{kubevirt.io: virt-launcher, kubevirt.io/created-by: "{vmi_uid}"}}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 60
  containers:
    - name: compute
      image: {IMAGE}
      command: ["/usr/bin/virt-launcher-monitor"]
      args: [--qemu-timeout, 5m, --name, {name}, --uid, "{vmi_uid}", --namespace, {namespace},
             --kubevirt-share-dir, /var/run/kubevirt, --ephemeral-disk-dir, /var/run/kubevirt-ephemeral-disks,
             --container-disk-dir, /var/run/kubevirt/container-disks, --grace-period-seconds, "45",
             --hook-sidecars, "0", --ovmf-path, /usr/share/OVMF, --emulation, tcg]
      securityContext:
        capabilities:
          drop: [ALL]
          add: [SETUID, SETGID, SETPCAP, CHOWN, DAC_OVERRIDE, FOWNER, KILL, SYS_ADMIN, MKNOD, SYS_CHROOT]
      volumeMounts:
        - {{name: sockets, mountPath: /var/run/kubevirt/sockets}}
        - {{name: private, mountPath: /var/run/kubevirt-private}}
        - {{name: hotplug-disks, mountPath: /var/run/kubevirt/hotplug-disks, mountPropagation: HostToContainer}}
        - {{name: disk, mountPath: /var/run/kubevirt/container-disks/disk_0.img, readOnly: true}}
  volumes:
    - {{name: sockets, hostPath: {{path: "{sockets}", type: Directory}}}}
    - {{name: private, hostPath: {{path: "{private}", type: Directory}}}}
    - {{name: hotplug-disks, hostPath: {{path: "{hotplug}", type: Directory}}}}
    - {{name: disk, hostPath: {{path: "{disk}", type: File}}}}
"#,
                sockets = sockets.display(),
                private = private.display(),
                hotplug = hotplug.display(),
                disk = disk.display(),
            ),
        )
        .unwrap();
        let _ = podman(&["kube", "down", manifest.to_str().unwrap()]);
        kube_play(&manifest);
        let played = LauncherPod {
            manifest,
            container: format!("{pod}-compute"),
            uid,
            sockets,
            console_log: private.join(vmi_uid).join("virt-serial0-log"),
            hotplug,
        };
        let ready = played.sockets.join("launcher-sock");
        assert!(
            appears(&ready, Duration::from_secs(60)),
            "the launcher never served on {}:\n{}",
            ready.display(),
            played.log()
        );
        played
    }

    pub fn log(&self) -> String {
        let out = podman(&["logs", &self.container]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// The guest's serial console, line by line from its start.
    pub fn console(&self) -> Console {
        let (tx, rx) = mpsc::channel();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let path = self.console_log.clone();
        let stopped = stop.clone();
        std::thread::spawn(move || follow_file(&path, &stopped, &tx));
        Console {
            lines: rx,
            stop,
            recent: Mutex::new(VecDeque::new()),
        }
    }

    /// Waits for the container to exit by itself: its exit code.
    pub fn wait_exit(&self, within: Duration) -> i32 {
        let out = Command::new("timeout")
            .arg(within.as_secs().to_string())
            .args(["podman", "wait", &self.container])
            .env("CONTAINERS_CONF", repo().join("deploy/containers.conf"))
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        text.trim().parse().unwrap_or_else(|_| {
            panic!(
                "the launcher did not exit within {within:?} ({text}); its log:\n{}",
                self.log()
            )
        })
    }

    /// SIGKILL to the launcher (the container's PID 1), as the OOM killer would.
    pub fn kill(&self) {
        let out = podman(&["kill", "--signal", "KILL", &self.container]);
        assert!(
            out.status.success(),
            "podman kill: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for LauncherPod {
    fn drop(&mut self) {
        // Kept beside virt-handler's log, for a failure's reader.
        if let Some(logs) = self.manifest.parent().and_then(Path::parent) {
            let _ = std::fs::write(
                logs.join(format!("logs/{}.log", self.container)),
                self.log(),
            );
        }
        let _ = podman(&["kube", "down", self.manifest.to_str().unwrap()]);
    }
}

fn uuid() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .unwrap()
        .trim()
        .to_string()
}

/// The guest's console lines, as they come.
#[derive(Debug)]
pub struct Console {
    lines: mpsc::Receiver<String>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    /// The last lines read, for a failed wait to show what the guest did say.
    recent: Mutex<VecDeque<String>>,
}

/// How many of the last console lines a failed wait shows.
const RECENT_LINES: usize = 30;

/// Sends each line of the file at `path` (once it exists) as it is written, until `stop`; woken
/// by every change in its directory.
fn follow_file(path: &Path, stop: &std::sync::atomic::AtomicBool, lines: &mpsc::Sender<String>) {
    use std::io::Read;
    let dir = path.parent().unwrap().to_path_buf();
    let mut read = 0u64;
    let mut partial = Vec::new();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let length = || std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        if length() > read {
            let mut file = std::fs::File::open(path).unwrap();
            std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(read)).unwrap();
            let mut more = Vec::new();
            read += file.read_to_end(&mut more).unwrap() as u64;
            partial.extend_from_slice(&more);
            while let Some(end) = partial.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = partial.drain(..=end).collect();
                if lines
                    .send(String::from_utf8_lossy(&line).trim_end().to_string())
                    .is_err()
                {
                    return;
                }
            }
            continue;
        }
        // Until the dir exists, and between writes: woken by a change, or each second to see
        // `stop`.
        if !dir.exists() {
            let _ = vmlauncher::host::watch::wait_for_change_in(
                &[dir.parent().unwrap()],
                Instant::now() + Duration::from_secs(1),
                || dir.exists(),
            );
            continue;
        }
        let _ = vmlauncher::host::watch::wait_for_change_in(
            &[&dir],
            Instant::now() + Duration::from_secs(1),
            || length() > read,
        );
    }
}

impl Console {
    /// Waits for a line containing `text`: the line. The lines before it are consumed.
    pub fn wait_for(&self, text: &str, within: Duration) -> String {
        self.wait_for_each(&[text], within).remove(0)
    }

    /// Waits until each of `texts` is in a line, in whatever order the guest prints them (its
    /// reports come from concurrent jobs: a background timer's line may come before or after
    /// the main loop's): the lines, in the order of `texts`.
    pub fn wait_for_each(&self, texts: &[&str], within: Duration) -> Vec<String> {
        let deadline = Instant::now() + within;
        let mut found: Vec<Option<String>> = vec![None; texts.len()];
        while found.iter().any(Option::is_none) {
            let left = deadline.saturating_duration_since(Instant::now());
            let missing = || -> Vec<&str> {
                texts
                    .iter()
                    .zip(&found)
                    .filter(|(_, f)| f.is_none())
                    .map(|(t, _)| *t)
                    .collect()
            };
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    for (text, slot) in texts.iter().zip(found.iter_mut()) {
                        if slot.is_none() && line.contains(text) {
                            *slot = Some(line.clone());
                        }
                    }
                    self.remember(line);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => panic!(
                    "no console line with {:?} within {within:?}; the last lines:\n{}",
                    missing(),
                    self.recent_lines()
                ),
                Err(mpsc::RecvTimeoutError::Disconnected) => panic!(
                    "the console ended before a line with {:?}; the last lines:\n{}",
                    missing(),
                    self.recent_lines()
                ),
            }
        }
        found.into_iter().map(Option::unwrap).collect()
    }

    fn remember(&self, line: String) {
        let mut recent = self.recent.lock().unwrap();
        if recent.len() == RECENT_LINES {
            recent.pop_front();
        }
        recent.push_back(line);
    }

    fn recent_lines(&self) -> String {
        let recent = self.recent.lock().unwrap();
        recent
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// KubeVirt's hotplug attachment pod for one filesystem volume, as virt-controller has the
/// kubelet run it: its PVC mounted at `/<volume>` (here a host dir holding `disk.img`), its
/// `hotplug-disks` emptyDir at `/path` with the socket `hp.sock` its process listens on (KubeVirt's
/// runs `container-disk --copy-path /path/hp`). virt-handler finds the process by that socket
/// and the volume by that process's mounts, then bind-mounts the image into the launcher pod.
#[derive(Debug)]
pub struct AttachmentPod {
    manifest: PathBuf,
    pub uid: String,
    pub name: String,
    /// `disk.img` on the host.
    pub image: PathBuf,
}

impl AttachmentPod {
    pub fn play(cluster: &Cluster, volume: &str, size: u64) -> AttachmentPod {
        let uid = uuid();
        let pod_dir = cluster.run.join(format!("node/pods/{uid}/volumes"));
        let sockets = pod_dir.join("kubernetes.io~empty-dir/hotplug-disks");
        let claim = pod_dir.join(format!("kubernetes.io~local-volume/{volume}"));
        for dir in [&sockets, &claim] {
            std::fs::create_dir_all(dir).unwrap();
        }
        let image = claim.join("disk.img");
        std::fs::File::create(&image)
            .unwrap()
            .set_len(size)
            .unwrap();
        let name = format!("hp-volume-{volume}-{}", &uid[..8]);
        let manifest = cluster.run.join(format!("pods/{name}.yaml"));
        std::fs::write(
            &manifest,
            format!(
                r#"apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  restartPolicy: Never
  containers:
    - name: hotplug-disk
      image: {IMAGE}
      command: ["perl", "-MIO::Socket::UNIX", "-e",
        "my $s = IO::Socket::UNIX->new(Type => SOCK_STREAM(), Local => '/path/hp.sock', Listen => 1) or die $!; while (my $c = $s->accept) {{ close $c }}"]
      volumeMounts:
        - {{name: hotplug-disks, mountPath: /path}}
        - {{name: claim, mountPath: /{volume}}}
  volumes:
    - {{name: hotplug-disks, hostPath: {{path: "{sockets}", type: Directory}}}}
    - {{name: claim, hostPath: {{path: "{claim}", type: Directory}}}}
"#,
                sockets = sockets.display(),
                claim = claim.display(),
            ),
        )
        .unwrap();
        kube_play(&manifest);
        let socket = sockets.join("hp.sock");
        assert!(
            appears(&socket, Duration::from_secs(30)),
            "the attachment pod never listened on {}",
            socket.display()
        );
        AttachmentPod {
            manifest,
            uid,
            name,
            image,
        }
    }
}

impl Drop for AttachmentPod {
    fn drop(&mut self) {
        let _ = podman(&["kube", "down", self.manifest.to_str().unwrap()]);
    }
}

/// Whether `path` is a mount point in this (the host's) mount namespace.
pub fn is_mount_point(path: &Path) -> bool {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let path = path.to_str().unwrap();
    text.lines().any(|l| l.split(' ').nth(4) == Some(path))
}

/// `podman kube play` of `manifest` with no network, as the kubelet of this node does.
fn kube_play(manifest: &Path) {
    let out = podman(&[
        "kube",
        "play",
        "--network",
        "none",
        manifest.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "podman kube play {}: {}",
        manifest.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether `path` exists within `within`, woken by each change in its directory.
fn appears(path: &Path, within: Duration) -> bool {
    vmlauncher::host::watch::wait_for_change_in(
        &[path.parent().unwrap()],
        Instant::now() + within,
        || path.exists(),
    )
    .unwrap()
}
