//! Under a real KubeVirt node: KubeVirt's own virt-handler, unmodified, fed by a real
//! kube-apiserver with KubeVirt's CRDs (`../shared/kubevirt-cluster`), drives vmlauncher's image
//! from `kubectl create` to the VMI's end. Only virt-controller and the kubelet are played
//! (`common::cluster`). Each flow is its own test; the cluster is one for the whole binary,
//! brought up by the first test that needs it and torn down when all have run, whatever happened.
//! It cannot come up: every test fails, none is skipped.
//!
//! The tests assert only what KubeVirt writes: the VMI's phase and conditions as virt-handler sets
//! them (every version watched: `Synchronized` is never `False`), virt-handler's log and its REST
//! answers; and the guest's own console.

mod common;

use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::cluster::{
    condition, is_mount_point, unique, AttachmentPod, Cluster, Console, LauncherPod, VmiWatch,
};
use libtest_mimic::{Arguments, Failed, Trial};
use serde_json::Value;

const NS: &str = "default";
/// Booting: the Debian image's cloud-init under TCG on two busy cores (about 75 s alone).
const DEBIAN_BOOT: Duration = Duration::from_secs(300);
/// The tiny guest from its disk: about 5 s alone.
const TINY_BOOT: Duration = Duration::from_secs(90);
/// A booted guest's answer to a line typed on its console, through virt-handler.
const GUEST_ANSWER: Duration = Duration::from_secs(30);
/// From `Scheduled` to `Running`: virt-handler's first Sync defines and starts the domain.
const TO_RUNNING: Duration = Duration::from_secs(60);
/// The VMIs' `terminationGracePeriodSeconds`.
const GRACE: u64 = 30;
/// The Debian guest's: systemd's whole shutdown under TCG, on two cores shared with the guests
/// tier, has taken more than 30 s (KubeVirt's default is 180).
const DEBIAN_GRACE: u64 = 120;

/// The cluster, brought up once, by the first test that needs it.
static CLUSTER: Mutex<Option<Result<Arc<Cluster>, String>>> = Mutex::new(None);

fn cluster() -> Arc<Cluster> {
    let mut slot = CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    let state = slot.get_or_insert_with(|| {
        std::panic::catch_unwind(Cluster::up)
            .map(Arc::new)
            .map_err(|e| {
                e.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default()
            })
    });
    match state {
        Ok(c) => c.clone(),
        Err(why) => panic!("the cluster did not come up: {why}"),
    }
}

fn main() -> ExitCode {
    let mut args = Arguments::from_args();
    // One guest at a time: two cores, TCG.
    args.test_threads.get_or_insert(1);
    let tests = [
        trial("kubectl_create_to_succeeded", kubectl_create_to_succeeded),
        trial(
            "pause_and_unpause_through_virt_handler",
            pause_and_unpause_through_virt_handler,
        ),
        trial(
            "console_vnc_and_agent_through_virt_handler",
            console_vnc_and_agent_through_virt_handler,
        ),
        trial(
            "soft_reboot_through_virt_handler",
            soft_reboot_through_virt_handler,
        ),
        trial(
            "freeze_without_an_agent_is_refused_as_kubevirt_refuses_it",
            freeze_without_an_agent,
        ),
        trial(
            "a_guest_that_powers_itself_off_succeeds",
            a_guest_that_powers_itself_off_succeeds,
        ),
        trial(
            "a_launcher_killed_fails_its_vmi",
            a_launcher_killed_fails_its_vmi,
        ),
        trial(
            "another_topology_and_cloud_init_as_virt_handler_leaves_them",
            another_topology_and_cloud_init,
        ),
        trial(
            "a_volume_hot_plugged_and_unplugged_under_virt_handler",
            a_volume_hot_plugged_and_unplugged,
        ),
    ];
    let conclusion = libtest_mimic::run(&args, tests.into());
    // Torn down however the tests ended.
    drop(CLUSTER.lock().unwrap_or_else(|e| e.into_inner()).take());
    conclusion.exit_code()
}

fn trial(name: &'static str, test: fn(&Cluster)) -> Trial {
    Trial::test(name, move || {
        test(&cluster());
        Ok::<(), Failed>(())
    })
}

