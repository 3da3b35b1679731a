//! Sync (hotplug): validate and plan the whole request before the first host step, then attach
//! scsi disks two at a time (`ATTACHES_IN_FLIGHT`) and detach them one by one; a volume whose
//! source is not there yet waits (Pending) and is retried when its path appears.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

use crate::convert;
use crate::domain::{self, DiskDef, DomainDef, LiveResources};
use crate::host::devnode::{self, DevNodeError, DevNumber};
use crate::hotplug::{self, Plan};
use crate::lifecycle::Command;
use crate::spec::{Validated, VirtualMachineInstance};

use super::coordinator::Launcher;
use super::error::LauncherError;
use super::in_flight::in_flight;
use super::nics;
use super::resize::{self, ResizePlan};
use super::synced_domain::SyncedDomain;
use super::tasks::Work;
use super::types::{
    BlockSource, NicChange, PlannedAction, PlannedChange, SyncInput, SyncOutcome, VolumePhase,
    VolumeStatus,
};

/// A hot-plugged block volume of a Sync: its device, or why it is not there yet.
/// A hot-plugged block volume's device, or the path it waits for (named by path, not there yet).
pub(super) type BlockResolution = Result<DevNumber, PathBuf>;

/// What a Sync changes of the vCPUs, memory and interfaces, and the live state it was planned
/// from (both empty when nothing needed reading).
struct ResourcePlan {
    resizes: ResizePlan,
    nic_plan: Vec<NicChange>,
    resources: domain::LiveResources,
    live_nics: Vec<domain::LiveInterface>,
}

/// A Sync request checked, converted and resolved: what its task applies.
#[derive(Debug)]
pub(super) struct PreparedSync {
    vmi: Validated,
    /// `vmi` converted for the running domain: kept as the current spec's conversion once
    /// the Sync is accepted (`SyncedDomain`).
    desired: Arc<DomainDef>,
    /// The boot memory `desired` was converted for.
    guest_at_boot: Option<u64>,
    /// The machines the launcher had learnt when `desired` was converted.
    machines_learnt: usize,
    input: SyncInput,
    devices: BTreeMap<String, BlockResolution>,
    /// The block volumes the launcher held when this was prepared.
    held: BTreeMap<String, DevNumber>,
    /// `Launcher::interrupt` when the Sync was asked for: a Kill or SIGTERM since stops it.
    interrupt_generation: u64,
}

impl Work for PreparedSync {
    type Output = SyncOutcome;

    fn command(&self) -> Command {
        Command::Sync
    }

    /// Applies the plan; a real (not dry) run is remembered: its failure as the
    /// `Synchronized` condition, its request (once planned, see `accept`) for `GetSpec`.
    async fn perform(self, launcher: &Launcher) -> Result<SyncOutcome, LauncherError> {
        // Prepared before the slot was taken: if a task meanwhile changed the block volumes the
        // launcher holds, prepare again, or a live block volume would be converted as a file.
        let this = if launcher.block.nodes() == self.held {
            self
        } else {
            let generation = self.interrupt_generation;
            PreparedSync {
                interrupt_generation: generation,
                ..launcher.prepare_sync(self.input)?
            }
        };
        let result = launcher.sync_locked(&this).await;
        if !this.input.dry_run {
            let failure = result.as_ref().err().map(|e| crate::error_chain(e));
            launcher.update(|s| s.sync_failure = failure);
        }
        result
    }
}

impl Launcher {
    /// The spec, block devices and persisted volumes of the last Sync (or the start spec).
    pub(crate) fn last_input(&self) -> SyncInput {
        let mut input = self.last_sync.get();
        // Block volumes the launcher holds, also when the last Sync did not repeat them.
        for (name, dev) in self.block.nodes() {
            input
                .block_devices
                .entry(name)
                .or_insert(BlockSource::Number(dev));
        }
        input
    }

    /// Applies a whole new spec: validate, plan, then attach and detach scsi disks. Invalid
    /// input, and every block device, is checked before anything is touched (and before the
    /// task slot is taken); a failure of one volume does not stop the others.
    pub(crate) async fn sync(&self, input: SyncInput) -> Result<SyncOutcome, LauncherError> {
        let prepared = self.prepare_sync(input)?;
        self.run(prepared).await.map(|(_, outcome)| outcome)
    }

