//! Network traffic both ways, in a real TCG guest on QEMU user-mode networking (a local run):
//! the test reaches the guest's HTTP server through the port the launcher published on
//! 127.0.0.1, and the guest fetches a page from a server the test runs on the host's loopback
//! (10.0.2.2 inside the guest is the host's 127.0.0.1). The guest's /init reports its DHCP lease,
//! its server and what it fetched on the serial console. Only loopback addresses are used.

use crate::common;

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use common::net::{free_port, host_server, http_get};
use common::{guest_vmi, Launched, BOOT_DEADLINE, GUEST_DEADLINE};

fn spec(name: &str, kernel_args: &str) -> String {
    guest_vmi(
        name,
        kernel_args,
        r#"    devices:
      autoattachGraphicsDevice: false
      interfaces:
      - name: default
        masquerade: {}
        macAddress: "02:00:00:0a:0b:0c"
        ports:
        - name: http
          port: 80
"#,
        "  networks:\n  - name: default\n    pod: {}\n",
    )
}

#[test]
fn traffic_crosses_both_ways_through_user_mode_networking() {
    let token = format!("host-token-{}", std::process::id());
    let (server_port, requests) = host_server(Ipv4Addr::LOCALHOST.into(), format!("{token}\n"));
    let published = free_port();
    let args =
        format!("vmltest.name=nettest vmltest.fetch=http://10.0.2.2:{server_port}/from-guest");
    let mut vm = Launched::start(
        &spec("e2e-network", &args),
        &["--publish", &format!("{published}:80")],
    );
    let mut console = vm.boot();
    let deadline = Instant::now() + BOOT_DEADLINE;
    let lease = console
        .wait_for("the guest's DHCP lease", deadline, |l| {
            l.starts_with("VMLTEST-NET ")
        })
        .unwrap();
    eprintln!("{lease}");
    // QEMU's user-mode network: the guest is 10.0.2.15/24 behind the router 10.0.2.2.
    let address = lease.split_whitespace().nth(2).unwrap().to_string();
    assert!(address.starts_with("10.0.2."), "{lease}");
    console
        .wait_for("the guest's HTTP server", deadline, |l| {
            l == "VMLTEST-HTTP nettest 80"
        })
        .unwrap();

    // Host → guest, through the published port.
    let answer = http_get(SocketAddr::from((Ipv4Addr::LOCALHOST, published)), "/").unwrap();
    eprintln!("{answer}");
    let ip = address.split('/').next().unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    assert!(
        answer.ends_with(&format!("vmltest nettest {ip}\n")),
        "{answer}"
    );

    // Status shows the interface as libvirt runs it, with the port where it was published.
    let status = common::cli_status(&vm.socket());
    assert_eq!(
        status["interfaces"],
        serde_json::json!([{
            "name": "default",
            "mac": "02:00:00:0a:0b:0c",
            "ipAddress": "",
            "ports": [{"protocol": "TCP", "port": 80, "hostAddress": "127.0.0.1", "hostPort": published}],
        }]),
        "{status:#}"
    );
    let text = std::process::Command::new(common::bin())
        .args(["status", "--socket"])
        .arg(vm.socket())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(&format!(
            "interface:   default 02:00:00:0a:0b:0c - 127.0.0.1:{published}->80/TCP"
        )),
        "{text}"
    );

    // Guest → host: the guest fetched the test's page, and the test's server saw the request.
    let fetched = console
        .wait_for("the guest's fetch from the host", deadline, |l| {
            l.starts_with("VMLTEST-FETCH")
        })
        .unwrap();
    eprintln!("{fetched}");
    assert_eq!(
        fetched,
        format!("VMLTEST-FETCH http://10.0.2.2:{server_port}/from-guest {token}")
    );
    let request = requests.recv_timeout(GUEST_DEADLINE).unwrap().line;
    assert!(request.starts_with("GET /from-guest HTTP/1."), "{request}");

    vm.signal(nix::sys::signal::Signal::SIGTERM);
    vm.wait_stdout("phase Succeeded", GUEST_DEADLINE);
    assert_eq!(vm.wait_exit(Duration::from_secs(60)).code(), Some(0));
}

#[test]
fn a_port_already_taken_on_the_host_fails_the_start_by_name() {
    // Someone else listens on the port the spec publishes: the launcher must not run a guest
    // whose port silently goes nowhere.
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let mut vm = Launched::start(
        &spec("e2e-port-taken", ""),
        &["--publish", &format!("{port}:80")],
    );
    let status = vm.wait_exit(BOOT_DEADLINE);
    let stderr = std::fs::read_to_string(vm.dir().join("launcher.stderr")).unwrap();
    assert_eq!(status.code(), Some(4), "exit code; stderr:\n{stderr}");
    assert!(
        stderr.contains(&format!("cannot publish tcp:127.0.0.1:{port}-:80")),
        "{stderr}"
    );
    drop(taken);
}

/// A cgroup v2 of its own for one launcher (its libvirtd and QEMU follow it): the loopback rule
/// is attached to the launcher's cgroup, and must not reach the other tests' guests.
struct OwnCgroup(std::path::PathBuf);

impl OwnCgroup {
    fn new(name: &str) -> OwnCgroup {
        let dir = std::path::PathBuf::from("/sys/fs/cgroup/unified")
            .join(format!("vmltest-{name}-{}", common::unique()));
        std::fs::create_dir_all(&dir).expect("a cgroup v2 hierarchy at /sys/fs/cgroup/unified");
        OwnCgroup(dir)
    }
}

impl Drop for OwnCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn with_the_loopback_closed_the_guest_cannot_reach_the_host_but_its_port_still_answers() {
    let token = format!("host-token-{}", std::process::id());
    let (server_port, requests) = host_server(Ipv4Addr::LOCALHOST.into(), format!("{token}\n"));
    let published = free_port();
    let url = format!("http://10.0.2.2:{server_port}/from-guest");
    let args = format!("vmltest.name=closed vmltest.fetch={url}");
    let cgroup = OwnCgroup::new("loopback");
    let mut vm = Launched::start_in_cgroups(
        &spec("e2e-loopback-closed", &args),
        &[
            "--publish",
            &format!("{published}:80"),
            "--guest-loopback",
            "closed",
        ],
        &[cgroup.0.join("cgroup.procs")],
    );
    let mut console = vm.boot();
    let deadline = Instant::now() + BOOT_DEADLINE;
    let fetched = console
        .wait_for("the guest's fetch from the host", deadline, |l| {
            l.starts_with("VMLTEST-FETCH")
        })
        .unwrap();
    eprintln!("{fetched}");
    assert!(
        fetched.starts_with(&format!("VMLTEST-FETCH-FAILED {url}")),
        "{fetched}"
    );
    assert!(
        requests.try_recv().is_err(),
        "the host's server was reached"
    );

    // Into the guest, through the published port: untouched.
    let answer = http_get(SocketAddr::from((Ipv4Addr::LOCALHOST, published)), "/").unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    assert!(answer.contains("vmltest closed"), "{answer}");

    vm.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(vm.wait_exit(Duration::from_secs(60)).code(), Some(0));
}
