//! A launcher call that runs to its end even when its gRPC caller stops waiting.

use crate::launcher::LauncherError;

/// Runs a launcher call to its end even if the client goes away: the server drops a handler
/// whose deadline passes or whose stream is reset, and a call cut off half-way would leave the VM
/// half-changed and its task "in flight" for good. So the call is a task of its own, which the
/// handler only waits for. (Running the call in the handler's task until it was dropped saved
/// nothing the bench could see: `docs/performance.md`, "The tricks, with and without".)
pub(super) async fn detached<T: Send + 'static>(
    call: impl std::future::Future<Output = Result<T, LauncherError>> + Send + 'static,
) -> Result<T, tonic::Status> {
    crate::spawn::spawn_boxed(call)
        .await
        .map_err(|e| {
            let panic = match e.try_into_panic() {
                Ok(panic) => panic_message(panic.as_ref()),
                Err(e) => e.to_string(),
            };
            tonic::Status::internal(format!("the launcher call panicked: {panic}"))
        })?
        .map_err(|e| super::to_status(&e))
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with no message".into())
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::sync::Arc;
    use std::task::Poll;

    use tokio::sync::{oneshot, Notify};

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_given_up_by_its_caller_still_runs_to_its_end() {
        let go_on = Arc::new(Notify::new());
        let (done, ended) = oneshot::channel();
        let call = {
            let go_on = go_on.clone();
            async move {
                go_on.notified().await;
                let _ = done.send("ended");
                Ok(())
            }
        };
        let mut waiting = Box::pin(detached(call));
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
                #[allow(unreachable_code)]
                Ok(())
            }
        };
        let ended: Result<(), tonic::Status> = detached(call).await;
        let status = ended.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Internal);
        assert_eq!(
            status.message(),
            "the launcher call panicked: a bug in a call"
        );
        assert_eq!(Arc::strong_count(&held), 1, "what the call held is dropped");
    }
}
