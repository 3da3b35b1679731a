//! The host side of hot-plugged block volumes, owned by one [`BlockDevices`]: the node in the
//! hotplug dir, the device rule in every cgroup QEMU is in (v1 `devices.allow`/`deny`, a v2 eBPF
//! program), and the records a restarted launcher reads to know what is its own.
//!
//! Every root comes in through [`BlockRoots`] (hotplug dir, cgroup mounts, `/proc`, QEMU's pid
//! file, the records file), so the unit tests below run this same code on a temp dir. It knows
//! nothing of libvirt: the launcher decides *when* (after planning, around the attach), this
//! module does the host steps and their undo.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::caps::Unavailable;
use super::cgroup::{self, CgroupRoots, DeviceCgroup};
use super::devnode::{self, DevNumber, NodeGuard, NodeOwner};
use super::records::{self, NodeRecord, Records};

/// A host step of a block-device hotplug that failed.
#[derive(Debug, thiserror::Error)]
pub enum BlockHostError {
    #[error("cannot read QEMU's pid from {path}")]
    QemuPid {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot read QEMU's cgroups from {path}")]
    QemuCgroups {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Node(#[from] devnode::DevNodeError),
    #[error(transparent)]
    Cgroup(#[from] cgroup::CgroupError),
    #[error(transparent)]
    Records(#[from] records::RecordsError),
    #[error("block volumes are unavailable here: {}", .missing.iter().map(|m| format!("{}: {}", m.feature, m.why)).collect::<Vec<_>>().join("; "))]
    Unavailable { missing: Vec<Unavailable> },
}

impl BlockHostError {
    /// A CamelCase reason for volume status.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            BlockHostError::Node(_) => "NodeFailed",
            BlockHostError::QemuPid { .. }
            | BlockHostError::QemuCgroups { .. }
            | BlockHostError::Cgroup(_) => "CgroupFailed",
            BlockHostError::Records(_) => "RecordsFailed",
            BlockHostError::Unavailable { .. } => "CapabilityMissing",
        }
    }
}

/// The device cgroups of the QEMU whose pid is in `pid_file`.
pub(crate) fn qemu_device_cgroups(
    pid_file: &Path,
    proc_root: &Path,
    roots: &CgroupRoots,
) -> Result<Vec<DeviceCgroup>, BlockHostError> {
    let pid = fs::read_to_string(pid_file)
        .and_then(|t| {
            t.trim()
                .parse::<u32>()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
        })
        .map_err(|source| BlockHostError::QemuPid {
            path: pid_file.into(),
            source,
        })?;
    let path = proc_root.join(pid.to_string()).join("cgroup");
    let text =
        fs::read_to_string(&path).map_err(|source| BlockHostError::QemuCgroups { path, source })?;
    Ok(roots.device_cgroups_of(&text)?)
}

/// Where the host steps happen.
#[derive(Debug, Clone)]
pub(crate) struct BlockRoots {
    /// Where the nodes are made (`<hotplug_dir>/<volume>`).
    pub hotplug_dir: PathBuf,
    /// Owner of the nodes: the user and group QEMU runs as.
    pub node_owner: NodeOwner,
    pub cgroup_roots: CgroupRoots,
    /// `/proc`, to read QEMU's cgroups.
    pub proc_root: PathBuf,
    /// Where libvirt writes QEMU's pid (`<qemu_pid_dir>/<domain>.pid`).
    pub qemu_pid_file: PathBuf,
    /// The state file of what the launcher made (`host::records`).
    pub records: PathBuf,
    /// What this process lacks for block hotplug (`host::caps::missing_capabilities`): while
    /// anything is, a block volume is refused before anything is made.
    pub missing: Vec<Unavailable>,
}

/// What the launcher made on the host for block volumes (saved as `host::records`).
#[derive(Debug, Default)]
struct HostState {
    /// Hot-plugged block volumes with a node of ours.
    nodes: BTreeMap<String, NodeRecord>,
    /// Block devices of the boot disks.
    boot: BTreeSet<DevNumber>,
    /// What each cgroup allows now.
    applied: BTreeMap<DeviceCgroup, BTreeSet<DevNumber>>,
    /// The device program attached per cgroup v2 directory.
    programs: BTreeMap<PathBuf, u32>,
    /// Which plug made each node of `nodes` (not saved: a restarted launcher starts afresh).
    generations: BTreeMap<String, u64>,
    last_generation: u64,
}

impl HostState {
    /// Records the node of `volume`, stamped with a new plug generation.
    fn plug(&mut self, volume: &str, record: NodeRecord) {
        self.last_generation += 1;
        self.generations.insert(volume.into(), self.last_generation);
        self.nodes.insert(volume.into(), record);
    }

    /// Forgets the node of `volume` and its generation together.
    fn unplug(&mut self, volume: &str) -> Option<NodeRecord> {
        self.generations.remove(volume);
        self.nodes.remove(volume)
    }

    /// The complete allow-list: boot disks and every hot-plugged one.
    fn wanted(&self) -> BTreeSet<DevNumber> {
        let mut all = self.boot.clone();
        all.extend(self.nodes.values().map(|n| n.dev));
        all
    }

    fn records(&self) -> Records {
        Records {
            nodes: self.nodes.clone(),
            cgroups: self
                .applied
                .iter()
                .map(|(c, d)| (c.clone(), d.clone()))
                .collect(),
            programs: self.programs.clone(),
        }
    }
}

/// The owner of the host side of block volumes. Its one lock is taken last: nothing else is
/// locked while a method runs, and no method calls out while holding it.
#[derive(Debug)]
pub(crate) struct BlockDevices {
    roots: BlockRoots,
    state: Mutex<HostState>,
}

/// The node and the rule of a volume being attached: both undone when dropped (the rule first,
/// then the node), both kept by [`Plugged::keep`] once the attach worked.
#[derive(Debug)]
#[must_use = "dropping it revokes the rule and removes the node"]
pub(crate) struct Plugged<'a> {
    // Field order is drop order: revoke the rule before the node goes.
    rule: RuleGuard<'a>,
    node: NodeGuard,
}

impl Plugged<'_> {
    pub(crate) fn keep(self) {
        let Plugged { rule, node } = self;
        rule.keep();
        node.keep();
    }
}

/// Undoes the cgroup rule of a volume whose attach failed (re-applies the list without it).
#[derive(Debug)]
struct RuleGuard<'a> {
    devices: &'a BlockDevices,
    volume: String,
    armed: bool,
}

