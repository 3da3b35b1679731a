//! What the launcher's parts and jobs share, defined below all of them: the launcher's options,
//! the requests (a Sync, its block sources, what it plans and did), and what it reports (the
//! status, its volumes, interfaces and migration, the event stream). Every file of `launcher/`
//! takes these from here, none from `launcher/mod.rs` (the module's face, which re-exports
//! them to the rest of the crate): `scripts/module-cycles.py` fails on an upward import.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::convert::ConvertOptions;
use crate::host::cgroup::CgroupRoots;
use crate::host::devnode::{DevNumber, NodeOwner};
use crate::libvirt::migrate::JobProgress;
use crate::lifecycle::{
    Command, Phase, PhaseReason, PowerState, PrintableStatus, RunStrategy, VmState,
};

/// How long a detach may take before the volume is reported stuck in `Detaching`.
pub(crate) const DETACH_TIMEOUT: Duration = Duration::from_secs(30);
/// KubeVirt's default grace period.
pub(crate) const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(30);
/// How long libvirt may take to report a destroyed domain as stopped.
pub(super) const DESTROY_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
pub(crate) struct LaunchOptions {
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
    /// Where a spec's host paths may not lead, checked on every spec the launcher takes.
    pub host_paths: crate::host::confine::HostPathPolicy,
    /// The launcher's runtime dir (what a migration target's paths are moved under).
    pub runtime_dir: PathBuf,
    /// A migration target: the domain comes from a source launcher, not from a start.
    pub incoming: bool,
    /// The hot-plugged block volumes' devices the VM starts with (a migration target's, as its
    /// source's last Sync gave them).
    pub block_devices: BTreeMap<String, BlockSource>,
    /// Migrating over TCP (`run --tls-dir`): the credentials and libvirt's copy of them.
    pub migration_tls: Option<crate::migration_tls::InstalledTls>,
}

/// Where the host side of block-device hotplug happens. The hotplug dir itself is
/// `convert.paths.hotplug_dir`.
#[derive(Debug, Clone)]
pub(crate) struct HotplugOptions {
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
    /// Where the last accepted Sync is kept (`launcher::saved`: two slots beside this path,
    /// `last-sync.0.json` and `last-sync.1.json` for `last-sync`), restored when the domain is
    /// adopted.
    pub last_sync: PathBuf,
    /// What this process lacks for block hotplug: block volumes are refused while anything is.
    pub missing_capabilities: Vec<crate::host::caps::Unavailable>,
    /// Which block devices a Sync may attach.
    pub allowed_block_devices: crate::host::block_allow::BlockAllowList,
}

/// What `start` did with the domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StartKind {
    Created,
    /// A running domain taken over; `last_sync`: with the last Sync its predecessor accepted,
    /// which stands over the spec file.
    Adopted {
        last_sync: bool,
    },
    /// The run strategy (Manual, Halted) waits for a Start call.
    NotStarted,
    /// A migration target: the disks are ready, the guest comes from its source.
    Incoming,
    /// A predecessor migrated the VM away (and was killed before it ended): nothing to run.
    MigratedAway,
}

// ---- what a Sync asks and what it plans and did

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PlannedAction {
    Attach,
    Detach,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PlannedChange {
    pub action: PlannedAction,
    pub volume: String,
    pub target: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SyncOutcome {
    pub plan: Vec<PlannedChange>,
    pub volumes: Vec<VolumeStatus>,
    /// The vCPU and memory changes, planned (dry run) or done, each with its own result.
    pub resources: Vec<ResourceChange>,
    /// The network interface changes, likewise.
    pub interfaces: Vec<NicChange>,
}

/// The block device behind a hot-plugged volume, as a Sync names it. Its serde form is part of
/// the saved Sync's file (`launcher::saved`): a renamed variant is a new file version.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub(crate) enum BlockSource {
    Path(PathBuf),
    Number(DevNumber),
}

/// One Sync request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SyncInput {
    pub spec: String,
    pub dry_run: bool,
    pub block_devices: BTreeMap<String, BlockSource>,
    /// Volumes whose attach also goes to the persistent definition.
    pub persist: BTreeSet<String>,
    /// The disk sequence (`devnode::disk_sequence`) of each block device given by number, as
    /// it was when the request was accepted: a restored request attaches a number only while
    /// it is still that disk. Filled by the launcher, not by the client.
    pub block_identities: BTreeMap<String, u64>,
}

/// A part of the guest a Sync resizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResourcePart {
    /// Enabled vCPUs.
    Cpu,
    /// Guest memory, in KiB.
    Memory,
}

