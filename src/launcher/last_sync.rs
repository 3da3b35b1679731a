//! The last Sync the launcher accepted (or the spec it started from): what `GetSpec` shows,
//! what a migration target gets, and what a launcher restarted after a crash restores. Kept
//! on disk (`saved`) before it is kept here, so that a crash never loses one that made a
//! change. The lock is a leaf.

use std::sync::Mutex;

use super::saved::{SavedSyncError, SavedSyncs};
use super::SyncInput;

#[derive(Debug)]
pub(super) struct LastSync {
    saved: SavedSyncs,
    input: Mutex<SyncInput>,
}

impl LastSync {
    pub(super) fn new(saved: SavedSyncs, input: SyncInput) -> LastSync {
        LastSync {
            saved,
            input: Mutex::new(input),
        }
    }

    pub(super) fn get(&self) -> SyncInput {
        self.input.lock().expect("input lock").clone()
    }

    /// `input` becomes the last one: saved first, unless it is the same again (a no-op Sync,
    /// a retry), which is saved already.
    pub(super) fn accept(&self, input: SyncInput) -> Result<(), SavedSyncError> {
        if *self.input.lock().expect("input lock") == input {
            return Ok(());
        }
        self.saved.save(&input)?;
        *self.input.lock().expect("input lock") = input;
        Ok(())
    }

    /// Saves the one kept now (a new domain's start spec replaces a Sync saved for an earlier
    /// one, before anything runs).
    pub(super) fn save_current(&self) -> Result<(), SavedSyncError> {
        self.saved.save(&self.get())
    }

    /// `input`, restored from disk, becomes the last one (it is saved already).
    pub(super) fn restored(&self, input: SyncInput) {
        *self.input.lock().expect("input lock") = input;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(spec: &str) -> SyncInput {
        SyncInput {
            spec: spec.into(),
            ..SyncInput::default()
        }
    }

    #[test]
    fn what_is_accepted_is_on_disk_before_it_is_shown() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("last-sync");
        let (saved, restorable) = SavedSyncs::open(&base);
        assert!(matches!(restorable, Ok(None)));
        let last = LastSync::new(saved, input("start"));
        last.save_current().unwrap();
        assert_eq!(SavedSyncs::read(&base), Some(input("start")));
        last.accept(input("first")).unwrap();
        assert_eq!(
            (last.get(), SavedSyncs::read(&base)),
            (input("first"), Some(input("first")))
        );
        last.restored(input("restored"));
        assert_eq!(last.get(), input("restored"));
        assert_eq!(SavedSyncs::read(&base), Some(input("first")));
    }
}
