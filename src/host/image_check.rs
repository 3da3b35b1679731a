//! What an image we did not make may be before QEMU opens it. QEMU runs as
//! root without MAC confinement, so a qcow2 header inside a disk is a pointer to any host file:
//! a backing file (`/etc/shadow`), an external data file (`/dev/sda`). A claim's image is the
//! guest's own bytes, so it is always read as `raw`, never sniffed; a container disk's image is
//! the image author's, so it may be qcow2, but only a self-contained one, as CDI's validation
//! requires. Pure: it reads a header the caller read.

/// The largest virtual size accepted from an image: the largest capacity a spec may ask for.
pub(crate) const MAX_VIRTUAL_SIZE: u64 = crate::spec::MAX_CAPACITY;

pub(super) const QCOW2_MAGIC: &[u8; 4] = b"QFI\xfb";
/// Incompatible feature bits QEMU 7.2 knows: dirty, corrupt, external data file, compression
/// type, extended L2 entries. Anything else means a format we cannot vouch for.
const KNOWN_INCOMPATIBLE: u64 = 0b1_1111;
const INCOMPATIBLE_CORRUPT: u64 = 1 << 1;
const INCOMPATIBLE_EXTERNAL_DATA: u64 = 1 << 2;

/// How many bytes of an image [`container_disk_format`] needs.
pub(crate) const HEADER_BYTES: usize = 104;

/// A container disk image's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    Raw,
    Qcow2 { virtual_size: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageProblem {
    #[error("qcow2 with a backing file: a container disk must be self-contained")]
    BackingFile,
    #[error("qcow2 with an external data file: a container disk must be self-contained")]
    ExternalDataFile,
    #[error("qcow2 marked corrupt")]
    Corrupt,
    #[error("qcow2 with unknown incompatible features {bits:#x}")]
    UnknownFeatures { bits: u64 },
    #[error("qcow2 version {version}, only 2 and 3 exist")]
    Version { version: u32 },
    #[error("qcow2 header cut short at {len} bytes")]
    Truncated { len: usize },
    #[error("virtual size {size} bytes, at most {MAX_VIRTUAL_SIZE}")]
    TooLarge { size: u64 },
}

/// The format of a container disk's image from its first [`HEADER_BYTES`] (fewer if the file is
/// shorter): raw, or a qcow2 that refers to no other file.
pub(crate) fn container_disk_format(header: &[u8]) -> Result<Format, ImageProblem> {
    if header.len() < 4 || &header[..4] != QCOW2_MAGIC {
        return Ok(Format::Raw);
    }
    let be32 = |at: usize| {
        header
            .get(at..at + 4)
            .map(|b| u32::from_be_bytes(b.try_into().unwrap()))
    };
    let be64 = |at: usize| {
        header
            .get(at..at + 8)
            .map(|b| u64::from_be_bytes(b.try_into().unwrap()))
    };
    let truncated = ImageProblem::Truncated { len: header.len() };
    let version = be32(4).ok_or(truncated.clone())?;
    if !(2..=3).contains(&version) {
        return Err(ImageProblem::Version { version });
    }
    if be64(8).ok_or(truncated.clone())? != 0 {
        return Err(ImageProblem::BackingFile);
    }
    let virtual_size = be64(24).ok_or(truncated.clone())?;
    if version == 3 {
        let incompatible = be64(72).ok_or(truncated)?;
        if incompatible & !KNOWN_INCOMPATIBLE != 0 {
            return Err(ImageProblem::UnknownFeatures {
                bits: incompatible & !KNOWN_INCOMPATIBLE,
            });
        }
        if incompatible & INCOMPATIBLE_EXTERNAL_DATA != 0 {
            return Err(ImageProblem::ExternalDataFile);
        }
        if incompatible & INCOMPATIBLE_CORRUPT != 0 {
            return Err(ImageProblem::Corrupt);
        }
    }
    if virtual_size > MAX_VIRTUAL_SIZE {
        return Err(ImageProblem::TooLarge { size: virtual_size });
    }
    Ok(Format::Qcow2 { virtual_size })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A qcow2 v3 header as the spec lays it out (docs/interop/qcow2.txt): magic, version,
    /// backing file offset (8), backing name size (16), cluster bits (20), size (24), ...,
    /// incompatible features (72).
    fn qcow2(version: u32, backing_offset: u64, size: u64, incompatible: u64) -> Vec<u8> {
        let mut h = vec![0u8; HEADER_BYTES];
        h[..4].copy_from_slice(b"QFI\xfb");
        h[4..8].copy_from_slice(&version.to_be_bytes());
        h[8..16].copy_from_slice(&backing_offset.to_be_bytes());
        h[20..24].copy_from_slice(&16u32.to_be_bytes());
        h[24..32].copy_from_slice(&size.to_be_bytes());
        h[72..80].copy_from_slice(&incompatible.to_be_bytes());
        h
    }

    #[test]
    fn anything_without_the_magic_is_raw() {
        assert_eq!(container_disk_format(b""), Ok(Format::Raw));
        assert_eq!(container_disk_format(&[0u8; 512]), Ok(Format::Raw));
        assert_eq!(container_disk_format(b"QFI"), Ok(Format::Raw));
    }

    #[test]
    fn a_self_contained_qcow2_passes_with_its_size() {
        assert_eq!(
            container_disk_format(&qcow2(3, 0, 1 << 30, 0)),
            Ok(Format::Qcow2 {
                virtual_size: 1 << 30
            })
        );
        // Dirty (bit 0), compression type (3) and extended L2 (4) change nothing we care about.
        assert!(container_disk_format(&qcow2(3, 0, 1 << 30, 0b1_1001)).is_ok());
        assert!(container_disk_format(&qcow2(2, 0, 1 << 20, 0)).is_ok());
    }

    #[test]
    fn references_to_other_files_are_refused() {
        assert_eq!(
            container_disk_format(&qcow2(3, 0x200, 1 << 30, 0)),
            Err(ImageProblem::BackingFile)
        );
        assert_eq!(
            container_disk_format(&qcow2(2, 0x200, 1 << 30, 0)),
            Err(ImageProblem::BackingFile)
        );
        assert_eq!(
            container_disk_format(&qcow2(3, 0, 1 << 30, 1 << 2)),
            Err(ImageProblem::ExternalDataFile)
        );
    }

    #[test]
    fn odd_headers_are_refused() {
        assert_eq!(
            container_disk_format(&qcow2(3, 0, 1 << 30, 1 << 5)),
            Err(ImageProblem::UnknownFeatures { bits: 1 << 5 })
        );
        assert_eq!(
            container_disk_format(&qcow2(3, 0, 1 << 30, 1 << 1)),
            Err(ImageProblem::Corrupt)
        );
        assert_eq!(
            container_disk_format(&qcow2(4, 0, 1 << 30, 0)),
            Err(ImageProblem::Version { version: 4 })
        );
        assert_eq!(
            container_disk_format(&qcow2(3, 0, 1 << 30, 0)[..40]),
            Err(ImageProblem::Truncated { len: 40 })
        );
        assert_eq!(
            container_disk_format(&qcow2(3, 0, 1 << 57, 0)),
            Err(ImageProblem::TooLarge { size: 1 << 57 })
        );
    }
}
