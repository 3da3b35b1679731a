//! `spec.domain.devices` and `spec.networks`: disks, interfaces, networks, inputs, watchdog.

use serde::Deserialize;

use super::Unsupported;

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Devices {
    #[serde(default)]
    pub disks: Vec<Disk>,
    #[serde(default)]
    pub interfaces: Vec<Interface>,
    #[serde(default)]
    pub inputs: Vec<Input>,
    pub watchdog: Option<Watchdog>,
    pub rng: Option<Rng>,
    /// KubeVirt's default is `true`.
    pub autoattach_serial_console: Option<bool>,
    /// KubeVirt's default is `true`: VNC (on a unix socket) and a VGA card.
    pub autoattach_graphics_device: Option<bool>,
    /// KubeVirt's default is `true`.
    pub autoattach_mem_balloon: Option<bool>,
    /// KubeVirt's default is `true`: a `default` masquerade interface when none is given.
    pub autoattach_pod_interface: Option<bool>,
    /// No hotplug scsi controller unless a scsi disk needs it.
    pub disable_hotplug: Option<bool>,
    pub gpus: Option<Unsupported>,
    pub host_devices: Option<Unsupported>,
    pub filesystems: Option<Unsupported>,
    pub tpm: Option<Tpm>,
    pub sound: Option<Unsupported>,
    pub client_passthrough: Option<Unsupported>,
    pub use_virtio_transitional: Option<Unsupported>,
    pub block_multi_queue: Option<Unsupported>,
    pub network_interface_multiqueue: Option<Unsupported>,
    #[serde(default, rename = "autoattachVSOCK")]
    pub autoattach_vsock: Option<Unsupported>,
    pub autoattach_input_device: Option<Unsupported>,
    /// KubeVirt's default (unless its cluster turns it off) is `true`: QEMU copies the serial
    /// console to a file.
    pub log_serial_console: Option<bool>,
    pub downward_metrics: Option<Unsupported>,
    pub panic_devices: Option<Unsupported>,
    pub video: Option<Unsupported>,
}

impl Devices {
    pub(crate) fn serial_console(&self) -> bool {
        self.autoattach_serial_console.unwrap_or(true)
    }
    pub(crate) fn graphics(&self) -> bool {
        self.autoattach_graphics_device.unwrap_or(true)
    }
    pub(crate) fn mem_balloon(&self) -> bool {
        self.autoattach_mem_balloon.unwrap_or(true)
    }
    pub(crate) fn pod_interface(&self) -> bool {
        self.autoattach_pod_interface.unwrap_or(true)
    }
    pub(crate) fn hotplug(&self) -> bool {
        !self.disable_hotplug.unwrap_or(false)
    }
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Disk {
    pub name: String,
    pub disk: Option<DiskTarget>,
    pub cdrom: Option<CdromTarget>,
    pub lun: Option<LunTarget>,
    pub serial: Option<String>,
    /// `none`, `writethrough` or `writeback`.
    pub cache: Option<String>,
    /// `native` or `threads`.
    pub io: Option<String>,
    pub boot_order: Option<u32>,
    pub shareable: Option<bool>,
    /// `stop`, `ignore`, `report` or `enospace`.
    pub error_policy: Option<String>,
    #[serde(default, rename = "dedicatedIOThread")]
    pub dedicated_io_thread: Option<bool>,
    pub block_size: Option<Unsupported>,
    pub tag: Option<Unsupported>,
}

/// What kind of device a disk is, from which of `disk`, `cdrom`, `lun` is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DiskKind {
    Disk,
    Cdrom,
    Lun,
}

impl DiskKind {
    pub(crate) fn field(self) -> &'static str {
        match self {
            DiskKind::Disk => "disk",
            DiskKind::Cdrom => "cdrom",
            DiskKind::Lun => "lun",
        }
    }
}

impl Disk {
    /// The device kind: `disk` when none of `disk`, `cdrom`, `lun` is given (KubeVirt's default).
    pub(crate) fn kind(&self) -> DiskKind {
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
    pub(crate) fn bus(&self) -> &str {
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
    pub(crate) fn readonly(&self) -> bool {
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
    pub bus: Option<String>,
    pub readonly: Option<bool>,
    pub pci_address: Option<Unsupported>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CdromTarget {
    pub bus: Option<String>,
    pub readonly: Option<bool>,
    pub tray: Option<Unsupported>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LunTarget {
    pub bus: Option<String>,
    pub readonly: Option<bool>,
    pub reservation: Option<Unsupported>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Interface {
    pub name: String,
    pub masquerade: Option<IgnoredEmpty>,
    pub bridge: Option<IgnoredEmpty>,
    /// `virtio` (default), `e1000`, `e1000e`, `rtl8139`, `pcnet` or `ne2k_pci`.
    pub model: Option<String>,
    pub mac_address: Option<String>,
    pub boot_order: Option<u32>,
    pub sriov: Option<Unsupported>,
    pub slirp: Option<Unsupported>,
    pub passt: Option<Unsupported>,
    pub macvtap: Option<Unsupported>,
    pub binding: Option<Unsupported>,
    /// Ports of the guest published on the host (masquerade only).
    #[serde(default)]
    pub ports: Vec<Port>,
    pub pci_address: Option<Unsupported>,
    pub dhcp_options: Option<Unsupported>,
    pub tag: Option<Unsupported>,
    /// `up` (default), `down` (the link is down), or `absent` (unplugged: a Sync detaches it).
    pub state: Option<String>,
    pub acpi_index: Option<Unsupported>,
}

/// A guest port a masquerade interface publishes: `TCP` (default) or `UDP`, 1–65535.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Port {
    pub name: Option<String>,
    pub protocol: Option<String>,
    pub port: i64,
}

impl Port {
    /// The protocol in libvirt's and QEMU's spelling (`tcp`, `udp`).
    pub(crate) fn protocol_lower(&self) -> String {
        self.protocol
            .as_deref()
            .unwrap_or("TCP")
            .to_ascii_lowercase()
    }
}

/// A vTPM 2.0 emulated by swtpm, which libvirt starts beside QEMU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Tpm {
    /// `false` removes the TPM (KubeVirt's explicit opt-out).
    pub enabled: Option<bool>,
    /// Keep the TPM's state when the VM stops (libvirt's `persistent_state`).
    pub persistent: Option<bool>,
}

/// An empty object (`masquerade: {}`): any field in it is an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IgnoredEmpty {}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Network {
    pub name: String,
    pub pod: Option<PodNetwork>,
    pub multus: Option<MultusNetwork>,
}

/// A secondary network. In a pod its interface (bridge binding) is the tap device the node's
/// network plugin made for it, as KubeVirt's; a local run has no Multus, so there it is a
/// user-mode network of its own.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MultusNetwork {
    pub network_name: String,
    /// Multus as the pod's default network.
    pub default: Option<bool>,
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
    pub bus: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Watchdog {
    pub name: String,
    pub i6300esb: Option<I6300esb>,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct I6300esb {
    /// `poweroff`, `reset` (default) or `shutdown`.
    pub action: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rng {}
