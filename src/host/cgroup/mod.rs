//! Device allowance in the cgroup QEMU runs in: cgroup v1 `devices.allow` / `devices.deny`, and
//! on cgroup v2 an eBPF device program (youki's `libcgroups` builds it) rebuilt from the
//! **complete** allow-list every time — what QEMU always needs plus every block device the VM
//! uses — so that a new attach never drops an earlier disk (KubeVirt #10689).
//!
//! The v2 program replaces whatever was attached before: the new one is attached first
//! (`BPF_F_ALLOW_MULTI`), then every older one is detached, so there is no moment without a
//! program. RLIMIT_MEMLOCK is not raised: kernels since 5.11 charge BPF memory to the memory
//! cgroup, and raising it needs CAP_SYS_RESOURCE, which a pod does not have (on older kernels
//! a low limit is reported at start, `host::caps::memlock_warning`).
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
use nix::mount::MsFlags;
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
    #[error("cgroup {cgroup} is outside this cgroup namespace")]
    OutsideNamespace { cgroup: String },
    #[error(
        "cgroup {cgroup} is outside the part of its hierarchy mounted at {mount_point} \
         (which holds {root})"
    )]
    OutsideMount {
        cgroup: String,
        mount_point: PathBuf,
        root: PathBuf,
    },
    #[error("cannot mount the cgroup v1 devices hierarchy read-write at {path}")]
    Mount {
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
    #[error("cannot query the device programs on {path}")]
    Query {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "cannot open {unopened} of the {attached} device programs on {path} (opening a program \
         by id needs CAP_SYS_ADMIN): they could not be detached, and with them in place a new \
         program would not allow the new disk; nothing was changed"
    )]
    ProgramsOutOfReach {
        path: PathBuf,
        attached: usize,
        unopened: usize,
    },
}

/// One mounted cgroup hierarchy, from `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CgroupMount {
    /// Where it is mounted (`/sys/fs/cgroup/devices`).
    pub mount_point: PathBuf,
    /// Which directory of the hierarchy is mounted there (mountinfo's field 4): `/` on a host,
    /// the container's own cgroup inside a container without a cgroup namespace. Paths in
    /// `/proc/<pid>/cgroup` are relative to the hierarchy (or the cgroup namespace), so this
    /// prefix is stripped before they are joined onto the mount point.
    pub root: PathBuf,
    pub read_only: bool,
}

impl CgroupMount {
    /// A read-write mount of the whole hierarchy at `mount_point`.
    pub(crate) fn whole(mount_point: impl Into<PathBuf>) -> CgroupMount {
        CgroupMount {
            mount_point: mount_point.into(),
            root: PathBuf::from("/"),
            read_only: false,
        }
    }

    /// The directory of the cgroup `path` (as `/proc/<pid>/cgroup` shows it) under this mount.
    pub(crate) fn dir_of(&self, path: &str) -> Result<PathBuf, CgroupError> {
        let cgroup = Path::new(path);
        if !cgroup.is_absolute()
            || cgroup
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            // `/../..`: the process is in a cgroup outside the reader's cgroup namespace.
            return Err(CgroupError::OutsideNamespace {
                cgroup: path.into(),
            });
        }
        let relative = cgroup
            .strip_prefix(&self.root)
            .map_err(|_| CgroupError::OutsideMount {
                cgroup: path.into(),
                mount_point: self.mount_point.clone(),
                root: self.root.clone(),
            })?;
        Ok(self.mount_point.join(relative))
    }
}

/// Where the cgroup hierarchies that can restrict devices are mounted.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct CgroupRoots {
    /// The cgroup v1 hierarchy with the `devices` controller (`/sys/fs/cgroup/devices`).
    pub v1_devices: Option<CgroupMount>,
    /// The cgroup2 mount (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a hybrid host).
    pub unified: Option<CgroupMount>,
}

/// Mounts `mount` (`(fstype, options)`, `None`: mounted there already) at `dir`, made if
/// missing, and reads back what mountinfo says of the mount at `dir`: its root is what
/// `/proc/<pid>/cgroup` is relative to (the hierarchy's, or the cgroup namespace's).
fn mount_at(dir: &Path, mount: Option<(&str, Option<&str>)>) -> Result<CgroupRoots, CgroupError> {
    std::fs::create_dir_all(dir).map_err(|source| CgroupError::Read {
        path: dir.into(),
        source,
    })?;
    if let Some((fstype, options)) = mount {
        nix::mount::mount(
            Some(fstype),
            dir,
            Some(fstype),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            options,
        )
        .map_err(|source| CgroupError::Mount {
            path: dir.into(),
            source,
        })?;
    }
    let text =
        std::fs::read_to_string("/proc/self/mountinfo").map_err(|source| CgroupError::Read {
            path: "/proc/self/mountinfo".into(),
            source,
        })?;
    Ok(text
        .lines()
        .rfind(|l| l.split(' ').nth(4).map(unescape).as_deref() == Some(dir))
        .map(CgroupRoots::from_mountinfo)
        .unwrap_or_default())
}

