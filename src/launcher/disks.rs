//! The host side of a domain's disks before QEMU gets them: images checked, what the launcher
//! owns made (`DiskOrCreate` images, empty disks, overlays, cloud-init ISOs), files given to
//! QEMU's user or passed by descriptor. A start, a Sync's attach and a migration target's
//! preparation all come through here.

use std::collections::BTreeSet;

use super::coordinator::Launcher;
use super::error::LauncherError;
use super::types::VolumePhase;
use crate::convert::{self, ConvertOptions};
use crate::domain::DiskDef;
use crate::host::{self, HostError};
use crate::spec::VirtualMachineInstance;

impl Launcher {
    /// The definition of the domain from the current spec, with its host side ready: images
    /// made and checked, given to QEMU's user. Hot-plugged volumes that wait for their source,
    /// failed, or are not ready now are left out (`not_ready`, with why). Without `fd_groups`
    /// (a migration target: descriptors cannot travel with libvirt's migration), images are
    /// given to QEMU's user instead of passed by descriptor.
    pub(super) async fn ready_definition(&self, fd_groups: bool) -> Result<Ready, LauncherError> {
        // Before the state lock: `block` is a leaf, never taken under `state`.
        let opts = self.convert_options();
        let (vmi, mut def, waiting) = {
            let s = self.state.lock().expect("state lock");
            let def = convert::convert(&s.spec, &opts)?;
            // Hot-plugged volumes that wait for their source or failed to attach.
            let waiting: BTreeSet<String> = s
                .volumes
                .iter()
                .filter(|(_, v)| matches!(v.phase, VolumePhase::Pending | VolumePhase::Failed))
                .map(|(name, _)| name.clone())
                .collect();
            (s.spec.clone(), def, waiting)
        };
        // Where the spec's host paths lead is looked at again at every start, not only when
        // the spec was taken: links may have changed since.
        self.options.host_paths.check(&vmi)?;
        // The copy made while libvirtd started, if it is of what this start boots.
        let staged = self.staged_boot.lock().expect("staged boot lock").take();
        if let Some((_, copied)) =
            staged.filter(|(asked, _)| Some(asked) == def.kernel_boot.as_ref())
        {
            def.kernel_boot = Some(copied);
        } else if let Some(kb) = def.kernel_boot.as_mut() {
            self.copy_kernel_boot(kb, &opts).await?;
        }
        // A hot-plugged volume never keeps the VM from (re)starting: one that waits
        // or failed, or whose source is not ready now, is left out of the definition and keeps
        // (or gets) its Pending or Failed status; a later Sync, or its source appearing,
        // attaches it.
        let hotpluggable = |volume: &str| {
            vmi.spec
                .volumes
                .iter()
                .any(|v| v.name == volume && crate::volumes::is_hotpluggable(v))
        };
        let (hot, boot): (Vec<DiskDef>, Vec<DiskDef>) = std::mem::take(&mut def.disks)
            .into_iter()
            .partition(|d| hotpluggable(&d.volume));
        // A migration target made its block volumes' nodes itself (`prepare_incoming`): they
        // are checked as the block devices they are. A start attaches held ones by Sync.
        let opts = if fd_groups {
            self.options.convert.clone()
        } else {
            opts
        };
        let qemu = self.options.hotplug.node_owner;
        let (vmi_, boot_, opts_) = (vmi.clone(), boot.clone(), opts.clone());
        tokio::task::spawn_blocking(move || prepare_disks(&vmi_, &boot_, &opts_, qemu))
            .await
            .map_err(LauncherError::Join)?
            .map_err(|e| e.named(&vmi))?;
        def.disks = boot;
        let (ready, mut not_ready) = prepare_hot_disks(&vmi, hot, &waiting, &opts, qemu).await?;
        def.disks.extend(ready);
        if !fd_groups {
            without_descriptors(&mut def.disks);
        }
        let (mut disks, owner) = (
            std::mem::take(&mut def.disks),
            self.options.hotplug.node_owner,
        );
        let (disks, opened) = tokio::task::spawn_blocking(move || {
            let opened = host::open_for_qemu(&mut disks, owner);
            (disks, opened)
        })
        .await
        .map_err(LauncherError::Join)?;
        def.disks = disks;
        let opened =
            opened.map_err(|(volume, source)| DiskNotReady { volume, source }.named(&vmi))?;
        // QEMU's mount namespace is made from libvirtd's as QEMU starts: a pin made there
        // now is in QEMU's. Pins of volumes this start leaves out go first.
        let pinned: BTreeSet<String> = opened
            .to_pin
            .iter()
            .map(|(name, _)| name.strip_suffix(".backing").unwrap_or(name).to_owned())
            .collect();
        let namespace_of = self.link.connector().daemon_pid();
        let (pins, failed) = super::blocking::host_work(|| {
            self.pins.keep_only(&pinned);
            self.pins
                .pin_images(&mut def.disks, opened.to_pin, namespace_of)
        });
        for (volume, source) in failed {
            // Only hot-plugged files are pinned, and they never keep the VM from starting.
            if let Some(at) = def.disks.iter().position(|d| d.volume == volume) {
                not_ready.push((def.disks.remove(at), source));
            }
        }
        Ok(Ready {
            def,
            fds: opened.fds,
            not_ready,
            pins,
        })
    }

