//! CPU and memory changed in place through Sync, on a real TCG guest against a real private
//! libvirtd, proven by what the guest itself reports on its console (`VMLTEST-CPUS`: its online
//! CPUs; `VMLTEST-MEMORY`: its MemTotal):
//! - a spec with `maxSockets: 4` and `maxGuest: 2Gi` boots with 1 socket and 1Gi;
//! - Syncs beyond the room, misaligned, or below KubeVirt's minimum are refused with exit 2,
//!   naming the field, and change nothing;
//! - 1 → 2 → 4 sockets and 1Gi → 1536Mi → 2Gi reach the guest (a socket added by someone else
//!   in between is found, not added again), and the status shows what was
//!   asked and what the guest has;
//! - a launcher killed with SIGKILL and started again adopts all of it;
//! - back down to 1Gi; 4 → 2 sockets waits for the next boot;
//! - a cold boot (stop, start) boots with the last values asked, 2 sockets and 1536Mi.
//!
//! A vCPU decrease is not tried live (QEMU 7.2 never completes one): 2 → 1 socket leaves the
//! guest at 2 CPUs with `RestartRequired` in the status, a Sync back to 2 changes nothing in the
//! guest and takes it back, and a cold boot after another decrease comes up with 1.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{cli_ok, cli_status, guest_spec, Launched, GUEST_DEADLINE};
use vmlauncher::console::ConsoleLog;

const NAME: &str = "e2e-resize";
const MIB: u64 = 1 << 20;
const MANUAL: &[&str] = &["--run-strategy", "manual"];

/// The test guest with room for 4 sockets and 2Gi, asking for `sockets` and `guest`.
fn spec(sockets: u32, guest: &str) -> String {
    spec_named(NAME, sockets, guest)
}

/// [`spec`] for the VM `name`.
fn spec_named(name: &str, sockets: u32, guest: &str) -> String {
    // Memory onlined movable: what virtio-mem plugged it can unplug again.
    guest_spec(name, "memhp_default_state=online_movable", &[])
        .replace(
            "      guest: 256Mi\n",
            &format!("      guest: {guest}\n      maxGuest: 2Gi\n"),
        )
        .replace(
            "    devices:\n",
            &format!("    cpu:\n      sockets: {sockets}\n      maxSockets: 4\n    devices:\n"),
        )
}

fn sync(vm: &Launched, text: &str) -> serde_json::Value {
    common::cli_sync(&vm.socket(), vm.scratch(), text)
}

/// A refused Sync: exit 2 and the field named on stderr.
fn refused(vm: &Launched, text: &str, field: &str) {
    let (code, stderr) = common::cli_sync_refused(&vm.socket(), vm.scratch(), text);
    assert_eq!(code, Some(2), "{field}: {stderr}");
    assert!(stderr.contains(field), "{field} not named: {stderr}");
}

/// Waits for a status `done` accepts (the guest plugs memory at its own pace).
fn status_until(
    socket: &Path,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    common::cli_wait_status(socket, what, GUEST_DEADLINE, done)
}

/// A resize of a Sync's reply: part, from, to, libvirt's error, and whether it waits for the
/// next boot.
type Change = (String, u64, u64, String, bool);

fn resources(reply: &serde_json::Value) -> Vec<Change> {
    reply["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["part"].as_str().unwrap().to_string(),
                c["from"].as_u64().unwrap(),
                c["to"].as_u64().unwrap(),
                c["error"].as_str().unwrap().to_string(),
                c["atRestart"].as_bool().unwrap(),
            )
        })
        .collect()
}

fn change(part: &str, from: u64, to: u64) -> Change {
    (part.to_string(), from, to, String::new(), false)
}

/// A vCPU decrease, done to the persistent definition only.
fn at_restart(from: u64, to: u64) -> Change {
    ("cpu".to_string(), from, to, String::new(), true)
}

