//! The cgroup code against sample mountinfo/cgroup files and, where the kernel lets us, real cgroups.

use super::*;

const MOUNTINFO: &str = "\
25 30 0:23 / /sys rw,nosuid shared:7 - sysfs sysfs rw
31 25 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
32 31 0:27 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate
40 31 0:35 / /sys/fs/cgroup/devices rw,nosuid - cgroup cgroup rw,devices
41 31 0:36 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
";

fn dev(major: u32, minor: u32) -> DevNumber {
    DevNumber { major, minor }
}

#[test]
fn finds_both_hierarchies_on_a_hybrid_host() {
    let roots = CgroupRoots::from_mountinfo(MOUNTINFO);
    assert_eq!(
        roots.unified,
        Some(CgroupMount::whole("/sys/fs/cgroup/unified"))
    );
    assert_eq!(
        roots.v1_devices,
        Some(CgroupMount::whole("/sys/fs/cgroup/devices"))
    );
    let cgroups = roots
        .device_cgroups_of("9:name=systemd:/\n5:devices:/pod/x\n4:memory:/pod/x\n0::/pod/y\n")
        .unwrap();
    assert_eq!(
        cgroups,
        [
            DeviceCgroup::V1("/sys/fs/cgroup/devices/pod/x".into()),
            DeviceCgroup::V2("/sys/fs/cgroup/unified/pod/y".into())
        ]
    );
}

/// Mount points in a temp dir, with the files the kernel puts in a hierarchy's root
/// (`release_agent`, v1) or in every non-root cgroup (`cgroup.type`, v2).
fn mounts(
    v1_root: &str,
    v1_is_hierarchy_root: bool,
    v2_root: &str,
    v2_is_hierarchy_root: bool,
) -> (tempfile::TempDir, CgroupRoots) {
    let dir = tempfile::tempdir().unwrap();
    let (v1, v2) = (dir.path().join("devices"), dir.path().join("unified"));
    std::fs::create_dir_all(&v1).unwrap();
    std::fs::create_dir_all(&v2).unwrap();
    if v1_is_hierarchy_root {
        std::fs::write(v1.join("release_agent"), "").unwrap();
    }
    if !v2_is_hierarchy_root {
        std::fs::write(v2.join("cgroup.type"), "domain\n").unwrap();
    }
    let roots = CgroupRoots {
        v1_devices: Some(CgroupMount {
            mount_point: v1,
            root: v1_root.into(),
            read_only: false,
        }),
        unified: Some(CgroupMount {
            mount_point: v2,
            root: v2_root.into(),
            read_only: false,
        }),
    };
    (dir, roots)
}

#[test]
fn a_hierarchy_root_is_left_alone_a_namespace_root_is_not() {
    // On a host: `/` is the hierarchy's root, which restricts nothing.
    let (_dir, roots) = mounts("/", true, "/", true);
    assert_eq!(roots.device_cgroups_of("5:devices:/\n0::/\n").unwrap(), []);
    // In a cgroup namespace: `/` is the container's own cgroup, which does restrict.
    let (dir, roots) = mounts("/", false, "/", false);
    assert_eq!(
        roots.device_cgroups_of("5:devices:/\n0::/\n").unwrap(),
        [
            DeviceCgroup::V1(dir.path().join("devices")),
            DeviceCgroup::V2(dir.path().join("unified")),
        ]
    );
}

#[test]
fn paths_outside_the_mount_or_the_namespace_are_refused() {
    let (_dir, roots) = mounts("/libpod_parent/libpod-abc", false, "/", true);
    assert!(matches!(
        roots.device_cgroups_of("5:devices:/libpod_parent/other\n"),
        Err(CgroupError::OutsideMount { .. })
    ));
    // A prefix of a name is not a parent: `/libpod-abcdef` is not under `/libpod-abc`.
    assert!(matches!(
        roots.device_cgroups_of("5:devices:/libpod_parent/libpod-abcdef\n"),
        Err(CgroupError::OutsideMount { .. })
    ));
    assert!(matches!(
        roots.device_cgroups_of("0::/../../kubepods/x\n"),
        Err(CgroupError::OutsideNamespace { .. })
    ));
}

