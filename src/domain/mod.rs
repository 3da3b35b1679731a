//! The libvirt domain XML model: what vmlauncher writes (serialised with quick-xml), and the few
//! facts it reads back from libvirt's XML (parsed losslessly with roxmltree): live disks, and the
//! canonical machine names of the capabilities.
//!
//! The live reader never rebuilds an element from the model: to detach a disk it hands back the
//! exact bytes libvirt gave, so nothing libvirt added (addresses, backing chains) is lost.

mod live;
pub mod migratable;
mod resources;
mod write;

use std::path::{Path, PathBuf};

pub use live::canonical_machines;
pub use live::live_disks;
pub(crate) use live::{
    agent_connected_in, definition_machine, live_interfaces, live_interfaces_in, LiveDisk,
    LiveInterface, LiveXmlError,
};
pub use resources::live_resources;
pub use resources::LiveVirtioMem;
pub(crate) use resources::{
    free_root_ports, live_resources_in, with_spare_root_ports, LiveResources,
};
pub use write::target_name;

/// The prefix libvirt requires for user-chosen device aliases.
pub(crate) const USER_ALIAS_PREFIX: &str = "ua-";
/// The virtio-serial port name of the QEMU guest agent (`org.qemu.guest_agent.0`): qemu-ga opens
/// `/dev/virtio-ports/` of that name, and libvirt talks to it through the channel of that name.
pub(crate) const AGENT_CHANNEL: &str = "org.qemu.guest_agent.0";
/// The namespace of vmlauncher's `<metadata>` element.
pub(crate) const METADATA_NAMESPACE: &str =
    "https://github.com/vmlauncher/vmlauncher/xmlns/instance/v1";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum VirtType {
    /// Hardware virtualisation.
    Kvm,
    /// Software emulation (TCG): slow, but runs anywhere.
    #[default]
    Qemu,
}

impl VirtType {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            VirtType::Kvm => "kvm",
            VirtType::Qemu => "qemu",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DomainDef {
    pub name: String,
    pub uuid: Option<String>,
    pub virt_type: VirtType,
    /// The memory the guest boots with (without what virtio-mem adds).
    pub memory_kib: u64,
    /// Room for memory hotplug: a virtio-mem device on NUMA node 0.
    pub virtio_mem: Option<VirtioMemDef>,
    /// Hugepage size backing the guest memory.
    pub hugepage_kib: Option<u64>,
    /// The vCPU topology; with room for CPU hotplug, the largest one (`maxSockets`).
    pub topology: CpuTopology,
    /// With room for CPU hotplug: how many of the topology's vCPUs are enabled.
    pub vcpus_enabled: Option<u32>,
    pub cpu: CpuDef,
    pub iothreads: u32,
    /// Host CPUs the vCPUs and the emulator are pinned to (`<cputune>`).
    pub cputune: Option<CpuTune>,
    pub tpm: Option<TpmDef>,
    pub machine: String,
    pub firmware: FirmwareDef,
    /// SMBIOS system serial number.
    pub sysinfo_serial: Option<String>,
    pub kernel_boot: Option<KernelBootDef>,
    pub features: FeaturesDef,
    pub clock: ClockDef,
    pub disks: Vec<DiskDef>,
    pub interfaces: Vec<InterfaceDef>,
    pub inputs: Vec<InputDef>,
    pub watchdog: Option<WatchdogDef>,
    pub rng: bool,
    /// The virtio-scsi controller that hot-plugged disks go to.
    pub scsi_controller: bool,
    /// Empty PCIe root ports for devices plugged later (a q35 machine's PCIe slots are not
    /// hot-pluggable otherwise; libvirt leaves one spare). Not in [`DomainDef::to_xml`]: the
    /// define adds them, with as many more as the boot devices take (`root_port_devices`),
    /// which libvirt places on the first ones (`Hypervisor::define_and_start`).
    pub spare_pcie_ports: u32,
    /// The guest's serial console; `None` without one.
    pub serial: Option<SerialDef>,
    /// The unix socket of the VNC display; `None` without graphics.
    pub vnc_socket: Option<PathBuf>,
    pub memballoon: bool,
    pub instance: InstanceMetadata,
}

/// The serial console as KubeVirt's converter makes it: a unix socket QEMU listens on (bind
/// mode), which `virtctl console` reaches through virt-handler and `vmlauncher console`
/// directly, and the file QEMU copies the guest's output to, whoever is attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SerialDef {
    pub socket: PathBuf,
    /// `None` when the spec says `logSerialConsole: false`.
    pub log: Option<PathBuf>,
}

