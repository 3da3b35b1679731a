//! The host's own files a spec names (`hostDisk.path`, `kernelPath`, `initrdPath`) keep their
//! owner and mode before, while and after the VM runs, and are opened by the launcher again at
//! every start: a hostDisk its directory's owner swapped for a link between two boots is refused
//! at the second start, naming the field, and the link's target is untouched; a hostDisk in a
//! directory others may write is refused, naming the field (security review N-3, N-5). Against
//! the real binary, a real private libvirtd and a TCG guest.

use crate::common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use common::{guest_spec, ConsoleWait, Launched, GUEST_DEADLINE};

/// nobody:nogroup on Debian: a local user who owns a VM's disk and its directory.
const NOBODY: u32 = 65534;
const SENTINEL: &[u8] = b"ROOT-ONLY-SENTINEL\n";

/// `(uid, gid, mode)` of `path`, not following a link.
fn owner_mode(path: &Path) -> (u32, u32, u32) {
    let m = std::fs::symlink_metadata(path).unwrap();
    (m.uid(), m.gid(), m.mode() & 0o7777)
}

fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A dir `nobody` owns (0755) in a root-owned 0755 temp dir, with `disk.img` (16 MiB sparse)
/// `nobody:nogroup 0640` in it: a user's disk, as the review's `alice/disk.img`.
fn users_disk(top: &Path) -> std::path::PathBuf {
    let dir = top.join("alice");
    std::fs::create_dir(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(NOBODY), Some(NOBODY)).unwrap();
    let disk = dir.join("disk.img");
    common::sparse_file(&disk, 16);
    std::os::unix::fs::chown(&disk, Some(NOBODY), Some(NOBODY)).unwrap();
    set_mode(&disk, 0o640);
    disk
}

/// Runs `script` with `sh -c` as `nobody:nogroup`, no supplementary groups (`setpriv`).
fn as_nobody(script: &str) -> std::process::Output {
    std::process::Command::new("setpriv")
        .args([
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            "sh",
            "-c",
            script,
        ])
        .output()
        .expect("setpriv")
}

