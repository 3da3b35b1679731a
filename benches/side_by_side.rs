//! The launcher beside raw libvirt, in one run, on the same domain and the same daemon:
//! `cargo bench --bench side_by_side [-- [--json FILE] [--only migration|start|resize]]`.
//!
//! It boots the test guest (scripts/setup.sh builds it) through the real binary of this build and
//! its private libvirtd, connects to that libvirtd's socket itself with the `virt` crate, and then
//! alternates each launcher operation with the same operation done directly through libvirt's
//! API (the side that goes first swaps every cycle):
//!
//! - start → phase Running with an empty and with a warm QEMU capability cache (launcher only:
//!   raw libvirt has no daemon to start);
//! - one scsi disk: Sync attach (until its reply) / `attachDeviceFlags`; the same until the guest
//!   prints the disk's serial on its console; Sync detach (until its reply, which waits for
//!   libvirt's DEVICE_REMOVED) / `detachDeviceFlags` and DEVICE_REMOVED; a Sync that changes
//!   nothing, and a gRPC call that does nothing (`grpc.health.v1` Check: what a call costs before
//!   the launcher does anything), on the same connection (launcher only);
//! - 64 disks: one Sync / 64 sequential `attachDeviceFlags`; the same until the guest prints all
//!   64 serials; and the 64 detaches;
//! - memory with 16 disks attached: RSS, RssAnon and PSS of the launcher and of every other
//!   non-QEMU process of the VM (its descendants and the daemons whose pid files it keeps).
//! - on a second VM with room to resize (1 GiB, 512 MiB more through virtio-mem, 25 sockets),
//!   booted once the first is gone: 512 MiB added (Sync reply / `updateDeviceFlags`, and until
//!   the guest's MemTotal has it) and given back (the reply) while the guest has one vCPU; a
//!   vCPU added (one socket more each time: Sync reply / `setVcpusFlags`, and until the guest
//!   has it online); then the memory rows again, beside the 25 vCPUs.
//! - live migration of an idle guest of 256 MiB, then of 1 GiB, each booted once the VM before it
//!   is gone: `Migrate` from launcher to launcher / `virDomainMigrateToURI3` between two private
//!   libvirtds of the same kind, and the downtime libvirt reports on the target
//!   (`side_by_side/migration.rs` says how the sides are kept the same). `--only migration`
//!   runs these rows alone.
//!
//! The raw side's disks carry no `ua-` alias: the launcher plans only disks with its own alias
//! (`ua-<volume>`), keeps the units and targets of other disks free of its own, and ignores their
//! DEVICE_REMOVED events; a raw disk is detached before the launcher's next Sync all the same, and
//! both sides use the same unit, so each starts from the same domain.
//!
//! The resize rows act on one domain too: the launcher reads the vCPUs and the virtio-mem device
//! from libvirt before each resize, so what the raw side did is where its next Sync starts. The
//! raw side reads the live virtio-mem element (libvirt finds the device by its address) before
//! each call, outside the timing. Each change is waited out, untimed, before the next: the guest
//! reporting it, and for memory libvirt's `<current>` (QEMU's size-change event, at most one a
//! second) reaching what was asked. vCPUs are only added: a TCG guest takes longer to let one go
//! than the 5 s libvirt 9.0 waits.
//!
//! It prints a markdown table and, with `--json FILE`, writes the same numbers as JSON. Numbers
//! are printed, never asserted. Outside `cargo bench` (e.g. `cargo test --all-targets`) it does
//! nothing.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "side_by_side/migration.rs"]
mod migration;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{guest_spec, Client, ConsoleWait, Launched, BOOT_DEADLINE};
use tokio::runtime::Runtime;
use tokio::sync::mpsc::UnboundedReceiver;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use vmlauncher::api::{self, proto};
use vmlauncher::console::ConsoleLog;
use vmlauncher::domain::{live_disks, live_resources, target_name, LiveVirtioMem};
use vmlauncher::libvirt::events::{ensure_event_loop, EventRegistration, HypervisorEvent};

/// Per VM, with all of a storm's VMs running: every non-QEMU process of each VM summed.
fn print_storm_memory(per_vm: &[ProcessMemory]) {
    let mib = |kib: u64| format!("{:.1}", kib as f64 / 1024.0);
    println!("\n| storm of {STORM_VMS}, all running: non-QEMU processes of each VM | RSS MiB | RssAnon MiB | PSS MiB |");
    println!("|---|---|---|---|");
    for p in per_vm {
        println!(
            "| launcher pid {} and its libvirtd | {} | {} | {} |",
            p.pid,
            mib(p.rss),
            mib(p.anon),
            mib(p.pss)
        );
    }
    let n = per_vm.len().max(1) as u64;
    let mean = |f: fn(&ProcessMemory) -> u64| per_vm.iter().map(f).sum::<u64>() / n;
    println!(
        "| mean per VM | {} | {} | {} |",
        mib(mean(|p| p.rss)),
        mib(mean(|p| p.anon)),
        mib(mean(|p| p.pss))
    );
}

/// Alternating cycles for each one-disk row. With 30, the medians of either side moved by
/// ±0.3 ms of a 5 ms attach from run to run (the guest's disk rescan under TCG competes with
/// QEMU's hotplug), so the attach ratio moved by ±0.07 between runs of the same code.
const ONE_DISK_CYCLES: usize = 60;
/// Disks per round of the many-disks rows, and rounds per side. With 3 rounds, either side's
/// median of a 0.4 s Sync moved by ±5 % between runs of the same code (the guest's disk rescan
/// under TCG), the ratio from 0.90 to 1.17; 5 rounds cost the run about 30 s more.
const MANY_DISKS: usize = 64;
const MANY_ROUNDS: usize = 5;
const COLD_STARTS: usize = 3;
const WARM_STARTS: usize = 5;

/// How many samples the first VM's rows take.
#[derive(Clone, Copy)]
struct Counts {
    one_disk_cycles: usize,
    many_rounds: usize,
    cold_starts: usize,
    warm_starts: usize,
    /// The storm rows after the start rows.
    storm: bool,
    /// Stop after the start (and storm) rows.
    start_only: bool,
}

/// The whole run's.
const FULL: Counts = Counts {
    one_disk_cycles: ONE_DISK_CYCLES,
    many_rounds: MANY_ROUNDS,
    cold_starts: COLD_STARTS,
    warm_starts: WARM_STARTS,
    storm: true,
    start_only: false,
};

/// `--only start`: the warm starts beside raw and the storms, nothing else.
const START_ONLY: Counts = Counts {
    one_disk_cycles: 0,
    many_rounds: 0,
    cold_starts: 0,
    warm_starts: 7,
    storm: true,
    start_only: true,
};

