//! libvirtd held on one CPU while it starts, and given the launcher's CPUs back once it answers.
//!
//! libvirt's QEMU driver reads the host's CPUID once, as it starts (`virCPUDataGetHost`, on its
//! `daemon-init` thread), and from then on compares it with the CPUID recorded in each cached
//! QEMU capability set it looks up (`virCPUDataIsIdentical`, at every lookup): a set recorded
//! elsewhere is stale ("host cpuid changed") and QEMU is probed again, 4 s against 0.4. On a
//! machine whose cores report different CPUID (this project's nested-PVM test host once
//! reported leaf 0x1f on one core only; hybrid CPUs report their core's type) the shared cache
//! (`capcache`) then held only for daemons that happened to start on the core it was probed on.
//! So every private libvirtd starts on the lowest CPU the launcher may use: all of them read
//! CPUID on that core.
//!
//! Only while it starts ([`Trick::BriefPin`]): held there for its whole life (as before issue
//! 46), every libvirtd of a node, and libvirtd's part of every start and Sync (the capability
//! load, building QEMU's command line, its monitor), ran on that one core, and a storm of starts
//! queued on it. The daemon answers its socket only once its drivers are up, so by then CPUID
//! is read (traced with uprobes on libvirt 9.0: `virCPUDataGetHost` once, on `daemon-init`,
//! before the first client is served). Guest QEMUs were never held: libvirt gives each all the
//! host's CPUs (`qemuProcessInitCpuAffinity`).

use std::fs;

use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::unistd::Pid;

use crate::tricks::{enabled, Trick};

/// A set holding only the lowest CPU this process may run on: where a libvirtd starts.
pub(super) fn start_cpu() -> Option<CpuSet> {
    let allowed = sched_getaffinity(Pid::from_raw(0)).ok()?;
    let first = (0..CpuSet::count()).find(|&c| allowed.is_set(c).unwrap_or(false))?;
    let mut one = CpuSet::new();
    one.set(first).ok()?;
    Some(one)
}

/// Gives every thread of the started daemon `pid` the CPUs this process may run on, once the
/// daemon answers (with the trick; without it, the daemon stays where it started). A thread
/// that goes or comes meanwhile is no error: a new one inherits the set of the thread that made
/// it, and the main thread, which makes libvirt's workers, goes first.
pub(super) fn release(pid: i32) {
    if !enabled(Trick::BriefPin) {
        return;
    }
    let Ok(allowed) = sched_getaffinity(Pid::from_raw(0)) else {
        return;
    };
    let mut done = vec![pid];
    let _ = sched_setaffinity(Pid::from_raw(pid), &allowed);
    // Until a pass finds no thread it has not seen: one made during the walk is then seen.
    loop {
        let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
            return;
        };
        let new: Vec<i32> = tasks
            .filter_map(|t| t.ok()?.file_name().to_str()?.parse().ok())
            .filter(|tid| !done.contains(tid))
            .collect();
        if new.is_empty() {
            return;
        }
        for tid in new {
            if let Err(e) = sched_setaffinity(Pid::from_raw(tid), &allowed) {
                tracing::debug!(tid, error = %e, "cannot widen a libvirtd thread's CPUs");
            }
            done.push(tid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(set: &CpuSet) -> usize {
        (0..CpuSet::count())
            .filter(|&c| set.is_set(c).unwrap_or(false))
            .count()
    }

    /// On this process: a thread of its own held on one CPU, as a daemon's threads are while it
    /// starts, gets every CPU of the releasing thread back.
    #[test]
    fn every_thread_of_a_started_daemon_gets_the_launchers_cpus_back() {
        let allowed = sched_getaffinity(Pid::from_raw(0)).unwrap();
        let one = start_cpu().unwrap();
        assert_eq!(count(&one), 1);
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (check_tx, check_rx) = std::sync::mpsc::channel::<()>();
        let held = std::thread::spawn(move || {
            sched_setaffinity(Pid::from_raw(0), &one).unwrap();
            held_tx.send(()).unwrap();
            check_rx.recv().unwrap();
            sched_getaffinity(Pid::from_raw(0)).unwrap()
        });
        held_rx.recv().unwrap();
        release(std::process::id() as i32);
        check_tx.send(()).unwrap();
        assert_eq!(count(&held.join().unwrap()), count(&allowed));
    }
}
