//! The VM's state model (`docs/DESIGN.md` §3), all pure functions with no I/O:
//! - power state: what libvirt says ([`PowerState`], from the `libvirt` module);
//! - vm_state: the stable state the owner asked for, changed only when a task ends (`settle`);
//! - task_state: the one transition in flight (`TaskKind`), admitted by `admit`;
//! - the KubeVirt phase, *derived* by a total function (`phase`), so there is never a gap;
//! - what to do about an observation when no task runs (`reconcile`) and after a stop
//!   (`after_stop`), by the run strategy, with the reboot window and the back-off
//!   (`after_unasked_stop`, `after_failed_restart`);
//! - which stops are final (`owner_stop_is_final`) and what a pause is called
//!   (`pause_reason`).
//!
//! `tasks` holds what an owner asks (commands, admission, settling), `strategy` what the
//! launcher does by itself (run strategies, restarts).

mod strategy;
mod tasks;

use std::fmt;

pub use strategy::RunStrategy;
pub(crate) use strategy::{
    after_failed_restart, after_unasked_stop, reconcile, Reaction, Restarts, REBOOT_WINDOW,
};
pub(crate) use tasks::{admit, owner_stop_is_final, settle, TaskKind, VmState};
pub use tasks::{Command, Refusal};

/// libvirt's domain state (`virDomainState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DomainState {
    NoState,
    Running,
    Blocked,
    Paused,
    ShuttingDown,
    Shutoff,
    Crashed,
    PmSuspended,
}

impl DomainState {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            DomainState::NoState => "nostate",
            DomainState::Running => "running",
            DomainState::Blocked => "blocked",
            DomainState::Paused => "paused",
            DomainState::ShuttingDown => "shutdown",
            DomainState::Shutoff => "shutoff",
            DomainState::Crashed => "crashed",
            DomainState::PmSuspended => "pmsuspended",
        }
    }

    /// QEMU is there and the guest can run or resume.
    pub(crate) fn is_active(self) -> bool {
        !matches!(
            self,
            DomainState::Shutoff | DomainState::Crashed | DomainState::NoState
        )
    }

    /// Off, or on its way off: QEMU reported the guest's shutdown and is exiting. A power
    /// button press has nothing left to do for it (libvirt refuses one in either case).
    pub(crate) fn is_off_or_going_off(self) -> bool {
        !self.is_active() || self == DomainState::ShuttingDown
    }
}

/// What the hypervisor reports: state and reason, e.g. `shutoff (destroyed)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PowerState {
    pub state: DomainState,
    /// libvirt's reason, in libvirt's own words (`booted`, `user`, `ioerror`, `shutdown`...).
    pub reason: String,
}

impl fmt::Display for PowerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.state.as_str(), self.reason)
    }
}

/// What the launcher currently knows about its domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Observation {
    /// The launcher is up; the domain is not created yet.
    NotCreated,
    /// libvirt cannot be reached: the truth is unknown until it answers again.
    Unreachable,
    /// The domain existed and is gone without the launcher removing it.
    Vanished,
    Domain(PowerState),
}

/// KubeVirt's VMI phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Scheduled,
    Running,
    Succeeded,
    Failed,
    Unknown,
}

impl Phase {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Phase::Scheduled => "Scheduled",
            Phase::Running => "Running",
            Phase::Succeeded => "Succeeded",
            Phase::Failed => "Failed",
            Phase::Unknown => "Unknown",
        }
    }

    /// The VM has ended; nothing will bring it back by itself.
    pub(crate) fn is_final(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed)
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The phase for an observation (`DESIGN.md` §3). `destroyed_after_grace` says that the launcher
/// itself destroyed the domain because the guest did not stop within its grace period.
pub(crate) fn phase(observation: &Observation, destroyed_after_grace: bool) -> Phase {
    let power = match observation {
        Observation::NotCreated => return Phase::Scheduled,
        Observation::Unreachable => return Phase::Unknown,
        Observation::Vanished => return Phase::Failed,
        Observation::Domain(power) => power,
    };
    match power.state {
        DomainState::NoState => Phase::Scheduled,
        DomainState::Paused if power.reason == "postcopy-failed" => Phase::Failed,
        DomainState::Running
        | DomainState::Blocked
        | DomainState::Paused
        | DomainState::PmSuspended
        | DomainState::ShuttingDown => Phase::Running,
        DomainState::Crashed => Phase::Failed,
        DomainState::Shutoff => match power.reason.as_str() {
            "shutdown" | "saved" | "from-snapshot" => Phase::Succeeded,
            "destroyed" if !destroyed_after_grace => Phase::Succeeded,
            // destroyed after the grace period, crashed, failed, unknown, migrated, daemon
            _ => Phase::Failed,
        },
    }
}

