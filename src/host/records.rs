//! What the launcher made on the host for hot-plugged block volumes (device nodes, cgroup rules),
//! recorded in a small JSON file in the runtime dir. A launcher that restarts reads it to know
//! what is its own: it keeps what the live domain still uses and cleans the rest. Written
//! atomically and durably (a synced temp file renamed over the old one, then the dir synced), so a
//! crash or a power cut leaves the old or the new record. Whoever could write the runtime dir could
//! write this file too, so what it says is vetted before it is obeyed ([`Records::vetted`]): a node
//! only inside the hotplug dir, a cgroup only one the caller vouches for.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::cgroup::DeviceCgroup;
use super::devnode::DevNumber;
use crate::durable::{self, Contents};

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
    #[error("the hotplug records {path} are over {MAX_RECORDS_BYTES} bytes")]
    TooLarge { path: PathBuf },
    #[error("cannot write the hotplug records {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One node the launcher made.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct NodeRecord {
    pub path: PathBuf,
    pub dev: DevNumber,
}

/// A record per hot-plugged block volume, a few per cgroup: far below this for 256 volumes.
pub(crate) const MAX_RECORDS_BYTES: u64 = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Records {
    /// Hot-plugged block volumes by name.
    pub nodes: BTreeMap<String, NodeRecord>,
    /// The cgroups whose device rules the launcher keeps, and the block devices it allowed there.
    pub cgroups: Vec<(DeviceCgroup, BTreeSet<DevNumber>)>,
    /// The id of the device program the launcher attached, per cgroup v2 directory.
    pub programs: BTreeMap<PathBuf, u32>,
}

impl Records {
    /// The records at `path`; none yet is an empty record.
    pub(crate) fn load(path: &Path) -> Result<Records, RecordsError> {
        let read_err = |source| RecordsError::Read {
            path: path.into(),
            source,
        };
        let text = match durable::read_bounded(path, MAX_RECORDS_BYTES).map_err(read_err)? {
            Contents::Missing => return Ok(Records::default()),
            Contents::TooLarge => return Err(RecordsError::TooLarge { path: path.into() }),
            Contents::Read(text) => text,
        };
        Records::parse(&text).map_err(|source| RecordsError::Parse {
            path: path.into(),
            source,
        })
    }

    /// The records in `text`, unvetted.
    pub(crate) fn parse(text: &[u8]) -> Result<Records, serde_json::Error> {
        serde_json::from_slice(text)
    }

    /// What of these records a launcher may act on: a node only if it is `hotplug_dir/<volume>`
    /// for a plain volume name (no `/`, `.` or `..`: the records must never make the launcher
    /// unlink `/dev/sda`), a cgroup only if `owned` vouches for it (under a detected cgroup root,
    /// not the root, QEMU's), a program only for a kept cgroup v2. The rest is returned apart, for
    /// the log.
    pub(crate) fn vetted(
        self,
        hotplug_dir: &Path,
        owned: impl Fn(&DeviceCgroup) -> bool,
    ) -> (Records, Vec<String>) {
        let mut dropped = Vec::new();
        let mut kept = Records::default();
        for (volume, node) in self.nodes {
            let plain = !volume.is_empty()
                && volume != "."
                && volume != ".."
                && !volume.contains('/')
                && !volume.contains('\0');
            if plain && node.path == hotplug_dir.join(&volume) {
                kept.nodes.insert(volume, node);
            } else {
                dropped.push(format!(
                    "node {} for volume {volume:?}: not in {}",
                    node.path.display(),
                    hotplug_dir.display()
                ));
            }
        }
        for (cgroup, devices) in self.cgroups {
            if owned(&cgroup) {
                kept.cgroups.push((cgroup, devices));
            } else {
                dropped.push(format!("cgroup {}: not QEMU's", cgroup.path().display()));
            }
        }
        for (dir, program) in self.programs {
            let ours = kept
                .cgroups
                .iter()
                .any(|(c, _)| matches!(c, DeviceCgroup::V2(p) if *p == dir));
            if ours {
                kept.programs.insert(dir, program);
            } else {
                dropped.push(format!(
                    "device program {program} on {}: not a kept cgroup",
                    dir.display()
                ));
            }
        }
        (kept, dropped)
    }

    pub(crate) fn save(&self, path: &Path) -> Result<(), RecordsError> {
        let write_err = |source| RecordsError::Write {
            path: path.into(),
            source,
        };
        let json = serde_json::to_vec_pretty(self).map_err(|e| write_err(e.into()))?;
        durable::write_durably(path, &json).map_err(write_err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_starts_empty() {
        let (dir, path) = crate::testing::temp_path("hotplug-records.json");
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
        std::fs::write(&path, vec![b' '; MAX_RECORDS_BYTES as usize + 1]).unwrap();
        assert!(matches!(
            Records::load(&path),
            Err(RecordsError::TooLarge { .. })
        ));
    }

    #[test]
    fn vetting_keeps_only_nodes_in_the_hotplug_dir_and_vouched_cgroups() {
        let text = br#"{
            "nodes": {
                "a": {"path": "/hp/a", "dev": {"major": 7, "minor": 1}},
                "sda": {"path": "/dev/sda", "dev": {"major": 8, "minor": 0}},
                "..": {"path": "/hp/..", "dev": {"major": 8, "minor": 0}},
                "b": {"path": "/hp/c", "dev": {"major": 7, "minor": 2}}
            },
            "cgroups": [
                [{"V1": "/sys/fs/cgroup/devices/machine/qemu-1"}, [{"major": 7, "minor": 1}]],
                [{"V2": "/sys/fs/cgroup/unified"}, []],
                [{"V2": "/sys/fs/cgroup/unified/qemu"}, []]
            ],
            "programs": {"/sys/fs/cgroup/unified": 9, "/sys/fs/cgroup/unified/qemu": 10}
        }"#;
        let records = Records::parse(text).unwrap();
        let roots = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup/devices"];
        let (kept, dropped) = records.vetted(Path::new("/hp"), |c| {
            !roots.iter().any(|r| c.path() == Path::new(r))
        });
        assert_eq!(kept.nodes.keys().collect::<Vec<_>>(), ["a"]);
        assert_eq!(
            kept.cgroups
                .iter()
                .map(|(c, _)| c.path().to_str().unwrap())
                .collect::<Vec<_>>(),
            [
                "/sys/fs/cgroup/devices/machine/qemu-1",
                "/sys/fs/cgroup/unified/qemu"
            ]
        );
        assert_eq!(
            kept.programs,
            [(PathBuf::from("/sys/fs/cgroup/unified/qemu"), 10)].into()
        );
        assert_eq!(dropped.len(), 5, "{dropped:#?}");
    }

    /// A path that is not UTF-8 cannot be written as JSON; that was an
    /// `expect` under the block-devices lock (a panic poisoning it). It is an error now.
    #[test]
    fn a_path_that_is_not_utf8_is_an_error_not_a_panic() {
        use std::os::unix::ffi::OsStrExt;
        let (_dir, path) = crate::testing::temp_path("hotplug-records.json");
        let mut r = Records::default();
        r.nodes.insert(
            "a".into(),
            NodeRecord {
                path: std::ffi::OsStr::from_bytes(b"/hp/\xff/a").into(),
                dev: DevNumber { major: 7, minor: 1 },
            },
        );
        assert!(matches!(r.save(&path), Err(RecordsError::Write { .. })));
        assert!(!path.exists());
    }

    #[test]
    fn unknown_fields_are_not_records() {
        assert!(
            Records::parse(br#"{"nodes": {}, "cgroups": [], "programs": {}, "x": 1}"#).is_err()
        );
    }
}
