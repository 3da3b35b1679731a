//! The libvirt domain XML model: what vmlauncher writes (serialised with quick-xml), and the few
//! facts it reads back from libvirt's *live* XML (parsed losslessly with roxmltree).
//!
//! The live reader never rebuilds an element from the model: to detach a disk it hands back the
//! exact bytes libvirt gave, so nothing libvirt added (addresses, backing chains) is lost.

use std::io;
use std::path::PathBuf;

use quick_xml::events::BytesText;
use quick_xml::Writer;

/// The prefix libvirt requires for user-chosen device aliases.
pub const USER_ALIAS_PREFIX: &str = "ua-";
/// The namespace of vmlauncher's `<metadata>` element.
pub const METADATA_NAMESPACE: &str = "https://github.com/vmlauncher/vmlauncher/xmlns/instance/v1";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VirtType {
    /// Hardware virtualisation.
    Kvm,
    /// Software emulation (TCG): slow, but runs anywhere.
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

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainDef {
    pub name: String,
    pub uuid: Option<String>,
    pub virt_type: VirtType,
    pub memory_kib: u64,
    pub topology: CpuTopology,
    pub machine: String,
    pub kernel_boot: Option<KernelBootDef>,
    pub disks: Vec<DiskDef>,
    /// Where QEMU writes the guest's serial console.
    pub console_log: PathBuf,
    pub instance: InstanceMetadata,
}

/// Who this domain belongs to, written into `<metadata>` so that a launcher can recognise its own.
#[derive(Debug, Clone, PartialEq, Eq)]
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

impl CpuTopology {
    pub fn vcpus(&self) -> u32 {
        self.sockets * self.cores * self.threads
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelBootDef {
    pub kernel: PathBuf,
    pub initrd: Option<PathBuf>,
    pub cmdline: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Bus {
    Scsi,
    Virtio,
}

impl Bus {
    pub fn as_str(self) -> &'static str {
        match self {
            Bus::Scsi => "scsi",
            Bus::Virtio => "virtio",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiskSource {
    File(PathBuf),
    Block(PathBuf),
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

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskDef {
    /// The spec's volume name; the device alias is `ua-<volume>`.
    pub volume: String,
    pub source: DiskSource,
    pub bus: Bus,
    /// Guest target name (`sda`, `vdb`).
    pub target: String,
    pub serial: Option<String>,
    /// Drive address, for scsi disks.
    pub address: Option<DriveAddress>,
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

fn write_disk(w: &mut XmlWriter, disk: &DiskDef) -> io::Result<()> {
    let (disk_type, source_attr) = match &disk.source {
        DiskSource::File(_) => ("file", "file"),
        DiskSource::Block(_) => ("block", "dev"),
    };
    let source = disk.source.path().to_string_lossy();
    w.create_element("disk")
        .with_attributes([("type", disk_type), ("device", "disk")])
        .write_inner_content(|w| {
            w.create_element("driver")
                .with_attributes([("name", "qemu"), ("type", "raw")])
                .write_empty()?;
            w.create_element("source")
                .with_attribute((source_attr, source.as_ref()))
                .write_empty()?;
            w.create_element("target")
                .with_attributes([("dev", disk.target.as_str()), ("bus", disk.bus.as_str())])
                .write_empty()?;
            if let Some(serial) = &disk.serial {
                text_element(w, "serial", serial)?;
            }
            w.create_element("alias")
                .with_attribute(("name", disk.alias().as_str()))
                .write_empty()?;
            if let Some(addr) = disk.address {
                let controller = addr.controller.to_string();
                let unit = addr.unit.to_string();
                w.create_element("address")
                    .with_attributes([
                        ("type", "drive"),
                        ("controller", controller.as_str()),
                        ("bus", "0"),
                        ("target", "0"),
                        ("unit", unit.as_str()),
                    ])
                    .write_empty()?;
            }
            Ok(())
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
                    w.create_element("vmlauncher:instance")
                        .with_attributes(attrs)
                        .write_empty()?;
                    Ok(())
                })?;
                w.create_element("memory")
                    .with_attribute(("unit", "KiB"))
                    .write_text_content(BytesText::new(&self.memory_kib.to_string()))?;
                w.create_element("vcpu")
                    .with_attribute(("placement", "static"))
                    .write_text_content(BytesText::new(&self.topology.vcpus().to_string()))?;
                w.create_element("cpu").write_inner_content(|w| {
                    let (s, c, t) = (
                        self.topology.sockets.to_string(),
                        self.topology.cores.to_string(),
                        self.topology.threads.to_string(),
                    );
                    w.create_element("topology")
                        .with_attributes([
                            ("sockets", s.as_str()),
                            ("dies", "1"),
                            ("cores", c.as_str()),
                            ("threads", t.as_str()),
                        ])
                        .write_empty()?;
                    Ok(())
                })?;
                w.create_element("os").write_inner_content(|w| {
                    w.create_element("type")
                        .with_attributes([("arch", "x86_64"), ("machine", self.machine.as_str())])
                        .write_text_content(BytesText::new("hvm"))?;
                    if let Some(kb) = &self.kernel_boot {
                        text_element(w, "kernel", &kb.kernel.to_string_lossy())?;
                        if let Some(initrd) = &kb.initrd {
                            text_element(w, "initrd", &initrd.to_string_lossy())?;
                        }
                        if let Some(cmdline) = &kb.cmdline {
                            text_element(w, "cmdline", cmdline)?;
                        }
                    }
                    Ok(())
                })?;
                w.create_element("features").write_inner_content(|w| {
                    w.create_element("acpi").write_empty()?;
                    w.create_element("apic").write_empty()?;
                    Ok(())
                })?;
                // The launcher decides what happens after a stop (run strategy), not libvirt.
                text_element(w, "on_poweroff", "destroy")?;
                text_element(w, "on_reboot", "restart")?;
                text_element(w, "on_crash", "destroy")?;
                w.create_element("devices").write_inner_content(|w| {
                    // Always present, so that scsi disks can be hot-plugged into any VM.
                    w.create_element("controller")
                        .with_attributes([
                            ("type", "scsi"),
                            ("index", "0"),
                            ("model", "virtio-scsi"),
                        ])
                        .write_empty()?;
                    for disk in &self.disks {
                        write_disk(w, disk)?;
                    }
                    let log = self.console_log.to_string_lossy();
                    w.create_element("serial")
                        .with_attribute(("type", "file"))
                        .write_inner_content(|w| {
                            w.create_element("source")
                                .with_attributes([("path", log.as_ref()), ("append", "on")])
                                .write_empty()?;
                            w.create_element("target")
                                .with_attribute(("port", "0"))
                                .write_empty()?;
                            Ok(())
                        })?;
                    w.create_element("memballoon")
                        .with_attribute(("model", "none"))
                        .write_empty()?;
                    Ok(())
                })?;
                Ok(())
            })?;
        Ok(())
    }
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