/// Undoes mountinfo's octal escapes (`\040` is a space).
fn unescape(field: &str) -> PathBuf {
    PathBuf::from(
        field
            .replace("\\040", " ")
            .replace("\\011", "\t")
            .replace("\\012", "\n")
            .replace("\\134", "\\"),
    )
}

impl CgroupRoots {
    /// Reads the mounts from `/proc/self/mountinfo` text.
    pub(crate) fn from_mountinfo(text: &str) -> CgroupRoots {
        let mut roots = CgroupRoots::default();
        for line in text.lines() {
            // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let mut left = left.split(' ').skip(3);
            let (Some(root), Some(mount_point), Some(options)) =
                (left.next(), left.next(), left.next())
            else {
                continue;
            };
            let mut right = right.split(' ');
            let (fstype, super_opts) = (right.next(), right.nth(1));
            let mount = CgroupMount {
                mount_point: unescape(mount_point),
                root: unescape(root),
                read_only: options.split(',').any(|o| o == "ro"),
            };
            match fstype {
                Some("cgroup2") if roots.unified.is_none() => roots.unified = Some(mount),
                Some("cgroup")
                    if roots.v1_devices.is_none()
                        && super_opts.is_some_and(|o| o.split(',').any(|o| o == "devices")) =>
                {
                    roots.v1_devices = Some(mount)
                }
                _ => {}
            }
        }
        roots
    }

    /// This host's hierarchies.
    pub(crate) fn detect() -> Result<CgroupRoots, CgroupError> {
        let path = Path::new("/proc/self/mountinfo");
        let text = std::fs::read_to_string(path).map_err(|source| CgroupError::Read {
            path: path.into(),
            source,
        })?;
        Ok(CgroupRoots::from_mountinfo(&text))
    }

    /// A container's cgroup v1 mounts are read-only, and cannot be remounted read-write: with
    /// CAP_SYS_ADMIN the devices hierarchy is mounted again, read-write, at `dir` (in this
    /// process's mount namespace only), and used instead. Does nothing when the mount is
    /// writable already.
    pub(crate) fn with_writable_v1(mut self, dir: &Path) -> Result<CgroupRoots, CgroupError> {
        if !self.v1_devices.as_ref().is_some_and(|m| m.read_only) {
            return Ok(self);
        }
        let mounted = CgroupRoots::detect()?
            .v1_devices
            .filter(|m| m.mount_point == dir && !m.read_only);
        let mount = if mounted.is_none() {
            Some(("cgroup", Some("devices")))
        } else {
            None
        };
        self.v1_devices = Some(
            mount_at(dir, mount)?
                .v1_devices
                .unwrap_or_else(|| CgroupMount::whole(dir)),
        );
        Ok(self)
    }

    /// The unified hierarchy, mounted at `dir` when none is (a container on a hybrid host gets
    /// the v1 hierarchies alone), for the programs the launcher attaches to its own cgroup v2.
    /// Only in a mount namespace that is the launcher's own (a container's PID 1).
    pub(crate) fn with_unified(mut self, dir: &Path) -> Result<CgroupRoots, CgroupError> {
        if self.unified.is_some() {
            return Ok(self);
        }
        self.unified = Some(
            mount_at(dir, Some(("cgroup2", None)))?
                .unified
                .unwrap_or_else(|| CgroupMount::whole(dir)),
        );
        Ok(self)
    }

    /// The cgroup v2 directory of the process whose `/proc/<pid>/cgroup` is `text`, if the
    /// unified hierarchy is mounted and the process's cgroup lies in the mounted part.
    pub(crate) fn unified_dir_of(&self, text: &str) -> Option<PathBuf> {
        let mount = self.unified.as_ref()?;
        let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
        mount.dir_of(path).ok()
    }