    /// [`Launcher::sync`] of a request whose spec the caller has parsed and validated already
    /// (`vmi`, from `input.spec`'s document): not parsed a second time.
    pub(crate) async fn sync_validated(
        &self,
        input: SyncInput,
        vmi: Validated,
    ) -> Result<SyncOutcome, LauncherError> {
        let prepared = self.prepare_parsed(input, vmi)?;
        self.run(prepared).await.map(|(_, outcome)| outcome)
    }

    /// Everything about a Sync that needs no task: parse and validate, check the block
    /// devices, convert, and make sure it is this launcher's instance.
    pub(super) fn prepare_sync(&self, input: SyncInput) -> Result<PreparedSync, LauncherError> {
        let vmi = self.kept_parse.parse(&input.spec)?;
        self.prepare_parsed(input, vmi)
    }

    /// [`Launcher::prepare_sync`] past the parse.
    fn prepare_parsed(
        &self,
        input: SyncInput,
        vmi: Validated,
    ) -> Result<PreparedSync, LauncherError> {
        let interrupt_generation = self.signals.interrupt_generation();
        self.options.host_paths.check(&vmi)?;
        let held = self.block.nodes();
        let devices = self.resolve_block_devices(&vmi, &input)?;
        let machines_learnt = self.machines_learnt();
        let mut opts = self.convert_options();
        opts.block_volumes.extend(devices.keys().cloned());
        opts.guest_at_boot = self.memory_at_boot();
        if let Some(boot) = opts.guest_at_boot {
            resize::check_not_below_boot(&vmi, boot)?;
        }
        let desired = convert::convert(&vmi, &opts)?;
        if desired.name != self.domain_name {
            return Err(LauncherError::WrongInstance {
                running: self.domain_name.clone(),
                requested: desired.name,
            });
        }
        Ok(PreparedSync {
            vmi,
            desired: Arc::new(desired),
            guest_at_boot: opts.guest_at_boot,
            machines_learnt,
            input,
            devices,
            held,
            interrupt_generation,
        })
    }

    /// Checks every block device of a Sync: names, sources, device numbers. A path that is not
    /// there yet is not an error: that volume will be Pending.
    pub(super) fn resolve_block_devices(
        &self,
        vmi: &VirtualMachineInstance,
        input: &SyncInput,
    ) -> Result<BTreeMap<String, BlockResolution>, LauncherError> {
        let hotpluggable: BTreeSet<&str> = vmi
            .spec
            .volumes
            .iter()
            .filter(|v| crate::volumes::is_hotpluggable(v))
            .map(|v| v.name.as_str())
            .collect();
        // Read once: the devices this launcher holds now.
        let held = self.block.nodes();
        let mut devices = BTreeMap::new();
        for (volume, source) in &input.block_devices {
            let refuse = |source| LauncherError::BlockDevice {
                volume: volume.clone(),
                source,
            };
            devnode::check_name(volume).map_err(refuse)?;
            if !hotpluggable.contains(volume.as_str()) {
                return Err(LauncherError::NotAHotplugVolume {
                    volume: volume.clone(),
                });
            }
            let resolved = match source {
                BlockSource::Path(path) => match devnode::device_of(path) {
                    Ok(dev) => Ok(dev),
                    Err(DevNodeError::Missing { path }) => Err(path),
                    Err(e) => return Err(refuse(e)),
                },
                BlockSource::Number(dev) => {
                    devnode::check_exists(&self.options.hotplug.sys_dev_block, *dev)
                        .map_err(refuse)?;
                    Ok(*dev)
                }
            };
            if let Ok(dev) = resolved {
                // A device this launcher already holds for the volume was allowed when attached.
                if held.get(volume) != Some(&dev) {
                    self.options
                        .hotplug
                        .allowed_block_devices
                        .check(dev, &self.options.convert.paths.hotplug_dir)
                        .map_err(|e| refuse(e.into()))?;
                }
            }
            devices.insert(volume.clone(), resolved);
        }
        // A live block volume the request does not repeat keeps its device.
        for (name, dev) in held {
            if hotpluggable.contains(name.as_str()) && !devices.contains_key(&name) {
                devices.insert(name, Ok(dev));
            }
        }
        Ok(devices)
    }

