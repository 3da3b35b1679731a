//! Live migration between machines' form: a target on TCP (`run --incoming --listen ADDR:PORT
//! --tls-dir DIR`), reached by `migrate --to HOST:PORT`, every channel under mutual TLS (the
//! target's API, libvirt's connection, QEMU's memory and disk streams). Run on one machine over
//! 127.0.0.1: the real binary, real private libvirtds, a TCG guest whose container disk (which
//! it wrote to) is copied through NBD under TLS, its boot kept.

use crate::common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::net::{free_ports, migration_credentials};
use common::ConsoleWait;
use common::{
    bin, cli_status, cli_sync, guest_vmi, hotplug_claims, hotplug_image, report_with, Launched,
    BOOT_DEADLINE, GUEST_DEADLINE,
};
use vmlauncher::api::proto;
use vmlauncher::api::tcp::TcpTarget;
use vmlauncher::migration_tls::MigrationTls;

const MIGRATION_DEADLINE: Duration = Duration::from_secs(180);

/// The guest with a container disk it writes its boot id to, a claim (a PVC's `disk.img`), and
/// the hot-plugged claims `claims` (volume, serial).
fn spec(claims: &[(&str, &str)]) -> String {
    let (disks, volumes) = hotplug_claims(claims);
    guest_vmi(
        "mig-tcp",
        "vmltest.write=CDISK-1",
        &format!(
            "    devices:\n      disks:\n      - {{name: cdisk, disk: {{bus: scsi}}, serial: CDISK-1}}\n      - {{name: claim1, disk: {{bus: scsi}}, serial: CLAIM-1}}\n{disks}"
        ),
        &format!("  volumes:\n  - {{name: cdisk, containerDisk: {{image: example/disk}}}}\n  - {{name: claim1, persistentVolumeClaim: {{claimName: claim1}}}}\n{volumes}"),
    )
}

const CLAIM: &str = "vmi-disks/claim1/disk.img";

/// A runtime dir as a pod of this VMI has it: the container disk's image, and the claim, shared
/// with the pod `from` (a hard link: one file, two places), as a PVC mounted in both pods is.
fn pod_dir(dir: &Path, from: Option<&Path>) {
    std::fs::create_dir_all(dir.join("container-disks")).unwrap();
    std::fs::File::create(dir.join("container-disks/disk_0.img"))
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    std::fs::create_dir_all(dir.join(CLAIM).parent().unwrap()).unwrap();
    match from {
        Some(from) => std::fs::hard_link(from.join(CLAIM), dir.join(CLAIM)).unwrap(),
        None => std::fs::File::create(dir.join(CLAIM))
            .unwrap()
            .set_len(8 << 20)
            .unwrap(),
    }
}

fn target_on_tcp(source: &Path, tls: &Path, port: u16) -> Launched {
    let listen = format!("127.0.0.1:{port}");
    let mut target = Launched::incoming(
        |dir| pod_dir(dir, Some(source)),
        &["--tls-dir", tls.to_str().unwrap(), "--listen", &listen],
    );
    target.wait_stdout(&format!("api tcp:{listen} (mutual TLS)"), BOOT_DEADLINE);
    target
}

/// `vmlauncher migrate --to 127.0.0.1:PORT` run to its end: its exit code, its JSON answer
/// and its stderr.
fn migrate(source: &Path, port: u16, tls: &Path) -> (Option<i32>, serde_json::Value, String) {
    let out = Command::new(bin())
        .args(["migrate", "--output", "json", "--socket"])
        .arg(source)
        .args(["--to", &format!("127.0.0.1:{port}"), "--tls-dir"])
        .arg(tls)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    (
        out.status.code(),
        serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The target's status over its TCP API, as a client holding `tls` sees it.
fn status_over_tcp(port: u16, tls: &MigrationTls) -> Result<proto::Status, tonic::Status> {
    let target = TcpTarget::parse(&format!("127.0.0.1:{port}")).unwrap();
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let mut client = vmlauncher::api::tcp::connect(&target, tls)
            .await
            .map_err(|e| tonic::Status::unavailable(vmlauncher::error_chain(&e)))?;
        client
            .get_status(proto::GetStatusRequest {})
            .await
            .map(|r| r.into_inner())
    })
}

