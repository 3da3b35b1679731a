//! KubeVirt's live migration through its cmd protocol, on the launcher's own migration
//! (`crate::launcher::migration`). virt-handler prepares the target first
//! (`SyncMigrationTarget`: the launcher starts from the VMI with no domain, its disks made, and
//! shows the sockets virt-handler's migration proxy connects to), then asks the source
//! (`MigrateVirtualMachine`), which answers at once and moves the guest in the background
//! through the proxy sockets KubeVirt names (`sockets`). Both sides report in the domain's
//! `Metadata.KubeVirt.Migration` — start, end, failed and why, abort status, mode — which
//! virt-handler reads from `GetDomain` and notify, as from KubeVirt's launcher.
//!
//! Not supported, and said so once per migration: post-copy, auto-converge, parallel streams,
//! compression, progress and stall timeouts, downtime tuning, KubeVirt's legacy TCP transport,
//! and decentralized (cross-cluster) migrations' renamed domains.

pub(super) mod sockets;
pub(super) mod wire;

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::domain_json::MigrationMeta;
use super::errors::MigrationError;
use super::front::{now_rfc3339, Front, FrontError};
use super::proto::cmd::{MigrationRequest, VmiRequest};
use crate::launcher::{
    Launcher, LauncherError, MigrateRequest, MigrationRole, MigrationState, MigrationStatus,
};
use crate::run::RuntimeDir;

/// KubeVirt's `MigrationAbortStatus` values.
const ABORTING: &str = "Aborting";
const ABORT_SUCCEEDED: &str = "Succeeded";
const ABORT_FAILED: &str = "Failed";
/// KubeVirt's interface migration method that asks the launcher to take a NIC's link down and
/// up once the guest arrived (for the guest to renew its DHCP lease).
const LINK_REFRESH: &str = "LinkRefresh";

/// What KubeVirt's `initializeMigrationMetadata` decides for a migration `uid`, given the one
/// this launcher knows of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Begin {
    New,
    /// The same migration, not over: a retry of the call.
    InProgress,
}

fn may_begin(known: Option<&MigrationMeta>, uid: &str) -> Result<Begin, MigrationError> {
    match known {
        Some(m) if m.uid == uid => match &m.end_timestamp {
            None => Ok(Begin::InProgress),
            // A migration is one shot, as a pod is.
            Some(end) => Err(MigrationError::AlreadyRan {
                uid: m.uid.clone(),
                end: end.clone(),
                failed: m.failed,
                abort_status: m.abort_status.clone(),
            }),
        },
        Some(m) if m.end_timestamp.is_none() => Err(MigrationError::Busy {
            running: m.uid.clone(),
            asked: uid.into(),
        }),
        _ => Ok(Begin::New),
    }
}

/// Records the start of migration `uid` unless it is under way; checked and set at once.
fn begin(front: &Front, uid: &str) -> Result<Begin, MigrationError> {
    let mut outcome = Ok(Begin::InProgress);
    front.update_meta(|m| {
        outcome = may_begin(m.domain.migration.as_ref(), uid);
        if matches!(outcome, Ok(Begin::New)) {
            m.domain.migration = Some(MigrationMeta {
                uid: uid.into(),
                start_timestamp: Some(now_rfc3339()),
                mode: wire::PRE_COPY.into(),
                ..MigrationMeta::default()
            });
        }
    });
    outcome
}

/// `SyncMigrationTarget`: the launcher is made from the VMI as a first Sync makes it, but waits
/// for its guest; `<share>/migrationproxy` is made for its QEMU's listening sockets and its
/// libvirt shown at `--libvirt-socket`, where virt-handler's proxy connects. A retry does it all
/// again, as KubeVirt's target does.
pub(super) async fn sync_target(front: Arc<Front>, vmi_json: Vec<u8>) -> Result<(), FrontError> {
    let sync = front.handler_vmi(&vmi_json)?;
    let state = wire::vmi_migration(&vmi_json)?;
    state.check_transport()?;
    let uid = state.migration_uid()?.to_string();
    may_begin(front.meta().domain.migration.as_ref(), &uid)?;
    let (launcher, created) = front.start_incoming(sync).await?;
    let flags = &front.flags;
    sockets::prepare_proxy_dir(
        &flags.kubevirt_share_dir,
        front.qemu_user.uid,
        front.qemu_user.gid,
    )?;
    let libvirt = crate::libvirt::daemon::PrivateDaemon::socket_for(
        &RuntimeDir(flags.runtime_dir.clone()).libvirt_dir(),
    );
    sockets::show_libvirt(&flags.libvirt_socket, &libvirt)?;
    begin(&front, &uid)?;
    if state.paused {
        // The source's guest is paused by its user: it stays paused here, through Syncs.
        front.update_meta(|m| m.user_paused = true);
    }
    if created {
        tokio::spawn(follow_target(front.clone(), launcher));
    }
    tracing::info!(migration = %uid, "prepared as the migration's target");
    Ok(())
}

