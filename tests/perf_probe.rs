//! The measurements behind the issue-11 performance commits, kept so they can be repeated (not a
//! test: `#[ignore]`d, it prints and asserts no timing; the side-by-side bench command is the
//! user-facing tool):
//! `cargo test --release --test perf_probe -- --ignored --nocapture`
//! (`PROBE_CYCLES`, `PROBE_ROUNDS`, `PROBE_STARTS`, `PROBE_MANY` change the counts).
//! It boots the test guest and alternates, on the same domain and daemon, the launcher's Sync
//! with the raw libvirt call (attach; detach until DEVICE_REMOVED; `PROBE_MANY` disks in one Sync
//! against as many sequential attaches, and until the guest lists them all), times no-op Syncs,
//! start → phase Running with a warm capability cache, and prints the memory (smaps_rollup) of
//! the launcher, libvirtd and virtlogd with 16 disks attached.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{guest_spec, Launched};
use vmlauncher::api::{self, proto};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn summary(name: &str, mut samples: Vec<Duration>) -> f64 {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    let median = at(0.5).as_secs_f64() * 1e3;
    println!(
        "PROBE {name:<40} n={:<3} median {:>8.2} ms  p90 {:>8.2} ms  min {:>8.2} ms",
        samples.len(),
        median,
        at(0.9).as_secs_f64() * 1e3,
        at(0.0).as_secs_f64() * 1e3,
    );
    median
}

fn raw_disk_xml(volume: &str, path: &Path, unit: u32) -> String {
    format!(
        "<disk type='file' device='disk'><driver name='qemu' type='raw' error_policy='stop'/>\
         <source file='{}'/><target dev='{}' bus='scsi'/><serial>{volume}</serial>\
         <address type='drive' controller='0' bus='0' target='0' unit='{unit}'/></disk>",
        path.display(),
        vmlauncher::domain::target_name("sd", unit),
    )
}

fn smaps(pid: i32) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    let field = |name: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(&format!("{name}:")))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    };
    format!(
        "Rss {:6.1} MiB  RssAnon {:5.1} MiB  Pss {:5.1} MiB",
        field("Rss"),
        field("Anonymous"),
        field("Pss")
    )
}

