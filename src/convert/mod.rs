//! Spec → domain model. A pure, deterministic function: the same spec and options give the same
//! domain, byte for byte once serialised. No I/O: whatever depends on the host (is KVM usable,
//! which versioned machine `q35` is, where volumes live, which volumes are block devices) comes in
//! through [`ConvertOptions`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::domain::{
    target_name, BackingDef, Bus, ClockDef, ClockOffset, CpuDef, CpuMode, CpuTopology, CpuTune,
    DiskDef, DiskDevice, DiskSource, DomainDef, DriveAddress, EfiDef, FeaturesDef, FirmwareDef,
    HypervFeature, InputDef, InstanceMetadata, KernelBootDef, TimerDef, TpmDef, VirtType,
    VirtioMemDef, WatchdogDef,
};
use crate::spec::{
    self, DiskKind, DomainSpec, FeatureState, FieldError, Firmware, Problem, SpecErrors, Validated,
    VirtualMachineInstance, VolumeSource, DEFAULT_NAMESPACE,
};
use crate::volumes::{self, HostPaths};

use network::interfaces;
pub use network::{moved_ports, NetworkMode, Publish, PublishError};

/// The machine type when the spec names none.
pub(crate) const DEFAULT_MACHINE: &str = "q35";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConvertOptions {
    pub virt_type: VirtType,
    /// Machine aliases and what they stand for on this host (`q35` → `pc-q35-7.2`), read once
    /// from libvirt so that the guest ABI does not drift; a name not in here is kept as written.
    pub machines: BTreeMap<String, String>,
    pub paths: HostPaths,
    pub network: NetworkMode,
    pub publish: Publish,
    /// The host CPUs the launcher may run on (its affinity: in a pod, the pod's cpuset), in
    /// order; dedicated vCPUs are pinned to the first ones.
    pub cpus: Vec<u32>,
    /// Volumes whose source the host found to be a block device.
    pub block_volumes: BTreeSet<String>,
    /// Claim images (a PVC's or DataVolume's `disk.img`, a hot-plugged file) are passed to QEMU
    /// as descriptors the launcher opens (`DiskDef::fd_group`; libvirt 9.0 and later).
    pub claims_by_fd: bool,
    /// The `--connect` URI when claims are refused there (`refused::disk`); `None` takes them.
    pub claims_refused_by: Option<String>,
    /// Where hot-plugged image files are pinned for QEMU (`host::pin`, `DiskDef::pin`), with
    /// `claims_by_fd`; `None` gives them by their path.
    pub pin_dir: Option<PathBuf>,
    /// The memory (bytes) the running guest booted with, when converting for a running domain:
    /// the boot memory cannot change until the next boot, so a changed `guest` becomes
    /// virtio-mem's requested size. `None` converts for a boot.
    pub guest_at_boot: Option<u64>,
}

impl ConvertOptions {
    /// A local run whose files live in the directory of `console_log`, with no machine
    /// resolution and no block volumes.
    pub fn new(virt_type: VirtType, console_log: PathBuf) -> ConvertOptions {
        let runtime_dir = console_log
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("/"));
        ConvertOptions {
            virt_type,
            paths: HostPaths {
                console_log,
                ..HostPaths::local(&runtime_dir)
            },
            machines: BTreeMap::new(),
            network: NetworkMode::Local,
            publish: Publish::default(),
            cpus: Vec::new(),
            block_volumes: BTreeSet::new(),
            claims_by_fd: false,
            claims_refused_by: None,
            pin_dir: None,
            guest_at_boot: None,
        }
    }
}

/// The libvirt domain name for an instance: `<namespace>_<name>`, as KubeVirt names them.
pub(crate) fn domain_name(vmi: &VirtualMachineInstance) -> String {
    let ns = vmi
        .metadata
        .namespace
        .as_deref()
        .unwrap_or(DEFAULT_NAMESPACE);
    format!("{ns}_{}", vmi.metadata.name)
}

