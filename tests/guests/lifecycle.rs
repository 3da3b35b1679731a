//! Lifecycle, end to end, with a real private libvirtd and a real TCG guest: crashes, run
//! strategies, the guest powering itself off, a guest that ignores ACPI, a libvirtd that dies,
//! a launcher that dies and is started again, and every owner command on the event stream.
//! Every wait is on an event, a stdout line, a console line or an exit, with a deadline.

use crate::common;

use std::process::Command as Process;
use std::time::{Duration, Instant};

use common::shared_guest::shared_guest;
use common::{
    alive, event_status, guest_spec, ConsoleWait, EventWatcher, Launched, BOOT_DEADLINE,
    GUEST_DEADLINE,
};
use vmlauncher::api::proto::{self, event::Kind};
use vmlauncher::host::watch::wait_for_change_in;
use vmlauncher::libvirt::process::wait_process_exit;

/// The test guest `name` launched and booted, and its QEMU's pid.
/// The launcher started through `wrapper` in a runtime dir of its own, kept as long as the first.
fn started_through(wrapper: &[&str], spec: &str, args: &[&str]) -> (tempfile::TempDir, Launched) {
    let owned = tempfile::Builder::new()
        .prefix("vml-e2e-")
        .tempdir()
        .unwrap();
    let vm = Launched::start_wrapped(wrapper, owned.path(), spec, args);
    (owned, vm)
}

