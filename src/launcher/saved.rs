//! The last accepted Sync, kept on disk (`RUNTIME_DIR/last-sync.json`) so that a launcher killed
//! and started again on the same runtime dir knows what the owner asked for: the spec with every
//! hot-plugged volume, the block devices and the persisted volumes (review M10). Without it, the
//! adopted launcher would only know the spec file it was started with, and the next Sync (an
//! `addvolume`) would unplug every volume hot-plugged before the restart.
//!
//! It is written ahead: once a Sync is planned and before its first host step. A launcher killed
//! in the middle of that Sync is restarted knowing the request it was applying, and converges to
//! it. Written atomically: a fresh temp file (`O_EXCL`, random name) renamed over the old one, so
//! a launcher killed at any point leaves the old request or the new one, never a mix.
//!
//! Not fsynced, on purpose: the file is read only when a restarted launcher *adopts a running
//! domain*, and QEMU outlives the launcher only if the kernel did, with its page cache, so the
//! renamed file is there. After a machine crash there is no domain to adopt and the file is
//! replaced before anything runs. The two fsyncs cost 2–3 ms of every Sync that changes
//! something (measured on this machine's ext4: 1.3 ms + 0.9 ms, more than the libvirt calls of
//! a one-disk attach); the host records (`host::records`), which must outlive a machine crash,
//! stay durable.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};

use super::sync::{BlockSource, SyncInput};
use crate::durable::{self, Contents};
use crate::host::devnode::DevNumber;

/// Far above any spec a Sync accepts: a bigger file is not ours.
const MAX_FILE: u64 = 16 << 20;
const VERSION: u32 = 1;

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
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedSync {
    version: u32,
    spec: String,
    block_devices: BTreeMap<String, SavedBlock>,
    persist: BTreeSet<String>,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
enum SavedBlock {
    Path(PathBuf),
    Number(DevNumber),
}

/// Saves `input` at `path`, atomically (see the module doc).
pub fn save(path: &Path, input: &SyncInput) -> Result<(), SavedSyncError> {
    let saved = SavedSync {
        version: VERSION,
        spec: input.spec.clone(),
        block_devices: input
            .block_devices
            .iter()
            .map(|(name, source)| {
                let block = match source {
                    BlockSource::Path(p) => SavedBlock::Path(p.clone()),
                    BlockSource::Number(n) => SavedBlock::Number(*n),
                };
                (name.clone(), block)
            })
            .collect(),
        persist: input.persist.clone(),
    };
    // Only strings, maps and numbers: serializing cannot fail.
    let json = serde_json::to_vec(&saved).unwrap_or_default();
    durable::write_atomically(path, &json).map_err(|source| SavedSyncError::Write {
        path: path.into(),
        source,
    })
}

/// The request saved at `path`, or `None` when there is none.
pub fn load(path: &Path) -> Result<Option<SyncInput>, SavedSyncError> {
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
    Ok(Some(SyncInput {
        spec: saved.spec,
        dry_run: false,
        block_devices: saved
            .block_devices
            .into_iter()
            .map(|(name, block)| {
                let source = match block {
                    SavedBlock::Path(p) => BlockSource::Path(p),
                    SavedBlock::Number(n) => BlockSource::Number(n),
                };
                (name, source)
            })
            .collect(),
        persist: saved.persist,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn input() -> SyncInput {
        SyncInput {
            spec: "kind: VirtualMachineInstance\nmetadata: {name: x}\n".into(),
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
        }
    }

    #[test]
    fn round_trips_without_dry_run_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("last-sync.json");
        assert!(load(&path).unwrap().is_none());
        save(&path, &input()).unwrap();
        let back = load(&path).unwrap().unwrap();
        assert_eq!(
            back,
            SyncInput {
                dry_run: false,
                ..input()
            }
        );
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["last-sync.json"]);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }

    #[test]
    fn a_symlink_in_its_place_is_replaced_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, "precious").unwrap();
        let path = dir.path().join("last-sync.json");
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        assert!(matches!(load(&path), Err(SavedSyncError::Read { .. })));
        save(&path, &input()).unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
        assert!(!fs::symlink_metadata(&path).unwrap().is_symlink());
    }

    #[test]
    fn a_damaged_or_foreign_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("last-sync.json");
        fs::write(&path, "{").unwrap();
        let err = load(&path).unwrap_err();
        assert!(matches!(err, SavedSyncError::Parse { .. }), "{err}");
        assert!(err.to_string().contains("last-sync.json"), "{err}");
        fs::write(
            &path,
            r#"{"version":2,"spec":"","block_devices":{},"persist":[]}"#,
        )
        .unwrap();
        assert!(matches!(
            load(&path),
            Err(SavedSyncError::Version { found: 2, .. })
        ));
        fs::write(&path, vec![b' '; MAX_FILE as usize + 1]).unwrap();
        assert!(matches!(load(&path), Err(SavedSyncError::TooBig { .. })));
    }
}