/// The domain for a validated instance. The only refusal left is one the spec alone cannot
/// show: a lun whose volume the host did not find to be a block device.
pub fn convert(vmi: &Validated, opts: &ConvertOptions) -> Result<DomainDef, SpecErrors> {
    let name = domain_name(vmi);
    let domain = &vmi.spec.domain;
    let devices = &domain.devices;
    let consoles = Consoles::of(devices, &opts.paths);
    let (topology, vcpus_enabled, cpu) = cpu(vmi);
    let firmware = domain.firmware.clone().unwrap_or_default();
    // The largest topology: a CPU hotplug must not change the iothreads.
    let (disks, iothreads) = disks(vmi, opts, topology.vcpus())?;
    // Every vCPU the topology has room for is pinned: one plugged later runs where the
    // definition says, as the others do (libvirt applies its pin when it comes).
    let cputune = cputune(domain, topology.vcpus(), &opts.cpus)?;
    let uuid = firmware.uuid.clone().or_else(|| {
        vmi.metadata
            .uid
            .clone()
            .filter(|u| spec::looks_like_uuid(u))
    });
    let (memory_kib, virtio_mem) = memory(vmi, opts.guest_at_boot);
    let machine = machine(domain, opts);
    let spare_pcie_ports = if is_q35(&machine) {
        SPARE_PCIE_PORTS
    } else {
        0
    };
    Ok(DomainDef {
        uuid,
        virt_type: opts.virt_type,
        memory_kib,
        virtio_mem,
        vcpus_enabled,
        hugepage_kib: domain
            .memory
            .as_ref()
            .and_then(|m| m.hugepages.as_ref())
            .and_then(|h| h.page_size.to_bytes().ok())
            .map(|b| b / 1024),
        topology,
        cpu,
        iothreads,
        cputune,
        tpm: devices
            .tpm
            .filter(|t| t.enabled != Some(false))
            .map(|t| TpmDef {
                persistent: t.persistent == Some(true),
            }),
        machine,
        firmware: firmware_def(&firmware, opts, &name),
        sysinfo_serial: firmware.serial.clone(),
        kernel_boot: kernel_boot(&firmware),
        features: features(domain),
        clock: clock(domain),
        disks,
        interfaces: interfaces(vmi, opts.network, &opts.publish),
        inputs: devices
            .inputs
            .iter()
            .map(|i| InputDef {
                name: i.name.clone(),
                input_type: i.input_type.clone(),
                bus: i.bus.clone().unwrap_or_else(|| "usb".into()),
            })
            .collect(),
        watchdog: devices.watchdog.as_ref().map(|w| WatchdogDef {
            name: w.name.clone(),
            action: w
                .i6300esb
                .as_ref()
                .and_then(|m| m.action.clone())
                .unwrap_or_else(|| "reset".into()),
        }),
        rng: devices.rng.is_some(),
        // Always present unless hotplug is off, so that scsi disks can be hot-plugged into any VM.
        scsi_controller: devices.hotplug() || devices.disks.iter().any(|d| d.bus() == "scsi"),
        spare_pcie_ports,
        serial: consoles.serial,
        vnc_socket: consoles.vnc_socket,
        memballoon: devices.mem_balloon(),
        instance: InstanceMetadata {
            namespace: vmi
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| DEFAULT_NAMESPACE.to_string()),
            name: vmi.metadata.name.clone(),
            uid: vmi.metadata.uid.clone(),
        },
        name,
    })
}

/// The boot memory in KiB and, with `maxGuest` above it, the virtio-mem device that holds the
/// rest: sized `maxGuest − boot`, asked for `guest − boot`. For a running domain the boot memory
/// is the one it booted with (`guest_at_boot`), else the spec's `guest`.
fn memory(vmi: &Validated, guest_at_boot: Option<u64>) -> (u64, Option<VirtioMemDef>) {
    let guest = vmi.guest_memory();
    let max = vmi
        .spec
        .domain
        .memory
        .as_ref()
        .and_then(|m| m.max_guest.as_ref())
        .and_then(|q| q.to_bytes().ok());
    // Without room, `guest` is the boot memory itself: a change of it is one a restart makes.
    let boot = guest_at_boot.filter(|_| max.is_some()).unwrap_or(guest);
    let device = max.filter(|&max| max > boot).map(|max| VirtioMemDef {
        size_kib: (max - boot) / 1024,
        requested_kib: guest.saturating_sub(boot) / 1024,
    });
    (boot.div_ceil(1024), device)
}

