//! The task slot: every front end (`vmlauncher.v1`, KubeVirt's `kubevirt.cmd.v1`, the `run`
//! entrypoint) drives the launcher through a `tasks::Work` — a lifecycle command, a Sync, a
//! migration — and one runs at a time, holding the slot (`Launcher::run`). The slot's lock is
//! taken before any other lock the launcher holds, and held for a whole task.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{Mutex, MutexGuard};

#[derive(Debug)]
pub(super) struct TaskSlot {
    slot: Mutex<()>,
    next_id: AtomicU64,
}

/// The slot, held.
pub(super) type Held<'a> = MutexGuard<'a, ()>;

impl Default for TaskSlot {
    fn default() -> Self {
        TaskSlot {
            slot: Mutex::new(()),
            next_id: AtomicU64::new(1),
        }
    }
}

impl TaskSlot {
    /// Waits for the task in flight, if any, to end.
    pub(super) async fn take(&self) -> Held<'_> {
        self.slot.lock().await
    }

    /// The slot if no task holds it.
    pub(super) fn try_take(&self) -> Option<Held<'_>> {
        self.slot.try_lock().ok()
    }

    /// A new task's id: ids increase from 1, never reused.
    pub(super) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_task_at_a_time_with_ids_that_only_grow() {
        let slot = TaskSlot::default();
        let held = slot.take().await;
        assert!(slot.try_take().is_none());
        let waiting = slot.take();
        drop(held);
        let _held = tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("the slot was freed");
        assert_eq!((slot.next_id(), slot.next_id()), (1, 2));
    }
}
