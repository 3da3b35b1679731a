//! The status publisher: the current status, the same again only when the VM's course changes
//! (for followers that need no more), the event stream with its sequence numbers, and the rate
//! limit of I/O error reports. The launcher publishes every state change through `publish`.
//!
//! Locks: `publish` is called under the owner's state lock, so that the stream's order is the
//! order of the updates; the sequence lock is taken after it, and nothing takes them reversed.
//! `io_errors` is a leaf.

use std::sync::Mutex;
use std::time::Instant;

use tokio::sync::{broadcast, watch};

use super::io_errors::{IoErrorReport, IoErrorReports};
use super::types::{volume_changes, EventKind, LauncherEvent, Status};

/// Events kept for slow `WatchEvents` subscribers before they get a resync instead.
const EVENT_BUFFER: usize = 1024;

#[derive(Debug)]
pub(super) struct StatusHub {
    changes: watch::Sender<Status>,
    /// The status again, sent only when what shows the VM's course changes (`Status::course`):
    /// for followers that need no more (`vmlauncher run` on the main thread, the health
    /// reporter). Woken by every change, such a follower cost the Sync that moved a volume's
    /// phase one futex wake-up of another thread per change, on the Sync's path.
    course: watch::Sender<Status>,
    stream: broadcast::Sender<LauncherEvent>,
    seq: Mutex<u64>,
    io_errors: Mutex<IoErrorReports>,
}

impl StatusHub {
    pub(super) fn new(initial: Status) -> StatusHub {
        StatusHub {
            course: watch::channel(initial.clone()).0,
            changes: watch::channel(initial).0,
            stream: broadcast::channel(EVENT_BUFFER).0,
            seq: Mutex::new(0),
            io_errors: Mutex::default(),
        }
    }

    /// The new status, published; the stream is told what changed (the status in summary, then
    /// each volume). Called under the state lock (see the module's doc).
    pub(super) fn publish(&self, status: Status) {
        // Compared where it is published, not cloned for that: a Sync of n disks makes 2n
        // updates of an n-volume status.
        let old = self.changes.send_replace(status);
        let new = self.changes.borrow();
        if new.course() != old.course() {
            self.course.send_replace(new.clone());
        }
        if new.summary_differs(&old) {
            self.event(EventKind::Status(Box::new(new.clone())));
        }
        for event in volume_changes(&old.volumes, &new.volumes) {
            self.event(event);
        }
    }

    /// One more event on the stream.
    pub(super) fn event(&self, kind: EventKind) {
        let mut seq = self.seq.lock().expect("seq lock");
        *seq += 1;
        // No subscriber is fine: the stream is for whoever listens.
        let _ = self.stream.send(LauncherEvent { seq: *seq, kind });
    }

    pub(super) fn current(&self) -> Status {
        self.changes.borrow().clone()
    }

    /// A receiver that sees every status change (the latest one, at least).
    pub(super) fn subscribe(&self) -> watch::Receiver<Status> {
        self.changes.subscribe()
    }

    /// A receiver that sees the status when the VM's course changes.
    pub(super) fn subscribe_course(&self) -> watch::Receiver<Status> {
        self.course.subscribe()
    }

    /// The event stream: a resync with the current status first, then every event after it.
    pub(super) fn watch_events(&self) -> (LauncherEvent, broadcast::Receiver<LauncherEvent>) {
        // Under the sequence lock, so no event falls between the snapshot and the subscription.
        let seq = self.seq.lock().expect("seq lock");
        let rx = self.stream.subscribe();
        (self.resync_at(*seq), rx)
    }

    /// A resync for a subscriber that fell behind.
    pub(super) fn resync_event(&self) -> LauncherEvent {
        let seq = self.seq.lock().expect("seq lock");
        self.resync_at(*seq)
    }

    fn resync_at(&self, seq: u64) -> LauncherEvent {
        LauncherEvent {
            seq,
            kind: EventKind::Resync(Box::new(self.current())),
        }
    }

    /// One more disk I/O error: the report to make now, if one is due (`io_errors`).
    pub(super) fn io_error(&self, message: String, now: Instant) -> Option<IoErrorReport> {
        self.io_errors
            .lock()
            .expect("io errors lock")
            .record(message, now)
    }

    /// The I/O errors held back, as one report, once their interval is over.
    pub(super) fn held_io_errors(&self, now: Instant) -> Option<IoErrorReport> {
        self.io_errors.lock().expect("io errors lock").flush(now)
    }

    /// When the I/O errors held back must be reported, if any are.
    pub(super) fn io_errors_due(&self) -> Option<Instant> {
        self.io_errors.lock().expect("io errors lock").due()
    }
}

#[cfg(test)]
mod tests {
    use super::super::status::{placeholder_status, test_volume};
    use super::*;
    use crate::launcher::VolumePhase;
    use crate::lifecycle::{Phase, RunStrategy};

    fn hub() -> (StatusHub, Status) {
        let first = placeholder_status("ns_vm", "test:///default", RunStrategy::Always);
        (StatusHub::new(first.clone()), first)
    }

    #[test]
    fn a_stream_starts_with_the_current_status_and_then_numbers_every_change() {
        let (hub, first) = hub();
        let (resync, mut rx) = hub.watch_events();
        assert_eq!(
            resync,
            LauncherEvent {
                seq: 0,
                kind: EventKind::Resync(Box::new(first.clone()))
            }
        );
        let running = Status {
            phase: Phase::Running,
            volumes: vec![test_volume("a", VolumePhase::Ready)],
            ..first
        };
        hub.publish(running.clone());
        assert_eq!(
            rx.try_recv().unwrap(),
            LauncherEvent {
                seq: 1,
                kind: EventKind::Status(Box::new(running.clone()))
            }
        );
        assert_eq!(
            rx.try_recv().unwrap(),
            LauncherEvent {
                seq: 2,
                kind: EventKind::Volume(Box::new(test_volume("a", VolumePhase::Ready)))
            }
        );
        assert!(rx.try_recv().is_err());
        assert_eq!(hub.current(), running);
        assert_eq!(hub.resync_event().seq, 2);
        // The same status again tells the stream nothing.
        hub.publish(running);
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn course_followers_are_woken_by_the_course_only() {
        let (hub, first) = hub();
        let mut course = hub.subscribe_course();
        let mut every = hub.subscribe();
        let with_volume = Status {
            volumes: vec![test_volume("a", VolumePhase::Attaching)],
            ..first.clone()
        };
        hub.publish(with_volume.clone());
        assert!(every.has_changed().unwrap());
        assert!(!course.has_changed().unwrap());
        every.mark_unchanged();
        hub.publish(Status {
            phase: Phase::Running,
            ..with_volume
        });
        assert!(every.has_changed().unwrap());
        assert!(course.has_changed().unwrap());
        assert_eq!(course.borrow_and_update().phase, Phase::Running);
    }

    #[test]
    fn io_errors_are_reported_at_once_then_held_back() {
        let (hub, _) = hub();
        let t = Instant::now();
        assert!(hub.io_error("first".into(), t).is_some());
        assert!(hub.io_error("second".into(), t).is_none());
        let due = hub.io_errors_due().expect("one held back");
        assert!(hub.held_io_errors(t).is_none());
        let report = hub.held_io_errors(due).expect("due now");
        assert_eq!((report.message.as_str(), report.suppressed), ("second", 0));
        assert_eq!(hub.io_errors_due(), None);
    }
}