    async fn sync_locked(
        &self,
        PreparedSync {
            vmi,
            desired,
            guest_at_boot,
            machines_learnt,
            input,
            devices,
            interrupt_generation,
            ..
        }: &PreparedSync,
    ) -> Result<SyncOutcome, LauncherError> {
        let dry_run = input.dry_run;
        let current = self.current_domain()?;
        let frozen = hotplug::frozen_fields_changed(&current, desired);
        if !frozen.is_empty() {
            return Err(LauncherError::FrozenFieldsChanged { fields: frozen });
        }
        let live = self.live_disks().await?;
        let plan = hotplug::plan(&live, desired)?;
        let planned = planned_changes(&plan);
        let ResourcePlan {
            resizes,
            nic_plan,
            resources,
            live_nics,
        } = self.plan_resources(&current, desired)?;
        if dry_run {
            return Ok(SyncOutcome {
                plan: planned,
                volumes: self.status().volumes,
                resources: resizes.changes,
                interfaces: nic_plan,
            });
        }
        self.accept(
            input,
            vmi,
            SyncedDomain::new(*guest_at_boot, *machines_learnt, Arc::clone(desired)),
        )?;
        let resized = self.resize(resizes, &resources);
        let interfaces = self
            .change_interfaces(nic_plan, &live_nics, &desired.interfaces)
            .await;
        // One read shows what both parts did; none if only resizes ran, all accepted.
        let shown =
            !resized.is_empty() && interfaces.is_empty() && self.show_resized(&resources, &resized);
        if (!resized.is_empty() || !interfaces.is_empty()) && !shown {
            if let Err(e) = self.refresh_live() {
                tracing::warn!(error = %crate::error_chain(&e), "cannot read the resized domain");
            }
        }
        self.forget_unwanted_volumes(desired, &live);
        self.apply_disk_plan(&plan, vmi, input, devices, *interrupt_generation)
            .await?;
        if !plan.attach.is_empty() || !plan.detach.is_empty() {
            self.read_own_changes().await;
        }
        Ok(SyncOutcome {
            plan: planned,
            volumes: self.status().volumes,
            resources: resized,
            interfaces,
        })
    }

    /// A volume the spec no longer names and libvirt does not have (one that was pending or
    /// failed) has nothing left to report, nor a path to wait for.
    fn forget_unwanted_volumes(&self, desired: &DomainDef, live: &[domain::LiveDisk]) {
        let wanted: BTreeSet<String> = desired.disks.iter().map(|d| d.volume.clone()).collect();
        let live_names: BTreeSet<String> = live
            .iter()
            .filter_map(|d| d.volume().map(str::to_string))
            .collect();
        self.update(|s| {
            s.volumes
                .retain(|name, _| wanted.contains(name) || live_names.contains(name))
        });
        self.pending.send_if_modified(|p| {
            let before = p.len();
            p.retain(|name, _| wanted.contains(name));
            p.len() != before
        });
    }

    /// The disk part of an accepted Sync: attaches a few at a time, then detaches one by one,
    /// each step given up once a stop interrupts the Sync.
    async fn apply_disk_plan(
        &self,
        plan: &Plan,
        vmi: &Validated,
        input: &SyncInput,
        devices: &BTreeMap<String, BlockResolution>,
        interrupt_generation: u64,
    ) -> Result<(), LauncherError> {
        let interrupted = || self.signals.interrupt_generation() != interrupt_generation;
        let attach_one = |disk: &DiskDef| {
            let persist = input.persist.contains(&disk.volume);
            match devices.get(&disk.volume) {
                Some(resolution) => self.attach_block(disk, resolution, persist),
                None => self.attach(vmi, disk, persist),
            }
        };
        // Not for a Sync with nothing to attach (a no-op, a detach): `host_work` hands the async
        // worker's other tasks to another thread, a wake-up for nothing.
        if !plan.attach.is_empty() {
            super::blocking::host_work(|| {
                in_flight(&plan.attach, ATTACHES_IN_FLIGHT, &interrupted, attach_one)
            })?;
        }
        for live_disk in &plan.detach {
            if interrupted() {
                return Err(LauncherError::SyncInterrupted);
            }
            self.detach(live_disk, interrupt_generation).await;
        }
        Ok(())
    }

