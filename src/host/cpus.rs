//! The host CPUs this process may run on: its scheduler affinity, which in a pod is the pod's
//! cpuset (what the node's CPU manager granted). Dedicated vCPUs are pinned to these.

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

#[cfg(test)]
mod tests {
    use super::*;

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
