//! The gRPC front end (`proto/vmlauncher/v1/launcher.proto`) on a unix socket: the server that
//! translates requests into launcher calls, and the client the CLI and tests use. No libvirt or XML
//! knowledge lives here; launcher errors map to status codes.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Endpoint, Server, Uri};
use tonic::{Request, Response};

use std::pin::Pin;
use std::time::Duration;

use tokio_stream::{Stream, StreamExt};

use crate::launcher::{self, EventKind, Launcher, LauncherError, PlannedAction};
use crate::lifecycle::Command;

mod detached;
mod migration;
mod reflection;
pub mod tcp;
mod tcp_limits;
mod to_proto;

use detached::detached;

pub(crate) use migration::Front;
pub(crate) use to_proto::{block_devices_from_proto, block_devices_to_proto, status_to_proto};
use to_proto::{event_to_proto, migration_status_to_proto, volume_to_proto};

/// The generated protobuf and gRPC types.
#[allow(missing_debug_implementations, clippy::all)]
pub mod proto {
    tonic::include_proto!("vmlauncher.v1");
}

use proto::launcher_client::LauncherClient;
use proto::launcher_server::LauncherServer;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("--socket: cannot listen on {path}")]
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
    #[error("--listen: cannot listen on {addr}")]
    ListenTcp {
        addr: std::net::SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("cannot connect to the launcher at {addr}")]
    ConnectTcp {
        addr: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("--tls-dir: the credentials are not usable for TLS")]
    Tls(#[source] tonic::transport::Error),
}

impl ApiError {
    /// The socket path given is refused (something that is not a stale socket is there), rather
    /// than the launcher failing to listen.
    pub fn is_refusal(&self) -> bool {
        matches!(self, Self::Listen { source, .. }
            if matches!(source.kind(), io::ErrorKind::AlreadyExists | io::ErrorKind::AddrInUse))
    }
}

pub(crate) fn to_status(e: &LauncherError) -> tonic::Status {
    use tonic::Code;
    let code = match e {
        _ if e.is_unavailable() => Code::Unavailable,
        LauncherError::InvalidSpec(_)
        | LauncherError::WrongInstance { .. }
        | LauncherError::BlockDevice { .. }
        | LauncherError::NotAHotplugVolume { .. } => Code::InvalidArgument,
        LauncherError::FrozenFieldsChanged { .. }
        | LauncherError::NoMigration
        | LauncherError::Refused(_)
        | LauncherError::Terminating { .. }
        | LauncherError::MigrationEnded { .. }
        | LauncherError::HostFile { .. } => Code::FailedPrecondition,
        LauncherError::Preempted | LauncherError::SyncInterrupted => Code::Aborted,
        LauncherError::InterfaceStuck { .. } => Code::DeadlineExceeded,
        LauncherError::Plan(crate::hotplug::PlanError::NoFreeUnit) => Code::ResourceExhausted,
        LauncherError::Plan(_) => Code::FailedPrecondition,
        LauncherError::HostDisk { .. }
        | LauncherError::BlockVolume { .. }
        | LauncherError::Unreachable
        | LauncherError::Connect(_)
        | LauncherError::Libvirt(_)
        | LauncherError::LiveXml(_)
        | LauncherError::Join(_)
        | LauncherError::SaveSync(_) => Code::Internal,
        LauncherError::MigrationTarget(_) => Code::Aborted,
        LauncherError::MigrationAborted { .. } => Code::Cancelled,
    };
    tonic::Status::new(code, crate::error_chain(e))
}

#[derive(Debug)]
struct Service {
    front: Arc<Front>,
}