    /// What a Sync changes of the vCPUs, memory and interfaces, and the live state it planned
    /// from. Only a domain with room to resize, or a Sync whose interfaces differ from the last
    /// one's or from what libvirt was last seen to have, pays for reading the live XML (once,
    /// for both).
    fn plan_resources(
        &self,
        current: &DomainDef,
        desired: &DomainDef,
    ) -> Result<ResourcePlan, LauncherError> {
        let resizable = desired.vcpus_enabled.is_some() || desired.virtio_mem.is_some();
        let relink = current.interfaces != desired.interfaces || {
            // The names shown, read under the lock: not a copy of the whole status per Sync.
            let s = self.state.lock().expect("state lock");
            let shown = s.interfaces.iter().map(|i| &i.name);
            shown.ne(desired.interfaces.iter().map(|i| &i.name))
        };
        // Without interfaces to relink, the vCPUs and memory as last read or resized, while
        // libvirt's events say they hold; a live vCPU change still reads the count first.
        let kept = (resizable && !relink)
            .then(|| self.kept_resources())
            .flatten();
        let from_kept = kept.is_some();
        let (mut resources, live_nics) = match kept {
            Some(kept) => (kept, Vec::new()),
            None if resizable || relink => self.refresh_live()?,
            None => Default::default(),
        };
        let plan_from = |resources: &LiveResources| -> Result<ResizePlan, LauncherError> {
            if !resizable {
                return Ok(ResizePlan::default());
            }
            let next_boot = self.vcpus_at_next_boot(desired, resources)?;
            Ok(resize::plan(resources, next_boot, desired))
        };
        let mut resizes = plan_from(&resources)?;
        if from_kept && resizes.changes_vcpus_live() {
            resources = self.with_vcpus_now(resources)?;
            resizes = plan_from(&resources)?;
        }
        let nic_plan = if relink {
            nics::plan(&live_nics, &desired.interfaces)
        } else {
            Vec::new()
        };
        Ok(ResourcePlan {
            resizes,
            nic_plan,
            resources,
            live_nics,
        })
    }

    /// Reads the live disks this Sync's own attaches and detaches left, while its task still
    /// holds the slot: the next Sync (a no-op above all, the node daemon's resync) finds them
    /// current (`live_view::carry_disks` takes their events, delivered after the read, for
    /// what the read shows) instead of reading libvirt itself. Nothing to keep with the live
    /// state cache off.
    async fn read_own_changes(&self) {
        if !self.live.keeps() {
            return;
        }
        if let Err(e) = self.live_disks().await {
            // The next Sync reads them.
            tracing::debug!(error = %crate::error_chain(&e), "cannot read the disks after a Sync's changes");
        }
    }

    /// The volume waits for `path` to appear; the pending watcher retries it then.
    pub(super) fn mark_pending(
        &self,
        disk: &DiskDef,
        reason: &str,
        message: String,
        path: PathBuf,
    ) {
        self.set_volume(disk, VolumePhase::Pending, reason, message);
        self.pending.send_modify(|p| {
            p.insert(disk.volume.clone(), path);
        });
    }

    /// The request of a Sync about to make its first change becomes the one to keep: saved
    /// first (a launcher killed from here on restarts knowing it), then shown by `GetSpec`.
    /// The spec becomes the current one too (what a restart boots), even if the Sync is then
    /// interrupted.
    fn accept(
        &self,
        input: &SyncInput,
        vmi: &Validated,
        converted: SyncedDomain,
    ) -> Result<(), LauncherError> {
        // The same request again (a no-op Sync, a retry) is saved already: neither copied nor
        // looked up in sysfs again.
        let sys = &self.options.hotplug.sys_dev_block;
        let disk_sequences = |input: &SyncInput| {
            input
                .block_devices
                .iter()
                .filter_map(|(volume, source)| match source {
                    BlockSource::Number(dev) => {
                        Some((volume.clone(), devnode::disk_sequence(sys, *dev)?))
                    }
                    BlockSource::Path(_) => None,
                })
                .collect()
        };
        self.last_sync.accept(input, disk_sequences)?;
        let vmi = vmi.clone();
        self.update(|s| s.set_spec(vmi, Some(converted)));
        Ok(())
    }

