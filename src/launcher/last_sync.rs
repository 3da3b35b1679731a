//! The last Sync the launcher accepted (or the spec it started from): what `GetSpec` shows,
//! what a migration target gets, and what a launcher restarted after a crash restores. Kept
//! on disk (`saved`) before it is kept here, so that a crash never loses one that made a
//! change. The lock is a leaf.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::saved::{SavedSyncError, SavedSyncs};

use super::types::{BlockSource, SyncInput};
use crate::host::devnode::DevNumber;

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

    /// `input` becomes the last one (never a dry run), with the disk sequences of its devices
    /// given by number (`disk_sequences`): saved first, unless it is the same request again (a
    /// no-op Sync, a retry), which is saved already and is neither copied nor looked up again.
    /// Only a request that is written pays for handing the async worker's other tasks over to
    /// another thread (`host_work`: a thread wake and a switch) for the sysfs reads and the
    /// write.
    pub(super) fn accept(
        &self,
        input: &SyncInput,
        disk_sequences: impl FnOnce(&SyncInput) -> BTreeMap<String, u64>,
    ) -> Result<(), SavedSyncError> {
        if self.input.lock().expect("input lock").same_request(input) {
            return Ok(());
        }
        super::blocking::host_work(|| {
            let input = SyncInput {
                dry_run: false,
                block_identities: disk_sequences(input),
                ..input.clone()
            };
            self.saved.save(&input)?;
            *self.input.lock().expect("input lock") = input;
            Ok(())
        })
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

impl SyncInput {
    /// The same request as `other`, whatever the launcher noted of its devices.
    fn same_request(&self, other: &SyncInput) -> bool {
        (&self.spec, &self.block_devices, &self.persist)
            == (&other.spec, &other.block_devices, &other.persist)
    }

    /// The request without the block devices given by number whose disk is no longer the one
    /// it was accepted with (`now`: a number's disk sequence now), and those volumes' names:
    /// the kernel reuses a number once its disk is gone, and a restored request must not
    /// attach whatever disk has it next.
    pub(crate) fn without_replaced_devices(
        mut self,
        now: impl Fn(DevNumber) -> Option<u64>,
    ) -> (SyncInput, Vec<String>) {
        let mut replaced = Vec::new();
        for (volume, accepted) in std::mem::take(&mut self.block_identities) {
            match self.block_devices.get(&volume) {
                Some(BlockSource::Number(dev)) if now(*dev) != Some(accepted) => {
                    self.block_devices.remove(&volume);
                    replaced.push(volume);
                }
                Some(BlockSource::Number(_)) => {
                    self.block_identities.insert(volume, accepted);
                }
                _ => {}
            }
        }
        (self, replaced)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restored_request_keeps_a_number_only_while_it_is_the_same_disk() {
        let number = |minor| BlockSource::Number(DevNumber { major: 7, minor });
        let input = SyncInput {
            block_devices: BTreeMap::from([
                ("same".to_string(), number(1)),
                ("reused".to_string(), number(2)),
                ("gone".to_string(), number(3)),
                ("unread".to_string(), number(4)),
                (
                    "by-path".to_string(),
                    BlockSource::Path("/dev/loop5".into()),
                ),
            ]),
            block_identities: BTreeMap::from([
                ("same".to_string(), 10),
                ("reused".to_string(), 20),
                ("gone".to_string(), 30),
            ]),
            ..SyncInput::default()
        };
        // Now: loop1 is still disk 10, loop2 is another disk, loop3 is no disk at all.
        let now = |dev: DevNumber| match dev.minor {
            1 => Some(10),
            2 => Some(21),
            4 => Some(40),
            _ => None,
        };
        let (kept, replaced) = input.without_replaced_devices(now);
        assert_eq!(replaced, ["gone", "reused"]);
        assert_eq!(
            kept.block_devices.keys().collect::<Vec<_>>(),
            ["by-path", "same", "unread"]
        );
        assert_eq!(
            kept.block_identities,
            BTreeMap::from([("same".to_string(), 10)])
        );
    }

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
        last.accept(&input("first"), |_| BTreeMap::new()).unwrap();
        assert_eq!(
            (last.get(), SavedSyncs::read(&base)),
            (input("first"), Some(input("first")))
        );
        last.restored(input("restored"));
        assert_eq!(last.get(), input("restored"));
        assert_eq!(SavedSyncs::read(&base), Some(input("first")));
    }

    #[test]
    fn the_same_request_again_is_not_written_again() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("last-sync");
        let slots = || [0, 1].map(|i| std::fs::read(base.with_extension(format!("{i}.json"))).ok());
        let last = LastSync::new(SavedSyncs::open(&base).0, input("start"));
        last.accept(&input("first"), |_| BTreeMap::new()).unwrap();
        let written = slots();
        let mut looked_up = false;
        last.accept(&input("first"), |_| {
            looked_up = true;
            BTreeMap::new()
        })
        .unwrap();
        assert_eq!(slots(), written);
        assert!(!looked_up, "the disk sequences were looked up again");
        last.accept(&input("second"), |_| BTreeMap::new()).unwrap();
        assert_ne!(slots(), written);
        assert_eq!(SavedSyncs::read(&base), Some(input("second")));
    }
}
