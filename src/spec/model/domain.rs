//! `spec.domain` apart from its devices: CPU, memory, resources, machine, firmware, features, clock.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{Devices, Unsupported};
use crate::spec::Quantity;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DomainSpec {
    pub cpu: Option<Cpu>,
    pub memory: Option<Memory>,
    pub resources: Option<Resources>,
    pub machine: Option<Machine>,
    pub firmware: Option<Firmware>,
    pub features: Option<Features>,
    pub clock: Option<Clock>,
    /// `shared` (one iothread for every virtio disk) or `auto` (one per disk, up to 2 × vCPUs).
    pub io_threads_policy: Option<String>,
    #[serde(default)]
    pub devices: Devices,
    pub io_threads: Option<Unsupported>,
    pub chassis: Option<Unsupported>,
    pub launch_security: Option<Unsupported>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Cpu {
    pub cores: Option<u32>,
    pub sockets: Option<u32>,
    pub threads: Option<u32>,
    /// `host-model`, `host-passthrough`, or a named libvirt CPU model.
    pub model: Option<String>,
    #[serde(default)]
    pub features: Vec<CpuFeature>,
    /// Room for CPU hotplug: the domain is defined with `maxSockets × cores × threads` vCPUs,
    /// `sockets × cores × threads` of them enabled; a Sync changes `sockets` within it.
    pub max_sockets: Option<u32>,
    /// Pin each vCPU to a CPU of the launcher's own CPU set (KubeVirt: of the pod's cpuset).
    pub dedicated_cpu_placement: Option<bool>,
    /// With `dedicatedCpuPlacement`: pin QEMU's emulator threads to one more CPU.
    pub isolate_emulator_thread: Option<bool>,
    pub numa: Option<Unsupported>,
    pub realtime: Option<Unsupported>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CpuFeature {
    pub name: String,
    /// libvirt's policies; KubeVirt's default is `require`.
    pub policy: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Memory {
    pub guest: Option<Quantity>,
    pub hugepages: Option<Hugepages>,
    /// Room for memory hotplug: a virtio-mem device holds `maxGuest` minus the memory the guest
    /// booted with; a Sync changes `guest` within it.
    pub max_guest: Option<Quantity>,
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
    pub uuid: Option<String>,
    /// SMBIOS system serial number.
    pub serial: Option<String>,
    pub bootloader: Option<Bootloader>,
    pub kernel_boot: Option<KernelBoot>,
    pub acpi: Option<Unsupported>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Bootloader {
    pub bios: Option<Bios>,
    pub efi: Option<Efi>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Bios {
    /// SeaBIOS prints to the serial console too.
    pub use_serial: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Efi {
    /// KubeVirt's default is `true`.
    pub secure_boot: Option<bool>,
    pub persistent: Option<Unsupported>,
}

impl Efi {
    pub(crate) fn secure(&self) -> bool {
        self.secure_boot.unwrap_or(true)
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KernelBoot {
    pub container: Option<KernelBootContainer>,
    pub kernel_args: Option<String>,
}

/// Without an `image`, `kernelPath` and `initrdPath` name files on the host (a local run); with an
/// image, the pod would provide them, which a launcher outside Kubernetes cannot do.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KernelBootContainer {
    pub image: Option<String>,
    pub image_pull_policy: Option<String>,
    pub image_pull_secret: Option<String>,
    pub kernel_path: Option<String>,
    pub initrd_path: Option<String>,
}

/// `{}` or `{enabled: false}`: present means on unless `enabled` says otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FeatureState {
    pub enabled: Option<bool>,
}

impl FeatureState {
    pub(crate) fn on(&self) -> bool {
        self.enabled.unwrap_or(true)
    }
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Features {
    pub acpi: Option<FeatureState>,
    pub apic: Option<Apic>,
    pub smm: Option<FeatureState>,
    pub hyperv: Option<Hyperv>,
    pub kvm: Option<KvmFeature>,
    pub pvspinlock: Option<FeatureState>,
    pub hyperv_passthrough: Option<Unsupported>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Apic {
    pub enabled: Option<bool>,
    pub end_of_interrupt: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KvmFeature {
    pub hidden: Option<bool>,
}

/// The Hyper-V enlightenments Windows guests commonly use.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Hyperv {
    pub relaxed: Option<FeatureState>,
    pub vapic: Option<FeatureState>,
    pub spinlocks: Option<Spinlocks>,
    pub vpindex: Option<FeatureState>,
    pub runtime: Option<FeatureState>,
    pub synic: Option<FeatureState>,
    pub synictimer: Option<SynicTimer>,
    pub reset: Option<FeatureState>,
    pub vendorid: Option<VendorId>,
    pub frequencies: Option<FeatureState>,
    pub reenlightenment: Option<FeatureState>,
    pub tlbflush: Option<FeatureState>,
    pub ipi: Option<FeatureState>,
    pub evmcs: Option<FeatureState>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Spinlocks {
    pub enabled: Option<bool>,
    /// Retries before a spinlock is reported to the hypervisor; KubeVirt's default is 4096.
    pub spinlocks: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SynicTimer {
    pub enabled: Option<bool>,
    pub direct: Option<FeatureState>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VendorId {
    pub enabled: Option<bool>,
    pub vendorid: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Clock {
    pub utc: Option<ClockUtc>,
    /// An IANA zone name, e.g. `Europe/Paris`.
    pub timezone: Option<String>,
    pub timer: Option<Timers>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClockUtc {
    pub offset_seconds: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Timers {
    pub hpet: Option<Timer>,
    pub kvm: Option<Timer>,
    pub pit: Option<Timer>,
    pub rtc: Option<Timer>,
    pub hyperv: Option<Timer>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Timer {
    pub present: Option<bool>,
    /// `delay`, `catchup`, `merge` or `discard`.
    pub tick_policy: Option<String>,
    /// rtc only: `guest` or `wall`.
    pub track: Option<String>,
}
