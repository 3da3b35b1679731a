//! Live migration between launchers on one machine, against the real binary, real private
//! libvirtds and a TCG guest: the guest keeps its boot (one boot id, its uptime counting), its
//! disks (shared ones as they are, the container disk it wrote to copied), its published port
//! and its hotplug; every source exits 0. A cancel and a target that dies leave the guest
//! running on the source; and it goes back and forth (`VMLAUNCHER_MIGRATION_ROUNDS`, 2 here, 20 in
//! `scripts/soak.sh`), paused and running, with a persistent vTPM whose state moves with it.

use crate::common;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::net::{free_port, http_get};
use common::{
    bin, cli_status, cli_sync, cli_wait_status, guest_vmi, hotplug_claims, hotplug_image,
    report_with, signal_pid, with_claims, ConsoleWait, Launched, BOOT_DEADLINE, GUEST_DEADLINE,
};
use vmlauncher::console::ConsoleLog;

const MIGRATION_DEADLINE: Duration = Duration::from_secs(180);
const CONTAINER_DISK_BYTES: u64 = 64 << 20;

/// The guest with a host disk, a container disk it writes its boot id to, a published HTTP port,
/// and the hot-plugged claims `claims` (volume, serial).
fn spec(name: &str, host_disk: &Path, claims: &[(&str, &str)]) -> String {
    let (disks, volumes) = hotplug_claims(claims);
    guest_vmi(
        name,
        "vmltest.write=CDISK-1",
        &format!(
            r#"    devices:
      autoattachGraphicsDevice: false
      disks:
      - {{name: host, disk: {{bus: scsi}}, serial: HOST-1}}
      - {{name: cdisk, disk: {{bus: scsi}}, serial: CDISK-1}}
{disks}      interfaces:
      - name: default
        masquerade: {{}}
        ports:
        - {{name: http, port: 80}}
"#
        ),
        &format!(
            "  networks:\n  - name: default\n    pod: {{}}\n  volumes:\n  - {{name: host, hostDisk: {{path: {}, type: Disk}}}}\n  - {{name: cdisk, containerDisk: {{image: example/disk}}}}\n{volumes}",
            host_disk.display()
        ),
    )
}

/// A runtime dir as a pod of this VMI has it: the container disk's image (the same, zeros), and
/// the hot-plugged claims' files, shared with `from` (hard links: one file, two places).
fn pod_dir(dir: &Path, from: Option<&Path>, claims: &[&str]) {
    std::fs::create_dir_all(dir.join("container-disks")).unwrap();
    std::fs::File::create(dir.join("container-disks/disk_0.img"))
        .unwrap()
        .set_len(CONTAINER_DISK_BYTES)
        .unwrap();
    if let Some(from) = from {
        std::fs::create_dir_all(dir.join("hotplug")).unwrap();
        for claim in claims {
            let image = format!("hotplug/{claim}.img");
            std::fs::hard_link(from.join(&image), dir.join(&image)).unwrap();
        }
    }
}

