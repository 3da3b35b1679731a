//! Which block devices a Sync may hand to the guest. The launcher makes a node and a device rule
//! for what a Sync names, so whoever can call Sync could otherwise attach any disk of the node
//! (its root disk is `8:0`). In a pod only devices the node daemon gave the pod qualify: a node
//! it put in the hotplug dir (as virt-handler does), or a number it listed when it started the
//! launcher (`--allow-block-device`). A local run, whose API socket is root's alone on root's
//! own machine, takes any device unless devices are listed.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use super::devnode::{DevNumber, NotGiven};

/// At most this many entries of the hotplug dir are looked at for a vouching node: the dir is
/// the node daemon's to fill, and a Sync must not scan without end.
const MAX_ENTRIES: usize = 4096;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum BlockAllowList {
    /// Any block device of the host (a local run that listed none).
    #[default]
    Any,
    /// Only these, and those with a node in the hotplug dir.
    Given(BTreeSet<DevNumber>),
}

impl BlockAllowList {
    /// The list for a launcher: `listed` (from `--allow-block-device`) alone where any was
    /// listed or where the launcher runs in a container; any device otherwise.
    pub(crate) fn new(
        listed: impl IntoIterator<Item = DevNumber>,
        in_container: bool,
    ) -> BlockAllowList {
        let listed: BTreeSet<DevNumber> = listed.into_iter().collect();
        if listed.is_empty() && !in_container {
            BlockAllowList::Any
        } else {
            BlockAllowList::Given(listed)
        }
    }

    /// `Ok` when `dev` may be attached.
    pub(crate) fn check(&self, dev: DevNumber, hotplug_dir: &Path) -> Result<(), NotGiven> {
        match self {
            BlockAllowList::Any => Ok(()),
            BlockAllowList::Given(listed) if listed.contains(&dev) => Ok(()),
            BlockAllowList::Given(_) if has_node_for(hotplug_dir, dev) => Ok(()),
            BlockAllowList::Given(_) => Err(NotGiven {
                dev,
                hotplug_dir: hotplug_dir.into(),
            }),
        }
    }
}

/// Whether a block node for `dev` sits directly in `dir` (links are not followed: a link could
/// name any node of the host).
fn has_node_for(dir: &Path, dev: DevNumber) -> bool {
    let Ok(entries) = fs::read_dir(dir) else {
        return false;
    };
    entries.take(MAX_ENTRIES).flatten().any(|entry| {
        entry.metadata().is_ok_and(|meta| {
            meta.file_type().is_block_device() && DevNumber::from_rdev(meta.rdev()) == dev
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOOP0: DevNumber = DevNumber { major: 7, minor: 0 };
    const ROOT_DISK: DevNumber = DevNumber { major: 8, minor: 0 };

    fn node(dir: &Path, name: &str, dev: DevNumber) {
        crate::testing::block_node(&dir.join(name), dev);
    }

    #[test]
    fn a_host_run_that_lists_nothing_takes_any_device() {
        let dir = tempfile::tempdir().unwrap();
        let allow = BlockAllowList::new([], false);
        assert_eq!(allow.check(ROOT_DISK, dir.path()), Ok(()));
    }

    #[test]
    fn in_a_container_only_given_devices_qualify() {
        let dir = tempfile::tempdir().unwrap();
        let allow = BlockAllowList::new([], true);
        assert_eq!(
            allow.check(ROOT_DISK, dir.path()).unwrap_err().to_string(),
            format!(
                "block device 8:0 was not given to this launcher: no node for it in {}, and it is not an --allow-block-device",
                dir.path().display()
            )
        );
        node(dir.path(), "given-by-the-daemon", LOOP0);
        assert_eq!(allow.check(LOOP0, dir.path()), Ok(()));
        assert!(allow.check(ROOT_DISK, dir.path()).is_err());
    }

    #[test]
    fn a_listed_device_qualifies_and_listing_restricts_a_host_run() {
        let dir = tempfile::tempdir().unwrap();
        let allow = BlockAllowList::new([LOOP0], false);
        assert_eq!(allow.check(LOOP0, dir.path()), Ok(()));
        assert!(allow.check(ROOT_DISK, dir.path()).is_err());
    }

    #[test]
    fn a_link_or_a_node_in_a_subdirectory_vouches_for_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("sub");
        fs::create_dir(&sub).unwrap();
        node(&sub, "root", ROOT_DISK);
        std::os::unix::fs::symlink(sub.join("root"), dir.path().join("link")).unwrap();
        let allow = BlockAllowList::new([], true);
        assert!(allow.check(ROOT_DISK, dir.path()).is_err());
    }
}
