//! `spec.domain.devices.disks`: names, buses, serials, caching, and what each disk kind needs of
//! its volume.

use std::collections::{BTreeMap, BTreeSet};

use super::{BootOrders, Problems};
use crate::spec::checks::{
    check_serial, MAX_SATA_SERIAL_LEN, MAX_SCSI_SERIAL_LEN, MAX_VIRTIO_SERIAL_LEN,
};
use crate::spec::model::{Disk, DiskKind, VirtualMachineInstance, Volume, VolumeSource};
use crate::spec::problem::Problem;
use crate::spec::unsupported;

pub(crate) const DISK_BUSES: &[&str] = &["virtio", "scsi", "sata"];
pub(crate) const CDROM_BUSES: &[&str] = &["sata", "scsi"];
pub(crate) const LUN_BUSES: &[&str] = &["scsi"];

pub(super) fn validate_disks(
    vmi: &VirtualMachineInstance,
    boot: &mut BootOrders,
    e: &mut Problems,
) {
    let devices = &vmi.spec.domain.devices;
    let base = "spec.domain.devices";
    let volumes: BTreeMap<&str, &Volume> = vmi
        .spec
        .volumes
        .iter()
        .map(|v| (v.name.as_str(), v))
        .collect();
    let mut seen_disks = BTreeSet::new();
    for (i, disk) in devices.disks.iter().enumerate() {
        let path = format!("{base}.disks[{i}]");
        e.unique(&mut seen_disks, &path, "disk", &disk.name);
        let volume = volumes.get(disk.name.as_str());
        if volume.is_none() {
            e.add(
                format!("{path}.name"),
                Problem::NoPartner {
                    what: "disk",
                    name: disk.name.clone(),
                    partner: "volume",
                },
            );
        }
        let set = [
            disk.disk.is_some(),
            disk.cdrom.is_some(),
            disk.lun.is_some(),
        ];
        if set.iter().filter(|s| **s).count() > 1 {
            e.add(
                path.clone(),
                Problem::OnlyOneOf {
                    fields: "disk, cdrom, lun",
                },
            );
        }
        let kind = disk.kind();
        let bus = disk.bus();
        let allowed = match kind {
            DiskKind::Disk => DISK_BUSES,
            DiskKind::Cdrom => CDROM_BUSES,
            DiskKind::Lun => LUN_BUSES,
        };
        let bus_ok = allowed.contains(&bus);
        if !bus_ok {
            e.add(
                format!("{path}.{}.bus", kind.field()),
                Problem::BusNotValid {
                    bus: bus.into(),
                    kind: kind.field(),
                    allowed,
                },
            );
        }
        unsupported::check(e, &path, disk);
        if let Some(d) = &disk.disk {
            unsupported::check(e, &format!("{path}.disk"), d);
        }
        if let Some(c) = &disk.cdrom {
            unsupported::check(e, &format!("{path}.cdrom"), c);
        }
        if let Some(l) = &disk.lun {
            unsupported::check(e, &format!("{path}.lun"), l);
        }
        check_disk_options(disk, &path, kind, bus_ok, e);
        boot.check(e, format!("{path}.bootOrder"), disk.boot_order);
        let claim_readonly = volume
            .and_then(|v| v.persistent_volume_claim.as_ref())
            .is_some_and(|p| p.read_only == Some(true));
        if kind == DiskKind::Disk && bus == "sata" && (disk.readonly() || claim_readonly) {
            // QEMU's ide-hd has no read-only mode; libvirt refuses it.
            e.add(format!("{path}.disk.readonly"), Problem::ReadOnlySata);
        }
        if kind == DiskKind::Lun {
            if let Some(source) = volume.and_then(|v| v.source()) {
                if !matches!(
                    source,
                    VolumeSource::HostDisk(_)
                        | VolumeSource::PersistentVolumeClaim(_)
                        | VolumeSource::DataVolume(_)
                ) {
                    e.add(format!("{path}.lun"), Problem::LunNeedsBlockSource);
                }
            }
        }
    }
}

/// A disk's serial (within its bus's length), cache, I/O mode, error policy and dedicated
/// iothread. `bus_ok`: its bus is one its kind takes (a serial is judged by that bus only then).
fn check_disk_options(disk: &Disk, path: &str, kind: DiskKind, bus_ok: bool, e: &mut Problems) {
    let bus = disk.bus();
    if let Some(serial) = &disk.serial {
        if kind == DiskKind::Lun {
            e.add(format!("{path}.serial"), Problem::LunSerial);
        } else if bus_ok {
            let max = match bus {
                "scsi" => MAX_SCSI_SERIAL_LEN,
                "sata" => MAX_SATA_SERIAL_LEN,
                _ => MAX_VIRTIO_SERIAL_LEN,
            };
            if let Err(why) = check_serial(serial, bus, max) {
                e.add(format!("{path}.serial"), why);
            }
        }
    }
    if let Some(cache) = &disk.cache {
        e.one_of(
            format!("{path}.cache"),
            cache,
            &["none", "writethrough", "writeback"],
        );
    }
    if let Some(io) = &disk.io {
        e.one_of(format!("{path}.io"), io, &["native", "threads"]);
        // QEMU opens native AIO with O_DIRECT: a host page cache in between refuses to start.
        if io == "native" && disk.cache.as_deref().is_some_and(|c| c != "none") {
            e.add(
                format!("{path}.io"),
                Problem::NativeIoNeedsNoCache {
                    cache: disk.cache.clone().unwrap_or_default(),
                },
            );
        }
    }
    if let Some(policy) = &disk.error_policy {
        e.one_of(
            format!("{path}.errorPolicy"),
            policy,
            &["stop", "ignore", "report", "enospace"],
        );
    }
    if disk.dedicated_io_thread == Some(true) && bus != "virtio" {
        e.add(
            format!("{path}.dedicatedIOThread"),
            Problem::IoThreadNeedsVirtio,
        );
    }
}
