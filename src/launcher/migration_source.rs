//! Live migration between two launchers, the source's side. The source runs it as a task
//! (`Migrate`): it hands the target its last accepted Sync, moves the guest with libvirt's
//! peer-to-peer migration between the two private libvirtds, and ends its VM's life as
//! "Migrated"; a launcher restarted mid-migration follows the one its predecessor started. The
//! target's side is `migration_target`. See `docs/DESIGN.md` §4.

use std::sync::Arc;
use std::time::Duration;

use super::migration_plan::{pinned_sources, IncomingOffer, PrepareTarget, TargetError};
use super::tasks::Work;

use super::coordinator::Launcher;
use super::error::LauncherError;
use super::migration_part::{left_by_migration, Marker};
use super::types::{MigrationRole, MigrationState, MigrationStatus};
use crate::domain::migratable;
use crate::libvirt::migrate::MigrateTo;
use crate::libvirt::{Hypervisor, LibvirtError};
use crate::lifecycle::{Command, Observation};
use tokio::sync::watch;

/// How often the source reads the migration's progress (and the CLI prints it).
const PROGRESS_INTERVAL: Duration = Duration::from_secs(1);

/// A migration the owner asked for.
pub(crate) struct MigrateRequest {
    /// The target's API socket, as the owner named it.
    pub target: String,
    pub prepare: PrepareTarget,
    /// Cancelled when it takes longer.
    pub timeout: Option<Duration>,
    pub bandwidth_mib: Option<u64>,
}

impl std::fmt::Debug for MigrateRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MigrateRequest")
            .field("target", &self.target)
            .field("timeout", &self.timeout)
            .field("bandwidth_mib", &self.bandwidth_mib)
            .finish_non_exhaustive()
    }
}

impl Work for MigrateRequest {
    type Output = MigrationStatus;

    fn command(&self) -> Command {
        Command::Migrate
    }

    async fn perform(self, launcher: &Launcher) -> Result<MigrationStatus, LauncherError> {
        let result = launcher.migrate_out(self).await;
        launcher.refresh().await;
        result
    }
}

impl Launcher {
    /// Moves the VM to the launcher `request.target`; returns once it runs there.
    pub(crate) async fn migrate(
        &self,
        request: MigrateRequest,
    ) -> Result<(u64, MigrationStatus), LauncherError> {
        self.run(request).await
    }

    /// Cancels the migration in flight; the guest keeps running here.
    pub(crate) fn cancel_migration(&self) -> Result<(), LauncherError> {
        let migrating = self
            .state
            .lock()
            .expect("state lock")
            .migration
            .is_outgoing();
        if !migrating {
            return Err(LauncherError::NoMigration);
        }
        self.signals.cancel_migration();
        Ok(())
    }

    async fn migrate_out(&self, request: MigrateRequest) -> Result<MigrationStatus, LauncherError> {
        // From the start: a cancel, Kill or SIGTERM while the target prepares stops it too.
        let mut cancel = self.signals.subscribe_migration_cancel();
        cancel.borrow_and_update();
        let mut interrupt = self.signals.subscribe_interrupt();
        interrupt.borrow_and_update();
        self.update(|s| {
            s.migration.begin(
                MigrationRole::Source,
                MigrationState::Preparing,
                request.target.clone(),
            )
        });
        let to = match self
            .migration_destination(request.prepare, request.bandwidth_mib)
            .await
        {
            Ok(to) => to,
            Err(e) => return Err(self.migration_failed(e, false)),
        };
        let hv = match self.hypervisor() {
            Ok(hv) => hv,
            Err(e) => return Err(self.migration_failed(e, false)),
        };
        if cancel.has_changed().unwrap_or(false) || interrupt.has_changed().unwrap_or(false) {
            let e = LauncherError::MigrationAborted {
                why: "cancelled",
                libvirt: "before it started".into(),
            };
            return Err(self.migration_failed(e, true));
        }
        let marker = self.migration_marker();
        if let Err(e) = super::blocking::host_work(|| marker.write(&request.target)) {
            return Err(self.migration_failed(TargetError::Marker(e).into(), false));
        }
        self.update(|s| s.migration.migrating());
        let n = self.domain_name.clone();
        let moving = hv.clone();
        let job = tokio::task::spawn_blocking(move || moving.migrate(&n, &to));
        let deadline = request.timeout.map(|t| tokio::time::Instant::now() + t);
        let (result, aborted) = self
            .follow_migration(&hv, job, deadline, &mut cancel, &mut interrupt)
            .await?;
        if result.is_err() {
            marker.remove();
        }
        self.migration_outcome(result, aborted)
    }

