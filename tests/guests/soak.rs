//! Fault and soak tests in one real TCG guest whose launcher (and so its private libvirtd and
//! QEMU) runs in a cgroup v1 devices group that denies block devices, so every block hotplug
//! writes a real device rule:
//! 1. attach/detach cycles of a file and a block (loop) volume: no device node, cgroup rule,
//!    launcher file descriptor or libvirt device left behind, and the launcher's RSS flat;
//! 2. eight Syncs with different specs at once: none fails, and the VM ends exactly in the state
//!    of the one applied last (the one `GetSpec` reports), with nothing of the others;
//! 3. pause/unpause cycles: every event on the stream, with no gap in the sequence numbers;
//! 4. libvirtd killed (SIGKILL) during an attach: the launcher brings a new one up, and the same
//!    Sync again attaches what is missing;
//! 5. a block volume still attached at the end: its node and rule go when the launcher exits
//!    (on SIGQUIT, which stops the guest gracefully like SIGTERM).
//!
//! The counts come from the environment, small by default (what CI runs):
//! `VMLAUNCHER_SOAK_CYCLES` (default 50) and `VMLAUNCHER_SOAK_PAUSES` (default 20);
//! `scripts/soak.sh` runs 1000 and 200. Figures are printed with `--nocapture`.

use crate::common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use common::{
    guest_serials, guest_spec, hotplug_image, set, with_claims, EventWatcher, Launched, Loop,
    BOOT_DEADLINE, GUEST_DEADLINE,
};
use vmlauncher::api::{self, proto};
use vmlauncher::console::ConsoleLog;

const NAME: &str = "e2e-soak";
const READY: i32 = proto::volume_status::Phase::Ready as i32;

fn count(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{var}={v} is not a count"))
        })
        .unwrap_or(default)
}

/// A cgroup v1 devices group that denies block devices (as a container runtime leaves a pod);
/// removed on drop.
struct DenyBlockCgroup(PathBuf);

impl DenyBlockCgroup {
    fn new() -> DenyBlockCgroup {
        let dir = PathBuf::from(format!(
            "/sys/fs/cgroup/devices/vml-soak-{}",
            common::unique()
        ));
        std::fs::create_dir(&dir).expect("make the test cgroup");
        for (file, rule) in [
            ("devices.deny", "a"),
            ("devices.allow", "c *:* rwm"),
            ("devices.allow", "b *:* m"),
        ] {
            std::fs::write(dir.join(file), rule).unwrap();
        }
        DenyBlockCgroup(dir)
    }

    /// The block rules in force, sorted.
    fn block_rules(&self) -> Vec<String> {
        let list = std::fs::read_to_string(self.0.join("devices.list")).unwrap();
        let mut rules: Vec<String> = list
            .lines()
            .filter(|l| l.starts_with("b ") && *l != "b *:* m")
            .map(str::to_string)
            .collect();
        rules.sort();
        rules
    }
}

impl Drop for DenyBlockCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// The test guest with hot-pluggable claims `(volume, serial)` on scsi.
fn hot_spec(volumes: &[(&str, &str)]) -> String {
    with_claims(guest_spec(NAME, "", &[]), volumes)
}

fn request(volumes: &[(&str, &str)], block: Option<(&str, &Loop)>) -> proto::SyncRequest {
    proto::SyncRequest {
        spec: hot_spec(volumes),
        block_devices: block
            .map(|(v, l)| (v.to_string(), l.block_device()))
            .into_iter()
            .collect(),
        ..Default::default()
    }
}

fn wait_guest_disks(console: &mut ConsoleLog, want: &BTreeSet<String>) {
    console
        .wait_for(
            &format!("the guest seeing exactly {want:?}"),
            Instant::now() + GUEST_DEADLINE,
            |l| l.starts_with("VMLTEST-DISKS") && &set(&guest_serials(l)) == want,
        )
        .unwrap();
}

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