/// A call a migration does not make (`GetSpec`), over the TCP API.
fn spec_over_tcp(port: u16, tls: &MigrationTls) -> tonic::Status {
    let target = TcpTarget::parse(&format!("127.0.0.1:{port}")).unwrap();
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let mut client = vmlauncher::api::tcp::connect(&target, tls).await.unwrap();
        client
            .get_spec(proto::GetSpecRequest {})
            .await
            .expect_err("over TCP only a migration's calls are served")
    })
}

/// Whether the libvirtd listening on `port` takes a client with these files (libvirt's
/// `pkipath` names: `cacert.pem`, `clientcert.pem`, `clientkey.pem`).
fn libvirtd_takes(port: u16, ca: &Path, cert: &Path, key: &Path) -> bool {
    let pki = tempfile::tempdir().unwrap();
    for (from, to) in [
        (ca, "cacert.pem"),
        (cert, "clientcert.pem"),
        (key, "clientkey.pem"),
    ] {
        std::fs::copy(from, pki.path().join(to)).unwrap();
    }
    let uri = format!(
        "qemu+tls://127.0.0.1:{}/system?pkipath={}",
        port + 1,
        pki.path().display()
    );
    Command::new("virsh")
        .args(["-c", &uri, "version"])
        .output()
        .unwrap()
        .status
        .success()
}