    /// Has the target prepare itself, then says where and how the guest goes there: the
    /// libvirt URIs, the domain's XML with its paths moved to the target's, the disks to copy.
    async fn migration_destination(
        &self,
        prepare: PrepareTarget,
        bandwidth_mib: Option<u64>,
    ) -> Result<MigrateTo, LauncherError> {
        let paths = &self.options.convert.paths;
        let offer = IncomingOffer {
            input: self.last_input(),
            domain_name: self.domain_name.clone(),
            source_runtime_dir: self.options.runtime_dir.clone(),
            source_hotplug_dir: paths.hotplug_dir.clone(),
        };
        let plan = prepare(offer).await?;
        let n = self.domain_name.clone();
        let xml = self.call(move |hv| hv.migratable_xml(&n))?;
        let copy_disks = migratable::copied_disks(&xml, &paths.private_dir)?;
        // Each image the target pinned (claims, hot-plugged files) is named by its pin there;
        // another pinned hot-plugged file becomes the target's volume path
        // (`<hotplug>/<volume>.img`, the pin's own file name), given to QEMU by path.
        let pinned_there = pinned_sources(&xml, &plan.pins)?;
        let mut moves: Vec<(&std::path::Path, &std::path::Path)> = vec![
            (&self.options.runtime_dir, &plan.runtime_dir),
            (&paths.hotplug_dir, &plan.hotplug_dir),
        ];
        if let Some(dir) = self.pins.dir() {
            moves.push((dir, &plan.hotplug_dir));
        }
        moves.extend(
            pinned_there
                .iter()
                .map(|(here, there)| (here.as_path(), *there)),
        );
        let dest_xml = migratable::for_target(&xml, &moves);
        let tls = plan.over_tcp();
        let libvirt_uri = match (tls, &self.options.migration_tls) {
            (false, _) => plan.libvirt_uri,
            // The source's libvirtd presents this launcher's client certificate.
            (true, Some(installed)) => format!(
                "{}?pkipath={}",
                plan.libvirt_uri,
                uri_path(&installed.libvirt_dir)
            ),
            (true, None) => return Err(TargetError::NoCredentials.into()),
        };
        Ok(MigrateTo {
            libvirt_uri,
            tls,
            migration_uri: plan.migration_uri,
            disks_uri: plan.disks_uri,
            listen_address: plan.listen_address,
            dest_xml,
            copy_disks,
            bandwidth_mib,
        })
    }

