//! The host side a launcher needs before it has a VM: the libvirt connector (a private libvirtd
//! or a given URI), the bounded logs, the cgroups and capabilities block hotplug needs, the
//! hotplug dir. Shared by `vmlauncher run`, which has its spec at start, and
//! `vmlauncher virt-launcher`, whose spec arrives with virt-handler's first Sync.

use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::{say, Emulation, RuntimeDir};
use crate::convert::{ConvertOptions, NetworkMode, Publish};
use crate::host::cgroup::CgroupRoots;
use crate::host::confine::HostPathPolicy;
use crate::host::qemu_user::{QemuUser, QemuUserError};
use crate::launcher::{HotplugOptions, LaunchOptions};
use crate::libvirt::daemon::{DaemonOptions, DaemonTls, PrivateDaemon};
use crate::libvirt::events::HypervisorEvent;
use crate::libvirt::{Backend, Connector};
use crate::lifecycle::RunStrategy;
use crate::logs::{Bounded, LogBound};
use crate::migration_tls::InstalledTls;
use crate::spec::Validated;
use crate::volumes::HostPaths;

/// What stops a launcher, `run` or `virt-launcher`, in its first steps, before it starts
/// anything: each front end decides what each means for its exit (the binary's `cli::exit`).
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("cannot install signal handlers")]
    Signals,
    #[error(transparent)]
    QemuUser(QemuUserError),
    #[error(transparent)]
    QemuId(crate::host::qemu_ids::QemuIdError),
    #[error(transparent)]
    RuntimeDir(crate::runtime_dir::RuntimeDirError),
}

/// What the host side is asked for.
#[derive(Debug)]
pub(crate) struct HostRequest<'a> {
    pub rt: &'a RuntimeDir,
    /// A libvirt URI to use instead of a private libvirtd.
    pub connect: Option<String>,
    pub qemu_cache_dir: Option<PathBuf>,
    /// Where volume sources live; the hotplug dir is made here if missing.
    pub paths: HostPaths,
    pub emulation: Emulation,
    pub network: NetworkMode,
    pub publish: Publish,
    pub log_max_size: u64,
    pub resync_interval: Duration,
    pub reconnect_timeout: Option<Duration>,
    /// Where the spec's host paths may lead.
    pub host_paths: HostPathPolicy,
    /// Who QEMU runs as (see [`qemu_user`]).
    pub qemu_user: QemuUser,
    /// Which block devices a Sync may attach.
    pub block_allow: crate::host::block_allow::BlockAllowList,
    /// Migrating over TCP (`run --tls-dir`, and `--listen` for a target).
    pub migration_tls: Option<DaemonTls>,
    /// The QEMU uid a previous launcher of this runtime dir used (`host::qemu_ids`).
    pub previous_qemu_id: Option<u32>,
}

/// The user QEMU runs as: the one `--qemu-user` names, else the distribution's QEMU account;
/// root only when asked for, or (said once) when the host has no such account.
pub(crate) fn qemu_user(requested: Option<&str>) -> Result<QemuUser, QemuUserError> {
    let user = QemuUser::resolve(requested)?;
    Ok(user.unwrap_or_else(|| {
        say(format_args!(
            "QEMU runs as root: this host has no {} account (add one, or say --qemu-user root)",
            crate::host::qemu_user::DEFAULT_NAMES.join(" or ")
        ));
        QemuUser::root()
    }))
}

/// Who QEMU runs as on a host run: the user `--qemu-user` names if any; with a libvirt of its
/// own outside a pod (`shared` false), an id of its own from `ids`, held while the returned
/// hold lives (`host::qemu_ids`); else the distribution's account, as [`qemu_user`] finds it.
pub(crate) fn qemu_identity(
    requested: Option<&str>,
    ids: crate::host::qemu_ids::QemuIdRange,
    rt: &RuntimeDir,
    shared: bool,
) -> Result<(QemuUser, Option<crate::host::qemu_ids::QemuId>), SetupError> {
    if requested.is_some() || shared {
        return Ok((qemu_user(requested).map_err(SetupError::QemuUser)?, None));
    }
    let id = crate::host::qemu_ids::allocate(
        ids,
        std::path::Path::new(crate::host::qemu_ids::LOCK_DIR),
        &rt.0,
    )
    .map_err(SetupError::QemuId)?;
    Ok((id.user.clone(), Some(id)))
}

