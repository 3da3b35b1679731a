//! The command-line contract (`docs/DESIGN.md` §6) on the real binary: validate, convert, and a
//! `run` with a bad spec, which must fail before touching any hypervisor.

use crate::common;

use std::path::Path;
use std::process::Command;

fn vmlauncher(args: &[&str], stdin: Option<&str>) -> std::process::Output {
    use std::io::Write;
    let mut child = Command::new(common::bin())
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.unwrap_or("").as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

const BAD: &str = r#"apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: bad}
spec:
  domain:
    memory: {guest: 128Mi}
    devices:
      disks:
      - {name: a, disk: {bus: scsi}, serial: "0123456789012345678901234567890123456"}
      - {name: b, disk: {bus: floppy}}
  volumes:
  - {name: a, hostDisk: {path: /a.img, type: Disk}}
  - {name: b, hostDisk: {path: /b.img, type: Disk}}
"#;

#[test]
fn validate_accepts_the_bundled_example() {
    let out = vmlauncher(
        &[
            "validate",
            concat!(env!("CARGO_MANIFEST_DIR"), "/examples/testguest-vmi.yaml"),
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn validate_names_every_bad_field_and_exits_2() {
    let out = vmlauncher(&["validate", "-"], Some(BAD));
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr
            .contains("spec.domain.devices.disks[0].serial: 37 characters, at most 36 on bus scsi"),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "spec.domain.devices.disks[1].disk.bus: bus \"floppy\" is not valid for a disk"
        ),
        "{stderr}"
    );
}

#[test]
fn malformed_yaml_and_json_are_named() {
    let out = vmlauncher(
        &["validate", "-"],
        Some("apiVersion: kubevirt.io/v1\nkind: [\n"),
    );
    assert_eq!(out.status.code(), Some(2));
    let out = vmlauncher(
        &["validate", "-"],
        Some(
            r#"{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineInstance","metadata":{"name":"x"},"spec":{"domain":{},"nodeSelectr":{}}}"#,
        ),
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("spec.nodeSelectr: unknown field `nodeSelectr`"),
        "{stderr}"
    );
}

#[test]
fn run_with_a_bad_spec_fails_before_reaching_libvirt() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("bad.yaml");
    std::fs::write(&spec, BAD).unwrap();
    let rt = dir.path().join("rt");
    let out = vmlauncher(
        &[
            "run",
            spec.to_str().unwrap(),
            "--runtime-dir",
            rt.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("disks[0].serial"));
    assert!(!rt.exists(), "a bad spec must not create anything");
}

/// `vmlauncher run` of the example on runtime dir `rt` with `extra` options, expected to be
/// refused as input before anything starts: its standard error.
fn run_refused(rt: &Path, extra: &[&str]) -> String {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/testguest-vmi.yaml");
    let mut args = vec!["run", example, "--runtime-dir", rt.to_str().unwrap()];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--emulation", "tcg"]);
    let out = vmlauncher(&args, None);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    stderr
}

/// A runtime dir that is not the launcher's own (here a symlink to a directory, which whoever
/// planted it could point anywhere) is refused before anything is started, as input, naming
/// the option; the target is untouched.
#[test]
fn run_refuses_a_runtime_dir_that_is_a_symlink() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("elsewhere");
    std::fs::create_dir(&target).unwrap();
    let rt = dir.path().join("rt");
    std::os::unix::fs::symlink(&target, &rt).unwrap();
    let stderr = run_refused(&rt, &[]);
    assert!(stderr.contains("--runtime-dir:"), "{stderr}");
    assert!(stderr.contains("not a directory"), "{stderr}");
    assert_eq!(std::fs::read_dir(&target).unwrap().count(), 0);
}

/// `--socket` naming a file that is not a socket (here a regular file) is refused
/// before anything starts, as input naming the option, and the file is left as it was.
#[test]
fn run_refuses_a_socket_path_that_is_a_regular_file() {
    let dir = tempfile::tempdir().unwrap();
    let precious = dir.path().join("precious");
    std::fs::write(&precious, "keep me").unwrap();
    let rt = dir.path().join("rt");
    let stderr = run_refused(&rt, &["--socket", precious.to_str().unwrap()]);
    assert!(stderr.contains("--socket: cannot listen on"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep me");
    assert!(!rt.join("libvirt").exists(), "no libvirtd was started");
}

/// A VMI whose one disk is the hostDisk at `path`.
fn host_disk_spec(path: &Path) -> String {
    format!(
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata: {{name: links}}\nspec:\n  terminationGracePeriodSeconds: 0\n  domain:\n    memory: {{guest: 128Mi}}\n    devices:\n      disks:\n      - {{name: a, disk: {{bus: scsi}}}}\n  volumes:\n  - {{name: a, hostDisk: {{path: {}, type: Disk}}}}\n",
        path.display()
    )
}

/// `vmlauncher run SPEC` on runtime dir `rt` with `extra` options, expected to end by itself
/// (refused): exit code and stderr. A launcher that took the spec and started its VM instead is
/// stopped (SIGTERM: it takes its libvirtd and QEMU with it) and the test fails.
fn run_spec(spec: &str, rt: &Path, extra: &[&str]) -> (Option<i32>, String) {
    use std::io::Read;
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), spec).unwrap();
    let mut child = Command::new(common::bin())
        .arg("run")
        .arg(file.path())
        .arg("--runtime-dir")
        .arg(rt)
        .args(["--emulation", "tcg"])
        .args(extra)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        let _ = tx.send(text);
    });
    // A refusal comes before any daemon starts: well within this even in a debug build.
    match rx.recv_timeout(std::time::Duration::from_secs(60)) {
        Ok(text) => (child.wait().unwrap().code(), text),
        Err(_) => {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let _ = child.wait();
            panic!("vmlauncher run took the spec and kept running");
        }
    }
}

