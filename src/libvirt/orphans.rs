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
    // The file the orphan's drive holds, as QEMU named it when it was opened: the disk's
    // source now may be another path to that image (a pin, `host::pin`, where the orphan was
    // attached by the volume's own path, or the other way round).
    let held = serde_json::from_str(&qmp(serde_json::json!({"execute": "query-block"}))?)
        .ok()
        .and_then(|reply| drive_file(&reply, id));
    qmp(serde_json::json!({"execute": "device_del", "arguments": {"id": id}}))?;
    let images: Vec<String> = source_of(disk_xml).into_iter().chain(held).collect();
    if images.is_empty() {
        return Ok(());
    }
    let nodes: serde_json::Value = serde_json::from_str(&qmp(
        serde_json::json!({"execute": "query-named-block-nodes", "arguments": {"flat": true}}),
    )?)
    .unwrap_or_default();
    let on_image: Vec<(String, bool)> = nodes["return"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| {
            n["file"]
                .as_str()
                .is_some_and(|f| images.iter().any(|i| i == f))
        })
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

/// The file the drive of device `id` has open, from QMP's `query-block` reply (`qdev` is the
/// device's id or its QOM path, `/machine/peripheral/<id>`).
fn drive_file(reply: &serde_json::Value, id: &str) -> Option<String> {
    let suffix = format!("/{id}");
    reply["return"].as_array()?.iter().find(|d| {
        d["qdev"]
            .as_str()
            .is_some_and(|q| q == id || q.ends_with(&suffix))
    })?["inserted"]["file"]
        .as_str()
        .map(str::to_string)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The orphan's file is found by its device, whatever path the disk's XML gives now.
    #[test]
    fn the_file_an_orphans_drive_holds_is_found_by_its_device() {
        let reply = serde_json::json!({"return": [
            {"device": "", "qdev": "/machine/peripheral/ua-other", "inserted": {"file": "/x.img"}},
            {"device": "", "qdev": "/machine/peripheral/ua-left", "inserted": {"file": "/hot/left.img"}},
            {"device": "", "qdev": "ua-empty"},
        ]});
        assert_eq!(
            drive_file(&reply, "ua-left").as_deref(),
            Some("/hot/left.img")
        );
        assert_eq!(drive_file(&reply, "ua-empty"), None);
        assert_eq!(drive_file(&reply, "ua-gone"), None);
        assert_eq!(drive_file(&serde_json::json!({}), "ua-left"), None);
    }
}