/// The vCPU topology (from the spec's, else from `resources`), how many of its vCPUs are
/// enabled when it has room for more (`maxSockets`), and the CPU model.
/// The vCPUs `vmi` asks enabled when it has room for CPU hotplug (`maxSockets`); `None`
/// without room (its topology is all there is).
pub(crate) fn vcpus_enabled(vmi: &VirtualMachineInstance) -> Option<u32> {
    cpu(vmi).1
}

fn cpu(vmi: &VirtualMachineInstance) -> (CpuTopology, Option<u32>, CpuDef) {
    let cpu = vmi.spec.domain.cpu.clone().unwrap_or_default();
    let mut enabled = None;
    let topology = if cpu.sockets.is_some() || cpu.cores.is_some() || cpu.threads.is_some() {
        let asked = CpuTopology {
            sockets: cpu.sockets.unwrap_or(1),
            cores: cpu.cores.unwrap_or(1),
            threads: cpu.threads.unwrap_or(1),
        };
        match cpu.max_sockets {
            Some(max) => {
                enabled = Some(asked.vcpus());
                CpuTopology {
                    sockets: max.max(asked.sockets),
                    ..asked
                }
            }
            None => asked,
        }
    } else if let Some(max) = cpu.max_sockets {
        let sockets = spec::resource_cpus(vmi).unwrap_or(1).min(max);
        enabled = Some(sockets);
        CpuTopology {
            sockets: max,
            cores: 1,
            threads: 1,
        }
    } else {
        CpuTopology {
            sockets: spec::resource_cpus(vmi).unwrap_or(1),
            cores: 1,
            threads: 1,
        }
    };
    let def = CpuDef {
        mode: match cpu.model.as_deref() {
            None => CpuMode::Default,
            Some("host-model") => CpuMode::HostModel,
            Some("host-passthrough") => CpuMode::HostPassthrough,
            Some(model) => CpuMode::Custom(model.to_string()),
        },
        features: cpu
            .features
            .iter()
            .map(|f| {
                (
                    f.policy.clone().unwrap_or_else(|| "require".into()),
                    f.name.clone(),
                )
            })
            .collect(),
    };
    (topology, enabled, def)
}

/// Room on a q35 machine for interfaces (and memory devices) plugged into the running guest.
const SPARE_PCIE_PORTS: u32 = 4;

/// A q35 machine (`q35`, `pc-q35-7.2`): PCIe, whose slots need root ports to be hot-pluggable.
fn is_q35(machine: &str) -> bool {
    machine == "q35" || machine.starts_with("pc-q35")
}

/// The machine type, with a host alias (`q35`) resolved through the options.
fn machine(domain: &DomainSpec, opts: &ConvertOptions) -> String {
    let machine = domain
        .machine
        .as_ref()
        .and_then(|m| m.machine_type.as_deref())
        .unwrap_or(DEFAULT_MACHINE);
    opts.machines
        .get(machine)
        .cloned()
        .unwrap_or_else(|| machine.to_string())
}

fn firmware_def(firmware: &Firmware, opts: &ConvertOptions, name: &str) -> FirmwareDef {
    let bootloader = firmware.bootloader.clone().unwrap_or_default();
    match (&bootloader.bios, bootloader.efi.as_ref()) {
        (_, Some(efi)) => {
            let secure = efi.secure();
            let dir = &opts.paths.firmware_dir;
            FirmwareDef::Efi(EfiDef {
                code: dir.join(if secure {
                    "OVMF_CODE_4M.secboot.fd"
                } else {
                    "OVMF_CODE_4M.fd"
                }),
                vars_template: dir.join(if secure {
                    "OVMF_VARS_4M.ms.fd"
                } else {
                    "OVMF_VARS_4M.fd"
                }),
                nvram: opts.paths.nvram(name),
                secure,
            })
        }
        (Some(bios), None) if bios.use_serial == Some(true) => FirmwareDef::BiosUseSerial,
        _ => FirmwareDef::Bios,
    }
}

fn kernel_boot(firmware: &Firmware) -> Option<KernelBootDef> {
    let kb = firmware.kernel_boot.as_ref()?;
    let container = kb.container.as_ref()?;
    Some(KernelBootDef {
        kernel: container.kernel_path.clone()?.into(),
        initrd: container.initrd_path.clone().map(PathBuf::from),
        cmdline: kb.kernel_args.clone(),
    })
}

