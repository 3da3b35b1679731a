//! Live migration between machines' form: a target on TCP (`run --incoming --listen ADDR:PORT
//! --tls-dir DIR`), reached by `migrate --to HOST:PORT`, every channel under mutual TLS (the
//! target's API, libvirt's connection, QEMU's memory and disk streams). Run on one machine over
//! 127.0.0.1: the real binary, real private libvirtds, a TCG guest whose container disk (which
//! it wrote to) is copied through NBD under TLS, its boot kept.

mod common;

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

/// The guest with a container disk it writes its boot id to, and the hot-plugged claims
/// `claims` (volume, serial).
fn spec(claims: &[(&str, &str)]) -> String {
    let (disks, volumes) = hotplug_claims(claims);
    guest_vmi(
        "mig-tcp",
        "vmltest.write=CDISK-1",
        &format!(
            "    devices:\n      disks:\n      - {{name: cdisk, disk: {{bus: scsi}}, serial: CDISK-1}}\n{disks}"
        ),
        &format!("  volumes:\n  - {{name: cdisk, containerDisk: {{image: example/disk}}}}\n{volumes}"),
    )
}

/// A runtime dir as a pod of this VMI has it: the container disk's image.
fn pod_dir(dir: &Path) {
    std::fs::create_dir_all(dir.join("container-disks")).unwrap();
    std::fs::File::create(dir.join("container-disks/disk_0.img"))
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
}

fn target_on_tcp(tls: &Path, port: u16) -> Launched {
    let listen = format!("127.0.0.1:{port}");
    let mut target = Launched::incoming(
        pod_dir,
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
fn status_over_tcp(port: u16, tls: &Path) -> Result<proto::Status, String> {
    let tls = MigrationTls::read(tls).map_err(|e| e.to_string())?;
    let target = TcpTarget::parse(&format!("127.0.0.1:{port}")).unwrap();
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let mut client = vmlauncher::api::tcp::connect(&target, &tls)
            .await
            .map_err(|e| vmlauncher::error_chain(&e))?;
        client
            .get_status(proto::GetStatusRequest {})
            .await
            .map(|r| r.into_inner())
            .map_err(|s| s.to_string())
    })
}

#[test]
fn a_guest_moves_to_a_target_on_tcp_every_channel_under_mutual_tls() {
    let certs = tempfile::tempdir().unwrap();
    let tls = migration_credentials(&certs.path().join("ours"));
    let strangers = migration_credentials(&certs.path().join("strangers"));

    let mut source =
        Launched::start_owned(pod_dir).run(&spec(&[]), &["--tls-dir", tls.to_str().unwrap()]);
    source.boot();
    let wrote = source
        .console()
        .line("the guest's write", BOOT_DEADLINE, |l| {
            l.starts_with("VMLTEST-WROTE CDISK-1 ")
        });
    let boot_id = wrote.split_whitespace().nth(2).unwrap().to_string();

    // The target's API answers a client of the same CA only.
    let port = free_ports(4);
    let mut refusing = target_on_tcp(&tls, port);
    let waiting = status_over_tcp(port, &tls).unwrap();
    assert_eq!(waiting.phase, "Scheduled", "{waiting:?}");
    let refused = status_over_tcp(port, &strangers).unwrap_err();
    assert!(!refused.is_empty());

    // QEMU's streams are under TLS too: with the source's QEMU holding another CA's
    // credentials (its API and libvirt's still ours), the guest cannot go, and stays.
    let qemu_tls = source.dir().join("private/tls");
    let ours: Vec<(String, Vec<u8>)> = ["ca-cert.pem", "client-cert.pem", "client-key.pem"]
        .iter()
        .map(|f| (f.to_string(), std::fs::read(qemu_tls.join(f)).unwrap()))
        .collect();
    for (file, _) in &ours {
        std::fs::copy(strangers.join(file), qemu_tls.join(file)).unwrap();
    }
    let (code, _, stderr) = migrate(&source.socket(), port, &tls);
    assert_ne!(code, Some(0), "{stderr}");
    let still = cli_status(&source.socket());
    assert_eq!(still["phase"], "Running", "{still}");
    assert_eq!(still["migration"]["state"], "Failed", "{still}");
    // The target whose guest never came ends as such.
    assert_eq!(refusing.wait_exit(MIGRATION_DEADLINE).code(), Some(7));
    for (file, bytes) in &ours {
        std::fs::write(qemu_tls.join(file), bytes).unwrap();
    }

    // With the right credentials everywhere, it goes; the CLI reads the target's end over TCP.
    let port = free_ports(4);
    let mut target = target_on_tcp(&tls, port);
    let (code, answer, stderr) = migrate(&source.socket(), port, &tls);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(answer["migration"]["state"], "Completed", "{answer}");
    assert_eq!(answer["target"]["state"], "Completed", "{answer}");
    assert!(stderr.contains("migrating: "), "{stderr}");
    source.wait_stdout("phase Succeeded (Succeeded; Migrated)", MIGRATION_DEADLINE);
    assert_eq!(source.wait_exit(GUEST_DEADLINE).code(), Some(0));
    let arrived = status_over_tcp(port, &tls).unwrap();
    assert_eq!(arrived.phase, "Running", "{arrived:?}");

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
    assert_eq!(report.boot_id, boot_id, "a second boot");
    assert_eq!(report.read_back, format!("vmltest {boot_id}"));
    let log = std::fs::read_to_string(target.dir().join("console.log")).unwrap();
    assert!(!log.contains("VMLTEST-BOOTED"), "{log}");

    target.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(target.wait_exit(GUEST_DEADLINE).code(), Some(0));
}
