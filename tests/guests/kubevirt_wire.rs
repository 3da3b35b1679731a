//! KubeVirt's wire, spoken by a client generated from KubeVirt's own protos (tonic, default
//! options) for what virt-handler's Go client never sends: malformed and oversized VMI JSON,
//! unknown and unsupported fields, a VMI for another pod, calls that are not built, a caller
//! that gives up while the first Sync is still defining the domain, and a Sync racing a
//! Shutdown. Each assertion is about an effect the handler could observe: the `Response`, the
//! domain `GetDomain` shows, the guest's console, the launcher's exit.
//!
//! Three launchers: one never gets a valid VMI (no guest, fast), two boot the TCG test guest
//! (one for a caller that gives up and a racing Shutdown, one for `SyncVirtualMachineCPUs` and
//! `SyncVirtualMachineMemory` as virt-handler sends them after a hotplug migration).

use crate::common;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tonic::transport::Channel;
use vmlauncher::console::ConsoleLog;
use vmlauncher::kubevirt::proto::cmd::cmd_client::CmdClient;
use vmlauncher::kubevirt::proto::cmd::{EmptyRequest, MigrationRequest, VmiRequest};
use vmlauncher::kubevirt::proto::cmd_info::cmd_info_client::CmdInfoClient;
use vmlauncher::kubevirt::proto::cmd_info::CmdInfoRequest;

use common::kubevirt::{cmd_client, guest_vmi_json, vmi_request, PodDirs, VirtLauncher};
use common::kubevirt_notify::NotifyRecorder;
use common::{ConsoleWait, BOOT_DEADLINE};

const NAME: &str = "wirevmi";
const NAMESPACE: &str = "kvwire";
const UID: &str = "0b6c2f3e-1d4a-4e5f-8a9b-7c6d5e4f3a2b";

/// virt-handler's deadline for a state-changing call: an answer later than this is a hang.
const HANDLER_DEADLINE: Duration = Duration::from_secs(20);

/// The domain as `GetDomain` answers it: `None` for `""` (no domain), else its decoded JSON.
/// A failed response or undecodable JSON fails the test.
async fn get_domain(client: &mut CmdClient<Channel>) -> Option<Value> {
    let answer = client
        .get_domain(EmptyRequest::default())
        .await
        .expect("GetDomain answers")
        .into_inner();
    let response = answer.response.expect("GetDomain carries a Response");
    assert!(response.success, "GetDomain failed: {}", response.message);
    if answer.domain.is_empty() {
        return None;
    }
    Some(
        serde_json::from_str(&answer.domain)
            .unwrap_or_else(|e| panic!("GetDomain's domain is not JSON ({e}):\n{}", answer.domain)),
    )
}

fn status_of(domain: &Value) -> &str {
    domain["Status"]["Status"].as_str().unwrap_or("")
}

/// Reads `GetDomain` until `done` accepts what it shows, within `within`, looking again after
/// each notify call the launcher makes (it notifies every change of the domain); fails naming
/// `what` and the last domain seen.
async fn wait_domain(
    client: &mut CmdClient<Channel>,
    notify: &mut NotifyRecorder,
    what: &str,
    within: Duration,
    mut done: impl FnMut(Option<&Value>) -> bool,
) -> Option<Value> {
    let deadline = Instant::now() + within;
    loop {
        let domain = get_domain(client).await;
        if done(domain.as_ref()) {
            return domain;
        }
        assert!(
            Instant::now() < deadline,
            "GetDomain did not show {what} within {within:?}; last: {domain:#?}"
        );
        tokio::task::block_in_place(|| notify.next_event(deadline));
    }
}

/// A Sync whose answer must be a refusal naming every one of `naming`, with nothing created
/// and the launcher still serving.
async fn refused(client: &mut CmdClient<Channel>, what: &str, vmi_json: Vec<u8>, naming: &[&str]) {
    let response = client
        .sync_virtual_machine(vmi_request(vmi_json))
        .await
        .unwrap_or_else(|s| panic!("{what}: the Sync's call failed instead of answering: {s}"))
        .into_inner();
    assert!(!response.success, "{what}: accepted");
    eprintln!(
        "{what}: refused: {}",
        response.message.chars().take(300).collect::<String>()
    );
    for needle in naming {
        assert!(
            response.message.contains(needle),
            "{what}: the refusal does not name {needle:?}: {}",
            response.message
        );
    }
    assert_eq!(
        get_domain(client).await,
        None,
        "{what}: refused, yet a domain exists"
    );
    let ping = client.ping(EmptyRequest::default()).await;
    assert!(
        ping.as_ref().is_ok_and(|p| p.get_ref().success),
        "{what}: the launcher no longer answers Ping: {ping:?}"
    );
}

