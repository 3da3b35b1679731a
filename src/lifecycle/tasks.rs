//! What an owner asks of the VM: commands, whether one may run now ([`admit`]) and the stable
//! state it leaves ([`settle`]).

use super::{DomainState, Observation, RunStrategy};

/// The stable state the owner asked for (Nova's vm_state). Changes only when a task ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VmState {
    /// Not started yet.
    Building,
    Active,
    Paused,
    Stopped,
    Error,
}

impl VmState {
    #[cfg(test)]
    pub(crate) const ALL: [VmState; 5] = [
        VmState::Building,
        VmState::Active,
        VmState::Paused,
        VmState::Stopped,
        VmState::Error,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            VmState::Building => "Building",
            VmState::Active => "Active",
            VmState::Paused => "Paused",
            VmState::Stopped => "Stopped",
            VmState::Error => "Error",
        }
    }
}

/// The transition in flight (Nova's task_state). One at a time; only a kill pre-empts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TaskKind {
    Starting,
    Pausing,
    Unpausing,
    Rebooting,
    PoweringOff,
    Syncing,
    Migrating,
}

impl TaskKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            TaskKind::Starting => "Starting",
            TaskKind::Pausing => "Pausing",
            TaskKind::Unpausing => "Unpausing",
            TaskKind::Rebooting => "Rebooting",
            TaskKind::PoweringOff => "PoweringOff",
            TaskKind::Syncing => "Syncing",
            TaskKind::Migrating => "Migrating",
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
    /// Apply a new spec: hot-plug and unplug disks.
    Sync,
    /// Live-migrate the VM to another launcher.
    Migrate,
}

impl Command {
    #[cfg(test)]
    pub(crate) const ALL: [Command; 9] = [
        Command::Start,
        Command::Pause,
        Command::Unpause,
        Command::SoftReboot,
        Command::Reset,
        Command::Shutdown,
        Command::Kill,
        Command::Sync,
        Command::Migrate,
    ];

    pub(crate) fn task(self) -> TaskKind {
        match self {
            Command::Start => TaskKind::Starting,
            Command::Pause => TaskKind::Pausing,
            Command::Unpause => TaskKind::Unpausing,
            Command::SoftReboot | Command::Reset => TaskKind::Rebooting,
            Command::Shutdown | Command::Kill => TaskKind::PoweringOff,
            Command::Sync => TaskKind::Syncing,
            Command::Migrate => TaskKind::Migrating,
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Command::Start => "Start",
            Command::Pause => "Pause",
            Command::Unpause => "Unpause",
            Command::SoftReboot => "SoftReboot",
            Command::Reset => "Reset",
            Command::Shutdown => "Shutdown",
            Command::Kill => "Kill",
            Command::Sync => "Sync",
            Command::Migrate => "Migrate",
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
pub(crate) fn admit(command: Command, observation: &Observation) -> Result<TaskKind, Refusal> {
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
        Command::Reset | Command::Shutdown | Command::Kill | Command::Sync | Command::Migrate => {
            running || paused
        }
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
pub(crate) fn settle(before: VmState, command: Command, succeeded: bool) -> VmState {
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
        Command::SoftReboot | Command::Reset | Command::Sync | Command::Migrate => before,
    }
}

/// An owner's stop is final for a VM its run strategy would never start again: a pod's launcher
/// then exits, as KubeVirt's does when its VMI is stopped.
pub(crate) fn owner_stop_is_final(
    command: Command,
    succeeded: bool,
    strategy: RunStrategy,
) -> bool {
    succeeded
        && matches!(command, Command::Shutdown | Command::Kill)
        && matches!(strategy, RunStrategy::Once | RunStrategy::RerunOnFailure)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::tests::{dom, observations};

    #[test]
    fn admit_every_command_in_every_observation() {
        // Columns follow `observations()`; `y` = admitted, `-` = refused.
        let table = [
            (Command::Start, "y-y---yyyy-----y"),
            (Command::Pause, "---y------yyy---"),
            (Command::Unpause, "----yy-------yy-"),
            (Command::SoftReboot, "---y------yyy---"),
            (Command::Reset, "---yyy----yyyyy-"),
            (Command::Shutdown, "---yyy----yyyyy-"),
            (Command::Kill, "---yyy----yyyyy-"),
            (Command::Sync, "---yyy----yyyyy-"),
            (Command::Migrate, "---yyy----yyyyy-"),
        ];
        for (cmd, row) in table {
            assert_eq!(row.len(), observations().len());
            for ((name, obs), want) in observations().iter().zip(row.bytes().map(|c| c == b'y')) {
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
        // (command, after success, after failure); `None` = the state before stays.
        let table: [(Command, Option<VmState>, Option<VmState>); 9] = [
            (Command::Start, Some(Active), Some(Error)),
            (Command::Pause, Some(Paused), None),
            (Command::Unpause, Some(Active), None),
            (Command::SoftReboot, None, None),
            (Command::Reset, None, None),
            (Command::Shutdown, Some(Stopped), None),
            (Command::Kill, Some(Stopped), None),
            (Command::Sync, None, None),
            (Command::Migrate, None, None),
        ];
        for before in VmState::ALL {
            for (cmd, ok, failed) in table {
                assert_eq!(
                    settle(before, cmd, true),
                    ok.unwrap_or(before),
                    "{before:?} {cmd:?} ok"
                );
                assert_eq!(
                    settle(before, cmd, false),
                    failed.unwrap_or(before),
                    "{before:?} {cmd:?} failed"
                );
            }
        }
    }

    #[test]
    fn only_a_successful_owner_stop_under_once_or_rerun_on_failure_is_final() {
        use RunStrategy::*;
        let finals = [
            (Command::Shutdown, Once),
            (Command::Shutdown, RerunOnFailure),
            (Command::Kill, Once),
            (Command::Kill, RerunOnFailure),
        ];
        for cmd in Command::ALL {
            for strategy in [Always, RerunOnFailure, Once, Manual, Halted] {
                let want = finals.contains(&(cmd, strategy));
                assert_eq!(
                    owner_stop_is_final(cmd, true, strategy),
                    want,
                    "{cmd:?} {strategy:?}"
                );
                assert!(!owner_stop_is_final(cmd, false, strategy), "{cmd:?} failed");
            }
        }
    }
}