/// What is listening on 127.0.0.1's `port`, and on every address.
fn listening(port: u16) -> String {
    let out = Command::new("ss")
        .args(["-Hltn", &format!("sport = :{port}")])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_guest_moves_to_a_target_on_tcp_every_channel_under_mutual_tls() {
    let certs = tempfile::tempdir().unwrap();
    let tls = migration_credentials(&certs.path().join("ours"));
    let strangers = migration_credentials(&certs.path().join("strangers"));
    let ours = MigrationTls::read(&tls).unwrap();
    let theirs = MigrationTls::read(&strangers).unwrap();

    let mut source = Launched::start_owned(|dir| pod_dir(dir, None))
        .run(&spec(&[]), &["--tls-dir", tls.to_str().unwrap()]);
    source.boot();
    let wrote = source
        .console()
        .line("the guest's write", BOOT_DEADLINE, |l| {
            l.starts_with("VMLTEST-WROTE CDISK-1 ")
        });
    let boot_id = wrote.split_whitespace().nth(2).unwrap().to_string();

    let port = free_ports(4);
    let mut refusing = target_on_tcp(source.dir(), &tls, port);
    // The API and libvirtd listen on the address given, not on every one.
    for p in [port, port + 1] {
        let found = listening(p);
        assert!(found.contains(&format!("127.0.0.1:{p}")), "{p}: {found}");
        assert_eq!(found.lines().count(), 1, "{p}: {found}");
    }
    // The target's API answers a client with a certificate of the launchers' CA, and serves
    // it a migration's calls only.
    let waiting = status_over_tcp(port, &ours).unwrap();
    assert_eq!(waiting.phase, "Scheduled", "{waiting:?}");
    let refused = spec_over_tcp(port, &ours);
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    // A client that trusts the target but presents another CA's certificate is refused, and so
    // is one presenting QEMU's (whose user reads its key).
    for (whose, cert, key) in [
        (
            "another CA's",
            &theirs.launcher.client_cert,
            &theirs.launcher.client_key,
        ),
        ("QEMU's", &ours.qemu.client_cert, &ours.qemu.client_key),
    ] {
        let mut impostor = ours.clone();
        impostor.launcher.client_cert = cert.clone();
        impostor.launcher.client_key = key.clone();
        assert!(
            status_over_tcp(port, &impostor).is_err(),
            "the API took {whose} certificate"
        );
    }
    // libvirtd's TLS listener likewise: ours is taken, QEMU's and another CA's are not.
    let ca = tls.join("ca-cert.pem");
    assert!(libvirtd_takes(
        port,
        &ca,
        &tls.join("client-cert.pem"),
        &tls.join("client-key.pem")
    ));
    for set in [tls.join("qemu"), strangers.clone()] {
        assert!(
            !libvirtd_takes(
                port,
                &ca,
                &set.join("client-cert.pem"),
                &set.join("client-key.pem")
            ),
            "libvirtd took {}",
            set.display()
        );
    }

    // QEMU's streams are under TLS, and the target's QEMU checks its peer: the source's QEMU
    // presents a certificate of another QEMU CA (trusting both, so that only the target's
    // check can stop it), and the guest cannot go, and stays.
    let qemu_tls = source.dir().join("qemu-tls");
    let kept: Vec<(String, Vec<u8>)> = ["ca-cert.pem", "client-cert.pem", "client-key.pem"]
        .iter()
        .map(|f| (f.to_string(), std::fs::read(qemu_tls.join(f)).unwrap()))
        .collect();
    let both_cas = [ours.qemu.ca_cert.clone(), theirs.qemu.ca_cert.clone()].concat();
    std::fs::write(qemu_tls.join("ca-cert.pem"), both_cas).unwrap();
    std::fs::write(qemu_tls.join("client-cert.pem"), &theirs.qemu.client_cert).unwrap();
    std::fs::write(qemu_tls.join("client-key.pem"), &theirs.qemu.client_key).unwrap();
    let (code, _, stderr) = migrate(&source.socket(), port, &tls);
    assert_ne!(code, Some(0), "{stderr}");
    let still = cli_status(&source.socket());
    assert_eq!(still["phase"], "Running", "{still}");
    assert_eq!(still["migration"]["state"], "Failed", "{still}");
    // The target whose guest never came ends as such.
    assert_eq!(refusing.wait_exit(MIGRATION_DEADLINE).code(), Some(7));
    // Refused by the target's QEMU itself, which checked the source's certificate.
    let target_qemu =
        std::fs::read_to_string(refusing.dir().join("libvirt/log/qemu/default_mig-tcp.log"))
            .unwrap_or_default();
    assert!(
        target_qemu.contains("The certificate hasn't got a known issuer"),
        "{target_qemu}\n{stderr}"
    );
    for (file, bytes) in &kept {
        std::fs::write(qemu_tls.join(file), bytes).unwrap();
    }

    // With the right credentials everywhere, it goes; the CLI reads the target's end over TCP.
    // Meanwhile another peer (127.0.0.2) holds 1,100 silent connections to the target's API
    // port (security review N-4): the target holds a few of them, answers its owner at once,
    // and the migration from 127.0.0.1 goes through.
    let port = free_ports(4);
    let mut target = target_on_tcp(source.dir(), &tls, port);
    let flood = silent_connections([127, 0, 0, 2], port, 1_100);
    // And a few to libvirtd's TLS port (fewer than its `max_anonymous_clients`, or the source's
    // libvirtd could not come in): clients that never finish a handshake hold it open no more
    // than the migration's end.
    let libvirt_flood = silent_connections([127, 0, 0, 3], port + 1, 8);
    let asked = std::time::Instant::now();
    let waiting = cli_status(&target.socket());
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "status took {:?} under the flood",
        asked.elapsed()
    );
    assert_eq!(waiting["phase"], "Scheduled", "{waiting}");
    let (code, answer, stderr) = migrate(&source.socket(), port, &tls);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(answer["migration"]["state"], "Completed", "{answer}");
    assert_eq!(answer["target"]["state"], "Completed", "{answer}");
    assert!(stderr.contains("migrating: "), "{stderr}");
    source.wait_stdout("phase Succeeded (Succeeded; Migrated)", MIGRATION_DEADLINE);
    assert_eq!(source.wait_exit(GUEST_DEADLINE).code(), Some(0));
    let arrived = cli_status(&target.socket());
    assert_eq!(arrived["phase"], "Running", "{arrived}");
    // The migration over, its TCP API is closed: no one connects any more.
    target.wait_stdout(
        "api tcp: closed, the incoming migration ended",
        MIGRATION_DEADLINE,
    );
    assert!(status_over_tcp(port, &ours).is_err());
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "port {port} still listens"
    );
    // libvirtd's TLS port likewise, once the source's libvirtd left it: libvirtd was started
    // again without it, under the running guest, whose phase never went Unknown for it.
    target.wait_stdout(
        "libvirt tls: closed, the incoming migration ended",
        MIGRATION_DEADLINE,
    );
    let refused = std::net::TcpStream::connect(("127.0.0.1", port + 1)).map(|_| ());
    assert_eq!(
        refused.map_err(|e| e.kind()),
        Err(std::io::ErrorKind::ConnectionRefused),
        "port {} still listens",
        port + 1
    );
    assert_eq!(listening(port + 1), "", "port {}", port + 1);
    let after = cli_status(&target.socket());
    assert_eq!(after["phase"], "Running", "{after}");
    let libvirtd = LibvirtdCpu::now(target.dir());
    // The claim, given by descriptor on the source, is opened on the target through the
    // target's pin of the inode it checked, never by its path.
    let live = common::live_xml(&target.libvirt_uri(), "default_mig-tcp");
    assert_eq!(
        common::live_disk_source(&live, "claim1").as_deref(),
        target.dir().join("pins/claim1.img").to_str(),
        "{live}"
    );
    // And the container disk's image under its overlay (copied through NBD) likewise.
    assert_eq!(
        common::live_backing_source(&live, "cdisk").as_deref(),
        target.dir().join("pins/cdisk.backing.img").to_str(),
        "{live}"
    );

    // The target is a full launcher: a hot-plug there, and the guest, the same boot, reads
    // back from its container disk, whose copy came through NBD under TLS.
    let mut console = target.console();
    hotplug_image(&target.dir().join("hotplug"), "hot1", 8 << 20);
    cli_sync(
        target.socket().as_path(),
        target.scratch(),
        &spec(&[("hot1", "HOT-1")]),
    );
    let report = report_with(&mut console, "HOT-1");
    assert!(
        report.serials.contains(&"CLAIM-1".to_string()),
        "{:?}",
        report.serials
    );
    assert_eq!(report.boot_id, boot_id, "a second boot");
    assert_eq!(report.read_back, format!("vmltest {boot_id}"));
    let log = std::fs::read_to_string(target.dir().join("console.log")).unwrap();
    assert!(!log.contains("VMLTEST-BOOTED"), "{log}");
    // The restarted libvirtd serves that hot-plug and `status`, and does not spin meanwhile (a
    // listener closed under an event loop can leave it polling a hung-up socket).
    let answered = cli_status(&target.socket());
    assert_eq!(answered["phase"], "Running", "{answered}");
    let busy = libvirtd.share_of_a_core_since();
    assert!(
        busy < 0.5,
        "libvirtd used {busy:.2} of a core after the restart"
    );

    target.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(target.wait_exit(GUEST_DEADLINE).code(), Some(0));
    let unknown: Vec<&String> = target
        .printed()
        .iter()
        .filter(|l| l.contains("phase Unknown"))
        .collect();
    assert!(unknown.is_empty(), "{unknown:?}");
    drop((flood, libvirt_flood));
}

