//! The core: one launcher, one domain. It creates (or adopts) the domain, keeps the observed state
//! true by re-reading libvirt after every event and on a periodic resync, reconciles it with what
//! the owner asked for (run strategy, vm_state), runs the owner's commands as tasks, applies `Sync`
//! (hotplug), and reconnects when libvirt goes away. Front ends (gRPC, the `run` entrypoint) only
//! call into it.
//!
//! libvirt calls block, so they run under `block_in_place` (`call`): the worker hands its other
//! tasks over first; connecting, and starting the private daemon again, run on the blocking pool.
//! One task at a time holds the task slot (`task_slot`);
//! only Kill pre-empts (a graceful stop waiting out its grace period gives way to it). The pure
//! rules live in `lifecycle`; this module executes them.
//!
//! By job: `status` (what `GetStatus` and `WatchEvents` report), `tasks` (the owner's commands
//! and Sync, one at a time), `reconciler` (libvirt's events, the run strategy, reconnecting),
//! `sync` (hotplug: plan, then attach and detach). The host side of block volumes is
//! [`crate::host::block::BlockDevices`].

mod attach_detach;
mod blocking;
mod coordinator;
mod daemon_restart;
mod detaches;
mod disks;
mod error;
mod in_flight;
mod io_errors;
mod kept_parse;
mod last_sync;
mod life;
mod link;
mod live_view;
mod migration_part;
mod migration_plan;
mod migration_source;
mod migration_target;
mod nics;
mod pending;
mod pins;
mod reconciler;
mod resize;
mod saved;
mod signals;
mod status;
mod status_hub;
mod sync;
mod synced_domain;
mod task_slot;
mod tasks;
#[cfg(test)]
mod tests;
mod types;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::{broadcast, mpsc, watch};

use crate::convert::{self, ConvertOptions};
use crate::domain;
use crate::host::block::{BlockDevices, BlockRoots};
use crate::host::devnode::{self, DevNumber};
use crate::libvirt::events::HypervisorEvent;
use crate::libvirt::{Connector, DomainStats, Hypervisor, LibvirtError};
use crate::lifecycle::{self, Command, Observation, VmState};
use crate::spec::Validated;

use blocking::host_work;
use coordinator::State;
use detaches::Detaches;
use last_sync::LastSync;
use link::Link;
use live_view::LiveView;
use pending::pending_watcher;
use pins::ImagePins;
use reconciler::reconciler;
use saved::{SavedSyncError, SavedSyncs};
use signals::Signals;
use status::placeholder_status;
use status_hub::StatusHub;
use task_slot::TaskSlot;

pub(crate) use coordinator::Launcher;
pub use error::LauncherError;
pub(crate) use migration_plan::{
    incoming_plan, incoming_plan_tcp, IncomingOffer, IncomingPlan, PrepareTarget, TargetError,
};
pub(crate) use migration_source::MigrateRequest;
pub(crate) use status::waiting_status;
pub(crate) use types::{
    BlockSource, EventKind, HotplugOptions, LaunchOptions, LauncherEvent, MigrationRole,
    MigrationState, MigrationStatus, PlannedAction, ResourceChange, ResourcePart, StartKind,
    Status, SyncInput, SyncOutcome, TaskOutcome, VolumePhase, VolumeStatus,
};

/// The last accepted Sync a launcher kept at `base` (`HotplugOptions::last_sync`), if any.
pub(crate) fn saved_sync(base: &std::path::Path) -> Option<SyncInput> {
    SavedSyncs::read(base)
}