/// The guest's VMI with `change` applied, as bytes on the wire.
fn vmi_with(name: &str, namespace: &str, change: impl FnOnce(&mut Value)) -> Vec<u8> {
    let mut vmi = guest_vmi_json(name, namespace, UID);
    change(&mut vmi);
    vmi.to_string().into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wire_refuses_what_the_go_client_never_sends() {
    let dirs = PodDirs::new();
    let mut launcher = VirtLauncher::start(&dirs, &dirs.flags(NAME, NAMESPACE, UID));
    let socket = tokio::task::block_in_place(|| launcher.wait_serving(&dirs));
    let mut client = cmd_client(&socket).await;

    // CmdInfo on the same socket: the versions virt-handler negotiates before anything else.
    let info = CmdInfoClient::new(vmlauncher::api::channel(&socket).await.unwrap())
        .info(CmdInfoRequest::default())
        .await
        .expect("CmdInfo.Info answers")
        .into_inner();
    assert_eq!(info.supported_cmd_versions, vec![1]);

    // Malformed documents: the refusal names the field (`vmi.vmiJson`) and the document.
    refused(
        &mut client,
        "not JSON",
        b"{not json".to_vec(),
        &["vmi.vmiJson", "(document)"],
    )
    .await;
    refused(
        &mut client,
        "empty",
        Vec::new(),
        &["vmi.vmiJson", "(document)"],
    )
    .await;
    refused(
        &mut client,
        "a JSON array",
        b"[1,2]".to_vec(),
        &["vmi.vmiJson", "(document)"],
    )
    .await;
    let mut not_utf8 = vmi_with(NAME, NAMESPACE, |_| {});
    not_utf8.splice(1..1, [0xff, 0xfe]);
    refused(
        &mut client,
        "invalid UTF-8",
        not_utf8,
        &["vmi.vmiJson", "(document)", "UTF-8"],
    )
    .await;
    // 2 MiB of valid JSON, a VMI otherwise fine (under tonic's 4 MiB message limit, so it
    // reaches the launcher): over the spec's document bound, refused before it is parsed.
    let huge = vmi_with(NAME, NAMESPACE, |v| {
        v["metadata"]["annotations"] = json!({"padding": "x".repeat(2 << 20)});
    });
    assert!(huge.len() > 2 << 20);
    refused(
        &mut client,
        "2 MiB of JSON",
        huge,
        &["vmi.vmiJson", "(document)", "bytes, at most"],
    )
    .await;

    // A field KubeVirt does not have, and one it has that vmlauncher does not implement.
    let unknown = vmi_with(NAME, NAMESPACE, |v| {
        v["spec"]["domain"]["noSuchField"] = json!(true)
    });
    refused(
        &mut client,
        "an unknown field",
        unknown,
        &["spec.domain.noSuchField", "unknown field"],
    )
    .await;
    let unsupported = vmi_with(NAME, NAMESPACE, |v| {
        v["spec"]["domain"]["devices"]["gpus"] =
            json!([{"name": "gpu1", "deviceName": "nvidia.com/GP100"}]);
    });
    refused(
        &mut client,
        "a KubeVirt field outside the subset",
        unsupported,
        &["spec.domain.devices.gpus", "unsupported"],
    )
    .await;

    // A valid VMI for another pod: were it accepted, this launcher would run someone else's VM
    // (and GetDomain would show it; `refused` checks it does not).
    let other_name = vmi_with("othervmi", NAMESPACE, |_| {});
    refused(&mut client, "another name", other_name, &["othervmi"]).await;
    let other_namespace = vmi_with(NAME, "otherns", |_| {});
    refused(
        &mut client,
        "another namespace",
        other_namespace,
        &["otherns"],
    )
    .await;

    // A migration asked before virt-controller made one: refused, naming the field.
    let migrate = client
        .migrate_virtual_machine(MigrationRequest {
            vmi: vmi_request(vmi_with(NAME, NAMESPACE, |_| {})).vmi,
            options: Vec::new(),
        })
        .await
        .expect("a Response")
        .into_inner();
    assert!(
        !migrate.success && migrate.message.contains("status.migrationState"),
        "MigrateVirtualMachine: {migrate:?}"
    );

    // Not built: the status code virt-handler's client checks, not a Response.
    let devices = client
        .hotplug_host_devices(vmi_request(vmi_with(NAME, NAMESPACE, |_| {})))
        .await;
    assert_eq!(
        devices.as_ref().map_err(tonic::Status::code).err(),
        Some(tonic::Code::Unimplemented),
        "HotplugHostDevices: {devices:?}"
    );

    // After all of that the launcher is consistent enough to end as a pod's launcher does.
    launcher.signal(nix::sys::signal::Signal::SIGTERM);
    let status = tokio::task::block_in_place(|| launcher.wait_exit(Duration::from_secs(90)));
    assert_eq!(status.code(), Some(0), "{}", launcher.stderr_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_gives_up_and_a_sync_racing_a_shutdown() {
    let started = Instant::now();
    let dirs = PodDirs::new();
    let mut notify = NotifyRecorder::serve(&dirs.share());
    let mut launcher = VirtLauncher::start(&dirs, &dirs.flags(NAME, NAMESPACE, UID));
    let socket = tokio::task::block_in_place(|| launcher.wait_serving(&dirs));
    let mut client = cmd_client(&socket).await;
    let vmi = guest_vmi_json(NAME, NAMESPACE, UID);

    // A first Sync that passes validation but cannot start (QEMU finds no kernel; in a cluster:
    // a file not in the pod yet) fails and leaves no domain. virt-handler retries such a Sync;
    // the retry below must be able to create the domain (it once answered "the hypervisor is
    // unreachable" for good: the failed attempt had used up libvirt's events).
    let mut no_kernel = vmi.clone();
    no_kernel["spec"]["domain"]["firmware"]["kernelBoot"]["container"]["kernelPath"] =
        json!(dirs.root.path().join("no-such-vmlinuz"));
    let failed = client
        .sync_virtual_machine(vmi_request(no_kernel.to_string().into_bytes()))
        .await
        .expect("the failing Sync answers")
        .into_inner();
    assert!(
        !failed.success && failed.message.contains("no-such-vmlinuz"),
        "a Sync whose QEMU cannot start: {failed:?}"
    );
    assert_eq!(
        get_domain(&mut client).await,
        None,
        "a failed first Sync left a domain"
    );

    // The retry defines and starts the domain: seconds of libvirt and QEMU. The caller
    // gives up after 200 ms, as virt-handler does at its 20 s deadline (the same mechanism:
    // `grpc-timeout`, and the caller dropping the call), so the call is cut off mid-define.
    let mut first = tonic::Request::new(vmi_request(vmi.to_string().into_bytes()));
    first.set_timeout(Duration::from_millis(200));
    let asked = Instant::now();
    let cut =
        tokio::time::timeout(Duration::from_secs(2), client.sync_virtual_machine(first)).await;
    eprintln!(
        "the retried first Sync, cut off after {:?}: {cut:?}",
        asked.elapsed()
    );
    match &cut {
        // The caller dropped the call itself.
        Err(_) => {}
        // tonic's client enforces `grpc-timeout` (Cancelled, "Timeout expired"); the server
        // drops its handler future at the same deadline, so only work on a task of its own
        // (or inside one uninterruptible poll) goes on.
        Ok(Err(status)) => assert!(
            matches!(
                status.code(),
                tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
            ),
            "the cut-off Sync: {status:?}"
        ),
        // An answer within 200 ms would mean the define was not under way when the caller
        // gave up, and this test would prove nothing.
        Ok(Ok(answer)) => {
            panic!("the retried first Sync answered within its 200 ms deadline: {answer:?}")
        }
    }
    // Nobody syncs again: the work the caller abandoned must finish on its own.
    let running = wait_domain(&mut client, &mut notify, "Running", BOOT_DEADLINE, |d| {
        d.is_some_and(|d| status_of(d) == "Running")
    })
    .await
    .unwrap();
    assert_eq!(running["ObjectMeta"]["name"], NAME);
    assert_eq!(running["ObjectMeta"]["namespace"], NAMESPACE);
    let mut console = ConsoleLog::from_start(&dirs.console_log(UID)).unwrap();
    tokio::task::block_in_place(|| {
        console.line("the guest's boot line", BOOT_DEADLINE, |l| {
            l.contains("VMLTEST-BOOTED")
        })
    });

    // A hotplug Sync (the volume mounted into the pod) and a Shutdown, at once, on two
    // connections, as two handler goroutines could send them.
    common::hotplug_image(&dirs.hotplug(), "hp1", 64 << 20);
    let mut hotplug = vmi.clone();
    hotplug["spec"]["domain"]["devices"]["disks"] = json!([
        {"name": "hp1", "serial": "wire_hp1", "disk": {"bus": "scsi"}}
    ]);
    hotplug["spec"]["volumes"] = json!([
        {"name": "hp1", "persistentVolumeClaim": {"claimName": "hp1", "hotpluggable": true}}
    ]);
    hotplug["status"]["volumeStatus"] =
        json!([{"name": "hp1", "phase": "MountedToPod", "hotplugVolume": {}}]);
    let call = |what: &'static str, request: VmiRequest| {
        let socket = socket.clone();
        tokio::spawn(async move {
            let mut client = cmd_client(&socket).await;
            let mut request = tonic::Request::new(request);
            request.set_timeout(HANDLER_DEADLINE);
            let asked = Instant::now();
            let answer = tokio::time::timeout(HANDLER_DEADLINE, async {
                match what {
                    "Sync" => client.sync_virtual_machine(request).await,
                    _ => client.shutdown_virtual_machine(request).await,
                }
            })
            .await
            .unwrap_or_else(|_| panic!("{what} racing: no answer within {HANDLER_DEADLINE:?}"))
            .unwrap_or_else(|s| panic!("{what} racing: the call failed: {s}"))
            .into_inner();
            eprintln!("{what} answered in {:?}: {answer:?}", asked.elapsed());
            answer
        })
    };
    let sync = call("Sync", vmi_request(hotplug.to_string().into_bytes()));
    let shutdown = call("Shutdown", vmi_request(vmi.to_string().into_bytes()));
    // The Sync may have lost the race (the domain going down): either answer is the handler's
    // to act on, so only its coming in time is checked. The Shutdown must have been taken, or
    // the guest would not power off.
    let (_sync, shutdown) = (sync.await.unwrap(), shutdown.await.unwrap());
    assert!(
        shutdown.success,
        "Shutdown racing a Sync: {}",
        shutdown.message
    );

    // The ACPI button, pressed once (virt-handler would press again every few seconds and kill
    // after the grace period): the booted guest powers off.
    let off = Duration::from_secs(30) + BOOT_DEADLINE;
    let last = wait_domain(
        &mut client,
        &mut notify,
        "the guest powered off",
        off,
        |d| d.is_none_or(|d| status_of(d) == "Shutoff"),
    )
    .await;
    if let Some(d) = &last {
        // The Shutdown's grace period start, stamped for virt-handler.
        assert!(
            !d["Spec"]["Metadata"]["KubeVirt"]["GracePeriod"]["DeletionTimestamp"].is_null(),
            "no grace period stamp: {d:#}"
        );
    }
    // Consistent afterwards: the domain still decodes, the launcher still answers and ends
    // cleanly.
    let _ = get_domain(&mut client).await;
    assert!(
        client
            .ping(EmptyRequest::default())
            .await
            .unwrap()
            .get_ref()
            .success
    );
    launcher.signal(nix::sys::signal::Signal::SIGTERM);
    let status = tokio::task::block_in_place(|| launcher.wait_exit(Duration::from_secs(90)));
    assert_eq!(status.code(), Some(0), "{}", launcher.stderr_text());
    eprintln!("guest test took {:?}", started.elapsed());
}

/// The enabled vCPUs of `GetDomain`'s `VCPUs` (every vCPU of the room, `Enabled` yes or no).
fn enabled_vcpus(domain: &Value) -> usize {
    domain["Spec"]["VCPUs"]["VCPU"]
        .as_array()
        .unwrap_or_else(|| panic!("no VCPUs in the domain: {domain:#}"))
        .iter()
        .filter(|v| v["Enabled"] == "yes")
        .count()
}

/// What virt-handler's migration target controller sends once a VM moved to a bigger pod for a
/// CPU or memory hotplug (`hotplugCPU`, `hotplugMemory`): the VMI whose spec asks for more,
/// through `SyncVirtualMachineCPUs` and `SyncVirtualMachineMemory`. The migration itself is not
/// needed for what the launcher does with the calls (its domain is the one it runs either way;
/// `kubevirt_migration` moves a guest); the guest's own console says what it got.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpus_and_memory_synced_as_after_a_migration_to_a_bigger_pod() {
    const CPUS: &str = "wirecpus";
    const CPUS_UID: &str = "3e9a7c1d-5b2f-4c6e-9d8a-1f2e3d4c5b6a";
    let dirs = PodDirs::new();
    let mut launcher = VirtLauncher::start(&dirs, &dirs.flags(CPUS, NAMESPACE, CPUS_UID));
    let socket = tokio::task::block_in_place(|| launcher.wait_serving(&dirs));
    let mut client = cmd_client(&socket).await;
    let vmi = |sockets: u32, guest: &str| {
        let mut vmi = guest_vmi_json(CPUS, NAMESPACE, CPUS_UID);
        let domain = &mut vmi["spec"]["domain"];
        domain["cpu"] = json!({"sockets": sockets, "maxSockets": 2});
        domain["memory"] = json!({"guest": guest, "maxGuest": "2Gi"});
        // Memory onlined movable: what virtio-mem plugged the guest can give back.
        domain["firmware"]["kernelBoot"]["kernelArgs"] =
            json!("console=ttyS0 loglevel=1 memhp_default_state=online_movable");
        vmi_request(vmi.to_string().into_bytes())
    };

    // No domain yet: refused, as KubeVirt's launcher finds no domain; none is started.
    let early = client.sync_virtual_machine_cp_us(vmi(2, "1Gi")).await;
    let early = early.expect("SyncVirtualMachineCPUs answers").into_inner();
    assert!(
        !early.success && early.message.contains("no domain"),
        "before any Sync: {early:?}"
    );
    assert_eq!(get_domain(&mut client).await, None);

    let first = client.sync_virtual_machine(vmi(1, "1Gi")).await.unwrap();
    assert!(first.get_ref().success, "the first Sync: {first:?}");
    let mut console = ConsoleLog::from_start(&dirs.console_log(CPUS_UID)).unwrap();
    tokio::task::block_in_place(|| common::guest_reports(&mut console, "VMLTEST-CPUS", |n| n == 1));
    let booted = tokio::task::block_in_place(|| {
        common::guest_reports(&mut console, "VMLTEST-MEMORY", |_| true)
    });

    // The bigger pod's CPUs: the second socket reaches the guest.
    let cpus = client.sync_virtual_machine_cp_us(vmi(2, "1Gi")).await;
    let cpus = cpus.expect("SyncVirtualMachineCPUs answers").into_inner();
    assert!(cpus.success, "SyncVirtualMachineCPUs 1 -> 2: {cpus:?}");
    tokio::task::block_in_place(|| common::guest_reports(&mut console, "VMLTEST-CPUS", |n| n == 2));
    let domain = get_domain(&mut client).await.unwrap();
    assert_eq!(enabled_vcpus(&domain), 2);

    // And its memory: virtio-mem's 512Mi more.
    let memory = client.sync_virtual_machine_memory(vmi(2, "1536Mi")).await;
    let memory = memory
        .expect("SyncVirtualMachineMemory answers")
        .into_inner();
    assert!(
        memory.success,
        "SyncVirtualMachineMemory 1Gi -> 1536Mi: {memory:?}"
    );
    tokio::task::block_in_place(|| {
        common::guest_reports(&mut console, "VMLTEST-MEMORY", |kb| {
            kb == booted + 512 * 1024
        })
    });

    // Beyond the room: refused naming the field, nothing changed.
    let before = get_domain(&mut client).await;
    let beyond = client.sync_virtual_machine_cp_us(vmi(3, "1536Mi")).await;
    let beyond = beyond.expect("SyncVirtualMachineCPUs answers").into_inner();
    assert!(
        !beyond.success && beyond.message.contains("spec.domain.cpu.sockets"),
        "3 sockets in a room of 2: {beyond:?}"
    );
    assert_eq!(get_domain(&mut client).await, before);

    // A decrease (KubeVirt's VM controller never sends one): the guest keeps its vCPUs and the
    // answer names the restart, so virt-handler keeps currentCPUTopology at what the guest has.
    let down = client.sync_virtual_machine_cp_us(vmi(1, "1536Mi")).await;
    let down = down.expect("SyncVirtualMachineCPUs answers").into_inner();
    assert!(
        !down.success && down.message.contains("requires a restart"),
        "2 -> 1 sockets: {down:?}"
    );
    assert_eq!(enabled_vcpus(&get_domain(&mut client).await.unwrap()), 2);
    // The same VMI again (virt-handler's retry, or its next SyncVirtualMachine) changes nothing.
    let again = client.sync_virtual_machine_cp_us(vmi(2, "1536Mi")).await;
    let again = again.expect("SyncVirtualMachineCPUs answers").into_inner();
    assert!(again.success, "back to 2 sockets: {again:?}");
    assert_eq!(enabled_vcpus(&get_domain(&mut client).await.unwrap()), 2);

    launcher.signal(nix::sys::signal::Signal::SIGTERM);
    let status = tokio::task::block_in_place(|| launcher.wait_exit(Duration::from_secs(90)));
    assert_eq!(status.code(), Some(0), "{}", launcher.stderr_text());
}