    /// Waits for libvirt's migration `job`, noting its progress each tick; a cancel, an
    /// interrupt or the deadline aborts it. Returns the job's result and, when aborted, the
    /// state the abort leaves the migration in.
    async fn follow_migration(
        &self,
        hv: &Arc<Hypervisor>,
        mut job: tokio::task::JoinHandle<Result<(), LibvirtError>>,
        deadline: Option<tokio::time::Instant>,
        cancel: &mut watch::Receiver<u64>,
        interrupt: &mut watch::Receiver<u64>,
    ) -> Result<(Result<(), LibvirtError>, Option<MigrationState>), LauncherError> {
        let mut tick = tokio::time::interval(PROGRESS_INTERVAL);
        let mut aborted: Option<MigrationState> = None;
        let result = loop {
            let timed_out = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                done = &mut job => break done.map_err(LauncherError::Join)?,
                _ = tick.tick() => {
                    let n = self.domain_name.clone();
                    let h = hv.clone();
                    if let Ok(Ok(Some(p))) = tokio::task::spawn_blocking(move || h.job_progress(&n)).await {
                        self.update(|s| s.migration.progress(p));
                    }
                }
                _ = cancel.changed(), if aborted.is_none() => {
                    aborted = Some(MigrationState::Cancelled);
                    self.abort_migration(hv).await;
                }
                _ = interrupt.changed(), if aborted.is_none() => {
                    aborted = Some(MigrationState::Cancelled);
                    self.abort_migration(hv).await;
                }
                () = timed_out, if aborted.is_none() => {
                    aborted = Some(MigrationState::Failed);
                    self.abort_migration(hv).await;
                }
            }
        };
        Ok((result, aborted))
    }

    /// The migration's end as the status and the caller see it, from libvirt's result and
    /// whether (and why) it was aborted.
    fn migration_outcome(
        &self,
        result: Result<(), LibvirtError>,
        aborted: Option<MigrationState>,
    ) -> Result<MigrationStatus, LauncherError> {
        match (result, aborted) {
            (Ok(()), _) => {
                self.update(|s| {
                    s.life = s.life.migrated_away();
                    s.migration.completed();
                });
                Ok(self.status().migration.expect("just set"))
            }
            (Err(e), Some(MigrationState::Failed)) => {
                let e = LauncherError::MigrationAborted {
                    why: "given up after --timeout",
                    libvirt: e.libvirt_message(),
                };
                Err(self.migration_failed(e, false))
            }
            (Err(e), Some(_)) => {
                let e = LauncherError::MigrationAborted {
                    why: "cancelled",
                    libvirt: e.libvirt_message(),
                };
                Err(self.migration_failed(e, true))
            }
            (Err(e), None) => Err(self.migration_failed(e.into(), false)),
        }
    }

    pub(super) fn migration_marker(&self) -> Marker {
        Marker::at(&self.options.runtime_dir)
    }

    /// At start, after a predecessor killed mid-migration: `Some(MigratedAway)` when the VM is
    /// gone from here (it runs on the target), nothing to do when no migration was noted. With
    /// the domain still here, the migration may still run in libvirt: followed to its end.
    pub(super) fn migration_left_behind(
        &self,
        domain_here: bool,
    ) -> Option<super::types::StartKind> {
        let marker = self.migration_marker();
        let target = marker.read()?;
        if !domain_here {
            self.update(|s| {
                s.migration.ended(
                    MigrationRole::Source,
                    target,
                    MigrationState::Completed,
                    "the guest left while no launcher ran here".into(),
                );
                s.life = s.life.migrated_away();
            });
            return Some(super::types::StartKind::MigratedAway);
        }
        let n = self.domain_name.clone();
        if matches!(self.call(move |hv| hv.job_progress(&n)), Ok(Some(_))) {
            self.update(|s| {
                s.migration
                    .begin(MigrationRole::Source, MigrationState::Migrating, target)
            });
        } else {
            marker.remove();
        }
        None
    }

    /// The reconciler's part: a migration a predecessor started ended while this launcher
    /// followed it (no task of ours runs it). True when the VM left.
    pub(super) fn reconcile_left_behind(&self) -> bool {
        let s = self.state.lock().expect("state lock");
        let following = s.migration.is_outgoing();
        if !following || s.task.is_some() {
            return false;
        }
        drop(s);
        let observation = self.observation();
        let left = left_by_migration(&observation);
        let failed = matches!(&observation, Observation::Domain(p) if p.state.is_active() && p.reason != "migration");
        if !left {
            // Asked of libvirt only while the guest may still be on its way.
            let n = self.domain_name.clone();
            let running_job = matches!(self.call(move |hv| hv.job_progress(&n)), Ok(Some(_)));
            if running_job || !failed {
                return false;
            }
        }
        if !left {
            self.migration_marker().remove();
        }
        self.update(|s| {
            if left {
                s.life = s.life.migrated_away();
            }
            let state = if left {
                MigrationState::Completed
            } else {
                MigrationState::Failed
            };
            s.migration
                .end(state, "followed after a launcher restart".into());
        });
        left
    }

    async fn abort_migration(&self, hv: &std::sync::Arc<crate::libvirt::Hypervisor>) {
        let (h, n) = (hv.clone(), self.domain_name.clone());
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || h.abort_job(&n)).await {
            tracing::warn!(error = %crate::error_chain(&e), "cannot abort the migration");
        }
    }

    fn migration_failed(&self, e: LauncherError, cancelled: bool) -> LauncherError {
        let state = if cancelled {
            MigrationState::Cancelled
        } else {
            MigrationState::Failed
        };
        let message = crate::error_chain(&e);
        self.update(|s| s.migration.end(state, message));
        e
    }
}

/// `path` as a URI query value: unreserved characters and `/` as they are, the rest
/// percent-encoded.
fn uri_path(path: &std::path::Path) -> String {
    let mut out = String::new();
    for byte in path.as_os_str().as_encoded_bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => {
                out.push(*byte as char)
            }
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn a_pkipath_is_percent_encoded_beyond_the_unreserved() {
        assert_eq!(
            uri_path(Path::new("/run/vm 1/tls&x")),
            "/run/vm%201/tls%26x"
        );
        assert_eq!(
            uri_path(Path::new("/run/vm-1/tls_a.b~")),
            "/run/vm-1/tls_a.b~"
        );
    }
}