/// Samples taken on this project's host: `podman kube play deploy/pod.yaml` (rootful podman
/// 4.3, runc, cgroup v1, no cgroup namespace) seen from inside the container.
const PODMAN_V1_MOUNTINFO: &str = "\
421 410 0:56 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - tmpfs tmpfs rw,mode=755
426 421 0:33 /libpod_parent/3bf9b2c38d27638f005a82e2b0da219fab0628b6f1ec1c27cb673c13c2ea3277/libpod-37844b5112881d889eaf8629a106b0d0aff0598b8c28677cd83e6d1d4dff3864 /sys/fs/cgroup/devices ro,nosuid,nodev,noexec,relatime - cgroup cgroup rw,devices
";
const PODMAN_V1_CGROUP: &str = "\
5:devices:/libpod_parent/3bf9b2c38d27638f005a82e2b0da219fab0628b6f1ec1c27cb673c13c2ea3277/libpod-37844b5112881d889eaf8629a106b0d0aff0598b8c28677cd83e6d1d4dff3864
0::/libpod_parent/3bf9b2c38d27638f005a82e2b0da219fab0628b6f1ec1c27cb673c13c2ea3277/libpod-37844b5112881d889eaf8629a106b0d0aff0598b8c28677cd83e6d1d4dff3864
";

#[test]
fn a_podman_v1_container_sees_its_own_cgroup_at_the_mount_point() {
    let roots = CgroupRoots::from_mountinfo(PODMAN_V1_MOUNTINFO);
    let mount = roots.v1_devices.clone().unwrap();
    assert!(
        mount.read_only,
        "the container's cgroup mounts are read-only"
    );
    assert!(roots.unified.is_none());
    // The mount root is stripped: the container's cgroup is the mount point itself, which
    // has no release_agent (not a hierarchy root) and is kept.
    let dir = tempfile::tempdir().unwrap();
    let roots = CgroupRoots {
        v1_devices: Some(CgroupMount {
            mount_point: dir.path().into(),
            ..mount
        }),
        unified: None,
    };
    assert_eq!(
        roots.device_cgroups_of(PODMAN_V1_CGROUP).unwrap(),
        [DeviceCgroup::V1(dir.path().into())]
    );
}

