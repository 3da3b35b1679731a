//! The core: one launcher, one domain. It creates (or adopts) the domain, keeps the observed state
//! true by re-reading libvirt after every event and on a periodic resync, reconciles it with what
//! the owner asked for (run strategy, vm_state), runs the owner's commands as tasks, applies `Sync`
//! (hotplug), and reconnects when libvirt goes away. Front ends (gRPC, the `run` entrypoint) only
//! call into it.
//!
//! libvirt calls block, so they run on the blocking pool. One task at a time holds `task_slot`;
//! only Kill pre-empts (a graceful stop waiting out its grace period gives way to it). The pure
//! rules live in `lifecycle`; this module executes them.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::{broadcast, mpsc, oneshot, watch, Notify};

use crate::convert::{self, ConvertOptions};
use crate::domain::{self, DiskDef, DomainDef};
use crate::host::{self, HostError};
use crate::hotplug::{self, Plan, PlanError};
use crate::libvirt::events::{lifecycle_event, lifecycle_names, HypervisorEvent};
use crate::libvirt::{ConnectError, Connector, Hypervisor, LibvirtError};
use crate::lifecycle::{
    self, AfterStop, Command, Observation, Phase, PowerState, Progress, Reaction, Refusal,
    RunStrategy, VmState,
};
use crate::spec::{self, SpecErrors, VirtualMachineInstance};