/// A hostDisk whose text names an innocent place, through a link into the launcher's runtime
/// dir (its saved Sync, records, libvirt's state): refused as a bad spec once the link is
/// followed, naming the field, before any libvirtd is started.
#[test]
fn run_refuses_a_host_disk_that_leads_into_the_runtime_dir() {
    let dir = tempfile::tempdir().unwrap();
    let rt = dir.path().join("rt");
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    // Dangling until the launcher makes its runtime dir, as it does before the check.
    std::os::unix::fs::symlink(&rt, data.join("state")).unwrap();
    let disk = data.join("state/last-sync.1.json");
    let (code, stderr) = run_spec(&host_disk_spec(&disk), &rt, &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "spec.volumes[0].hostDisk.path: {:?} leads to",
            disk.display().to_string()
        )),
        "{stderr}"
    );
    assert!(stderr.contains("the launcher's own state"), "{stderr}");
    assert!(!rt.join("libvirt").exists(), "no libvirtd was started");
    assert!(!rt.join("last-sync.1.json").exists());
}

/// A persistent TPM on a libvirtd shared with other VMs (`--connect`): its state would be kept
/// there by the domain's UUID, which any spec may name. Refused as a bad spec, naming the field,
/// before anything connects; the same spec on the launcher's own libvirtd is another test's.
#[test]
fn run_refuses_a_persistent_tpm_on_a_shared_libvirtd() {
    let dir = tempfile::tempdir().unwrap();
    let rt = dir.path().join("rt");
    let spec = "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata: {name: tpm}\nspec:\n  domain:\n    memory: {guest: 128Mi}\n    devices:\n      tpm: {persistent: true}\n";
    let (code, stderr) = run_spec(spec, &rt, &["--connect", "test:///default"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("spec.domain.devices.tpm.persistent: a persistent TPM needs the launcher's own libvirtd"),
        "{stderr}"
    );
}

/// `--host-disk-root DIR`: a hostDisk elsewhere, or a link from inside the root to elsewhere,
/// is refused as a bad spec, naming the roots; a relative root is a usage error.
#[test]
fn run_confines_host_disks_to_the_host_disk_roots() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("disks");
    std::fs::create_dir(&root).unwrap();
    let outside = dir.path().join("outside.img");
    std::fs::write(&outside, b"").unwrap();
    std::os::unix::fs::symlink(&outside, root.join("link.img")).unwrap();
    let root_arg = root.to_str().unwrap();
    for disk in [outside.clone(), root.join("link.img")] {
        let rt = dir.path().join("rt");
        let (code, stderr) = run_spec(&host_disk_spec(&disk), &rt, &["--host-disk-root", root_arg]);
        assert_eq!(code, Some(2), "{stderr}");
        assert!(
            stderr.contains("spec.volumes[0].hostDisk.path: "),
            "{stderr}"
        );
        assert!(
            stderr.contains(&format!(
                "is not under a host disk root of this launcher ({root_arg})"
            )),
            "{stderr}"
        );
        assert!(!rt.join("libvirt").exists(), "no libvirtd was started");
    }
    let (code, stderr) = run_spec(
        &host_disk_spec(&outside),
        &dir.path().join("rt"),
        &["--host-disk-root", "disks"],
    );
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("disks is not an absolute path"), "{stderr}");
}

