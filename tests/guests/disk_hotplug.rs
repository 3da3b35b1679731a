//! The walking skeleton, end to end, against a real private libvirtd and a real TCG guest:
//! boot → the guest's boot line → Sync two new scsi disks → the guest reports both serials →
//! Sync without one → the guest reports it gone → the same spec again changes nothing → bad Syncs
//! are refused and change nothing → SIGTERM → the domain is gone and the launcher exited 0.

use crate::common;

use std::time::{Duration, Instant};

use common::{
    alive, guest_spec, live_xml, with_claims, ConsoleWait, Launched, BOOT_DEADLINE, GUEST_DEADLINE,
};
use vmlauncher::api::{self, proto};

/// The status is compared before and after refused or empty Syncs: a guest agent connecting on
/// its own meanwhile would change it (`AgentConnected`).
const NO_AGENT: &str = "vmltest.agent=off";

fn disk_image(dir: &std::path::Path, name: &str, mib: u64) -> std::path::PathBuf {
    let path = dir.join(name);
    common::sparse_file(&path, mib);
    path
}

/// Sends a Sync; its reply, or the status it was refused with.
async fn sync(
    client: &mut common::Client,
    spec: String,
) -> Result<proto::SyncResponse, tonic::Status> {
    client
        .sync(proto::SyncRequest {
            spec,
            ..Default::default()
        })
        .await
        .map(tonic::Response::into_inner)
}

/// Sends SIGCONT to the process when dropped: a libvirtd a test stopped is never left stopped,
/// even when the test fails half-way.
struct Resumed(i32);

impl Drop for Resumed {
    fn drop(&mut self) {
        let _ = common::signal_pid(self.0, nix::sys::signal::Signal::SIGCONT);
    }
}

/// A dry-run Sync to `spec`, which must succeed.
async fn dry_run(client: &mut common::Client, spec: String) -> proto::SyncResponse {
    let request = proto::SyncRequest {
        spec,
        dry_run: true,
        ..Default::default()
    };
    common::sync_ok(client, request, "a dry run").await
}

