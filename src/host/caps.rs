//! Capabilities: what block-device hotplug needs (mknod, chown, cgroup device rules), checked at
//! start so that a missing one is reported plainly instead of failing on the first attach, and
//! the drop of every capability neither the launcher nor its libvirtd and QEMU need.
//!
//! Capabilities are per thread: `drop_unneeded` must run before the async runtime starts its
//! threads (`main` does it first thing for `run`). Dropping from the bounding set also takes them
//! from every process the launcher starts (libvirtd, QEMU).

use caps::{CapSet, Capability, CapsHashSet};

use super::cgroup::CgroupRoots;

#[derive(Debug, thiserror::Error)]
pub enum CapsError {
    #[error("cannot read the {set} capability set")]
    Read {
        set: &'static str,
        #[source]
        source: caps::errors::CapsError,
    },
    #[error("cannot drop {cap} from the {set} set")]
    Drop {
        cap: Capability,
        set: &'static str,
        #[source]
        source: caps::errors::CapsError,
    },
}

/// What the launcher, its private libvirtd and QEMU use. Everything else is dropped.
pub(crate) const NEEDED: [Capability; 23] = [
    Capability::CAP_CHOWN,
    Capability::CAP_DAC_OVERRIDE,
    Capability::CAP_DAC_READ_SEARCH,
    Capability::CAP_FOWNER,
    Capability::CAP_FSETID,
    Capability::CAP_KILL,
    Capability::CAP_SETGID,
    Capability::CAP_SETUID,
    Capability::CAP_SETPCAP,
    Capability::CAP_NET_BIND_SERVICE,
    Capability::CAP_NET_ADMIN,
    Capability::CAP_NET_RAW,
    Capability::CAP_IPC_LOCK,
    Capability::CAP_SYS_CHROOT,
    Capability::CAP_SYS_PTRACE,
    // mount namespace of the private libvirtd, cgroup v1 device rules, bpf on older kernels
    Capability::CAP_SYS_ADMIN,
    Capability::CAP_SYS_NICE,
    Capability::CAP_SYS_RESOURCE,
    // scsi `lun` passthrough
    Capability::CAP_SYS_RAWIO,
    Capability::CAP_MKNOD,
    Capability::CAP_AUDIT_WRITE,
    Capability::CAP_BPF,
    Capability::CAP_PERFMON,
];

/// A hotplug feature this process cannot provide, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable {
    pub feature: &'static str,
    pub why: String,
}

/// Which hotplug features the effective capabilities and the host's cgroups allow.
/// `chown_needed`: the nodes go to another user or group than the launcher's own (giving a file
/// one already owns to one's own ids needs no capability, as for a QEMU that runs as root).
pub(crate) fn check(
    effective: &CapsHashSet,
    roots: &CgroupRoots,
    chown_needed: bool,
) -> Vec<Unavailable> {
    let mut missing = missing_capabilities(effective, roots, chown_needed);
    if roots.v1_devices.is_none() && roots.unified.is_none() {
        missing.push(Unavailable {
            feature: "cgroup device rules",
            why: "no cgroup v1 devices hierarchy and no cgroup2 mount".into(),
        });
    }
    missing
}