impl ResourcePart {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ResourcePart::Cpu => "cpu",
            ResourcePart::Memory => "memory",
        }
    }
}

/// One resize a Sync plans or did: vCPUs, or memory in KiB, from what the domain has to what
/// the spec asks; `error` is libvirt's words when it refused. `at_restart`: the running guest
/// keeps `from` and boots next with `to` (a vCPU decrease).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ResourceChange {
    pub part: ResourcePart,
    pub from: u64,
    pub to: u64,
    pub error: Option<String>,
    pub at_restart: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NicAction {
    Attach,
    Detach,
    LinkUp,
    LinkDown,
}

impl NicAction {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            NicAction::Attach => "attach",
            NicAction::Detach => "detach",
            NicAction::LinkUp => "link-up",
            NicAction::LinkDown => "link-down",
        }
    }
}

/// One interface change a Sync plans or did; `error` is why it failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NicChange {
    pub name: String,
    pub action: NicAction,
    pub error: Option<String>,
}

// ---- what the launcher reports

/// The events that tell a watcher how `old` volumes became `new` ones: each new or changed
/// volume, in `new`'s order, then each removed one, in `old`'s. Both are sorted by name (the
/// state keeps them in a map), so one walk over the two finds them: with a status rebuilt for
/// every volume's change, a pairwise search made a Sync of n disks cost n³ name comparisons.
pub(super) fn volume_changes(old: &[VolumeStatus], new: &[VolumeStatus]) -> Vec<EventKind> {
    let mut changed = Vec::new();
    let mut removed = Vec::new();
    let (mut old, mut new) = (old.iter().peekable(), new.iter().peekable());
    loop {
        match (old.peek(), new.peek()) {
            (None, None) => break,
            (Some(o), Some(n)) if o.name == n.name => {
                if o != n {
                    changed.push(EventKind::Volume(Box::new((*n).clone())));
                }
                old.next();
                new.next();
            }
            (Some(o), Some(n)) if o.name < n.name => {
                removed.push(EventKind::VolumeRemoved(o.name.clone()));
                old.next();
            }
            (Some(o), None) => {
                removed.push(EventKind::VolumeRemoved(o.name.clone()));
                old.next();
            }
            (_, Some(n)) => {
                changed.push(EventKind::Volume(Box::new((*n).clone())));
                new.next();
            }
        }
    }
    changed.append(&mut removed);
    changed
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum VolumePhase {
    Pending,
    Attaching,
    Ready,
    Detaching,
    Failed,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VolumeStatus {
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

/// A network interface as libvirt runs it (read from the live XML at every start and adoption).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InterfaceStatus {
    pub name: String,
    pub mac: String,
    /// Empty when unknown (QEMU's user-mode network does not report its DHCP leases).
    pub ip_address: String,
    pub ports: Vec<PublishedPort>,
}

/// A guest port published on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PublishedPort {
    /// `TCP` or `UDP`, as KubeVirt spells them.
    pub protocol: String,
    pub port: u16,
    pub host_address: String,
    pub host_port: u16,
}

/// The vCPUs: the topology the spec asks for, and what the guest has enabled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CpuStatus {
    pub sockets: u32,
    pub cores: u32,
    pub threads: u32,
    /// The room for CPU hotplug, when the spec gives one.
    pub max_sockets: Option<u32>,
    /// vCPUs the domain has enabled (libvirt's count; the guest onlines them itself).
    pub vcpus_online: u32,
}

/// Guest memory in bytes: booted with, asked for, plugged by the guest, and the room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MemoryStatus {
    pub guest_at_boot: u64,
    pub requested: u64,
    pub current: u64,
    pub max_guest: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TaskInfo {
    pub id: u64,
    pub command: Command,
}

/// The condition shown while libvirt says the guest agent is connected (KubeVirt's
/// `VirtualMachineInstanceAgentConnected`).
pub(crate) const AGENT_CONNECTED: &str = "AgentConnected";

/// A condition, KubeVirt style.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Condition {
    pub kind: &'static str,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

/// Everything `GetStatus` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Status {
    pub phase: Phase,
    pub phase_reason: Option<PhaseReason>,
    pub printable_status: PrintableStatus,
    pub power_state: Option<PowerState>,
    pub vm_state: VmState,
    pub task: Option<TaskInfo>,
    pub conditions: Vec<Condition>,
    pub volumes: Vec<VolumeStatus>,
    pub interfaces: Vec<InterfaceStatus>,
    /// Once libvirt has shown the domain.
    pub cpu: Option<CpuStatus>,
    pub memory: Option<MemoryStatus>,
    pub domain_name: String,
    pub libvirt_uri: String,
    pub run_strategy: RunStrategy,
    /// Restarts by the run strategy since the VM last ran stably.
    pub restart_count: u32,
    /// When the pending restart happens (CrashLoopBackOff).
    pub next_restart: Option<Instant>,
    /// The VM will not run again under this launcher; a pod's launcher exits.
    pub finished: bool,
    /// The migration in flight or last ended.
    pub migration: Option<MigrationStatus>,
    /// Where the guest's serial console and VNC display are reached.
    pub consoles: crate::convert::Consoles,
}