fn features(domain: &DomainSpec) -> FeaturesDef {
    let features = domain.features.clone().unwrap_or_default();
    let secure_boot = domain
        .firmware
        .as_ref()
        .and_then(|f| f.bootloader.as_ref())
        .and_then(|b| b.efi.as_ref())
        .is_some_and(|e| e.secure());
    FeaturesDef {
        acpi: features.acpi.is_none_or(|f| f.on()),
        apic: features.apic.is_none_or(|a| a.enabled.unwrap_or(true)),
        apic_eoi: features.apic.and_then(|a| a.end_of_interrupt),
        // Secure boot needs SMM; validation refused an explicit "off".
        smm: features.smm.map(|s| s.on()).or(secure_boot.then_some(true)),
        hyperv: hyperv_features(features.hyperv.as_ref()),
        kvm_hidden: features.kvm.and_then(|k| k.hidden),
        pvspinlock: features.pvspinlock.map(|p| p.on()),
    }
}

fn clock(domain: &DomainSpec) -> ClockDef {
    let clock = domain.clock.clone().unwrap_or_default();
    ClockDef {
        offset: match (&clock.timezone, clock.utc.and_then(|u| u.offset_seconds)) {
            (Some(tz), _) => ClockOffset::Timezone(tz.clone()),
            (None, Some(seconds)) => ClockOffset::UtcAdjusted(seconds),
            (None, None) => ClockOffset::Utc,
        },
        timers: clock
            .timer
            .iter()
            .flat_map(|t| {
                [
                    ("hpet", &t.hpet),
                    ("pit", &t.pit),
                    ("rtc", &t.rtc),
                    ("kvmclock", &t.kvm),
                    ("hypervclock", &t.hyperv),
                ]
            })
            .filter_map(|(name, timer)| {
                let timer = timer.as_ref()?;
                Some(TimerDef {
                    name,
                    // A timer listed at all is wanted, unless it says otherwise.
                    present: Some(timer.present.unwrap_or(true)),
                    tickpolicy: timer.tick_policy.clone(),
                    track: timer.track.clone(),
                })
            })
            .collect(),
    }
}

/// The disks, and how many iothreads they use.
fn disks(
    vmi: &Validated,
    opts: &ConvertOptions,
    vcpus: u32,
) -> Result<(Vec<DiskDef>, u32), SpecErrors> {
    let mut iothreads = IoThreads::new(&vmi.spec.domain, vcpus);
    let mut targets = DiskTargets::default();
    let mut problems = Vec::new();
    let mut disks = Vec::with_capacity(vmi.spec.domain.devices.disks.len());
    for (i, disk, volume, source) in vmi.disks() {
        let resolved =
            volumes::resolve_source(vmi, volume, source, &opts.paths, &opts.block_volumes);
        let kind = disk.kind();
        if let Some(problem) = refused::disk(i, kind, volume, &resolved, opts) {
            problems.push(problem);
            continue;
        }
        let (bus, target, address) = targets.next(disk.bus());
        let iothread = iothreads.next(bus, disk.dedicated_io_thread == Some(true));
        let (claim_readonly, shared, host_file) = match source {
            VolumeSource::PersistentVolumeClaim(p) => (p.read_only == Some(true), false, false),
            // A file or a block device: the host's either way, never relabelled.
            VolumeSource::HostDisk(h) => (false, h.shared == Some(true), true),
            _ => (false, false, false),
        };
        // A claim's image file lies where a tenant or the node daemon writes: handed to QEMU by
        // the launcher, never by a path QEMU or libvirt resolves (`DiskDef::fd_group`).
        let tenant_file = opts.claims_by_fd
            && resolved.preparation == crate::volumes::Preparation::Claim
            && !resolved.block;
        let hotpluggable = crate::volumes::is_hotpluggable(volume);
        let given_to_qemu = (tenant_file && hotpluggable) || resolved.made_by_launcher();
        let backing = backing_def(&resolved, &disk.name, hotpluggable, opts);
        disks.push(DiskDef {
            volume: disk.name.clone(),
            device: match kind {
                DiskKind::Disk => DiskDevice::Disk,
                DiskKind::Cdrom => DiskDevice::Cdrom,
                DiskKind::Lun => DiskDevice::Lun,
            },
            source: if resolved.block {
                DiskSource::Block(resolved.path)
            } else {
                DiskSource::File(resolved.path)
            },
            format: resolved.format.as_str(),
            backing,
            bus,
            target,
            serial: disk.serial.clone(),
            address,
            cache: disk.cache.clone(),
            io: disk.io.clone(),
            // KubeVirt's default: pause the guest on an I/O error rather than let it see one.
            error_policy: Some(disk.error_policy.clone().unwrap_or_else(|| "stop".into())),
            iothread,
            boot_order: disk.boot_order,
            readonly: disk.readonly() || claim_readonly,
            shareable: disk.shareable == Some(true) || shared,
            // A hostDisk file too, the host's own, by descriptor where it can (`host_file`);
            // libvirt 9.0 passes no descriptor for a block device, which QEMU opens by its path.
            fd_group: ((tenant_file && !hotpluggable)
                || (host_file && !resolved.block && opts.claims_by_fd))
                .then(|| format!("vml-{}", disk.name)),
            given_to_qemu,
            host_file,
            // Where a tenant's file goes when not by descriptor: hot-plugged ones always
            // (libvirt 9.0 cannot pass a descriptor on hot-plug), claims on a migration target
            // (descriptors cannot travel with libvirt's migration). By the launcher's pin of what
            // it checked, never by the claim's or hotplug dir's path.
            pin: opts
                .pin_dir
                .as_deref()
                .filter(|_| tenant_file)
                .map(|dir| crate::host::pin::Pins::in_dir(dir).path(&disk.name)),
        });
    }
    if !problems.is_empty() {
        return Err(SpecErrors(problems));
    }
    Ok((disks, iothreads.count()))
}

