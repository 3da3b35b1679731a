//! The bookkeeping of detaches: who waits for a device's removal, which volumes are being
//! detached (with the generation of the block node each detach is about, so that finishing it
//! releases that node and nothing newer), and the removals that came after their detach
//! stopped waiting, which the reconciler finishes under the task slot, never beside a Sync.
//!
//! Locks: each is a leaf, taken alone and never while calling out.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use tokio::sync::oneshot;

use crate::domain::USER_ALIAS_PREFIX;

#[derive(Debug, Default)]
pub(super) struct Detaches {
    /// By device alias: who waits for its device-removed event.
    waiters: Mutex<HashMap<String, Vec<oneshot::Sender<()>>>>,
    /// By volume: the generation of its block node when the detach began (`None`: no node).
    detaching: Mutex<HashMap<String, Option<u64>>>,
    /// Volumes whose device-removed event came when no one waited any more.
    late: Mutex<BTreeSet<String>>,
}

impl Detaches {
    /// A detach of `volume` begins, about its block node of `generation`. A detach that begins
    /// again (`again`: the volume was still being detached) stays about the node the first one
    /// was about.
    pub(super) fn begin(&self, volume: &str, generation: Option<u64>, again: bool) {
        let mut detaching = self.detaching.lock().expect("detaching lock");
        if again {
            detaching.entry(volume.to_string()).or_insert(generation);
        } else {
            detaching.insert(volume.to_string(), generation);
        }
    }

    /// Resolves when the device of `alias` is removed (`removed`).
    pub(super) fn expect_removal(&self, alias: &str) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        self.waiters
            .lock()
            .expect("waiters lock")
            .entry(alias.to_string())
            .or_default()
            .push(tx);
        rx
    }

    /// No one waits for `alias`'s removal any more (its detach was refused).
    pub(super) fn stop_waiting(&self, alias: &str) {
        self.waiters.lock().expect("waiters lock").remove(alias);
    }

    /// The detach of `volume` ended without its device gone: nothing is to be released.
    pub(super) fn abandon(&self, volume: &str) {
        self.detaching
            .lock()
            .expect("detaching lock")
            .remove(volume);
    }

    /// The detach of `volume` is over: the generation of the node it was about, if any.
    pub(super) fn finish(&self, volume: &str) -> Option<u64> {
        self.detaching
            .lock()
            .expect("detaching lock")
            .remove(volume)
            .flatten()
    }

    /// libvirt removed the device of `alias`: its waiters are told. True when no one waited
    /// (its detach stopped waiting) for a volume still being detached: a late removal, kept
    /// for `take_late`.
    pub(super) fn removed(&self, alias: &str) -> bool {
        let waiters = self
            .waiters
            .lock()
            .expect("waiters lock")
            .remove(alias)
            .unwrap_or_default();
        // A waiter whose detach timed out is gone.
        let waiters: Vec<_> = waiters.into_iter().filter(|w| !w.is_closed()).collect();
        if waiters.is_empty() {
            if let Some(volume) = alias.strip_prefix(USER_ALIAS_PREFIX) {
                if self.is_detaching(volume) {
                    self.late
                        .lock()
                        .expect("late removals lock")
                        .insert(volume.to_string());
                    return true;
                }
            }
        }
        for w in waiters {
            let _ = w.send(());
        }
        false
    }

    /// The late removals so far, taken.
    pub(super) fn take_late(&self) -> BTreeSet<String> {
        std::mem::take(&mut *self.late.lock().expect("late removals lock"))
    }

    /// A detach of `volume` began and is not over.
    pub(super) fn is_detaching(&self, volume: &str) -> bool {
        self.detaching
            .lock()
            .expect("detaching lock")
            .contains_key(volume)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alias(volume: &str) -> String {
        format!("{USER_ALIAS_PREFIX}{volume}")
    }

    #[test]
    fn a_removal_wakes_its_waiter_and_is_not_late() {
        let d = Detaches::default();
        d.begin("a", Some(3), false);
        let mut rx = d.expect_removal(&alias("a"));
        assert!(!d.removed(&alias("a")));
        assert_eq!(rx.try_recv(), Ok(()));
        assert_eq!(d.finish("a"), Some(3));
        assert!(!d.is_detaching("a"));
    }

    #[test]
    fn a_removal_no_one_waits_for_is_late_only_for_a_volume_being_detached() {
        let d = Detaches::default();
        d.begin("a", None, false);
        // The detach stopped waiting: its receiver is gone.
        drop(d.expect_removal(&alias("a")));
        assert!(d.removed(&alias("a")));
        assert!(!d.removed(&alias("other")));
        assert!(!d.removed("scsi0-0-0-1"));
        assert_eq!(d.take_late(), BTreeSet::from(["a".to_string()]));
        assert!(d.take_late().is_empty());
    }

    #[test]
    fn a_detach_begun_again_stays_about_the_first_node() {
        let d = Detaches::default();
        d.begin("a", Some(1), false);
        d.begin("a", Some(2), true);
        assert_eq!(d.finish("a"), Some(1));
        d.begin("a", Some(2), false);
        d.abandon("a");
        assert_eq!(d.finish("a"), None);
    }

    #[test]
    fn a_refused_detach_leaves_no_waiter() {
        let d = Detaches::default();
        d.begin("a", None, false);
        let mut rx = d.expect_removal(&alias("a"));
        d.stop_waiting(&alias("a"));
        assert!(rx.try_recv().is_err());
        // Its removal, should it come after all, is late.
        assert!(d.removed(&alias("a")));
    }
}
