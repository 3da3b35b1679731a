//! The pod's loopback is not the guest's: `podman kube play` of `deploy/pod.yaml` with a sidecar
//! that listens on the pod's 127.0.0.1 (as Envoy's admin port does), started before the launcher,
//! and the guest told (a kernel argument) to fetch from its gateway 10.0.2.2 on that port, which
//! QEMU's user-mode network would turn into the pod's 127.0.0.1. The guest's fetch fails; the
//! sidecar answers a client in the launcher's container on 127.0.0.1 (it was listening) and saw
//! that one connection only.
//!
//! `scripts/test.sh` builds the image before `cargo test`; run `scripts/build-image.sh` first
//! when running this test alone.

use crate::common;

use common::pod::{podman_ok, repo, PlayedPod, IMAGE};
use common::{BOOT_DEADLINE, GUEST_DEADLINE};

const PORT: u16 = 8099;

/// A sidecar that answers every connection on the pod's 127.0.0.1 and logs it.
fn sidecar() -> String {
    let server = format!(
        "$|=1; my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1:{PORT}', Listen => 8, ReuseAddr => 1) or die $!; \
         while (my $c = $s->accept) {{ print \"accepted\\n\"; print $c \"HTTP/1.0 200 OK\\r\\n\\r\\nsidecar-admin\\n\"; close $c }}"
    );
    format!(
        "    - name: sidecar\n      image: {IMAGE}\n      command: [perl, -MIO::Socket::INET, -e, {server:?}]\n"
    )
}

#[test]
fn the_guest_cannot_reach_the_pods_loopback() {
    let url = format!("http://10.0.2.2:{PORT}/admin");
    let boot_line = "kernelArgs: console=ttyS0 loglevel=1\n";
    let containers = "  containers:\n";
    let manifest = std::fs::read_to_string(repo().join("deploy/pod.yaml")).unwrap();
    assert_eq!(
        manifest.matches(boot_line).count(),
        1,
        "deploy/pod.yaml changed its VM"
    );
    assert_eq!(
        manifest.matches(containers).count(),
        1,
        "deploy/pod.yaml changed its pod"
    );
    let manifest = manifest
        .replace(
            boot_line,
            &format!(
                "kernelArgs: console=ttyS0 loglevel=1 vmltest.name=podlo vmltest.fetch={url}\n"
            ),
        )
        // First in the list: kube play starts it before the launcher.
        .replace(containers, &format!("{containers}{}", sidecar()));
    let work = tempfile::tempdir().unwrap();
    std::fs::write(work.path().join("pod.yaml"), manifest).unwrap();
    let pod = PlayedPod::play(&work.path().join("pod.yaml"));
    let logs = pod.logs("launcher");

    logs.wait_for("the guest's boot line", BOOT_DEADLINE, |l| {
        l.contains("VMLTEST-BOOTED")
    });
    let fetched = logs.wait_for("the guest's fetch", GUEST_DEADLINE, |l| {
        l.contains("VMLTEST-FETCH")
    });
    eprintln!("{fetched}");
    assert!(
        fetched.contains(&format!("VMLTEST-FETCH-FAILED {url}")),
        "the guest reached the pod's loopback: {fetched}"
    );

    // The sidecar was there: it answers on the pod's loopback, from the launcher's container.
    let client = format!(
        "my $c = IO::Socket::INET->new(PeerAddr => '127.0.0.1:{PORT}') or die $!; print <$c>"
    );
    let answer = podman_ok(&[
        "exec",
        &pod.launcher(),
        "perl",
        "-MIO::Socket::INET",
        "-e",
        &client,
    ]);
    assert!(answer.contains("sidecar-admin"), "{answer}");
    // And that was its only connection: none came from the guest.
    let seen = podman_ok(&["logs", &pod.container("sidecar")]);
    assert_eq!(seen.matches("accepted").count(), 1, "sidecar's log: {seen}");
}