#[test]
fn cpus_and_memory_change_in_place_survive_a_restart_and_a_cold_boot() {
    // Manual: a stop stays stopped until the start that cold-boots it.
    let mut vm = Launched::start(&spec(1, "1Gi"), MANUAL);
    vm.wait_stdout("api unix:", GUEST_DEADLINE);
    cli_ok(&vm.socket(), &["start"]);
    let mut console = vm.boot();
    common::guest_reports(&mut console, "VMLTEST-CPUS", |n| n == 1);
    let booted = common::guest_reports(&mut console, "VMLTEST-MEMORY", |_| true);
    let uri = vm.libvirt_uri();
    let domain = format!("default_{NAME}");
    let xml_before = common::live_xml(&uri, &domain);

    // Out of bounds: refused by field, nothing changed.
    refused(&vm, &spec(5, "1Gi"), "spec.domain.cpu.sockets");
    refused(&vm, &spec(2, "3Gi"), "spec.domain.memory.guest");
    refused(
        &vm,
        &spec(2, "1025Mi"),
        "spec.domain.memory.guest: 1074790400 bytes is not a multiple",
    );
    refused(&vm, &spec(1, "512Mi"), "below 1Gi");
    assert_eq!(common::live_xml(&uri, &domain), xml_before);

    // Up: one socket, then two more with 512Mi.
    let reply = sync(&vm, &spec(2, "1Gi"));
    assert_eq!(resources(&reply), vec![change("cpu", 1, 2)]);
    common::guest_reports(&mut console, "VMLTEST-CPUS", |n| n == 2);
    // A vCPU added behind the launcher's back, of which libvirt sends no event: a Sync asking
    // for that count finds it there (the reply changes nothing; setting it again would say
    // 2 → 3), and the next one counts from it.
    let out = Command::new("virsh")
        .args(["-c", &uri, "setvcpus", &domain, "3", "--live"])
        .output()
        .unwrap();
    common::succeeded(out, "virsh setvcpus --live");
    common::guest_reports(&mut console, "VMLTEST-CPUS", |n| n == 3);
    assert_eq!(resources(&sync(&vm, &spec(3, "1Gi"))), vec![]);
    assert_eq!(
        vcpucount(&vm, &domain, "--config"),
        3,
        "the next boot's, as asked"
    );
    let reply = sync(&vm, &spec(4, "1536Mi"));
    assert_eq!(
        resources(&reply),
        vec![
            change("cpu", 3, 4),
            change("memory", 1024 * MIB, 1536 * MIB)
        ]
    );
    common::guest_reports(&mut console, "VMLTEST-CPUS", |n| n == 4);
    common::guest_reports(&mut console, "VMLTEST-MEMORY", |kb| {
        kb == booted + 512 * 1024
    });
    let reply = sync(&vm, &spec(4, "2Gi"));
    assert_eq!(
        resources(&reply),
        vec![change("memory", 1536 * MIB, 2048 * MIB)]
    );
    common::guest_reports(&mut console, "VMLTEST-MEMORY", |kb| {
        kb == booted + 1024 * 1024
    });
    let status = status_until(&vm.socket(), "2Gi plugged", |s| {
        s["memory"]["current"] == 2048 * MIB
    });
    assert_eq!(status["memory"]["guestAtBoot"], 1024 * MIB);
    assert_eq!(status["memory"]["requested"], 2048 * MIB);
    assert_eq!(status["memory"]["maxGuest"], 2048 * MIB);
    assert_eq!(status["cpu"]["sockets"], 4);
    assert_eq!(status["cpu"]["maxSockets"], 4);
    assert_eq!(status["cpu"]["vcpusOnline"], 4);
    // A Sync that asks what the guest has changes nothing.
    assert_eq!(resources(&sync(&vm, &spec(4, "2Gi"))), vec![]);

    // SIGKILL and a new launcher: it adopts the resized guest, and knows what was asked.
    vm.kill9();
    let mut vm = vm.successor(&spec(1, "1Gi"), MANUAL);
    vm.wait_stdout("phase Running", GUEST_DEADLINE);
    let status = cli_status(&vm.socket());
    assert_eq!(status["cpu"]["vcpusOnline"], 4, "{status}");
    assert_eq!(status["memory"]["requested"], 2048 * MIB, "{status}");

    // Memory down again, live. (vCPUs go down with the cold boot below: see
    // `a_vcpu_decrease_waits_for_the_next_boot_and_can_be_taken_back`.)
    let reply = sync(&vm, &spec(4, "1Gi"));
    assert_eq!(
        resources(&reply),
        vec![change("memory", 2048 * MIB, 1024 * MIB)]
    );
    common::guest_reports(&mut console, "VMLTEST-MEMORY", |kb| kb == booted);
    status_until(&vm.socket(), "1Gi given back", |s| {
        s["memory"]["current"] == 1024 * MIB
    });

    // A cold boot boots with what was asked last: 2 sockets, 1536Mi from the start.
    let reply = sync(&vm, &spec(2, "1536Mi"));
    assert_eq!(
        resources(&reply),
        vec![at_restart(4, 2), change("memory", 1024 * MIB, 1536 * MIB)]
    );
    cli_ok(&vm.socket(), &["stop"]);
    let mut console = ConsoleLog::from_end(&vm.dir().join("console.log")).unwrap();
    cli_ok(&vm.socket(), &["start"]);
    common::wait_booted(&mut console);
    let status = status_until(&vm.socket(), "booted with 1536Mi", |s| {
        s["memory"]["guestAtBoot"] == 1536 * MIB
    });
    assert_eq!(status["cpu"]["vcpusOnline"], 2, "{status}");
    common::guest_reports(&mut console, "VMLTEST-CPUS", |n| n == 2);
    common::guest_reports(&mut console, "VMLTEST-MEMORY", |kb| {
        kb > booted + 256 * 1024
    });

    vm.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(vm.wait_exit(Duration::from_secs(120)).code(), Some(0));
}

