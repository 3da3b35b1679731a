//! The README's real OS: `examples/debian.yaml` boots the Debian 12 image that
//! `scripts/build-debian-image.sh` builds (a containerDisk; TCG on this machine), cloud-init
//! creates the user and runs its command, and sshd answers on the published port — proven by
//! logging in over SSH with a key the test made and reading cloud-init's own result file; the
//! image's qemu-guest-agent connects, and the launcher's status shows `AgentConnected`.
//! The same image under `vmlauncher virt-launcher` answers KubeVirt's guest agent calls
//! (`GetGuestInfo`, `GetUsers`, `GetFilesystems`) and a freeze/unfreeze round trip.
//! Each test one boot, bounded (the getty's banner within 4 minutes); one boot at a time.

mod common;

use std::io::Read;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::net::free_port;
use common::{Launched, GUEST_DEADLINE};

const BOOT_BOUND: Duration = Duration::from_secs(240);

/// Two Debian boots at once under TCG on a small machine would miss their bounds.
static ONE_BOOT_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_boot_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_BOOT_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

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
    let _boot = one_boot_at_a_time();
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

/// The Debian image as KubeVirt runs it: a containerDisk and a NoCloud seed under `vmlauncher
/// virt-launcher`, driven over the cmd socket as virt-handler drives it. cloud-init names the
/// host and logs root in on a pseudo-terminal (a utmp entry: a user for `GetUsers`).
#[test]
fn the_debian_agent_answers_kubevirts_guest_calls_and_freezes() {
    let _boot = one_boot_at_a_time();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(agent_calls());
}

async fn agent_calls() {
    use common::kubevirt::{cmd_client, vmi_request, PodDirs, VirtLauncher};
    use common::kubevirt_notify::NotifyRecorder;
    use vmlauncher::kubevirt::proto::cmd::EmptyRequest;

    let dirs = PodDirs::new();
    let disk = dirs.root.path().join("container-disks/disk_0.img");
    if std::fs::hard_link(image(), &disk).is_err() {
        std::fs::copy(image(), &disk).unwrap();
    }
    let (name, namespace, uid) = ("agentvm", "kvtest", "6a0f2c1e-3b4d-4e5f-8a9b-0c1d2e3f4a5b");
    let mut notify = NotifyRecorder::serve(&dirs.share());
    let mut launcher = VirtLauncher::start(&dirs, &dirs.flags(name, namespace, uid));
    let socket = tokio::task::block_in_place(|| launcher.wait_serving(&dirs));
    let mut client = cmd_client(&socket).await;
    let started = Instant::now();
    let vmi = debian_vmi(name, namespace, uid).to_string().into_bytes();
    let synced = client.sync_virtual_machine(vmi_request(vmi)).await;
    let synced = synced.expect("SyncVirtualMachine").into_inner();
    assert!(synced.success, "{synced:?}; {}", launcher.stderr_text());

    let mut console =
        vmlauncher::console::ConsoleLog::from_start(&dirs.runtime().join("console.log"))
            .expect("the console log");
    let deadline = started + BOOT_BOUND;
    let ready = tokio::task::block_in_place(|| {
        console.wait_for("cloud-init's runcmd marker", deadline, |l| {
            l.starts_with("VMLAUNCHER-AGENT-READY")
        })
    })
    .unwrap();
    eprintln!("{ready} ({:.1?} after the Sync)", started.elapsed());
    tokio::task::block_in_place(|| {
        let within = deadline.saturating_duration_since(Instant::now());
        notify.domain("the agent connected", within, |_, d| {
            d["Spec"]["Devices"]["Channels"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["Target"]["State"] == "connected"))
        })
    });

    let info = client.get_guest_info(EmptyRequest {}).await.unwrap();
    let info: serde_json::Value =
        serde_json::from_str(&info.into_inner().guest_info_response).unwrap();
    assert_eq!(info["hostname"], "agentvm", "{info:#}");
    assert_eq!(info["os"]["name"], "Debian GNU/Linux", "{info:#}");
    assert_eq!(info["os"]["versionId"], "12", "{info:#}");
    let users = guest_list(client.get_users(EmptyRequest {}).await);
    assert!(users.iter().any(|u| u["userName"] == "root"), "{users:#?}");
    let root = root_filesystem(&mut client).await;
    assert_eq!(root["fileSystemType"], "ext4", "{root:#}");
    assert!(root["totalBytes"].as_u64().unwrap_or(0) > 0, "{root:#}");

    freeze_round_trip(&mut client).await;

    launcher.signal(nix::sys::signal::Signal::SIGTERM);
    let status = launcher.wait_exit(Duration::from_secs(120));
    assert_eq!(status.code(), Some(0), "{}", launcher.stderr_text());
}