impl Service {
    async fn run(
        &self,
        command: Command,
        grace: Option<Duration>,
    ) -> Result<Response<proto::CommandResponse>, tonic::Status> {
        let launcher = self.front.launcher()?;
        let l = launcher.clone();
        let task_id = detached(async move { l.command(command, grace).await }).await?;
        Ok(Response::new(proto::CommandResponse {
            task_id,
            status: Some(status_to_proto(&launcher.status())),
        }))
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<proto::Event, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl proto::launcher_server::Launcher for Service {
    async fn sync(
        &self,
        request: Request<proto::SyncRequest>,
    ) -> Result<Response<proto::SyncResponse>, tonic::Status> {
        let req = request.into_inner();
        let input = launcher::SyncInput {
            block_devices: block_devices_from_proto(req.block_devices)?,
            spec: req.spec,
            dry_run: req.dry_run,
            persist: req.persist.into_iter().collect(),
            ..launcher::SyncInput::default()
        };
        let launcher = self.front.launcher()?;
        let outcome = detached(async move { launcher.sync(input).await }).await?;
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
            interfaces: outcome
                .interfaces
                .iter()
                .map(|c| proto::InterfaceChange {
                    name: c.name.clone(),
                    action: c.action.as_str().into(),
                    error: c.error.clone().unwrap_or_default(),
                })
                .collect(),
            resources: outcome
                .resources
                .iter()
                .map(|c| {
                    // Memory travels in bytes, as everywhere on the wire.
                    let unit = match c.part {
                        launcher::ResourcePart::Cpu => 1,
                        launcher::ResourcePart::Memory => 1024,
                    };
                    proto::ResourceChange {
                        part: c.part.as_str().into(),
                        from: c.from * unit,
                        to: c.to * unit,
                        error: c.error.clone().unwrap_or_default(),
                        at_restart: c.at_restart,
                    }
                })
                .collect(),
        }))
    }

    async fn get_spec(
        &self,
        _request: Request<proto::GetSpecRequest>,
    ) -> Result<Response<proto::GetSpecResponse>, tonic::Status> {
        let input = self.front.launcher()?.last_input();
        Ok(Response::new(proto::GetSpecResponse {
            spec: input.spec,
            block_devices: block_devices_to_proto(&input.block_devices),
            persist: input.persist.into_iter().collect(),
        }))
    }

    async fn get_status(
        &self,
        _request: Request<proto::GetStatusRequest>,
    ) -> Result<Response<proto::Status>, tonic::Status> {
        Ok(Response::new(status_to_proto(&self.front.status())))
    }

    async fn start(
        &self,
        _: Request<proto::CommandRequest>,
    ) -> Result<Response<proto::CommandResponse>, tonic::Status> {
        self.run(Command::Start, None).await
    }

    async fn pause(
        &self,
        _: Request<proto::CommandRequest>,
    ) -> Result<Response<proto::CommandResponse>, tonic::Status> {
        self.run(Command::Pause, None).await
    }

    async fn unpause(
        &self,
        _: Request<proto::CommandRequest>,
    ) -> Result<Response<proto::CommandResponse>, tonic::Status> {
        self.run(Command::Unpause, None).await
    }

    async fn soft_reboot(
        &self,
        _: Request<proto::CommandRequest>,
    ) -> Result<Response<proto::CommandResponse>, tonic::Status> {
        self.run(Command::SoftReboot, None).await
    }

    async fn reset(
        &self,
        _: Request<proto::CommandRequest>,
    ) -> Result<Response<proto::CommandResponse>, tonic::Status> {
        self.run(Command::Reset, None).await
    }

    async fn shutdown(
        &self,
        request: Request<proto::ShutdownRequest>,
    ) -> Result<Response<proto::CommandResponse>, tonic::Status> {
        let grace = request
            .into_inner()
            .grace_period_seconds
            .map(|s| Duration::from_secs(s.into()));
        self.run(Command::Shutdown, grace).await
    }

    async fn kill(
        &self,
        _: Request<proto::CommandRequest>,
    ) -> Result<Response<proto::CommandResponse>, tonic::Status> {
        self.run(Command::Kill, None).await
    }

    type WatchEventsStream = EventStream;

    async fn watch_events(
        &self,
        _request: Request<proto::WatchEventsRequest>,
    ) -> Result<Response<Self::WatchEventsStream>, tonic::Status> {
        let front = self.front.clone();
        let (tx, out) = tokio::sync::mpsc::channel(64);
        tokio::spawn(async move {
            // A migration target without its VM yet: its waiting status first, then the
            // launcher's stream once the VM is here.
            if front.current().is_none() {
                let waiting = launcher::LauncherEvent {
                    seq: 0,
                    kind: EventKind::Resync(Box::new(front.status())),
                };
                if tx.send(Ok(event_to_proto(waiting))).await.is_err() {
                    return;
                }
            }
            let launcher = tokio::select! {
                l = front.wait() => l,
                () = tx.closed() => return,
            };
            let (first, mut rx) = launcher.watch_events();
            let mut closing = launcher.closing();
            if tx.send(Ok(event_to_proto(first))).await.is_err() {
                return;
            }
            loop {
                let received = tokio::select! {
                    received = rx.recv() => received,
                    // The launcher is going away: end the stream so the server can stop.
                    _ = closing.wait_for(|c| *c) => return,
                };
                let event = match received {
                    Ok(e) => e,
                    // Fell behind: the full status replaces what was missed.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::info!(missed, "event subscriber fell behind; sending a resync");
                        launcher.resync_event()
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                };
                if tx.send(Ok(event_to_proto(event))).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(out),
        )))
    }

    async fn migrate(
        &self,
        request: Request<proto::MigrateRequest>,
    ) -> Result<Response<proto::MigrateResponse>, tonic::Status> {
        let launcher = self.front.launcher()?;
        let tls = launcher.migration_credentials();
        let req = migration::migrate_request(request.into_inner(), tls)?;
        let (task_id, status) = detached(async move { launcher.migrate(req).await }).await?;
        Ok(Response::new(proto::MigrateResponse {
            task_id,
            migration: Some(migration_status_to_proto(&status)),
        }))
    }

    async fn cancel_migration(
        &self,
        _: Request<proto::CommandRequest>,
    ) -> Result<Response<proto::CommandResponse>, tonic::Status> {
        let launcher = self.front.launcher()?;
        launcher.cancel_migration().map_err(|e| to_status(&e))?;
        Ok(Response::new(proto::CommandResponse {
            task_id: launcher.status().task.map(|t| t.id).unwrap_or_default(),
            status: Some(status_to_proto(&launcher.status())),
        }))
    }

    async fn prepare_migration_target(
        &self,
        request: Request<proto::PrepareMigrationTargetRequest>,
    ) -> Result<Response<proto::PrepareMigrationTargetResponse>, tonic::Status> {
        self.front
            .prepare_target(request.into_inner())
            .await
            .map(Response::new)
    }
}