    /// The cgroups whose device rules apply to the process whose `/proc/<pid>/cgroup` is `text`.
    /// The root of a hierarchy restricts nothing and is left alone; the root of a cgroup
    /// namespace (a container's own cgroup) is not the hierarchy's root, and is kept. A cgroup
    /// outside the mounted part of its hierarchy is an error, never a path outside the mount.
    pub(crate) fn device_cgroups_of(&self, text: &str) -> Result<Vec<DeviceCgroup>, CgroupError> {
        let mut found = Vec::new();
        for line in text.lines() {
            let mut parts = line.splitn(3, ':');
            let (Some(id), Some(controllers), Some(path)) =
                (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            if id == "0" && controllers.is_empty() {
                if let Some(mount) = &self.unified {
                    let dir = mount.dir_of(path)?;
                    // Every cgroup2 directory but the hierarchy's root has `cgroup.type`.
                    if dir != mount.mount_point || dir.join("cgroup.type").exists() {
                        found.push(DeviceCgroup::V2(dir));
                    }
                }
            } else if controllers.split(',').any(|c| c == "devices") {
                if let Some(mount) = &self.v1_devices {
                    let dir = mount.dir_of(path)?;
                    // Only a v1 hierarchy's root has `release_agent`.
                    if dir != mount.mount_point || !dir.join("release_agent").exists() {
                        found.push(DeviceCgroup::V1(dir));
                    }
                }
            }
        }
        Ok(found)
    }
}

/// Whether `cgroup` restricts devices at all: cgroup v1 `devices.list` is `a *:* rwm`, or no
/// device program is attached to a cgroup v2 directory. `None` when that cannot be read.
pub(crate) fn restricts_devices(cgroup: &DeviceCgroup) -> Option<bool> {
    match cgroup {
        DeviceCgroup::V1(dir) => {
            let list = std::fs::read_to_string(dir.join("devices.list")).ok()?;
            Some(!list.lines().any(|l| l.trim() == "a *:* rwm"))
        }
        DeviceCgroup::V2(dir) => attached_programs(dir).ok().map(|p| !p.is_empty()),
    }
}

/// One cgroup whose device rules the launcher keeps.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub enum DeviceCgroup {
    V1(PathBuf),
    V2(PathBuf),
}

impl DeviceCgroup {
    pub(crate) fn path(&self) -> &Path {
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
pub(crate) fn default_rules() -> Vec<LinuxDeviceCgroup> {
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
pub(crate) fn rules_for(wanted: &BTreeSet<DevNumber>) -> Vec<LinuxDeviceCgroup> {
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
pub(crate) fn program_for(wanted: &BTreeSet<DevNumber>) -> Result<Program, CgroupError> {
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

/// The ids of the device programs attached to the cgroup v2 directory `dir`, all of them (also
/// those this process could not open: without CAP_SYS_ADMIN, a cgroup is never taken for
/// unrestricted because its program is out of reach).
pub fn attached_programs(dir: &Path) -> Result<Vec<u32>, CgroupError> {
    attached_ids(&open_cgroup(dir)?, dir)
}

/// The ids of every device program attached to the cgroup `cgroup` (of `dir`), whether this
/// process may open them or not (libcgroups' `prog::query` leaves out those it cannot open).
fn attached_ids(cgroup: &OwnedFd, dir: &Path) -> Result<Vec<u32>, CgroupError> {
    // The kernel allows 64 programs per cgroup and attach type (BPF_CGROUP_MAX_PROGS).
    let mut ids = vec![0_u32; 64];
    let mut count = ids.len() as u32;
    let mut flags = 0_u32;
    // SAFETY: `cgroup` is an open descriptor; `ids` has room for `count` ids, and the other
    // pointers are to live locals; libbpf writes at most `count` ids and then the real count.
    let rc = unsafe {
        libbpf_sys::bpf_prog_query(
            cgroup.as_raw_fd(),
            libbpf_sys::BPF_CGROUP_DEVICE,
            0,
            &mut flags,
            ids.as_mut_ptr(),
            &mut count,
        )
    };
    if rc != 0 {
        return Err(CgroupError::Query {
            path: dir.into(),
            source: std::io::Error::last_os_error(),
        });
    }
    ids.truncate(count as usize);
    Ok(ids)
}

/// Attaches a program built from `wanted` to `dir`, then detaches every program attached before
/// it. Returns the new program's id. Programs on a cgroup are ANDed: one left behind would deny
/// the new disk, and each one left adds up to the kernel's 64. So the old ones must all be
/// detachable before anything is attached (opening a program by id needs CAP_SYS_ADMIN; with
/// CAP_BPF alone they are out of reach), and a failed detach takes the new program off again.
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
    let attached = attached_ids(&cgroup, dir)?;
    let old: Vec<(u32, OwnedFd)> = prog::query(cgroup.as_raw_fd())
        .map_err(bpf_err("query"))?
        .into_iter()
        .map(|info| (info.id, owned(info.fd)))
        .collect();
    let old_ids: BTreeSet<u32> = old.iter().map(|(id, _)| *id).collect();
    let unopened = attached.iter().filter(|id| !old_ids.contains(id)).count();
    if unopened > 0 {
        return Err(CgroupError::ProgramsOutOfReach {
            path: dir.into(),
            attached: attached.len(),
            unopened,
        });
    }
    let new = owned(prog::load(LICENSE, program.bytecodes()).map_err(bpf_err("load"))?);
    prog::attach(new.as_raw_fd(), cgroup.as_raw_fd()).map_err(bpf_err("attach"))?;
    for (_, fd) in &old {
        if let Err(e) = prog::detach2(fd.as_raw_fd(), cgroup.as_raw_fd()) {
            // Back to the programs that were there: never one more each time.
            if let Err(undo) = prog::detach2(new.as_raw_fd(), cgroup.as_raw_fd()) {
                tracing::warn!(path = %dir.display(), error = %undo, "undo: cannot detach the new device program");
            }
            return Err(bpf_err("detach")(e));
        }
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
mod tests;
