//! The CPU and memory part of a Sync: a changed `sockets` sets the enabled vCPUs, a changed
//! `guest` memory sets virtio-mem's requested size, both live and in the persistent definition,
//! each with a result of its own. What the domain has is read from libvirt, not remembered.
//!
//! A vCPU decrease is not tried live: it goes to the persistent definition and waits for the
//! next boot, shown as `RestartRequired` (KubeVirt does the same: its VM controller never
//! unplugs vCPUs, it sets `RestartRequired`). Under QEMU 7.2 a live unplug never completes
//! (QEMU reports only the vCPU's lapic deleted), libvirt times out and keeps counting the vCPU
//! the guest let go of, and no later Sync reaches it; the launcher cannot tell beforehand
//! whether this QEMU would complete one, so it never starts one. Memory goes down live:
//! virtio-mem gives back what the guest lets go of.

use super::coordinator::Launcher;
use super::error::{libvirt_message, LauncherError};
use super::live_view::LiveKey;
use super::types::{ResourceChange, ResourcePart};
use crate::domain::{self, DomainDef, LiveResources};
use crate::spec::{FieldError, Problem, SpecErrors, Validated};
use crate::tricks::{enabled, Trick};

/// What a Sync does to vCPUs and memory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ResizePlan {
    /// What the reply reports, CPUs first.
    pub changes: Vec<ResourceChange>,
    /// The spec asks again for the vCPUs the guest has while a decrease waits in the persistent
    /// definition: that count goes back there, and the guest is not touched.
    pub withdraw_decrease: Option<u32>,
}

impl ResizePlan {
    /// Whether it changes the running guest's vCPUs (an increase; a decrease waits).
    pub(super) fn changes_vcpus_live(&self) -> bool {
        self.changes
            .iter()
            .any(|c| c.part == ResourcePart::Cpu && !c.at_restart)
    }
}

/// The resizes from `live` to `desired`; `next_boot`: the vCPUs the persistent definition
/// enables (read when `desired` has room for CPU hotplug).
pub(super) fn plan(
    live: &LiveResources,
    next_boot: Option<u32>,
    desired: &DomainDef,
) -> ResizePlan {
    let mut plan = ResizePlan::default();
    if let Some(vcpus) = desired.vcpus_enabled {
        // Unknown counts as different: setting it again is harmless.
        let next_boot_differs = next_boot != Some(vcpus);
        let cpu = |at_restart| ResourceChange {
            part: ResourcePart::Cpu,
            from: live.vcpus.into(),
            to: vcpus.into(),
            error: None,
            at_restart,
        };
        match vcpus.cmp(&live.vcpus) {
            std::cmp::Ordering::Greater => plan.changes.push(cpu(false)),
            std::cmp::Ordering::Less if next_boot_differs => plan.changes.push(cpu(true)),
            // Already waiting in the persistent definition: nothing more to do.
            std::cmp::Ordering::Less => {}
            std::cmp::Ordering::Equal if next_boot_differs => plan.withdraw_decrease = Some(vcpus),
            std::cmp::Ordering::Equal => {}
        }
    }
    if let (Some(asked), Some(has)) = (desired.virtio_mem, &live.virtio_mem) {
        if asked.requested_kib != has.requested_kib {
            plan.changes.push(ResourceChange {
                part: ResourcePart::Memory,
                from: live.requested_kib(),
                to: live.memory_at_boot_kib + asked.requested_kib,
                error: None,
                at_restart: false,
            });
        }
    }
    plan
}

/// A Sync may not ask for less memory than the running guest booted with: virtio-mem only
/// holds what was added since.
pub(super) fn check_not_below_boot(vmi: &Validated, boot_bytes: u64) -> Result<(), SpecErrors> {
    let room = vmi
        .spec
        .domain
        .memory
        .as_ref()
        .is_some_and(|m| m.max_guest.is_some());
    let guest = vmi.guest_memory();
    // Without room, any change of `guest` is one of the boot memory: refused as frozen.
    if room && guest < boot_bytes {
        return Err(SpecErrors(vec![FieldError::new(
            "spec.domain.memory.guest",
            Problem::BelowBootMemory {
                bytes: guest,
                boot: boot_bytes,
            },
        )]));
    }
    Ok(())
}

impl Launcher {
    /// Reads the live XML once and shows its vCPUs, memory and interfaces in the status.
    pub(super) fn refresh_live(
        &self,
    ) -> Result<(LiveResources, Vec<domain::LiveInterface>), LauncherError> {
        let n = self.domain_name.clone();
        let agent_events = self.agent_events();
        let key = self.resources_key_now();
        let xml = self.call(move |hv| hv.live_xml(&n))?;
        self.show_live(&xml, agent_events, key)
    }

