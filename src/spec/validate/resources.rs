//! `spec.domain.memory`, `.resources` and `.cpu`: how much of the host the guest gets.

use std::collections::{BTreeMap, BTreeSet};

use super::{bounds, Problems};
use crate::spec::checks::is_word;
use crate::spec::model::{DomainSpec, VirtualMachineInstance};
use crate::spec::problem::Problem;
use crate::spec::quantity::{Quantity, QuantityError};
use crate::spec::unsupported;

/// Returns the guest memory in bytes when it is present and sane.
pub(super) fn validate_memory(vmi: &VirtualMachineInstance, e: &mut Problems) -> Option<u64> {
    let domain = &vmi.spec.domain;
    let guest = match guest_memory(vmi) {
        Ok(Some(bytes)) if bytes < 1024 * 1024 => {
            e.add(memory_path(vmi), Problem::TooLittleMemory { bytes });
            None
        }
        Ok(Some(bytes)) => Some(bytes),
        Ok(None) => {
            e.add("spec.domain.memory.guest", Problem::NoGuestMemory);
            None
        }
        Err(why) => {
            e.add(memory_path(vmi), why);
            None
        }
    };
    if let Some(memory) = &domain.memory {
        if let Some(hp) = &memory.hugepages {
            let path = "spec.domain.memory.hugepages.pageSize";
            match hp.page_size.to_bytes() {
                Ok(size) if size == 2 << 20 || size == 1 << 30 => {
                    if let Some(guest) = guest.filter(|g| g % size != 0) {
                        e.add(
                            path,
                            Problem::NotPageAligned {
                                guest,
                                page_size: hp.page_size.0.clone(),
                            },
                        );
                    }
                }
                Ok(_) => e.add(
                    path,
                    Problem::PageSize {
                        page_size: hp.page_size.0.clone(),
                    },
                ),
                Err(why) => e.add(path, why),
            }
        }
    }
    if let Some(resources) = &domain.resources {
        unsupported::check(e, "spec.domain.resources", resources);
        for (kind, map) in [
            ("requests", &resources.requests),
            ("limits", &resources.limits),
        ] {
            for (name, quantity) in map {
                let path = format!("spec.domain.resources.{kind}.{name}");
                match name.as_str() {
                    "memory" | "cpu" | "ephemeral-storage" => match quantity.value() {
                        Ok(cpus) if name == "cpu" => bounds::check_cpu_quantity(path, cpus, e),
                        Ok(_) => {}
                        Err(why) => e.add(path, why),
                    },
                    _ => e.add(
                        path,
                        Problem::Unsupported {
                            why: "extended resources are devices of a cluster",
                        },
                    ),
                }
            }
        }
    }
    guest
}

/// virtio-mem's block size, and the alignment of hot-pluggable memory (KubeVirt's too).
pub(crate) const HOTPLUG_BLOCK_BYTES: u64 = 2 << 20;
/// The least boot memory that memory hotplug is offered with (KubeVirt's rule).
pub(crate) const HOTPLUG_MIN_GUEST_BYTES: u64 = 1 << 30;
/// The most guest memory the launcher defines: QEMU's x86 limit.
pub(crate) const MAX_GUEST_BYTES: u64 = 16 << 40;

/// `memory.maxGuest`, KubeVirt's rules: `guest` given explicitly and at most `maxGuest`, both
/// aligned to virtio-mem's 2 MiB block, `guest` at least 1Gi; not with hugepages.
pub(super) fn validate_max_guest(
    vmi: &VirtualMachineInstance,
    guest: Option<u64>,
    e: &mut Problems,
) {
    let Some(memory) = &vmi.spec.domain.memory else {
        return;
    };
    let Some(max) = &memory.max_guest else {
        return;
    };
    let path = "spec.domain.memory.maxGuest";
    let max_bytes = match max.to_bytes() {
        Ok(b) if b > MAX_GUEST_BYTES => {
            e.add(
                path,
                Problem::TooLarge {
                    value: max.0.clone(),
                    max: "16Ti",
                },
            );
            return;
        }
        Ok(b) => b,
        Err(why) => {
            e.add(path, why);
            return;
        }
    };
    if max_bytes % HOTPLUG_BLOCK_BYTES != 0 {
        e.add(
            path,
            Problem::NotBlockAligned {
                bytes: max_bytes,
                alignment: "2Mi",
            },
        );
    }
    if memory.hugepages.is_some() {
        e.add(
            path,
            Problem::Unsupported {
                why: "memory hotplug with hugepages",
            },
        );
    }
    let guest_path = "spec.domain.memory.guest";
    let Some(guest_quantity) = &memory.guest else {
        e.add(
            guest_path,
            Problem::Needs {
                what: "an explicit memory.guest with maxGuest",
            },
        );
        return;
    };
    let Some(guest) = guest else { return };
    if guest > max_bytes {
        e.add(
            guest_path,
            Problem::AboveMaximum {
                value: guest_quantity.0.clone(),
                max_field: "maxGuest",
                max: max.0.clone(),
            },
        );
    }
    if guest % HOTPLUG_BLOCK_BYTES != 0 {
        e.add(
            guest_path,
            Problem::NotBlockAligned {
                bytes: guest,
                alignment: "2Mi",
            },
        );
    }
    if guest < HOTPLUG_MIN_GUEST_BYTES {
        e.add(guest_path, Problem::BelowHotplugMinimum { bytes: guest });
    }
}

