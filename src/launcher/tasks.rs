//! Tasks: the owner's commands and Sync, one at a time under `task_slot`, each admitted by
//! `lifecycle::admit` before any side effect and settled by `lifecycle::settle` when it ends;
//! also the graceful stop, SIGTERM and the final clean-up.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{
    EventKind, Launcher, LauncherError, Status, SyncInput, TaskInfo, TaskOutcome, VolumePhase,
    DEFAULT_GRACE_PERIOD, DESTROY_TIMEOUT,
};
use crate::convert::{self, ConvertOptions};
use crate::domain::DiskDef;
use crate::host::{self, HostError};
use crate::libvirt::LibvirtError;
use crate::lifecycle::{self, Command, Observation};
use crate::spec::VirtualMachineInstance;

/// What a task does, once admitted: a lifecycle command, or a Sync validated and planned before
/// the slot was taken.
pub(super) trait Work {
    type Output;
    fn command(&self) -> Command;
    async fn perform(self, launcher: &Launcher) -> Result<Self::Output, LauncherError>;
}

/// An owner's lifecycle command.
struct Lifecycle {
    command: Command,
    grace: Option<Duration>,
    preempt_generation: u64,
}

impl Work for Lifecycle {
    type Output = ();

    fn command(&self) -> Command {
        self.command
    }

    /// The state is read again before the task ends: the command that comes next is admitted
    /// against what this one did, not against the state before it (an Unpause followed at once
    /// by a Pause was refused as "the VM is paused" until libvirt's event had been handled).
    async fn perform(self, launcher: &Launcher) -> Result<(), LauncherError> {
        let result = launcher
            .perform(self.command, self.grace, self.preempt_generation)
            .await;
        launcher.refresh().await;
        result
    }
}

/// Holds the task slot for one command; `Launcher::end_task` records how it went. A task that
/// never gets there (its future panicked, or was dropped part-way) is ended when the guard goes:
/// as failed, so that status never shows a task no one runs.
pub(super) struct TaskGuard<'a> {
    launcher: &'a Launcher,
    /// Taken by `end_task`; still here on drop means the task did not end normally.
    slot: Option<tokio::sync::MutexGuard<'a, ()>>,
    info: TaskInfo,
}

impl Drop for TaskGuard<'_> {
    fn drop(&mut self) {
        let Some(slot) = self.slot.take() else {
            return;
        };
        let why = if std::thread::panicking() {
            "the task panicked"
        } else {
            "the task was cancelled"
        };
        tracing::error!(
            id = self.info.id,
            command = self.info.command.as_str(),
            "{why}"
        );
        // A panic under the state lock leaves it poisoned: settling would panic again while
        // unwinding (an abort). The slot is freed either way.
        if self.launcher.state.is_poisoned() {
            return;
        }
        self.launcher.settle_task(self.info, Some(why.to_string()));
        drop(slot);
        self.launcher.wake.notify_one();
    }
}

