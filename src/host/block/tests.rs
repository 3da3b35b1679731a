//! A cgroup v1 `devices` hierarchy, `/proc/<pid>/cgroup`, QEMU's pid file and the hotplug
//! dir, all in a temp dir: the real code on real files (nodes need root, as the launcher).
use super::*;

const QEMU_PID: u32 = 4242;
const LOOP1: DevNumber = DevNumber { major: 7, minor: 1 };
const LOOP2: DevNumber = DevNumber { major: 7, minor: 2 };
const BOOT: DevNumber = DevNumber { major: 8, minor: 0 };

struct Host {
    dir: tempfile::TempDir,
}

impl Host {
    /// QEMU in cgroup `/pod/qemu` of the v1 devices hierarchy.
    fn new() -> Host {
        let host = Host {
            dir: tempfile::tempdir().unwrap(),
        };
        let cg = host.cgroup();
        fs::create_dir_all(&cg).unwrap();
        for f in ["devices.allow", "devices.deny"] {
            fs::write(cg.join(f), "").unwrap();
        }
        let proc = host.path("proc").join(QEMU_PID.to_string());
        fs::create_dir_all(&proc).unwrap();
        fs::write(proc.join("cgroup"), "5:devices:/pod/qemu\n0::/\n").unwrap();
        fs::write(host.path("qemu.pid"), format!("{QEMU_PID}\n")).unwrap();
        host
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn cgroup(&self) -> PathBuf {
        self.path("devices/pod/qemu")
    }

    fn roots(&self) -> BlockRoots {
        BlockRoots {
            hotplug_dir: self.path("hotplug"),
            node_owner: NodeOwner { uid: 0, gid: 0 },
            cgroup_roots: CgroupRoots {
                v1_devices: Some(cgroup::CgroupMount::whole(self.path("devices"))),
                unified: None,
            },
            proc_root: self.path("proc"),
            qemu_pid_file: self.path("qemu.pid"),
            records: self.path("records.json"),
            missing: Vec::new(),
        }
    }

    /// The rules written to the cgroup, one per line as the kernel takes them.
    fn written(&self, file: &str) -> String {
        fs::read_to_string(self.cgroup().join(file)).unwrap()
    }

    fn records(&self) -> Records {
        Records::load(&self.path("records.json")).unwrap()
    }
}

#[test]
fn plug_makes_the_node_allows_the_device_and_records_both() {
    let host = Host::new();
    let devices = BlockDevices::new(host.roots());
    devices.plug("vol-a", LOOP1).unwrap().keep();
    assert_eq!(
        devnode::device_of(&host.path("hotplug/vol-a")).unwrap(),
        LOOP1
    );
    assert_eq!(host.written("devices.allow"), "b 7:1 rwm");
    assert_eq!(host.written("devices.deny"), "");
    let records = host.records();
    assert_eq!(
        records.nodes["vol-a"],
        NodeRecord {
            path: host.path("hotplug/vol-a"),
            dev: LOOP1
        }
    );
    assert_eq!(
        records.cgroups,
        vec![(DeviceCgroup::V1(host.cgroup()), [LOOP1].into())]
    );
    assert_eq!(devices.nodes(), [("vol-a".to_string(), LOOP1)].into());
}

#[test]
fn a_dropped_plug_revokes_the_rule_and_removes_the_node() {
    let host = Host::new();
    let devices = BlockDevices::new(host.roots());
    drop(devices.plug("vol-a", LOOP1).unwrap());
    assert!(fs::symlink_metadata(host.path("hotplug/vol-a")).is_err());
    assert_eq!(host.written("devices.allow"), "b 7:1 rwm");
    assert_eq!(host.written("devices.deny"), "b 7:1 rwm");
    assert!(devices.nodes().is_empty());
    assert!(host.records().nodes.is_empty());
}

#[test]
fn release_removes_the_node_and_the_rule_but_keeps_boot_devices() {
    let host = Host::new();
    let devices = BlockDevices::new(host.roots());
    devices.set_boot([BOOT].into());
    devices.plug("vol-a", LOOP1).unwrap().keep();
    devices.plug("vol-b", LOOP2).unwrap().keep();
    devices.release("vol-a").unwrap();
    assert!(fs::symlink_metadata(host.path("hotplug/vol-a")).is_err());
    assert!(host.path("hotplug/vol-b").exists());
    assert_eq!(host.written("devices.deny"), "b 7:1 rwm");
    assert_eq!(
        host.records().cgroups,
        vec![(DeviceCgroup::V1(host.cgroup()), [BOOT, LOOP2].into())]
    );
    // Releasing what is not ours is nothing.
    devices.release("vol-a").unwrap();
    devices.forget("never-plugged").unwrap();
}

/// A detach of `vol` times out, the volume is plugged again (the node found
/// there is taken as it is), then the old disk's late removal comes: it must not unlink the
/// new node nor revoke its rule.
#[test]
fn a_late_release_leaves_the_node_plugged_again_since() {
    let host = Host::new();
    let devices = BlockDevices::new(host.roots());
    devices.plug("vol", LOOP1).unwrap().keep();
    let detached = devices.generation("vol").unwrap();
    devices.plug("vol", LOOP1).unwrap().keep();
    assert!(!devices.release_plug("vol", detached).unwrap());
    assert_eq!(
        devnode::device_of(&host.path("hotplug/vol")).unwrap(),
        LOOP1
    );
    assert_eq!(host.written("devices.deny"), "");
    assert_eq!(host.records().nodes["vol"].dev, LOOP1);
    // The removal of the disk plugged now does release it.
    let now = devices.generation("vol").unwrap();
    assert!(devices.release_plug("vol", now).unwrap());
    assert!(fs::symlink_metadata(host.path("hotplug/vol")).is_err());
    assert_eq!(host.written("devices.deny"), "b 7:1 rwm");
    assert!(devices.nodes().is_empty());
    assert_eq!(devices.generation("vol"), None);
}

#[test]
fn without_qemu_a_plug_fails_and_leaves_nothing() {
    let host = Host::new();
    fs::remove_file(host.path("qemu.pid")).unwrap();
    let devices = BlockDevices::new(host.roots());
    let err = devices.plug("vol-a", LOOP1).unwrap_err();
    assert!(matches!(err, BlockHostError::QemuPid { .. }), "{err}");
    assert_eq!(err.reason(), "CgroupFailed");
    assert!(fs::symlink_metadata(host.path("hotplug/vol-a")).is_err());
    assert!(devices.nodes().is_empty());
}

/// Without what block hotplug needs, a block volume is refused with the missing
/// capability named, before a node is made or a rule written.
#[test]
fn a_missing_capability_refuses_the_volume_and_makes_nothing() {
    let host = Host::new();
    let devices = BlockDevices::new(BlockRoots {
        missing: vec![Unavailable {
            feature: "cgroup v2 device programs (bpf)",
            why: "CAP_SYS_ADMIN is not in the effective set".into(),
        }],
        ..host.roots()
    });
    let err = devices.plug("vol-a", LOOP1).unwrap_err();
    assert_eq!(err.reason(), "CapabilityMissing");
    assert_eq!(
        err.to_string(),
        "block volumes are unavailable here: cgroup v2 device programs (bpf): \
         CAP_SYS_ADMIN is not in the effective set"
    );
    assert!(fs::symlink_metadata(host.path("hotplug/vol-a")).is_err());
    assert_eq!(host.written("devices.allow"), "");
    assert!(!host.path("records.json").exists());
}

#[test]
fn a_bad_volume_name_makes_no_node() {
    let host = Host::new();
    let devices = BlockDevices::new(host.roots());
    let err = devices.plug("../escape", LOOP1).unwrap_err();
    assert_eq!(err.reason(), "NodeFailed");
    assert_eq!(host.written("devices.allow"), "");
}

#[test]
fn adopting_keeps_live_volumes_and_cleans_stale_ones() {
    let host = Host::new();
    let before = BlockDevices::new(host.roots());
    before.plug("live", LOOP1).unwrap().keep();
    before.plug("stale", LOOP2).unwrap().keep();
    drop(before);

    // A new launcher of the same runtime dir; the domain still has "live" only.
    let after = BlockDevices::new(host.roots());
    after.adopt(&["live".to_string()].into());
    assert_eq!(after.nodes(), [("live".to_string(), LOOP1)].into());
    assert!(host.path("hotplug/live").exists());
    assert!(fs::symlink_metadata(host.path("hotplug/stale")).is_err());
    assert_eq!(host.written("devices.deny"), "b 7:2 rwm");
    assert_eq!(
        host.records().cgroups,
        vec![(DeviceCgroup::V1(host.cgroup()), [LOOP1].into())]
    );
}

#[test]
fn a_node_that_is_no_longer_the_recorded_device_is_not_adopted() {
    let host = Host::new();
    let before = BlockDevices::new(host.roots());
    before.plug("live", LOOP1).unwrap().keep();
    drop(before);
    // Someone put another device under the volume's name since.
    fs::remove_file(host.path("hotplug/live")).unwrap();
    crate::testing::block_node(&host.path("hotplug/live"), LOOP2);
    let after = BlockDevices::new(host.roots());
    after.adopt(&["live".to_string()].into());
    assert_eq!(after.nodes(), BTreeMap::new());
}

#[test]
fn adopting_without_records_does_nothing() {
    let host = Host::new();
    let devices = BlockDevices::new(host.roots());
    devices.adopt(&BTreeSet::new());
    assert!(!host.path("records.json").exists());
    fs::write(host.path("records.json"), "{").unwrap();
    devices.adopt(&BTreeSet::new());
    assert!(devices.nodes().is_empty());
}

#[test]
fn release_all_leaves_nothing() {
    let host = Host::new();
    let devices = BlockDevices::new(host.roots());
    devices.plug("a", LOOP1).unwrap().keep();
    devices.plug("b", LOOP2).unwrap().keep();
    devices.release_all();
    assert!(devices.nodes().is_empty());
    assert!(fs::symlink_metadata(host.path("hotplug/a")).is_err());
    assert!(fs::symlink_metadata(host.path("hotplug/b")).is_err());
    assert!(host.records().nodes.is_empty());
    assert!(host
        .records()
        .cgroups
        .iter()
        .all(|(_, devices)| devices.is_empty()));
}

/// The records file is not trusted: records written by someone else name a node outside
/// the hotplug dir and a cgroup QEMU is not in; the launcher unlinks neither and writes no
/// rule there.
#[test]
fn hostile_records_are_not_obeyed() {
    let host = Host::new();
    let outside = host.path("outside");
    fs::create_dir_all(&outside).unwrap();
    let victim = devnode::make_node(&outside, "sda", BOOT, NodeOwner { uid: 0, gid: 0 }).unwrap();
    victim.keep();
    let elsewhere = host.path("devices/other");
    fs::create_dir_all(&elsewhere).unwrap();
    for f in ["devices.allow", "devices.deny"] {
        fs::write(elsewhere.join(f), "").unwrap();
    }
    let hostile = Records {
        nodes: [(
            "sda".to_string(),
            NodeRecord {
                path: outside.join("sda"),
                dev: BOOT,
            },
        )]
        .into(),
        cgroups: vec![(DeviceCgroup::V1(elsewhere.clone()), [BOOT].into())],
        programs: Default::default(),
    };
    hostile.save(&host.path("records.json")).unwrap();

    let devices = BlockDevices::new(host.roots());
    devices.adopt(&BTreeSet::new());
    assert!(
        fs::symlink_metadata(outside.join("sda")).is_ok(),
        "not unlinked"
    );
    assert_eq!(
        fs::read_to_string(elsewhere.join("devices.deny")).unwrap(),
        ""
    );
    assert!(devices.nodes().is_empty());
}

/// KubeVirt #10689: with the records lost, a restarted launcher still knows the
/// live volume's node and keeps its device allowed; the bad file is kept aside.
#[test]
fn corrupt_records_are_rebuilt_from_the_live_volumes_nodes() {
    let host = Host::new();
    let before = BlockDevices::new(host.roots());
    before.plug("live", LOOP1).unwrap().keep();
    drop(before);
    fs::write(host.path("records.json"), "{").unwrap();
    fs::write(host.cgroup().join("devices.allow"), "").unwrap();

    let after = BlockDevices::new(host.roots());
    after.adopt(&["live".to_string()].into());
    assert_eq!(after.nodes(), [("live".to_string(), LOOP1)].into());
    assert_eq!(host.written("devices.allow"), "b 7:1 rwm");
    assert_eq!(
        fs::read_to_string(host.path("records.json.bak")).unwrap(),
        "{"
    );
    assert_eq!(host.records().nodes["live"].dev, LOOP1);
}

#[test]
fn qemu_cgroups_come_from_its_proc_entry() {
    let host = Host::new();
    let roots = host.roots();
    assert_eq!(
        qemu_device_cgroups(&roots.qemu_pid_file, &roots.proc_root, &roots.cgroup_roots).unwrap(),
        vec![DeviceCgroup::V1(host.cgroup())]
    );
    fs::write(host.path("qemu.pid"), "not a pid").unwrap();
    assert!(matches!(
        qemu_device_cgroups(&roots.qemu_pid_file, &roots.proc_root, &roots.cgroup_roots),
        Err(BlockHostError::QemuPid { .. })
    ));
}
