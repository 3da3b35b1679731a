//! The launcher's exit codes: one enum, derived from how the VM and the process ended. The README
//! tabulates them; scripts and node daemons depend on the numbers. Every mapping to a code lives
//! here, in the binary's front end (the library returns how a command ended and why it failed,
//! and never picks a code): from how a command ended ([`Ended`]: a final phase, a Sync that
//! reported a failed part) and from why it failed ([`MainError`], which gathers the launcher's,
//! `run`'s, `virt-launcher`'s and the client verbs' errors). Each mapping is an exhaustive match:
//! a new error does not compile until its code is decided. (What PID 1 exits with for a launcher
//! killed by a signal is `vmlauncher::init`'s.)

use vmlauncher::ended::Ended;
use vmlauncher::kubevirt::VirtLauncherError;
use vmlauncher::lifecycle::{Phase, PhaseReason};
use vmlauncher::run::{RunError, SetupError, SpecFileError};
use vmlauncher::LauncherError;

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

/// Why a command failed: the error of each front end, gathered so that `main` prints it once
/// and one function picks the exit code. The variants say what failed, not which code it gets.
#[derive(Debug, thiserror::Error)]
pub enum MainError {
    // The command line.
    /// clap's own error, or the help it prints (clap reports help as an error too).
    #[error(transparent)]
    CommandLine(clap::Error),
    /// `virt-launcher`'s flags, or its help.
    #[error(transparent)]
    VirtLauncherFlags(vmlauncher::kubevirt::flags::FlagsError),
    #[error(transparent)]
    Publish(vmlauncher::convert::PublishError),
    #[error("addvolume needs --path or --major and --minor")]
    NoVolumeSource,
    #[error(transparent)]
    MigrationTls(vmlauncher::migration_tls::TlsError),

