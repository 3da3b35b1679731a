//! Block-device hotplug done by the launcher itself, end to end: the launcher, its private
//! libvirtd and so QEMU run inside a test cgroup whose device rules deny block devices by
//! default — (a) the cgroup v1 devices controller, (b) a cgroup v2 directory with a device
//! program. For each: loop devices hot-plugged by major:minor are seen by the guest by their
//! serial; without the launcher's rule QEMU is refused (negative control through libvirt
//! directly); three volumes attached in separate Syncs all stay allowed (KubeVirt #10689); a Sync
//! with one good and one bad volume attaches the good one and leaves nothing of the bad one;
//! bad names, char devices and unknown device numbers are refused before anything is touched;
//! after unplug the rule is gone; 100 attach/detach cycles leave no node, rule or descriptor.

use crate::common;

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{guest_spec, with_claims, ConsoleWait, Launched, Loop, BOOT_DEADLINE, GUEST_DEADLINE};
use vmlauncher::api::{self, proto};
use vmlauncher::host::cgroup::{attached_programs, DeviceCgroup};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    V1,
    V2,
}

/// A test cgroup that denies block devices by default; removed on drop.
struct TestCgroup {
    kind: Kind,
    dir: PathBuf,
}

impl TestCgroup {
    fn new(kind: Kind, name: &str) -> TestCgroup {
        let root = match kind {
            Kind::V1 => "/sys/fs/cgroup/devices",
            Kind::V2 => "/sys/fs/cgroup/unified",
        };
        let dir = Path::new(root).join(format!("vml-test-{name}-{}", common::unique()));
        std::fs::create_dir(&dir).expect("make the test cgroup");
        let cg = TestCgroup { kind, dir };
        match kind {
            Kind::V1 => {
                // Deny everything, then allow character devices and mknod of block nodes: what a
                // container runtime leaves a pod.
                cg.write("devices.deny", "a");
                cg.write("devices.allow", "c *:* rwm");
                cg.write("devices.allow", "b *:* m");
            }
            // The launcher's own default program: character devices QEMU needs, no block device.
            Kind::V2 => {
                DeviceCgroup::V2(cg.dir.clone())
                    .apply(&Default::default(), &Default::default())
                    .expect("attach the default-deny program");
            }
        }
        cg
    }

    fn write(&self, file: &str, text: &str) {
        std::fs::write(self.dir.join(file), text).unwrap_or_else(|e| panic!("{file} {text}: {e}"));
    }

    fn procs(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// v1: the block rules in `devices.list`; v2: the number of attached programs.
    fn rules(&self) -> String {
        match self.kind {
            Kind::V1 => {
                let list = std::fs::read_to_string(self.dir.join("devices.list")).unwrap();
                let mut rules: Vec<&str> = list.lines().filter(|l| l.starts_with("b ")).collect();
                rules.sort();
                rules.join(", ")
            }
            Kind::V2 => format!("{} program(s)", attached_programs(&self.dir).unwrap().len()),
        }
    }

    /// A process inside the cgroup can open `node` (what QEMU's open would meet).
    fn can_open(&self, node: &Path) -> bool {
        use std::os::unix::process::CommandExt;
        let procs =
            std::ffi::CString::new(self.procs().into_os_string().into_encoded_bytes()).unwrap();
        let mut cmd = Command::new("dd");
        cmd.arg(format!("if={}", node.display()))
            .args(["of=/dev/null", "bs=512", "count=1"])
            .stderr(std::process::Stdio::null());
        // SAFETY: runs in the forked child before exec; only open/write/close on memory prepared
        // before the fork.
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(fd);
                Ok(())
            });
        }
        cmd.status().unwrap().success()
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

const NAME: &str = "e2e-block";

/// The test guest with hot-plugged block claims `(volume, serial)` on scsi.
fn spec(volumes: &[(&str, &str)]) -> String {
    with_claims(guest_spec(NAME, "", &[]), volumes)
}

fn request(volumes: &[(&str, &str, &Loop)]) -> proto::SyncRequest {
    let names: Vec<(&str, &str)> = volumes.iter().map(|(v, s, _)| (*v, *s)).collect();
    proto::SyncRequest {
        spec: spec(&names),
        block_devices: volumes
            .iter()
            .map(|(v, _, l)| (v.to_string(), l.block_device()))
            .collect(),
        ..Default::default()
    }
}