pub(super) fn validate_cpu(domain: &DomainSpec, e: &mut Problems) {
    let Some(cpu) = &domain.cpu else { return };
    for (field, value) in [
        ("cores", cpu.cores),
        ("sockets", cpu.sockets),
        ("threads", cpu.threads),
    ] {
        if value == Some(0) {
            e.add(
                format!("spec.domain.cpu.{field}"),
                Problem::AtLeast { min: 1 },
            );
        }
    }
    let one = |n: Option<u32>| n.unwrap_or(1);
    if let Some(max) = cpu.max_sockets {
        if max == 0 {
            e.add("spec.domain.cpu.maxSockets", Problem::AtLeast { min: 1 });
        } else if one(cpu.sockets) > max {
            e.add(
                "spec.domain.cpu.sockets",
                Problem::AboveMaximum {
                    value: one(cpu.sockets).to_string(),
                    max_field: "maxSockets",
                    max: max.to_string(),
                },
            );
        }
        // The domain is defined for the largest topology.
        bounds::check_topology(
            max.max(one(cpu.sockets)),
            one(cpu.cores),
            one(cpu.threads),
            e,
        );
    } else if cpu.sockets.is_some() || cpu.cores.is_some() || cpu.threads.is_some() {
        bounds::check_topology(one(cpu.sockets), one(cpu.cores), one(cpu.threads), e);
    }
    if let Some(model) = &cpu.model {
        if !is_word(model, b"-_.") {
            e.add(
                "spec.domain.cpu.model",
                Problem::CpuModel {
                    model: model.clone(),
                },
            );
        }
    }
    let mut seen = BTreeSet::new();
    for (i, feature) in cpu.features.iter().enumerate() {
        let path = format!("spec.domain.cpu.features[{i}]");
        if !is_word(&feature.name, b"-_.") {
            e.add(
                format!("{path}.name"),
                Problem::CpuFeature {
                    name: feature.name.clone(),
                },
            );
        }
        if !seen.insert(feature.name.as_str()) {
            e.add(
                format!("{path}.name"),
                Problem::DuplicateCpuFeature {
                    name: feature.name.clone(),
                },
            );
        }
        if let Some(policy) = &feature.policy {
            e.one_of(
                format!("{path}.policy"),
                policy,
                &["force", "require", "optional", "disable", "forbid"],
            );
        }
    }
    if cpu.isolate_emulator_thread == Some(true) && cpu.dedicated_cpu_placement != Some(true) {
        e.add(
            "spec.domain.cpu.isolateEmulatorThread",
            Problem::Needs {
                what: "dedicatedCpuPlacement: true",
            },
        );
    }
    unsupported::check(e, "spec.domain.cpu", cpu);
}

/// Guest memory in bytes: `memory.guest`, else `resources.requests.memory`, else
/// `resources.limits.memory` (KubeVirt's order).
pub(crate) fn guest_memory(vmi: &VirtualMachineInstance) -> Result<Option<u64>, QuantityError> {
    let domain = &vmi.spec.domain;
    let from_resources = |m: &BTreeMap<String, Quantity>| m.get("memory").cloned();
    let quantity = domain
        .memory
        .as_ref()
        .and_then(|m| m.guest.clone())
        .or_else(|| {
            domain
                .resources
                .as_ref()
                .and_then(|r| from_resources(&r.requests))
        })
        .or_else(|| {
            domain
                .resources
                .as_ref()
                .and_then(|r| from_resources(&r.limits))
        });
    quantity.map(|q| q.to_bytes()).transpose()
}

/// vCPUs from `resources.limits.cpu`, else `requests.cpu`, rounded up (KubeVirt's fallback when
/// the spec gives no topology).
pub(crate) fn resource_cpus(vmi: &VirtualMachineInstance) -> Option<u32> {
    let r = vmi.spec.domain.resources.as_ref()?;
    let q = r.limits.get("cpu").or_else(|| r.requests.get("cpu"))?;
    let cpus = q.value().ok()?.ceil();
    Some((cpus as u32).max(1))
}

fn memory_path(vmi: &VirtualMachineInstance) -> &'static str {
    let domain = &vmi.spec.domain;
    if domain.memory.as_ref().is_some_and(|m| m.guest.is_some()) {
        "spec.domain.memory.guest"
    } else if domain
        .resources
        .as_ref()
        .is_some_and(|r| r.requests.contains_key("memory"))
    {
        "spec.domain.resources.requests.memory"
    } else {
        "spec.domain.resources.limits.memory"
    }
}