    /// The kernel and initrd copied where QEMU may read them (`copy_boot_files`), `kb` pointed
    /// at the copies.
    async fn copy_kernel_boot(
        &self,
        kb: &mut crate::domain::KernelBootDef,
        opts: &ConvertOptions,
    ) -> Result<(), LauncherError> {
        let (mut kb_, private_dir) = (kb.clone(), opts.paths.private_dir.clone());
        let owner = self.options.hotplug.node_owner;
        tokio::task::spawn_blocking(move || {
            copy_boot_files(&mut kb_, &private_dir, owner).map(|()| kb_)
        })
        .await
        .map_err(LauncherError::Join)?
        .map(|copied| *kb = copied)
    }
}

/// The host side of each hot-plugged disk made ready, one by one: those ready, and those not
/// (with why). Disks in `waiting` (Pending or Failed) are left out of both.
async fn prepare_hot_disks(
    vmi: &crate::spec::Validated,
    hot: Vec<DiskDef>,
    waiting: &BTreeSet<String>,
    opts: &ConvertOptions,
    qemu: host::NodeOwner,
) -> Result<(Vec<DiskDef>, Vec<(DiskDef, HostError)>), LauncherError> {
    let (mut ready, mut not_ready) = (Vec::new(), Vec::new());
    for disk in hot {
        if waiting.contains(&disk.volume) {
            continue;
        }
        let opts = opts.clone();
        let (vmi_, disk_) = (vmi.clone(), disk.clone());
        match tokio::task::spawn_blocking(move || {
            prepare_disks(&vmi_, std::slice::from_ref(&disk_), &opts, qemu)
        })
        .await
        .map_err(LauncherError::Join)?
        {
            Ok(()) => ready.push(disk),
            Err(DiskNotReady { source, .. }) => not_ready.push((disk, source)),
        }
    }
    Ok((ready, not_ready))
}

/// Disks for a migration target, whose descriptors cannot travel with libvirt's migration.
fn without_descriptors(disks: &mut [DiskDef]) {
    for disk in disks {
        // A claim, then, is given to QEMU's user and pinned (its `pin`, from convert), as
        // a hot-plugged file is. The domain arrives with a QEMU libvirt starts for the
        // migration, whose mount namespace is copied from libvirtd's then: pinned there
        // now, the checked inode is what it opens (the source names the pins in the
        // domain it sends, from the plan).
        // A hostDisk is opened by its path, as its owner's mode lets QEMU: its owner
        // stays the host's (`DiskDef::host_file`).
        disk.given_to_qemu |= disk.fd_group.take().is_some() && !disk.host_file;
        if let Some(backing) = disk.backing.as_mut() {
            backing.fd_group = None;
        }
    }
}

/// A volume whose host side could not be made ready (`volume` is empty for the private dirs).
#[derive(Debug)]
pub(super) struct DiskNotReady {
    pub(super) volume: String,
    pub(super) source: HostError,
}

