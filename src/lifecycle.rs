//! The VM's state model (`docs/DESIGN.md` §3), all pure functions with no I/O:
//! - power state: what libvirt says ([`PowerState`], from the `libvirt` module);
//! - vm_state: the stable state the owner asked for, changed only when a task ends ([`settle`]);
//! - task_state: the one transition in flight ([`TaskKind`]), admitted by [`admit`];
//! - the KubeVirt phase, *derived* by a total function ([`phase`]), so there is never a gap;
//! - what to do about an observation when no task runs ([`reconcile`]) and after a stop
//!   ([`after_stop`]), by the run strategy.

use std::fmt;

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
    pub fn as_str(self) -> &'static str {
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
    pub fn is_active(self) -> bool {
        !matches!(
            self,
            DomainState::Shutoff | DomainState::Crashed | DomainState::NoState
        )
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
pub enum Observation {
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
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Scheduled => "Scheduled",
            Phase::Running => "Running",
            Phase::Succeeded => "Succeeded",
            Phase::Failed => "Failed",
            Phase::Unknown => "Unknown",
        }
    }

    /// The VM has ended; nothing will bring it back by itself.
    pub fn is_final(self) -> bool {
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
pub fn phase(observation: &Observation, destroyed_after_grace: bool) -> Phase {
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

/// The reason that goes with a final phase, in KubeVirt's CamelCase.
pub fn phase_reason(
    observation: &Observation,
    destroyed_after_grace: bool,
) -> Option<&'static str> {
    match observation {
        Observation::Vanished => Some("DomainLost"),
        Observation::Unreachable => Some("HypervisorUnreachable"),
        Observation::Domain(p) if p.state == DomainState::Crashed => Some("Crashed"),
        Observation::Domain(p) if p.state == DomainState::Shutoff => {
            Some(match p.reason.as_str() {
                "shutdown" => "GuestShutdown",
                "destroyed" if destroyed_after_grace => "GracePeriodExpired",
                "destroyed" => "Destroyed",
                "crashed" => "Crashed",
                "failed" => "StartFailed",
                "saved" => "Saved",
                "from-snapshot" => "FromSnapshot",
                _ => "Unknown",
            })
        }
        _ => None,
    }
}

/// What, beside the phase, decides the printable status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub vm_state: VmState,
    pub task: Option<TaskKind>,
    /// The launcher itself is shutting down (SIGTERM).
    pub terminating: bool,
    /// A run-strategy restart is waiting for its back-off.
    pub restart_pending: bool,
    /// The VM is final: it will not run again under this launcher.
    pub finished: bool,
}

/// What a person reads in `status`: the phase, refined by what the launcher is doing.
pub fn printable_status(observation: &Observation, phase: Phase, p: Progress) -> &'static str {
    if p.task == Some(TaskKind::Starting) {
        return "Starting";
    }
    if p.restart_pending {
        return "CrashLoopBackOff";
    }
    if p.terminating && !p.finished {
        return "Terminating";
    }
    match (phase, p.task) {
        (Phase::Unknown, _) => return "Unknown",
        (_, Some(TaskKind::PoweringOff)) => return "Stopping",
        _ => {}
    }
    match (phase, observation) {
        (Phase::Succeeded, _) if p.finished => "Succeeded",
        (Phase::Failed, _) => "Failed",
        (Phase::Scheduled | Phase::Succeeded, _) if p.vm_state == VmState::Stopped => "Stopped",
        (Phase::Scheduled, _) => "Starting",
        (Phase::Succeeded, _) => "Succeeded",
        (Phase::Unknown, _) => "Unknown",
        (Phase::Running, Observation::Domain(d)) if d.state == DomainState::ShuttingDown => {
            "Stopping"
        }
        (Phase::Running, Observation::Domain(d)) if d.state == DomainState::Paused => "Paused",
        (Phase::Running, _) => "Running",
    }
}

