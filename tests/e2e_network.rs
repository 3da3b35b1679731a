//! Network traffic both ways, in a real TCG guest on QEMU user-mode networking (a local run):
//! the test reaches the guest's HTTP server through the port the launcher published on
//! 127.0.0.1, and the guest fetches a page from a server the test runs on the host's loopback
//! (10.0.2.2 inside the guest is the host's 127.0.0.1). The guest's /init reports its DHCP lease,
//! its server and what it fetched on the serial console. Only loopback addresses are used.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{guest_dir, Launched, BOOT_DEADLINE, GUEST_DEADLINE};

fn spec(name: &str, kernel_args: &str) -> String {
    let guest = guest_dir();
    format!(
        r#"apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 60
  domain:
    memory:
      guest: 256Mi
    firmware:
      kernelBoot:
        kernelArgs: console=ttyS0 loglevel=1 {kernel_args}
        container:
          kernelPath: {kernel}
          initrdPath: {initrd}
    devices:
      autoattachGraphicsDevice: false
      interfaces:
      - name: default
        masquerade: {{}}
        macAddress: "02:00:00:0a:0b:0c"
        ports:
        - name: http
          port: 80
  networks:
  - name: default
    pod: {{}}
"#,
        kernel = guest.join("vmlinuz").display(),
        initrd = guest.join("initrd.img").display(),
    )
}

/// A port nobody listens on right now, on the host's loopback.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One HTTP/1.0 GET; the whole answer.
fn http_get(port: u16, path: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: vmltest\r\n\r\n")?;
    stream.shutdown(Shutdown::Write)?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}

/// A one-request HTTP server on the host's loopback that answers `body` and reports the
/// request line it got.
fn host_server(body: String) -> (u16, mpsc::Receiver<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut request = String::new();
        reader.read_line(&mut request).unwrap();
        // Read the headers to their end before answering.
        let mut line = String::new();
        while reader.read_line(&mut line).unwrap_or(0) > 2 {
            line.clear();
        }
        let _ = write!(
            stream,
            "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let _ = tx.send(request.trim_end().to_string());
    });
    (port, rx)
}

#[test]
fn traffic_crosses_both_ways_through_user_mode_networking() {
    let token = format!("host-token-{}", std::process::id());
    let (server_port, requests) = host_server(format!("{token}\n"));
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
    let answer = http_get(published, "/").unwrap();
    eprintln!("{answer}");
    let ip = address.split('/').next().unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    assert!(
        answer.ends_with(&format!("vmltest nettest {ip}\n")),
        "{answer}"
    );

    // Status shows the interface as libvirt runs it, with the port where it was published.
    let out = std::process::Command::new(common::bin())
        .args(["status", "--output", "json", "--socket"])
        .arg(vm.socket())
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
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
    let request = requests.recv_timeout(GUEST_DEADLINE).unwrap();
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
