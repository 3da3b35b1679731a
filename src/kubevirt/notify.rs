//! The notify client: the domain and Kubernetes events virt-handler learns the VM's state from,
//! sent to `<share>/domain-notify-pipe.sock` (`kubevirt.notify.v1.Notify`, after
//! `NotifyInfo.Info` says it speaks version 1).
//!
//! KubeVirt's client retries each event for 20 s and then drops it. Here nothing is dropped: what
//! waits to be sent is the latest domain (a newer one replaces an older one not sent yet; only
//! the latest state matters to the handler, and an `ADDED` not sent yet stays `ADDED`), plus
//! the Kubernetes events, in order and bounded. The sender keeps trying, once a second, for as
//! long as something waits.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::{watch, Notify};

use super::proto::notify::notify_client::NotifyClient;
use super::proto::notify::{DomainEventRequest, K8sEventRequest};
use super::proto::notify_info::notify_info_client::NotifyInfoClient;
use super::proto::notify_info::NotifyInfoRequest;

/// How often a failed send is tried again, and how long one try may take (KubeVirt's values).
const RETRY_INTERVAL: Duration = Duration::from_secs(1);
const SEND_TIMEOUT: Duration = Duration::from_secs(5);
/// After this long without success a warning is logged again (KubeVirt's total timeout).
const WARN_EVERY: Duration = Duration::from_secs(20);
/// Kubernetes events kept while the handler cannot be reached; the oldest go first.
const MAX_K8S_EVENTS: usize = 64;

/// `watch.EventType` as the handler's notify server reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DomainEvent {
    Added,
    Modified,
}

impl DomainEvent {
    fn as_str(self) -> &'static str {
        match self {
            DomainEvent::Added => "ADDED",
            DomainEvent::Modified => "MODIFIED",
        }
    }
}

#[derive(Debug, Default)]
struct Mailbox {
    domain: Option<(DomainEvent, Value)>,
    k8s: VecDeque<Value>,
    /// Events dropped because the queue was full (said once when sent again).
    k8s_dropped: u64,
}

impl Mailbox {
    fn is_empty(&self) -> bool {
        self.domain.is_none() && self.k8s.is_empty()
    }
}

#[derive(Debug)]
struct Inner {
    socket: PathBuf,
    mailbox: Mutex<Mailbox>,
    wake: Notify,
    /// Bumped each time the mailbox is found empty after a send: what `flush` waits on.
    drained: watch::Sender<u64>,
}

/// The handle the launcher posts events through; cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Notifier {
    inner: Arc<Inner>,
}

impl Notifier {
    /// Starts the sender for the notify socket `socket`.
    pub(crate) fn start(socket: PathBuf) -> Notifier {
        let inner = Arc::new(Inner {
            socket,
            mailbox: Mutex::default(),
            wake: Notify::new(),
            drained: watch::channel(0).0,
        });
        tokio::spawn(sender(inner.clone()));
        Notifier { inner }
    }

    /// Posts the domain as it is now; replaces a domain not sent yet.
    pub(crate) fn domain(&self, event: DomainEvent, domain: Value) {
        let mut mailbox = self.inner.mailbox.lock().expect("mailbox lock");
        let event = match &mailbox.domain {
            Some((DomainEvent::Added, _)) => DomainEvent::Added,
            _ => event,
        };
        mailbox.domain = Some((event, domain));
        drop(mailbox);
        self.inner.wake.notify_one();
    }

    /// Posts a Kubernetes event (`core/v1.Event` JSON).
    pub(crate) fn k8s_event(&self, event: Value) {
        let mut mailbox = self.inner.mailbox.lock().expect("mailbox lock");
        if mailbox.k8s.len() == MAX_K8S_EVENTS {
            mailbox.k8s.pop_front();
            mailbox.k8s_dropped += 1;
        }
        mailbox.k8s.push_back(event);
        drop(mailbox);
        self.inner.wake.notify_one();
    }

    /// Waits until everything posted has been sent, or `timeout`; true if it was.
    pub(crate) async fn flush(&self, timeout: Duration) -> bool {
        let mut drained = self.inner.drained.subscribe();
        let done = async {
            loop {
                if self.inner.mailbox.lock().expect("mailbox lock").is_empty() {
                    return;
                }
                if drained.changed().await.is_err() {
                    return;
                }
            }
        };
        tokio::time::timeout(timeout, done).await.is_ok()
    }
}

