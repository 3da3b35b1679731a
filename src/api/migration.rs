//! The API's side of a migration: what it serves before a migration target has a VM (`Front`),
//! the source's call to its target (`PrepareMigrationTarget`), and the wire form of a migration's
//! status.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};

use super::proto;
use tonic::transport::Channel;

use super::proto::launcher_client::LauncherClient;
use super::tcp::TcpTarget;
use crate::launcher::{
    self, IncomingOffer, IncomingPlan, Launcher, MigrateRequest, PrepareTarget, TargetError,
};
use crate::migration_tls::MigrationTls;

/// A source's offer and where the target's answer goes (a refusal as the source's call returns
/// it, so that the target keeps its typed error for its own exit).
pub(crate) type Offer = (
    IncomingOffer,
    oneshot::Sender<Result<IncomingPlan, tonic::Status>>,
);

/// What the API serves: the launcher once there is one. Before that (a migration target waiting
/// for its source) it shows a waiting status and takes the source's offer.
#[derive(Debug)]
pub(crate) struct Front {
    launcher: watch::Sender<Option<Arc<Launcher>>>,
    waiting: Option<Waiting>,
}

#[derive(Debug)]
struct Waiting {
    status: launcher::Status,
    offers: mpsc::Sender<Offer>,
}

impl Front {
    /// The API of a launcher that has its VM.
    pub(crate) fn ready(launcher: Arc<Launcher>) -> Arc<Front> {
        Arc::new(Front {
            launcher: watch::channel(Some(launcher)).0,
            waiting: None,
        })
    }

    /// The API of a migration target: offers come out of the receiver, one at a time (a
    /// second source waits for the first's answer).
    pub(crate) fn incoming(libvirt_uri: &str) -> (Arc<Front>, mpsc::Receiver<Offer>) {
        let (offers, rx) = mpsc::channel(1);
        let front = Front {
            launcher: watch::channel(None).0,
            waiting: Some(Waiting {
                status: launcher::waiting_status(libvirt_uri),
                offers,
            }),
        };
        (Arc::new(front), rx)
    }

    /// The VM is here: from now on every call goes to its launcher.
    pub(crate) fn set(&self, launcher: Arc<Launcher>) {
        self.launcher.send_replace(Some(launcher));
    }

    pub(crate) fn current(&self) -> Option<Arc<Launcher>> {
        self.launcher.borrow().clone()
    }

    /// The launcher, once there is one.
    pub(crate) async fn wait(&self) -> Arc<Launcher> {
        let mut rx = self.launcher.subscribe();
        let ready = rx.wait_for(Option::is_some).await;
        ready
            .ok()
            .and_then(|l| l.clone())
            .unwrap_or_else(|| unreachable!("the front holds its own sender"))
    }

    pub(super) fn launcher(&self) -> Result<Arc<Launcher>, tonic::Status> {
        self.current().ok_or_else(|| {
            tonic::Status::failed_precondition(
                "no VM here yet: this launcher waits for an incoming migration",
            )
        })
    }

    pub(super) fn status(&self) -> launcher::Status {
        match (self.current(), &self.waiting) {
            (Some(l), _) => l.status(),
            (None, Some(w)) => w.status.clone(),
            (None, None) => unreachable!("a front is ready or waiting"),
        }
    }

    /// A source's `PrepareMigrationTarget`: handed to whoever waits for offers (`run`).
    pub(super) async fn prepare_target(
        &self,
        req: proto::PrepareMigrationTargetRequest,
    ) -> Result<proto::PrepareMigrationTargetResponse, tonic::Status> {
        let Some(waiting) = self.waiting.as_ref().filter(|_| self.current().is_none()) else {
            return Err(tonic::Status::failed_precondition(
                "this launcher has a VM: only one started with `run --incoming` and no VM yet takes a migration",
            ));
        };
        let offer = IncomingOffer {
            input: launcher::SyncInput {
                spec: req.spec,
                block_devices: super::block_devices_from_proto(req.block_devices)?,
                ..launcher::SyncInput::default()
            },
            domain_name: req.domain_name,
            source_runtime_dir: req.source_runtime_dir.into(),
            source_hotplug_dir: req.source_hotplug_dir.into(),
        };
        let (tx, rx) = oneshot::channel();
        waiting
            .offers
            .send((offer, tx))
            .await
            .map_err(|_| tonic::Status::unavailable("the launcher is going away"))?;
        let plan = rx
            .await
            .map_err(|_| tonic::Status::unavailable("the launcher is going away"))??;
        Ok(proto::PrepareMigrationTargetResponse {
            libvirt_uri: plan.libvirt_uri,
            migration_uri: plan.migration_uri,
            disks_uri: plan.disks_uri,
            runtime_dir: plan.runtime_dir.display().to_string(),
            hotplug_dir: plan.hotplug_dir.display().to_string(),
            listen_address: plan.listen_address.unwrap_or_default(),
            pins: plan
                .pins
                .into_iter()
                .map(|(volume, pin)| (volume, pin.display().to_string()))
                .collect(),
        })
    }
}

