//! What virt-handler's calls do to the launcher. A virt-launcher starts with no VM: the first
//! `SyncVirtualMachine` brings the launcher up (defines and starts the domain), later ones are
//! launcher Syncs (hotplug). KubeVirt's few rules of its own live here: a VM the user paused
//! stays paused through Syncs while any other pause is resumed; a Shutdown stamps the grace
//! period's start once; Delete removes the definition and the domain then reads as gone.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};

use super::domain_json::{self, DomainMeta};
pub(crate) use super::errors::FrontError;
use super::errors::MigrationError;
use super::flags::VirtLauncherFlags;
use super::guest_agent;
use super::vmi;
use crate::host::qemu_user::QemuUser;
use crate::launcher::{
    Launcher, LauncherError, MigrationRole, MigrationState, SyncInput, VolumePhase,
};
use crate::libvirt::events::HypervisorEvent;
use crate::libvirt::{Connector, MAX_AGENT_ANSWER};
use crate::lifecycle::{Command, DomainState, PowerState, Refusal, RunStrategy};
use crate::run::LaunchBase;

/// How long one call's guest agent commands may take together: under virt-handler's 5 s
/// deadline for `GetGuestInfo` and the like (its `shortTimeout`), so that a hung agent costs an
/// answer with less in it, not a failed call.
const AGENT_BUDGET: Duration = Duration::from_secs(4);

/// What the launcher tells virt-handler about the VMI beyond libvirt's XML.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Meta {
    pub domain: DomainMeta,
    /// Paused by `PauseVirtualMachine`: a Sync does not resume it.
    pub user_paused: bool,
    /// `DeleteVirtualMachine` removed the definition.
    pub deleted: bool,
}

/// The state behind the cmd server.
#[derive(Debug)]
pub(crate) struct Front {
    pub flags: VirtLauncherFlags,
    base: LaunchBase,
    connector: Arc<Connector>,
    events: Mutex<Option<mpsc::UnboundedReceiver<HypervisorEvent>>>,
    launcher: OnceLock<Arc<Launcher>>,
    /// Held while the first Sync creates the launcher: a second Sync waits, then syncs.
    creating: tokio::sync::Mutex<()>,
    meta: watch::Sender<Meta>,
    /// QEMU's version, once asked.
    pub qemu_version: OnceLock<String>,
    /// Who QEMU runs as: a migration target gives it the dir it listens in.
    pub qemu_user: QemuUser,
    /// The domain's live XML as last read: once the VM left by migration, virt-handler still
    /// sees it, shut off because it migrated, until it deletes it (as KubeVirt's source
    /// keeps its domain defined).
    last_xml: Mutex<Option<String>>,
    /// The thaw a freeze armed for when its `unfreezeTimeoutSeconds` pass.
    pub(super) safety_thaw: SafetyThaw,
}

impl Front {
    pub(crate) fn new(
        flags: VirtLauncherFlags,
        base: LaunchBase,
        connector: Arc<Connector>,
        events: mpsc::UnboundedReceiver<HypervisorEvent>,
        qemu_user: QemuUser,
    ) -> Front {
        let meta = Meta {
            domain: DomainMeta {
                name: flags.name.clone(),
                namespace: flags.namespace.clone(),
                uid: flags.uid.clone(),
                grace_period_seconds: Some(flags.grace_period_seconds),
                pins: base.pins(),
                ..DomainMeta::default()
            },
            ..Meta::default()
        };
        Front {
            flags,
            base,
            connector,
            events: Mutex::new(Some(events)),
            launcher: OnceLock::new(),
            creating: tokio::sync::Mutex::new(()),
            meta: watch::channel(meta).0,
            qemu_version: OnceLock::new(),
            qemu_user,
            last_xml: Mutex::new(None),
            safety_thaw: Default::default(),
        }
    }

    pub(crate) fn launcher(&self) -> Option<&Arc<Launcher>> {
        self.launcher.get()
    }

    pub(crate) fn connector(&self) -> &Arc<Connector> {
        &self.connector
    }

    pub(crate) fn meta(&self) -> Meta {
        self.meta.borrow().clone()
    }

    /// Sees every change of [`Meta`] (and the launcher's creation, which changes it).
    pub(crate) fn subscribe_meta(&self) -> watch::Receiver<Meta> {
        self.meta.subscribe()
    }

    pub(crate) fn update_meta(&self, change: impl FnOnce(&mut Meta)) {
        self.meta.send_modify(change);
    }

