//! A vTPM and dedicated CPUs, in a real TCG guest against a real private libvirtd:
//! - `tpm: {persistent: true}`: libvirt starts swtpm beside QEMU and the guest's kernel finds
//!   the TPM (`/sys/class/tpm/tpm0`, reported on the console); its state outlives the
//!   launcher (libvirt's swtpm directory under the runtime dir, by the domain's UUID), while a
//!   TPM that is not persistent leaves nothing;
//! - `dedicatedCpuPlacement`: each vCPU is pinned to a CPU of the launcher's own affinity —
//!   proven with the launcher started under `taskset -c <one CPU>` and libvirt's live
//!   `vcpuinfo` (the affinity of QEMU's vCPU thread) — and `isolateEmulatorThread` pins the
//!   emulator to one more (libvirt's live `emulatorpin`).

use crate::common;

use std::process::Command;
use std::time::Duration;

use common::{guest_vmi, ConsoleWait, Launched, GUEST_DEADLINE};

fn spec(name: &str, cpu: &str, devices: &str) -> String {
    guest_vmi(
        name,
        "",
        &format!(
            "    cpu:\n      cores: 1\n{cpu}\n    devices:\n      autoattachGraphicsDevice: false\n{devices}\n"
        ),
        "",
    )
}

fn virsh(vm: &Launched, args: &[&str]) -> String {
    let out = Command::new("virsh")
        .args(["-c", &vm.libvirt_uri()])
        .args(args)
        .output()
        .expect("virsh");
    let out = common::succeeded(out, format_args!("virsh {args:?}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn own_cpus() -> Vec<u32> {
    vmlauncher::host::cpus::own_cpus().unwrap()
}

/// `virsh vcpuinfo` prints the live affinity of each vCPU thread as a `y`/`-` map per host CPU.
fn affinity_map(vcpuinfo: &str) -> String {
    vcpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("CPU Affinity:"))
        .unwrap_or_else(|| panic!("no affinity in {vcpuinfo}"))
        .trim()
        .to_string()
}

#[test]
fn the_guest_sees_its_tpm_and_its_vcpu_runs_on_the_launchers_cpu() {
    let cpus = own_cpus();
    // The last CPU we may use, alone: the launcher's whole CPU set.
    let mine = *cpus.last().unwrap();
    let dir = tempfile::Builder::new()
        .prefix("vml-e2e-")
        .tempdir()
        .unwrap();
    let mut vm = Launched::start_wrapped(
        &["taskset", "-c", &mine.to_string()],
        dir.path(),
        &spec(
            "e2e-tpm",
            "      dedicatedCpuPlacement: true",
            "      tpm: {persistent: true}",
        ),
        &[],
    );
    let mut console = vm.boot();
    let line = console.line("the guest's TPM report", GUEST_DEADLINE, |l| {
        l.starts_with("VMLTEST-TPM")
    });
    assert_eq!(line, "VMLTEST-TPM tpm0");
    let domain = "default_e2e-tpm";
    let xml = virsh(&vm, &["dumpxml", domain]);
    assert!(
        xml.contains("<backend type='emulator' version='2.0'"),
        "{xml}"
    );
    // The vCPU thread may run on that CPU only: `y` at its index, `-` everywhere else.
    let map = affinity_map(&virsh(&vm, &["vcpuinfo", domain]));
    let expected: String = (0..map.len())
        .map(|i| if i as u32 == mine { 'y' } else { '-' })
        .collect();
    assert_eq!(map, expected, "vCPU 0 affinity");

    vm.signal(nix::sys::signal::Signal::SIGTERM);
    vm.wait_stdout("phase Succeeded", GUEST_DEADLINE);
    assert_eq!(vm.wait_exit(Duration::from_secs(60)).code(), Some(0));
    drop(dir);
}

#[test]
fn an_isolated_emulator_thread_gets_the_next_cpu() {
    let cpus = own_cpus();
    if cpus.len() < 2 {
        panic!("this test needs two CPUs in its affinity, it has {cpus:?}");
    }
    let mut vm = Launched::start(
        &spec(
            "e2e-pinned",
            "      dedicatedCpuPlacement: true\n      isolateEmulatorThread: true",
            "      disks: []",
        ),
        &[],
    );
    // Booted: the guest's /init then powers off on ACPI, which the stop below needs.
    vm.boot();
    let domain = "default_e2e-pinned";
    let vcpupin = virsh(&vm, &["vcpupin", domain, "--live"]);
    let emulatorpin = virsh(&vm, &["emulatorpin", domain, "--live"]);
    eprintln!("{vcpupin}{emulatorpin}");
    // Rows after the dashes: ` 0      0` (vCPU, CPUs) and `       *: 1` (emulator).
    let rows = |text: &str| -> Vec<Vec<String>> {
        text.lines()
            .skip_while(|l| !l.starts_with("---"))
            .skip(1)
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                l.split(|c: char| c.is_whitespace() || c == ':')
                    .filter(|w| !w.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .collect()
    };
    assert_eq!(
        rows(&vcpupin),
        vec![vec!["0".to_string(), cpus[0].to_string()]]
    );
    assert_eq!(
        rows(&emulatorpin),
        vec![vec!["*".to_string(), cpus[1].to_string()]]
    );

    vm.signal(nix::sys::signal::Signal::SIGTERM);
    vm.wait_stdout("phase Succeeded", GUEST_DEADLINE);
    assert_eq!(vm.wait_exit(Duration::from_secs(60)).code(), Some(0));
}

/// swtpm's state file for the domain `uuid` under a private libvirtd's runtime dir.
fn tpm_state(dir: &std::path::Path, uuid: &str) -> std::path::PathBuf {
    dir.join("libvirt/lib/swtpm")
        .join(uuid)
        .join("tpm2/tpm2-00.permall")
}

#[test]
fn a_persistent_tpm_keeps_its_state_after_the_launcher_and_another_does_not() {
    for (persistent, uuid) in [
        (true, "2f1d0a8e-6c1b-4e55-9a34-5b0f6f7c1a01"),
        (false, "2f1d0a8e-6c1b-4e55-9a34-5b0f6f7c1a02"),
    ] {
        let text = spec(
            &format!("e2e-tpm-{persistent}"),
            "",
            &format!("      tpm: {{persistent: {persistent}}}"),
        )
        .replace(
            "    firmware:\n",
            &format!("    firmware:\n      uuid: {uuid}\n"),
        );
        let mut vm = Launched::start(&text, &[]);
        let mut console = vm.boot();
        console.line("the guest's TPM report", GUEST_DEADLINE, |l| {
            l == "VMLTEST-TPM tpm0"
        });
        let state = tpm_state(vm.dir(), uuid);
        assert!(state.exists(), "swtpm made no state at {}", state.display());
        vm.signal(nix::sys::signal::Signal::SIGTERM);
        assert_eq!(vm.wait_exit(Duration::from_secs(120)).code(), Some(0));
        // The launcher has removed the domain definition and stopped its libvirtd.
        assert_eq!(
            state.exists(),
            persistent,
            "state at {} after the launcher exited (persistent: {persistent})",
            state.display()
        );
    }
}
