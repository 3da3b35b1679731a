//! `spec.domain.machine`, `.firmware`, `.features` and `.clock`.

use super::Problems;
use crate::spec::checks::{check_host_path, is_word, looks_like_uuid};
use crate::spec::model::{DomainSpec, KernelBoot};
use crate::spec::problem::Problem;
use crate::spec::unsupported;

/// The machine types this launcher knows: the q35 and i440fx families of QEMU's x86 machines.
pub(crate) fn is_known_machine(machine: &str) -> bool {
    machine == "q35"
        || machine == "pc"
        || machine.starts_with("pc-q35-")
        || machine.starts_with("pc-i440fx-")
}

pub(super) fn validate_machine_and_firmware(domain: &DomainSpec, e: &mut Problems) {
    let machine = domain
        .machine
        .as_ref()
        .and_then(|m| m.machine_type.as_deref());
    if let Some(machine) = machine {
        if !is_known_machine(machine) {
            e.add(
                "spec.domain.machine.type",
                Problem::MachineType {
                    machine: machine.into(),
                },
            );
        }
    }
    let Some(firmware) = &domain.firmware else {
        return;
    };
    let base = "spec.domain.firmware";
    unsupported::check(e, base, firmware);
    if let Some(uuid) = &firmware.uuid {
        if !looks_like_uuid(uuid) {
            e.add(format!("{base}.uuid"), Problem::Uuid { uuid: uuid.clone() });
        }
    }
    if let Some(serial) = &firmware.serial {
        if serial.is_empty()
            || serial.len() > 64
            || !serial.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
        {
            e.add(
                format!("{base}.serial"),
                Problem::SmbiosSerial {
                    serial: serial.clone(),
                },
            );
        }
    }
    if let Some(bootloader) = &firmware.bootloader {
        if bootloader.bios.is_some() && bootloader.efi.is_some() {
            e.add(
                format!("{base}.bootloader"),
                Problem::BothSet {
                    first: "bios",
                    second: "efi",
                },
            );
        }
        if let Some(efi) = &bootloader.efi {
            unsupported::check(e, &format!("{base}.bootloader.efi"), efi);
            if efi.secure() {
                if machine.is_some_and(|m| m == "pc" || m.starts_with("pc-i440fx-")) {
                    e.add(
                        format!("{base}.bootloader.efi.secureBoot"),
                        Problem::SecureBootNeedsQ35,
                    );
                }
                let smm_off = domain
                    .features
                    .as_ref()
                    .and_then(|f| f.smm)
                    .is_some_and(|s| !s.on());
                if smm_off {
                    e.add(
                        format!("{base}.bootloader.efi.secureBoot"),
                        Problem::SecureBootNeedsSmm,
                    );
                }
            }
        }
    }
    if let Some(kb) = &firmware.kernel_boot {
        validate_kernel_boot(kb, e);
    }
}

/// `kernelBoot`: host paths of a kernel (and initrd), never an image from a registry.
fn validate_kernel_boot(kb: &KernelBoot, e: &mut Problems) {
    let base = "spec.domain.firmware.kernelBoot.container";
    match &kb.container {
        None => e.add(base, Problem::KernelBootNeedsContainer),
        Some(c) => {
            // Go writes an unset image as `""` (the field has no omitempty): the same as none.
            if let Some(image) = c.image.as_ref().filter(|i| !i.is_empty()) {
                e.add(
                    format!("{base}.image"),
                    Problem::UnsupportedValue {
                        value: image.clone(),
                        why: "kernel images from a registry; leave out image and give host paths in kernelPath and initrdPath",
                    },
                );
            }
            if c.kernel_path.is_none() {
                e.add(format!("{base}.kernelPath"), Problem::Required);
            }
            for (field, path) in [
                ("kernelPath", &c.kernel_path),
                ("initrdPath", &c.initrd_path),
            ] {
                let Some(p) = path else { continue };
                if !p.starts_with('/') {
                    e.add(
                        format!("{base}.{field}"),
                        Problem::NotAbsolute { path: p.clone() },
                    );
                } else if let Err(why) = check_host_path(p, false) {
                    // QEMU reads the file into guest memory (libvirt hands it to QEMU's
                    // user first).
                    e.add(format!("{base}.{field}"), why);
                }
            }
        }
    }
}

const TICK_POLICIES: &[&str] = &["delay", "catchup", "merge", "discard"];

pub(super) fn validate_features_and_clock(domain: &DomainSpec, e: &mut Problems) {
    if let Some(features) = &domain.features {
        unsupported::check(e, "spec.domain.features", features);
        if let Some(hv) = &features.hyperv {
            let base = "spec.domain.features.hyperv";
            if let Some(s) = &hv.spinlocks {
                if s.spinlocks.is_some_and(|n| n < 4096) {
                    e.add(
                        format!("{base}.spinlocks.spinlocks"),
                        Problem::AtLeast { min: 4096 },
                    );
                }
            }
            if let Some(v) = &hv.vendorid {
                if v.enabled.unwrap_or(true) {
                    match &v.vendorid {
                        Some(id) if !id.is_empty() && id.len() <= 12 && id.is_ascii() => {}
                        Some(id) => e.add(
                            format!("{base}.vendorid.vendorid"),
                            Problem::VendorId { id: id.clone() },
                        ),
                        None => e.add(format!("{base}.vendorid.vendorid"), Problem::Required),
                    }
                }
            }
        }
    }
    if let Some(clock) = &domain.clock {
        let base = "spec.domain.clock";
        if clock.utc.is_some() && clock.timezone.is_some() {
            e.add(
                base,
                Problem::BothSet {
                    first: "utc",
                    second: "timezone",
                },
            );
        }
        if let Some(tz) = &clock.timezone {
            if !is_word(tz, b"/_+-") {
                e.add(
                    format!("{base}.timezone"),
                    Problem::TimeZone { zone: tz.clone() },
                );
            }
        }
        if let Some(timers) = &clock.timer {
            for (name, timer) in [
                ("hpet", &timers.hpet),
                ("kvm", &timers.kvm),
                ("pit", &timers.pit),
                ("rtc", &timers.rtc),
                ("hyperv", &timers.hyperv),
            ] {
                let Some(timer) = timer else { continue };
                let path = format!("{base}.timer.{name}");
                if let Some(policy) = &timer.tick_policy {
                    if matches!(name, "kvm" | "hyperv") {
                        e.add(
                            format!("{path}.tickPolicy"),
                            Problem::NoTickPolicy { timer: name },
                        );
                    } else {
                        e.one_of(format!("{path}.tickPolicy"), policy, TICK_POLICIES);
                    }
                }
                if let Some(track) = &timer.track {
                    if name == "rtc" {
                        e.one_of(format!("{path}.track"), track, &["guest", "wall"]);
                    } else {
                        e.add(format!("{path}.track"), Problem::TrackNotRtc);
                    }
                }
            }
        }
    }
}
