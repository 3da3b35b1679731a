//! The hotplug plan: which scsi disks to attach and which to detach so that the live domain matches
//! the desired one, keyed by volume name through the user alias `ua-<volume>`.
//!
//! Planning is pure and complete before anything is touched: a spec that asks for a change that
//! cannot be made live is refused as a whole. Execution lives in the launcher.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::domain::{target_name, Bus, DiskDef, DomainDef, DriveAddress, InterfaceDef, LiveDisk};

/// Units on controller 0 that a plan may hand out (virtio-scsi allows 16,384 LUNs per target).
pub(crate) const MAX_SCSI_UNITS: u32 = 16_384;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// New disks, with their target and drive address already chosen.
    pub attach: Vec<DiskDef>,
    /// Live disks to remove, with libvirt's own element.
    pub detach: Vec<LiveDisk>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("volume {volume:?}: disks on bus {bus} cannot be {action} while the VM runs (only scsi disks can)")]
    NotHotpluggable {
        volume: String,
        bus: String,
        action: &'static str,
    },
    #[error("volume {volume:?}: {field} changed from {live:?} to {desired:?}; remove the volume and add it again to change it")]
    Changed {
        volume: String,
        field: &'static str,
        live: String,
        desired: String,
    },
    #[error("no free scsi unit left on controller 0 ({MAX_SCSI_UNITS} in use)")]
    NoFreeUnit,
}

/// Diffs the live disks against the desired domain.
pub fn plan(live: &[LiveDisk], desired: &DomainDef) -> Result<Plan, PlanError> {
    let live_by_volume: BTreeMap<&str, &LiveDisk> =
        live.iter().filter_map(|d| Some((d.volume()?, d))).collect();
    let desired_by_volume: BTreeMap<&str, &DiskDef> = desired
        .disks
        .iter()
        .map(|d| (d.volume.as_str(), d))
        .collect();

    let mut plan = Plan::default();
    for disk in &desired.disks {
        match live_by_volume.get(disk.volume.as_str()) {
            Some(live) => check_unchanged(live, disk)?,
            None if disk.bus == Bus::Scsi => plan.attach.push(disk.clone()),
            None => {
                return Err(PlanError::NotHotpluggable {
                    volume: disk.volume.clone(),
                    bus: disk.bus.as_str().into(),
                    action: "added",
                })
            }
        }
    }
    for (volume, live) in &live_by_volume {
        if desired_by_volume.contains_key(volume) {
            continue;
        }
        if live.bus != Bus::Scsi.as_str() {
            return Err(PlanError::NotHotpluggable {
                volume: volume.to_string(),
                bus: live.bus.clone(),
                action: "removed",
            });
        }
        plan.detach.push((*live).clone());
    }
    allocate(live, &mut plan.attach)?;
    Ok(plan)
}