#[test]
fn convert_prints_deterministic_xml() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/testguest-vmi.yaml");
    let a = vmlauncher(&["convert", example, "--emulation", "tcg"], None);
    let b = vmlauncher(&["convert", example, "--emulation", "tcg"], None);
    assert!(a.status.success());
    assert_eq!(a.stdout, b.stdout);
    let xml = String::from_utf8(a.stdout).unwrap();
    assert!(xml.starts_with("<domain type=\"qemu\">"), "{xml}");
    assert!(xml.contains("<name>default_testguest</name>"));
}

#[test]
fn output_to_a_reader_that_has_gone_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    // `vmlauncher convert ... | head -0`: the pipe's read end is closed before anything is
    // written, so the first write fails with a broken pipe. Close-on-exec: a test running
    // beside this one must not inherit the read end and keep the pipe open.
    let (read_end, write_end) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    drop(read_end);
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/testguest-vmi.yaml");
    let out = Command::new(common::bin())
        .args(["convert", example, "--emulation", "tcg"])
        .stdout(std::process::Stdio::from(write_end))
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        (out.status.code(), out.status.signal(), stderr.as_ref()),
        (Some(0), None, "")
    );
}

#[test]
fn usage_errors_exit_64() {
    let out = vmlauncher(&["frobnicate"], None);
    assert_eq!(out.status.code(), Some(64));
}

#[test]
fn client_without_a_launcher_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("none.sock");
    let out = vmlauncher(&["status", "--socket", socket.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(6));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot connect to the launcher"));
}

#[test]
fn publishing_a_port_the_spec_does_not_list_is_a_usage_error() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/debian.yaml");
    let out = vmlauncher(&["run", example, "--publish", "2222:23"], None);
    assert_eq!(out.status.code(), Some(64));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("--publish 2222:23: no masquerade interface of the spec lists port 23"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = vmlauncher(&["run", example, "--publish", "22"], None);
    assert_eq!(out.status.code(), Some(64), "HOSTPORT:PORT is required");
}

/// A host port must publish one guest port, and a guest port be moved once: otherwise QEMU
/// would refuse the second forward only after the VM started, or the later move would silently
/// replace the earlier one. Refused as usage errors before anything starts.
#[test]
fn publishing_two_ports_on_one_host_port_or_one_port_twice_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("web.yaml");
    std::fs::write(
        &spec,
        r#"apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: web}
spec:
  domain:
    memory: {guest: 128Mi}
    devices:
      interfaces:
      - name: default
        masquerade: {}
        ports:
        - {port: 22}
        - {port: 80}
        - {port: 443}
        - {port: 8080}
  networks:
  - {name: default, pod: {}}
"#,
    )
    .unwrap();
    let spec = spec.to_str().unwrap();
    for (publish, says) in [
        (
            &["9000:80", "9000:443"][..],
            "--publish 9000:443: host port 9000/tcp already publishes guest port 80",
        ),
        (
            &["8080:80"][..],
            "--publish 8080:80: host port 8080/tcp already publishes guest port 8080 (on its own number)",
        ),
        (
            &["2222:22", "3333:22"][..],
            "--publish 3333:22: guest port 22 is already moved to host port 2222",
        ),
    ] {
        let mut args = vec!["run", spec];
        for p in publish {
            args.extend(["--publish", p]);
        }
        let out = vmlauncher(&args, None);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{publish:?}: {stderr}");
        assert!(stderr.contains(says), "{publish:?}: {stderr}");
    }
}

