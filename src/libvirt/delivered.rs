//! The count of libvirt events delivered to this process, and what the last few of them were.
//!
//! Every callback of `events` counts its event here before it queues it. Whoever read libvirt's
//! state when the count was `n` knows it is still true while the count is `n`, even if the event
//! that moved it has not been handled yet. And when the count has moved, the log of the last
//! events ([`between`]) may show that the events since changed nothing that was read, or only
//! what they name (a device removed): the state is then carried over without a libvirt round trip.
//! It is read where the decision is made, so it never waits for the reconciler to handle the
//! events first (a Sync that came right after another client's detach raced with it).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

/// What a delivered event may have changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change {
    /// The device of `alias` is gone from `domain`, and nothing else changed.
    DeviceRemoved { domain: String, alias: String },
    /// The device of `alias` was added to `domain`: what it is, only a read of the domain
    /// tells (one that already shows `alias` has it: libvirt keeps a domain's aliases unique).
    DeviceAdded { domain: String, alias: String },
    /// Something inside the guest, seen from outside: its agent came or went, or a memory
    /// device's plugged size moved. The domain's devices and power state are as they were.
    Guest,
    /// Anything else (a lifecycle change, a reboot, a block job's end, a lost connection...).
    Other,
}

impl Change {
    /// A device came or went, or the guest did something inside: the domain's power state is
    /// as it was.
    pub(crate) fn keeps_power_state(&self) -> bool {
        !matches!(self, Change::Other)
    }
}

/// How many of the last events are kept: a reader whose state is older than that reads libvirt.
const KEPT: usize = 32;

static COUNT: AtomicU64 = AtomicU64::new(0);
static LOG: Mutex<Log> = Mutex::new(Log::new());

/// The number of events delivered so far.
pub(crate) fn count() -> u64 {
    COUNT.load(Ordering::SeqCst)
}

/// Counts one more event, what it changed kept in the log; returns the count with it. The
/// log has the event before the count shows it.
pub(super) fn deliver(change: Change) -> u64 {
    let mut log = LOG.lock().unwrap_or_else(PoisonError::into_inner);
    let count = COUNT.load(Ordering::SeqCst) + 1;
    log.push(count, change);
    COUNT.store(count, Ordering::SeqCst);
    count
}

/// What the events after count `after`, up to and with count `upto`, changed, in order; `None`
/// when the log no longer reaches back that far.
pub(crate) fn between(after: u64, upto: u64) -> Option<Vec<Change>> {
    LOG.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .between(after, upto)
}

/// The last [`KEPT`] events, by count.
#[derive(Debug)]
struct Log {
    kept: VecDeque<(u64, Change)>,
}

impl Log {
    const fn new() -> Log {
        Log {
            kept: VecDeque::new(),
        }
    }

    fn push(&mut self, count: u64, change: Change) {
        if self.kept.len() == KEPT {
            self.kept.pop_front();
        }
        self.kept.push_back((count, change));
    }

    fn between(&self, after: u64, upto: u64) -> Option<Vec<Change>> {
        if upto <= after {
            return Some(Vec::new());
        }
        let first = self.kept.front()?.0;
        if first > after + 1 || self.kept.back()?.0 < upto {
            return None;
        }
        Some(
            self.kept
                .iter()
                .filter(|(count, _)| *count > after && *count <= upto)
                .map(|(_, change)| change.clone())
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn removed(alias: &str) -> Change {
        Change::DeviceRemoved {
            domain: "d".into(),
            alias: alias.into(),
        }
    }

    #[test]
    fn the_log_gives_the_events_between_two_counts_while_it_reaches_back() {
        let mut log = Log::new();
        assert_eq!(log.between(0, 0), Some(vec![]), "nothing came");
        assert_eq!(log.between(0, 1), None, "an event not in the log");
        log.push(1, removed("a"));
        log.push(2, Change::Other);
        log.push(3, removed("b"));
        assert_eq!(
            log.between(0, 3),
            Some(vec![removed("a"), Change::Other, removed("b")])
        );
        assert_eq!(log.between(1, 3), Some(vec![Change::Other, removed("b")]));
        assert_eq!(log.between(2, 2), Some(vec![]));
        assert_eq!(log.between(1, 2), Some(vec![Change::Other]));
        assert_eq!(log.between(3, 4), None, "count 4 is not delivered yet");
        for count in 4..=(KEPT as u64 + 1) {
            log.push(count, Change::Other);
        }
        // Count 1 is gone: from 0 is too far back, from 1 on is still whole.
        assert_eq!(log.between(0, 3), None);
        assert_eq!(log.between(1, 3), Some(vec![Change::Other, removed("b")]));
    }

    #[test]
    fn a_delivered_event_is_in_the_log_when_the_count_shows_it() {
        let before = count();
        let mine = deliver(removed("mine"));
        assert!(mine > before);
        assert!(count() >= mine);
        // Other tests' domains deliver too: only this one's own entry is certain.
        let changes = between(mine - 1, mine).expect("the event just delivered is kept");
        assert_eq!(changes, [removed("mine")]);
    }
}