    /// The key of a read of the vCPUs and memory about to be made: taken before it, so that
    /// anything that happens during the read moves it.
    pub(super) fn resources_key_now(&self) -> LiveKey {
        self.live.resources_key(crate::libvirt::delivered::count())
    }

    /// The vCPUs and memory as last read or resized, when libvirt's events since say they still
    /// hold (`LiveView::resources`).
    pub(super) fn kept_resources(&self) -> Option<LiveResources> {
        let log = &crate::libvirt::delivered::between;
        self.live
            .resources(self.resources_key_now(), &self.domain_name, log)
    }

    /// `kept` with the vCPUs enabled now, read on their own: libvirt tells of no vCPU count
    /// changed live, and a live change planned from a count someone else moved could unplug.
    pub(super) fn with_vcpus_now(
        &self,
        kept: LiveResources,
    ) -> Result<LiveResources, LauncherError> {
        let n = self.domain_name.as_str();
        let vcpus = self.call(|hv| hv.vcpus_now(n))?;
        Ok(LiveResources { vcpus, ..kept })
    }

    /// What the guest has plugged of the launcher's virtio-mem device (`alias`), as QEMU's
    /// size-change event says, in the status and in what the live-state cache keeps. The event
    /// says what a read of the live XML would (libvirt updates it from the same event); read
    /// only while nothing was read yet. A guest plugs block after block, an event a second: a
    /// read for each made a Sync that came meanwhile wait behind it.
    pub(super) fn show_plugged(&self, alias: &str, size_kib: u64) {
        if alias != domain::VirtioMemDef::ALIAS {
            return;
        }
        let mut shown = false;
        self.update(|s| {
            if let Some(mem) = s.resources.as_mut().and_then(|r| r.virtio_mem.as_mut()) {
                mem.current_kib = size_kib;
                shown = true;
            }
        });
        self.live.guest_plugged(size_kib);
        if !shown {
            if let Err(e) = self.refresh_live() {
                tracing::debug!(error = %crate::error_chain(&e), "cannot read the resources");
            }
        }
    }

    /// How many agent events the state has taken: read before a live XML read, for `show_live`.
    pub(super) fn agent_events(&self) -> u64 {
        self.state.lock().expect("state lock").agent_events
    }

    /// Shows the vCPUs, memory, interfaces and the guest agent's state of the live XML `xml` in
    /// the status (read at every start and adoption: the agent may have connected before the
    /// launcher listened for its events). The agent's state only if no agent event came since
    /// `agent_events` (taken before `xml` was read): the event is newer.
    /// `key`: taken before `xml` was read, under which its vCPUs and memory are kept.
    pub(super) fn show_live(
        &self,
        xml: &str,
        agent_events: u64,
        key: LiveKey,
    ) -> Result<(LiveResources, Vec<domain::LiveInterface>), LauncherError> {
        // One parse for the three readings: this runs after every Sync, resize and rebuild.
        let doc = roxmltree::Document::parse(xml).map_err(domain::LiveXmlError::Malformed)?;
        let resources = domain::live_resources_in(&doc)?;
        let interfaces = domain::live_interfaces_in(&doc)?;
        let statuses = super::reconciler::interface_statuses(&interfaces);
        let agent = domain::agent_connected_in(&doc);
        self.update(|s| {
            s.resources = Some(resources.clone());
            s.interfaces = statuses;
            if s.agent_events == agent_events {
                s.agent_connected = agent;
            }
        });
        self.live.keep_resources(key, resources.clone());
        Ok((resources, interfaces))
    }

    /// The memory (bytes) the running domain booted with, as last read.
    pub(super) fn memory_at_boot(&self) -> Option<u64> {
        let s = self.state.lock().expect("state lock");
        s.resources.as_ref().map(|r| r.memory_at_boot_kib * 1024)
    }

    /// The vCPUs the persistent definition enables, when [`plan`] needs them: `desired` has
    /// room to change them and asks for no more than `live` has (an increase is planned
    /// whatever the persistent definition says; a decrease or the same count look there for
    /// a decrease already waiting).
    pub(super) fn vcpus_at_next_boot(
        &self,
        desired: &DomainDef,
        live: &LiveResources,
    ) -> Result<Option<u32>, LauncherError> {
        if desired.vcpus_enabled.is_none_or(|asked| asked > live.vcpus) {
            return Ok(None);
        }
        if let Some(known) = self.live.next_boot_vcpus() {
            return Ok(Some(known));
        }
        let n = self.domain_name.as_str();
        let read = self.call(|hv| hv.vcpus_at_next_boot(n))?;
        self.live.keep_next_boot_vcpus(Some(read));
        Ok(Some(read))
    }

