//! The bodies of the fuzz targets (`fuzz/`): every input that comes from outside the launcher,
//! from bytes. They live here so that the harnesses see one small API whatever the modules
//! become, and so that a plain `cargo test` replays the committed corpus (`fuzz/corpus/`) on the
//! pinned toolchain; `cargo +nightly fuzz run <target>` explores from it.

use std::path::Path;

use crate::convert::{self, ConvertOptions};
use crate::domain::{self, VirtType};
use crate::host::records::Records;
use crate::spec;

/// A spec from any bytes: read, validate and, when valid, convert; what converts must be
/// well-formed XML (libvirt would refuse anything else, after the launcher said the spec is fine).
pub fn spec(data: &[u8]) {
    let Ok(vmi) = spec::parse_bytes(data) else {
        return;
    };
    let options = ConvertOptions::new(VirtType::Qemu, "/run/vmlauncher/console.log".into());
    if let Ok(def) = convert::convert(&vmi, &options) {
        let xml = def.to_xml();
        if let Err(e) = roxmltree::Document::parse(&xml) {
            panic!("a valid spec converted to malformed XML: {e}\n{xml}");
        }
    }
}

/// libvirt's live domain XML from any bytes: the disk parser Sync diffs against.
pub fn live_xml(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = domain::live_disks(text);
    }
}

/// The hotplug records file from any bytes: whatever vetting keeps is inside the hotplug dir.
pub fn records(data: &[u8]) {
    let Ok(records) = Records::parse(data) else {
        return;
    };
    let hotplug_dir = Path::new("/run/vmlauncher/hotplug");
    let (kept, _) = records.vetted(hotplug_dir, |c| {
        c.path().starts_with("/sys/fs/cgroup/devices/")
    });
    for (volume, node) in &kept.nodes {
        assert_eq!(
            node.path.parent(),
            Some(hotplug_dir),
            "kept a node for {volume:?} outside the hotplug dir"
        );
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    fn corpus(target: &str) -> Vec<PathBuf> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fuzz/corpus")
            .join(target);
        let files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .collect();
        assert!(!files.is_empty(), "no corpus in {}", dir.display());
        files
    }

    use super::*;

    #[test]
    fn the_spec_corpus_replays() {
        for file in corpus("spec") {
            spec(&std::fs::read(&file).unwrap());
        }
    }

    #[test]
    fn the_live_xml_corpus_replays() {
        for file in corpus("live_xml") {
            live_xml(&std::fs::read(&file).unwrap());
        }
    }

    #[test]
    fn the_records_corpus_replays() {
        for file in corpus("records") {
            records(&std::fs::read(&file).unwrap());
        }
    }
}