fn dir_names(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// The volumes of the scsi disks in libvirt's live XML (`ua-<volume>` aliases).
fn live_volumes(vm: &Launched) -> BTreeSet<String> {
    let conn = virt::connect::Connect::open(Some(&vm.libvirt_uri())).unwrap();
    let dom = conn
        .lookup_domain_by_name(&format!("default_{NAME}"))
        .unwrap();
    let xml = dom.xml_desc(0).unwrap();
    vmlauncher::domain::live_disks(&xml)
        .unwrap()
        .iter()
        .filter_map(|d| d.volume().map(str::to_string))
        .collect()
}

fn ready_names(volumes: &[proto::VolumeStatus]) -> BTreeSet<String> {
    assert!(
        volumes.iter().all(|v| v.phase == READY),
        "not all Ready: {volumes:?}"
    );
    volumes.iter().map(|v| v.name.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_hotplug_concurrency_pauses_and_a_killed_libvirtd() {
    let cycles = count("VMLAUNCHER_SOAK_CYCLES", 50);
    let pauses = count("VMLAUNCHER_SOAK_PAUSES", 20);
    let cgroup = DenyBlockCgroup::new();
    let mut vm = Launched::start_in_cgroups(
        &guest_spec(NAME, "", &[]),
        &[],
        &[cgroup.0.join("cgroup.procs")],
    );
    let mut console = vm.boot();
    let launcher = vm.child.id();
    let hotplug = vm.dir().join("hotplug");
    let scratch = tempfile::tempdir().unwrap();
    let lo = Loop::new(scratch.path(), "soak", 2, false);
    hotplug_image(&hotplug, "cf", 1 << 20);
    let mut client = api::connect(&vm.socket()).await.unwrap();

    // 1. Attach/detach cycles. The first ones warm up (allocator pools, libvirt's caches);
    // the baseline is taken after them.
    let both = request(
        &[("cf", "Soak-File"), ("cb", "Soak-Block")],
        Some(("cb", &lo)),
    );
    let none = request(&[], None);
    let warm_up = 10.min(cycles);
    let mut baseline = None;
    let started = Instant::now();
    for i in 0..cycles {
        if i == warm_up {
            baseline = Some((
                fd_count(launcher),
                rss_kib(launcher),
                dir_names(&hotplug),
                cgroup.block_rules(),
                Instant::now(),
            ));
        }
        let reply = client
            .sync(both.clone())
            .await
            .unwrap_or_else(|e| panic!("cycle {i} attach: {e}"))
            .into_inner();
        assert_eq!(ready_names(&reply.volumes), set(&["cb", "cf"]), "cycle {i}");
        if i == 0 || i + 1 == cycles {
            wait_guest_disks(&mut console, &set(&["Soak-Block", "Soak-File"]));
            assert_eq!(
                cgroup.block_rules(),
                [format!("b {}:{} rwm", lo.major, lo.minor)]
            );
        }
        let reply = client
            .sync(none.clone())
            .await
            .unwrap_or_else(|e| panic!("cycle {i} detach: {e}"))
            .into_inner();
        assert!(reply.volumes.is_empty(), "cycle {i}: {:?}", reply.volumes);
        if i == 0 || i + 1 == cycles {
            wait_guest_disks(&mut console, &BTreeSet::new());
        }
    }
    let elapsed = started.elapsed();
    let (fds, rss, nodes, rules, measured) = baseline.expect("at least warm-up + 1 cycles");
    let (fds_end, rss_end) = (fd_count(launcher), rss_kib(launcher));
    eprintln!(
        "SOAK {cycles} attach/detach cycles (file + block) in {:.1}s ({:.0} ms/cycle); \
         launcher fds {fds} -> {fds_end}; RSS {rss} KiB -> {rss_end} KiB (after {warm_up} warm-up cycles)",
        elapsed.as_secs_f64(),
        measured.elapsed().as_secs_f64() * 1000.0 / (cycles - warm_up) as f64,
    );
    assert_eq!(fds_end, fds, "the launcher leaks file descriptors");
    assert_eq!(
        dir_names(&hotplug),
        nodes,
        "device nodes left in {hotplug:?}"
    );
    assert_eq!(cgroup.block_rules(), rules, "cgroup rules left");
    assert!(rules.is_empty(), "{rules:?}");
    let live = live_volumes(&vm);
    assert!(live.is_empty(), "libvirt still has devices: {live:?}");
    let records =
        std::fs::read_to_string(vm.dir().join("hotplug-records.json")).unwrap_or_default();
    assert!(!records.contains("\"cb\""), "{records}");
    // Flat: growth within an eighth (+ 2 MiB for the allocator's arenas), not per cycle.
    assert!(
        rss_end <= rss + rss / 8 + 2048,
        "RSS grew from {rss} KiB to {rss_end} KiB over {} cycles",
        cycles - warm_up
    );

    // 2. Eight Syncs with different specs at once.
    let specs: Vec<proto::SyncRequest> = (0..8)
        .map(|i| {
            let a = format!("p{i}a");
            let b = format!("p{i}b");
            hotplug_image(&hotplug, &a, 1 << 20);
            hotplug_image(&hotplug, &b, 1 << 20);
            let (sa, sb) = (format!("Conc-{i}-A"), format!("Conc-{i}-B"));
            let mut vols = vec![(a, sa), (b, sb)];
            // Half of them also hold the block volume, so concurrent Syncs also race on it.
            if i % 2 == 0 {
                // (One serial: a live disk's serial cannot change.)
                vols.push(("cb".into(), "Conc-Blk".into()));
            }
            let v: Vec<(&str, &str)> = vols.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
            request(&v, (i % 2 == 0).then_some(("cb", &lo)))
        })
        .collect();
    let mut handles = Vec::new();
    for req in specs.clone() {
        let mut c = api::connect(&vm.socket()).await.unwrap();
        handles.push(tokio::spawn(async move { c.sync(req).await }));
    }
    for (i, h) in handles.into_iter().enumerate() {
        h.await
            .unwrap()
            .unwrap_or_else(|e| panic!("concurrent Sync {i} failed: {e}"));
    }
    let last = common::spec(&mut client).await.spec;
    let k = specs
        .iter()
        .position(|r| r.spec == last)
        .expect("GetSpec is one of the eight specs");
    let mut want: BTreeSet<String> = set(&[format!("p{k}a"), format!("p{k}b")]);
    let mut want_serials = set(&[format!("Conc-{k}-A"), format!("Conc-{k}-B")]);
    if k % 2 == 0 {
        want.insert("cb".into());
        want_serials.insert("Conc-Blk".into());
    }
    assert_eq!(
        ready_names(&common::status(&mut client).await.volumes),
        want
    );
    assert_eq!(live_volumes(&vm), want);
    wait_guest_disks(&mut console, &want_serials);
    eprintln!("SOAK 8 concurrent Syncs: all succeeded, the VM is in the state of Sync #{k}");
    let reply = client.sync(none.clone()).await.unwrap().into_inner();
    assert!(reply.volumes.is_empty(), "{:?}", reply.volumes);

    // 3. Pause/unpause cycles, followed on the event stream.
    let mut events = EventWatcher::start(&vm.socket()).await;
    let first = events
        .wait_for("the stream's resync", GUEST_DEADLINE, |_| true)
        .await;
    let started = Instant::now();
    for i in 0..pauses {
        for (what, paused) in [("pause", true), ("unpause", false)] {
            let reply = if paused {
                client.pause(proto::CommandRequest::default()).await
            } else {
                client.unpause(proto::CommandRequest::default()).await
            };
            let id = reply
                .unwrap_or_else(|e| panic!("{what} {i}: {e}"))
                .into_inner()
                .task_id;
            events
                .wait_for(&format!("{what} {i} succeeded"), GUEST_DEADLINE, |e| {
                    matches!(&e.kind, Some(proto::event::Kind::Task(t))
                        if t.id == id && t.outcome == "Succeeded")
                })
                .await;
        }
    }
    let elapsed = started.elapsed();
    assert!(
        matches!(first.kind, Some(proto::event::Kind::Resync(_))),
        "{first:?}"
    );
    let seqs: Vec<u64> = events.seen.iter().map(|e| e.seq).collect();
    // The resync carries the sequence number it is current at; every event after it is +1.
    for w in seqs.windows(2) {
        assert_eq!(w[1], w[0] + 1, "a gap in the event stream: {seqs:?}");
    }
    let resyncs = events
        .seen
        .iter()
        .skip(1)
        .filter(|e| matches!(e.kind, Some(proto::event::Kind::Resync(_))))
        .count();
    assert_eq!(resyncs, 0, "the stream fell behind");
    let tasks = |command: &str, outcome: &str| {
        events
            .seen
            .iter()
            .filter(|e| {
                matches!(&e.kind, Some(proto::event::Kind::Task(t))
                if t.command == command && t.outcome == outcome)
            })
            .count()
    };
    for command in ["Pause", "Unpause"] {
        assert_eq!(tasks(command, "Started"), pauses, "{command}");
        assert_eq!(tasks(command, "Succeeded"), pauses, "{command}");
    }
    // The vm_state the stream shows, changes only: Active, then Paused/Active per cycle.
    let mut states: Vec<&str> = Vec::new();
    for s in events.seen.iter().filter_map(common::event_status) {
        if states.last() != Some(&s.vm_state.as_str()) {
            states.push(&s.vm_state);
        }
    }
    let expected: Vec<&str> = std::iter::once("Active")
        .chain((0..pauses).flat_map(|_| ["Paused", "Active"]))
        .collect();
    assert_eq!(states, expected, "vm_state on the stream");
    eprintln!(
        "SOAK {pauses} pause/unpause cycles in {:.1}s; {} events, sequence {}..={} without a gap",
        elapsed.as_secs_f64(),
        seqs.len(),
        seqs[0],
        seqs[seqs.len() - 1]
    );

    // 4. libvirtd killed (SIGKILL) during an attach of six volumes.
    let six: Vec<(String, String)> = (1..=6)
        .map(|i| (format!("k{i}"), format!("Kill-{i}")))
        .collect();
    for (v, _) in &six {
        hotplug_image(&hotplug, v, 1 << 20);
    }
    let v: Vec<(&str, &str)> = six.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    let six_request = request(&v, None);
    let daemon = vm.pid_from("libvirt/libvirtd.pid").expect("libvirtd's pid");
    let mut sync_client = client.clone();
    let req = six_request.clone();
    let in_flight = tokio::spawn(async move { sync_client.sync(req).await });
    events
        .wait_for("the first attach in flight", GUEST_DEADLINE, |e| {
            matches!(&e.kind, Some(proto::event::Kind::Volume(v))
                if v.name.starts_with('k') && v.phase == proto::volume_status::Phase::Attaching as i32)
        })
        .await;
    common::signal_pid(daemon, nix::sys::signal::Signal::SIGKILL).unwrap();
    // The Sync ends one way or the other (volumes it could not attach are Failed).
    let outcome = in_flight.await.unwrap();
    eprintln!(
        "SOAK libvirtd killed during an attach; that Sync: {:?}",
        outcome.as_ref().map(|r| r
            .get_ref()
            .volumes
            .iter()
            .map(|v| (v.name.clone(), v.phase, v.reason.clone()))
            .collect::<Vec<_>>())
    );
    events
        .wait_phase("phase Unknown without libvirtd", GUEST_DEADLINE, "Unknown")
        .await;
    events
        .wait_phase(
            "Running again after the reconnect",
            BOOT_DEADLINE,
            "Running",
        )
        .await;
    let new_daemon = vm.pid_from("libvirt/libvirtd.pid").unwrap();
    assert!(new_daemon != daemon && common::alive(new_daemon));
    // The same Sync again converges: every volume Ready, seen by the guest, once.
    let reply = client.sync(six_request).await.unwrap().into_inner();
    let names: BTreeSet<String> = six.iter().map(|(v, _)| v.clone()).collect();
    assert_eq!(ready_names(&reply.volumes), names);
    assert_eq!(live_volumes(&vm), names);
    wait_guest_disks(&mut console, &six.iter().map(|(_, s)| s.clone()).collect());
    let reply = client.sync(none).await.unwrap().into_inner();
    assert!(reply.volumes.is_empty(), "{:?}", reply.volumes);
    assert!(live_volumes(&vm).is_empty());
    assert!(cgroup.block_rules().is_empty());

    // 5. A block volume still attached when the VM stops: nothing of it outlives the launcher.
    let reply = client
        .sync(request(&[("cb", "Soak-Block")], Some(("cb", &lo))))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ready_names(&reply.volumes), set(&["cb"]));
    assert!(!cgroup.block_rules().is_empty());
    drop(client);
    drop(events);
    // SIGQUIT (which PID 1 forwards) stops the guest gracefully like SIGTERM.
    vm.signal(nix::sys::signal::Signal::SIGQUIT);
    assert_eq!(vm.wait_exit(GUEST_DEADLINE).code(), Some(0));
    assert!(
        std::fs::symlink_metadata(hotplug.join("cb")).is_err(),
        "the node outlived the launcher"
    );
    assert_eq!(
        cgroup.block_rules(),
        Vec::<String>::new(),
        "rules outlived it"
    );
    drop(lo);
}
