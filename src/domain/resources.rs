//! The CPU and memory a live domain has, read back from libvirt's XML: what a Sync that resizes
//! the guest compares against, and what the status reports.

use super::live::LiveXmlError;
use super::{Bus, DomainDef, VirtioMemDef};

/// vCPUs and memory as libvirt runs them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LiveResources {
    /// vCPUs enabled now (`<vcpu current=…>`, else all of them).
    pub vcpus: u32,
    /// vCPUs the domain has room for.
    pub max_vcpus: u32,
    /// The memory it booted with, without virtio-mem's (its NUMA cells', else `<memory>`).
    pub memory_at_boot_kib: u64,
    pub virtio_mem: Option<LiveVirtioMem>,
}

/// vmlauncher's virtio-mem device (`VirtioMemDef::ALIAS`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LiveVirtioMem {
    pub size_kib: u64,
    pub requested_kib: u64,
    /// What the guest has plugged; libvirt updates it on QEMU's size-change event.
    pub current_kib: u64,
    /// The element exactly as libvirt wrote it, and where its `<requested>` is in it: libvirt
    /// finds the device to update by its address, which only the live XML has.
    pub xml: String,
    pub requested_range: std::ops::Range<usize>,
}

impl LiveVirtioMem {
    /// The device as libvirt has it, asking for `kib`: what libvirt's update call takes.
    pub fn asking(&self, kib: u64) -> String {
        format!(
            "{}<requested unit='KiB'>{kib}</requested>{}",
            &self.xml[..self.requested_range.start],
            &self.xml[self.requested_range.end..]
        )
    }
}

impl LiveResources {
    /// Guest memory asked for: the boot memory and what virtio-mem was asked to add.
    pub(crate) fn requested_kib(&self) -> u64 {
        self.memory_at_boot_kib + self.virtio_mem.as_ref().map_or(0, |m| m.requested_kib)
    }

    /// Guest memory it has: the boot memory and what the guest plugged.
    pub(crate) fn current_kib(&self) -> u64 {
        self.memory_at_boot_kib + self.virtio_mem.as_ref().map_or(0, |m| m.current_kib)
    }
}

/// Reads `<vcpu>`, the NUMA cells, `<memory>` and the virtio-mem device of a live domain XML.
pub fn live_resources(xml: &str) -> Result<LiveResources, LiveXmlError> {
    let doc = roxmltree::Document::parse(xml).map_err(LiveXmlError::Malformed)?;
    live_resources_in(&doc)
}

/// [`live_resources`] of a document already parsed.
pub(crate) fn live_resources_in(
    doc: &roxmltree::Document<'_>,
) -> Result<LiveResources, LiveXmlError> {
    let root = doc.root_element();
    let number = |node: roxmltree::Node, what: &'static str| -> Result<u64, LiveXmlError> {
        node.text()
            .and_then(|t| t.trim().parse::<u64>().ok())
            .ok_or(LiveXmlError::BadNumber { what })
    };
    let vcpu = root
        .children()
        .find(|n| n.has_tag_name("vcpu"))
        .ok_or(LiveXmlError::BadNumber { what: "<vcpu>" })?;
    let max_vcpus = number(vcpu, "<vcpu>")? as u32;
    let vcpus = match vcpu.attribute("current") {
        Some(current) => current
            .parse::<u32>()
            .map_err(|_| LiveXmlError::BadNumber {
                what: "<vcpu current>",
            })?,
        None => max_vcpus,
    };
    let cells: Vec<u64> = root
        .descendants()
        .filter(|n| n.has_tag_name("cell") && n.parent().is_some_and(|p| p.has_tag_name("numa")))
        .map(|cell| {
            let value = cell.attribute("memory").and_then(|m| m.parse::<u64>().ok());
            let unit = cell.attribute("unit").unwrap_or("KiB");
            value
                .and_then(|v| kib(v, unit))
                .ok_or(LiveXmlError::BadNumber {
                    what: "<numa><cell memory>",
                })
        })
        .collect::<Result<_, _>>()?;
    let memory_at_boot_kib = if cells.is_empty() {
        let memory = root
            .children()
            .find(|n| n.has_tag_name("memory"))
            .ok_or(LiveXmlError::BadNumber { what: "<memory>" })?;
        sized(memory, "<memory>")?
    } else {
        cells.iter().sum()
    };
    let virtio_mem = root
        .children()
        .filter(|n| n.has_tag_name("devices"))
        .flat_map(|d| d.children())
        .find(|n| {
            n.has_tag_name("memory")
                && n.attribute("model") == Some("virtio-mem")
                && n.children().any(|a| {
                    a.has_tag_name("alias") && a.attribute("name") == Some(VirtioMemDef::ALIAS)
                })
        })
        .map(|device| -> Result<LiveVirtioMem, LiveXmlError> {
            let target = device.children().find(|n| n.has_tag_name("target")).ok_or(
                LiveXmlError::BadNumber {
                    what: "virtio-mem <target>",
                },
            )?;
            let field = |name: &str, what: &'static str| match target
                .children()
                .find(|n| n.has_tag_name(name))
            {
                Some(node) => sized(node, what),
                None => Ok(0),
            };
            let requested = target
                .children()
                .find(|n| n.has_tag_name("requested"))
                .ok_or(LiveXmlError::BadNumber {
                    what: "virtio-mem <requested>",
                })?;
            let start = device.range().start;
            Ok(LiveVirtioMem {
                size_kib: field("size", "virtio-mem <size>")?,
                requested_kib: sized(requested, "virtio-mem <requested>")?,
                current_kib: field("current", "virtio-mem <current>")?,
                xml: doc.input_text()[device.range()].to_string(),
                requested_range: requested.range().start - start..requested.range().end - start,
            })
        })
        .transpose()?;
    Ok(LiveResources {
        vcpus,
        max_vcpus,
        memory_at_boot_kib,
        virtio_mem,
    })
}