/// `--plain`'s, for each of several configurations in one run: half the one-disk cycles, three
/// rounds of 64 disks, no cold start (the capability cache's row is its warm start turned off).
const PLAIN_COUNTS: Counts = Counts {
    one_disk_cycles: 30,
    many_rounds: 3,
    cold_starts: 0,
    warm_starts: 4,
    storm: false,
    start_only: false,
};
/// Disks attached while memory is read.
const MEMORY_DISKS: usize = 16;
const NAME: &str = "bench";
/// The guest rescans its disks every 0.2 s; 64 disks under TCG on a loaded host take longer.
const GUEST_DEADLINE: Duration = Duration::from_secs(180);
const REMOVAL_DEADLINE: Duration = Duration::from_secs(60);
/// vCPUs added per side, one socket each time, on a VM booted with one socket and room for
/// all of them: n of the CPU rows. Eight per side left a spread across runs of one build
/// (0.91-1.52) wider than the 10 % the rows are judged by.
const CPU_ADDS: u32 = 12;
/// Per side: 512 MiB added, then given back, each until the guest reports it.
const MEMORY_CYCLES: usize = 16;
/// The resize VM's memory at boot and what a memory cycle adds (KubeVirt's virtio-mem needs at
/// least 1 GiB at boot).
const BOOT_MIB: u64 = 1024;
const ADD_MIB: u64 = 512;
const RESIZE_NAME: &str = "bench-resize";

/// One row of the table: the launcher's samples and, where libvirt has the same operation, raw
/// libvirt's.
struct Row {
    what: &'static str,
    launcher: Vec<Duration>,
    raw: Option<Vec<Duration>>,
}

/// The value at quantile `q` of `samples` (nearest rank on the sorted samples).
fn quantile(samples: &[Duration], q: f64) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn human(d: Duration) -> String {
    if d >= Duration::from_secs(1) {
        format!("{:.2} s", d.as_secs_f64())
    } else {
        format!("{:.2} ms", d.as_secs_f64() * 1e3)
    }
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

impl Row {
    fn ratio(&self) -> Option<f64> {
        let raw = quantile(self.raw.as_ref()?, 0.5).as_secs_f64();
        Some(quantile(&self.launcher, 0.5).as_secs_f64() / raw)
    }

    fn markdown(&self) -> String {
        let (raw_median, raw_p90) = match &self.raw {
            Some(raw) => (human(quantile(raw, 0.5)), human(quantile(raw, 0.9))),
            None => ("—".into(), "—".into()),
        };
        format!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            self.what,
            self.launcher.len(),
            raw_median,
            raw_p90,
            human(quantile(&self.launcher, 0.5)),
            human(quantile(&self.launcher, 0.9)),
            self.ratio().map_or("—".into(), |r| format!("{r:.2}")),
        )
    }

    fn json(&self) -> serde_json::Value {
        let side = |s: &[Duration]| {
            serde_json::json!({
                "median_ms": ms(quantile(s, 0.5)),
                "p90_ms": ms(quantile(s, 0.9)),
                "samples_ms": s.iter().map(|d| ms(*d)).collect::<Vec<_>>(),
            })
        };
        serde_json::json!({
            "what": self.what,
            "n": self.launcher.len(),
            "launcher": side(&self.launcher),
            "raw": self.raw.as_deref().map(side),
            "ratio": self.ratio().map(|r| (r * 1000.0).round() / 1000.0),
        })
    }
}

/// One operation's samples on either side, for the rows that alternate single calls.
#[derive(Default)]
struct Sides {
    launcher: Vec<Duration>,
    raw: Vec<Duration>,
}

impl Sides {
    fn push(&mut self, launcher_turn: bool, took: Duration) {
        if launcher_turn {
            self.launcher.push(took);
        } else {
            self.raw.push(took);
        }
    }

    fn row(self, what: &'static str) -> Row {
        Row {
            what,
            launcher: self.launcher,
            raw: Some(self.raw),
        }
    }
}

/// Memory of one process, in KiB, from /proc.
struct ProcessMemory {
    pid: i32,
    name: String,
    rss: u64,
    anon: u64,
    pss: u64,
}

/// The `field:` value (kB) of a /proc file in the `status` format.
fn proc_kib(text: &str, field: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in\n{text}"))
}

fn memory_of(pid: i32) -> ProcessMemory {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    let name = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
    ProcessMemory {
        pid,
        name: name.trim().into(),
        rss: proc_kib(&status, "VmRSS"),
        anon: proc_kib(&status, "RssAnon"),
        pss: proc_kib(&rollup, "Pss"),
    }
}

/// Parent pid of every process, from /proc/PID/stat (the fields after the command's `)`).
fn parents() -> BTreeMap<i32, i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let ppid = stat_field(pid, 4)?.parse().ok()?;
            Some((pid, ppid))
        })
        .collect()
}

/// Field `n` (counted from 1, as proc(5) does) of `/proc/PID/stat`.
fn stat_field(pid: i32, n: usize) -> Option<String> {
    stat_fields(pid, [n]).map(|[field]| field)
}

/// Fields `ns` (counted from 1, as proc(5) does) of one read of `/proc/PID/stat`, so that they
/// are one snapshot: read past the command name, which may hold spaces and parentheses.
fn stat_fields<const N: usize>(pid: i32, ns: [usize; N]) -> Option<[String; N]> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    // The fields after the name start with the third.
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let mut found = ns.map(|_| String::new());
    for (slot, n) in found.iter_mut().zip(ns) {
        *slot = (*fields.get(n.checked_sub(3)?)?).to_string();
    }
    Some(found)
}

fn is_qemu(pid: i32) -> bool {
    std::fs::read_link(format!("/proc/{pid}/exe"))
        .ok()
        .and_then(|exe| Some(exe.file_name()?.to_str()?.starts_with("qemu-system")))
        .unwrap_or(false)
}

/// The launcher, every process it started or that descends from it, and every process whose pid
/// file is under its runtime dir (a daemon that detached itself) — QEMU left out.
fn vm_processes(launcher: i32, runtime_dir: &Path) -> Vec<i32> {
    let parents = parents();
    let mut found = BTreeSet::from([launcher]);
    loop {
        let more: Vec<i32> = parents
            .iter()
            .filter(|(pid, ppid)| found.contains(ppid) && !found.contains(pid))
            .map(|(pid, _)| *pid)
            .collect();
        if more.is_empty() {
            break;
        }
        found.extend(more);
    }
    for dir in [runtime_dir.to_path_buf(), runtime_dir.join("libvirt")] {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if entry.path().extension().is_some_and(|x| x == "pid") {
                let pid = std::fs::read_to_string(entry.path())
                    .ok()
                    .and_then(|t| t.trim().parse().ok());
                if let Some(pid) = pid.filter(|p| common::alive(*p)) {
                    found.insert(pid);
                }
            }
        }
    }
    found.into_iter().filter(|p| !is_qemu(*p)).collect()
}

/// Waits until the guest prints a disk list with every serial in `wanted`.
fn wait_serials(console: &mut ConsoleLog, wanted: &[String]) {
    let what = format!("the guest listing {} serial(s)", wanted.len());
    console.line(&what, GUEST_DEADLINE, |l| {
        l.starts_with("VMLTEST-DISKS") && {
            let seen = common::set(&common::guest_serials(l));
            wanted.iter().all(|s| seen.contains(s))
        }
    });
}

/// A spec of the base guest with one hostDisk volume `<prefix><k>` per serial, on the images.
fn hostdisk_spec(prefix: &str, serials: &[String], images: &[PathBuf]) -> String {
    let volumes: Vec<String> = (0..serials.len()).map(|k| format!("{prefix}{k}")).collect();
    let disks: Vec<(&str, &str, &Path)> = volumes
        .iter()
        .zip(serials)
        .zip(images)
        .map(|((v, s), i)| (v.as_str(), s.as_str(), i.as_path()))
        .collect();
    guest_spec(NAME, "", &disks)
}