/// A --hotplug-dir (or --runtime-dir) that is not UTF-8 ends up in
/// libvirt's XML and in the hotplug records as text; it is refused up front, naming the option.
#[test]
fn run_refuses_a_directory_that_is_not_utf8() {
    use std::os::unix::ffi::OsStrExt;
    let not_utf8 = std::ffi::OsStr::from_bytes(b"/tmp/vml-\xff-dir");
    for option in ["--hotplug-dir", "--runtime-dir"] {
        let out = Command::new(common::bin())
            .arg("run")
            .arg(option)
            .arg(not_utf8)
            .arg("-")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{option}: {stderr}");
        assert!(stderr.contains(option), "{stderr}");
        assert!(stderr.contains("is not UTF-8"), "{stderr}");
        assert!(!Path::new(not_utf8).exists());
    }
}

/// KubeVirt's launcher command line, by either name: pflag's rules, exit 64 on an unknown flag.
#[test]
fn virt_launcher_flags_are_kubevirts_and_an_unknown_one_is_a_usage_error() {
    let unknown = vmlauncher(&["virt-launcher", "--name", "a", "--no-such-flag"], None);
    assert_eq!(unknown.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&unknown.stderr);
    assert!(stderr.contains("unknown flag: --no-such-flag"), "{stderr}");
    let missing = vmlauncher(&["virt-launcher", "--qemu-timeout"], None);
    assert_eq!(missing.status.code(), Some(64));
    let help = vmlauncher(&["virt-launcher", "--help"], None);
    assert_eq!(help.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&help.stdout).contains("--kubevirt-share-dir"));

    // Invoked as /usr/bin/virt-launcher (the image's link): the same parser, no verb.
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("virt-launcher");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_vmlauncher"), &link).unwrap();
    let out = Command::new(&link)
        .args(["--hook-sidecars", "0", "--bogus=1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown flag: --bogus=1"));
}

/// `--tls-dir` that cannot serve a migration over TCP is refused before anything starts, naming
/// the option and the file; `--listen` needs `--incoming` and `--tls-dir`, and room for the four
/// ports a target listens on.
#[test]
fn run_refuses_unusable_migration_credentials_and_listen_addresses() {
    let dir = tempfile::tempdir().unwrap();
    let tls = dir.path().join("tls");
    std::fs::create_dir(&tls).unwrap();
    for file in ["ca-cert.pem", "server-cert.pem", "client-cert.pem"] {
        std::fs::write(tls.join(file), "-----BEGIN CERTIFICATE-----\n").unwrap();
    }
    std::fs::write(tls.join("server-key.pem"), "-----BEGIN PRIVATE KEY-----\n").unwrap();
    let rt = dir.path().join("rt");
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/testguest-vmi.yaml");
    let out = vmlauncher(
        &[
            "run",
            example,
            "--runtime-dir",
            rt.to_str().unwrap(),
            "--emulation",
            "tcg",
            "--tls-dir",
            tls.to_str().unwrap(),
        ],
        None,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The operator's command line, as `--qemu-user` naming no user.
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(
        stderr.contains("--tls-dir") && stderr.contains("cannot read client-key.pem"),
        "{stderr}"
    );
    assert!(!rt.join("libvirt/libvirtd.pid").exists(), "nothing started");

    let refused = |args: &[&str], says: &str| {
        let out = vmlauncher(args, None);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    };
    let tls_dir = tls.to_str().unwrap();
    refused(
        &["run", "--incoming", "--listen", "127.0.0.1:7100"],
        "--tls-dir",
    );
    for (listen, says) in [
        ("127.0.0.1:65534", "leaves no room for the 4 ports"),
        ("node-2:7100", "is not ADDR:PORT"),
    ] {
        let args = [
            "run",
            "--incoming",
            "--tls-dir",
            tls_dir,
            "--listen",
            listen,
        ];
        refused(&args, says);
    }
}