/// IOThreads: a shared pool for virtio disks (one with `shared`, one per disk up to 2 × vCPUs
/// with `auto`), then one of its own for each disk that asks for it.
struct IoThreads {
    pool: u32,
    next_pooled: u32,
    next_dedicated: u32,
}

impl IoThreads {
    fn new(domain: &DomainSpec, vcpus: u32) -> IoThreads {
        let pooled = domain
            .devices
            .disks
            .iter()
            .filter(|d| d.bus() == "virtio" && d.dedicated_io_thread != Some(true))
            .count() as u32;
        let pool = match domain.io_threads_policy.as_deref() {
            Some("shared") => 1,
            Some("auto") => pooled.min(2 * vcpus).max(1),
            _ => 0,
        };
        IoThreads {
            pool,
            next_pooled: 0,
            next_dedicated: pool,
        }
    }

    /// The next disk's iothread, in disk order.
    fn next(&mut self, bus: Bus, dedicated: bool) -> Option<u32> {
        if bus != Bus::Virtio {
            None
        } else if dedicated {
            self.next_dedicated += 1;
            Some(self.next_dedicated)
        } else if self.pool > 0 {
            self.next_pooled += 1;
            Some((self.next_pooled - 1) % self.pool + 1)
        } else {
            None
        }
    }

    /// How many iothreads the disks so far use.
    fn count(&self) -> u32 {
        self.next_dedicated
    }
}

/// Targets follow disk order: vdX for virtio, sdX shared by scsi and sata (one namespace in
/// libvirt), and scsi units count scsi disks only.
#[derive(Default)]
struct DiskTargets {
    sd_index: u32,
    scsi_unit: u32,
    virtio_index: u32,
}

impl DiskTargets {
    /// The next disk's bus, target name and (scsi) address, by the bus its spec names.
    fn next(&mut self, bus: &str) -> (Bus, String, Option<DriveAddress>) {
        match bus {
            "scsi" => {
                let unit = self.scsi_unit;
                self.scsi_unit += 1;
                self.sd_index += 1;
                (
                    Bus::Scsi,
                    target_name("sd", self.sd_index - 1),
                    Some(DriveAddress {
                        controller: 0,
                        unit,
                    }),
                )
            }
            "sata" => {
                self.sd_index += 1;
                (Bus::Sata, target_name("sd", self.sd_index - 1), None)
            }
            _ => {
                self.virtio_index += 1;
                (Bus::Virtio, target_name("vd", self.virtio_index - 1), None)
            }
        }
    }
}

