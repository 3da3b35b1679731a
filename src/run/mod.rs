//! `vmlauncher run`: the pod entrypoint and the terminal front end. Reaches a hypervisor, creates
//! the VM, serves the API, prints every phase change, and on SIGTERM or Ctrl-C stops the guest
//! gracefully; exits with a code that tells how the VM ended.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::api;
use crate::domain::VirtType;
use crate::ended::Ended;
use crate::launcher::{Launcher, StartKind};
use crate::libvirt::daemon::DaemonOptions;
use crate::lifecycle::{Phase, PrintableStatus, RunStrategy};
pub(crate) use crate::runtime_dir::RuntimeDir;

use crate::spec::{self, Validated};

mod host;
mod incoming;
pub use host::SetupError;
pub(crate) use host::{host_path_policy, prepare, qemu_user, HostRequest, LaunchBase, Prepared};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Emulation {
    /// KVM when /dev/kvm can be opened, else TCG.
    Auto,
    Kvm,
    /// Software emulation (`<domain type='qemu'>`).
    Tcg,
}

impl Emulation {
    pub fn resolve(self) -> VirtType {
        match self {
            Emulation::Kvm => VirtType::Kvm,
            Emulation::Tcg => VirtType::Qemu,
            Emulation::Auto => {
                let kvm = fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open("/dev/kvm");
                if kvm.is_ok() {
                    VirtType::Kvm
                } else {
                    VirtType::Qemu
                }
            }
        }
    }
}

#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The spec; `None` only for a migration target, which takes its source's.
    pub spec: Option<Validated>,
    /// A migration target: no VM until one comes from a source launcher.
    pub incoming: bool,
    pub connect: Option<String>,
    pub runtime_dir: PathBuf,
    pub socket: Option<PathBuf>,
    pub emulation: Emulation,
    pub strategy: RunStrategy,
    pub resync_interval: Duration,
    /// Mirror the guest's serial console to standard output.
    pub console: bool,
    /// The spec as the owner wrote it (what `GetSpec` returns).
    pub spec_text: String,
    /// Where hot-plugged volumes live (default: RUNTIME_DIR/hotplug).
    pub hotplug_dir: Option<PathBuf>,
    /// User-mode networking for a local run, or the pod's tap devices.
    pub network: crate::convert::NetworkMode,
    /// Where masquerade interfaces' `ports` are published on the host.
    pub publish: crate::convert::Publish,
    /// Give up on a lost libvirt after this long (`None`: never).
    pub reconnect_timeout: Option<Duration>,
    /// QEMU's capability cache shared by the launchers of this host (`None`: not shared).
    pub qemu_cache_dir: Option<PathBuf>,
    /// The bound of the console log and of QEMU's log (with a private libvirtd).
    pub log_max_size: u64,
    /// The only directories a hostDisk may be under (empty: anywhere not denied).
    pub host_disk_roots: Vec<PathBuf>,
    /// `--qemu-user`: who QEMU runs as (`None`: the host's QEMU account).
    pub qemu_user: Option<String>,
    /// `--qemu-ids`: where a host run's QEMU takes an id of its own from.
    pub qemu_ids: crate::host::qemu_ids::QemuIdRange,
    /// `--allow-block-device`: the block devices a Sync may attach besides the hotplug dir's.
    pub allow_block_devices: Vec<crate::host::DevNumber>,
    /// `--guest-loopback` (`None`: decided by the network mode and the VMI).
    pub guest_loopback: Option<crate::host::loopback::GuestLoopback>,
    /// `--tls-dir`: credentials to migrate between machines.
    pub tls_dir: Option<PathBuf>,
    /// `--listen`: a migration target's first TCP port (with `--incoming` and `--tls-dir`).
    pub listen: Option<std::net::SocketAddr>,
}

/// Progress lines for people and scripts: `vmlauncher: <what>`. A closed standard output (a
/// pipe whose reader went away) must not take the launcher, and so the VM's clean stop, with it.
pub(crate) fn say(what: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stdout().lock(), "vmlauncher: {what}");
}