impl Status {
    /// What shows the VM's course to someone following it.
    pub(super) fn course(
        &self,
    ) -> (
        Phase,
        PrintableStatus,
        &Option<PowerState>,
        Option<PhaseReason>,
        bool,
    ) {
        (
            self.phase,
            self.printable_status,
            &self.power_state,
            self.phase_reason,
            self.finished,
        )
    }

    /// What the stream reports as a status change: everything but the volumes (they have their
    /// own events) and the interfaces.
    pub(super) fn summary_differs(&self, other: &Status) -> bool {
        (
            self.phase,
            self.printable_status,
            &self.power_state,
            self.vm_state,
            self.task,
            &self.conditions,
            self.restart_count,
            self.finished,
            self.cpu,
            self.memory,
            &self.migration,
        ) != (
            other.phase,
            other.printable_status,
            &other.power_state,
            other.vm_state,
            other.task,
            &other.conditions,
            other.restart_count,
            other.finished,
            other.cpu,
            other.memory,
            &other.migration,
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TaskOutcome {
    Started,
    Succeeded,
    Failed(String),
}

/// One entry of the `WatchEvents` stream.
///
/// Kept small, its larger payloads boxed: the stream's buffer holds `EVENT_BUFFER` of them,
/// allocated and written when the launcher starts (with a volume's status inline, 184 bytes a
/// slot: 184 KiB of heap for the launcher's whole life).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EventKind {
    /// The whole current status: first on every stream, and instead of anything a slow
    /// subscriber missed.
    Resync(Box<Status>),
    /// The status (phase, printable status, power/vm/task state, conditions) changed.
    Status(Box<Status>),
    Volume(Box<VolumeStatus>),
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
pub(crate) struct LauncherEvent {
    /// Strictly increasing, without gaps on a stream that was not resynced.
    pub seq: u64,
    pub kind: EventKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MigrationRole {
    Source,
    Target,
}

impl MigrationRole {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            MigrationRole::Source => "source",
            MigrationRole::Target => "target",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MigrationState {
    /// A target no source has come to yet.
    Waiting,
    /// The source asks the target to get ready; the target makes its disks.
    Preparing,
    /// The guest's memory and disks are on their way.
    Migrating,
    Completed,
    Failed,
    Cancelled,
}

impl MigrationState {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            MigrationState::Waiting => "Waiting",
            MigrationState::Preparing => "Preparing",
            MigrationState::Migrating => "Migrating",
            MigrationState::Completed => "Completed",
            MigrationState::Failed => "Failed",
            MigrationState::Cancelled => "Cancelled",
        }
    }

    pub(crate) fn is_over(self) -> bool {
        matches!(
            self,
            MigrationState::Completed | MigrationState::Failed | MigrationState::Cancelled
        )
    }
}

/// The migration in flight or last ended, as status shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MigrationStatus {
    pub role: MigrationRole,
    pub state: MigrationState,
    /// The target's API socket (on the source), the source's libvirt (on the target).
    pub peer: String,
    pub progress: JobProgress,
    pub started: Instant,
    /// Set when it ended.
    pub took: Option<Duration>,
    pub message: String,
}

impl MigrationStatus {
    pub(crate) fn new(role: MigrationRole, state: MigrationState, peer: String) -> Self {
        MigrationStatus {
            role,
            state,
            peer,
            progress: JobProgress::default(),
            started: Instant::now(),
            took: None,
            message: String::new(),
        }
    }

    /// A target whose guest has not arrived yet.
    pub(crate) fn is_incoming(&self) -> bool {
        self.role == MigrationRole::Target && !self.state.is_over()
    }

    /// A source whose guest has not left yet.
    pub(crate) fn is_outgoing(&self) -> bool {
        self.role == MigrationRole::Source && !self.state.is_over()
    }

    pub(crate) fn elapsed(&self) -> Duration {
        self.took.unwrap_or_else(|| self.started.elapsed())
    }

    pub(super) fn end(&mut self, state: MigrationState, message: String) {
        self.state = state;
        self.message = message;
        self.took = Some(self.started.elapsed());
    }
}