/// The stable state the owner asked for (Nova's vm_state). Changes only when a task ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VmState {
    /// Not started yet.
    Building,
    Active,
    Paused,
    Stopped,
    Error,
    Deleted,
}

impl VmState {
    pub const ALL: [VmState; 6] = [
        VmState::Building,
        VmState::Active,
        VmState::Paused,
        VmState::Stopped,
        VmState::Error,
        VmState::Deleted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            VmState::Building => "Building",
            VmState::Active => "Active",
            VmState::Paused => "Paused",
            VmState::Stopped => "Stopped",
            VmState::Error => "Error",
            VmState::Deleted => "Deleted",
        }
    }
}

/// The transition in flight (Nova's task_state). One at a time; only a kill pre-empts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskKind {
    Starting,
    Pausing,
    Unpausing,
    Rebooting,
    PoweringOff,
    Syncing,
    Deleting,
}

impl TaskKind {
    pub fn as_str(self) -> &'static str {
        match self {
            TaskKind::Starting => "Starting",
            TaskKind::Pausing => "Pausing",
            TaskKind::Unpausing => "Unpausing",
            TaskKind::Rebooting => "Rebooting",
            TaskKind::PoweringOff => "PoweringOff",
            TaskKind::Syncing => "Syncing",
            TaskKind::Deleting => "Deleting",
        }
    }
}

/// What an owner can ask of the VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Start,
    Pause,
    Unpause,
    /// ACPI reboot: the guest restarts itself.
    SoftReboot,
    /// Hard reset, like the reset button.
    Reset,
    /// Graceful stop: ACPI, grace period, then destroy.
    Shutdown,
    /// Immediate destroy. Pre-empts any task in flight.
    Kill,
    /// Hotplug.
    Sync,
}

impl Command {
    pub const ALL: [Command; 8] = [
        Command::Start,
        Command::Pause,
        Command::Unpause,
        Command::SoftReboot,
        Command::Reset,
        Command::Shutdown,
        Command::Kill,
        Command::Sync,
    ];

    pub fn task(self) -> TaskKind {
        match self {
            Command::Start => TaskKind::Starting,
            Command::Pause => TaskKind::Pausing,
            Command::Unpause => TaskKind::Unpausing,
            Command::SoftReboot | Command::Reset => TaskKind::Rebooting,
            Command::Shutdown | Command::Kill => TaskKind::PoweringOff,
            Command::Sync => TaskKind::Syncing,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Command::Start => "Start",
            Command::Pause => "Pause",
            Command::Unpause => "Unpause",
            Command::SoftReboot => "SoftReboot",
            Command::Reset => "Reset",
            Command::Shutdown => "Shutdown",
            Command::Kill => "Kill",
            Command::Sync => "Sync",
        }
    }
}

/// Why a command cannot run now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("cannot {command} while the hypervisor is unreachable")]
    Unreachable { command: &'static str },
    #[error("cannot {command}: the VM is {actual}")]
    WrongState {
        command: &'static str,
        actual: String,
    },
}

/// Checks a command against the *observed* power state, before any side effect, and names the
/// task it becomes.
pub fn admit(command: Command, observation: &Observation) -> Result<TaskKind, Refusal> {
    use DomainState::*;
    let power = match observation {
        Observation::Unreachable => {
            return Err(Refusal::Unreachable {
                command: command.as_str(),
            })
        }
        Observation::Domain(p) => Some(p),
        Observation::NotCreated | Observation::Vanished => None,
    };
    let state = power.map(|p| p.state);
    let running = matches!(state, Some(Running | Blocked | ShuttingDown | PmSuspended));
    let paused = state == Some(Paused);
    let allowed = match command {
        Command::Start => !running && !paused,
        Command::Pause | Command::SoftReboot => running,
        Command::Unpause => paused,
        Command::Reset | Command::Shutdown | Command::Kill | Command::Sync => running || paused,
    };
    if allowed {
        return Ok(command.task());
    }
    let actual = match (observation, power) {
        (Observation::NotCreated, _) => "not created".to_string(),
        (Observation::Vanished, _) => "gone".to_string(),
        _ if paused => "paused".to_string(),
        _ if running => "running".to_string(),
        (_, Some(p)) => format!("stopped: {p}"),
        _ => "unknown".to_string(),
    };
    Err(Refusal::WrongState {
        command: command.as_str(),
        actual,
    })
}