/// `vmlauncher migrate` from `source` to `target`, run to its end: its exit code, its JSON
/// answer (when it succeeded) and its stderr.
fn migrate(
    source: &Path,
    target: &Path,
    extra: &[&str],
) -> (Option<i32>, serde_json::Value, String) {
    let out = migrate_child(source, target, extra)
        .wait_with_output()
        .unwrap();
    let json = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (
        out.status.code(),
        json,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn migrate_child(source: &Path, target: &Path, extra: &[&str]) -> Child {
    Command::new(bin())
        .args(["migrate", "--output", "json", "--socket"])
        .arg(source)
        .arg("--to")
        .arg(target)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn page(port: u16) -> String {
    http_get(SocketAddr::from((Ipv4Addr::LOCALHOST, port)), "/").unwrap_or_else(|e| e.to_string())
}

/// What a source shows once its VM left, and how it ends.
fn left_by_migration(source: &mut Launched) {
    source.wait_stdout("phase Succeeded (Succeeded; Migrated)", MIGRATION_DEADLINE);
    assert_eq!(
        source.wait_exit(GUEST_DEADLINE).code(),
        Some(0),
        "{}",
        source.stderr_text()
    );
}

#[test]
fn a_guest_moves_through_three_launchers_with_its_disks_port_and_hotplug() {
    let name = "mig-three";
    let published = free_port();
    // The host disk lives outside every runtime dir, shared by all three.
    let shared = common::disk_dir("vml-e2e-migration-");
    let host_disk = shared.path().join("host.img");
    common::sparse_file(&host_disk, 16);
    // A migration target's QEMU opens a hostDisk by its path as its own user (no descriptor
    // travels, and nothing relabels the host's file): the operator gives it access.
    std::fs::set_permissions(
        &host_disk,
        std::os::unix::fs::PermissionsExt::from_mode(0o666),
    )
    .unwrap();
    let mut one = Launched::start_owned(|dir| pod_dir(dir, None, &[])).run(
        &spec(name, &host_disk, &[]),
        &["--publish", &format!("{published}:80")],
    );
    let mut console = one.boot();
    // In whichever order they come: each from the console's start.
    let wrote = one.console().line("the guest's write", BOOT_DEADLINE, |l| {
        l.starts_with("VMLTEST-WROTE CDISK-1 ")
    });
    let boot_id = wrote.split_whitespace().nth(2).unwrap().to_string();
    one.console()
        .line("the guest's HTTP server", BOOT_DEADLINE, |l| {
            l.starts_with("VMLTEST-HTTP ")
        });
    assert!(page(published).contains("vmltest"), "{}", page(published));
    hotplug_image(&one.dir().join("hotplug"), "hot1", 8 << 20);
    cli_sync(
        one.socket().as_path(),
        one.scratch(),
        &spec(name, &host_disk, &[("hot1", "HOT-1")]),
    );
    report_with(&mut console, "HOT-1");
    // And a block device, as a node daemon hot-plugs one: the launcher makes its node.
    let block = common::Loop::new(shared.path(), "blk1", 8, false);
    common::cli_ok(
        &one.socket(),
        &[
            "addvolume",
            "blk1",
            "--path",
            block.dev.to_str().unwrap(),
            "--serial",
            "BLK-1",
        ],
    );
    let first = report_with(&mut console, "BLK-1");
    assert_eq!(first.read_back, format!("vmltest {boot_id}"));

    // One → two: the target waits with no spec, and says so.
    let mut two = Launched::incoming(|dir| pod_dir(dir, Some(one.dir()), &["hot1"]), &[]);
    two.wait_stdout("waiting for an incoming migration", BOOT_DEADLINE);
    let waiting = cli_status(&two.socket());
    assert_eq!(waiting["phase"], "Scheduled", "{waiting}");
    assert_eq!(waiting["migration"]["role"], "target", "{waiting}");
    assert_eq!(waiting["migration"]["state"], "Waiting", "{waiting}");
    let (code, answer, stderr) = migrate(&one.socket(), &two.socket(), &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(answer["migration"]["state"], "Completed", "{answer}");
    assert_eq!(answer["target"]["state"], "Completed", "{answer}");
    left_by_migration(&mut one);
    // The hot-plugged file is opened on the target through the target's own pin of the inode
    // its launcher checked, as on the source.
    let live = common::live_xml(&two.libvirt_uri(), &format!("default_{name}"));
    assert_eq!(
        common::live_disk_source(&live, "hot1").as_deref(),
        two.dir().join("pins/hot1.img").to_str(),
        "{live}"
    );
    let arrived = cli_status(&two.socket());
    assert_eq!(arrived["phase"], "Running", "{arrived}");
    assert_eq!(arrived["vmState"], "Active", "{arrived}");
    assert!(
        page(published).contains("vmltest"),
        "the port from launcher two: {}",
        page(published)
    );

    // A hot-plug on launcher two; the guest reads back from the disk copied to it.
    let mut console = two.console();
    hotplug_image(&two.dir().join("hotplug"), "hot2", 8 << 20);
    let claims2 = [("hot1", "HOT-1"), ("blk1", "BLK-1"), ("hot2", "HOT-2")];
    cli_sync(
        two.socket().as_path(),
        two.scratch(),
        &spec(name, &host_disk, &claims2),
    );
    let second = report_with(&mut console, "HOT-2");
    assert_eq!(second.boot_id, boot_id, "a second boot");
    assert!(second.uptime > first.uptime);
    assert_eq!(second.read_back, format!("vmltest {boot_id}"));
    for serial in ["HOST-1", "CDISK-1", "HOT-1", "BLK-1", "HOT-2"] {
        assert!(
            second.serials.contains(&serial.to_string()),
            "{serial}: {:?}",
            second.serials
        );
    }

    // Two → three.
    let mut three = Launched::incoming(|dir| pod_dir(dir, Some(two.dir()), &["hot1", "hot2"]), &[]);
    three.wait_stdout("waiting for an incoming migration", BOOT_DEADLINE);
    let (code, answer, stderr) = migrate(&two.socket(), &three.socket(), &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(answer["migration"]["state"], "Completed", "{answer}");
    left_by_migration(&mut two);
    assert!(
        page(published).contains("vmltest"),
        "the port from launcher three: {}",
        page(published)
    );
    let mut console = three.console();
    hotplug_image(&three.dir().join("hotplug"), "hot3", 8 << 20);
    let claims3 = [
        ("hot1", "HOT-1"),
        ("blk1", "BLK-1"),
        ("hot2", "HOT-2"),
        ("hot3", "HOT-3"),
    ];
    cli_sync(
        three.socket().as_path(),
        three.scratch(),
        &spec(name, &host_disk, &claims3),
    );
    let third = report_with(&mut console, "HOT-3");
    assert_eq!(third.boot_id, boot_id, "a second boot");
    assert!(third.uptime > second.uptime);
    assert_eq!(third.read_back, format!("vmltest {boot_id}"));
    assert_eq!(third.serials.len(), 6, "{:?}", third.serials);
    // The targets' consoles start with the migration: no boot line ever.
    for dir in [two.dir(), three.dir()] {
        let log = std::fs::read_to_string(dir.join("console.log")).unwrap();
        assert!(!log.contains("VMLTEST-BOOTED"), "{log}");
    }

    three.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(three.wait_exit(GUEST_DEADLINE).code(), Some(0));
}

/// A slow migration (`mib_per_s`) from `source` to a new target, seen under way: the target and
/// the running `migrate`.
fn migration_under_way(source: &Launched, mib_per_s: &str) -> (Launched, Child) {
    let mut target = Launched::incoming(|_| {}, &[]);
    target.wait_stdout("waiting for an incoming migration", BOOT_DEADLINE);
    let child = migrate_child(
        &source.socket(),
        &target.socket(),
        &["--bandwidth", mib_per_s],
    );
    cli_wait_status(
        &source.socket(),
        "the migration under way",
        MIGRATION_DEADLINE,
        |s| {
            s["migration"]["state"] == "Migrating"
                && s["migration"]["dataProcessed"].as_u64() > Some(0)
        },
    );
    (target, child)
}

fn still_runs_here(source: &Launched, child: Child, why: &str) {
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(6), "{stderr}");
    assert!(stderr.contains(why), "{stderr}");
    let status = cli_status(&source.socket());
    assert_eq!(status["phase"], "Running", "{status}");
    assert_eq!(status["vmState"], "Active", "{status}");
    let power = status["powerState"].as_str().unwrap_or_default();
    assert!(power.starts_with("running"), "{status}");
}

#[test]
fn a_cancel_or_a_dead_target_leaves_the_guest_running_on_its_source() {
    let name = "mig-fail";
    let mut source = Launched::start(&guest_vmi(name, "", "", ""), &[]);
    source.boot();

    let (mut target, child) = migration_under_way(&source, "1");
    let out = Command::new(bin())
        .args(["migrate", "--cancel", "--socket"])
        .arg(source.socket())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    still_runs_here(&source, child, "cancel");
    let cancelled = cli_status(&source.socket());
    assert_eq!(cancelled["migration"]["state"], "Cancelled", "{cancelled}");
    // The target's guest never came: it ends with its own code.
    assert_eq!(
        target.wait_exit(GUEST_DEADLINE).code(),
        Some(7),
        "{}",
        target.stderr_text()
    );
    target.assert_printed("phase Failed (Failed; MigrationFailed)");

    // The target's QEMU and launcher die half-way.
    let (mut target, child) = migration_under_way(&source, "1");
    let qemu = target.qemu_pid(name);
    target.kill9();
    signal_pid(qemu, nix::sys::signal::Signal::SIGKILL).unwrap();
    still_runs_here(&source, child, "migrate");

    // The source is none the worse: it migrates the next time.
    let mut last = Launched::incoming(|_| {}, &[]);
    last.wait_stdout("waiting for an incoming migration", BOOT_DEADLINE);
    let (code, _, stderr) = migrate(&source.socket(), &last.socket(), &[]);
    assert_eq!(code, Some(0), "{stderr}");
    left_by_migration(&mut source);
    last.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(last.wait_exit(GUEST_DEADLINE).code(), Some(0));
}

#[test]
fn a_source_killed_mid_migration_is_followed_by_its_successor_never_booted_again() {
    let name = "mig-kill-source";
    let spec = guest_vmi(name, "", "", "");
    let mut source = Launched::start(&spec, &[]);
    source.boot();
    let (mut target, mut child) = migration_under_way(&source, "4");
    source.kill9();
    let _ = child.kill();
    let _ = child.wait();
    // libvirt carries the migration on; the successor follows it to its end and never boots
    // the VM a second time.
    let mut successor = source.successor(&spec, &[]);
    successor.wait_stdout("phase Succeeded (Succeeded; Migrated)", MIGRATION_DEADLINE);
    assert_eq!(
        successor.wait_exit(GUEST_DEADLINE).code(),
        Some(0),
        "{}",
        successor.stderr_text()
    );
    let arrived = cli_wait_status(
        &target.socket(),
        "the guest's arrival",
        MIGRATION_DEADLINE,
        |s| s["migration"]["state"] == "Completed",
    );
    assert_eq!(arrived["phase"], "Running", "{arrived}");
    // And one that finds the VM gone altogether does not boot it either.
    std::fs::write(successor.dir().join("migrating-to"), "elsewhere").unwrap();
    let mut late = successor.successor(&spec, &[]);
    late.wait_stdout("migrated away before this launcher started", BOOT_DEADLINE);
    assert_eq!(
        late.wait_exit(GUEST_DEADLINE).code(),
        Some(0),
        "{}",
        late.stderr_text()
    );
    assert!(!late.dir().join("migrating-to").exists());
    // The target's launcher killed after the guest came, started again as it was: it adopts it.
    target.kill9();
    let mut again = target.successor("", &["--incoming"]);
    again.wait_stdout(
        "going on with the migration a predecessor took",
        BOOT_DEADLINE,
    );
    let adopted = cli_wait_status(&again.socket(), "the adoption", GUEST_DEADLINE, |s| {
        s["phase"] == "Running"
    });
    assert_eq!(adopted["vmState"], "Active", "{adopted}");
    common::cli_ok(&again.socket(), &["kill"]);
    assert_eq!(again.wait_exit(GUEST_DEADLINE).code(), Some(0));
}

/// The vTPM's permanent state (its seeds and keys), as libvirt's swtpm keeps it in a launcher's
/// runtime dir.
fn tpm_state(launcher: &Launched) -> Vec<u8> {
    let dir = launcher.dir().join("libvirt/lib/swtpm");
    let by_uuid = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .next()
        .expect("a TPM's state")
        .unwrap()
        .path();
    std::fs::read(by_uuid.join("tpm2/tpm2-00.permall")).unwrap()
}

#[test]
fn a_guest_goes_back_and_forth() {
    let rounds: usize = std::env::var("VMLAUNCHER_MIGRATION_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2);
    let name = "mig-rounds";
    // With a persistent vTPM, whose state (seeds, keys) lives in the launcher's runtime dir:
    // the migration carries it.
    let spec_with = |claims: &[(&str, &str)]| {
        with_claims(common::guest_spec(name, "", &[]), claims).replace(
            "    devices:\n",
            "    devices:\n      tpm: {persistent: true}\n",
        )
    };
    let spec = spec_with(&[]);
    let mut here = Launched::start(&spec, &[]);
    let mut console = here.boot();
    let uptime = |console: &mut ConsoleLog| {
        console.line("the guest's uptime", GUEST_DEADLINE, |l| {
            l.starts_with("VMLTEST-UPTIME ")
        })
    };
    let boot_id = uptime(&mut console)
        .split_whitespace()
        .nth(1)
        .unwrap()
        .to_string();
    // The first two hops move a paused guest: it stays paused, then runs on where it is.
    common::cli_ok(&here.socket(), &["pause"]);
    for hop in 0..rounds * 2 {
        let mut there = Launched::incoming(|_| {}, &[]);
        there.wait_stdout("waiting for an incoming migration", BOOT_DEADLINE);
        let tpm = tpm_state(&here);
        let (code, answer, stderr) = migrate(&here.socket(), &there.socket(), &[]);
        assert_eq!(code, Some(0), "hop {hop}: {stderr}");
        assert_eq!(
            answer["target"]["state"], "Completed",
            "hop {hop}: {answer}"
        );
        left_by_migration(&mut here);
        here = there;
        // The same TPM: a fresh one would have been manufactured with seeds of its own.
        assert!(
            tpm_state(&here) == tpm,
            "hop {hop}: the vTPM's state did not move"
        );
        let status = cli_status(&here.socket());
        let paused = hop < 2;
        assert_eq!(status["phase"], "Running", "hop {hop}: {status}");
        assert_eq!(
            status["vmState"],
            if paused { "Paused" } else { "Active" },
            "hop {hop}: {status}"
        );
        let power = status["powerState"].as_str().unwrap_or_default();
        assert!(
            power.starts_with(if paused { "paused" } else { "running" }),
            "hop {hop}: {status}"
        );
        if hop == 1 {
            common::cli_ok(&here.socket(), &["unpause"]);
        }
    }
    // Still the first boot: a hot-plug makes the guest report.
    hotplug_image(&here.dir().join("hotplug"), "late", 8 << 20);
    let mut console = here.console();
    cli_sync(
        here.socket().as_path(),
        here.scratch(),
        &spec_with(&[("late", "LATE-1")]),
    );
    let line = uptime(&mut console);
    assert_eq!(
        line.split_whitespace().nth(1),
        Some(boot_id.as_str()),
        "{line}"
    );
    here.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(here.wait_exit(GUEST_DEADLINE).code(), Some(0));
}
