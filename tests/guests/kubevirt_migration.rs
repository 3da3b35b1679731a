//! KubeVirt's live migration between two `vmlauncher virt-launcher`s on this machine, driven as
//! virt-handler drives them, with a client generated from KubeVirt's `cmd.proto`:
//! `SyncMigrationTarget` on the target, `MigrateVirtualMachine` on the source, the outcome read
//! from the domains' `Metadata.KubeVirt.Migration` on notify and `GetDomain`; a real TCG guest
//! whose container disk is copied and whose boot survives.
//!
//! Each launcher runs in a mount namespace of its own where its pod dir is at the same path, as
//! two KubeVirt pods see the same paths: KubeVirt's migration relies on it (the target's QEMU
//! listens at the path the source connects to, each in its own pod). virt-handler's migration
//! proxies (a unix socket in the source pod, TCP between the nodes, the same path in the target
//! pod) are stood in for by unix-socket byte forwarders from the source pod's
//! `<share>/migrationproxy` to the target pod's libvirt socket and migration sockets.

use crate::common;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use tonic::transport::Channel;

use common::forward::Forwarder;
use common::kubevirt::{cmd_client, guest_vmi_json, vmi_request, PodDirs, VirtLauncher};
use common::kubevirt_notify::NotifyRecorder;
use common::{ConsoleWait, BOOT_DEADLINE, GUEST_DEADLINE};
use vmlauncher::console::ConsoleLog;
use vmlauncher::kubevirt::proto::cmd::cmd_client::CmdClient;
use vmlauncher::kubevirt::proto::cmd::{EmptyRequest, MigrationRequest, Response, Vmi};

const NAMESPACE: &str = "kvmig";
const MIGRATION_DEADLINE: Duration = Duration::from_secs(240);
const CONTAINER_DISK_BYTES: u64 = 64 << 20;

/// What virt-handler marshals for KubeVirt's default migration configuration
/// (`cmdclient.MigrationOptions`), with `bandwidth`.
fn options(bandwidth: &str) -> Vec<u8> {
    json!({
        "Bandwidth": bandwidth, "ProgressTimeout": 150, "CompletionTimeoutPerGiB": 150,
        "MaxDowntimeMs": 0, "UnsafeMigration": false, "AllowAutoConverge": false,
        "AllowPostCopy": false, "ParallelMigrationThreads": null,
        "AllowWorkloadDisruption": false, "StallDetectorOptions": null, "Compression": null,
        "DowntimeTuning": null,
    })
    .to_string()
    .into_bytes()
}

/// One launcher's pod: its dirs, the launcher, virt-handler's notify server, the cmd socket.
struct Pod {
    dirs: PodDirs,
    launcher: VirtLauncher,
    notify: NotifyRecorder,
    socket: PathBuf,
    uid: String,
}

impl Pod {
    /// A pod as KubeVirt's template makes it for the VMI `name`, seen by its launcher at
    /// `seen_at`, with the container disk's image (the same zeros in every pod, as the image
    /// gives it).
    fn start(seen_at: &Path, name: &str, uid: &str) -> Pod {
        let dirs = PodDirs::new();
        std::fs::File::create(dirs.root.path().join("container-disks/disk_0.img"))
            .unwrap()
            .set_len(CONTAINER_DISK_BYTES)
            .unwrap();
        let notify = NotifyRecorder::serve(&dirs.share());
        let mut flags = dirs.flags_at(seen_at, name, NAMESPACE, uid);
        let libvirt = seen_at.join("libvirt/virtqemud-sock");
        flags.extend(["--libvirt-socket".into(), libvirt.display().to_string()]);
        let mut launcher = VirtLauncher::start_in_pod(&dirs, seen_at, &flags);
        let socket = launcher.wait_serving(&dirs);
        Pod {
            dirs,
            launcher,
            notify,
            socket,
            uid: uid.into(),
        }
    }

