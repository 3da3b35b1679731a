//! A call that runs to its end even when its caller stops waiting.
//!
//! A gRPC handler's future is dropped when its client goes away; a launcher task cut off between
//! its start and its end would leave the VM half-changed and the task "in flight" for good. The
//! first way to keep it going was a task of its own per call, awaited by the handler: every call
//! then paid two hand-overs between threads (the spawn, and the wake-up of the handler when the
//! task ended), 0.1–0.2 ms of a Sync on the bench machine, where the handler is otherwise idle
//! while it waits. [`RunToEnd`] polls the call in place, in the handler's own task, and hands
//! it to a task of its own only if it is dropped before the call ended.

use std::any::Any;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll};

/// `call`, run to its end whatever becomes of the future that waits for it (see the module).
/// Resolves to the call's output, or to the message of its panic.
pub(crate) fn run_to_end<F>(call: F) -> RunToEnd<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    RunToEnd {
        call: Some(Box::pin(call)),
        runtime: tokio::runtime::Handle::try_current().ok(),
    }
}

pub(crate) struct RunToEnd<F: Future + Send + 'static>
where
    F::Output: Send + 'static,
{
    /// `None` once the call ended (or panicked).
    call: Option<Pin<Box<F>>>,
    /// Where the call was made: where it goes on if it is given up (not whatever runtime is
    /// current where the future is dropped).
    runtime: Option<tokio::runtime::Handle>,
}

impl<F> Future for RunToEnd<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    type Output = Result<F::Output, String>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(call) = self.call.as_mut() else {
            panic!("RunToEnd polled after it ended");
        };
        // A panic is the call's end too, reported to the caller (as a spawned task's would be);
        // what the call held is dropped here, as a panicked task's is.
        let polled = catch_unwind(AssertUnwindSafe(|| call.as_mut().poll(cx)));
        match polled {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(output)) => {
                self.call = None;
                Poll::Ready(Ok(output))
            }
            Err(panic) => {
                self.call = None;
                Poll::Ready(Err(panic_message(panic.as_ref())))
            }
        }
    }
}

impl<F> Drop for RunToEnd<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn drop(&mut self) {
        let Some(call) = self.call.take() else {
            return;
        };
        // Its outcome is the launcher's status and event stream's to tell (a task's end, the
        // Synchronized condition); no one waits for the value any more.
        match &self.runtime {
            Some(runtime) => drop(runtime.spawn(call)),
            None => tracing::error!("a call made outside a runtime and given up is lost"),
        }
    }
}

pub(crate) fn panic_message(panic: &(dyn Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with no message".into())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::sync::{oneshot, Notify};

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_runs_in_the_task_that_waits_for_it() {
        // As a gRPC handler: a task of the server's.
        let handler = tokio::spawn(async {
            let waiting = tokio::task::id();
            let ran_in = run_to_end(async { tokio::task::id() }).await.unwrap();
            (waiting, ran_in)
        });
        let (waiting, ran_in) = handler.await.unwrap();
        assert_eq!(ran_in, waiting);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_given_up_by_its_caller_still_runs_to_its_end() {
        let go_on = Arc::new(Notify::new());
        let (done, ended) = oneshot::channel();
        let call = {
            let go_on = go_on.clone();
            async move {
                go_on.notified().await;
                let _ = done.send("ended");
            }
        };
        let mut waiting = Box::pin(run_to_end(call));
        let first = std::future::poll_fn(|cx| Poll::Ready(waiting.as_mut().poll(cx))).await;
        assert!(first.is_pending(), "the call waits for go_on");
        // The caller goes away (as a gRPC handler whose client cancelled), then the call may go on.
        drop(waiting);
        go_on.notify_one();
        assert_eq!(ended.await, Ok("ended"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_panic_is_the_calls_end_with_its_message() {
        let held = Arc::new(());
        let call = {
            let held = held.clone();
            async move {
                let _held = held;
                panic!("a bug in a call");
            }
        };
        let ended: Result<(), String> = run_to_end(call).await;
        assert_eq!(ended, Err("a bug in a call".to_string()));
        assert_eq!(Arc::strong_count(&held), 1, "what the call held is dropped");
    }
}