impl Launcher {
    /// Connects, then creates the domain from `vmi` (or adopts a running one of the same name,
    /// rebuilding the volume statuses from its live XML), unless the run strategy waits for a
    /// Start call. `events` must be the receiving end of the connector's channel.
    pub(crate) async fn start(
        connector: Arc<Connector>,
        vmi: Validated,
        options: LaunchOptions,
        events: mpsc::UnboundedReceiver<HypervisorEvent>,
    ) -> Result<(Arc<Launcher>, StartKind), LauncherError> {
        // Before anything is made or started: a refused path is a bad spec (exit 2).
        options.host_paths.check(&vmi)?;
        let def = convert::convert(&vmi, &options.convert)?;
        let c = connector.clone();
        let connecting = tokio::task::spawn_blocking(move || c.connect());
        let staging = stage_boot_copy(&def, &options);
        let hv = connecting.await.map_err(LauncherError::Join)??;
        // A copy that failed is made again by the start, which says why.
        let staged_boot = match staging {
            Some(staging) => staging.await.ok().and_then(Result::ok),
            None => None,
        };
        let boot_devices: BTreeSet<DevNumber> = def
            .disks
            .iter()
            .filter_map(|d| match &d.source {
                domain::DiskSource::Block(p) => devnode::device_of(p).ok(),
                _ => None,
            })
            .collect();
        let (launcher, restorable) = Launcher::assemble(
            connector,
            hv,
            def.name,
            options,
            State::new(vmi),
            staged_boot,
        );
        let (kind, restored) = launcher.first_start(restorable).await?;
        launcher.settle_first_start(kind, boot_devices);
        // Following libvirt's events before the restored Sync runs: its detaches end on the
        // DEVICE_REMOVED the reconciler hands them (without it each waited the whole detach
        // timeout, and the launcher's API with it).
        crate::spawn::spawn_boxed(reconciler(Arc::downgrade(&launcher), events));
        crate::spawn::spawn_boxed(pending_watcher(Arc::downgrade(&launcher)));
        if restored {
            // The request may have been cut off half-way (a launcher killed during a Sync):
            // apply it again; Sync is idempotent, only what is missing is done.
            if let Err(e) = launcher.command(Command::Sync, None).await {
                tracing::warn!(error = %crate::error_chain(&e), "cannot converge to the restored Sync");
            }
        }
        Ok((launcher, kind))
    }

    /// The launcher of domain `name` from its parts, on a connection already open; with the
    /// last Sync a launcher before it saved, if one can be restored.
    fn assemble(
        connector: Arc<Connector>,
        hv: Hypervisor,
        name: String,
        options: LaunchOptions,
        state: State,
        staged_boot: Option<(domain::KernelBootDef, domain::KernelBootDef)>,
    ) -> (Arc<Launcher>, Result<Option<SyncInput>, SavedSyncError>) {
        let uri = connector.uri();
        let spec_text = options.spec_text.clone();
        let block_devices = options.block_devices.clone();
        let block = BlockDevices::new(BlockRoots {
            hotplug_dir: options.convert.paths.hotplug_dir.clone(),
            node_owner: options.hotplug.node_owner,
            cgroup_roots: options.hotplug.cgroup_roots.clone(),
            proc_root: options.hotplug.proc_root.clone(),
            qemu_pid_file: options.hotplug.qemu_pid_dir.join(format!("{name}.pid")),
            records: options.hotplug.records.clone(),
            missing: options.hotplug.missing_capabilities.clone(),
        });
        let (saved, restorable) = host_work(|| SavedSyncs::open(&options.hotplug.last_sync));
        let launcher = Arc::new(Launcher {
            link: Link::new(connector, hv),
            hub: StatusHub::new(placeholder_status(&name, &uri, options.strategy)),
            domain_name: name,
            pins: ImagePins::new(options.convert.pin_dir.as_deref()),
            options,
            state: Mutex::new(state),
            tasks: TaskSlot::default(),
            signals: Signals::default(),
            detaches: Detaches::default(),
            block,
            last_sync: LastSync::new(
                saved,
                SyncInput {
                    spec: spec_text,
                    block_devices,
                    ..SyncInput::default()
                },
            ),
            pending: watch::channel(BTreeMap::new()).0,
            live: LiveView::new(crate::tricks::enabled(crate::tricks::Trick::LiveStateCache)),
            kept_parse: kept_parse::KeptParse::new(crate::tricks::enabled(
                crate::tricks::Trick::LiveStateCache,
            )),
            staged_boot: Mutex::new(staged_boot),
            machines: Mutex::new(BTreeMap::new()),
        });
        (launcher, restorable)
    }

