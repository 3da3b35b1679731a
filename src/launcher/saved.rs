//! The last accepted Sync, kept on disk (`RUNTIME_DIR/last-sync.{0,1}.json`) so that a launcher
//! killed and started again on the same runtime dir knows what the owner asked for: the spec with
//! every hot-plugged volume, the block devices and the persisted volumes. Without
//! it, the adopted launcher would only know the spec file it was started with, and the next Sync
//! (an `addvolume`) would unplug every volume hot-plugged before the restart.
//!
//! It is written ahead: once a Sync is planned and before its first host step. A launcher killed
//! in the middle of that Sync is restarted knowing the request it was applying, and converges to
//! it. Written in two slots in turn, each overwritten in place and framed by its generation
//! (first and last field): a launcher killed part-way through a write leaves that slot torn,
//! which the frame shows, and the other slot whole with the request before. Reading takes the
//! whole slot of the newest generation. (A temp file renamed over the old one gave the same
//! guarantee for 0.35–0.5 ms of every Sync that changes something, see
//! `durable::overwrite_in_place`; the two slots cost a few microseconds.)
//!
//! Not fsynced, on purpose: the file is read only when a restarted launcher *adopts a running
//! domain*, and QEMU outlives the launcher only if the kernel did, with its page cache. After a
//! machine crash there is no domain to adopt and a new request is written before anything runs.
//! The fsyncs would cost 2–3 ms of every Sync that changes something (measured on this machine's
//! ext4: 1.3 ms + 0.9 ms, more than the libvirt calls of a one-disk attach); the host records
//! (`host::records`), which must outlive a machine crash, stay durable.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::types::{BlockSource, SyncInput};
use crate::durable::{self, Contents};

/// Far above any spec a Sync accepts: a bigger file is not ours.
const MAX_FILE: u64 = 16 << 20;
const VERSION: u32 = 2;

#[derive(Debug, thiserror::Error)]
pub enum SavedSyncError {
    #[error("cannot read the last Sync from {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the last Sync in {path} is not valid")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("the last Sync in {path} has version {found}, this launcher reads {VERSION}")]
    Version { path: PathBuf, found: u32 },
    #[error("the last Sync in {path} is torn or misplaced (generation {first} at its start, {last} at its end)")]
    Torn {
        path: PathBuf,
        first: u64,
        last: u64,
    },
    #[error("the last Sync in {path} is over {MAX_FILE} bytes")]
    TooBig { path: PathBuf },
    #[error("cannot save the last Sync to {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The file's form of a [`SyncInput`] (never `dry_run`: a dry run is not a request to keep).
/// Fields are written in this order: the generation first and last frames the rest.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedSync {
    generation: u64,
    version: u32,
    spec: String,
    block_devices: BTreeMap<String, BlockSource>,
    persist: BTreeSet<String>,
    /// Absent from files written before it: no number is checked then.
    #[serde(default)]
    block_identities: BTreeMap<String, u64>,
    generation_end: u64,
}

/// The two slots of the last Sync, and the generation written last. Writes happen under the
/// launcher's task slot; the lock (a leaf) only makes the generation and its slot one step.
#[derive(Debug)]
pub(crate) struct SavedSyncs {
    slots: [PathBuf; 2],
    generation: Mutex<u64>,
}

impl SavedSyncs {
    /// Reads both slots beside `base` (`last-sync` has `last-sync.0.json` and
    /// `last-sync.1.json`): the request of the newest whole one (`None` when neither slot
    /// exists, an error when none is whole), and the writer, which goes on after the newest
    /// generation found, into the other slot.
    /// The last accepted Sync kept at `base`, if one can be read.
    pub(crate) fn read(base: &Path) -> Option<SyncInput> {
        Self::open(base).1.ok().flatten()
    }

    pub(crate) fn open(base: &Path) -> (SavedSyncs, Result<Option<SyncInput>, SavedSyncError>) {
        let slots = [0, 1].map(|i| base.with_extension(format!("{i}.json")));
        let read = [read_slot(&slots[0], 0), read_slot(&slots[1], 1)];
        let newest = read
            .iter()
            .filter_map(|r| r.as_ref().ok().and_then(Option::as_ref))
            .max_by_key(|saved| saved.generation);
        let generation = newest.map_or(0, |saved| saved.generation);
        let found = match newest {
            Some(saved) => {
                if let Some(Err(e)) = read.iter().find(|r| r.is_err()) {
                    tracing::warn!(error = %crate::error_chain(e), "one slot of the last Sync is damaged; the other stands");
                }
                Ok(Some(input_of(saved)))
            }
            None => match read.into_iter().find(Result::is_err) {
                Some(Err(e)) => Err(e),
                _ => Ok(None),
            },
        };
        let saved = SavedSyncs {
            slots,
            generation: Mutex::new(generation),
        };
        (saved, found)
    }