/// The test guest from its bootable disk (`scripts/build-test-guest.sh`), and the Debian image.
fn tiny_disk() -> std::path::PathBuf {
    common::guest_dir().join("disk.img")
}

fn debian_disk() -> std::path::PathBuf {
    let disk = std::path::PathBuf::from("/var/cache/vmlauncher/debian/disk.img");
    assert!(
        disk.exists(),
        "no {}: run scripts/build-debian-image.sh (scripts/test.sh does)",
        disk.display()
    );
    disk
}

/// A VMI as a user writes it: `domain` and `volumes` given, the finalizer virt-controller
/// would add already on it.
fn vmi_manifest(name: &str, grace: u64, domain: &str, cloud_init: &str) -> String {
    format!(
        r#"apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: {name}
  namespace: {NS}
  finalizers: [kubevirt.io/virtualMachineControllerFinalize]
spec:
  terminationGracePeriodSeconds: {grace}
  domain:
{domain}
    devices:
      autoattachGraphicsDevice: false
      disks:
        - {{name: root, disk: {{bus: virtio}}, bootOrder: 1}}
        - {{name: cloudinit, disk: {{bus: virtio}}}}
  volumes:
    - name: root
      containerDisk: {{image: "localhost/test-disk:none"}}
    - name: cloudinit
      cloudInitNoCloud:
        userData: |
{cloud_init}
"#
    )
}

/// The tiny guest's VMI; `user_data` lines go into its cloud-init user data.
fn tiny_vmi(name: &str, user_data: &[&str]) -> String {
    let mut lines = vec!["          #cloud-config".to_string()];
    lines.extend(user_data.iter().map(|l| format!("          {l}")));
    vmi_manifest(
        name,
        GRACE,
        "    cpu: {sockets: 1, cores: 2}\n    memory: {guest: 256Mi}",
        &lines.join("\n"),
    )
}

/// A VMI started on the node: created, its launcher pod played, scheduled, `Running`.
struct Started {
    name: String,
    /// virt-handler's errors about this VMI that its test expects (their messages).
    expected_handler_errors: Mutex<Vec<&'static str>>,
    watch: VmiWatch,
    pod: LauncherPod,
    console: Console,
    created: Instant,
}