/// What a non-root QEMU must reach: the private dirs as `host::private_dirs` makes them, and
/// search (only) through the runtime, hotplug and console dirs' parents, by an ACL entry for its
/// uid, which the returned reach takes back when the launcher ends: the operator's modes stay
/// theirs, and no other local user gains anything. `previous`: the uid a killed launcher of
/// this runtime dir gave such entries to.
fn give_qemu_its_dirs(
    rt: &RuntimeDir,
    paths: &HostPaths,
    qemu: &QemuUser,
    previous: Option<u32>,
) -> Option<QemuReach> {
    if qemu.is_root() {
        return None;
    }
    let owner = crate::host::devnode::NodeOwner {
        uid: qemu.uid,
        gid: qemu.gid,
    };
    if let Err(e) = crate::host::private_dirs::prepare(paths, owner) {
        say(format_args!(
            "cannot give QEMU's user {} its dirs: {}",
            qemu.name,
            crate::error_chain(&e)
        ));
    }
    // The console dir's parent: KubeVirt's private dir in a pod (an emptyDir, 0777 there), the
    // runtime dir on a host; QEMU's own dir is beside it.
    let mut searched: Vec<PathBuf> = vec![rt.0.clone(), paths.hotplug_dir.clone()];
    for dir in [&paths.console_dir, &paths.qemu_dir] {
        if let Some(parent) = dir.parent() {
            if !searched.iter().any(|d| d == parent) {
                searched.push(parent.to_path_buf());
            }
        }
    }
    let reach = QemuReach::grant(searched, qemu, previous);
    for dir in [&paths.private_dir, &paths.hotplug_dir, &paths.qemu_dir] {
        if let Some(blocked) = qemu.blocked_on_the_way(&dir.join("-")) {
            say(format_args!(
                "QEMU's user {} cannot reach {}: {} is {:04o} {}:{}",
                qemu.name,
                dir.display(),
                blocked.dir.display(),
                blocked.mode,
                blocked.owner,
                blocked.group
            ));
        }
    }
    Some(reach)
}

/// QEMU's search through directories that are not the launcher's alone, for as long as it
/// lives.
#[derive(Debug)]
pub(crate) struct QemuReach {
    uid: u32,
    dirs: Vec<PathBuf>,
}

impl QemuReach {
    fn grant(dirs: Vec<PathBuf>, qemu: &QemuUser, previous: Option<u32>) -> QemuReach {
        let uid = qemu.uid;
        let mut granted = Vec::new();
        for dir in dirs {
            if let Some(old) = previous.filter(|old| *old != uid) {
                // A killed launcher's entry: its id may go to another VM now.
                let _ = crate::host::acl::revoke(&dir, |id| id == old);
            }
            // A dir anyone may search already (`/var/run` in a pod) needs no entry.
            if std::fs::metadata(&dir).is_ok_and(|m| {
                std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o001 != 0
            }) {
                continue;
            }
            match crate::host::acl::grant_search(&dir, uid) {
                Ok(()) => granted.push(dir),
                Err(e) => say(format_args!(
                    "cannot let QEMU's user {} pass through {}: {e}",
                    qemu.name,
                    dir.display()
                )),
            }
        }
        QemuReach { uid, dirs: granted }
    }
}

impl Drop for QemuReach {
    fn drop(&mut self) {
        for dir in &self.dirs {
            if let Err(e) = crate::host::acl::revoke(dir, |id| id == self.uid) {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot take QEMU's passage back");
            }
        }
    }
}

/// The host, ready for a launcher: give [`Prepared::events`] and the options of
/// [`LaunchBase::for_spec`] to `Launcher::start`.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub connector: Arc<Connector>,
    /// The receiving end of the connector's event channel.
    pub events: mpsc::UnboundedReceiver<HypervisorEvent>,
    /// Everything of the launch options that does not depend on the spec.
    pub base: LaunchBase,
    /// Keeps the console and QEMU logs bounded while it lives.
    pub logs: Option<LogBound>,
    /// QEMU's passage through the dirs it needs, taken back when dropped.
    pub reach: Option<QemuReach>,
}