/// Syncs `volumes`, which must succeed (else a panic naming the step, `what`): the reply.
async fn sync_ok(
    client: &mut common::Client,
    volumes: &[(&str, &str, &Loop)],
    what: impl std::fmt::Display,
) -> proto::SyncResponse {
    common::sync_ok(client, request(volumes), what).await
}

fn phase(reply: &proto::SyncResponse, volume: &str) -> (i32, String, String) {
    let v = reply
        .volumes
        .iter()
        .find(|v| v.name == volume)
        .unwrap_or_else(|| panic!("no status for {volume}: {:?}", reply.volumes));
    (v.phase, v.reason.clone(), v.message.clone())
}

const READY: i32 = proto::volume_status::Phase::Ready as i32;
const FAILED: i32 = proto::volume_status::Phase::Failed as i32;

/// Attaches `node` through libvirt directly, without the launcher: must be refused by the
/// cgroup. Returns libvirt's message.
fn direct_attach_refused(uri: &str, node: &Path) -> String {
    let conn = virt::connect::Connect::open(Some(uri)).unwrap();
    let dom = conn
        .lookup_domain_by_name(&format!("default_{NAME}"))
        .unwrap();
    let xml = format!(
        "<disk type='block' device='disk'><driver name='qemu' type='raw' cache='none'/>\
         <source dev='{}'/><target dev='sdzz' bus='scsi'/>\
         <address type='drive' controller='0' bus='0' target='0' unit='1000'/></disk>",
        node.display()
    );
    match dom.attach_device_flags(&xml, virt::sys::VIR_DOMAIN_AFFECT_LIVE) {
        Ok(()) => {
            let _ = dom.detach_device_flags(&xml, virt::sys::VIR_DOMAIN_AFFECT_LIVE);
            panic!("QEMU opened {} without the launcher's rule", node.display());
        }
        Err(e) => e.message().to_string(),
    }
}

fn assert_permission_error(message: &str) {
    assert!(
        message.contains("Operation not permitted") || message.contains("Permission denied"),
        "expected a permission error, got: {message}"
    );
}

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

