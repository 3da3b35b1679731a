//! The instance spec: the subset of KubeVirt's `VirtualMachineInstance` (kubevirt.io/v1) that
//! vmlauncher understands, as serde types, plus validation that reports every problem at once with
//! its field path. A `VirtualMachine` manifest is accepted too: its `spec.template` is the instance,
//! its `spec.runStrategy` is kept for the lifecycle.
//!
//! Parsing rejects any field KubeVirt does not have, naming it, so a manifest is never half
//! understood. KubeVirt fields outside the subset parse (as [`Unsupported`]) and validation names
//! them as unsupported; a few pure scheduling fields are accepted and ignored, each with its reason
//! in the README. This module does no I/O and knows nothing of libvirt.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::de::IgnoredAny;
use serde::Deserialize;

/// QEMU 7.2 silently truncates scsi serials past this length (newer QEMU refuses to start).
pub const MAX_SCSI_SERIAL_LEN: usize = 36;
/// Linux reports at most 20 bytes of a virtio-blk serial.
pub const MAX_VIRTIO_SERIAL_LEN: usize = 20;
/// An ATA serial number is 20 bytes (QEMU's ide-hd refuses longer ones).
pub const MAX_SATA_SERIAL_LEN: usize = 20;

/// A KubeVirt field that parses but that vmlauncher does not implement: validation names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Unsupported;

impl<'de> Deserialize<'de> for Unsupported {
    fn deserialize<D: serde::Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        IgnoredAny::deserialize(de)?;
        Ok(Unsupported)
    }
}

/// A field accepted and deliberately ignored (scheduling, server-set metadata); the README lists
/// every one with its reason.
pub type Ignored = Option<IgnoredAny>;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VirtualMachineInstance {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: VmiSpec,
    /// Written by controllers, never read: accepted so that `kubectl get -o yaml` output parses.
    #[serde(default)]
    pub status: Ignored,
    /// From a `VirtualMachine` manifest's `spec.runStrategy` (or its legacy `running`); `None` for
    /// a bare instance.
    #[serde(skip)]
    pub run_strategy: Option<RunStrategy>,
}

