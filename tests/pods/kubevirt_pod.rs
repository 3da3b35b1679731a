//! The KubeVirt drop-in in its image, under `podman kube play`: a pod shaped as KubeVirt's
//! virt-controller makes it (the `compute` container running `/usr/bin/virt-launcher-monitor`
//! with virt-launcher's flags), driven from the host by `handler-replay` — virt-handler's own
//! client and notify server — to `HELD`; the container then exits 0.
//!
//! The pod's share dir is a host directory mounted at the same path inside: handler-replay links
//! `<share>/domain-notify-pipe.sock` to its own socket beside the share, as virt-handler's proxy
//! would put it there, and the link must resolve on both sides.

use crate::common;

use std::time::Duration;

use common::kubevirt::{guest_vmi_json, handler_replay_holds};
use common::pod::{podman, podman_ok, PlayedPod};

fn manifest(root: &str, uid: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: virt-launcher-testvmi
  labels:
    kubevirt.io: virt-launcher
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 90
  containers:
    - name: compute
      image: localhost/vmlauncher:dev
      command: ["/usr/bin/virt-launcher-monitor"]
      args:
        - --qemu-timeout
        - 5m
        - --name
        - testvmi
        - --uid
        - {uid}
        - --namespace
        - kvtest
        - --kubevirt-share-dir
        - {root}/share
        - --ephemeral-disk-dir
        - /var/run/kubevirt-ephemeral-disks
        - --container-disk-dir
        - /var/run/kubevirt/container-disks
        - --hotplug-disk-dir
        - {root}/hotplug
        - --grace-period-seconds
        - "45"
        - --hook-sidecars
        - "0"
        - --ovmf-path
        - /usr/share/OVMF
        - --runtime-dir
        - {root}/runtime
        - --kubevirt-private-dir
        - {root}/private
        # This machine's /dev/kvm cannot boot a guest (a nested PVM).
        - --emulation
        - tcg
      securityContext:
        capabilities:
          drop: [ALL]
          add: [SETUID, SETGID, SETPCAP, CHOWN, DAC_OVERRIDE, FOWNER, KILL, SYS_ADMIN, MKNOD, SYS_CHROOT]
      volumeMounts:
        - name: pod-dirs
          mountPath: {root}
        - name: kvm
          mountPath: /dev/kvm
        - name: test-guest
          mountPath: /var/cache/vmlauncher/test-guest
          readOnly: true
  volumes:
    - name: pod-dirs
      hostPath:
        path: {root}
        type: Directory
    - name: kvm
      hostPath:
        path: /dev/kvm
        type: CharDevice
    - name: test-guest
      hostPath:
        path: /var/cache/vmlauncher/test-guest
        type: Directory
"#
    )
}

#[test]
fn the_image_runs_as_kubevirts_launcher_under_podman_kube_play() {
    let root = tempfile::Builder::new()
        .prefix("vml-kvpod-")
        .tempdir_in("/var/tmp")
        .unwrap();
    for d in ["share", "hotplug"] {
        std::fs::create_dir_all(root.path().join(d)).unwrap();
    }
    let root_text = root.path().display().to_string();
    let uid = "0c9b7a6e-2d4f-4b1a-8e3c-5f6a7b8c9d0e";
    let manifest_path = root.path().join("pod.yaml");
    std::fs::write(&manifest_path, manifest(&root_text, uid)).unwrap();
    let vmi = root.path().join("vmi.json");
    std::fs::write(&vmi, guest_vmi_json("testvmi", "kvtest", uid).to_string()).unwrap();

    let pod = PlayedPod::play(&manifest_path);
    // The pod is `virt-launcher-testvmi-<unique>`, its container `<pod>-compute`.
    let container = pod.container("compute");
    let logs = pod.logs("compute");
    logs.wait_for("the launcher ready", Duration::from_secs(120), |l| {
        l.contains("virt-launcher for kvtest_testvmi ready")
    });

    handler_replay_holds(
        &root.path().join("share"),
        &vmi,
        &root.path().join("hotplug"),
        &root.path().join("private"),
        || {
            let log = podman(&["logs", &container]);
            format!("container log:\n{}", String::from_utf8_lossy(&log.stderr))
        },
    );

    // The VM is over and deleted: the launcher exits by itself; SIGTERM would end it too.
    let _ = podman(&["kill", "--signal", "TERM", &container]);
    podman_ok(&["wait", &container]);
    let code = podman_ok(&["inspect", "--format", "{{.State.ExitCode}}", &container]);
    let log = podman(&["logs", &container]);
    assert_eq!(
        code.trim(),
        "0",
        "the container's exit code; its log:\n{}",
        String::from_utf8_lossy(&log.stderr)
    );
}