/// The backing image under a disk's overlay, when its volume has one.
fn backing_def(
    resolved: &volumes::ResolvedVolume,
    disk: &str,
    hotpluggable: bool,
    opts: &ConvertOptions,
) -> Option<BackingDef> {
    resolved.backing().map(|(path, block, trust)| BackingDef {
        source: if block {
            DiskSource::Block(path.into())
        } else {
            DiskSource::File(path.into())
        },
        format: match trust {
            crate::volumes::Backing::Claim { .. } => Some("raw"),
            crate::volumes::Backing::ContainerDisk => None,
        },
        fd_group: (opts.claims_by_fd && !block && !hotpluggable)
            .then(|| format!("vml-{disk}-backing")),
        // Where a migration target, which takes no descriptors, gives it (`DiskDef::pin`).
        pin: opts
            .pin_dir
            .as_deref()
            .filter(|_| !block && !hotpluggable)
            .map(|dir| crate::host::pin::Pins::in_dir(dir).backing_path(disk)),
    })
}

/// `dedicatedCpuPlacement`: vCPU `i` on the `i`-th CPU of the launcher's own set, and with
/// `isolateEmulatorThread` the emulator on the next one — what KubeVirt does with the CPUs the
/// node's CPU manager gave the pod. Too few CPUs is refused, never shared silently.
fn cputune(domain: &DomainSpec, vcpus: u32, cpus: &[u32]) -> Result<Option<CpuTune>, SpecErrors> {
    let Some(cpu) = domain
        .cpu
        .as_ref()
        .filter(|c| c.dedicated_cpu_placement == Some(true))
    else {
        return Ok(None);
    };
    let isolate = cpu.isolate_emulator_thread == Some(true);
    let needed = vcpus as usize + usize::from(isolate);
    if cpus.len() < needed {
        return Err(SpecErrors(vec![FieldError::new(
            "spec.domain.cpu.dedicatedCpuPlacement",
            Problem::NotEnoughCpus {
                needed,
                available: cpus.len(),
                cpus: cpus
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            },
        )]));
    }
    Ok(Some(CpuTune {
        vcpu_pins: cpus[..vcpus as usize].to_vec(),
        emulator_pin: isolate.then(|| cpus[vcpus as usize]),
    }))
}

/// KubeVirt's Hyper-V fields in libvirt's names and order.
fn hyperv_features(hv: Option<&spec::Hyperv>) -> Vec<HypervFeature> {
    let Some(hv) = hv else { return Vec::new() };
    let plain = |name: &'static str, state: Option<FeatureState>| {
        state.map(|s| HypervFeature {
            name,
            on: s.on(),
            attribute: None,
            direct: None,
        })
    };
    [
        plain("relaxed", hv.relaxed),
        plain("vapic", hv.vapic),
        hv.spinlocks.map(|s| {
            let on = s.enabled.unwrap_or(true);
            HypervFeature {
                name: "spinlocks",
                on,
                attribute: on.then(|| ("retries", s.spinlocks.unwrap_or(4096).to_string())),
                direct: None,
            }
        }),
        plain("vpindex", hv.vpindex),
        plain("runtime", hv.runtime),
        plain("synic", hv.synic),
        hv.synictimer.map(|t| HypervFeature {
            name: "stimer",
            on: t.enabled.unwrap_or(true),
            attribute: None,
            direct: t.direct.map(|d| d.on()),
        }),
        plain("reset", hv.reset),
        hv.vendorid.as_ref().map(|v| {
            let on = v.enabled.unwrap_or(true);
            HypervFeature {
                name: "vendor_id",
                on,
                attribute: on.then(|| ("value", v.vendorid.clone().unwrap_or_default())),
                direct: None,
            }
        }),
        plain("frequencies", hv.frequencies),
        plain("reenlightenment", hv.reenlightenment),
        plain("tlbflush", hv.tlbflush),
        plain("ipi", hv.ipi),
        plain("evmcs", hv.evmcs),
    ]
    .into_iter()
    .flatten()
    .collect()
}

mod consoles;
mod network;
mod refused;
#[cfg(test)]
mod tests;
pub(crate) use consoles::Consoles;
