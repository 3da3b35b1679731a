//! The core: one launcher, one domain. It creates (or adopts) the domain, keeps the observed state
//! true by re-reading libvirt after every event, applies `Sync` (hotplug), and stops the VM
//! gracefully. Front ends (CLI, gRPC, the `run` entrypoint) only call into it.
//!
//! libvirt calls block, so they run on the blocking pool; one task (start, sync, stop) runs at a
//! time, serialised by `task_slot`.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};

use crate::convert::{self, ConvertOptions};
use crate::domain::{self, DiskDef, DomainDef};
use crate::host::{self, HostError};
use crate::hotplug::{self, Plan, PlanError};
use crate::libvirt::events::{lifecycle_event, HypervisorEvent};
use crate::libvirt::{Hypervisor, LibvirtError};
use crate::lifecycle::{self, Observation, Phase, PowerState};
use crate::spec::{self, SpecErrors, VirtualMachineInstance};

/// How long a detach may take before the volume is reported stuck in `Detaching`.
pub const DETACH_TIMEOUT: Duration = Duration::from_secs(30);
/// KubeVirt's default grace period.
pub const DEFAULT_GRACE_PERIOD: Duration = Duration::from_secs(30);
/// How long libvirt may take to report a destroyed domain as stopped.
const DESTROY_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum LauncherError {
    #[error("invalid spec:\n{0}")]
    InvalidSpec(#[from] SpecErrors),
    #[error("the spec is for {requested}, this launcher runs {running}")]
    WrongInstance { running: String, requested: String },
    #[error("cannot change {fields} while the VM runs; only disks can be hot-plugged")]
    FrozenFieldsChanged { fields: String },
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("volume {volume:?}")]
    HostDisk {
        volume: String,
        #[source]
        source: HostError,
    },
    #[error("the VM is not running (phase {phase})")]
    NotRunning { phase: Phase },
    #[error(transparent)]
    Libvirt(#[from] LibvirtError),
    #[error(transparent)]
    LiveXml(#[from] domain::LiveXmlError),
    #[error("a libvirt call panicked")]
    Join(#[source] tokio::task::JoinError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum VolumePhase {
    Pending,
    Attaching,
    Ready,
    Detaching,
    Failed,
}

impl VolumePhase {
    pub fn as_str(self) -> &'static str {
        match self {
            VolumePhase::Pending => "Pending",
            VolumePhase::Attaching => "Attaching",
            VolumePhase::Ready => "Ready",
            VolumePhase::Detaching => "Detaching",
            VolumePhase::Failed => "Failed",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeStatus {
    pub name: String,
    pub target: String,
    pub serial: String,
    pub bus: String,
    pub phase: VolumePhase,
    pub reason: String,
    pub message: String,
    /// Came with the VM at boot.
    pub boot: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlannedAction {
    Attach,
    Detach,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedChange {
    pub action: PlannedAction,
    pub volume: String,
    pub target: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncOutcome {
    pub plan: Vec<PlannedChange>,
    pub volumes: Vec<VolumeStatus>,
}

/// Everything `GetStatus` reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub phase: Phase,
    pub phase_reason: Option<&'static str>,
    pub printable_status: &'static str,
    pub power_state: Option<PowerState>,
    pub vm_state: &'static str,
    pub task_state: Option<&'static str>,
    /// `(type, status, reason, message)`
    pub conditions: Vec<(String, bool, String, String)>,
    pub volumes: Vec<VolumeStatus>,
    pub domain_name: String,
    pub libvirt_uri: String,
}

#[derive(Debug)]
struct State {
    observation: Observation,
    destroyed_after_grace: bool,
    stopping: bool,
    task: Option<&'static str>,
    volumes: BTreeMap<String, VolumeStatus>,
    /// The last Sync's failure, shown as condition `Synchronized=false`.
    sync_failure: Option<String>,
    /// The spec the running domain was made from or last synced to.
    spec: VirtualMachineInstance,
}

#[derive(Debug)]
pub struct Launcher {
    hv: Arc<Hypervisor>,
    domain_name: String,
    convert_options: ConvertOptions,
    state: Mutex<State>,
    changes: watch::Sender<Status>,
    task_slot: tokio::sync::Mutex<()>,
    removal_waiters: Mutex<HashMap<String, Vec<oneshot::Sender<()>>>>,
}

/// What `start` did with the domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartKind {
    Created,
    Adopted,
}

impl Launcher {
    /// Creates the domain from `vmi` (or adopts a running one of the same name) and starts
    /// following `events`, which must carry the events of `hv`'s connection.
    pub async fn start(
        hv: Arc<Hypervisor>,
        vmi: VirtualMachineInstance,
        convert_options: ConvertOptions,
        events: mpsc::UnboundedReceiver<HypervisorEvent>,
    ) -> Result<(Arc<Launcher>, StartKind), LauncherError> {
        let def = convert::convert(&vmi, &convert_options)
            .map_err(|convert::ConvertError::Invalid(e)| e)?;
        let name = def.name.clone();
        let state = State {
            observation: Observation::NotCreated,
            destroyed_after_grace: false,
            stopping: false,
            task: Some("Starting"),
            volumes: BTreeMap::new(),
            sync_failure: None,
            spec: vmi.clone(),
        };
        let (changes, _) = watch::channel(initial_status(&name, hv.uri()));
        let launcher = Arc::new(Launcher {
            hv,
            domain_name: name.clone(),
            convert_options,
            state: Mutex::new(state),
            changes,
            task_slot: tokio::sync::Mutex::new(()),
            removal_waiters: Mutex::new(HashMap::new()),
        });
        let pump = Arc::downgrade(&launcher);
        tokio::spawn(pump_events(pump, events));

        let slot = launcher.task_slot.lock().await;
        let existing = {
            let n = name.clone();
            launcher.blocking(move |hv| hv.exists(&n)).await?
        };
        let kind = if existing && launcher.is_active().await? {
            StartKind::Adopted
        } else {
            if existing {
                // A stopped leftover of an earlier run: start afresh from the spec.
                let n = name.clone();
                launcher.blocking(move |hv| hv.undefine(&n)).await?;
            }
            prepare_disks(&vmi, &def.disks, &launcher.convert_options)?;
            let (n, xml) = (name.clone(), def.to_xml());
            launcher
                .blocking(move |hv| hv.define_and_start(&n, &xml))
                .await?;
            StartKind::Created
        };
        launcher.rebuild_volumes(kind == StartKind::Created).await?;
        launcher.update(|s| s.task = None);
        launcher.refresh().await;
        drop(slot);
        Ok((launcher, kind))
    }

    pub fn domain_name(&self) -> &str {
        &self.domain_name
    }

    /// A receiver that sees every status change (the latest one, at least).
    pub fn subscribe(&self) -> watch::Receiver<Status> {
        self.changes.subscribe()
    }

    pub fn status(&self) -> Status {
        self.changes.borrow().clone()
    }

    async fn blocking<T, F>(&self, f: F) -> Result<T, LauncherError>
    where
        T: Send + 'static,
        F: FnOnce(&Hypervisor) -> Result<T, LibvirtError> + Send + 'static,
    {
        let hv = self.hv.clone();
        tokio::task::spawn_blocking(move || f(&hv))
            .await
            .map_err(LauncherError::Join)?
            .map_err(LauncherError::from)
    }

    async fn is_active(&self) -> Result<bool, LauncherError> {
        let n = self.domain_name.clone();
        let power = self.blocking(move |hv| hv.power_state(&n)).await?;
        Ok(power.state.is_active())
    }

    /// Changes the state and publishes the new status.
    fn update(&self, change: impl FnOnce(&mut State)) {
        let status = {
            let mut state = self.state.lock().expect("state lock");
            change(&mut state);
            self.status_of(&state)
        };
        self.changes.send_replace(status);
    }

    fn status_of(&self, s: &State) -> Status {
        let phase = lifecycle::phase(&s.observation, s.destroyed_after_grace);
        let power_state = match &s.observation {
            Observation::Domain(p) => Some(p.clone()),
            _ => None,
        };
        let vm_state = match (&s.observation, phase) {
            (_, Phase::Failed) => "Error",
            (_, Phase::Succeeded) => "Stopped",
            (Observation::Domain(p), _) if p.state == lifecycle::DomainState::Paused => "Paused",
            (Observation::NotCreated, _) => "Building",
            _ => "Active",
        };
        let mut conditions = Vec::new();
        if let Some(p) = &power_state {
            if p.state == lifecycle::DomainState::Paused {
                conditions.push(("Paused".into(), true, p.reason.clone(), String::new()));
            }
        }
        conditions.push(match &s.sync_failure {
            None => ("Synchronized".into(), true, String::new(), String::new()),
            Some(msg) => (
                "Synchronized".into(),
                false,
                "SyncFailed".into(),
                msg.clone(),
            ),
        });
        Status {
            phase,
            phase_reason: lifecycle::phase_reason(&s.observation, s.destroyed_after_grace),
            printable_status: lifecycle::printable_status(&s.observation, phase, s.stopping),
            power_state,
            vm_state,
            task_state: s.task,
            conditions,
            volumes: s.volumes.values().cloned().collect(),
            domain_name: self.domain_name.clone(),
            libvirt_uri: self.hv.uri().to_string(),
        }
    }

    /// Re-reads the real state from libvirt (never trusting an event's payload alone).
    async fn refresh(&self) {
        let n = self.domain_name.clone();
        let observation = match self.blocking(move |hv| hv.power_state(&n)).await {
            Ok(power) => Observation::Domain(power),
            Err(LauncherError::Libvirt(LibvirtError::NoDomain { .. })) => Observation::Vanished,
            Err(e) => {
                tracing::warn!(error = %crate::error_chain(&e), "cannot read the domain's state");
                Observation::Unreachable
            }
        };
        self.update(|s| s.observation = observation);
    }

    /// Rebuilds the volume list from the live XML (at start, and when adopting a domain).
    async fn rebuild_volumes(&self, all_boot: bool) -> Result<(), LauncherError> {
        let n = self.domain_name.clone();
        let xml = self.blocking(move |hv| hv.live_xml(&n)).await?;
        let live = domain::live_disks(&xml)?;
        let boot: Vec<String> = {
            let s = self.state.lock().expect("state lock");
            s.spec
                .spec
                .domain
                .devices
                .disks
                .iter()
                .map(|d| d.name.clone())
                .collect()
        };
        self.update(|s| {
            s.volumes = live
                .iter()
                .filter_map(|d| {
                    let name = d.volume()?.to_string();
                    Some((
                        name.clone(),
                        VolumeStatus {
                            boot: all_boot && boot.contains(&name),
                            name,
                            target: d.target.clone(),
                            serial: d.serial.clone().unwrap_or_default(),
                            bus: d.bus.clone(),
                            phase: VolumePhase::Ready,
                            reason: String::new(),
                            message: String::new(),
                        },
                    ))
                })
                .collect();
        });
        Ok(())
    }

    fn handle_event(&self, event: HypervisorEvent) -> Option<bool> {
        match event {
            HypervisorEvent::DeviceRemoved { domain, alias } if domain == self.domain_name => {
                let waiters = self
                    .removal_waiters
                    .lock()
                    .expect("waiters lock")
                    .remove(&alias)
                    .unwrap_or_default();
                for w in waiters {
                    let _ = w.send(());
                }
                Some(false)
            }
            // Definitions coming and going (ours, at exit) do not change the power state.
            HypervisorEvent::Lifecycle { domain, event, .. } if domain == self.domain_name => Some(
                !matches!(event, lifecycle_event::DEFINED | lifecycle_event::UNDEFINED),
            ),
            HypervisorEvent::ConnectionClosed { reason } => {
                tracing::error!(reason, "the libvirt connection closed");
                self.update(|s| s.observation = Observation::Unreachable);
                Some(false)
            }
            _ => None,
        }
    }

    fn expect_removal(&self, alias: &str) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        self.removal_waiters
            .lock()
            .expect("waiters lock")
            .entry(alias.to_string())
            .or_default()
            .push(tx);
        rx
    }

    /// Applies a whole new spec: validate, plan, then attach and detach scsi disks. Invalid
    /// input changes nothing; a failure of one volume does not stop the others.
    pub async fn sync(&self, spec_text: &str, dry_run: bool) -> Result<SyncOutcome, LauncherError> {
        let vmi = spec::parse(spec_text)?;
        let desired = convert::convert(&vmi, &self.convert_options)
            .map_err(|convert::ConvertError::Invalid(e)| e)?;
        if desired.name != self.domain_name {
            return Err(LauncherError::WrongInstance {
                running: self.domain_name.clone(),
                requested: desired.name,
            });
        }
        let _slot = self.task_slot.lock().await;
        let result = self.sync_locked(vmi, desired, dry_run).await;
        self.update(|s| {
            s.task = None;
            if !dry_run {
                s.sync_failure = result.as_ref().err().map(|e| crate::error_chain(e));
            }
        });
        result
    }

    async fn sync_locked(
        &self,
        vmi: VirtualMachineInstance,
        desired: DomainDef,
        dry_run: bool,
    ) -> Result<SyncOutcome, LauncherError> {
        let phase = self.status().phase;
        if phase != Phase::Running {
            return Err(LauncherError::NotRunning { phase });
        }
        let current = {
            let s = self.state.lock().expect("state lock");
            convert::convert(&s.spec, &self.convert_options)
                .map_err(|convert::ConvertError::Invalid(e)| e)?
        };
        let frozen = hotplug::frozen_fields_changed(&current, &desired);
        if !frozen.is_empty() {
            return Err(LauncherError::FrozenFieldsChanged {
                fields: frozen.join(", "),
            });
        }
        let n = self.domain_name.clone();
        let xml = self.blocking(move |hv| hv.live_xml(&n)).await?;
        let live = domain::live_disks(&xml)?;
        let plan = hotplug::plan(&live, &desired)?;
        let planned = planned_changes(&plan);
        if dry_run {
            return Ok(SyncOutcome {
                plan: planned,
                volumes: self.status().volumes,
            });
        }
        if !plan.is_empty() {
            self.update(|s| s.task = Some("Syncing"));
        }
        for disk in &plan.attach {
            self.attach(&vmi, disk).await;
        }
        for live_disk in &plan.detach {
            self.detach(live_disk).await;
        }
        self.update(|s| s.spec = vmi);
        Ok(SyncOutcome {
            plan: planned,
            volumes: self.status().volumes,
        })
    }

    fn set_volume(&self, disk: &DiskDef, phase: VolumePhase, reason: &str, message: String) {
        let status = VolumeStatus {
            name: disk.volume.clone(),
            target: disk.target.clone(),
            serial: disk.serial.clone().unwrap_or_default(),
            bus: disk.bus.as_str().into(),
            phase,
            reason: reason.into(),
            message,
            boot: false,
        };
        self.update(|s| {
            s.volumes.insert(disk.volume.clone(), status);
        });
    }

    async fn attach(&self, vmi: &VirtualMachineInstance, disk: &DiskDef) {
        if let Err(e) = prepare_disks(vmi, std::slice::from_ref(disk), &self.convert_options) {
            let LauncherError::HostDisk { source, .. } = &e else {
                unreachable!("prepare_disks only fails with HostDisk")
            };
            let phase = match source {
                HostError::Missing { .. } => VolumePhase::Pending,
                _ => VolumePhase::Failed,
            };
            self.set_volume(disk, phase, source.reason(), source.to_string());
            return;
        }
        self.set_volume(disk, VolumePhase::Attaching, "", String::new());
        let (n, xml) = (self.domain_name.clone(), disk.to_xml());
        match self.blocking(move |hv| hv.attach(&n, &xml, false)).await {
            Ok(()) => self.set_volume(disk, VolumePhase::Ready, "", String::new()),
            Err(e) => {
                let message = match &e {
                    LauncherError::Libvirt(l) => l.libvirt_message(),
                    other => crate::error_chain(other),
                };
                tracing::warn!(volume = %disk.volume, %message, "attach failed");
                self.set_volume(disk, VolumePhase::Failed, "AttachFailed", message);
            }
        }
    }

    async fn detach(&self, live: &domain::LiveDisk) {
        let volume = live.volume().unwrap_or_default().to_string();
        let alias = live.alias.clone().unwrap_or_default();
        let set_phase = |phase, reason: &str, message: String| {
            self.update(|s| {
                if let Some(v) = s.volumes.get_mut(&volume) {
                    v.phase = phase;
                    v.reason = reason.into();
                    v.message = message;
                }
            })
        };
        set_phase(VolumePhase::Detaching, "", String::new());
        let removed = self.expect_removal(&alias);
        let (n, xml) = (self.domain_name.clone(), live.xml.clone());
        if let Err(e) = self.blocking(move |hv| hv.detach(&n, &xml)).await {
            self.removal_waiters
                .lock()
                .expect("waiters lock")
                .remove(&alias);
            let message = match &e {
                LauncherError::Libvirt(l) => l.libvirt_message(),
                other => crate::error_chain(other),
            };
            set_phase(VolumePhase::Failed, "DetachFailed", message);
            return;
        }
        match tokio::time::timeout(DETACH_TIMEOUT, removed).await {
            Ok(Ok(())) => self.update(|s| {
                s.volumes.remove(&volume);
            }),
            _ => set_phase(
                VolumePhase::Detaching,
                "DetachTimeout",
                format!(
                    "libvirt did not report the device removed within {DETACH_TIMEOUT:?}; the next Sync retries"
                ),
            ),
        }
    }

    /// Graceful stop: ACPI power button, up to `grace` for the guest to power off, then destroy.
    /// Returns once the domain is no longer running.
    pub async fn stop(&self, grace: Duration) -> Result<(), LauncherError> {
        let _slot = self.task_slot.lock().await;
        self.update(|s| {
            s.stopping = true;
            s.task = Some("PoweringOff");
        });
        let result = self.stop_locked(grace).await;
        self.update(|s| s.task = None);
        result
    }

    async fn stop_locked(&self, grace: Duration) -> Result<(), LauncherError> {
        let mut changes = self.subscribe();
        let stopped = |s: &Status| s.phase != Phase::Running;
        if stopped(&changes.borrow_and_update()) {
            return Ok(());
        }
        if !grace.is_zero() {
            let n = self.domain_name.clone();
            if let Err(e) = self.blocking(move |hv| hv.shutdown_acpi(&n)).await {
                tracing::warn!(error = %crate::error_chain(&e), "ACPI shutdown request failed");
            }
            if tokio::time::timeout(grace, changes.wait_for(stopped))
                .await
                .is_ok()
            {
                return Ok(());
            }
            tracing::warn!(
                ?grace,
                "the guest did not power off within its grace period; destroying it"
            );
        }
        self.update(|s| s.destroyed_after_grace = !grace.is_zero());
        let n = self.domain_name.clone();
        if let Err(e) = self.blocking(move |hv| hv.destroy(&n)).await {
            // It may have stopped by itself in the meantime; the state says.
            self.refresh().await;
            if !stopped(&self.status()) {
                return Err(e);
            }
        }
        let _ = tokio::time::timeout(DESTROY_TIMEOUT, changes.wait_for(stopped)).await;
        Ok(())
    }

    /// Removes the stopped domain's definition: the launcher leaves nothing behind in libvirt.
    pub async fn undefine(&self) -> Result<(), LauncherError> {
        let n = self.domain_name.clone();
        self.blocking(move |hv| hv.undefine(&n)).await
    }
}

fn initial_status(domain_name: &str, uri: &str) -> Status {
    Status {
        phase: Phase::Scheduled,
        phase_reason: None,
        printable_status: "Starting",
        power_state: None,
        vm_state: "Building",
        task_state: Some("Starting"),
        conditions: Vec::new(),
        volumes: Vec::new(),
        domain_name: domain_name.into(),
        libvirt_uri: uri.into(),
    }
}

fn planned_changes(plan: &Plan) -> Vec<PlannedChange> {
    let attach = plan.attach.iter().map(|d| PlannedChange {
        action: PlannedAction::Attach,
        volume: d.volume.clone(),
        target: d.target.clone(),
    });
    let detach = plan.detach.iter().map(|d| PlannedChange {
        action: PlannedAction::Detach,
        volume: d.volume().unwrap_or_default().into(),
        target: d.target.clone(),
    });
    attach.chain(detach).collect()
}

/// Makes the host side of `disks` ready: checks the files and devices the spec names, creates
/// what the launcher owns (`DiskOrCreate` images, empty disks, overlays, cloud-init ISOs) where
/// `volumes` says they live.
fn prepare_disks(
    vmi: &VirtualMachineInstance,
    disks: &[DiskDef],
    opts: &ConvertOptions,
) -> Result<(), LauncherError> {
    // The VNC socket and EFI variables go there too, whatever the disks.
    host::prepare_private_dirs(&opts.paths).map_err(|source| LauncherError::HostDisk {
        volume: String::new(),
        source,
    })?;
    for disk in disks {
        let Some(volume) = vmi.spec.volumes.iter().find(|v| v.name == disk.volume) else {
            continue;
        };
        let Some(resolved) = crate::volumes::resolve(vmi, volume, &opts.paths, &opts.block_volumes)
        else {
            continue;
        };
        host::prepare_volume(&resolved).map_err(|source| LauncherError::HostDisk {
            volume: disk.volume.clone(),
            source,
        })?;
    }
    Ok(())
}

/// Follows libvirt's events for as long as the launcher lives. Lifecycle events trigger a re-read
/// of the real state; device removals wake the detach that waits for them.
async fn pump_events(
    launcher: std::sync::Weak<Launcher>,
    mut events: mpsc::UnboundedReceiver<HypervisorEvent>,
) {
    while let Some(event) = events.recv().await {
        let Some(launcher) = launcher.upgrade() else {
            return;
        };
        tracing::debug!(?event, "libvirt event");
        if launcher.handle_event(event) == Some(true) {
            launcher.refresh().await;
        }
    }
}

/// Where the launcher keeps what it owns for one VM.
#[derive(Debug, Clone)]
pub struct RuntimeDir(pub PathBuf);

impl RuntimeDir {
    pub fn socket(&self) -> PathBuf {
        self.0.join("launcher.sock")
    }
    pub fn console_log(&self) -> PathBuf {
        self.0.join("console.log")
    }
    pub fn libvirt_dir(&self) -> PathBuf {
        self.0.join("libvirt")
    }
}