    /// What the first start finds and does: adopts the domain running under its name, takes
    /// an incoming migration, creates the domain, or waits for a Start call. Whether the last
    /// Sync was restored comes with it.
    async fn first_start(
        self: &Arc<Self>,
        restorable: Result<Option<SyncInput>, SavedSyncError>,
    ) -> Result<(StartKind, bool), LauncherError> {
        self.update(|_| {});
        let n = self.domain_name.clone();
        let seen = crate::libvirt::delivered::count();
        let exists = self.call(move |hv| hv.exists(&n))?;
        if exists {
            self.refresh().await;
        } else {
            // Nothing to read: the observation stays NotCreated, as a read would leave it, and
            // is as current as one (`refresh_if_stale`): the first Start's task asks no more.
            self.live.power_read(Some(seen));
        }
        let active = matches!(&self.observation(), Observation::Domain(p) if p.state.is_active());
        let mut restored = false;
        let left_behind = self.migration_left_behind(exists && active);
        // A target restarted while its guest was still coming in: not a guest to adopt yet.
        let still_incoming = self.options.incoming && exists && self.still_incoming();
        let kind = if let Some(kind) = left_behind {
            kind
        } else if exists && active && !still_incoming {
            let paused = matches!(&self.observation(), Observation::Domain(p) if p.state == lifecycle::DomainState::Paused);
            self.show_guest_running(paused);
            restored = self.restore_last_sync(restorable);
            self.rebuild_volumes().await?;
            StartKind::Adopted {
                last_sync: restored,
            }
        } else if self.options.incoming {
            host_work(|| self.last_sync.save_current())?;
            self.update(|s| {
                s.migration.begin(
                    MigrationRole::Target,
                    MigrationState::Preparing,
                    String::new(),
                )
            });
            // A predecessor's migration still coming in finds its disks made already.
            if !exists {
                self.prepare_incoming().await?;
            }
            self.update(|s| s.migration.migrating());
            StartKind::Incoming
        } else {
            // A new domain starts from the spec file: a request saved for an earlier one is
            // replaced before anything runs, so that a crash from here on never restores it.
            host_work(|| self.last_sync.save_current())?;
            if self.options.strategy.starts_at_launch() {
                self.command(Command::Start, None).await?;
                StartKind::Created
            } else {
                self.update(|s| s.vm_state = VmState::Stopped);
                StartKind::NotStarted
            }
        };
        Ok((kind, restored))
    }

    /// After the first start: what it learnt is dropped (a later start asks libvirt and opens
    /// the host's files again), and the block nodes and pins a launcher before this one left
    /// are adopted or removed.
    fn settle_first_start(&self, kind: StartKind, boot_devices: BTreeSet<DevNumber>) {
        // What `start` learnt holds for its own first start only: a later one (a restart, a
        // Start call) asks libvirt and opens the host's files again.
        self.staged_boot.lock().expect("staged boot lock").take();
        self.block.set_boot(boot_devices);
        let live: BTreeSet<String> = self.status().volumes.into_iter().map(|v| v.name).collect();
        // A migration target's nodes were just made for a domain still on its way: they are
        // this launcher's own, nothing to adopt.
        if kind != StartKind::Incoming {
            host_work(|| {
                self.block.adopt(&live);
                // Pins are found again by name (`<volume>.img`): those of volumes the domain
                // still has stay, the rest (a launcher killed mid-unplug) go.
                self.pins.keep_only(&live);
            });
        }
    }

