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
pub const NEEDED: [Capability; 23] = [
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
pub fn check(effective: &CapsHashSet, roots: &CgroupRoots) -> Vec<Unavailable> {
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
    need(
        "giving device nodes to the QEMU user (chown)",
        Capability::CAP_CHOWN,
    );
    if roots.v1_devices.is_some() {
        need("cgroup v1 device rules", Capability::CAP_SYS_ADMIN);
    }
    if roots.unified.is_some()
        && !effective.contains(&Capability::CAP_SYS_ADMIN)
        && !effective.contains(&Capability::CAP_BPF)
    {
        missing.push(Unavailable {
            feature: "cgroup v2 device programs (bpf)",
            why: "neither CAP_BPF nor CAP_SYS_ADMIN is in the effective set".into(),
        });
    }
    if roots.v1_devices.is_none() && roots.unified.is_none() {
        missing.push(Unavailable {
            feature: "cgroup device rules",
            why: "no cgroup v1 devices hierarchy and no cgroup2 mount".into(),
        });
    }
    missing
}

/// This thread's effective set.
pub fn effective() -> Result<CapsHashSet, CapsError> {
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
        assert!(check(&all, &roots).is_empty());
        let mut some = all.clone();
        some.remove(&Capability::CAP_MKNOD);
        some.remove(&Capability::CAP_SYS_ADMIN);
        some.remove(&Capability::CAP_BPF);
        let missing = check(&some, &roots);
        let features: Vec<_> = missing.iter().map(|m| m.feature).collect();
        assert_eq!(
            features,
            [
                "block device nodes (mknod)",
                "cgroup v1 device rules",
                "cgroup v2 device programs (bpf)"
            ]
        );
        assert_eq!(missing[0].why, "CAP_MKNOD is not in the effective set");
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
