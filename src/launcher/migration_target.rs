//! Live migration between two launchers, the target's side (`run --incoming`): it prepares its
//! disks from the source's last Sync, waits, and adopts the guest when libvirt has made it its
//! own (persistent, no longer paused for the migration), as a restarted launcher adopts one.
//! The source's side is `migration_source`. See `docs/DESIGN.md` §4.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::coordinator::Launcher;
use super::disks::Ready;
use super::error::LauncherError;
use super::types::MigrationState;
use crate::host::HostError;
use crate::lifecycle::{DomainState, Observation, VmState};

impl Launcher {
    /// A migration target: the host side of the domain the source will send (its disks made as
    /// a start would make them, for the migration to copy into), and nothing defined. Every
    /// hot-plugged volume the source has must be here too.
    pub(super) async fn prepare_incoming(&self) -> Result<(), LauncherError> {
        // Block volumes first: their nodes in this launcher's hotplug dir are what the
        // definition names; their cgroup rules wait for QEMU (`BlockDevices::apply_rules`).
        let vmi = self.state.lock().expect("state lock").spec.clone();
        let input = self.last_sync.get();
        for (volume, dev) in self.resolve_block_devices(&vmi, &input)? {
            let dev = dev.map_err(|path| LauncherError::HostDisk {
                volume: volume.clone(),
                source: HostError::Missing { path },
            })?;
            super::blocking::host_work(|| self.block.plug_before_qemu(&volume, dev))
                .map_err(|source| LauncherError::BlockVolume { volume, source })?;
        }
        let Ready {
            not_ready, pins, ..
        } = self.ready_definition(false).await?;
        if let Some((disk, source)) = not_ready.into_iter().next() {
            return Err(LauncherError::HostDisk {
                volume: disk.volume,
                source,
            });
        }
        // The incoming guest's QEMU opens them: they stay.
        pins.keep();
        Ok(())
    }

    /// A prepared migration target's pins, by volume (see [`IncomingPlan::pins`]).
    pub(crate) fn incoming_pins(&self) -> std::collections::BTreeMap<String, PathBuf> {
        self.pins.list()
    }

    /// libvirt's domain is still a migration's destination: not defined yet, or paused for it.
    pub(super) fn still_incoming(&self) -> bool {
        let n = self.domain_name.clone();
        let persistent = self.call(move |hv| hv.is_persistent(&n)).unwrap_or(false);
        let paused_for_it = matches!(self.observation(),
            Observation::Domain(p) if p.state == DomainState::Paused && p.reason == "migration");
        !persistent || paused_for_it
    }

    /// A migration target whose guest has not arrived yet.
    pub(super) fn is_incoming(&self) -> bool {
        self.state
            .lock()
            .expect("state lock")
            .migration
            .is_incoming()
    }

    /// On the target, while the guest is on its way: whether libvirt has made it ours yet, or
    /// lost it. Called by the reconciler instead of the run strategy's rules; true while the
    /// migration still owns the VM.
    pub(super) async fn reconcile_incoming(&self) -> bool {
        if !self.is_incoming() {
            return false;
        }
        let observation = self.observation();
        match observation {
            Observation::NotCreated | Observation::Unreachable => {}
            Observation::Domain(p) if p.state == DomainState::Paused && p.reason == "migration" => {
                self.update(|s| s.migration.migrating());
            }
            Observation::Domain(p) if p.state.is_active() => {
                let n = self.domain_name.clone();
                if matches!(self.call(move |hv| hv.is_persistent(&n)), Ok(true)) {
                    self.arrived(p.state == DomainState::Paused).await;
                } else {
                    self.update(|s| s.migration.migrating());
                }
            }
            Observation::Domain(_) | Observation::Vanished => {
                tracing::error!("the incoming migration ended without the guest");
                self.update(|s| {
                    s.vm_state = VmState::Error;
                    s.life = s.life.migration_lost();
                    s.migration.end(
                        MigrationState::Failed,
                        "the source cancelled it or failed; the guest runs there".into(),
                    );
                });
            }
        }
        true
    }

    /// The guest is here: the launcher takes it as it adopts a running one, and publishes its
    /// ports (the source's QEMU held them until it ended: tried again until it has).
    async fn arrived(&self, paused: bool) {
        self.show_guest_running(paused);
        // `run` says so by the phase it prints next.
        tracing::info!("the guest arrived by migration");
        if let Err(e) = super::blocking::host_work(|| self.block.apply_rules()) {
            tracing::error!(error = %crate::error_chain(&e), "cannot allow the block volumes' devices to the migrated QEMU");
        }
        if let Err(e) = self.rebuild_volumes().await {
            tracing::warn!(error = %crate::error_chain(&e), "cannot read the migrated domain's volumes");
        }
        self.after_switch_over().await;
    }

    /// What waits for libvirt's end of the migration and the source's QEMU to go, both right
    /// after the guest is here: the ports (bound by the source's QEMU until it ends) and the
    /// statistics (libvirt keeps them only after its last step). Tried again every
    /// `AFTER_SWITCH_OVER_STEP` for at most `AFTER_SWITCH_OVER`: neither has an event.
    async fn after_switch_over(&self) {
        const AFTER_SWITCH_OVER: Duration = Duration::from_secs(10);
        const AFTER_SWITCH_OVER_STEP: Duration = Duration::from_millis(50);
        let give_up = Instant::now() + AFTER_SWITCH_OVER;
        let (mut published, mut stats) = (false, None);
        loop {
            let n = self.domain_name.clone();
            if !published {
                match self.call(move |hv| hv.publish_ports(&n)) {
                    Ok(()) => published = true,
                    Err(e) if Instant::now() >= give_up => {
                        tracing::error!(error = %crate::error_chain(&e), "cannot publish the migrated guest's ports");
                        published = true;
                    }
                    Err(_) => {}
                }
            }
            if stats.is_none() {
                let n = self.domain_name.clone();
                stats = self.call(move |hv| hv.completed_job(&n)).ok().flatten();
            }
            if published && (stats.is_some() || Instant::now() >= give_up) {
                break;
            }
            tokio::time::sleep(AFTER_SWITCH_OVER_STEP).await;
        }
        self.update(|s| s.migration.arrived(stats));
    }
}