/// The CPU time of a runtime dir's libvirtd from a point on.
struct LibvirtdCpu {
    pid: i32,
    ticks: u64,
    at: std::time::Instant,
}

impl LibvirtdCpu {
    fn now(dir: &Path) -> LibvirtdCpu {
        let pid = std::fs::read_to_string(dir.join("libvirt/libvirtd.pid")).unwrap();
        let pid = pid.trim().parse().unwrap();
        LibvirtdCpu {
            pid,
            ticks: Self::ticks(pid),
            at: std::time::Instant::now(),
        }
    }

    /// utime + stime of `pid`, in clock ticks (`proc(5)`: fields 14 and 15).
    fn ticks(pid: i32) -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let after_name = &stat[stat.rfind(')').unwrap() + 2..];
        let fields: Vec<&str> = after_name.split_whitespace().collect();
        fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
    }

    /// The CPU it used since `now`, as a share of one core over the time passed.
    fn share_of_a_core_since(&self) -> f64 {
        let used = Self::ticks(self.pid) - self.ticks;
        // SAFETY: sysconf reads a constant of the system.
        let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        used as f64 / per_second / self.at.elapsed().as_secs_f64()
    }
}

/// `count` TCP connections from `from` (a loopback address of its own: another peer) to
/// 127.0.0.1's `port`, which never send a byte.
fn silent_connections(from: [u8; 4], port: u16, count: usize) -> Vec<std::net::TcpStream> {
    let to = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let from = std::net::SocketAddr::from((from, 0));
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let mut held = Vec::with_capacity(count);
        for _ in 0..count {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind(from).unwrap();
            held.push(socket.connect(to).await.unwrap().into_std().unwrap());
        }
        held
    })
}
