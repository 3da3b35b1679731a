//! The launcher's one error type: every job returns it, `exit` maps each variant to its exit
//! code and `api` to its gRPC status.

use std::time::Duration;

use crate::domain;
use crate::host::devnode::DevNodeError;
use crate::host::HostError;
use crate::hotplug::PlanError;
use crate::libvirt::{ConnectError, LibvirtError};
use crate::lifecycle::Refusal;
use crate::spec::SpecErrors;

use super::migration_plan::TargetError;
use super::saved::SavedSyncError;

#[derive(Debug, thiserror::Error)]
pub enum LauncherError {
    #[error("invalid spec:\n{0}")]
    InvalidSpec(#[from] SpecErrors),
    #[error("the spec is for {requested}, this launcher runs {running}")]
    WrongInstance { running: String, requested: String },
    #[error("cannot change {} while the VM runs; only disks, cpu.sockets and memory.guest can change", .fields.join(", "))]
    FrozenFieldsChanged { fields: Vec<&'static str> },
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("block device of volume {volume:?}")]
    BlockDevice {
        volume: String,
        #[source]
        source: DevNodeError,
    },
    #[error("block_devices names volume {volume:?}, which is not a hot-pluggable claim (persistentVolumeClaim or dataVolume with hotpluggable: true) of the spec")]
    NotAHotplugVolume { volume: String },
    #[error("volume {volume:?}")]
    HostDisk {
        volume: String,
        #[source]
        source: HostError,
    },
    /// A host file the spec names (`hostDisk.path`, `kernelPath`, `initrdPath`), refused or
    /// missing when the domain was (re)started: `field` is its path in the spec.
    #[error("{field}")]
    HostFile {
        field: String,
        #[source]
        source: HostError,
    },
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("the hypervisor is unreachable")]
    Unreachable,
    #[error("cannot {command}: the launcher is shutting down")]
    Terminating { command: &'static str },
    /// The VM's life here ended by a migration (it went to another launcher, or it never came
    /// in): starting it here would run a second copy of a guest that runs elsewhere.
    #[error("cannot {command}: {how}")]
    MigrationEnded {
        command: &'static str,
        how: &'static str,
    },
    #[error("the graceful stop gave way to a Kill")]
    Preempted,
    #[error(
        "interface {alias} is still in the guest after {waited:?}: the guest has not let it go"
    )]
    InterfaceStuck { alias: String, waited: Duration },
    #[error("the Sync stopped part-way: the VM is being stopped (SIGTERM or Kill); the volumes not reached keep their status")]
    SyncInterrupted,
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error(transparent)]
    Libvirt(#[from] LibvirtError),
    #[error(transparent)]
    LiveXml(#[from] domain::LiveXmlError),
    #[error("a libvirt call panicked")]
    Join(#[source] tokio::task::JoinError),
    #[error(transparent)]
    SaveSync(#[from] SavedSyncError),
    #[error("no migration is in flight")]
    NoMigration,
    #[error("the migration target")]
    MigrationTarget(#[from] TargetError),
    #[error("block volume {volume:?}")]
    BlockVolume {
        volume: String,
        #[source]
        source: crate::host::block::BlockHostError,
    },
    #[error("the migration was {why}; the guest runs here (libvirt: {libvirt})")]
    MigrationAborted { why: &'static str, libvirt: String },
}

impl LauncherError {
    /// The failure is about reaching libvirt, not about the request.
    pub fn is_unavailable(&self) -> bool {
        match self {
            LauncherError::Unreachable
            | LauncherError::Connect(_)
            | LauncherError::Refused(Refusal::Unreachable { .. }) => true,
            LauncherError::Libvirt(l) => l.is_unavailable(),
            _ => false,
        }
    }
}

/// libvirt's own words for a failed call, for a one-line status.
pub(super) fn libvirt_message(e: &LauncherError) -> String {
    match e {
        LauncherError::Libvirt(l) => l.libvirt_message(),
        other => crate::error_chain(other),
    }
}