    /// Shows in the status what the resizes `done` from `live` left the domain with, when all
    /// of them succeeded and the trick is played ([`Trick::AppliedResize`]): libvirt's live
    /// definition then has exactly that (the vCPUs it enabled, virtio-mem's new requested size;
    /// what the guest has plugged comes with QEMU's size-change event), so reading it back costs
    /// a round trip and a parse of the whole domain for nothing new. False if the caller must
    /// read it (`refresh_live`): a resize failed, perhaps half done.
    pub(super) fn show_resized(&self, live: &LiveResources, done: &[ResourceChange]) -> bool {
        if !enabled(Trick::AppliedResize) || done.iter().any(|c| c.error.is_some()) {
            return false;
        }
        let resized = resized(live, done);
        self.update(|s| s.resources = Some(resized.clone()));
        self.live.keep_resources(self.resources_key_now(), resized);
        true
    }

    /// Applies each planned resize; one failing does not stop the next. The caller shows the
    /// outcome afterwards (`show_resized`, else `refresh_live`).
    pub(super) fn resize(&self, plan: ResizePlan, live: &LiveResources) -> Vec<ResourceChange> {
        if plan.changes.is_empty() && plan.withdraw_decrease.is_none() {
            return Vec::new();
        }
        let name = self.domain_name.as_str();
        // What was kept, and any read that began before, no longer holds; nor one that began
        // during the calls (bumped again after them).
        self.live.forget_resources();
        if let Some(count) = plan.withdraw_decrease {
            // Not a change of the guest, so not in the reply; the status shows the condition
            // gone (it compares the spec with the guest).
            tracing::info!(vcpus = count, "a waiting vCPU decrease is taken back");
            let set = self.call(|hv| hv.set_vcpus_at_next_boot(name, count));
            self.live
                .keep_next_boot_vcpus(set.as_ref().ok().map(|_| count));
            if let Err(e) = set {
                let error = libvirt_message(&e);
                tracing::warn!(%error, "cannot take the waiting vCPU decrease back; a start boots the spec all the same");
            }
        }
        let mut done = Vec::with_capacity(plan.changes.len());
        for change in plan.changes {
            let result = match change.part {
                ResourcePart::Cpu => {
                    // Live and persistent, or (a decrease) persistent only: the next boot's
                    // count either way, if libvirt took it.
                    let count = change.to as u32;
                    let set = if change.at_restart {
                        self.call(|hv| hv.set_vcpus_at_next_boot(name, count))
                    } else {
                        self.call(|hv| hv.set_vcpus(name, count))
                    };
                    self.live
                        .keep_next_boot_vcpus(set.as_ref().ok().map(|_| count));
                    set
                }
                ResourcePart::Memory => {
                    // Planned only for a domain that has the device. The guest plugs or
                    // unplugs at its own pace: the size-change events tell how far it got.
                    let device = live.virtio_mem.as_ref().expect("a virtio-mem device");
                    let added = change.to - live.memory_at_boot_kib;
                    self.call(|hv| hv.update_device(name, &device.asking(added)))
                }
            };
            let error = result.err().map(|e| libvirt_message(&e));
            if let Some(error) = &error {
                tracing::warn!(part = change.part.as_str(), %error, "resize failed");
            }
            done.push(ResourceChange { error, ..change });
        }
        self.live.forget_resources();
        done
    }
}