/// The parts of a domain that a running VM cannot change, by name, where `desired` differs.
pub(crate) fn frozen_fields_changed(current: &DomainDef, desired: &DomainDef) -> Vec<&'static str> {
    // Destructured without `..`: a field added to the domain model must be classified here as
    // either hot-pluggable or frozen, or this stops compiling.
    let DomainDef {
        name: _,          // checked by the caller: another name is another instance
        instance: _,      // labels and the like: no effect on the running VM
        disks: _,         // the one thing Sync changes
        vcpus_enabled: _, // changed live by Sync (`resize`)
        uuid,
        virt_type,
        memory_kib,
        virtio_mem,
        hugepage_kib,
        topology,
        cpu,
        iothreads,
        cputune,
        tpm,
        machine,
        firmware,
        sysinfo_serial,
        kernel_boot,
        features,
        clock,
        interfaces,
        inputs,
        watchdog,
        rng,
        scsi_controller,
        spare_pcie_ports,
        serial,
        vnc_socket,
        memballoon,
    } = current;
    let d = desired;
    let checks = [
        ("metadata.uid / spec.domain.firmware.uuid", *uuid == d.uuid),
        (
            "spec.domain.memory",
            // virtio-mem's requested size is changed live; its room is not.
            *memory_kib == d.memory_kib
                && *hugepage_kib == d.hugepage_kib
                && virtio_mem.map(|m| m.size_kib) == d.virtio_mem.map(|m| m.size_kib),
        ),
        ("spec.domain.cpu", *topology == d.topology && *cpu == d.cpu),
        ("spec.domain.ioThreadsPolicy", *iothreads == d.iothreads),
        (
            "spec.domain.cpu.dedicatedCpuPlacement",
            *cputune == d.cputune,
        ),
        ("spec.domain.devices.tpm", *tpm == d.tpm),
        ("spec.domain.machine", *machine == d.machine),
        (
            "spec.domain.firmware",
            *firmware == d.firmware && *sysinfo_serial == d.sysinfo_serial,
        ),
        (
            "spec.domain.firmware.kernelBoot",
            *kernel_boot == d.kernel_boot,
        ),
        ("spec.domain.features", *features == d.features),
        ("spec.domain.clock", *clock == d.clock),
        (
            "spec.domain.devices.interfaces",
            // Interfaces come and go, and links go up and down (`launcher::nics`).
            !frozen_interfaces_changed(interfaces, &d.interfaces),
        ),
        (
            "spec.domain.devices (inputs, watchdog, rng, autoattach*)",
            *inputs == d.inputs
                && *spare_pcie_ports == d.spare_pcie_ports
                && *watchdog == d.watchdog
                && *rng == d.rng
                && *scsi_controller == d.scsi_controller
                && *serial == d.serial
                && *vnc_socket == d.vnc_socket
                && *memballoon == d.memballoon,
        ),
        ("emulation", *virt_type == d.virt_type),
    ];
    checks
        .into_iter()
        .filter(|(_, same)| !same)
        .map(|(field, _)| field)
        .collect()
}

fn check_unchanged(live: &LiveDisk, desired: &DiskDef) -> Result<(), PlanError> {
    let source = desired.source.path().to_string_lossy();
    // A pinned image is live as its pin (or as its source, attached by path where the launcher
    // could not mount): either is the desired source.
    let pinned = desired.pin.as_deref().map(Path::to_string_lossy);
    let live_source = match (live.source.as_deref(), pinned.as_deref()) {
        (Some(live), Some(pin)) if live == pin => Some(source.as_ref()),
        (live, _) => live,
    };
    let fields = [
        ("bus", Some(live.bus.as_str()), Some(desired.bus.as_str())),
        ("serial", live.serial.as_deref(), desired.serial.as_deref()),
        ("source", live_source, Some(source.as_ref())),
    ];
    let changed = fields.into_iter().find(|(_, was, want)| was != want);
    match changed {
        Some((field, was, want)) => Err(PlanError::Changed {
            volume: desired.volume.clone(),
            field,
            live: was.unwrap_or("").into(),
            desired: want.unwrap_or("").into(),
        }),
        None => Ok(()),
    }
}

/// Gives each new scsi disk the lowest unit on controller 0 that neither a live disk nor an
/// earlier new disk holds, and the target name of that unit (unit 2 → `sdc`) unless a live disk
/// already uses that name. Targets in use are never reused, so a disk keeps its name across Syncs.
fn allocate(live: &[LiveDisk], attach: &mut [DiskDef]) -> Result<(), PlanError> {
    let mut used_units: BTreeSet<u32> = live
        .iter()
        .filter(|d| d.bus == Bus::Scsi.as_str())
        .filter_map(|d| d.address.filter(|a| a.controller == 0).map(|a| a.unit))
        .collect();
    let mut used_targets: BTreeSet<String> = live.iter().map(|d| d.target.clone()).collect();
    for disk in attach {
        let unit = (0..MAX_SCSI_UNITS)
            .find(|u| !used_units.contains(u) && !used_targets.contains(&target_name("sd", *u)))
            .ok_or(PlanError::NoFreeUnit)?;
        used_units.insert(unit);
        disk.target = target_name("sd", unit);
        used_targets.insert(disk.target.clone());
        disk.address = Some(DriveAddress {
            controller: 0,
            unit,
        });
    }
    Ok(())
}

