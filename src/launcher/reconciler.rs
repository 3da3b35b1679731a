//! Keeping the observed state true and acting on it: libvirt's events, the periodic resync,
//! reconnecting to a lost libvirt, and the run strategy when the VM stopped by itself.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::io_errors::IoErrorReport;

use super::coordinator::Launcher;
use super::error::LauncherError;
use super::types::{EventKind, InterfaceStatus, PublishedPort, VolumePhase, VolumeStatus};
use crate::domain;
use crate::libvirt::events::{lifecycle_event, lifecycle_names, HypervisorEvent};
use crate::libvirt::LibvirtError;
use crate::lifecycle::{self, Command, Observation, Reaction, VmState};

/// How long the reconciler must have been quiet before it looks at the free memory: the look
/// walks the allocator's free lists (tens of µs), and a Sync that follows an event at once (a
/// node daemon's next step) must not wait behind it.
const QUIET_BEFORE_RELEASE: Duration = Duration::from_millis(100);
/// The longest a look at the free memory waits after the pass that asked for it, however busy
/// the reconciler stays.
const LONGEST_BEFORE_RELEASE: Duration = Duration::from_secs(1);

impl Launcher {
    /// Re-reads the real state from libvirt (never trusting an event's payload alone).
    pub(super) async fn refresh(&self) {
        if self.signals.is_closing() {
            // Shutting down: the domain is being removed on purpose; nothing to learn.
            return;
        }
        // One read and its update at a time: two interleaved (the reconciler's and a task's)
        // could leave the older state under the newer event count, taken for current.
        let _reading = self.live.reading().await;
        let seen = crate::libvirt::delivered::count();
        let n = self.domain_name.clone();
        let read = self.call(move |hv| hv.power_state(&n));
        if self.signals.is_closing() {
            // The launcher removed the domain meanwhile, on purpose.
            return;
        }
        let observation = match read {
            Ok(power) => Observation::Domain(power),
            Err(LauncherError::Libvirt(LibvirtError::NoDomain { .. })) => {
                let ours = self.state.lock().expect("state lock").undefined_by_us;
                match self.observation() {
                    // Never created (Manual before its first Start), or removed by the launcher
                    // itself for a (re)start that has not defined it again: not lost.
                    Observation::NotCreated => Observation::NotCreated,
                    _ if ours => Observation::NotCreated,
                    _ => Observation::Vanished,
                }
            }
            Err(e) => {
                tracing::warn!(error = %crate::error_chain(&e), "cannot read the domain's state");
                Observation::Unreachable
            }
        };
        // A definite answer: the domain's state, or no domain that the launcher ever made or
        // still means to (its definition comes with a lifecycle event, which makes it stale).
        let observed_at = matches!(
            observation,
            Observation::Domain(_) | Observation::NotCreated
        )
        .then_some(seen);
        self.update(|s| {
            if matches!(&observation, Observation::Domain(p) if p.state.is_active()) {
                s.stop_seen = None;
            }
            s.observation = observation;
        });
        // Only now: a task that finds the count current takes the observation for the truth,
        // so the observation must be there first (set before, a task in between took the
        // previous observation for the one read at `seen`).
        self.live.power_read(observed_at);
    }

    /// Re-reads the real state unless it is known to be current: read after the last event libvirt
    /// delivered, or before device events only, and found a domain or none yet made (a start's
    /// first task, admitted without a lookup that `first_start` just made). Every change of a domain's
    /// state comes with an event of its own (a lost connection too), so a state read since the
    /// last other event is still the truth.
    pub(super) async fn refresh_if_stale(&self) {
        let seen = crate::libvirt::delivered::count();
        let current = self
            .live
            .power_state_current_at(seen, &crate::libvirt::delivered::between)
            && matches!(
                self.observation(),
                Observation::Domain(_) | Observation::NotCreated
            );
        if !current {
            self.refresh().await;
        }
    }

    /// After an event (which may have changed the disks, by anyone), reads the live disks now if
    /// no task runs, so that the next Sync finds them current and plans without a libvirt round
    /// trip on its path. The task slot is held for the read: a Sync that comes meanwhile waits
    /// for it (and takes it), and no attach or detach can overlap it. Skipped while a task runs:
    /// a Sync reads them itself when it needs them.
    async fn read_live_disks_while_idle(&self) {
        let Some(_slot) = self.tasks.try_take() else {
            return;
        };
        if self.signals.is_closing() || !matches!(self.observation(), Observation::Domain(_)) {
            return;
        }
        if let Err(e) = self.live_disks().await {
            tracing::debug!(error = %crate::error_chain(&e), "cannot read the live disks");
        }
    }