/// On the target: the migration's end once the launcher has the guest (after libvirt's job is
/// over, as KubeVirt's target monitor waits for it), or lost it.
async fn follow_target(front: Arc<Front>, launcher: Arc<Launcher>) {
    let mut status = launcher.subscribe();
    let ended = |m: &MigrationStatus| m.role == MigrationRole::Target && m.state.is_over();
    let Ok(status) = status
        .wait_for(|s| s.migration.as_ref().is_some_and(ended))
        .await
    else {
        return;
    };
    let Some(ended) = status.migration.clone() else {
        return;
    };
    drop(status);
    front.update_meta(|m| {
        if let Some(meta) = m.domain.migration.as_mut() {
            meta.end_timestamp = Some(now_rfc3339());
            if ended.state != MigrationState::Completed {
                meta.failed = true;
                meta.failure_reason = ended.message.clone();
            }
        }
    });
}

/// `MigrateVirtualMachine`: checked, recorded as started, and run in the background; the
/// answer comes at once, the outcome in the domain's migration metadata.
pub(super) async fn migrate(
    front: Arc<Front>,
    request: MigrationRequest,
) -> Result<(), FrontError> {
    let vmi_json = request.vmi.map(|v| v.vmi_json).unwrap_or_default();
    front.handler_vmi(&vmi_json)?;
    let state = wire::vmi_migration(&vmi_json)?;
    let uid = state.migration_uid()?.to_string();
    let options = wire::migration_options(&request.options)?;
    let launcher = front.running()?.clone();
    let memory = launcher.status().memory.map_or(0, |m| m.requested);
    let timeout = options.completion_timeout(memory);
    let flags = &front.flags;
    let plan = sockets::kubevirt_plan(
        &flags.kubevirt_share_dir,
        &state.vmi_uid,
        flags.runtime_dir.clone(),
        flags.hotplug_disk_dir.clone(),
    );
    let migrate = MigrateRequest {
        target: plan.libvirt_uri.clone(),
        // virt-handler prepared the target before it asked: the plan is KubeVirt's fixed one.
        prepare: Box::new(move |_| Box::pin(async move { Ok(plan) })),
        timeout,
        bandwidth_mib: options.bandwidth_mib,
    };
    if begin(&front, &uid)? == Begin::InProgress {
        return Ok(());
    }
    if !options.not_honoured.is_empty() {
        tracing::warn!(
            migration = %uid,
            options = ?options.not_honoured,
            "MigrationOptions not supported by vmlauncher, ignored: the migration runs pre-copy, \
             one stream, uncompressed, bounded only by CompletionTimeoutPerGiB"
        );
    }
    tracing::info!(migration = %uid, ?timeout, bandwidth_mib = ?options.bandwidth_mib, "migrating");
    tokio::spawn(async move {
        let started = Instant::now();
        let result = launcher.migrate(migrate).await.map(drop);
        if let Err(e) = &result {
            tracing::warn!(migration = %uid, error = %crate::error_chain(e), "the migration failed");
        }
        record_outcome(&front, &result, timeout, started.elapsed());
    });
    Ok(())
}

