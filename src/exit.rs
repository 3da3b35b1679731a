//! The launcher's exit codes: one enum, derived from how the VM and the process ended. The README
//! tabulates them; scripts and node daemons depend on the numbers.

use crate::lifecycle::Phase;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ExitCode {
    /// The VM ended well: the guest powered off (also after a SIGTERM), or validation passed.
    Succeeded = 0,
    /// The launcher itself failed (see its log).
    Internal = 1,
    /// The spec is invalid; every problem is printed with its field path.
    BadSpec = 2,
    /// libvirt could not be reached or started.
    HypervisorUnavailable = 3,
    /// The guest crashed, failed to start, or its domain vanished.
    GuestFailed = 4,
    /// Asked to stop, the guest ignored ACPI for its whole grace period and was destroyed.
    GracePeriodExpired = 5,
    /// A client call was refused (wrong state, bad request) or the launcher could not be reached.
    RequestFailed = 6,
    /// The command line is malformed.
    Usage = 64,
}

impl ExitCode {
    /// How a launcher whose VM reached a final phase exits.
    pub fn from_final_phase(phase: Phase, reason: Option<&str>) -> ExitCode {
        match (phase, reason) {
            (Phase::Succeeded, _) => ExitCode::Succeeded,
            (Phase::Failed, Some("GracePeriodExpired")) => ExitCode::GracePeriodExpired,
            (Phase::Failed, _) => ExitCode::GuestFailed,
            (Phase::Unknown, _) => ExitCode::HypervisorUnavailable,
            (Phase::Scheduled | Phase::Running, _) => ExitCode::Internal,
        }
    }
}

impl From<ExitCode> for std::process::ExitCode {
    fn from(code: ExitCode) -> Self {
        std::process::ExitCode::from(code as u8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn final_phases_map_to_codes() {
        assert_eq!(
            ExitCode::from_final_phase(Phase::Succeeded, Some("GuestShutdown")),
            ExitCode::Succeeded
        );
        assert_eq!(
            ExitCode::from_final_phase(Phase::Failed, Some("GracePeriodExpired")),
            ExitCode::GracePeriodExpired
        );
        assert_eq!(
            ExitCode::from_final_phase(Phase::Failed, Some("Crashed")),
            ExitCode::GuestFailed
        );
        assert_eq!(
            ExitCode::from_final_phase(Phase::Failed, Some("DomainLost")),
            ExitCode::GuestFailed
        );
        assert_eq!(
            ExitCode::from_final_phase(Phase::Unknown, None),
            ExitCode::HypervisorUnavailable
        );
    }
}