/// The capabilities block-device hotplug needs on this host and does not have: with any of them
/// missing, a block volume is refused before its node is made.
pub(crate) fn missing_capabilities(
    effective: &CapsHashSet,
    roots: &CgroupRoots,
    chown_needed: bool,
) -> Vec<Unavailable> {
    let mut missing = Vec::new();
    let mut need = |feature, cap: Capability| {
        if !effective.contains(&cap) {
            missing.push(Unavailable {
                feature,
                why: format!("{cap} is not in the effective set"),
            });
        }
    };
    need("block device nodes (mknod)", Capability::CAP_MKNOD);
    if chown_needed {
        need(
            "giving device nodes to the QEMU user (chown)",
            Capability::CAP_CHOWN,
        );
    }
    if roots.v1_devices.is_some() {
        need("cgroup v1 device rules", Capability::CAP_SYS_ADMIN);
    }
    // CAP_BPF loads and attaches a program, but replacing the one attached before means opening
    // it by id (bpf_prog_get_fd_by_id), which needs CAP_SYS_ADMIN: with CAP_BPF alone the old
    // program stays, and ANDed with the new one it denies the new disk.
    if roots.unified.is_some() && !effective.contains(&Capability::CAP_SYS_ADMIN) {
        missing.push(Unavailable {
            feature: "cgroup v2 device programs (bpf)",
            why: "CAP_SYS_ADMIN is not in the effective set (CAP_BPF alone cannot open the \
                  programs attached before to detach them)"
                .into(),
        });
    }
    missing
}

/// Kernels before 5.11 charge BPF programs to RLIMIT_MEMLOCK, not to the memory cgroup: with a
/// low limit, loading a device program fails with EPERM. What to say about it, on such a kernel
/// (`release` as `uname -r` gives it) with a soft limit of `memlock` bytes.
pub(crate) fn memlock_warning(release: &str, memlock: u64) -> Option<String> {
    /// A device program and its bookkeeping take a few pages; QEMU locks none of this limit
    /// (the launcher does not lock guest memory).
    const ENOUGH: u64 = 1 << 20;
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().ok());
    let (Some(Some(major)), Some(Some(minor))) = (numbers.next(), numbers.next()) else {
        return None;
    };
    if (major, minor) >= (5, 11) || memlock >= ENOUGH {
        return None;
    }
    Some(format!(
        "kernel {release} charges BPF programs to RLIMIT_MEMLOCK, which is {} KiB here: cgroup v2 \
         device programs may fail to load (EPERM); raise it to at least {} KiB (ulimit -l, or \
         the container runtime's memlock limit)",
        memlock / 1024,
        ENOUGH / 1024
    ))
}

/// [`memlock_warning`] for this host, when it uses cgroup v2 device programs.
pub(crate) fn memlock_warning_here(roots: &CgroupRoots) -> Option<String> {
    roots.unified.as_ref()?;
    let release = nix::sys::utsname::uname().ok()?;
    let (soft, _) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_MEMLOCK).ok()?;
    memlock_warning(&release.release().to_string_lossy(), soft)
}

/// This thread's effective set.
pub(crate) fn effective() -> Result<CapsHashSet, CapsError> {
    caps::read(None, CapSet::Effective).map_err(|source| CapsError::Read {
        set: "effective",
        source,
    })
}