/// The same disk the launcher attaches for a `hostDisk` on scsi (`vmlauncher convert` shows it),
/// without the launcher's `ua-` alias: libvirt names it `scsi0-0-0-<unit>` itself.
fn raw_disk_xml(path: &Path, serial: &str, unit: u32) -> String {
    format!(
        "<disk type='file' device='disk'><driver name='qemu' type='raw' error_policy='stop'/>\
         <source file='{}'/><target dev='{}' bus='scsi'/><serial>{serial}</serial>\
         <address type='drive' controller='0' bus='0' target='0' unit='{unit}'/></disk>",
        path.display(),
        target_name("sd", unit)
    )
}

/// Live and persistent: what the launcher asks of both resize calls.
const RESIZE_FLAGS: u32 = virt::sys::VIR_DOMAIN_AFFECT_LIVE | virt::sys::VIR_DOMAIN_AFFECT_CONFIG;

/// libvirt used directly, as a program without the launcher would: one connection to the
/// launcher's private libvirtd, the domain's device calls, and its DEVICE_REMOVED events
/// (through vmlauncher's event module: the `virt` crate has no event registration).
struct Raw {
    domain_name: String,
    domain: virt::domain::Domain,
    events: UnboundedReceiver<HypervisorEvent>,
    // Dropped before the connection it holds a clone of.
    _registration: EventRegistration,
    conn: virt::connect::Connect,
}

impl Raw {
    fn open(uri: &str, domain_name: &str) -> Raw {
        ensure_event_loop().unwrap();
        let conn = virt::connect::Connect::open(Some(uri)).unwrap();
        let (tx, events) = tokio::sync::mpsc::unbounded_channel();
        let registration = EventRegistration::register(&conn, tx).unwrap();
        let domain = conn.lookup_domain_by_name(domain_name).unwrap();
        Raw {
            domain_name: domain_name.into(),
            domain,
            events,
            _registration: registration,
            conn,
        }
    }

    /// The launcher's definition of the domain, renamed, without its uuid, and with every path
    /// under `runtime_dir` (console log, VNC socket) moved under `elsewhere`.
    fn definition_copy(&self, runtime_dir: &Path, elsewhere: &Path, name: &str) -> String {
        let xml = self
            .domain
            .xml_desc(virt::sys::VIR_DOMAIN_XML_INACTIVE)
            .unwrap();
        let uuid = xml.find("<uuid>").expect("a uuid")
            ..xml.find("</uuid>").expect("a uuid") + "</uuid>".len();
        let mut copy = xml.clone();
        copy.replace_range(uuid, "");
        copy.replace(
            &format!("<name>{}</name>", self.domain_name),
            &format!("<name>{name}</name>"),
        )
        .replace(runtime_dir.to_str().unwrap(), elsewhere.to_str().unwrap())
    }

    /// `defineXML` and `create` (what the launcher calls), until `create` returns with the
    /// domain running; then destroyed and undefined, untimed.
    fn start_copy(&self, xml: &str) -> Duration {
        let started = Instant::now();
        let domain = self
            .conn
            .define_domain_xml(xml)
            .unwrap_or_else(|e| panic!("defineXML: {e}\n{xml}"));
        domain.create().unwrap_or_else(|e| panic!("create: {e}"));
        let took = started.elapsed();
        domain.destroy().unwrap();
        domain.undefine().unwrap();
        took
    }

    fn attach(&self, xml: &str) {
        self.domain
            .attach_device_flags(xml, virt::sys::VIR_DOMAIN_AFFECT_LIVE)
            .unwrap_or_else(|e| panic!("attachDeviceFlags: {e}\n{xml}"));
    }

    fn detach(&self, xml: &str) {
        self.domain
            .detach_device_flags(xml, virt::sys::VIR_DOMAIN_AFFECT_LIVE)
            .unwrap_or_else(|e| panic!("detachDeviceFlags: {e}\n{xml}"));
    }

    /// `setVcpusFlags`, live and persistent, as the launcher calls it.
    fn set_vcpus(&self, count: u32) {
        self.domain
            .set_vcpus_flags(count, RESIZE_FLAGS)
            .unwrap_or_else(|e| panic!("setVcpusFlags({count}): {e}"));
    }

    /// `updateDeviceFlags`, live and persistent, as the launcher calls it.
    fn update_device(&self, xml: &str) {
        self.domain
            .update_device_flags(xml, RESIZE_FLAGS)
            .unwrap_or_else(|e| panic!("updateDeviceFlags: {e}\n{xml}"));
    }

    /// The live virtio-mem device (read outside any timing).
    fn virtio_mem(&self) -> LiveVirtioMem {
        let xml = self.domain.xml_desc(0).unwrap();
        live_resources(&xml)
            .unwrap()
            .virtio_mem
            .expect("a virtio-mem device")
    }

