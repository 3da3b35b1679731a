//! Tasks spawned with their future moved to the heap first.

use std::future::Future;

use tokio::task::JoinHandle;

/// `tokio::spawn` of `future`, boxed first. tokio builds a task's cell on the caller's stack
/// before it moves it to the heap, and a launcher call's future is tens of KiB: the handlers
/// that spawned one had frames of 36–90 KiB (read from the release binary), and a thread keeps
/// every stack page it ever touched, the worker from its first call on (`docs/performance.md`,
/// "The launcher's stack and the start's free heap"). Always inlined: a future passed to a
/// function of its own would be copied onto the caller's stack all the same.
#[inline(always)]
pub(crate) fn spawn_boxed<F>(future: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(Box::pin(future))
}