    // The process itself.
    #[error("cannot drop capabilities")]
    Capabilities(#[source] vmlauncher::host::caps::CapsError),
    #[error("cannot start the async runtime: {0}")]
    AsyncRuntime(std::io::Error),
    /// Said without its cause, as `convert` always has.
    #[error("{0}")]
    OwnCpus(vmlauncher::host::cpus::CpusError),
    /// What a verb printed could not all be written (a full disk under `> file`; a reader that
    /// has gone is not a failure).
    #[error("cannot write to stdout: {0}")]
    Stdout(std::io::Error),

    // A spec file given on the command line.
    #[error(transparent)]
    Spec(#[from] SpecFileError),

    // The client verbs' calls to a launcher.
    #[error(transparent)]
    Connect(vmlauncher::api::ApiError),
    /// The launcher refused the call; it chose the gRPC code from its own typed error, in `api`.
    #[error("{:?}: {}", .0.code(), .0.message())]
    Refused(tonic::Status),
    #[error(
        "this VM has no serial console (spec.domain.devices.autoattachSerialConsole is false)"
    )]
    NoSerialConsole,
    #[error("cannot attach to the serial console at {}", .path.display())]
    SerialConsole {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the launcher's spec does not parse: {0}")]
    LaunchersSpec(serde_yaml_ng::Error),
    /// `addvolume` / `removevolume` cannot make the edit on the launcher's spec.
    #[error(transparent)]
    Edit(super::spec_edit::SpecEditError),
    #[error("cannot write the edited spec: {0}")]
    EditedSpec(serde_yaml_ng::Error),

    // The launcher proper.
    #[error(transparent)]
    Run(#[from] RunError),
    #[error(transparent)]
    VirtLauncher(#[from] VirtLauncherError),
}

impl From<Ended> for ExitCode {
    fn from(ended: Ended) -> ExitCode {
        match ended {
            Ended::Done => ExitCode::Succeeded,
            Ended::VmFinal { phase, reason } => ExitCode::from_final_phase(phase, reason),
            Ended::PartFailed => ExitCode::RequestFailed,
        }
    }
}

impl From<&MainError> for ExitCode {
    fn from(e: &MainError) -> ExitCode {
        use vmlauncher::kubevirt::flags::FlagsError;
        match e {
            MainError::CommandLine(e) if !e.use_stderr() => ExitCode::Succeeded,
            MainError::VirtLauncherFlags(FlagsError::Help) => ExitCode::Succeeded,
            MainError::CommandLine(_)
            | MainError::VirtLauncherFlags(_)
            | MainError::Publish(_)
            | MainError::NoVolumeSource
            | MainError::MigrationTls(_) => ExitCode::Usage,
            MainError::Capabilities(_)
            | MainError::AsyncRuntime(_)
            | MainError::OwnCpus(_)
            | MainError::Stdout(_)
            | MainError::EditedSpec(_) => ExitCode::Internal,
            MainError::Spec(_) => ExitCode::BadSpec,
            MainError::Connect(_)
            | MainError::LaunchersSpec(_)
            | MainError::Edit(_)
            | MainError::NoSerialConsole
            | MainError::SerialConsole { .. } => ExitCode::RequestFailed,
            MainError::Refused(status) => ExitCode::from_rpc_code(status.code()),
            MainError::Run(e) => ExitCode::from_run_error(e),
            MainError::VirtLauncher(e) => ExitCode::from_virt_launcher_error(e),
        }
    }
}

impl ExitCode {
    /// How a launcher whose VM reached a final phase exits.
    fn from_final_phase(phase: Phase, reason: Option<PhaseReason>) -> ExitCode {
        match (phase, reason) {
            (Phase::Succeeded, _) => ExitCode::Succeeded,
            // Stopped before it ever ran (run strategy Manual or Halted): nothing failed.
            (Phase::Scheduled, _) => ExitCode::Succeeded,
            (Phase::Failed, Some(PhaseReason::GracePeriodExpired)) => ExitCode::GracePeriodExpired,
            (Phase::Failed, Some(PhaseReason::MigrationFailed)) => ExitCode::MigrationFailed,
            (Phase::Failed, _) => ExitCode::GuestFailed,
            (Phase::Unknown, _) => ExitCode::HypervisorUnavailable,
            (Phase::Running, _) => ExitCode::Internal,
        }
    }

    /// How a launcher exits when it could not bring its VM up.
    fn from_launcher_error(e: &LauncherError) -> ExitCode {
        match e {
            LauncherError::InvalidSpec(_) => ExitCode::BadSpec,
            // As the API's `Unavailable`: the same test decides both.
            e if e.is_unavailable() => ExitCode::HypervisorUnavailable,
            LauncherError::Unreachable | LauncherError::Connect(_) => {
                ExitCode::HypervisorUnavailable
            }
            LauncherError::HostDisk { .. }
            | LauncherError::HostFile { .. }
            | LauncherError::Libvirt(_) => ExitCode::GuestFailed,
            LauncherError::WrongInstance { .. }
            | LauncherError::FrozenFieldsChanged { .. }
            | LauncherError::Plan(_)
            | LauncherError::BlockDevice { .. }
            | LauncherError::NotAHotplugVolume { .. }
            | LauncherError::Refused(_)
            | LauncherError::Terminating { .. }
            | LauncherError::MigrationEnded { .. }
            | LauncherError::Preempted
            | LauncherError::InterfaceStuck { .. }
            | LauncherError::SyncInterrupted
            | LauncherError::LiveXml(_)
            | LauncherError::Join(_)
            | LauncherError::SaveSync(_)
            | LauncherError::NoMigration
            | LauncherError::MigrationTarget(_)
            | LauncherError::BlockVolume { .. }
            | LauncherError::MigrationAborted { .. } => ExitCode::Internal,
        }
    }

    /// How `run` (and `warm-cache`) exits when it fails before its VM ends.
    fn from_run_error(e: &RunError) -> ExitCode {
        match e {
            // `--qemu-user` names a user the host does not have.
            RunError::Setup(SetupError::QemuUser(_)) | RunError::GuestLoopback(_) => {
                ExitCode::Usage
            }
            RunError::Setup(SetupError::RuntimeDir(e)) => ExitCode::from_runtime_dir_error(e),
            RunError::Socket(e) => ExitCode::from_bind_error(e),
            RunError::HostPaths(_) => ExitCode::BadSpec,
            RunError::Start(e) | RunError::Resumed(e) | RunError::Incoming(e) => {
                ExitCode::from_launcher_error(e)
            }
            RunError::Daemons(_) | RunError::WarmCache(_) => ExitCode::HypervisorUnavailable,
            // The operator's directory is unusable; copying it into the runtime dir failed.
            RunError::MigrationTls(vmlauncher::migration_tls::TlsError::Install { .. }) => {
                ExitCode::Internal
            }
            RunError::MigrationTls(_) => ExitCode::Usage,
            // No id of the range is free, or the lock dir is unusable: the host's state.
            RunError::Setup(SetupError::QemuId(_)) => ExitCode::HypervisorUnavailable,
            RunError::Setup(SetupError::Signals)
            | RunError::Panicked(_)
            | RunError::WarmCachePanicked(_)
            | RunError::NoOffers
            | RunError::StatusClosed => ExitCode::Internal,
        }
    }

    /// How `virt-launcher` exits when it fails before its VM ends.
    fn from_virt_launcher_error(e: &VirtLauncherError) -> ExitCode {
        match e {
            VirtLauncherError::Setup(SetupError::RuntimeDir(e)) => {
                ExitCode::from_runtime_dir_error(e)
            }
            VirtLauncherError::Serve(e) => ExitCode::from_bind_error(e),
            VirtLauncherError::Libvirtd(_) => ExitCode::HypervisorUnavailable,
            VirtLauncherError::NoDomain { .. } => ExitCode::GuestFailed,
            // KubeVirt's QEMU user is the image's own: its lack is the launcher's failure.
            VirtLauncherError::Setup(
                SetupError::Signals | SetupError::QemuUser(_) | SetupError::QemuId(_),
            )
            | VirtLauncherError::Panicked(_)
            | VirtLauncherError::StatusClosed => ExitCode::Internal,
        }
    }

    /// How a launcher exits when its runtime dir cannot be its own.
    fn from_runtime_dir_error(e: &vmlauncher::runtime_dir::RuntimeDirError) -> ExitCode {
        Self::refused_or_failed(e.is_refusal())
    }

    /// How a launcher exits when it cannot listen on its API socket.
    fn from_bind_error(e: &vmlauncher::api::ApiError) -> ExitCode {
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
    fn from_rpc_code(code: tonic::Code) -> ExitCode {
        match code {
            tonic::Code::InvalidArgument => ExitCode::BadSpec,
            tonic::Code::Unavailable => ExitCode::HypervisorUnavailable,
            // gRPC's fixed set of codes, not this project's errors: every other one is a refused
            // request.
            _ => ExitCode::RequestFailed,
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
            ExitCode::from_final_phase(Phase::Succeeded, Some(PhaseReason::GuestShutdown)),
            ExitCode::Succeeded
        );
        assert_eq!(
            ExitCode::from_final_phase(Phase::Failed, Some(PhaseReason::GracePeriodExpired)),
            ExitCode::GracePeriodExpired
        );
        assert_eq!(
            ExitCode::from_final_phase(Phase::Failed, Some(PhaseReason::Crashed)),
            ExitCode::GuestFailed
        );
        assert_eq!(
            ExitCode::from_final_phase(Phase::Failed, Some(PhaseReason::MigrationFailed)),
            ExitCode::MigrationFailed
        );
        assert_eq!(
            ExitCode::from_final_phase(Phase::Succeeded, Some(PhaseReason::Migrated)),
            ExitCode::Succeeded
        );
        assert_eq!(
            ExitCode::from_final_phase(Phase::Failed, Some(PhaseReason::DomainLost)),
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
    fn a_refused_runtime_dir_is_refused_input_and_an_io_error_a_failure() {
        use vmlauncher::runtime_dir::RuntimeDirError;
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
        use vmlauncher::api::ApiError;
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
        use vmlauncher::lifecycle::Refusal;
        use vmlauncher::spec::SpecErrors;
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
                    source: vmlauncher::host::HostError::Missing { path: "/x".into() },
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
    fn how_a_command_ended_maps_to_codes() {
        let table = [
            (Ended::Done, ExitCode::Succeeded),
            (Ended::PartFailed, ExitCode::RequestFailed),
            (
                Ended::VmFinal {
                    phase: Phase::Failed,
                    reason: Some(PhaseReason::GracePeriodExpired),
                },
                ExitCode::GracePeriodExpired,
            ),
        ];
        for (ended, code) in table {
            assert_eq!(ExitCode::from(ended), code, "{ended:?}");
        }
    }

    #[test]
    fn why_a_command_failed_maps_to_codes() {
        use vmlauncher::kubevirt::flags::FlagsError;
        let io = || std::io::Error::from(std::io::ErrorKind::Other);
        let table = [
            (
                MainError::VirtLauncherFlags(FlagsError::Help),
                ExitCode::Succeeded,
            ),
            (
                MainError::VirtLauncherFlags(FlagsError::NotUtf8),
                ExitCode::Usage,
            ),
            (MainError::NoVolumeSource, ExitCode::Usage),
            (MainError::Stdout(io()), ExitCode::Internal),
            (
                MainError::Spec(SpecFileError::Unreadable {
                    path: "/s".into(),
                    source: io(),
                }),
                ExitCode::BadSpec,
            ),
            (
                MainError::Refused(tonic::Status::unavailable("down")),
                ExitCode::HypervisorUnavailable,
            ),
            (
                MainError::Edit(crate::cli::spec_edit::SpecEditError::NoVolume {
                    name: "v".into(),
                }),
                ExitCode::RequestFailed,
            ),
            (
                MainError::Run(RunError::Start(LauncherError::Unreachable)),
                ExitCode::HypervisorUnavailable,
            ),
            (
                MainError::Run(RunError::WarmCache(io())),
                ExitCode::HypervisorUnavailable,
            ),
            (MainError::Run(RunError::StatusClosed), ExitCode::Internal),
            (
                MainError::VirtLauncher(VirtLauncherError::NoDomain {
                    qemu_timeout: std::time::Duration::from_secs(5),
                }),
                ExitCode::GuestFailed,
            ),
        ];
        for (error, code) in table {
            assert_eq!(ExitCode::from(&error), code, "{error:?}");
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