    /// virt-handler's VMI, read and checked to be this launcher's.
    pub(super) fn handler_vmi(&self, vmi_json: &[u8]) -> Result<vmi::HandlerSync, FrontError> {
        let sync = vmi::from_handler(vmi_json)?;
        let expected = (self.flags.namespace.as_str(), self.flags.name.as_str());
        if !expected.1.is_empty() && (sync.namespace.as_str(), sync.name.as_str()) != expected {
            return Err(FrontError::WrongVmi {
                expected: format!("{}/{}", expected.0, expected.1),
                got: format!("{}/{}", sync.namespace, sync.name),
            });
        }
        Ok(sync)
    }

    /// `SyncVirtualMachine`: the first creates the domain, later ones hot-plug.
    pub(crate) async fn sync(&self, vmi_json: &[u8]) -> Result<(), FrontError> {
        let sync = self.handler_vmi(vmi_json)?;
        if !sync.not_mounted.is_empty() {
            tracing::info!(volumes = ?sync.not_mounted, "hotplug volumes not mounted into the pod yet; left for a later Sync");
        }
        if self.meta.borrow().deleted {
            return Err(FrontError::Deleted);
        }
        let launcher = match self.launcher.get() {
            Some(l) => l.clone(),
            None => {
                let _creating = self.creating.lock().await;
                match self.launcher.get() {
                    Some(l) => l.clone(),
                    None => return self.create(sync, false).await.map(drop),
                }
            }
        };
        if vm_is_down(&launcher) {
            // KubeVirt's launcher starts a domain only for a VMI that never ran: a guest that
            // powered off stays off, and virt-handler, which may sync once more before it sees
            // that, is answered success (it makes the VMI final from the domain).
            tracing::info!("the VM is down; a Sync has nothing to change");
            return Ok(());
        }
        let outcome = match self.sync_running(&launcher, sync).await {
            // The guest powered off between the look above and the Sync's own admission (which
            // reads the state the stop event has just brought): the same answer as above.
            Err(FrontError::Launcher(LauncherError::Refused(Refusal::WrongState { .. })))
                if vm_is_down(&launcher) =>
            {
                tracing::info!("the VM went down as the Sync came; it has nothing to change");
                return Ok(());
            }
            result => result?,
        };
        let failed: Vec<String> = outcome
            .volumes
            .iter()
            .filter(|v| v.phase == VolumePhase::Failed)
            .map(|v| format!("{}: {}", v.name, v.message))
            .collect();
        if failed.is_empty() {
            Ok(())
        } else {
            Err(FrontError::Volumes(failed.join("; ")))
        }
    }

    /// The VMI applied to the running VM by the launcher's Sync (disks, interfaces, vCPUs,
    /// memory: whatever differs), what KubeVirt keeps beside the domain noted, and a VM paused
    /// by anything but its user resumed.
    pub(super) async fn sync_running(
        &self,
        launcher: &Launcher,
        sync: vmi::HandlerSync,
    ) -> Result<crate::launcher::SyncOutcome, FrontError> {
        let grace = sync
            .spec
            .spec
            .termination_grace_period_seconds
            .and_then(|g| i64::try_from(g).ok());
        let outcome = launcher
            .sync_validated(
                SyncInput {
                    spec: sync.spec_text,
                    ..SyncInput::default()
                },
                sync.spec,
            )
            .await?;
        self.meta.send_if_modified(|m| {
            let uid_changed = m.domain.uid != sync.uid;
            m.domain.uid = sync.uid;
            let grace_changed = grace.is_some() && m.domain.grace_period_seconds != grace;
            if grace.is_some() {
                m.domain.grace_period_seconds = grace;
            }
            uid_changed || grace_changed
        });
        self.resume_unless_user_paused(launcher).await?;
        Ok(outcome)
    }

    /// `SyncMigrationTarget`: the launcher of a VM that comes by migration (its disks made, no
    /// domain), created once; true when this call created it. A launcher that runs its own VM
    /// is no target.
    pub(super) async fn start_incoming(
        &self,
        sync: vmi::HandlerSync,
    ) -> Result<(Arc<Launcher>, bool), FrontError> {
        if self.meta.borrow().deleted {
            return Err(FrontError::Deleted);
        }
        let _creating = self.creating.lock().await;
        if let Some(launcher) = self.launcher.get() {
            let target = launcher
                .status()
                .migration
                .is_some_and(|m| m.role == MigrationRole::Target && !m.state.is_over());
            return if target {
                Ok((launcher.clone(), false))
            } else {
                Err(MigrationError::NotATarget.into())
            };
        }
        Ok((self.create(sync, true).await?, true))
    }

