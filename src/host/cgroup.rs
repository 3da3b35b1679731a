//! Device allowance in the cgroup QEMU runs in: cgroup v1 `devices.allow` / `devices.deny`, and
//! on cgroup v2 an eBPF device program (youki's `libcgroups` builds it) rebuilt from the
//! **complete** allow-list every time — what QEMU always needs plus every block device the VM
//! uses — so that a new attach never drops an earlier disk (KubeVirt #10689).
//!
//! The v2 program replaces whatever was attached before: the new one is attached first
//! (`BPF_F_ALLOW_MULTI`), then every older one is detached, so there is no moment without a
//! program. RLIMIT_MEMLOCK is not raised: kernels since 5.11 charge BPF memory to the memory
//! cgroup, and raising it needs CAP_SYS_RESOURCE, which a pod does not have.
//!
//! Cgroup roots and the process's cgroup file come in as parameters; nothing here looks at
//! `/sys/fs/cgroup` by itself.

use std::collections::BTreeSet;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use libcgroups::v2::devices::bpf::{prog, BpfError};
use libcgroups::v2::devices::program::{Program, ProgramError};
use nix::fcntl::{open, OFlag};
use nix::sys::stat::Mode;
use oci_spec::runtime::{LinuxDeviceCgroup, LinuxDeviceCgroupBuilder, LinuxDeviceType};

use super::devnode::DevNumber;

const LICENSE: &str = "Apache";

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {rule:?} to {path}")]
    Write {
        path: PathBuf,
        rule: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open cgroup {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error("cannot build the device program for {rules} rules")]
    Program {
        rules: usize,
        #[source]
        source: ProgramError,
    },
    #[error("cannot {action} the device program on {path}")]
    Bpf {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: BpfError,
    },
}

/// Where the cgroup hierarchies that can restrict devices are mounted.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CgroupRoots {
    /// The cgroup v1 hierarchy with the `devices` controller (`/sys/fs/cgroup/devices`).
    pub v1_devices: Option<PathBuf>,
    /// The cgroup2 mount (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a hybrid host).
    pub unified: Option<PathBuf>,
}

impl CgroupRoots {
    /// Reads the mounts from `/proc/self/mountinfo` text.
    pub fn from_mountinfo(text: &str) -> CgroupRoots {
        let mut roots = CgroupRoots::default();
        for line in text.lines() {
            // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let mount_point = left.split(' ').nth(4);
            let mut right = right.split(' ');
            let (fstype, super_opts) = (right.next(), right.nth(1));
            let Some(mount_point) = mount_point else {
                continue;
            };
            let mount_point = PathBuf::from(mount_point.replace("\\040", " "));
            match fstype {
                Some("cgroup2") if roots.unified.is_none() => roots.unified = Some(mount_point),
                Some("cgroup")
                    if roots.v1_devices.is_none()
                        && super_opts.is_some_and(|o| o.split(',').any(|o| o == "devices")) =>
                {
                    roots.v1_devices = Some(mount_point)
                }
                _ => {}
            }
        }
        roots
    }

    /// This host's hierarchies.
    pub fn detect() -> Result<CgroupRoots, CgroupError> {
        let path = Path::new("/proc/self/mountinfo");
        let text = std::fs::read_to_string(path).map_err(|source| CgroupError::Read {
            path: path.into(),
            source,
        })?;
        Ok(CgroupRoots::from_mountinfo(&text))
    }

