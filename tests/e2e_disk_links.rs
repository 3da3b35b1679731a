//! Disk images in places a tenant or an image author writes (a claim's `disk.img`, a container
//! disk's `disk_N.img`) are opened only as themselves: one that is a symbolic link, which could
//! hand the guest any file of the launcher's (QEMU runs as root), is refused at start, naming the
//! volume, with exit 4, before QEMU opens anything; the link's target is untouched. Against the
//! real binary and a real private libvirtd; the guest never boots.

mod common;

use common::{guest_spec, Launched, GUEST_DEADLINE};

const TARGET_BYTES: &[u8] = b"#!/bin/sh\n# a file of the launcher's\n";

/// `text` (a VMI with `disks: []` and `volumes: []`) with volume `data` from `source`.
fn with_volume(text: String, source: &str) -> String {
    text.replace(
        "      disks: []\n",
        "      disks:\n      - {name: data, disk: {bus: scsi}, serial: Data-1}\n",
    )
    .replace(
        "  volumes: []\n",
        &format!("  volumes:\n  - {{name: data, {source}}}\n"),
    )
}

/// Starts a launcher whose runtime dir has `link` (relative to it) pointing at a file outside,
/// and expects it to refuse volume `data` with exit 4, leaving the file as it was.
fn refused_at_start(name: &str, link: &str, source: &str) {
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("launcher-file");
    std::fs::write(&target, TARGET_BYTES).unwrap();
    let mut vm = Launched::start_owned(|dir| {
        let link = dir.join(link);
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&target, &link).unwrap();
    })
    .run(&with_volume(guest_spec(name, "", &[]), source), &[]);
    let code = vm.wait_exit(GUEST_DEADLINE).code();
    let stderr = vm.stderr_text();
    assert_eq!(code, Some(4), "{stderr}");
    assert!(stderr.contains("volume \"data\""), "{stderr}");
    assert!(stderr.contains("is a symbolic link"), "{stderr}");
    assert_eq!(std::fs::read(&target).unwrap(), TARGET_BYTES);
}

#[test]
fn a_claim_whose_disk_img_is_a_symlink_is_refused_at_start() {
    refused_at_start(
        "pvc-link",
        "vmi-disks/data/disk.img",
        "persistentVolumeClaim: {claimName: data}",
    );
}

#[test]
fn a_container_disk_that_is_a_symlink_is_refused_at_start() {
    refused_at_start(
        "cd-link",
        "container-disks/disk_0.img",
        "containerDisk: {image: example/disk}",
    );
}