fn start(cluster: &Cluster, name: &str, manifest: &str, disk: &std::path::Path) -> Started {
    let created = Instant::now();
    cluster.create(manifest);
    let watch = VmiWatch::start(cluster, NS, name);
    let created_vmi = watch.until("created", TO_RUNNING, |v| v["metadata"]["uid"].is_string());
    let uid = created_vmi["metadata"]["uid"].as_str().unwrap().to_string();
    let pod = LauncherPod::play(cluster, NS, name, &uid, disk);
    let console = pod.console();
    // virt-controller, once the launcher pod runs: the node label and the status it writes,
    // with a volume status per volume (sorted by name), which virt-handler fills in.
    let mut volumes: Vec<&str> = created_vmi["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["name"].as_str())
        .collect();
    volumes.sort();
    let volume_status: Vec<Value> = volumes
        .iter()
        .map(|v| serde_json::json!({"name": v, "target": ""}))
        .collect();
    let patch = serde_json::json!({
        "metadata": {"labels": {"kubevirt.io/nodeName": "node01"}},
        "status": {
            "phase": "Scheduled",
            "nodeName": "node01",
            "activePods": {(pod.uid.clone()): "node01"},
            "qosClass": "Burstable",
            "launcherContainerImageVersion": common::pod::IMAGE,
            "migrationTransport": "Unix",
            "volumeStatus": volume_status,
        },
    });
    cluster.kubectl_ok(&[
        "-n",
        NS,
        "patch",
        "vmi",
        name,
        "--type=merge",
        "-p",
        &patch.to_string(),
    ]);
    watch.phase("Running", TO_RUNNING);
    eprintln!(
        "{name}: Running {:.1} s after kubectl create",
        created.elapsed().as_secs_f64()
    );
    Started {
        name: name.into(),
        expected_handler_errors: Mutex::new(Vec::new()),
        watch,
        pod,
        console,
        created,
    }
}

impl Started {
    /// What holds for every VMI while virt-handler drives it: no sync failed, and virt-handler
    /// logged no error or warning about it but those the test `expected` (their messages).
    fn assert_synchronized(&self, cluster: &Cluster) {
        let expected = self.expected_handler_errors.lock().unwrap().clone();
        self.assert_synchronized_but(cluster, &expected);
    }

    fn assert_synchronized_but(&self, cluster: &Cluster, expected: &[&str]) {
        let unexpected: Vec<String> = cluster
            .handler_failures(&self.name)
            .into_iter()
            .filter(|l| !expected.iter().any(|e| l.contains(e)))
            .collect();
        assert!(
            unexpected.is_empty(),
            "virt-handler's errors and warnings: {unexpected:#?}"
        );
        let failures = self.watch.sync_failures();
        assert!(failures.is_empty(), "Synchronized=False: {failures:?}");
        let failed_syncs: Vec<Value> = cluster
            .handler_lines(&self.name)
            .into_iter()
            .filter(|l| l["msg"] == "Synchronizing the VirtualMachineInstance failed.")
            .collect();
        assert!(
            failed_syncs.is_empty(),
            "virt-handler's failed syncs: {failed_syncs:?}"
        );
    }

    /// The VMI's end once it is final: deleted (by its owner, or virt-controller for a VMI of a
    /// VM), and virt-controller's last step, its finalizer off; the VMI gone.
    fn finalize(&self, cluster: &Cluster) {
        cluster.kubectl_ok(&["-n", NS, "delete", "vmi", &self.name, "--wait=false"]);
        cluster.kubectl_ok(&[
            "-n",
            NS,
            "patch",
            "vmi",
            &self.name,
            "--type=json",
            "-p",
            r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
        ]);
        self.watch.gone(Duration::from_secs(60));
    }

    /// virt-handler's final cleanup of the VMI, done: its domain removed from its cache.
    fn cleaned_up(&self, cluster: &Cluster) {
        cluster.wait_handler(
            &self.name,
            "Removing domain from cache during final cleanup",
            0,
            Duration::from_secs(60),
        );
    }

    /// A guest that powers itself off with no delete, once it has also printed each line of
    /// `also` (in any order: its timer's marker may come before the main loop's reports):
    /// virt-handler makes the VMI `Succeeded` and cleans up, the launcher exits 0.
    fn powers_itself_off_to_succeeded(&self, cluster: &Cluster, also: &[&str]) {
        let mut lines = also.to_vec();
        lines.push("VMLTEST-SELF-POWEROFF");
        self.console.wait_for_each(&lines, TINY_BOOT);
        self.ends_succeeded(cluster, Duration::from_secs(60));
        self.ended(cluster);
    }

    /// Waits for the VMI's final phase, which must be `Succeeded`.
    /// Otherwise the failure shows what decided the phase: the VMI's status, virt-handler's last
    /// lines about it and the launcher's log.
    fn ends_succeeded(&self, cluster: &Cluster, within: Duration) {
        let vmi = self.watch.until("final", within, |v| {
            matches!(v["status"]["phase"].as_str(), Some("Succeeded" | "Failed"))
        });
        assert_eq!(
            vmi["status"]["phase"],
            "Succeeded",
            "status: {:#}\nvirt-handler:\n{}\nlauncher:\n{}",
            vmi["status"],
            cluster.handler_digest(&self.name),
            self.pod.log()
        );
    }

    /// After a final phase: virt-handler's cleanup, the VMI gone, the launcher's exit 0, and no
    /// sync failed on the way.
    fn ended(&self, cluster: &Cluster) {
        self.cleaned_up(cluster);
        self.finalize(cluster);
        assert_eq!(
            self.pod.wait_exit(Duration::from_secs(90)),
            0,
            "{}",
            self.pod.log()
        );
        self.assert_synchronized(cluster);
    }

    /// `kubectl delete` of a running VMI: ACPI within the grace period, `Succeeded` (virt-handler
    /// would write `Failed` for a destroyed guest), its final cleanup, the launcher exits 0.
    fn delete_to_succeeded(&self, cluster: &Cluster, powered_off: &str, grace: u64) {
        let asked = Instant::now();
        cluster.kubectl_ok(&["-n", NS, "delete", "vmi", &self.name, "--wait=false"]);
        self.console
            .wait_for(powered_off, Duration::from_secs(grace));
        self.ends_succeeded(cluster, Duration::from_secs(grace + 30));
        assert!(
            asked.elapsed() < Duration::from_secs(grace),
            "Succeeded only {:?} after the delete: beyond the grace period",
            asked.elapsed()
        );
        self.ended(cluster);
    }
}

/// The whole life of a Debian VMI with its cloud-init, as a user has it: `kubectl create`,
/// `Running`, the guest's boot line, a change virt-handler syncs again, `kubectl delete`.
fn kubectl_create_to_succeeded(cluster: &Cluster) {
    let name = "debian";
    let manifest = vmi_manifest(
        name,
        DEBIAN_GRACE,
        "    cpu: {cores: 1}\n    memory: {guest: 1Gi}",
        // The guest agent reports a logged-in user: root logs in on a pseudo-terminal (kept open
        // by a `sleep` feeding it) before the marker.
        &[
            "          #cloud-config",
            "          hostname: kvnode-debian",
            "          runcmd:",
            "          - [sh, -c, \"(sleep 3600 | script -qfc 'login -f root' /dev/null >/dev/null 2>&1 &); for i in $(seq 100); do who | grep -q root && break; sleep 0.2; done\"]",
            "          - echo \"VMLAUNCHER-DEBIAN-READY after $(cut -d' ' -f1 /proc/uptime)s\" > /dev/ttyS0",
        ]
        .join("\n"),
    );
    // Until cloud-init's marker: then the guest only answers.
    let turn = common::debian_turn::debian_turn(name);
    let vm = start(cluster, name, &manifest, &debian_disk());
    // The cloud-init ISO is where virt-handler looks for it: it writes its size in the status.
    vm.watch.until(
        "with the cloud-init ISO's size",
        Duration::from_secs(30),
        |v| {
            v["status"]["volumeStatus"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|s| s["name"] == "cloudinit" && s["size"].as_u64().is_some_and(|n| n > 0))
        },
    );
    let line = vm.console.wait_for("VMLAUNCHER-DEBIAN-READY", DEBIAN_BOOT);
    eprintln!(
        "{name}: {line} ({:.0} s after kubectl create)",
        vm.created.elapsed().as_secs_f64()
    );
    drop(turn);
    debian_agent_through_virt_handler(cluster, &vm, name);

    // A change to the VMI: virt-handler syncs again, with the VMI from its informer cache (no
    // apiVersion, no kind), and the launcher takes it.
    let synced = cluster.handler_count(name, "Synchronization loop succeeded.");
    cluster.kubectl_ok(&[
        "-n",
        NS,
        "label",
        "vmi",
        name,
        "vmlauncher.test/changed=yes",
    ]);
    cluster.wait_handler(
        name,
        "Synchronization loop succeeded.",
        synced,
        Duration::from_secs(30),
    );
    vm.assert_synchronized(cluster);

    // systemd powers the guest off on the ACPI button; the kernel's last line says so.
    vm.delete_to_succeeded(cluster, "reboot: Power down", DEBIAN_GRACE);
    assert_eq!(
        vm.watch.phases(),
        ["Scheduled", "Running", "Succeeded"].map(String::from)
    );
}

/// Debian's own qemu-guest-agent, as a KubeVirt user reaches it: the VMI's `AgentConnected`
/// (virt-handler's, from the domain's channel state), `virtctl guestosinfo`, `userlist`,
/// `fslist`, and a freeze round trip, each through virt-handler's REST server.
fn debian_agent_through_virt_handler(cluster: &Cluster, vm: &Started, name: &str) {
    vm.watch
        .until("AgentConnected", Duration::from_secs(60), |v| {
            has_condition(v, "AgentConnected")
        });
    let get = |verb: &str| -> Value {
        let (code, body) = cluster.rest("GET", NS, name, verb, None);
        assert_eq!(code, 200, "{verb}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{verb}: {e}: {body}"))
    };
    let info = get("guestosinfo");
    assert_eq!(info["hostname"], "kvnode-debian", "{info:#}");
    assert_eq!(info["os"]["name"], "Debian GNU/Linux", "{info:#}");
    assert_eq!(info["os"]["versionId"], "12", "{info:#}");
    let users = get("userlist");
    assert!(
        users["items"]
            .as_array()
            .is_some_and(|u| u.iter().any(|u| u["userName"] == "root")),
        "{users:#}"
    );
    let root = |fs: &Value| {
        fs["items"]
            .as_array()
            .and_then(|f| f.iter().find(|f| f["mountPoint"] == "/").cloned())
    };
    let filesystems = get("filesystemlist");
    let listed = root(&filesystems).unwrap_or_else(|| panic!("no /: {filesystems:#}"));
    assert_eq!(listed["fileSystemType"], "ext4", "{listed:#}");

    let (code, body) = cluster.rest(
        "PUT",
        NS,
        name,
        "freeze",
        Some(r#"{"unfreezeTimeout":"5m0s"}"#),
    );
    assert_eq!(code, 202, "freeze: {body}");
    vm.watch
        .until("fsFreezeStatus frozen", Duration::from_secs(60), |v| {
            v["status"]["fsFreezeStatus"] == "frozen"
        });
    let (code, body) = cluster.rest("PUT", NS, name, "unfreeze", None);
    assert_eq!(code, 202, "unfreeze: {body}");
    vm.watch.until("thawed", Duration::from_secs(60), |v| {
        v["status"]["fsFreezeStatus"].is_null()
    });
    assert!(root(&get("filesystemlist")).is_some(), "/ after the thaw");
}

fn has_condition(vmi: &Value, kind: &str) -> bool {
    vmi["status"]["conditions"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c["type"] == kind && c["status"] == "True"))
}

