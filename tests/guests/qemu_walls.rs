//! What a guest that escaped into QEMU can reach on a host, tried as the security review of
//! 2026-11-27 did: a process with QEMU's uid and gid, no other groups and no capabilities
//! (`setpriv`). It cannot rename or add anything in the launcher's private dir, so it cannot
//! make root (the launcher, libvirt) write or chown a host file through a link it placed: a
//! root-only sentinel keeps its owner, mode and content across a stop and a start (N-1). One
//! VM's QEMU cannot read another's RAM, cloud-init ISO or VNC console: each has an id of its own
//! (N-2). And no other local user reads a claim under the runtime dir the operator made 0700,
//! whose mode is the operator's again once the launcher ends (N-8).

use crate::common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command as Process;

use common::{guest_vmi, qemu_command, qemu_id_of, Launched, GUEST_DEADLINE};

/// The test guest with a cloud-init volume (a secret in its user data) and an empty disk: both
/// images the launcher makes in its private dir.
fn spec_with_secrets(name: &str) -> String {
    guest_vmi(
        name,
        "",
        "    devices:\n      disks:\n      - {name: ci, disk: {bus: scsi}, serial: CI-1}\n      - {name: scratch, disk: {bus: scsi}, serial: SCRATCH-1}\n",
        "  volumes:\n  - {name: ci, cloudInitNoCloud: {userData: \"#cloud-config\\npassword: VMLTEST-SECRET\\n\"}}\n  - {name: scratch, emptyDisk: {capacity: 16Mi}}\n",
    )
}

/// Runs `script` (sh) as QEMU's `uid`; its exit status.
fn sh_as(uid: u32, script: &str) -> bool {
    qemu_command(uid)
        .args(["/bin/sh", "-c", script])
        .status()
        .expect("setpriv")
        .success()
}

fn owner_mode(path: &Path) -> (u32, u32, u32) {
    let m = std::fs::symlink_metadata(path).unwrap();
    (m.uid(), m.gid(), m.mode() & 0o7777)
}

/// The VM's state after the client's `verb` (which must succeed).
fn state_after(vm: &Launched, verb: &str) -> String {
    let out = common::cli_ok(&vm.socket(), &[verb, "--output", "json"]);
    let reply: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    reply["status"]["vmState"].as_str().unwrap().to_string()
}