    fn console(&self) -> ConsoleLog {
        ConsoleLog::from_start(&self.dirs.console_log(&self.uid)).expect("the console log")
    }

    /// Where virt-handler's proxy reaches this (target) pod's libvirt.
    fn libvirt_socket(&self) -> PathBuf {
        self.dirs.root.path().join("libvirt/virtqemud-sock")
    }

    fn proxy_dir(&self) -> PathBuf {
        self.dirs.share().join("migrationproxy")
    }
}

impl Drop for Pod {
    /// A failed test shows what each launcher said, and stops it as a pod's deletion would, so
    /// that no guest is left running.
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- launcher of {}:\n{}",
                self.dirs.root.path().display(),
                self.launcher.stderr_text()
            );
        }
        self.launcher.terminate(Duration::from_secs(90));
    }
}

/// virt-handler's migration proxies for the VMI `uid`, source pod → target pod, as KubeVirt
/// names them (`<uid>-source.sock` to the target's libvirt, `<uid>-49152-source.sock` and
/// `<uid>-49153-source.sock` to the same paths in the target pod).
fn proxies(source: &Pod, target: &Pod, uid: &str) -> Vec<Forwarder> {
    let from = source.proxy_dir();
    std::fs::create_dir_all(&from).unwrap();
    let mut proxies = vec![Forwarder::start(
        &from.join(format!("{uid}-source.sock")),
        &target.libvirt_socket(),
    )];
    for port in [49152, 49153] {
        let name = format!("{uid}-{port}-source.sock");
        proxies.push(Forwarder::start(
            &from.join(&name),
            &target.proxy_dir().join(&name),
        ));
    }
    proxies
}

/// The test guest's VMI with a container disk it writes its boot id to, and the hot-plugged
/// claims `hot` (serial `<VOLUME>-S`), mounted into the pod; `status` as virt-controller keeps it.
fn vmi(name: &str, uid: &str, hot: &[&str], status: Value) -> Value {
    let mut vmi = guest_vmi_json(name, NAMESPACE, uid);
    let mut disks = vec![json!({"name": "cdisk", "disk": {"bus": "scsi"}, "serial": "CDISK-1"})];
    let mut volumes = vec![json!({"name": "cdisk", "containerDisk": {"image": "example/disk"}})];
    let mut volume_status = Vec::new();
    for volume in hot {
        let serial = format!("{}-S", volume.to_uppercase());
        disks.push(json!({"name": volume, "disk": {"bus": "scsi"}, "serial": serial}));
        volumes.push(json!({"name": volume, "persistentVolumeClaim":
            {"claimName": volume, "hotpluggable": true}}));
        volume_status.push(json!({"name": volume, "phase": "MountedToPod"}));
    }
    let spec = &mut vmi["spec"];
    spec["domain"]["firmware"]["kernelBoot"]["kernelArgs"] =
        "console=ttyS0 loglevel=1 vmltest.write=CDISK-1".into();
    spec["domain"]["devices"]["disks"] = disks.into();
    spec["volumes"] = volumes.into();
    let mut status = status;
    status["migrationTransport"] = "Unix".into();
    status["volumeStatus"] = volume_status.into();
    vmi["status"] = status;
    vmi
}