/// `dedicatedCpuPlacement` pins vCPUs to the launcher's CPUs (its affinity, as convert reads it)
/// as if they were the VM's alone; where they visibly are not, the operator is told why (the VM
/// still runs: pinned on shared CPUs it is no worse off than unpinned on them).
/// Where a person finds the guest's consoles: the serial's log and socket (`vmlauncher
/// console` attaches to it) and the VNC socket, for those the spec has.
fn consoles(spec: &Validated, paths: &crate::volumes::HostPaths) -> Vec<String> {
    let consoles = crate::convert::Consoles::of(&spec.spec.domain.devices, paths);
    let mut lines = Vec::new();
    if let Some(serial) = consoles.serial {
        if let Some(log) = serial.log {
            lines.push(format!("console {}", log.display()));
        }
        lines.push(format!("serial unix:{}", serial.socket.display()));
    }
    if let Some(vnc) = consoles.vnc_socket {
        lines.push(format!("vnc unix:{}", vnc.display()));
    }
    lines
}

pub(crate) fn warn_if_cpus_shared(spec: &Validated) {
    let cpu = spec.spec.domain.cpu.as_ref();
    if cpu.is_none_or(|c| c.dedicated_cpu_placement != Some(true)) {
        return;
    }
    let Ok(cpus) = crate::host::cpus::own_cpus() else {
        return;
    };
    let cgroup = crate::host::cgroup::CgroupRoots::detect()
        .ok()
        .and_then(|roots| {
            roots.unified_dir_of(&fs::read_to_string("/proc/self/cgroup").unwrap_or_default())
        });
    let sys_cpu = Path::new("/sys/devices/system/cpu");
    if let Some(why) =
        crate::host::cpus::own_not_exclusive_because(&cpus, sys_cpu, cgroup.as_deref())
    {
        tracing::warn!("dedicatedCpuPlacement: the pinned CPUs are not the VM's alone: {why}");
    }
}

/// SIGTERM, SIGINT and SIGHUP, caught from the very start: a signal that comes while the VM is
/// still being created must not kill the launcher with the default action and leave it behind.
pub(super) struct StopSignals {
    term: Signal,
    int: Signal,
    hup: Signal,
    /// PID 1 forwards SIGQUIT (init.rs); unhandled it would kill the launcher without a stop.
    quit: Signal,
}

impl StopSignals {
    fn install() -> std::io::Result<StopSignals> {
        Ok(StopSignals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: signal(SignalKind::hangup())?,
            quit: signal(SignalKind::quit())?,
        })
    }

    /// Waits for one; says which.
    pub(super) async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "interrupted",
            _ = self.hup.recv() => "SIGHUP",
            _ = self.quit.recv() => "SIGQUIT",
        }
    }
}

