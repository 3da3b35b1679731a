//! Nothing the owner asked for is lost when the launcher dies, and nothing hot-plugged stands in
//! the way of the guest, end to end in a real TCG guest that prints its disks' serials:
//! - a launcher killed (SIGKILL) and started again on the same runtime dir keeps every volume
//!   hot-plugged before, and its next `addvolume` adds exactly one disk
//!   (the last Sync, saved, is its spec);
//! - a launcher killed in the middle of a Sync is started again and converges to that Sync,
//!   unplugging nothing the owner still wants;
//! - a Pending hot-plugged volume does not keep the VM from restarting, and is
//!   attached once its file appears;
//! - SIGTERM and Kill stop a Sync in flight at its next volume, and the guest still gets its
//!   ACPI power button (a grace period is not spent on hotplug).

use crate::common;

use std::collections::BTreeSet;
use std::time::Instant;

use common::{
    guest_serials, guest_spec, hotplug_image, set, with_claims, Client, EventWatcher, Launched,
    BOOT_DEADLINE, GUEST_DEADLINE,
};
use vmlauncher::api::{self, proto};
use vmlauncher::console::ConsoleLog;

const READY: i32 = proto::volume_status::Phase::Ready as i32;
const PENDING: i32 = proto::volume_status::Phase::Pending as i32;

/// The test guest with hot-pluggable claims `(volume, serial)` on scsi: a file
/// `<hotplug>/<volume>.img`, or a block device when the Sync names one.
fn hot_spec(name: &str, volumes: &[(&str, &str)]) -> String {
    with_claims(guest_spec(name, "", &[]), volumes)
}

/// Waits for the guest to list exactly `want`; every disk report on the way must still list
/// every serial of `kept` (nothing the owner wants is ever unplugged).
fn wait_disks(console: &mut ConsoleLog, want: &BTreeSet<String>, kept: &BTreeSet<String>) {
    let mut seen = Vec::new();
    let found = console.wait_for(
        "the guest's disk report",
        Instant::now() + GUEST_DEADLINE,
        |l| {
            if !l.starts_with("VMLTEST-DISKS") {
                return false;
            }
            let s = set(&guest_serials(l));
            seen.push(l.to_string());
            assert!(
                kept.is_subset(&s),
                "the guest lost a disk the owner still wants: {l}\nreports so far:\n{}",
                seen.join("\n")
            );
            &s == want
        },
    );
    found.unwrap_or_else(|e| panic!("{e}; want {want:?}; reports:\n{}", seen.join("\n")));
}

async fn sync(client: &mut Client, spec: String) -> proto::SyncResponse {
    let request = proto::SyncRequest {
        spec,
        ..Default::default()
    };
    common::sync_ok(client, request, "Sync").await
}

fn phases(volumes: &[proto::VolumeStatus]) -> Vec<(String, i32)> {
    volumes.iter().map(|v| (v.name.clone(), v.phase)).collect()
}

/// Sends `request` as a Sync in the background and returns once the launcher at `socket` sends
/// an event `caught` accepts (named `what`): a Sync caught in the middle.
async fn sync_until(
    client: &Client,
    socket: &std::path::Path,
    request: proto::SyncRequest,
    what: &str,
    caught: impl FnMut(&proto::Event) -> bool,
) -> tokio::task::JoinHandle<Result<tonic::Response<proto::SyncResponse>, tonic::Status>> {
    let mut events = EventWatcher::start(socket).await;
    let mut sync_client = client.clone();
    let in_flight = tokio::spawn(async move { sync_client.sync(request).await });
    events.wait_for(what, GUEST_DEADLINE, caught).await;
    in_flight
}

/// [`sync_until`] the first volume is removed.
async fn sync_until_first_removal(
    client: &Client,
    socket: &std::path::Path,
    request: proto::SyncRequest,
) -> tokio::task::JoinHandle<Result<tonic::Response<proto::SyncResponse>, tonic::Status>> {
    sync_until(client, socket, request, "the first volume removed", |e| {
        matches!(&e.kind, Some(proto::event::Kind::VolumeRemoved(_)))
    })
    .await
}

