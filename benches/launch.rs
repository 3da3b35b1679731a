//! The launcher's own speed, end to end, on this machine: `cargo bench --bench launch`.
//! Boots the test guest (scripts/setup.sh builds it) through the real binary and its private
//! libvirtd, and prints: time to phase Running and to the guest's boot line, one-disk Sync attach
//! and detach latency over many cycles (median, p90, max), and the graceful stop. Numbers are
//! printed, never asserted. Outside `cargo bench` (e.g. `cargo test --all-targets`) it does nothing.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use vmlauncher::api::{self, proto};
use vmlauncher::console::ConsoleLog;

const CYCLES: usize = 30;
const DEADLINE: Duration = Duration::from_secs(180);

fn spec(guest: &str, disk: Option<&std::path::Path>) -> String {
    let mut s = format!(
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata: {{name: bench}}\nspec:\n  \
         terminationGracePeriodSeconds: 30\n  domain:\n    memory: {{guest: 256Mi}}\n    firmware:\n      \
         kernelBoot:\n        kernelArgs: console=ttyS0 loglevel=1\n        container: {{kernelPath: {guest}/vmlinuz, \
         initrdPath: {guest}/initrd.img}}\n    devices:\n"
    );
    match disk {
        None => s += "      disks: []\n  volumes: []\n",
        Some(path) => {
            s += "      disks: [{name: data, disk: {bus: scsi}, serial: BENCH-1}]\n";
            s += &format!(
                "  volumes: [{{name: data, hostDisk: {{path: {}, type: Disk}}}}]\n",
                path.display()
            );
        }
    }
    s
}

fn summary(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    println!(
        "{name:<44} n={:<3} median {:>8.2} ms   p90 {:>8.2} ms   max {:>8.2} ms",
        samples.len(),
        at(0.5).as_secs_f64() * 1e3,
        at(0.9).as_secs_f64() * 1e3,
        at(1.0).as_secs_f64() * 1e3
    );
}

/// SIGTERM to the launcher once the guest can answer ACPI, so that the stop is quick.
fn sigterm_once_booted(child: &std::process::Child, rt: &std::path::Path) {
    ConsoleLog::from_start(&rt.join("console.log"))
        .unwrap()
        .wait_for("boot", Instant::now() + DEADLINE, |l| {
            l.contains("VMLTEST-BOOTED")
        })
        .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
}

type Lines = std::io::Lines<BufReader<std::process::ChildStdout>>;

/// `vmlauncher run` of `spec` (with the shared capability cache `caps`, if given), until it
/// prints phase Running: the child, the rest of its output, and how long that took.
fn run_until_running(
    spec: &std::path::Path,
    rt: &std::path::Path,
    caps: Option<&std::path::Path>,
) -> (std::process::Child, Lines, Duration) {
    let started = Instant::now();
    let mut command = Command::new(env!("CARGO_BIN_EXE_vmlauncher"));
    command.arg("run").arg(spec).arg("--runtime-dir").arg(rt);
    if let Some(caps) = caps {
        command.arg("--qemu-cache-dir").arg(caps);
    }
    let mut child = command
        .args(["--emulation", "tcg"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let running = loop {
        let line = lines.next().expect("launcher output").unwrap();
        if line.contains("phase Running") {
            break started.elapsed();
        }
    };
    (child, lines, running)
}

/// `vmlauncher run` with the shared capability cache `caps`, until phase Running; then SIGTERM and
/// wait for it to end.
fn time_to_running(
    spec: &std::path::Path,
    rt: &std::path::Path,
    caps: &std::path::Path,
) -> Duration {
    let (mut child, mut lines, running) = run_until_running(spec, rt, Some(caps));
    sigterm_once_booted(&child, rt);
    for _ in lines.by_ref() {}
    child.wait().unwrap();
    running
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let guest = std::env::var("VMLAUNCHER_GUEST_DIR")
        .unwrap_or_else(|_| "/var/cache/vmlauncher/test-guest".into());
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("data.img");
    std::fs::File::create(&disk)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let spec_path = dir.path().join("vmi.yaml");
    std::fs::write(&spec_path, spec(&guest, None)).unwrap();
    let rt = dir.path().join("rt");

    // QEMU's capability cache: a first run with an empty shared cache probes QEMU; a second run
    // on the same cache does not.
    let caps = dir.path().join("qemu-caps");
    for (what, n) in [("cold capability cache", 1), ("warm capability cache", 2)] {
        let t = time_to_running(&spec_path, &dir.path().join(format!("rt-cache-{n}")), &caps);
        println!(
            "{:<44} {:>8.2} s",
            format!("run → phase Running, {what}"),
            t.as_secs_f64()
        );
    }

    let started = Instant::now();
    let (mut child, _lines, running) = run_until_running(&spec_path, &rt, None);
    let mut console = ConsoleLog::from_start(&rt.join("console.log")).unwrap();
    console
        .wait_for("boot", Instant::now() + DEADLINE, |l| {
            l.contains("VMLTEST-BOOTED")
        })
        .unwrap();
    let booted = started.elapsed();
    println!(
        "{:<44} {:>8.2} s",
        "run → phase Running (private libvirtd, TCG)",
        running.as_secs_f64()
    );
    println!(
        "{:<44} {:>8.2} s",
        "run → guest's boot line",
        booted.as_secs_f64()
    );

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let with_disk = spec(&guest, Some(&disk));
    let without = spec(&guest, None);
    let (attach, detach) = runtime.block_on(async {
        let mut client = api::connect(&rt.join("launcher.sock")).await.unwrap();
        let (mut attach, mut detach) = (Vec::new(), Vec::new());
        for _ in 0..CYCLES {
            // Each cycle attaches the disk, then detaches it again.
            for (spec, samples) in [(&with_disk, &mut attach), (&without, &mut detach)] {
                let t = Instant::now();
                client
                    .sync(proto::SyncRequest {
                        spec: spec.clone(),
                        ..Default::default()
                    })
                    .await
                    .unwrap();
                samples.push(t.elapsed());
            }
        }
        (attach, detach)
    });
    summary("Sync attach 1 scsi disk (until Ready)", attach);
    summary("Sync detach 1 scsi disk (until DEVICE_REMOVED)", detach);

    let t = Instant::now();
    sigterm_once_booted(&child, &rt);
    let status = child.wait().unwrap();
    println!(
        "{:<44} {:>8.2} s (exit {status})",
        "SIGTERM → guest off, launcher exited",
        t.elapsed().as_secs_f64()
    );
}