/// `getfacl`'s entries of `dir`, ids as numbers.
fn acl_of(dir: &Path) -> String {
    let out = Process::new("getfacl")
        .args(["--omit-header", "--numeric"])
        .arg(dir)
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn an_escaped_qemu_changes_nothing_root_works_in_and_a_root_file_keeps_its_owner() {
    let name = "walls-private";
    let mut vm = Launched::start(&spec_with_secrets(name), &["--run-strategy", "manual"]);
    vm.wait_stdout("api unix:", GUEST_DEADLINE);
    assert_eq!(state_after(&vm, "start"), "Active");
    let mut console = vm.console();
    common::wait_booted(&mut console);
    let uid = qemu_id_of(vm.dir());
    let private = vm.dir().join("private");
    let iso = private.join("cloud-init/ci.iso");
    // What it has: its images, given to it (not to a shared account), and search only.
    assert_eq!(owner_mode(&iso), (uid, uid, 0o600));
    assert_eq!(owner_mode(&private), (0, uid, 0o710));
    // The control: QEMU's uid reads its own ISO, so a refusal below is the dirs' doing.
    assert!(sh_as(
        uid,
        &format!("head -c 1 {} >/dev/null", iso.display())
    ));

    let sentinel_dir = tempfile::tempdir().unwrap();
    let sentinel = sentinel_dir.path().join("root-only");
    std::fs::write(&sentinel, "ROOT-ONLY-SENTINEL\n").unwrap();
    std::fs::set_permissions(&sentinel, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(sentinel_dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let before = owner_mode(&sentinel);
    assert_eq!(before, (0, 0, 0o600));

    // Each of the review's moves, and each of the private dir's places: all refused.
    let p = private.display();
    let s = sentinel.display();
    for attack in [
        format!("mv {p}/cloud-init {p}/.taken"),
        format!("mkdir {p}/cloud-init-2"),
        format!("ln -s {s} {p}/cloud-init/ci.iso.new && mv -f {p}/cloud-init/ci.iso.new {p}/cloud-init/ci.iso"),
        format!("rm -f {p}/cloud-init/ci.iso"),
        format!("ln -s {s} {p}/empty-disks/other.qcow2"),
        format!("mv {p}/empty-disks/scratch.qcow2 {p}/empty-disks/moved.qcow2"),
        format!("ln -s {s} {p}/nvram/default_{name}_VARS.fd"),
        format!("touch {p}/ephemeral-disks/x {p}/container-disks/x"),
        format!("rm -f {p}/virt-serial0"),
    ] {
        assert!(!sh_as(uid, &attack), "QEMU's uid could: {attack}");
    }

    // A stop and a start (what a power-off under `Always` does): libvirt, as root, works in the
    // private dir again; the guest boots; the sentinel is as it was.
    assert_eq!(state_after(&vm, "stop"), "Stopped");
    assert_eq!(state_after(&vm, "start"), "Active");
    common::wait_booted(&mut console);
    assert_eq!(owner_mode(&sentinel), before);
    assert_eq!(
        std::fs::read_to_string(&sentinel).unwrap(),
        "ROOT-ONLY-SENTINEL\n"
    );
    assert_eq!(
        owner_mode(&iso),
        (uid, uid, 0o600),
        "the ISO is still its own"
    );
    vm.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(vm.wait_exit(GUEST_DEADLINE).code(), Some(0));
}

/// Whether QEMU's `uid` may open `path` for reading (`/proc/PID/mem` included: the kernel's
/// ptrace check lets only the same uid in).
fn reads(uid: u32, path: &Path) -> bool {
    sh_as(uid, &format!("exec 3< {}", path.display()))
}

/// Whether QEMU's `uid` gets VNC's greeting from the socket `path`.
fn vnc_answers(uid: u32, path: &Path) -> bool {
    const CLIENT: &str = "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.settimeout(10)\ns.connect(sys.argv[1])\nsys.exit(0 if s.recv(12) == b'RFB 003.008\\n' else 1)\n";
    qemu_command(uid)
        .args(["/usr/bin/python3", "-c", CLIENT])
        .arg(path)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("setpriv")
        .success()
}

#[test]
fn one_vms_qemu_reaches_neither_the_ram_nor_the_secrets_nor_the_console_of_another() {
    let mut a = Launched::start(&spec_with_secrets("walls-a"), &[]);
    let mut b = Launched::start(&common::guest_spec("walls-b", "", &[]), &[]);
    a.boot();
    b.boot();
    let (a_id, b_id) = (qemu_id_of(a.dir()), qemu_id_of(b.dir()));
    assert_ne!(a_id, b_id, "two launchers, two QEMU ids");
    let mem = std::path::PathBuf::from(format!("/proc/{}/mem", a.qemu_pid("walls-a")));
    let iso = a.dir().join("private/cloud-init/ci.iso");
    let vnc = a.dir().join("qemu/virt-vnc");
    // A's own QEMU id reaches each of them: the controls.
    assert!(reads(a_id, &mem), "A's id opens A's memory");
    assert!(reads(a_id, &iso), "A's id reads A's ISO");
    assert!(vnc_answers(a_id, &vnc), "A's id gets A's VNC greeting");
    // B's does not.
    assert!(!reads(b_id, &mem), "B's QEMU opened A's guest RAM");
    assert!(!reads(b_id, &iso), "B's QEMU read A's cloud-init data");
    assert!(!vnc_answers(b_id, &vnc), "B's QEMU reached A's VNC console");
    for vm in [&mut a, &mut b] {
        vm.signal(nix::sys::signal::Signal::SIGTERM);
        assert_eq!(vm.wait_exit(GUEST_DEADLINE).code(), Some(0));
    }
}

#[test]
fn no_other_user_reads_a_claim_in_a_0700_runtime_dir_which_keeps_its_mode() {
    let claim = "vmi-disks/data/disk.img";
    let mut vm = Launched::start_owned(|dir| {
        let image = dir.join(claim);
        std::fs::create_dir_all(image.parent().unwrap()).unwrap();
        std::fs::write(&image, "TENANT-DISK-CONTENT\n").unwrap();
        std::fs::set_permissions(&image, std::fs::Permissions::from_mode(0o644)).unwrap();
        for sub in ["vmi-disks", "vmi-disks/data"] {
            std::fs::set_permissions(dir.join(sub), std::fs::Permissions::from_mode(0o755))
                .unwrap();
        }
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    })
    .run(
        &guest_vmi(
            "walls-claim",
            "",
            "    devices:\n      disks:\n      - {name: data, disk: {bus: scsi}, serial: DATA-1}\n",
            "  volumes:\n  - {name: data, persistentVolumeClaim: {claimName: data}}\n",
        ),
        &[],
    );
    vm.boot();
    let dir = vm.dir().to_path_buf();
    let image = dir.join(claim);
    let nobody = 65534;
    // The control: the file itself is readable to anyone who reaches it.
    assert_eq!(owner_mode(&image).2, 0o644);
    assert!(!reads(nobody, &image), "another user read the claim");
    // Only QEMU's id passes through: the ACL's one named entry; the owning group's and others'
    // bits are still none.
    let acl = acl_of(&dir);
    let qemu = qemu_id_of(&dir);
    for entry in [
        "user::rwx".to_string(),
        format!("user:{qemu}:--x"),
        "group::---".to_string(),
        "other::---".to_string(),
    ] {
        assert!(acl.lines().any(|l| l == entry), "{entry} in\n{acl}");
    }
    vm.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(vm.wait_exit(GUEST_DEADLINE).code(), Some(0));
    assert_eq!(owner_mode(&dir).2, 0o700, "the operator's mode again");
    let acl = acl_of(&dir);
    assert!(!acl.contains(&format!("user:{qemu}")), "{acl}");
}

/// swtpm runs as the VM's QEMU id and its state dir is that id's; libvirt, as root, chowns
/// every "regular file" there at each start, following links (`virFileChownFiles`). A link to
/// a root-only file that an escaped QEMU puts there (from QEMU's own mount namespace, where the
/// dir is `/var/lib/libvirt/swtpm/<uuid>/tpm2`) is gone before the next start, whose guest
/// still finds its TPM; the file keeps its owner, mode and content.
#[test]
fn a_link_an_escaped_qemu_puts_in_the_tpm_state_never_gives_it_the_file() {
    const UUID: &str = "2f1d0a8e-6c1b-4e55-9a34-5b0f6f7c1a0c";
    let name = "walls-tpm";
    let text = guest_vmi(
        name,
        "",
        "    devices:\n      autoattachGraphicsDevice: false\n      tpm: {persistent: true}\n",
        "",
    )
    .replace(
        "    firmware:\n",
        &format!("    firmware:\n      uuid: {UUID}\n"),
    );
    let mut vm = Launched::start(&text, &["--run-strategy", "manual"]);
    vm.wait_stdout("api unix:", GUEST_DEADLINE);
    assert_eq!(state_after(&vm, "start"), "Active");
    let mut console = vm.console();
    let tpm = |console: &mut vmlauncher::console::ConsoleLog| {
        common::ConsoleWait::line(console, "the guest's TPM report", GUEST_DEADLINE, |l| {
            l == "VMLTEST-TPM tpm0"
        })
    };
    tpm(&mut console);
    assert_eq!(state_after(&vm, "stop"), "Stopped");

    let sentinel_dir = tempfile::tempdir().unwrap();
    let sentinel = sentinel_dir.path().join("root-only");
    std::fs::write(&sentinel, "ROOT-ONLY-SENTINEL\n").unwrap();
    std::fs::set_permissions(&sentinel, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(sentinel_dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let uid = qemu_id_of(vm.dir());
    let libvirtd = std::fs::read_to_string(vm.dir().join("libvirt/libvirtd.pid")).unwrap();
    let planted = format!("/var/lib/libvirt/swtpm/{UUID}/tpm2/planted");
    let out = Process::new("nsenter")
        .args(["-t", libvirtd.trim(), "-m", "--"])
        .args(qemu_command_line(uid))
        .args(["ln", "-s"])
        .arg(&sentinel)
        .arg(&planted)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "QEMU's id could not put the link in its TPM state: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let state = vm.dir().join(format!("libvirt/lib/swtpm/{UUID}/tpm2"));
    assert!(std::fs::symlink_metadata(state.join("planted")).is_ok());

    assert_eq!(state_after(&vm, "start"), "Active");
    tpm(&mut console);
    assert_eq!(owner_mode(&sentinel), (0, 0, 0o600));
    assert_eq!(
        std::fs::read_to_string(&sentinel).unwrap(),
        "ROOT-ONLY-SENTINEL\n"
    );
    assert!(std::fs::symlink_metadata(state.join("planted")).is_err());
    vm.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(vm.wait_exit(GUEST_DEADLINE).code(), Some(0));
}

/// [`qemu_command`]'s program and arguments, for another program to run (`nsenter`).
fn qemu_command_line(uid: u32) -> Vec<std::ffi::OsString> {
    let c = qemu_command(uid);
    std::iter::once(c.get_program().to_owned())
        .chain(c.get_args().map(ToOwned::to_owned))
        .collect()
}
