//! The core: one launcher, one domain. It creates (or adopts) the domain, keeps the observed state
//! true by re-reading libvirt after every event and on a periodic resync, reconciles it with what
//! the owner asked for (run strategy, vm_state), runs the owner's commands as tasks, applies `Sync`
//! (hotplug), and reconnects when libvirt goes away. Front ends (gRPC, the `run` entrypoint) only
//! call into it.
//!
//! libvirt calls block, so they run on the blocking pool. One task at a time holds `task_slot`;
//! only Kill pre-empts (a graceful stop waiting out its grace period gives way to it). The pure
//! rules live in `lifecycle`; this module executes them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::{broadcast, mpsc, oneshot, watch, Notify};

use crate::convert::{self, ConvertOptions};
use crate::domain::{self, DiskDef, DomainDef};
use crate::host::cgroup::{CgroupRoots, DeviceCgroup};
use crate::host::devnode::{self, DevNodeError, DevNumber, NodeOwner};
use crate::host::records::{NodeRecord, Records};
use crate::host::{self, BlockHostError, HostError};
use crate::hotplug::{self, Plan, PlanError};
use crate::libvirt::events::{lifecycle_event, lifecycle_names, HypervisorEvent};
use crate::libvirt::{ConnectError, Connector, Hypervisor, LibvirtError};
use crate::lifecycle::{
    self, AfterStop, Command, Observation, Phase, PowerState, Progress, Reaction, Refusal,
    RunStrategy, VmState,
};
use crate::spec::{self, SpecErrors, Validated, VirtualMachineInstance};

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
    #[error("block device of volume {volume:?}")]
    BlockDevice {
        volume: String,
        #[source]
        source: DevNodeError,
    },
    #[error("block_devices names volume {volume:?}, which is not a hot-pluggable claim (persistentVolumeClaim or dataVolume with hotpluggable: true) of the spec")]
    NotAHotplugVolume { volume: String },
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
    #[error("cannot {command}: the launcher is shutting down")]
    Terminating { command: &'static str },
    #[error("the graceful stop gave way to a Kill")]
    Preempted,
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
    pub hotplug: HotplugOptions,
    /// The spec text the VM was started from (what `GetSpec` returns before the first Sync).
    pub spec_text: String,
    /// How long to keep trying to reach a lost libvirt before giving up (phase Unknown, the
    /// launcher exits); `None` tries for ever.
    pub reconnect_timeout: Option<Duration>,
}

/// Where the host side of block-device hotplug happens. The hotplug dir itself is
/// `convert.paths.hotplug_dir`.
#[derive(Debug, Clone)]
pub struct HotplugOptions {
    /// Owner of the nodes: the user and group QEMU runs as.
    pub node_owner: NodeOwner,
    pub cgroup_roots: CgroupRoots,
    /// `/sys/dev/block`: which device numbers exist.
    pub sys_dev_block: PathBuf,
    /// `/proc`.
    pub proc_root: PathBuf,
    /// Where libvirt writes `<domain>.pid` for QEMU.
    pub qemu_pid_dir: PathBuf,
    /// The state file of what the launcher made (`host::records`).
    pub records: PathBuf,
}

/// The block device behind a hot-plugged volume, as a Sync names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlockSource {
    Path(PathBuf),
    Number(DevNumber),
}

/// One Sync request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncInput {
    pub spec: String,
    pub dry_run: bool,
    pub block_devices: BTreeMap<String, BlockSource>,
    /// Volumes whose attach also goes to the persistent definition.
    pub persist: BTreeSet<String>,
}

/// What the launcher made on the host for block volumes (saved as `host::records`).
#[derive(Debug, Default)]
struct HostState {
    /// Hot-plugged block volumes with a node of ours.
    nodes: BTreeMap<String, NodeRecord>,
    /// Block devices of the boot disks.
    boot: BTreeSet<DevNumber>,
    /// What each cgroup allows now.
    applied: BTreeMap<DeviceCgroup, BTreeSet<DevNumber>>,
    /// The device program attached per cgroup v2 directory.
    programs: BTreeMap<PathBuf, u32>,
}