impl DiskNotReady {
    /// The error of a start: a hostDisk's named by its field in `vmi` (the host's own file,
    /// refused or missing), any other by its volume.
    pub(super) fn named(self, vmi: &VirtualMachineInstance) -> LauncherError {
        let host_disk = vmi
            .spec
            .volumes
            .iter()
            .position(|v| v.name == self.volume && v.host_disk.is_some());
        match host_disk {
            Some(i) => LauncherError::HostFile {
                field: format!("spec.volumes[{i}].hostDisk.path"),
                source: self.source,
            },
            None => self.into(),
        }
    }
}

/// A disk to attach to a running domain: libvirt 9.0 cannot pass a descriptor on hot-plug
/// ("Could not dup FD" from QEMU), so a hostDisk that would go by `fd_group` at a start goes by
/// its path, checked, its owner the host's: its mode must let QEMU in
/// (`host_files::qemu_may_open`).
pub(super) fn for_hot_plug(mut disk: DiskDef) -> DiskDef {
    if disk.host_file {
        disk.fd_group = None;
    }
    disk
}

/// The kernel and initrd of `kb` (host paths from the spec) copied into the launcher's own
/// `boot` dir in `private_dir`, given to QEMU's user (`owner`), and `kb` pointed at the copies:
/// libvirt has no descriptor for `<kernel>`/`<initrd>`, and QEMU opening the host's file would
/// need it to be QEMU's. Each opened as the host's own file (`host::host_files`), at every start.
pub(super) fn copy_boot_files(
    kb: &mut crate::domain::KernelBootDef,
    private_dir: &std::path::Path,
    owner: host::NodeOwner,
) -> Result<(), LauncherError> {
    use host::host_files::{boot_dir, copy_boot_file, open_host_file, Kind};
    const FIELD: &str = "spec.domain.firmware.kernelBoot.container";
    let named = |field: &str| {
        let field = format!("{FIELD}.{field}");
        move |source| LauncherError::HostFile { field, source }
    };
    let dir = boot_dir(private_dir).map_err(named("kernelPath"))?;
    let kernel = open_host_file(&kb.kernel, Kind::Boot).map_err(named("kernelPath"))?;
    let initrd = match &kb.initrd {
        Some(path) => Some(open_host_file(path, Kind::Boot).map_err(named("initrdPath"))?),
        None => None,
    };
    kb.kernel = copy_boot_file(&kernel, &dir, "kernel", owner).map_err(named("kernelPath"))?;
    if let Some(initrd) = initrd {
        let copy = copy_boot_file(&initrd, &dir, "initrd", owner).map_err(named("initrdPath"))?;
        kb.initrd = Some(copy);
    }
    Ok(())
}

impl From<DiskNotReady> for LauncherError {
    fn from(DiskNotReady { volume, source }: DiskNotReady) -> LauncherError {
        LauncherError::HostDisk { volume, source }
    }
}

/// A definition whose host side is ready (`Launcher::ready_definition`).
pub(super) struct Ready {
    pub(super) def: crate::domain::DomainDef,
    pub(super) fds: Vec<(String, std::fs::File)>,
    pub(super) not_ready: Vec<(DiskDef, HostError)>,
    /// The pins made for it: kept once QEMU has them, else removed.
    pub(super) pins: super::pins::PinGuard,
}

/// Makes the host side of `disks` ready: checks the files and devices the spec names, creates
/// what the launcher owns (`DiskOrCreate` images, empty disks, overlays, cloud-init ISOs) where
/// `volumes` says they live.
pub(super) fn prepare_disks(
    vmi: &VirtualMachineInstance,
    disks: &[DiskDef],
    opts: &ConvertOptions,
    qemu: crate::host::devnode::NodeOwner,
) -> Result<(), DiskNotReady> {
    // The consoles and EFI variables go there too, whatever the disks; checked at every start.
    host::private_dirs::prepare(&opts.paths, qemu).map_err(|source| DiskNotReady {
        volume: String::new(),
        source,
    })?;
    for disk in disks {
        let Some(volume) = vmi.spec.volumes.iter().find(|v| v.name == disk.volume) else {
            continue;
        };
        let Some(resolved) = crate::volumes::resolve(vmi, volume, &opts.paths, &opts.block_volumes)
        else {
            continue;
        };
        host::prepare_volume(&resolved).map_err(|source| DiskNotReady {
            volume: disk.volume.clone(),
            source,
        })?;
    }
    Ok(())
}