    /// The first Sync (or a migration target's `SyncMigrationTarget`, `incoming`): validate,
    /// then define and start the domain (or make its disks and wait for it).
    async fn create(
        &self,
        sync: vmi::HandlerSync,
        incoming: bool,
    ) -> Result<Arc<Launcher>, FrontError> {
        let spec = sync.spec;
        crate::run::warn_if_cpus_shared(&spec);
        let grace = spec.spec.termination_grace_period_seconds;
        // The VM runs once, as a VMI does: restarting it is the controller's decision.
        let mut options = self
            .base
            .for_spec(&spec, sync.spec_text.clone(), RunStrategy::Once);
        options.incoming = incoming;
        let Some(source) = self.events.lock().expect("events lock").take() else {
            return Err(FrontError::Launcher(LauncherError::Unreachable));
        };
        let (events, lent) = lend_events(source);
        let (launcher, kind) =
            match Launcher::start(self.connector.clone(), spec, options, events).await {
                Ok(started) => started,
                Err(e) => {
                    // virt-handler retries a first Sync that failed (a volume not there yet, a
                    // QEMU that did not start): the next attempt needs libvirt's events again.
                    if let Some(source) = lent.give_back().await {
                        *self.events.lock().expect("events lock") = Some(source);
                    }
                    return Err(e.into());
                }
            };
        tracing::info!(domain = launcher.domain_name(), ?kind, "domain up");
        let _ = self.launcher.set(launcher.clone());
        self.meta.send_modify(|m| {
            m.domain.name = sync.name;
            m.domain.namespace = sync.namespace;
            m.domain.uid = sync.uid;
            if let Some(g) = grace {
                m.domain.grace_period_seconds = Some(g as i64);
            }
        });
        Ok(launcher)
    }

    /// KubeVirt resumes a VM paused for any reason but the user's (an I/O error once the
    /// storage is back, a start that left it paused) when it syncs.
    async fn resume_unless_user_paused(&self, launcher: &Launcher) -> Result<(), FrontError> {
        if self.meta.borrow().user_paused {
            return Ok(());
        }
        let status = launcher.status();
        let paused = status
            .power_state
            .as_ref()
            .is_some_and(|p| p.state == DomainState::Paused && p.reason != "user");
        if paused {
            tracing::info!("resuming a VM not paused by its user");
            launcher.command(Command::Unpause, None).await?;
        }
        Ok(())
    }

    /// No domain was ever created, or it was deleted: a stop has nothing to do.
    fn nothing_to_stop(&self) -> bool {
        self.meta.borrow().deleted || self.launcher.get().is_none()
    }

    pub(super) fn running(&self) -> Result<&Arc<Launcher>, FrontError> {
        if self.meta.borrow().deleted {
            return Err(FrontError::Deleted);
        }
        self.launcher.get().ok_or(FrontError::NoDomain)
    }

    /// An owner's command on the VM.
    pub(crate) async fn command(&self, command: Command) -> Result<(), FrontError> {
        // Killing what does not exist or is already off leaves it as asked, as KubeVirt's
        // launcher answers (virt-handler's kill after the grace period may meet a guest that
        // powered off a moment before).
        if command == Command::Kill && self.nothing_to_stop() {
            return Ok(());
        }
        let launcher = self.running()?.clone();
        if command == Command::Kill && vm_is_down(&launcher) {
            return Ok(());
        }
        if command == Command::Pause {
            self.meta.send_modify(|m| m.user_paused = true);
        }
        let result = launcher.command(command, None).await;
        match (command, &result) {
            (Command::Unpause, Ok(_)) => self.meta.send_modify(|m| m.user_paused = false),
            (Command::Pause, Err(_)) => self.meta.send_modify(|m| m.user_paused = false),
            _ => {}
        }
        result.map(drop).map_err(FrontError::from)
    }

    /// `ShutdownVirtualMachine`, as KubeVirt's `SignalShutdownVMI`: the ACPI power button,
    /// pressed once, and the grace period's start stamped (once); the answer does not wait for
    /// the guest. virt-handler keeps the grace period: it presses again every few seconds until
    /// it sees the guest off, and kills it once the period is over. A VM already down is left as
    /// it is, successfully.
    pub(crate) async fn shutdown(&self) -> Result<(), FrontError> {
        if self.nothing_to_stop() {
            return Ok(());
        }
        let launcher = self.running()?.clone();
        if vm_is_down(&launcher) {
            return Ok(());
        }
        self.meta.send_if_modified(|m| {
            if m.domain.grace_deletion_timestamp.is_some() {
                return false;
            }
            m.domain.grace_deletion_timestamp = Some(now_rfc3339());
            true
        });
        launcher
            .press_power_button()
            .await
            .map_err(FrontError::from)
    }