impl HostState {
    /// The complete allow-list: boot disks and every hot-plugged one.
    fn wanted(&self) -> BTreeSet<DevNumber> {
        let mut all = self.boot.clone();
        all.extend(self.nodes.values().map(|n| n.dev));
        all
    }

    fn records(&self) -> Records {
        Records {
            nodes: self.nodes.clone(),
            cgroups: self
                .applied
                .iter()
                .map(|(c, d)| (c.clone(), d.clone()))
                .collect(),
            programs: self.programs.clone(),
        }
    }
}

/// Undoes the cgroup rule of a volume whose attach failed (re-applies the list without it).
struct RuleGuard<'a> {
    launcher: &'a Launcher,
    volume: String,
    armed: bool,
}

impl RuleGuard<'_> {
    fn keep(mut self) {
        self.armed = false;
    }
}

impl Drop for RuleGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            if let Err(e) = self.launcher.forget_block(&self.volume) {
                tracing::warn!(volume = %self.volume, error = %crate::error_chain(&e), "undo: cannot revoke the device rule");
            }
        }
    }
}

/// A hot-plugged block volume of a Sync: its device, or why it is not there yet.
type BlockResolution = Result<DevNumber, String>;

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
    /// The launcher undefined the domain itself (to start it afresh) and has not defined it
    /// again: a missing domain is then not a lost one.
    undefined_by_us: bool,
    /// The last I/O error libvirt reported, shown with the `Paused` condition.
    io_error: Option<String>,
    /// The spec the domain was made from or last synced to.
    spec: Validated,
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
    /// Nodes and device rules of block volumes (`host::records` on disk).
    host: Mutex<HostState>,
    /// The last Sync request (or the start spec), for `GetSpec`.
    last_input: Mutex<SyncInput>,
    /// Volumes waiting for their source, and the path each waits for: watched, so that they are
    /// attached as soon as it appears.
    pending: watch::Sender<BTreeMap<String, PathBuf>>,
    /// The block sources of the Sync being applied.
    applying: Mutex<BTreeMap<String, BlockSource>>,
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
        vmi: Validated,
        mut options: LaunchOptions,
        events: mpsc::UnboundedReceiver<HypervisorEvent>,
    ) -> Result<(Arc<Launcher>, StartKind), LauncherError> {
        let def = convert::convert(&vmi, &options.convert)?;
        let name = def.name.clone();
        let c = connector.clone();
        let hv = tokio::task::spawn_blocking(move || c.connect())
            .await
            .map_err(LauncherError::Join)??;
        // Machine aliases (`q35`) are resolved once, here, and kept for every later (re)start,
        // so the guest keeps the machine ABI it started with.
        // Only the one alias the spec uses is asked about: the host-wide capabilities would probe
        // every QEMU binary (seconds on a fresh daemon), domain capabilities probe just ours.
        let alias = vmi
            .spec
            .domain
            .machine
            .as_ref()
            .and_then(|m| m.machine_type.clone())
            .unwrap_or_else(|| convert::DEFAULT_MACHINE.to_string());
        if !options.convert.machines.contains_key(&alias) {
            match hv.canonical_machine(&alias, options.convert.virt_type) {
                Ok(Some(canonical)) => {
                    options.convert.machines.insert(alias, canonical);
                }
                Ok(None) => {}
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
            undefined_by_us: false,
            spec: vmi,
        };
        let uri = connector.uri();
        let boot_devices: BTreeSet<DevNumber> = def
            .disks
            .iter()
            .filter_map(|d| match &d.source {
                domain::DiskSource::Block(p) => devnode::device_of(p).ok(),
                _ => None,
            })
            .collect();
        let spec_text = options.spec_text.clone();
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
            host: Mutex::new(HostState::default()),
            last_input: Mutex::new(SyncInput {
                spec: spec_text,
                ..SyncInput::default()
            }),
            closing: watch::channel(false).0,
            pending: watch::channel(BTreeMap::new()).0,
            applying: Mutex::new(BTreeMap::new()),
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
        launcher.host.lock().expect("host lock").boot = boot_devices;
        launcher.adopt_records();
        tokio::spawn(reconciler(Arc::downgrade(&launcher), events));
        tokio::spawn(pending_watcher(Arc::downgrade(&launcher)));
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
        // Published while the state lock is held, so that the stream's order is the order of
        // the updates (lock order: state, then the event sequence; nothing takes them reversed).
        let mut state = self.state.lock().expect("state lock");
        change(&mut state);
        let new = self.status_of(&state);
        let old = self.changes.send_replace(new.clone());
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
        drop(state);
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
        let read = self.call(move |hv| hv.power_state(&n)).await;
        if *self.closing.borrow() {
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
                // A waiter whose detach timed out is gone: its removal is finished here.
                let waiters: Vec<_> = waiters.into_iter().filter(|w| !w.is_closed()).collect();
                if waiters.is_empty() {
                    // A removal that arrived after its detach timed out: finish it now.
                    if let Some(volume) = alias.strip_prefix(domain::USER_ALIAS_PREFIX) {
                        let detaching = self
                            .status()
                            .volumes
                            .iter()
                            .any(|v| v.name == volume && v.phase == VolumePhase::Detaching);
                        if detaching {
                            self.finish_detach(volume);
                        }
                    }
                }
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
                    // The close of its connection may have been handled first, by a reconnect
                    // that already started a new daemon: then there is nothing left to do.
                    if !self.hypervisor().is_ok_and(|hv| hv.is_alive()) {
                        self.reconnect().await;
                    }
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
        let started = Instant::now();
        loop {
            if *self.closing.borrow() || self.status().finished {
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
                self.update(|s| s.finished = true);
                return;
            }
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
        if *self.closing.borrow() {
            return;
        }
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
                        if let AfterStop::Restart { delay } =
                            lifecycle::after_stop(strategy, true, s.restarts)
                        {
                            s.restarts += 1;
                            s.restart_at = Some(Instant::now() + delay);
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
            // Already decided: a restart is pending or the VM is final. Arming the reboot window
            // again would make the reconciler's timer fire in a loop until the restart.
            if s.restart_at.is_some() || s.finished {
                s.stop_seen = None;
                return;
            }
            let Some(seen) = s.stop_seen else {
                s.stop_seen = Some(now);
                return;
            };
            if now < seen + REBOOT_WINDOW {
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
        self.refuse_while_terminating(command)?;
        // Fail fast, before waiting for the slot...
        lifecycle::admit(command, &self.observation())?;
        let slot = self.task_slot.lock().await;
        // ...and check again: the state may have moved while we waited.
        self.refresh().await;
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
        Ok(TaskGuard { _slot: slot, info })
    }

    /// Once the launcher is terminating, only the stop itself may run: nothing may start the VM
    /// again behind its back.
    fn refuse_while_terminating(&self, command: Command) -> Result<(), LauncherError> {
        let terminating = self.state.lock().expect("state lock").terminating;
        if terminating && !matches!(command, Command::Shutdown | Command::Kill) {
            return Err(LauncherError::Terminating {
                command: command.as_str(),
            });
        }
        Ok(())
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
        // Taken before waiting for the slot: a Kill asked for at any time after this pre-empts
        // this command's graceful stop.
        let preempt_generation = *self.preempt.borrow();
        if command == Command::Kill {
            self.preempt.send_modify(|n| *n += 1);
        }
        let guard = self.begin_task(command).await?;
        let id = guard.info.id;
        let result = self.perform(command, grace, preempt_generation).await;
        self.end_task(guard, result.as_ref().err().map(|e| crate::error_chain(e)));
        result.map(|()| id)
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
            Command::Pause => self.call(move |hv| hv.suspend(&n)).await,
            Command::Unpause => self.call(move |hv| hv.resume(&n)).await,
            Command::SoftReboot => self.call(move |hv| hv.reboot_acpi(&n)).await,
            Command::Reset => self.call(move |hv| hv.reset(&n)).await,
            Command::Shutdown => {
                let grace = grace.unwrap_or_else(|| self.grace_period());
                self.graceful_stop(grace, preempt_generation).await
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
            let def = convert::convert(&s.spec, &self.convert_options())?;
            (s.spec.clone(), def)
        };
        let n = self.domain_name.clone();
        if self.call(move |hv| hv.exists(&n)).await? {
            let n = self.domain_name.clone();
            self.update(|s| s.undefined_by_us = true);
            self.call(move |hv| hv.undefine(&n)).await?;
        }
        prepare_disks(&vmi, &def.disks, &self.options.convert)?;
        let (n, xml) = (self.domain_name.clone(), def.to_xml());
        self.call(move |hv| hv.define_and_start(&n, &xml)).await?;
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
        self.rebuild_volumes().await
    }

    /// Waits until the VM has stopped (a final phase), at most `limit`; false if it has not.
    /// An unreachable libvirt (phase Unknown) is not a stopped VM.
    async fn wait_stopped(&self, limit: Duration) -> bool {
        let mut changes = self.subscribe();
        let stopped = |s: &Status| s.phase.is_final();
        let waited = tokio::time::timeout(limit, changes.wait_for(stopped)).await;
        waited.is_ok()
    }

    /// ACPI power button, up to `grace` for the guest to power off, then destroy. A Kill asked
    /// for since `preempt_generation` ends the wait: this stop then fails as pre-empted, and
    /// the Kill (which runs next) does the stopping.
    async fn graceful_stop(
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
            match self.call(move |hv| hv.shutdown_acpi(&n)).await {
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
        if let Err(e) = self.call(move |hv| hv.destroy(&n)).await {
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

    /// The spec, block devices and persisted volumes of the last Sync (or the start spec).
    pub fn last_input(&self) -> SyncInput {
        let mut input = self.last_input.lock().expect("input lock").clone();
        // Block volumes the launcher holds, also when the last Sync did not repeat them.
        let host = self.host.lock().expect("host lock");
        for (name, node) in &host.nodes {
            input
                .block_devices
                .entry(name.clone())
                .or_insert(BlockSource::Number(node.dev));
        }
        input
    }

    /// Applies a whole new spec: validate, plan, then attach and detach scsi disks. Invalid
    /// input, and every block device, is checked before anything is touched; a failure of one
    /// volume does not stop the others.
    pub async fn sync_with(&self, input: SyncInput) -> Result<SyncOutcome, LauncherError> {
        let vmi = spec::parse(&input.spec)?;
        let devices = self.resolve_block_devices(&vmi, &input)?;
        let mut opts = self.convert_options();
        opts.block_volumes.extend(devices.keys().cloned());
        let desired = convert::convert(&vmi, &opts)?;
        if desired.name != self.domain_name {
            return Err(LauncherError::WrongInstance {
                running: self.domain_name.clone(),
                requested: desired.name,
            });
        }
        let guard = self.begin_task(Command::Sync).await?;
        let result = self
            .sync_locked(vmi, desired, &input, &devices, input.dry_run)
            .await;
        let failure = result.as_ref().err().map(|e| crate::error_chain(e));
        if !input.dry_run {
            self.update(|s| s.sync_failure = failure.clone());
            if failure.is_none() {
                *self.last_input.lock().expect("input lock") = input.clone();
            }
        }
        self.end_task(guard, failure);
        result
    }

    /// Checks every block device of a Sync: names, sources, device numbers. A path that is not
    /// there yet is not an error: that volume will be Pending.
    fn resolve_block_devices(
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
                    Err(DevNodeError::Missing { path }) => {
                        Err(format!("{} does not exist yet", path.display()))
                    }
                    Err(e) => return Err(refuse(e)),
                },
                BlockSource::Number(dev) => {
                    devnode::check_exists(&self.options.hotplug.sys_dev_block, *dev)
                        .map_err(refuse)?;
                    Ok(*dev)
                }
            };
            devices.insert(volume.clone(), resolved);
        }
        // A live block volume the request does not repeat keeps its device.
        let host = self.host.lock().expect("host lock");
        for (name, node) in &host.nodes {
            if hotpluggable.contains(name.as_str()) && !devices.contains_key(name) {
                devices.insert(name.clone(), Ok(node.dev));
            }
        }
        Ok(devices)
    }

    /// The host path a block volume of the Sync in flight was given by, if any.
    fn last_block_path(&self, volume: &str) -> Option<PathBuf> {
        match self.applying.lock().expect("applying lock").get(volume)? {
            BlockSource::Path(p) => Some(p.clone()),
            BlockSource::Number(_) => None,
        }
    }

    /// The converter's options with the block volumes the launcher holds.
    fn convert_options(&self) -> ConvertOptions {
        let mut opts = self.options.convert.clone();
        let host = self.host.lock().expect("host lock");
        opts.block_volumes.extend(host.nodes.keys().cloned());
        opts
    }

    async fn sync_locked(
        &self,
        vmi: Validated,
        desired: DomainDef,
        input: &SyncInput,
        devices: &BTreeMap<String, BlockResolution>,
        dry_run: bool,
    ) -> Result<SyncOutcome, LauncherError> {
        let current = {
            let s = self.state.lock().expect("state lock");
            convert::convert(&s.spec, &self.convert_options())?
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
        *self.applying.lock().expect("applying lock") = input.block_devices.clone();
        // A volume the spec no longer names and libvirt does not have (one that was pending or
        // failed) has nothing left to report.
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
        for disk in &plan.attach {
            let persist = input.persist.contains(&disk.volume);
            match devices.get(&disk.volume) {
                Some(resolution) => self.attach_block(disk, resolution, persist).await,
                None => self.attach(&vmi, disk, persist).await,
            }
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

    /// The volume waits for `path` to appear; the pending watcher retries it then.
    fn mark_pending(&self, disk: &DiskDef, reason: &str, message: String, path: PathBuf) {
        self.set_volume(disk, VolumePhase::Pending, reason, message);
        self.pending.send_modify(|p| {
            p.insert(disk.volume.clone(), path);
        });
    }

    /// Re-runs the last Sync once a pending volume's source has appeared (Sync is idempotent:
    /// only what is missing is done).
    async fn retry_pending(&self) {
        if *self.closing.borrow() {
            return;
        }
        let input = SyncInput {
            dry_run: false,
            ..self.last_input()
        };
        tracing::info!("a pending volume's source appeared; syncing again");
        if let Err(e) = self.sync_with(input).await {
            tracing::warn!(error = %crate::error_chain(&e), "retrying pending volumes failed");
        }
    }

    fn set_volume(&self, disk: &DiskDef, phase: VolumePhase, reason: &str, message: String) {
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

    async fn attach(&self, vmi: &VirtualMachineInstance, disk: &DiskDef, persist: bool) {
        if let Err(e) = prepare_disks(vmi, std::slice::from_ref(disk), &self.options.convert) {
            let LauncherError::HostDisk { source, .. } = &e else {
                unreachable!("prepare_disks only fails with HostDisk")
            };
            match source {
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
        self.attach_live(disk, persist).await;
    }

    /// The libvirt step of an attach; true if it worked.
    async fn attach_live(&self, disk: &DiskDef, persist: bool) -> bool {
        self.set_volume(disk, VolumePhase::Attaching, "", String::new());
        let (n, xml) = (self.domain_name.clone(), disk.to_xml());
        match self.call(move |hv| hv.attach(&n, &xml, persist)).await {
            Ok(()) => {
                self.set_volume(disk, VolumePhase::Ready, "", String::new());
                true
            }
            Err(e) => {
                let message = libvirt_message(&e);
                tracing::warn!(volume = %disk.volume, %message, "attach failed");
                self.set_volume(disk, VolumePhase::Failed, "AttachFailed", message);
                false
            }
        }
    }

    fn fail_block_volume(&self, disk: &DiskDef, e: &BlockHostError) {
        self.set_volume(disk, VolumePhase::Failed, e.reason(), crate::error_chain(e));
    }

    /// A hot-plugged block volume: node, then rule, then attach; each host step undone if a
    /// later one fails.
    async fn attach_block(&self, disk: &DiskDef, resolution: &BlockResolution, persist: bool) {
        let dev = match resolution {
            Ok(dev) => *dev,
            Err(why) => {
                match self.last_block_path(&disk.volume) {
                    Some(path) => self.mark_pending(disk, "SourceNotFound", why.clone(), path),
                    None => {
                        self.set_volume(disk, VolumePhase::Pending, "SourceNotFound", why.clone())
                    }
                }
                return;
            }
        };
        let started = Instant::now();
        let dir = &self.options.convert.paths.hotplug_dir;
        let node = match devnode::make_node(dir, &disk.volume, dev, self.options.hotplug.node_owner)
        {
            Ok(node) => node,
            Err(e) => return self.fail_block_volume(disk, &BlockHostError::from(e)),
        };
        let record = NodeRecord {
            path: node.path(),
            dev,
        };
        let rule = match self.allow_block(&disk.volume, record) {
            Ok(rule) => rule,
            Err(e) => return self.fail_block_volume(disk, &e),
        };
        if self.attach_live(disk, persist).await {
            rule.keep();
            node.keep();
            tracing::info!(volume = %disk.volume, %dev, elapsed = ?started.elapsed(), "block volume attached");
        }
        // Otherwise the guards revoke the rule and remove the node, in that order.
    }

    /// Adds `volume`'s device to the allow-list of every cgroup QEMU is in. The guard takes it
    /// out again unless kept.
    fn allow_block(
        &self,
        volume: &str,
        record: NodeRecord,
    ) -> Result<RuleGuard<'_>, BlockHostError> {
        let mut host = self.host.lock().expect("host lock");
        host.nodes.insert(volume.into(), record);
        if let Err(e) = self.apply_device_rules(&mut host) {
            host.nodes.remove(volume);
            if let Err(undo) = self.apply_device_rules(&mut host) {
                tracing::warn!(error = %crate::error_chain(&undo), "undo: cannot restore the device rules");
            }
            return Err(e);
        }
        Ok(RuleGuard {
            launcher: self,
            volume: volume.into(),
            armed: true,
        })
    }

    /// Takes `volume` out of the allow-list (its device stays allowed while another volume or a
    /// boot disk uses it).
    fn forget_block(&self, volume: &str) -> Result<(), BlockHostError> {
        let mut host = self.host.lock().expect("host lock");
        if host.nodes.remove(volume).is_none() {
            return Ok(());
        }
        self.apply_device_rules(&mut host)
    }

    /// Makes every cgroup QEMU is in (and every one the launcher wrote to before) allow exactly
    /// the complete list, then saves the records.
    fn apply_device_rules(&self, host: &mut HostState) -> Result<(), BlockHostError> {
        let wanted = host.wanted();
        let mut cgroups: BTreeSet<DeviceCgroup> = host.applied.keys().cloned().collect();
        let pid_file = self.qemu_pid_file();
        match host::qemu_device_cgroups(
            &pid_file,
            &self.options.hotplug.proc_root,
            &self.options.hotplug.cgroup_roots,
        ) {
            Ok(found) => cgroups.extend(found),
            // No QEMU (stopped): only the cgroups already written to are updated.
            Err(e) if cgroups.is_empty() && !wanted.is_empty() => return Err(e),
            Err(e) => tracing::debug!(error = %crate::error_chain(&e), "QEMU's cgroups unknown"),
        }
        for cgroup in cgroups {
            let previous = host.applied.get(&cgroup).cloned().unwrap_or_default();
            let attached = host.programs.contains_key(cgroup.path());
            if previous == wanted && (matches!(cgroup, DeviceCgroup::V1(_)) || attached) {
                continue;
            }
            if let Some(id) = cgroup.apply(&previous, &wanted)? {
                host.programs.insert(cgroup.path().into(), id);
            }
            host.applied.insert(cgroup, wanted.clone());
        }
        host.records().save(&self.options.hotplug.records)?;
        Ok(())
    }

    fn qemu_pid_file(&self) -> PathBuf {
        self.options
            .hotplug
            .qemu_pid_dir
            .join(format!("{}.pid", self.domain_name))
    }

    /// After a detach: unlinks the node and revokes the rule of a block volume.
    fn release_block(&self, volume: &str) -> Result<(), BlockHostError> {
        let node = self
            .host
            .lock()
            .expect("host lock")
            .nodes
            .get(volume)
            .cloned();
        let Some(node) = node else {
            return Ok(());
        };
        let dir = node.path.parent().unwrap_or(Path::new("/"));
        devnode::remove_node(dir, volume, node.dev)?;
        self.forget_block(volume)
    }

    /// At start: takes over the records a previous launcher of this runtime dir left, keeps
    /// what the live domain still uses, and cleans the rest.
    fn adopt_records(&self) {
        let records = match Records::load(&self.options.hotplug.records) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %crate::error_chain(&e), "ignoring unreadable hotplug records");
                return;
            }
        };
        if records == Records::default() {
            return;
        }
        let live: BTreeSet<String> = self.status().volumes.into_iter().map(|v| v.name).collect();
        let mut host = self.host.lock().expect("host lock");
        host.applied = records.cgroups.into_iter().collect();
        host.programs = records.programs;
        for (volume, node) in records.nodes {
            if live.contains(&volume) {
                host.nodes.insert(volume, node);
            } else {
                let dir = node.path.parent().unwrap_or(Path::new("/"));
                match devnode::remove_node(dir, &volume, node.dev) {
                    Ok(()) => {
                        tracing::info!(%volume, path = %node.path.display(), "removed a stale node")
                    }
                    Err(e) => {
                        tracing::warn!(error = %crate::error_chain(&e), "cannot remove a stale node")
                    }
                }
            }
        }
        if let Err(e) = self.apply_device_rules(&mut host) {
            tracing::warn!(error = %crate::error_chain(&e), "cannot restore the device rules");
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
        let was_detaching = self
            .status()
            .volumes
            .iter()
            .any(|v| v.name == volume && v.phase == VolumePhase::Detaching);
        set_phase(VolumePhase::Detaching, "", String::new());
        let removed = self.expect_removal(&alias);
        let (n, xml, a) = (self.domain_name.clone(), live.xml.clone(), alias.clone());
        if let Err(e) = self.call(move |hv| hv.detach(&n, &xml, &a)).await {
            self.removal_waiters
                .lock()
                .expect("waiters lock")
                .remove(&alias);
            if was_detaching {
                // libvirt still works on the earlier request: keep waiting for its event.
                set_phase(VolumePhase::Detaching, "DetachPending", libvirt_message(&e));
            } else {
                set_phase(VolumePhase::Failed, "DetachFailed", libvirt_message(&e));
            }
            return;
        }
        match tokio::time::timeout(self.detach_timeout(), removed).await {
            Ok(Ok(())) => self.finish_detach(&volume),
            _ => set_phase(
                VolumePhase::Detaching,
                "DetachTimeout",
                format!(
                    "libvirt did not report the device removed within {:?}; the next Sync retries",
                    self.detach_timeout()
                ),
            ),
        }
    }

    fn detach_timeout(&self) -> Duration {
        DETACH_TIMEOUT
    }

    /// The device is gone from the domain: clean the host side, forget the volume.
    fn finish_detach(&self, volume: &str) {
        match self.release_block(volume) {
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

/// Watches the sources pending volumes wait for, and syncs again as soon as one appears.
async fn pending_watcher(launcher: std::sync::Weak<Launcher>) {
    let Some(mut pending) = launcher.upgrade().map(|l| l.pending.subscribe()) else {
        return;
    };
    loop {
        let waiting: BTreeMap<String, PathBuf> = pending.borrow_and_update().clone();
        if waiting.is_empty() {
            if pending.changed().await.is_err() {
                return;
            }
            continue;
        }
        let paths: Vec<PathBuf> = waiting.values().cloned().collect();
        // Armed before looking, so that nothing appearing in between is missed.
        let mut watch = match crate::host::watch::PathWatch::new(&paths) {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(error = %crate::error_chain(&e), "cannot watch pending volumes' sources; the next Sync retries them");
                None
            }
        };
        if !paths.iter().any(|p| p.exists()) {
            tokio::select! {
                changed = pending.changed() => {
                    if changed.is_err() { return; }
                    continue;
                }
                woke = async { match watch.as_mut() {
                    Some(w) => w.changed().await,
                    None => std::future::pending().await,
                } } => {
                    if let Err(e) = woke {
                        tracing::warn!(error = %crate::error_chain(&e), "watching pending volumes failed");
                    }
                }
            }
            if !paths.iter().any(|p| p.exists()) {
                // Something else changed there (or a directory on the way appeared): re-arm.
                continue;
            }
        }
        let Some(l) = launcher.upgrade() else {
            return;
        };
        l.retry_pending().await;
        drop(l);
        // If the retry could not settle them (the VM is stopped, say), wait for a change rather
        // than retrying in a loop.
        if *pending.borrow() == waiting && pending.changed().await.is_err() {
            return;
        }
    }
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
