//! `vmlauncher virt-launcher`: the launcher as KubeVirt's pod runs it. It starts with no VM, its
//! private libvirtd up, and serves the cmd socket at `<share>/sockets/launcher-init-sock`, renamed
//! to `launcher-sock` once it serves (virt-handler's only readiness signal). virt-handler's first
//! Sync creates the VM. The domain follower tells virt-handler every change over notify. SIGTERM
//! marks the VM for graceful shutdown, notifies, then stops the guest within its grace period;
//! the launcher exits once the VM is over and virt-handler has been told.

use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio_stream::wrappers::UnixListenerStream;
use tokio_stream::StreamExt;

use super::domain_json::{self, DomainMeta};
use super::flags::VirtLauncherFlags;
use super::front::{now_rfc3339, Front, Meta};
use super::notify::{self, DomainEvent, Notifier};
use super::proto::cmd::cmd_server::CmdServer;
use super::proto::cmd_info::cmd_info_server::CmdInfoServer;
use super::server::{CmdService, InfoService};
use crate::ended::Ended;
use crate::launcher::{EventKind, Launcher};
use crate::run::{self, HostRequest, RuntimeDir, SetupError};
use crate::volumes::HostPaths;

/// Socket names of KubeVirt's handler/launcher contract.
pub(crate) const INIT_SOCKET: &str = "launcher-init-sock";
pub const READY_SOCKET: &str = "launcher-sock";
pub(crate) const NOTIFY_SOCKET: &str = "domain-notify-pipe.sock";
/// How long a VM that is over waits for virt-handler's Delete before the launcher exits anyway
/// (KubeVirt's launcher waits for its final notification about as long).
const FINAL_DELETE_WAIT: Duration = Duration::from_secs(30);

