//! The host CPUs this process may run on: its scheduler affinity, which in a pod is the pod's
//! cpuset (what the node's CPU manager granted). Dedicated vCPUs are pinned to these, and
//! whether they are the VM's alone is judged here (`not_exclusive_because`).

use std::path::Path;

use nix::sched::{sched_getaffinity, CpuSet};
use nix::unistd::Pid;

#[derive(Debug, thiserror::Error)]
pub enum CpusError {
    #[error("cannot read this process's CPU affinity")]
    Affinity(#[source] nix::Error),
}

/// The CPUs of this process's affinity mask, in ascending order.
pub fn own_cpus() -> Result<Vec<u32>, CpusError> {
    let set = sched_getaffinity(Pid::from_raw(0)).map_err(CpusError::Affinity)?;
    Ok((0..CpuSet::count())
        .filter(|&cpu| set.is_set(cpu).unwrap_or(false))
        .map(|cpu| cpu as u32)
        .collect())
}

/// Why the launcher's CPUs `own` (its affinity, where dedicated vCPUs get pinned) may be shared
/// with other processes, or `None` if they may be its alone. `online` are the host's online
/// CPUs, `exclusive` those the kernel reserves for the launcher's cgroup (cgroup v2
/// `cpuset.cpus.exclusive.effective`; empty where unset or unsupported).
///
/// The rule, from what a launcher can see of itself:
/// - CPUs the kernel reserves for its cgroup are proven exclusive: no sibling cgroup may use them.
/// - An affinity of every online CPU is proof of the opposite: nothing set any CPU aside, so every
///   other process, the host's interrupts, and every other launcher (which pins its vCPU 0 to
///   the same first CPU) run there too. That is a host run without a cpuset, or a pod without
///   Guaranteed QoS and the kubelet's static CPU manager.
/// - A narrower affinity is a cpuset someone chose for this launcher (the static CPU manager
///   gives a Guaranteed container exactly its exclusive CPUs; an operator a `taskset`) and is
///   taken as meant. From inside a container it cannot be told from the CPU manager's shared
///   pool, so that case is not flagged: flagging it would warn on the right set-up too.
pub(crate) fn not_exclusive_because(
    own: &[u32],
    online: &[u32],
    exclusive: &[u32],
) -> Option<String> {
    if !own.is_empty() && own.iter().all(|cpu| exclusive.contains(cpu)) {
        return None;
    }
    if !online.is_empty() && online.iter().all(|cpu| own.contains(cpu)) {
        return Some(format!(
            "the launcher may run on every online CPU ({}): no cpuset reserves them for this VM, \
             so other processes, the host's interrupts and other launchers share the CPUs its \
             vCPUs are pinned to",
            cpu_list(own)
        ));
    }
    None
}

/// [`not_exclusive_because`] for this process's CPUs `own` on this host: the online CPUs from
/// `sys_cpu` (`/sys/devices/system/cpu`), the exclusive ones from the launcher's cgroup v2
/// directory `cgroup` if it has one. What cannot be read counts as none.
pub(crate) fn own_not_exclusive_because(
    own: &[u32],
    sys_cpu: &Path,
    cgroup: Option<&Path>,
) -> Option<String> {
    let read = |path: &Path| {
        std::fs::read_to_string(path)
            .ok()
            .and_then(|text| parse_cpu_list(&text))
            .unwrap_or_default()
    };
    let online = read(&sys_cpu.join("online"));
    let exclusive = cgroup
        .map(|dir| read(&dir.join("cpuset.cpus.exclusive.effective")))
        .unwrap_or_default();
    not_exclusive_because(own, &online, &exclusive)
}

/// The kernel's CPU list format (`0-3,8,10-11`, empty for none); `None` if malformed.
fn parse_cpu_list(text: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let (first, last): (u32, u32) = match part.split_once('-') {
            Some((a, b)) => (a.parse().ok()?, b.parse().ok()?),
            None => {
                let cpu = part.parse().ok()?;
                (cpu, cpu)
            }
        };
        if first > last {
            return None;
        }
        cpus.extend(first..=last);
    }
    Some(cpus)
}

/// CPUs as the message shows them: `0,1,2`.
fn cpu_list(cpus: &[u32]) -> String {
    cpus.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpus_are_shared_when_the_affinity_is_every_online_cpu_and_none_is_reserved() {
        let online = [0, 1, 2, 3];
        // A host run without a cpuset, or a pod without the static CPU manager.
        let why = not_exclusive_because(&online, &online, &[]).unwrap();
        assert!(why.contains("every online CPU (0,1,2,3)"), "{why}");
        // ... unless the kernel reserves them all for the launcher's cgroup.
        assert_eq!(not_exclusive_because(&online, &online, &online), None);
        // Reserving some of them is not enough: the rest are shared.
        assert!(not_exclusive_because(&online, &online, &[2, 3]).is_some());
        // A narrower affinity was chosen for this launcher (the CPU manager's grant).
        assert_eq!(not_exclusive_because(&[2, 3], &online, &[]), None);
        // Online CPUs unknown: nothing is claimed either way.
        assert_eq!(not_exclusive_because(&[0, 1], &[], &[]), None);
    }

    #[test]
    fn the_host_files_are_read_from_the_roots_given() {
        let sys = tempfile::tempdir().unwrap();
        let cgroup = tempfile::tempdir().unwrap();
        std::fs::write(sys.path().join("online"), "0-1,3\n").unwrap();
        let own = [0, 1, 3];
        assert!(own_not_exclusive_because(&own, sys.path(), Some(cgroup.path())).is_some());
        std::fs::write(
            cgroup.path().join("cpuset.cpus.exclusive.effective"),
            "0-1,3\n",
        )
        .unwrap();
        assert_eq!(
            own_not_exclusive_because(&own, sys.path(), Some(cgroup.path())),
            None
        );
        assert_eq!(own_not_exclusive_because(&[0, 1], sys.path(), None), None);
    }

    #[test]
    fn cpu_lists_parse_ranges_and_refuse_garbage() {
        assert_eq!(parse_cpu_list("0-2,5,7-8\n"), Some(vec![0, 1, 2, 5, 7, 8]));
        assert_eq!(parse_cpu_list("\n"), Some(vec![]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("a"), None);
    }

    #[test]
    fn own_cpus_follow_the_affinity_mask() {
        // Run the check in a thread whose mask this test narrows to one CPU it already has.
        let all = own_cpus().unwrap();
        assert!(!all.is_empty());
        let last = *all.last().unwrap();
        std::thread::spawn(move || {
            let mut one = CpuSet::new();
            one.set(last as usize).unwrap();
            nix::sched::sched_setaffinity(Pid::from_raw(0), &one).unwrap();
            assert_eq!(own_cpus().unwrap(), vec![last]);
        })
        .join()
        .unwrap();
    }
}
