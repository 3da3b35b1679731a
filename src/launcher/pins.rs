//! The images this launcher pins for QEMU (`host::pin`), as a part of the launcher: built once
//! from the pin dir, and the one place pins are made, listed and removed. A pin made for a
//! start or a hot-plug is held by a [`PinGuard`] until the step that gives it to QEMU
//! (define-and-start, attach) has worked: every other way out of that step — an error returned
//! with `?`, a failed attach, a panic, a task dropped part-way — drops the guard, which removes
//! exactly the pins it made (an image's and its backing's), so that none is left behind for a
//! disk QEMU never got.
//!
//! Locks: none. The file system is the state (a restarted launcher finds the pins again by
//! name), and pins are made and removed only with the task slot held (a start, a Sync, a
//! migration's preparation), or with the launcher ending (`keep_only` at the end).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::domain::DiskDef;
use crate::host::pin::{PinError, Pins};
use crate::host::HostError;

/// Where this launcher pins images, if it does (else disks go to QEMU by path).
#[derive(Debug)]
pub(super) struct ImagePins {
    pins: Option<Pins>,
}

impl ImagePins {
    pub(super) fn new(pin_dir: Option<&Path>) -> ImagePins {
        ImagePins {
            pins: pin_dir.map(Pins::in_dir),
        }
    }

    /// The pins' directory, if the launcher pins (a migration moves it to the target's
    /// hotplug dir).
    pub(super) fn dir(&self) -> Option<&Path> {
        self.pins.as_ref().map(Pins::dir)
    }

    /// The pins there are, by pin name (see [`Pins::list`]).
    pub(super) fn list(&self) -> BTreeMap<String, PathBuf> {
        self.pins.as_ref().map(Pins::list).unwrap_or_default()
    }

    /// Removes every pin but those of the volumes in `keep`.
    pub(super) fn keep_only(&self, keep: &BTreeSet<String>) {
        if let Some(pins) = &self.pins {
            pins.keep_only(keep);
        }
    }

    /// Removes `volume`'s pins, its image's and its backing's (QEMU has let go of the disk, or
    /// never had it).
    pub(super) fn unpin(&self, volume: &str) {
        let Some(pins) = &self.pins else {
            return;
        };
        for name in [volume.to_owned(), crate::host::pin::backing_name(volume)] {
            if let Err(e) = pins.unpin(&name) {
                tracing::warn!(%volume, pin = %name, error = %e, "cannot remove the volume's pin");
            }
        }
    }

    /// Pins each checked image of `to_pin` at its disk's pin, in the mount namespace of process
    /// `namespace_of` (QEMU's for a hot-plug, libvirtd's before a start). Where the launcher may
    /// not mount (no CAP_SYS_ADMIN or CAP_SYS_CHROOT, or no `open_tree` here), the disk goes to
    /// QEMU by its path, as before pins, with a warning naming the volume: the image was still
    /// checked and given to QEMU's user through its descriptor, and hot-plug keeps working where
    /// it did. Any other failure is the volume's, returned, with none of its pins left. The
    /// pins made are held by the guard returned: kept only if the caller says so.
    pub(super) fn pin_images(
        &self,
        disks: &mut [DiskDef],
        to_pin: Vec<(String, std::fs::File)>,
        namespace_of: Option<i32>,
    ) -> (PinGuard, Vec<(String, HostError)>) {
        let mut guard = PinGuard {
            pins: self.pins.clone(),
            made: Vec::new(),
        };
        let mut failed: Vec<(String, HostError)> = Vec::new();
        let Some(pins) = &self.pins else {
            return (guard, failed);
        };
        for (name, file) in to_pin {
            // A disk's image, or its overlay's backing (`<volume>.backing`).
            let volume = name.strip_suffix(".backing").unwrap_or(&name).to_owned();
            let Some(pin) = pin_of(disks, &name, &volume) else {
                continue;
            };
            let pinned = match namespace_of {
                Some(pid) => pins.pin(&name, &file, pid),
                None => Err(PinError::NoProcess {
                    path: pins.path(&name),
                }),
            };
            match pinned {
                Ok(path) => {
                    *pin = Some(path);
                    guard.made.push(name);
                }
                Err(PinError::Unavailable { path, source }) => {
                    tracing::warn!(
                        %volume,
                        pin = %path.display(),
                        error = %source,
                        "cannot pin the image (mounting is not available here): QEMU opens it by its path"
                    );
                    *pin = None;
                }
                Err(e) => failed.push((volume, HostError::Pin(e))),
            }
        }
        // A volume that failed keeps none of its pins (its image's, made before its backing's
        // failed, say): it is left out of the start or its attach, whatever the caller keeps.
        for (volume, _) in &failed {
            guard.release_volume(volume);
        }
        (guard, failed)
    }
}