/// KubeVirt's run strategies, applied by the lifecycle.
pub use crate::lifecycle::RunStrategy;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct VirtualMachine {
    api_version: String,
    #[allow(dead_code)]
    kind: String,
    metadata: ObjectMeta,
    spec: VirtualMachineSpec,
    #[serde(default)]
    #[allow(dead_code)]
    status: Ignored,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct VirtualMachineSpec {
    template: VmiTemplate,
    #[serde(default)]
    run_strategy: Option<RunStrategy>,
    #[serde(default)]
    running: Option<bool>,
    #[serde(default)]
    data_volume_templates: Option<Unsupported>,
    #[serde(default)]
    instancetype: Option<Unsupported>,
    #[serde(default)]
    preference: Option<Unsupported>,
    #[serde(default)]
    update_volumes_strategy: Option<Unsupported>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct VmiTemplate {
    #[serde(default)]
    metadata: Option<TemplateMeta>,
    spec: VmiSpec,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TemplateMeta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    #[serde(default)]
    creation_timestamp: Ignored,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObjectMeta {
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub uid: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// A launcher runs one named VM: a name the server would invent cannot be used.
    #[serde(default)]
    pub generate_name: Option<Unsupported>,
    // Set by the API server; they carry no meaning for a launcher.
    #[serde(default)]
    pub creation_timestamp: Ignored,
    #[serde(default)]
    pub resource_version: Ignored,
    #[serde(default)]
    pub generation: Ignored,
    #[serde(default)]
    pub managed_fields: Ignored,
    #[serde(default)]
    pub finalizers: Ignored,
    #[serde(default)]
    pub owner_references: Ignored,
    #[serde(default)]
    pub self_link: Ignored,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VmiSpec {
    pub domain: DomainSpec,
    #[serde(default)]
    pub volumes: Vec<Volume>,
    #[serde(default)]
    pub networks: Vec<Network>,
    /// Seconds between the ACPI shutdown request and a forced stop. KubeVirt's default is 30.
    #[serde(default)]
    pub termination_grace_period_seconds: Option<u64>,
    /// The guest's host name (cloud-init's `local-hostname`); the VMI name when absent.
    #[serde(default)]
    pub hostname: Option<String>,
    /// `amd64` is the only architecture this launcher runs.
    #[serde(default)]
    pub architecture: Option<String>,
    // Pod scheduling: decided before a launcher exists, nothing for it to do.
    #[serde(default)]
    pub node_selector: Ignored,
    #[serde(default)]
    pub affinity: Ignored,
    #[serde(default)]
    pub tolerations: Ignored,
    #[serde(default)]
    pub topology_spread_constraints: Ignored,
    #[serde(default)]
    pub scheduler_name: Ignored,
    #[serde(default)]
    pub priority_class_name: Ignored,
    #[serde(default)]
    pub eviction_strategy: Ignored,
    #[serde(default)]
    pub subdomain: Option<Unsupported>,
    #[serde(default)]
    pub dns_policy: Option<Unsupported>,
    #[serde(default)]
    pub dns_config: Option<Unsupported>,
    #[serde(default)]
    pub liveness_probe: Option<Unsupported>,
    #[serde(default)]
    pub readiness_probe: Option<Unsupported>,
    #[serde(default)]
    pub access_credentials: Option<Unsupported>,
    #[serde(default)]
    pub start_strategy: Option<Unsupported>,
    #[serde(default)]
    pub resource_claims: Option<Unsupported>,
    #[serde(default)]
    pub preference: Option<Unsupported>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DomainSpec {
    #[serde(default)]
    pub cpu: Option<Cpu>,
    #[serde(default)]
    pub memory: Option<Memory>,
    #[serde(default)]
    pub resources: Option<Resources>,
    #[serde(default)]
    pub machine: Option<Machine>,
    #[serde(default)]
    pub firmware: Option<Firmware>,
    #[serde(default)]
    pub features: Option<Features>,
    #[serde(default)]
    pub clock: Option<Clock>,
    /// `shared` (one iothread for every virtio disk) or `auto` (one per disk, up to 2 × vCPUs).
    #[serde(default)]
    pub io_threads_policy: Option<String>,
    #[serde(default)]
    pub devices: Devices,
    #[serde(default)]
    pub io_threads: Option<Unsupported>,
    #[serde(default)]
    pub chassis: Option<Unsupported>,
    #[serde(default)]
    pub launch_security: Option<Unsupported>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Cpu {
    #[serde(default)]
    pub cores: Option<u32>,
    #[serde(default)]
    pub sockets: Option<u32>,
    #[serde(default)]
    pub threads: Option<u32>,
    /// `host-model`, `host-passthrough`, or a named libvirt CPU model.
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub features: Vec<CpuFeature>,
    #[serde(default)]
    pub max_sockets: Option<Unsupported>,
    #[serde(default)]
    pub dedicated_cpu_placement: Option<Unsupported>,
    #[serde(default)]
    pub isolate_emulator_thread: Option<Unsupported>,
    #[serde(default)]
    pub numa: Option<Unsupported>,
    #[serde(default)]
    pub realtime: Option<Unsupported>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CpuFeature {
    pub name: String,
    /// libvirt's policies; KubeVirt's default is `require`.
    #[serde(default)]
    pub policy: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Memory {
    #[serde(default)]
    pub guest: Option<Quantity>,
    #[serde(default)]
    pub hugepages: Option<Hugepages>,
    #[serde(default)]
    pub max_guest: Option<Unsupported>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Hugepages {
    /// `2Mi` or `1Gi`.
    pub page_size: Quantity,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Resources {
    #[serde(default)]
    pub requests: BTreeMap<String, Quantity>,
    #[serde(default)]
    pub limits: BTreeMap<String, Quantity>,
    #[serde(default)]
    pub overcommit_guest_overhead: Option<Unsupported>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Machine {
    #[serde(rename = "type", default)]
    pub machine_type: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Firmware {
    #[serde(default)]
    pub uuid: Option<String>,
    /// SMBIOS system serial number.
    #[serde(default)]
    pub serial: Option<String>,
    #[serde(default)]
    pub bootloader: Option<Bootloader>,
    #[serde(default)]
    pub kernel_boot: Option<KernelBoot>,
    #[serde(default)]
    pub acpi: Option<Unsupported>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Bootloader {
    #[serde(default)]
    pub bios: Option<Bios>,
    #[serde(default)]
    pub efi: Option<Efi>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Bios {
    /// SeaBIOS prints to the serial console too.
    #[serde(default)]
    pub use_serial: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Efi {
    /// KubeVirt's default is `true`.
    #[serde(default)]
    pub secure_boot: Option<bool>,
    #[serde(default)]
    pub persistent: Option<Unsupported>,
}

impl Efi {
    pub fn secure(&self) -> bool {
        self.secure_boot.unwrap_or(true)
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KernelBoot {
    #[serde(default)]
    pub container: Option<KernelBootContainer>,
    #[serde(default)]
    pub kernel_args: Option<String>,
}

/// Without an `image`, `kernelPath` and `initrdPath` name files on the host (a local run); with an
/// image, the pod would provide them, which a launcher outside Kubernetes cannot do.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KernelBootContainer {
    #[serde(default)]
    pub image: Option<String>,
    #[serde(default)]
    pub image_pull_policy: Option<String>,
    #[serde(default)]
    pub image_pull_secret: Option<String>,
    #[serde(default)]
    pub kernel_path: Option<String>,
    #[serde(default)]
    pub initrd_path: Option<String>,
}

/// `{}` or `{enabled: false}`: present means on unless `enabled` says otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FeatureState {
    #[serde(default)]
    pub enabled: Option<bool>,
}

impl FeatureState {
    pub fn on(&self) -> bool {
        self.enabled.unwrap_or(true)
    }
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Features {
    #[serde(default)]
    pub acpi: Option<FeatureState>,
    #[serde(default)]
    pub apic: Option<Apic>,
    #[serde(default)]
    pub smm: Option<FeatureState>,
    #[serde(default)]
    pub hyperv: Option<Hyperv>,
    #[serde(default)]
    pub kvm: Option<KvmFeature>,
    #[serde(default)]
    pub pvspinlock: Option<FeatureState>,
    #[serde(default)]
    pub hyperv_passthrough: Option<Unsupported>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Apic {
    #[serde(default)]
    pub enabled: Option<bool>,
    #[serde(default)]
    pub end_of_interrupt: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KvmFeature {
    #[serde(default)]
    pub hidden: Option<bool>,
}

/// The Hyper-V enlightenments Windows guests commonly use.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Hyperv {
    #[serde(default)]
    pub relaxed: Option<FeatureState>,
    #[serde(default)]
    pub vapic: Option<FeatureState>,
    #[serde(default)]
    pub spinlocks: Option<Spinlocks>,
    #[serde(default)]
    pub vpindex: Option<FeatureState>,
    #[serde(default)]
    pub runtime: Option<FeatureState>,
    #[serde(default)]
    pub synic: Option<FeatureState>,
    #[serde(default)]
    pub synictimer: Option<SynicTimer>,
    #[serde(default)]
    pub reset: Option<FeatureState>,
    #[serde(default)]
    pub vendorid: Option<VendorId>,
    #[serde(default)]
    pub frequencies: Option<FeatureState>,
    #[serde(default)]
    pub reenlightenment: Option<FeatureState>,
    #[serde(default)]
    pub tlbflush: Option<FeatureState>,
    #[serde(default)]
    pub ipi: Option<FeatureState>,
    #[serde(default)]
    pub evmcs: Option<FeatureState>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Spinlocks {
    #[serde(default)]
    pub enabled: Option<bool>,
    /// Retries before a spinlock is reported to the hypervisor; KubeVirt's default is 4096.
    #[serde(default)]
    pub spinlocks: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SynicTimer {
    #[serde(default)]
    pub enabled: Option<bool>,
    #[serde(default)]
    pub direct: Option<FeatureState>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VendorId {
    #[serde(default)]
    pub enabled: Option<bool>,
    #[serde(default)]
    pub vendorid: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Clock {
    #[serde(default)]
    pub utc: Option<ClockUtc>,
    /// An IANA zone name, e.g. `Europe/Paris`.
    #[serde(default)]
    pub timezone: Option<String>,
    #[serde(default)]
    pub timer: Option<Timers>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClockUtc {
    #[serde(default)]
    pub offset_seconds: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Timers {
    #[serde(default)]
    pub hpet: Option<Timer>,
    #[serde(default)]
    pub kvm: Option<Timer>,
    #[serde(default)]
    pub pit: Option<Timer>,
    #[serde(default)]
    pub rtc: Option<Timer>,
    #[serde(default)]
    pub hyperv: Option<Timer>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Timer {
    #[serde(default)]
    pub present: Option<bool>,
    /// `delay`, `catchup`, `merge` or `discard`.
    #[serde(default)]
    pub tick_policy: Option<String>,
    /// rtc only: `guest` or `wall`.
    #[serde(default)]
    pub track: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Devices {
    #[serde(default)]
    pub disks: Vec<Disk>,
    #[serde(default)]
    pub interfaces: Vec<Interface>,
    #[serde(default)]
    pub inputs: Vec<Input>,
    #[serde(default)]
    pub watchdog: Option<Watchdog>,
    #[serde(default)]
    pub rng: Option<Rng>,
    /// KubeVirt's default is `true`.
    #[serde(default)]
    pub autoattach_serial_console: Option<bool>,
    /// KubeVirt's default is `true`: VNC (on a unix socket) and a VGA card.
    #[serde(default)]
    pub autoattach_graphics_device: Option<bool>,
    /// KubeVirt's default is `true`.
    #[serde(default)]
    pub autoattach_mem_balloon: Option<bool>,
    /// KubeVirt's default is `true`: a `default` masquerade interface when none is given.
    #[serde(default)]
    pub autoattach_pod_interface: Option<bool>,
    /// No hotplug scsi controller unless a scsi disk needs it.
    #[serde(default)]
    pub disable_hotplug: Option<bool>,
    #[serde(default)]
    pub gpus: Option<Unsupported>,
    #[serde(default)]
    pub host_devices: Option<Unsupported>,
    #[serde(default)]
    pub filesystems: Option<Unsupported>,
    #[serde(default)]
    pub tpm: Option<Unsupported>,
    #[serde(default)]
    pub sound: Option<Unsupported>,
    #[serde(default)]
    pub client_passthrough: Option<Unsupported>,
    #[serde(default)]
    pub use_virtio_transitional: Option<Unsupported>,
    #[serde(default)]
    pub block_multi_queue: Option<Unsupported>,
    #[serde(default)]
    pub network_interface_multiqueue: Option<Unsupported>,
    #[serde(default, rename = "autoattachVSOCK")]
    pub autoattach_vsock: Option<Unsupported>,
    #[serde(default)]
    pub autoattach_input_device: Option<Unsupported>,
    #[serde(default)]
    pub log_serial_console: Option<Unsupported>,
    #[serde(default)]
    pub downward_metrics: Option<Unsupported>,
    #[serde(default)]
    pub panic_devices: Option<Unsupported>,
    #[serde(default)]
    pub video: Option<Unsupported>,
}

impl Devices {
    pub fn serial_console(&self) -> bool {
        self.autoattach_serial_console.unwrap_or(true)
    }
    pub fn graphics(&self) -> bool {
        self.autoattach_graphics_device.unwrap_or(true)
    }
    pub fn mem_balloon(&self) -> bool {
        self.autoattach_mem_balloon.unwrap_or(true)
    }
    pub fn pod_interface(&self) -> bool {
        self.autoattach_pod_interface.unwrap_or(true)
    }
    pub fn hotplug(&self) -> bool {
        !self.disable_hotplug.unwrap_or(false)
    }
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Disk {
    pub name: String,
    #[serde(default)]
    pub disk: Option<DiskTarget>,
    #[serde(default)]
    pub cdrom: Option<CdromTarget>,
    #[serde(default)]
    pub lun: Option<LunTarget>,
    #[serde(default)]
    pub serial: Option<String>,
    /// `none`, `writethrough` or `writeback`.
    #[serde(default)]
    pub cache: Option<String>,
    /// `native` or `threads`.
    #[serde(default)]
    pub io: Option<String>,
    #[serde(default)]
    pub boot_order: Option<u32>,
    #[serde(default)]
    pub shareable: Option<bool>,
    /// `stop`, `ignore`, `report` or `enospace`.
    #[serde(default)]
    pub error_policy: Option<String>,
    #[serde(default, rename = "dedicatedIOThread")]
    pub dedicated_io_thread: Option<bool>,
    #[serde(default)]
    pub block_size: Option<Unsupported>,
    #[serde(default)]
    pub tag: Option<Unsupported>,
}

/// What kind of device a disk is, from which of `disk`, `cdrom`, `lun` is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskKind {
    Disk,
    Cdrom,
    Lun,
}

impl DiskKind {
    pub fn field(self) -> &'static str {
        match self {
            DiskKind::Disk => "disk",
            DiskKind::Cdrom => "cdrom",
            DiskKind::Lun => "lun",
        }
    }
}

impl Disk {
    /// The device kind: `disk` when none of `disk`, `cdrom`, `lun` is given (KubeVirt's default).
    pub fn kind(&self) -> DiskKind {
        if self.cdrom.is_some() {
            DiskKind::Cdrom
        } else if self.lun.is_some() {
            DiskKind::Lun
        } else {
            DiskKind::Disk
        }
    }

    /// The bus as written, else KubeVirt's default for the kind (virtio, sata for a cdrom, scsi
    /// for a lun).
    pub fn bus(&self) -> &str {
        let written = match self.kind() {
            DiskKind::Disk => self.disk.as_ref().and_then(|d| d.bus.as_deref()),
            DiskKind::Cdrom => self.cdrom.as_ref().and_then(|d| d.bus.as_deref()),
            DiskKind::Lun => self.lun.as_ref().and_then(|d| d.bus.as_deref()),
        };
        written.unwrap_or(match self.kind() {
            DiskKind::Disk => "virtio",
            DiskKind::Cdrom => "sata",
            DiskKind::Lun => "scsi",
        })
    }

    /// Read-only as written; a cdrom is read-only unless it says otherwise (KubeVirt's default).
    pub fn readonly(&self) -> bool {
        match self.kind() {
            DiskKind::Disk => self.disk.as_ref().and_then(|d| d.readonly),
            DiskKind::Cdrom => Some(self.cdrom.as_ref().and_then(|d| d.readonly).unwrap_or(true)),
            DiskKind::Lun => self.lun.as_ref().and_then(|d| d.readonly),
        }
        .unwrap_or(false)
    }
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DiskTarget {
    #[serde(default)]
    pub bus: Option<String>,
    #[serde(default)]
    pub readonly: Option<bool>,
    #[serde(default)]
    pub pci_address: Option<Unsupported>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CdromTarget {
    #[serde(default)]
    pub bus: Option<String>,
    #[serde(default)]
    pub readonly: Option<bool>,
    #[serde(default)]
    pub tray: Option<Unsupported>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LunTarget {
    #[serde(default)]
    pub bus: Option<String>,
    #[serde(default)]
    pub readonly: Option<bool>,
    #[serde(default)]
    pub reservation: Option<Unsupported>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Interface {
    pub name: String,
    #[serde(default)]
    pub masquerade: Option<IgnoredEmpty>,
    #[serde(default)]
    pub bridge: Option<IgnoredEmpty>,
    /// `virtio` (default), `e1000`, `e1000e`, `rtl8139`, `pcnet` or `ne2k_pci`.
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub mac_address: Option<String>,
    #[serde(default)]
    pub boot_order: Option<u32>,
    #[serde(default)]
    pub sriov: Option<Unsupported>,
    #[serde(default)]
    pub slirp: Option<Unsupported>,
    #[serde(default)]
    pub passt: Option<Unsupported>,
    #[serde(default)]
    pub macvtap: Option<Unsupported>,
    #[serde(default)]
    pub binding: Option<Unsupported>,
    #[serde(default)]
    pub ports: Option<Unsupported>,
    #[serde(default)]
    pub pci_address: Option<Unsupported>,
    #[serde(default)]
    pub dhcp_options: Option<Unsupported>,
    #[serde(default)]
    pub tag: Option<Unsupported>,
    #[serde(default)]
    pub state: Option<Unsupported>,
    #[serde(default)]
    pub acpi_index: Option<Unsupported>,
}

/// An empty object (`masquerade: {}`): any field in it is an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IgnoredEmpty {}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Network {
    pub name: String,
    #[serde(default)]
    pub pod: Option<PodNetwork>,
    #[serde(default)]
    pub multus: Option<Unsupported>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodNetwork {
    #[serde(default, rename = "vmNetworkCIDR")]
    pub vm_network_cidr: Option<Unsupported>,
    #[serde(default, rename = "vmIPv6NetworkCIDR")]
    pub vm_ipv6_network_cidr: Option<Unsupported>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Input {
    pub name: String,
    /// `tablet` or `keyboard`.
    #[serde(rename = "type")]
    pub input_type: String,
    /// `usb` (default) or `virtio`.
    #[serde(default)]
    pub bus: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Watchdog {
    pub name: String,
    #[serde(default)]
    pub i6300esb: Option<I6300esb>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct I6300esb {
    /// `poweroff`, `reset` (default) or `shutdown`.
    #[serde(default)]
    pub action: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rng {}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Volume {
    pub name: String,
    #[serde(default)]
    pub host_disk: Option<HostDisk>,
    #[serde(default)]
    pub persistent_volume_claim: Option<PvcSource>,
    #[serde(default)]
    pub data_volume: Option<DataVolumeSource>,
    #[serde(default)]
    pub container_disk: Option<ContainerDisk>,
    #[serde(default)]
    pub empty_disk: Option<EmptyDisk>,
    #[serde(default)]
    pub ephemeral: Option<Ephemeral>,
    #[serde(default)]
    pub cloud_init_no_cloud: Option<CloudInitNoCloud>,
    #[serde(default)]
    pub cloud_init_config_drive: Option<Unsupported>,
    #[serde(default)]
    pub config_map: Option<Unsupported>,
    #[serde(default)]
    pub secret: Option<Unsupported>,
    #[serde(default)]
    pub service_account: Option<Unsupported>,
    #[serde(default, rename = "downwardAPI")]
    pub downward_api: Option<Unsupported>,
    #[serde(default)]
    pub downward_metrics: Option<Unsupported>,
    #[serde(default)]
    pub sysprep: Option<Unsupported>,
    #[serde(default)]
    pub memory_dump: Option<Unsupported>,
}

/// Which source a volume has, once validated (exactly one).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum VolumeSource<'a> {
    HostDisk(&'a HostDisk),
    PersistentVolumeClaim(&'a PvcSource),
    DataVolume(&'a DataVolumeSource),
    ContainerDisk(&'a ContainerDisk),
    EmptyDisk(&'a EmptyDisk),
    Ephemeral(&'a Ephemeral),
    CloudInitNoCloud(&'a CloudInitNoCloud),
}

impl Volume {
    /// Every source this volume names, supported or not, with its field name.
    fn sources(&self) -> Vec<(&'static str, Option<VolumeSource<'_>>)> {
        let supported = [
            (
                "hostDisk",
                self.host_disk.as_ref().map(VolumeSource::HostDisk),
            ),
            (
                "persistentVolumeClaim",
                self.persistent_volume_claim
                    .as_ref()
                    .map(VolumeSource::PersistentVolumeClaim),
            ),
            (
                "dataVolume",
                self.data_volume.as_ref().map(VolumeSource::DataVolume),
            ),
            (
                "containerDisk",
                self.container_disk
                    .as_ref()
                    .map(VolumeSource::ContainerDisk),
            ),
            (
                "emptyDisk",
                self.empty_disk.as_ref().map(VolumeSource::EmptyDisk),
            ),
            (
                "ephemeral",
                self.ephemeral.as_ref().map(VolumeSource::Ephemeral),
            ),
            (
                "cloudInitNoCloud",
                self.cloud_init_no_cloud
                    .as_ref()
                    .map(VolumeSource::CloudInitNoCloud),
            ),
        ];
        // Real KubeVirt sources that only make sense inside a cluster.
        let unsupported = [
            (
                "cloudInitConfigDrive",
                self.cloud_init_config_drive.is_some(),
            ),
            ("configMap", self.config_map.is_some()),
            ("secret", self.secret.is_some()),
            ("serviceAccount", self.service_account.is_some()),
            ("downwardAPI", self.downward_api.is_some()),
            ("downwardMetrics", self.downward_metrics.is_some()),
            ("sysprep", self.sysprep.is_some()),
            ("memoryDump", self.memory_dump.is_some()),
        ];
        let named = supported
            .into_iter()
            .filter_map(|(field, source)| Some((field, Some(source?))));
        let named_unsupported = unsupported
            .into_iter()
            .filter(|(_, present)| *present)
            .map(|(field, _)| (field, None));
        named.chain(named_unsupported).collect()
    }

    /// The volume's source; `None` only for a volume that failed validation.
    pub fn source(&self) -> Option<VolumeSource<'_>> {
        match self.sources().as_slice() {
            [(_, Some(source))] => Some(*source),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HostDisk {
    pub path: String,
    #[serde(rename = "type")]
    pub disk_type: String,
    #[serde(default)]
    pub capacity: Option<Quantity>,
    /// Marks the disk shareable between VMs.
    #[serde(default)]
    pub shared: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PvcSource {
    pub claim_name: String,
    #[serde(default)]
    pub read_only: Option<bool>,
    #[serde(default)]
    pub hotpluggable: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DataVolumeSource {
    pub name: String,
    #[serde(default)]
    pub hotpluggable: Option<bool>,
}

/// The image is not pulled by the launcher: whoever makes the pod puts it at
/// `<container-disk-dir>/disk_<n>.img` (KubeVirt's convention), so `image` and its pull settings
/// only identify it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerDisk {
    pub image: String,
    #[serde(default)]
    pub image_pull_policy: Option<String>,
    #[serde(default)]
    pub image_pull_secret: Option<String>,
    #[serde(default)]
    pub path: Option<Unsupported>,
    #[serde(default)]
    pub hotpluggable: Option<Unsupported>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EmptyDisk {
    pub capacity: Quantity,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Ephemeral {
    pub persistent_volume_claim: PvcSource,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CloudInitNoCloud {
    #[serde(default)]
    pub user_data: Option<String>,
    #[serde(default)]
    pub user_data_base64: Option<String>,
    #[serde(default)]
    pub network_data: Option<String>,
    #[serde(default)]
    pub network_data_base64: Option<String>,
    #[serde(default)]
    pub secret_ref: Option<Unsupported>,
    #[serde(default)]
    pub network_data_secret_ref: Option<Unsupported>,
}

/// A Kubernetes resource quantity (`128Mi`, `1G`, `1.5Gi`, `1024`, `500m`), kept as written and
/// read on demand, so an error can quote what the user wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quantity(pub String);

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: serde::Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        // YAML writes `cpu: 2` as a number and `memory: 1Gi` as a string: accept both.
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Int(u64),
            Float(f64),
        }
        Ok(Quantity(match Raw::deserialize(de)? {
            Raw::Text(s) => s,
            Raw::Int(n) => n.to_string(),
            Raw::Float(f) => f.to_string(),
        }))
    }
}

impl Quantity {
    /// The quantity as a number of units (bytes for memory, cores for CPU).
    pub fn value(&self) -> Result<f64, String> {
        let text = self.0.trim();
        let split = text
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(text.len());
        let (number, suffix) = text.split_at(split);
        let multiplier: f64 = match suffix {
            "" => 1.0,
            "m" => 1e-3,
            "k" => 1e3,
            "M" => 1e6,
            "G" => 1e9,
            "T" => 1e12,
            "P" => 1e15,
            "E" => 1e18,
            "Ki" => 1024.0,
            "Mi" => 1024.0 * 1024.0,
            "Gi" => 1024.0 * 1024.0 * 1024.0,
            "Ti" => 1024f64.powi(4),
            "Pi" => 1024f64.powi(5),
            "Ei" => 1024f64.powi(6),
            other => return Err(format!("unknown unit {other:?} in quantity {text:?}")),
        };
        let value: f64 = number
            .parse()
            .map_err(|_| format!("{text:?} is not a quantity (e.g. 128Mi, 1Gi, 2G)"))?;
        let total = value * multiplier;
        if !total.is_finite() || total < 0.0 || total > u64::MAX as f64 {
            return Err(format!("quantity {text:?} is out of range"));
        }
        Ok(total)
    }

    /// The quantity in bytes (or plain units), rounded up to a whole number.
    pub fn to_bytes(&self) -> Result<u64, String> {
        Ok(self.value()?.ceil() as u64)
    }
}

/// One problem in a spec, with the path of the field it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub path: String,
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Every problem found in a spec; `Display` prints one per line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct SpecErrors(pub Vec<FieldError>);

impl fmt::Display for SpecErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl SpecErrors {
    fn one(path: impl Into<String>, message: impl Into<String>) -> Self {
        SpecErrors(vec![FieldError {
            path: path.into(),
            message: message.into(),
        }])
    }
}

/// Parses a VMI (or a VirtualMachine's template) from YAML or JSON text and validates it.
pub fn parse(text: &str) -> Result<VirtualMachineInstance, SpecErrors> {
    let (vmi, from_vm) = parse_manifest(text)?;
    validate(&vmi).map_err(|SpecErrors(errors)| {
        // A VirtualMachine's instance lives under spec.template: say so in every path.
        SpecErrors(
            errors
                .into_iter()
                .map(|e| match e.path.strip_prefix("spec.") {
                    Some(rest) if from_vm => FieldError {
                        path: format!("spec.template.spec.{rest}"),
                        message: e.message,
                    },
                    _ => e,
                })
                .collect(),
        )
    })?;
    Ok(vmi)
}

/// Parses without validating: for tools that want to show every validation error themselves.
pub fn parse_unvalidated(text: &str) -> Result<VirtualMachineInstance, SpecErrors> {
    parse_manifest(text).map(|(vmi, _)| vmi)
}

fn document_error(message: String) -> SpecErrors {
    SpecErrors::one("(document)", message)
}

fn from_value<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<T, SpecErrors> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let path = if path == "." || path.is_empty() {
            "(document)".to_string()
        } else {
            path
        };
        SpecErrors::one(path, e.into_inner().to_string())
    })
}

/// The instance, and whether it came from a VirtualMachine's template.
fn parse_manifest(text: &str) -> Result<(VirtualMachineInstance, bool), SpecErrors> {
    let looks_like_json = text.trim_start().starts_with('{');
    let value: serde_json::Value = if looks_like_json {
        serde_json::from_str(text).map_err(|e| document_error(e.to_string()))?
    } else {
        serde_yaml_ng::from_str(text).map_err(|e| document_error(e.to_string()))?
    };
    if !value.is_object() {
        return Err(document_error(
            "not a Kubernetes object (expected apiVersion, kind, metadata, spec)".into(),
        ));
    }
    match value.get("kind").and_then(|k| k.as_str()) {
        Some("VirtualMachine") => from_vm(from_value(value)?).map(|vmi| (vmi, true)),
        Some("VirtualMachineInstance") | None => Ok((from_value(value)?, false)),
        Some(other) => Err(SpecErrors::one(
            "kind",
            format!("{other:?}: unsupported kind (VirtualMachineInstance or VirtualMachine)"),
        )),
    }
    .map(|(mut vmi, from_vm)| {
        default_volume_disks(&mut vmi.spec);
        (vmi, from_vm)
    })
}

/// KubeVirt's defaulting: a volume that no disk names gets a disk of its own, with the default
/// bus (what KubeVirt's mutating webhook does, so manifests that rely on it mean the same here).
fn default_volume_disks(spec: &mut VmiSpec) {
    for volume in &spec.volumes {
        if !spec
            .domain
            .devices
            .disks
            .iter()
            .any(|d| d.name == volume.name)
        {
            spec.domain.devices.disks.push(Disk {
                name: volume.name.clone(),
                ..Disk::default()
            });
        }
    }
}

fn from_vm(vm: VirtualMachine) -> Result<VirtualMachineInstance, SpecErrors> {
    let mut errors = Vec::new();
    let spec = &vm.spec;
    for (field, present, why) in [
        (
            "dataVolumeTemplates",
            spec.data_volume_templates.is_some(),
            "DataVolumes are imported by CDI in a cluster",
        ),
        (
            "instancetype",
            spec.instancetype.is_some(),
            "instance types are expanded by the cluster",
        ),
        (
            "preference",
            spec.preference.is_some(),
            "preferences are expanded by the cluster",
        ),
        (
            "updateVolumesStrategy",
            spec.update_volumes_strategy.is_some(),
            "volume migration",
        ),
    ] {
        if present {
            errors.push(FieldError {
                path: format!("spec.{field}"),
                message: format!("unsupported ({why})"),
            });
        }
    }
    let run_strategy = match (spec.run_strategy, spec.running) {
        (Some(_), Some(_)) => {
            errors.push(FieldError {
                path: "spec.running".into(),
                message: "cannot be combined with spec.runStrategy".into(),
            });
            None
        }
        (Some(s), None) => Some(s),
        (None, Some(true)) => Some(RunStrategy::Always),
        (None, Some(false)) => Some(RunStrategy::Halted),
        (None, None) => None,
    };
    if !errors.is_empty() {
        return Err(SpecErrors(errors));
    }
    let template = vm.spec.template.metadata.unwrap_or_default();
    Ok(VirtualMachineInstance {
        api_version: vm.api_version,
        kind: "VirtualMachineInstance".into(),
        metadata: ObjectMeta {
            // KubeVirt names the instance after its VirtualMachine, whatever the template says.
            name: vm.metadata.name,
            namespace: vm.metadata.namespace.or(template.namespace),
            uid: None,
            labels: template.labels,
            annotations: template.annotations,
            generate_name: None,
            creation_timestamp: None,
            resource_version: None,
            generation: None,
            managed_fields: None,
            finalizers: None,
            owner_references: None,
            self_link: None,
        },
        spec: vm.spec.template.spec,
        status: None,
        run_strategy,
    })
}

/// Collects field errors with their paths.
struct Errors(Vec<FieldError>);

impl Errors {
    fn add(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError {
            path: path.into(),
            message: message.into(),
        });
    }

    /// Names each present field as unsupported, with why.
    fn unsupported(&mut self, base: &str, fields: &[(&str, bool, &str)]) {
        for (field, present, why) in fields {
            if *present {
                self.add(format!("{base}.{field}"), format!("unsupported ({why})"));
            }
        }
    }

    fn one_of(&mut self, path: String, value: &str, allowed: &[&str]) {
        if !allowed.contains(&value) {
            self.add(
                path,
                format!("{value:?} is not one of {}", allowed.join(", ")),
            );
        }
    }
}

/// Annotations that would change the domain through a KubeVirt sidecar hook.
const HOOK_ANNOTATIONS: &[&str] = &["hooks.kubevirt.io/hookSidecars"];
const SMBIOS_ANNOTATION_PREFIX: &str = "smbios.vm.kubevirt.io/";

pub const DISK_BUSES: &[&str] = &["virtio", "scsi", "sata"];
pub const CDROM_BUSES: &[&str] = &["sata", "scsi"];
pub const LUN_BUSES: &[&str] = &["scsi"];
pub const NIC_MODELS: &[&str] = &["virtio", "e1000", "e1000e", "rtl8139", "pcnet", "ne2k_pci"];

/// Checks what serde cannot: names, references between disks, volumes, interfaces and networks,
/// buses, serials, quantities, and the KubeVirt fields outside the subset. Returns every problem,
/// not just the first.
pub fn validate(vmi: &VirtualMachineInstance) -> Result<(), SpecErrors> {
    let mut errors = Errors(Vec::new());
    let e = &mut errors;

    if vmi.api_version != "kubevirt.io/v1" {
        e.add(
            "apiVersion",
            format!("{:?} is not supported, use kubevirt.io/v1", vmi.api_version),
        );
    }
    if vmi.kind != "VirtualMachineInstance" {
        e.add(
            "kind",
            format!(
                "{:?}: unsupported kind (VirtualMachineInstance or VirtualMachine)",
                vmi.kind
            ),
        );
    }
    validate_metadata(&vmi.metadata, e);

    let spec = &vmi.spec;
    e.unsupported(
        "spec",
        &[
            ("subdomain", spec.subdomain.is_some(), "cluster DNS"),
            ("dnsPolicy", spec.dns_policy.is_some(), "pod DNS"),
            ("dnsConfig", spec.dns_config.is_some(), "pod DNS"),
            ("livenessProbe", spec.liveness_probe.is_some(), "probes"),
            ("readinessProbe", spec.readiness_probe.is_some(), "probes"),
            (
                "accessCredentials",
                spec.access_credentials.is_some(),
                "credential propagation needs the guest agent",
            ),
            (
                "startStrategy",
                spec.start_strategy.is_some(),
                "paused starts",
            ),
            (
                "resourceClaims",
                spec.resource_claims.is_some(),
                "dynamic resource allocation",
            ),
            (
                "preference",
                spec.preference.is_some(),
                "preferences are expanded by the cluster",
            ),
        ],
    );
    if let Some(arch) = &spec.architecture {
        if arch != "amd64" {
            e.add(
                "spec.architecture",
                format!("{arch:?}: unsupported (this launcher runs amd64 guests only)"),
            );
        }
    }
    if let Some(hostname) = &spec.hostname {
        if let Err(why) = check_dns1123_label(hostname) {
            e.add("spec.hostname", why);
        }
    }

    let domain = &spec.domain;
    e.unsupported(
        "spec.domain",
        &[
            (
                "ioThreads",
                domain.io_threads.is_some(),
                "supplemental iothread pools",
            ),
            ("chassis", domain.chassis.is_some(), "SMBIOS chassis"),
            (
                "launchSecurity",
                domain.launch_security.is_some(),
                "confidential computing",
            ),
        ],
    );
    validate_memory(vmi, e);
    validate_cpu(domain, e);
    validate_machine_and_firmware(domain, e);
    validate_features_and_clock(domain, e);
    if let Some(policy) = &domain.io_threads_policy {
        e.one_of(
            "spec.domain.ioThreadsPolicy".into(),
            policy,
            &["shared", "auto"],
        );
    }
    validate_devices(vmi, e);
    validate_volumes(vmi, e);

    if errors.0.is_empty() {
        Ok(())
    } else {
        Err(SpecErrors(errors.0))
    }
}

fn validate_metadata(meta: &ObjectMeta, e: &mut Errors) {
    if let Err(why) = check_dns1123_label(&meta.name) {
        e.add("metadata.name", why);
    }
    if let Some(ns) = &meta.namespace {
        if let Err(why) = check_dns1123_label(ns) {
            e.add("metadata.namespace", why);
        }
    }
    e.unsupported(
        "metadata",
        &[(
            "generateName",
            meta.generate_name.is_some(),
            "a launcher runs one VM with a fixed name",
        )],
    );
    for key in meta.annotations.keys() {
        if HOOK_ANNOTATIONS.contains(&key.as_str()) || key.starts_with(SMBIOS_ANNOTATION_PREFIX) {
            e.add(
                format!("metadata.annotations[{key}]"),
                "unsupported (sidecar hooks)",
            );
        }
    }
}

fn validate_memory(vmi: &VirtualMachineInstance, e: &mut Errors) {
    let domain = &vmi.spec.domain;
    let guest = match guest_memory(vmi) {
        Ok(Some(bytes)) if bytes < 1024 * 1024 => {
            e.add(
                memory_path(vmi),
                format!("{bytes} bytes is too little memory for a guest (at least 1Mi)"),
            );
            None
        }
        Ok(Some(bytes)) => Some(bytes),
        Ok(None) => {
            e.add(
                "spec.domain.memory.guest",
                "guest memory is required (spec.domain.memory.guest or resources.requests.memory)",
            );
            None
        }
        Err(why) => {
            e.add(memory_path(vmi), why);
            None
        }
    };
    if let Some(memory) = &domain.memory {
        e.unsupported(
            "spec.domain.memory",
            &[("maxGuest", memory.max_guest.is_some(), "memory hotplug")],
        );
        if let Some(hp) = &memory.hugepages {
            let path = "spec.domain.memory.hugepages.pageSize";
            match hp.page_size.to_bytes() {
                Ok(size) if size == 2 << 20 || size == 1 << 30 => {
                    if let Some(guest) = guest.filter(|g| g % size != 0) {
                        e.add(
                            path,
                            format!(
                                "guest memory ({guest} bytes) is not a multiple of the page size {}",
                                hp.page_size.0
                            ),
                        );
                    }
                }
                Ok(_) => e.add(path, format!("{:?} is not 2Mi or 1Gi", hp.page_size.0)),
                Err(why) => e.add(path, why),
            }
        }
    }
    if let Some(resources) = &domain.resources {
        e.unsupported(
            "spec.domain.resources",
            &[(
                "overcommitGuestOverhead",
                resources.overcommit_guest_overhead.is_some(),
                "pod memory accounting",
            )],
        );
        for (kind, map) in [
            ("requests", &resources.requests),
            ("limits", &resources.limits),
        ] {
            for (name, quantity) in map {
                let path = format!("spec.domain.resources.{kind}.{name}");
                match name.as_str() {
                    "memory" | "cpu" | "ephemeral-storage" => {
                        if let Err(why) = quantity.value() {
                            e.add(path, why);
                        }
                    }
                    _ => e.add(
                        path,
                        "unsupported (extended resources are devices of a cluster)",
                    ),
                }
            }
        }
    }
}

fn validate_cpu(domain: &DomainSpec, e: &mut Errors) {
    let Some(cpu) = &domain.cpu else { return };
    for (field, value) in [
        ("cores", cpu.cores),
        ("sockets", cpu.sockets),
        ("threads", cpu.threads),
    ] {
        if value == Some(0) {
            e.add(format!("spec.domain.cpu.{field}"), "must be at least 1");
        }
    }
    if let Some(model) = &cpu.model {
        if model.is_empty()
            || !model
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            e.add(
                "spec.domain.cpu.model",
                format!("{model:?} is not a CPU model name (host-model, host-passthrough or a libvirt model)"),
            );
        }
    }
    let mut seen = BTreeSet::new();
    for (i, feature) in cpu.features.iter().enumerate() {
        let path = format!("spec.domain.cpu.features[{i}]");
        if feature.name.is_empty()
            || !feature
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            e.add(
                format!("{path}.name"),
                format!("{:?} is not a CPU feature name", feature.name),
            );
        }
        if !seen.insert(feature.name.as_str()) {
            e.add(
                format!("{path}.name"),
                format!("duplicate CPU feature {:?}", feature.name),
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
    e.unsupported(
        "spec.domain.cpu",
        &[
            ("maxSockets", cpu.max_sockets.is_some(), "CPU hotplug"),
            (
                "dedicatedCpuPlacement",
                cpu.dedicated_cpu_placement.is_some(),
                "CPU pinning needs the node's CPU manager",
            ),
            (
                "isolateEmulatorThread",
                cpu.isolate_emulator_thread.is_some(),
                "CPU pinning needs the node's CPU manager",
            ),
            ("numa", cpu.numa.is_some(), "guest NUMA mapping"),
            ("realtime", cpu.realtime.is_some(), "realtime scheduling"),
        ],
    );
}

/// The machine types this launcher knows: the q35 and i440fx families of QEMU's x86 machines.
pub fn is_known_machine(machine: &str) -> bool {
    machine == "q35"
        || machine == "pc"
        || machine.starts_with("pc-q35-")
        || machine.starts_with("pc-i440fx-")
}

fn validate_machine_and_firmware(domain: &DomainSpec, e: &mut Errors) {
    let machine = domain
        .machine
        .as_ref()
        .and_then(|m| m.machine_type.as_deref());
    if let Some(machine) = machine {
        if !is_known_machine(machine) {
            e.add(
                "spec.domain.machine.type",
                format!(
                    "{machine:?} is not a supported machine type (q35, pc-q35-*, pc, pc-i440fx-*)"
                ),
            );
        }
    }
    let Some(firmware) = &domain.firmware else {
        return;
    };
    let base = "spec.domain.firmware";
    e.unsupported(
        base,
        &[("acpi", firmware.acpi.is_some(), "ACPI tables from volumes")],
    );
    if let Some(uuid) = &firmware.uuid {
        if !looks_like_uuid(uuid) {
            e.add(format!("{base}.uuid"), format!("{uuid:?} is not a UUID"));
        }
    }
    if let Some(serial) = &firmware.serial {
        if serial.is_empty()
            || serial.len() > 64
            || !serial.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
        {
            e.add(
                format!("{base}.serial"),
                format!("{serial:?}: an SMBIOS serial is 1-64 printable ASCII characters"),
            );
        }
    }
    if let Some(bootloader) = &firmware.bootloader {
        if bootloader.bios.is_some() && bootloader.efi.is_some() {
            e.add(
                format!("{base}.bootloader"),
                "bios and efi cannot both be set",
            );
        }
        if let Some(efi) = &bootloader.efi {
            e.unsupported(
                &format!("{base}.bootloader.efi"),
                &[(
                    "persistent",
                    efi.persistent.is_some(),
                    "EFI variables kept across restarts need a persistent volume",
                )],
            );
            if efi.secure() {
                if machine.is_some_and(|m| m == "pc" || m.starts_with("pc-i440fx-")) {
                    e.add(
                        format!("{base}.bootloader.efi.secureBoot"),
                        "secure boot needs a q35 machine",
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
                        "secure boot needs SMM; spec.domain.features.smm is disabled",
                    );
                }
            }
        }
    }
    if let Some(kb) = &firmware.kernel_boot {
        let base = "spec.domain.firmware.kernelBoot.container";
        match &kb.container {
            None => e.add(base, "a kernel boot needs a container with kernelPath"),
            Some(c) => {
                if let Some(image) = &c.image {
                    e.add(
                        format!("{base}.image"),
                        format!("{image:?}: unsupported (kernel images from a registry; leave out image and give host paths in kernelPath and initrdPath)"),
                    );
                }
                match &c.kernel_path {
                    None => e.add(format!("{base}.kernelPath"), "is required"),
                    Some(p) if !p.starts_with('/') => e.add(
                        format!("{base}.kernelPath"),
                        format!("{p:?} must be an absolute path"),
                    ),
                    Some(_) => {}
                }
                if let Some(p) = &c.initrd_path {
                    if !p.starts_with('/') {
                        e.add(
                            format!("{base}.initrdPath"),
                            format!("{p:?} must be an absolute path"),
                        );
                    }
                }
            }
        }
    }
}

const TICK_POLICIES: &[&str] = &["delay", "catchup", "merge", "discard"];

fn validate_features_and_clock(domain: &DomainSpec, e: &mut Errors) {
    if let Some(features) = &domain.features {
        e.unsupported(
            "spec.domain.features",
            &[(
                "hypervPassthrough",
                features.hyperv_passthrough.is_some(),
                "host Hyper-V passthrough",
            )],
        );
        if let Some(hv) = &features.hyperv {
            let base = "spec.domain.features.hyperv";
            if let Some(s) = &hv.spinlocks {
                if s.spinlocks.is_some_and(|n| n < 4096) {
                    e.add(
                        format!("{base}.spinlocks.spinlocks"),
                        "must be at least 4096",
                    );
                }
            }
            if let Some(v) = &hv.vendorid {
                if v.enabled.unwrap_or(true) {
                    match &v.vendorid {
                        Some(id) if !id.is_empty() && id.len() <= 12 && id.is_ascii() => {}
                        Some(id) => e.add(
                            format!("{base}.vendorid.vendorid"),
                            format!("{id:?}: a Hyper-V vendor id is 1-12 ASCII characters"),
                        ),
                        None => e.add(format!("{base}.vendorid.vendorid"), "is required"),
                    }
                }
            }
        }
    }
    if let Some(clock) = &domain.clock {
        let base = "spec.domain.clock";
        if clock.utc.is_some() && clock.timezone.is_some() {
            e.add(base, "utc and timezone cannot both be set");
        }
        if let Some(tz) = &clock.timezone {
            if tz.is_empty()
                || !tz
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"/_+-".contains(&b))
            {
                e.add(
                    format!("{base}.timezone"),
                    format!("{tz:?} is not a time zone name"),
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
                            format!("not available for the {name} timer"),
                        );
                    } else {
                        e.one_of(format!("{path}.tickPolicy"), policy, TICK_POLICIES);
                    }
                }
                if let Some(track) = &timer.track {
                    if name == "rtc" {
                        e.one_of(format!("{path}.track"), track, &["guest", "wall"]);
                    } else {
                        e.add(format!("{path}.track"), "only the rtc timer has track");
                    }
                }
            }
        }
    }
}

fn validate_devices(vmi: &VirtualMachineInstance, e: &mut Errors) {
    let devices = &vmi.spec.domain.devices;
    let base = "spec.domain.devices";
    e.unsupported(
        base,
        &[
            ("gpus", devices.gpus.is_some(), "device passthrough"),
            (
                "hostDevices",
                devices.host_devices.is_some(),
                "device passthrough",
            ),
            ("filesystems", devices.filesystems.is_some(), "virtiofs"),
            ("tpm", devices.tpm.is_some(), "a vTPM needs swtpm"),
            ("sound", devices.sound.is_some(), "sound devices"),
            (
                "clientPassthrough",
                devices.client_passthrough.is_some(),
                "USB redirection",
            ),
            (
                "useVirtioTransitional",
                devices.use_virtio_transitional.is_some(),
                "virtio 0.9 devices",
            ),
            (
                "blockMultiQueue",
                devices.block_multi_queue.is_some(),
                "multi-queue block",
            ),
            (
                "networkInterfaceMultiqueue",
                devices.network_interface_multiqueue.is_some(),
                "multi-queue network",
            ),
            (
                "autoattachVSOCK",
                devices.autoattach_vsock.is_some(),
                "vsock",
            ),
            (
                "autoattachInputDevice",
                devices.autoattach_input_device.is_some(),
                "list the input in spec.domain.devices.inputs",
            ),
            (
                "logSerialConsole",
                devices.log_serial_console.is_some(),
                "the launcher always logs the serial console",
            ),
            (
                "downwardMetrics",
                devices.downward_metrics.is_some(),
                "downward metrics",
            ),
            (
                "panicDevices",
                devices.panic_devices.is_some(),
                "panic devices",
            ),
            (
                "video",
                devices.video.is_some(),
                "the video model is chosen with the graphics device",
            ),
        ],
    );

    let volumes: BTreeMap<&str, &Volume> = vmi
        .spec
        .volumes
        .iter()
        .map(|v| (v.name.as_str(), v))
        .collect();
    let mut boot_orders: BTreeMap<u32, String> = BTreeMap::new();
    let mut check_boot_order = |e: &mut Errors, path: String, order: Option<u32>| {
        let Some(order) = order else { return };
        if order == 0 {
            e.add(path, "must be at least 1");
        } else if let Some(first) = boot_orders.get(&order) {
            e.add(
                path,
                format!("boot order {order} is already used by {first}"),
            );
        } else {
            boot_orders.insert(order, path);
        }
    };

    let mut seen_disks = BTreeSet::new();
    for (i, disk) in devices.disks.iter().enumerate() {
        let path = format!("{base}.disks[{i}]");
        if !seen_disks.insert(disk.name.as_str()) {
            e.add(
                format!("{path}.name"),
                format!("duplicate disk name {:?}", disk.name),
            );
        }
        let volume = volumes.get(disk.name.as_str());
        if volume.is_none() {
            e.add(
                format!("{path}.name"),
                format!("disk {:?} has no volume of the same name", disk.name),
            );
        }
        let set = [
            disk.disk.is_some(),
            disk.cdrom.is_some(),
            disk.lun.is_some(),
        ];
        if set.iter().filter(|s| **s).count() > 1 {
            e.add(path.clone(), "only one of disk, cdrom, lun may be set");
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
                format!(
                    "bus {bus:?} is not valid for a {} (valid: {})",
                    kind.field(),
                    allowed.join(", ")
                ),
            );
        }
        e.unsupported(
            &path,
            &[
                ("blockSize", disk.block_size.is_some(), "custom block sizes"),
                (
                    "tag",
                    disk.tag.is_some(),
                    "device tags need the guest agent",
                ),
            ],
        );
        if let Some(d) = &disk.disk {
            e.unsupported(
                &format!("{path}.disk"),
                &[("pciAddress", d.pci_address.is_some(), "fixed PCI addresses")],
            );
        }
        if let Some(c) = &disk.cdrom {
            e.unsupported(
                &format!("{path}.cdrom"),
                &[("tray", c.tray.is_some(), "an open tray")],
            );
        }
        if let Some(l) = &disk.lun {
            e.unsupported(
                &format!("{path}.lun"),
                &[(
                    "reservation",
                    l.reservation.is_some(),
                    "persistent reservations",
                )],
            );
        }
        if let Some(serial) = &disk.serial {
            if kind == DiskKind::Lun {
                e.add(
                    format!("{path}.serial"),
                    "a lun shows the device's own serial",
                );
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
                    format!(
                        "io native needs cache none, not {:?}",
                        disk.cache.as_deref().unwrap_or("")
                    ),
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
                "only virtio disks run on an iothread",
            );
        }
        check_boot_order(e, format!("{path}.bootOrder"), disk.boot_order);
        let claim_readonly = volume
            .and_then(|v| v.persistent_volume_claim.as_ref())
            .is_some_and(|p| p.read_only == Some(true));
        if kind == DiskKind::Disk && bus == "sata" && (disk.readonly() || claim_readonly) {
            // QEMU's ide-hd has no read-only mode; libvirt refuses it.
            e.add(
                format!("{path}.disk.readonly"),
                "a read-only disk cannot be on bus sata (use virtio or scsi, or a cdrom)",
            );
        }
        if kind == DiskKind::Lun {
            if let Some(source) = volume.and_then(|v| v.source()) {
                if !matches!(
                    source,
                    VolumeSource::HostDisk(_)
                        | VolumeSource::PersistentVolumeClaim(_)
                        | VolumeSource::DataVolume(_)
                ) {
                    e.add(
                        format!("{path}.lun"),
                        "a lun needs a block device: a hostDisk, persistentVolumeClaim or dataVolume",
                    );
                }
            }
        }
    }

    // Networks and interfaces.
    let mut networks: BTreeMap<&str, &Network> = BTreeMap::new();
    let mut pod_networks = 0;
    for (i, network) in vmi.spec.networks.iter().enumerate() {
        let path = format!("spec.networks[{i}]");
        if let Err(why) = check_dns1123_label(&network.name) {
            e.add(format!("{path}.name"), why);
        }
        if networks.insert(network.name.as_str(), network).is_some() {
            e.add(
                format!("{path}.name"),
                format!("duplicate network name {:?}", network.name),
            );
        }
        match (&network.pod, &network.multus) {
            (Some(pod), None) => {
                pod_networks += 1;
                e.unsupported(
                    &format!("{path}.pod"),
                    &[
                        ("vmNetworkCIDR", pod.vm_network_cidr.is_some(), "custom masquerade subnets"),
                        (
                            "vmIPv6NetworkCIDR",
                            pod.vm_ipv6_network_cidr.is_some(),
                            "custom masquerade subnets",
                        ),
                    ],
                );
            }
            (None, Some(_)) => e.add(
                format!("{path}.multus"),
                "unsupported (secondary networks need Multus in a cluster; only the pod network is available)",
            ),
            (Some(_), Some(_)) => e.add(path, "only one of pod, multus may be set"),
            (None, None) => e.add(path, "a network needs a source (supported: pod)"),
        }
    }
    if pod_networks > 1 {
        e.add("spec.networks", "at most one pod network");
    }
    let mut seen_ifaces = BTreeSet::new();
    for (i, iface) in devices.interfaces.iter().enumerate() {
        let path = format!("{base}.interfaces[{i}]");
        if !seen_ifaces.insert(iface.name.as_str()) {
            e.add(
                format!("{path}.name"),
                format!("duplicate interface name {:?}", iface.name),
            );
        }
        if !networks.contains_key(iface.name.as_str()) {
            e.add(
                format!("{path}.name"),
                format!("interface {:?} has no network of the same name", iface.name),
            );
        }
        let unsupported_bindings = [
            (
                "sriov",
                iface.sriov.is_some(),
                "SR-IOV needs a VF from the node",
            ),
            (
                "slirp",
                iface.slirp.is_some(),
                "the slirp binding was removed from KubeVirt",
            ),
            ("passt", iface.passt.is_some(), "the passt binding"),
            ("macvtap", iface.macvtap.is_some(), "the macvtap binding"),
            (
                "binding",
                iface.binding.is_some(),
                "network binding plugins",
            ),
        ];
        let bindings = [iface.masquerade.is_some(), iface.bridge.is_some()]
            .into_iter()
            .chain(unsupported_bindings.iter().map(|(_, set, _)| *set))
            .filter(|s| *s)
            .count();
        e.unsupported(&path, &unsupported_bindings);
        if bindings == 0 {
            e.add(
                path.clone(),
                "an interface needs a binding (supported: masquerade, bridge)",
            );
        } else if bindings > 1 {
            e.add(path.clone(), "only one binding may be set");
        }
        if iface.masquerade.is_some()
            && networks
                .get(iface.name.as_str())
                .is_some_and(|n| n.pod.is_none())
        {
            e.add(
                format!("{path}.masquerade"),
                "masquerade is only for the pod network",
            );
        }
        e.unsupported(
            &path,
            &[
                ("ports", iface.ports.is_some(), "port forwarding"),
                (
                    "pciAddress",
                    iface.pci_address.is_some(),
                    "fixed PCI addresses",
                ),
                (
                    "dhcpOptions",
                    iface.dhcp_options.is_some(),
                    "custom DHCP options",
                ),
                (
                    "tag",
                    iface.tag.is_some(),
                    "device tags need the guest agent",
                ),
                ("state", iface.state.is_some(), "interface hot-unplug"),
                ("acpiIndex", iface.acpi_index.is_some(), "ACPI indexes"),
            ],
        );
        if let Some(model) = &iface.model {
            e.one_of(format!("{path}.model"), model, NIC_MODELS);
        }
        if let Some(mac) = &iface.mac_address {
            if let Err(why) = check_mac(mac) {
                e.add(format!("{path}.macAddress"), why);
            }
        }
        check_boot_order(e, format!("{path}.bootOrder"), iface.boot_order);
    }
    for (name, _) in networks {
        if !devices.interfaces.iter().any(|i| i.name == name) {
            e.add(
                "spec.networks",
                format!("network {name:?} has no interface of the same name"),
            );
        }
    }

    let mut seen_inputs = BTreeSet::new();
    for (i, input) in devices.inputs.iter().enumerate() {
        let path = format!("{base}.inputs[{i}]");
        if !seen_inputs.insert(input.name.as_str()) {
            e.add(
                format!("{path}.name"),
                format!("duplicate input name {:?}", input.name),
            );
        }
        if let Err(why) = check_dns1123_label(&input.name) {
            e.add(format!("{path}.name"), why);
        }
        e.one_of(
            format!("{path}.type"),
            &input.input_type,
            &["tablet", "keyboard"],
        );
        if let Some(bus) = &input.bus {
            e.one_of(format!("{path}.bus"), bus, &["usb", "virtio"]);
        }
    }
    if let Some(w) = &devices.watchdog {
        let path = format!("{base}.watchdog");
        if let Err(why) = check_dns1123_label(&w.name) {
            e.add(format!("{path}.name"), why);
        }
        match &w.i6300esb {
            None => e.add(path, "a watchdog needs a model (supported: i6300esb)"),
            Some(m) => {
                if let Some(action) = &m.action {
                    e.one_of(
                        format!("{path}.i6300esb.action"),
                        action,
                        &["poweroff", "reset", "shutdown"],
                    );
                }
            }
        }
    }
}

fn validate_volumes(vmi: &VirtualMachineInstance, e: &mut Errors) {
    let mut seen = BTreeSet::new();
    for (i, volume) in vmi.spec.volumes.iter().enumerate() {
        let path = format!("spec.volumes[{i}]");
        if let Err(why) = check_volume_name(&volume.name) {
            e.add(format!("{path}.name"), why);
        }
        if !seen.insert(volume.name.as_str()) {
            e.add(
                format!("{path}.name"),
                format!("duplicate volume name {:?}", volume.name),
            );
        }
        let sources = volume.sources();
        match sources.as_slice() {
            [] => e.add(
                path.clone(),
                "a volume needs a source (supported: hostDisk, persistentVolumeClaim, dataVolume, containerDisk, emptyDisk, ephemeral, cloudInitNoCloud)",
            ),
            [_] => {}
            more => e.add(
                path.clone(),
                format!(
                    "only one source may be set, found {}",
                    more.iter().map(|(f, _)| *f).collect::<Vec<_>>().join(", ")
                ),
            ),
        }
        for (field, source) in &sources {
            let spath = format!("{path}.{field}");
            match source {
                None => e.add(spath, "unsupported (only block-device volume sources are)"),
                Some(VolumeSource::HostDisk(hd)) => {
                    if !hd.path.starts_with('/') {
                        e.add(
                            format!("{spath}.path"),
                            format!("{:?} must be an absolute path", hd.path),
                        );
                    }
                    match hd.disk_type.as_str() {
                        "Disk" => {}
                        "DiskOrCreate" => match &hd.capacity {
                            None => e.add(
                                format!("{spath}.capacity"),
                                "is required with type DiskOrCreate",
                            ),
                            Some(q) => {
                                if let Err(why) = q.to_bytes() {
                                    e.add(format!("{spath}.capacity"), why);
                                }
                            }
                        },
                        other => e.add(
                            format!("{spath}.type"),
                            format!("{other:?} is not a hostDisk type (Disk or DiskOrCreate)"),
                        ),
                    }
                }
                Some(VolumeSource::PersistentVolumeClaim(pvc)) => check_pvc(pvc, &spath, e),
                Some(VolumeSource::DataVolume(dv)) => {
                    if let Err(why) = check_dns1123_subdomain(&dv.name) {
                        e.add(format!("{spath}.name"), why);
                    }
                }
                Some(VolumeSource::ContainerDisk(cd)) => {
                    if cd.image.is_empty() {
                        e.add(format!("{spath}.image"), "is required");
                    }
                    if let Some(policy) = &cd.image_pull_policy {
                        e.one_of(
                            format!("{spath}.imagePullPolicy"),
                            policy,
                            &["Always", "IfNotPresent", "Never"],
                        );
                    }
                    e.unsupported(
                        &spath,
                        &[
                            (
                                "path",
                                cd.path.is_some(),
                                "the image file is found by KubeVirt's convention",
                            ),
                            (
                                "hotpluggable",
                                cd.hotpluggable.is_some(),
                                "hot-plugged container disks",
                            ),
                        ],
                    );
                }
                Some(VolumeSource::EmptyDisk(ed)) => match ed.capacity.to_bytes() {
                    Ok(0) => e.add(format!("{spath}.capacity"), "must be more than 0"),
                    Ok(_) => {}
                    Err(why) => e.add(format!("{spath}.capacity"), why),
                },
                Some(VolumeSource::Ephemeral(eph)) => check_pvc(
                    &eph.persistent_volume_claim,
                    &format!("{spath}.persistentVolumeClaim"),
                    e,
                ),
                Some(VolumeSource::CloudInitNoCloud(ci)) => {
                    e.unsupported(
                        &spath,
                        &[
                            (
                                "secretRef",
                                ci.secret_ref.is_some(),
                                "Secrets live in a cluster",
                            ),
                            (
                                "networkDataSecretRef",
                                ci.network_data_secret_ref.is_some(),
                                "Secrets live in a cluster",
                            ),
                        ],
                    );
                    if ci.user_data.is_some() && ci.user_data_base64.is_some() {
                        e.add(
                            spath.clone(),
                            "userData and userDataBase64 cannot both be set",
                        );
                    }
                    if ci.user_data.is_none()
                        && ci.user_data_base64.is_none()
                        && ci.secret_ref.is_none()
                    {
                        e.add(spath.clone(), "userData or userDataBase64 is required");
                    }
                    if ci.network_data.is_some() && ci.network_data_base64.is_some() {
                        e.add(
                            spath.clone(),
                            "networkData and networkDataBase64 cannot both be set",
                        );
                    }
                    for (field, value) in [
                        ("userDataBase64", &ci.user_data_base64),
                        ("networkDataBase64", &ci.network_data_base64),
                    ] {
                        if let Some(text) = value {
                            if let Err(why) = decode_base64(text) {
                                e.add(format!("{spath}.{field}"), why);
                            }
                        }
                    }
                }
            }
        }
        if !vmi
            .spec
            .domain
            .devices
            .disks
            .iter()
            .any(|d| d.name == volume.name)
        {
            e.add(
                format!("{path}.name"),
                format!("volume {:?} is not used by any disk", volume.name),
            );
        }
    }
}

fn check_pvc(pvc: &PvcSource, path: &str, e: &mut Errors) {
    if let Err(why) = check_dns1123_subdomain(&pvc.claim_name) {
        e.add(format!("{path}.claimName"), why);
    }
}

/// Guest memory in bytes: `memory.guest`, else `resources.requests.memory`, else
/// `resources.limits.memory` (KubeVirt's order).
pub fn guest_memory(vmi: &VirtualMachineInstance) -> Result<Option<u64>, String> {
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
pub fn resource_cpus(vmi: &VirtualMachineInstance) -> Option<u32> {
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

/// `8-4-4-4-12` hex digits.
pub fn looks_like_uuid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups
            .iter()
            .all(|g| g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Kubernetes names: at most 63 of `[a-z0-9-]`, starting and ending alphanumeric.
pub fn check_dns1123_label(name: &str) -> Result<(), String> {
    let ok_chars = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    let ok_ends = name
        .bytes()
        .next()
        .zip(name.bytes().last())
        .is_some_and(|(a, z)| a.is_ascii_alphanumeric() && z.is_ascii_alphanumeric());
    if name.is_empty() || name.len() > 63 || !ok_chars || !ok_ends {
        return Err(format!(
            "{name:?} is not a DNS-1123 label (1-63 of a-z, 0-9 and '-', alphanumeric at both ends)"
        ));
    }
    Ok(())
}

/// Object names such as claims: dot-separated DNS-1123 labels, at most 253 characters.
pub fn check_dns1123_subdomain(name: &str) -> Result<(), String> {
    if name.is_empty()
        || name.len() > 253
        || name.split('.').any(|l| check_dns1123_label(l).is_err())
    {
        return Err(format!(
            "{name:?} is not a DNS-1123 subdomain (dot-separated labels of a-z, 0-9 and '-')"
        ));
    }
    Ok(())
}

/// Volume names become libvirt aliases (`ua-<name>`) and file names in the hotplug directory,
/// so they must be DNS-1123 labels: never `/`, `..` or anything path-like.
pub fn check_volume_name(name: &str) -> Result<(), String> {
    if name.contains('/') || name.contains("..") {
        return Err(format!(
            "{name:?} looks like a path; volume names may not contain '/' or '..'"
        ));
    }
    check_dns1123_label(name)
}

/// Serials keep their case; only `[A-Za-z0-9_.+-]` reaches the guest unchanged.
pub fn check_serial(serial: &str, bus: &str, max: usize) -> Result<(), String> {
    if serial.is_empty() {
        return Err("is empty".into());
    }
    if let Some(bad) = serial
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '+' | '-')))
    {
        return Err(format!(
            "{serial:?} contains {bad:?}; serials may only use A-Z a-z 0-9 _ . + -"
        ));
    }
    if serial.len() > max {
        return Err(format!(
            "{} characters, at most {max} on bus {bus}",
            serial.len()
        ));
    }
    Ok(())
}

/// A unicast MAC address, `xx:xx:xx:xx:xx:xx` (or with `-`).
pub fn check_mac(mac: &str) -> Result<(), String> {
    let octets: Vec<&str> = mac.split([':', '-']).collect();
    let hex = octets.len() == 6
        && octets
            .iter()
            .all(|o| o.len() == 2 && o.bytes().all(|b| b.is_ascii_hexdigit()));
    if !hex {
        return Err(format!("{mac:?} is not a MAC address (xx:xx:xx:xx:xx:xx)"));
    }
    let first = u8::from_str_radix(octets[0], 16).expect("checked hex");
    if first & 1 == 1 {
        return Err(format!("{mac:?} is a multicast address"));
    }
    Ok(())
}

/// Standard base64 (RFC 4648, padding optional, whitespace ignored), as Kubernetes writes it.
pub fn decode_base64(text: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let mut acc = 0u32;
    let mut bits = 0;
    let mut padding = false;
    for c in text.bytes().filter(|c| !c.is_ascii_whitespace()) {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => {
                padding = true;
                continue;
            }
            other => return Err(format!("not base64: contains {:?}", char::from(other))),
        };
        if padding {
            return Err("not base64: data after '='".into());
        }
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: testvm
spec:
  domain:
    memory:
      guest: 128Mi
    devices:
      disks:
      - name: data
        disk:
          bus: scsi
        serial: DataDisk-1
  volumes:
  - name: data
    hostDisk:
      path: /var/data/data.img
      type: Disk
"#;

    fn errors_of(text: &str) -> Vec<String> {
        match parse(text) {
            Ok(_) => vec![],
            Err(e) => e.0.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn parses_minimal_yaml() {
        let vmi = parse(MINIMAL).expect("valid");
        assert_eq!(vmi.metadata.name, "testvm");
        assert_eq!(vmi.spec.domain.devices.disks[0].bus(), "scsi");
        assert_eq!(
            vmi.spec.domain.devices.disks[0].serial.as_deref(),
            Some("DataDisk-1")
        );
        assert_eq!(guest_memory(&vmi), Ok(Some(128 * 1024 * 1024)));
    }

    #[test]
    fn parses_json_the_same_as_yaml() {
        let yaml = parse(MINIMAL).unwrap();
        let value: serde_json::Value = serde_yaml_ng::from_str(MINIMAL).unwrap();
        let json = parse(&serde_json::to_string(&value).unwrap()).unwrap();
        assert_eq!(yaml, json);
    }

    #[test]
    fn unknown_field_is_named_with_its_path() {
        let text = MINIMAL.replace(
            "        serial: DataDisk-1",
            "        serial: DataDisk-1\n        bogus: 1",
        );
        let errors = errors_of(&text);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with("spec.domain.devices.disks[0].bogus: unknown field `bogus`"),
            "{errors:?}"
        );
    }

    #[test]
    fn unknown_field_in_json_is_named_with_its_path() {
        let text = r#"{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineInstance",
            "metadata":{"name":"a"},"spec":{"domain":{"memory":{"guest":"1Gi"},"cpu":{"cores":1,"speed":3}}}}"#;
        let errors = errors_of(text);
        assert!(
            errors[0].starts_with("spec.domain.cpu.speed: unknown field `speed`"),
            "{errors:?}"
        );
    }

    #[test]
    fn reports_every_problem_at_once() {
        let text = r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: Bad_Name
spec:
  domain:
    memory:
      guest: 12Qi
    devices:
      disks:
      - name: a
        disk: {bus: ide}
      - name: b
        disk: {bus: scsi}
        serial: "0123456789012345678901234567890123456789"
      - name: b
        disk: {bus: scsi}
        serial: "has space"
  volumes:
  - name: a
    hostDisk: {path: relative.img, type: Disk}
  - name: b
    hostDisk: {path: /b.img, type: Sometimes}
  - name: ../etc
    hostDisk: {path: /c.img, type: DiskOrCreate}
"#;
        let errors = errors_of(text);
        let expect = [
            "metadata.name: \"Bad_Name\" is not a DNS-1123 label",
            "spec.domain.memory.guest: unknown unit \"Qi\"",
            "spec.volumes[0].hostDisk.path: \"relative.img\" must be an absolute path",
            "spec.volumes[1].hostDisk.type: \"Sometimes\" is not a hostDisk type",
            "spec.volumes[2].name: \"../etc\" looks like a path",
            "spec.volumes[2].hostDisk.capacity: is required with type DiskOrCreate",
            "spec.domain.devices.disks[0].disk.bus: bus \"ide\" is not valid for a disk",
            "spec.domain.devices.disks[1].serial: 40 characters, at most 36 on bus scsi",
            "spec.domain.devices.disks[2].name: duplicate disk name \"b\"",
            "spec.domain.devices.disks[2].serial: \"has space\" contains ' '",
        ];
        for e in expect {
            assert!(
                errors.iter().any(|got| got.starts_with(e)),
                "missing {e:?} in {errors:#?}"
            );
        }
        assert_eq!(errors.len(), expect.len(), "{errors:#?}");
    }

    #[test]
    fn disk_without_volume_is_an_error() {
        let text = MINIMAL.replace(
            "  - name: data\n    hostDisk",
            "  - name: other\n    hostDisk",
        );
        let errors = errors_of(&text);
        assert!(errors.iter().any(|e| e
            == "spec.domain.devices.disks[0].name: disk \"data\" has no volume of the same name"));
    }

    #[test]
    fn serial_of_exactly_36_is_accepted_on_scsi() {
        let serial = "A".repeat(36);
        let text = MINIMAL.replace("DataDisk-1", &serial);
        assert_eq!(errors_of(&text), Vec::<String>::new());
        let text = MINIMAL.replace("DataDisk-1", &"A".repeat(37));
        assert_eq!(
            errors_of(&text),
            vec!["spec.domain.devices.disks[0].serial: 37 characters, at most 36 on bus scsi"]
        );
    }

    #[test]
    fn quantities() {
        let q = |s: &str| Quantity(s.into()).to_bytes();
        assert_eq!(q("128Mi"), Ok(128 << 20));
        assert_eq!(q("1G"), Ok(1_000_000_000));
        assert_eq!(q("1.5Gi"), Ok(3 << 29));
        assert_eq!(q("1024"), Ok(1024));
        assert_eq!(q("2k"), Ok(2000));
        assert!(q("Gi").is_err());
        assert!(q("1.2.3Mi").is_err());
        assert!(q("-1Mi").is_err());
    }

    #[test]
    fn memory_falls_back_to_resources() {
        let text = MINIMAL.replace(
            "    memory:\n      guest: 128Mi\n",
            "    resources:\n      requests:\n        memory: 64M\n        cpu: 1\n",
        );
        let vmi = parse(&text).unwrap();
        assert_eq!(guest_memory(&vmi), Ok(Some(64_000_000)));
    }

    #[test]
    fn kernel_boot_from_an_image_is_rejected_by_name() {
        let text = MINIMAL.replace(
            "    memory:\n",
            "    firmware:\n      kernelBoot:\n        container:\n          image: quay.io/k:1\n          kernelPath: /boot/vmlinuz\n    memory:\n",
        );
        let errors = errors_of(&text);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].starts_with("spec.domain.firmware.kernelBoot.container.image: \"quay.io/k:1\": unsupported (kernel images from a registry"));
    }

    #[test]
    fn malformed_yaml_is_an_error_not_a_panic() {
        for text in ["", "{", "spec: [", "apiVersion: 3", ":\n  - -"] {
            assert!(parse(text).is_err(), "{text:?}");
        }
    }

    #[test]
    fn a_virtual_machine_gives_its_template_and_run_strategy() {
        let text = r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: myvm, namespace: ns}
spec:
  runStrategy: RerunOnFailure
  template:
    metadata:
      labels: {app: x}
    spec:
      domain:
        memory: {guest: 64Mi}
        devices:
          disks:
          - {name: d, disk: {bus: ide}}
      volumes:
      - {name: d, emptyDisk: {capacity: 1Gi}}
"#;
        let errors = errors_of(text);
        assert_eq!(
            errors,
            vec![
                "spec.template.spec.domain.devices.disks[0].disk.bus: bus \"ide\" is not valid for a disk (valid: virtio, scsi, sata)"
            ]
        );
        let vmi = parse(&text.replace("bus: ide", "bus: sata")).unwrap();
        assert_eq!(vmi.metadata.name, "myvm");
        assert_eq!(
            vmi.metadata.labels.get("app").map(String::as_str),
            Some("x")
        );
        assert_eq!(vmi.run_strategy, Some(RunStrategy::RerunOnFailure));
        let both = text.replace(
            "  runStrategy: RerunOnFailure\n",
            "  runStrategy: Always\n  running: true\n",
        );
        assert_eq!(
            errors_of(&both),
            vec!["spec.running: cannot be combined with spec.runStrategy"]
        );
    }

    #[test]
    fn a_volume_without_a_disk_gets_a_default_disk() {
        let text = MINIMAL.replace(
            "  volumes:\n",
            "  volumes:\n  - name: extra\n    emptyDisk: {capacity: 1Mi}\n",
        );
        let vmi = parse(&text).unwrap();
        let extra = &vmi.spec.domain.devices.disks[1];
        assert_eq!((extra.name.as_str(), extra.bus()), ("extra", "virtio"));
    }

    #[test]
    fn unsupported_fields_are_named_and_typos_are_unknown() {
        let text = MINIMAL.replace(
            "    devices:\n",
            "    devices:\n      gpus: [{name: g, deviceName: x}]\n      tpm: {}\n",
        );
        assert_eq!(
            errors_of(&text),
            vec![
                "spec.domain.devices.gpus: unsupported (device passthrough)",
                "spec.domain.devices.tpm: unsupported (a vTPM needs swtpm)"
            ]
        );
        let typo = MINIMAL.replace("    devices:\n", "    devices:\n      gpu: []\n");
        assert!(errors_of(&typo)[0].starts_with("spec.domain.devices.gpu: unknown field `gpu`"));
        let ignored = MINIMAL.replace(
            "  domain:\n",
            "  nodeSelector: {a: b}\n  tolerations: []\n  domain:\n",
        );
        assert_eq!(errors_of(&ignored), Vec::<String>::new());
    }

    #[test]
    fn device_rules() {
        let text = r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: vm}
spec:
  domain:
    memory: {guest: 64Mi}
    devices:
      disks:
      - {name: a, cdrom: {bus: virtio}, bootOrder: 1}
      - {name: b, lun: {}, serial: X}
      - {name: c, bootOrder: 1, io: native, cache: writeback}
      - {name: d, disk: {bus: sata}, serial: "123456789012345678901"}
      interfaces:
      - {name: default, masquerade: {}, macAddress: "01:00:00:00:00:01", model: virtio-net}
  networks:
  - {name: default, pod: {}}
  volumes:
  - {name: a, cloudInitNoCloud: {userDataBase64: "!!"}}
  - {name: b, emptyDisk: {capacity: 1Gi}}
  - {name: c, hostDisk: {path: /c, type: Disk}}
  - {name: d, hostDisk: {path: /d, type: Disk}}
"#;
        let errors = errors_of(text);
        let expect = [
            "spec.domain.devices.disks[0].cdrom.bus: bus \"virtio\" is not valid for a cdrom",
            "spec.domain.devices.disks[1].serial: a lun shows the device's own serial",
            "spec.domain.devices.disks[1].lun: a lun needs a block device",
            "spec.domain.devices.disks[2].io: io native needs cache none",
            "spec.domain.devices.disks[2].bootOrder: boot order 1 is already used by spec.domain.devices.disks[0].bootOrder",
            "spec.domain.devices.disks[3].serial: 21 characters, at most 20 on bus sata",
            "spec.domain.devices.interfaces[0].model: \"virtio-net\" is not one of",
            "spec.domain.devices.interfaces[0].macAddress: \"01:00:00:00:00:01\" is a multicast address",
            "spec.volumes[0].cloudInitNoCloud.userDataBase64: not base64",
        ];
        for e in expect {
            assert!(
                errors.iter().any(|got| got.starts_with(e)),
                "missing {e:?} in {errors:#?}"
            );
        }
        assert_eq!(errors.len(), expect.len(), "{errors:#?}");
    }

    #[test]
    fn base64_decodes() {
        assert_eq!(decode_base64("aGVsbG8gd29ybGQ=").unwrap(), b"hello world");
        assert_eq!(decode_base64("aGk\n").unwrap(), b"hi");
        assert!(decode_base64("a=b").is_err());
    }
}
