//! The launcher's exit codes: one enum, derived from how the VM and the process ended. The README
//! tabulates them; scripts and node daemons depend on the numbers. Every mapping to a code lives
//! here: from a final phase, from a launcher error, from a gRPC status a client verb received, and
//! from the signal that killed the launcher (what PID 1 reports).

use crate::launcher::LauncherError;
use crate::lifecycle::Phase;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ExitCode {
    /// The VM ended well: the guest powered off (also after a SIGTERM), or validation passed.
    Succeeded = 0,
    /// The launcher itself failed (see its log).
    Internal = 1,
    /// The spec is invalid; every problem is printed with its field path. Also a runtime dir
    /// that cannot be the launcher's (someone else's, or another launcher's) or a `--socket`
    /// path that is not a stale socket: refused input.
    BadSpec = 2,
    /// libvirt could not be reached or started.
    HypervisorUnavailable = 3,
    /// The guest crashed, failed to start, or its domain vanished.
    GuestFailed = 4,
    /// Asked to stop, the guest ignored ACPI for its whole grace period and was destroyed.
    GracePeriodExpired = 5,
    /// A client call was refused (wrong state, bad request) or the launcher could not be reached.
    RequestFailed = 6,
    /// A migration target whose guest never arrived: its source cancelled or failed the
    /// migration (the guest runs on there).
    MigrationFailed = 7,
    /// The command line is malformed.
    Usage = 64,
}

impl ExitCode {
    /// How a launcher whose VM reached a final phase exits.
    pub fn from_final_phase(phase: Phase, reason: Option<&str>) -> ExitCode {
        match (phase, reason) {
            (Phase::Succeeded, _) => ExitCode::Succeeded,
            // Stopped before it ever ran (run strategy Manual or Halted): nothing failed.
            (Phase::Scheduled, _) => ExitCode::Succeeded,
            (Phase::Failed, Some("GracePeriodExpired")) => ExitCode::GracePeriodExpired,
            (Phase::Failed, Some("MigrationFailed")) => ExitCode::MigrationFailed,
            (Phase::Failed, _) => ExitCode::GuestFailed,
            (Phase::Unknown, _) => ExitCode::HypervisorUnavailable,
            (Phase::Running, _) => ExitCode::Internal,
        }
    }

    /// How a launcher exits when it could not bring its VM up.
    pub fn from_launcher_error(e: &LauncherError) -> ExitCode {
        match e {
            LauncherError::InvalidSpec(_) => ExitCode::BadSpec,
            e if e.is_unavailable() => ExitCode::HypervisorUnavailable,
            LauncherError::HostDisk { .. } | LauncherError::Libvirt(_) => ExitCode::GuestFailed,
            _ => ExitCode::Internal,
        }
    }

    /// How a launcher exits when its runtime dir cannot be its own.
    pub fn from_runtime_dir_error(e: &crate::runtime_dir::RuntimeDirError) -> ExitCode {
        Self::refused_or_failed(e.is_refusal())
    }

    /// How a launcher exits when it cannot listen on its API socket.
    pub fn from_bind_error(e: &crate::api::ApiError) -> ExitCode {
        Self::refused_or_failed(e.is_refusal())
    }

    /// Input the operator gave and the launcher refused is like a bad spec; anything else, a
    /// failure of the launcher.
    fn refused_or_failed(refused: bool) -> ExitCode {
        if refused {
            ExitCode::BadSpec
        } else {
            ExitCode::Internal
        }
    }

    /// How a client verb exits when the launcher refused its call (the launcher chose the gRPC
    /// code from its own typed error, in `api`).
    pub fn from_rpc_code(code: tonic::Code) -> ExitCode {
        match code {
            tonic::Code::InvalidArgument => ExitCode::BadSpec,
            tonic::Code::Unavailable => ExitCode::HypervisorUnavailable,
            _ => ExitCode::RequestFailed,
        }
    }
}

