//! The pod's network, for real: `podman kube play` of `deploy/pod.yaml` with one change — the
//! guest is told (a kernel argument) to fetch a page from a server this test runs on the host —
//! then packets cross the pod both ways. The test GETs the guest's page at the pod's address,
//! port 80, where the launcher (`--network=pod`) has QEMU's user-mode network publish it; the
//! guest fetches the test's page through the pod's network, and the request reaches the host
//! from the pod's address. `status`, through the pod's socket, shows the published port.
//!
//! `scripts/test.sh` builds the image before `cargo test`; run `scripts/build-image.sh` first
//! when running this test alone.

use crate::common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use common::net::{host_server, http_get};
use common::pod::{podman_ok, repo, PlayedPod};
use common::{BOOT_DEADLINE, GUEST_DEADLINE};

/// The pod's address on podman's default network (its infra container holds the namespace).
fn pod_address(pod: &PlayedPod) -> IpAddr {
    let address = podman_ok(&[
        "inspect",
        "--format",
        "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
        &pod.infra_container(),
    ]);
    address.trim().parse().unwrap()
}

#[test]
fn traffic_crosses_the_pod_both_ways() {
    // The host as the pod sees it: the gateway of podman's default network.
    let gateway: Ipv4Addr = podman_ok(&[
        "network",
        "inspect",
        "--format",
        "{{range .Subnets}}{{.Gateway}}{{end}}",
        "podman",
    ])
    .trim()
    .parse()
    .unwrap();
    let token = format!("host-token-{}", std::process::id());
    // On every address: podman's bridge may get the gateway only when the pod starts. That the
    // request came from the pod is checked on its source address below.
    let (port, requests) = host_server(Ipv4Addr::UNSPECIFIED.into(), format!("{token}\n"));
    let url = format!("http://{gateway}:{port}/from-pod");

    let boot_line = "kernelArgs: console=ttyS0 loglevel=1\n";
    let manifest = std::fs::read_to_string(repo().join("deploy/pod.yaml")).unwrap();
    assert_eq!(
        manifest.matches(boot_line).count(),
        1,
        "deploy/pod.yaml changed its VM"
    );
    let manifest = manifest.replace(
        boot_line,
        &format!("kernelArgs: console=ttyS0 loglevel=1 vmltest.name=podnet vmltest.fetch={url}\n"),
    );
    let work = tempfile::tempdir().unwrap();
    std::fs::write(work.path().join("pod.yaml"), manifest).unwrap();
    let pod = PlayedPod::play(&work.path().join("pod.yaml"));
    let logs = pod.logs("launcher");

    let lease = logs.wait_for("the guest's DHCP lease", BOOT_DEADLINE, |l| {
        l.contains("VMLTEST-NET ")
    });
    eprintln!("{lease}");
    let guest_ip = lease
        .split_whitespace()
        .skip_while(|w| *w != "VMLTEST-NET")
        .nth(2)
        .and_then(|a| a.split('/').next())
        .unwrap()
        .to_string();
    logs.wait_for("the guest's HTTP server", GUEST_DEADLINE, |l| {
        l.ends_with("VMLTEST-HTTP podnet 80")
    });

    // Host → guest: the pod's address, port 80.
    let pod_ip = pod_address(&pod);
    let answer = http_get(SocketAddr::new(pod_ip, 80), "/").unwrap();
    eprintln!("{answer}");
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    assert!(
        answer.ends_with(&format!("vmltest podnet {guest_ip}\n")),
        "{answer}"
    );

    // Guest → host: the guest printed the test's page, and the request came from the pod.
    let fetched = logs.wait_for("the guest's fetch from the host", GUEST_DEADLINE, |l| {
        l.contains("VMLTEST-FETCH")
    });
    assert!(
        fetched.ends_with(&format!("VMLTEST-FETCH {url} {token}")),
        "{fetched}"
    );
    let request = requests.recv_timeout(GUEST_DEADLINE).unwrap();
    assert!(
        request.line.starts_with("GET /from-pod HTTP/1."),
        "{}",
        request.line
    );
    assert_eq!(request.peer.ip(), pod_ip, "the request's source");

    // Status through the pod's socket: the port published on every address of the pod.
    let status = common::cli_status(&pod.shared_dir().join("launcher.sock"));
    assert_eq!(
        status["interfaces"][0]["ports"],
        serde_json::json!([{"protocol": "TCP", "port": 80, "hostAddress": "0.0.0.0", "hostPort": 80}]),
        "{status:#}"
    );
}