/// What one send needs: a connection that has negotiated version 1.
struct Connection {
    client: NotifyClient<tonic::transport::Channel>,
}

/// Why virt-handler could not be told, this time (the sender tries again).
#[derive(Debug, thiserror::Error)]
enum NotifyError {
    /// The notify socket cannot be reached.
    #[error(transparent)]
    Connect(crate::api::ApiError),
    #[error("NotifyInfo.Info: {}", .0.message())]
    Info(tonic::Status),
    #[error("the notify server speaks versions {versions:?}, not 1")]
    Version { versions: Vec<u32> },
    #[error("no answer within 5 s")]
    NoAnswer,
    #[error("{:?}: {}", .0.code(), .0.message())]
    Call(tonic::Status),
    #[error("refused: {message}")]
    Refused { message: String },
}

async fn connect(socket: &std::path::Path) -> Result<Connection, NotifyError> {
    let channel = crate::api::channel(socket)
        .await
        .map_err(NotifyError::Connect)?;
    let versions = NotifyInfoClient::new(channel.clone())
        .info(NotifyInfoRequest {})
        .await
        .map_err(NotifyError::Info)?
        .into_inner()
        .supported_notify_versions;
    if !versions.contains(&1) {
        return Err(NotifyError::Version { versions });
    }
    Ok(Connection {
        client: NotifyClient::new(channel),
    })
}

enum Item {
    Domain(DomainEvent, Value),
    K8s(Value),
}

async fn send(connection: &mut Connection, item: &Item) -> Result<(), NotifyError> {
    let response = match item {
        Item::Domain(event, domain) => {
            let request = DomainEventRequest {
                domain_json: domain.to_string().into_bytes(),
                status_json: Vec::new(),
                event_type: event.as_str().into(),
            };
            tokio::time::timeout(SEND_TIMEOUT, connection.client.handle_domain_event(request)).await
        }
        Item::K8s(event) => {
            let request = K8sEventRequest {
                event_json: event.to_string().into_bytes(),
            };
            tokio::time::timeout(SEND_TIMEOUT, connection.client.handle_k8s_event(request)).await
        }
    };
    let response = response
        .map_err(|_| NotifyError::NoAnswer)?
        .map_err(NotifyError::Call)?
        .into_inner();
    if !response.success && !response.message.is_empty() {
        return Err(NotifyError::Refused {
            message: response.message,
        });
    }
    Ok(())
}

/// Takes the next item: Kubernetes events first (they are about a moment; the domain is about
/// now and is still current when they are through).
fn next(inner: &Inner) -> Option<Item> {
    let mut mailbox = inner.mailbox.lock().expect("mailbox lock");
    if mailbox.k8s_dropped > 0 {
        tracing::warn!(
            dropped = mailbox.k8s_dropped,
            "Kubernetes events dropped while the notify server could not be reached"
        );
        mailbox.k8s_dropped = 0;
    }
    if let Some(event) = mailbox.k8s.pop_front() {
        return Some(Item::K8s(event));
    }
    mailbox.domain.take().map(|(e, d)| Item::Domain(e, d))
}

/// Puts back an item that could not be sent, unless something newer took its place.
fn put_back(inner: &Inner, item: Item) {
    let mut mailbox = inner.mailbox.lock().expect("mailbox lock");
    match item {
        Item::K8s(event) => mailbox.k8s.push_front(event),
        Item::Domain(event, domain) => match &mut mailbox.domain {
            // A newer domain came meanwhile: it is sent instead, as ADDED if this one was.
            Some((newer, _)) => {
                if event == DomainEvent::Added {
                    *newer = DomainEvent::Added;
                }
            }
            None => mailbox.domain = Some((event, domain)),
        },
    }
}

