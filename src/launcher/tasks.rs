//! Tasks: the owner's commands and Sync, one at a time under the task slot (`task_slot`), each admitted by
//! `lifecycle::admit` before any side effect and settled by `lifecycle::settle` when it ends;
//! also the graceful stop, SIGTERM and the final clean-up.

use std::time::{Duration, Instant};

use super::disks::Ready;

use super::coordinator::Launcher;
use super::error::LauncherError;
use super::types::{
    EventKind, Status, SyncInput, TaskInfo, TaskOutcome, VolumePhase, DEFAULT_GRACE_PERIOD,
    DESTROY_TIMEOUT,
};
use crate::host::HostError;
use crate::libvirt::{LibvirtError, Nvram, RootPorts};
use crate::lifecycle::{self, Command, Observation};

/// What a task does, once admitted: a lifecycle command, a Sync validated and planned before
/// the slot was taken, a migration with its target.
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
        self.launcher.signals.wake();
    }
}

impl Launcher {
    /// Takes the task slot for `command` (waiting for a task in flight), re-checks it against the
    /// real state, and announces it.
    pub(super) async fn begin_task(
        &self,
        command: Command,
    ) -> Result<TaskGuard<'_>, LauncherError> {
        self.refuse_after_the_end(command)?;
        // Fail fast, before waiting for the slot...
        lifecycle::admit(command, &self.observation())?;
        let slot = self.tasks.take().await;
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
            .refuse_after_the_end(command)
            .and_then(|()| Ok(lifecycle::admit(command, &self.observation())?));
        if let Err(e) = admitted {
            drop(slot);
            // The reconciler may have skipped its turn because this command held the slot.
            self.signals.wake();
            return Err(e);
        }
        let info = TaskInfo {
            id: self.tasks.next_id(),
            command,
        };
        self.update(|s| s.task = Some(info));
        self.hub.event(EventKind::Task {
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

    /// Once the launcher is terminating, or a migration ended the VM's life here, only a stop
    /// may run: nothing may start the VM again behind its back (or beside its copy elsewhere).
    pub(super) fn refuse_after_the_end(&self, command: Command) -> Result<(), LauncherError> {
        let life = self.state.lock().expect("state lock").life;
        if matches!(command, Command::Shutdown | Command::Kill) {
            return Ok(());
        }
        // Before the stop: a migration's end is over whatever else, a Start above all (the
        // domain is gone here, so `admit` would let a Start create it again).
        if let Some(how) = life.migration_ended() {
            return Err(LauncherError::MigrationEnded {
                command: command.as_str(),
                how,
            });
        }
        if life.terminated() {
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
        self.signals.wake();
    }

    /// The bookkeeping of a task's end: vm_state settled, the task cleared and announced.
    fn settle_task(&self, info: TaskInfo, failure: Option<String>) {
        let final_stop =
            lifecycle::owner_stop_is_final(info.command, failure.is_none(), self.options.strategy);
        self.update(|s| {
            s.vm_state = lifecycle::settle(s.vm_state, info.command, failure.is_none());
            s.task = None;
            if final_stop {
                s.life = s.life.finish();
            }
        });
        self.hub.event(EventKind::Task {
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
    pub(crate) async fn command(
        &self,
        command: Command,
        grace: Option<Duration>,
    ) -> Result<u64, LauncherError> {
        // Taken before waiting for the slot: a Kill asked for at any time after this pre-empts
        // this command's graceful stop.
        let preempt_generation = self.signals.preempt_generation();
        if command == Command::Kill {
            self.signals.kill();
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
            Command::Migrate => Err(super::migration_plan::TargetError::NotNamed.into()),
        }
    }

    /// The spec's grace period, or KubeVirt's default.
    pub(crate) fn grace_period(&self) -> Duration {
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
        // The observation is current: the task's admission read it, or knew it current
        // (`refresh_if_stale`; at the first start, from `first_start`'s own lookup).
        if matches!(self.observation(), Observation::Domain(_)) {
            let n = self.domain_name.clone();
            self.update(|s| s.undefined_by_us = true);
            // The variables the guest set survive its restart.
            self.call(move |hv| hv.undefine(&n, Nvram::Keep))?;
        }
        let Ready {
            def,
            fds,
            not_ready,
            pins,
        } = self.ready_definition(true).await?;
        self.clear_tpm_state(&def)?;
        let (n, xml) = (self.domain_name.clone(), def.to_xml());
        self.forget_live_disks();
        let ports = RootPorts {
            spare: def.spare_pcie_ports,
            for_devices: def.root_port_devices(),
        };
        let forwards = def.interfaces.iter().any(|i| !i.port_forwards.is_empty());
        let machine = self.call(move |hv| hv.define_and_start(&n, &xml, ports, &fds, forwards))?;
        self.learn_machine(&def.machine, machine);
        // QEMU has them now; on any way out before this line the guard removed them.
        pins.keep();
        self.update(|s| {
            s.undefined_by_us = false;
            s.life = s.life.started();
            s.stop_seen = None;
            s.restart_at = None;
            s.io_error = None;
            s.last_started = Some(Instant::now());
        });
        // Its state is read when the task ends (`Lifecycle::perform`), as every command's.
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

    /// Before libvirt, as root, chowns what is in the TPM's state dir (`host::tpm_state`):
    /// what swtpm's user (QEMU's) put there that is no state file goes.
    fn clear_tpm_state(&self, def: &crate::domain::DomainDef) -> Result<(), LauncherError> {
        let (Some(_), Some(uuid), Some(dir)) = (
            &def.tpm,
            def.uuid.as_deref(),
            self.link.connector().swtpm_dir(),
        ) else {
            return Ok(());
        };
        let removed = crate::host::tpm_state::remove_planted(&dir, uuid).map_err(|source| {
            LauncherError::HostFile {
                field: "spec.domain.devices.tpm".into(),
                source,
            }
        })?;
        if !removed.is_empty() {
            tracing::warn!(?removed, "removed what was no TPM state from the TPM's state dir: libvirt would have chowned where each leads");
        }
        Ok(())
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
        let mut preempt = self.signals.subscribe_preempt();
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
        self.update(|s| s.life = s.life.destroying(waited_out_grace));
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
    pub(crate) async fn terminate(&self) {
        self.update(|s| {
            s.life = s.life.terminate();
            s.restart_at = None;
        });
        // A Sync in flight gives way at its next volume: the guest's grace period must not
        // be spent on hotplug.
        self.signals.interrupt();
        let active = matches!(&self.observation(), Observation::Domain(p) if p.state.is_active());
        if active {
            if let Err(e) = self.command(Command::Shutdown, None).await {
                tracing::warn!(error = %crate::error_chain(&e), "graceful stop failed");
                let n = self.domain_name.clone();
                let _ = self.call(move |hv| hv.destroy(&n));
            }
        }
        self.refresh().await;
        self.update(|s| s.life = s.life.finish());
    }

    /// Removes the domain's definition, the VM stopped first if it still runs (KubeVirt's
    /// `DeleteVirtualMachine`); the launcher and its libvirtd stay, so that the owner reads the
    /// domain gone. True when there was a definition to remove.
    pub(crate) async fn delete_domain(&self) -> Result<bool, LauncherError> {
        let active = matches!(&self.observation(), Observation::Domain(p) if p.state.is_active());
        if active {
            self.command(Command::Kill, None).await?;
        }
        let _slot = self.tasks.take().await;
        let n = self.domain_name.clone();
        self.update(|s| s.undefined_by_us = true);
        match self.call(move |hv| hv.undefine(&n, Nvram::Keep)) {
            Ok(()) => Ok(true),
            Err(LauncherError::Libvirt(LibvirtError::NoDomain { .. })) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Removes the stopped domain's definition and stops a private libvirtd: the launcher
    /// leaves nothing behind.
    pub(crate) async fn shut_down(&self) {
        self.signals.close();
        if self
            .state
            .lock()
            .expect("state lock")
            .life
            .is_migrated_away()
        {
            // Ended here for good: a next launcher on this dir starts afresh.
            self.migration_marker().remove();
        }
        let n = self.domain_name.clone();
        match self.call(move |hv| hv.undefine(&n, Nvram::Remove)) {
            Ok(()) | Err(LauncherError::Libvirt(LibvirtError::NoDomain { .. })) => {
                // A few unlinks and cgroup writes, once, as the launcher exits.
                self.block.release_all();
                // QEMU is gone: its namespace with it; a pin in libvirtd's (made before a
                // start) goes with its unlink.
                self.pins.keep_only(&Default::default());
            }
            Err(e) => {
                tracing::warn!(error = %crate::error_chain(&e), "cannot remove the domain definition")
            }
        }
        let hv = self.link.take();
        let connector = self.link.connector().clone();
        let _ = tokio::task::spawn_blocking(move || {
            drop(hv);
            connector.stop_daemon();
        })
        .await;
    }
}
