//! Disks refused for what the host or the launcher's setup found, not for the spec's text: the
//! spec is valid, but this launcher cannot give that disk to QEMU safely or at all.

use crate::spec::{DiskKind, FieldError, Problem, Volume};
use crate::volumes::{Preparation, ResolvedVolume};

use super::ConvertOptions;

/// The problem with disk `i` (of `kind`, on `volume`, found at `resolved`), if it is refused.
pub(super) fn disk(
    i: usize,
    kind: DiskKind,
    volume: &Volume,
    resolved: &ResolvedVolume,
    opts: &ConvertOptions,
) -> Option<FieldError> {
    if kind == DiskKind::Lun && !resolved.block {
        return Some(FieldError::new(
            format!("spec.domain.devices.disks[{i}].lun"),
            Problem::NotABlockDevice {
                volume: volume.name.clone(),
                path: resolved.path.display().to_string(),
            },
        ));
    }
    // A claim's directory is written by a tenant or the node daemon: its image goes to QEMU
    // only as the inode the launcher opened and checked, by a descriptor or a pin in QEMU's
    // mount namespace. Through a libvirt the launcher does not run it can do neither for every
    // path a claim takes (a hot-plug and a migration target need a pin, and the launcher knows
    // neither that libvirt's QEMU namespace nor its pid files; a remote one takes no
    // descriptor), and by path that libvirt would open, and chown, whatever link was put there.
    match &opts.claims_refused_by {
        Some(uri) if resolved.preparation == Preparation::Claim => Some(FieldError::new(
            format!("spec.domain.devices.disks[{i}]"),
            Problem::ClaimUnderConnect {
                volume: volume.name.clone(),
                uri: uri.clone(),
            },
        )),
        _ => None,
    }
}