    /// Gives the allocator's free memory back while no task runs (`allocator` says why), and the
    /// first time a domain exists, what only the start used (`resident`). Called once the
    /// reconciler has been quiet for `QUIET_BEFORE_RELEASE` after a pass that looked, or at the
    /// latest `LONGEST_BEFORE_RELEASE` after the first such pass.
    fn release_free_memory_while_idle(&self) {
        let Some(_slot) = self.tasks.try_take() else {
            return;
        };
        let started = matches!(self.observation(), Observation::Domain(_))
            && crate::resident::give_back_start_memory();
        if !started {
            crate::allocator::give_back_free_memory();
        }
    }

    /// Rebuilds the volume list from the live XML (at start, when adopting, after a restart).
    pub(super) async fn rebuild_volumes(&self) -> Result<(), LauncherError> {
        let n = self.domain_name.clone();
        let agent_events = self.agent_events();
        let key = self.resources_key_now();
        let xml = self.call(move |hv| hv.live_xml(&n))?;
        let live = domain::live_disks(&xml)?;
        self.show_live(&xml, agent_events, key)?;
        // A domain defined (or found) anew: its persistent vCPUs are read when first needed.
        self.live.keep_next_boot_vcpus(None);
        self.update(|s| {
            let boot: Vec<&str> = s
                .spec
                .spec
                .domain
                .devices
                .disks
                .iter()
                .map(|d| d.name.as_str())
                .collect();
            let mut volumes: BTreeMap<String, VolumeStatus> = live
                .iter()
                .filter_map(|d| {
                    let name = d.volume()?.to_string();
                    // A disk still being detached stays so: its DEVICE_REMOVED finishes it.
                    let detaching = s
                        .volumes
                        .get(&name)
                        .filter(|v| v.phase == VolumePhase::Detaching)
                        .cloned();
                    Some((
                        name.clone(),
                        detaching.unwrap_or(VolumeStatus {
                            boot: boot.contains(&name.as_str()),
                            name,
                            target: d.target.clone(),
                            serial: d.serial.clone().unwrap_or_default(),
                            bus: d.bus.clone(),
                            phase: VolumePhase::Ready,
                            reason: String::new(),
                            message: String::new(),
                        }),
                    ))
                })
                .collect();
            // Volumes libvirt does not have but that wait (Pending) or failed keep their status.
            for (name, v) in &s.volumes {
                if matches!(v.phase, VolumePhase::Pending | VolumePhase::Failed) {
                    volumes.entry(name.clone()).or_insert_with(|| v.clone());
                }
            }
            s.volumes = volumes;
        });
        Ok(())
    }

    /// Handles one libvirt event; true if the state must be re-read.
    pub(super) async fn on_event(&self, event: HypervisorEvent) -> bool {
        let ours = |domain: &str| domain == self.domain_name;
        match event {
            // A removal that arrived after its detach stopped waiting is finished by
            // `reconcile`, which holds the task slot, so that it never runs beside a Sync that
            // plugs the same name again.
            HypervisorEvent::DeviceRemoved { domain, alias } if ours(&domain) => {
                self.detaches.removed(&alias)
            }
            HypervisorEvent::Lifecycle {
                domain,
                event,
                detail,
            } if ours(&domain) => {
                let (name, detail) = lifecycle_names(event, detail);
                self.hub.event(EventKind::Hypervisor {
                    event: name.into(),
                    detail: detail.into(),
                });
                // Definitions coming and going (ours, at exit) do not change the power state;
                // but a guest migrating in is ours once libvirt defined it.
                !matches!(event, lifecycle_event::DEFINED | lifecycle_event::UNDEFINED)
                    || self.is_incoming()
            }
            HypervisorEvent::Reboot { domain } if ours(&domain) => {
                self.hub.event(EventKind::Hypervisor {
                    event: "Reboot".into(),
                    detail: String::new(),
                });
                true
            }
            HypervisorEvent::IoError {
                domain,
                alias,
                path,
                action,
                reason,
            } if ours(&domain) => {
                let message = format!("I/O error on {alias} ({path}): {reason}; action {action}");
                let report = self.hub.io_error(message, Instant::now());
                // Held back (a storm): reported, with the count, when its interval is over.
                report.is_some_and(|r| self.report_io_error(r))
            }
            HypervisorEvent::MemoryDeviceSizeChange {
                domain,
                alias,
                size_kib,
            } if ours(&domain) => {
                self.hub.event(EventKind::Hypervisor {
                    event: "MemoryDeviceSizeChange".into(),
                    detail: format!("{alias} {size_kib} KiB"),
                });
                self.show_plugged(&alias, size_kib);
                false
            }
            HypervisorEvent::AgentLifecycle { domain, connected } if ours(&domain) => {
                // The status first: a follower that sees the event finds it there.
                self.update(|s| {
                    s.agent_connected = connected;
                    s.agent_events += 1;
                });
                self.hub.event(EventKind::Hypervisor {
                    event: "AgentLifecycle".into(),
                    detail: if connected {
                        "connected"
                    } else {
                        "disconnected"
                    }
                    .into(),
                });
                false
            }
            HypervisorEvent::ControlError { domain } if ours(&domain) => {
                self.hub.event(EventKind::Hypervisor {
                    event: "ControlError".into(),
                    detail: String::new(),
                });
                true
            }
            _ if self.signals.is_closing() => false,
            HypervisorEvent::ConnectionClosed { reason } => {
                self.on_connection_closed(reason).await;
                true
            }
            HypervisorEvent::DaemonExited { daemon } => {
                self.on_daemon_exited(daemon).await;
                true
            }
            _ => false,
        }
    }

