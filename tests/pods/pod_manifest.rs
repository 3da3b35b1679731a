//! The pod, for real: `podman kube play deploy/pod.yaml` (the manifest unchanged, the image
//! `scripts/build-image.sh` built; the guest finds the manifest's vTPM), then from the host, as a
//! node daemon would, through the
//! emptyDir that holds the socket and the hotplug dir: a stock Python gRPC client (default
//! options) hot-plugs a file disk and a loop device passed by major:minor; the guest reports both
//! serials; the device rule shows in the container's devices cgroup; removal leaves no node and
//! no rule; `podman stop` powers the guest off through ACPI and the container exits 0.
//!
//! `scripts/test.sh` builds the image before `cargo test`; run `scripts/build-image.sh` first
//! when running this test alone.

use crate::common;

use std::path::Path;

use common::pod::{podman_ok, repo, PlayedPod};
use common::python::python_client;
use common::{guest_vmi_from, with_claims, Loop, BOOT_DEADLINE, GUEST_DEADLINE};

/// The launcher container's device cgroup (v1) on the host.
fn devices_list(pod: &PlayedPod) -> String {
    let pid = podman_ok(&["inspect", "--format", "{{.State.Pid}}", &pod.launcher()]);
    let cgroups = std::fs::read_to_string(format!("/proc/{}/cgroup", pid.trim())).unwrap();
    let path = cgroups
        .lines()
        .find_map(|l| l.split_once(":devices:").map(|(_, p)| p.to_string()))
        .expect("a v1 devices cgroup");
    std::fs::read_to_string(format!("/sys/fs/cgroup/devices{path}/devices.list")).unwrap()
}

/// The manifest's VM (the guest where the pod mounts it), with hot-pluggable claims
/// `(volume, serial)`.
fn spec(disks: &[(&str, &str)]) -> String {
    let vm = guest_vmi_from(
        Path::new("/var/cache/vmlauncher/test-guest"),
        "pod-vm",
        "",
        "    devices:
      interfaces:
      - {name: default, masquerade: {}, ports: [{name: http, port: 80}]}
      disks: []
      tpm: {}
",
        "  networks:\n  - {name: default, pod: {}}\n  volumes: []\n",
    );
    with_claims(vm, disks)
}

#[test]
fn the_pod_manifest_runs_and_hotplug_works_inside_the_container() {
    let pod = PlayedPod::play(&repo().join("deploy/pod.yaml"));
    let logs = pod.logs("launcher");
    let running = logs.wait_for("phase Running", BOOT_DEADLINE, |l| {
        l.contains("phase Running")
    });
    eprintln!("{running}");
    logs.wait_for("the guest's boot line", BOOT_DEADLINE, |l| {
        l.contains("VMLTEST-BOOTED")
    });
    // The manifest's vTPM: swtpm runs in the image, and the guest's kernel finds the TPM.
    logs.wait_for("the guest's TPM", GUEST_DEADLINE, |l| {
        l.ends_with("VMLTEST-TPM tpm0")
    });

    // The node daemon's view: the emptyDir on the host.
    let shared = pod.shared_dir();
    let socket = shared.join("launcher.sock");
    let socket = socket.to_str().unwrap();
    assert_eq!(
        python_client(&["health", socket])["status"],
        "SERVING",
        "health through the pod's socket"
    );

    let work = tempfile::tempdir().unwrap();
    common::sparse_file(shared.join("hotplug-disks/data.img"), 8);
    let block = Loop::new(work.path(), "pod-blk", 16, false);
    // In a pod only a device the node daemon gave it may be attached.
    block.give_to(&shared.join("hotplug-disks"), "given-pod-blk");
    let with_both = work.path().join("both.yaml");
    std::fs::write(
        &with_both,
        spec(&[("data", "PODFILE-1"), ("blk", "PODBLK-1")]),
    )
    .unwrap();
    let synced = python_client(&[
        "sync",
        socket,
        with_both.to_str().unwrap(),
        "--block",
        &format!("blk={}", block.number()),
        "--ready",
        "data",
        "--ready",
        "blk",
    ]);
    eprintln!("{synced}");
    let disks = logs.wait_for("the guest reporting both disks", GUEST_DEADLINE, |l| {
        l.contains("VMLTEST-DISKS") && l.contains(":PODFILE-1:") && l.contains(":PODBLK-1:")
    });
    eprintln!("{disks}");
    let rule = format!("b {} rwm", block.number());
    assert!(
        devices_list(&pod).lines().any(|l| l == rule),
        "{rule} not in the container's devices.list"
    );
    let node = shared.join("hotplug-disks/blk");
    assert!(node.exists(), "the launcher made {}", node.display());
    // The file went to QEMU as the launcher's pin of the inode it checked, made in QEMU's
    // (libvirtd's) mount namespace: the pod grants what that takes (SYS_ADMIN, SYS_CHROOT). A
    // pin that could not be made leaves no mount point behind (the file would go by path).
    let pin = shared.join("pins/data.img");
    assert!(pin.exists(), "no pin {}", pin.display());

    let without = work.path().join("none.yaml");
    std::fs::write(&without, spec(&[])).unwrap();
    python_client(&[
        "sync",
        socket,
        without.to_str().unwrap(),
        "--gone",
        "data",
        "--gone",
        "blk",
    ]);
    logs.wait_for("the guest reporting no disk", GUEST_DEADLINE, |l| {
        l.trim() == "[console] VMLTEST-DISKS"
    });
    assert!(!node.exists(), "the node is gone");
    assert!(!pin.exists(), "the pin is gone");
    assert!(
        !devices_list(&pod).lines().any(|l| l == rule),
        "the rule is gone"
    );

    // podman stop: SIGTERM to PID 1 -> ACPI power-off -> exit 0 (README's table).
    podman_ok(&["stop", "-t", "90", &pod.launcher()]);
    logs.wait_for("the guest's ACPI power-off", GUEST_DEADLINE, |l| {
        l.contains("VMLTEST-ACPI-POWEROFF")
    });
    let code = podman_ok(&[
        "inspect",
        "--format",
        "{{.State.ExitCode}}",
        &pod.launcher(),
    ]);
    assert_eq!(code.trim(), "0", "the container's exit code");
}