/// `virtctl console` and `virtctl vnc` as virt-api reaches them: virt-handler's console server
/// dials the sockets in the launcher's root where KubeVirt's launcher has them; a line typed
/// reaches the guest and its answer comes back; the display speaks RFB. The tiny guest's agent
/// gives the VMI `AgentConnected`.
fn console_vnc_and_agent_through_virt_handler(cluster: &Cluster) {
    let name = format!("console-{}", unique());
    let manifest = tiny_vmi(&name, &[]).replace(
        "autoattachGraphicsDevice: false",
        "autoattachGraphicsDevice: true",
    );
    let vm = start(cluster, &name, &manifest, &tiny_disk());
    vm.console.wait_for("VMLTEST-BOOTED", TINY_BOOT);
    let mut serial = cluster.websocket(NS, &name, "console");
    let word = format!("hello-{name}");
    serial.send(format!("{word}\n").as_bytes());
    serial.read_until(&format!("VMLTEST-HEARD {word}"), GUEST_ANSWER);
    serial.close();
    let mut vnc = cluster.websocket(NS, &name, "vnc");
    vnc.read_until("RFB 003.008\n", GUEST_ANSWER);
    vnc.close();
    vm.watch
        .until("AgentConnected", Duration::from_secs(60), |v| {
            has_condition(v, "AgentConnected")
        });
    // virt-handler's console server logs the end of every session as errors, a normal close
    // included (`stream` in its rest/console.go): its own words, not a failure.
    let session_ends = [
        "error encountered reading from client (virt-api) websocket",
        "error encountered reading from unix socket",
        "Error in proxing websocket and unix socket",
    ];
    vm.assert_synchronized_but(cluster, &session_ends);
    *vm.expected_handler_errors.lock().unwrap() = session_ends.to_vec();
    vm.delete_to_succeeded(cluster, "VMLTEST-ACPI-POWEROFF", GRACE);
}