/// An enum whose variants' names are their wire form (KubeVirt's CamelCase): `as_str` and
/// `Display` give the name, so that the string the API, `status` and `run`'s lines show cannot
/// drift from the variant the code matches on.
macro_rules! wire_names {
    ($(#[$meta:meta])* $vis:vis enum $name:ident { $($(#[$doc:meta])* $variant:ident,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        $vis enum $name {
            $($(#[$doc])* $variant,)*
        }

        impl $name {
            pub(crate) fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => stringify!($variant),)*
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

wire_names! {
    /// The reason that goes with a final phase.
    pub enum PhaseReason {
        GuestShutdown,
        /// The launcher destroyed the guest that ignored ACPI for its whole grace period.
        GracePeriodExpired,
        Destroyed,
        Crashed,
        StartFailed,
        Saved,
        FromSnapshot,
        /// Shut off for a reason libvirt gives and the launcher does not know.
        Unknown,
        /// The domain went away without the launcher's doing.
        DomainLost,
        HypervisorUnreachable,
        /// The VM left for another launcher by live migration.
        Migrated,
        /// A migration target whose guest never arrived.
        MigrationFailed,
    }
}

/// The reason that goes with the phase of an observation; `None` for a domain not created or one
/// that runs.
pub(crate) fn phase_reason(
    observation: &Observation,
    destroyed_after_grace: bool,
) -> Option<PhaseReason> {
    match observation {
        Observation::Vanished => Some(PhaseReason::DomainLost),
        Observation::Unreachable => Some(PhaseReason::HypervisorUnreachable),
        Observation::Domain(p) if p.state == DomainState::Crashed => Some(PhaseReason::Crashed),
        Observation::Domain(p) if p.state == DomainState::Shutoff => {
            Some(match p.reason.as_str() {
                "shutdown" => PhaseReason::GuestShutdown,
                "destroyed" if destroyed_after_grace => PhaseReason::GracePeriodExpired,
                "destroyed" => PhaseReason::Destroyed,
                "crashed" => PhaseReason::Crashed,
                "failed" => PhaseReason::StartFailed,
                "saved" => PhaseReason::Saved,
                "from-snapshot" => PhaseReason::FromSnapshot,
                _ => PhaseReason::Unknown,
            })
        }
        _ => None,
    }
}

/// What, beside the phase, decides the printable status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Progress {
    pub vm_state: VmState,
    pub task: Option<TaskKind>,
    /// The launcher itself is shutting down (SIGTERM).
    pub terminating: bool,
    /// A run-strategy restart is waiting for its back-off.
    pub restart_pending: bool,
    /// The VM is final: it will not run again under this launcher.
    pub finished: bool,
}

wire_names! {
    /// What a person reads in `status`: the phase, refined by what the launcher is doing.
    pub(crate) enum PrintableStatus {
        Starting,
        CrashLoopBackOff,
        /// The launcher itself is shutting down (SIGTERM).
        Terminating,
        Unknown,
        Stopping,
        Migrating,
        /// A migration target before any source has come.
        WaitingForMigration,
        Succeeded,
        Failed,
        Stopped,
        Paused,
        Running,
    }
}

/// The printable status of an observation in `phase`, given what the launcher is doing.
pub(crate) fn printable_status(
    observation: &Observation,
    phase: Phase,
    p: Progress,
) -> PrintableStatus {
    use PrintableStatus as S;
    if p.task == Some(TaskKind::Starting) {
        return S::Starting;
    }
    if p.restart_pending {
        return S::CrashLoopBackOff;
    }
    if p.terminating && !p.finished {
        return S::Terminating;
    }
    match (phase, p.task) {
        (Phase::Unknown, _) => return S::Unknown,
        (_, Some(TaskKind::PoweringOff)) => return S::Stopping,
        (Phase::Running, Some(TaskKind::Migrating)) => return S::Migrating,
        _ => {}
    }
    match (phase, observation) {
        (Phase::Succeeded, _) if p.finished => S::Succeeded,
        (Phase::Failed, _) => S::Failed,
        (Phase::Scheduled | Phase::Succeeded, _) if p.vm_state == VmState::Stopped => S::Stopped,
        (Phase::Scheduled, _) => S::Starting,
        (Phase::Succeeded, _) => S::Succeeded,
        (Phase::Unknown, _) => S::Unknown,
        (Phase::Running, Observation::Domain(d)) if d.state == DomainState::ShuttingDown => {
            S::Stopping
        }
        (Phase::Running, Observation::Domain(d)) if d.state == DomainState::Paused => S::Paused,
        (Phase::Running, _) => S::Running,
    }
}

/// KubeVirt's reason for the `Paused` condition, from libvirt's pause reason.
pub(crate) fn pause_reason(libvirt_reason: &str) -> &'static str {
    match libvirt_reason {
        "user" => "PausedByUser",
        "ioerror" => "PausedIOError",
        "watchdog" => "PausedWatchdog",
        "migration" => "PausedMigration",
        "starting-up" => "PausedStartingUp",
        "api-error" => "PausedAPIError",
        "crashed" => "PausedCrashed",
        "postcopy-failed" => "PausedPostcopyFailed",
        _ => "PausedUnknown",
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn dom(state: DomainState, reason: &str) -> Observation {
        Observation::Domain(PowerState {
            state,
            reason: reason.into(),
        })
    }

    /// One observation of each kind the rules tell apart: every state libvirt can report, and
    /// the paused and shutoff reasons that change a decision.
    pub(crate) fn observations() -> Vec<(&'static str, Observation)> {
        use DomainState::*;
        vec![
            ("not-created", Observation::NotCreated),
            ("unreachable", Observation::Unreachable),
            ("vanished", Observation::Vanished),
            ("running", dom(Running, "booted")),
            ("paused-user", dom(Paused, "user")),
            ("paused-ioerror", dom(Paused, "ioerror")),
            ("shutoff-shutdown", dom(Shutoff, "shutdown")),
            ("shutoff-crashed", dom(Shutoff, "crashed")),
            ("crashed", dom(Crashed, "panicked")),
            ("nostate", dom(NoState, "unknown")),
            ("blocked", dom(Blocked, "unknown")),
            ("shutting-down", dom(ShuttingDown, "user")),
            ("pmsuspended", dom(PmSuspended, "unknown")),
            ("paused-postcopy-failed", dom(Paused, "postcopy-failed")),
            ("paused-crashed", dom(Paused, "crashed")),
            ("shutoff-destroyed", dom(Shutoff, "destroyed")),
        ]
    }

    #[test]
    fn phase_table() {
        use DomainState::*;
        let cases = [
            (Observation::NotCreated, false, Phase::Scheduled),
            (Observation::Unreachable, false, Phase::Unknown),
            (Observation::Vanished, false, Phase::Failed),
            (dom(NoState, "unknown"), false, Phase::Scheduled),
            (dom(Running, "booted"), false, Phase::Running),
            (dom(Blocked, "unknown"), false, Phase::Running),
            (dom(Paused, "user"), false, Phase::Running),
            (dom(Paused, "ioerror"), false, Phase::Running),
            (dom(Paused, "postcopy-failed"), false, Phase::Failed),
            (dom(PmSuspended, "unknown"), false, Phase::Running),
            (dom(ShuttingDown, "user"), false, Phase::Running),
            (dom(Crashed, "panicked"), false, Phase::Failed),
            (dom(Shutoff, "shutdown"), false, Phase::Succeeded),
            (dom(Shutoff, "saved"), false, Phase::Succeeded),
            (dom(Shutoff, "from-snapshot"), false, Phase::Succeeded),
            (dom(Shutoff, "destroyed"), false, Phase::Succeeded),
            (dom(Shutoff, "destroyed"), true, Phase::Failed),
            (dom(Shutoff, "crashed"), false, Phase::Failed),
            (dom(Shutoff, "failed"), false, Phase::Failed),
            (dom(Shutoff, "unknown"), false, Phase::Failed),
        ];
        for (obs, grace, want) in cases {
            assert_eq!(phase(&obs, grace), want, "{obs:?} grace={grace}");
        }
    }

    #[test]
    fn final_phases_have_reasons() {
        assert_eq!(
            phase_reason(&Observation::Vanished, false),
            Some(PhaseReason::DomainLost)
        );
        assert_eq!(
            phase_reason(&dom(DomainState::Shutoff, "destroyed"), true),
            Some(PhaseReason::GracePeriodExpired)
        );
        assert_eq!(
            phase_reason(&dom(DomainState::Shutoff, "shutdown"), false),
            Some(PhaseReason::GuestShutdown)
        );
        assert_eq!(
            phase_reason(&dom(DomainState::Running, "booted"), false),
            None
        );
    }

    #[test]
    fn printable_status_refines_the_phase() {
        use VmState::*;
        let paused = dom(DomainState::Paused, "user");
        let running = dom(DomainState::Running, "booted");
        let off = dom(DomainState::Shutoff, "shutdown");
        let crashed = dom(DomainState::Shutoff, "crashed");
        let base = Progress {
            vm_state: Active,
            task: None,
            terminating: false,
            restart_pending: false,
            finished: false,
        };
        let p = |obs: &Observation, progress| printable_status(obs, phase(obs, false), progress);
        assert_eq!(
            p(
                &paused,
                Progress {
                    vm_state: Paused,
                    ..base
                }
            ),
            PrintableStatus::Paused
        );
        let stopping = Progress {
            task: Some(TaskKind::PoweringOff),
            ..base
        };
        assert_eq!(p(&paused, stopping), PrintableStatus::Stopping);
        assert_eq!(p(&running, base), PrintableStatus::Running);
        assert_eq!(
            p(
                &running,
                Progress {
                    terminating: true,
                    ..base
                }
            ),
            PrintableStatus::Terminating
        );
        assert_eq!(
            p(
                &Observation::NotCreated,
                Progress {
                    vm_state: Building,
                    ..base
                }
            ),
            PrintableStatus::Starting
        );
        assert_eq!(
            p(
                &Observation::NotCreated,
                Progress {
                    vm_state: Stopped,
                    ..base
                }
            ),
            PrintableStatus::Stopped
        );
        assert_eq!(
            p(
                &crashed,
                Progress {
                    restart_pending: true,
                    ..base
                }
            ),
            PrintableStatus::CrashLoopBackOff
        );
        assert_eq!(p(&crashed, base), PrintableStatus::Failed);
        assert_eq!(
            p(
                &off,
                Progress {
                    vm_state: Stopped,
                    ..base
                }
            ),
            PrintableStatus::Stopped
        );
        assert_eq!(
            p(
                &off,
                Progress {
                    vm_state: Stopped,
                    finished: true,
                    ..base
                }
            ),
            PrintableStatus::Succeeded
        );
        let starting = Progress {
            task: Some(TaskKind::Starting),
            ..base
        };
        assert_eq!(p(&off, starting), PrintableStatus::Starting);
        assert_eq!(p(&Observation::Unreachable, base), PrintableStatus::Unknown);
    }

    #[test]
    fn pause_reasons_in_kubevirts_words() {
        let table = [
            ("user", "PausedByUser"),
            ("ioerror", "PausedIOError"),
            ("watchdog", "PausedWatchdog"),
            ("migration", "PausedMigration"),
            ("starting-up", "PausedStartingUp"),
            ("api-error", "PausedAPIError"),
            ("crashed", "PausedCrashed"),
            ("postcopy-failed", "PausedPostcopyFailed"),
            ("unknown", "PausedUnknown"),
            ("snapshot", "PausedUnknown"),
        ];
        for (libvirt, kubevirt) in table {
            assert_eq!(pause_reason(libvirt), kubevirt, "{libvirt}");
        }
    }

    #[test]
    fn a_press_refused_by_a_guest_off_or_on_its_way_down_did_what_it_asked() {
        use super::DomainState as S;
        for done in [S::Shutoff, S::Crashed, S::NoState, S::ShuttingDown] {
            assert!(done.is_off_or_going_off(), "{done:?}");
        }
        // A paused guest cannot see the button: its refusal stays an error.
        for running in [S::Running, S::Blocked, S::Paused, S::PmSuspended] {
            assert!(!running.is_off_or_going_off(), "{running:?}");
        }
    }
}
