//! What one task tells others while they run: a Kill pre-empts a graceful stop in flight; a
//! Kill or SIGTERM interrupts a Sync (at its next volume) or a migration; a cancel aborts the
//! migration in flight; a task's end wakes the reconciler; the launcher closing ends the event
//! streams. Each is a generation or a flag on a watch channel (or a `Notify`): no locks.

use tokio::sync::{watch, Notify};

#[derive(Debug)]
pub(super) struct Signals {
    /// Bumped by Kill so that a graceful stop in flight gives way.
    preempt: watch::Sender<u64>,
    /// Bumped by Kill and SIGTERM so that a Sync or a migration in flight stops.
    interrupt: watch::Sender<u64>,
    /// Bumped to cancel the migration in flight.
    migration_cancel: watch::Sender<u64>,
    /// Asks the reconciler to re-read and reconcile now.
    wake: Notify,
    /// Set when the launcher is going away: event streams end, so the API can stop.
    closing: watch::Sender<bool>,
}

impl Default for Signals {
    fn default() -> Self {
        Signals {
            preempt: watch::channel(0).0,
            interrupt: watch::channel(0).0,
            migration_cancel: watch::channel(0).0,
            wake: Notify::new(),
            closing: watch::channel(false).0,
        }
    }
}

impl Signals {
    /// A Kill: pre-empts a graceful stop and interrupts a Sync or migration.
    pub(super) fn kill(&self) {
        self.preempt.send_modify(|n| *n += 1);
        self.interrupt();
    }

    /// SIGTERM (or a Kill): interrupts a Sync or migration in flight.
    pub(super) fn interrupt(&self) {
        self.interrupt.send_modify(|n| *n += 1);
    }

    /// The Kills so far: a graceful stop asked for now gives way to any later one.
    pub(super) fn preempt_generation(&self) -> u64 {
        *self.preempt.borrow()
    }

    pub(super) fn subscribe_preempt(&self) -> watch::Receiver<u64> {
        self.preempt.subscribe()
    }

    /// The interrupts so far: a Sync asked for now stops at any later one.
    pub(super) fn interrupt_generation(&self) -> u64 {
        *self.interrupt.borrow()
    }

    pub(super) fn subscribe_interrupt(&self) -> watch::Receiver<u64> {
        self.interrupt.subscribe()
    }

    pub(super) fn cancel_migration(&self) {
        self.migration_cancel.send_modify(|n| *n += 1);
    }

    pub(super) fn subscribe_migration_cancel(&self) -> watch::Receiver<u64> {
        self.migration_cancel.subscribe()
    }

    /// Asks the reconciler to look now (a permit is kept if it is busy).
    pub(super) fn wake(&self) {
        self.wake.notify_one();
    }

    /// Resolves when `wake` was asked for.
    pub(super) async fn woken(&self) {
        self.wake.notified().await
    }

    pub(super) fn close(&self) {
        self.closing.send_replace(true);
    }

    pub(super) fn is_closing(&self) -> bool {
        *self.closing.borrow()
    }

    pub(super) fn subscribe_closing(&self) -> watch::Receiver<bool> {
        self.closing.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kill_pre_empts_and_interrupts_a_sigterm_only_interrupts() {
        let s = Signals::default();
        let (preempt, interrupt) = (s.preempt_generation(), s.interrupt_generation());
        s.interrupt();
        assert_eq!(s.preempt_generation(), preempt);
        assert_ne!(s.interrupt_generation(), interrupt);
        let interrupt = s.interrupt_generation();
        s.kill();
        assert_ne!(s.preempt_generation(), preempt);
        assert_ne!(s.interrupt_generation(), interrupt);
    }

    #[tokio::test]
    async fn a_wake_asked_while_no_one_waits_is_kept() {
        let s = Signals::default();
        s.wake();
        tokio::time::timeout(std::time::Duration::from_secs(5), s.woken())
            .await
            .expect("the permit was kept");
    }

    #[test]
    fn closing_and_cancels_reach_their_subscribers() {
        let s = Signals::default();
        let closing = s.subscribe_closing();
        let cancel = s.subscribe_migration_cancel();
        assert!(!s.is_closing());
        s.close();
        assert!(s.is_closing() && closing.has_changed().unwrap());
        s.cancel_migration();
        assert!(cancel.has_changed().unwrap());
    }
}