/// `virtctl pause` and `unpause` go through virt-handler's REST server to the launcher; the VMI's
/// `Paused` condition comes and goes.
fn pause_and_unpause_through_virt_handler(cluster: &Cluster) {
    let name = format!("pause-{}", unique());
    let vm = start(cluster, &name, &tiny_vmi(&name, &[]), &tiny_disk());
    vm.console.wait_for("VMLTEST-BOOTED", TINY_BOOT);
    let (code, body) = cluster.rest("PUT", NS, &name, "pause", None);
    assert_eq!(code, 202, "pause: {body}");
    let paused = vm.watch.until("Paused", Duration::from_secs(30), |v| {
        condition(v, "Paused").is_some_and(|c| c["status"] == "True")
    });
    assert_eq!(
        condition(&paused, "Paused").unwrap()["reason"],
        "PausedByUser",
        "{paused:#}"
    );
    // A pause by the user survives virt-handler's next sync: once virt-handler has the label
    // (the watch shows it), a sync loop ends after it; no version of the VMI from the pause to
    // the unpause lacks the condition, and virt-handler never saw the domain running again.
    let paused_at = vm.watch.mark().saturating_sub(1);
    // Taken before the label: virt-handler may sync it before the watch shows it here.
    let labelled = rfc3339_now();
    cluster.kubectl_ok(&[
        "-n",
        NS,
        "label",
        "vmi",
        &name,
        "vmlauncher.test/changed=yes",
    ]);
    vm.watch.until("labelled", Duration::from_secs(30), |v| {
        v["metadata"]["labels"]["vmlauncher.test/changed"] == "yes"
    });
    let logs = cluster.run.join("logs");
    let synced = vmlauncher::host::watch::wait_for_change_in(
        &[&logs],
        Instant::now() + Duration::from_secs(30),
        || cluster.handler_said_since(&name, "Synchronization loop succeeded.", &labelled) > 0,
    )
    .unwrap();
    assert!(
        synced,
        "virt-handler did not sync after the label:\n{}",
        cluster.handler_digest(&name)
    );
    for version in vm.watch.since(paused_at) {
        assert!(
            condition(&version, "Paused").is_some(),
            "a Sync resumed the paused VM: {version:#}"
        );
    }
    assert_eq!(
        cluster.handler_said_since(
            &name,
            "Domain is in state Running reason Unknown",
            &paused_rfc3339(&paused)
        ),
        0,
        "the domain ran again while paused"
    );
    let (code, body) = cluster.rest("PUT", NS, &name, "unpause", None);
    assert_eq!(code, 202, "unpause: {body}");
    vm.watch.until("unpaused", Duration::from_secs(30), |v| {
        condition(v, "Paused").is_none()
    });
    vm.delete_to_succeeded(cluster, "VMLTEST-ACPI-POWEROFF", GRACE);
}

