//! The bodies of the fuzz targets (`fuzz/`): every input that comes from outside the launcher,
//! from bytes. They live here so that the harnesses see one small API whatever the modules
//! become, and so that a plain `cargo test` replays the committed corpus (`fuzz/corpus/`) on the
//! pinned toolchain; `cargo +nightly fuzz run <target>` explores from it.

use std::path::Path;

use crate::authority::{self, Rewriter};
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

/// A client's side of an API connection from any bytes, through the `:authority` rewriter: the
/// first byte chooses how the rest is cut into reads (0: whole; n: n bytes at a time, so that
/// frame boundaries fall anywhere). Nothing panics, the output never outgrows the input by more
/// than one header list at the server's limit per block, and when the connection is rewritten,
/// every header block the server gets decodes with the server's one HPACK decoder and carries
/// only authorities the server accepts.
pub fn authority(data: &[u8]) {
    let Some((&chunk, stream)) = data.split_first() else {
        return;
    };
    let chunk = if chunk == 0 {
        stream.len().max(1)
    } else {
        chunk as usize
    };
    let mut rewriter = Rewriter::default();
    let mut out = Vec::new();
    let (mut taken_all, mut blocks) = (0, 0);
    'reads: for read in stream.chunks(chunk) {
        let mut rest = read;
        while !rest.is_empty() {
            let Ok((taken, decoded)) = rewriter.feed_some(rest, &mut out) else {
                break 'reads;
            };
            assert!(
                taken > 0 && taken <= rest.len(),
                "took {taken} of {}",
                rest.len()
            );
            taken_all += taken;
            blocks += usize::from(decoded);
            // Bytes pass through one for one; a decoded block goes on as the client's own
            // (bytes it sent) or re-encoded, no larger than its list, plus frame headers.
            let bound = taken_all + blocks * (authority::MAX_HEADER_LIST + 64);
            assert!(
                out.len() <= bound,
                "{taken_all} bytes in, {blocks} blocks, {} out",
                out.len()
            );
            rest = &rest[taken..];
        }
    }
    if !rewriter.passes_through() {
        // The server's one decoder for the connection, as our encoder's peer.
        let mut decoder = loona_hpack::Decoder::new();
        for block in authority::header_blocks(&out) {
            let headers = decoder
                .decode(&block)
                .unwrap_or_else(|e| panic!("a rewritten block does not decode: {e:?}"));
            for (name, value) in headers {
                if name == b":authority" {
                    assert!(
                        http::uri::Authority::try_from(&value[..]).is_ok(),
                        "the server gets the authority {:?}",
                        String::from_utf8_lossy(&value)
                    );
                }
            }
        }
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
    fn the_authority_corpus_replays() {
        for file in corpus("authority") {
            authority(&std::fs::read(&file).unwrap());
        }
    }

    #[test]
    fn the_records_corpus_replays() {
        for file in corpus("records") {
            records(&std::fs::read(&file).unwrap());
        }
    }
}