/// How long a detach may take before the volume is reported stuck in `Detaching`.
pub const DETACH_TIMEOUT: Duration = Duration::from_secs(30);
/// KubeVirt's default grace period.
pub const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(30);
/// A stop followed by a start within this window is a reboot, not a stop.
pub const REBOOT_WINDOW: Duration = Duration::from_secs(1);
/// A VM that ran this long since its last (re)start has its back-off reset.
pub const STABLE_RUN: Duration = Duration::from_secs(60);
/// How long libvirt may take to report a destroyed domain as stopped.
const DESTROY_TIMEOUT: Duration = Duration::from_secs(30);
/// Events kept for slow `WatchEvents` subscribers before they get a resync instead.
const EVENT_BUFFER: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum LauncherError {
    #[error("invalid spec:\n{0}")]
    InvalidSpec(#[from] SpecErrors),
    #[error("the spec is for {requested}, this launcher runs {running}")]
    WrongInstance { running: String, requested: String },
    #[error("cannot change {fields} while the VM runs; only disks can be hot-plugged")]
    FrozenFieldsChanged { fields: String },
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("volume {volume:?}")]
    HostDisk {
        volume: String,
        #[source]
        source: HostError,
    },
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("the hypervisor is unreachable")]
    Unreachable,
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error(transparent)]
    Libvirt(#[from] LibvirtError),
    #[error(transparent)]
    LiveXml(#[from] domain::LiveXmlError),
    #[error("a libvirt call panicked")]
    Join(#[source] tokio::task::JoinError),
}

impl LauncherError {
    /// The failure is about reaching libvirt, not about the request.
    pub fn is_unavailable(&self) -> bool {
        match self {
            LauncherError::Unreachable
            | LauncherError::Connect(_)
            | LauncherError::Refused(Refusal::Unreachable { .. }) => true,
            LauncherError::Libvirt(l) => l.is_unavailable(),
            _ => false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum VolumePhase {
    Pending,
    Attaching,
    Ready,
    Detaching,
    Failed,
}

impl VolumePhase {
    pub fn as_str(self) -> &'static str {
        match self {
            VolumePhase::Pending => "Pending",
            VolumePhase::Attaching => "Attaching",
            VolumePhase::Ready => "Ready",
            VolumePhase::Detaching => "Detaching",
            VolumePhase::Failed => "Failed",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeStatus {
    pub name: String,
    pub target: String,
    pub serial: String,
    pub bus: String,
    pub phase: VolumePhase,
    pub reason: String,
    pub message: String,
    /// Came with the VM at boot.
    pub boot: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlannedAction {
    Attach,
    Detach,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedChange {
    pub action: PlannedAction,
    pub volume: String,
    pub target: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncOutcome {
    pub plan: Vec<PlannedChange>,
    pub volumes: Vec<VolumeStatus>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskInfo {
    pub id: u64,
    pub command: Command,
}

/// A condition, KubeVirt style.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    pub kind: &'static str,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

/// Everything `GetStatus` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub phase: Phase,
    pub phase_reason: Option<&'static str>,
    pub printable_status: &'static str,
    pub power_state: Option<PowerState>,
    pub vm_state: VmState,
    pub task: Option<TaskInfo>,
    pub conditions: Vec<Condition>,
    pub volumes: Vec<VolumeStatus>,
    pub domain_name: String,
    pub libvirt_uri: String,
    pub run_strategy: RunStrategy,
    /// Restarts by the run strategy since the VM last ran stably.
    pub restart_count: u32,
    /// When the pending restart happens (CrashLoopBackOff).
    pub next_restart: Option<Instant>,
    /// The VM will not run again under this launcher; a pod's launcher exits.
    pub finished: bool,
}

impl Status {
    /// What the stream reports as a status change: everything but the volumes (they have their
    /// own events).
    fn summary_differs(&self, other: &Status) -> bool {
        (
            self.phase,
            self.printable_status,
            &self.power_state,
            self.vm_state,
            self.task,
            &self.conditions,
            self.restart_count,
            self.finished,
        ) != (
            other.phase,
            other.printable_status,
            &other.power_state,
            other.vm_state,
            other.task,
            &other.conditions,
            other.restart_count,
            other.finished,
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskOutcome {
    Started,
    Succeeded,
    Failed(String),
}

/// One entry of the `WatchEvents` stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventKind {
    /// The whole current status: first on every stream, and instead of anything a slow
    /// subscriber missed.
    Resync(Box<Status>),
    /// The status (phase, printable status, power/vm/task state, conditions) changed.
    Status(Box<Status>),
    Volume(VolumeStatus),
    VolumeRemoved(String),
    /// A libvirt event about the domain, in libvirt's words.
    Hypervisor {
        event: String,
        detail: String,
    },
    Task {
        id: u64,
        command: Command,
        outcome: TaskOutcome,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LauncherEvent {
    /// Strictly increasing, without gaps on a stream that was not resynced.
    pub seq: u64,
    pub kind: EventKind,
}

#[derive(Debug, Clone)]
pub struct LaunchOptions {
    pub strategy: RunStrategy,
    pub convert: ConvertOptions,
    /// The periodic safety-net re-read of the real state.
    pub resync_interval: Duration,
}

#[derive(Debug)]
struct State {
    observation: Observation,
    vm_state: VmState,
    task: Option<TaskInfo>,
    destroyed_after_grace: bool,
    terminating: bool,
    finished: bool,
    /// When the domain was first seen stopped without a task (reboot window).
    stop_seen: Option<Instant>,
    restart_at: Option<Instant>,
    restarts: u32,
    last_started: Option<Instant>,
    volumes: BTreeMap<String, VolumeStatus>,
    /// The last Sync's failure, shown as condition `Synchronized=false`.
    sync_failure: Option<String>,
    /// The last I/O error libvirt reported, shown with the `Paused` condition.
    io_error: Option<String>,
    /// The spec the domain was made from or last synced to.
    spec: VirtualMachineInstance,
}

impl State {
    /// When the reconciler must look again without an event.
    fn timer(&self) -> Option<Instant> {
        let window = self.stop_seen.map(|t| t + REBOOT_WINDOW);
        match (window, self.restart_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

#[derive(Debug)]
struct EventLog {
    tx: broadcast::Sender<LauncherEvent>,
    seq: Mutex<u64>,
}

impl EventLog {
    fn publish(&self, kind: EventKind) {
        let mut seq = self.seq.lock().expect("seq lock");
        *seq += 1;
        // No subscriber is fine: the stream is for whoever listens.
        let _ = self.tx.send(LauncherEvent { seq: *seq, kind });
    }
}

/// What `start` did with the domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartKind {
    Created,
    Adopted,
    /// The run strategy (Manual, Halted) waits for a Start call.
    NotStarted,
}

#[derive(Debug)]
pub struct Launcher {
    connector: Arc<Connector>,
    hv: RwLock<Option<Arc<Hypervisor>>>,
    domain_name: String,
    options: LaunchOptions,
    state: Mutex<State>,
    changes: watch::Sender<Status>,
    events: EventLog,
    task_slot: tokio::sync::Mutex<()>,
    next_task_id: AtomicU64,
    /// Bumped by Kill so that a graceful stop in flight gives way.
    preempt: watch::Sender<u64>,
    /// Asks the reconciler to re-read and reconcile now.
    wake: Notify,
    removal_waiters: Mutex<HashMap<String, Vec<oneshot::Sender<()>>>>,
    /// Set when the launcher is going away: event streams end, so the API can stop.
    closing: watch::Sender<bool>,
}

/// Holds the task slot for one command; `Launcher::end_task` records how it went.
struct TaskGuard<'a> {
    _slot: tokio::sync::MutexGuard<'a, ()>,
    info: TaskInfo,
}

impl Launcher {
    /// Connects, then creates the domain from `vmi` (or adopts a running one of the same name,
    /// rebuilding the volume statuses from its live XML), unless the run strategy waits for a
    /// Start call. `events` must be the receiving end of the connector's channel.
    pub async fn start(
        connector: Arc<Connector>,
        vmi: VirtualMachineInstance,
        mut options: LaunchOptions,
        events: mpsc::UnboundedReceiver<HypervisorEvent>,
    ) -> Result<(Arc<Launcher>, StartKind), LauncherError> {
        let def = convert::convert(&vmi, &options.convert)
            .map_err(|convert::ConvertError::Invalid(e)| e)?;
        let name = def.name.clone();
        let c = connector.clone();
        let hv = tokio::task::spawn_blocking(move || c.connect())
            .await
            .map_err(LauncherError::Join)??;
        // Machine aliases (`q35`) are resolved once, here, and kept for every later (re)start,
        // so the guest keeps the machine ABI it started with.
        if options.convert.machines.is_empty() {
            match hv.capabilities_xml() {
                Ok(xml) => {
                    options.convert.machines = domain::canonical_machines(&xml).unwrap_or_default()
                }
                Err(e) => {
                    tracing::warn!(error = %crate::error_chain(&e), "machine types stay as written")
                }
            }
        }
        let state = State {
            observation: Observation::NotCreated,
            vm_state: VmState::Building,
            task: None,
            destroyed_after_grace: false,
            terminating: false,
            finished: false,
            stop_seen: None,
            restart_at: None,
            restarts: 0,
            last_started: None,
            volumes: BTreeMap::new(),
            sync_failure: None,
            io_error: None,
            spec: vmi,
        };
        let uri = connector.uri();
        let launcher = Arc::new(Launcher {
            connector,
            hv: RwLock::new(Some(Arc::new(hv))),
            domain_name: name.clone(),
            changes: watch::channel(placeholder_status(&name, &uri, options.strategy)).0,
            options,
            state: Mutex::new(state),
            events: EventLog {
                tx: broadcast::channel(EVENT_BUFFER).0,
                seq: Mutex::new(0),
            },
            task_slot: tokio::sync::Mutex::new(()),
            next_task_id: AtomicU64::new(1),
            preempt: watch::channel(0).0,
            wake: Notify::new(),
            removal_waiters: Mutex::new(HashMap::new()),
            closing: watch::channel(false).0,
        });
        launcher.update(|_| {});
        let n = name.clone();
        let exists = launcher.call(move |hv| hv.exists(&n)).await?;
        launcher.refresh().await;
        let active =
            matches!(&launcher.observation(), Observation::Domain(p) if p.state.is_active());
        let kind = if exists && active {
            let paused = matches!(&launcher.observation(), Observation::Domain(p) if p.state == lifecycle::DomainState::Paused);
            launcher.update(|s| {
                s.vm_state = if paused {
                    VmState::Paused
                } else {
                    VmState::Active
                };
                s.last_started = Some(Instant::now());
            });
            launcher.rebuild_volumes().await?;
            StartKind::Adopted
        } else if launcher.options.strategy.starts_at_launch() {
            launcher.command(Command::Start, None).await?;
            StartKind::Created
        } else {
            launcher.update(|s| s.vm_state = VmState::Stopped);
            StartKind::NotStarted
        };
        tokio::spawn(reconciler(Arc::downgrade(&launcher), events));
        Ok((launcher, kind))
    }

    pub fn domain_name(&self) -> &str {
        &self.domain_name
    }

    /// A receiver that sees every status change (the latest one, at least).
    pub fn subscribe(&self) -> watch::Receiver<Status> {
        self.changes.subscribe()
    }

    pub fn status(&self) -> Status {
        self.changes.borrow().clone()
    }

    /// The event stream: a resync with the current status first, then every event after it.
    pub fn watch_events(&self) -> (LauncherEvent, broadcast::Receiver<LauncherEvent>) {
        // Under the sequence lock, so no event falls between the snapshot and the subscription.
        let seq = self.events.seq.lock().expect("seq lock");
        let rx = self.events.tx.subscribe();
        let first = LauncherEvent {
            seq: *seq,
            kind: EventKind::Resync(Box::new(self.status())),
        };
        (first, rx)
    }

    /// Resolves when the launcher is going away (event streams end then).
    pub fn closing(&self) -> watch::Receiver<bool> {
        self.closing.subscribe()
    }

    /// A resync for a subscriber that fell behind.
    pub fn resync_event(&self) -> LauncherEvent {
        let seq = self.events.seq.lock().expect("seq lock");
        LauncherEvent {
            seq: *seq,
            kind: EventKind::Resync(Box::new(self.status())),
        }
    }

    fn observation(&self) -> Observation {
        self.state.lock().expect("state lock").observation.clone()
    }

    fn hypervisor(&self) -> Result<Arc<Hypervisor>, LauncherError> {
        self.hv
            .read()
            .expect("hv lock")
            .clone()
            .ok_or(LauncherError::Unreachable)
    }

    /// Runs a blocking libvirt call on the blocking pool.
    async fn call<T, F>(&self, f: F) -> Result<T, LauncherError>
    where
        T: Send + 'static,
        F: FnOnce(&Hypervisor) -> Result<T, LibvirtError> + Send + 'static,
    {
        let hv = self.hypervisor()?;
        tokio::task::spawn_blocking(move || f(&hv))
            .await
            .map_err(LauncherError::Join)?
            .map_err(LauncherError::from)
    }

    /// Changes the state, publishes the new status, and tells the stream what changed.
    fn update(&self, change: impl FnOnce(&mut State)) {
        let (old, new) = {
            let mut state = self.state.lock().expect("state lock");
            change(&mut state);
            let new = self.status_of(&state);
            (self.changes.send_replace(new.clone()), new)
        };
        if new.summary_differs(&old) {
            self.events
                .publish(EventKind::Status(Box::new(new.clone())));
        }
        let old_volumes: BTreeMap<&str, &VolumeStatus> =
            old.volumes.iter().map(|v| (v.name.as_str(), v)).collect();
        for v in &new.volumes {
            if old_volumes.get(v.name.as_str()) != Some(&v) {
                self.events.publish(EventKind::Volume(v.clone()));
            }
        }
        for v in &old.volumes {
            if !new.volumes.iter().any(|n| n.name == v.name) {
                self.events
                    .publish(EventKind::VolumeRemoved(v.name.clone()));
            }
        }
    }

    fn status_of(&self, s: &State) -> Status {
        let phase = lifecycle::phase(&s.observation, s.destroyed_after_grace);
        let power_state = match &s.observation {
            Observation::Domain(p) => Some(p.clone()),
            _ => None,
        };
        let mut conditions = Vec::new();
        if let Some(p) = power_state
            .as_ref()
            .filter(|p| p.state == lifecycle::DomainState::Paused)
        {
            conditions.push(Condition {
                kind: "Paused",
                status: true,
                reason: pause_reason(&p.reason).into(),
                message: match (&s.io_error, p.reason.as_str()) {
                    (Some(e), "ioerror") => e.clone(),
                    _ => format!("libvirt reports paused ({})", p.reason),
                },
            });
        }
        conditions.push(match &s.sync_failure {
            None => Condition {
                kind: "Synchronized",
                status: true,
                reason: String::new(),
                message: String::new(),
            },
            Some(msg) => Condition {
                kind: "Synchronized",
                status: false,
                reason: "SyncFailed".into(),
                message: msg.clone(),
            },
        });
        let progress = Progress {
            vm_state: s.vm_state,
            task: s.task.map(|t| t.command.task()),
            terminating: s.terminating,
            restart_pending: s.restart_at.is_some(),
            finished: s.finished,
        };
        Status {
            phase,
            phase_reason: lifecycle::phase_reason(&s.observation, s.destroyed_after_grace),
            printable_status: lifecycle::printable_status(&s.observation, phase, progress),
            power_state,
            vm_state: s.vm_state,
            task: s.task,
            conditions,
            volumes: s.volumes.values().cloned().collect(),
            domain_name: self.domain_name.clone(),
            libvirt_uri: self.connector.uri(),
            run_strategy: self.options.strategy,
            restart_count: s.restarts,
            next_restart: s.restart_at,
            finished: s.finished,
        }
    }

    /// Re-reads the real state from libvirt (never trusting an event's payload alone).
    async fn refresh(&self) {
        if *self.closing.borrow() {
            // Shutting down: the domain is being removed on purpose; nothing to learn.
            return;
        }
        let n = self.domain_name.clone();
        let observation = match self.call(move |hv| hv.power_state(&n)).await {
            Ok(power) => Observation::Domain(power),
            Err(LauncherError::Libvirt(LibvirtError::NoDomain { .. })) => {
                match self.observation() {
                    // Never created (Manual before its first Start): still not created.
                    Observation::NotCreated => Observation::NotCreated,
                    _ => Observation::Vanished,
                }
            }
            Err(e) => {
                tracing::warn!(error = %crate::error_chain(&e), "cannot read the domain's state");
                Observation::Unreachable
            }
        };
        self.update(|s| {
            if matches!(&observation, Observation::Domain(p) if p.state.is_active()) {
                s.stop_seen = None;
            }
            s.observation = observation;
        });
    }

    /// Rebuilds the volume list from the live XML (at start, when adopting, after a restart).
    async fn rebuild_volumes(&self) -> Result<(), LauncherError> {
        let n = self.domain_name.clone();
        let xml = self.call(move |hv| hv.live_xml(&n)).await?;
        let live = domain::live_disks(&xml)?;
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
            let volumes = live
                .iter()
                .filter_map(|d| {
                    let name = d.volume()?.to_string();
                    Some((
                        name.clone(),
                        VolumeStatus {
                            boot: boot.contains(&name.as_str()),
                            name,
                            target: d.target.clone(),
                            serial: d.serial.clone().unwrap_or_default(),
                            bus: d.bus.clone(),
                            phase: VolumePhase::Ready,
                            reason: String::new(),
                            message: String::new(),
                        },
                    ))
                })
                .collect();
            s.volumes = volumes;
        });
        Ok(())
    }

    /// Handles one libvirt event; true if the state must be re-read.
    async fn on_event(&self, event: HypervisorEvent) -> bool {
        let ours = |domain: &str| domain == self.domain_name;
        match event {
            HypervisorEvent::DeviceRemoved { domain, alias } if ours(&domain) => {
                let waiters = self
                    .removal_waiters
                    .lock()
                    .expect("waiters lock")
                    .remove(&alias)
                    .unwrap_or_default();
                for w in waiters {
                    let _ = w.send(());
                }
                false
            }
            HypervisorEvent::Lifecycle {
                domain,
                event,
                detail,
            } if ours(&domain) => {
                let (name, detail) = lifecycle_names(event, detail);
                self.events.publish(EventKind::Hypervisor {
                    event: name.into(),
                    detail: detail.into(),
                });
                // Definitions coming and going (ours, at exit) do not change the power state.
                !matches!(event, lifecycle_event::DEFINED | lifecycle_event::UNDEFINED)
            }
            HypervisorEvent::Reboot { domain } if ours(&domain) => {
                self.events.publish(EventKind::Hypervisor {
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
                tracing::warn!(%message);
                self.events.publish(EventKind::Hypervisor {
                    event: "IOError".into(),
                    detail: message.clone(),
                });
                self.update(|s| s.io_error = Some(message));
                true
            }
            HypervisorEvent::ControlError { domain } if ours(&domain) => {
                self.events.publish(EventKind::Hypervisor {
                    event: "ControlError".into(),
                    detail: String::new(),
                });
                true
            }
            _ if *self.closing.borrow() => false,
            HypervisorEvent::ConnectionClosed { reason } => {
                // A close of a connection already replaced (after a daemon restart) is old news.
                let current_alive = self.hypervisor().is_ok_and(|hv| hv.is_alive());
                if !current_alive {
                    tracing::error!(reason, "the libvirt connection closed");
                    self.reconnect().await;
                }
                true
            }
            HypervisorEvent::DaemonExited { daemon } => {
                tracing::error!(daemon, "a private daemon exited");
                self.events.publish(EventKind::Hypervisor {
                    event: "DaemonExited".into(),
                    detail: daemon.into(),
                });
                if daemon == "libvirtd" {
                    self.reconnect().await;
                } else {
                    let c = self.connector.clone();
                    match tokio::task::spawn_blocking(move || c.ensure_daemons()).await {
                        Ok(Ok(())) => {
                            tracing::info!(daemon, "restarted");
                            self.events.publish(EventKind::Hypervisor {
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
                true
            }
            _ => false,
        }
    }

    /// Marks the state Unknown and reconnects with back-off (restarting a private libvirtd that
    /// died), then rebuilds what it knows from libvirt.
    async fn reconnect(&self) {
        let old = self.hv.write().expect("hv lock").take();
        self.update(|s| s.observation = Observation::Unreachable);
        // Dropping the old connection deregisters its callbacks; off the async threads.
        if let Some(old) = old {
            let _ = tokio::task::spawn_blocking(move || drop(old)).await;
        }
        let mut delay = Duration::from_millis(100);
        loop {
            let c = self.connector.clone();
            match tokio::task::spawn_blocking(move || c.connect()).await {
                Ok(Ok(hv)) => {
                    *self.hv.write().expect("hv lock") = Some(Arc::new(hv));
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
    async fn reconcile(&self) {
        let Ok(slot) = self.task_slot.try_lock() else {
            return;
        };
        let now = Instant::now();
        let (vm_state, observation, restart_due) = {
            let s = self.state.lock().expect("state lock");
            (
                s.vm_state,
                s.observation.clone(),
                s.restart_at.is_some_and(|t| t <= now),
            )
        };
        if restart_due {
            drop(slot);
            tracing::info!(
                "restarting the VM (run strategy {})",
                self.options.strategy.as_str()
            );
            // A successful start clears the pending restart; a failed one backs off further.
            if let Err(e) = self.command(Command::Start, None).await {
                tracing::warn!(error = %crate::error_chain(&e), "restart failed");
                let strategy = self.options.strategy;
                self.update(|s| {
                    if let AfterStop::Restart { delay } =
                        lifecycle::after_stop(strategy, true, s.restarts)
                    {
                        s.restarts += 1;
                        s.restart_at = Some(Instant::now() + delay);
                    }
                });
            }
            return;
        }
        match lifecycle::reconcile(vm_state, &observation) {
            Reaction::Nothing | Reaction::KeepPaused { .. } => {}
            Reaction::Stopped { failed } => self.stopped_by_itself(failed, now),
            Reaction::ForceStop => {
                tracing::warn!("the VM runs although it was stopped; stopping it");
                let n = self.domain_name.clone();
                if let Err(e) = self.call(move |hv| hv.destroy(&n)).await {
                    tracing::warn!(error = %crate::error_chain(&e), "force stop failed");
                }
            }
            Reaction::MarkStopped => self.update(|s| s.vm_state = VmState::Stopped),
            Reaction::Lost => {
                tracing::error!("the domain vanished");
                self.update(|s| {
                    s.vm_state = VmState::Error;
                    s.finished = true;
                });
            }
        }
        drop(slot);
    }

    /// The VM stopped without a task: wait out the reboot window, then apply the run strategy.
    fn stopped_by_itself(&self, failed: bool, now: Instant) {
        let strategy = self.options.strategy;
        self.update(|s| {
            let Some(seen) = s.stop_seen else {
                s.stop_seen = Some(now);
                return;
            };
            if now < seen + REBOOT_WINDOW || s.restart_at.is_some() || s.finished {
                return;
            }
            let stable = s
                .last_started
                .is_some_and(|t| now.duration_since(t) >= STABLE_RUN);
            let restarts = if stable { 0 } else { s.restarts };
            match lifecycle::after_stop(strategy, failed, restarts) {
                AfterStop::Restart { delay } => {
                    s.restarts = restarts + 1;
                    s.restart_at = Some(now + delay);
                }
                AfterStop::WaitForStart => s.vm_state = VmState::Stopped,
                AfterStop::Finish => {
                    s.vm_state = if failed {
                        VmState::Error
                    } else {
                        VmState::Stopped
                    };
                    s.finished = true;
                }
            }
            s.stop_seen = None;
        });
    }

    /// Takes the task slot for `command` (waiting for a task in flight), re-checks it against the
    /// real state, and announces it.
    async fn begin_task(&self, command: Command) -> Result<TaskGuard<'_>, LauncherError> {
        // Fail fast, before waiting for the slot...
        lifecycle::admit(command, &self.observation())?;
        let slot = self.task_slot.lock().await;
        // ...and check again: the state may have moved while we waited.
        self.refresh().await;
        lifecycle::admit(command, &self.observation())?;
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
        Ok(TaskGuard { _slot: slot, info })
    }

    /// Settles the vm_state by how the task went (`failure` is its error, if any).
    fn end_task(&self, guard: TaskGuard<'_>, failure: Option<String>) {
        let TaskGuard { _slot, info } = guard;
        // An owner's stop is final for a VM that would never be started again by its strategy:
        // a pod's launcher then exits, as KubeVirt's does when its VMI is stopped.
        let final_stop = failure.is_none()
            && matches!(info.command, Command::Shutdown | Command::Kill)
            && matches!(
                self.options.strategy,
                RunStrategy::Once | RunStrategy::RerunOnFailure
            );
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
        drop(_slot);
        self.wake.notify_one();
    }

    /// Runs an owner's command as a task. `grace` overrides the grace period of a Shutdown.
    /// Returns the task id.
    pub async fn command(
        &self,
        command: Command,
        grace: Option<Duration>,
    ) -> Result<u64, LauncherError> {
        if command == Command::Kill {
            self.preempt.send_modify(|n| *n += 1);
        }
        let guard = self.begin_task(command).await?;
        let id = guard.info.id;
        let result = self.perform(command, grace).await;
        self.end_task(guard, result.as_ref().err().map(|e| crate::error_chain(e)));
        result.map(|()| id)
    }

    async fn perform(
        &self,
        command: Command,
        grace: Option<Duration>,
    ) -> Result<(), LauncherError> {
        let n = self.domain_name.clone();
        match command {
            Command::Start => self.start_domain().await,
            Command::Pause => self.call(move |hv| hv.suspend(&n)).await,
            Command::Unpause => self.call(move |hv| hv.resume(&n)).await,
            Command::SoftReboot => self.call(move |hv| hv.reboot_acpi(&n)).await,
            Command::Reset => self.call(move |hv| hv.reset(&n)).await,
            Command::Shutdown => {
                let grace = grace.unwrap_or_else(|| self.grace_period());
                self.graceful_stop(grace).await
            }
            Command::Kill => {
                self.call(move |hv| hv.destroy(&n)).await?;
                self.wait_stopped(DESTROY_TIMEOUT).await;
                Ok(())
            }
            Command::Sync => unreachable!("Sync runs through Launcher::sync"),
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
    async fn start_domain(&self) -> Result<(), LauncherError> {
        let (vmi, def) = {
            let s = self.state.lock().expect("state lock");
            let def = convert::convert(&s.spec, &self.options.convert)
                .map_err(|convert::ConvertError::Invalid(e)| e)?;
            (s.spec.clone(), def)
        };
        let n = self.domain_name.clone();
        if self.call(move |hv| hv.exists(&n)).await? {
            let n = self.domain_name.clone();
            self.call(move |hv| hv.undefine(&n)).await?;
        }
        prepare_disks(&vmi, &def.disks, &self.options.convert)?;
        let (n, xml) = (self.domain_name.clone(), def.to_xml());
        self.call(move |hv| hv.define_and_start(&n, &xml)).await?;
        self.update(|s| {
            s.finished = false;
            s.stop_seen = None;
            s.restart_at = None;
            s.destroyed_after_grace = false;
            s.io_error = None;
            s.last_started = Some(Instant::now());
        });
        self.refresh().await;
        self.rebuild_volumes().await
    }

    /// Waits until the VM no longer runs, at most `limit`; false if it still runs.
    async fn wait_stopped(&self, limit: Duration) -> bool {
        let mut changes = self.subscribe();
        let stopped = |s: &Status| s.phase != Phase::Running;
        let waited = tokio::time::timeout(limit, changes.wait_for(stopped)).await;
        waited.is_ok()
    }

    /// ACPI power button, up to `grace` for the guest to power off, then destroy. A Kill
    /// pre-empts the wait.
    async fn graceful_stop(&self, grace: Duration) -> Result<(), LauncherError> {
        let mut preempt = self.preempt.subscribe();
        preempt.borrow_and_update();
        let mut waited_out_grace = false;
        if !grace.is_zero() {
            let n = self.domain_name.clone();
            match self.call(move |hv| hv.shutdown_acpi(&n)).await {
                Ok(()) => {
                    tokio::select! {
                        stopped = self.wait_stopped(grace) => if stopped { return Ok(()) },
                        _ = preempt.changed() => {
                            tracing::info!("graceful stop pre-empted by Kill");
                            return Ok(());
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
        if let Err(e) = self.call(move |hv| hv.destroy(&n)).await {
            // It may have stopped by itself in the meantime; the state says.
            self.refresh().await;
            if self.status().phase == Phase::Running {
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
        let active = matches!(&self.observation(), Observation::Domain(p) if p.state.is_active());
        if active {
            if let Err(e) = self.command(Command::Shutdown, None).await {
                tracing::warn!(error = %crate::error_chain(&e), "graceful stop failed");
                let n = self.domain_name.clone();
                let _ = self.call(move |hv| hv.destroy(&n)).await;
            }
        }
        self.refresh().await;
        self.update(|s| s.finished = true);
    }

    /// Removes the stopped domain's definition and stops a private libvirtd: the launcher
    /// leaves nothing behind.
    pub async fn shut_down(&self) {
        self.closing.send_replace(true);
        let n = self.domain_name.clone();
        match self.call(move |hv| hv.undefine(&n)).await {
            Ok(()) | Err(LauncherError::Libvirt(LibvirtError::NoDomain { .. })) => {}
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

    fn expect_removal(&self, alias: &str) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        self.removal_waiters
            .lock()
            .expect("waiters lock")
            .entry(alias.to_string())
            .or_default()
            .push(tx);
        rx
    }

    /// Applies a whole new spec: validate, plan, then attach and detach scsi disks. Invalid
    /// input changes nothing; a failure of one volume does not stop the others.
    pub async fn sync(&self, spec_text: &str, dry_run: bool) -> Result<SyncOutcome, LauncherError> {
        let vmi = spec::parse(spec_text)?;
        let desired = convert::convert(&vmi, &self.options.convert)
            .map_err(|convert::ConvertError::Invalid(e)| e)?;
        if desired.name != self.domain_name {
            return Err(LauncherError::WrongInstance {
                running: self.domain_name.clone(),
                requested: desired.name,
            });
        }
        let guard = self.begin_task(Command::Sync).await?;
        let result = self.sync_locked(vmi, desired, dry_run).await;
        let failure = result.as_ref().err().map(|e| crate::error_chain(e));
        if !dry_run {
            self.update(|s| s.sync_failure = failure.clone());
        }
        self.end_task(guard, failure);
        result
    }

    async fn sync_locked(
        &self,
        vmi: VirtualMachineInstance,
        desired: DomainDef,
        dry_run: bool,
    ) -> Result<SyncOutcome, LauncherError> {
        let current = {
            let s = self.state.lock().expect("state lock");
            convert::convert(&s.spec, &self.options.convert)
                .map_err(|convert::ConvertError::Invalid(e)| e)?
        };
        let frozen = hotplug::frozen_fields_changed(&current, &desired);
        if !frozen.is_empty() {
            return Err(LauncherError::FrozenFieldsChanged {
                fields: frozen.join(", "),
            });
        }
        let n = self.domain_name.clone();
        let xml = self.call(move |hv| hv.live_xml(&n)).await?;
        let live = domain::live_disks(&xml)?;
        let plan = hotplug::plan(&live, &desired)?;
        let planned = planned_changes(&plan);
        if dry_run {
            return Ok(SyncOutcome {
                plan: planned,
                volumes: self.status().volumes,
            });
        }
        for disk in &plan.attach {
            self.attach(&vmi, disk).await;
        }
        for live_disk in &plan.detach {
            self.detach(live_disk).await;
        }
        self.update(|s| s.spec = vmi);
        Ok(SyncOutcome {
            plan: planned,
            volumes: self.status().volumes,
        })
    }

    fn set_volume(&self, disk: &DiskDef, phase: VolumePhase, reason: &str, message: String) {
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

    async fn attach(&self, vmi: &VirtualMachineInstance, disk: &DiskDef) {
        if let Err(e) = prepare_disks(vmi, std::slice::from_ref(disk), &self.options.convert) {
            let LauncherError::HostDisk { source, .. } = &e else {
                unreachable!("prepare_disks only fails with HostDisk")
            };
            let phase = match source {
                HostError::Missing { .. } => VolumePhase::Pending,
                _ => VolumePhase::Failed,
            };
            self.set_volume(disk, phase, source.reason(), source.to_string());
            return;
        }
        self.set_volume(disk, VolumePhase::Attaching, "", String::new());
        let (n, xml) = (self.domain_name.clone(), disk.to_xml());
        match self.call(move |hv| hv.attach(&n, &xml, false)).await {
            Ok(()) => self.set_volume(disk, VolumePhase::Ready, "", String::new()),
            Err(e) => {
                let message = libvirt_message(&e);
                tracing::warn!(volume = %disk.volume, %message, "attach failed");
                self.set_volume(disk, VolumePhase::Failed, "AttachFailed", message);
            }
        }
    }

    async fn detach(&self, live: &domain::LiveDisk) {
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
        set_phase(VolumePhase::Detaching, "", String::new());
        let removed = self.expect_removal(&alias);
        let (n, xml) = (self.domain_name.clone(), live.xml.clone());
        if let Err(e) = self.call(move |hv| hv.detach(&n, &xml)).await {
            self.removal_waiters
                .lock()
                .expect("waiters lock")
                .remove(&alias);
            set_phase(VolumePhase::Failed, "DetachFailed", libvirt_message(&e));
            return;
        }
        match tokio::time::timeout(DETACH_TIMEOUT, removed).await {
            Ok(Ok(())) => self.update(|s| {
                s.volumes.remove(&volume);
            }),
            _ => set_phase(
                VolumePhase::Detaching,
                "DetachTimeout",
                format!(
                    "libvirt did not report the device removed within {DETACH_TIMEOUT:?}; the next Sync retries"
                ),
            ),
        }
    }
}

/// libvirt's own words for a failed call, for a one-line status.
fn libvirt_message(e: &LauncherError) -> String {
    match e {
        LauncherError::Libvirt(l) => l.libvirt_message(),
        other => crate::error_chain(other),
    }
}

/// KubeVirt's reason names for libvirt's pause reasons.
fn pause_reason(libvirt_reason: &str) -> &'static str {
    match libvirt_reason {
        "user" => "PausedByUser",
        "ioerror" => "PausedIOError",
        "watchdog" => "PausedWatchdog",
        "migration" => "PausedMigration",
        "starting-up" => "PausedStartingUp",
        "api-error" => "PausedAPIError",
        _ => "PausedUnknown",
    }
}

fn placeholder_status(domain_name: &str, uri: &str, strategy: RunStrategy) -> Status {
    Status {
        phase: Phase::Scheduled,
        phase_reason: None,
        printable_status: "Starting",
        power_state: None,
        vm_state: VmState::Building,
        task: None,
        conditions: Vec::new(),
        volumes: Vec::new(),
        domain_name: domain_name.into(),
        libvirt_uri: uri.into(),
        run_strategy: strategy,
        restart_count: 0,
        next_restart: None,
        finished: false,
    }
}

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

/// Makes the host side of `disks` ready: checks the files and devices the spec names, creates
/// what the launcher owns (`DiskOrCreate` images, empty disks, overlays, cloud-init ISOs) where
/// `volumes` says they live.
fn prepare_disks(
    vmi: &VirtualMachineInstance,
    disks: &[DiskDef],
    opts: &ConvertOptions,
) -> Result<(), LauncherError> {
    // The VNC socket and EFI variables go there too, whatever the disks.
    host::prepare_private_dirs(&opts.paths).map_err(|source| LauncherError::HostDisk {
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
        host::prepare_volume(&resolved).map_err(|source| LauncherError::HostDisk {
            volume: disk.volume.clone(),
            source,
        })?;
    }
    Ok(())
}

/// Follows libvirt's events for as long as the launcher lives: after every event (and on the
/// periodic resync, and when a timer falls due) it re-reads the real state and reconciles.
async fn reconciler(
    launcher: std::sync::Weak<Launcher>,
    mut events: mpsc::UnboundedReceiver<HypervisorEvent>,
) {
    let interval = match launcher.upgrade() {
        Some(l) => l.options.resync_interval,
        None => return,
    };
    let mut resync = tokio::time::interval(interval);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let Some(l) = launcher.upgrade() else {
            return;
        };
        let timer = l.state.lock().expect("state lock").timer();
        let sleep_until = timer.unwrap_or_else(Instant::now);
        let look = tokio::select! {
            event = events.recv() => match event {
                Some(event) => {
                    tracing::debug!(?event, "libvirt event");
                    l.on_event(event).await
                }
                None => return,
            },
            _ = resync.tick() => true,
            _ = l.wake.notified() => true,
            _ = tokio::time::sleep_until(sleep_until.into()), if timer.is_some() => true,
        };
        if look {
            l.refresh().await;
            if matches!(l.observation(), Observation::Unreachable) {
                l.reconnect().await;
                l.refresh().await;
            }
            l.reconcile().await;
        }
    }
}

/// Where the launcher keeps what it owns for one VM.
#[derive(Debug, Clone)]
pub struct RuntimeDir(pub PathBuf);

impl RuntimeDir {
    pub fn socket(&self) -> PathBuf {
        self.0.join("launcher.sock")
    }
    pub fn console_log(&self) -> PathBuf {
        self.0.join("console.log")
    }
    pub fn libvirt_dir(&self) -> PathBuf {
        self.0.join("libvirt")
    }
}