/// Drops every capability not in `NEEDED` from the bounding, inheritable, permitted and
/// effective sets of the calling thread (call it while the process has one thread). Returns
/// what was dropped.
pub fn drop_unneeded() -> Result<Vec<Capability>, CapsError> {
    let keep: CapsHashSet = NEEDED.into_iter().collect();
    let mut dropped = Vec::new();
    let bounding = caps::read(None, CapSet::Bounding).map_err(|source| CapsError::Read {
        set: "bounding",
        source,
    })?;
    for cap in caps::all() {
        if keep.contains(&cap) {
            continue;
        }
        let mut any = false;
        // Bounding first (it needs CAP_SETPCAP, which we keep), then the others.
        for (set, name) in [
            (CapSet::Bounding, "bounding"),
            (CapSet::Inheritable, "inheritable"),
            (CapSet::Effective, "effective"),
            (CapSet::Permitted, "permitted"),
        ] {
            let has = match set {
                CapSet::Bounding => bounding.contains(&cap),
                _ => caps::has_cap(None, set, cap)
                    .map_err(|source| CapsError::Read { set: name, source })?,
            };
            if has {
                caps::drop(None, set, cap).map_err(|source| CapsError::Drop {
                    cap,
                    set: name,
                    source,
                })?;
                any = true;
            }
        }
        if any {
            dropped.push(cap);
        }
    }
    Ok(dropped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::cgroup::CgroupMount;

    #[test]
    fn names_what_is_missing_and_why() {
        let roots = CgroupRoots {
            v1_devices: Some(CgroupMount::whole("/sys/fs/cgroup/devices")),
            unified: Some(CgroupMount::whole("/sys/fs/cgroup/unified")),
        };
        let all: CapsHashSet = NEEDED.into_iter().collect();
        assert!(check(&all, &roots, true).is_empty());
        let mut some = all.clone();
        some.remove(&Capability::CAP_MKNOD);
        some.remove(&Capability::CAP_SYS_ADMIN);
        some.remove(&Capability::CAP_BPF);
        some.remove(&Capability::CAP_CHOWN);
        // A pod's launcher has no CAP_CHOWN, and needs none for nodes that stay root's.
        assert!(!check(&some, &roots, false)
            .iter()
            .any(|m| m.why.contains("CAP_CHOWN")));
        let missing = check(&some, &roots, true);
        let features: Vec<_> = missing.iter().map(|m| m.feature).collect();
        assert_eq!(
            features,
            [
                "block device nodes (mknod)",
                "giving device nodes to the QEMU user (chown)",
                "cgroup v1 device rules",
                "cgroup v2 device programs (bpf)"
            ]
        );
        assert_eq!(missing[0].why, "CAP_MKNOD is not in the effective set");
    }

    /// CAP_BPF without CAP_SYS_ADMIN is not enough for cgroup v2: the program attached before
    /// cannot be opened to detach it (it was once taken as enough).
    #[test]
    fn cap_bpf_alone_is_not_enough_for_cgroup_v2() {
        let v2 = CgroupRoots {
            v1_devices: None,
            unified: Some(CgroupMount::whole("/sys/fs/cgroup")),
        };
        let mut bpf_only: CapsHashSet = NEEDED.into_iter().collect();
        bpf_only.remove(&Capability::CAP_SYS_ADMIN);
        let missing = missing_capabilities(&bpf_only, &v2, true);
        assert_eq!(missing.len(), 1, "{missing:?}");
        assert_eq!(missing[0].feature, "cgroup v2 device programs (bpf)");
        assert!(
            missing[0].why.starts_with("CAP_SYS_ADMIN is not"),
            "{missing:?}"
        );
        // No cgroup at all is reported, but is no missing capability.
        let none = CgroupRoots::default();
        assert!(missing_capabilities(&NEEDED.into_iter().collect(), &none, true).is_empty());
        assert_eq!(check(&NEEDED.into_iter().collect(), &none, true).len(), 1);
    }

    #[test]
    fn memlock_matters_before_linux_5_11_only() {
        let low = 64 << 10;
        let warning = memlock_warning("5.10.0-28-amd64", low).unwrap();
        assert!(
            warning.starts_with(
                "kernel 5.10.0-28-amd64 charges BPF programs to RLIMIT_MEMLOCK, which is 64 KiB"
            ),
            "{warning}"
        );
        assert_eq!(memlock_warning("4.19.0", 8 << 20), None, "enough");
        assert_eq!(memlock_warning("5.11.0", low), None, "memory cgroup");
        assert_eq!(memlock_warning("6.18.44-fc-v669", low), None);
        assert_eq!(memlock_warning("garbage", low), None);
    }

    #[test]
    fn dropping_in_a_thread_of_its_own_keeps_what_is_needed() {
        // Capabilities are per thread: a scratch thread keeps the test process intact.
        std::thread::spawn(|| {
            drop_unneeded().unwrap();
            let permitted = caps::read(None, CapSet::Permitted).unwrap();
            assert!(!permitted.contains(&Capability::CAP_SYS_MODULE));
            assert!(!permitted.contains(&Capability::CAP_SYS_TIME));
            assert!(permitted.is_subset(&NEEDED.into_iter().collect()));
        })
        .join()
        .unwrap();
    }
}