/// Why `run` (or `warm-cache`) failed before its VM ended.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Setup(#[from] SetupError),
    /// `--socket` refused, or the socket cannot be listened on.
    #[error(transparent)]
    Socket(api::ApiError),
    /// Host paths of the spec that lead where they may not; each said on its own line.
    #[error("{0}")]
    HostPaths(spec::SpecErrors),
    #[error("--guest-loopback closed")]
    GuestLoopback(#[source] crate::host::loopback::LoopbackError),
    #[error("cannot start the VM")]
    Start(#[source] crate::launcher::LauncherError),
    /// A migration target's private libvirtd.
    #[error(transparent)]
    Daemons(crate::libvirt::ConnectError),
    /// Its panic message is on stderr already.
    #[error("a libvirt call panicked")]
    Panicked(tokio::task::JoinError),
    /// The migration a predecessor on this runtime dir took cannot go on.
    #[error(transparent)]
    Resumed(crate::launcher::LauncherError),
    #[error("cannot prepare for the migration")]
    Incoming(#[source] crate::launcher::LauncherError),
    /// The API that hands a migration target its offers has gone.
    #[error("no migration can come any more")]
    NoOffers,
    /// The launcher's status is no longer published (it has gone).
    #[error("the launcher's status went away")]
    StatusClosed,
    #[error("cannot warm the capability cache: {0}")]
    WarmCache(std::io::Error),
    #[error("cannot warm the capability cache: {0}")]
    WarmCachePanicked(tokio::task::JoinError),
    #[error(transparent)]
    MigrationTls(crate::migration_tls::TlsError),
}

/// Runs the VM until it is final or the launcher is told to stop.
pub async fn run(opts: RunOptions) -> Result<Ended, RunError> {
    let started = Instant::now();
    let mut signals = StopSignals::install().map_err(|_| SetupError::Signals)?;
    // Held until the launcher exits: one launcher per runtime dir.
    let (rt, _lock) = RuntimeDir::claim(&opts.runtime_dir).map_err(SetupError::RuntimeDir)?;
    // Held until the launcher exits too: this VM's QEMU identity on a host.
    let (qemu_user, _qemu_id) = host::qemu_identity(
        opts.qemu_user.as_deref(),
        opts.qemu_ids,
        &rt,
        opts.connect.is_some() || crate::init::is_container_entrypoint(),
    )?;
    let qemu_uid = qemu_user.uid;
    // The API socket's path before anything starts: a `--socket` that would be refused (a file
    // there, a socket someone still answers on) ends the run here, with no daemon or VM to undo.
    // It is bound only once the VM is up: until then a client finds no socket and fails at
    // once, instead of waiting unanswered through the start.
    let socket = opts.socket.clone().unwrap_or_else(|| rt.socket());
    api::check_socket_path(&socket).map_err(RunError::Socket)?;
    let (paths, host_paths) = check_host_paths(&opts, &rt, &qemu_user)?;

    // Before libvirtd, whose configuration names them.
    let migration_tls = install_migration_tls(&opts, &rt, &qemu_user)?;
    // Before libvirtd, and so QEMU, start in this cgroup.
    let _loopback = close_guest_loopback(&opts, &rt, qemu_uid)?;
    let Prepared {
        connector,
        events,
        base,
        logs: _logs,
        reach: _reach,
    } = prepare(HostRequest {
        rt: &rt,
        connect: opts.connect.clone(),
        qemu_cache_dir: opts.qemu_cache_dir.clone(),
        paths: paths.clone(),
        emulation: opts.emulation,
        network: opts.network,
        publish: opts.publish.clone(),
        log_max_size: opts.log_max_size,
        resync_interval: opts.resync_interval,
        reconnect_timeout: opts.reconnect_timeout,
        host_paths,
        qemu_user,
        block_allow: crate::host::block_allow::BlockAllowList::new(
            opts.allow_block_devices.iter().copied(),
            crate::init::is_container_entrypoint(),
        ),
        migration_tls,
        previous_qemu_id: _qemu_id.as_ref().and_then(|id| id.previous),
    });
    let console_log = paths.console_log.clone();
    if opts.console {
        mirror_console(console_log.clone());
    }
    if opts.incoming {
        let sockets = migration_sockets(&opts, &base).await?;
        let target = incoming::Target {
            opts: &opts,
            rt: &rt,
            paths: &paths,
            connector: &connector,
            base: &base,
            socket: &socket,
            qemu_uid,
            sockets: sockets.as_ref(),
        };
        return target.run(events, started, &mut signals).await;
    }
    let Some(spec) = opts.spec.clone() else {
        unreachable!("a spec is required without --incoming (clap)");
    };
    warn_if_cpus_shared(&spec);
    let consoles = consoles(&spec, &paths);
    let options = base.for_spec(&spec, opts.spec_text.clone(), opts.strategy);
    let (launcher, kind) = start_launcher(&connector, spec, options, events).await?;
    say(format_args!("libvirt {}", connector.uri()));
    say_started(&launcher, kind, opts.strategy, consoles);

    let listener = match api::bind(&socket) {
        Ok(l) => l,
        Err(e) => {
            launcher.terminate().await;
            launcher.shut_down().await;
            return Err(RunError::Socket(e));
        }
    };
    let api = Served::start(api::Front::ready(launcher.clone()), listener, qemu_uid);
    say(format_args!("api unix:{}", socket.display()));
    let ended = follow(&launcher, started, &mut signals).await;
    launcher.shut_down().await;
    api.stop(&socket).await;
    ended
}

/// Where the spec's host paths lead, before anything is started: never into the launcher's own
/// places, wherever this command line put them (its saved Sync, records, libvirt's and the vTPM's
/// state, the capability cache), and only under the host disk roots if named.
fn check_host_paths(
    opts: &RunOptions,
    rt: &RuntimeDir,
    qemu_user: &crate::host::qemu_user::QemuUser,
) -> Result<
    (
        crate::volumes::HostPaths,
        crate::host::confine::HostPathPolicy,
    ),
    RunError,
> {
    let mut paths = crate::volumes::HostPaths::local(&rt.0);
    if let Some(dir) = &opts.hotplug_dir {
        paths.hotplug_dir = dir.clone();
    }
    let host_paths = host_path_policy(
        rt,
        &paths,
        opts.qemu_cache_dir.as_deref(),
        &opts.host_disk_roots,
    )
    .reached_by(qemu_user)
    .on_shared_libvirt(opts.connect.is_some());
    if let Some(spec) = &opts.spec {
        host_paths.check(spec).map_err(RunError::HostPaths)?;
    }
    Ok((paths, host_paths))
}

/// A migration target's sockets: a source on this host connects there (`MigrationSockets`); in
/// a pod no other pod reaches a path of this one's, and QEMU's own dir serves (`None`).
async fn migration_sockets(
    opts: &RunOptions,
    base: &LaunchBase,
) -> Result<Option<crate::host::private_dirs::MigrationSockets>, RunError> {
    if opts.listen.is_some() || crate::init::is_container_entrypoint() {
        return Ok(None);
    }
    let owner = base.qemu_owner();
    let made = tokio::task::spawn_blocking(move || {
        crate::host::private_dirs::MigrationSockets::make(owner)
    })
    .await
    .map_err(RunError::Panicked)?;
    let sockets = made.map_err(|source| {
        RunError::Incoming(crate::launcher::LauncherError::HostDisk {
            volume: String::new(),
            source,
        })
    })?;
    Ok(Some(sockets))
}

/// Starts the launcher; when it cannot, stops the libvirtd started for it.
async fn start_launcher(
    connector: &Arc<crate::libvirt::Connector>,
    spec: Validated,
    options: crate::launcher::LaunchOptions,
    events: tokio::sync::mpsc::UnboundedReceiver<crate::libvirt::events::HypervisorEvent>,
) -> Result<(Arc<Launcher>, StartKind), RunError> {
    match Launcher::start(connector.clone(), spec, options, events).await {
        Ok(started) => Ok(started),
        Err(e) => {
            let c = connector.clone();
            let _ = tokio::task::spawn_blocking(move || c.stop_daemon()).await;
            Err(RunError::Start(e))
        }
    }
}

/// Says what became of the domain at start, and where its consoles are.
fn say_started(launcher: &Launcher, kind: StartKind, strategy: RunStrategy, consoles: Vec<String>) {
    say(format_args!(
        "domain {} {} (run strategy {})",
        launcher.domain_name(),
        match kind {
            StartKind::Created => "created",
            StartKind::Adopted { last_sync: false } => "adopted",
            StartKind::Adopted { last_sync: true } => "adopted with its last accepted Sync, which stands over the spec file (a Sync of the file's spec changes it)",
            StartKind::NotStarted => "not started: waiting for a Start call",
            StartKind::Incoming => "prepared for an incoming migration",
            StartKind::MigratedAway => "migrated away before this launcher started: nothing to run",
        },
        strategy.as_str(),
    ));
    for line in consoles {
        say(format_args!("{line}"));
    }
}

/// The API, served until `stop`.
pub(super) struct Served {
    stop: tokio::sync::watch::Sender<bool>,
    servers: Vec<tokio::task::JoinHandle<Result<(), api::ApiError>>>,
}

impl Served {
    pub(super) fn start(
        front: std::sync::Arc<api::Front>,
        listener: tokio::net::UnixListener,
        qemu_uid: u32,
    ) -> Served {
        let (stop, _) = tokio::sync::watch::channel(false);
        let stopped = Self::stopped(&stop);
        let server = tokio::spawn(api::serve(front, listener, qemu_uid, stopped));
        Served {
            stop,
            servers: vec![server],
        }
    }

    /// The same API over TCP under mutual TLS as well (a migration target on `--listen`), until
    /// the API stops or `closed` resolves (the incoming migration ended, either way): a port
    /// anyone may reach is open no longer than a migration needs it. Connections already
    /// served go on (a source following the target to its end).
    pub(super) fn also_tcp(
        &mut self,
        front: std::sync::Arc<api::Front>,
        listener: tokio::net::TcpListener,
        tls: crate::migration_tls::MigrationTls,
        closed: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let stopped = Self::stopped(&self.stop);
        self.servers.push(crate::spawn::spawn_boxed(async move {
            let ended = std::sync::atomic::AtomicBool::new(false);
            let until = async {
                tokio::select! {
                    () = stopped => {}
                    () = closed => ended.store(true, std::sync::atomic::Ordering::Relaxed),
                }
            };
            let served = api::tcp::serve(front, listener, &tls, until).await;
            if ended.load(std::sync::atomic::Ordering::Relaxed) {
                say(format_args!(
                    "api tcp: closed, the incoming migration ended"
                ));
            }
            served
        }));
    }

    fn stopped(stop: &tokio::sync::watch::Sender<bool>) -> impl std::future::Future<Output = ()> {
        let mut rx = stop.subscribe();
        async move {
            let _ = rx.wait_for(|stopped| *stopped).await;
        }
    }

    /// Called after the launcher's shut_down, which ends its event streams: a client that holds
    /// a unary call open must not keep the launcher here.
    pub(super) async fn stop(self, socket: &Path) {
        let _ = self.stop.send(true);
        let all = join_servers(self.servers);
        if tokio::time::timeout(Duration::from_secs(5), all)
            .await
            .is_err()
        {
            tracing::warn!("the API did not stop within 5s; leaving anyway");
        }
        let _ = fs::remove_file(socket);
    }
}

/// Waits for every server in turn (each was told to stop at once).
async fn join_servers(servers: Vec<tokio::task::JoinHandle<Result<(), api::ApiError>>>) {
    for server in servers {
        if let Ok(Err(e)) = server.await {
            tracing::warn!(error = %crate::error_chain(&e), "the API server failed");
        }
    }
}

/// `--tls-dir`'s credentials, read, checked usable, and copied where libvirt (root's) and QEMU
/// (its group's, read-only) read them, both in the runtime dir; with `--listen`, where the
/// target's libvirtd listens (the port after the API's).
fn install_migration_tls(
    opts: &RunOptions,
    rt: &RuntimeDir,
    qemu_user: &crate::host::qemu_user::QemuUser,
) -> Result<Option<crate::libvirt::daemon::DaemonTls>, RunError> {
    let Some(dir) = &opts.tls_dir else {
        return Ok(None);
    };
    let tls = crate::migration_tls::MigrationTls::read(dir).map_err(RunError::MigrationTls)?;
    api::tcp::check_usable(&tls, dir).map_err(RunError::MigrationTls)?;
    let owner = crate::host::devnode::NodeOwner {
        uid: qemu_user.uid,
        gid: qemu_user.gid,
    };
    let installed = tls
        .install(&rt.0.join("tls"), &rt.0.join("qemu-tls"), owner)
        .map_err(RunError::MigrationTls)?;
    Ok(Some(crate::libvirt::daemon::DaemonTls {
        installed,
        listen: opts
            .listen
            .map(|api| std::net::SocketAddr::new(api.ip(), api.port() + 1)),
    }))
}

/// Closes the host's loopback to the guest where `GuestLoopback::decide` says so. Asked for on
/// the command line and impossible: a refused run (nothing started yet). By default in a pod and
/// impossible (no cgroup v2, a root QEMU): said, and the run goes on as before.
fn close_guest_loopback(
    opts: &RunOptions,
    rt: &RuntimeDir,
    qemu_uid: u32,
) -> Result<Option<crate::host::loopback::LoopbackClosed>, RunError> {
    use crate::host::loopback::{self, GuestLoopback};
    let in_pod = opts.network == crate::convert::NetworkMode::Pod;
    // A migration target without a spec decides without the VMI's annotation.
    let no_annotations = Default::default();
    let annotations = opts
        .spec
        .as_ref()
        .map_or(&no_annotations, |s| &s.metadata.annotations);
    let wanted = GuestLoopback::decide(opts.guest_loopback, in_pod, annotations);
    if wanted == GuestLoopback::Open || opts.connect.is_some() {
        return Ok(None);
    }
    let in_container = crate::init::is_container_entrypoint();
    let mount_at = in_container.then(|| rt.0.join("cgroup2"));
    match loopback::close_here(qemu_uid, mount_at.as_deref()) {
        Ok(closed) => {
            tracing::info!(cgroup = %closed.cgroup.display(), "the guest cannot reach the host's loopback");
            Ok(Some(closed))
        }
        Err(e) if opts.guest_loopback.is_some() => Err(RunError::GuestLoopback(e)),
        Err(e) => {
            say(format_args!(
                "the guest can reach the pod's loopback: {}",
                crate::error_chain(&e)
            ));
            Ok(None)
        }
    }
}

/// `vmlauncher warm-cache`: starts a private libvirtd in a temporary dir with the shared cache
/// `cache`, has it load (probe) QEMU's capabilities, publishes them, and stops it.
pub async fn warm_cache(cache: &Path) -> Result<Ended, RunError> {
    let cache = cache.to_path_buf();
    let qemu_user = host::qemu_user(None).map_err(SetupError::QemuUser)?;
    let started = Instant::now();
    let warmed = tokio::task::spawn_blocking(move || {
        let dir = tempfile::Builder::new()
            .prefix("vmlauncher-warm-")
            .tempdir()?;
        let daemon = crate::libvirt::daemon::PrivateDaemon::start(
            dir.path(),
            DaemonOptions {
                pod_cgroups: true,
                capability_cache: Some(cache.clone()),
                // Probed as the launchers that use the cache will run QEMU.
                qemu_user,
                domain_namespace: false,
                migration_tls: None,
            },
        )
        .map_err(|e| std::io::Error::other(crate::error_chain(&e)))?;
        drop(daemon);
        std::fs::read_dir(&cache).map(|d| d.count())
    })
    .await;
    let files = warmed
        .map_err(RunError::WarmCachePanicked)?
        .map_err(RunError::WarmCache)?;
    say(format_args!(
        "QEMU capability cache warm: {files} file(s) after {:.2}s",
        started.elapsed().as_secs_f64()
    ));
    Ok(Ended::Done)
}

/// Prints status changes until the VM is final, terminating it on SIGTERM, SIGINT or SIGHUP.
pub(super) async fn follow(
    launcher: &Launcher,
    started: Instant,
    signals: &mut StopSignals,
) -> Result<Ended, RunError> {
    let mut changes = launcher.subscribe_course();
    let mut last: Option<(Phase, PrintableStatus)> = None;
    let terminate = async {
        let which = signals.recv().await;
        say(format_args!(
            "{which}: stopping the guest (grace period {}s)",
            launcher.grace_period().as_secs()
        ));
        launcher.terminate().await;
    };
    tokio::pin!(terminate);
    let mut terminating = true;
    loop {
        let status = changes.borrow_and_update().clone();
        let shown = (status.phase, status.printable_status);
        if last != Some(shown) {
            let detail = match (&status.power_state, status.phase_reason) {
                (_, Some(reason)) if status.phase.is_final() => reason.to_string(),
                (Some(power), _) => power.to_string(),
                (None, _) => String::new(),
            };
            say(format_args!(
                "phase {} ({}; {}) after {:.2}s",
                status.phase,
                status.printable_status,
                detail,
                started.elapsed().as_secs_f64()
            ));
            last = Some(shown);
        }
        if status.finished {
            return Ok(Ended::VmFinal {
                phase: status.phase,
                reason: status.phase_reason,
            });
        }
        tokio::select! {
            changed = changes.changed() => {
                changed.map_err(|_| RunError::StatusClosed)?;
            }
            () = &mut terminate, if terminating => terminating = false,
        }
    }
}

fn mirror_console(path: PathBuf) {
    std::thread::spawn(move || {
        let Ok(mut console) = crate::console::ConsoleLog::from_end(&path) else {
            return;
        };
        let forever = Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600);
        while let Ok(Some(line)) = console.next_line(forever) {
            // The guest's bytes, not its escape sequences: a terminal is not the guest's to drive.
            let line: String = line
                .chars()
                .filter(|c| !c.is_control() || *c == '\t')
                .collect();
            if writeln!(std::io::stdout().lock(), "[console] {line}").is_err() {
                return;
            }
        }
    });
}

/// Why a spec could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadSpecError {
    #[error("cannot read it: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    TooLarge(spec::SpecErrors),
}

