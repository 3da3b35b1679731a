//! The source's domain XML made the target's: its paths moved to the target's dirs, and which of
//! its disks are copied by the migration.

use std::path::Path;

use super::LiveXmlError;

/// `xml` (libvirt's migratable XML) with every path under one of `moves`' source dirs moved
/// under the matching target dir, and without `fdgroup`: descriptors are the source's
/// connection's, and the target's launcher has checked and given the files to QEMU itself.
/// Paths are moved where libvirt writes them, as whole attribute values or element text that
/// start with the dir: `'<dir>/…'` and `><dir>/…`.
pub fn for_target(xml: &str, moves: &[(&Path, &Path)]) -> String {
    let mut moves: Vec<(String, String)> = moves
        .iter()
        .filter(|(from, to)| from != to)
        .map(|(from, to)| (escaped(from), escaped(to)))
        .collect();
    // The longer first: a hotplug dir inside the runtime dir moves as itself.
    moves.sort_by_key(|(from, _)| std::cmp::Reverse(from.len()));
    let mut out = xml.to_owned();
    for (from, to) in &moves {
        for (open, close) in [("'", "'"), ("\"", "\""), (">", "<")] {
            out = move_prefix(&out, open, close, from, to);
        }
    }
    without_attribute(&out, "fdgroup")
}

/// The targets (`sda`) of the writable disks whose image lies under `dir`: what the migration
/// copies. Read-only ones (the cloud-init ISO) are made again by the target from the same spec.
pub fn copied_disks(xml: &str, dir: &Path) -> Result<Vec<String>, LiveXmlError> {
    let doc = roxmltree::Document::parse(xml).map_err(LiveXmlError::Malformed)?;
    let mut targets = Vec::new();
    for disk in doc.descendants().filter(|n| n.has_tag_name("disk")) {
        let child = |tag: &str| disk.children().find(|c| c.has_tag_name(tag));
        if child("readonly").is_some() || child("shareable").is_some() {
            continue;
        }
        let source = child("source").and_then(|s| s.attribute("file").or(s.attribute("dev")));
        let target = child("target").and_then(|t| t.attribute("dev"));
        if let (Some(source), Some(target)) = (source, target) {
            if Path::new(source).starts_with(dir) {
                targets.push(target.to_owned());
            }
        }
    }
    Ok(targets)
}

fn escaped(path: &Path) -> String {
    let text = path.to_string_lossy();
    let text = text.trim_end_matches('/');
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\'' => out.push_str("&apos;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}

/// Replaces `from` by `to` where a value starts with it (right after `open`) and it is a whole
/// path component (followed by `/` or the value's end, `close`).
fn move_prefix(text: &str, open: &str, close: &str, from: &str, to: &str) -> String {
    let needle = format!("{open}{from}");
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(&needle) {
        let after = &rest[at + needle.len()..];
        out.push_str(&rest[..at]);
        if after.starts_with('/') || after.starts_with(close) {
            out.push_str(open);
            out.push_str(to);
        } else {
            out.push_str(&needle);
        }
        rest = after;
    }
    out.push_str(rest);
    out
}

/// `text` without every ` name='…'` (or `"…"`) attribute.
fn without_attribute(text: &str, name: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let needle = format!(" {name}=");
    while let Some(at) = rest.find(&needle) {
        out.push_str(&rest[..at]);
        let value = &rest[at + needle.len()..];
        let Some(quote) = value.chars().next().filter(|q| *q == '\'' || *q == '"') else {
            out.push_str(&needle);
            rest = value;
            continue;
        };
        match value[1..].find(quote) {
            Some(end) => rest = &value[end + 2..],
            None => {
                out.push_str(&rest[at..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const XML: &str = r#"<domain type='qemu'>
  <name>default_vm</name>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/>
      <source file='/run/a/private/overlays/root.qcow2' fdgroup='vml-root'/>
      <backingStore type='file'><source file='/run/a/container-disks/disk_0.img'/></backingStore>
      <target dev='sda' bus='scsi'/>
    </disk>
    <disk type='file' device='disk'>
      <source file='/srv/shared/data.img'/>
      <target dev='sdb' bus='scsi'/>
    </disk>
    <disk type='file' device='cdrom'>
      <source file='/run/a/private/cloud-init/noCloud.iso'/>
      <target dev='sdc' bus='scsi'/>
      <readonly/>
    </disk>
    <disk type='file' device='disk'>
      <source file='/run/ab/private/other.img'/>
      <target dev='sdd' bus='scsi'/>
    </disk>
    <disk type='block' device='disk'>
      <source dev='/hot/a/blk'/>
      <target dev='sde' bus='scsi'/>
    </disk>
    <serial type='file'><source path='/run/a/console.log'/></serial>
    <nvram>/run/a/private/nvram/default_vm_VARS.fd</nvram>
  </devices>
</domain>"#;

    #[test]
    fn paths_under_the_source_dirs_move_and_others_stay() {
        let out = for_target(
            XML,
            &[
                (Path::new("/run/a"), Path::new("/run/b")),
                (Path::new("/hot/a/"), Path::new("/hot/b")),
            ],
        );
        for moved in [
            "'/run/b/private/overlays/root.qcow2'",
            "'/run/b/container-disks/disk_0.img'",
            "'/run/b/private/cloud-init/noCloud.iso'",
            "'/run/b/console.log'",
            ">/run/b/private/nvram/default_vm_VARS.fd<",
            "'/hot/b/blk'",
            // Not under /run/a: a dir whose name only starts the same.
            "'/run/ab/private/other.img'",
            "'/srv/shared/data.img'",
        ] {
            assert!(out.contains(moved), "{moved} missing in\n{out}");
        }
        assert!(!out.contains("/run/a/"), "{out}");
        assert!(!out.contains("fdgroup"), "{out}");
        roxmltree::Document::parse(&out).expect("still XML");
    }

    /// A pinned hot-plugged file (`host::pin`) arrives as the target's volume path: the pin
    /// has the file name the volume has in the hotplug dir. It is never copied.
    #[test]
    fn a_pin_moves_to_the_targets_hotplug_dir() {
        let xml = "<domain><devices><disk type='file' device='disk'>\
            <source file='/run/a/pins/late.img'><seclabel model='dac' relabel='no'/></source>\
            <target dev='sdb' bus='scsi'/></disk></devices></domain>";
        let out = for_target(
            xml,
            &[
                (Path::new("/run/a"), Path::new("/run/b")),
                (Path::new("/hot/a"), Path::new("/hot/b")),
                (Path::new("/run/a/pins"), Path::new("/hot/b")),
            ],
        );
        assert!(out.contains("'/hot/b/late.img'"), "{out}");
        assert!(out.contains("relabel='no'"), "{out}");
        assert!(copied_disks(xml, Path::new("/run/a/private"))
            .unwrap()
            .is_empty());
    }

    #[test]
    fn writable_disks_under_the_private_dir_are_copied() {
        let copied = copied_disks(XML, Path::new("/run/a/private")).unwrap();
        assert_eq!(copied, ["sda"]);
        assert!(copied_disks(XML, Path::new("/elsewhere"))
            .unwrap()
            .is_empty());
    }
}
