//! The KubeVirt drop-in, driven by virt-handler's own code: `handler-replay` (built from
//! KubeVirt's tree: its cmd client and notify server, unmodified) against `vmlauncher
//! virt-launcher` on a real TCG guest. It negotiates, pings, has an invalid VMI refused, syncs
//! the VM up, decodes the domain until Running, hot-plugs a volume the guest sees by serial and
//! unplugs it, pauses across a Sync, reads guest info and QEMU's version, shuts down and deletes;
//! it ends with `HELD`. Then SIGTERM ends the launcher with 0.

use crate::common;

use std::time::Duration;

use common::kubevirt::{guest_vmi_json, handler_replay_holds, PodDirs, VirtLauncher};

#[test]
fn virt_handlers_own_client_drives_the_launcher_to_held() {
    let dirs = PodDirs::new();
    let (name, namespace, uid) = ("testvmi", "kvtest", "5d6f1a2b-7c1e-4a8b-9d0e-1f2a3b4c5d6e");
    let vmi = dirs.root.path().join("vmi.json");
    std::fs::write(&vmi, guest_vmi_json(name, namespace, uid).to_string()).unwrap();
    let mut launcher = VirtLauncher::start(&dirs, &dirs.flags(name, namespace, uid));

    handler_replay_holds(
        &dirs.share(),
        &vmi,
        &dirs.hotplug(),
        &dirs.consoles(uid),
        || format!("launcher stderr:\n{}", launcher.stderr_text()),
    );

    launcher.signal(nix::sys::signal::Signal::SIGTERM);
    let status = launcher.wait_exit(Duration::from_secs(90));
    assert_eq!(status.code(), Some(0), "{}", launcher.stderr_text());
    assert!(
        !dirs.sockets().join("launcher-sock").exists(),
        "the socket is removed at exit"
    );
}

/// SIGTERM as the kubelet sends it when the pod is deleted: the domain is marked for graceful
/// shutdown and virt-handler told, the guest powers off through ACPI within its grace period,
/// virt-handler learns that the domain is gone, and the launcher exits 0.
#[test]
fn sigterm_marks_notifies_and_stops_the_guest_gracefully() {
    use common::kubevirt_notify::NotifyRecorder;
    use vmlauncher::kubevirt::proto::cmd::{cmd_client::CmdClient, Vmi, VmiRequest};

    let dirs = PodDirs::new();
    let (name, namespace, uid) = ("termvmi", "kvtest", "a4c1e3f0-9b8d-4e6f-8a2b-3c4d5e6f7a8b");
    let mut notify = NotifyRecorder::serve(&dirs.share());
    let mut launcher = VirtLauncher::start(&dirs, &dirs.flags(name, namespace, uid));

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let socket = dirs.sockets().join(vmlauncher::kubevirt::READY_SOCKET);
    // The readiness rename is the only signal, as for virt-handler.
    let ready = vmlauncher::host::watch::wait_for_change_in(
        &[&dirs.sockets()],
        std::time::Instant::now() + Duration::from_secs(120),
        || socket.exists(),
    )
    .unwrap();
    assert!(
        ready,
        "no launcher-sock within 120 s: {}",
        launcher.stderr_text()
    );
    let response = runtime.block_on(async {
        let channel = vmlauncher::api::channel(&socket).await.unwrap();
        CmdClient::new(channel)
            .sync_virtual_machine(VmiRequest {
                vmi: Some(Vmi {
                    vmi_json: guest_vmi_json(name, namespace, uid)
                        .to_string()
                        .into_bytes(),
                }),
                options: None,
            })
            .await
            .unwrap()
            .into_inner()
    });
    assert!(response.success, "{}", response.message);
    let added = notify.domain("ADDED", Duration::from_secs(120), |t, _| t == "ADDED");
    assert_eq!(added["ObjectMeta"]["uid"], uid);
    notify.domain("Running", common::BOOT_DEADLINE, |_, d| {
        d["Status"]["Status"] == "Running"
    });
    let mut console = vmlauncher::console::ConsoleLog::from_start(&dirs.console_log(uid))
        .expect("the console log");
    common::wait_booted(&mut console);

    launcher.signal(nix::sys::signal::Signal::SIGTERM);
    let marked = notify.domain(
        "MarkedForGracefulShutdown",
        Duration::from_secs(30),
        |_, d| {
            d["Spec"]["Metadata"]["KubeVirt"]["GracePeriod"]["MarkedForGracefulShutdown"] == true
        },
    );
    assert_eq!(marked["Spec"]["Metadata"]["KubeVirt"]["UID"], uid);
    use common::ConsoleWait;
    console.line("the guest's ACPI power-off", common::GUEST_DEADLINE, |l| {
        l.contains("VMLTEST-ACPI-POWEROFF")
    });
    notify.domain("the domain gone", Duration::from_secs(60), |_, d| {
        d["ObjectMeta"]["deletionTimestamp"].is_string()
    });
    let status = launcher.wait_exit(Duration::from_secs(90));
    assert_eq!(status.code(), Some(0), "{}", launcher.stderr_text());
}