/// The vm_state after a task ends.
pub fn settle(before: VmState, command: Command, succeeded: bool) -> VmState {
    if !succeeded {
        return match command {
            Command::Start => VmState::Error,
            _ => before,
        };
    }
    match command {
        Command::Start | Command::Unpause => VmState::Active,
        Command::Pause => VmState::Paused,
        Command::Shutdown | Command::Kill => VmState::Stopped,
        Command::SoftReboot | Command::Reset | Command::Sync => before,
    }
}

/// KubeVirt's run strategies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
pub enum RunStrategy {
    /// Restart whenever it stops, with exponential back-off.
    Always,
    /// Restart only after a failure.
    RerunOnFailure,
    /// Run once; never restart. What a bare VMI does.
    Once,
    /// Start and stop only on request.
    Manual,
    /// Stay stopped until a Start call.
    Halted,
}

impl RunStrategy {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStrategy::Always => "Always",
            RunStrategy::RerunOnFailure => "RerunOnFailure",
            RunStrategy::Once => "Once",
            RunStrategy::Manual => "Manual",
            RunStrategy::Halted => "Halted",
        }
    }

    /// Boot at launch, or wait for a Start call.
    pub fn starts_at_launch(self) -> bool {
        !matches!(self, RunStrategy::Manual | RunStrategy::Halted)
    }
}

/// What the reconciler does about an observation while no task runs (`docs/DESIGN.md` §3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reaction {
    Nothing,
    /// The VM stopped by itself: apply the run strategy ([`after_stop`]).
    Stopped {
        failed: bool,
    },
    /// Keep the pause and report it; never auto-resume (an I/O-error pause least of all).
    KeepPaused {
        reason: String,
    },
    /// It runs although the owner stopped it.
    ForceStop,
    /// It stopped while paused: mark it stopped, do not restart.
    MarkStopped,
    /// The domain is gone without the launcher removing it.
    Lost,
}

pub fn reconcile(vm_state: VmState, observation: &Observation) -> Reaction {
    let power = match observation {
        Observation::Vanished => return Reaction::Lost,
        Observation::NotCreated | Observation::Unreachable => return Reaction::Nothing,
        Observation::Domain(p) => p,
    };
    let active = power.state.is_active();
    match (vm_state, power.state) {
        (VmState::Active, _) if !active => Reaction::Stopped {
            failed: phase(observation, false) == Phase::Failed,
        },
        (VmState::Active, DomainState::Paused) => Reaction::KeepPaused {
            reason: power.reason.clone(),
        },
        (VmState::Stopped, _) if active => Reaction::ForceStop,
        (VmState::Paused, _) if !active => Reaction::MarkStopped,
        _ => Reaction::Nothing,
    }
}

/// What follows a stop the owner did not ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterStop {
    /// Start again after `delay` (shown as CrashLoopBackOff).
    Restart { delay: std::time::Duration },
    /// Stay stopped; a Start call may come.
    WaitForStart,
    /// The VM is final: a pod's launcher exits.
    Finish,
}

pub const BACKOFF_START: std::time::Duration = std::time::Duration::from_secs(1);
pub const BACKOFF_MAX: std::time::Duration = std::time::Duration::from_secs(300);