/// The source's end of a migration, in KubeVirt's words (its `setMigrationResult`).
fn record_outcome(
    front: &Front,
    result: &Result<(), LauncherError>,
    timeout: Option<Duration>,
    took: Duration,
) {
    let end = now_rfc3339();
    front.update_meta(|m| {
        let Some(meta) = m.domain.migration.as_mut() else {
            return;
        };
        meta.end_timestamp = Some(end);
        let aborting = meta.abort_status == ABORTING;
        match result {
            // Asked to abort, it completed all the same.
            Ok(()) if aborting => meta.abort_status = ABORT_FAILED.into(),
            Ok(()) => {}
            Err(e) => {
                meta.failed = true;
                meta.failure_reason = match (e, timeout) {
                    _ if aborting => {
                        meta.abort_status = ABORT_SUCCEEDED.into();
                        "Live migration has been aborted".into()
                    }
                    (LauncherError::MigrationAborted { .. }, Some(t)) if took >= t => format!(
                        "Live migration is not completed after {} seconds and has been aborted",
                        t.as_secs()
                    ),
                    _ => crate::error_chain(e),
                };
            }
        }
    });
}

/// `CancelVirtualMachineMigration`: the migration in flight is aborted, the guest stays here.
/// As KubeVirt's, a call with no migration to cancel (none, over, or already aborting) is
/// ignored, and an abort that cannot be made is reported in the abort status, not the answer.
pub(super) fn cancel(front: &Front, vmi_json: &[u8]) -> Result<(), FrontError> {
    front.handler_vmi(vmi_json)?;
    let Some(launcher) = front.launcher().cloned() else {
        tracing::info!("cancel migration ignored: no VM here");
        return Ok(());
    };
    let mut asked = false;
    front.update_meta(|m| {
        let Some(meta) = m.domain.migration.as_mut() else {
            return;
        };
        let migrating = meta.start_timestamp.is_some()
            && meta.end_timestamp.is_none()
            && !meta.failed
            && meta.abort_status != ABORTING
            && meta.abort_status != ABORT_SUCCEEDED;
        if migrating {
            meta.abort_status = ABORTING.into();
            asked = true;
        }
    });
    if !asked {
        tracing::info!("cancel migration ignored: the VM is not migrating");
        return Ok(());
    }
    if let Err(e) = launcher.cancel_migration() {
        tracing::warn!(error = %crate::error_chain(&e), "cannot cancel the migration");
        front.update_meta(|m| {
            if let Some(meta) = m.domain.migration.as_mut() {
                meta.abort_status = ABORT_FAILED.into();
            }
        });
    }
    Ok(())
}

/// `FinalizeVirtualMachineMigration`, on the target once the guest runs here. KubeVirt's
/// launcher takes the links of interfaces whose binding asks for it (`LinkRefresh`: the guest
/// renews its lease) down and up, and sets the guest's clock through its agent. vmlauncher does
/// neither: its guest's clock runs on across a migration whose downtime is well under a
/// second, and an interface's link refresh is not built (said per interface). So it answers
/// success.
pub(super) fn finalize(front: &Front, request: &VmiRequest) -> Result<(), FrontError> {
    let vmi_json = request
        .vmi
        .as_ref()
        .map(|v| v.vmi_json.as_slice())
        .unwrap_or_default();
    front.handler_vmi(vmi_json)?;
    let refresh = request
        .options
        .iter()
        .flat_map(|o| &o.interface_migration)
        .filter(|(_, m)| m.method == LINK_REFRESH);
    for (interface, _) in refresh {
        tracing::warn!(%interface, "LinkRefresh after a migration is not supported: the guest keeps its lease until it renews it");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(uid: &str, end: Option<&str>) -> MigrationMeta {
        MigrationMeta {
            uid: uid.into(),
            start_timestamp: Some("2026-11-26T12:00:00Z".into()),
            end_timestamp: end.map(Into::into),
            mode: wire::PRE_COPY.into(),
            ..MigrationMeta::default()
        }
    }

    #[test]
    fn a_migration_runs_once_and_one_at_a_time() {
        assert_eq!(may_begin(None, "a").unwrap(), Begin::New);
        assert_eq!(
            may_begin(Some(&meta("a", None)), "a").unwrap(),
            Begin::InProgress
        );
        assert!(matches!(
            may_begin(Some(&meta("a", Some("2026-11-26T12:01:00Z"))), "a"),
            Err(MigrationError::AlreadyRan { .. })
        ));
        assert!(matches!(
            may_begin(Some(&meta("a", None)), "b"),
            Err(MigrationError::Busy { .. })
        ));
        assert_eq!(
            may_begin(Some(&meta("a", Some("2026-11-26T12:01:00Z"))), "b").unwrap(),
            Begin::New
        );
    }
}
