//! A stock Python client (PyPI's grpcio, grpcio-health-checking, grpcio-reflection), default
//! channel options, drives a real launcher over its unix socket: gRPC's C core sends the
//! percent-encoded socket path as `:authority`, which the server's HTTP/2 layer would refuse
//! without the launcher's authority fix. Health says SERVING once the domain is up, reflection
//! lists the services and serves the types the client builds its messages from, a Sync hot-plugs
//! a disk the guest reports by serial, and health turns NOT_SERVING while the launcher terminates.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use common::python::{client_script, python, python_client as client};
use common::{guest_spec, ConsoleWait, Launched, BOOT_DEADLINE, GUEST_DEADLINE};

#[test]
fn a_stock_python_client_with_default_options_drives_the_launcher() {
    let name = "e2e-python";
    let mut vm = Launched::start(&guest_spec(name, "", &[]), &[]);
    let mut console = vm.boot();
    let socket = vm.socket();
    let socket = socket.to_str().unwrap();

    for service in ["", "vmlauncher.v1.Launcher"] {
        let health = client(&["health", socket, "--service", service]);
        assert_eq!(health["status"], "SERVING", "{service:?}: {health}");
    }
    let services = client(&["services", socket]);
    for wanted in [
        "vmlauncher.v1.Launcher",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    ] {
        assert!(
            services["services"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s == wanted),
            "{wanted} not in {services}"
        );
    }
    let status = client(&["status", socket]);
    assert_eq!(status["phase"], "Running", "{status}");
    assert!(
        status["domain_name"].as_str().unwrap().contains(name),
        "{status}"
    );

    // A Sync through messages built from reflection: a new scsi disk the guest reports.
    let image = vm.scratch().join("py-data.img");
    common::sparse_file(&image, 8);
    let spec = vm.dir().join("with-disk.yaml");
    std::fs::write(&spec, guest_spec(name, "", &[("data", "PYDISK-1", &image)])).unwrap();
    let synced = client(&["sync", socket, spec.to_str().unwrap(), "--ready", "data"]);
    assert_eq!(synced["ready"]["data"]["serial"], "PYDISK-1", "{synced}");
    console.line(
        "the guest to report the disk synced by Python",
        GUEST_DEADLINE,
        |l| l.starts_with("VMLTEST-DISKS") && l.contains(":PYDISK-1:"),
    );

    // Terminating: the health Watch, subscribed while SERVING, sees NOT_SERVING while the guest
    // shuts down, before the server goes away.
    let mut watch = Command::new(python())
        .arg(client_script())
        .args(["health-watch", socket, "--until", "NOT_SERVING"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    let mut next_status = || -> String {
        let line = lines.next().expect("a health status line").unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        v["status"].as_str().unwrap().to_string()
    };
    assert_eq!(next_status(), "SERVING");
    vm.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(next_status(), "NOT_SERVING");
    assert!(watch.wait().unwrap().success());
    let exit = vm.wait_exit(BOOT_DEADLINE);
    assert_eq!(exit.code(), Some(0), "the guest powered off on ACPI");
}