fn pid_file(dir: &Path, name: &str) -> Option<i32> {
    std::fs::read_to_string(dir.join(name))
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[test]
#[ignore]
fn probe() {
    let cycles = env_usize("PROBE_CYCLES", 30);
    let many = env_usize("PROBE_MANY", 64);
    let tmp = tempfile::tempdir().unwrap();
    let disk = |name: &str| -> PathBuf {
        let p = tmp.path().join(format!("{name}.img"));
        common::sparse_file(&p, 1);
        p
    };
    // Start → Running, warm capability cache.
    let caps = tmp.path().join("caps");
    let caps_arg = caps.to_str().unwrap().to_string();
    let empty = guest_spec("probe", "", &[]);
    let mut starts = Vec::new();
    for i in 0..env_usize("PROBE_STARTS", 4) {
        let t = Instant::now();
        let mut vm = Launched::start(&empty, &["--qemu-cache-dir", &caps_arg]);
        vm.wait_stdout("phase Running", common::BOOT_DEADLINE);
        let took = t.elapsed();
        if i > 0 {
            starts.push(took);
        } else {
            println!("PROBE start cold cache {:.3} s", took.as_secs_f64());
        }
        common::wait_booted(&mut vm.console());
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(vm.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        vm.wait_exit(common::BOOT_DEADLINE);
    }
    if !starts.is_empty() {
        summary("start -> Running (warm cache)", starts);
    }

    let data = disk("data");
    let with = guest_spec("probe", "", &[("data", "DATA", &data)]);
    let many_disks: Vec<(String, PathBuf)> = (0..many)
        .map(|i| (format!("m{i}"), disk(&format!("m{i}"))))
        .collect();
    let many_refs: Vec<(&str, &str, &Path)> = many_disks
        .iter()
        .map(|(n, p)| (n.as_str(), n.as_str(), p.as_path()))
        .collect();
    let with_many = guest_spec("probe", "", &many_refs);
    let with_16 = guest_spec("probe", "", &many_refs[..16.min(many)]);
    let raw_many: Vec<(String, PathBuf)> = (0..many)
        .map(|i| (format!("r{i}"), disk(&format!("r{i}"))))
        .collect();
    let raw_one = disk("raw");

    let mut vm = Launched::start(&empty, &["--qemu-cache-dir", &caps_arg]);
    let mut console = vm.boot();
    let uri = vm.libvirt_uri();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let hv = vmlauncher::libvirt::Hypervisor::open(&uri, tx).unwrap();
    let (etx, removed) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        while let Some(ev) = events.blocking_recv() {
            if etx.send(format!("{ev:?}")).is_err() {
                return;
            }
        }
    });
    let conn = virt::connect::Connect::open(Some(&uri)).unwrap();
    rt.block_on(async {
        let mut client = api::connect(&vm.socket()).await.unwrap();
        let status = client
            .get_status(proto::GetStatusRequest::default())
            .await
            .unwrap()
            .into_inner();
        let dom = conn.lookup_domain_by_name(&status.domain_name).unwrap();
        let wait_removed = |unit: u32| {
            let alias = format!("alias: \"scsi0-0-0-{unit}\"");
            loop {
                let ev = removed
                    .recv_timeout(Duration::from_secs(30))
                    .expect("DEVICE_REMOVED");
                if ev.contains("DeviceRemoved") && ev.contains(&alias) {
                    return;
                }
            }
        };
        let sync = |spec: String| {
            let mut c = client.clone();
            async move {
                c.sync(proto::SyncRequest {
                    spec,
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner()
            }
        };
        let raw_xml = raw_disk_xml("raw", &raw_one, 100);
        let (mut la, mut ld, mut ra, mut rd, mut noop) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..cycles {
            let t = Instant::now();
            let r = sync(with.clone()).await;
            la.push(t.elapsed());
            assert!(
                r.volumes
                    .iter()
                    .any(|v| v.name == "data"
                        && v.phase == proto::volume_status::Phase::Ready as i32),
                "{r:?}"
            );
            let t = Instant::now();
            dom.attach_device_flags(&raw_xml, virt::sys::VIR_DOMAIN_AFFECT_LIVE)
                .unwrap();
            ra.push(t.elapsed());
            let t = Instant::now();
            sync(with.clone()).await;
            noop.push(t.elapsed());
            let t = Instant::now();
            sync(empty.clone()).await;
            ld.push(t.elapsed());
            let t = Instant::now();
            dom.detach_device_flags(&raw_xml, virt::sys::VIR_DOMAIN_AFFECT_LIVE)
                .unwrap();
            wait_removed(100);
            rd.push(t.elapsed());
        }
        let a = summary("launcher Sync attach 1", la);
        let b = summary("raw attachDeviceFlags 1", ra);
        println!("PROBE attach ratio {:.2}", a / b);
        let a = summary("launcher Sync detach 1", ld);
        let b = summary("raw detach + DEVICE_REMOVED", rd);
        println!("PROBE detach ratio {:.2}", a / b);
        summary("launcher no-op Sync (after attach+detach)", noop);
        sync(with.clone()).await;
        let mut pure = Vec::new();
        for _ in 0..cycles {
            let t = Instant::now();
            sync(with.clone()).await;
            pure.push(t.elapsed());
        }
        summary("launcher no-op Sync (repeated)", pure);
        let mut status = Vec::new();
        for _ in 0..cycles {
            let t = Instant::now();
            client
                .clone()
                .get_status(proto::GetStatusRequest::default())
                .await
                .unwrap();
            status.push(t.elapsed());
        }
        summary("GetStatus (gRPC round trip)", status);
        sync(empty.clone()).await;

        let (mut lm, mut rm, mut seen) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..env_usize("PROBE_ROUNDS", 3) {
            let t = Instant::now();
            let r = sync(with_many.clone()).await;
            lm.push(t.elapsed());
            let ready = r
                .volumes
                .iter()
                .filter(|v| v.phase == proto::volume_status::Phase::Ready as i32)
                .count();
            assert_eq!(ready, many, "{r:?}");
            let want = many;
            let line = console.wait_for(
                "all disks",
                Instant::now() + Duration::from_secs(120),
                |l| l.starts_with("VMLTEST-DISKS") && l.split_whitespace().count() > want,
            );
            seen.push(t.elapsed());
            let _ = line;
            sync(empty.clone()).await;
            let t = Instant::now();
            for (i, (name, path)) in raw_many.iter().enumerate() {
                dom.attach_device_flags(
                    &raw_disk_xml(name, path, 200 + i as u32),
                    virt::sys::VIR_DOMAIN_AFFECT_LIVE,
                )
                .unwrap();
            }
            rm.push(t.elapsed());
            for (i, (name, path)) in raw_many.iter().enumerate() {
                dom.detach_device_flags(
                    &raw_disk_xml(name, path, 200 + i as u32),
                    virt::sys::VIR_DOMAIN_AFFECT_LIVE,
                )
                .unwrap();
                wait_removed(200 + i as u32);
            }
        }
        let a = summary(&format!("launcher Sync {many} disks"), lm);
        let b = summary(&format!("raw {many} sequential attaches"), rm);
        println!("PROBE many ratio {:.2}", a / b);
        summary(&format!("launcher Sync {many} until guest sees all"), seen);

        sync(with_16.clone()).await;
        let launcher_pid = vm.child.id() as i32;
        let libvirt = vm.dir().join("libvirt");
        println!("PROBE launcher  {}", smaps(launcher_pid));
        if let Some(p) = pid_file(&libvirt, "libvirtd.pid") {
            println!("PROBE libvirtd  {}", smaps(p));
        }
        if let Some(p) = pid_file(&libvirt, "virtlogd.pid") {
            println!("PROBE virtlogd  {}", smaps(p));
        }
        drop(client);
    });
    let _ = std::fs::copy(
        vm.dir().join("launcher.stderr"),
        "/tmp/probe-launcher.stderr",
    );
    drop(hv);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(vm.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    vm.wait_exit(common::BOOT_DEADLINE);
}
