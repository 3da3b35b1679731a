//! What the launcher reports: the status `GetStatus` returns, the `WatchEvents` stream, and how
//! both are derived from the state (`status_of`), KubeVirt's conditions included.

use super::coordinator::{Launcher, State};
use super::types::{Condition, CpuStatus, MemoryStatus, Status, AGENT_CONNECTED};
use crate::domain::LiveResources;
use crate::lifecycle::{
    self, Observation, Phase, PhaseReason, PowerState, PrintableStatus, Progress, RunStrategy,
    VmState,
};
use crate::spec::Validated;

impl Launcher {
    pub(super) fn status_of(&self, s: &State) -> Status {
        // A VM that left by migration ended well here; a target's guest that never came did not,
        // and one on its way is not here yet.
        let incoming = s.migration.is_incoming();
        let (phase, phase_reason) = phase_of(s, incoming);
        let power_state = match &s.observation {
            Observation::Domain(p) => Some(p.clone()),
            _ => None,
        };
        let conditions = conditions(s, power_state.as_ref());
        let progress = Progress {
            vm_state: s.vm_state,
            task: s.task.map(|t| t.command.task()),
            terminating: s.life.terminated(),
            restart_pending: s.restart_at.is_some(),
            finished: s.life.is_finished(),
        };
        Status {
            phase,
            phase_reason,
            printable_status: if incoming && phase == Phase::Scheduled {
                PrintableStatus::Migrating
            } else {
                lifecycle::printable_status(&s.observation, phase, progress)
            },
            power_state,
            vm_state: s.vm_state,
            task: s.task,
            conditions,
            volumes: s.volumes.values().cloned().collect(),
            interfaces: s.interfaces.clone(),
            cpu: s.resources.as_ref().map(|r| cpu_status(&s.spec, r)),
            memory: s.resources.as_ref().map(|r| memory_status(&s.spec, r)),
            domain_name: self.domain_name.clone(),
            libvirt_uri: self.link.connector().uri(),
            run_strategy: self.options.strategy,
            restart_count: s.restarts,
            next_restart: s.restart_at,
            finished: s.life.is_finished(),
            migration: s.migration.status().cloned(),
            consoles: crate::convert::Consoles::of(
                &s.spec.spec.domain.devices,
                &self.options.convert.paths,
            ),
        }
    }
}

/// The phase and its reason: a migration's end first, a target waiting for its guest, else
/// what libvirt shows.
fn phase_of(s: &State, incoming: bool) -> (Phase, Option<PhaseReason>) {
    // A source's migration followed after a restart, seen to end before the reconciler
    // said so: the same end, without a moment of "lost".
    let following = s.migration.is_outgoing();
    let gone = super::migration_part::left_by_migration(&s.observation);
    if s.life.is_migrated_away() || (following && gone) {
        (Phase::Succeeded, Some(PhaseReason::Migrated))
    } else if s.life.is_migration_lost() || (incoming && s.observation == Observation::Vanished) {
        (Phase::Failed, Some(PhaseReason::MigrationFailed))
    } else if incoming {
        (Phase::Scheduled, None)
    } else {
        (
            lifecycle::phase(&s.observation, s.life.grace_expired()),
            lifecycle::phase_reason(&s.observation, s.life.grace_expired()),
        )
    }
}