fn booted(name: &str, kernel_args: &str) -> (Launched, i32) {
    let mut vm = Launched::start(&guest_spec(name, kernel_args, &[]), &[]);
    vm.boot();
    let qemu = vm.qemu_pid(name);
    (vm, qemu)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_qemu_is_failed_and_always_brings_it_back_with_backoff() {
    let name = "crash-always";
    let mut vm = Launched::start(&guest_spec(name, "", &[]), &["--run-strategy", "always"]);
    let mut console = vm.boot();
    let first = vm.qemu_pid(name);
    let mut events = EventWatcher::start(&vm.socket()).await;
    common::signal_pid(first, nix::sys::signal::Signal::SIGKILL).unwrap();

    let failed = events
        .wait_phase("phase Failed after the crash", GUEST_DEADLINE, "Failed")
        .await;
    assert_eq!(event_status(&failed).unwrap().phase_reason, "Crashed");
    let backoff = events
        .wait_for("CrashLoopBackOff", GUEST_DEADLINE, |e| {
            event_status(e).is_some_and(|s| s.printable_status == "CrashLoopBackOff")
        })
        .await;
    let s = event_status(&backoff).unwrap();
    assert_eq!(s.restart_count, 1);
    assert!(
        s.next_restart_in_ms > 0 && s.next_restart_in_ms <= 1000,
        "{s:?}"
    );
    events
        .wait_for("Running again", BOOT_DEADLINE, |e| {
            event_status(e).is_some_and(|s| s.phase == "Running" && s.printable_status == "Running")
        })
        .await;
    let second = vm.qemu_pid(name);
    assert_ne!(first, second, "a new QEMU");
    assert!(alive(second));
    let status = common::status(&mut vmlauncher::api::connect(&vm.socket()).await.unwrap()).await;
    assert_eq!(status.restart_count, 1, "the back-off count stays visible");
    assert!(events.seen.iter().any(|e| matches!(&e.kind,
        Some(Kind::Hypervisor(h)) if h.event == "Stopped" && h.detail == "failed")));
    // Until the restarted guest has booted it cannot see the ACPI power button.
    common::wait_booted(&mut console);
    vm.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(vm.wait_exit(GUEST_DEADLINE).code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guest_powering_itself_off_succeeds_and_the_launcher_exits_0() {
    let name = "self-poweroff";
    let (mut vm, qemu) = booted(name, "vmltest.poweroff_after=2");
    vm.wait_stdout("phase Succeeded", GUEST_DEADLINE);
    assert_eq!(vm.wait_exit(GUEST_DEADLINE).code(), Some(0));
    vm.assert_printed("GuestShutdown");
    assert!(!alive(qemu));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_destroys_a_guest_that_ignores_acpi_when_the_grace_period_ends() {
    let name = "acpi-ignored";
    let spec = guest_spec(name, "vmltest.acpi=ignore", &[]).replace(
        "terminationGracePeriodSeconds: 60",
        "terminationGracePeriodSeconds: 3",
    );
    let mut vm = Launched::start(&spec, &[]);
    vm.boot();
    let qemu = vm.qemu_pid(name);
    let asked = Instant::now();
    vm.signal(nix::sys::signal::Signal::SIGTERM);
    vm.wait_stdout("phase Failed", GUEST_DEADLINE);
    let code = vm.wait_exit(GUEST_DEADLINE).code();
    assert!(
        asked.elapsed() >= Duration::from_secs(3),
        "destroyed before the grace period ended"
    );
    assert_eq!(code, Some(5), "exit code for an expired grace period");
    vm.assert_printed("GracePeriodExpired");
    assert!(!alive(qemu));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_libvirtd_is_unknown_then_restarted_with_the_vm_still_running() {
    let name = "daemon-killed";
    let (mut vm, qemu) = booted(name, "");
    let daemon = vm.pid_from("libvirt/libvirtd.pid").unwrap();
    common::signal_pid(daemon, nix::sys::signal::Signal::SIGKILL).unwrap();
    vm.wait_stdout("phase Unknown", GUEST_DEADLINE);
    vm.wait_stdout("phase Running", GUEST_DEADLINE);
    let new_daemon = vm.pid_from("libvirt/libvirtd.pid").unwrap();
    assert_ne!(daemon, new_daemon, "a new libvirtd");
    assert!(alive(new_daemon));
    assert_eq!(vm.qemu_pid(name), qemu, "the same QEMU");
    assert!(alive(qemu), "QEMU kept running throughout");
    // And the launcher still controls it through the new daemon.
    common::cli_ok(&vm.socket(), &["pause"]);
    vm.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(vm.wait_exit(GUEST_DEADLINE).code(), Some(0));
    assert!(!alive(qemu) && !alive(new_daemon));
}

/// The environment a process was started with (`/proc/PID/environ`: what it changed later is
/// not shown there).
fn environ(pid: i32) -> Vec<u8> {
    std::fs::read(format!("/proc/{pid}/environ")).unwrap()
}

fn mentions(bytes: &[u8], what: &str) -> bool {
    bytes
        .windows(what.len())
        .any(|window| window == what.as_bytes())
}

/// libvirtd gives back what its start-up freed (jemalloc, preloaded by the dynamic loader), and
/// the QEMU it starts keeps glibc's malloc: libvirt passes `LD_PRELOAD` on to QEMU, so the
/// preload must not be one. On the shared guest: it only reads its processes.
#[test]
fn libvirtd_runs_on_jemalloc_and_its_qemu_does_not() {
    let jemalloc = std::path::Path::new("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2");
    assert!(jemalloc.exists(), "scripts/setup.sh installs libjemalloc2");
    let vm = shared_guest();
    let qemu = vm.qemu_pid();
    let daemon = vm.pid_from("libvirt/libvirtd.pid").unwrap();
    let maps = |pid: i32| std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(
        maps(daemon).contains("libjemalloc.so.2"),
        "libvirtd maps jemalloc"
    );
    assert!(
        maps(daemon).contains("no_ssh_crypto.so") && !maps(qemu).contains("no_ssh_crypto.so"),
        "libvirtd, and it alone, preloads the shim that skips OpenSSL's set-up"
    );
    let comm = std::fs::read_to_string(format!("/proc/{daemon}/comm")).unwrap();
    assert_eq!(comm.trim(), "libvirtd", "known by its name in ps and top");
    assert!(
        !maps(qemu).contains("libjemalloc"),
        "QEMU keeps glibc's malloc"
    );
    assert!(
        !mentions(&environ(qemu), "LD_PRELOAD"),
        "nothing preloaded into QEMU"
    );
    assert!(
        !mentions(&environ(daemon), "LD_PRELOAD"),
        "nothing for libvirt to pass on"
    );
}

/// `VMLAUNCHER_PLAIN=1` (`src/tricks.rs`) turns every performance trick off: libvirtd is started
/// as it is (no loader, nothing preloaded, every driver), and the VM boots all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_trick_off_libvirtd_starts_as_it_is_and_the_vm_boots() {
    let name = "plain";
    let (_owned, mut vm) = started_through(
        &["env", "VMLAUNCHER_PLAIN=1"],
        &guest_spec(name, "", &[]),
        &[],
    );
    vm.boot();
    let daemon = vm.pid_from("libvirt/libvirtd.pid").unwrap();
    let maps = std::fs::read_to_string(format!("/proc/{daemon}/maps")).unwrap();
    assert!(
        !maps.contains("libjemalloc") && !maps.contains("no_ssh_crypto.so"),
        "libvirtd preloads nothing"
    );
    assert!(
        !mentions(&environ(daemon), "LIBVIRT_DRIVER_DIR"),
        "libvirtd loads every driver"
    );
    vm.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(vm.wait_exit(GUEST_DEADLINE).code(), Some(0));
}

/// A process (by pid) that a failing test must not leave behind.
struct KilledOnDrop(i32);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        if alive(self.0) {
            let _ = common::signal_pid(self.0, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// A runtime dir where an earlier launcher (one that still started virtlogd) left its virtlogd
/// running, as a launcher upgraded on a host finds it: the running QEMU's logs and an adopted
/// libvirtd configured for virtlogd depend on it. The launcher adopts it, keeps it while the VM
/// runs, and stops it with its libvirtd at exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_launchers_virtlogd_is_kept_while_the_vm_runs_and_stopped_at_exit() {
    let name = "legacy-virtlogd";
    let mut virtlogd = None;
    let mut pending = Launched::start_owned(|dir| {
        let private = dir.join("libvirt");
        std::fs::create_dir_all(private.join("run")).unwrap();
        let conf = private.join("virtlogd.conf");
        std::fs::write(&conf, "log_outputs = \"3:stderr\"\n").unwrap();
        // As the earlier launcher ran it: in a mount namespace whose /run/libvirt is the private
        // dir's, with its pid file beside libvirtd's. With --daemon the command returns once
        // virtlogd listens (a libvirt daemon tells its parent when it is ready).
        let started = Process::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(r#"mount --bind "$0" /run/libvirt && exec virtlogd --daemon --config "$1" --pid-file "$2""#)
            .arg(private.join("run"))
            .arg(&conf)
            .arg(private.join("virtlogd.pid"))
            .status()
            .unwrap();
        assert!(started.success(), "the earlier virtlogd did not start");
        let pid = std::fs::read_to_string(private.join("virtlogd.pid")).unwrap();
        virtlogd = Some(KilledOnDrop(pid.trim().parse().unwrap()));
    });
    let virtlogd = virtlogd.unwrap();
    let mut vm = pending.run(&guest_spec(name, "", &[]), &[]);
    vm.boot();
    assert!(
        alive(virtlogd.0),
        "the earlier virtlogd is kept while the VM runs"
    );
    vm.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(vm.wait_exit(GUEST_DEADLINE).code(), Some(0));
    assert!(
        wait_process_exit(virtlogd.0, Instant::now() + GUEST_DEADLINE),
        "the earlier virtlogd outlived the launcher"
    );
}

/// No virtlogd runs: QEMU writes the console log itself and the launcher keeps it under
/// `--log-max-size` (copy to console.log.1, truncate). A guest that floods its console with 8,192
/// numbered lines (512 KiB, eight times the bound) is never held up, the follower reads the
/// lines across every truncation in order, and the files end within their bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_flooding_its_console_leaves_the_log_within_its_bound() {
    const BOUND: u64 = 64 * 1024;
    const LINES: usize = 8192;
    let name = "console-flood";
    let spec = guest_spec(name, &format!("vmltest.console_flood={LINES}"), &[]);
    let mut vm = Launched::start(&spec, &["--log-max-size", &BOUND.to_string()]);
    let mut console = vm.boot();
    assert!(
        !vm.dir().join("libvirt/virtlogd.pid").exists(),
        "no virtlogd is started"
    );
    // libvirtd wrote QEMU's log itself (stdio_handler = "file"), where the launcher bounds it.
    let qemu_logs: Vec<_> = std::fs::read_dir(vm.dir().join("libvirt/log/qemu"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    assert_eq!(qemu_logs.len(), 1, "{qemu_logs:?}");
    let qemu_log = std::fs::read_to_string(&qemu_logs[0]).unwrap();
    assert!(qemu_log.contains("-name guest="), "{qemu_log}");
    let mut seen = Vec::new();
    let done = console.line("the end of the flood", GUEST_DEADLINE, |l| {
        // A line that lost bytes to a truncation is not counted: it does not parse, or (the
        // head of one line joined to the tail of another, at the same column) its two copies
        // of the number differ.
        let mut words = l
            .strip_prefix("VMLTEST-FLOOD ")
            .unwrap_or_default()
            .split(' ');
        if let (Some(a), Some(b)) = (words.next(), words.next()) {
            if let (Ok(n), true) = (a.parse::<usize>(), a == b) {
                seen.push(n);
            }
        }
        l.starts_with("VMLTEST-FLOOD-DONE")
    });
    assert_eq!(done, format!("VMLTEST-FLOOD-DONE {LINES}"));
    // In order, none twice; a few bytes may fall between a copy and its truncation (logrotate's
    // copytruncate has the same window), so nearly all, not all.
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "lines out of order");
    assert!(
        seen.len() * 100 >= LINES * 99,
        "{} of {LINES} flood lines read",
        seen.len()
    );
    let log = vm.dir().join("console.log");
    let older = vm.dir().join("console.log.1");
    // The next check after the flood brings the log under the bound; the copy holds at most
    // what one check's spacing let through beyond it.
    let within_bound = || std::fs::metadata(&log).unwrap().len() <= BOUND;
    assert!(
        wait_for_change_in(&[vm.dir()], Instant::now() + GUEST_DEADLINE, within_bound).unwrap(),
        "console.log stays over its bound"
    );
    let older_len = std::fs::metadata(&older).unwrap().len();
    eprintln!(
        "flood: {} of {LINES} lines read; console.log.1 {older_len} bytes",
        seen.len()
    );
    assert!(
        older_len > BOUND && older_len < (LINES as u64 * 64) / 2,
        "console.log.1 holds {older_len} bytes"
    );
    vm.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(vm.wait_exit(GUEST_DEADLINE).code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_launcher_adopts_the_running_domain_and_its_volumes() {
    let name = "adopt";
    let (mut first, qemu) = booted(name, "");
    let disk = first.scratch().join("data.img");
    common::sparse_file(&disk, 4);
    let with_disk = guest_spec(name, "", &[("data", "Adopt-Me-1", &disk)]);
    // Plus a hot-plugged block volume: its node is the launcher's own, known from its records.
    let scratch = tempfile::tempdir().unwrap();
    let lo = common::Loop::new(scratch.path(), "adopt", 3, false);
    let with_block = with_disk
        .replace(
            "      disks:\n",
            "      disks:\n      - name: blk\n        disk: {bus: scsi}\n        serial: Adopt-Block-1\n",
        )
        .replace(
            "  volumes:\n",
            "  volumes:\n  - name: blk\n    persistentVolumeClaim: {claimName: blk, hotpluggable: true}\n",
        );
    let mut client = vmlauncher::api::connect(&first.socket()).await.unwrap();
    let block_request = |spec| proto::SyncRequest {
        spec,
        block_devices: [("blk".to_string(), lo.block_device())].into(),
        ..Default::default()
    };
    let reply = common::sync_ok(&mut client, block_request(with_block.clone()), "attach").await;
    assert!(
        reply
            .volumes
            .iter()
            .all(|v| v.phase == proto::volume_status::Phase::Ready as i32),
        "{reply:?}"
    );
    let node = first.dir().join("hotplug/blk");
    assert!(node.exists());
    drop(client);
    first.kill9();
    assert!(alive(qemu), "QEMU outlives its launcher");

    let mut second = first.successor(&with_block, &[]);
    let line = second.wait_stdout("domain default_adopt", GUEST_DEADLINE);
    assert!(line.contains("adopted"), "{line}");
    second.wait_stdout("phase Running", GUEST_DEADLINE);
    assert_eq!(second.qemu_pid(name), qemu, "one QEMU, the same one");
    let qemus = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("guest=default_adopt,"))
        })
        .count();
    assert_eq!(qemus, 1, "no second QEMU");
    let mut client = vmlauncher::api::connect(&second.socket()).await.unwrap();
    let status = common::status(&mut client).await;
    let volumes: Vec<_> = status
        .volumes
        .iter()
        .map(|v| (v.name.as_str(), v.serial.as_str(), v.phase))
        .collect();
    let ready = proto::volume_status::Phase::Ready as i32;
    assert_eq!(
        volumes,
        [
            ("blk", "Adopt-Block-1", ready),
            ("data", "Adopt-Me-1", ready)
        ]
    );
    // Syncing the same spec again changes nothing: the adopted state is the real one.
    let reply = common::sync_ok(&mut client, block_request(with_block), "the same again").await;
    assert!(reply.plan.is_empty(), "{:?}", reply.plan);
    // The new launcher owns the old one's node: dropping the volume removes it.
    let without_block = proto::SyncRequest {
        spec: with_disk,
        ..Default::default()
    };
    let reply = common::sync_ok(&mut client, without_block, "drop the block volume").await;
    assert_eq!(reply.plan.len(), 1, "{:?}", reply.plan);
    assert!(!node.exists(), "the adopted block node was not removed");
    drop(client);
    second.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(second.wait_exit(GUEST_DEADLINE).code(), Some(0));
    assert!(!alive(qemu));
}

/// Runs a CLI verb against the launcher; returns (exit code, stdout, stderr).
fn verb(socket: &std::path::Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Process::new(common::bin())
        .args(args)
        .arg("--socket")
        .arg(socket)
        .args(["--output", "json"])
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn vm_state_after(vm: &Launched, args: &[&str]) -> String {
    let (code, stdout, stderr) = verb(&vm.socket(), args);
    assert_eq!(code, Some(0), "{args:?}: {stderr}");
    let reply: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    reply["status"]["vmState"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_moves_the_states_and_shows_once_in_order_on_the_stream() {
    let name = "commands";
    let mut vm = Launched::start(&guest_spec(name, "", &[]), &["--run-strategy", "manual"]);
    let line = vm.wait_stdout("domain default_commands", GUEST_DEADLINE);
    assert!(line.contains("not started"), "{line}");
    vm.wait_stdout("api unix:", GUEST_DEADLINE);
    // `vmlauncher events` follows the stream as a separate process, as an operator would.
    let mut follower = Process::new(common::bin())
        .args(["events", "--output", "json", "--socket"])
        .arg(vm.socket())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let lines = common::lines_of(follower.stdout.take().unwrap());
    // The stream starts with a resync: wait for it so that no later event can be missed.
    let first = lines
        .recv_timeout(GUEST_DEADLINE)
        .expect("the stream's first event");
    assert!(first.contains("\"type\":\"resync\""), "{first}");
    // A follower whose output cannot be written (a full disk) says so and fails, as every
    // other verb does, rather than end as if the stream were over.
    let full = Process::new(common::bin())
        .args(["events", "--socket"])
        .arg(vm.socket())
        .stdout(std::fs::File::create("/dev/full").unwrap())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&full.stderr);
    assert_eq!(full.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot write to stdout"), "{stderr}");

    let mut console = vm.console();
    let booted = common::wait_booted;
    // A command the state does not allow is refused before anything happens.
    let (code, _, stderr) = verb(&vm.socket(), &["pause"]);
    assert_eq!(code, Some(6), "{stderr}");
    assert!(
        stderr.contains("FailedPrecondition") && stderr.contains("cannot Pause"),
        "{stderr}"
    );

    assert_eq!(vm_state_after(&vm, &["start"]), "Active");
    booted(&mut console);
    assert_eq!(vm_state_after(&vm, &["pause"]), "Paused");
    let (code, _, stderr) = verb(&vm.socket(), &["pause"]);
    assert_eq!(code, Some(6), "pausing twice: {stderr}");
    assert_eq!(vm_state_after(&vm, &["unpause"]), "Active");
    assert_eq!(vm_state_after(&vm, &["reset"]), "Active");
    booted(&mut console);
    assert_eq!(vm_state_after(&vm, &["reboot"]), "Active");
    console.line("the guest acting on the ACPI reboot", GUEST_DEADLINE, |l| {
        l.contains("VMLTEST-ACPI-POWEROFF")
    });
    booted(&mut console);
    assert_eq!(vm_state_after(&vm, &["stop"]), "Stopped");
    assert_eq!(vm_state_after(&vm, &["start"]), "Active");
    booted(&mut console);
    assert_eq!(vm_state_after(&vm, &["kill"]), "Stopped");

    // Every command shows up on the stream once, in order, with strictly increasing sequence
    // numbers. Read until the last command's end, each line with a deadline.
    let expected = [
        "Start",
        "Pause",
        "Unpause",
        "Reset",
        "SoftReboot",
        "Shutdown",
        "Start",
        "Kill",
    ];
    let mut done = Vec::new();
    let mut started = Vec::new();
    let mut last_seq = 0;
    let mut statuses = Vec::new();
    while done.len() < expected.len() {
        let line = lines
            .recv_timeout(GUEST_DEADLINE)
            .unwrap_or_else(|_| panic!("stream stalled; tasks done so far: {done:?}"));
        let event: serde_json::Value = serde_json::from_str(&line).unwrap();
        let seq = event["seq"].as_u64().unwrap();
        assert!(
            seq > last_seq,
            "sequence numbers must increase: {seq} after {last_seq}"
        );
        last_seq = seq;
        match event["type"].as_str().unwrap() {
            "task" => {
                let command = event["task"]["command"].as_str().unwrap().to_string();
                match event["task"]["outcome"].as_str().unwrap() {
                    "Started" => started.push(command),
                    "Succeeded" => done.push(command),
                    other => panic!("task {command} ended {other}: {line}"),
                }
            }
            "status" => statuses.push(
                event["status"]["printableStatus"]
                    .as_str()
                    .unwrap()
                    .to_string(),
            ),
            _ => {}
        }
    }
    assert_eq!(done, expected, "each command once, in order");
    assert_eq!(started, expected);
    for printable in ["Starting", "Running", "Paused", "Stopping", "Stopped"] {
        assert!(
            statuses.iter().any(|s| s == printable),
            "{printable} never shown: {statuses:?}"
        );
    }
    follower.kill().unwrap();
    follower.wait().unwrap();
    vm.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(vm.wait_exit(GUEST_DEADLINE).code(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_stop_ends_a_launcher_whose_vm_runs_once() {
    let name = "stop-once";
    let (mut vm, qemu) = booted(name, "");
    assert_eq!(
        vm_state_after(&vm, &["stop", "--grace-period", "30"]),
        "Stopped"
    );
    assert_eq!(vm.wait_exit(GUEST_DEADLINE).code(), Some(0));
    vm.assert_printed("phase Succeeded");
    assert!(!alive(qemu));
}

/// Host pids of the QEMU processes of `domain`, zombies included.
fn qemu_host_pids(domain: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&format!("guest={domain},")))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn as_pid_1_the_launcher_reaps_the_qemu_that_libvirt_left_to_it() {
    // Its QEMU is looked for among the host's processes by name: one no other run uses.
    let name = &format!("pid-one-{}", common::unique());
    // A new PID namespace (with its own /proc) in which the launcher is PID 1, as in a pod.
    let (owned, mut vm) = started_through(
        &["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"],
        &guest_spec(name, "vmltest.poweroff_after=1", &[]),
        &["--run-strategy", "manual"],
    );
    vm.wait_stdout("api unix:", GUEST_DEADLINE);
    assert_eq!(vm_state_after(&vm, &["start"]), "Active");
    vm.wait_stdout("phase Running", BOOT_DEADLINE);
    let first = qemu_host_pids(&format!("default_{name}"));
    assert_eq!(first.len(), 1, "{first:?}");
    // The guest powers itself off: QEMU exits, an orphan of the namespace's PID 1.
    vm.wait_stdout("phase Succeeded", GUEST_DEADLINE);
    // Boot it again and let that one come up: the first QEMU has long been reaped by then.
    assert_eq!(vm_state_after(&vm, &["start"]), "Active");
    vm.wait_stdout("phase Running", BOOT_DEADLINE);
    assert!(
        !std::path::Path::new(&format!("/proc/{}", first[0])).exists(),
        "the first QEMU ({}) was never reaped: a zombie under PID 1",
        first[0]
    );
    // unshare ignores SIGTERM while it waits: signal the namespace's PID 1, as a runtime would.
    let children =
        std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", vm.child.id())).unwrap();
    let pid1: i32 = children
        .split_whitespace()
        .next()
        .expect("unshare's child")
        .parse()
        .unwrap();
    common::signal_pid(pid1, nix::sys::signal::Signal::SIGTERM).unwrap();
    assert_eq!(
        vm.wait_exit(GUEST_DEADLINE).code(),
        Some(0),
        "PID 1 exits as the launcher did"
    );
    drop(vm);
    drop(owned);
}

/// A second `run` on the runtime dir of a running launcher is refused (exit 2, naming
/// the option and the launcher that holds it) and changes nothing; it used to adopt the first
/// launcher's VM and shut it down when it was itself stopped. On the shared guest: the second
/// launcher is refused before it touches anything, which is the point.
#[test]
fn a_second_run_on_a_runtime_dir_in_use_is_refused_and_changes_nothing() {
    let vm = shared_guest();
    let qemu = vm.qemu_pid();
    let before = common::cli_status(&vm.socket());
    let spec = std::fs::read_to_string(vm.dir().join("spec.yaml")).unwrap();

    let mut second = Launched::start_in(vm.dir(), &spec, &["--run-strategy", "halted"]);
    assert_eq!(second.wait_exit(GUEST_DEADLINE).code(), Some(2));
    let stderr = second.stderr_text();
    let refusal = format!(
        "--runtime-dir: another vmlauncher (pid {}) runs on",
        vm.launcher_pid()
    );
    assert!(stderr.contains(&refusal), "{stderr}");

    assert!(alive(qemu));
    assert_eq!(vm.qemu_pid(), qemu, "the same QEMU");
    let after = common::cli_status(&vm.socket());
    assert_eq!(after["phase"], "Running", "{after}");
    assert_eq!(after["phase"], before["phase"]);
    assert!(before["vmState"].is_string(), "{before}");
    assert_eq!(after["vmState"], before["vmState"], "{after}");
    assert_eq!(after["powerState"], before["powerState"], "{after}");
}

/// The serial console and the VNC display at the sockets the status names: a line typed through
/// `vmlauncher console` reaches the guest and its answer comes back (and into the console log),
/// Ctrl-] leaves with the VM still running, and the VNC socket speaks RFB. On the shared guest:
/// no other test types on its console, and the word typed is this process's own.
#[test]
fn the_serial_console_answers_through_vmlauncher_console_and_vnc_speaks_rfb() {
    use std::io::{BufRead, Read, Write};
    let vm = shared_guest();
    let mut log = vm.console();
    common::wait_booted(&mut log);
    let (code, stdout, stderr) = verb(&vm.socket(), &["status"]);
    assert_eq!(code, Some(0), "{stderr}");
    let status: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let consoles = &status["consoles"];
    let private = vm.dir().join("private");
    assert_eq!(
        consoles["serialSocket"],
        private.join("virt-serial0").to_str().unwrap()
    );
    // QEMU makes the VNC socket in its own dir; the private dir has a link to it where
    // KubeVirt's layout has the socket.
    assert_eq!(
        consoles["vncSocket"],
        vm.dir().join("qemu/virt-vnc").to_str().unwrap()
    );
    assert_eq!(
        consoles["serialLog"],
        vm.dir().join("console.log").to_str().unwrap()
    );

    let mut vnc = std::os::unix::net::UnixStream::connect(private.join("virt-vnc")).unwrap();
    vnc.set_read_timeout(Some(GUEST_DEADLINE)).unwrap();
    let mut greeting = [0u8; 12];
    vnc.read_exact(&mut greeting).unwrap();
    assert_eq!(&greeting, b"RFB 003.008\n");
    drop(vnc);

    let mut attached = Process::new(common::bin())
        .args(["console", "--socket"])
        .arg(vm.socket())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    let out = std::io::BufReader::new(attached.stdout.take().unwrap());
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut keys = attached.stdin.take().unwrap();
    let word = format!("hello-{}", std::process::id());
    let heard = format!("VMLTEST-HEARD {word}");
    // Typed once: until the console connects, the keys wait in its stdin; the guest's tty keeps
    // them until its reader reads.
    keys.write_all(format!("{word}\n").as_bytes()).unwrap();
    let deadline = Instant::now() + GUEST_DEADLINE;
    let mut answered = false;
    while let Ok(line) = lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        if line.contains(&heard) {
            answered = true;
            break;
        }
    }
    assert!(answered, "no {heard:?} through vmlauncher console");
    log.line("the answer in the console log", GUEST_DEADLINE, |l| {
        l.contains(&heard)
    });

    keys.write_all(&[0x1d]).unwrap();
    let status = attached.wait().unwrap();
    let mut said = String::new();
    attached
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut said)
        .unwrap();
    assert_eq!(status.code(), Some(0), "{said}");
    assert!(said.contains("detached"), "{said}");
    let (_, stdout, _) = verb(&vm.socket(), &["status"]);
    let status: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(status["printableStatus"], "Running", "{status:#}");
}

/// An EFI VM whose QEMU dies is started again under `Always` (libvirt refuses a plain undefine of
/// a domain with an EFI variables file: the restart keeps the file, the launcher's end removes
/// it), and the launcher leaves no definition behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_efi_vm_killed_is_started_again_and_its_variables_go_at_the_end() {
    let name = "efi-restart";
    let spec = guest_spec(name, "", &[]).replace(
        "    firmware:\n      kernelBoot:",
        "    firmware:\n      bootloader:\n        efi: {secureBoot: false}\n      kernelBoot:",
    );
    assert!(spec.contains("efi: {secureBoot: false}"), "{spec}");
    let mut vm = Launched::start(&spec, &["--run-strategy", "always"]);
    let mut console = vm.boot();
    let nvram = vm
        .dir()
        .join(format!("private/nvram/default_{name}_VARS.fd"));
    assert!(nvram.exists(), "no {}", nvram.display());
    let first = vm.qemu_pid(name);
    let mut events = EventWatcher::start(&vm.socket()).await;
    common::signal_pid(first, nix::sys::signal::Signal::SIGKILL).unwrap();
    events
        .wait_for("Running again", BOOT_DEADLINE, |e| {
            event_status(e).is_some_and(|s| s.restart_count == 1 && s.phase == "Running")
        })
        .await;
    assert_ne!(vm.qemu_pid(name), first, "a new QEMU");
    assert!(nvram.exists(), "the variables did not survive the restart");
    common::wait_booted(&mut console);
    vm.terminate_ok();
    assert!(!nvram.exists(), "the variables outlived the launcher");
}

/// A launcher that adopted its running VM (no define of its own yet) accepts a Sync, starts the
/// VM again after a kill (its first define, at which libvirt resolves the spec's `q35`), and is
/// sent the same spec once more: nothing to change. The machine it learns at that define is not
/// a frozen field changed against the conversion it kept from the first Sync.
#[test]
fn after_adoption_a_new_start_learns_the_machine_and_the_same_spec_changes_nothing() {
    let name = "adopt-machine";
    let spec = guest_spec(name, "", &[]);
    let mut first = Launched::start(&spec, &[]);
    first.wait_stdout("phase Running", BOOT_DEADLINE);
    first.kill9();
    let mut vm = first.successor(&spec, &["--run-strategy", "manual"]);
    let line = vm.wait_stdout("domain default_", GUEST_DEADLINE);
    assert!(line.contains("adopted"), "{line}");
    vm.wait_stdout("api unix:", GUEST_DEADLINE);
    let file = vm.scratch().join("spec.yaml");
    std::fs::write(&file, &spec).unwrap();
    let file = file.to_str().unwrap();
    let synced = |when: &str| {
        let (code, stdout, stderr) = verb(&vm.socket(), &["sync", file]);
        assert_eq!(code, Some(0), "the Sync {when}: {stderr}");
        let reply: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        for part in ["plan", "resources", "interfaces"] {
            assert_eq!(
                reply[part],
                serde_json::json!([]),
                "the Sync {when}: {reply}"
            );
        }
    };
    synced("after the adoption");
    assert_eq!(vm_state_after(&vm, &["kill"]), "Stopped");
    assert_eq!(vm_state_after(&vm, &["start"]), "Active");
    synced("after this launcher's own start");
    let live = common::live_xml(&vm.libvirt_uri(), &format!("default_{name}"));
    assert!(live.contains("machine='pc-q35-"), "{live}");
}