/// What is at the socket path before the launcher binds it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum SocketPath {
    /// Nothing: the path is free.
    Free,
    /// A socket no one answers on (a launcher that died): `bind` replaces it.
    Stale,
}

/// Checks that the launcher may bind `path`: nothing there, or a stale socket. A file, a
/// directory or a socket someone still answers on is refused. `run` checks this
/// before it starts anything, and `bind` again when it binds.
pub(crate) fn check_socket_path(path: &Path) -> Result<SocketPath, ApiError> {
    use std::os::unix::fs::FileTypeExt;
    let listen_err = |source| ApiError::Listen {
        path: path.into(),
        source,
    };
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(SocketPath::Free),
        Err(e) => Err(listen_err(e)),
        Ok(meta) if !meta.file_type().is_socket() => Err(listen_err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "something other than a socket is there; not removing it",
        ))),
        Ok(_) => match answers(path) {
            Ok(false) => Ok(SocketPath::Stale),
            Ok(true) => Err(listen_err(io::Error::new(
                io::ErrorKind::AddrInUse,
                "another process answers on this socket",
            ))),
            Err(e) => Err(listen_err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("cannot tell whether anyone answers on this socket ({e}); not removing it"),
            ))),
        },
    }
}

/// Whether a process listens on the stream socket at `path`, found without waiting. Only
/// ECONNREFUSED means no one does (the listener is gone): any other failure (a datagram socket,
/// no permission, ...) says nothing about it and is returned. The connect is non-blocking: a
/// blocking one waits as long as a live listener's backlog stays full, where EAGAIN answers at
/// once that someone listens.
fn answers(path: &Path) -> io::Result<bool> {
    use nix::errno::Errno;
    use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
    use std::os::fd::AsRawFd;
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    match connect(fd.as_raw_fd(), &UnixAddr::new(path)?) {
        Ok(()) | Err(Errno::EAGAIN) => Ok(true),
        Err(Errno::ECONNREFUSED) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Binds the socket (mode 0600) and returns a listener to serve on. What is at `path` already is
/// replaced only if it is a stale socket ([`check_socket_path`]), never unlinked otherwise.
pub(crate) fn bind(path: &Path) -> Result<UnixListener, ApiError> {
    let listen_err = |source| ApiError::Listen {
        path: path.into(),
        source,
    };
    if check_socket_path(path)? == SocketPath::Stale {
        fs::remove_file(path).map_err(listen_err)?;
    }
    // Created 0600 by the umask, and never chmod'ed after: no window in which anyone else may
    // connect, and no path-based chmod that a symlink swapped in after the bind
    // would redirect (fchmod cannot help: on a socket's fd it changes the socket, not the
    // node). The umask is the process's: a file another thread makes during the bind gets at
    // most 0600 (a directory 0700), stricter than meant and never looser.
    let umask = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let bound = UnixListener::bind(path);
    nix::sys::stat::umask(umask);
    bound.map_err(listen_err)
}

/// Whether a connection is served: not one from QEMU's user (`qemu_uid`, unless QEMU runs as
/// root), which is what a guest that escaped into QEMU acts as. The socket's mode (0600, root's)
/// keeps that user out already; this still holds where a deployment widens the socket or its
/// directory (a pod's shared emptyDir).
pub(crate) fn admitted(qemu_uid: u32) -> impl FnMut(&std::io::Result<UnixStream>) -> bool {
    move |connection| {
        let Ok(stream) = connection else { return true };
        match stream.peer_cred() {
            Ok(peer) if qemu_uid != 0 && peer.uid() == qemu_uid => {
                tracing::warn!(pid = ?peer.pid(), uid = peer.uid(), "refused a connection from QEMU's user");
                false
            }
            _ => true,
        }
    }
}

/// Serves the launcher's API on `listener` until `shutdown` resolves; connections from
/// `qemu_uid` are closed unanswered ([`admitted`]).
pub(crate) async fn serve(
    front: Arc<Front>,
    listener: UnixListener,
    qemu_uid: u32,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ApiError> {
    // Every connection goes through the authority fix: stock C-core and Java clients send the
    // socket path as `:authority`, which the HTTP/2 layer would refuse.
    let incoming = UnixListenerStream::new(listener)
        .filter(admitted(qemu_uid))
        .map(|connection| connection.map(crate::authority::FixAuthority::new));
    services(Server::builder(), front)
        .await
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .map_err(ApiError::Serve)
}

/// Every service of the launcher's API on `builder`: the launcher's, health, reflection.
async fn services<L>(
    mut builder: Server<L>,
    front: Arc<Front>,
) -> tonic::transport::server::Router<L>
where
    L: Clone,
{
    let (health, health_service) = tonic_health::server::health_reporter();
    // The first status is set before the server answers anything ("" starts as SERVING).
    let first = serving(&front.status());
    set_health(&health, first).await;
    let health_front = front.clone();
    tokio::spawn(async move {
        let launcher = health_front.wait().await;
        report_health(launcher, health, first).await
    });
    let (reflection_v1, reflection_v1alpha) = reflection::services();
    builder
        .add_service(LauncherServer::new(Service { front }))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
}

/// The encoded descriptors of `launcher.proto`, for server reflection.
const DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("vmlauncher_descriptor");

/// Whether the launcher serves, in `grpc.health.v1` terms, for the whole server ("") and for the
/// Launcher service: SERVING once the domain is up (phase Running), NOT_SERVING before that and
/// from the moment the launcher is terminating or the VM is final.
pub(crate) fn serving(status: &launcher::Status) -> bool {
    status.phase == crate::lifecycle::Phase::Running
        && status.printable_status != crate::lifecycle::PrintableStatus::Terminating
        && !status.finished
}

async fn set_health(health: &tonic_health::server::HealthReporter, serving: bool) {
    use tonic::server::NamedService;
    use tonic_health::ServingStatus;
    let status = if serving {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    };
    for name in ["", <LauncherServer<Service> as NamedService>::NAME] {
        health.set_service_status(name, status).await;
    }
}

async fn report_health(
    launcher: Arc<Launcher>,
    health: tonic_health::server::HealthReporter,
    mut last: bool,
) {
    // Health follows the phase: woken by the course only, not by each volume's progress.
    let mut changes = launcher.subscribe_course();
    let mut closing = launcher.closing();
    loop {
        let now = serving(&changes.borrow_and_update()) && !*closing.borrow_and_update();
        if now != last {
            set_health(&health, now).await;
            last = now;
        }
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return },
            changed = closing.changed() => if changed.is_err() { return },
        }
    }
}

/// A client for the launcher listening on the unix socket `path`.
pub async fn connect(path: &Path) -> Result<LauncherClient<Channel>, ApiError> {
    Ok(LauncherClient::new(channel(path).await?))
}

/// A connection to the server listening on the unix socket `path`, for any of its services
/// (the launcher's, `grpc.health.v1`, reflection).
pub async fn channel(path: &Path) -> Result<Channel, ApiError> {
    let socket = path.to_path_buf();
    // The URI is required by the API but unused: every connection goes to the socket.
    Endpoint::from_static("http://[::1]:50051")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move { Ok::<_, io::Error>(TokioIo::new(UnixStream::connect(socket).await?)) }
        }))
        .await
        .map_err(|source| ApiError::Connect {
            path: path.into(),
            source,
        })
}

