//! The errors of the cmd server's calls: a call's failure as virt-handler reads it
//! ([`FrontError`]), and the migration and resize calls' own. Apart from the calls, so that each
//! call's module imports them and `front` imports none of the calls.

use super::domain_json::DomainJsonError;
use super::migration::sockets::SocketError;
use super::migration::wire::WireError;
use super::vmi::VmiError;
use crate::launcher::LauncherError;

/// A call's failure, as the Go launcher reports it: `Response{success: false, message}`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FrontError {
    #[error(transparent)]
    Vmi(#[from] VmiError),
    #[error("vmi.vmiJson: metadata: this launcher runs {expected}, the VMI is {got}")]
    WrongVmi { expected: String, got: String },
    #[error("no domain: no SyncVirtualMachine has created it yet")]
    NoDomain,
    #[error("the domain was deleted; this launcher's VM is over")]
    Deleted,
    #[error("{}", crate::error_chain(.0))]
    Launcher(#[from] LauncherError),
    #[error("volume(s) failed: {0}")]
    Volumes(String),
    #[error("the domain's JSON: {}", crate::error_chain(.0))]
    DomainJson(#[source] DomainJsonError),
    #[error(transparent)]
    Migration(#[from] MigrationError),
    #[error(transparent)]
    Resize(#[from] ResizeError),
    /// The guest agent answered a command with something other than what it returns.
    #[error("{command} answered {answer:?}")]
    AgentAnswer {
        command: &'static str,
        answer: String,
    },
    /// A freeze asked while the guest moves: KubeVirt's own refusal, in its words.
    #[error("failed to freeze VMI, VMI is currently during migration")]
    FreezeDuringMigration,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum MigrationError {
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error(transparent)]
    Socket(#[from] SocketError),
    #[error("this launcher runs its own VM: only one with no VM yet is a migration target")]
    NotATarget,
    #[error(
        "migration job {uid} already executed, finished at {end}, failed: {failed}, \
         abortStatus: {abort_status}"
    )]
    AlreadyRan {
        uid: String,
        end: String,
        failed: bool,
        abort_status: String,
    },
    #[error("migration {running} is in progress; {asked} waits for it to end")]
    Busy { running: String, asked: String },
}

impl From<WireError> for FrontError {
    fn from(e: WireError) -> Self {
        FrontError::Migration(e.into())
    }
}

impl From<SocketError> for FrontError {
    fn from(e: SocketError) -> Self {
        FrontError::Migration(e.into())
    }
}

/// Why a CPU or memory sync did not reach the guest.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ResizeError {
    #[error("failed to update {what}: the VM is not running")]
    NotRunning { what: &'static str },
    #[error("failed to update {what}: {message}")]
    Refused { what: &'static str, message: String },
    #[error(
        "failed to update vCPUs: Reduction of CPU socket count requires a restart: the guest \
         keeps {from} vCPUs and boots next with {to}"
    )]
    RestartRequired { from: u64, to: u64 },
}
