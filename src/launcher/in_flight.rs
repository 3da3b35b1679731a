//! Work on a list of items a few at a time, on scoped threads: a Sync's attaches, which libvirt
//! queues one device job after another (see `sync::ATTACHES_IN_FLIGHT`).

use super::error::LauncherError;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Runs `work` on each of `items`, `at_once` at a time (on this thread and `at_once - 1`
/// scoped ones), taking the items in order; none starts once `interrupted` says so. If the
/// system refuses a thread (a pod's `pids.max`, say), fewer run at once, down to this thread.
pub(super) fn in_flight<T: Sync>(
    items: &[T],
    at_once: usize,
    interrupted: &(dyn Fn() -> bool + Sync),
    work: impl Fn(&T) + Sync,
) -> Result<(), LauncherError> {
    let next = AtomicUsize::new(0);
    let stopped = AtomicBool::new(false);
    let worker = || loop {
        let Some(item) = items.get(next.fetch_add(1, Ordering::Relaxed)) else {
            return;
        };
        if interrupted() {
            stopped.store(true, Ordering::Relaxed);
            return;
        }
        work(item);
    };
    std::thread::scope(|scope| {
        for _ in 1..at_once.min(items.len()) {
            let spawned = std::thread::Builder::new()
                .name("attach".into())
                .spawn_scoped(scope, worker);
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "cannot start a thread; attaching one at a time");
                break;
            }
        }
        worker();
    });
    if stopped.load(Ordering::Relaxed) {
        return Err(LauncherError::SyncInterrupted);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn in_flight_runs_every_item_once() {
        let started = Mutex::new(Vec::new());
        in_flight(&[1, 2, 3, 4, 5], 2, &|| false, |&i| {
            started.lock().unwrap().push(i)
        })
        .unwrap();
        let mut started = started.into_inner().unwrap();
        started.sort();
        assert_eq!(started, [1, 2, 3, 4, 5]);
    }

    /// `in_flight`, two at once, on items 0, 1, 2, ..., each recorded in `finished`: item 0
    /// returns only once item 1 has run `item1` and said so. One at a time, item 0 would wait
    /// for ever (the test fails at the timeout instead).
    fn item0_waits_for_item1(
        items: &[usize],
        interrupted: &(dyn Fn() -> bool + Sync),
        item1: impl Fn() + Sync,
    ) -> (Result<(), LauncherError>, Vec<usize>) {
        let (item1_ran, wait_for_item1) = std::sync::mpsc::channel();
        let (item1_ran, wait_for_item1) = (Mutex::new(item1_ran), Mutex::new(wait_for_item1));
        let finished = Mutex::new(Vec::new());
        let outcome = in_flight(items, 2, interrupted, |&i| {
            match i {
                0 => wait_for_item1
                    .lock()
                    .unwrap()
                    .recv_timeout(std::time::Duration::from_secs(10))
                    .expect("item 1 ran while item 0 was running"),
                1 => {
                    item1();
                    item1_ran.lock().unwrap().send(()).unwrap();
                }
                _ => {}
            }
            finished.lock().unwrap().push(i);
        });
        let mut finished = finished.into_inner().unwrap();
        finished.sort();
        (outcome, finished)
    }

    #[test]
    fn in_flight_keeps_two_going_at_once() {
        let (outcome, finished) = item0_waits_for_item1(&[0, 1, 2, 3, 4, 5], &|| false, || {});
        outcome.unwrap();
        assert_eq!(finished, [0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn two_at_once_an_interrupt_starts_nothing_more_and_lets_the_running_one_finish() {
        // The interrupt comes while item 0 runs: it finishes; neither thread starts 2 or 3.
        let interrupted = AtomicBool::new(false);
        let (outcome, finished) = item0_waits_for_item1(
            &[0, 1, 2, 3],
            &|| interrupted.load(Ordering::SeqCst),
            || interrupted.store(true, Ordering::SeqCst),
        );
        assert!(matches!(outcome, Err(LauncherError::SyncInterrupted)));
        assert_eq!(finished, [0, 1]);
    }

    #[test]
    fn in_flight_starts_nothing_once_interrupted_and_says_so() {
        // One at a time: the item after the interrupt is not started.
        let interrupted = AtomicBool::new(false);
        let started = Mutex::new(Vec::new());
        let outcome = in_flight(
            &[1, 2, 3, 4],
            1,
            &|| interrupted.load(Ordering::SeqCst),
            |&i| {
                started.lock().unwrap().push(i);
                if i == 2 {
                    interrupted.store(true, Ordering::SeqCst);
                }
            },
        );
        assert!(matches!(outcome, Err(LauncherError::SyncInterrupted)));
        assert_eq!(started.into_inner().unwrap(), [1, 2]);
    }

    #[test]
    fn in_flight_with_one_item_uses_no_other_thread() {
        let caller = std::thread::current().id();
        in_flight(&["only"], 2, &|| false, |_| {
            assert_eq!(std::thread::current().id(), caller)
        })
        .unwrap();
    }
}
