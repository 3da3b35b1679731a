//! Devices a killed libvirtd left in QEMU: found by the duplicate id an attach meets, and
//! removed (the device, then its block nodes) so that the attach can be made again.

use virt::domain::Domain;

/// How long a device a killed libvirtd left in QEMU may take to leave once asked to.
const ORPHAN_REMOVAL_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The device id QEMU refused as a duplicate on attaching `disk_xml`, when it is that disk's own
/// alias (`ua-<volume>`): a device only a killed libvirtd can have left.
pub(super) fn orphan_device(e: &virt::error::Error, disk_xml: &str) -> Option<String> {
    let message = e.message();
    let id = message
        .split("Duplicate device ID '")
        .nth(1)?
        .split('\'')
        .next()?;
    let ours = id.starts_with(crate::domain::USER_ALIAS_PREFIX)
        && (disk_xml.contains(&format!("<alias name=\"{id}\"/>"))
            || disk_xml.contains(&format!("<alias name='{id}'/>")));
    ours.then(|| id.to_string())
}

/// Removes the device `id` a killed libvirtd left in QEMU, then the block nodes it left on the
/// disk's image (format nodes first, then the file's), which hold the image's write lock.
pub(super) fn remove_orphan(
    dom: &Domain,
    id: &str,
    disk_xml: &str,
) -> Result<(), virt::error::Error> {
    let qmp = |command: serde_json::Value| dom.qemu_monitor_command(&command.to_string(), 0);
    qmp(serde_json::json!({"execute": "device_del", "arguments": {"id": id}}))?;
    let Some(image) = source_of(disk_xml) else {
        return Ok(());
    };
    let nodes: serde_json::Value = serde_json::from_str(&qmp(
        serde_json::json!({"execute": "query-named-block-nodes", "arguments": {"flat": true}}),
    )?)
    .unwrap_or_default();
    let on_image: Vec<(String, bool)> = nodes["return"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| n["file"].as_str() == Some(image.as_str()))
        .filter_map(|n| {
            let name = n["node-name"].as_str()?.to_string();
            let protocol = matches!(n["drv"].as_str(), Some("file" | "host_device"));
            Some((name, protocol))
        })
        .collect();
    // The device leaves QEMU a moment after device_del (its DEVICE_DELETED, which libvirt does
    // not pass on for a device it does not know), and its nodes stay "in use" until then: each
    // is asked again until it goes, within a bound. Formats first, over their files.
    let deadline = std::time::Instant::now() + ORPHAN_REMOVAL_WAIT;
    for protocol in [false, true] {
        for (node, _) in on_image.iter().filter(|(_, p)| *p == protocol) {
            loop {
                let reply = qmp(
                    serde_json::json!({"execute": "blockdev-del", "arguments": {"node-name": node}}),
                )?;
                if !reply.contains("\"error\"") {
                    break;
                }
                if !reply.contains("in use") || std::time::Instant::now() >= deadline {
                    tracing::warn!(%node, %reply, "cannot remove a block node a killed libvirtd left in QEMU");
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    }
    Ok(())
}

/// The image path a disk's XML names (`<source file=...>` or `<source dev=...>`).
fn source_of(disk_xml: &str) -> Option<String> {
    let doc = roxmltree::Document::parse(disk_xml).ok()?;
    let source = doc.descendants().find(|n| n.has_tag_name("source"))?;
    source
        .attribute("file")
        .or_else(|| source.attribute("dev"))
        .map(str::to_string)
}