/// `virsh vcpucount DOMAIN --active` of the running guest (`--live`) or of the persistent
/// definition (`--config`).
fn vcpucount(vm: &Launched, domain: &str, which: &str) -> u32 {
    let out = Command::new("virsh")
        .args([
            "-c",
            &vm.libvirt_uri(),
            "vcpucount",
            domain,
            which,
            "--active",
        ])
        .output()
        .unwrap();
    let out = common::succeeded(out, "virsh vcpucount");
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .parse()
        .unwrap_or_else(|e| panic!("virsh vcpucount {which}: {e}: {text:?}"))
}

/// The status's `RestartRequired` condition, if shown.
fn restart_required(status: &serde_json::Value) -> Option<serde_json::Value> {
    status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "RestartRequired")
        .cloned()
}

#[test]
fn a_vcpu_decrease_waits_for_the_next_boot_and_can_be_taken_back() {
    const DOWN: &str = "e2e-resize-down";
    let spec = |sockets: u32, guest: &str| spec_named(DOWN, sockets, guest);
    let domain = format!("default_{DOWN}");
    let mut vm = Launched::start(&spec(2, "1Gi"), MANUAL);
    vm.wait_stdout("api unix:", GUEST_DEADLINE);
    cli_ok(&vm.socket(), &["start"]);
    let mut console = vm.boot();
    common::guest_reports(&mut console, "VMLTEST-CPUS", |n| n == 2);
    let booted = common::guest_reports(&mut console, "VMLTEST-MEMORY", |_| true);

    // 2 → 1 socket: the persistent definition only, reported as waiting for a restart.
    let reply = sync(&vm, &spec(1, "1Gi"));
    assert_eq!(resources(&reply), vec![at_restart(2, 1)]);
    assert_eq!(vcpucount(&vm, &domain, "--live"), 2);
    assert_eq!(vcpucount(&vm, &domain, "--config"), 1);
    let status = cli_status(&vm.socket());
    assert_eq!(status["cpu"]["vcpusOnline"], 2, "{status}");
    let waiting =
        restart_required(&status).unwrap_or_else(|| panic!("no RestartRequired: {status}"));
    assert_eq!(waiting["status"], true, "{waiting}");
    assert_eq!(waiting["reason"], "VCPUDecrease", "{waiting}");
    // The guest keeps both: memory plugged after the decrease is the marker; the guest prints
    // its CPUs on every change, before its memory, and never printed 1.
    let reply = sync(&vm, &spec(1, "1536Mi"));
    assert_eq!(
        resources(&reply),
        vec![change("memory", 1024 * MIB, 1536 * MIB)]
    );
    let mut cpus_seen = Vec::new();
    console
        .wait_for("the memory marker", Instant::now() + GUEST_DEADLINE, |l| {
            if let Some(n) = l.strip_prefix("VMLTEST-CPUS ") {
                cpus_seen.push(n.trim().to_string());
            }
            l.strip_prefix("VMLTEST-MEMORY ")
                .and_then(|n| n.trim().parse::<u64>().ok())
                .is_some_and(|kb| kb == booted + 512 * 1024)
        })
        .unwrap();
    assert!(
        cpus_seen.is_empty(),
        "the guest's CPUs changed: {cpus_seen:?}"
    );

    // Back to 2: nothing to do to the guest, the waiting decrease is taken back.
    let reply = sync(&vm, &spec(2, "1536Mi"));
    assert_eq!(resources(&reply), vec![]);
    assert_eq!(vcpucount(&vm, &domain, "--config"), 2);
    let status = cli_status(&vm.socket());
    assert_eq!(restart_required(&status), None, "{status}");

    // Down again, and a cold boot (stop, start): it boots with 1.
    assert_eq!(
        resources(&sync(&vm, &spec(1, "1536Mi"))),
        vec![at_restart(2, 1)]
    );
    // The same decrease asked again: it waits already.
    assert_eq!(resources(&sync(&vm, &spec(1, "1536Mi"))), vec![]);
    cli_ok(&vm.socket(), &["stop"]);
    let mut console = ConsoleLog::from_end(&vm.dir().join("console.log")).unwrap();
    cli_ok(&vm.socket(), &["start"]);
    common::wait_booted(&mut console);
    common::guest_reports(&mut console, "VMLTEST-CPUS", |n| n == 1);
    let status = status_until(&vm.socket(), "booted with 1 vCPU", |s| {
        s["cpu"]["vcpusOnline"] == 1
    });
    assert_eq!(restart_required(&status), None, "{status}");
    assert_eq!(vcpucount(&vm, &domain, "--live"), 1);

    // And the next increase works.
    let reply = sync(&vm, &spec(2, "1536Mi"));
    assert_eq!(resources(&reply), vec![change("cpu", 1, 2)]);
    common::guest_reports(&mut console, "VMLTEST-CPUS", |n| n == 2);
    assert_eq!(vcpucount(&vm, &domain, "--config"), 2);

    vm.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(vm.wait_exit(Duration::from_secs(120)).code(), Some(0));
}