/// Launch options without a spec.
#[derive(Debug, Clone)]
pub(crate) struct LaunchBase {
    convert: ConvertOptions,
    hotplug: HotplugOptions,
    resync_interval: Duration,
    reconnect_timeout: Option<Duration>,
    host_paths: HostPathPolicy,
    runtime_dir: PathBuf,
    migration_tls: Option<InstalledTls>,
}

impl LaunchBase {
    /// Where hot-plugged files are pinned (`host::pin`) and the hotplug dir they come from;
    /// `None` when files go to QEMU by path.
    pub(crate) fn pins(&self) -> Option<(PathBuf, PathBuf)> {
        let dir = self.convert.pin_dir.clone()?;
        Some((dir, self.convert.paths.hotplug_dir.clone()))
    }

    /// Who QEMU runs as: what the launcher gives it is given to this owner.
    pub(crate) fn qemu_owner(&self) -> crate::host::devnode::NodeOwner {
        self.hotplug.node_owner
    }

    /// Where a launcher keeps its last accepted Sync.
    pub(crate) fn last_sync(&self) -> &Path {
        &self.hotplug.last_sync
    }

    /// Migrating over TCP: the credentials and where they were installed (`run --tls-dir`).
    pub(crate) fn migration_tls(&self) -> Option<&InstalledTls> {
        self.migration_tls.as_ref()
    }

    /// The launch options for `spec`: which of its volumes are block devices is read from the
    /// host now.
    pub(crate) fn for_spec(
        &self,
        spec: &Validated,
        spec_text: String,
        strategy: RunStrategy,
    ) -> LaunchOptions {
        let mut convert = self.convert.clone();
        convert.block_volumes =
            crate::host::block_volumes(&crate::volumes::block_candidates(spec, &convert.paths));
        LaunchOptions {
            strategy,
            convert,
            resync_interval: self.resync_interval,
            hotplug: self.hotplug.clone(),
            spec_text,
            reconnect_timeout: self.reconnect_timeout,
            host_paths: self.host_paths.clone(),
            runtime_dir: self.runtime_dir.clone(),
            incoming: false,
            block_devices: Default::default(),
            migration_tls: self.migration_tls.clone(),
        }
    }
}

/// Where a spec's host paths may lead: never into the launcher's own places (its runtime dir with
/// the saved Sync, records, libvirt's and the vTPM's state; the private and hotplug dirs; the
/// capability cache), and only under `host_disk_roots` when any are named.
pub(crate) fn host_path_policy(
    rt: &RuntimeDir,
    paths: &HostPaths,
    qemu_cache_dir: Option<&Path>,
    host_disk_roots: &[PathBuf],
) -> HostPathPolicy {
    let own_dirs: Vec<PathBuf> = [
        Some(rt.0.clone()),
        Some(paths.private_dir.clone()),
        Some(paths.hotplug_dir.clone()),
        qemu_cache_dir.map(Path::to_path_buf),
    ]
    .into_iter()
    .flatten()
    .collect();
    HostPathPolicy::new(&own_dirs, host_disk_roots)
}