/// The exit status PID 1 (`init`) gives for a launcher killed by `signal`: 128 + its number, as
/// a shell reports a killed command, so that 137 reads as SIGKILL (e.g. the OOM killer).
pub fn killed_by(signal: nix::sys::signal::Signal) -> i32 {
    128 + signal as i32
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
            ExitCode::from_final_phase(Phase::Failed, Some("MigrationFailed")),
            ExitCode::MigrationFailed
        );
        assert_eq!(
            ExitCode::from_final_phase(Phase::Succeeded, Some("Migrated")),
            ExitCode::Succeeded
        );
        assert_eq!(
            ExitCode::from_final_phase(Phase::Failed, Some("DomainLost")),
            ExitCode::GuestFailed
        );
        assert_eq!(
            ExitCode::from_final_phase(Phase::Unknown, None),
            ExitCode::HypervisorUnavailable
        );
        assert_eq!(
            ExitCode::from_final_phase(Phase::Scheduled, None),
            ExitCode::Succeeded
        );
        assert_eq!(
            ExitCode::from_final_phase(Phase::Running, None),
            ExitCode::Internal
        );
    }

    #[test]
    fn a_killed_launcher_exits_as_a_shell_reports_it() {
        use nix::sys::signal::Signal;
        assert_eq!(killed_by(Signal::SIGKILL), 137);
        assert_eq!(killed_by(Signal::SIGTERM), 143);
        assert_eq!(killed_by(Signal::SIGSEGV), 139);
    }

    #[test]
    fn a_refused_runtime_dir_is_refused_input_and_an_io_error_a_failure() {
        use crate::runtime_dir::RuntimeDirError;
        let table = [
            (
                RuntimeDirError::Busy {
                    path: "/rt".into(),
                    holder: "42".into(),
                },
                ExitCode::BadSpec,
            ),
            (
                RuntimeDirError::Unsafe {
                    path: "/rt".into(),
                    why: "a symlink".into(),
                },
                ExitCode::BadSpec,
            ),
            (
                RuntimeDirError::Io {
                    path: "/rt".into(),
                    source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
                },
                ExitCode::Internal,
            ),
        ];
        for (error, code) in table {
            assert_eq!(ExitCode::from_runtime_dir_error(&error), code, "{error}");
        }
    }

    #[test]
    fn a_refused_socket_path_is_refused_input_and_other_errors_a_failure() {
        use crate::api::ApiError;
        let listen = |kind: std::io::ErrorKind| ApiError::Listen {
            path: "/s".into(),
            source: kind.into(),
        };
        let table = [
            (listen(std::io::ErrorKind::AlreadyExists), ExitCode::BadSpec),
            (listen(std::io::ErrorKind::AddrInUse), ExitCode::BadSpec),
            (
                listen(std::io::ErrorKind::PermissionDenied),
                ExitCode::Internal,
            ),
        ];
        for (error, code) in table {
            assert_eq!(ExitCode::from_bind_error(&error), code, "{error}");
        }
    }

    #[test]
    fn launcher_errors_map_to_codes() {
        use crate::lifecycle::Refusal;
        use crate::spec::SpecErrors;
        let table = [
            (
                LauncherError::InvalidSpec(SpecErrors(vec![])),
                ExitCode::BadSpec,
            ),
            (LauncherError::Unreachable, ExitCode::HypervisorUnavailable),
            (
                LauncherError::Refused(Refusal::Unreachable { command: "Start" }),
                ExitCode::HypervisorUnavailable,
            ),
            (
                LauncherError::HostDisk {
                    volume: "v".into(),
                    source: crate::host::HostError::Missing { path: "/x".into() },
                },
                ExitCode::GuestFailed,
            ),
            (LauncherError::Preempted, ExitCode::Internal),
            (
                LauncherError::Terminating { command: "Start" },
                ExitCode::Internal,
            ),
        ];
        for (error, code) in table {
            assert_eq!(ExitCode::from_launcher_error(&error), code, "{error}");
        }
    }

    #[test]
    fn rpc_codes_map_to_codes() {
        use tonic::Code;
        let table = [
            (Code::InvalidArgument, ExitCode::BadSpec),
            (Code::Unavailable, ExitCode::HypervisorUnavailable),
            (Code::FailedPrecondition, ExitCode::RequestFailed),
            (Code::NotFound, ExitCode::RequestFailed),
            (Code::Internal, ExitCode::RequestFailed),
        ];
        for (rpc, code) in table {
            assert_eq!(ExitCode::from_rpc_code(rpc), code, "{rpc:?}");
        }
    }

    #[test]
    fn the_numbers_scripts_depend_on() {
        let table = [
            (ExitCode::Succeeded, 0u8),
            (ExitCode::Internal, 1),
            (ExitCode::BadSpec, 2),
            (ExitCode::HypervisorUnavailable, 3),
            (ExitCode::GuestFailed, 4),
            (ExitCode::GracePeriodExpired, 5),
            (ExitCode::RequestFailed, 6),
            (ExitCode::MigrationFailed, 7),
            (ExitCode::Usage, 64),
        ];
        for (code, number) in table {
            assert_eq!(code as u8, number, "{code:?}");
        }
    }
}