    /// Waits until the guest has plugged `kib` through virtio-mem, as libvirt has it (from
    /// QEMU's size-change event).
    fn wait_plugged(&self, kib: u64) {
        let deadline = Instant::now() + GUEST_DEADLINE;
        while self.virtio_mem().current_kib != kib {
            assert!(
                Instant::now() < deadline,
                "virtio-mem not at {kib} KiB within {GUEST_DEADLINE:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The alias libvirt gave each disk, by serial (read outside any timing).
    fn aliases(&self) -> BTreeMap<String, String> {
        let xml = self.domain.xml_desc(0).unwrap();
        live_disks(&xml)
            .unwrap()
            .into_iter()
            .filter_map(|d| Some((d.serial?, d.alias?)))
            .collect()
    }

    /// Waits for DEVICE_REMOVED of `alias` on the domain; earlier events (the launcher's own
    /// detaches reach every connection) are passed over.
    fn wait_removed(&mut self, rt: &Runtime, alias: &str) {
        let deadline = tokio::time::Instant::now() + REMOVAL_DEADLINE;
        loop {
            let event = rt
                .block_on(async { tokio::time::timeout_at(deadline, self.events.recv()).await })
                .unwrap_or_else(|_| {
                    panic!("no DEVICE_REMOVED for {alias} within {REMOVAL_DEADLINE:?}")
                })
                .expect("the event channel stays open");
            if let HypervisorEvent::DeviceRemoved { domain, alias: a } = event {
                if domain == self.domain_name && a == alias {
                    return;
                }
            }
        }
    }
}

/// One side's samples of a disk round: until the attach returned, until the guest listed the
/// serials (from the same start), and until the detach was done.
#[derive(Default)]
struct DiskSamples {
    attach: Vec<Duration>,
    seen: Vec<Duration>,
    detach: Vec<Duration>,
}

impl DiskSamples {
    /// The launcher's turn: a Sync to `spec` attaching the disks of `serials`, then one back to
    /// `base` detaching them.
    fn time_launcher(
        &mut self,
        rt: &Runtime,
        console: &mut ConsoleLog,
        client: &mut Client,
        spec: &str,
        base: &str,
        serials: &[String],
    ) {
        let t = Instant::now();
        let reply = sync(rt, client, spec);
        self.attach.push(t.elapsed());
        all_ready(&reply, serials.len());
        wait_serials(console, serials);
        self.seen.push(t.elapsed());
        let t = Instant::now();
        let reply = sync(rt, client, base);
        self.detach.push(t.elapsed());
        all_ready(&reply, 0);
    }

    /// Raw libvirt's turn: each disk of `xmls` attached, then each detached until its
    /// DEVICE_REMOVED. The aliases are read between the two, outside the timing.
    fn time_raw(
        &mut self,
        rt: &Runtime,
        console: &mut ConsoleLog,
        raw: &mut Raw,
        xmls: &[String],
        serials: &[String],
    ) {
        let t = Instant::now();
        for xml in xmls {
            raw.attach(xml);
        }
        self.attach.push(t.elapsed());
        wait_serials(console, serials);
        self.seen.push(t.elapsed());
        let mut aliases = raw.aliases();
        let aliases: Vec<String> = serials
            .iter()
            .map(|s| aliases.remove(s).expect("the raw disk's alias"))
            .collect();
        let t = Instant::now();
        for (xml, alias) in xmls.iter().zip(&aliases) {
            raw.detach(xml);
            raw.wait_removed(rt, alias);
        }
        self.detach.push(t.elapsed());
    }

    /// The three rows of a round, this side as the launcher's beside `raw`, named by `what`.
    fn rows_beside(self, raw: DiskSamples, what: [&'static str; 3]) -> [Row; 3] {
        let [attach, seen, detach] = what;
        [
            Row {
                what: attach,
                launcher: self.attach,
                raw: Some(raw.attach),
            },
            Row {
                what: seen,
                launcher: self.seen,
                raw: Some(raw.seen),
            },
            Row {
                what: detach,
                launcher: self.detach,
                raw: Some(raw.detach),
            },
        ]
    }
}

fn sync(rt: &Runtime, client: &mut Client, spec: &str) -> proto::SyncResponse {
    rt.block_on(client.sync(proto::SyncRequest {
        spec: spec.into(),
        ..Default::default()
    }))
    .unwrap_or_else(|e| panic!("Sync: {e}"))
    .into_inner()
}

/// Panics unless the reply lists exactly `n` volumes, all Ready.
fn all_ready(reply: &proto::SyncResponse, n: usize) {
    let ready = proto::volume_status::Phase::Ready as i32;
    assert!(
        reply.volumes.len() == n && reply.volumes.iter().all(|v| v.phase == ready),
        "expected {n} Ready volumes: {:?}",
        reply.volumes
    );
}

/// `vmlauncher run` until phase Running, on QEMU capability cache `caps`; then Kill, and its exit.
fn time_to_running(spec: &str, caps: &Path) -> Duration {
    let started = Instant::now();
    let mut vm = Launched::start(spec, &["--qemu-cache-dir", caps.to_str().unwrap()]);
    vm.wait_stdout("phase Running", BOOT_DEADLINE);
    let took = started.elapsed();
    common::cli_ok(&vm.socket(), &["kill"]);
    vm.wait_exit(Duration::from_secs(120));
    took
}

/// `raw_dir` laid out as the launcher's runtime dir is, for a copy of its domain that boots on
/// its libvirtd: QEMU's own dir (its VNC socket) and the private dir as the launcher's QEMU id's,
/// and the kernel and initrd copied into `private/boot` as the launcher copies them (untimed:
/// a raw libvirt user points the domain at files there already). Returns the QEMU id.
fn lay_out_raw_dir(vm: &Launched, raw_dir: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    let qemu_id: u32 = std::fs::read_to_string(vm.dir().join("qemu-id"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    for dir in ["private", "qemu"] {
        std::fs::create_dir_all(raw_dir.join(dir)).unwrap();
        std::os::unix::fs::chown(raw_dir.join(dir), Some(qemu_id), Some(qemu_id)).unwrap();
    }
    let boot = raw_dir.join("private/boot");
    std::fs::create_dir_all(&boot).unwrap();
    let guest = common::guest_dir();
    for (from, to) in [("vmlinuz", "kernel"), ("initrd.img", "initrd")] {
        let copy = boot.join(to);
        let _ = std::fs::remove_file(&copy);
        std::fs::copy(guest.join(from), &copy).unwrap();
        std::os::unix::fs::chown(&copy, Some(qemu_id), Some(qemu_id)).unwrap();
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o400)).unwrap();
    }
    qemu_id
}

/// Batches of Syncs that change nothing, one after the other.
const NOOP_CPU_BATCHES: usize = 5;
/// Syncs per batch: the process's CPU time counts in clock ticks (10 ms here), so a batch runs
/// long enough for a tick to be a small part of it.
const NOOP_CPU_SYNCS: u32 = 2_000;

/// The launcher's CPU time (`/proc/PID/stat` utime + stime: every thread, exited ones too) per
/// Sync of `spec`, which changes nothing, one sample per batch. Its latency rows include the
/// machine's scheduling; this is its own work alone (and whatever it does in the background
/// meanwhile: its reconciler, its allocator's trim), what a node of many VMs pays for every
/// node daemon's periodic Sync.
fn noop_cpu(rt: &Runtime, client: &mut Client, spec: &str, pid: i32) -> Vec<Duration> {
    // SAFETY: sysconf reads a constant of the system.
    let ticks = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).expect("CLK_TCK");
    let cpu = || {
        // utime and stime.
        let ticks_used: u64 = stat_fields(pid, [14, 15])
            .unwrap()
            .iter()
            .map(|field| field.parse::<u64>().unwrap())
            .sum();
        Duration::from_nanos(ticks_used * 1_000_000_000 / ticks)
    };
    (0..NOOP_CPU_BATCHES)
        .map(|_| {
            let before = cpu();
            for _ in 0..NOOP_CPU_SYNCS {
                let reply = sync(rt, client, spec);
                assert!(
                    reply.plan.is_empty(),
                    "a no-op Sync planned {:?}",
                    reply.plan
                );
            }
            (cpu() - before) / NOOP_CPU_SYNCS
        })
        .collect()
}

fn sparse_files(dir: &Path, prefix: &str, n: usize) -> Vec<PathBuf> {
    (0..n)
        .map(|k| {
            let path = dir.join(format!("{prefix}-{k}.img"));
            common::sparse_file(&path, 1);
            path
        })
        .collect()
}

fn shell(command: &str) -> String {
    Command::new("sh")
        .args(["-c", command])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// The test guest with room for `1 + 2 × CPU_ADDS` sockets and `ADD_MIB` more memory, asking
/// for `sockets` and `guest_mib`. Hot-added memory is onlined movable, so that the guest can
/// give it back.
fn resize_spec(sockets: u32, guest_mib: u64) -> String {
    let spec = guest_spec(RESIZE_NAME, "memhp_default_state=online_movable", &[])
        .replace(
            "      guest: 256Mi\n",
            &format!(
                "      guest: {guest_mib}Mi\n      maxGuest: {}Mi\n",
                BOOT_MIB + ADD_MIB
            ),
        )
        .replace(
            "    devices:\n",
            &format!(
                "    cpu:\n      sockets: {sockets}\n      maxSockets: {}\n    devices:\n",
                1 + 2 * CPU_ADDS
            ),
        );
    assert!(spec.contains("maxGuest") && spec.contains("maxSockets"));
    spec
}

/// A Sync to `spec` that panics unless it did exactly one resize of `part`, without error.
fn sync_resize(rt: &Runtime, client: &mut Client, spec: &str, part: &str) {
    let reply = sync(rt, client, spec);
    assert!(
        matches!(&reply.resources[..], [c] if c.part == part && c.error.is_empty()),
        "expected one {part} change: {:?}",
        reply.resources
    );
}

/// The guest's next `what` report (`VMLTEST-CPUS`, `VMLTEST-MEMORY`) that says `value`.
fn guest_says(console: &mut ConsoleLog, what: &str, value: u64) {
    let line = format!("{what} {value}");
    console.line(&line, GUEST_DEADLINE, |l| l.trim() == line);
}

/// The rows of the resize VM: memory added and given back on the guest of one vCPU, then vCPUs
/// added, then memory again beside all of them; each side in turn (the side that goes first
/// swaps every pair or cycle).
fn resize_rows(rt: &Runtime, caps: &Path) -> Vec<Row> {
    let mut vm = Launched::start(
        &resize_spec(1, BOOT_MIB),
        &["--qemu-cache-dir", caps.to_str().unwrap()],
    );
    let mut console = vm.boot();
    guest_says(&mut console, "VMLTEST-CPUS", 1);
    let booted_kb: u64 = console.line("the guest's memory", GUEST_DEADLINE, |l| {
        l.starts_with("VMLTEST-MEMORY ")
    })["VMLTEST-MEMORY ".len()..]
        .trim()
        .parse()
        .unwrap();
    let mut client = Client::new(rt.block_on(api::channel(&vm.socket())).unwrap());
    let raw = Raw::open(&vm.libvirt_uri(), &format!("default_{RESIZE_NAME}"));
    let memory = |client: &mut Client, console: &mut ConsoleLog, vcpus: u32| {
        memory_cycles(rt, client, &raw, console, vcpus, booted_kb)
    };

    // Memory on the guest of one vCPU first: the guest with all 25 keeps most of a core busy
    // while it idles (TCG), and every thread wake-up on either side then waits behind it.
    let [one_added, one_added_seen, one_given_back] = memory(&mut client, &mut console, 1);

    eprintln!("side_by_side: {CPU_ADDS} vCPUs added per side, alternating");
    let (mut cpu, mut cpu_seen) = (Sides::default(), Sides::default());
    let mut noop_after_resize = Vec::new();
    let mut vcpus = 1;
    for pair in 0..CPU_ADDS {
        for launcher_turn in [pair % 2 == 0, pair % 2 == 1] {
            vcpus += 1;
            let t = Instant::now();
            if launcher_turn {
                sync_resize(rt, &mut client, &resize_spec(vcpus, BOOT_MIB), "cpu");
            } else {
                raw.set_vcpus(vcpus);
            }
            cpu.push(launcher_turn, t.elapsed());
            guest_says(&mut console, "VMLTEST-CPUS", vcpus.into());
            cpu_seen.push(launcher_turn, t.elapsed());
            if launcher_turn {
                // The same spec again, right after the launcher's own resize.
                let t = Instant::now();
                let reply = sync(rt, &mut client, &resize_spec(vcpus, BOOT_MIB));
                noop_after_resize.push(t.elapsed());
                assert!(
                    reply.plan.is_empty() && reply.resources.is_empty(),
                    "a no-op Sync after a resize planned {:?} {:?}",
                    reply.plan,
                    reply.resources
                );
            }
        }
    }

    let [added, added_seen, given_back] = memory(&mut client, &mut console, vcpus);

    drop(raw);
    drop(client);
    vm.signal(nix::sys::signal::Signal::SIGTERM);
    vm.wait_exit(Duration::from_secs(120));
    vec![
        cpu.row("add 1 vCPU (a socket): Sync reply / `setVcpusFlags`"),
        cpu_seen.row("add 1 vCPU until the guest has it online"),
        one_added
            .row("add 512 MiB (virtio-mem), guest of 1 vCPU: Sync reply / `updateDeviceFlags`"),
        one_added_seen.row("add 512 MiB until the guest's MemTotal has it, guest of 1 vCPU"),
        one_given_back.row("give back 512 MiB, guest of 1 vCPU: Sync reply / `updateDeviceFlags`"),
        added.row("add 512 MiB (virtio-mem): Sync reply / `updateDeviceFlags`"),
        added_seen.row("add 512 MiB until the guest's MemTotal has it"),
        given_back.row("give back 512 MiB: Sync reply / `updateDeviceFlags`"),
        Row {
            what: "Sync that changes nothing, right after the launcher's own vCPU add",
            launcher: noop_after_resize,
            raw: None,
        },
    ]
}

/// `MEMORY_CYCLES` per side on the guest of `vcpus`: 512 MiB added (the reply, and until the
/// guest's MemTotal has it), then given back (the reply).
fn memory_cycles(
    rt: &Runtime,
    client: &mut Client,
    raw: &Raw,
    console: &mut ConsoleLog,
    vcpus: u32,
    booted_kb: u64,
) -> [Sides; 3] {
    eprintln!("side_by_side: {MEMORY_CYCLES} memory cycles per side, alternating, {vcpus} vCPUs");
    let (mut added, mut added_seen, mut given_back) =
        (Sides::default(), Sides::default(), Sides::default());
    for cycle in 0..MEMORY_CYCLES {
        for launcher_turn in [cycle % 2 == 0, cycle % 2 == 1] {
            for add in [true, false] {
                let (guest_mib, virtio_kib) = if add {
                    (BOOT_MIB + ADD_MIB, ADD_MIB * 1024)
                } else {
                    (BOOT_MIB, 0)
                };
                let device = (!launcher_turn).then(|| raw.virtio_mem());
                let t = Instant::now();
                match &device {
                    None => sync_resize(rt, client, &resize_spec(vcpus, guest_mib), "memory"),
                    Some(device) => raw.update_device(&device.asking(virtio_kib)),
                }
                let took = t.elapsed();
                guest_says(console, "VMLTEST-MEMORY", booted_kb + virtio_kib);
                if add {
                    added.push(launcher_turn, took);
                    added_seen.push(launcher_turn, t.elapsed());
                } else {
                    given_back.push(launcher_turn, took);
                }
                raw.wait_plugged(virtio_kib);
            }
        }
    }
    [added, added_seen, given_back]
}

/// Launchers (and raw domains) started at once in a storm.
const STORM_VMS: usize = 8;
/// How long after a launcher's domain runs its memory is read as a node's would be: past its
/// first idle moment (at most a second after the start, longer on a loaded machine).
const SETTLED_AFTER_START: Duration = Duration::from_secs(3);
/// Storms per side, alternating which side goes first.
const STORM_ROUNDS: usize = 2;

/// One storm's outcome on the launchers' side.
struct Storm {
    took: Duration,
    /// Per VM, every non-QEMU process of it summed, with all of them running.
    per_vm: Vec<ProcessMemory>,
}

/// `STORM_VMS` launchers started at the same moment, each its own VM (a name of its own) on the
/// warm capability cache, until every one has printed phase Running; then the memory of each
/// VM's non-QEMU processes with all of them running; then each Killed.
fn launcher_storm(warm_caps: &Path, round: usize) -> Storm {
    let specs: Vec<String> = (0..STORM_VMS)
        .map(|k| guest_spec(&format!("storm-{round}-{k}"), "", &[]))
        .collect();
    let caps = ["--qemu-cache-dir", warm_caps.to_str().unwrap()];
    let started = Instant::now();
    let mut vms: Vec<Launched> = specs.iter().map(|s| Launched::start(s, &caps)).collect();
    for vm in &mut vms {
        vm.wait_stdout("phase Running", BOOT_DEADLINE);
    }
    let took = started.elapsed();
    // A node's steady state, not its last start: each launcher gives back the pages only its
    // start used at its first idle moment, at most a second after its domain runs
    // (`launcher::reconciler`'s LONGEST_BEFORE_RELEASE); the last launcher of the storm has
    // just printed Running.
    std::thread::sleep(SETTLED_AFTER_START);
    let per_vm = vms
        .iter()
        .map(|vm| {
            let all: Vec<ProcessMemory> = vm_processes(vm.child.id() as i32, vm.dir())
                .into_iter()
                .map(memory_of)
                .collect();
            ProcessMemory {
                pid: vm.child.id() as i32,
                name: "all non-QEMU".into(),
                rss: all.iter().map(|p| p.rss).sum(),
                anon: all.iter().map(|p| p.anon).sum(),
                pss: all.iter().map(|p| p.pss).sum(),
            }
        })
        .collect();
    for vm in &mut vms {
        common::cli_ok(&vm.socket(), &["kill"]);
    }
    for vm in &mut vms {
        vm.wait_exit(Duration::from_secs(120));
    }
    Storm { took, per_vm }
}

/// `STORM_VMS` copies of the launcher's domain defined and started at the same moment on its
/// running libvirtd (`uri`), each from a thread and a connection of its own (opened before),
/// until every `create` has returned; then destroyed and undefined, untimed.
fn raw_storm(uri: &str, xmls: &[String]) -> Duration {
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(xmls.len() + 1));
    let threads: Vec<_> = xmls
        .iter()
        .map(|xml| {
            let (xml, uri, barrier) = (xml.clone(), uri.to_string(), barrier.clone());
            std::thread::spawn(move || {
                let conn = virt::connect::Connect::open(Some(&uri)).unwrap();
                barrier.wait();
                let domain = conn
                    .define_domain_xml(&xml)
                    .unwrap_or_else(|e| panic!("defineXML: {e}"));
                domain.create().unwrap_or_else(|e| panic!("create: {e}"));
                domain
            })
        })
        .collect();
    barrier.wait();
    let started = Instant::now();
    let domains: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let took = started.elapsed();
    for domain in domains {
        domain.destroy().unwrap();
        domain.undefine().unwrap();
    }
    took
}

/// The storm rows (issue 46): `STORM_VMS` launchers at once beside `STORM_VMS` raw domains at
/// once on the first VM's libvirtd, `STORM_ROUNDS` each, alternating; each beside one launcher's
/// warm start (`warm`, its median); and the memory per VM with all the storm's VMs running.
fn storm_rows(
    work: &Path,
    warm_caps: &Path,
    vm: &Launched,
    raw: &Raw,
    [warm, raw_start]: [Duration; 2],
) -> (Vec<Row>, Vec<ProcessMemory>) {
    eprintln!("side_by_side: storms of {STORM_VMS}, {STORM_ROUNDS} per side, alternating");
    let xmls: Vec<String> = (0..STORM_VMS)
        .map(|k| {
            let dir = work.join(format!("raw-storm-{k}"));
            lay_out_raw_dir(vm, &dir);
            raw.definition_copy(vm.dir(), &dir, &format!("default_{NAME}-storm-{k}"))
        })
        .collect();
    let uri = vm.libvirt_uri();
    let (mut launchers, mut raws, mut memory) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..STORM_ROUNDS {
        if round % 2 == 1 {
            raws.push(raw_storm(&uri, &xmls));
        }
        let storm = launcher_storm(warm_caps, round);
        launchers.push(storm.took);
        memory = storm.per_vm;
        if round % 2 == 0 {
            raws.push(raw_storm(&uri, &xmls));
        }
    }
    let median = |v: &[Duration]| quantile(v, 0.5);
    let (l, r) = (median(&launchers), median(&raws));
    eprintln!(
        "side_by_side: storm of {STORM_VMS}: launchers {} ({:.2} × one warm start of {}), raw {} (launchers / raw {:.2})",
        human(l),
        l.as_secs_f64() / warm.as_secs_f64(),
        human(warm),
        human(r),
        l.as_secs_f64() / r.as_secs_f64()
    );
    let raws_again = raws.clone();
    let rows = vec![
        Row {
            what: "storm: 8 `vmlauncher run` at once → all phase Running / 8 × (`defineXML` + `create`) at once on one running libvirtd",
            launcher: launchers.clone(),
            raw: Some(raws),
        },
        Row {
            what: "storm: 8 launchers at once → all Running / one launcher's warm start (median, the same run)",
            launcher: launchers,
            raw: Some(vec![warm]),
        },
        // What the machine allows: raw libvirt's own storm against its own single start (each
        // TCG guest boots on a core of its own from its create on, the later creates beside it).
        Row {
            what: "storm, raw libvirt's own: 8 at once → all created / one `defineXML` + `create` (median, the same run)",
            launcher: raws_again,
            raw: Some(vec![raw_start]),
        },
    ];
    (rows, memory)
}

/// The rows of the VM the rest runs on (start, one disk, 64 disks), and the memory of its
/// processes with 16 disks attached.
fn first_vm_rows(
    rt: &Runtime,
    work: &Path,
    warm_caps: &Path,
    counts: Counts,
) -> (Vec<Row>, Vec<ProcessMemory>) {
    let Counts {
        one_disk_cycles,
        many_rounds,
        cold_starts,
        warm_starts,
        ..
    } = counts;
    let base = guest_spec(NAME, "", &[]);
    let mut rows = Vec::new();

    // The VM the rest runs on boots first, on a cache directory of its own that it fills: the
    // warm starts use that one, each cold start a new empty one.
    eprintln!("side_by_side: booting the VM the rest runs on");
    let mut vm = Launched::start(&base, &["--qemu-cache-dir", warm_caps.to_str().unwrap()]);
    let mut console = vm.boot();
    console.line("the guest's first disk report", GUEST_DEADLINE, |l| {
        l.starts_with("VMLTEST-DISKS")
    });
    let channel = rt.block_on(api::channel(&vm.socket())).unwrap();
    let mut client = Client::new(channel.clone());
    // The same connection's round trip to a handler that does nothing but read a map: what any
    // call costs before the launcher does anything.
    let mut health = HealthClient::new(channel);
    let mut raw = Raw::open(&vm.libvirt_uri(), &format!("default_{NAME}"));

    // Start. Raw libvirt has no daemon to start: its side defines and starts a copy of the
    // launcher's own domain definition on the launcher's running libvirtd (another name, no
    // uuid, its console and VNC socket elsewhere), then destroys and undefines it.
    eprintln!(
        "side_by_side: start → running, {cold_starts} cold and {warm_starts} warm, alternating"
    );
    let raw_dir = work.join("raw-start");
    lay_out_raw_dir(&vm, &raw_dir);
    let raw_xml = raw.definition_copy(vm.dir(), &raw_dir, &format!("default_{NAME}-raw"));
    let (mut cold, mut warm, mut raw_start) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..cold_starts.max(warm_starts) {
        if i < cold_starts {
            let caps = work.join(format!("caps-cold-{i}"));
            std::fs::create_dir_all(&caps).unwrap();
            cold.push(time_to_running(&base, &caps));
        }
        if i % 2 == 0 {
            warm.push(time_to_running(&base, warm_caps));
            raw_start.push(raw.start_copy(&raw_xml));
        } else {
            raw_start.push(raw.start_copy(&raw_xml));
            warm.push(time_to_running(&base, warm_caps));
        }
    }
    if !cold.is_empty() {
        rows.push(Row {
            what: "start → phase Running, empty capability cache (launcher only)",
            launcher: cold,
            raw: None,
        });
    }
    let warm_median = quantile(&warm, 0.5);
    let raw_start_median = quantile(&raw_start, 0.5);
    rows.push(Row {
        what: "start → running: `vmlauncher run`, warm cache / `defineXML` + `create` on a running libvirtd",
        launcher: warm,
        raw: Some(raw_start),
    });
    if counts.storm {
        let (storm, per_vm) =
            storm_rows(work, warm_caps, &vm, &raw, [warm_median, raw_start_median]);
        rows.extend(storm);
        print_storm_memory(&per_vm);
    }
    if counts.start_only {
        common::cli_ok(&vm.socket(), &["kill"]);
        vm.wait_exit(Duration::from_secs(120));
        return (rows, Vec::new());
    }

    eprintln!("side_by_side: one disk, {one_disk_cycles} alternating cycles");
    let launcher_image = work.join("launcher-one.img");
    let raw_image = work.join("raw-one.img");
    common::sparse_file(&launcher_image, 8);
    common::sparse_file(&raw_image, 8);
    let (mut launcher, mut raw_side, mut noop, mut round_trip) = (
        DiskSamples::default(),
        DiskSamples::default(),
        vec![],
        vec![],
    );
    for cycle in 0..one_disk_cycles {
        for launcher_turn in [cycle % 2 == 0, cycle % 2 == 1] {
            if launcher_turn {
                let serial = format!("BL-{cycle}");
                let spec = guest_spec(NAME, "", &[("one", &serial, &launcher_image)]);
                launcher.time_launcher(
                    rt,
                    &mut console,
                    &mut client,
                    &spec,
                    &base,
                    std::slice::from_ref(&serial),
                );
                let t = Instant::now();
                let reply = sync(rt, &mut client, &base);
                noop.push(t.elapsed());
                assert!(
                    reply.plan.is_empty(),
                    "a no-op Sync planned {:?}",
                    reply.plan
                );
                let t = Instant::now();
                rt.block_on(health.check(HealthCheckRequest::default()))
                    .unwrap_or_else(|e| panic!("health Check: {e}"));
                round_trip.push(t.elapsed());
            } else {
                let serial = format!("BR-{cycle}");
                let xml = raw_disk_xml(&raw_image, &serial, 0);
                raw_side.time_raw(rt, &mut console, &mut raw, &[xml], &[serial]);
            }
        }
    }
    // Issue 46 measures a Sync that changes nothing against one raw attach (the target: 0.05).
    let raw_attach = raw_side.attach.clone();
    rows.extend(launcher.rows_beside(
        raw_side,
        [
            "attach 1 scsi disk: Sync reply / `attachDeviceFlags`",
            "attach 1 scsi disk until the guest lists its serial",
            "detach 1 scsi disk: Sync reply / `detachDeviceFlags` + DEVICE_REMOVED",
        ],
    ));
    rows.push(Row {
        what: "Sync that changes nothing, right after the launcher's own attach and detach / one raw `attachDeviceFlags`",
        launcher: noop,
        raw: Some(raw_attach),
    });
    rows.push(Row {
        what: "gRPC round trip to a handler that does nothing (`grpc.health.v1` Check)",
        launcher: round_trip,
        raw: None,
    });
    rows.push(Row {
        what:
            "launcher CPU (user + system, all its threads) per Sync that changes nothing, in a row",
        launcher: noop_cpu(rt, &mut client, &base, vm.child.id() as i32),
        raw: None,
    });

    eprintln!("side_by_side: {MANY_DISKS} disks, {many_rounds} alternating rounds");
    let launcher_images = sparse_files(work, "launcher-many", MANY_DISKS);
    let raw_images = sparse_files(work, "raw-many", MANY_DISKS);
    let (mut launcher, mut raw_side) = (DiskSamples::default(), DiskSamples::default());
    for round in 0..many_rounds {
        for launcher_turn in [round % 2 == 0, round % 2 == 1] {
            if launcher_turn {
                let serials: Vec<String> =
                    (0..MANY_DISKS).map(|k| format!("L{round}-{k}")).collect();
                let spec = hostdisk_spec("d", &serials, &launcher_images);
                launcher.time_launcher(rt, &mut console, &mut client, &spec, &base, &serials);
            } else {
                let serials: Vec<String> =
                    (0..MANY_DISKS).map(|k| format!("R{round}-{k}")).collect();
                let xmls: Vec<String> = (0..MANY_DISKS)
                    .map(|k| raw_disk_xml(&raw_images[k], &serials[k], k as u32))
                    .collect();
                raw_side.time_raw(rt, &mut console, &mut raw, &xmls, &serials);
            }
        }
    }
    rows.extend(launcher.rows_beside(
        raw_side,
        [
            "64 scsi disks: one Sync reply / 64 sequential `attachDeviceFlags`",
            "64 scsi disks until the guest lists all 64 serials",
            "64 scsi disks detached: one Sync reply / 64 × (detach + DEVICE_REMOVED)",
        ],
    ));

    eprintln!("side_by_side: memory with {MEMORY_DISKS} disks attached");
    let serials: Vec<String> = (0..MEMORY_DISKS).map(|k| format!("M-{k}")).collect();
    all_ready(
        &sync(
            rt,
            &mut client,
            &hostdisk_spec("m", &serials, &launcher_images),
        ),
        MEMORY_DISKS,
    );
    wait_serials(&mut console, &serials);
    let memory: Vec<ProcessMemory> = vm_processes(vm.child.id() as i32, vm.dir())
        .into_iter()
        .map(memory_of)
        .collect();

    drop(raw);
    drop(client);
    vm.signal(nix::sys::signal::Signal::SIGTERM);
    vm.wait_exit(Duration::from_secs(120));
    (rows, memory)
}

/// The rows as a markdown table, then the memory of the VM's processes.
fn print_tables(rows: &[Row], memory: &[ProcessMemory]) {
    let mib = |kib: u64| format!("{:.1}", kib as f64 / 1024.0);
    println!("| what | n | raw median | raw p90 | launcher median | launcher p90 | launcher / raw (median) |");
    println!("|---|---|---|---|---|---|---|");
    for row in rows {
        println!("{}", row.markdown());
    }
    let total = |f: fn(&ProcessMemory) -> u64| memory.iter().map(f).sum::<u64>();
    if !memory.is_empty() {
        println!(
            "\n| process, {MEMORY_DISKS} disks attached | pid | RSS MiB | RssAnon MiB | PSS MiB |"
        );
        println!("|---|---|---|---|---|");
        for p in memory {
            println!(
                "| {} | {} | {} | {} | {} |",
                p.name,
                p.pid,
                mib(p.rss),
                mib(p.anon),
                mib(p.pss)
            );
        }
        println!(
            "| all non-QEMU processes of the VM | | {} | {} | {} |",
            mib(total(|p| p.rss)),
            mib(total(|p| p.anon)),
            mib(total(|p| p.pss))
        );
    }
}

/// `--plain VALUE ...`: the first VM's rows (start, disks, memory) once for each value of
/// `VMLAUNCHER_PLAIN` (`src/tricks.rs`), in the order given, in this one run: each trick's rows
/// with and without it (`0`: every trick played; `1`: none; else the tricks named off).
/// `VALUE@BINARY` runs another build's launcher binary (a trick of the build: link order, say).
fn plain_rows(rt: &Runtime, work: &Path, values: &[String]) {
    for (i, value) in values.iter().enumerate() {
        eprintln!("side_by_side: VMLAUNCHER_PLAIN={value}");
        // Inherited by every launcher this run starts from now on.
        match value.split_once('@') {
            Some((plain, binary)) => {
                std::env::set_var(vmlauncher::tricks::PLAIN, plain);
                std::env::set_var("VMLAUNCHER_BENCH_BIN", binary);
            }
            None => {
                std::env::set_var(vmlauncher::tricks::PLAIN, value);
                std::env::remove_var("VMLAUNCHER_BENCH_BIN");
            }
        }
        let dir = work.join(format!("plain-{i}"));
        let caps = dir.join("caps-warm");
        std::fs::create_dir_all(&caps).unwrap();
        let (rows, memory) = first_vm_rows(rt, &dir, &caps, PLAIN_COUNTS);
        let date = shell("date -u '+%Y-%m-%d %H:%M:%S UTC'");
        let load = shell("cut -d' ' -f1-3 /proc/loadavg");
        println!("\nVMLAUNCHER_PLAIN={value}, ended {date}, load average {load}\n");
        print_tables(&rows, &memory);
    }
}

/// `--only resize [--plain VALUE ...]`: the CPU and memory rows alone, once per value of
/// `VMLAUNCHER_PLAIN` given (else once, every trick played), one VM after the other in this run.
fn resize_only(rt: &Runtime, caps: &Path, values: &[String]) {
    let values = if values.is_empty() {
        vec!["0".to_string()]
    } else {
        values.to_vec()
    };
    for value in values {
        eprintln!("side_by_side: resize rows, VMLAUNCHER_PLAIN={value}");
        std::env::set_var(vmlauncher::tricks::PLAIN, &value);
        let rows = resize_rows(rt, caps);
        let date = shell("date -u '+%Y-%m-%d %H:%M:%S UTC'");
        let load = shell("cut -d' ' -f1-3 /proc/loadavg");
        println!("\nresize rows, VMLAUNCHER_PLAIN={value}, ended {date}, load average {load}\n");
        print_tables(&rows, &[]);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if !args.iter().any(|a| a == "--bench") {
        return;
    }
    let json_path = args
        .iter()
        .position(|a| a == "--json")
        .map(|i| PathBuf::from(args.get(i + 1).expect("--json FILE")));
    // `--only migration`: the migration rows alone (they take their own guests and daemons);
    // `--only start`: the warm starts and the storms alone; `--only resize`: the CPU and memory
    // rows alone (with `--plain`, once per value).
    let only = args.iter().position(|a| a == "--only").map(|i| {
        let what = args.get(i + 1).map(String::as_str);
        assert!(
            matches!(what, Some("migration" | "start" | "resize")),
            "--only takes `migration`, `start` or `resize`"
        );
        what.unwrap_or_default().to_string()
    });
    let only_migration = only.as_deref() == Some("migration");
    // The launchers log as they would in production (warn), not as tests ask them to (info).
    std::env::set_var("VMLAUNCHER_TEST_LOG", "warn");
    // The gRPC client does a call's I/O on the calling thread, as libvirt's client library does
    // for the raw side: on a multi-thread runtime the request and its reply each crossed to
    // another thread of this process, which timed the client's own hand-offs with the launcher.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Disk images live here, not under the launcher's runtime dir (its own state, refused as a
    // hostDisk path); QEMU's user passes through it.
    let work = common::disk_dir("vml-bench-");
    let warm_caps = work.path().join("caps-warm");
    std::fs::create_dir_all(&warm_caps).unwrap();
    let plain: Vec<String> = args
        .windows(2)
        .filter(|w| w[0] == "--plain")
        .map(|w| w[1].clone())
        .collect();
    if only.as_deref() == Some("resize") {
        resize_only(&rt, &warm_caps, &plain);
        return;
    }
    if !plain.is_empty() {
        plain_rows(&rt, work.path(), &plain);
        return;
    }
    if only.as_deref() == Some("start") {
        let (rows, _) = first_vm_rows(&rt, work.path(), &warm_caps, START_ONLY);
        let load = shell("cut -d' ' -f1-3 /proc/loadavg");
        println!(
            "\nstart rows, {}, load average {load} at the end\n",
            shell("date -u '+%Y-%m-%d %H:%M UTC'")
        );
        print_tables(&rows, &[]);
        return;
    }
    let (mut rows, memory) = if only_migration {
        (Vec::new(), Vec::new())
    } else {
        let (mut rows, memory) = first_vm_rows(&rt, work.path(), &warm_caps, FULL);
        // One TCG guest at a time: the resize VM boots once the first is gone.
        rows.extend(resize_rows(&rt, &warm_caps));
        (rows, memory)
    };
    // And the migrating ones once the resize VM is gone, one at a time too. A failure there
    // (its panic already printed) still lets every row measured before it print, and the run
    // exits non-zero at the end.
    let migrations = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        migration::rows(&rt, &warm_caps, work.path())
    }));
    let migration_failed = migrations.is_err();
    let migrations = migrations.unwrap_or_else(|_| migration::Migrations {
        rows: Vec::new(),
        moved: serde_json::Value::Null,
    });
    rows.extend(migrations.rows);

    let date = shell("date -u '+%Y-%m-%d %H:%M UTC'");
    // The load average at the end: what else shared the machine (the last 1, 5, 15 minutes).
    let load = shell("cut -d' ' -f1-3 /proc/loadavg");
    let host = format!(
        "{} cores, {}, {} build, load average {load} at the end",
        shell("nproc"),
        shell("uname -r"),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    println!("\nvmlauncher beside raw libvirt, {date}, {host}, TCG guest\n");
    print_tables(&rows, &memory);
    let total = |f: fn(&ProcessMemory) -> u64| memory.iter().map(f).sum::<u64>();

    if let Some(path) = json_path {
        let json = serde_json::json!({
            "date": date,
            "host": host,
            "rows": rows.iter().map(Row::json).collect::<Vec<_>>(),
            // Bytes of each migration, from libvirt's completed job on the target.
            "migrated": migrations.moved,
            "memory": (!memory.is_empty()).then(|| serde_json::json!({
                "disks_attached": MEMORY_DISKS,
                "processes": memory.iter().map(|p| serde_json::json!({
                    "name": p.name, "pid": p.pid,
                    "rss_kib": p.rss, "rss_anon_kib": p.anon, "pss_kib": p.pss,
                })).collect::<Vec<_>>(),
                "total": {
                    "rss_kib": total(|p| p.rss),
                    "rss_anon_kib": total(|p| p.anon),
                    "pss_kib": total(|p| p.pss),
                },
            })),
        });
        std::fs::write(&path, serde_json::to_string_pretty(&json).unwrap() + "\n")
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        eprintln!("side_by_side: wrote {}", path.display());
    }
    assert!(!migration_failed, "the migration rows failed (above)");
}