    /// The current spec converted for the running domain: the conversion the Sync that
    /// accepted it made, or a new one (the spec of a start or a restore, another boot's memory).
    fn current_domain(&self) -> Result<Arc<DomainDef>, LauncherError> {
        let guest_at_boot = self.memory_at_boot();
        let machines_learnt = self.machines_learnt();
        {
            let s = self.state.lock().expect("state lock");
            if let Some(kept) = s
                .spec_domain
                .as_ref()
                .and_then(|d| d.for_inputs(guest_at_boot, machines_learnt))
            {
                return Ok(kept);
            }
        }
        // Before the state lock: `block` is a leaf, never taken under `state`.
        let mut opts = self.convert_options();
        opts.guest_at_boot = guest_at_boot;
        let s = self.state.lock().expect("state lock");
        Ok(Arc::new(convert::convert(&s.spec, &opts)?))
    }

    /// Re-runs the last Sync once a pending volume's source has appeared (Sync is idempotent:
    /// only what is missing is done). The request is read once the task slot is held, so a
    /// retry never re-applies a request older than the last one.
    pub(super) async fn retry_pending(&self) {
        if self.signals.is_closing() {
            return;
        }
        tracing::info!("a pending volume's source appeared; syncing again");
        if let Err(e) = self.command(Command::Sync, None).await {
            tracing::warn!(error = %crate::error_chain(&e), "retrying pending volumes failed");
        }
    }

    pub(super) fn set_volume(
        &self,
        disk: &DiskDef,
        phase: VolumePhase,
        reason: &str,
        message: String,
    ) {
        if phase != VolumePhase::Pending {
            self.pending
                .send_if_modified(|p| p.remove(&disk.volume).is_some());
        }
        let status = VolumeStatus {
            name: disk.volume.clone(),
            target: disk.target.clone(),
            serial: disk.serial.clone().unwrap_or_default(),
            bus: disk.bus.as_str().into(),
            phase,
            reason: reason.into(),
            message,
            boot: false,
        };
        self.update(|s| {
            s.volumes.insert(disk.volume.clone(), status);
        });
    }
}

/// Attaches a Sync keeps before libvirt at once. libvirt runs one device job per domain at a
/// time and queues the next: with a second request already waiting in libvirtd when a job ends,
/// libvirt starts it at once, and what the launcher does between two attaches (the volume's
/// status, the next disk's host side, the round trip) is off the path. The plan has chosen
/// every disk's target and drive address, so the order libvirt takes them in changes nothing
/// the launcher reports (the guest names disks in the order it finds them, as it always could).
const ATTACHES_IN_FLIGHT: usize = 2;

fn planned_changes(plan: &Plan) -> Vec<PlannedChange> {
    let attach = plan.attach.iter().map(|d| PlannedChange {
        action: PlannedAction::Attach,
        volume: d.volume.clone(),
        target: d.target.clone(),
    });
    let detach = plan.detach.iter().map(|d| PlannedChange {
        action: PlannedAction::Detach,
        volume: d.volume().unwrap_or_default().into(),
        target: d.target.clone(),
    });
    attach.chain(detach).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::domain::Bus;

    #[test]
    fn a_plan_reads_as_attaches_then_detaches() {
        let plan = Plan {
            attach: vec![DiskDef {
                volume: "new".into(),
                target: "sdb".into(),
                bus: Bus::Scsi,
                ..DiskDef::default()
            }],
            detach: vec![domain::LiveDisk {
                alias: Some("ua-old".into()),
                target: "sdc".into(),
                bus: "scsi".into(),
                serial: None,
                source: None,
                address: None,
                xml: String::new(),
            }],
        };
        assert_eq!(
            planned_changes(&plan),
            [
                PlannedChange {
                    action: PlannedAction::Attach,
                    volume: "new".into(),
                    target: "sdb".into()
                },
                PlannedChange {
                    action: PlannedAction::Detach,
                    volume: "old".into(),
                    target: "sdc".into()
                },
            ]
        );
    }
}