/// What `live` is once the resizes `done` all succeeded: a vCPU increase enables them now, a
/// decrease only at the next boot; virtio-mem is asked for the new size.
fn resized(live: &LiveResources, done: &[ResourceChange]) -> LiveResources {
    let mut after = live.clone();
    for change in done {
        match change.part {
            ResourcePart::Cpu if change.at_restart => {}
            ResourcePart::Cpu => after.vcpus = change.to as u32,
            ResourcePart::Memory => {
                if let Some(mem) = &mut after.virtio_mem {
                    let asked = change.to - live.memory_at_boot_kib;
                    let xml = mem.asking(asked);
                    let end = xml.len() - (mem.xml.len() - mem.requested_range.end);
                    mem.requested_range = mem.requested_range.start..end;
                    mem.xml = xml;
                    mem.requested_kib = asked;
                }
            }
        }
    }
    after
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::LiveVirtioMem;

    fn live(vcpus: u32, requested_kib: u64) -> LiveResources {
        LiveResources {
            vcpus,
            max_vcpus: 4,
            memory_at_boot_kib: 1 << 20,
            virtio_mem: Some(LiveVirtioMem {
                size_kib: 1 << 20,
                requested_kib,
                current_kib: requested_kib,
                ..LiveVirtioMem::default()
            }),
        }
    }

    fn desired(vcpus: u32, requested_kib: u64) -> DomainDef {
        DomainDef {
            vcpus_enabled: Some(vcpus),
            virtio_mem: Some(VirtioMemDef {
                size_kib: 1 << 20,
                requested_kib,
            }),
            ..DomainDef::default()
        }
    }

    use crate::domain::VirtioMemDef;

    fn cpu(from: u64, to: u64, at_restart: bool) -> ResourceChange {
        ResourceChange {
            part: ResourcePart::Cpu,
            from,
            to,
            error: None,
            at_restart,
        }
    }

    #[test]
    fn a_sync_that_asks_what_the_domain_has_resizes_nothing() {
        assert_eq!(
            plan(&live(2, 512 << 10), Some(2), &desired(2, 512 << 10)),
            ResizePlan::default()
        );
    }

    #[test]
    fn cpus_then_memory_each_from_what_the_domain_has() {
        let plan_up = plan(&live(1, 0), Some(1), &desired(4, 512 << 10));
        assert_eq!(
            plan_up.changes,
            vec![
                cpu(1, 4, false),
                ResourceChange {
                    part: ResourcePart::Memory,
                    from: 1 << 20,
                    to: (1 << 20) + (512 << 10),
                    error: None,
                    at_restart: false,
                },
            ]
        );
        // Down again, both: memory live, vCPUs at the next boot.
        let changes = plan(&live(4, 512 << 10), Some(4), &desired(1, 0)).changes;
        assert_eq!(
            changes
                .iter()
                .map(|c| (c.from, c.to, c.at_restart))
                .collect::<Vec<_>>(),
            vec![(4, 1, true), ((1 << 20) + (512 << 10), 1 << 20, false)]
        );
    }

    #[test]
    fn a_decrease_waits_once_and_asking_what_the_guest_has_takes_it_back() {
        // Already waiting for the next boot: asked again, nothing to do.
        assert_eq!(
            plan(&live(2, 0), Some(1), &desired(1, 0)),
            ResizePlan::default()
        );
        // Another decrease while one waits replaces it.
        let four = LiveResources {
            vcpus: 4,
            ..live(4, 0)
        };
        assert_eq!(
            plan(&four, Some(2), &desired(1, 0)).changes,
            vec![cpu(4, 1, true)]
        );
        // Back to what the guest has: the guest is not touched, the definition set back.
        assert_eq!(
            plan(&live(2, 0), Some(1), &desired(2, 0)),
            ResizePlan {
                changes: vec![],
                withdraw_decrease: Some(2)
            }
        );
        // An increase beyond a waiting decrease is a live plug (it sets both).
        assert_eq!(
            plan(&live(2, 0), Some(1), &desired(3, 0)).changes,
            vec![cpu(2, 3, false)]
        );
    }

    #[test]
    fn a_domain_without_room_plans_no_resize() {
        let fixed = LiveResources {
            vcpus: 2,
            max_vcpus: 2,
            memory_at_boot_kib: 1 << 20,
            virtio_mem: None,
        };
        assert_eq!(
            plan(&fixed, None, &DomainDef::default()),
            ResizePlan::default()
        );
    }

    /// What the status shows after accepted resizes without reading libvirt back: the live
    /// definition's vCPUs and virtio-mem as libvirt has them after the calls, and the element
    /// still one libvirt's update call takes.
    #[test]
    fn accepted_resizes_leave_the_domain_as_asked() {
        let mut before = live(2, 0);
        let element = "<memory model='virtio-mem'><target><requested unit='KiB'>0</requested></target><address type='pci' bus='0x07'/></memory>";
        let at = element.find("<requested").unwrap();
        let end = element.find("</target>").unwrap();
        let mem = before.virtio_mem.as_mut().unwrap();
        mem.xml = element.into();
        mem.requested_range = at..end;
        let memory = ResourceChange {
            part: ResourcePart::Memory,
            from: 1 << 20,
            to: (1 << 20) + (512 << 10),
            error: None,
            at_restart: false,
        };
        let after = resized(&before, &[cpu(2, 3, false), memory]);
        assert_eq!(after.vcpus, 3);
        let mem = after.virtio_mem.unwrap();
        assert_eq!(mem.requested_kib, 512 << 10);
        // What the guest has plugged moves with QEMU's event, not with the call.
        assert_eq!(mem.current_kib, 0);
        assert_eq!(
            mem.xml,
            element.replace(">0</requested>", ">524288</requested>")
        );
        assert_eq!(
            &mem.xml[mem.requested_range.clone()],
            "<requested unit='KiB'>524288</requested>"
        );
        assert!(
            mem.asking(0).contains(">0</requested><"),
            "{}",
            mem.asking(0)
        );
        // A decrease waits for the next boot: the running guest keeps its vCPUs.
        assert_eq!(resized(&live(3, 0), &[cpu(3, 2, true)]).vcpus, 3);
    }
}