async fn scenario(kind: Kind) {
    let tag = format!("{kind:?}").to_lowercase();
    let scratch = tempfile::tempdir().unwrap();
    let cgroup = TestCgroup::new(kind, &tag);
    let loops: Vec<Loop> = ["a", "b", "c", "good", "cycle"]
        .iter()
        .map(|n| Loop::new(scratch.path(), n, 4, false))
        .collect();
    let bad = Loop::new(scratch.path(), "bad", 4, true);
    let [a, b, c, good, cycle] = &loops[..] else {
        unreachable!()
    };

    let mut vm = Launched::start_in_cgroups(&spec(&[]), &[], &[cgroup.procs()]);
    vm.wait_stdout("phase Running", BOOT_DEADLINE);
    let mut console = vm.console();
    let deadline = Instant::now() + BOOT_DEADLINE;
    console
        .wait_for("the guest's first disk report", deadline, |l| {
            l == "VMLTEST-DISKS"
        })
        .unwrap();
    let qemu_pid = vm.qemu_pid(NAME);
    let qemu_cgroup = std::fs::read_to_string(format!("/proc/{qemu_pid}/cgroup")).unwrap();
    let leaf = cgroup
        .dir
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(
        qemu_cgroup.contains(&leaf),
        "QEMU is not in the test cgroup:\n{qemu_cgroup}"
    );
    let uri = vm.libvirt_uri();
    let hotplug = vm.dir().join("hotplug");
    let baseline_rules = cgroup.rules();

    // Negative control: without the launcher's rule, QEMU is refused.
    let control = scratch.path().join("control-node");
    nix::sys::stat::mknod(
        &control,
        nix::sys::stat::SFlag::S_IFBLK,
        nix::sys::stat::Mode::from_bits_truncate(0o660),
        nix::sys::stat::makedev(a.major.into(), a.minor.into()),
    )
    .unwrap();
    assert_permission_error(&direct_attach_refused(&uri, &control));
    assert!(!cgroup.can_open(&a.dev));

    // One volume by major:minor: the guest sees it by its serial.
    let mut client = api::connect(&vm.socket()).await.unwrap();
    let started = Instant::now();
    let reply = sync_ok(&mut client, &[("vol-a", "BLK-A", a)], "Sync vol-a").await;
    eprintln!(
        "[{tag}] block attach (Sync round trip): {:?}",
        started.elapsed()
    );
    assert_eq!(phase(&reply, "vol-a").0, READY, "{:?}", reply.volumes);
    let node = std::fs::symlink_metadata(hotplug.join("vol-a")).unwrap();
    assert!(node.file_type().is_block_device());
    assert_eq!(node.permissions().mode() & 0o777, 0o660);
    assert_eq!(node.rdev(), std::fs::metadata(&a.dev).unwrap().rdev());
    console.line("BLK-A in the guest", GUEST_DEADLINE, |l| {
        l.starts_with("VMLTEST-DISKS") && serials(l) == ["BLK-A"]
    });
    assert!(cgroup.can_open(&a.dev));

    // KubeVirt #10689: three volumes in three Syncs, all still allowed after the third.
    sync_ok(
        &mut client,
        &[("vol-a", "BLK-A", a), ("vol-b", "BLK-B", b)],
        "Sync vol-b",
    )
    .await;
    let reply = sync_ok(
        &mut client,
        &[
            ("vol-a", "BLK-A", a),
            ("vol-b", "BLK-B", b),
            ("vol-c", "BLK-C", c),
        ],
        "Sync vol-c",
    )
    .await;
    for v in ["vol-a", "vol-b", "vol-c"] {
        assert_eq!(phase(&reply, v).0, READY, "{:?}", reply.volumes);
    }
    console.line("three block disks in the guest", GUEST_DEADLINE, |l| {
        l.starts_with("VMLTEST-DISKS") && serials(l) == ["BLK-A", "BLK-B", "BLK-C"]
    });
    for l in [a, b, c] {
        assert!(cgroup.can_open(&l.dev), "{} no longer allowed", l.number());
    }
    if kind == Kind::V1 {
        let rules = cgroup.rules();
        for l in [a, b, c] {
            assert!(rules.contains(&format!("b {} rwm", l.number())), "{rules}");
        }
    } else {
        assert_eq!(cgroup.rules(), "1 program(s)");
    }

    // Refused before anything is touched: a bad name, a char device, an unknown number.
    let xml_before = vm_xml(&uri);
    let files_before = listing(&hotplug);
    let rules_before = cgroup.rules();
    let three = [
        ("vol-a", "BLK-A", a),
        ("vol-b", "BLK-B", b),
        ("vol-c", "BLK-C", c),
    ];
    let mut bad_name = request(&three);
    bad_name
        .block_devices
        .insert("../etc".into(), a.block_device());
    let mut char_dev = request(&three);
    char_dev.block_devices.insert(
        "vol-c".into(),
        proto::BlockDevice {
            source: Some(proto::block_device::Source::Path("/dev/null".into())),
        },
    );
    let mut unknown = request(&three);
    unknown.block_devices.insert(
        "vol-c".into(),
        proto::BlockDevice {
            source: Some(proto::block_device::Source::Number(proto::DeviceNumber {
                major: 7,
                minor: 1_000_000,
            })),
        },
    );
    for (what, req, needle) in [
        (
            "a name with ..",
            bad_name,
            "volume name \"../etc\" cannot name a device node",
        ),
        ("a char device", char_dev, "/dev/null is not a block device"),
        (
            "an unknown device number",
            unknown,
            "no block device 7:1000000 on this host",
        ),
    ] {
        let err = client.sync(req).await.expect_err(what);
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{what}: {err:?}");
        assert!(err.message().contains(needle), "{what}: {}", err.message());
    }
    assert_eq!(vm_xml(&uri), xml_before);
    assert_eq!(listing(&hotplug), files_before);
    assert_eq!(cgroup.rules(), rules_before);

    // One good and one bad volume in one Sync: the good one attaches, the bad one (a read-only
    // device attached read-write) is Failed with libvirt's reason and leaves nothing behind.
    let mut five = three.to_vec();
    five.push(("vol-good", "BLK-GOOD", good));
    five.push(("vol-bad", "BLK-BAD", &bad));
    let reply = sync_ok(&mut client, &five, "mixed Sync").await;
    assert_eq!(phase(&reply, "vol-good").0, READY, "{:?}", reply.volumes);
    let (p, reason, message) = phase(&reply, "vol-bad");
    assert_eq!((p, reason.as_str()), (FAILED, "AttachFailed"), "{message}");
    eprintln!("[{tag}] the bad volume: {message}");
    assert!(
        !hotplug.join("vol-bad").exists(),
        "the bad volume's node was left"
    );
    assert!(!cgroup.can_open(&bad.dev), "the bad volume's rule was left");
    if kind == Kind::V1 {
        assert!(!cgroup.rules().contains(&format!("b {} ", bad.number())));
    }
    assert!(cgroup.can_open(&good.dev));
    console.line("BLK-GOOD in the guest", GUEST_DEADLINE, |l| {
        l.starts_with("VMLTEST-DISKS") && serials(l).contains(&"BLK-GOOD".to_string())
    });

    // Unplug vol-a: the guest loses it, the node and the rule are gone, QEMU is refused again.
    let started = Instant::now();
    let rest = [
        ("vol-b", "BLK-B", b),
        ("vol-c", "BLK-C", c),
        ("vol-good", "BLK-GOOD", good),
    ];
    let reply = sync_ok(&mut client, &rest, "unplug vol-a").await;
    eprintln!(
        "[{tag}] block detach (until DEVICE_REMOVED, node and rule gone): {:?}",
        started.elapsed()
    );
    assert!(
        reply.volumes.iter().all(|v| v.name != "vol-a"),
        "{:?}",
        reply.volumes
    );
    console.line("vol-a gone from the guest", GUEST_DEADLINE, |l| {
        l.starts_with("VMLTEST-DISKS") && serials(l) == ["BLK-B", "BLK-C", "BLK-GOOD"]
    });
    assert!(!hotplug.join("vol-a").exists());
    assert!(!cgroup.can_open(&a.dev), "vol-a's rule is still there");
    assert_permission_error(&direct_attach_refused(&uri, &control));
    for l in [b, c, good] {
        assert!(cgroup.can_open(&l.dev), "{} lost with vol-a", l.number());
    }

    // Re-adding a name just removed works (KubeVirt #16159).
    let mut again = rest.to_vec();
    again.push(("vol-a", "BLK-A", a));
    let reply = sync_ok(&mut client, &again, "re-add vol-a").await;
    assert_eq!(phase(&reply, "vol-a").0, READY, "{:?}", reply.volumes);
    sync_ok(&mut client, &rest, "unplug vol-a again").await;

    // 100 attach/detach cycles: no node, rule or descriptor left behind.
    let launcher_pid = vm.child.id();
    let fds = fd_count(launcher_pid);
    let files = listing(&hotplug);
    let rules = cgroup.rules();
    let mut with_cycle = rest.to_vec();
    with_cycle.push(("vol-cycle", "BLK-CYCLE", cycle));
    let started = Instant::now();
    for i in 0..100 {
        let reply = sync_ok(&mut client, &with_cycle, format!("cycle {i} attach")).await;
        assert_eq!(
            phase(&reply, "vol-cycle").0,
            READY,
            "cycle {i}: {:?}",
            reply.volumes
        );
        let reply = sync_ok(&mut client, &rest, format!("cycle {i} detach")).await;
        assert!(
            reply.volumes.iter().all(|v| v.name != "vol-cycle"),
            "cycle {i}: {:?}",
            reply.volumes
        );
    }
    eprintln!("[{tag}] 100 attach/detach cycles: {:?}", started.elapsed());
    assert_eq!(listing(&hotplug), files);
    assert_eq!(cgroup.rules(), rules);
    assert_eq!(fd_count(launcher_pid), fds, "the launcher's descriptors");
    assert!(!cgroup.can_open(&cycle.dev));
    if kind == Kind::V1 {
        assert_ne!(baseline_rules, cgroup.rules());
    }

    drop(client);
    vm.signal(nix::sys::signal::Signal::SIGTERM);
    let status = vm.wait_exit(Duration::from_secs(90));
    assert_eq!(status.code(), Some(0));
}

fn vm_xml(uri: &str) -> String {
    let conn = virt::connect::Connect::open(Some(uri)).unwrap();
    let dom = conn
        .lookup_domain_by_name(&format!("default_{NAME}"))
        .unwrap();
    common::without_agent_state(&dom.xml_desc(0).unwrap())
}

/// The guest's serials, sorted: block volumes reach it in no fixed order.
fn serials(line: &str) -> Vec<String> {
    let mut s = common::guest_serials(line);
    s.sort();
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_hotplug_in_a_cgroup_v1_devices_cgroup() {
    scenario(Kind::V1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_hotplug_in_a_cgroup_v2_with_a_device_program() {
    scenario(Kind::V2).await;
}
