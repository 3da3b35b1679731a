//! The VM's state as the launcher reports it: power state (what libvirt says), and the KubeVirt
//! phase *derived* from it by a total function, so that there is never an "unchanged" gap.
//!
//! Pure: no libvirt calls here. The `libvirt` module turns libvirt's numbers into [`PowerState`].

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

/// What a person reads in `status`: the phase, refined by what is in flight.
pub fn printable_status(observation: &Observation, phase: Phase, stopping: bool) -> &'static str {
    match (phase, observation) {
        (Phase::Scheduled, _) => "Starting",
        (Phase::Unknown, _) => "Unknown",
        (Phase::Succeeded, _) => "Succeeded",
        (Phase::Failed, _) => "Failed",
        (Phase::Running, _) if stopping => "Stopping",
        (Phase::Running, Observation::Domain(p)) if p.state == DomainState::ShuttingDown => {
            "Stopping"
        }
        (Phase::Running, Observation::Domain(p)) if p.state == DomainState::Paused => "Paused",
        (Phase::Running, _) => "Running",
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
    fn printable_status_refines_running() {
        let paused = dom(DomainState::Paused, "user");
        assert_eq!(printable_status(&paused, Phase::Running, false), "Paused");
        assert_eq!(printable_status(&paused, Phase::Running, true), "Stopping");
        let running = dom(DomainState::Running, "booted");
        assert_eq!(printable_status(&running, Phase::Running, false), "Running");
        assert_eq!(
            printable_status(&Observation::NotCreated, Phase::Scheduled, false),
            "Starting"
        );
    }
}
