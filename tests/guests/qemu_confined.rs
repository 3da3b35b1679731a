//! QEMU is what a guest that escapes its virtual hardware controls. It runs as the host's QEMU
//! account (KubeVirt's uid 107 in the image), with no capabilities, under libvirt's seccomp
//! sandbox, in libvirt's mount namespace for the domain (a /dev of its own), and cannot open the launcher's socket, libvirtd's socket or the launcher's saved
//! state. A hostDisk that account cannot reach is refused before anything starts, naming the
//! field and the directory. A Sync attaches only the block devices the launcher was given.
//! Against the real binary, a real private libvirtd and a TCG guest.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::{guest_spec, ConsoleWait, Launched, Loop, GUEST_DEADLINE};
use vmlauncher::api::{self, proto};

/// `key:` of `/proc/PID/status`, its value trimmed.
fn status_of(pid: i32, key: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("no {key} in QEMU's status"))
        .trim()
        .to_string()
}

/// Whether a process with QEMU's credentials (`uid`, its own gid, no supplementary groups, no
/// capabilities) may open `path` for writing (a socket: connect to it), by `test -w`.
fn writable_by(uid: u32, path: &Path) -> bool {
    common::as_qemu(uid, &["test", "-w"], path)
}

/// How many bytes the launcher's HTTP/2 server answers to a client preface on `socket`, sent as
/// QEMU's `uid` (`None`: as this test, root); 0 when it closes the connection instead.
fn answer_bytes(uid: Option<u32>, socket: &Path) -> usize {
    const CLIENT: &str = r#"
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
s.connect(sys.argv[1])
try:
    s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
    answer = s.recv(100)
except (BrokenPipeError, ConnectionResetError):
    # Closed unanswered, before or after the preface.
    answer = b""
print(len(answer))
"#;
    let mut command = match uid {
        Some(uid) => {
            let mut c = common::qemu_command(uid);
            // The system's: root's PATH may lead into a home QEMU cannot enter.
            c.arg("/usr/bin/python3");
            c
        }
        None => std::process::Command::new("python3"),
    };
    let out = command
        .args(["-c", CLIENT])
        .arg(socket)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_runs_unprivileged_and_sandboxed_and_cannot_reach_the_launcher() {
    let name = "confined";
    let libvirt_qemu = nix::unistd::User::from_name("libvirt-qemu")
        .unwrap()
        .expect("scripts/setup.sh makes the libvirt-qemu account");
    let disks = common::disk_dir("vml-confined-");
    let disk = disks.path().join("data.img");
    common::sparse_file(&disk, 4);
    // Only this loop device may be attached.
    let given = Loop::new(disks.path(), "given", 2, false);
    let other = Loop::new(disks.path(), "other", 2, false);
    let mut vm = Launched::start(
        &guest_spec(name, "", &[("data", "Confined-1", &disk)]),
        &["--allow-block-device", &given.number()],
    );
    let mut console = vm.boot();
    console.line("the guest sees its host disk", GUEST_DEADLINE, |l| {
        l.contains("VMLTEST-SERIALS") && l.contains("serial=Confined-1")
    });

    let qemu = vm.qemu_pid(name);
    // An id of its own on a host (`--qemu-ids`' default range), recorded in the runtime dir,
    // with the same gid: not the host's shared QEMU account.
    let own = common::qemu_id_of(vm.dir());
    assert!((2_000_000_000..=2_000_065_535).contains(&own), "{own}");
    assert_ne!(own, libvirt_qemu.uid.as_raw());
    for key in ["Uid", "Gid"] {
        let ids = status_of(qemu, key);
        assert!(
            ids.split_whitespace().all(|id| id == own.to_string()),
            "QEMU's {key}: {ids}"
        );
    }
    // libvirt lists its primary group as its only supplementary one.
    assert_eq!(
        status_of(qemu, "Groups"),
        own.to_string(),
        "QEMU's supplementary groups"
    );
    for set in ["CapInh", "CapPrm", "CapEff", "CapAmb"] {
        assert_eq!(status_of(qemu, set), "0000000000000000", "QEMU's {set}");
    }
    assert_eq!(
        status_of(qemu, "Seccomp"),
        "2",
        "QEMU runs under a seccomp filter"
    );
    assert_eq!(status_of(qemu, "NoNewPrivs"), "1");
    // libvirt's mount namespace for the domain: a /dev of QEMU's own, with no host disk in it.
    let libvirtd = vm.pid_from("libvirt/libvirtd.pid").expect("libvirtd's pid");
    let mount_ns = |pid: i32| std::fs::read_link(format!("/proc/{pid}/ns/mnt")).unwrap();
    assert_ne!(
        mount_ns(qemu),
        mount_ns(libvirtd),
        "QEMU shares libvirtd's mount namespace"
    );
    let host_disks: Vec<String> = std::fs::read_dir(format!("/proc/{qemu}/root/dev"))
        .unwrap()
        .flatten()
        .filter(|e| std::os::unix::fs::FileTypeExt::is_block_device(&e.file_type().unwrap()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        host_disks,
        Vec::<String>::new(),
        "block devices in QEMU's /dev"
    );

    let own_id = own;
    for own in [
        vm.socket(),
        vm.dir().join("libvirt/sock/libvirt-sock"),
        vm.dir().join("last-sync.1.json"),
        vm.dir().join("libvirt/etc/qemu.conf"),
    ] {
        assert!(own.exists(), "{} exists", own.display());
        assert!(
            !writable_by(own_id, &own),
            "QEMU's user can write {}",
            own.display()
        );
    }

    // With the socket opened to everyone (as a deployment might), QEMU's user is still not
    // answered, while root is.
    std::fs::set_permissions(vm.socket(), std::fs::Permissions::from_mode(0o666)).unwrap();
    assert_eq!(
        answer_bytes(Some(own_id), &vm.socket()),
        0,
        "QEMU's user was answered"
    );
    assert!(answer_bytes(None, &vm.socket()) > 0, "root is answered");
    std::fs::set_permissions(vm.socket(), std::fs::Permissions::from_mode(0o600)).unwrap();

    // The block device it was not given is refused, naming it; the given one is attached.
    let mut client = api::connect(&vm.socket()).await.expect("gRPC socket");
    let spec = guest_spec(name, "", &[("data", "Confined-1", &disk)])
        .replace(
            "      disks:\n",
            "      disks:\n      - {name: blk, disk: {bus: scsi}, serial: Given-1}\n",
        )
        .replace(
            "  volumes:\n",
            "  volumes:\n  - {name: blk, persistentVolumeClaim: {claimName: blk, hotpluggable: true}}\n",
        );
    let refused = client
        .sync(proto::SyncRequest {
            spec: spec.clone(),
            block_devices: [("blk".to_string(), other.block_device())].into(),
            ..Default::default()
        })
        .await
        .expect_err("a device that was not given");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(
        refused.message().contains(&format!(
            "block device {} was not given to this launcher",
            other.number()
        )),
        "{}",
        refused.message()
    );
    client
        .sync(proto::SyncRequest {
            spec,
            block_devices: [("blk".to_string(), given.block_device())].into(),
            ..Default::default()
        })
        .await
        .expect("the given device");
    console.line(
        "the guest sees the given block device",
        GUEST_DEADLINE,
        |l| l.contains("VMLTEST-SERIALS") && l.contains("serial=Given-1"),
    );

    vm.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(vm.wait_exit(GUEST_DEADLINE).code(), Some(0));
}

#[test]
fn a_host_disk_qemu_cannot_reach_is_refused_before_anything_starts() {
    let closed = tempfile::tempdir().unwrap();
    std::fs::set_permissions(closed.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let disk = closed.path().join("data.img");
    common::sparse_file(&disk, 4);
    let mut vm = Launched::start(
        &guest_spec("unreachable", "", &[("data", "Data-1", &disk)]),
        &[],
    );
    let code = vm.wait_exit(GUEST_DEADLINE).code();
    let stderr = vm.stderr_text();
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("spec.volumes[0].hostDisk.path")
            && stderr.contains("cannot reach it")
            && stderr.contains(&format!("{} is 0700 0:0", closed.path().display())),
        "{stderr}"
    );
    assert!(
        !vm.dir().join("libvirt/libvirtd.pid").exists(),
        "no libvirtd was started"
    );
}