impl RuleGuard<'_> {
    fn keep(mut self) {
        self.armed = false;
    }
}

impl Drop for RuleGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            if let Err(e) = self.devices.forget(&self.volume) {
                tracing::warn!(volume = %self.volume, error = %crate::error_chain(&e), "undo: cannot revoke the device rule");
            }
        }
    }
}

impl BlockDevices {
    pub(crate) fn new(roots: BlockRoots) -> BlockDevices {
        BlockDevices {
            roots,
            state: Mutex::new(HostState::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HostState> {
        self.state.lock().expect("block devices lock")
    }

    /// The devices of the boot disks: always allowed, whatever is hot-plugged.
    pub(crate) fn set_boot(&self, boot: BTreeSet<DevNumber>) {
        self.lock().boot = boot;
    }

    /// The hot-plugged volumes with a node of ours, and their devices.
    pub(crate) fn nodes(&self) -> BTreeMap<String, DevNumber> {
        self.lock()
            .nodes
            .iter()
            .map(|(name, node)| (name.clone(), node.dev))
            .collect()
    }

    /// Makes the node of `volume` for `dev`, then allows `dev` in every cgroup QEMU is in. A
    /// failure undoes what was done; so does dropping the result.
    pub(crate) fn plug(&self, volume: &str, dev: DevNumber) -> Result<Plugged<'_>, BlockHostError> {
        if !self.roots.missing.is_empty() {
            return Err(BlockHostError::Unavailable {
                missing: self.roots.missing.clone(),
            });
        }
        let node = devnode::make_node(&self.roots.hotplug_dir, volume, dev, self.roots.node_owner)?;
        let record = NodeRecord {
            path: node.path(),
            dev,
        };
        let rule = self.allow(volume, record)?;
        Ok(Plugged { rule, node })
    }

    fn allow(&self, volume: &str, record: NodeRecord) -> Result<RuleGuard<'_>, BlockHostError> {
        let mut host = self.lock();
        host.plug(volume, record);
        if let Err(e) = self.apply_device_rules(&mut host) {
            host.unplug(volume);
            if let Err(undo) = self.apply_device_rules(&mut host) {
                tracing::warn!(error = %crate::error_chain(&undo), "undo: cannot restore the device rules");
            }
            return Err(e);
        }
        Ok(RuleGuard {
            devices: self,
            volume: volume.into(),
            armed: true,
        })
    }

    /// A migration target's node for `volume`, made before its QEMU exists: recorded, its rule
    /// applied once QEMU runs ([`BlockDevices::apply_rules`]).
    pub(crate) fn plug_before_qemu(
        &self,
        volume: &str,
        dev: DevNumber,
    ) -> Result<(), BlockHostError> {
        if !self.roots.missing.is_empty() {
            return Err(BlockHostError::Unavailable {
                missing: self.roots.missing.clone(),
            });
        }
        let node = devnode::make_node(&self.roots.hotplug_dir, volume, dev, self.roots.node_owner)?;
        let mut host = self.lock();
        host.plug(
            volume,
            NodeRecord {
                path: node.path(),
                dev,
            },
        );
        if let Err(e) = host.records().save(&self.roots.records) {
            host.unplug(volume);
            return Err(e.into());
        }
        node.keep();
        Ok(())
    }

    /// Applies the allow-list to the cgroups QEMU is in now (a QEMU that came by migration).
    pub(crate) fn apply_rules(&self) -> Result<(), BlockHostError> {
        self.apply_device_rules(&mut self.lock())
    }

    /// Takes `volume` out of the allow-list (its device stays allowed while another volume or a
    /// boot disk uses it).
    pub(crate) fn forget(&self, volume: &str) -> Result<(), BlockHostError> {
        let mut host = self.lock();
        if host.unplug(volume).is_none() {
            return Ok(());
        }
        self.apply_device_rules(&mut host)
    }

    /// When the domain is gone for good (the launcher exits): every node unlinked, every rule
    /// revoked, the records emptied — nothing is left for a next launcher to find.
    pub(crate) fn release_all(&self) {
        let volumes: Vec<String> = self.lock().nodes.keys().cloned().collect();
        for volume in volumes {
            if let Err(e) = self.release(&volume) {
                tracing::warn!(%volume, error = %crate::error_chain(&e), "cannot release a block volume");
            }
        }
    }

    /// After a detach: unlinks the node and revokes the rule of a block volume.
    pub(crate) fn release(&self, volume: &str) -> Result<(), BlockHostError> {
        self.release_locked(&mut self.lock(), volume).map(drop)
    }

    /// Unlinks the node of `volume` (if it has one), forgets it and applies the rules without
    /// it; true if there was a node.
    fn release_locked(&self, host: &mut HostState, volume: &str) -> Result<bool, BlockHostError> {
        let Some(node) = host.nodes.get(volume).cloned() else {
            return Ok(false);
        };
        devnode::remove_node(&self.roots.hotplug_dir, volume, node.dev)?;
        host.unplug(volume);
        self.apply_device_rules(host)?;
        Ok(true)
    }

    /// Which plug made the node `volume` has now, if it has one: what a detach started now
    /// must release, and nothing plugged after it (see [`BlockDevices::release_plug`]).
    pub(crate) fn generation(&self, volume: &str) -> Option<u64> {
        self.lock().generations.get(volume).copied()
    }

    /// [`BlockDevices::release`], only if the node of `volume` is still the one plug
    /// `generation` made: a late device-removed event of an old disk must not take the node and
    /// rule of the same name plugged again since. False if it was not.
    pub(crate) fn release_plug(
        &self,
        volume: &str,
        generation: u64,
    ) -> Result<bool, BlockHostError> {
        let mut host = self.lock();
        if host.generations.get(volume) != Some(&generation) {
            return Ok(false);
        }
        self.release_locked(&mut host, volume)
    }

    /// Makes every cgroup QEMU is in (and every one written to before) allow exactly the
    /// complete list, then saves the records.
    fn apply_device_rules(&self, host: &mut HostState) -> Result<(), BlockHostError> {
        let wanted = host.wanted();
        let mut cgroups: BTreeSet<DeviceCgroup> = host.applied.keys().cloned().collect();
        match qemu_device_cgroups(
            &self.roots.qemu_pid_file,
            &self.roots.proc_root,
            &self.roots.cgroup_roots,
        ) {
            Ok(found) => cgroups.extend(found),
            // No QEMU (stopped): only the cgroups already written to are updated.
            Err(e) if cgroups.is_empty() && !wanted.is_empty() => return Err(e),
            Err(e) => tracing::debug!(error = %crate::error_chain(&e), "QEMU's cgroups unknown"),
        }
        for cgroup in cgroups {
            let previous = host.applied.get(&cgroup).cloned().unwrap_or_default();
            let attached = host.programs.contains_key(cgroup.path());
            if previous == wanted && (matches!(cgroup, DeviceCgroup::V1(_)) || attached) {
                continue;
            }
            if let Some(id) = cgroup.apply(&previous, &wanted)? {
                host.programs.insert(cgroup.path().into(), id);
            }
            host.applied.insert(cgroup, wanted.clone());
        }
        host.records().save(&self.roots.records)?;
        Ok(())
    }

    /// At start: takes over what a previous launcher of this runtime dir made. Its records are
    /// vetted first (a node only in the hotplug dir, a cgroup only one QEMU is in now);
    /// missing or unreadable records are rebuilt from the nodes in the hotplug dir of the volumes
    /// in `live` (what the domain still uses), so their devices stay allowed (KubeVirt #10689).
    /// Nodes of volumes the domain no longer uses are removed.
    pub(crate) fn adopt(&self, live: &BTreeSet<String>) {
        let records = match Records::load(&self.roots.records) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %crate::error_chain(&e), "unreadable hotplug records: rebuilding them from the live domain");
                self.keep_unreadable_records();
                self.records_from_nodes(live)
            }
        };
        let qemu_cgroups: BTreeSet<DeviceCgroup> = qemu_device_cgroups(
            &self.roots.qemu_pid_file,
            &self.roots.proc_root,
            &self.roots.cgroup_roots,
        )
        .map(|found| found.into_iter().collect())
        .unwrap_or_default();
        let (records, dropped) =
            records.vetted(&self.roots.hotplug_dir, |c| qemu_cgroups.contains(c));
        for why in dropped {
            tracing::warn!(%why, "ignoring a hotplug record");
        }
        let mut host = self.lock();
        host.applied = records.cgroups.into_iter().collect();
        host.programs = records.programs;
        for (volume, node) in records.nodes {
            if live.contains(&volume) {
                // The record names what the launcher made; the node must still be that device
                // (a node replaced since would otherwise be allowed under the old number).
                match node_now(&node.path) {
                    Some(dev) if dev == node.dev => host.plug(&volume, node),
                    now => tracing::warn!(
                        %volume,
                        path = %node.path.display(),
                        recorded = %node.dev,
                        now = ?now.map(|d| d.to_string()),
                        "the node is not the recorded device: not adopted"
                    ),
                }
            } else {
                match devnode::remove_node(&self.roots.hotplug_dir, &volume, node.dev) {
                    Ok(()) => {
                        tracing::info!(%volume, path = %node.path.display(), "removed a stale node")
                    }
                    Err(e) => {
                        tracing::warn!(error = %crate::error_chain(&e), "cannot remove a stale node")
                    }
                }
            }
        }
        if host.nodes.is_empty() && host.applied.is_empty() {
            return;
        }
        if let Err(e) = self.apply_device_rules(&mut host) {
            tracing::warn!(error = %crate::error_chain(&e), "cannot restore the device rules");
        }
    }

    /// Records of the block nodes in the hotplug dir named after a volume in `live`.
    fn records_from_nodes(&self, live: &BTreeSet<String>) -> Records {
        let mut records = Records::default();
        for volume in live {
            if devnode::check_name(volume).is_err() {
                continue;
            }
            let path = self.roots.hotplug_dir.join(volume);
            let is_node = fs::symlink_metadata(&path)
                .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type()));
            if let (true, Ok(dev)) = (is_node, devnode::device_of(&path)) {
                records
                    .nodes
                    .insert(volume.clone(), NodeRecord { path, dev });
            }
        }
        records
    }

    /// Moves unreadable records aside (`.bak`) for whoever investigates; the next save writes
    /// the rebuilt ones.
    fn keep_unreadable_records(&self) {
        let mut bak = self.roots.records.clone().into_os_string();
        bak.push(".bak");
        if let Err(e) = fs::rename(&self.roots.records, &bak) {
            tracing::warn!(error = %e, "cannot keep the unreadable hotplug records");
        }
    }
}

/// The device a node is now (not following a link), if it is a block node.
fn node_now(path: &std::path::Path) -> Option<DevNumber> {
    let meta = fs::symlink_metadata(path).ok()?;
    std::os::unix::fs::FileTypeExt::is_block_device(&meta.file_type())
        .then(|| DevNumber::from_rdev(std::os::unix::fs::MetadataExt::rdev(&meta)))
}

#[cfg(test)]
mod tests;