    /// Saves `input` as the newest generation, in the slot that holds the older one.
    pub(crate) fn save(&self, input: &SyncInput) -> Result<(), SavedSyncError> {
        let mut last = self.generation.lock().expect("saved generation lock");
        let generation = *last + 1;
        let saved = SavedSync {
            generation,
            version: VERSION,
            spec: input.spec.clone(),
            block_devices: input.block_devices.clone(),
            persist: input.persist.clone(),
            block_identities: input.block_identities.clone(),
            generation_end: generation,
        };
        // Only strings, maps and numbers: serializing cannot fail.
        let json = serde_json::to_vec(&saved).unwrap_or_default();
        let path = &self.slots[slot_of(generation)];
        durable::overwrite_in_place(path, &json).map_err(|source| SavedSyncError::Write {
            path: path.clone(),
            source,
        })?;
        // Only a whole write moves on: after a failed one the next write goes to the same
        // slot, never over the newest whole request.
        *last = generation;
        Ok(())
    }
}

fn slot_of(generation: u64) -> usize {
    (generation % 2) as usize
}

/// Slot `index`, if there is one: whole, of this version, and of a generation that belongs in
/// this slot.
fn read_slot(path: &Path, index: usize) -> Result<Option<SavedSync>, SavedSyncError> {
    let read_err = |source| SavedSyncError::Read {
        path: path.into(),
        source,
    };
    let bytes = match durable::read_bounded(path, MAX_FILE).map_err(read_err)? {
        Contents::Missing => return Ok(None),
        Contents::TooLarge => return Err(SavedSyncError::TooBig { path: path.into() }),
        Contents::Read(bytes) => bytes,
    };
    let saved: SavedSync =
        serde_json::from_slice(&bytes).map_err(|source| SavedSyncError::Parse {
            path: path.into(),
            source,
        })?;
    if saved.version != VERSION {
        return Err(SavedSyncError::Version {
            path: path.into(),
            found: saved.version,
        });
    }
    if saved.generation != saved.generation_end || slot_of(saved.generation) != index {
        return Err(SavedSyncError::Torn {
            path: path.into(),
            first: saved.generation,
            last: saved.generation_end,
        });
    }
    Ok(Some(saved))
}