/// Conventional PCI network models. On a q35 machine libvirt puts them, and the i6300esb
/// watchdog, behind a pcie-to-pci bridge, and adds the bridge with a root port of its own.
const CONVENTIONAL_PCI_NICS: [&str; 4] = ["e1000", "rtl8139", "pcnet", "ne2k_pci"];

impl DomainDef {
    /// The root ports a q35 machine's libvirt fills with this definition's devices: one for
    /// each PCIe device (virtio disks, NICs, inputs, the scsi controller, rng, virtio-mem, the
    /// balloon), and one each for the two controllers libvirt adds itself (USB, and
    /// virtio-serial for the agent channel). Conventional PCI devices take none of them: libvirt
    /// adds their bridge with a port of its own. A definition written with this many root ports
    /// more than it wants spare is placed by libvirt with the spare ones left empty, in one
    /// define. Only a count of what the writer writes: should libvirt place more, the define
    /// shows it (`free_root_ports`).
    pub(crate) fn root_port_devices(&self) -> u32 {
        let virtio_disks = self.disks.iter().filter(|d| d.bus == Bus::Virtio).count();
        let pcie_nics = (self.interfaces.iter())
            .filter(|i| !CONVENTIONAL_PCI_NICS.contains(&i.model.as_str()))
            .count();
        let virtio_inputs = self.inputs.iter().filter(|i| i.bus == "virtio").count();
        let flags = [
            self.scsi_controller,
            self.rng,
            self.virtio_mem.is_some(),
            self.memballoon,
            true, // the USB controller
            true, // virtio-serial, for the agent channel
        ];
        let devices =
            virtio_disks + pcie_nics + virtio_inputs + flags.iter().filter(|f| **f).count();
        u32::try_from(devices).unwrap_or(u32::MAX)
    }
}

/// The PCIe root ports of a definition that nothing is plugged into: those whose bus no PCI
/// address names.
pub(crate) fn free_root_ports(xml: &str) -> Result<u32, LiveXmlError> {
    let doc = roxmltree::Document::parse(xml).map_err(LiveXmlError::Malformed)?;
    let used: std::collections::BTreeSet<u32> = doc
        .descendants()
        .filter(|n| n.has_tag_name("address") && n.attribute("type") == Some("pci"))
        .filter_map(|n| bus_number(n.attribute("bus")?))
        .collect();
    let free = doc
        .descendants()
        .filter(|n| {
            n.has_tag_name("controller")
                && n.attribute("type") == Some("pci")
                && n.attribute("model") == Some("pcie-root-port")
        })
        .filter_map(|n| n.attribute("index")?.parse::<u32>().ok())
        .filter(|index| !used.contains(index))
        .count();
    Ok(u32::try_from(free).unwrap_or(u32::MAX))
}