#[cfg(test)]
mod bind_tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[tokio::test]
    async fn bind_replaces_only_a_stale_socket() {
        let tmp = tempfile::tempdir().unwrap();
        // A regular file at the path (`--socket /etc/hosts`) is refused and left alone.
        let file = tmp.path().join("file");
        fs::write(&file, "precious").unwrap();
        assert!(bind(&file).is_err());
        assert_eq!(fs::read_to_string(&file).unwrap(), "precious");

        // A socket someone answers on is refused; once it is stale it is replaced.
        let sock = tmp.path().join("launcher.sock");
        let first = bind(&sock).unwrap();
        let err = bind(&sock).unwrap_err();
        assert!(crate::error_chain(&err).contains("answers"), "{err}");
        drop(first);
        bind(&sock).unwrap();
        assert_eq!(
            fs::metadata(&sock).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }

    #[tokio::test]
    async fn a_listener_with_a_full_backlog_is_refused_without_waiting() {
        use nix::sys::socket::{
            bind, listen, socket, AddressFamily, Backlog, SockFlag, SockType, UnixAddr,
        };
        let tmp = tempfile::tempdir().unwrap();
        let sock = tmp.path().join("busy.sock");
        let listener = socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        bind(
            std::os::fd::AsRawFd::as_raw_fd(&listener),
            &UnixAddr::new(&sock).unwrap(),
        )
        .unwrap();
        // A backlog of 0 holds one connection that is never accepted: then it is full.
        listen(&listener, Backlog::new(0).unwrap()).unwrap();
        let _queued = std::os::unix::net::UnixStream::connect(&sock).unwrap();
        let path = sock.clone();
        let err =
            crate::testing::without_blocking("checking a busy listener's socket", move || {
                check_socket_path(&path)
            })
            .unwrap_err();
        assert!(crate::error_chain(&err).contains("answers"), "{err}");
        assert!(err.is_refusal());
    }

    #[tokio::test]
    async fn a_socket_that_cannot_say_whether_anyone_listens_is_refused_and_kept() {
        let tmp = tempfile::tempdir().unwrap();
        // A datagram socket: a stream connect fails with EPROTOTYPE, not ECONNREFUSED.
        let sock = tmp.path().join("dgram.sock");
        let _other = std::os::unix::net::UnixDatagram::bind(&sock).unwrap();
        let err = bind(&sock).unwrap_err();
        assert!(err.is_refusal(), "{err}");
        assert!(crate::error_chain(&err).contains("cannot tell"), "{err}");
        assert!(fs::symlink_metadata(&sock).is_ok());
    }
}