/// A verb of the client through the launcher's socket: exit code and stderr.
fn verb(vm: &Launched, verb: &str) -> (Option<i32>, String) {
    let out = std::process::Command::new(common::bin())
        .arg(verb)
        .arg("--socket")
        .arg(vm.socket())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Waits for the test guest to report the disk of serial `Data-1`, 16 MiB (32768 sectors): the
/// user's image, not another file.
fn sees_the_disk(console: &mut vmlauncher::console::ConsoleLog) {
    console.line("the guest's disks", GUEST_DEADLINE, |l| {
        l.starts_with("VMLTEST-DISKS ") && l.contains(":Data-1:32768")
    });
}

#[test]
fn a_host_disk_swapped_for_a_link_between_two_boots_is_refused_and_its_target_untouched() {
    let name = "hostdisk-swap";
    let top = common::disk_dir("vml-e2e-hostfiles-");
    let disk = users_disk(top.path());
    let secret = common::disk_dir("vml-e2e-sentinel-");
    let sentinel = secret.path().join("root-only-sentinel");
    std::fs::write(&sentinel, SENTINEL).unwrap();
    set_mode(&sentinel, 0o600);

    let spec = guest_spec(name, "", &[("data", "Data-1", &disk)]);
    let mut vm = Launched::start(&spec, &["--run-strategy", "manual"]);
    vm.wait_stdout("api unix:", GUEST_DEADLINE);
    let (code, stderr) = verb(&vm, "start");
    assert_eq!(code, Some(0), "first start: {stderr}");
    let mut console = vm.console();
    common::wait_booted(&mut console);
    // The guest has the user's disk, and the disk is still the user's.
    sees_the_disk(&mut console);
    assert_eq!(owner_mode(&disk), (NOBODY, NOBODY, 0o640));
    let (code, stderr) = verb(&vm, "stop");
    assert_eq!(code, Some(0), "stop: {stderr}");

    // Between the two boots, the directory's owner puts a link to a root-only file in its place.
    let swap = format!(
        "ln -s {s} {d}.new && mv -T {d}.new {d}",
        s = sentinel.display(),
        d = disk.display()
    );
    let out = as_nobody(&swap);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(std::fs::symlink_metadata(&disk)
        .unwrap()
        .file_type()
        .is_symlink());

    let (code, stderr) = verb(&vm, "start");
    assert_eq!(code, Some(6), "the second start must be refused: {stderr}");
    assert!(stderr.contains("spec.volumes[0].hostDisk.path"), "{stderr}");
    assert!(stderr.contains("symbolic link"), "{stderr}");
    assert_eq!(owner_mode(&sentinel), (0, 0, 0o600));
    assert_eq!(std::fs::read(&sentinel).unwrap(), SENTINEL);

    vm.signal(nix::sys::signal::Signal::SIGTERM);
    vm.wait_exit(GUEST_DEADLINE);
    assert_eq!(owner_mode(&sentinel), (0, 0, 0o600));
    assert_eq!(std::fs::read(&sentinel).unwrap(), SENTINEL);
}

#[test]
fn a_users_host_disk_and_the_kernel_keep_their_owner_and_mode_while_and_after_the_vm_runs() {
    let name = "hostfiles-owner";
    let top = common::disk_dir("vml-e2e-hostfiles-");
    let disk = users_disk(top.path());
    // A kernel and an initrd of the test's own (the shared test guest's are every test's):
    // nobody's, as an operator's files might be, with modes QEMU's user could not write.
    let boot = top.path().join("guest");
    std::fs::create_dir(&boot).unwrap();
    let mut expected = Vec::new();
    for (file, mode) in [("vmlinuz", 0o644), ("initrd.img", 0o640)] {
        let path = boot.join(file);
        std::fs::copy(common::guest_dir().join(file), &path).unwrap();
        std::os::unix::fs::chown(&path, Some(NOBODY), Some(NOBODY)).unwrap();
        set_mode(&path, mode);
        expected.push((path, (NOBODY, NOBODY, mode)));
    }
    expected.push((disk.clone(), (NOBODY, NOBODY, 0o640)));
    let check = |when: &str| {
        for (path, owner) in &expected {
            assert_eq!(owner_mode(path), *owner, "{} {when}", path.display());
        }
    };
    check("before");
    let devices = "    devices:\n      disks:\n      - name: data\n        disk: {bus: scsi}\n        serial: Data-1\n";
    let volumes = format!(
        "  volumes:\n  - name: data\n    hostDisk: {{path: {}, type: Disk}}\n",
        disk.display()
    );
    let spec = common::guest_vmi_from(&boot, name, "", devices, &volumes);
    let mut vm = Launched::start(&spec, &[]);
    let mut console = vm.boot();
    sees_the_disk(&mut console);
    check("while the VM runs");
    vm.terminate_ok();
    check("after the VM");
    // Still readable to its owner.
    let out = as_nobody(&format!("head -c 512 {} > /dev/null", disk.display()));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_host_disk_in_a_directory_others_may_write_is_refused_naming_the_field() {
    let name = "hostdisk-shared-dir";
    let top = common::disk_dir("vml-e2e-hostfiles-");
    // Sticky or not, others than root and the owner may write it.
    let shared = top.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    set_mode(&shared, 0o1777);
    let disk = shared.join("disk.img");
    common::sparse_file(&disk, 16);
    let before = owner_mode(&disk);
    let mut vm = Launched::start(&guest_spec(name, "", &[("data", "Data-1", &disk)]), &[]);
    let code = vm.wait_exit(GUEST_DEADLINE).code();
    let stderr = vm.stderr_text();
    assert_eq!(code, Some(4), "{stderr}");
    assert!(stderr.contains("spec.volumes[0].hostDisk.path"), "{stderr}");
    assert!(
        stderr.contains("writable by others than root and its owner"),
        "{stderr}"
    );
    assert_eq!(owner_mode(&disk), before);
}

/// A hostDisk a Sync attaches to the running VM reaches QEMU by its path (libvirt 9.0 passes
/// no descriptor on hot-plug): a user's image that grants QEMU access is attached and keeps its
/// owner and mode, while and after; one whose mode keeps QEMU out is refused, naming QEMU's
/// user and the mode, and stays as it was. No owner is changed to make either work.
#[test]
fn a_host_disk_attached_by_a_sync_keeps_its_owner_and_one_qemu_may_not_open_is_refused() {
    let top = tempfile::tempdir().unwrap();
    set_mode(top.path(), 0o755);
    let granted = users_disk(top.path());
    set_mode(&granted, 0o666);
    let closed = top.path().join("closed.img");
    common::sparse_file(&closed, 4);
    set_mode(&closed, 0o600);
    let name = "host-hotplug";
    let mut vm = Launched::start(&guest_spec(name, "", &[]), &[]);
    let mut console = vm.boot();
    let with_disks = guest_spec(
        name,
        "",
        &[
            ("granted", "Granted-1", &granted),
            ("closed", "Closed-1", &closed),
        ],
    );
    let file = top.path().join("sync.yaml");
    std::fs::write(&file, &with_disks).unwrap();
    let out = std::process::Command::new(common::bin())
        .args([
            "sync",
            file.to_str().unwrap(),
            "--output",
            "json",
            "--socket",
        ])
        .arg(vm.socket())
        .output()
        .unwrap();
    // A volume that failed makes the Sync's exit non-zero; its reply says which and why.
    assert!(!out.status.success());
    let reply: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let volume = |name: &str| {
        reply["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .unwrap()
            .clone()
    };
    assert_eq!(volume("granted")["phase"], "Ready", "{reply}");
    console.line("the guest sees the granted disk", GUEST_DEADLINE, |l| {
        l.contains("VMLTEST-SERIALS") && l.contains("serial=Granted-1")
    });
    let closed_status = volume("closed");
    assert_eq!(closed_status["phase"], "Failed", "{closed_status}");
    assert_eq!(closed_status["reason"], "QemuMayNotOpen", "{closed_status}");
    let qemu = common::qemu_id_of(vm.dir());
    let message = closed_status["message"].as_str().unwrap();
    assert!(
        message.contains(&format!(
            "0600 0:0: QEMU's user {qemu} may not read and write it"
        )),
        "{message}"
    );
    assert_eq!(
        owner_mode(&granted),
        (NOBODY, NOBODY, 0o666),
        "while attached"
    );
    assert_eq!(owner_mode(&closed), (0, 0, 0o600));
    vm.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(vm.wait_exit(GUEST_DEADLINE).code(), Some(0));
    assert_eq!(
        owner_mode(&granted),
        (NOBODY, NOBODY, 0o666),
        "after the VM"
    );
    assert_eq!(owner_mode(&closed), (0, 0, 0o600));
}

/// A hostDisk that is a block device (a node for a loop device in a user's directory: `/dev`
/// itself is no hostDisk's) keeps its owner and mode: libvirt 9.0 passes no descriptor for a
/// block device, so QEMU opens it by its path as its own user, and libvirt never relabels it
/// (security review N-5: the node was QEMU's for the VM's life and `root:root` after). A node
/// whose mode keeps QEMU's user out is refused at the start, naming the field and the user;
/// one that lets it in reaches the guest, and keeps its owner and mode while and after.
#[test]
fn a_block_device_host_disk_keeps_its_owner_and_mode_and_one_qemu_may_not_open_is_refused() {
    let name = "hostdisk-block";
    let scratch = common::disk_dir("vml-e2e-hostblock-");
    let lo = common::Loop::new(scratch.path(), "hostdisk", 16, false);
    let disk_group = nix::unistd::Group::from_name("disk")
        .unwrap()
        .expect("a disk group")
        .gid
        .as_raw();
    let node = scratch.path().join("data.blk");
    nix::sys::stat::mknod(
        &node,
        nix::sys::stat::SFlag::S_IFBLK,
        nix::sys::stat::Mode::from_bits_truncate(0o660),
        nix::sys::stat::makedev(lo.major.into(), lo.minor.into()),
    )
    .unwrap();
    std::os::unix::fs::chown(&node, Some(NOBODY), Some(disk_group)).unwrap();
    set_mode(&node, 0o660);
    let spec = guest_spec(name, "", &[("data", "Data-1", &node)]);

    let mut closed = Launched::start(&spec, &[]);
    let code = closed.wait_exit(GUEST_DEADLINE).code();
    let stderr = closed.stderr_text();
    assert_eq!(code, Some(4), "{stderr}");
    assert!(stderr.contains("spec.volumes[0].hostDisk.path"), "{stderr}");
    assert!(stderr.contains("QEMU's user"), "{stderr}");
    assert_eq!(owner_mode(&node), (NOBODY, disk_group, 0o660));
    drop(closed);

    set_mode(&node, 0o666);
    let expected = (NOBODY, disk_group, 0o666);
    let mut vm = Launched::start(&spec, &[]);
    let mut console = vm.boot();
    sees_the_disk(&mut console);
    assert_eq!(owner_mode(&node), expected, "while the VM runs");
    vm.terminate_ok();
    assert_eq!(owner_mode(&node), expected, "after the VM");
}
