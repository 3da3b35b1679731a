//! One hot-plugged volume attached or detached: its host side made ready (the image opened
//! and checked, a block device's node and cgroup rule), libvirt asked (again while its wait
//! for the domain's job runs out), and the volume's status moved as it goes.

use std::time::Instant;

use crate::domain::{self, DiskDef};
use crate::host::block::BlockHostError;
use crate::host::HostError;
use crate::spec::VirtualMachineInstance;

use super::coordinator::Launcher;
use super::disks::{prepare_disks, DiskNotReady};
use super::error::{libvirt_message, LauncherError};
use super::sync::BlockResolution;
use super::types::{VolumePhase, DETACH_TIMEOUT};

/// How many times an attach asks libvirt when libvirt's wait for the domain's job runs out.
/// libvirt gives up after 30 s (`VIR_JOB_WAIT_TIME`) with a timeout; an attach queued behind the
/// other one in flight meets that only when QEMU or its storage holds that other attach so long,
/// and one at a time it would have waited: so it asks again, up to 2.5 minutes in all, its
/// volume Attaching with the reason `WaitingForDomainJob` meanwhile.
const JOB_WAIT_ATTEMPTS: u32 = 5;

impl Launcher {
    pub(super) fn attach(&self, vmi: &VirtualMachineInstance, disk: &DiskDef, persist: bool) {
        if let Err(DiskNotReady { source, .. }) = prepare_disks(
            vmi,
            std::slice::from_ref(disk),
            &self.options.convert,
            self.options.hotplug.node_owner,
        ) {
            match &source {
                HostError::Missing { path } => {
                    self.mark_pending(disk, source.reason(), source.to_string(), path.clone())
                }
                _ => self.set_volume(
                    disk,
                    VolumePhase::Failed,
                    source.reason(),
                    source.to_string(),
                ),
            }
            return;
        }
        self.attach_live(disk, persist);
    }

    /// The libvirt step of an attach; true if it worked.
    fn attach_live(&self, disk: &DiskDef, persist: bool) -> bool {
        self.set_volume(disk, VolumePhase::Attaching, "", String::new());
        let owner = self.options.hotplug.node_owner;
        let mut prepared = super::disks::for_hot_plug(disk.clone());
        let opened = match crate::host::open_for_qemu(std::slice::from_mut(&mut prepared), owner) {
            Ok(opened) => opened,
            Err((_, e)) => {
                self.set_volume(disk, VolumePhase::Failed, e.reason(), e.to_string());
                return false;
            }
        };
        let fds = opened.fds;
        // QEMU opens a hot-plugged file in its own mount namespace: the pin is made there,
        // and removed by its guard on every way out but a worked attach.
        let (pins, failed) = self.pins.pin_images(
            std::slice::from_mut(&mut prepared),
            opened.to_pin,
            self.qemu_namespace_pid(),
        );
        if let Some((_, e)) = failed.into_iter().next() {
            self.set_volume(
                disk,
                VolumePhase::Failed,
                e.reason(),
                crate::error_chain(&e),
            );
            return false;
        }
        let xml = prepared.to_xml();
        self.forget_live_disks();
        let mut attempts = 1;
        let attached = loop {
            match self.call(|hv| hv.attach(&self.domain_name, &xml, persist, &fds)) {
                Err(LauncherError::Libvirt(e))
                    if e.is_operation_timeout() && attempts < JOB_WAIT_ATTEMPTS =>
                {
                    attempts += 1;
                    let message = e.libvirt_message();
                    tracing::info!(volume = %disk.volume, %message, "asking libvirt again");
                    self.set_volume(disk, VolumePhase::Attaching, "WaitingForDomainJob", message);
                }
                result => break result,
            }
        };
        match attached {
            Ok(()) => {
                pins.keep();
                self.set_volume(disk, VolumePhase::Ready, "", String::new());
                true
            }
            Err(e) => {
                let message = libvirt_message(&e);
                tracing::warn!(volume = %disk.volume, %message, "attach failed");
                drop(pins);
                self.set_volume(disk, VolumePhase::Failed, "AttachFailed", message);
                false
            }
        }
    }

    /// Removes `volume`'s pin, if it has one (QEMU has let go of the disk, or never had it).
    pub(super) fn unpin(&self, volume: &str) {
        self.pins.unpin(volume);
    }

    /// A process in QEMU's mount namespace. libvirtd when QEMU shares its namespace (in a pod):
    /// QEMU runs as another user, whose `/proc/<pid>/ns/mnt` only CAP_SYS_PTRACE may open, which
    /// the pod does not grant; libvirtd is root with the launcher's capabilities. Else QEMU (on
    /// a host: libvirt's per-domain namespace), from libvirt's pid file.
    fn qemu_namespace_pid(&self) -> Option<i32> {
        let connector = self.link.connector();
        if connector.qemu_in_daemon_namespace() {
            return connector.daemon_pid();
        }
        self.qemu_pid()
    }

