//! Migration as a part of the launcher: the one owner of what a migration leaves in the
//! launcher's state, on both ends. It holds the migration in flight or last ended (what the
//! status shows) and moves it only along the legal steps: begun (a source Preparing, a target
//! Preparing or Waiting), Migrating, then one end — Completed, Failed or Cancelled — that
//! stands; a new migration may begin after an end. The source's marker file (`Marker`: "my
//! guest may be leaving for ...", read by a restarted launcher) is its file on disk. The jobs
//! that run a migration (`migration_source`: the source's task; `migration_target`: the
//! target's preparation and its following of the incoming guest) change it only through these moves.
//!
//! Lock rule: the value lives inside the launcher's `State`, under its one lock, because it is
//! part of the status, published in one snapshot with the phase it decides (Migrated,
//! MigrationFailed, Scheduled while a guest comes in); it is changed only inside
//! `Launcher::update`. The marker is written and removed only with the task slot held (the
//! source's task, the start, the reconciler's turn) or as the launcher ends, never under the
//! state lock. The cancel signal is `Signals`' (a watch channel, no lock).

use std::path::{Path, PathBuf};

use super::types::{MigrationRole, MigrationState, MigrationStatus};
use crate::libvirt::migrate::JobProgress;
use crate::lifecycle::{DomainState, Observation};

/// The migration in flight or last ended, if any.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Migration {
    current: Option<MigrationStatus>,
}

impl Migration {
    /// What status shows.
    pub(super) fn status(&self) -> Option<&MigrationStatus> {
        self.current.as_ref()
    }

    /// A target whose guest has not arrived yet.
    pub(super) fn is_incoming(&self) -> bool {
        self.current
            .as_ref()
            .is_some_and(MigrationStatus::is_incoming)
    }

    /// A source whose guest has not left yet.
    pub(super) fn is_outgoing(&self) -> bool {
        self.current
            .as_ref()
            .is_some_and(MigrationStatus::is_outgoing)
    }

    fn in_flight(&mut self) -> Option<&mut MigrationStatus> {
        self.current.as_mut().filter(|m| !m.state.is_over())
    }

    /// A new migration, replacing one that ended. `state` is where it begins: Preparing (a
    /// source, a target asked to get ready), Waiting (a target no source has come to), or
    /// Migrating (a source's migration found running after a restart).
    pub(super) fn begin(&mut self, role: MigrationRole, state: MigrationState, peer: String) {
        debug_assert!(!state.is_over(), "a migration begins in flight");
        self.current = Some(MigrationStatus::new(role, state, peer));
    }

    /// The guest is on its way (a no-op once the migration ended).
    pub(super) fn migrating(&mut self) {
        if let Some(m) = self.in_flight() {
            m.state = MigrationState::Migrating;
        }
    }

    /// libvirt's latest word on how far it is (a no-op once the migration ended).
    pub(super) fn progress(&mut self, progress: JobProgress) {
        if let Some(m) = self.in_flight() {
            m.progress = progress;
        }
    }

    /// The source's guest left: nothing remains to copy.
    pub(super) fn completed(&mut self) {
        if let Some(m) = self.in_flight() {
            m.progress.data_remaining = 0;
        }
        self.end(MigrationState::Completed, String::new());
    }

    /// The target's guest arrived; `stats` are the completed job's, when libvirt kept them.
    pub(super) fn arrived(&mut self, stats: Option<JobProgress>) {
        if let Some(stats) = stats {
            self.progress(stats);
        }
        self.end(MigrationState::Completed, String::new());
    }

    /// The migration's end, `state` Completed, Failed or Cancelled. The first end stands: a
    /// later one (a failure reported after the guest had left, say) changes nothing.
    pub(super) fn end(&mut self, state: MigrationState, message: String) {
        debug_assert!(state.is_over(), "{state:?} is not an end");
        if let Some(m) = self.in_flight() {
            m.end(state, message);
        }
    }

    /// A migration that began and ended at once (a predecessor's, found over at start).
    pub(super) fn ended(
        &mut self,
        role: MigrationRole,
        peer: String,
        state: MigrationState,
        message: String,
    ) {
        self.begin(role, MigrationState::Migrating, peer);
        self.end(state, message);
    }
}

/// The source's note, in its runtime dir, that its VM is on its way to (or reached) another
/// launcher: written before libvirt's migration starts, removed when it failed, and when the
/// launcher ends after it succeeded. A launcher that starts on this dir and finds it (its
/// predecessor was killed mid-migration) never boots the VM again: with no domain left, the
/// VM is there; with one still migrating, it follows the migration to its end.
pub(super) struct Marker(PathBuf);

