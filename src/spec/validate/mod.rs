//! What serde cannot check, by area of the manifest: names, references between disks, volumes,
//! interfaces and networks, buses, serials, quantities, and the KubeVirt fields outside the
//! subset. Every problem is reported, not just the first, each a [`Problem`] at a field path.

mod bounds;
mod disks;
mod firmware;
mod inputs;
mod metadata;
mod networks;
mod resources;
mod volumes;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

pub(crate) use bounds::MAX_CAPACITY;
#[cfg(test)]
pub(super) use resources::guest_memory;
pub(crate) use resources::{resource_cpus, HOTPLUG_BLOCK_BYTES};

use super::checks::check_dns1123_label;
use super::model::VirtualMachineInstance;
use super::problem::{Problem, Problems, SpecErrors};
use super::unsupported;

/// What validation learnt on the way that `convert` needs, so it never looks again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Facts {
    pub(super) memory_bytes: u64,
    /// For each disk, the index of its volume in `spec.volumes`.
    pub(super) disk_volumes: Vec<usize>,
}

/// Checks what serde cannot: names, references between disks, volumes, interfaces and networks,
/// buses, serials, quantities, and the KubeVirt fields outside the subset. Returns every problem,
/// not just the first.
pub(super) fn check(vmi: &VirtualMachineInstance) -> Result<Facts, SpecErrors> {
    let mut errors = Problems::default();
    let e = &mut errors;

    if vmi.api_version != "kubevirt.io/v1" {
        e.add(
            "apiVersion",
            Problem::UnsupportedApiVersion {
                version: vmi.api_version.clone(),
            },
        );
    }
    if vmi.kind != "VirtualMachineInstance" {
        e.add(
            "kind",
            Problem::UnsupportedKind {
                kind: vmi.kind.clone(),
            },
        );
    }
    metadata::validate_metadata(&vmi.metadata, e);
    if !bounds::check_counts(vmi, e) {
        return Err(SpecErrors(errors.0));
    }

    let spec = &vmi.spec;
    unsupported::check(e, "spec", spec);
    if let Some(arch) = &spec.architecture {
        if arch != "amd64" {
            e.add(
                "spec.architecture",
                Problem::UnsupportedValue {
                    value: arch.clone(),
                    why: "this launcher runs amd64 guests only",
                },
            );
        }
    }
    if let Some(hostname) = &spec.hostname {
        if let Err(why) = check_dns1123_label(hostname) {
            e.add("spec.hostname", why);
        }
    }

    let domain = &spec.domain;
    unsupported::check(e, "spec.domain", domain);
    let memory_bytes = resources::validate_memory(vmi, e);
    resources::validate_max_guest(vmi, memory_bytes, e);
    resources::validate_cpu(domain, e);
    firmware::validate_machine_and_firmware(domain, e);
    firmware::validate_features_and_clock(domain, e);
    if let Some(policy) = &domain.io_threads_policy {
        e.one_of(
            "spec.domain.ioThreadsPolicy".into(),
            policy,
            &["shared", "auto"],
        );
    }
    validate_devices(vmi, e);
    volumes::validate_volumes(vmi, e);

    // Every disk's volume, by index, once each has one with a supported source.
    let disk_volumes: Option<Vec<usize>> = domain
        .devices
        .disks
        .iter()
        .map(|d| {
            spec.volumes
                .iter()
                .position(|v| v.name == d.name && v.source().is_some())
        })
        .collect();
    match (memory_bytes, disk_volumes) {
        // The checks above report whatever leaves either one missing.
        (Some(memory_bytes), Some(disk_volumes)) if errors.0.is_empty() => Ok(Facts {
            memory_bytes,
            disk_volumes,
        }),
        _ => Err(SpecErrors(errors.0)),
    }
}

/// Boot orders are unique across disks and interfaces.
#[derive(Debug, Default)]
pub(super) struct BootOrders(BTreeMap<u32, String>);

impl BootOrders {
    fn check(&mut self, e: &mut Problems, path: String, order: Option<u32>) {
        let Some(order) = order else { return };
        if order == 0 {
            e.add(path, Problem::AtLeast { min: 1 });
        } else if let Some(first) = self.0.get(&order) {
            e.add(
                path,
                Problem::BootOrderTaken {
                    order,
                    first: first.clone(),
                },
            );
        } else {
            self.0.insert(order, path);
        }
    }
}

fn validate_devices(vmi: &VirtualMachineInstance, e: &mut Problems) {
    let devices = &vmi.spec.domain.devices;
    let base = "spec.domain.devices";
    unsupported::check(e, base, devices);

    let mut boot = BootOrders::default();
    disks::validate_disks(vmi, &mut boot, e);
    networks::validate_networks(vmi, &mut boot, e);
    inputs::validate_inputs(devices, e);
}