/// KubeVirt's conditions: Paused, waiting for a restart, AgentConnected, Synchronized.
fn conditions(s: &State, power_state: Option<&PowerState>) -> Vec<Condition> {
    let mut conditions = Vec::new();
    if let Some(p) = power_state.filter(|p| p.state == lifecycle::DomainState::Paused) {
        conditions.push(Condition {
            kind: "Paused",
            status: true,
            reason: lifecycle::pause_reason(&p.reason).into(),
            message: match (&s.io_error, p.reason.as_str()) {
                (Some(e), "ioerror") => e.clone(),
                _ => format!("libvirt reports paused ({})", p.reason),
            },
        });
    }
    if let Some(waiting) = s
        .resources
        .as_ref()
        .and_then(|r| restart_required(&s.spec, r))
    {
        conditions.push(waiting);
    }
    // As virt-handler sets it from the channel's state; a domain that stopped has no agent,
    // whatever libvirt last said (it sends no agent event when QEMU ends).
    let running = power_state.is_some_and(|p| p.state.is_active());
    if s.agent_connected && running {
        conditions.push(Condition {
            kind: AGENT_CONNECTED,
            status: true,
            reason: String::new(),
            message: String::new(),
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
    conditions
}

/// The spec's topology (sockets from `resources` when it gives none) with the live count.
fn cpu_status(spec: &Validated, live: &LiveResources) -> CpuStatus {
    let cpu = spec.spec.domain.cpu.clone().unwrap_or_default();
    let topology_given = cpu.sockets.is_some() || cpu.cores.is_some() || cpu.threads.is_some();
    let sockets = match cpu.sockets {
        Some(sockets) => sockets,
        None if topology_given => 1,
        None => crate::spec::resource_cpus(spec).unwrap_or(1),
    };
    CpuStatus {
        sockets,
        cores: cpu.cores.unwrap_or(1),
        threads: cpu.threads.unwrap_or(1),
        max_sockets: cpu.max_sockets,
        vcpus_online: live.vcpus,
    }
}

fn memory_status(spec: &Validated, live: &LiveResources) -> MemoryStatus {
    MemoryStatus {
        guest_at_boot: live.memory_at_boot_kib * 1024,
        requested: live.requested_kib() * 1024,
        current: live.current_kib() * 1024,
        max_guest: spec
            .spec
            .domain
            .memory
            .as_ref()
            .and_then(|m| m.max_guest.as_ref())
            .and_then(|q| q.to_bytes().ok()),
    }
}

pub(super) fn placeholder_status(domain_name: &str, uri: &str, strategy: RunStrategy) -> Status {
    Status {
        phase: Phase::Scheduled,
        phase_reason: None,
        printable_status: PrintableStatus::Starting,
        power_state: None,
        vm_state: VmState::Building,
        task: None,
        conditions: Vec::new(),
        volumes: Vec::new(),
        interfaces: Vec::new(),
        cpu: None,
        memory: None,
        domain_name: domain_name.into(),
        libvirt_uri: uri.into(),
        run_strategy: strategy,
        restart_count: 0,
        next_restart: None,
        finished: false,
        migration: None,
        consoles: Default::default(),
    }
}

/// What a migration target shows before a source has come: no VM, waiting for one.
pub(crate) fn waiting_status(uri: &str) -> Status {
    Status {
        printable_status: PrintableStatus::WaitingForMigration,
        migration: Some(super::types::MigrationStatus::new(
            super::types::MigrationRole::Target,
            super::types::MigrationState::Waiting,
            String::new(),
        )),
        ..placeholder_status("", uri, RunStrategy::Once)
    }
}

/// A volume's status, for tests.
/// `RestartRequired` while the running guest has more vCPUs than `spec` asks: the decrease
/// waits for the next boot (a start boots the spec). KubeVirt's condition type and words.
fn restart_required(spec: &Validated, live: &LiveResources) -> Option<Condition> {
    let asked = crate::convert::vcpus_enabled(spec)?;
    (asked < live.vcpus).then(|| Condition {
        kind: "RestartRequired",
        status: true,
        reason: "VCPUDecrease".into(),
        message: format!(
            "Reduction of CPU socket count requires a restart: the guest has {} vCPUs and boots \
             next with {asked}",
            live.vcpus
        ),
    })
}

#[cfg(test)]
pub(super) fn test_volume(
    name: &str,
    phase: super::types::VolumePhase,
) -> super::types::VolumeStatus {
    super::types::VolumeStatus {
        name: name.into(),
        target: "sda".into(),
        serial: String::new(),
        bus: "scsi".into(),
        phase,
        reason: String::new(),
        message: String::new(),
        boot: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launcher::types::{
        volume_changes, EventKind, LauncherEvent, VolumePhase, VolumeStatus,
    };

    fn volume(name: &str, phase: VolumePhase) -> VolumeStatus {
        test_volume(name, phase)
    }

    #[test]
    fn volume_changes_are_the_new_and_changed_then_the_removed() {
        use VolumePhase::{Attaching, Detaching, Ready};
        let old = [
            volume("a", Ready),
            volume("c", Attaching),
            volume("d", Ready),
            volume("f", Ready),
        ];
        let new = [
            volume("b", Attaching),
            volume("c", Ready),
            volume("d", Ready),
            volume("e", Detaching),
        ];
        assert_eq!(
            volume_changes(&old, &new),
            [
                EventKind::Volume(Box::new(volume("b", Attaching))),
                EventKind::Volume(Box::new(volume("c", Ready))),
                EventKind::Volume(Box::new(volume("e", Detaching))),
                EventKind::VolumeRemoved("a".into()),
                EventKind::VolumeRemoved("f".into()),
            ]
        );
        assert_eq!(volume_changes(&new, &new), []);
        assert_eq!(
            volume_changes(&[], &old[..1]),
            [EventKind::Volume(Box::new(volume("a", Ready)))]
        );
        assert_eq!(
            volume_changes(&old[..1], &[]),
            [EventKind::VolumeRemoved("a".into())]
        );
    }

    #[test]
    fn an_event_is_at_most_eight_words() {
        // The stream's buffer is EVENT_BUFFER of these, allocated at start (see EventKind).
        assert!(
            std::mem::size_of::<LauncherEvent>() <= 64,
            "LauncherEvent is {} bytes: box the large variant",
            std::mem::size_of::<LauncherEvent>()
        );
    }

    #[test]
    fn a_new_launcher_reports_scheduled_and_starting() {
        let s = placeholder_status("ns_vm", "qemu:///system", RunStrategy::Always);
        assert_eq!(
            (s.phase, s.printable_status, s.vm_state, s.finished),
            (
                Phase::Scheduled,
                PrintableStatus::Starting,
                VmState::Building,
                false
            )
        );
        assert_eq!(
            (
                s.domain_name.as_str(),
                s.libvirt_uri.as_str(),
                s.run_strategy
            ),
            ("ns_vm", "qemu:///system", RunStrategy::Always)
        );
    }

    #[test]
    fn a_status_event_is_about_everything_but_the_volumes() {
        let base = placeholder_status("ns_vm", "qemu:///system", RunStrategy::Once);
        let volumes_only = Status {
            volumes: vec![volume("a", VolumePhase::Ready)],
            ..base.clone()
        };
        assert!(!base.summary_differs(&volumes_only));
        let changes = [
            Status {
                phase: Phase::Running,
                ..base.clone()
            },
            Status {
                printable_status: PrintableStatus::Running,
                ..base.clone()
            },
            Status {
                vm_state: VmState::Active,
                ..base.clone()
            },
            Status {
                restart_count: 1,
                ..base.clone()
            },
            Status {
                finished: true,
                ..base.clone()
            },
            Status {
                conditions: vec![Condition {
                    kind: "Synchronized",
                    status: true,
                    reason: String::new(),
                    message: String::new(),
                }],
                ..base.clone()
            },
        ];
        for changed in changes {
            assert!(base.summary_differs(&changed), "{changed:?}");
        }
    }

    fn two_vcpus() -> LiveResources {
        LiveResources {
            vcpus: 2,
            max_vcpus: 4,
            memory_at_boot_kib: 1 << 20,
            virtio_mem: None,
        }
    }

    #[test]
    fn restart_is_required_while_the_guest_has_more_vcpus_than_the_spec_asks() {
        let spec = |sockets: u32| {
            crate::spec::parse_bytes(
                format!(
                    "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata:\n  name: r\n\
                     spec:\n  domain:\n    cpu:\n      sockets: {sockets}\n      maxSockets: 4\n\
                     \x20   memory:\n      guest: 128Mi\n    devices: {{}}\n"
                )
                .as_bytes(),
            )
            .unwrap()
        };
        let condition = restart_required(&spec(1), &two_vcpus()).expect("a waiting decrease");
        assert_eq!(
            (condition.kind, condition.status, condition.reason.as_str()),
            ("RestartRequired", true, "VCPUDecrease")
        );
        assert!(
            condition.message.contains("has 2 vCPUs") && condition.message.contains("with 1"),
            "{}",
            condition.message
        );
        assert_eq!(restart_required(&spec(2), &two_vcpus()), None);
        // An increase not done yet is the next Sync's to retry, not a restart's.
        assert_eq!(restart_required(&spec(3), &two_vcpus()), None);
    }
}