    /// When adopting: takes the last accepted Sync saved by the launcher before this one as the
    /// current spec and request. False (the spec file stays) when there is none, or when it no
    /// longer parses or names another domain.
    fn restore_last_sync(&self, restorable: Result<Option<SyncInput>, SavedSyncError>) -> bool {
        let input = match restorable {
            Ok(Some(input)) => input,
            Ok(None) => return false,
            Err(e) => {
                tracing::warn!(error = %crate::error_chain(&e), "the last Sync is lost; the spec file stands (a Sync of the whole spec restores it)");
                return false;
            }
        };
        let vmi = match crate::spec::parse(&input.spec) {
            Ok(vmi) => vmi,
            Err(e) => {
                tracing::warn!(error = %e, "the saved last Sync is no longer valid; the spec file stands");
                return false;
            }
        };
        // Checked as a Sync would be now: this launcher's places and QEMU's user may differ
        // from the one that saved it.
        if let Err(e) = self.options.host_paths.check(&vmi) {
            tracing::warn!(error = %e, "the saved last Sync names a host path this launcher refuses; the spec file stands");
            return false;
        }
        match convert::convert(&vmi, &self.convert_options()) {
            Ok(def) if def.name == self.domain_name => {}
            Ok(def) => {
                tracing::warn!(saved = %def.name, running = %self.domain_name, "the saved last Sync is for another domain; the spec file stands");
                return false;
            }
            Err(e) => {
                tracing::warn!(error = %e, "the saved last Sync no longer converts; the spec file stands");
                return false;
            }
        }
        // The operator restarted with a spec file; what stands instead must not be a surprise
        // (`run` says it too, from the start's `StartKind`).
        tracing::warn!("restored the last Sync over the spec file");
        // A device number is reused once its disk is gone: one whose disk changed since the
        // Sync was accepted is left out, never attached as the volume.
        let sys = &self.options.hotplug.sys_dev_block;
        let (input, replaced) =
            input.without_replaced_devices(|dev| devnode::disk_sequence(sys, dev));
        for volume in replaced {
            tracing::warn!(%volume, "the block device the last Sync gave this volume is another disk now (its number was reused): left out; a Sync naming its device attaches it");
        }
        self.update(|s| s.set_spec(vmi, None));
        self.last_sync.restored(input);
        true
    }

    pub(crate) fn domain_name(&self) -> &str {
        &self.domain_name
    }

    /// What this launcher presents to migrate over TCP (`run --tls-dir`), if anything.
    pub(crate) fn migration_credentials(&self) -> Option<crate::migration_tls::MigrationTls> {
        let installed = self.options.migration_tls.as_ref()?;
        Some(installed.credentials.clone())
    }