/// `virtctl soft-reboot` without a guest agent: KubeVirt's launcher presses the ACPI button for
/// a reboot; the guest boots a second time and the VMI stays `Running`.
fn soft_reboot_through_virt_handler(cluster: &Cluster) {
    let name = format!("reboot-{}", unique());
    let vm = start(cluster, &name, &tiny_vmi(&name, &[]), &tiny_disk());
    let first = vm.console.wait_for("VMLTEST-UPTIME", TINY_BOOT);
    let (code, body) = cluster.rest("PUT", NS, &name, "softreboot", None);
    assert_eq!(code, 202, "softreboot: {body}");
    vm.console
        .wait_for("VMLTEST-ACPI-POWEROFF", Duration::from_secs(30));
    let second = vm.console.wait_for("VMLTEST-UPTIME", TINY_BOOT);
    let boot_id = |line: &str| line.split_whitespace().nth(1).map(String::from);
    assert_ne!(boot_id(&first), boot_id(&second), "{first} / {second}");
    assert_eq!(vm.watch.latest().unwrap()["status"]["phase"], "Running");
    vm.delete_to_succeeded(cluster, "VMLTEST-ACPI-POWEROFF", GRACE);
}

/// `virtctl freeze` needs the guest agent: without one, KubeVirt's launcher fails the call, and
/// virt-handler answers 400 with its reason; the VM runs on, untouched.
fn freeze_without_an_agent(cluster: &Cluster) {
    let name = format!("freeze-{}", unique());
    let no_agent = tiny_vmi(&name, &["vmltest-agent: off"]);
    let vm = start(cluster, &name, &no_agent, &tiny_disk());
    vm.console.wait_for("VMLTEST-BOOTED", TINY_BOOT);
    let (code, body) = cluster.rest(
        "PUT",
        NS,
        &name,
        "freeze",
        Some(r#"{"unfreezeTimeout":"5m0s"}"#),
    );
    assert_eq!(code, 400, "freeze: {body}");
    assert!(
        body.contains("agent"),
        "freeze's refusal does not say why: {body}"
    );
    let vmi = vm.watch.latest().unwrap();
    assert_eq!(vmi["status"]["phase"], "Running");
    assert!(vmi["status"]["fsFreezeStatus"].is_null(), "{vmi:#}");
    // KubeVirt's virt-handler logs the refusal ("Failed to freeze VMI") as its own error.
    vm.assert_synchronized_but(cluster, &["Failed to freeze VMI"]);
    *vm.expected_handler_errors.lock().unwrap() = vec!["Failed to freeze VMI"];
    vm.delete_to_succeeded(cluster, "VMLTEST-ACPI-POWEROFF", GRACE);
}

/// A guest that powers itself off, with no delete: virt-handler makes the VMI `Succeeded`, cleans
/// up, and the launcher exits 0.
fn a_guest_that_powers_itself_off_succeeds(cluster: &Cluster) {
    let name = format!("selfoff-{}", unique());
    let vm = start(
        cluster,
        &name,
        &tiny_vmi(&name, &["vmltest-poweroff-after: 2"]),
        &tiny_disk(),
    );
    vm.powers_itself_off_to_succeeded(cluster, &[]);
}

/// The launcher SIGKILLed under a running VMI: virt-handler's watchdog finds its socket dead and
/// fails the VMI ("The VirtualMachineInstance crashed."), as with KubeVirt's launcher.
fn a_launcher_killed_fails_its_vmi(cluster: &Cluster) {
    let name = format!("killed-{}", unique());
    let vm = start(cluster, &name, &tiny_vmi(&name, &[]), &tiny_disk());
    vm.pod.kill();
    // virt-handler's watchdog: a tick every 11 s, a socket dead for 30 s.
    vm.watch.phase("Failed", Duration::from_secs(120));
    cluster.wait_handler(
        &name,
        "Removing domain from cache during final cleanup",
        0,
        Duration::from_secs(60),
    );
    vm.finalize(cluster);
}

/// A VMI written otherwise, passed on by virt-handler with nothing defaulted (no virt-api here
/// to fill in buses or a machine type): one socket of one core with two threads, memory from
/// the resources' request, a disk without a bus, cloud-init on a SCSI CD-ROM (the cloud
/// kernel has no AHCI for KubeVirt's default SATA) as base64 user data with network data. The guest reads its seed and powers itself off; the VMI ends `Succeeded`.
fn another_topology_and_cloud_init(cluster: &Cluster) {
    let name = format!("other-{}", unique());
    let manifest = format!(
        r#"apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: {name}
  namespace: {NS}
  labels: {{special: other}}
  finalizers: [kubevirt.io/virtualMachineControllerFinalize]
spec:
  domain:
    cpu: {{sockets: 1, cores: 1, threads: 2}}
    resources: {{requests: {{memory: 320Mi}}}}
    devices:
      disks:
        - {{name: containerdisk, disk: {{}}}}
        - {{name: cloudinitdisk, cdrom: {{bus: scsi}}}}
  volumes:
    - name: containerdisk
      containerDisk: {{image: "localhost/test-disk:none"}}
    - name: cloudinitdisk
      cloudInitNoCloud:
        userDataBase64: {user}
        networkDataBase64: {network}
"#,
        user = base64("#cloud-config\nvmltest-poweroff-after: 3\n"),
        network = base64("version: 2\nethernets: {}\n"),
    );
    let vm = start(cluster, &name, &manifest, &tiny_disk());
    // Two vCPUs, not four: a TCG guest of four on this two-core machine, beside the guests
    // lane's own, once soft-locked at boot ("CPU#3 stuck for 71s") and never reached its seed.
    vm.powers_itself_off_to_succeeded(cluster, &["VMLTEST-CPUS 2"]);
}

/// A filesystem PVC hot-plugged as KubeVirt does it, through virt-handler's own mount: its
/// attachment pod runs (the PVC at `/hp1`, `hp.sock` in its `hotplug-disks` emptyDir) and its
/// status says `AttachedToNode` (virt-controller's part); virt-handler finds the image through
/// that pod's mounts, bind-mounts it into the launcher pod as `hotplug-disks/hp1.img` and marks
/// it `MountedToPod`; its next Sync carries it, the guest sees its serial, and virt-handler reads
/// the target back from the domain: `Ready`. Out of the spec, the guest loses it, virt-handler
/// unmounts it and marks it `UnMountedFromPod`.
fn a_volume_hot_plugged_and_unplugged(cluster: &Cluster) {
    let name = format!("hotplug-{}", unique());
    let vm = start(cluster, &name, &tiny_vmi(&name, &[]), &tiny_disk());
    vm.console.wait_for("VMLTEST-DISKS", TINY_BOOT);
    let attachment = AttachmentPod::play(cluster, "hp1", 16 << 20);
    let plug = serde_json::json!([
        {"op": "add", "path": "/spec/volumes/-", "value":
            {"name": "hp1", "persistentVolumeClaim": {"claimName": "hp1", "hotpluggable": true}}},
        {"op": "add", "path": "/spec/domain/devices/disks/-", "value":
            {"name": "hp1", "serial": "hp1-serial", "disk": {"bus": "scsi"}}},
        {"op": "add", "path": "/status/volumeStatus/-", "value": {
            "name": "hp1", "target": "", "phase": "AttachedToNode",
            "hotplugVolume": {"attachPodName": attachment.name, "attachPodUID": attachment.uid},
            "persistentVolumeClaimInfo": {"claimName": "hp1", "volumeMode": "Filesystem",
                "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "16Mi"}}}},
    ]);
    cluster.json_patch(NS, &name, &plug);
    let seen = vm.console.wait_for("hp1-serial", Duration::from_secs(60));
    assert!(seen.contains("hp1-serial:32768"), "{seen}");
    let hp1 = |v: &Value| -> Option<Value> {
        v["status"]["volumeStatus"]
            .as_array()?
            .iter()
            .find(|s| s["name"] == "hp1")
            .cloned()
    };
    let ready = vm
        .watch
        .until("with hp1 Ready", Duration::from_secs(60), |v| {
            hp1(v).is_some_and(|s| {
                s["phase"] == "Ready" && s["target"].as_str().is_some_and(|t| t.starts_with("sd"))
            })
        });
    eprintln!("{name}: hp1 {}", hp1(&ready).unwrap());
    // virt-handler's bind mount, in the node's mount namespace.
    let mounted = vm.pod.hotplug.join("hp1.img");
    assert!(
        is_mount_point(&mounted),
        "{} is not virt-handler's mount",
        mounted.display()
    );

    // Unplugged: out of the spec (its status stays until virt-controller drops it).
    let spec = vm.watch.latest().unwrap();
    let index = |list: &str| {
        spec["spec"]
            .pointer(list)
            .and_then(Value::as_array)
            .unwrap()
            .iter()
            .position(|d| d["name"] == "hp1")
            .unwrap()
    };
    let unplug = serde_json::json!([
        {"op": "remove", "path": format!("/spec/domain/devices/disks/{}", index("/domain/devices/disks"))},
        {"op": "remove", "path": format!("/spec/volumes/{}", index("/volumes"))},
    ]);
    cluster.json_patch(NS, &name, &unplug);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let line = vm.console.wait_for(
            "VMLTEST-DISKS",
            deadline.saturating_duration_since(Instant::now()),
        );
        if !line.contains("hp1-serial") {
            break;
        }
    }
    vm.watch.until(
        "with hp1 unmounted from the pod",
        Duration::from_secs(60),
        |v| hp1(v).is_some_and(|s| s["phase"] == "UnMountedFromPod"),
    );
    assert!(
        !is_mount_point(&mounted),
        "virt-handler left {} mounted",
        mounted.display()
    );
    assert!(attachment.image.exists());
    assert_eq!(
        vm.watch.volume_phases("hp1"),
        [
            "AttachedToNode",
            "MountedToPod",
            "Ready",
            "UnMountedFromPod"
        ]
        .map(String::from)
    );
    vm.delete_to_succeeded(cluster, "VMLTEST-ACPI-POWEROFF", GRACE);
}

/// Standard base64 with padding, as a user writes `userDataBase64`.
fn base64(text: &str) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in text.as_bytes().chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (*b as u32) << (16 - 8 * i));
        for i in 0..4 {
            out.push(if i <= chunk.len() {
                ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char
            } else {
                '='
            });
        }
    }
    out
}

/// Now, as virt-handler's log stamps its lines (RFC 3339, UTC, to the microsecond).
fn rfc3339_now() -> String {
    humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string()
}

/// When virt-handler put the `Paused` condition on `vmi`: its transition time's second, without
/// the zone, so that every log line of that second compares as later.
fn paused_rfc3339(vmi: &Value) -> String {
    let time = condition(vmi, "Paused").and_then(|c| c["lastTransitionTime"].as_str());
    time.unwrap_or("").trim_end_matches('Z').to_string()
}