/// Reads a spec once, bounded: a file (its size checked before reading), or `-` standard input
/// (never more than one byte past the bound).
pub fn read_spec(path: &Path) -> Result<Vec<u8>, ReadSpecError> {
    use std::io::Read;
    let limit = spec::MAX_DOCUMENT_BYTES as u64 + 1;
    let mut bytes = Vec::new();
    if path.as_os_str() == "-" {
        std::io::stdin()
            .lock()
            .take(limit)
            .read_to_end(&mut bytes)?;
    } else {
        let file = fs::File::open(path)?;
        let len = usize::try_from(file.metadata()?.len()).unwrap_or(usize::MAX);
        spec::check_document_size(len).map_err(ReadSpecError::TooLarge)?;
        file.take(limit).read_to_end(&mut bytes)?;
    }
    spec::check_document_size(bytes.len()).map_err(ReadSpecError::TooLarge)?;
    Ok(bytes)
}

/// Why a spec file given on the command line is refused. Except `Unreadable`, each says the
/// file's path first, as a compiler names the file of its diagnostics.
#[derive(Debug, thiserror::Error)]
pub enum SpecFileError {
    /// Every problem, one per line, each with its field path.
    #[error("{}", each_after(path, errors))]
    Invalid {
        path: PathBuf,
        errors: spec::SpecErrors,
    },
    #[error("cannot read {}", path.display())]
    Unreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Read for a Sync, which leaves the validation to the launcher.
    #[error("{}: {source}", path.display())]
    NotSendable {
        path: PathBuf,
        source: ReadSpecError,
    },
    #[error("{}: (document): not UTF-8 (invalid byte at offset {valid_up_to})", path.display())]
    NotUtf8 { path: PathBuf, valid_up_to: usize },
    /// Valid, and still not a domain (the problems after the path, not each).
    #[error("{}: {errors}", path.display())]
    NotConvertible {
        path: PathBuf,
        errors: spec::SpecErrors,
    },
}

fn each_after(path: &Path, errors: &spec::SpecErrors) -> String {
    let lines: Vec<String> = errors
        .0
        .iter()
        .map(|e| format!("{}: {e}", path.display()))
        .collect();
    lines.join("\n")
}

/// Reads (once), parses and validates; the spec and its text.
pub fn load_spec(path: &Path) -> Result<(Validated, String), SpecFileError> {
    let invalid = |errors| SpecFileError::Invalid {
        path: path.into(),
        errors,
    };
    let bytes = read_spec(path).map_err(|e| match e {
        ReadSpecError::TooLarge(errors) => invalid(errors),
        ReadSpecError::Io(source) => SpecFileError::Unreadable {
            path: path.into(),
            source,
        },
    })?;
    let validated = spec::parse_bytes(&bytes).map_err(invalid)?;
    // parse_bytes checked that it is UTF-8.
    Ok((validated, String::from_utf8(bytes).unwrap_or_default()))
}
