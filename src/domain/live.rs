//! The few facts read back from libvirt's XML (roxmltree, losslessly): live disks with their
//! exact bytes, and machine names from the capabilities.

use std::collections::BTreeMap;

use super::{DriveAddress, PortForward, USER_ALIAS_PREFIX};

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

/// The machine of a domain definition (`<os><type machine=...>`): after a define, the versioned
/// name libvirt wrote for an alias such as `q35`.
pub(crate) fn definition_machine(xml: &str) -> Option<String> {
    let doc = roxmltree::Document::parse(xml).ok()?;
    let os = doc
        .root_element()
        .children()
        .find(|n| n.has_tag_name("os"))?;
    let os_type = os.children().find(|n| n.has_tag_name("type"))?;
    Some(os_type.attribute("machine")?.to_string())
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
    #[error("live domain XML: {what} is missing or not a number")]
    BadNumber { what: &'static str },
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

/// Whether libvirt says the guest agent is connected: the `<target state='connected'/>` of its
/// channel ([`super::AGENT_CHANNEL`]), which libvirt sets when the guest opens the port (QEMU's
/// `VSERPORT_CHANGE`) and clears when it closes it. Of libvirt's XML, so a root `<domain>`, already
/// parsed (by a caller with its own parse limits).
pub(crate) fn agent_connected_in(doc: &roxmltree::Document<'_>) -> bool {
    child(doc.root_element(), "devices")
        .into_iter()
        .flat_map(|d| d.children())
        .filter(|n| n.has_tag_name("channel"))
        .filter_map(|c| child(c, "target"))
        .any(|t| {
            t.attribute("name") == Some(super::AGENT_CHANNEL)
                && t.attribute("state") == Some("connected")
        })
}

/// Each `<tag>` element under `<devices>` of a live domain XML, in document order, as `read`
/// makes it of the element and its index among them (for the errors); none without `<devices>`.
fn live_devices<T>(
    xml: &str,
    tag: &str,
    read: impl FnMut(usize, roxmltree::Node<'_, '_>) -> Result<T, LiveXmlError>,
) -> Result<Vec<T>, LiveXmlError> {
    let doc = roxmltree::Document::parse(xml).map_err(LiveXmlError::Malformed)?;
    devices_in(&doc, tag, read)
}

/// [`live_devices`] of a document already parsed.
fn devices_in<T>(
    doc: &roxmltree::Document<'_>,
    tag: &str,
    mut read: impl FnMut(usize, roxmltree::Node<'_, '_>) -> Result<T, LiveXmlError>,
) -> Result<Vec<T>, LiveXmlError> {
    let Some(devices) = child(doc.root_element(), "devices") else {
        return Ok(Vec::new());
    };
    devices
        .children()
        .filter(|n| n.has_tag_name(tag))
        .enumerate()
        .map(|(index, node)| read(index, node))
        .collect()
}

/// The `<disk>` elements of a live domain XML, in document order.
pub fn live_disks(xml: &str) -> Result<Vec<LiveDisk>, LiveXmlError> {
    live_devices(xml, "disk", |index, disk| {
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
}

/// An `<interface>` of libvirt's live XML: what status shows and what the launcher publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LiveInterface {
    pub alias: Option<String>,
    /// libvirt's interface type: `user`, `ethernet`...
    pub kind: String,
    pub mac: Option<String>,
    pub port_forwards: Vec<PortForward>,
    /// `<link state='down'/>`: the guest sees no carrier.
    pub link_down: bool,
    /// The element exactly as libvirt wrote it (a detach or an update sends it back: libvirt
    /// finds the interface by the MAC address it may have chosen), and where its `<link>` is.
    pub xml: String,
    link_range: Option<std::ops::Range<usize>>,
}

impl LiveInterface {
    /// The interface as libvirt has it, with its link up or down: what libvirt's update takes.
    pub(crate) fn with_link(&self, down: bool) -> String {
        let link = format!("<link state='{}'/>", if down { "down" } else { "up" });
        match &self.link_range {
            Some(range) => format!(
                "{}{link}{}",
                &self.xml[..range.start],
                &self.xml[range.end..]
            ),
            None => {
                let end = self.xml.rfind("</interface>").unwrap_or(self.xml.len());
                format!("{}{link}{}", &self.xml[..end], &self.xml[end..])
            }
        }
    }

    /// The spec interface this one was made from, if it carries vmlauncher's user alias.
    pub(crate) fn name(&self) -> Option<&str> {
        self.alias.as_deref()?.strip_prefix(USER_ALIAS_PREFIX)
    }

    /// QEMU's id of the interface's backend: libvirt names it `host<alias>`.
    pub(crate) fn netdev_id(&self) -> Option<String> {
        self.alias.as_ref().map(|a| format!("host{a}"))
    }
}

/// The `<interface>` elements of a live domain XML, in document order.
pub(crate) fn live_interfaces(xml: &str) -> Result<Vec<LiveInterface>, LiveXmlError> {
    let doc = roxmltree::Document::parse(xml).map_err(LiveXmlError::Malformed)?;
    live_interfaces_in(&doc)
}

/// [`live_interfaces`] of a document already parsed.
pub(crate) fn live_interfaces_in(
    doc: &roxmltree::Document<'_>,
) -> Result<Vec<LiveInterface>, LiveXmlError> {
    devices_in(doc, "interface", |index, iface| {
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
        let link = child(iface, "link");
        let start = iface.range().start;
        Ok(LiveInterface {
            link_down: link.is_some_and(|l| l.attribute("state") == Some("down")),
            link_range: link.map(|l| l.range().start - start..l.range().end - start),
            xml: iface.document().input_text()[iface.range()].to_string(),
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn reads_the_machine_of_a_definition() {
        // As libvirt 9.0 writes a domain defined with `machine='q35'`.
        let xml = "<domain type='qemu'>\n  <name>default_vm</name>\n  <os>\n    <type arch='x86_64' machine='pc-q35-7.2'>hvm</type>\n    <kernel>/k</kernel>\n  </os>\n</domain>";
        assert_eq!(definition_machine(xml).as_deref(), Some("pc-q35-7.2"));
        assert_eq!(
            definition_machine("<domain><os><type>hvm</type></os></domain>"),
            None
        );
        assert_eq!(definition_machine("<domain/>"), None);
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