    /// `DeleteVirtualMachine`: the definition goes (the VM is stopped first if it runs). A
    /// domain that is already gone (deleted, or the launcher is ending) is deleted: KubeVirt's
    /// launcher answers success when it cannot find the domain, and virt-handler's final
    /// cleanup depends on it.
    pub(crate) async fn delete(&self) -> Result<(), FrontError> {
        if self.meta.borrow().deleted {
            return Ok(());
        }
        let Some(launcher) = self.launcher.get().cloned() else {
            return Ok(());
        };
        launcher.delete_domain().await?;
        self.meta.send_modify(|m| {
            m.deleted = true;
            m.domain.deletion_timestamp = Some(now_rfc3339());
        });
        Ok(())
    }

    /// `stats.DomainStats` of the domain as JSON, or `None` when there is no domain.
    pub(crate) async fn domain_stats(&self) -> Result<Option<serde_json::Value>, FrontError> {
        // The domain's JSON first: the stats name interfaces and disks by its aliases.
        let Some(domain) = self.domain().await? else {
            return Ok(None);
        };
        let Some(launcher) = self.launcher.get() else {
            return Ok(None);
        };
        let Some(stats) = launcher.domain_stats().await? else {
            return Ok(None);
        };
        let params: Vec<(String, domain_json::StatValue)> = stats
            .params
            .into_iter()
            .map(|(name, value)| (name, value.into()))
            .collect();
        Ok(Some(domain_json::domain_stats_json(
            launcher.domain_name(),
            &stats.uuid,
            &params,
            &domain_json::device_aliases(&domain),
        )))
    }

    /// The guest agent's answers to `commands` (each one's `return`), asked only when libvirt
    /// says the agent is connected; empty when there is no domain or no agent. A command that
    /// fails or answers nonsense is left out: the agent's data is a courtesy, not vital.
    pub(crate) async fn guest_agent(&self, commands: &[&str]) -> guest_agent::Answers {
        let mut answers = guest_agent::Answers::new();
        let Some(launcher) = self.launcher.get() else {
            return answers;
        };
        if self.meta.borrow().deleted {
            return answers;
        }
        let xml = match launcher.live_xml().await {
            Ok(Some(xml)) => xml,
            Ok(None) => return answers,
            Err(e) => {
                tracing::debug!("guest agent: no live XML: {e}");
                return answers;
            }
        };
        if !guest_agent::agent_connected(&xml) {
            return answers;
        }
        let deadline = Instant::now() + AGENT_BUDGET;
        for command in commands {
            // libvirt's agent timeout is in whole seconds.
            let left = deadline.saturating_duration_since(Instant::now()).as_secs();
            if left == 0 {
                tracing::debug!(command, "guest agent: out of time, not asked");
                break;
            }
            let request = serde_json::json!({ "execute": command }).to_string();
            let secs = i32::try_from(left).unwrap_or(i32::MAX);
            match launcher.agent_command(&request, secs).await {
                Ok(answer) => match guest_agent::agent_return(&answer, MAX_AGENT_ANSWER) {
                    Some(value) => {
                        answers.insert(command.to_string(), value);
                    }
                    None => tracing::debug!(command, "guest agent: no usable answer"),
                },
                Err(e) => tracing::debug!(command, "guest agent: {e}"),
            }
        }
        answers
    }

    /// The domain as virt-handler decodes it, or `None` when there is none.
    pub(crate) async fn domain(&self) -> Result<Option<serde_json::Value>, FrontError> {
        let meta = self.meta();
        let Some(launcher) = self.launcher.get() else {
            return Ok(None);
        };
        if meta.deleted {
            return Ok(None);
        }
        let status = launcher.status();
        let (xml, power) = match launcher.live_xml().await? {
            Some(xml) => {
                *self.last_xml.lock().expect("xml lock") = Some(xml.clone());
                (xml, status.power_state)
            }
            None => {
                // libvirt undefines the source's domain once the target has the guest, a
                // moment before the migration's call returns: gone while migrating is migrated.
                let migrated = status.migration.is_some_and(|m| {
                    m.role == MigrationRole::Source
                        && matches!(
                            m.state,
                            MigrationState::Migrating | MigrationState::Completed
                        )
                });
                let last = self.last_xml.lock().expect("xml lock").clone();
                match last.filter(|_| migrated) {
                    // libvirt's words for a domain that left by migration.
                    Some(xml) => (
                        xml,
                        Some(PowerState {
                            state: DomainState::Shutoff,
                            reason: "migrated".into(),
                        }),
                    ),
                    None => return Ok(None),
                }
            }
        };
        domain_json::domain_json(&xml, &meta.domain, power.as_ref())
            .map(Some)
            .map_err(FrontError::DomainJson)
    }
}