impl Marker {
    pub(super) fn at(runtime_dir: &Path) -> Marker {
        Marker(runtime_dir.join("migrating-to"))
    }

    pub(super) fn write(&self, target: &str) -> std::io::Result<()> {
        crate::durable::write_atomically(&self.0, target.as_bytes())
    }

    pub(super) fn read(&self) -> Option<String> {
        std::fs::read_to_string(&self.0).ok()
    }

    pub(super) fn remove(&self) {
        if let Err(e) = std::fs::remove_file(&self.0) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(path = %self.0.display(), error = %e, "cannot remove the migration marker");
            }
        }
    }
}

/// The domain is gone from here by migration: no domain, or one left defined and shut off
/// "migrated" (libvirt undefines the source only when its caller saw the migration through).
pub(super) fn left_by_migration(observation: &Observation) -> bool {
    match observation {
        Observation::Vanished => true,
        Observation::Domain(p) => p.state == DomainState::Shutoff && p.reason == "migrated",
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use MigrationState::*;

    fn state(m: &Migration) -> Option<MigrationState> {
        m.status().map(|s| s.state)
    }

    /// A source's migration: Preparing, Migrating with progress, Completed with nothing left;
    /// a failure reported after that changes nothing.
    #[test]
    fn a_source_moves_preparing_migrating_completed_and_its_end_stands() {
        let mut m = Migration::default();
        assert_eq!(state(&m), None);
        assert!(!m.is_outgoing());
        m.begin(MigrationRole::Source, Preparing, "/run/target.sock".into());
        assert!(m.is_outgoing() && !m.is_incoming());
        m.migrating();
        let p = JobProgress {
            data_total: 10,
            data_processed: 4,
            data_remaining: 6,
            downtime_ms: None,
        };
        m.progress(p);
        assert_eq!(m.status().unwrap().progress, p);
        m.completed();
        assert_eq!(state(&m), Some(Completed));
        assert_eq!(m.status().unwrap().progress.data_remaining, 0);
        assert!(m.status().unwrap().took.is_some());
        assert!(!m.is_outgoing());
        let before = m.clone();
        m.end(Failed, "too late".into());
        m.migrating();
        m.progress(JobProgress::default());
        assert_eq!(m, before, "an ended migration does not move");
    }

    /// A target: Preparing, then Migrating, then the guest arrives with the completed job's
    /// statistics; or it never comes (Failed).
    #[test]
    fn a_target_ends_arrived_or_lost() {
        let mut m = Migration::default();
        m.begin(MigrationRole::Target, Preparing, String::new());
        assert!(m.is_incoming() && !m.is_outgoing());
        m.migrating();
        assert_eq!(state(&m), Some(Migrating));
        let stats = JobProgress {
            downtime_ms: Some(12),
            ..JobProgress::default()
        };
        m.arrived(Some(stats));
        assert_eq!(state(&m), Some(Completed));
        assert_eq!(m.status().unwrap().progress, stats);
        assert!(!m.is_incoming());

        let mut lost = Migration::default();
        lost.begin(MigrationRole::Target, Waiting, String::new());
        lost.end(Failed, "the source cancelled it".into());
        assert_eq!(state(&lost), Some(Failed));
        assert_eq!(lost.status().unwrap().message, "the source cancelled it");
        assert!(!lost.is_incoming());
    }

    /// A cancelled migration may be followed by a new one.
    #[test]
    fn a_new_migration_begins_after_an_end() {
        let mut m = Migration::default();
        m.begin(MigrationRole::Source, Preparing, "a".into());
        m.end(Cancelled, "asked".into());
        assert_eq!(state(&m), Some(Cancelled));
        m.begin(MigrationRole::Source, Preparing, "b".into());
        assert_eq!(state(&m), Some(Preparing));
        assert_eq!(m.status().unwrap().peer, "b");
        assert!(m.status().unwrap().message.is_empty());
    }

    #[test]
    fn one_found_over_at_start_is_ended_at_once() {
        let mut m = Migration::default();
        m.ended(
            MigrationRole::Source,
            "t".into(),
            Completed,
            "left meanwhile".into(),
        );
        assert_eq!(state(&m), Some(Completed));
        assert!(!m.is_outgoing());
    }

    #[test]
    fn the_marker_is_written_read_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let marker = Marker::at(dir.path());
        assert_eq!(marker.read(), None);
        marker.write("/run/target.sock").unwrap();
        assert_eq!(
            Marker::at(dir.path()).read().as_deref(),
            Some("/run/target.sock")
        );
        marker.remove();
        marker.remove();
        assert_eq!(marker.read(), None);
    }
}