impl Launcher {
    /// Takes the task slot for `command` (waiting for a task in flight), re-checks it against the
    /// real state, and announces it.
    pub(super) async fn begin_task(
        &self,
        command: Command,
    ) -> Result<TaskGuard<'_>, LauncherError> {
        self.refuse_while_terminating(command)?;
        // Fail fast, before waiting for the slot...
        lifecycle::admit(command, &self.observation())?;
        let slot = self.task_slot.lock().await;
        // ...and check again: the state may have moved while we waited (if it did, libvirt
        // sent an event, and the state is read again). A Sync reads the live disks next: both
        // reads (each only if something changed) go to libvirt at once; an error of the second
        // is met again, and reported, by the Sync itself.
        if command == Command::Sync {
            let (_, _) = tokio::join!(self.refresh_if_stale(), self.live_disks());
        } else {
            self.refresh_if_stale().await;
        }
        let admitted = self
            .refuse_while_terminating(command)
            .and_then(|()| Ok(lifecycle::admit(command, &self.observation())?));
        if let Err(e) = admitted {
            drop(slot);
            // The reconciler may have skipped its turn because this command held the slot.
            self.wake.notify_one();
            return Err(e);
        }
        let info = TaskInfo {
            id: self.next_task_id.fetch_add(1, Ordering::Relaxed),
            command,
        };
        self.update(|s| s.task = Some(info));
        self.events.publish(EventKind::Task {
            id: info.id,
            command,
            outcome: TaskOutcome::Started,
        });
        Ok(TaskGuard {
            launcher: self,
            slot: Some(slot),
            info,
        })
    }

    /// Once the launcher is terminating, only the stop itself may run: nothing may start the VM
    /// again behind its back.
    pub(super) fn refuse_while_terminating(&self, command: Command) -> Result<(), LauncherError> {
        let terminating = self.state.lock().expect("state lock").terminating;
        if terminating && !matches!(command, Command::Shutdown | Command::Kill) {
            return Err(LauncherError::Terminating {
                command: command.as_str(),
            });
        }
        Ok(())
    }

    /// Settles the vm_state by how the task went (`failure` is its error, if any).
    pub(super) fn end_task(&self, mut guard: TaskGuard<'_>, failure: Option<String>) {
        let slot = guard.slot.take();
        self.settle_task(guard.info, failure);
        drop(slot);
        self.wake.notify_one();
    }

    /// The bookkeeping of a task's end: vm_state settled, the task cleared and announced.
    fn settle_task(&self, info: TaskInfo, failure: Option<String>) {
        let final_stop =
            lifecycle::owner_stop_is_final(info.command, failure.is_none(), self.options.strategy);
        self.update(|s| {
            s.vm_state = lifecycle::settle(s.vm_state, info.command, failure.is_none());
            s.task = None;
            s.finished |= final_stop;
        });
        self.events.publish(EventKind::Task {
            id: info.id,
            command: info.command,
            outcome: match failure {
                None => TaskOutcome::Succeeded,
                Some(message) => TaskOutcome::Failed(message),
            },
        });
    }

    /// Runs an owner's command as a task. `grace` overrides the grace period of a Shutdown.
    /// Returns the task id.
    pub async fn command(
        &self,
        command: Command,
        grace: Option<Duration>,
    ) -> Result<u64, LauncherError> {
        // Taken before waiting for the slot: a Kill asked for at any time after this pre-empts
        // this command's graceful stop.
        let preempt_generation = *self.preempt.borrow();
        if command == Command::Kill {
            self.preempt.send_modify(|n| *n += 1);
            self.interrupt.send_modify(|n| *n += 1);
        }
        let work = Lifecycle {
            command,
            grace,
            preempt_generation,
        };
        self.run(work).await.map(|(id, ())| id)
    }

    /// The one path of every task, whatever it does: admitted against the real state before any
    /// side effect, announced, performed, then settled (`lifecycle::settle`) and announced again.
    pub(super) async fn run<W: Work>(&self, work: W) -> Result<(u64, W::Output), LauncherError> {
        let guard = self.begin_task(work.command()).await?;
        let id = guard.info.id;
        let result = work.perform(self).await;
        self.end_task(guard, result.as_ref().err().map(|e| crate::error_chain(e)));
        result.map(|output| (id, output))
    }

    async fn perform(
        &self,
        command: Command,
        grace: Option<Duration>,
        preempt_generation: u64,
    ) -> Result<(), LauncherError> {
        let n = self.domain_name.clone();
        match command {
            Command::Start => self.start_domain().await,
            Command::Pause => self.call(move |hv| hv.suspend(&n)),
            Command::Unpause => self.call(move |hv| hv.resume(&n)),
            Command::SoftReboot => self.call(move |hv| hv.reboot_acpi(&n)),
            Command::Reset => self.call(move |hv| hv.reset(&n)),
            Command::Shutdown => {
                let grace = grace.unwrap_or_else(|| self.grace_period());
                self.graceful_stop(grace, preempt_generation).await
            }
            Command::Kill => {
                self.call(move |hv| hv.destroy(&n))?;
                self.wait_stopped(DESTROY_TIMEOUT).await;
                Ok(())
            }
            // A Sync without a new request re-applies the last one; Sync is idempotent, so only
            // what is missing is done.
            Command::Sync => {
                let input = SyncInput {
                    dry_run: false,
                    ..self.last_input()
                };
                self.prepare_sync(input)?.perform(self).await.map(drop)
            }
            // A migration needs its target: `Launcher::migrate`, never a bare command.
            Command::Migrate => Err(LauncherError::MigrationTarget(
                "a migration names its target".into(),
            )),
        }
    }

    /// The spec's grace period, or KubeVirt's default.
    pub fn grace_period(&self) -> Duration {
        let s = self.state.lock().expect("state lock");
        s.spec
            .spec
            .termination_grace_period_seconds
            .map(Duration::from_secs)
            .unwrap_or(DEFAULT_GRACE_PERIOD)
    }

    /// (Re)creates the domain from the current spec and starts it. A stopped leftover definition
    /// is replaced, so that a restart boots what the owner last asked for.
    pub(super) async fn start_domain(&self) -> Result<(), LauncherError> {
        let n = self.domain_name.clone();
        if self.call(move |hv| hv.exists(&n))? {
            let n = self.domain_name.clone();
            self.update(|s| s.undefined_by_us = true);
            self.call(move |hv| hv.undefine(&n))?;
        }
        let Ready {
            def,
            fds,
            not_ready,
        } = self.ready_definition(true).await?;
        let (n, xml) = (self.domain_name.clone(), def.to_xml());
        self.forget_live_disks();
        self.call(move |hv| hv.define_and_start(&n, &xml, def.spare_pcie_ports, &fds))?;
        self.update(|s| {
            s.undefined_by_us = false;
            s.finished = false;
            s.stop_seen = None;
            s.restart_at = None;
            s.destroyed_after_grace = false;
            s.io_error = None;
            s.last_started = Some(Instant::now());
        });
        self.refresh().await;
        self.rebuild_volumes().await?;
        for (disk, source) in not_ready {
            tracing::warn!(volume = %disk.volume, error = %crate::error_chain(&source), "hot-plugged volume left out of the start");
            match &source {
                HostError::Missing { path } => {
                    self.mark_pending(&disk, source.reason(), source.to_string(), path.clone())
                }
                _ => self.set_volume(
                    &disk,
                    VolumePhase::Failed,
                    source.reason(),
                    source.to_string(),
                ),
            }
        }
        Ok(())
    }

    /// A migration target: the host side of the domain the source will send (its disks made as
    /// a start would make them, for the migration to copy into), and nothing defined. Every
    /// hot-plugged volume the source has must be here too.
    pub(super) async fn prepare_incoming(&self) -> Result<(), LauncherError> {
        // Block volumes first: their nodes in this launcher's hotplug dir are what the
        // definition names; their cgroup rules wait for QEMU (`BlockDevices::apply_rules`).
        let vmi = self.state.lock().expect("state lock").spec.clone();
        let input = self.last_input.lock().expect("input lock").clone();
        for (volume, dev) in self.resolve_block_devices(&vmi, &input)? {
            let dev = dev.map_err(|path| LauncherError::HostDisk {
                volume: volume.clone(),
                source: HostError::Missing { path },
            })?;
            super::host_work(|| self.block.plug_before_qemu(&volume, dev))
                .map_err(|source| LauncherError::BlockVolume { volume, source })?;
        }
        let Ready { not_ready, .. } = self.ready_definition(false).await?;
        if let Some((disk, source)) = not_ready.into_iter().next() {
            return Err(LauncherError::HostDisk {
                volume: disk.volume,
                source,
            });
        }
        Ok(())
    }

    /// The definition of the domain from the current spec, with its host side ready: images
    /// made and checked, given to QEMU's user. Hot-plugged volumes that wait for their source,
    /// failed, or are not ready now are left out (`not_ready`, with why). Without `fd_groups`
    /// (a migration target: descriptors cannot travel with libvirt's migration), images are
    /// given to QEMU's user instead of passed by descriptor.
    async fn ready_definition(&self, fd_groups: bool) -> Result<Ready, LauncherError> {
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
        let (vmi_, boot_, opts_) = (vmi.clone(), boot.clone(), opts.clone());
        tokio::task::spawn_blocking(move || prepare_disks(&vmi_, &boot_, &opts_))
            .await
            .map_err(LauncherError::Join)??;
        def.disks = boot;
        let mut not_ready = Vec::new();
        for disk in hot {
            if waiting.contains(&disk.volume) {
                continue;
            }
            let opts = opts.clone();
            let (vmi_, disk_) = (vmi.clone(), disk.clone());
            match tokio::task::spawn_blocking(move || {
                prepare_disks(&vmi_, std::slice::from_ref(&disk_), &opts)
            })
            .await
            .map_err(LauncherError::Join)?
            {
                Ok(()) => def.disks.push(disk),
                Err(DiskNotReady { source, .. }) => not_ready.push((disk, source)),
            }
        }
        if !fd_groups {
            for disk in &mut def.disks {
                disk.given_to_qemu |= disk.fd_group.take().is_some();
            }
        }
        let (mut disks, owner) = (
            std::mem::take(&mut def.disks),
            self.options.hotplug.node_owner,
        );
        let (disks, fds) = tokio::task::spawn_blocking(move || {
            let fds = host::open_for_qemu(&mut disks, owner);
            (disks, fds)
        })
        .await
        .map_err(LauncherError::Join)?;
        def.disks = disks;
        let fds = fds.map_err(|(volume, source)| DiskNotReady { volume, source })?;
        Ok(Ready {
            def,
            fds,
            not_ready,
        })
    }

    /// Waits until the VM has stopped (a final phase), at most `limit`; false if it has not.
    /// An unreachable libvirt (phase Unknown) is not a stopped VM.
    pub(super) async fn wait_stopped(&self, limit: Duration) -> bool {
        let mut changes = self.subscribe();
        let stopped = |s: &Status| s.phase.is_final();
        let waited = tokio::time::timeout(limit, changes.wait_for(stopped)).await;
        waited.is_ok()
    }

    /// ACPI power button, up to `grace` for the guest to power off, then destroy. A Kill asked
    /// for since `preempt_generation` ends the wait: this stop then fails as pre-empted, and
    /// the Kill (which runs next) does the stopping.
    pub(super) async fn graceful_stop(
        &self,
        grace: Duration,
        preempt_generation: u64,
    ) -> Result<(), LauncherError> {
        let mut preempt = self.preempt.subscribe();
        if *preempt.borrow() != preempt_generation {
            return Err(LauncherError::Preempted);
        }
        let mut waited_out_grace = false;
        if !grace.is_zero() {
            let n = self.domain_name.clone();
            match self.call(move |hv| hv.shutdown_acpi(&n)) {
                Ok(()) => {
                    tokio::select! {
                        stopped = self.wait_stopped(grace) => if stopped { return Ok(()) },
                        _ = preempt.wait_for(|g| *g != preempt_generation) => {
                            tracing::info!("graceful stop pre-empted by Kill");
                            return Err(LauncherError::Preempted);
                        }
                    }
                    tracing::warn!(
                        ?grace,
                        "the guest did not power off within its grace period; destroying it"
                    );
                    waited_out_grace = true;
                }
                // A paused guest cannot see the power button: waiting would only delay.
                Err(e) => tracing::warn!(
                    error = %crate::error_chain(&e),
                    "the guest cannot be asked to power off; destroying it"
                ),
            }
        }
        self.update(|s| s.destroyed_after_grace = waited_out_grace);
        let n = self.domain_name.clone();
        if let Err(e) = self.call(move |hv| hv.destroy(&n)) {
            // It may have stopped by itself in the meantime; the state says.
            self.refresh().await;
            if !self.status().phase.is_final() {
                return Err(e);
            }
        }
        self.wait_stopped(DESTROY_TIMEOUT).await;
        Ok(())
    }

    /// SIGTERM: stop the guest gracefully and mark the VM final, whatever the run strategy.
    pub async fn terminate(&self) {
        self.update(|s| {
            s.terminating = true;
            s.restart_at = None;
        });
        // A Sync in flight gives way at its next volume: the guest's grace period must not
        // be spent on hotplug.
        self.interrupt.send_modify(|n| *n += 1);
        let active = matches!(&self.observation(), Observation::Domain(p) if p.state.is_active());
        if active {
            if let Err(e) = self.command(Command::Shutdown, None).await {
                tracing::warn!(error = %crate::error_chain(&e), "graceful stop failed");
                let n = self.domain_name.clone();
                let _ = self.call(move |hv| hv.destroy(&n));
            }
        }
        self.refresh().await;
        self.update(|s| s.finished = true);
    }

    /// Removes the domain's definition, the VM stopped first if it still runs (KubeVirt's
    /// `DeleteVirtualMachine`); the launcher and its libvirtd stay, so that the owner reads the
    /// domain gone. True when there was a definition to remove.
    pub async fn delete_domain(&self) -> Result<bool, LauncherError> {
        let active = matches!(&self.observation(), Observation::Domain(p) if p.state.is_active());
        if active {
            self.command(Command::Kill, None).await?;
        }
        let _slot = self.task_slot.lock().await;
        let n = self.domain_name.clone();
        self.update(|s| s.undefined_by_us = true);
        match self.call(move |hv| hv.undefine(&n)) {
            Ok(()) => Ok(true),
            Err(LauncherError::Libvirt(LibvirtError::NoDomain { .. })) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Removes the stopped domain's definition and stops a private libvirtd: the launcher
    /// leaves nothing behind.
    pub async fn shut_down(&self) {
        self.closing.send_replace(true);
        if self.state.lock().expect("state lock").migrated_away {
            // Ended here for good: a next launcher on this dir starts afresh.
            self.migration_marker().remove();
        }
        let n = self.domain_name.clone();
        match self.call(move |hv| hv.undefine(&n)) {
            Ok(()) | Err(LauncherError::Libvirt(LibvirtError::NoDomain { .. })) => {
                // A few unlinks and cgroup writes, once, as the launcher exits.
                self.block.release_all();
            }
            Err(e) => {
                tracing::warn!(error = %crate::error_chain(&e), "cannot remove the domain definition")
            }
        }
        let hv = self.hv.write().expect("hv lock").take();
        let connector = self.connector.clone();
        let _ = tokio::task::spawn_blocking(move || {
            drop(hv);
            connector.stop_daemon();
        })
        .await;
    }
}

/// A volume whose host side could not be made ready (`volume` is empty for the private dirs).
#[derive(Debug)]
pub(super) struct DiskNotReady {
    pub(super) volume: String,
    pub(super) source: HostError,
}

impl From<DiskNotReady> for LauncherError {
    fn from(DiskNotReady { volume, source }: DiskNotReady) -> LauncherError {
        LauncherError::HostDisk { volume, source }
    }
}

/// A definition whose host side is ready (`Launcher::ready_definition`).
struct Ready {
    def: crate::domain::DomainDef,
    fds: Vec<(String, std::fs::File)>,
    not_ready: Vec<(DiskDef, HostError)>,
}

/// Makes the host side of `disks` ready: checks the files and devices the spec names, creates
/// what the launcher owns (`DiskOrCreate` images, empty disks, overlays, cloud-init ISOs) where
/// `volumes` says they live.
pub(super) fn prepare_disks(
    vmi: &VirtualMachineInstance,
    disks: &[DiskDef],
    opts: &ConvertOptions,
) -> Result<(), DiskNotReady> {
    // The VNC socket and EFI variables go there too, whatever the disks.
    host::prepare_private_dirs(&opts.paths).map_err(|source| DiskNotReady {
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