fn live_scsi_disks(vm: &Launched, name: &str) -> usize {
    let conn = virt::connect::Connect::open(Some(&vm.libvirt_uri())).unwrap();
    let dom = conn
        .lookup_domain_by_name(&format!("default_{name}"))
        .unwrap();
    dom.xml_desc(0).unwrap().matches("bus='scsi'").count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_launcher_keeps_every_volume_and_converges_to_the_sync_it_was_in() {
    let name = "restart-keep";
    let mut first = Launched::start(&guest_spec(name, "", &[]), &[]);
    let mut console = first.boot();
    for v in ["f1", "f2"] {
        hotplug_image(&first.dir().join("hotplug"), v, 4 << 20);
    }
    let two = [("f1", "Keep-File-1"), ("f2", "Keep-File-2")];
    let mut client = api::connect(&first.socket()).await.unwrap();
    let reply = sync(&mut client, hot_spec(name, &two)).await;
    assert_eq!(
        phases(&reply.volumes),
        [("f1".into(), READY), ("f2".into(), READY)]
    );
    let files = set(&["Keep-File-1", "Keep-File-2"]);
    wait_disks(&mut console, &files, &BTreeSet::new());
    drop(client);

    // 1. Killed between Syncs, started again from the original spec file (no volumes).
    first.kill9();
    let mut second = first.successor(&guest_spec(name, "", &[]), &[]);
    let line = second.wait_stdout("domain default_", GUEST_DEADLINE);
    assert!(line.contains("adopted"), "{line}");
    second.wait_stdout("api unix:", GUEST_DEADLINE);
    let mut client = api::connect(&second.socket()).await.unwrap();
    let spec = common::spec(&mut client).await.spec;
    assert!(
        spec.contains("Keep-File-1") && spec.contains("Keep-File-2"),
        "GetSpec after the restart lost the hot-plugged volumes:\n{spec}"
    );
    // `addvolume` of one block volume: exactly one disk more, the two files stay.
    let scratch = tempfile::tempdir().unwrap();
    let lo = common::Loop::new(scratch.path(), "restart-keep", 3, false);
    common::cli_ok(
        &second.socket(),
        &[
            "addvolume",
            "blk",
            "--serial",
            "Keep-Block-1",
            "--major",
            &lo.major.to_string(),
            "--minor",
            &lo.minor.to_string(),
        ],
    );
    let three = set(&["Keep-File-1", "Keep-File-2", "Keep-Block-1"]);
    wait_disks(&mut console, &three, &files);
    assert_eq!(live_scsi_disks(&second, name), 3);
    // The adopted files' pins (`host::pin`) stay: QEMU's disks are on them.
    let pins = |vm: &Launched| -> BTreeSet<String> {
        std::fs::read_dir(vm.dir().join("pins"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(pins(&second), set(&["f1.img", "f2.img"]));

    // 2. Killed in the middle of a Sync that adds twelve more files.
    let more: Vec<(String, String)> = (1..=12)
        .map(|i| (format!("m{i:02}"), format!("Keep-More-{i:02}")))
        .collect();
    for (v, _) in &more {
        hotplug_image(&second.dir().join("hotplug"), v, 4 << 20);
    }
    let spec = common::spec(&mut client).await;
    let mut all: Vec<(&str, &str)> = vec![
        ("blk", "Keep-Block-1"),
        ("f1", "Keep-File-1"),
        ("f2", "Keep-File-2"),
    ];
    all.extend(more.iter().map(|(v, s)| (v.as_str(), s.as_str())));
    let request = proto::SyncRequest {
        spec: hot_spec(name, &all),
        block_devices: spec.block_devices,
        ..Default::default()
    };
    let in_flight = sync_until(
        &client,
        &second.socket(),
        request,
        "the first new volume Ready",
        |e| {
            matches!(&e.kind, Some(proto::event::Kind::Volume(v))
                if v.name.starts_with('m') && v.phase == READY)
        },
    )
    .await;
    second.kill9();
    let _ = in_flight.await;
    let live = live_scsi_disks(&second, name);
    eprintln!("killed with {live} of 15 disks live");
    assert!(
        live < 15,
        "the Sync had ended before the kill ({live} disks)"
    );

    let mut third = second.successor(&guest_spec(name, "", &[]), &[]);
    let line = third.wait_stdout("domain default_", GUEST_DEADLINE);
    assert!(line.contains("adopted"), "{line}");
    third.wait_stdout("api unix:", GUEST_DEADLINE);
    let everything: BTreeSet<String> = all.iter().map(|(_, s)| s.to_string()).collect();
    wait_disks(&mut console, &everything, &three);
    let mut client = api::connect(&third.socket()).await.unwrap();
    let status = common::status(&mut client).await;
    assert_eq!(status.volumes.len(), 15, "{:?}", status.volumes);
    assert!(
        status.volumes.iter().all(|v| v.phase == READY),
        "{:?}",
        status.volumes
    );
    assert_eq!(live_scsi_disks(&third, name), 15);

    // 3. Killed in the middle of a Sync that removes the twelve: the restarted launcher applies
    // the rest of the removals at once. Its API comes up well within one detach timeout (30 s):
    // a restored Sync whose detaches waited for a DEVICE_REMOVED no one handled yet would not.
    let remove = proto::SyncRequest {
        spec: hot_spec(name, &all[..3]),
        block_devices: common::spec(&mut client).await.block_devices,
        ..Default::default()
    };
    let in_flight = sync_until_first_removal(&client, &third.socket(), remove.clone()).await;
    drop(client);
    third.kill9();
    let _ = in_flight.await;
    let live = live_scsi_disks(&third, name);
    eprintln!("killed with {live} of 15 disks live, removing down to 3");
    assert!(
        live > 3,
        "the Sync had ended before the kill ({live} disks)"
    );
    let mut fourth = third.successor(&guest_spec(name, "", &[]), &[]);
    let restarted = Instant::now();
    fourth.wait_stdout("api unix:", std::time::Duration::from_secs(20));
    eprintln!("restarted and converged in {:?}", restarted.elapsed());
    wait_disks(&mut console, &three, &three);
    assert_eq!(live_scsi_disks(&fourth, name), 3);
    let mut client = api::connect(&fourth.socket()).await.unwrap();
    let status = common::status(&mut client).await;
    let ready: BTreeSet<String> = status
        .volumes
        .iter()
        .filter(|v| v.phase == READY)
        .map(|v| v.name.clone())
        .collect();
    assert_eq!(ready, set(&["blk", "f1", "f2"]), "{:?}", status.volumes);
    assert_eq!(status.volumes.len(), 3, "{:?}", status.volumes);
    // The removals a killed launcher left to its successor took their pins with them.
    assert_eq!(pins(&fourth), set(&["f1.img", "f2.img"]));
    // The twelve again, for the next step.
    let request = proto::SyncRequest {
        spec: hot_spec(name, &all),
        block_devices: remove.block_devices.clone(),
        ..Default::default()
    };
    client.sync(request).await.unwrap();
    wait_disks(&mut console, &everything, &three);

    // 4. Kill stops a Sync in flight (here one that removes the twelve again).
    let in_flight = sync_until_first_removal(&client, &fourth.socket(), remove).await;
    client
        .kill(proto::CommandRequest::default())
        .await
        .expect("Kill");
    let synced = in_flight.await.unwrap();
    let status = synced.expect_err("the Sync was interrupted by the Kill");
    assert_eq!(status.code(), tonic::Code::Aborted, "{status:?}");
    assert!(status.message().contains("part-way"), "{status:?}");
    drop(client);
    fourth.wait_exit(GUEST_DEADLINE);
    drop(lo);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_volume_never_blocks_a_restart_and_sigterm_stops_a_sync_in_flight() {
    let name = "restart-pending";
    let mut vm = Launched::start(&guest_spec(name, "", &[]), &["--run-strategy", "always"]);
    let mut console = vm.boot();
    hotplug_image(&vm.dir().join("hotplug"), "here", 4 << 20);
    let mut client = api::connect(&vm.socket()).await.unwrap();
    let spec = hot_spec(name, &[("here", "Pend-Here"), ("later", "Pend-Later")]);
    let reply = sync(&mut client, spec.clone()).await;
    assert_eq!(
        phases(&reply.volumes),
        [("here".into(), READY), ("later".into(), PENDING)]
    );
    wait_disks(&mut console, &set(&["Pend-Here"]), &BTreeSet::new());

    // The guest crashes; the run strategy restarts it although "later" still waits.
    let mut events = EventWatcher::start(&vm.socket()).await;
    let qemu = vm
        .pid_from(&format!("libvirt/run/qemu/default_{name}.pid"))
        .unwrap();
    common::signal_pid(qemu, nix::sys::signal::Signal::SIGKILL).unwrap();
    events
        .wait_phase("phase Failed after the crash", GUEST_DEADLINE, "Failed")
        .await;
    events
        .wait_phase("Running again", BOOT_DEADLINE, "Running")
        .await;
    common::wait_booted(&mut console);
    // The guest booted with the volume that was there, not the one that waits.
    wait_disks(&mut console, &set(&["Pend-Here"]), &BTreeSet::new());
    let status = common::status(&mut client).await;
    assert_eq!(
        phases(&status.volumes),
        [("here".into(), READY), ("later".into(), PENDING)]
    );
    // Its file appears: it is attached without another Sync.
    hotplug_image(&vm.dir().join("hotplug"), "later", 4 << 20);
    wait_disks(
        &mut console,
        &set(&["Pend-Here", "Pend-Later"]),
        &set(&["Pend-Here"]),
    );

    // SIGTERM in the middle of a Sync of forty volumes: the Sync stops, the guest is asked to
    // power off (it prints the ACPI line) and the launcher exits 0.
    let mut forty: Vec<(String, String)> = (1..=40)
        .map(|i| (format!("t{i:02}"), format!("Term-{i:02}")))
        .collect();
    for (v, _) in &forty {
        hotplug_image(&vm.dir().join("hotplug"), v, 4 << 20);
    }
    forty.push(("here".into(), "Pend-Here".into()));
    forty.push(("later".into(), "Pend-Later".into()));
    let vols: Vec<(&str, &str)> = forty
        .iter()
        .map(|(v, s)| (v.as_str(), s.as_str()))
        .collect();
    let request = proto::SyncRequest {
        spec: hot_spec(name, &vols),
        ..Default::default()
    };
    let mut sync_client = client.clone();
    let in_flight = tokio::spawn(async move { sync_client.sync(request).await });
    events
        .wait_for("the first of forty Ready", GUEST_DEADLINE, |e| {
            matches!(&e.kind, Some(proto::event::Kind::Volume(v))
                if v.name.starts_with('t') && v.phase == READY)
        })
        .await;
    let asked = Instant::now();
    vm.signal(nix::sys::signal::Signal::SIGTERM);
    let status = in_flight
        .await
        .unwrap()
        .expect_err("SIGTERM interrupts the Sync");
    eprintln!("Sync interrupted {:?} after SIGTERM", asked.elapsed());
    assert_eq!(status.code(), tonic::Code::Aborted, "{status:?}");
    console
        .wait_for(
            "the guest's ACPI power-off",
            Instant::now() + GUEST_DEADLINE,
            |l| l.contains("VMLTEST-ACPI-POWEROFF"),
        )
        .unwrap();
    drop(client);
    assert_eq!(vm.wait_exit(GUEST_DEADLINE).code(), Some(0));
}