    /// The libvirt connection closed: reconnected unless it is already replaced.
    async fn on_connection_closed(&self, reason: i32) {
        // A close of a connection already replaced (after a daemon restart) is old news;
        // one that a planned restart causes is judged once that restart is over.
        let _planned = self.link.planned().await;
        let current_alive = self.hypervisor().is_ok_and(|hv| hv.is_alive());
        if !current_alive {
            tracing::error!(reason, "the libvirt connection closed");
            self.reconnect().await;
        }
    }

    /// A private daemon exited: libvirtd is reconnected to (and so restarted), another restarted.
    async fn on_daemon_exited(&self, daemon: &'static str) {
        let _planned = self.link.planned().await;
        tracing::error!(daemon, "a private daemon exited");
        self.hub.event(EventKind::Hypervisor {
            event: "DaemonExited".into(),
            detail: daemon.into(),
        });
        if daemon == "libvirtd" {
            // The close of its connection may have been handled first, by a reconnect
            // that already started a new daemon: then there is nothing left to do.
            if !self.hypervisor().is_ok_and(|hv| hv.is_alive()) {
                self.reconnect().await;
            }
        } else {
            let c = self.link.connector().clone();
            match tokio::task::spawn_blocking(move || c.ensure_daemons()).await {
                Ok(Ok(())) => {
                    tracing::info!(daemon, "restarted");
                    self.hub.event(EventKind::Hypervisor {
                        event: "DaemonRestarted".into(),
                        detail: daemon.into(),
                    });
                }
                Ok(Err(e)) => {
                    tracing::error!(daemon, error = %crate::error_chain(&e), "cannot restart")
                }
                Err(e) => tracing::error!(daemon, error = %e, "restart panicked"),
            }
        }
    }

    /// Logs an I/O error (with how many were held back), tells the stream, and shows it with
    /// the `Paused` condition; true: the state must be re-read (the guest may have paused).
    fn report_io_error(&self, report: IoErrorReport) -> bool {
        tracing::warn!(message = %report.message, more = report.suppressed, "I/O error");
        let detail = report.detail();
        // Status first: whoever sees the event finds it there.
        self.update(|s| s.io_error = Some(report.message));
        self.hub.event(EventKind::Hypervisor {
            event: "IOError".into(),
            detail,
        });
        true
    }

    /// Reports the I/O errors held back, once their interval is over; true if it did.
    fn flush_io_errors(&self) -> bool {
        let report = self.hub.held_io_errors(Instant::now());
        report.is_some_and(|r| self.report_io_error(r))
    }