/// The VMI's status once virt-controller started migration `migration`.
fn migrating(migration: &str) -> Value {
    json!({
        "phase": "Running",
        "migrationState": {
            "migrationUid": migration,
            "sourceNode": "node-a",
            "targetNode": "node-b",
            "targetPod": "virt-launcher-target",
        },
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// One call on the launcher at `socket`, as virt-handler makes it.
fn call<T, F: Future<Output = T>>(socket: &Path, f: impl FnOnce(CmdClient<Channel>) -> F) -> T {
    let rt = runtime();
    rt.block_on(async { f(cmd_client(socket).await).await })
}

fn vmi_call(socket: &Path, vmi: &Value, rpc: &str) -> Response {
    let request = vmi_request(vmi.to_string().into_bytes());
    let rpc = rpc.to_string();
    call(socket, |mut c| async move {
        let reply = match rpc.as_str() {
            "Sync" => c.sync_virtual_machine(request).await,
            "SyncMigrationTarget" => c.sync_migration_target(request).await,
            "Cancel" => c.cancel_virtual_machine_migration(request).await,
            "Finalize" => c.finalize_virtual_machine_migration(request).await,
            "SignalTargetPodCleanup" => c.signal_target_pod_cleanup(request).await,
            "Delete" => c.delete_virtual_machine(request).await,
            other => unreachable!("{other}"),
        };
        reply.unwrap().into_inner()
    })
}

fn migrate(socket: &Path, vmi: &Value, options: Vec<u8>) -> Response {
    let request = MigrationRequest {
        vmi: Some(Vmi {
            vmi_json: vmi.to_string().into_bytes(),
        }),
        options,
    };
    call(socket, |mut c| async move {
        c.migrate_virtual_machine(request)
            .await
            .unwrap()
            .into_inner()
    })
}

fn get_domain(socket: &Path) -> Value {
    let reply = call(socket, |mut c| async move {
        c.get_domain(EmptyRequest {}).await.unwrap().into_inner()
    });
    assert!(
        reply.response.as_ref().is_some_and(|r| r.success),
        "{reply:?}"
    );
    serde_json::from_str(&reply.domain).unwrap_or(Value::Null)
}

fn assert_ok(what: &str, r: Response, launcher: &VirtLauncher) {
    assert!(
        r.success,
        "{what}: {}\nlauncher stderr:\n{}",
        r.message,
        launcher.stderr_text()
    );
}

fn migration_meta(domain: &Value) -> &Value {
    &domain["Spec"]["Metadata"]["KubeVirt"]["Migration"]
}

/// The source boots the guest (first Sync); its boot id, from the line it writes at boot.
fn boot(source: &mut Pod, base: &Value) -> String {
    assert_ok(
        "the first Sync",
        vmi_call(&source.socket, base, "Sync"),
        &source.launcher,
    );
    let wrote = source
        .console()
        .line("the guest's write", BOOT_DEADLINE, |l| {
            l.starts_with("VMLTEST-WROTE CDISK-1 ")
        });
    source.notify.domain("Running", BOOT_DEADLINE, |_, d| {
        d["Status"]["Status"] == "Running"
    });
    wrote.split_whitespace().nth(2).unwrap().to_string()
}

/// virt-handler's target side: `SyncMigrationTarget`, then what its proxy connects to is there.
fn prepare_target(target: &mut Pod, vmi: &Value) {
    assert_ok(
        "SyncMigrationTarget",
        vmi_call(&target.socket, vmi, "SyncMigrationTarget"),
        &target.launcher,
    );
    assert!(target.proxy_dir().is_dir(), "no migrationproxy dir");
    let libvirt = target.libvirt_socket();
    assert!(
        std::fs::symlink_metadata(&libvirt).is_ok_and(|m| m.file_type().is_symlink()),
        "{} is no link",
        libvirt.display()
    );
    std::os::unix::net::UnixStream::connect(&libvirt)
        .unwrap_or_else(|e| panic!("{} leads to no libvirt: {e}", libvirt.display()));
}

#[test]
fn a_guest_migrates_between_kubevirt_launchers_and_keeps_its_boot() {
    let seen_at = common::disk_dir("vml-kvmig-pod-");
    let (name, uid) = ("migvmi", "6f0e2d1c-3b4a-4c5d-8e9f-0a1b2c3d4e5f");
    let mut source = Pod::start(seen_at.path(), name, uid);
    let mut target = Pod::start(seen_at.path(), name, uid);
    let boot_id = boot(
        &mut source,
        &vmi(name, uid, &[], json!({"phase": "Scheduled"})),
    );

    let moving = vmi(name, uid, &[], migrating("mig-1"));
    prepare_target(&mut target, &moving);
    let _proxies = proxies(&source, &target, uid);
    assert_ok(
        "MigrateVirtualMachine",
        migrate(&source.socket, &moving, options("0")),
        &source.launcher,
    );
    // Asked again while it runs (virt-handler retries): nothing more happens.
    assert_ok(
        "MigrateVirtualMachine again",
        migrate(&source.socket, &moving, options("0")),
        &source.launcher,
    );

    // The target has the guest, running, and says the migration is over.
    let arrived = target.notify.domain(
        "the guest running on the target, the migration ended",
        MIGRATION_DEADLINE,
        |_, d| d["Status"]["Status"] == "Running" && migration_meta(d)["EndTimestamp"].is_string(),
    );
    let m = migration_meta(&arrived);
    assert_eq!(m["UID"], "mig-1", "{arrived}");
    assert_eq!(m["Failed"], false, "{arrived}");
    assert_eq!(m["Mode"], "PreCopy", "{arrived}");
    assert!(m["StartTimestamp"].is_string(), "{arrived}");
    let domain = get_domain(&target.socket);
    assert_eq!(domain["Status"]["Status"], "Running", "{domain}");
    assert_eq!(migration_meta(&domain), m, "{domain}");

    // The source: shut off because it migrated, the migration completed; virt-handler deletes
    // such a domain, and the launcher exits 0.
    let left = source.notify.domain(
        "the source's domain migrated",
        MIGRATION_DEADLINE,
        |_, d| {
            d["Status"]["Status"] == "Shutoff"
                && d["Status"]["Reason"] == "Migrated"
                && migration_meta(d)["EndTimestamp"].is_string()
        },
    );
    let m = migration_meta(&left);
    assert_eq!(m["UID"], "mig-1", "{left}");
    assert_eq!(m["Failed"], false, "{left}");
    assert_eq!(m["AbortStatus"], "", "{left}");
    assert_ok(
        "Delete on the source",
        vmi_call(&source.socket, &moving, "Delete"),
        &source.launcher,
    );
    source
        .notify
        .domain("the source's domain deleted", GUEST_DEADLINE, |_, d| {
            d["ObjectMeta"]["deletionTimestamp"].is_string()
        });
    let status = source.launcher.wait_exit(Duration::from_secs(90));
    assert_eq!(status.code(), Some(0), "{}", source.launcher.stderr_text());

    // virt-handler finalizes on the target.
    assert_ok(
        "FinalizeVirtualMachineMigration",
        vmi_call(&target.socket, &moving, "Finalize"),
        &target.launcher,
    );
    // Still the first boot, with its container disk copied: a hot-plug makes the guest report.
    common::hotplug_image(&target.dirs.hotplug(), "hot1", 8 << 20);
    let mut console = target.console();
    assert_ok(
        "a hotplug Sync on the target",
        vmi_call(
            &target.socket,
            &vmi(name, uid, &["hot1"], migrating("mig-1")),
            "Sync",
        ),
        &target.launcher,
    );
    let common::GuestReport {
        read_back,
        boot_id: boot,
        ..
    } = common::report_with(&mut console, "HOT1-S");
    assert_eq!(boot, boot_id, "a second boot");
    assert_eq!(read_back, format!("vmltest {boot_id}"));
    let log = std::fs::read_to_string(target.dirs.console_log(&target.uid)).unwrap();
    assert!(!log.contains("VMLTEST-BOOTED"), "the target booted:\n{log}");

    target.launcher.signal(nix::sys::signal::Signal::SIGTERM);
    let status = target.launcher.wait_exit(Duration::from_secs(90));
    assert_eq!(status.code(), Some(0), "{}", target.launcher.stderr_text());
}

#[test]
fn a_cancelled_migration_leaves_the_guest_on_its_source() {
    let seen_at = common::disk_dir("vml-kvmig-pod-");
    let (name, uid) = ("cancelvmi", "0d9c8b7a-6f5e-4d3c-9b2a-1f0e9d8c7b6a");
    let mut source = Pod::start(seen_at.path(), name, uid);
    let mut target = Pod::start(seen_at.path(), name, uid);
    let boot_id = boot(
        &mut source,
        &vmi(name, uid, &[], json!({"phase": "Scheduled"})),
    );

    // Refused, naming the field; nothing starts.
    let not_ready = migrate(
        &source.socket,
        &vmi(name, uid, &[], json!({"phase": "Running"})),
        options("0"),
    );
    assert!(
        !not_ready.success && not_ready.message.contains("status.migrationState"),
        "{not_ready:?}"
    );
    let moving = vmi(name, uid, &[], migrating("mig-c"));
    let bad = migrate(&source.socket, &moving, options("fast"));
    assert!(
        !bad.success && bad.message.contains("options.Bandwidth"),
        "{bad:?}"
    );
    let domain = get_domain(&source.socket);
    assert!(migration_meta(&domain).is_null(), "{domain}");

    // A slow migration (1 MiB/s), seen under way: the incoming domain is on the target.
    prepare_target(&mut target, &moving);
    let _proxies = proxies(&source, &target, uid);
    assert_ok(
        "MigrateVirtualMachine",
        migrate(&source.socket, &moving, options("1Mi")),
        &source.launcher,
    );
    target.notify.domain(
        "the incoming domain on the target",
        MIGRATION_DEADLINE,
        |t, _| t == "ADDED",
    );
    assert_ok(
        "CancelVirtualMachineMigration",
        vmi_call(&source.socket, &moving, "Cancel"),
        &source.launcher,
    );
    let aborted = source
        .notify
        .domain("the migration aborted", MIGRATION_DEADLINE, |_, d| {
            migration_meta(d)["EndTimestamp"].is_string()
        });
    let m = migration_meta(&aborted);
    assert_eq!(m["AbortStatus"], "Succeeded", "{aborted}");
    assert_eq!(m["Failed"], true, "{aborted}");
    assert_eq!(
        m["FailureReason"], "Live migration has been aborted",
        "{aborted}"
    );
    let domain = get_domain(&source.socket);
    assert_eq!(domain["Status"]["Status"], "Running", "{domain}");
    // A migration is one shot: the same one is not run again.
    let again = migrate(&source.socket, &moving, options("0"));
    assert!(
        !again.success && again.message.contains("already executed"),
        "{again:?}"
    );

    // The target's guest never came: its domain goes; virt-handler cleans up, and the launcher
    // exits 0 as KubeVirt's does (the domain told virt-handler it failed).
    target
        .notify
        .domain("the incoming domain gone", MIGRATION_DEADLINE, |_, d| {
            d["ObjectMeta"]["deletionTimestamp"].is_string()
        });
    for rpc in ["SignalTargetPodCleanup", "Delete"] {
        assert_ok(
            rpc,
            vmi_call(&target.socket, &moving, rpc),
            &target.launcher,
        );
    }
    let status = target.launcher.wait_exit(Duration::from_secs(90));
    assert_eq!(status.code(), Some(0), "{}", target.launcher.stderr_text());

    // The guest still runs its first boot on the source.
    common::hotplug_image(&source.dirs.hotplug(), "hot1", 8 << 20);
    let mut console = source.console();
    assert_ok(
        "a hotplug Sync on the source",
        vmi_call(
            &source.socket,
            &vmi(name, uid, &["hot1"], migrating("mig-c")),
            "Sync",
        ),
        &source.launcher,
    );
    let boot = common::report_with(&mut console, "HOT1-S").boot_id;
    assert_eq!(boot, boot_id, "a second boot");

    source.launcher.signal(nix::sys::signal::Signal::SIGTERM);
    let status = source.launcher.wait_exit(Duration::from_secs(90));
    assert_eq!(status.code(), Some(0), "{}", source.launcher.stderr_text());
}