    /// The cgroups whose device rules apply to the process whose `/proc/<pid>/cgroup` is `text`.
    /// A root cgroup restricts nothing and is left alone.
    pub fn device_cgroups_of(&self, text: &str) -> Vec<DeviceCgroup> {
        let mut found = Vec::new();
        for line in text.lines() {
            let mut parts = line.splitn(3, ':');
            let (Some(id), Some(controllers), Some(path)) =
                (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let relative = path.trim_start_matches('/');
            if relative.is_empty() {
                continue;
            }
            if id == "0" && controllers.is_empty() {
                if let Some(root) = &self.unified {
                    found.push(DeviceCgroup::V2(root.join(relative)));
                }
            } else if controllers.split(',').any(|c| c == "devices") {
                if let Some(root) = &self.v1_devices {
                    found.push(DeviceCgroup::V1(root.join(relative)));
                }
            }
        }
        found
    }
}

/// One cgroup whose device rules the launcher keeps.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub enum DeviceCgroup {
    V1(PathBuf),
    V2(PathBuf),
}

impl DeviceCgroup {
    pub fn path(&self) -> &Path {
        match self {
            DeviceCgroup::V1(p) | DeviceCgroup::V2(p) => p,
        }
    }

    /// Moves the rules from `previous` to `wanted`, the complete set of block devices QEMU may
    /// use. v1: allows what is new, denies what is gone. v2: a new program from `wanted` replaces
    /// the attached one; returns its id.
    pub fn apply(
        &self,
        previous: &BTreeSet<DevNumber>,
        wanted: &BTreeSet<DevNumber>,
    ) -> Result<Option<u32>, CgroupError> {
        match self {
            DeviceCgroup::V1(dir) => {
                for dev in wanted.difference(previous) {
                    write_rule(&dir.join("devices.allow"), &v1_rule(*dev))?;
                }
                for dev in previous.difference(wanted) {
                    write_rule(&dir.join("devices.deny"), &v1_rule(*dev))?;
                }
                Ok(None)
            }
            DeviceCgroup::V2(dir) => replace_program(dir, wanted).map(Some),
        }
    }
}

fn v1_rule(dev: DevNumber) -> String {
    format!("b {}:{} rwm", dev.major, dev.minor)
}

fn write_rule(path: &Path, rule: &str) -> Result<(), CgroupError> {
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new().append(true).open(path)?;
        f.write_all(rule.as_bytes())
    };
    write().map_err(|source| CgroupError::Write {
        path: path.into(),
        rule: rule.into(),
        source,
    })
}

fn rule(
    typ: LinuxDeviceType,
    major: Option<i64>,
    minor: Option<i64>,
    access: &str,
) -> LinuxDeviceCgroup {
    let mut b = LinuxDeviceCgroupBuilder::default()
        .allow(true)
        .typ(typ)
        .access(access.to_string());
    if let Some(major) = major {
        b = b.major(major);
    }
    if let Some(minor) = minor {
        b = b.minor(minor);
    }
    b.build().expect("every field of a device rule is set")
}

/// What QEMU needs whatever its disks: mknod of any node (as runc allows), the standard
/// character devices, ptys, tun/tap, KVM, vhost-net and vhost-vsock.
pub fn default_rules() -> Vec<LinuxDeviceCgroup> {
    use LinuxDeviceType::{B, C};
    let mut rules = vec![rule(C, None, None, "m"), rule(B, None, None, "m")];
    for (major, minor) in [
        (1, 3),    // null
        (1, 5),    // zero
        (1, 7),    // full
        (1, 8),    // random
        (1, 9),    // urandom
        (5, 0),    // tty
        (5, 1),    // console
        (5, 2),    // ptmx
        (10, 200), // net/tun
        (10, 232), // kvm
        (10, 238), // vhost-net
        (10, 241), // vhost-vsock
    ] {
        rules.push(rule(C, Some(major), Some(minor), "rwm"));
    }
    rules.push(rule(C, Some(136), None, "rwm")); // pts
    rules
}

/// The complete allow-list for a VM using the block devices `wanted`.
pub fn rules_for(wanted: &BTreeSet<DevNumber>) -> Vec<LinuxDeviceCgroup> {
    let mut rules = default_rules();
    for dev in wanted {
        rules.push(rule(
            LinuxDeviceType::B,
            Some(dev.major.into()),
            Some(dev.minor.into()),
            "rwm",
        ));
    }
    rules
}