/// libvirt's events, lent to one attempt at starting the launcher: [`Launcher::start`] takes the
/// receiver and drops it when it fails, and the connection has only one. The attempt gets a
/// channel of its own, fed from the connection's by a task that hands that back when asked.
struct LentEvents {
    give_back: tokio::sync::oneshot::Sender<()>,
    forwarder: tokio::task::JoinHandle<mpsc::UnboundedReceiver<HypervisorEvent>>,
}

impl LentEvents {
    /// The connection's receiver, once the attempt is over (`None` if the forwarder is gone).
    async fn give_back(self) -> Option<mpsc::UnboundedReceiver<HypervisorEvent>> {
        let _ = self.give_back.send(());
        self.forwarder.await.ok()
    }
}

fn lend_events(
    mut source: mpsc::UnboundedReceiver<HypervisorEvent>,
) -> (mpsc::UnboundedReceiver<HypervisorEvent>, LentEvents) {
    let (tx, rx) = mpsc::unbounded_channel();
    let (give_back, mut asked) = tokio::sync::oneshot::channel::<()>();
    let forwarder = tokio::spawn(async move {
        // Dropping `give_back` (the attempt succeeded) is not asking: forward for good.
        let mut may_ask = true;
        loop {
            tokio::select! {
                biased;
                asked_back = &mut asked, if may_ask => match asked_back {
                    Ok(()) => return source,
                    Err(_) => may_ask = false,
                },
                () = tx.closed(), if !may_ask => return source,
                event = source.recv() => match event {
                    Some(event) => {
                        // An event for a failed attempt's domain: the next attempt reads the
                        // domain afresh, so it is not needed.
                        let _ = tx.send(event);
                    }
                    None => return source,
                },
            }
        }
    });
    (
        rx,
        LentEvents {
            give_back,
            forwarder,
        },
    )
}

/// Now, as Kubernetes writes a `metav1.Time`.
pub(crate) fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

/// The armed safety thaw, aborted by a thaw or a new freeze; and the turn that freezes and
/// thaws take one at a time (a safety thaw must not interleave with a freeze asked meanwhile).
#[derive(Debug, Default)]
pub(crate) struct SafetyThaw(
    Mutex<Option<tokio::task::JoinHandle<()>>>,
    pub(super) tokio::sync::Mutex<()>,
);

impl SafetyThaw {
    pub(super) fn cancel(&self) {
        if let Some(task) = self.0.lock().expect("safety thaw lock").take() {
            task.abort();
        }
    }

    pub(super) fn arm(&self, task: tokio::task::JoinHandle<()>) {
        if let Some(old) = self.0.lock().expect("safety thaw lock").replace(task) {
            old.abort();
        }
    }
}

/// The guest is not running and will not by itself: its domain is seen off (shut off or
/// crashed) or the launcher's VM is over. A domain whose state is not known (libvirt
/// unreachable) is not down: a call on it fails, and virt-handler retries, as with KubeVirt's
/// launcher, whose calls fail when it cannot read the state.
pub(super) fn vm_is_down(launcher: &Launcher) -> bool {
    let status = launcher.status();
    status.finished || status.power_state.is_some_and(|p| !p.state.is_active())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reboot(domain: &str) -> HypervisorEvent {
        HypervisorEvent::Reboot {
            domain: domain.into(),
        }
    }

    #[tokio::test]
    async fn a_failed_attempt_gives_the_connections_events_back() {
        let (tx, source) = mpsc::unbounded_channel();
        let (attempt, lent) = lend_events(source);
        // The attempt failed: Launcher::start dropped its receiver.
        drop(attempt);
        let mut source = lent.give_back().await.expect("the receiver comes back");
        tx.send(reboot("later")).unwrap();
        assert!(
            matches!(source.recv().await, Some(HypervisorEvent::Reboot { domain }) if domain == "later")
        );
    }

    #[tokio::test]
    async fn a_started_launcher_keeps_getting_events() {
        let (tx, source) = mpsc::unbounded_channel();
        let (mut attempt, lent) = lend_events(source);
        // The attempt succeeded: nothing is given back, the forwarder goes on.
        drop(lent.give_back);
        for name in ["a", "b"] {
            tx.send(reboot(name)).unwrap();
            assert!(
                matches!(attempt.recv().await, Some(HypervisorEvent::Reboot { domain }) if domain == name)
            );
        }
    }
}