/// `virsh vcpupin --live`: each row after the dashes, as (vCPU, CPUs).
fn live_pins(vm: &Launched, domain: &str) -> Vec<(String, String)> {
    let out = Command::new("virsh")
        .args(["-c", &vm.libvirt_uri(), "vcpupin", domain, "--live"])
        .output()
        .unwrap();
    let out = common::succeeded(out, "virsh vcpupin");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip_while(|l| !l.starts_with("---"))
        .skip(1)
        .filter_map(|l| {
            // ` 0      0`, or `0: 0` in other virsh versions.
            let mut words = l
                .split(|c: char| c.is_whitespace() || c == ':')
                .filter(|w| !w.is_empty());
            Some((words.next()?.to_string(), words.next()?.to_string()))
        })
        .collect()
}

#[test]
fn a_hot_added_dedicated_vcpu_is_pinned_as_the_others_are() {
    let cpus = vmlauncher::host::cpus::own_cpus().unwrap();
    assert!(
        cpus.len() >= 2,
        "this test needs two CPUs in its affinity, it has {cpus:?}"
    );
    let spec = |sockets: u32| {
        guest_spec("e2e-resize-pinned", "", &[]).replace(
            "    devices:\n",
            &format!("    cpu:\n      sockets: {sockets}\n      maxSockets: 2\n      dedicatedCpuPlacement: true\n    devices:\n"),
        )
    };
    let mut vm = Launched::start(&spec(1), &[]);
    let mut console = vm.boot();
    common::guest_reports(&mut console, "VMLTEST-CPUS", |n| n == 1);
    let domain = "default_e2e-resize-pinned";
    let file = vm.scratch().join("sync.yaml");
    std::fs::write(&file, spec(2)).unwrap();
    cli_ok(&vm.socket(), &["sync", file.to_str().unwrap()]);
    common::guest_reports(&mut console, "VMLTEST-CPUS", |n| n == 2);
    assert_eq!(
        live_pins(&vm, domain),
        vec![
            ("0".to_string(), cpus[0].to_string()),
            ("1".to_string(), cpus[1].to_string())
        ]
    );
    vm.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(vm.wait_exit(Duration::from_secs(120)).code(), Some(0));
}