/// An overlay's backing, which lies where a tenant or an image author writes. libvirt is told
/// the chain (it reads none from the images) and not to relabel the backing: its chown would
/// follow a link put there after the launcher's check. The launcher gives the file to QEMU's
/// user through the descriptor it checked (`host::open_for_qemu`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackingDef {
    pub source: DiskSource,
    /// `raw` or `qcow2`. A container disk's is read from its header before the start
    /// (`host::open_for_qemu`): `None` until then, and libvirt reads the chain itself.
    pub format: Option<&'static str>,
    /// Passed to QEMU as a descriptor the launcher opened, under this libvirt fd group (as
    /// `DiskDef::fd_group`), rather than opened by QEMU through its path.
    pub fd_group: Option<String>,
    /// Where QEMU opens it when not by descriptor (a migration target): the launcher's pin of
    /// the inode it checked (`DiskDef::pin`), `<pins>/<volume>.backing.img`.
    pub pin: Option<PathBuf>,
}

impl BackingDef {
    /// The path QEMU is given: as [`DiskDef::qemu_path`].
    pub(crate) fn qemu_path(&self) -> &Path {
        qemu_path(&self.fd_group, &self.pin, &self.source)
    }
}

/// Where QEMU opens an image: its source when passed by descriptor (libvirt names it beside the
/// `fdgroup`), else its pin, else its source.
fn qemu_path<'a>(
    fd_group: &Option<String>,
    pin: &'a Option<PathBuf>,
    source: &'a DiskSource,
) -> &'a Path {
    match (fd_group, pin) {
        (None, Some(pin)) => pin,
        _ => source.path(),
    }
}

/// A virtio-mem device: `size_kib` of hot-pluggable memory, `requested_kib` of it asked to be
/// plugged (the guest may plug less, and takes its time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VirtioMemDef {
    pub size_kib: u64,
    pub requested_kib: u64,
}

impl VirtioMemDef {
    /// Its alias, fixed so that the launcher can find it again in the live XML.
    pub(crate) const ALIAS: &'static str = "ua-virtio-mem";
    /// virtio-mem's block, in KiB (KubeVirt's: 2 MiB, a transparent hugepage).
    pub(crate) const BLOCK_KIB: u64 = crate::spec::HOTPLUG_BLOCK_BYTES / 1024;
}

/// CPU pinning: vCPU `i` runs on host CPU `vcpu_pins[i]`; QEMU's emulator threads on
/// `emulator_pin` when isolated.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CpuTune {
    pub vcpu_pins: Vec<u32>,
    pub emulator_pin: Option<u32>,
}

/// A TPM 2.0 (`tpm-tis`) emulated by swtpm, which libvirt starts and stops with QEMU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TpmDef {
    /// Keep the state when the domain stops (libvirt's `persistent_state`).
    pub persistent: bool,
}

/// Who this domain belongs to, written into `<metadata>` so that a launcher can recognise its own.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InstanceMetadata {
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTopology {
    pub sockets: u32,
    pub cores: u32,
    pub threads: u32,
}

impl Default for CpuTopology {
    fn default() -> Self {
        CpuTopology {
            sockets: 1,
            cores: 1,
            threads: 1,
        }
    }
}