/// cgroup v2 in a cgroup namespace (`unshare -C` after moving into a child cgroup, on this
/// host): the process sees itself at `0::/`; a cgroup2 mounted inside the namespace has root
/// `/`, and its top directory has `cgroup.type` (it is not the hierarchy's root); the host's
/// mount, seen from inside, has root `/..`.
#[test]
fn cgroup_v2_in_a_cgroup_namespace() {
    let inside =
        CgroupRoots::from_mountinfo("142 121 0:38 / /tmp/cg2 rw,relatime - cgroup2 none rw\n");
    let host_mount = CgroupRoots::from_mountinfo(
        "135 125 0:38 /.. /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n",
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cgroup.type"), "domain\n").unwrap();
    let inside = CgroupRoots {
        v1_devices: None,
        unified: Some(CgroupMount {
            mount_point: dir.path().into(),
            ..inside.unified.unwrap()
        }),
    };
    assert_eq!(
        inside.device_cgroups_of("0::/\n").unwrap(),
        [DeviceCgroup::V2(dir.path().into())]
    );
    assert!(matches!(
        host_mount.device_cgroups_of("0::/\n"),
        Err(CgroupError::OutsideMount { .. })
    ));
}

#[test]
fn the_unified_dir_of_a_process_is_under_the_mount_or_none() {
    let roots =
        CgroupRoots::from_mountinfo("35 25 0:30 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n");
    assert_eq!(
        roots.unified_dir_of("0::/system.slice/vm.service\n"),
        Some("/sys/fs/cgroup/system.slice/vm.service".into())
    );
    assert_eq!(roots.unified_dir_of("0::/../outside\n"), None);
    assert_eq!(CgroupRoots::default().unified_dir_of("0::/a\n"), None);
}

/// An empty cgroup of this host's cgroup2 mount, removed (programs first) when dropped.
struct ScratchV2(PathBuf);

impl ScratchV2 {
    fn new(name: &str) -> ScratchV2 {
        let dir = Path::new("/sys/fs/cgroup/unified")
            .join(format!("vml-unit-{name}-{}", std::process::id()));
        std::fs::create_dir(&dir).expect("the host has a cgroup2 mount (scripts/setup.sh)");
        ScratchV2(dir)
    }

    fn ids(&self) -> Vec<u32> {
        attached_programs(&self.0).unwrap()
    }
}

impl Drop for ScratchV2 {
    fn drop(&mut self) {
        if let Ok(cgroup) = open_cgroup(&self.0) {
            for info in prog::query(cgroup.as_raw_fd()).unwrap_or_default() {
                let fd = owned(info.fd);
                let _ = prog::detach2(fd.as_raw_fd(), cgroup.as_raw_fd());
            }
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// With CAP_BPF but not CAP_SYS_ADMIN the program attached before cannot be
/// opened, so it was never detached: the new one was added beside it (ANDed, the old one
/// denies the new disk), one more on every change up to the kernel's 64. Now nothing is
/// attached and the error says why. On the real kernel, in a thread without CAP_SYS_ADMIN.
#[test]
fn without_cap_sys_admin_no_program_is_added_beside_one_out_of_reach() {
    let cg = ScratchV2::new("out-of-reach");
    let first = DeviceCgroup::V2(cg.0.clone())
        .apply(&BTreeSet::new(), &[dev(7, 1)].into())
        .unwrap()
        .unwrap();
    assert_eq!(cg.ids(), [first]);
    let dir = cg.0.clone();
    let err = std::thread::spawn(move || {
        caps::drop(
            None,
            caps::CapSet::Effective,
            caps::Capability::CAP_SYS_ADMIN,
        )
        .unwrap();
        // Nor is the cgroup taken for unrestricted because its program is out of reach.
        let cgroup = DeviceCgroup::V2(dir);
        assert_eq!(restricts_devices(&cgroup), Some(true));
        cgroup.apply(&[dev(7, 1)].into(), &[dev(7, 1), dev(7, 2)].into())
    })
    .join()
    .unwrap()
    .unwrap_err();
    assert!(
        matches!(
            err,
            CgroupError::ProgramsOutOfReach {
                attached: 1,
                unopened: 1,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("CAP_SYS_ADMIN"), "{err}");
    assert_eq!(cg.ids(), [first], "no program added");
    // With CAP_SYS_ADMIN the old one is replaced: one program, a new one.
    let second = DeviceCgroup::V2(cg.0.clone())
        .apply(&[dev(7, 1)].into(), &[dev(7, 1), dev(7, 2)].into())
        .unwrap()
        .unwrap();
    assert_ne!(second, first);
    assert_eq!(cg.ids(), [second]);
}

#[test]
fn v1_allows_the_new_and_denies_the_gone() {
    let dir = tempfile::tempdir().unwrap();
    for f in ["devices.allow", "devices.deny"] {
        std::fs::write(dir.path().join(f), "").unwrap();
    }
    let cg = DeviceCgroup::V1(dir.path().into());
    let a: BTreeSet<_> = [dev(7, 1)].into();
    let ab: BTreeSet<_> = [dev(7, 1), dev(7, 2)].into();
    cg.apply(&BTreeSet::new(), &a).unwrap();
    cg.apply(&a, &ab).unwrap();
    cg.apply(&ab, &[dev(7, 2)].into()).unwrap();
    let read = |f| std::fs::read_to_string(dir.path().join(f)).unwrap();
    assert_eq!(read("devices.allow"), "b 7:1 rwmb 7:2 rwm");
    assert_eq!(read("devices.deny"), "b 7:1 rwm");
}

#[test]
fn the_program_allows_every_wanted_disk_and_nothing_else() {
    let wanted: BTreeSet<_> = [dev(7, 1), dev(7, 2), dev(8, 16)].into();
    let p = program_for(&wanted).unwrap();
    let run =
        |typ, major, minor, access: &str| p.execute(typ, major, minor, access.into()).unwrap() == 1;
    for d in &wanted {
        assert!(run(LinuxDeviceType::B, d.major, d.minor, "rw"), "{d}");
    }
    assert!(!run(LinuxDeviceType::B, 7, 3, "r"));
    assert!(!run(LinuxDeviceType::B, 8, 0, "rw"));
    assert!(run(LinuxDeviceType::B, 7, 3, "m"), "mknod stays allowed");
    assert!(run(LinuxDeviceType::C, 1, 3, "rw"), "/dev/null");
    assert!(run(LinuxDeviceType::C, 10, 232, "rw"), "/dev/kvm");
    assert!(!run(LinuxDeviceType::C, 4, 1, "rw"), "a tty of the host");
    // Rebuilt with one disk fewer: exactly that one is gone.
    let fewer: BTreeSet<_> = [dev(7, 1), dev(8, 16)].into();
    let p = program_for(&fewer).unwrap();
    assert_eq!(p.execute(LinuxDeviceType::B, 7, 2, "r".into()).unwrap(), 0);
    assert_eq!(p.execute(LinuxDeviceType::B, 7, 1, "r".into()).unwrap(), 1);
}