/// The source's request, with the call that prepares the target: over its API socket, or over
/// TCP under mutual TLS with the credentials of `tls` (`target` is then `HOST:PORT`).
pub(super) fn migrate_request(
    req: proto::MigrateRequest,
    tls: Option<MigrationTls>,
) -> Result<MigrateRequest, tonic::Status> {
    let prepare: PrepareTarget =
        match (TcpTarget::parse(&req.target), tls) {
            (Some(tcp), Some(tls)) => Box::new(move |offer| {
                Box::pin(async move {
                    let client = super::tcp::connect(&tcp, &tls).await.map_err(|e| {
                        TargetError::Unreachable {
                            target: tcp.to_string(),
                            reason: crate::error_chain(&e),
                        }
                    })?;
                    let plan = prepare_remote(client, tcp.to_string(), offer).await?;
                    plan.dialled_over_tcp(&tcp.host, tcp.port)
                })
            }),
            (Some(_), None) => return Err(tonic::Status::failed_precondition(
                "a migration to HOST:PORT goes over TCP under TLS: this launcher needs --tls-dir",
            )),
            (None, _) => {
                let target = PathBuf::from(&req.target);
                Box::new(move |offer| {
                    Box::pin(async move {
                        let client = super::connect(&target).await.map_err(|e| {
                            TargetError::Unreachable {
                                target: target.display().to_string(),
                                reason: crate::error_chain(&e),
                            }
                        })?;
                        prepare_remote(client, target.display().to_string(), offer)
                            .await?
                            .dialled_locally()
                    })
                })
            }
        };
    Ok(MigrateRequest {
        target: req.target,
        prepare,
        timeout: (req.timeout_seconds > 0).then(|| Duration::from_secs(req.timeout_seconds.into())),
        bandwidth_mib: (req.bandwidth_mib > 0).then_some(req.bandwidth_mib),
    })
}

/// Asks the target `named` through `client` to prepare for `offer`.
async fn prepare_remote(
    mut client: LauncherClient<Channel>,
    named: String,
    offer: IncomingOffer,
) -> Result<IncomingPlan, TargetError> {
    let reply = client
        .prepare_migration_target(proto::PrepareMigrationTargetRequest {
            spec: offer.input.spec,
            block_devices: super::block_devices_to_proto(&offer.input.block_devices),
            domain_name: offer.domain_name,
            source_runtime_dir: offer.source_runtime_dir.display().to_string(),
            source_hotplug_dir: offer.source_hotplug_dir.display().to_string(),
        })
        .await
        .map_err(|s| TargetError::Unreachable {
            target: named,
            reason: s.message().to_string(),
        })?
        .into_inner();
    Ok(IncomingPlan {
        libvirt_uri: reply.libvirt_uri,
        migration_uri: reply.migration_uri,
        disks_uri: reply.disks_uri,
        runtime_dir: reply.runtime_dir.into(),
        hotplug_dir: reply.hotplug_dir.into(),
        listen_address: Some(reply.listen_address).filter(|a| !a.is_empty()),
        pins: reply
            .pins
            .into_iter()
            .map(|(volume, pin)| (volume, pin.into()))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(target: &str) -> proto::MigrateRequest {
        proto::MigrateRequest {
            target: target.into(),
            timeout_seconds: 0,
            bandwidth_mib: 0,
        }
    }

    #[test]
    fn a_tcp_target_needs_credentials_and_a_socket_path_does_not() {
        let refused = migrate_request(request("node-2.example:7100"), None).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
        assert!(refused.message().contains("--tls-dir"), "{refused:?}");
        let local = migrate_request(request("/run/vm2/launcher.sock"), None).unwrap();
        assert_eq!(local.target, "/run/vm2/launcher.sock");
    }
}