/// `restarts` counts the restarts before this one since the VM last ran stably.
pub fn after_stop(strategy: RunStrategy, failed: bool, restarts: u32) -> AfterStop {
    let restart = || AfterStop::Restart {
        delay: BACKOFF_START
            .saturating_mul(1u32.checked_shl(restarts).unwrap_or(u32::MAX))
            .min(BACKOFF_MAX),
    };
    match strategy {
        RunStrategy::Always => restart(),
        RunStrategy::RerunOnFailure if failed => restart(),
        RunStrategy::RerunOnFailure | RunStrategy::Once => AfterStop::Finish,
        RunStrategy::Manual | RunStrategy::Halted => AfterStop::WaitForStart,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dom(state: DomainState, reason: &str) -> Observation {
        Observation::Domain(PowerState {
            state,
            reason: reason.into(),
        })
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
            Some("DomainLost")
        );
        assert_eq!(
            phase_reason(&dom(DomainState::Shutoff, "destroyed"), true),
            Some("GracePeriodExpired")
        );
        assert_eq!(
            phase_reason(&dom(DomainState::Shutoff, "shutdown"), false),
            Some("GuestShutdown")
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
            "Paused"
        );
        let stopping = Progress {
            task: Some(TaskKind::PoweringOff),
            ..base
        };
        assert_eq!(p(&paused, stopping), "Stopping");
        assert_eq!(p(&running, base), "Running");
        assert_eq!(
            p(
                &running,
                Progress {
                    terminating: true,
                    ..base
                }
            ),
            "Terminating"
        );
        assert_eq!(
            p(
                &Observation::NotCreated,
                Progress {
                    vm_state: Building,
                    ..base
                }
            ),
            "Starting"
        );
        assert_eq!(
            p(
                &Observation::NotCreated,
                Progress {
                    vm_state: Stopped,
                    ..base
                }
            ),
            "Stopped"
        );
        assert_eq!(
            p(
                &crashed,
                Progress {
                    restart_pending: true,
                    ..base
                }
            ),
            "CrashLoopBackOff"
        );
        assert_eq!(p(&crashed, base), "Failed");
        assert_eq!(
            p(
                &off,
                Progress {
                    vm_state: Stopped,
                    ..base
                }
            ),
            "Stopped"
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
            "Succeeded"
        );
        let starting = Progress {
            task: Some(TaskKind::Starting),
            ..base
        };
        assert_eq!(p(&off, starting), "Starting");
        assert_eq!(p(&Observation::Unreachable, base), "Unknown");
    }

    /// One representative observation of each kind the reconciler distinguishes.
    fn observations() -> Vec<(&'static str, Observation)> {
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
        ]
    }

    #[test]
    fn reconcile_every_vm_state_with_every_observation() {
        use Reaction::*;
        let ok = || Stopped { failed: false };
        let bad = || Stopped { failed: true };
        let keep = |r: &str| KeepPaused { reason: r.into() };
        let none = || Nothing;
        // Columns follow `observations()`.
        let table: [(VmState, [Reaction; 9]); 6] = [
            (
                VmState::Building,
                [
                    none(),
                    none(),
                    Lost,
                    none(),
                    none(),
                    none(),
                    none(),
                    none(),
                    none(),
                ],
            ),
            (
                VmState::Active,
                [
                    none(),
                    none(),
                    Lost,
                    none(),
                    keep("user"),
                    keep("ioerror"),
                    ok(),
                    bad(),
                    bad(),
                ],
            ),
            (
                VmState::Paused,
                [
                    none(),
                    none(),
                    Lost,
                    none(),
                    none(),
                    none(),
                    MarkStopped,
                    MarkStopped,
                    MarkStopped,
                ],
            ),
            (
                VmState::Stopped,
                [
                    none(),
                    none(),
                    Lost,
                    ForceStop,
                    ForceStop,
                    ForceStop,
                    none(),
                    none(),
                    none(),
                ],
            ),
            (
                VmState::Error,
                [
                    none(),
                    none(),
                    Lost,
                    none(),
                    none(),
                    none(),
                    none(),
                    none(),
                    none(),
                ],
            ),
            (
                VmState::Deleted,
                [
                    none(),
                    none(),
                    Lost,
                    none(),
                    none(),
                    none(),
                    none(),
                    none(),
                    none(),
                ],
            ),
        ];
        for (vm, row) in table {
            for ((name, obs), want) in observations().iter().zip(row) {
                assert_eq!(reconcile(vm, obs), want, "{vm:?} × {name}");
            }
        }
    }

    #[test]
    fn admit_every_command_in_every_observation() {
        // Columns follow `observations()`; `true` = admitted.
        let table: [(Command, [bool; 9]); 8] = [
            (
                Command::Start,
                [true, false, true, false, false, false, true, true, true],
            ),
            (
                Command::Pause,
                [false, false, false, true, false, false, false, false, false],
            ),
            (
                Command::Unpause,
                [false, false, false, false, true, true, false, false, false],
            ),
            (
                Command::SoftReboot,
                [false, false, false, true, false, false, false, false, false],
            ),
            (
                Command::Reset,
                [false, false, false, true, true, true, false, false, false],
            ),
            (
                Command::Shutdown,
                [false, false, false, true, true, true, false, false, false],
            ),
            (
                Command::Kill,
                [false, false, false, true, true, true, false, false, false],
            ),
            (
                Command::Sync,
                [false, false, false, true, true, true, false, false, false],
            ),
        ];
        for (cmd, row) in table {
            for ((name, obs), want) in observations().iter().zip(row) {
                let got = admit(cmd, obs);
                assert_eq!(got.is_ok(), want, "{cmd:?} × {name}: {got:?}");
                if let Ok(task) = got {
                    assert_eq!(task, cmd.task());
                }
            }
        }
        assert!(matches!(
            admit(Command::Pause, &Observation::Unreachable),
            Err(Refusal::Unreachable { .. })
        ));
        assert_eq!(
            admit(Command::Unpause, &dom(DomainState::Running, "booted"))
                .unwrap_err()
                .to_string(),
            "cannot Unpause: the VM is running"
        );
    }

    #[test]
    fn settle_every_command_in_every_vm_state() {
        use VmState::*;
        for before in VmState::ALL {
            for cmd in Command::ALL {
                let want = match cmd {
                    Command::Start | Command::Unpause => Active,
                    Command::Pause => Paused,
                    Command::Shutdown | Command::Kill => Stopped,
                    Command::SoftReboot | Command::Reset | Command::Sync => before,
                };
                assert_eq!(settle(before, cmd, true), want, "{before:?} {cmd:?} ok");
                let want = if cmd == Command::Start { Error } else { before };
                assert_eq!(
                    settle(before, cmd, false),
                    want,
                    "{before:?} {cmd:?} failed"
                );
            }
        }
    }

    #[test]
    fn run_strategies_after_a_stop() {
        use std::time::Duration;
        let restart = |s| AfterStop::Restart {
            delay: Duration::from_secs(s),
        };
        assert_eq!(after_stop(RunStrategy::Always, false, 0), restart(1));
        assert_eq!(after_stop(RunStrategy::Always, true, 3), restart(8));
        assert_eq!(after_stop(RunStrategy::Always, true, 9), restart(300));
        assert_eq!(after_stop(RunStrategy::Always, true, 40), restart(300));
        assert_eq!(after_stop(RunStrategy::RerunOnFailure, true, 0), restart(1));
        assert_eq!(
            after_stop(RunStrategy::RerunOnFailure, false, 0),
            AfterStop::Finish
        );
        assert_eq!(after_stop(RunStrategy::Once, true, 0), AfterStop::Finish);
        assert_eq!(after_stop(RunStrategy::Once, false, 0), AfterStop::Finish);
        assert_eq!(
            after_stop(RunStrategy::Manual, true, 0),
            AfterStop::WaitForStart
        );
        assert_eq!(
            after_stop(RunStrategy::Halted, false, 0),
            AfterStop::WaitForStart
        );
    }
}