    /// QEMU's pid, from libvirt's pid file; `None` while it cannot be read.
    fn qemu_pid(&self) -> Option<i32> {
        let file = self
            .options
            .hotplug
            .qemu_pid_dir
            .join(format!("{}.pid", self.domain_name));
        std::fs::read_to_string(file).ok()?.trim().parse().ok()
    }

    fn fail_block_volume(&self, disk: &DiskDef, e: &BlockHostError) {
        self.set_volume(disk, VolumePhase::Failed, e.reason(), crate::error_chain(e));
    }

    /// A hot-plugged block volume: node, then rule, then attach; each host step undone if a
    /// later one fails.
    pub(super) fn attach_block(&self, disk: &DiskDef, resolution: &BlockResolution, persist: bool) {
        let dev = match resolution {
            Ok(dev) => *dev,
            Err(path) => {
                let why = format!("{} does not exist yet", path.display());
                return self.mark_pending(disk, "SourceNotFound", why, path.clone());
            }
        };
        let started = Instant::now();
        let plugged = match self.block.plug(&disk.volume, dev) {
            Ok(plugged) => plugged,
            Err(e) => return self.fail_block_volume(disk, &e),
        };
        if self.attach_live(disk, persist) {
            plugged.keep();
            tracing::info!(volume = %disk.volume, %dev, elapsed = ?started.elapsed(), "block volume attached");
        } else {
            // The guards revoke the rule and remove the node, in that order.
            drop(plugged);
        }
    }

    /// Stops waiting for libvirt's device-removed event when a Kill or SIGTERM comes after
    /// `interrupt_generation`; the event, when it comes, finishes the detach.
    pub(super) async fn detach(&self, live: &domain::LiveDisk, interrupt_generation: u64) {
        let volume = live.volume().unwrap_or_default().to_string();
        let alias = live.alias.clone().unwrap_or_default();
        let set_phase = |phase, reason: &str, message: String| {
            self.update(|s| {
                if let Some(v) = s.volumes.get_mut(&volume) {
                    v.phase = phase;
                    v.reason = reason.into();
                    v.message = message;
                }
            })
        };
        let was_detaching = self.is_detaching(&volume);
        set_phase(VolumePhase::Detaching, "", String::new());
        // The node this detach is about (an earlier, unfinished detach of it began already).
        let generation = self.block.generation(&volume);
        self.detaches.begin(&volume, generation, was_detaching);
        let removed = self.detaches.expect_removal(&alias);
        let (n, xml, a) = (self.domain_name.clone(), live.xml.clone(), alias.clone());
        self.forget_live_disks();
        if let Err(e) = self.call(move |hv| hv.detach(&n, &xml, &a)) {
            self.detaches.stop_waiting(&alias);
            if matches!(&e, LauncherError::Libvirt(l) if l.is_device_missing()) {
                // Removed between the read of the live disks and this call: an earlier detach
                // (e.g. of a launcher killed during its Sync) that libvirt has just finished.
                tracing::info!(%volume, "the device was removed already");
                return self.finish_detach(&volume);
            }
            if was_detaching {
                // libvirt still works on the earlier request: keep waiting for its event.
                set_phase(VolumePhase::Detaching, "DetachPending", libvirt_message(&e));
            } else {
                self.detaches.abandon(&volume);
                set_phase(VolumePhase::Failed, "DetachFailed", libvirt_message(&e));
            }
            return;
        }
        let mut interrupt = self.signals.subscribe_interrupt();
        let waited = tokio::select! {
            waited = tokio::time::timeout(DETACH_TIMEOUT, removed) => waited,
            _ = interrupt.wait_for(|g| *g != interrupt_generation) => {
                return set_phase(
                    VolumePhase::Detaching,
                    "DetachInterrupted",
                    "the VM is being stopped; libvirt's device-removed event finishes the detach".into(),
                );
            }
        };
        match waited {
            Ok(Ok(())) => self.finish_detach(&volume),
            _ => set_phase(
                VolumePhase::Detaching,
                "DetachTimeout",
                format!(
                    "libvirt did not report the device removed within {:?}; the next Sync retries",
                    DETACH_TIMEOUT
                ),
            ),
        }
    }

    /// The device is gone from the domain: clean the host side of what the detach was about
    /// (a node plugged again since is not), forget the volume.
    pub(super) fn finish_detach(&self, volume: &str) {
        let generation = self.detaches.finish(volume);
        // QEMU closed the image with the device: its pin goes (a file volume's; a no-op else).
        super::blocking::host_work(|| self.unpin(volume));
        let released = match generation {
            Some(generation) => {
                super::blocking::host_work(|| self.block.release_plug(volume, generation)).map(drop)
            }
            None => Ok(()),
        };
        match released {
            Ok(()) => self.update(|s| {
                s.volumes.remove(volume);
            }),
            Err(e) => {
                let message = crate::error_chain(&e);
                tracing::warn!(%volume, %message, "cannot clean up after a detach");
                self.update(|s| {
                    if let Some(v) = s.volumes.get_mut(volume) {
                        v.phase = VolumePhase::Failed;
                        v.reason = e.reason().into();
                        v.message = message;
                    }
                });
            }
        }
    }
}
