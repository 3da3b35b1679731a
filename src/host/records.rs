//! What the launcher made on the host for hot-plugged block volumes (device nodes, cgroup rules),
//! recorded in a small JSON file in the runtime dir. A launcher that restarts reads it to know
//! what is its own: it keeps what the live domain still uses and cleans the rest. Written
//! atomically (a temp file renamed over the old one), so a crash leaves the old or the new record.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};

use super::cgroup::DeviceCgroup;
use super::devnode::DevNumber;

#[derive(Debug, thiserror::Error)]
pub enum RecordsError {
    #[error("cannot read the hotplug records {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the hotplug records {path} are not valid")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot write the hotplug records {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One node the launcher made.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeRecord {
    pub path: PathBuf,
    pub dev: DevNumber,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Records {
    /// Hot-plugged block volumes by name.
    pub nodes: BTreeMap<String, NodeRecord>,
    /// The cgroups whose device rules the launcher keeps, and the block devices it allowed there.
    pub cgroups: Vec<(DeviceCgroup, BTreeSet<DevNumber>)>,
    /// The id of the device program the launcher attached, per cgroup v2 directory.
    pub programs: BTreeMap<PathBuf, u32>,
}

impl Records {
    /// The records at `path`; none yet is an empty record.
    pub fn load(path: &Path) -> Result<Records, RecordsError> {
        let text = match std::fs::read(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Records::default()),
            Err(source) => {
                return Err(RecordsError::Read {
                    path: path.into(),
                    source,
                })
            }
        };
        serde_json::from_slice(&text).map_err(|source| RecordsError::Parse {
            path: path.into(),
            source,
        })
    }

    pub fn save(&self, path: &Path) -> Result<(), RecordsError> {
        let write_err = |source| RecordsError::Write {
            path: path.into(),
            source,
        };
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(write_err)?;
        let json = serde_json::to_vec_pretty(self).expect("records serialize");
        tmp.write_all(&json).map_err(write_err)?;
        tmp.persist(path).map_err(|e| write_err(e.error))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_starts_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("hotplug-records.json");
        assert_eq!(Records::load(&path).unwrap(), Records::default());
        let mut r = Records::default();
        let dev = DevNumber { major: 7, minor: 3 };
        r.nodes.insert(
            "a".into(),
            NodeRecord {
                path: "/hp/a".into(),
                dev,
            },
        );
        r.cgroups
            .push((DeviceCgroup::V1("/cg/x".into()), [dev].into()));
        r.programs.insert("/cg2/x".into(), 42);
        r.save(&path).unwrap();
        assert_eq!(Records::load(&path).unwrap(), r);
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temp file left"
        );
        std::fs::write(&path, "{").unwrap();
        assert!(matches!(
            Records::load(&path),
            Err(RecordsError::Parse { .. })
        ));
    }
}
