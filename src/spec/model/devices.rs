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
    /// Ports of the guest published on the host (masquerade only).
    #[serde(default)]
    pub ports: Vec<Port>,
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

/// A guest port a masquerade interface publishes: `TCP` (default) or `UDP`, 1–65535.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Port {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub protocol: Option<String>,
    pub port: i64,
}

impl Port {
    /// The protocol in libvirt's and QEMU's spelling (`tcp`, `udp`).
    pub fn protocol_lower(&self) -> String {
        self.protocol
            .as_deref()
            .unwrap_or("TCP")
            .to_ascii_lowercase()
    }
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