    /// libvirt's live XML of the domain, or `None` when it is not defined.
    pub(crate) async fn live_xml(&self) -> Result<Option<String>, LauncherError> {
        let n = self.domain_name.clone();
        match self.call(move |hv| hv.live_xml(&n)) {
            Ok(xml) => Ok(Some(xml)),
            Err(LauncherError::Libvirt(LibvirtError::NoDomain { .. })) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The hypervisor's version (QEMU's, `7.2.0`).
    pub(crate) fn hypervisor_version(&self) -> Result<String, LauncherError> {
        // The running QEMU answers at once; libvirt's own answer may first probe QEMU.
        let n = self.domain_name.clone();
        match self.call(move |hv| hv.qemu_version(&n)) {
            Ok(Some(version)) => Ok(version),
            _ => self.call(|hv| hv.version()),
        }
    }

    /// libvirt's bulk stats of the domain, or `None` when it is not defined.
    pub(crate) async fn domain_stats(&self) -> Result<Option<DomainStats>, LauncherError> {
        let n = self.domain_name.clone();
        match self.call(move |hv| hv.domain_stats(&n)) {
            Ok(stats) => Ok(Some(stats)),
            Err(LauncherError::Libvirt(LibvirtError::NoDomain { .. })) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Presses the ACPI power button once and returns: no task, no grace period, no destroy. For
    /// an owner that keeps its own grace period and asks again (KubeVirt's virt-handler resends
    /// it every few seconds, then kills); a guest that powers off is seen stopping by itself.
    /// A guest that powered itself off between the owner's look and the press (libvirt answers
    /// "domain is not running" before its stop event reaches the status) is what the press
    /// asked for: libvirt's own state, read after the refusal, decides. So is one already on
    /// its way down: libvirt refuses the press from QEMU's shutdown until QEMU has exited
    /// (state `shutdown`), the window an owner's resent press can fall in.
    pub(crate) async fn press_power_button(&self) -> Result<(), LauncherError> {
        let n = self.domain_name.clone();
        self.call(move |hv| match hv.shutdown_acpi(&n) {
            Err(refused) => match hv.power_state(&n) {
                Ok(now) if now.state.is_off_or_going_off() => Ok(()),
                _ => Err(refused),
            },
            pressed => pressed,
        })
    }

    /// One guest agent command's JSON answer (bounded, see [`Hypervisor::agent_command`]),
    /// waiting at most `timeout_secs`: the guest's word, for the caller to parse with care.
    pub(crate) async fn agent_command(
        &self,
        command: &str,
        timeout_secs: i32,
    ) -> Result<String, LauncherError> {
        let n = self.domain_name.clone();
        self.call(move |hv| hv.agent_command(&n, command, timeout_secs))
    }

    /// A receiver that sees every status change (the latest one, at least).
    pub(crate) fn subscribe(&self) -> watch::Receiver<Status> {
        self.hub.subscribe()
    }

    /// A receiver that sees the status when the VM's course changes (phase, printable status,
    /// power state, phase reason, finished), not at each change of a volume or a task.
    pub(crate) fn subscribe_course(&self) -> watch::Receiver<Status> {
        self.hub.subscribe_course()
    }

    pub(crate) fn status(&self) -> Status {
        self.hub.current()
    }

    /// The event stream: a resync with the current status first, then every event after it.
    pub(crate) fn watch_events(&self) -> (LauncherEvent, broadcast::Receiver<LauncherEvent>) {
        self.hub.watch_events()
    }

    /// Resolves when the launcher is going away (event streams end then).
    pub(crate) fn closing(&self) -> watch::Receiver<bool> {
        self.signals.subscribe_closing()
    }

    /// A resync for a subscriber that fell behind.
    pub(crate) fn resync_event(&self) -> LauncherEvent {
        self.hub.resync_event()
    }

    fn observation(&self) -> Observation {
        self.state.lock().expect("state lock").observation.clone()
    }

    fn hypervisor(&self) -> Result<Arc<Hypervisor>, LauncherError> {
        self.link.hypervisor()
    }

    /// Runs a blocking libvirt call on this thread, its other tasks handed over first
    /// (`host_work`). Not on the blocking pool: waking a pool thread, then this task's worker
    /// again, put two thread wake-ups on the path of every call (the side-by-side bench: no-op
    /// Sync 0.89 → 0.60 ms, attach 7.2 → 6.4 ms, when this changed).
    fn call<T>(
        &self,
        f: impl FnOnce(&Hypervisor) -> Result<T, LibvirtError>,
    ) -> Result<T, LauncherError> {
        let hv = self.hypervisor()?;
        host_work(|| f(&hv)).map_err(LauncherError::from)
    }

    /// A running guest the launcher did not start itself (adopted, or arrived by migration):
    /// shown running, or paused, from now.
    fn show_guest_running(&self, paused: bool) {
        self.update(|s| {
            s.vm_state = if paused {
                VmState::Paused
            } else {
                VmState::Active
            };
            s.last_started = Some(Instant::now());
        });
    }

    /// Changes the state, publishes the new status, and tells the stream what changed.
    fn update(&self, change: impl FnOnce(&mut State)) {
        // Published while the state lock is held, so that the stream's order is the order of
        // the updates (lock order: state, then the event sequence; nothing takes them reversed).
        let mut state = self.state.lock().expect("state lock");
        change(&mut state);
        self.hub.publish(self.status_of(&state));
        drop(state);
    }

    /// The `<disk>` elements of the live domain. Read from libvirt (a round trip and a parse of
    /// the whole domain XML) only when something may have changed them since the last read in
    /// a way the events do not tell (`current_live_disks`): an event from libvirt other than a
    /// device's removal (a device added, a lifecycle change, a reconnect), the launcher's own
    /// attach or detach (`forget_live_disks`), or the periodic resync. Called with
    /// the task slot held (by a task, or by the reconciler's read while idle), so no attach or
    /// detach of the launcher's own overlaps the read.
    async fn live_disks(&self) -> Result<Vec<domain::LiveDisk>, LauncherError> {
        // Taken before the read: anything that happens during it moves the key.
        let key = self.live.key(crate::libvirt::delivered::count());
        let log = &crate::libvirt::delivered::between;
        if let Some(disks) = self.live.disks(key, &self.domain_name, log) {
            return Ok(disks);
        }
        let n = self.domain_name.clone();
        let xml = self.call(move |hv| hv.live_xml(&n))?;
        let live = domain::live_disks(&xml)?;
        self.live.keep_disks(key, live.clone());
        Ok(live)
    }

    /// The launcher is about to change the domain's devices (or lost track of them).
    fn forget_live_disks(&self) {
        self.live.forget_disks();
    }

    /// The volume is being detached (its status says `Detaching`).
    fn is_detaching(&self, volume: &str) -> bool {
        let state = self.state.lock().expect("state lock");
        state
            .volumes
            .get(volume)
            .is_some_and(|v| v.phase == VolumePhase::Detaching)
    }

    /// The converter's options with the block volumes the launcher holds.
    fn convert_options(&self) -> ConvertOptions {
        let mut opts = self.options.convert.clone();
        opts.block_volumes.extend(self.block.nodes().into_keys());
        let machines = self.machines.lock().expect("machines lock");
        opts.machines
            .extend(machines.iter().map(|(a, m)| (a.clone(), m.clone())));
        opts
    }

    /// Keeps the versioned machine libvirt defined for the alias `written` named (`machines`):
    /// libvirt resolves aliases itself, at the define, so the launcher asks nothing for it. A
    /// conversion kept from before is not used again (`SyncedDomain`).
    fn learn_machine(&self, written: &str, defined: Option<String>) {
        if let Some(defined) = defined.filter(|d| d != written) {
            let mut machines = self.machines.lock().expect("machines lock");
            machines.entry(written.to_string()).or_insert(defined);
        }
    }

    /// How many machines the launcher has learnt: a conversion's input, which only grows.
    fn machines_learnt(&self) -> usize {
        self.machines.lock().expect("machines lock").len()
    }
}

/// The kernel and initrd copied for the first start while libvirtd starts (the host side of
/// a first start needs no libvirt): opened and copied as at every start
/// (`disks::copy_boot_files`), only sooner. `None` when nothing is to be copied, or the start
/// does not boot now.
fn stage_boot_copy(
    def: &domain::DomainDef,
    options: &LaunchOptions,
) -> Option<
    tokio::task::JoinHandle<Result<(domain::KernelBootDef, domain::KernelBootDef), LauncherError>>,
> {
    def.kernel_boot
        .clone()
        .filter(|_| {
            crate::tricks::enabled(crate::tricks::Trick::ParallelStart)
                && options.strategy.starts_at_launch()
                && !options.incoming
        })
        .map(|kb| {
            let (private_dir, owner) = (
                options.convert.paths.private_dir.clone(),
                options.hotplug.node_owner,
            );
            tokio::task::spawn_blocking(move || {
                let mut copied = kb.clone();
                disks::copy_boot_files(&mut copied, &private_dir, owner).map(|()| (kb, copied))
            })
        })
}