impl CpuTopology {
    pub(crate) fn vcpus(&self) -> u32 {
        self.sockets * self.cores * self.threads
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum CpuMode {
    /// libvirt's default for the domain type.
    #[default]
    Default,
    HostModel,
    HostPassthrough,
    /// A named libvirt CPU model.
    Custom(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CpuDef {
    pub mode: CpuMode,
    /// `(policy, name)`.
    pub features: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum FirmwareDef {
    /// SeaBIOS.
    #[default]
    Bios,
    BiosUseSerial,
    Efi(EfiDef),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EfiDef {
    pub code: PathBuf,
    pub vars_template: PathBuf,
    pub nvram: PathBuf,
    pub secure: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KernelBootDef {
    pub kernel: PathBuf,
    pub initrd: Option<PathBuf>,
    pub cmdline: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FeaturesDef {
    pub acpi: bool,
    pub apic: bool,
    /// `<apic eoi=...>`.
    pub apic_eoi: Option<bool>,
    pub smm: Option<bool>,
    /// `(element, state, extra attribute)`, in libvirt's names (`stimer`, `vendor_id`).
    pub hyperv: Vec<HypervFeature>,
    pub kvm_hidden: Option<bool>,
    pub pvspinlock: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HypervFeature {
    pub name: &'static str,
    pub on: bool,
    /// An extra attribute: `retries` for spinlocks, `value` for vendor_id.
    pub attribute: Option<(&'static str, String)>,
    /// `<stimer><direct state=.../></stimer>`.
    pub direct: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ClockOffset {
    #[default]
    Utc,
    /// UTC plus seconds.
    UtcAdjusted(i64),
    Timezone(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClockDef {
    pub offset: ClockOffset,
    pub timers: Vec<TimerDef>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimerDef {
    /// libvirt's name: `hpet`, `pit`, `rtc`, `kvmclock`, `hypervclock`.
    pub name: &'static str,
    pub present: Option<bool>,
    pub tickpolicy: Option<String>,
    pub track: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum Bus {
    #[default]
    Scsi,
    Virtio,
    Sata,
}

impl Bus {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Bus::Scsi => "scsi",
            Bus::Virtio => "virtio",
            Bus::Sata => "sata",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DiskDevice {
    #[default]
    Disk,
    Cdrom,
    Lun,
}

impl DiskDevice {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            DiskDevice::Disk => "disk",
            DiskDevice::Cdrom => "cdrom",
            DiskDevice::Lun => "lun",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiskSource {
    File(PathBuf),
    Block(PathBuf),
}

impl Default for DiskSource {
    fn default() -> Self {
        DiskSource::File(PathBuf::new())
    }
}

impl DiskSource {
    pub(crate) fn path(&self) -> &std::path::Path {
        match self {
            DiskSource::File(p) | DiskSource::Block(p) => p,
        }
    }
}

/// `<address type='drive' controller='0' bus='0' target='0' unit='N'/>`: explicit, because
/// libvirt's own allocation adds a controller every 7 disks and runs out of PCI slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriveAddress {
    pub controller: u32,
    pub unit: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DiskDef {
    /// The spec's volume name; the device alias is `ua-<volume>`.
    pub volume: String,
    pub device: DiskDevice,
    pub source: DiskSource,
    /// `raw` or `qcow2`; raw when empty.
    pub format: &'static str,
    /// The image under `source` (an overlay's backing) that ends the chain.
    pub backing: Option<BackingDef>,
    pub bus: Bus,
    /// Guest target name (`sda`, `vdb`).
    pub target: String,
    pub serial: Option<String>,
    /// Drive address, for scsi disks.
    pub address: Option<DriveAddress>,
    pub cache: Option<String>,
    pub io: Option<String>,
    pub error_policy: Option<String>,
    pub iothread: Option<u32>,
    pub boot_order: Option<u32>,
    pub readonly: bool,
    pub shareable: bool,
    /// Passed to QEMU as a file descriptor the launcher opened and checked (libvirt's
    /// `fdgroup`, associated before the start or attach), never opened by QEMU through its path:
    /// the image lies in a directory someone else writes, who could swap it for a link.
    pub fd_group: Option<String>,
    /// The launcher gave the image to QEMU's user itself, through the descriptor it opened and
    /// checked; libvirt must not relabel it (`<seclabel model='dac' relabel='no'/>`), since
    /// libvirt's chown follows a link. For hot-plugged files, which libvirt 9.0 cannot pass
    /// by `fdgroup` ("Could not dup FD" from QEMU on `blockdev-add`): QEMU opens these by path,
    /// as its unprivileged user.
    pub given_to_qemu: bool,
    /// The host's own file (a spec's `hostDisk`, a file or a block device): walked and opened by
    /// the launcher at every start (`host::host_files`) and passed by `fd_group` where it can be
    /// (a file at a start); libvirt never relabels it (`relabel='no'`): its owner and mode stay
    /// the host's, and where QEMU opens it by path they must let QEMU in.
    pub host_file: bool,
    /// Where QEMU opens a tenant's image when it does not get it by descriptor (`fd_group`:
    /// a hot-plug, or a migration target, whose descriptors cannot travel): the launcher's pin
    /// of the inode it checked, a bind mount in QEMU's mount namespace (`host::pin`), so that
    /// the source's directory, which others write, is not resolved again. `None`: the source.
    pub pin: Option<PathBuf>,
}

impl DiskDef {
    /// The path QEMU is given ([`qemu_path`]).
    pub(crate) fn qemu_path(&self) -> &Path {
        qemu_path(&self.fd_group, &self.pin, &self.source)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InterfaceBackend {
    /// QEMU's user-mode network: a local run, no privileges, no host configuration.
    User,
    /// A tap device the pod network prepared (`managed='no'`: libvirt neither creates nor
    /// removes it).
    Tap(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceDef {
    pub name: String,
    pub backend: InterfaceBackend,
    pub model: String,
    pub mac: Option<String>,
    pub boot_order: Option<u32>,
    /// Guest ports published on the host (user-mode interfaces only).
    pub port_forwards: Vec<PortForward>,
    /// The link is down (`state: down`): the guest sees no carrier.
    pub link_down: bool,
}

/// A guest port published on the host: libvirt's `<portForward proto address><range start to/>`.
/// libvirt 9.0 keeps this element on a user-mode (slirp) interface but does not apply it (only
/// its passt backend would, and 9.0 refuses that backend): the launcher applies it itself through
/// QEMU's monitor once the domain runs (`publish_ports` in `libvirt`, after each start). Writing
/// it in the XML keeps the domain self-describing, so the live XML is the one record of what is
/// published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortForward {
    /// `tcp` or `udp`.
    pub protocol: String,
    /// The host address the port listens on.
    pub address: String,
    pub host_port: u16,
    /// The guest's port.
    pub port: u16,
}

impl PortForward {
    /// The rule QEMU's `hostfwd_add` takes: `tcp:127.0.0.1:2222-:22` (the guest address left
    /// empty: QEMU's default, the guest's DHCP address).
    pub(crate) fn hostfwd_rule(&self) -> String {
        format!(
            "{}:{}:{}-:{}",
            self.protocol, self.address, self.host_port, self.port
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputDef {
    pub name: String,
    pub input_type: String,
    pub bus: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchdogDef {
    pub name: String,
    pub action: String,
}
