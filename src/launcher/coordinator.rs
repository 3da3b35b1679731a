//! The launcher's fields: the parts it coordinates, and the VM's `State` under its one lock.
//! Defined here, below the jobs (`tasks`, `sync`, `migration_source`, `reconciler`, ...) that extend
//! it with `impl Launcher`, so that they import it from a sibling, never from `mod.rs`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;

use tokio::sync::watch;

use crate::domain;
use crate::host::block::BlockDevices;
use crate::lifecycle::{self, Observation, VmState};
use crate::spec::Validated;

use super::detaches::Detaches;
use super::kept_parse::KeptParse;
use super::last_sync::LastSync;
use super::life::Life;
use super::link::Link;
use super::live_view::LiveView;
use super::migration_part::Migration;
use super::pins::ImagePins;
use super::signals::Signals;
use super::status_hub::StatusHub;
use super::synced_domain::SyncedDomain;
use super::task_slot::TaskSlot;
use super::types::{InterfaceStatus, LaunchOptions, TaskInfo, VolumeStatus};

#[derive(Debug)]
pub(super) struct State {
    pub(super) observation: Observation,
    pub(super) vm_state: VmState,
    pub(super) task: Option<TaskInfo>,
    /// Running, terminating, or over and how (`life`): what was five flags.
    pub(super) life: Life,
    /// When the domain was first seen stopped without a task (reboot window).
    pub(super) stop_seen: Option<Instant>,
    pub(super) restart_at: Option<Instant>,
    pub(super) restarts: u32,
    pub(super) last_started: Option<Instant>,
    pub(super) volumes: BTreeMap<String, VolumeStatus>,
    pub(super) interfaces: Vec<InterfaceStatus>,
    /// The domain's vCPUs and memory as libvirt last showed them; `None` before the first read.
    pub(super) resources: Option<domain::LiveResources>,
    /// The last Sync's failure, shown as condition `Synchronized=false`.
    pub(super) sync_failure: Option<String>,
    /// The launcher undefined the domain itself (to start it afresh) and has not defined it
    /// again: a missing domain is then not a lost one.
    pub(super) undefined_by_us: bool,
    /// The last I/O error libvirt reported, shown with the `Paused` condition.
    pub(super) io_error: Option<String>,
    /// libvirt's word on the guest agent's channel (its live XML, then its agent events): the
    /// condition `AgentConnected` while the domain runs.
    pub(super) agent_connected: bool,
    /// Agent events handled so far: a live XML read before the last one is older news.
    pub(super) agent_events: u64,
    /// The spec the domain was made from or last synced to.
    pub(super) spec: Validated,
    /// `spec` as the Sync that accepted it converted it; `None` until a Sync did.
    pub(super) spec_domain: Option<SyncedDomain>,
    /// The migration in flight or last ended.
    pub(super) migration: Migration,
}

impl State {
    /// The state of a launcher that has not looked at its domain yet, for `spec`.
    pub(super) fn new(spec: Validated) -> State {
        State {
            observation: Observation::NotCreated,
            vm_state: VmState::Building,
            task: None,
            life: Life::default(),
            stop_seen: None,
            restart_at: None,
            restarts: 0,
            last_started: None,
            volumes: BTreeMap::new(),
            interfaces: Vec::new(),
            resources: None,
            sync_failure: None,
            io_error: None,
            agent_connected: false,
            agent_events: 0,
            undefined_by_us: false,
            spec,
            spec_domain: None,
            migration: Migration::default(),
        }
    }

    /// The part of the state the restart rules of `lifecycle` read and write.
    pub(super) fn restarts(&self) -> lifecycle::Restarts {
        lifecycle::Restarts {
            vm_state: self.vm_state,
            stop_seen: self.stop_seen,
            restart_at: self.restart_at,
            restarts: self.restarts,
            last_started: self.last_started,
            finished: self.life.is_finished(),
        }
    }

    pub(super) fn set_restarts(&mut self, r: lifecycle::Restarts) {
        self.vm_state = r.vm_state;
        self.stop_seen = r.stop_seen;
        self.restart_at = r.restart_at;
        self.restarts = r.restarts;
        self.last_started = r.last_started;
        // The restart rules only ever make the VM final, never revive it.
        if r.finished {
            self.life = self.life.finish();
        }
    }

    /// The spec is now `vmi`, converted as `domain` when the caller converted it.
    pub(super) fn set_spec(&mut self, vmi: Validated, domain: Option<SyncedDomain>) {
        self.spec = vmi;
        self.spec_domain = domain;
    }

    /// When the reconciler must look again without an event.
    pub(super) fn timer(&self) -> Option<Instant> {
        let window = self.stop_seen.map(|t| t + lifecycle::REBOOT_WINDOW);
        match (window, self.restart_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The launcher: a coordinator of owned parts, each with its own state and locks and the rule
/// of who may take them in its own module. Between parts, the order for the few places that
/// hold two: the task slot (async, held for a whole task) before anything else; `state` before
/// the hub's sequence lock (`update` publishes under the state lock, so the stream's order is
/// the order of the updates); the link and the live view's read lock after the task slot.
/// Everything else is a leaf: taken alone, never while calling out, never with `state` held.
/// Two parts take no lock of their own: the migration (`migration_part::Migration`, a value
/// inside `State`, moved only inside `update`, its marker file only with the task slot held)
/// and the pins (`pins`, files made and removed only with the task slot held or at the end).
#[derive(Debug)]
pub(crate) struct Launcher {
    pub(super) link: Link,
    pub(super) domain_name: String,
    pub(super) options: LaunchOptions,
    pub(super) state: Mutex<State>,
    /// The status, its followers and the event stream.
    pub(super) hub: StatusHub,
    pub(super) tasks: TaskSlot,
    pub(super) signals: Signals,
    pub(super) detaches: Detaches,
    /// Nodes and device rules of block volumes (`host::records` on disk).
    pub(super) block: BlockDevices,
    pub(super) last_sync: LastSync,
    /// Volumes waiting for their source, and the path each waits for: watched, so that they are
    /// attached as soon as it appears.
    pub(super) pending: watch::Sender<BTreeMap<String, PathBuf>>,
    pub(super) live: LiveView,
    /// The last spec text a Sync parsed, and its parse.
    pub(super) kept_parse: KeptParse,
    /// The images pinned for QEMU (`pins`).
    pub(super) pins: ImagePins,
    /// The kernel and initrd copied for the first start while libvirtd started (`start`):
    /// the spec's (host) paths and the copies. Taken by that start if the paths are the same.
    pub(super) staged_boot: Mutex<Option<(domain::KernelBootDef, domain::KernelBootDef)>>,
    /// The versioned machine libvirt wrote for each alias the spec named (`q35` →
    /// `pc-q35-7.2`), learnt from this launcher's first definition: every later definition
    /// names it, so that a restart boots the machine the guest first saw, whatever QEMU now
    /// calls the alias.
    pub(super) machines: Mutex<BTreeMap<String, String>>,
}