/// The interfaces a Sync may add, drop or relink; any other change to one that stays (its
/// model, MAC, binding, ports) needs a restart: true when `desired` makes one.
pub(crate) fn frozen_interfaces_changed(
    current: &[InterfaceDef],
    desired: &[InterfaceDef],
) -> bool {
    current.iter().any(|c| {
        desired.iter().any(|d| {
            d.name == c.name
                && InterfaceDef {
                    link_down: c.link_down,
                    ..d.clone()
                } != *c
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{CpuTopology, DiskSource, InstanceMetadata, VirtType};

    fn disk(volume: &str, bus: Bus, serial: &str) -> DiskDef {
        DiskDef {
            volume: volume.into(),
            source: DiskSource::File(format!("/d/{volume}.img").into()),
            bus,
            target: "sda".into(),
            serial: Some(serial.into()),
            address: None,
            ..Default::default()
        }
    }

    fn domain(disks: Vec<DiskDef>) -> DomainDef {
        DomainDef {
            name: "default_vm".into(),
            uuid: None,
            virt_type: VirtType::Qemu,
            memory_kib: 1024,
            topology: CpuTopology {
                sockets: 1,
                cores: 1,
                threads: 1,
            },
            machine: "q35".into(),
            kernel_boot: None,
            disks,
            serial: Some(crate::domain::SerialDef {
                socket: "/s".into(),
                log: Some("/c".into()),
            }),
            instance: InstanceMetadata {
                namespace: "default".into(),
                name: "vm".into(),
                uid: None,
            },
            ..Default::default()
        }
    }

    fn live(volume: &str, bus: &str, target: &str, unit: Option<u32>, serial: &str) -> LiveDisk {
        LiveDisk {
            alias: Some(format!("ua-{volume}")),
            target: target.into(),
            bus: bus.into(),
            serial: Some(serial.into()),
            source: Some(format!("/d/{volume}.img")),
            address: unit.map(|unit| DriveAddress {
                controller: 0,
                unit,
            }),
            xml: format!("<disk>{volume}</disk>"),
        }
    }

    /// A hot-plugged file is live as its pin (or as its source, attached by path where the
    /// launcher could not mount): neither is a changed source; anything else is.
    #[test]
    fn a_pinned_disk_is_unchanged_at_its_pin_or_its_source() {
        let mut wanted = disk("data", Bus::Scsi, "D");
        wanted.pin = Some("/run/vml/pins/data.img".into());
        let desired = domain(vec![wanted]);
        let mut pinned = live("data", "scsi", "sda", Some(0), "D");
        pinned.source = Some("/run/vml/pins/data.img".into());
        assert_eq!(plan(&[pinned.clone()], &desired).unwrap(), Plan::default());
        let by_path = live("data", "scsi", "sda", Some(0), "D");
        assert_eq!(plan(&[by_path], &desired).unwrap(), Plan::default());
        pinned.source = Some("/run/vml/pins/other.img".into());
        assert!(matches!(
            plan(&[pinned], &desired),
            Err(PlanError::Changed {
                field: "source",
                ..
            })
        ));
    }

    #[test]
    fn attaches_new_and_detaches_removed_scsi_disks() {
        let live_disks = [
            live("boot", "virtio", "vda", None, "B"),
            live("old", "scsi", "sda", Some(0), "O"),
        ];
        let desired = domain(vec![
            disk("boot", Bus::Virtio, "B"),
            disk("new1", Bus::Scsi, "N1"),
            disk("new2", Bus::Scsi, "N2"),
        ]);
        let plan = plan(&live_disks, &desired).unwrap();
        let attached: Vec<_> = plan
            .attach
            .iter()
            .map(|d| {
                (
                    d.volume.as_str(),
                    d.target.as_str(),
                    d.address.unwrap().unit,
                )
            })
            .collect();
        // Unit 0 is still held by "old" until its detach completes: never reuse it in one plan.
        assert_eq!(attached, [("new1", "sdb", 1), ("new2", "sdc", 2)]);
        assert_eq!(plan.detach.len(), 1);
        assert_eq!(plan.detach[0].xml, "<disk>old</disk>");
    }

    #[test]
    fn same_spec_twice_plans_nothing() {
        let live_disks = [live("a", "scsi", "sda", Some(0), "A")];
        let desired = domain(vec![disk("a", Bus::Scsi, "A")]);
        let plan = plan(&live_disks, &desired).unwrap();
        assert!(plan.attach.is_empty() && plan.detach.is_empty());
    }

    #[test]
    fn fills_holes_but_skips_targets_in_use() {
        // unit 1 is free, but a disk without an address already took the name sdb.
        let live_disks = [
            live("a", "scsi", "sda", Some(0), "A"),
            live("c", "scsi", "sdb", Some(2), "C"),
        ];
        let desired = domain(vec![
            disk("a", Bus::Scsi, "A"),
            disk("c", Bus::Scsi, "C"),
            disk("d", Bus::Scsi, "D"),
        ]);
        let plan = plan(&live_disks, &desired).unwrap();
        assert_eq!(plan.attach[0].target, "sdd");
        assert_eq!(plan.attach[0].address.unwrap().unit, 3);
    }

    #[test]
    fn virtio_disks_cannot_come_or_go() {
        let err = plan(&[], &domain(vec![disk("v", Bus::Virtio, "V")])).unwrap_err();
        assert!(
            matches!(
                err,
                PlanError::NotHotpluggable {
                    action: "added",
                    ..
                }
            ),
            "{err}"
        );
        let err = plan(&[live("v", "virtio", "vda", None, "V")], &domain(vec![])).unwrap_err();
        assert!(
            matches!(
                err,
                PlanError::NotHotpluggable {
                    action: "removed",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn changed_serial_is_refused() {
        let err = plan(
            &[live("a", "scsi", "sda", Some(0), "A")],
            &domain(vec![disk("a", Bus::Scsi, "Other")]),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "volume \"a\": serial changed from \"A\" to \"Other\"; remove the volume and add it again to change it"
        );
    }

    #[test]
    fn disks_libvirt_added_without_our_alias_are_left_alone() {
        let mut foreign = live("x", "scsi", "sda", Some(0), "X");
        foreign.alias = Some("scsi0-0-0-0".into());
        let plan = plan(&[foreign], &domain(vec![disk("b", Bus::Scsi, "B")])).unwrap();
        assert!(plan.detach.is_empty());
        assert_eq!(plan.attach[0].target, "sdb");
    }

    #[test]
    fn only_disks_may_change_on_a_running_vm() {
        let current = domain(vec![disk("a", Bus::Scsi, "A")]);
        let more_disks = domain(vec![disk("a", Bus::Scsi, "A"), disk("b", Bus::Scsi, "B")]);
        assert!(frozen_fields_changed(&current, &more_disks).is_empty());
        let mut other = more_disks.clone();
        other.memory_kib *= 2;
        other.rng = !other.rng;
        other.clock.timers.clear();
        other.clock.offset = crate::domain::ClockOffset::Timezone("Europe/Paris".into());
        assert_eq!(
            frozen_fields_changed(&current, &other),
            [
                "spec.domain.memory",
                "spec.domain.clock",
                "spec.domain.devices (inputs, watchdog, rng, autoattach*)"
            ]
        );
    }
}