/// The pin field of `disks`' disk for pin name `name` (the volume's image, or its backing).
fn pin_of<'a>(
    disks: &'a mut [DiskDef],
    name: &str,
    volume: &str,
) -> Option<&'a mut Option<PathBuf>> {
    let disk = disks.iter_mut().find(|d| d.volume == volume)?;
    if name == volume {
        Some(&mut disk.pin)
    } else {
        disk.backing.as_mut().map(|b| &mut b.pin)
    }
}

/// Pins made for a step that has not yet given them to QEMU: removed when the guard goes,
/// unless [`PinGuard::keep`] said the step worked.
#[must_use = "dropping the guard removes the pins it holds"]
#[derive(Debug)]
pub(super) struct PinGuard {
    pins: Option<Pins>,
    /// Pin names (a volume, or `<volume>.backing`).
    made: Vec<String>,
}

impl PinGuard {
    /// QEMU has the disks: the pins stay (until the volume's detach, or the launcher's end).
    pub(super) fn keep(mut self) {
        self.made.clear();
    }

    /// Removes the pins of `volume` now.
    fn release_volume(&mut self, volume: &str) {
        let (theirs, others): (Vec<String>, Vec<String>) = std::mem::take(&mut self.made)
            .into_iter()
            .partition(|name| name.strip_suffix(".backing").unwrap_or(name) == volume);
        self.made = others;
        self.remove(&theirs);
    }

    fn remove(&self, names: &[String]) {
        let Some(pins) = &self.pins else {
            return;
        };
        for name in names {
            if let Err(e) = pins.unpin(name) {
                tracing::warn!(pin = %name, error = %e, "cannot remove a pin its step did not use");
            }
        }
    }
}

impl Drop for PinGuard {
    fn drop(&mut self) {
        let made = std::mem::take(&mut self.made);
        self.remove(&made);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A guard holding the pins `names`, each made as its placeholder file (what a pin is on
    /// disk in the launcher's namespace; the bind mount itself needs root and is
    /// `host::pin`'s test).
    fn holding(dir: &Path, names: &[&str]) -> PinGuard {
        let pins = Pins::in_dir(dir);
        for name in names {
            std::fs::write(pins.path(name), b"").unwrap();
        }
        PinGuard {
            pins: Some(pins),
            made: names.iter().map(|n| n.to_string()).collect(),
        }
    }

    fn pinned(dir: &Path) -> Vec<String> {
        Pins::in_dir(dir).list().into_keys().collect()
    }

    /// An attach that fails after pinning returns early with `?`: the guard removes its pins,
    /// the image's and the backing's, and leaves another volume's alone.
    #[test]
    fn an_early_return_removes_the_pins_it_made() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(Pins::in_dir(dir.path()).path("other"), b"").unwrap();
        fn attach(guard: PinGuard, libvirt: Result<(), &'static str>) -> Result<(), &'static str> {
            libvirt?;
            guard.keep();
            Ok(())
        }
        let guard = holding(dir.path(), &["data", "data.backing"]);
        assert_eq!(pinned(dir.path()), ["data", "data.backing", "other"]);
        assert_eq!(attach(guard, Err("attach failed")), Err("attach failed"));
        assert_eq!(pinned(dir.path()), ["other"]);
    }

    #[test]
    fn kept_pins_stay() {
        let dir = tempfile::tempdir().unwrap();
        let guard = holding(dir.path(), &["data"]);
        guard.keep();
        assert_eq!(pinned(dir.path()), ["data"]);
    }

    /// A panic between pinning and the attach unwinds through the guard.
    #[test]
    fn a_panic_removes_the_pins() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_owned();
        let result = std::panic::catch_unwind(move || {
            let _guard = holding(&path, &["data"]);
            panic!("the attach panicked");
        });
        assert!(result.is_err());
        assert!(pinned(dir.path()).is_empty());
    }

    /// A volume whose backing could not be pinned keeps none of its pins; another volume's
    /// stay with the guard.
    #[test]
    fn a_failed_volume_keeps_none_of_its_pins() {
        let dir = tempfile::tempdir().unwrap();
        let mut guard = holding(dir.path(), &["data", "logs"]);
        guard.release_volume("data");
        assert_eq!(pinned(dir.path()), ["logs"]);
        assert_eq!(guard.made, ["logs"]);
        guard.keep();
        assert_eq!(pinned(dir.path()), ["logs"]);
    }
}