    /// Marks the state Unknown and reconnects with back-off (restarting a private libvirtd that
    /// died), then rebuilds what it knows from libvirt.
    pub(super) async fn reconnect(&self) {
        let old = self.link.take();
        self.forget_live_disks();
        {
            // After any read in flight on the old connection, so that it cannot land later.
            let _reading = self.live.reading().await;
            self.live.power_read(None);
            self.update(|s| s.observation = Observation::Unreachable);
        }
        // Dropping the old connection deregisters its callbacks; off the async threads.
        if let Some(old) = old {
            let _ = tokio::task::spawn_blocking(move || drop(old)).await;
        }
        let mut delay = Duration::from_millis(100);
        let started = Instant::now();
        loop {
            if self.signals.is_closing() || self.status().finished {
                return;
            }
            if self
                .options
                .reconnect_timeout
                .is_some_and(|limit| started.elapsed() >= limit)
            {
                tracing::error!(
                    after = ?started.elapsed(),
                    "libvirt stayed unreachable; giving up (the VM's state is unknown)"
                );
                self.update(|s| s.life = s.life.finish());
                return;
            }
            let c = self.link.connector().clone();
            match tokio::task::spawn_blocking(move || c.connect()).await {
                Ok(Ok(hv)) => {
                    self.link.connected(hv);
                    break;
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %crate::error_chain(&e), ?delay, "reconnecting to libvirt")
                }
                Err(e) => tracing::error!(error = %e, "reconnect panicked"),
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(5));
        }
        tracing::info!("reconnected to libvirt");
        if let Err(e) = self.rebuild_volumes().await {
            tracing::warn!(error = %crate::error_chain(&e), "cannot rebuild volumes after reconnecting");
        }
    }

    /// Applies `lifecycle::reconcile` when no task runs (a running task wakes the reconciler
    /// when it ends, so nothing is missed).
    pub(super) async fn reconcile(&self) {
        if self.signals.is_closing() {
            return;
        }
        let Some(slot) = self.tasks.try_take() else {
            return;
        };
        self.finish_late_removals();
        if self.reconcile_left_behind()
            || self
                .state
                .lock()
                .expect("state lock")
                .life
                .is_migrated_away()
        {
            // The VM runs on another launcher now: nothing here is to be reconciled.
            return;
        }
        if self.reconcile_incoming().await {
            return;
        }
        let now = Instant::now();
        let (vm_state, observation, restart_due) = {
            let s = self.state.lock().expect("state lock");
            (
                s.vm_state,
                s.observation.clone(),
                s.restart_at.is_some_and(|t| t <= now),
            )
        };
        if restart_due && matches!(&observation, Observation::Domain(p) if p.state.is_active()) {
            // Started meanwhile (by a Start call): the pending restart has nothing left to do.
            self.update(|s| s.restart_at = None);
            return;
        }
        if restart_due {
            drop(slot);
            tracing::info!(
                "restarting the VM (run strategy {})",
                self.options.strategy.as_str()
            );
            // A successful start clears the pending restart; a failed one backs off further.
            match self.command(Command::Start, None).await {
                Ok(_) | Err(LauncherError::Terminating { .. }) => {}
                Err(e) => {
                    tracing::warn!(error = %crate::error_chain(&e), "restart failed");
                    let strategy = self.options.strategy;
                    self.update(|s| {
                        if let Some((restarts, at)) =
                            lifecycle::after_failed_restart(strategy, s.restarts, Instant::now())
                        {
                            s.restarts = restarts;
                            s.restart_at = Some(at);
                        }
                    });
                }
            }
            return;
        }
        match lifecycle::reconcile(vm_state, &observation) {
            Reaction::Nothing | Reaction::KeepPaused { .. } => {}
            Reaction::Stopped { failed } => self.stopped_by_itself(failed, now),
            Reaction::ForceStop => {
                tracing::warn!("the VM runs although it was stopped; stopping it");
                let n = self.domain_name.clone();
                if let Err(e) = self.call(move |hv| hv.destroy(&n)) {
                    tracing::warn!(error = %crate::error_chain(&e), "force stop failed");
                }
            }
            Reaction::MarkStopped => self.update(|s| s.vm_state = VmState::Stopped),
            Reaction::Lost => {
                tracing::error!("the domain vanished");
                self.update(|s| {
                    s.vm_state = VmState::Error;
                    s.life = s.life.finish();
                });
            }
        }
        drop(slot);
    }

    /// Finishes the detaches whose device-removed event came late; called with the task slot
    /// held. A volume no longer Detaching (a Sync plugged it again meanwhile) is left alone, and
    /// `finish_detach` releases only the node the detach was about.
    fn finish_late_removals(&self) {
        let volumes = self.detaches.take_late();
        for volume in volumes {
            if self.is_detaching(&volume) {
                self.finish_detach(&volume);
            } else {
                self.detaches.abandon(&volume);
            }
        }
    }

    /// The VM stopped without a task: `lifecycle::after_unasked_stop` decides (reboot window,
    /// back-off, run strategy).
    pub(super) fn stopped_by_itself(&self, failed: bool, now: Instant) {
        let strategy = self.options.strategy;
        self.update(|s| {
            let after = lifecycle::after_unasked_stop(strategy, failed, s.restarts(), now);
            s.set_restarts(after);
        });
    }
}

