//! `spec.domain` apart from its devices: CPU, memory, resources, machine, firmware, features, clock.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{Devices, Unsupported};
use crate::spec::Quantity;

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