fn input_of(saved: &SavedSync) -> SyncInput {
    SyncInput {
        spec: saved.spec.clone(),
        dry_run: false,
        block_devices: saved.block_devices.clone(),
        persist: saved.persist.clone(),
        block_identities: saved.block_identities.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::devnode::DevNumber;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    fn input(spec: &str) -> SyncInput {
        SyncInput {
            spec: spec.into(),
            dry_run: true,
            block_devices: [
                (
                    "blk".to_string(),
                    BlockSource::Number(DevNumber { major: 7, minor: 3 }),
                ),
                ("byp".to_string(), BlockSource::Path("/dev/loop9".into())),
            ]
            .into(),
            persist: ["blk".to_string()].into(),
            block_identities: [("blk".to_string(), 926)].into(),
        }
    }

    fn kept(spec: &str) -> SyncInput {
        SyncInput {
            dry_run: false,
            ..input(spec)
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn the_newest_request_comes_back_from_two_private_slots() {
        let (dir, base) = crate::testing::temp_path("last-sync");
        let (saved, found) = SavedSyncs::open(&base);
        assert!(found.unwrap().is_none());
        saved.save(&input("first")).unwrap();
        assert_eq!(SavedSyncs::open(&base).1.unwrap(), Some(kept("first")));
        saved.save(&input("second")).unwrap();
        saved.save(&input("third")).unwrap();
        assert_eq!(SavedSyncs::open(&base).1.unwrap(), Some(kept("third")));
        assert_eq!(names(dir.path()), ["last-sync.0.json", "last-sync.1.json"]);
        for name in names(dir.path()) {
            let mode = fs::metadata(dir.path().join(name))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn a_torn_newest_slot_leaves_the_request_before_it() {
        let (dir, base) = crate::testing::temp_path("last-sync");
        let (saved, _) = SavedSyncs::open(&base);
        saved.save(&input("older")).unwrap(); // generation 1, slot 1
        saved.save(&input("newer")).unwrap(); // generation 2, slot 0
        let newest = dir.path().join("last-sync.0.json");
        let whole = fs::read(&newest).unwrap();
        // Killed part-way: the slot holds the start of a write and no end.
        fs::write(&newest, &whole[..whole.len() / 2]).unwrap();
        let (saved, found) = SavedSyncs::open(&base);
        assert_eq!(found.unwrap(), Some(kept("older")));
        // A whole text whose frame does not match (a new start over an old end) is torn too.
        let framed = String::from_utf8(whole)
            .unwrap()
            .replace("\"generation_end\":2", "\"generation_end\":0");
        fs::write(&newest, framed).unwrap();
        let (_, found) = SavedSyncs::open(&base);
        assert_eq!(found.unwrap(), Some(kept("older")));
        // The next write goes over the torn slot, not over the whole one.
        saved.save(&input("next")).unwrap();
        assert_eq!(SavedSyncs::open(&base).1.unwrap(), Some(kept("next")));
        let older = fs::read_to_string(dir.path().join("last-sync.1.json")).unwrap();
        assert!(older.contains("\"older\""), "{older}");
    }

    #[test]
    fn a_new_start_over_old_slots_writes_the_newest() {
        let (_dir, base) = crate::testing::temp_path("last-sync");
        let (saved, _) = SavedSyncs::open(&base);
        for spec in ["a", "b", "c", "d", "e"] {
            saved.save(&input(spec)).unwrap();
        }
        // Another launcher on the same runtime dir, after the first one's domain is gone.
        let (again, found) = SavedSyncs::open(&base);
        assert_eq!(found.unwrap(), Some(kept("e")));
        again.save(&input("fresh")).unwrap();
        assert_eq!(SavedSyncs::open(&base).1.unwrap(), Some(kept("fresh")));
    }

    #[test]
    fn a_symlink_in_a_slot_is_replaced_not_followed() {
        let (dir, victim) = crate::testing::temp_path("victim");
        fs::write(&victim, "precious").unwrap();
        let base = dir.path().join("last-sync");
        for i in 0..2 {
            std::os::unix::fs::symlink(&victim, dir.path().join(format!("last-sync.{i}.json")))
                .unwrap();
        }
        let (saved, found) = SavedSyncs::open(&base);
        assert!(matches!(found, Err(SavedSyncError::Read { .. })));
        saved.save(&input("x")).unwrap();
        saved.save(&input("y")).unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(SavedSyncs::open(&base).1.unwrap(), Some(kept("y")));
    }

    #[test]
    fn damaged_or_foreign_slots_are_an_error_naming_the_file() {
        let (dir, base) = crate::testing::temp_path("last-sync");
        let found_with = |bytes: &[u8]| {
            fs::write(dir.path().join("last-sync.1.json"), bytes).unwrap();
            SavedSyncs::open(&base).1
        };
        let err = found_with(b"{").unwrap_err();
        assert!(matches!(err, SavedSyncError::Parse { .. }), "{err}");
        assert!(err.to_string().contains("last-sync.1.json"), "{err}");
        let whole = |generation: u64, version: u32| {
            format!(
                r#"{{"generation":{generation},"version":{version},"spec":"","block_devices":{{}},"persist":[],"generation_end":{generation}}}"#
            )
        };
        assert!(matches!(
            found_with(whole(1, 1).as_bytes()),
            Err(SavedSyncError::Version { found: 1, .. })
        ));
        // Whole, but of a generation that belongs in the other slot: not ours to trust.
        assert!(matches!(
            found_with(whole(2, 2).as_bytes()),
            Err(SavedSyncError::Torn {
                first: 2,
                last: 2,
                ..
            })
        ));
        assert!(matches!(
            found_with(&vec![b' '; MAX_FILE as usize + 1]),
            Err(SavedSyncError::TooBig { .. })
        ));
    }

    #[test]
    fn a_request_saved_before_disk_sequences_were_kept_reads_without_them() {
        let (_dir, base) = crate::testing::temp_path("last-sync");
        let old = r#"{"generation":1,"version":2,"spec":"s","block_devices":{},"persist":[],"generation_end":1}"#;
        fs::write(base.with_extension("1.json"), old).unwrap();
        let (_, found) = SavedSyncs::open(&base);
        let found = found.unwrap().unwrap();
        assert_eq!(
            (found.spec.as_str(), found.block_identities.len()),
            ("s", 0)
        );
    }
}