/// Queued events handled together before the state is read again.
const EVENT_BATCH: usize = 1024;

/// Follows libvirt's events for as long as the launcher lives: after every event (and on the
/// periodic resync, and when a timer falls due) it re-reads the real state and reconciles.
pub(super) async fn reconciler(
    launcher: std::sync::Weak<Launcher>,
    mut events: mpsc::UnboundedReceiver<HypervisorEvent>,
) {
    let interval = match launcher.upgrade() {
        Some(l) => {
            // The first pass reconciles what the start found. It reads the state again only if an
            // event came since the start read it, then reads the disks while idle (the start
            // keeps none). (The periodic resync's first tick, at once, read everything again.)
            l.signals.wake();
            l.options.resync_interval
        }
        None => return,
    };
    let first_resync = tokio::time::Instant::now() + interval;
    let mut resync = tokio::time::interval_at(first_resync, interval);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // When to look at the free memory, and when it was first asked for: set by each pass that
    // looked at the VM or its disks, pushed back by each later one, up to LONGEST_BEFORE_RELEASE.
    let mut release_due: Option<(Instant, Instant)> = None;
    loop {
        let Some(l) = launcher.upgrade() else {
            return;
        };
        let timer = l.state.lock().expect("state lock").timer();
        let sleep_until = timer.unwrap_or_else(Instant::now);
        let io_due = l.hub.io_errors_due();
        let io_due_at = io_due.unwrap_or_else(Instant::now);
        let release_at = release_due.map_or_else(Instant::now, |(due, _)| due);
        // Whether any event of the batch may have changed the disks (a device came or went).
        let mut devices = false;
        // The periodic resync reads everything again, whatever the events said: the safety net
        // for an event lost; anything else reads the state only if an event other than a device's
        // came since.
        let (look, resyncing) = tokio::select! {
            event = events.recv() => match event {
                Some(first) => {
                    // What else is queued is handled now, with one state read for all of it: a
                    // storm of events costs a read per batch, not one each.
                    let (mut look, mut event, mut handled) = (false, first, 0);
                    loop {
                        tracing::debug!(?event, "libvirt event");
                        devices |= is_device_event(&event);
                        look |= l.on_event(event).await;
                        handled += 1;
                        if handled == EVENT_BATCH {
                            break;
                        }
                        let Ok(queued) = events.try_recv() else { break };
                        event = queued;
                    }
                    (look, false)
                }
                None => return,
            },
            _ = resync.tick() => (true, true),
            _ = l.signals.woken() => (true, false),
            _ = tokio::time::sleep_until(sleep_until.into()), if timer.is_some() => (true, false),
            _ = tokio::time::sleep_until(io_due_at.into()), if io_due.is_some() => (l.flush_io_errors(), false),
            _ = tokio::time::sleep_until(release_at.into()), if release_due.is_some() => {
                release_due = None;
                l.release_free_memory_while_idle();
                continue;
            }
        };
        if resyncing {
            l.forget_live_disks();
            l.refresh().await;
        } else if look {
            l.refresh_if_stale().await;
        }
        if look {
            if matches!(l.observation(), Observation::Unreachable) {
                l.reconnect().await;
                l.refresh().await;
            }
            l.reconcile().await;
        }
        if look || devices {
            l.read_live_disks_while_idle().await;
            let now = Instant::now();
            let first = release_due.map_or(now, |(_, first)| first);
            release_due = Some((
                (now + QUIET_BEFORE_RELEASE).min(first + LONGEST_BEFORE_RELEASE),
                first,
            ));
        }
    }
}

fn is_device_event(event: &HypervisorEvent) -> bool {
    matches!(
        event,
        HypervisorEvent::DeviceAdded { .. } | HypervisorEvent::DeviceRemoved { .. }
    )
}

/// What status shows of each live interface: its spec name (libvirt's alias when it has none),
/// MAC and published ports.
pub(super) fn interface_statuses(live: &[domain::LiveInterface]) -> Vec<InterfaceStatus> {
    live.iter()
        .map(|i| InterfaceStatus {
            name: i
                .name()
                .or(i.alias.as_deref())
                .unwrap_or_default()
                .to_string(),
            mac: i.mac.clone().unwrap_or_default(),
            ip_address: String::new(),
            ports: i
                .port_forwards
                .iter()
                .map(|f| PublishedPort {
                    protocol: f.protocol.to_ascii_uppercase(),
                    port: f.port,
                    host_address: f.address.clone(),
                    host_port: f.host_port,
                })
                .collect(),
        })
        .collect()
}
