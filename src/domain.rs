//! The libvirt domain XML model: what vmlauncher writes (serialised with quick-xml), and the few
//! facts it reads back from libvirt's XML (parsed losslessly with roxmltree): live disks, and the
//! canonical machine names of the capabilities.
//!
//! The live reader never rebuilds an element from the model: to detach a disk it hands back the
//! exact bytes libvirt gave, so nothing libvirt added (addresses, backing chains) is lost.

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;

use quick_xml::events::BytesText;
use quick_xml::Writer;

/// The prefix libvirt requires for user-chosen device aliases.
pub const USER_ALIAS_PREFIX: &str = "ua-";
/// The namespace of vmlauncher's `<metadata>` element.
pub const METADATA_NAMESPACE: &str = "https://github.com/vmlauncher/vmlauncher/xmlns/instance/v1";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum VirtType {
    /// Hardware virtualisation.
    Kvm,
    /// Software emulation (TCG): slow, but runs anywhere.
    #[default]
    Qemu,
}

impl VirtType {
    pub fn as_str(self) -> &'static str {
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
    pub memory_kib: u64,
    /// Hugepage size backing the guest memory.
    pub hugepage_kib: Option<u64>,
    pub topology: CpuTopology,
    pub cpu: CpuDef,
    pub iothreads: u32,
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
    /// Where QEMU writes the guest's serial console; `None` without a serial console.
    pub console_log: Option<PathBuf>,
    /// The unix socket of the VNC display; `None` without graphics.
    pub vnc_socket: Option<PathBuf>,
    pub memballoon: bool,
    pub instance: InstanceMetadata,
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
    pub fn vcpus(&self) -> u32 {
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
    pub fn as_str(self) -> &'static str {
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
    pub fn as_str(self) -> &'static str {
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
    pub fn path(&self) -> &std::path::Path {
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
}

impl DiskDef {
    pub fn alias(&self) -> String {
        format!("{USER_ALIAS_PREFIX}{}", self.volume)
    }

    /// The `<disk>` element alone, as sent to libvirt's attach call.
    pub fn to_xml(&self) -> String {
        let mut w = Writer::new_with_indent(Vec::new(), b' ', 2);
        write_disk(&mut w, self).expect("writing to a Vec cannot fail");
        String::from_utf8(w.into_inner()).expect("quick-xml writes UTF-8")
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
}

/// A guest port published on the host: libvirt's `<portForward proto address><range start to/>`.
/// libvirt 9.0 keeps this element on a user-mode (slirp) interface but does not apply it (only
/// its passt backend would, and 9.0 refuses that backend): the launcher applies it itself through
/// QEMU's monitor once the domain runs (`libvirt::Hypervisor::publish_ports`). Writing it in the
/// XML keeps the domain self-describing, so the live XML is the one record of what is published.
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
    pub fn hostfwd_rule(&self) -> String {
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

/// The guest target name for an index: `prefix` + a, b, ..., z, aa, ab, ... (Linux's scheme).
pub fn target_name(prefix: &str, index: u32) -> String {
    let mut letters = Vec::new();
    let mut n = index as u64 + 1;
    while n > 0 {
        n -= 1;
        letters.push(b'a' + (n % 26) as u8);
        n /= 26;
    }
    letters.reverse();
    format!("{prefix}{}", String::from_utf8(letters).expect("ascii"))
}

type XmlWriter = Writer<Vec<u8>>;

fn text_element(w: &mut XmlWriter, name: &str, text: &str) -> io::Result<()> {
    w.create_element(name)
        .write_text_content(BytesText::new(text))?;
    Ok(())
}

fn empty(w: &mut XmlWriter, name: &str, attrs: &[(&str, &str)]) -> io::Result<()> {
    w.create_element(name)
        .with_attributes(attrs.iter().copied())
        .write_empty()?;
    Ok(())
}

fn on_off(on: bool) -> &'static str {
    if on {
        "on"
    } else {
        "off"
    }
}

fn yes_no(on: bool) -> &'static str {
    if on {
        "yes"
    } else {
        "no"
    }
}

fn alias(w: &mut XmlWriter, name: &str) -> io::Result<()> {
    let alias = format!("{USER_ALIAS_PREFIX}{name}");
    empty(w, "alias", &[("name", alias.as_str())])
}

fn write_disk(w: &mut XmlWriter, disk: &DiskDef) -> io::Result<()> {
    let (disk_type, source_attr) = match &disk.source {
        DiskSource::File(_) => ("file", "file"),
        DiskSource::Block(_) => ("block", "dev"),
    };
    let source = disk.source.path().to_string_lossy();
    w.create_element("disk")
        .with_attributes([("type", disk_type), ("device", disk.device.as_str())])
        .write_inner_content(|w| {
            let format = if disk.format.is_empty() {
                "raw"
            } else {
                disk.format
            };
            let iothread = disk.iothread.map(|t| t.to_string());
            let mut driver = vec![("name", "qemu"), ("type", format)];
            if let Some(cache) = &disk.cache {
                driver.push(("cache", cache));
            }
            if let Some(policy) = &disk.error_policy {
                driver.push(("error_policy", policy));
            }
            if let Some(io) = &disk.io {
                driver.push(("io", io));
            }
            if let Some(t) = &iothread {
                driver.push(("iothread", t));
            }
            empty(w, "driver", &driver)?;
            empty(w, "source", &[(source_attr, source.as_ref())])?;
            empty(
                w,
                "target",
                &[("dev", disk.target.as_str()), ("bus", disk.bus.as_str())],
            )?;
            if let Some(serial) = &disk.serial {
                text_element(w, "serial", serial)?;
            }
            if let Some(order) = disk.boot_order {
                empty(w, "boot", &[("order", &order.to_string())])?;
            }
            if disk.readonly {
                empty(w, "readonly", &[])?;
            }
            if disk.shareable {
                empty(w, "shareable", &[])?;
            }
            alias(w, &disk.volume)?;
            if let Some(addr) = disk.address {
                let controller = addr.controller.to_string();
                let unit = addr.unit.to_string();
                empty(
                    w,
                    "address",
                    &[
                        ("type", "drive"),
                        ("controller", controller.as_str()),
                        ("bus", "0"),
                        ("target", "0"),
                        ("unit", unit.as_str()),
                    ],
                )?;
            }
            Ok(())
        })?;
    Ok(())
}

fn write_interface(w: &mut XmlWriter, iface: &InterfaceDef) -> io::Result<()> {
    let kind = match iface.backend {
        InterfaceBackend::User => "user",
        InterfaceBackend::Tap(_) => "ethernet",
    };
    w.create_element("interface")
        .with_attribute(("type", kind))
        .write_inner_content(|w| {
            if let Some(mac) = &iface.mac {
                empty(w, "mac", &[("address", mac)])?;
            }
            if let InterfaceBackend::Tap(dev) = &iface.backend {
                empty(w, "target", &[("dev", dev), ("managed", "no")])?;
            }
            empty(w, "model", &[("type", &iface.model)])?;
            if let Some(order) = iface.boot_order {
                empty(w, "boot", &[("order", &order.to_string())])?;
            }
            for fwd in &iface.port_forwards {
                w.create_element("portForward")
                    .with_attributes([("proto", fwd.protocol.as_str()), ("address", &fwd.address)])
                    .write_inner_content(|w| {
                        empty(
                            w,
                            "range",
                            &[
                                ("start", &fwd.host_port.to_string()),
                                ("to", &fwd.port.to_string()),
                            ],
                        )
                    })?;
            }
            alias(w, &iface.name)
        })?;
    Ok(())
}

impl DomainDef {
    /// The whole domain XML. Deterministic: the same definition gives the same bytes.
    pub fn to_xml(&self) -> String {
        let mut w = Writer::new_with_indent(Vec::new(), b' ', 2);
        self.write(&mut w).expect("writing to a Vec cannot fail");
        let mut xml = String::from_utf8(w.into_inner()).expect("quick-xml writes UTF-8");
        xml.push('\n');
        xml
    }

    fn write(&self, w: &mut XmlWriter) -> io::Result<()> {
        w.create_element("domain")
            .with_attribute(("type", self.virt_type.as_str()))
            .write_inner_content(|w| {
                text_element(w, "name", &self.name)?;
                if let Some(uuid) = &self.uuid {
                    text_element(w, "uuid", uuid)?;
                }
                w.create_element("metadata").write_inner_content(|w| {
                    let mut attrs = vec![
                        ("xmlns:vmlauncher", METADATA_NAMESPACE),
                        ("namespace", self.instance.namespace.as_str()),
                        ("name", self.instance.name.as_str()),
                    ];
                    if let Some(uid) = &self.instance.uid {
                        attrs.push(("uid", uid.as_str()));
                    }
                    empty(w, "vmlauncher:instance", &attrs)
                })?;
                w.create_element("memory")
                    .with_attribute(("unit", "KiB"))
                    .write_text_content(BytesText::new(&self.memory_kib.to_string()))?;
                if let Some(page) = self.hugepage_kib {
                    w.create_element("memoryBacking").write_inner_content(|w| {
                        w.create_element("hugepages").write_inner_content(|w| {
                            empty(w, "page", &[("size", &page.to_string()), ("unit", "KiB")])
                        })?;
                        Ok(())
                    })?;
                }
                w.create_element("vcpu")
                    .with_attribute(("placement", "static"))
                    .write_text_content(BytesText::new(&self.topology.vcpus().to_string()))?;
                if self.iothreads > 0 {
                    text_element(w, "iothreads", &self.iothreads.to_string())?;
                }
                self.write_cpu(w)?;
                if let Some(serial) = &self.sysinfo_serial {
                    w.create_element("sysinfo")
                        .with_attribute(("type", "smbios"))
                        .write_inner_content(|w| {
                            w.create_element("system").write_inner_content(|w| {
                                w.create_element("entry")
                                    .with_attribute(("name", "serial"))
                                    .write_text_content(BytesText::new(serial))?;
                                Ok(())
                            })?;
                            Ok(())
                        })?;
                }
                self.write_os(w)?;
                self.write_features(w)?;
                self.write_clock(w)?;
                // The launcher decides what happens after a stop (run strategy), not libvirt.
                text_element(w, "on_poweroff", "destroy")?;
                text_element(w, "on_reboot", "restart")?;
                text_element(w, "on_crash", "destroy")?;
                self.write_devices(w)
            })?;
        Ok(())
    }

    fn write_cpu(&self, w: &mut XmlWriter) -> io::Result<()> {
        let mode = match &self.cpu.mode {
            CpuMode::Default => None,
            CpuMode::HostModel => Some("host-model"),
            CpuMode::HostPassthrough => Some("host-passthrough"),
            CpuMode::Custom(_) => Some("custom"),
        };
        let mut cpu = w.create_element("cpu");
        if let Some(mode) = mode {
            cpu = cpu.with_attribute(("mode", mode));
        }
        cpu.write_inner_content(|w| {
            if let CpuMode::Custom(model) = &self.cpu.mode {
                w.create_element("model")
                    .with_attribute(("fallback", "forbid"))
                    .write_text_content(BytesText::new(model))?;
            }
            let (s, c, t) = (
                self.topology.sockets.to_string(),
                self.topology.cores.to_string(),
                self.topology.threads.to_string(),
            );
            empty(
                w,
                "topology",
                &[
                    ("sockets", s.as_str()),
                    ("dies", "1"),
                    ("cores", c.as_str()),
                    ("threads", t.as_str()),
                ],
            )?;
            for (policy, name) in &self.cpu.features {
                empty(w, "feature", &[("policy", policy), ("name", name)])?;
            }
            Ok(())
        })?;
        Ok(())
    }

    fn write_os(&self, w: &mut XmlWriter) -> io::Result<()> {
        w.create_element("os").write_inner_content(|w| {
            w.create_element("type")
                .with_attributes([("arch", "x86_64"), ("machine", self.machine.as_str())])
                .write_text_content(BytesText::new("hvm"))?;
            if let FirmwareDef::Efi(efi) = &self.firmware {
                w.create_element("loader")
                    .with_attributes([
                        ("readonly", "yes"),
                        ("secure", yes_no(efi.secure)),
                        ("type", "pflash"),
                    ])
                    .write_text_content(BytesText::new(&efi.code.to_string_lossy()))?;
                w.create_element("nvram")
                    .with_attribute(("template", efi.vars_template.to_string_lossy().as_ref()))
                    .write_text_content(BytesText::new(&efi.nvram.to_string_lossy()))?;
            }
            if let Some(kb) = &self.kernel_boot {
                text_element(w, "kernel", &kb.kernel.to_string_lossy())?;
                if let Some(initrd) = &kb.initrd {
                    text_element(w, "initrd", &initrd.to_string_lossy())?;
                }
                if let Some(cmdline) = &kb.cmdline {
                    text_element(w, "cmdline", cmdline)?;
                }
            }
            if self.firmware == FirmwareDef::BiosUseSerial {
                empty(w, "bios", &[("useserial", "yes")])?;
            }
            if self.sysinfo_serial.is_some() {
                empty(w, "smbios", &[("mode", "sysinfo")])?;
            }
            Ok(())
        })?;
        Ok(())
    }

    fn write_features(&self, w: &mut XmlWriter) -> io::Result<()> {
        let f = &self.features;
        w.create_element("features").write_inner_content(|w| {
            if f.acpi {
                empty(w, "acpi", &[])?;
            }
            if f.apic {
                match f.apic_eoi {
                    Some(eoi) => empty(w, "apic", &[("eoi", on_off(eoi))])?,
                    None => empty(w, "apic", &[])?,
                }
            }
            if !f.hyperv.is_empty() {
                w.create_element("hyperv")
                    .with_attribute(("mode", "custom"))
                    .write_inner_content(|w| {
                        for h in &f.hyperv {
                            let mut attrs = vec![("state", on_off(h.on))];
                            if let Some((name, value)) = &h.attribute {
                                attrs.push((name, value));
                            }
                            match h.direct {
                                None => empty(w, h.name, &attrs)?,
                                Some(direct) => {
                                    w.create_element(h.name)
                                        .with_attributes(attrs)
                                        .write_inner_content(|w| {
                                            empty(w, "direct", &[("state", on_off(direct))])
                                        })?;
                                }
                            }
                        }
                        Ok(())
                    })?;
            }
            if let Some(hidden) = f.kvm_hidden {
                w.create_element("kvm")
                    .write_inner_content(|w| empty(w, "hidden", &[("state", on_off(hidden))]))?;
            }
            if let Some(on) = f.pvspinlock {
                empty(w, "pvspinlock", &[("state", on_off(on))])?;
            }
            if let Some(on) = f.smm {
                empty(w, "smm", &[("state", on_off(on))])?;
            }
            Ok(())
        })?;
        Ok(())
    }

    fn write_clock(&self, w: &mut XmlWriter) -> io::Result<()> {
        let adjustment;
        let attrs: Vec<(&str, &str)> = match &self.clock.offset {
            ClockOffset::Utc => vec![("offset", "utc")],
            ClockOffset::UtcAdjusted(seconds) => {
                adjustment = seconds.to_string();
                vec![
                    ("offset", "variable"),
                    ("adjustment", adjustment.as_str()),
                    ("basis", "utc"),
                ]
            }
            ClockOffset::Timezone(tz) => vec![("offset", "timezone"), ("timezone", tz.as_str())],
        };
        if self.clock.timers.is_empty() {
            return empty(w, "clock", &attrs);
        }
        w.create_element("clock")
            .with_attributes(attrs)
            .write_inner_content(|w| {
                for t in &self.clock.timers {
                    let mut attrs = vec![("name", t.name)];
                    if let Some(present) = t.present {
                        attrs.push(("present", yes_no(present)));
                    }
                    if let Some(policy) = &t.tickpolicy {
                        attrs.push(("tickpolicy", policy));
                    }
                    if let Some(track) = &t.track {
                        attrs.push(("track", track));
                    }
                    empty(w, "timer", &attrs)?;
                }
                Ok(())
            })?;
        Ok(())
    }

    fn write_devices(&self, w: &mut XmlWriter) -> io::Result<()> {
        w.create_element("devices").write_inner_content(|w| {
            if self.scsi_controller {
                empty(
                    w,
                    "controller",
                    &[("type", "scsi"), ("index", "0"), ("model", "virtio-scsi")],
                )?;
            }
            for disk in &self.disks {
                write_disk(w, disk)?;
            }
            for iface in &self.interfaces {
                write_interface(w, iface)?;
            }
            if let Some(log) = &self.console_log {
                let log = log.to_string_lossy();
                w.create_element("serial")
                    .with_attribute(("type", "file"))
                    .write_inner_content(|w| {
                        empty(w, "source", &[("path", log.as_ref()), ("append", "on")])?;
                        empty(w, "target", &[("port", "0")])
                    })?;
            }
            for input in &self.inputs {
                w.create_element("input")
                    .with_attributes([("type", input.input_type.as_str()), ("bus", &input.bus)])
                    .write_inner_content(|w| alias(w, &input.name))?;
            }
            if let Some(socket) = &self.vnc_socket {
                let socket = socket.to_string_lossy();
                w.create_element("graphics")
                    .with_attribute(("type", "vnc"))
                    .write_inner_content(|w| {
                        empty(
                            w,
                            "listen",
                            &[("type", "socket"), ("socket", socket.as_ref())],
                        )
                    })?;
                w.create_element("video").write_inner_content(|w| {
                    empty(
                        w,
                        "model",
                        &[("type", "vga"), ("vram", "16384"), ("heads", "1")],
                    )
                })?;
            }
            if let Some(wd) = &self.watchdog {
                w.create_element("watchdog")
                    .with_attributes([("model", "i6300esb"), ("action", wd.action.as_str())])
                    .write_inner_content(|w| alias(w, &wd.name))?;
            }
            if self.rng {
                w.create_element("rng")
                    .with_attribute(("model", "virtio"))
                    .write_inner_content(|w| {
                        w.create_element("backend")
                            .with_attribute(("model", "random"))
                            .write_text_content(BytesText::new("/dev/urandom"))?;
                        Ok(())
                    })?;
            }
            if self.memballoon {
                w.create_element("memballoon")
                    .with_attribute(("model", "virtio"))
                    .write_inner_content(|w| empty(w, "stats", &[("period", "10")]))?;
            } else {
                empty(w, "memballoon", &[("model", "none")])?;
            }
            Ok(())
        })?;
        Ok(())
    }
}

/// The canonical machine type of each alias in libvirt's capabilities XML, for x86_64 guests:
/// `<machine canonical='pc-q35-7.2'>q35</machine>` gives `q35 → pc-q35-7.2`.
pub fn canonical_machines(capabilities: &str) -> Result<BTreeMap<String, String>, LiveXmlError> {
    let doc = roxmltree::Document::parse(capabilities).map_err(LiveXmlError::Malformed)?;
    Ok(doc
        .descendants()
        .filter(|n| n.has_tag_name("arch") && n.attribute("name") == Some("x86_64"))
        .flat_map(|arch| arch.children().filter(|n| n.has_tag_name("machine")))
        .filter_map(|m| {
            Some((
                m.text()?.trim().to_string(),
                m.attribute("canonical")?.to_string(),
            ))
        })
        .collect())
}

/// The `<machine>` of a domain capabilities document (the canonical, versioned name).
pub fn domain_capabilities_machine(xml: &str) -> Option<String> {
    let doc = roxmltree::Document::parse(xml).ok()?;
    let machine = doc
        .root_element()
        .children()
        .find(|n| n.has_tag_name("machine"))?;
    Some(machine.text()?.trim().to_string())
}

/// A `<disk>` of libvirt's live XML: the facts the hotplug diff needs, and the element's own bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveDisk {
    pub alias: Option<String>,
    pub target: String,
    pub bus: String,
    pub serial: Option<String>,
    /// The file or device path, when the disk has a source.
    pub source: Option<String>,
    /// The drive address, when the disk has one.
    pub address: Option<DriveAddress>,
    /// The element exactly as libvirt wrote it: what a detach sends back.
    pub xml: String,
}

impl LiveDisk {
    /// The spec volume this disk was made from, if it carries vmlauncher's user alias.
    pub fn volume(&self) -> Option<&str> {
        self.alias.as_deref()?.strip_prefix(USER_ALIAS_PREFIX)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LiveXmlError {
    #[error("libvirt returned XML that does not parse")]
    Malformed(#[source] roxmltree::Error),
    #[error("live domain XML: <disk> #{index} has no <target dev=...>")]
    DiskWithoutTarget { index: usize },
    #[error("live domain XML: <interface> #{index} has a portForward with a bad {attribute}")]
    BadPortForward {
        index: usize,
        attribute: &'static str,
    },
    #[error("live domain XML: <disk> #{index} has a drive address with a bad {attribute}")]
    BadAddress {
        index: usize,
        attribute: &'static str,
    },
}

fn child<'a, 'input>(
    node: roxmltree::Node<'a, 'input>,
    tag: &str,
) -> Option<roxmltree::Node<'a, 'input>> {
    node.children().find(|n| n.has_tag_name(tag))
}

/// The `<disk>` elements of a live domain XML, in document order.
pub fn live_disks(xml: &str) -> Result<Vec<LiveDisk>, LiveXmlError> {
    let doc = roxmltree::Document::parse(xml).map_err(LiveXmlError::Malformed)?;
    let Some(devices) = doc
        .root_element()
        .children()
        .find(|n| n.has_tag_name("devices"))
    else {
        return Ok(Vec::new());
    };
    devices
        .children()
        .filter(|n| n.has_tag_name("disk"))
        .enumerate()
        .map(|(index, disk)| {
            let target = child(disk, "target").ok_or(LiveXmlError::DiskWithoutTarget { index })?;
            let dev = target
                .attribute("dev")
                .ok_or(LiveXmlError::DiskWithoutTarget { index })?;
            let address = match child(disk, "address") {
                Some(a) if a.attribute("type") == Some("drive") => {
                    let num = |attribute: &'static str| {
                        a.attribute(attribute)
                            .unwrap_or("0")
                            .parse::<u32>()
                            .map_err(|_| LiveXmlError::BadAddress { index, attribute })
                    };
                    Some(DriveAddress {
                        controller: num("controller")?,
                        unit: num("unit")?,
                    })
                }
                _ => None,
            };
            let source = child(disk, "source").and_then(|s| {
                s.attribute("file")
                    .or_else(|| s.attribute("dev"))
                    .map(str::to_string)
            });
            Ok(LiveDisk {
                alias: child(disk, "alias")
                    .and_then(|a| a.attribute("name"))
                    .map(str::to_string),
                target: dev.to_string(),
                bus: target.attribute("bus").unwrap_or("").to_string(),
                serial: child(disk, "serial")
                    .and_then(|s| s.text())
                    .map(str::to_string),
                source,
                address,
                xml: xml[disk.range()].to_string(),
            })
        })
        .collect()
}

/// An `<interface>` of libvirt's live XML: what status shows and what the launcher publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveInterface {
    pub alias: Option<String>,
    /// libvirt's interface type: `user`, `ethernet`...
    pub kind: String,
    pub mac: Option<String>,
    pub port_forwards: Vec<PortForward>,
}

impl LiveInterface {
    /// The spec interface this one was made from, if it carries vmlauncher's user alias.
    pub fn name(&self) -> Option<&str> {
        self.alias.as_deref()?.strip_prefix(USER_ALIAS_PREFIX)
    }

