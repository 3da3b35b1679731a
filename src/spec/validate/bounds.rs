//! Every count and size that comes from outside has a ceiling, so that a spec can neither make the
//! launcher do unbounded work nor make libvirt or QEMU refuse, overflow or truncate what the
//! launcher already accepted (`cores: 65536, sockets: 65536` multiplied to 0 vCPUs in a `u32`).

use super::Problems;
use crate::spec::model::VirtualMachineInstance;
use crate::spec::problem::Problem;
use crate::spec::quantity::Quantity;

/// QEMU 7.2's q35 machine takes at most 288 vCPUs (`-smp` beyond it is refused at start).
pub(crate) const MAX_VCPUS: u64 = 288;
/// Disks (and volumes): the launcher's SCSI controller addresses 256 units; KubeVirt has no
/// lower limit, but nothing useful runs with more.
pub(crate) const MAX_DISKS: usize = 256;
pub(crate) const MAX_VOLUMES: usize = 256;
/// The largest image the launcher creates or accepts a capacity for: qcow2 and ext4 stop near
/// here, and no PVC is larger.
pub(crate) const MAX_CAPACITY: u64 = 2 << 50;
const MAX_CAPACITY_TEXT: &str = "2Pi";

/// Refuses more disks or volumes than the launcher handles. Returns false when the spec is over
/// a count, so that the per-item checks (some of them quadratic) are not run on it.
pub(super) fn check_counts(vmi: &VirtualMachineInstance, e: &mut Problems) -> bool {
    let disks = vmi.spec.domain.devices.disks.len();
    let volumes = vmi.spec.volumes.len();
    let mut within = true;
    for (path, what, count, max) in [
        ("spec.domain.devices.disks", "disks", disks, MAX_DISKS),
        ("spec.volumes", "volumes", volumes, MAX_VOLUMES),
    ] {
        if count > max {
            e.add(path, Problem::TooMany { count, what, max });
            within = false;
        }
    }
    within
}

/// The vCPUs a topology gives, refused above [`MAX_VCPUS`] (counted wide: three `u32`s can
/// overflow even a `u64`).
pub(super) fn check_topology(sockets: u32, cores: u32, threads: u32, e: &mut Problems) {
    let count = u128::from(sockets) * u128::from(cores) * u128::from(threads);
    if count > u128::from(MAX_VCPUS) {
        e.add(
            "spec.domain.cpu",
            Problem::TooManyVcpus {
                count,
                from: " (sockets × cores × threads)",
                max: MAX_VCPUS,
            },
        );
    }
}

/// A CPU quantity (`resources.*.cpu`) that would become more than [`MAX_VCPUS`] vCPUs.
pub(super) fn check_cpu_quantity(path: String, cpus: f64, e: &mut Problems) {
    if cpus.ceil() > MAX_VCPUS as f64 {
        e.add(
            path,
            Problem::TooManyVcpus {
                count: cpus.ceil() as u128,
                from: "",
                max: MAX_VCPUS,
            },
        );
    }
}

/// A disk capacity: a valid quantity, more than 0, at most [`MAX_CAPACITY`].
pub(super) fn check_capacity(path: String, capacity: &Quantity, e: &mut Problems) {
    match capacity.to_bytes() {
        Ok(0) => e.add(path, Problem::Zero),
        Ok(bytes) if bytes > MAX_CAPACITY => e.add(
            path,
            Problem::TooLarge {
                value: capacity.0.clone(),
                max: MAX_CAPACITY_TEXT,
            },
        ),
        Ok(_) => {}
        Err(why) => e.add(path, why),
    }
}

/// A string that becomes one line of the domain XML or a path: no control character at all (the
/// document reader already refused those XML cannot carry; this adds line breaks and tabs).
pub(super) fn check_single_line(path: String, value: &str, e: &mut Problems) {
    if let Some(ch) = value.chars().find(|c| c.is_control()) {
        e.add(path, Problem::ControlCharacter { ch });
    }
}