/// Prepares the host side; problems that only take features away (block hotplug) are said on
/// standard output, once each, and do not stop the launcher.
pub(crate) fn prepare(request: HostRequest<'_>) -> Prepared {
    let HostRequest {
        rt,
        connect,
        qemu_cache_dir,
        paths,
        emulation,
        network,
        publish,
        log_max_size,
        resync_interval,
        reconnect_timeout,
        host_paths,
        qemu_user,
        block_allow,
        migration_tls,
        previous_qemu_id,
    } = request;
    let (events_tx, events) = mpsc::unbounded_channel();
    let backend = match &connect {
        Some(uri) => Backend::Uri(uri.clone()),
        None => Backend::Private {
            dir: rt.libvirt_dir(),
            options: DaemonOptions {
                pod_cgroups: true,
                capability_cache: qemu_cache_dir,
                qemu_user: qemu_user.clone(),
                domain_namespace: !crate::init::is_container_entrypoint(),
                migration_tls: migration_tls.clone().map(Box::new),
            },
        },
    };
    let connector = Arc::new(Connector::new(backend, events_tx));
    make_hotplug_dir(&paths.hotplug_dir);
    // Before the logs are watched: the console log may live in the console dir made here.
    let reach = give_qemu_its_dirs(rt, &paths, &qemu_user, previous_qemu_id);
    // A `--connect`ed libvirt has its own virtlogd to bound the logs.
    let logs = match &connect {
        Some(_) => None,
        None => bound_logs(rt, &paths.console_log, log_max_size),
    };
    let cgroup_roots = match CgroupRoots::detect() {
        Ok(roots) => writable_cgroups(roots, rt),
        Err(e) => {
            tracing::warn!(error = %crate::error_chain(&e), "cannot find the cgroup mounts");
            Default::default()
        }
    };
    // Block nodes are QEMU's to open (a `--connect`ed libvirt runs QEMU as its distribution's
    // account too, which is what `qemu_user` finds).
    let node_owner = crate::host::devnode::NodeOwner {
        uid: qemu_user.uid,
        gid: qemu_user.gid,
    };
    let chown_needed = nix::unistd::geteuid().as_raw() != node_owner.uid
        || nix::unistd::getegid().as_raw() != node_owner.gid;
    let effective = crate::host::caps::effective();
    say_unavailable_hotplug(&effective, &cgroup_roots, chown_needed);
    let cgroup_roots = unless_unrestricted(cgroup_roots, connect.is_some());
    let hotplug = HotplugOptions {
        allowed_block_devices: block_allow,
        node_owner,
        // Block volumes are refused, naming it, while a capability they need is missing.
        missing_capabilities: effective
            .as_ref()
            .map(|e| crate::host::caps::missing_capabilities(e, &cgroup_roots, chown_needed))
            .unwrap_or_default(),
        cgroup_roots,
        sys_dev_block: crate::host::devnode::block_device_list(),
        proc_root: "/proc".into(),
        qemu_pid_dir: match &connect {
            Some(_) => "/run/libvirt/qemu".into(),
            None => rt.libvirt_dir().join("run/qemu"),
        },
        records: rt.0.join("hotplug-records.json"),
        last_sync: rt.0.join("last-sync"),
    };
    allow_device_nodes(&paths.hotplug_dir);
    let convert = convert_options(rt, connect.as_deref(), emulation, paths, network, publish);
    Prepared {
        connector,
        events,
        base: LaunchBase {
            convert,
            hotplug,
            resync_interval,
            reconnect_timeout,
            host_paths,
            runtime_dir: rt.0.clone(),
            migration_tls: migration_tls.map(|t| t.installed),
        },
        logs,
        reach,
    }
}

/// Made at start: a node daemon puts hot-plugged image files there before a Sync.
fn make_hotplug_dir(dir: &Path) {
    if let Err(e) = fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(dir)
    {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot make the hotplug dir");
    }
}

/// Says which hotplug features the launcher's capabilities and cgroups take away.
fn say_unavailable_hotplug(
    effective: &Result<caps::CapsHashSet, crate::host::caps::CapsError>,
    cgroup_roots: &CgroupRoots,
    chown_needed: bool,
) {
    match effective {
        Ok(effective) => {
            for missing in crate::host::caps::check(effective, cgroup_roots, chown_needed) {
                say(format_args!(
                    "hotplug: {} unavailable: {}",
                    missing.feature, missing.why
                ));
            }
        }
        Err(e) => say(format_args!(
            "hotplug: cannot check capabilities: {}",
            crate::error_chain(e)
        )),
    }
    if let Some(warning) = crate::host::caps::memlock_warning_here(cgroup_roots) {
        say(format_args!("hotplug: {warning}"));
    }
}

/// Device nodes allowed in the hotplug dir (remounted without nodev where needed), or said why
/// block devices cannot be hot-plugged.
fn allow_device_nodes(hotplug_dir: &Path) {
    // As a container's PID 1 the launcher owns its mount namespace.
    let in_container = crate::init::is_container_entrypoint();
    match crate::host::devnode::allow_device_nodes(hotplug_dir, in_container) {
        Ok(true) => {
            tracing::info!(dir = %hotplug_dir.display(), "the hotplug dir was on a nodev mount; remounted it with device nodes allowed")
        }
        Ok(false) => {}
        Err(e) => say(format_args!(
            "hotplug: block device nodes unavailable: {}",
            crate::error_chain(&e)
        )),
    }
}