    /// QEMU's id of the interface's backend: libvirt names it `host<alias>`.
    pub fn netdev_id(&self) -> Option<String> {
        self.alias.as_ref().map(|a| format!("host{a}"))
    }
}

/// The `<interface>` elements of a live domain XML, in document order.
pub fn live_interfaces(xml: &str) -> Result<Vec<LiveInterface>, LiveXmlError> {
    let doc = roxmltree::Document::parse(xml).map_err(LiveXmlError::Malformed)?;
    let Some(devices) = child(doc.root_element(), "devices") else {
        return Ok(Vec::new());
    };
    devices
        .children()
        .filter(|n| n.has_tag_name("interface"))
        .enumerate()
        .map(|(index, iface)| {
            let port_forwards = iface
                .children()
                .filter(|n| n.has_tag_name("portForward"))
                .flat_map(|pf| {
                    pf.children()
                        .filter(|n| n.has_tag_name("range"))
                        .map(move |range| (pf, range))
                })
                .map(|(pf, range)| {
                    let port = |attribute: &'static str| {
                        range
                            .attribute(attribute)
                            .and_then(|v| v.parse::<u16>().ok())
                            .ok_or(LiveXmlError::BadPortForward { index, attribute })
                    };
                    let host_port = port("start")?;
                    Ok(PortForward {
                        protocol: pf.attribute("proto").unwrap_or("tcp").to_string(),
                        address: pf.attribute("address").unwrap_or("").to_string(),
                        host_port,
                        // libvirt: without `to`, the guest port is the host port.
                        port: match range.attribute("to") {
                            Some(_) => port("to")?,
                            None => host_port,
                        },
                    })
                })
                .collect::<Result<Vec<_>, LiveXmlError>>()?;
            Ok(LiveInterface {
                alias: child(iface, "alias")
                    .and_then(|a| a.attribute("name"))
                    .map(str::to_string),
                kind: iface.attribute("type").unwrap_or("").to_string(),
                mac: child(iface, "mac")
                    .and_then(|m| m.attribute("address"))
                    .map(str::to_string),
                port_forwards,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_names_follow_linux() {
        assert_eq!(target_name("sd", 0), "sda");
        assert_eq!(target_name("sd", 25), "sdz");
        assert_eq!(target_name("sd", 26), "sdaa");
        assert_eq!(target_name("sd", 27), "sdab");
        assert_eq!(target_name("vd", 701), "vdzz");
        assert_eq!(target_name("vd", 702), "vdaaa");
    }

    #[test]
    fn disk_xml_has_alias_serial_and_address() {
        let disk = DiskDef {
            volume: "data".into(),
            source: DiskSource::File("/var/data/a&b.img".into()),
            bus: Bus::Scsi,
            target: "sdb".into(),
            serial: Some("MixedCase-1".into()),
            address: Some(DriveAddress {
                controller: 0,
                unit: 1,
            }),
            ..Default::default()
        };
        assert_eq!(
            disk.to_xml(),
            r#"<disk type="file" device="disk">
  <driver name="qemu" type="raw"/>
  <source file="/var/data/a&amp;b.img"/>
  <target dev="sdb" bus="scsi"/>
  <serial>MixedCase-1</serial>
  <alias name="ua-data"/>
  <address type="drive" controller="0" bus="0" target="0" unit="1"/>
</disk>"#
        );
    }

    const LIVE: &str = r#"<domain type='qemu' id='1'>
  <name>default_vm</name>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw'/>
      <source file='/data/a.img' index='2'/>
      <backingStore/>
      <target dev='sda' bus='scsi'/>
      <serial>SerA</serial>
      <alias name='ua-a'/>
      <address type='drive' controller='0' bus='0' target='0' unit='3'/>
    </disk>
    <disk type='block' device='disk'>
      <source dev='/dev/loop0'/>
      <target dev='vda' bus='virtio'/>
      <alias name='virtio-disk0'/>
      <address type='pci' domain='0x0000' bus='0x04' slot='0x00' function='0x0'/>
    </disk>
  </devices>
</domain>"#;

    #[test]
    fn reads_live_interfaces_with_their_published_ports() {
        let xml = r#"<domain type='qemu'><name>x</name><devices>
  <interface type='user'>
    <mac address='52:54:00:12:34:56'/>
    <portForward proto='tcp' address='127.0.0.1'>
      <range start='2222' to='22'/>
      <range start='8080'/>
    </portForward>
    <model type='virtio'/>
    <alias name='ua-default'/>
  </interface>
  <interface type='ethernet'><target dev='tap0' managed='no'/><alias name='net1'/></interface>
</devices></domain>"#;
        let live = live_interfaces(xml).unwrap();
        assert_eq!(live.len(), 2);
        assert_eq!(live[0].name(), Some("default"));
        assert_eq!(live[0].netdev_id().as_deref(), Some("hostua-default"));
        assert_eq!(live[0].mac.as_deref(), Some("52:54:00:12:34:56"));
        let rules: Vec<String> = live[0]
            .port_forwards
            .iter()
            .map(PortForward::hostfwd_rule)
            .collect();
        assert_eq!(
            rules,
            ["tcp:127.0.0.1:2222-:22", "tcp:127.0.0.1:8080-:8080"]
        );
        assert_eq!((live[1].kind.as_str(), live[1].name()), ("ethernet", None));
        assert!(live[1].port_forwards.is_empty());
        let bad = xml.replace("start='2222'", "start='70000'");
        assert!(matches!(
            live_interfaces(&bad),
            Err(LiveXmlError::BadPortForward {
                index: 0,
                attribute: "start"
            })
        ));
    }

    #[test]
    fn reads_live_disks_and_keeps_their_bytes() {
        let disks = live_disks(LIVE).unwrap();
        assert_eq!(disks.len(), 2);
        let a = &disks[0];
        assert_eq!(a.volume(), Some("a"));
        assert_eq!(a.target, "sda");
        assert_eq!(a.bus, "scsi");
        assert_eq!(a.serial.as_deref(), Some("SerA"));
        assert_eq!(a.source.as_deref(), Some("/data/a.img"));
        assert_eq!(
            a.address,
            Some(DriveAddress {
                controller: 0,
                unit: 3
            })
        );
        assert!(a.xml.starts_with("<disk type='file' device='disk'>"));
        assert!(a.xml.ends_with("</disk>"));
        assert!(
            a.xml.contains("<backingStore/>"),
            "live bytes kept as libvirt wrote them"
        );
        let b = &disks[1];
        assert_eq!(b.volume(), None);
        assert_eq!(b.source.as_deref(), Some("/dev/loop0"));
        assert_eq!(b.address, None);
    }

    #[test]
    fn reads_the_machine_of_domain_capabilities() {
        let xml = "<domainCapabilities>\n  <path>/usr/bin/qemu-system-x86_64</path>\n  <domain>qemu</domain>\n  <machine>pc-q35-7.2</machine>\n  <arch>x86_64</arch>\n</domainCapabilities>";
        assert_eq!(
            domain_capabilities_machine(xml).as_deref(),
            Some("pc-q35-7.2")
        );
        assert_eq!(domain_capabilities_machine("<domainCapabilities/>"), None);
    }

    #[test]
    fn reads_canonical_machines_from_capabilities() {
        let caps = r#"<capabilities><guest><arch name='x86_64'>
            <machine maxCpus='255'>pc-i440fx-7.2</machine>
            <machine canonical='pc-i440fx-7.2' maxCpus='255'>pc</machine>
            <machine canonical='pc-q35-7.2' maxCpus='288'>q35</machine>
            </arch></guest><guest><arch name='i686'>
            <machine canonical='pc-q35-7.1'>q35</machine></arch></guest></capabilities>"#;
        let machines = canonical_machines(caps).unwrap();
        assert_eq!(machines.get("q35").map(String::as_str), Some("pc-q35-7.2"));
        assert_eq!(
            machines.get("pc").map(String::as_str),
            Some("pc-i440fx-7.2")
        );
        assert_eq!(machines.len(), 2);
    }

    #[test]
    fn malformed_live_xml_is_an_error() {
        assert!(matches!(
            live_disks("<domain><devices>"),
            Err(LiveXmlError::Malformed(_))
        ));
        assert!(matches!(
            live_disks("<domain><devices><disk/></devices></domain>"),
            Err(LiveXmlError::DiskWithoutTarget { index: 0 })
        ));
    }
}