type CmdClient = vmlauncher::kubevirt::proto::cmd::cmd_client::CmdClient<tonic::transport::Channel>;

/// A `GetUsers` or `GetFilesystems` answer as its JSON list.
fn guest_list<T: GuestList>(
    answer: Result<tonic::Response<T>, tonic::Status>,
) -> Vec<serde_json::Value> {
    let text = answer.expect("the call").into_inner().list();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

trait GuestList {
    fn list(self) -> String;
}

impl GuestList for vmlauncher::kubevirt::proto::cmd::GuestUserListResponse {
    fn list(self) -> String {
        self.guest_user_list_response
    }
}

impl GuestList for vmlauncher::kubevirt::proto::cmd::GuestFilesystemsResponse {
    fn list(self) -> String {
        self.guest_filesystems_response
    }
}

/// The guest's `/` as `GetFilesystems` lists it, if the agent lists it.
async fn listed_root(client: &mut CmdClient) -> Option<serde_json::Value> {
    use vmlauncher::kubevirt::proto::cmd::EmptyRequest;
    let filesystems = guest_list(client.get_filesystems(EmptyRequest {}).await);
    filesystems.into_iter().find(|f| f["mountPoint"] == "/")
}

async fn root_filesystem(client: &mut CmdClient) -> serde_json::Value {
    listed_root(client).await.expect("GetFilesystems lists /")
}

/// `Status.FSFreezeStatus.Status` of the domain `GetDomain` answers.
async fn freeze_status(client: &mut CmdClient) -> serde_json::Value {
    use vmlauncher::kubevirt::proto::cmd::EmptyRequest;
    let domain = client
        .get_domain(EmptyRequest {})
        .await
        .unwrap()
        .into_inner();
    let domain: serde_json::Value = serde_json::from_str(&domain.domain).unwrap();
    domain["Status"]["FSFreezeStatus"]["Status"].clone()
}

/// Freeze, then unfreeze, as virt-handler asks for a snapshot. While frozen the agent refuses
/// what is not freeze-related (qemu-ga's own rule): `GetFilesystems` finds nothing, which shows
/// the guest itself is frozen; after the thaw it lists `/` again.
async fn freeze_round_trip(client: &mut CmdClient) {
    use vmlauncher::kubevirt::proto::cmd::{FreezeRequest, Vmi, VmiRequest};
    let vmi = || {
        Some(Vmi {
            vmi_json: b"{}".to_vec(),
        })
    };
    let request = FreezeRequest {
        vmi: vmi(),
        unfreeze_timeout_seconds: 120,
    };
    let frozen = client
        .freeze_virtual_machine(request)
        .await
        .unwrap()
        .into_inner();
    assert!(frozen.success, "{frozen:?}");
    assert_eq!(freeze_status(client).await, "frozen");
    assert_eq!(
        listed_root(client).await,
        None,
        "the agent answers while frozen"
    );
    let request = VmiRequest {
        vmi: vmi(),
        options: None,
    };
    let thawed = client
        .unfreeze_virtual_machine(request)
        .await
        .unwrap()
        .into_inner();
    assert!(thawed.success, "{thawed:?}");
    assert_eq!(freeze_status(client).await, "thawed");
    root_filesystem(client).await;
}

/// The VMI virt-handler would send for the image: its disk, and a seed whose runcmd logs root in
/// on a pseudo-terminal (kept open by a `sleep` feeding it), then prints a marker once `who`
/// shows the login.
fn debian_vmi(name: &str, namespace: &str, uid: &str) -> serde_json::Value {
    let user_data = r#"#cloud-config
hostname: agentvm
runcmd:
- [sh, -c, "(sleep 3600 | script -qfc 'login -f root' /dev/null >/dev/null 2>&1 &); for i in $(seq 100); do who | grep -q root && break; sleep 0.2; done; echo VMLAUNCHER-AGENT-READY $(who | head -n1) > /dev/ttyS0"]
"#;
    serde_json::json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {
            "terminationGracePeriodSeconds": 30,
            "domain": {
                "memory": {"guest": "1Gi"},
                "devices": {
                    "autoattachGraphicsDevice": false,
                    "disks": [
                        {"name": "root", "disk": {"bus": "virtio"}, "bootOrder": 1},
                        {"name": "cloudinit", "disk": {"bus": "virtio"}},
                    ],
                },
            },
            "volumes": [
                {"name": "root", "containerDisk": {"image": "vmlauncher/debian-12"}},
                {"name": "cloudinit", "cloudInitNoCloud": {"userData": user_data}},
            ],
        },
        "status": {"phase": "Scheduled"},
    })
}
