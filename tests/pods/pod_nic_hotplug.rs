//! A bridge interface plugged into a running VM in a pod, as KubeVirt's bridge binding does it:
//! `podman kube play` of `deploy/pod.yaml` with the one thing a bridge binding needs added — the
//! tun device, which KubeVirt's device plugin gives its pods — and this test in the role of the
//! node's network plugin, which makes the tap (`tap1`, the interface's index) in the pod's
//! network namespace. A Sync through the pod's socket plugs it: the guest sees a NIC with the
//! spec's MAC and its carrier up, answers on it (an IPv6 ping from the pod's side to the guest's
//! link-local address, which the guest's kernel derives from that MAC), and loses it again with
//! `state: absent`.
//!
//! `scripts/test.sh` builds the image before `cargo test`; run `scripts/build-image.sh` first
//! when running this test alone.

use crate::common;

use std::process::Command;

use common::pod::{repo, PlayedPod};
use common::{cli_sync, BOOT_DEADLINE, GUEST_DEADLINE};

const MAC: &str = "02:00:00:00:0a:01";
/// The guest's IPv6 link-local address on that NIC: EUI-64 of `MAC`, its U/L bit flipped.
const LINK_LOCAL: &str = "fe80::ff:fe00:a01";

/// The pod's VM with the second interface, in `state` (`up`, `absent`).
fn spec(manifest: &str, state: &str) -> String {
    let vm: String = manifest
        .split("  vm.yaml: |\n")
        .nth(1)
        .unwrap()
        .split("\n---\n")
        .next()
        .unwrap()
        .lines()
        .map(|l| format!("{}\n", l.strip_prefix("    ").unwrap_or(l)))
        .collect();
    // Appended to both lists: the interface's index (1) names its tap.
    let (networks, volumes) = ("  networks:\n", "  volumes:");
    assert!(
        vm.contains("      interfaces:\n") && vm.contains(networks) && vm.contains(volumes),
        "deploy/pod.yaml changed its VM: {vm}"
    );
    vm.replace(
        networks,
        &format!(
            "        - {{name: second, bridge: {{}}, macAddress: \"{MAC}\", state: {state}}}\n{networks}"
        ),
    )
    .replace(
        volumes,
        &format!("    - {{name: second, multus: {{networkName: second-net}}}}\n{volumes}"),
    )
}

/// Runs `args` in the pod's network namespace, as the node's network plugin would.
fn in_pod_netns(pid: u32, args: &[&str]) -> std::process::Output {
    Command::new("nsenter")
        .args(["-t", &pid.to_string(), "-n"])
        .args(args)
        .output()
        .unwrap()
}

fn in_pod_netns_ok(pid: u32, args: &[&str]) -> String {
    let out = in_pod_netns(pid, args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_bridge_nic_plugged_in_a_pod_reaches_the_guest_and_leaves() {
    let tun_mount = "        - name: kvm\n          mountPath: /dev/kvm\n";
    let tun_volume =
        "    - name: kvm\n      hostPath:\n        path: /dev/kvm\n        type: CharDevice\n";
    let manifest = std::fs::read_to_string(repo().join("deploy/pod.yaml")).unwrap();
    assert!(
        manifest.contains(tun_mount) && manifest.contains(tun_volume),
        "deploy/pod.yaml changed its devices"
    );
    let with_tun = manifest
        .replace(
            tun_mount,
            &format!("{tun_mount}        - name: tun\n          mountPath: /dev/net/tun\n"),
        )
        .replace(
            tun_volume,
            &format!("{tun_volume}    - name: tun\n      hostPath:\n        path: /dev/net/tun\n        type: CharDevice\n"),
        );
    let work = tempfile::tempdir().unwrap();
    std::fs::write(work.path().join("pod.yaml"), &with_tun).unwrap();
    let pod = PlayedPod::play(&work.path().join("pod.yaml"));
    let logs = pod.logs("launcher");
    logs.wait_for("the guest's NICs at boot", BOOT_DEADLINE, |l| {
        l.contains("VMLTEST-NICS ")
    });

    // The node's plugin: the tap of interface 1, owned by the user libvirtd runs as in the
    // pod (root), so that it may open it without NET_ADMIN.
    let pid = pod.infra_pid();
    in_pod_netns_ok(
        pid,
        &[
            "ip", "tuntap", "add", "dev", "tap1", "mode", "tap", "vnet_hdr", "user", "0",
        ],
    );
    in_pod_netns_ok(pid, &["ip", "link", "set", "tap1", "up"]);

    let socket = pod.shared_dir().join("launcher.sock");
    let reply = cli_sync(&socket, work.path(), &spec(&with_tun, "up"));
    let plugged = &reply["interfaces"][0];
    assert_eq!(
        (plugged["name"].as_str(), plugged["error"].as_str()),
        (Some("second"), Some("")),
        "{reply:#}"
    );
    let with = format!("eth1:{MAC}:up");
    let nics = logs.wait_for("the guest's new NIC", GUEST_DEADLINE, |l| {
        l.contains("VMLTEST-NICS ") && l.contains(&with)
    });
    eprintln!("{nics}");
    // A packet each way: the guest answers on the new NIC from the address its MAC gives it.
    let ping = in_pod_netns(
        pid,
        &[
            "ping", "-6", "-c", "1", "-w", "60", "-I", "tap1", LINK_LOCAL,
        ],
    );
    assert!(
        ping.status.success(),
        "no answer from {LINK_LOCAL}: {}{}",
        String::from_utf8_lossy(&ping.stdout),
        String::from_utf8_lossy(&ping.stderr)
    );

    cli_sync(&socket, work.path(), &spec(&with_tun, "absent"));
    let nics = logs.wait_for("the guest losing the NIC", GUEST_DEADLINE, |l| {
        l.contains("VMLTEST-NICS ") && !l.contains(MAC)
    });
    eprintln!("{nics}");
}