/// The conversion options every spec of this launcher shares.
fn convert_options(
    rt: &RuntimeDir,
    connect: Option<&str>,
    emulation: Emulation,
    paths: HostPaths,
    network: NetworkMode,
    publish: Publish,
) -> ConvertOptions {
    let claims_by_fd = connect.is_none() && crate::libvirt::supports_fd_groups();
    ConvertOptions {
        virt_type: emulation.resolve(),
        machines: Default::default(),
        block_volumes: Default::default(),
        // The private libvirtd is this host's libvirt, 9.0 or later where it was built against
        // one; a `--connect`ed one may be older than `fdgroup`.
        claims_by_fd,
        claims_refused_by: connect.map(str::to_owned),
        // Beside the private dir, not in it: a migration copies the writable disks under the
        // private dir, and a hot-plugged file is shared, never copied.
        pin_dir: claims_by_fd.then(|| rt.0.join(crate::host::pin::PIN_DIR)),
        paths,
        network,
        publish,
        // Never fails in practice; if it did, a spec asking for dedicated CPUs is refused by
        // convert with "0 available", and nothing else needs them.
        cpus: crate::host::cpus::own_cpus()
            .inspect_err(|e| tracing::warn!("{e}"))
            .unwrap_or_default(),
        // Set per conversion by the launcher, for a domain that runs.
        guest_at_boot: None,
    }
}

/// With the private libvirtd, QEMU writes its logs itself (no virtlogd): the launcher bounds
/// them for as long as it runs, from before the VM starts or is adopted (so QEMU's log dir is
/// made here, before libvirtd would make it).
fn bound_logs(rt: &RuntimeDir, console_log: &Path, max_size: u64) -> Option<LogBound> {
    let qemu_logs = PrivateDaemon::qemu_log_dir(&rt.libvirt_dir());
    if let Err(e) = fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&qemu_logs)
    {
        tracing::warn!(dir = %qemu_logs.display(), error = %e, "cannot make QEMU's log dir");
    }
    let bounded = vec![
        Bounded::File(console_log.into()),
        Bounded::LogsIn(qemu_logs),
    ];
    LogBound::start(bounded, max_size)
        .inspect_err(|e| {
            say(format_args!(
                "warning: the console and QEMU logs are not bounded: {e}"
            ))
        })
        .ok()
}

/// The private libvirtd leaves QEMU in the launcher's own cgroup. On a host that is the operator's
/// session, which restricts no device: QEMU may open any block node already, and a device rule
/// written there would restrict every process of the session, for good. So when none
/// of the launcher's device cgroups restricts anything, block hotplug writes no rule at all. A pod's
/// cgroup (the container engine's device policy) is restricted, and gets the rules.
fn unless_unrestricted(roots: CgroupRoots, connect: bool) -> CgroupRoots {
    if connect {
        // QEMU runs in the cgroup the other libvirt gives it.
        return roots;
    }
    let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let Ok(cgroups) = roots.device_cgroups_of(&own) else {
        return roots;
    };
    let unrestricted = cgroups
        .iter()
        .all(|c| crate::host::cgroup::restricts_devices(c) == Some(false));
    if unrestricted {
        say(format_args!(
            "hotplug: block devices get no cgroup rule: this launcher's cgroup restricts no \
             device, so QEMU (which runs in it) needs none, and a rule would restrict every \
             process sharing it"
        ));
        CgroupRoots::default()
    } else {
        roots
    }
}

/// In a container the cgroup v1 mounts are read-only: the devices hierarchy is mounted again,
/// read-write, in the runtime dir (needs CAP_SYS_ADMIN; without it, block hotplug is reported
/// unavailable by the capability check and file volumes work as before).
fn writable_cgroups(roots: CgroupRoots, rt: &RuntimeDir) -> CgroupRoots {
    match roots.clone().with_writable_v1(&rt.0.join("cgroup-devices")) {
        Ok(roots) => roots,
        Err(e) => {
            say(format_args!(
                "hotplug: cgroup v1 device rules unavailable: {}",
                crate::error_chain(&e)
            ));
            roots
        }
    }
}