/// The v2 device program (default deny) for the block devices `wanted`.
pub fn program_for(wanted: &BTreeSet<DevNumber>) -> Result<Program, CgroupError> {
    let rules = rules_for(wanted);
    Program::from_rules(&rules, false).map_err(|source| CgroupError::Program {
        rules: rules.len(),
        source,
    })
}

/// Takes ownership of a descriptor a libcgroups call returned.
fn owned(fd: i32) -> OwnedFd {
    // SAFETY: `fd` was just returned by a successful bpf(2) call (libbpf), so it is an open
    // descriptor that nothing else owns; from here on `OwnedFd` closes it exactly once.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn open_cgroup(dir: &Path) -> Result<OwnedFd, CgroupError> {
    open(
        dir,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|source| CgroupError::Open {
        path: dir.into(),
        source,
    })
}

/// The ids of the device programs attached to the cgroup v2 directory `dir`.
pub fn attached_programs(dir: &Path) -> Result<Vec<u32>, CgroupError> {
    let cgroup = open_cgroup(dir)?;
    let infos = prog::query(cgroup.as_raw_fd()).map_err(|source| CgroupError::Bpf {
        action: "query",
        path: dir.into(),
        source,
    })?;
    Ok(infos
        .into_iter()
        .map(|info| {
            drop(owned(info.fd));
            info.id
        })
        .collect())
}

/// Attaches a program built from `wanted` to `dir`, then detaches every program attached before
/// it. Returns the new program's id.
fn replace_program(dir: &Path, wanted: &BTreeSet<DevNumber>) -> Result<u32, CgroupError> {
    let program = program_for(wanted)?;
    let cgroup = open_cgroup(dir)?;
    let bpf_err = |action| {
        move |source| CgroupError::Bpf {
            action,
            path: dir.into(),
            source,
        }
    };
    let old: Vec<(u32, OwnedFd)> = prog::query(cgroup.as_raw_fd())
        .map_err(bpf_err("query"))?
        .into_iter()
        .map(|info| (info.id, owned(info.fd)))
        .collect();
    let new = owned(prog::load(LICENSE, program.bytecodes()).map_err(bpf_err("load"))?);
    prog::attach(new.as_raw_fd(), cgroup.as_raw_fd()).map_err(bpf_err("attach"))?;
    let old_ids: BTreeSet<u32> = old.iter().map(|(id, _)| *id).collect();
    for (_, fd) in &old {
        prog::detach2(fd.as_raw_fd(), cgroup.as_raw_fd()).map_err(bpf_err("detach"))?;
    }
    let now = prog::query(cgroup.as_raw_fd()).map_err(bpf_err("query"))?;
    let mut new_id = None;
    for info in now {
        drop(owned(info.fd));
        if !old_ids.contains(&info.id) {
            new_id = Some(info.id);
        }
    }
    Ok(new_id.unwrap_or_default())
}

#[cfg(test)]
mod tests {
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
            roots.unified.as_deref(),
            Some(Path::new("/sys/fs/cgroup/unified"))
        );
        assert_eq!(
            roots.v1_devices.as_deref(),
            Some(Path::new("/sys/fs/cgroup/devices"))
        );
        let cgroups = roots
            .device_cgroups_of("9:name=systemd:/\n5:devices:/pod/x\n4:memory:/pod/x\n0::/pod/y\n");
        assert_eq!(
            cgroups,
            [
                DeviceCgroup::V1("/sys/fs/cgroup/devices/pod/x".into()),
                DeviceCgroup::V2("/sys/fs/cgroup/unified/pod/y".into())
            ]
        );
        // Root cgroups restrict nothing.
        assert!(roots.device_cgroups_of("5:devices:/\n0::/\n").is_empty());
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
        let run = |typ, major, minor, access: &str| {
            p.execute(typ, major, minor, access.into()).unwrap() == 1
        };
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
}
