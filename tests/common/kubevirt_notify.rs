//! virt-handler's side of notify, for tests that check what the launcher tells it: a
//! `kubevirt.notify.v1.Notify` server (generated from KubeVirt's protos) on
//! `<share>/domain-notify-pipe.sock`, handing every event to the test in order.

use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use vmlauncher::kubevirt::proto::notify::notify_server::{Notify, NotifyServer};
use vmlauncher::kubevirt::proto::notify::{DomainEventRequest, K8sEventRequest, Response};
use vmlauncher::kubevirt::proto::notify_info::notify_info_server::{NotifyInfo, NotifyInfoServer};
use vmlauncher::kubevirt::proto::notify_info::{NotifyInfoRequest, NotifyInfoResponse};

/// One notify call, as the handler received it.
#[derive(Debug, Clone)]
pub enum Received {
    Domain {
        event_type: String,
        domain: serde_json::Value,
    },
    K8s(serde_json::Value),
}

struct Server(mpsc::Sender<Received>);

#[tonic::async_trait]
impl Notify for Server {
    async fn handle_domain_event(
        &self,
        request: tonic::Request<DomainEventRequest>,
    ) -> Result<tonic::Response<Response>, tonic::Status> {
        let r = request.into_inner();
        let domain = serde_json::from_slice(&r.domain_json)
            .map_err(|e| tonic::Status::invalid_argument(e.to_string()))?;
        let _ = self.0.send(Received::Domain {
            event_type: r.event_type,
            domain,
        });
        Ok(tonic::Response::new(Response {
            success: true,
            message: String::new(),
        }))
    }

    async fn handle_k8s_event(
        &self,
        request: tonic::Request<K8sEventRequest>,
    ) -> Result<tonic::Response<Response>, tonic::Status> {
        let event = serde_json::from_slice(&request.into_inner().event_json)
            .map_err(|e| tonic::Status::invalid_argument(e.to_string()))?;
        let _ = self.0.send(Received::K8s(event));
        Ok(tonic::Response::new(Response {
            success: true,
            message: String::new(),
        }))
    }
}

struct Info;

#[tonic::async_trait]
impl NotifyInfo for Info {
    async fn info(
        &self,
        _: tonic::Request<NotifyInfoRequest>,
    ) -> Result<tonic::Response<NotifyInfoResponse>, tonic::Status> {
        Ok(tonic::Response::new(NotifyInfoResponse {
            supported_notify_versions: vec![1],
        }))
    }
}

/// The notify server, serving on its own thread for as long as it lives.
pub struct NotifyRecorder {
    events: mpsc::Receiver<Received>,
    pub seen: Vec<Received>,
}

impl NotifyRecorder {
    /// Serves at `<share>/domain-notify-pipe.sock`.
    pub fn serve(share: &Path) -> NotifyRecorder {
        let socket = share.join("domain-notify-pipe.sock");
        let (tx, events) = mpsc::channel();
        let (ready_tx, ready) = mpsc::channel();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::UnixListener::bind(&socket).unwrap();
                let _ = ready_tx.send(());
                let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
                tonic::transport::Server::builder()
                    .add_service(NotifyServer::new(Server(tx)))
                    .add_service(NotifyInfoServer::new(Info))
                    .serve_with_incoming(incoming)
                    .await
                    .unwrap();
            });
        });
        ready
            .recv_timeout(Duration::from_secs(10))
            .expect("the notify server listens");
        NotifyRecorder {
            events,
            seen: Vec::new(),
        }
    }

    /// Waits for the next notify call until `deadline`; false if none came. What a test that
    /// polls the launcher's state waits on between two looks: every change is notified.
    pub fn next_event(&mut self, deadline: Instant) -> bool {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.events.recv_timeout(left) {
            Ok(r) => {
                self.seen.push(r);
                true
            }
            Err(_) => false,
        }
    }

    /// The first domain event that `wanted` accepts, among those received so far or within
    /// `within`.
    pub fn domain(
        &mut self,
        what: &str,
        within: Duration,
        mut wanted: impl FnMut(&str, &serde_json::Value) -> bool,
    ) -> serde_json::Value {
        for r in &self.seen {
            if let Received::Domain { event_type, domain } = r {
                if wanted(event_type, domain) {
                    return domain.clone();
                }
            }
        }
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(r) => {
                    self.seen.push(r.clone());
                    if let Received::Domain { event_type, domain } = r {
                        if wanted(&event_type, &domain) {
                            return domain;
                        }
                    }
                }
                Err(_) => panic!(
                    "no notify {what} within {within:?}; received: {:#?}",
                    self.seen
                ),
            }
        }
    }
}
