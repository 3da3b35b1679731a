//! The launcher's gRPC API as a test client uses it: calls that must succeed, and the event
//! stream followed in the background.

use std::path::Path;
use std::time::Duration;

/// Follows the launcher's gRPC event stream in the background.
pub struct EventWatcher {
    rx: tokio::sync::mpsc::UnboundedReceiver<vmlauncher::api::proto::Event>,
    pub seen: Vec<vmlauncher::api::proto::Event>,
}

impl EventWatcher {
    pub async fn start(socket: &Path) -> EventWatcher {
        let mut client = vmlauncher::api::connect(socket).await.expect("connect");
        let mut stream = client
            .watch_events(vmlauncher::api::proto::WatchEventsRequest {})
            .await
            .expect("WatchEvents")
            .into_inner();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(event)) = stream.message().await {
                if tx.send(event).is_err() {
                    return;
                }
            }
        });
        EventWatcher {
            rx,
            seen: Vec::new(),
        }
    }

    /// Waits for an event that satisfies `matches`, failing with everything seen so far.
    pub async fn wait_for(
        &mut self,
        what: &str,
        within: Duration,
        mut matches: impl FnMut(&vmlauncher::api::proto::Event) -> bool,
    ) -> vmlauncher::api::proto::Event {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(event)) => {
                    self.seen.push(event.clone());
                    if matches(&event) {
                        return event;
                    }
                }
                Ok(None) => panic!(
                    "the event stream ended before {what}; seen: {:#?}",
                    self.seen
                ),
                Err(_) => panic!("no {what} within {within:?}; seen: {:#?}", self.seen),
            }
        }
    }

    /// Waits for a status (or resync) event whose phase is `phase`.
    pub async fn wait_phase(
        &mut self,
        what: &str,
        within: Duration,
        phase: &str,
    ) -> vmlauncher::api::proto::Event {
        self.wait_for(what, within, |e| {
            event_status(e).is_some_and(|s| s.phase == phase)
        })
        .await
    }
}

/// A gRPC client of the launcher.
pub type Client =
    vmlauncher::api::proto::launcher_client::LauncherClient<tonic::transport::Channel>;

/// The launcher's status through `client`; the call must succeed.
pub async fn status(client: &mut Client) -> vmlauncher::api::proto::Status {
    client
        .get_status(vmlauncher::api::proto::GetStatusRequest {})
        .await
        .unwrap()
        .into_inner()
}

/// Sends `request` through `client`; the Sync must succeed (else a panic naming the step,
/// `what`). The reply.
pub async fn sync_ok(
    client: &mut Client,
    request: vmlauncher::api::proto::SyncRequest,
    what: impl std::fmt::Display,
) -> vmlauncher::api::proto::SyncResponse {
    client
        .sync(request)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e:?}"))
        .into_inner()
}

/// The spec (and block devices) the launcher last took, through `client`; the call must succeed.
pub async fn spec(client: &mut Client) -> vmlauncher::api::proto::GetSpecResponse {
    client
        .get_spec(vmlauncher::api::proto::GetSpecRequest {})
        .await
        .unwrap()
        .into_inner()
}

/// The status inside a status or resync event.
pub fn event_status(e: &vmlauncher::api::proto::Event) -> Option<&vmlauncher::api::proto::Status> {
    use vmlauncher::api::proto::event::Kind;
    match &e.kind {
        Some(Kind::Status(s)) | Some(Kind::Resync(s)) => Some(s),
        _ => None,
    }
}
