//! Volumes the launcher makes itself, in a real TCG guest against a real private libvirtd: a
//! cloud-init NoCloud volume (a `cidata` ISO built by the launcher) and an `emptyDisk` (a qcow2
//! the launcher writes). The guest's /init reports every disk with its serial and size, and
//! mounts any disk labelled `cidata` to print its instance id and the user-data's marker line.

use crate::common;

use std::time::{Duration, Instant};

use common::{guest_vmi, ConsoleWait, Launched, BOOT_DEADLINE, GUEST_DEADLINE};

/// `(dev, serial, size in 512-byte sectors)` for every disk in a `VMLTEST-DISKS` line.
fn disks(line: &str) -> Vec<(String, String, u64)> {
    line.split_whitespace()
        .skip(1)
        .filter_map(|d| {
            let mut parts = d.split(':');
            Some((
                parts.next()?.to_string(),
                parts.next()?.to_string(),
                parts.next()?.parse().ok()?,
            ))
        })
        .collect()
}

fn spec(name: &str, marker: &str) -> String {
    guest_vmi(
        name,
        "",
        "    devices:
      autoattachGraphicsDevice: false
      disks:
      - name: cloudinitdisk
        disk: {bus: virtio}
      - name: scratch
        serial: EMPTY-SCRATCH
        disk: {bus: virtio}
",
        &format!(
            "  volumes:
  - name: cloudinitdisk
    cloudInitNoCloud:
      userData: |
        #cloud-config
        # {marker}
      networkData: |
        version: 2
  - name: scratch
    emptyDisk:
      capacity: 96Mi
"
        ),
    )
}

#[test]
fn the_guest_sees_the_cidata_iso_and_the_empty_disk() {
    let name = "e2e-volumes";
    let marker = format!("vmltest-marker-{}", std::process::id());
    let mut vm = Launched::start(&spec(name, &marker), &[]);
    vm.wait_stdout("phase Running", BOOT_DEADLINE);
    let iso = vm.dir().join("private/cloud-init/cloudinitdisk.iso");
    let iso_sectors = std::fs::metadata(&iso)
        .unwrap_or_else(|e| panic!("{}: {e}", iso.display()))
        .len()
        / 512;
    let empty = vm.dir().join("private/empty-disks/scratch.qcow2");
    assert!(empty.exists(), "{} was not made", empty.display());

    let mut console = vm.console();
    let deadline = Instant::now() + BOOT_DEADLINE;
    common::wait_booted(&mut console);
    let line = console
        .wait_for("the guest's disk report with both disks", deadline, |l| {
            l.starts_with("VMLTEST-DISKS") && disks(l).len() >= 2
        })
        .unwrap();
    eprintln!("{line}");
    let seen = disks(&line);
    // The empty disk: by its serial, with the capacity asked for (96Mi = 196608 sectors).
    assert!(
        seen.iter()
            .any(|(_, serial, size)| serial == "EMPTY-SCRATCH" && *size == 96 * 2048),
        "{line}"
    );
    // The cidata disk: no serial, exactly the ISO the launcher built.
    let cidata_dev = seen
        .iter()
        .find(|(_, serial, size)| serial == "-" && *size == iso_sectors)
        .map(|(dev, _, _)| dev.clone())
        .unwrap_or_else(|| panic!("no disk of {iso_sectors} sectors: {line}"));
    // And the guest reads it as a NoCloud seed: label, meta-data and user-data.
    let line = console.line("the guest's cidata report", GUEST_DEADLINE, |l| {
        l.starts_with("VMLTEST-CIDATA")
    });
    eprintln!("{line}");
    assert_eq!(
        line,
        format!("VMLTEST-CIDATA {cidata_dev} instance-id: {name}.default # {marker}")
    );

    vm.signal(nix::sys::signal::Signal::SIGTERM);
    vm.wait_stdout("phase Succeeded", GUEST_DEADLINE);
    let status = vm.wait_exit(Duration::from_secs(60));
    assert_eq!(status.code(), Some(0), "exit status");
}