/// A PCI address's bus as libvirt writes it (`0x01`), or decimal.
fn bus_number(text: &str) -> Option<u32> {
    match text.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// A domain definition (libvirt's, with the addresses it chose) with `count` empty PCIe root
/// ports added after its PCI controllers: room for interfaces and other PCI devices plugged
/// later, which libvirt's own placement would have filled with the boot devices.
pub(crate) fn with_spare_root_ports(xml: &str, count: u32) -> Result<String, LiveXmlError> {
    let doc = roxmltree::Document::parse(xml).map_err(LiveXmlError::Malformed)?;
    let devices = doc
        .root_element()
        .children()
        .find(|n| n.has_tag_name("devices"))
        .ok_or(LiveXmlError::BadNumber { what: "<devices>" })?;
    let last_index = devices
        .children()
        .filter(|n| n.has_tag_name("controller") && n.attribute("type") == Some("pci"))
        .filter_map(|n| n.attribute("index")?.parse::<u32>().ok())
        .max()
        .unwrap_or(0);
    // A root port takes a slot of bus 0, which has 32.
    let ports: String = (last_index + 1..=(last_index + count).min(MAX_PCI_BUS_INDEX))
        .map(|index| format!("<controller type='pci' index='{index}' model='pcie-root-port'/>"))
        .collect();
    let end = devices.range().end - "</devices>".len();
    Ok(format!("{}{ports}{}", &xml[..end], &xml[end..]))
}

const MAX_PCI_BUS_INDEX: u32 = 31;

/// An element's number in KiB, by its `unit` (libvirt writes KiB; the others are its spellings).
fn sized(node: roxmltree::Node, what: &'static str) -> Result<u64, LiveXmlError> {
    let value = node.text().and_then(|t| t.trim().parse::<u64>().ok());
    let unit = node.attribute("unit").unwrap_or("KiB");
    value
        .and_then(|v| kib(v, unit))
        .ok_or(LiveXmlError::BadNumber { what })
}

fn kib(value: u64, unit: &str) -> Option<u64> {
    match unit {
        "b" | "bytes" => Some(value / 1024),
        "k" | "KiB" => Some(value),
        "M" | "MiB" => value.checked_mul(1024),
        "G" | "GiB" => value.checked_mul(1024 * 1024),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As libvirt 9.0 shows a domain booted with 1 GiB, room for 1 GiB more and 4 vCPUs,
    /// after a Sync asked for 2 vCPUs and 512 MiB (the guest has plugged 256 MiB so far).
    const RESIZED: &str = r#"<domain type='qemu' id='3'>
  <name>default_vm</name>
  <maxMemory slots='1' unit='KiB'>2097152</maxMemory>
  <memory unit='KiB'>2097152</memory>
  <currentMemory unit='KiB'>1310720</currentMemory>
  <vcpu placement='static' current='2'>4</vcpu>
  <cpu mode='custom' match='exact' check='full'>
    <topology sockets='4' dies='1' cores='1' threads='1'/>
    <numa>
      <cell id='0' cpus='0-3' memory='1048576' unit='KiB'/>
    </numa>
  </cpu>
  <devices>
    <memory model='virtio-mem'>
      <target>
        <size unit='KiB'>1048576</size>
        <node>0</node>
        <block unit='KiB'>2048</block>
        <requested unit='KiB'>524288</requested>
        <current unit='KiB'>262144</current>
      </target>
      <alias name='ua-virtio-mem'/>
      <address type='pci' domain='0x0000' bus='0x00' slot='0x05' function='0x0'/>
    </memory>
  </devices>
</domain>"#;

    #[test]
    fn a_resized_domain_reads_as_booted_asked_and_plugged() {
        let r = live_resources(RESIZED).unwrap();
        assert_eq!(r.vcpus, 2);
        assert_eq!(r.max_vcpus, 4);
        assert_eq!(r.memory_at_boot_kib, 1048576);
        let mem = r.virtio_mem.clone().unwrap();
        assert_eq!(
            (mem.size_kib, mem.requested_kib, mem.current_kib),
            (1048576, 524288, 262144)
        );
        assert_eq!(r.requested_kib(), 1572864);
        assert_eq!(r.current_kib(), 1310720);
        // The update names the device as libvirt does (its address), asking for the new size.
        let update = mem.asking(1048576);
        assert!(
            update.starts_with("<memory model='virtio-mem'>"),
            "{update}"
        );
        assert!(update.ends_with("</memory>"), "{update}");
        assert!(
            update.contains("<requested unit='KiB'>1048576</requested>"),
            "{update}"
        );
        assert!(!update.contains("524288"), "{update}");
        assert!(update.contains("<address type='pci' domain='0x0000' bus='0x00' slot='0x05'"));
    }

    #[test]
    fn a_domain_without_room_has_its_memory_and_every_vcpu() {
        let xml = "<domain><memory unit='MiB'>512</memory><vcpu>2</vcpu><devices/></domain>";
        let r = live_resources(xml).unwrap();
        assert_eq!((r.vcpus, r.max_vcpus, r.memory_at_boot_kib), (2, 2, 524288));
        assert_eq!(r.virtio_mem, None);
    }

    #[test]
    fn spare_root_ports_come_after_libvirts_own() {
        let xml = "<domain><devices><controller type='pci' index='0' model='pcie-root'/>\
            <controller type='pci' index='3' model='pcie-root-port'/>\
            <controller type='usb' index='0'/></devices></domain>";
        let spared = with_spare_root_ports(xml, 2).unwrap();
        assert!(
            spared.ends_with("<controller type='usb' index='0'/><controller type='pci' index='4' model='pcie-root-port'/><controller type='pci' index='5' model='pcie-root-port'/></devices></domain>"),
            "{spared}"
        );
        assert_eq!(with_spare_root_ports(xml, 0).unwrap(), xml);
    }

    /// The devices and root ports of the test guest's domain as libvirt 9.0 placed them on a
    /// q35 machine (the NIC, the scsi controller, the USB controller, virtio-serial and the
    /// balloon on the ports of buses 1 to 5), with five ports left empty.
    const PLACED: &str = "<domain type='qemu'><devices>\
        <controller type='scsi' index='0' model='virtio-scsi'><address type='pci' domain='0x0000' bus='0x02' slot='0x00' function='0x0'/></controller>\
        <controller type='usb' index='0' model='qemu-xhci'><address type='pci' domain='0x0000' bus='0x03' slot='0x00' function='0x0'/></controller>\
        <controller type='sata' index='0'><address type='pci' domain='0x0000' bus='0x00' slot='0x1f' function='0x2'/></controller>\
        <controller type='pci' index='0' model='pcie-root'/>\
        <controller type='pci' index='1' model='pcie-root-port'><model name='pcie-root-port'/><target chassis='1' port='0x10'/><address type='pci' domain='0x0000' bus='0x00' slot='0x02' function='0x0' multifunction='on'/></controller>\
        <controller type='pci' index='2' model='pcie-root-port'><address type='pci' domain='0x0000' bus='0x00' slot='0x02' function='0x1'/></controller>\
        <controller type='pci' index='3' model='pcie-root-port'><address type='pci' domain='0x0000' bus='0x00' slot='0x02' function='0x2'/></controller>\
        <controller type='pci' index='4' model='pcie-root-port'><address type='pci' domain='0x0000' bus='0x00' slot='0x02' function='0x3'/></controller>\
        <controller type='pci' index='5' model='pcie-root-port'><address type='pci' domain='0x0000' bus='0x00' slot='0x02' function='0x4'/></controller>\
        <controller type='pci' index='6' model='pcie-root-port'><address type='pci' domain='0x0000' bus='0x00' slot='0x02' function='0x5'/></controller>\
        <controller type='pci' index='7' model='pcie-root-port'><address type='pci' domain='0x0000' bus='0x00' slot='0x02' function='0x6'/></controller>\
        <controller type='pci' index='8' model='pcie-root-port'><address type='pci' domain='0x0000' bus='0x00' slot='0x02' function='0x7'/></controller>\
        <controller type='pci' index='9' model='pcie-root-port'><address type='pci' domain='0x0000' bus='0x00' slot='0x03' function='0x0' multifunction='on'/></controller>\
        <controller type='pci' index='10' model='pcie-root-port'><address type='pci' domain='0x0000' bus='0x00' slot='0x03' function='0x1'/></controller>\
        <controller type='virtio-serial' index='0'><address type='pci' domain='0x0000' bus='0x04' slot='0x00' function='0x0'/></controller>\
        <interface type='user'><model type='virtio'/><address type='pci' domain='0x0000' bus='0x01' slot='0x00' function='0x0'/></interface>\
        <video><model type='vga'/><address type='pci' domain='0x0000' bus='0x00' slot='0x01' function='0x0'/></video>\
        <memballoon model='virtio'><address type='pci' domain='0x0000' bus='0x05' slot='0x00' function='0x0'/></memballoon>\
        </devices></domain>";

    #[test]
    fn root_ports_that_no_address_names_are_free() {
        assert_eq!(free_root_ports(PLACED).unwrap(), 5);
        // The spare ports added to it are free too; a definition without ports has none.
        assert_eq!(
            free_root_ports(&with_spare_root_ports(PLACED, 2).unwrap()).unwrap(),
            7
        );
        assert_eq!(free_root_ports("<domain><devices/></domain>").unwrap(), 0);
        assert!(free_root_ports("<domain>").is_err());
    }

    #[test]
    fn a_number_that_is_not_one_is_an_error_not_a_zero() {
        let xml = "<domain><memory unit='KiB'>lots</memory><vcpu>2</vcpu></domain>";
        assert!(matches!(
            live_resources(xml),
            Err(LiveXmlError::BadNumber { what: "<memory>" })
        ));
    }
}