async fn sender(inner: Arc<Inner>) {
    let mut connection: Option<Connection> = None;
    let mut failing_since: Option<Instant> = None;
    let mut warned_at: Option<Instant> = None;
    loop {
        let Some(item) = next(&inner) else {
            inner.drained.send_modify(|n| *n += 1);
            inner.wake.notified().await;
            continue;
        };
        let result = match connection.as_mut() {
            Some(c) => send(c, &item).await,
            None => match connect(&inner.socket).await {
                Ok(c) => send(connection.insert(c), &item).await,
                Err(e) => Err(e),
            },
        };
        match result {
            Ok(()) => {
                if failing_since.take().is_some() {
                    tracing::info!("the notify server is reachable again");
                }
                warned_at = None;
            }
            Err(why) => {
                connection = None;
                put_back(&inner, item);
                let since = *failing_since.get_or_insert_with(Instant::now);
                if warned_at.is_none_or(|w| w.elapsed() >= WARN_EVERY) {
                    tracing::warn!(
                        socket = %inner.socket.display(),
                        failing_for = ?since.elapsed(),
                        "cannot notify virt-handler, trying again: {}",
                        crate::error_chain(&why)
                    );
                    warned_at = Some(Instant::now());
                }
                tokio::time::sleep(RETRY_INTERVAL).await;
            }
        }
    }
}

/// A Kubernetes `core/v1.Event` about the VMI, as KubeVirt's launcher sends it: the handler fills
/// in the rest and records it.
pub(crate) fn k8s_event(
    vmi: &super::domain_json::DomainMeta,
    kind: &str,
    reason: &str,
    message: &str,
) -> Value {
    serde_json::json!({
        "metadata": {},
        "involvedObject": {
            "kind": "VirtualMachineInstance",
            "namespace": vmi.namespace,
            "name": vmi.name,
            "uid": vmi.uid,
            "apiVersion": "kubevirt.io/v1",
        },
        "reason": reason,
        "message": message,
        "source": {},
        "firstTimestamp": null,
        "lastTimestamp": null,
        "eventTime": null,
        "reportingComponent": "",
        "reportingInstance": "",
        "type": kind,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inner() -> Inner {
        Inner {
            socket: "/nonexistent".into(),
            mailbox: Mutex::default(),
            wake: Notify::new(),
            drained: watch::channel(0).0,
        }
    }

    #[test]
    fn a_newer_domain_replaces_one_not_sent_and_keeps_added() {
        let inner = Arc::new(inner());
        let n = Notifier {
            inner: inner.clone(),
        };
        n.domain(DomainEvent::Added, serde_json::json!({"v": 1}));
        n.domain(DomainEvent::Modified, serde_json::json!({"v": 2}));
        let Some(Item::Domain(event, domain)) = next(&inner) else {
            panic!("a domain waits")
        };
        assert_eq!((event, domain["v"].as_i64()), (DomainEvent::Added, Some(2)));
        assert!(next(&inner).is_none());
    }

    #[test]
    fn an_unsent_domain_goes_back_unless_a_newer_one_came() {
        let inner = inner();
        put_back(
            &inner,
            Item::Domain(DomainEvent::Added, serde_json::json!({"v": 1})),
        );
        let Some(Item::Domain(_, d)) = next(&inner) else {
            panic!()
        };
        assert_eq!(d["v"], 1);
        inner.mailbox.lock().unwrap().domain =
            Some((DomainEvent::Modified, serde_json::json!({"v": 3})));
        put_back(
            &inner,
            Item::Domain(DomainEvent::Added, serde_json::json!({"v": 2})),
        );
        let Some(Item::Domain(e, d)) = next(&inner) else {
            panic!()
        };
        assert_eq!((e, d["v"].as_i64()), (DomainEvent::Added, Some(3)));
    }

    #[test]
    fn k8s_events_go_first_in_order_and_are_bounded() {
        let inner = Arc::new(inner());
        let n = Notifier {
            inner: inner.clone(),
        };
        n.domain(DomainEvent::Modified, serde_json::json!({}));
        for i in 0..MAX_K8S_EVENTS + 3 {
            n.k8s_event(serde_json::json!(i));
        }
        let Some(Item::K8s(first)) = next(&inner) else {
            panic!()
        };
        assert_eq!(first, 3);
        for _ in 1..MAX_K8S_EVENTS {
            assert!(matches!(next(&inner), Some(Item::K8s(_))));
        }
        assert!(matches!(next(&inner), Some(Item::Domain(..))));
    }
}
