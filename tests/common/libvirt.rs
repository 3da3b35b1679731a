//! libvirt on the test's side: a private libvirtd of its own, the live XML, and libvirt as the
//! judge of a domain XML.

use std::path::Path;

use super::succeeded;

/// The live XML of `domain`, straight from libvirt at `uri`.
pub fn live_xml(uri: &str, domain: &str) -> String {
    let conn = virt::connect::Connect::open(Some(uri)).expect("connect to the private libvirtd");
    let dom = conn.lookup_domain_by_name(domain).expect("domain exists");
    without_agent_state(&dom.xml_desc(0).expect("live XML"))
}

/// The live XML without the guest agent channel's `state`: the agent connects when the guest
/// gets to it, on its own, which is no change made to the domain (tests compare the XML before
/// and after a refused request).
pub fn without_agent_state(xml: &str) -> String {
    xml.replace(
        "name='org.qemu.guest_agent.0' state='connected'",
        "name='org.qemu.guest_agent.0'",
    )
    .replace(
        "name='org.qemu.guest_agent.0' state='disconnected'",
        "name='org.qemu.guest_agent.0'",
    )
}

/// A private libvirtd of the test's own under `dir/libvirt`, leaving QEMU's cgroups alone.
pub fn private_libvirtd(dir: &Path) -> vmlauncher::libvirt::daemon::PrivateDaemon {
    use vmlauncher::libvirt::daemon::{DaemonOptions, PrivateDaemon};
    PrivateDaemon::start(
        &dir.join("libvirt"),
        DaemonOptions {
            pod_cgroups: true,
            ..Default::default()
        },
    )
    .expect("a private libvirtd")
}

/// libvirt as the judge of an XML: `virt-xml-validate`, then `defineXML` (and undefine) on a
/// private libvirtd of its own.
pub struct LibvirtJudge {
    state: tempfile::TempDir,
    _daemon: vmlauncher::libvirt::daemon::PrivateDaemon,
    pub hv: vmlauncher::libvirt::Hypervisor,
}

impl LibvirtJudge {
    pub fn start() -> LibvirtJudge {
        let state = tempfile::tempdir().unwrap();
        let daemon = private_libvirtd(state.path());
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let hv = vmlauncher::libvirt::Hypervisor::open(daemon.uri(), tx).expect("connect to it");
        LibvirtJudge {
            state,
            _daemon: daemon,
            hv,
        }
    }

    /// Panics, naming `what`, if libvirt rejects the domain XML.
    pub fn accept(&self, what: &str, name: &str, xml: &str) {
        let file = self.state.path().join("domain.xml");
        std::fs::write(&file, xml).unwrap();
        let out = std::process::Command::new("virt-xml-validate")
            .arg(&file)
            .arg("domain")
            .output()
            .unwrap();
        succeeded(out, format_args!("{what}: virt-xml-validate"));
        self.hv.define_and_undefine(name, xml).unwrap_or_else(|e| {
            panic!(
                "{what}: libvirt refused it: {}\n{xml}",
                vmlauncher::error_chain(&e)
            )
        });
    }
}

/// The `<source file>` of the live disk of `volume`.
pub fn live_disk_source(live: &str, volume: &str) -> Option<String> {
    live_source_of(live, volume, false)
}

/// The `<source file>` of the backing of `volume`'s overlay in the live XML.
pub fn live_backing_source(live: &str, volume: &str) -> Option<String> {
    live_source_of(live, volume, true)
}

fn live_source_of(live: &str, volume: &str, backing: bool) -> Option<String> {
    let doc = roxmltree::Document::parse(live).unwrap();
    let alias = format!("ua-{volume}");
    let disk = doc.descendants().find(|n| {
        n.has_tag_name("disk")
            && n.children()
                .any(|c| c.has_tag_name("alias") && c.attribute("name") == Some(alias.as_str()))
    })?;
    let holder = if backing {
        disk.children().find(|c| c.has_tag_name("backingStore"))?
    } else {
        disk
    };
    holder
        .children()
        .find(|c| c.has_tag_name("source"))?
        .attribute("file")
        .map(str::to_string)
}

/// The PCIe root ports of a domain's XML that nothing is plugged into (no PCI address names their
/// bus): the room left for devices plugged later.
pub fn empty_root_ports(xml: &str) -> usize {
    let doc = roxmltree::Document::parse(xml).unwrap();
    let bus = |text: &str| u32::from_str_radix(text.trim_start_matches("0x"), 16).unwrap();
    let used: Vec<u32> = doc
        .descendants()
        .filter(|n| n.has_tag_name("address") && n.attribute("type") == Some("pci"))
        .filter_map(|n| n.attribute("bus").map(bus))
        .collect();
    doc.descendants()
        .filter(|n| n.has_tag_name("controller") && n.attribute("model") == Some("pcie-root-port"))
        .filter(|n| !used.contains(&n.attribute("index").unwrap().parse().unwrap()))
        .count()
}
