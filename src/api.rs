//! The gRPC front end (`proto/vmlauncher/v1/launcher.proto`) on a unix socket: the server that
//! translates requests into launcher calls, and the client the CLI and tests use. No libvirt or XML
//! knowledge lives here; launcher errors map to status codes.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Endpoint, Server, Uri};
use tonic::{Request, Response};

use crate::launcher::{self, Launcher, LauncherError, PlannedAction, VolumePhase};

/// The generated protobuf and gRPC types.
#[allow(missing_debug_implementations, clippy::all)]
pub mod proto {
    tonic::include_proto!("vmlauncher.v1");
}

use proto::launcher_client::LauncherClient;
use proto::launcher_server::LauncherServer;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("cannot listen on {path}")]
    Listen {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot connect to the launcher at {path}")]
    Connect {
        path: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("the gRPC server failed")]
    Serve(#[source] tonic::transport::Error),
}

fn to_status(e: LauncherError) -> tonic::Status {
    use tonic::Code;
    let code = match &e {
        LauncherError::InvalidSpec(_) | LauncherError::WrongInstance { .. } => {
            Code::InvalidArgument
        }
        LauncherError::FrozenFieldsChanged { .. } | LauncherError::NotRunning { .. } => {
            Code::FailedPrecondition
        }
        LauncherError::Plan(crate::hotplug::PlanError::NoFreeUnit) => Code::ResourceExhausted,
        LauncherError::Plan(_) => Code::FailedPrecondition,
        LauncherError::Libvirt(l) if l.is_unavailable() => Code::Unavailable,
        LauncherError::HostDisk { .. }
        | LauncherError::Libvirt(_)
        | LauncherError::LiveXml(_)
        | LauncherError::Join(_) => Code::Internal,
    };
    tonic::Status::new(code, crate::error_chain(&e))
}

fn volume_to_proto(v: &launcher::VolumeStatus) -> proto::VolumeStatus {
    use proto::volume_status::Phase;
    proto::VolumeStatus {
        name: v.name.clone(),
        target: v.target.clone(),
        serial: v.serial.clone(),
        bus: v.bus.clone(),
        phase: match v.phase {
            VolumePhase::Pending => Phase::Pending,
            VolumePhase::Attaching => Phase::Attaching,
            VolumePhase::Ready => Phase::Ready,
            VolumePhase::Detaching => Phase::Detaching,
            VolumePhase::Failed => Phase::Failed,
        } as i32,
        reason: v.reason.clone(),
        message: v.message.clone(),
        boot: v.boot,
    }
}

pub fn status_to_proto(s: &launcher::Status) -> proto::Status {
    proto::Status {
        phase: s.phase.as_str().into(),
        printable_status: s.printable_status.into(),
        power_state: s
            .power_state
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        vm_state: s.vm_state.into(),
        task_state: s.task_state.unwrap_or_default().into(),
        conditions: s
            .conditions
            .iter()
            .map(|(kind, status, reason, message)| proto::Condition {
                r#type: kind.clone(),
                status: *status,
                reason: reason.clone(),
                message: message.clone(),
            })
            .collect(),
        volumes: s.volumes.iter().map(volume_to_proto).collect(),
        domain_name: s.domain_name.clone(),
        libvirt_uri: s.libvirt_uri.clone(),
    }
}

#[derive(Debug)]
struct Service {
    launcher: Arc<Launcher>,
}

#[tonic::async_trait]
impl proto::launcher_server::Launcher for Service {
    async fn sync(
        &self,
        request: Request<proto::SyncRequest>,
    ) -> Result<Response<proto::SyncResponse>, tonic::Status> {
        let req = request.into_inner();
        let outcome = self
            .launcher
            .sync(&req.spec, req.dry_run)
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::SyncResponse {
            plan: outcome
                .plan
                .iter()
                .map(|c| proto::PlannedChange {
                    action: match c.action {
                        PlannedAction::Attach => proto::planned_change::Action::Attach,
                        PlannedAction::Detach => proto::planned_change::Action::Detach,
                    } as i32,
                    volume: c.volume.clone(),
                    target: c.target.clone(),
                })
                .collect(),
            volumes: outcome.volumes.iter().map(volume_to_proto).collect(),
        }))
    }

    async fn get_status(
        &self,
        _request: Request<proto::GetStatusRequest>,
    ) -> Result<Response<proto::Status>, tonic::Status> {
        Ok(Response::new(status_to_proto(&self.launcher.status())))
    }
}

/// Binds the socket (mode 0600, replacing a stale one) and returns a listener to serve on.
pub fn bind(path: &Path) -> Result<UnixListener, ApiError> {
    let listen_err = |source| ApiError::Listen {
        path: path.into(),
        source,
    };
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(listen_err(e)),
    }
    let listener = UnixListener::bind(path).map_err(listen_err)?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600)).map_err(listen_err)?;
    Ok(listener)
}

/// Serves the launcher's API on `listener` until `shutdown` resolves.
pub async fn serve(
    launcher: Arc<Launcher>,
    listener: UnixListener,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ApiError> {
    Server::builder()
        .add_service(LauncherServer::new(Service { launcher }))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await
        .map_err(ApiError::Serve)
}

/// A client for the launcher listening on the unix socket `path`.
pub async fn connect(path: &Path) -> Result<LauncherClient<Channel>, ApiError> {
    let socket = path.to_path_buf();
    // The URI is required by the API but unused: every connection goes to the socket.
    let channel = Endpoint::from_static("http://[::1]:50051")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move { Ok::<_, io::Error>(TokioIo::new(UnixStream::connect(socket).await?)) }
        }))
        .await
        .map_err(|source| ApiError::Connect {
            path: path.into(),
            source,
        })?;
    Ok(LauncherClient::new(channel))
}