/// `(serial, size in 512-byte sectors)` for every disk in a `VMLTEST-DISKS` line.
fn sized_serials(line: &str) -> Vec<(String, u64)> {
    line.split_whitespace()
        .skip(1)
        .filter_map(|d| {
            let mut parts = d.split(':').skip(1);
            Some((parts.next()?.to_string(), parts.next()?.parse().ok()?))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn boot_hotplug_unplug_and_stop_in_a_real_guest() {
    let name = "e2e-hotplug";
    let mut vm = Launched::start(&guest_spec(name, NO_AGENT, &[]), &[]);
    let running = vm.wait_stdout("phase Running", BOOT_DEADLINE);
    eprintln!("{running}");
    let mut console = vm.console();
    let deadline = Instant::now() + BOOT_DEADLINE;
    console
        .wait_for("the guest's boot line", deadline, |l| {
            l.contains("VMLTEST-BOOTED")
        })
        .unwrap();
    console
        .wait_for("the guest's first disk report", deadline, |l| {
            l == "VMLTEST-DISKS"
        })
        .unwrap();
    let qemu_pid = vm.qemu_pid(name);
    let daemon_pid = vm
        .pid_from("libvirt/libvirtd.pid")
        .expect("libvirtd's pid file");
    assert!(alive(qemu_pid) && alive(daemon_pid));

    let one = disk_image(vm.scratch(), "one.img", 8);
    let two = disk_image(vm.scratch(), "two.img", 16);
    // Mixed case on purpose: KubeVirt lower-cases serials; we keep them as written.
    let two_disks = [
        ("one", "E2E-Serial-One", one.as_path()),
        ("two", "e2e.serial_TWO", two.as_path()),
    ];
    let both = guest_spec(name, NO_AGENT, &two_disks);
    let only_one = guest_spec(name, NO_AGENT, &[("one", "E2E-Serial-One", &one)]);

    let mut client = api::connect(&vm.socket()).await.expect("gRPC socket");
    let started = Instant::now();
    let reply = sync(&mut client, both.clone())
        .await
        .expect("Sync with two new disks");
    eprintln!("Sync attaching 2 disks took {:?}", started.elapsed());
    let ready: Vec<_> = reply
        .volumes
        .iter()
        .map(|v| {
            (
                v.name.as_str(),
                v.target.as_str(),
                v.serial.as_str(),
                v.phase,
            )
        })
        .collect();
    let ready_phase = proto::volume_status::Phase::Ready as i32;
    assert_eq!(
        ready,
        [
            ("one", "sda", "E2E-Serial-One", ready_phase),
            ("two", "sdb", "e2e.serial_TWO", ready_phase)
        ]
    );
    let line = console.line(
        "both hot-plugged serials in the guest",
        GUEST_DEADLINE,
        |l| {
            let s = common::guest_serials(l);
            l.starts_with("VMLTEST-DISKS")
                && s.contains(&"E2E-Serial-One".into())
                && s.contains(&"e2e.serial_TWO".into())
        },
    );
    // The guest names disks in its own probe order; libvirt's target names are only hints.
    let mut seen = sized_serials(&line);
    seen.sort();
    assert_eq!(
        seen,
        [
            ("E2E-Serial-One".to_string(), 16384),
            ("e2e.serial_TWO".to_string(), 32768)
        ],
        "{line}"
    );

    let started = Instant::now();
    let reply = sync(&mut client, only_one.clone())
        .await
        .expect("Sync without disk two");
    eprintln!(
        "Sync detaching 1 disk (until DEVICE_REMOVED) took {:?}",
        started.elapsed()
    );
    assert_eq!(reply.plan.len(), 1);
    assert_eq!(reply.plan[0].volume, "two");
    assert_eq!(
        reply.plan[0].action,
        proto::planned_change::Action::Detach as i32
    );
    assert_eq!(
        reply
            .volumes
            .iter()
            .map(|v| v.name.as_str())
            .collect::<Vec<_>>(),
        ["one"]
    );
    console.line("disk two gone from the guest", GUEST_DEADLINE, |l| {
        l.starts_with("VMLTEST-DISKS") && common::guest_serials(l) == ["E2E-Serial-One"]
    });

    // The same spec again: no plan, and libvirt's live XML is byte for byte the same.
    let uri = vm.libvirt_uri();
    let domain = format!("default_{name}");
    let before = live_xml(&uri, &domain);
    // The bare `q35` of the spec was resolved, by libvirt at the define, to this host's
    // versioned machine.
    assert!(before.contains("machine='pc-q35-"), "{before}");
    // Room for devices plugged later: the launcher's four spare root ports and libvirt's one,
    // empty, with every boot device placed (the one define counted what they take).
    assert_eq!(common::libvirt::empty_root_ports(&before), 5, "{before}");
    let status_before = common::status(&mut client).await;
    let reply = sync(&mut client, only_one.clone())
        .await
        .expect("the same Sync again");
    assert!(reply.plan.is_empty(), "{:?}", reply.plan);
    assert_eq!(live_xml(&uri, &domain), before);
    assert_eq!(common::status(&mut client).await, status_before);

    // Bad Syncs: refused with the field named, and nothing changes.
    for (spec, what, code, named) in [
        (
            only_one.replace("E2E-Serial-One", &"S".repeat(37)),
            "a 37-character scsi serial",
            tonic::Code::InvalidArgument,
            "spec.domain.devices.disks[0].serial: 37 characters, at most 36 on bus scsi",
        ),
        (
            only_one.replace("    memory:\n", "    memory:\n      overcommit: true\n"),
            "an unknown field",
            tonic::Code::InvalidArgument,
            "spec.domain.memory.overcommit: unknown field",
        ),
        (
            both.replace("guest: 256Mi", "guest: 512Mi"),
            "a memory change",
            tonic::Code::FailedPrecondition,
            "spec.domain.memory",
        ),
    ] {
        let err = sync(&mut client, spec).await.expect_err(what);
        assert_eq!(err.code(), code, "{what}");
        assert!(err.message().contains(named), "{what}: {}", err.message());
    }
    assert_eq!(
        live_xml(&uri, &domain),
        before,
        "a refused Sync touched the domain"
    );

    // A dry run plans without doing.
    let reply = dry_run(&mut client, both.clone()).await;
    assert_eq!(
        reply
            .plan
            .iter()
            .map(|c| c.volume.as_str())
            .collect::<Vec<_>>(),
        ["two"]
    );
    assert_eq!(
        live_xml(&uri, &domain),
        before,
        "a dry run touched the domain"
    );

    // A caller that stops waiting cuts nothing off. A Sync whose deadline (gRPC's
    // `grpc-timeout`, which the server enforces by dropping the call) passes while it waits
    // for the task slot is still applied once the slot is free. The slot is held by a Sync
    // whose attach waits for a libvirtd stopped with SIGSTOP.
    let three = disk_image(vm.scratch(), "three.img", 8);
    let [disk_one, disk_two] = two_disks;
    let all_three = guest_spec(
        name,
        NO_AGENT,
        &[disk_one, disk_two, ("three", "E2E-THREE", three.as_path())],
    );
    let mut events = common::EventWatcher::start(&vm.socket()).await;
    common::signal_pid(daemon_pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let stopped = Resumed(daemon_pid);
    let holding = {
        let (mut client, both) = (client.clone(), both.clone());
        tokio::spawn(async move { sync(&mut client, both).await })
    };
    events
        .wait_for("disk two attaching", GUEST_DEADLINE, |e| {
            matches!(&e.kind, Some(proto::event::Kind::Volume(v))
                if v.name == "two" && v.phase == proto::volume_status::Phase::Attaching as i32)
        })
        .await;
    let mut request = tonic::Request::new(proto::SyncRequest {
        spec: all_three.clone(),
        ..Default::default()
    });
    request.set_timeout(Duration::from_millis(500));
    // tonic's client keeps the deadline too; bounded here all the same.
    let given_up = tokio::time::timeout(GUEST_DEADLINE, client.sync(request))
        .await
        .expect("the call ends at its deadline")
        .expect_err("the deadline passes while the slot is held");
    assert!(
        matches!(
            given_up.code(),
            tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
        ),
        "{given_up:?}"
    );
    drop(stopped);
    holding.await.unwrap().expect("the Sync that held the slot");
    // The slot is handed over in order: this dry run comes after the Sync given up.
    let after = dry_run(&mut client, all_three.clone()).await;
    assert!(
        after.plan.is_empty(),
        "the given-up Sync was not applied: {:?}",
        after.plan
    );
    console.line("disk three in the guest", GUEST_DEADLINE, |l| {
        l.starts_with("VMLTEST-DISKS") && common::guest_serials(l).contains(&"E2E-THREE".into())
    });
    sync(&mut client, only_one.clone())
        .await
        .expect("back to disk one alone");
    console.line("only disk one in the guest again", GUEST_DEADLINE, |l| {
        l.starts_with("VMLTEST-DISKS") && common::guest_serials(l) == ["E2E-Serial-One"]
    });

    // Two attaches are before libvirt at once; the second waits in libvirtd for the domain's
    // job, held by the first. With QEMU stopped, the first holds it past libvirt's 30 s wait:
    // the second asks again, its status saying why, instead of failing, and both are attached
    // once QEMU runs again.
    let four = disk_image(vm.scratch(), "four.img", 8);
    let five = disk_image(vm.scratch(), "five.img", 8);
    let with_four_and_five = guest_spec(
        name,
        NO_AGENT,
        &[
            ("one", "E2E-Serial-One", one.as_path()),
            ("four", "E2E-FOUR", four.as_path()),
            ("five", "E2E-FIVE", five.as_path()),
        ],
    );
    let mut events = common::EventWatcher::start(&vm.socket()).await;
    common::signal_pid(qemu_pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let stopped = Resumed(qemu_pid);
    let attaching = {
        let mut client = client.clone();
        tokio::spawn(async move { sync(&mut client, with_four_and_five).await })
    };
    events
        .wait_for(
            "an attach asking libvirt again after its 30 s wait for the job",
            Duration::from_secs(120),
            |e| {
                matches!(&e.kind, Some(proto::event::Kind::Volume(v))
                    if v.reason == "WaitingForDomainJob"
                        && v.phase == proto::volume_status::Phase::Attaching as i32)
            },
        )
        .await;
    drop(stopped);
    let reply = attaching
        .await
        .unwrap()
        .expect("the Sync of disks four and five");
    let ready: Vec<&str> = reply
        .volumes
        .iter()
        .filter(|v| v.phase == ready_phase)
        .map(|v| v.name.as_str())
        .collect();
    assert_eq!(ready, ["five", "four", "one"], "{:?}", reply.volumes);
    console.line("disks four and five in the guest", GUEST_DEADLINE, |l| {
        let serials = common::guest_serials(l);
        l.starts_with("VMLTEST-DISKS")
            && serials.contains(&"E2E-FOUR".into())
            && serials.contains(&"E2E-FIVE".into())
    });
    sync(&mut client, only_one.clone())
        .await
        .expect("back to disk one alone");
    console.line("only disk one in the guest again", GUEST_DEADLINE, |l| {
        l.starts_with("VMLTEST-DISKS") && common::guest_serials(l) == ["E2E-Serial-One"]
    });

    // The CLI client sees the same state.
    let status = common::cli_status(&vm.socket());
    assert_eq!(status["phase"], "Running");
    assert_eq!(status["volumes"][0]["name"], "one");
    assert_eq!(status["volumes"][0]["phase"], "Ready");
    assert_eq!(status["volumes"][0]["serial"], "E2E-Serial-One");

    drop(client);
    vm.signal(nix::sys::signal::Signal::SIGTERM);
    console.line("the guest powering off on ACPI", GUEST_DEADLINE, |l| {
        l.contains("VMLTEST-ACPI-POWEROFF")
    });
    vm.wait_stdout("phase Succeeded", GUEST_DEADLINE);
    let status = vm.wait_exit(Duration::from_secs(60));
    assert_eq!(status.code(), Some(0), "exit status");
    assert!(!alive(qemu_pid), "QEMU {qemu_pid} still runs");
    assert!(
        !alive(daemon_pid),
        "the private libvirtd {daemon_pid} still runs"
    );
    assert!(!vm.socket().exists(), "the socket was left behind");
}

/// A volume whose source is not there yet is Pending, and is attached as soon as the source
/// appears (the launcher watches for it); then the CLI's addvolume/removevolume on a block device.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_sources_are_picked_up_and_cli_volume_verbs_work() {
    let name = "e2e-pending";
    let mut vm = Launched::start(&guest_spec(name, NO_AGENT, &[]), &[]);
    let mut console = vm.boot();

    // The source's directory does not even exist yet.
    let late = vm.scratch().join("arrives-later/late.img");
    let spec = guest_spec(name, NO_AGENT, &[("late", "Late-Serial-1", &late)]);
    let mut events = common::EventWatcher::start(&vm.socket()).await;
    let reply = api::connect(&vm.socket())
        .await
        .unwrap()
        .sync(proto::SyncRequest {
            spec,
            ..Default::default()
        })
        .await
        .expect("Sync with a missing source")
        .into_inner();
    let status = reply
        .volumes
        .iter()
        .find(|v| v.name == "late")
        .expect("status for late");
    assert_eq!(
        status.phase,
        proto::volume_status::Phase::Pending as i32,
        "{status:?}"
    );
    assert_eq!(status.reason, "SourceNotFound");

    // Made elsewhere and moved into place, as a provisioner would.
    let parent = late.parent().unwrap();
    std::fs::create_dir(parent).unwrap();
    let staging = vm.scratch().join("staging.img");
    common::sparse_file(&staging, 2);
    std::fs::rename(&staging, &late).unwrap();
    events
        .wait_for("the pending volume Ready", GUEST_DEADLINE, |e| {
            matches!(&e.kind, Some(proto::event::Kind::Volume(v))
                if v.name == "late" && v.phase == proto::volume_status::Phase::Ready as i32)
        })
        .await;
    console.line("the late disk in the guest", GUEST_DEADLINE, |l| {
        l.starts_with("VMLTEST-DISKS") && l.contains(":Late-Serial-1:4096")
    });

    // addvolume / removevolume: a block device by path, through the CLI.
    let scratch = tempfile::tempdir().unwrap();
    let lo = common::Loop::new(scratch.path(), "cli", 3, false);
    let cli = |args: &[&str]| {
        common::cli_ok(&vm.socket(), args);
    };
    cli(&[
        "addvolume",
        "blk",
        "--path",
        lo.dev.to_str().unwrap(),
        "--serial",
        "Cli-Block-1",
        "--persist",
    ]);
    let uri = vm.libvirt_uri();
    let inactive = || {
        let conn = virt::connect::Connect::open(Some(&uri)).unwrap();
        let dom = conn
            .lookup_domain_by_name(&format!("default_{name}"))
            .unwrap();
        dom.xml_desc(virt::sys::VIR_DOMAIN_XML_INACTIVE).unwrap()
    };
    assert!(
        inactive().contains("<alias name='ua-blk'/>"),
        "--persist: the disk is in the persistent definition"
    );
    assert!(
        !inactive().contains("<alias name='ua-late'/>"),
        "without --persist it is not"
    );
    console.line("the CLI's block disk in the guest", GUEST_DEADLINE, |l| {
        l.starts_with("VMLTEST-DISKS")
            && l.contains(":Cli-Block-1:6144")
            && l.contains(":Late-Serial-1:")
    });
    cli(&["removevolume", "blk"]);
    console.line("the CLI's block disk gone", GUEST_DEADLINE, |l| {
        l.starts_with("VMLTEST-DISKS")
            && !l.contains("Cli-Block-1")
            && l.contains(":Late-Serial-1:")
    });
    assert!(
        !vm.dir().join("hotplug/blk").exists(),
        "the block node was left behind"
    );
    assert!(
        !inactive().contains("ua-blk"),
        "the persisted disk left the persistent definition too"
    );

    vm.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(vm.wait_exit(GUEST_DEADLINE).code(), Some(0));
}

/// What a libvirtd killed in the middle of an attach leaves in QEMU: the disk's block nodes and
/// its device, under the disk's own alias, which the restarted libvirtd knows nothing of. The
/// next attach of that volume removes them and succeeds; the guest sees the disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_a_killed_libvirtd_left_in_qemu_is_replaced_on_attach() {
    let name = "orphan";
    let mut vm = Launched::start(&guest_spec(name, NO_AGENT, &[]), &[]);
    let mut console = vm.boot();
    let image = vm.dir().join("hotplug/left.img");
    common::sparse_file(&image, 4);
    // What QEMU opens by path must be its own (this VM's QEMU id).
    let qemu_id = common::qemu_id_of(vm.dir());
    std::os::unix::fs::chown(&image, Some(qemu_id), Some(qemu_id)).unwrap();
    let conn = virt::connect::Connect::open(Some(&vm.libvirt_uri())).unwrap();
    let dom = conn
        .lookup_domain_by_name(&format!("default_{name}"))
        .unwrap();
    for command in [
        serde_json::json!({"execute": "blockdev-add", "arguments": {"driver": "file",
            "node-name": "left-storage", "filename": image, "auto-read-only": true}}),
        serde_json::json!({"execute": "blockdev-add", "arguments": {"driver": "raw",
            "node-name": "left-format", "file": "left-storage", "read-only": false}}),
        serde_json::json!({"execute": "device_add", "arguments": {"driver": "scsi-hd",
            "bus": "scsi0.0", "drive": "left-format", "id": "ua-left", "scsi-id": 0, "lun": 3}}),
    ] {
        let reply = dom.qemu_monitor_command(&command.to_string(), 0).unwrap();
        assert!(!reply.contains("\"error\""), "{command}: {reply}");
    }
    let mut client = api::connect(&vm.socket()).await.expect("gRPC socket");
    let reply = client
        .sync(proto::SyncRequest {
            spec: with_claims(guest_spec(name, NO_AGENT, &[]), &[("left", "Left-1")]),
            ..Default::default()
        })
        .await
        .expect("a Sync")
        .into_inner();
    let left = reply.volumes.iter().find(|v| v.name == "left").unwrap();
    assert_eq!(
        left.phase,
        proto::volume_status::Phase::Ready as i32,
        "{left:?}"
    );
    console.line("the guest sees the disk", GUEST_DEADLINE, |l| {
        l.contains("VMLTEST-SERIALS") && l.contains("serial=Left-1")
    });
    assert_eq!(
        live_xml(&vm.libvirt_uri(), &format!("default_{name}"))
            .matches("ua-left")
            .count(),
        1,
        "libvirt knows the disk once"
    );
    vm.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(vm.wait_exit(GUEST_DEADLINE).code(), Some(0));
}
