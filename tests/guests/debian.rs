//! The README's real OS: `examples/debian.yaml` boots the Debian 12 image that
//! `scripts/build-debian-image.sh` builds (a containerDisk; TCG on this machine), cloud-init
//! creates the user and runs its command, and sshd answers on the published port — proven by
//! logging in over SSH with a key the test made and reading cloud-init's own result file; the
//! image's qemu-guest-agent connects, and the launcher's status shows `AgentConnected`.
//! One boot, bounded: cloud-init's marker within 5 minutes (the node test's bound: on two cores
//! beside the other test lane, a boot has taken 4). KubeVirt's guest agent calls on the same
//! image (guest info, users, filesystems, freeze) are in `e2e_kubevirt_node`, through the real
//! virt-handler.

use crate::common;

use std::io::Read;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::net::free_port;
use common::{Launched, GUEST_DEADLINE};

const BOOT_BOUND: Duration = Duration::from_secs(300);

fn image() -> PathBuf {
    let dir = std::env::var_os("VMLAUNCHER_DEBIAN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/vmlauncher/debian"));
    let image = dir.join("disk.img");
    assert!(
        image.exists(),
        "no Debian image at {} — run scripts/build-debian-image.sh first",
        image.display()
    );
    image
}

/// The README's example, with the test's public key added to the user cloud-init creates.
fn spec(public_key: &str) -> String {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/debian.yaml");
    let text = std::fs::read_to_string(example).unwrap();
    let line = "          plain_text_passwd: debian\n";
    assert!(text.contains(line), "examples/debian.yaml changed its user");
    text.replace(
        line,
        &format!("{line}          ssh_authorized_keys: [\"{public_key}\"]\n"),
    )
}

#[test]
fn the_debian_example_boots_runs_cloud_init_and_answers_ssh() {
    let image = image();
    let keys = tempfile::tempdir().unwrap();
    let key = keys.path().join("id_ed25519");
    let made = Command::new("ssh-keygen")
        .args([
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            "vmlauncher-e2e",
            "-f",
        ])
        .arg(&key)
        .status()
        .expect("ssh-keygen (openssh-client)");
    assert!(made.success());
    let public_key = std::fs::read_to_string(key.with_extension("pub")).unwrap();

    let port = free_port();
    // Until cloud-init's marker: then the guest only answers.
    let turn = common::debian_turn::debian_turn("debian");
    let mut pending = Launched::start_owned(|dir| {
        std::fs::create_dir_all(dir.join("container-disks")).unwrap();
        // The launcher opens a container disk only as itself, never through a link: the
        // image's own inode (a hard link), or a copy where the temp dir is on another
        // filesystem. It is only read: the guest writes to an overlay.
        let disk = dir.join("container-disks/disk_0.img");
        if std::fs::hard_link(&image, &disk).is_err() {
            std::fs::copy(&image, &disk).unwrap();
        }
    });
    let started = Instant::now();
    let mut vm = pending.run(
        &spec(public_key.trim()),
        // The harness runs every guest under TCG (this machine's /dev/kvm cannot boot one).
        &["--publish", &format!("{port}:22")],
    );
    vm.wait_stdout("phase Running", GUEST_DEADLINE);
    let mut console = vm.console();
    let deadline = started + BOOT_BOUND;
    // The getty's banner, printed right before the login prompt.
    console
        .wait_for("the login prompt", deadline, |l| {
            l.starts_with("Debian GNU/Linux 12 ")
        })
        .unwrap();
    eprintln!("login prompt {:.1?} after run", started.elapsed());
    let ready = console
        .wait_for("cloud-init's runcmd marker", deadline, |l| {
            l.starts_with("VMLAUNCHER-DEBIAN-READY")
        })
        .unwrap();
    eprintln!("{ready} ({:.1?} after run)", started.elapsed());
    drop(turn);
    assert!(
        ready.contains("uid=1000(debian)") && ready.contains("(sudo)"),
        "cloud-init did not make the user: {ready}"
    );

    // sshd on the published port: its banner, then a real login with the key.
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut banner = [0u8; 8];
    stream.read_exact(&mut banner).unwrap();
    assert_eq!(&banner, b"SSH-2.0-");
    drop(stream);
    let out = Command::new("ssh")
        .args(["-i"])
        .arg(&key)
        .args([
            "-p",
            &port.to_string(),
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "ConnectTimeout=30",
            "debian@127.0.0.1",
            "cloud-init status --long; echo RESULT; cat /run/cloud-init/result.json",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "ssh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("status: done"), "{stdout}");
    let (_, result) = stdout.split_once("RESULT\n").unwrap();
    let result: serde_json::Value = serde_json::from_str(result).unwrap();
    assert_eq!(result["v1"]["errors"], serde_json::json!([]), "{stdout}");
    assert!(
        result["v1"]["datasource"]
            .as_str()
            .unwrap_or("")
            .starts_with("DataSourceNoCloud"),
        "{stdout}"
    );

    // qemu-guest-agent starts early in the boot (udev, on its port): by now libvirt has seen it,
    // and the launcher's own status says so (the stream's first event is the whole status).
    agent_connected_in_status(&vm.socket(), deadline);

    vm.signal(nix::sys::signal::Signal::SIGTERM);
    vm.wait_stdout("phase Succeeded", Duration::from_secs(120));
    assert_eq!(vm.wait_exit(Duration::from_secs(60)).code(), Some(0));
}

/// Waits until `deadline` for the launcher's status to carry `AgentConnected`.
fn agent_connected_in_status(socket: &Path, deadline: Instant) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut events = common::EventWatcher::start(socket).await;
        let within = deadline.saturating_duration_since(Instant::now());
        events
            .wait_for("AgentConnected in the status", within, |e| {
                common::event_status(e).is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.r#type == "AgentConnected" && c.status)
                })
            })
            .await;
    });
}