/// Why `virt-launcher` failed before its VM ended.
#[derive(Debug, thiserror::Error)]
pub enum VirtLauncherError {
    #[error(transparent)]
    Setup(#[from] run::SetupError),
    #[error("cannot start libvirtd")]
    Libvirtd(#[source] crate::libvirt::ConnectError),
    /// Its panic message is on stderr already.
    #[error("a libvirt call panicked")]
    Panicked(tokio::task::JoinError),
    /// The cmd socket; said without its cause, as always.
    #[error("{0}")]
    Serve(crate::api::ApiError),
    #[error("no domain was created within --qemu-timeout {}s", .qemu_timeout.as_secs())]
    NoDomain { qemu_timeout: Duration },
    /// The launcher's status is no longer published (it has gone).
    #[error("the launcher's status went away")]
    StatusClosed,
}

/// Runs the launcher until its VM is over, or until SIGTERM has stopped it.
pub async fn virt_launcher(flags: VirtLauncherFlags) -> Result<Ended, VirtLauncherError> {
    warn_not_built(&flags);
    let mut term = signal(SignalKind::terminate()).map_err(|_| SetupError::Signals)?;
    let mut int = signal(SignalKind::interrupt()).map_err(|_| SetupError::Signals)?;
    // KubeVirt's QEMU user (107 in its images and in vmlauncher's): it owns what virt-handler
    // hot-plugs for the pod.
    let qemu_user = run::qemu_user(None).map_err(SetupError::QemuUser)?;
    let qemu_uid = qemu_user.uid;
    let (rt, _lock) = RuntimeDir::claim(&flags.runtime_dir).map_err(SetupError::RuntimeDir)?;
    let paths = pod_paths(&flags);
    let host_paths = run::host_path_policy(&rt, &paths, flags.qemu_cache_dir.as_deref(), &[])
        .reached_by(&qemu_user);
    // Before libvirtd and QEMU start in this cgroup.
    let _loopback = close_pod_loopback(&rt, qemu_uid);
    let prepared = run::prepare(HostRequest {
        rt: &rt,
        connect: None,
        qemu_cache_dir: flags.qemu_cache_dir.clone(),
        paths,
        emulation: flags.emulation(),
        network: crate::convert::NetworkMode::Pod,
        publish: Default::default(),
        log_max_size: crate::logs::DEFAULT_MAX_SIZE,
        resync_interval: Duration::from_secs(30),
        reconnect_timeout: None,
        host_paths,
        qemu_user: qemu_user.clone(),
        // virt-handler makes the node of each block volume it hot-plugs in the hotplug dir.
        block_allow: crate::host::block_allow::BlockAllowList::new([], true),
        // KubeVirt's handler migrates through its own proxies, on unix sockets.
        migration_tls: None,
        previous_qemu_id: None,
    });
    let _logs = prepared.logs;
    // libvirtd is up before the launcher says it is ready, as KubeVirt's is: the first Sync
    // then only defines and starts.
    let c = prepared.connector.clone();
    tokio::task::spawn_blocking(move || c.ensure_daemons())
        .await
        .map_err(VirtLauncherError::Panicked)?
        .map_err(VirtLauncherError::Libvirtd)?;
    let share = flags.kubevirt_share_dir.clone();
    let front = Arc::new(Front::new(
        flags,
        prepared.base,
        prepared.connector.clone(),
        prepared.events,
        qemu_user,
    ));
    let sockets = share.join("sockets");
    let (stop_server, server_stopped) = tokio::sync::oneshot::channel::<()>();
    let server = match serve(&sockets, front.clone(), qemu_uid, async {
        let _ = server_stopped.await;
    }) {
        Ok(server) => server,
        Err(e) => {
            prepared.connector.stop_daemon();
            return Err(VirtLauncherError::Serve(e));
        }
    };
    let notifier = Notifier::start(share.join(NOTIFY_SOCKET));
    tokio::spawn(follow_domain(front.clone(), notifier.clone()));
    crate::run::say(format_args!(
        "virt-launcher for {} ready: {}",
        front.flags.domain_name(),
        sockets.join(READY_SOCKET).display()
    ));

    let ended = until_over_or_signalled(&front, &notifier, &mut term, &mut int).await;
    shut_down(&front, &prepared.connector).await;
    if !notifier.flush(Duration::from_secs(5)).await {
        tracing::warn!("virt-handler was not told everything before the launcher exits");
    }
    let _ = stop_server.send(());
    let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
    let _ = fs::remove_file(sockets.join(READY_SOCKET));
    ended.map(as_kubevirts_launcher_ends)
}

/// Flags KubeVirt passes for features not built in: accepted, and said to do nothing.
fn warn_not_built(flags: &VirtLauncherFlags) {
    for (flag, value) in &flags.not_built {
        tracing::warn!(flag = %format!("--{flag}"), %value, "accepted; this feature is not built into vmlauncher, the flag does nothing");
        crate::run::say(format_args!(
            "--{flag}={value}: accepted, not built (does nothing)"
        ));
    }
}

/// The launcher's places in KubeVirt's pod.
fn pod_paths(flags: &VirtLauncherFlags) -> HostPaths {
    // Where KubeVirt's launcher puts the consoles (virt-handler's console server and the
    // `guest-console-log` container look there); the dir itself is made with the private dir.
    let console_dir = flags.kubevirt_private_dir.join(&flags.uid);
    HostPaths {
        console_log: console_dir.join("virt-serial0-log"),
        // virt-handler's console server reaches `virt-vnc` there only as the socket QEMU made
        // (no link), so the console dir is QEMU's own (`host::private_dirs`).
        qemu_dir: console_dir.clone(),
        console_dir,
        container_disk_dir: flags.container_disk_dir.clone(),
        private_dir: flags.ephemeral_disk_dir.join("vmlauncher"),
        firmware_dir: flags.ovmf_path.clone(),
        hotplug_dir: flags.hotplug_disk_dir.clone(),
        cloud_init_dir: Some(flags.ephemeral_disk_dir.join("cloud-init-data")),
        ..HostPaths::pod()
    }
}

/// As KubeVirt's masquerade binding, whose guest cannot address the pod's loopback at all. When
/// it cannot be closed, said, and the launcher goes on.
fn close_pod_loopback(
    rt: &RuntimeDir,
    qemu_uid: u32,
) -> Option<crate::host::loopback::LoopbackClosed> {
    let in_container = crate::init::is_container_entrypoint();
    let mount_at = in_container.then(|| rt.0.join("cgroup2"));
    crate::host::loopback::close_here(qemu_uid, mount_at.as_deref())
        .inspect_err(|e| {
            crate::run::say(format_args!(
                "the guest can reach the pod's loopback: {}",
                crate::error_chain(e)
            ))
        })
        .ok()
}

/// Until the VM is over (and virt-handler has deleted it, or a while), or a SIGTERM or SIGINT
/// has stopped it gracefully.
async fn until_over_or_signalled(
    front: &Front,
    notifier: &Notifier,
    term: &mut Signal,
    int: &mut Signal,
) -> Result<Ended, VirtLauncherError> {
    let started = Instant::now();
    let qemu_timeout = front.flags.qemu_timeout;
    let signalled = async {
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    };
    tokio::pin!(signalled);
    tokio::select! {
        which = &mut signalled => {
            graceful_stop(front, notifier, which).await;
            Ok(Ended::Done)
        }
        ended = vm_over(front, started, qemu_timeout) => {
            // The VM is over: virt-handler deletes the domain once it has seen it off; a
            // SIGTERM meanwhile ends the wait.
            tokio::select! {
                _ = deleted(front) => {}
                _ = tokio::time::sleep(FINAL_DELETE_WAIT) => {}
                _ = &mut signalled => {}
            }
            ended
        }
    }
}

/// Marks the domain gone, then stops the launcher (or, with no VM ever created, libvirtd).
async fn shut_down(front: &Front, connector: &Arc<crate::libvirt::Connector>) {
    // Marked gone before libvirtd goes: a Delete from virt-handler from here on finds nothing
    // to delete and succeeds, as KubeVirt's launcher answers for a domain it cannot find.
    if !front.meta().deleted {
        front.update_meta(|m| {
            m.deleted = true;
            m.domain.deletion_timestamp = Some(now_rfc3339());
        });
    }
    if let Some(launcher) = front.launcher() {
        launcher.shut_down().await;
    } else {
        let c = connector.clone();
        let _ = tokio::task::spawn_blocking(move || c.stop_daemon()).await;
    }
}

/// KubeVirt's launcher exits 0 however its VM ended (powered off, destroyed after the grace
/// period, crashed, migrated away or never arrived): virt-handler learns how from the domain,
/// and the pod's exit code says only whether the launcher itself failed (a non-zero code makes
/// virt-launcher-monitor log a "dirty virt-launcher shutdown"). The way it ended is logged.
fn as_kubevirts_launcher_ends(ended: Ended) -> Ended {
    if let Ended::VmFinal { phase, reason } = ended {
        let why = reason.map(|r| format!(" ({r:?})")).unwrap_or_default();
        crate::run::say(format_args!(
            "the VM ended {phase:?}{why}; exiting 0, as KubeVirt's launcher does"
        ));
        return Ended::Done;
    }
    ended
}

/// Binds `launcher-init-sock`, serves, and renames it `launcher-sock` once it serves.
fn serve(
    sockets: &Path,
    front: Arc<Front>,
    qemu_uid: u32,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<tokio::task::JoinHandle<()>, crate::api::ApiError> {
    let init = sockets.join(INIT_SOCKET);
    let ready = sockets.join(READY_SOCKET);
    let listen_err = |source| crate::api::ApiError::Listen {
        path: init.clone(),
        source,
    };
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(sockets)
        .map_err(listen_err)?;
    // A launcher-sock left by a launcher that died is stale: the handler must not take it for
    // this one's readiness.
    if crate::api::check_socket_path(&ready)? == crate::api::SocketPath::Stale {
        fs::remove_file(&ready).map_err(listen_err)?;
    }
    let listener = crate::api::bind(&init)?;
    let incoming = UnixListenerStream::new(listener)
        .filter(crate::api::admitted(qemu_uid))
        .map(|connection| connection.map(crate::authority::FixAuthority::new));
    let router = tonic::transport::Server::builder()
        .add_service(CmdServer::new(CmdService { front }))
        .add_service(CmdInfoServer::new(InfoService));
    let server = tokio::spawn(async move {
        if let Err(e) = router
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
        {
            tracing::error!(error = %crate::error_chain(&e), "the cmd server failed");
        }
    });
    // The listener accepts from here on: connections queue until the server polls it.
    fs::rename(&init, &ready).map_err(listen_err)?;
    Ok(server)
}

/// Resolves once the VM is over: finished, or never created within `--qemu-timeout`.
async fn vm_over(
    front: &Front,
    started: Instant,
    qemu_timeout: Duration,
) -> Result<Ended, VirtLauncherError> {
    let mut meta = front.subscribe_meta();
    let launcher = loop {
        if let Some(l) = front.launcher() {
            break l.clone();
        }
        let left = qemu_timeout.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Err(VirtLauncherError::NoDomain { qemu_timeout });
        }
        let _ = tokio::time::timeout(left, meta.changed()).await;
    };
    // Over when the launcher's VM is final, or once virt-handler deleted the domain: it does so
    // only for a VMI it has made final (a guest that powered off, a deleted VMI), and KubeVirt's
    // launcher ends with its domain.
    let mut changes = launcher.subscribe_course();
    loop {
        let status = changes.borrow_and_update().clone();
        if status.finished || meta.borrow_and_update().deleted {
            return Ok(Ended::VmFinal {
                phase: status.phase,
                reason: status.phase_reason,
            });
        }
        tokio::select! {
            changed = changes.changed() => changed.map_err(|_| VirtLauncherError::StatusClosed)?,
            changed = meta.changed() => changed.map_err(|_| VirtLauncherError::StatusClosed)?,
        }
    }
}

async fn deleted(front: &Front) {
    let mut meta = front.subscribe_meta();
    let _ = meta.wait_for(|m| m.deleted).await;
}

/// SIGTERM: KubeVirt's graceful shutdown. The domain is marked, virt-handler told, then the
/// guest gets its grace period to power off.
async fn graceful_stop(front: &Front, notifier: &Notifier, which: &str) {
    crate::run::say(format_args!(
        "{which}: marking the VM for graceful shutdown"
    ));
    front.update_meta(|m| m.domain.marked_for_graceful_shutdown = Some(true));
    let Some(launcher) = front.launcher() else {
        return;
    };
    let _ = notifier.flush(Duration::from_secs(2)).await;
    launcher.terminate().await;
}

/// Tells virt-handler about every change of the domain: its JSON when it differs from what was
/// last posted (libvirt's events, the launcher's status, KubeVirt's metadata), `ADDED` the first
/// time it exists, a `deletionTimestamp` once it is gone; and the Kubernetes events of I/O
/// errors and guest panics.
async fn follow_domain(front: Arc<Front>, notifier: Notifier) {
    let mut meta = front.subscribe_meta();
    let launcher: Arc<Launcher> = loop {
        if let Some(l) = front.launcher() {
            break l.clone();
        }
        if meta.changed().await.is_err() {
            return;
        }
    };
    let (_, mut events) = launcher.watch_events();
    let mut status = launcher.subscribe();
    let mut last: Option<serde_json::Value> = None;
    let mut added = false;
    let mut gone = false;
    loop {
        let current = front.meta();
        if !gone {
            match current_domain(&front, &current).await {
                Err(()) => {}
                Ok(Some(domain)) if last.as_ref() != Some(&domain) => {
                    let event = if added {
                        DomainEvent::Modified
                    } else {
                        DomainEvent::Added
                    };
                    added = true;
                    notifier.domain(event, domain.clone());
                    last = Some(domain);
                }
                Ok(Some(_)) => {}
                Ok(None) if added || current.deleted => {
                    let mut meta = current.domain.clone();
                    meta.deletion_timestamp.get_or_insert_with(now_rfc3339);
                    notifier.domain(DomainEvent::Modified, domain_json::gone_domain_json(&meta));
                    gone = true;
                }
                Ok(None) => {}
            }
        }
        tokio::select! {
            changed = meta.changed() => if changed.is_err() { return },
            changed = status.changed() => if changed.is_err() { return },
            event = events.recv() => match event {
                Ok(e) => k8s_events(&notifier, &current.domain, &e.kind),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            },
        }
    }
}

/// The domain now; `Err` when it cannot be read (unknown is not gone: nothing is posted).
async fn current_domain(front: &Front, meta: &Meta) -> Result<Option<serde_json::Value>, ()> {
    if meta.deleted {
        return Ok(None);
    }
    front.domain().await.map_err(|e| {
        tracing::warn!(error = %e, "cannot read the domain for virt-handler");
    })
}

/// The launcher events KubeVirt's launcher reports as Kubernetes events.
fn k8s_events(notifier: &Notifier, vmi: &DomainMeta, kind: &EventKind) {
    if let EventKind::Hypervisor { event, detail } = kind {
        match event.as_str() {
            "IOError" => notifier.k8s_event(notify::k8s_event(
                vmi,
                "Warning",
                "IOerror",
                &format!("VM Paused due to IO error: {detail}"),
            )),
            "Crashed" => notifier.k8s_event(notify::k8s_event(
                vmi,
                "Warning",
                "GuestPanicked",
                &format!("GuestPanicked ({detail})"),
            )),
            _ => {}
        }
    }
}

/// The binary was invoked by one of KubeVirt's names for its launcher (argv\[0\]): the image links
/// both to vmlauncher. The monitor's own flag, `--keep-after-failure`, is one virt-launcher
/// accepts too.
pub fn invoked_as_virt_launcher(argv0: &str) -> bool {
    PathBuf::from(argv0)
        .file_name()
        .is_some_and(|n| n == "virt-launcher" || n == "virt-launcher-monitor")
}
