//! The qcow2 images the launcher makes itself (empty disks, overlays on a backing image), written
//! natively so that the launcher needs no `qemu-img`. What a foreign image's header may be is
//! `image_check`'s; where each image goes is `volumes`'.

use std::ffi::OsStr;
use std::fs;
use std::io::{self, Write};
use std::path::Path;

use super::image_check::QCOW2_MAGIC;
use super::root_dir::RootDir;
use super::HostError;

const CLUSTER_BITS: u32 = 16;
pub(super) const CLUSTER: u64 = 1 << CLUSTER_BITS;

/// Writes an empty qcow2 (version 3, 64 KiB clusters) of `size` bytes, on top of `backing` when
/// given. Written natively, so that the launcher needs no `qemu-img`: the layout is the one
/// `qemu-img create` makes — header (with the backing format extension and backing name),
/// refcount table, one refcount block, and the L1 table, each in a cluster of its own.
/// Written as `name` in `dir`, `0600` (QEMU's user is given it later, by descriptor).
pub(super) fn create_qcow2(
    dir: &RootDir,
    name: &OsStr,
    size: u64,
    backing: Option<(&Path, &str)>,
) -> Result<fs::File, HostError> {
    let path = dir.path().join(name);
    let create = |source| HostError::Create {
        path: path.clone(),
        source,
    };
    let l2_coverage = CLUSTER * (CLUSTER / 8);
    let l1_entries = size.div_ceil(l2_coverage).max(1);
    let l1_clusters = (l1_entries * 8).div_ceil(CLUSTER);
    let (refcount_table, refcount_block, l1_table) = (CLUSTER, 2 * CLUSTER, 3 * CLUSTER);
    let clusters = 3 + l1_clusters;
    // One refcount block (16-bit entries) counts 32,768 clusters: the metadata of any size up to
    // the spec's 2Pi capacity bound takes 515 (refused, never a panic).
    if clusters >= CLUSTER / 2 {
        return Err(create(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{size} bytes is too large for a qcow2 the launcher writes"),
        )));
    }

    let mut header = Vec::with_capacity(512);
    let backing_name = backing.map(|(p, _)| p.to_string_lossy().into_owned());
    let be32 = |v: u32| v.to_be_bytes();
    let be64 = |v: u64| v.to_be_bytes();
    header.extend_from_slice(QCOW2_MAGIC);
    header.extend_from_slice(&be32(3)); // version
    header.extend_from_slice(&be64(0)); // backing file offset, set below
    header.extend_from_slice(&be32(backing_name.as_ref().map_or(0, |n| n.len() as u32)));
    header.extend_from_slice(&be32(CLUSTER_BITS));
    header.extend_from_slice(&be64(size));
    header.extend_from_slice(&be32(0)); // no encryption
    header.extend_from_slice(&be32(l1_entries as u32));
    header.extend_from_slice(&be64(l1_table));
    header.extend_from_slice(&be64(refcount_table));
    header.extend_from_slice(&be32(1)); // refcount table clusters
    header.extend_from_slice(&be32(0)); // snapshots
    header.extend_from_slice(&be64(0));
    header.extend_from_slice(&be64(0)); // incompatible features
    header.extend_from_slice(&be64(0)); // compatible features
    header.extend_from_slice(&be64(0)); // autoclear features
    header.extend_from_slice(&be32(4)); // refcount order: 16-bit refcounts
    header.extend_from_slice(&be32(104)); // header length
    if let Some((_, format)) = backing {
        // Backing file format extension.
        header.extend_from_slice(&be32(0xE279_2ACA));
        header.extend_from_slice(&be32(format.len() as u32));
        header.extend_from_slice(format.as_bytes());
        header.resize(header.len().next_multiple_of(8), 0);
    }
    header.extend_from_slice(&be32(0)); // end of extensions
    header.extend_from_slice(&be32(0));
    if let Some(name) = &backing_name {
        let offset = header.len() as u64;
        header[8..16].copy_from_slice(&be64(offset));
        header.extend_from_slice(name.as_bytes());
    }
    if header.len() as u64 > CLUSTER {
        return Err(create(io::Error::new(
            io::ErrorKind::InvalidInput,
            "backing file name too long",
        )));
    }

    let mut image = vec![0u8; (clusters * CLUSTER) as usize];
    image[..header.len()].copy_from_slice(&header);
    image[refcount_table as usize..refcount_table as usize + 8]
        .copy_from_slice(&be64(refcount_block));
    for cluster in 0..clusters as usize {
        let at = refcount_block as usize + cluster * 2;
        image[at..at + 2].copy_from_slice(&1u16.to_be_bytes());
    }
    // Written aside and renamed: a half-written image is never used.
    dir.replace_with(name, 0o600, |file| file.write_all(&image).map_err(create))
}

#[cfg(test)]
pub(super) mod tests {
    use std::fs;
    use std::path::PathBuf;
    use std::process::Command;

    use super::*;

    /// A raw `base.img` of `size` bytes in a temp dir, and a qcow2 `overlay` on it there: the
    /// temp dir, the base and the overlay.
    pub(in crate::host) fn overlay_on_a_raw_base(
        overlay: &str,
        size: u64,
    ) -> (tempfile::TempDir, PathBuf, PathBuf) {
        let (dir, base) = crate::testing::temp_path("base.img");
        fs::File::create(&base).unwrap().set_len(size).unwrap();
        let opened = RootDir::open(dir.path()).unwrap();
        create_qcow2(&opened, OsStr::new(overlay), size, Some((&base, "raw"))).unwrap();
        let overlay = dir.path().join(overlay);
        (dir, base, overlay)
    }

    /// QEMU itself opens what `create_qcow2` writes, with the size and backing file we meant.
    #[test]
    fn qemu_reads_our_qcow2_overlay() {
        use std::io::Write;
        let (_dir, base, overlay) = overlay_on_a_raw_base("overlay.qcow2", 7 << 20);
        let mut qemu = Command::new("qemu-system-x86_64")
            .args([
                "-machine",
                "none",
                "-nodefaults",
                "-display",
                "none",
                "-qmp",
                "stdio",
            ])
            .arg("-blockdev")
            .arg(format!(
                "driver=qcow2,node-name=d,file.driver=file,file.filename={}",
                overlay.display()
            ))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        qemu.stdin
            .take()
            .unwrap()
            .write_all(
                br#"{"execute":"qmp_capabilities"}
{"execute":"query-named-block-nodes"}
{"execute":"quit"}
"#,
            )
            .unwrap();
        let out = qemu.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let reply: serde_json::Value = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|v| v["return"].is_array())
            .unwrap_or_else(|| panic!("no block nodes from QEMU: {text}"));
        let node = reply["return"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["node-name"] == "d")
            .unwrap_or_else(|| panic!("{reply}"));
        assert_eq!(node["image"]["format"], "qcow2", "{node}");
        assert_eq!(node["image"]["virtual-size"], 7 << 20, "{node}");
        assert_eq!(
            node["image"]["backing-filename"],
            base.to_string_lossy().as_ref(),
            "{node}"
        );
    }
}
