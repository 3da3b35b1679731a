//! The CPU and memory part of a Sync: a changed `sockets` sets the enabled vCPUs, a changed
//! `guest` memory sets virtio-mem's requested size, both live and in the persistent definition,
//! each with a result of its own. What the domain has is read from libvirt, not remembered.

use super::{libvirt_message, Launcher, LauncherError};
use crate::domain::{self, DomainDef, LiveResources};
use crate::spec::{FieldError, Problem, SpecErrors, Validated};

/// A part of the guest a Sync resizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResourcePart {
    /// Enabled vCPUs.
    Cpu,
    /// Guest memory, in KiB.
    Memory,
}

impl ResourcePart {
    pub fn as_str(self) -> &'static str {
        match self {
            ResourcePart::Cpu => "cpu",
            ResourcePart::Memory => "memory",
        }
    }
}

/// One resize a Sync plans or did: vCPUs, or memory in KiB, from what the domain has to what
/// the spec asks; `error` is libvirt's words when it refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceChange {
    pub part: ResourcePart,
    pub from: u64,
    pub to: u64,
    pub error: Option<String>,
}

/// The resizes from `live` to `desired`, CPUs first.
pub(super) fn plan(live: &LiveResources, desired: &DomainDef) -> Vec<ResourceChange> {
    let mut changes = Vec::new();
    if let Some(vcpus) = desired.vcpus_enabled {
        if vcpus != live.vcpus {
            changes.push(ResourceChange {
                part: ResourcePart::Cpu,
                from: live.vcpus.into(),
                to: vcpus.into(),
                error: None,
            });
        }
    }
    if let (Some(asked), Some(has)) = (desired.virtio_mem, &live.virtio_mem) {
        if asked.requested_kib != has.requested_kib {
            changes.push(ResourceChange {
                part: ResourcePart::Memory,
                from: live.requested_kib(),
                to: live.memory_at_boot_kib + asked.requested_kib,
                error: None,
            });
        }
    }
    changes
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
        let xml = self.call(move |hv| hv.live_xml(&n))?;
        self.show_live(&xml, agent_events)
    }

    /// How many agent events the state has taken: read before a live XML read, for `show_live`.
    pub(super) fn agent_events(&self) -> u64 {
        self.state.lock().expect("state lock").agent_events
    }

    /// Shows the vCPUs, memory, interfaces and the guest agent's state of the live XML `xml` in
    /// the status (read at every start and adoption: the agent may have connected before the
    /// launcher listened for its events). The agent's state only if no agent event came since
    /// `agent_events` (taken before `xml` was read): the event is newer.
    pub(super) fn show_live(
        &self,
        xml: &str,
        agent_events: u64,
    ) -> Result<(LiveResources, Vec<domain::LiveInterface>), LauncherError> {
        let resources = domain::live_resources(xml)?;
        let interfaces = domain::live_interfaces(xml)?;
        let statuses = super::reconciler::interface_statuses(&interfaces);
        let agent = domain::agent_connected(xml)?;
        self.update(|s| {
            s.resources = Some(resources.clone());
            s.interfaces = statuses;
            if s.agent_events == agent_events {
                s.agent_connected = agent;
            }
        });
        Ok((resources, interfaces))
    }

    /// The memory (bytes) the running domain booted with, as last read.
    pub(super) fn memory_at_boot(&self) -> Option<u64> {
        let s = self.state.lock().expect("state lock");
        s.resources.as_ref().map(|r| r.memory_at_boot_kib * 1024)
    }

    /// Applies each planned resize; one failing does not stop the next. The caller shows the
    /// outcome as libvirt has it afterwards (`refresh_live`).
    pub(super) fn resize(
        &self,
        changes: Vec<ResourceChange>,
        live: &LiveResources,
    ) -> Vec<ResourceChange> {
        let name = self.domain_name.as_str();
        let mut done = Vec::with_capacity(changes.len());
        for change in changes {
            let result = match change.part {
                // An unplug fails here: QEMU 7.2 never reports the vCPU deleted (only its
                // lapic), so libvirt 9.0 times out; its error is the result (DESIGN §4).
                ResourcePart::Cpu => {
                    let count = change.to as u32;
                    self.call(|hv| hv.set_vcpus(name, count))
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
        done
    }
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

    #[test]
    fn a_sync_that_asks_what_the_domain_has_resizes_nothing() {
        assert_eq!(plan(&live(2, 512 << 10), &desired(2, 512 << 10)), vec![]);
    }

    #[test]
    fn cpus_then_memory_each_from_what_the_domain_has() {
        let changes = plan(&live(1, 0), &desired(4, 512 << 10));
        assert_eq!(
            changes,
            vec![
                ResourceChange {
                    part: ResourcePart::Cpu,
                    from: 1,
                    to: 4,
                    error: None
                },
                ResourceChange {
                    part: ResourcePart::Memory,
                    from: 1 << 20,
                    to: (1 << 20) + (512 << 10),
                    error: None
                },
            ]
        );
        // Down again, both.
        let changes = plan(&live(4, 512 << 10), &desired(1, 0));
        assert_eq!(
            changes.iter().map(|c| (c.from, c.to)).collect::<Vec<_>>(),
            vec![(4, 1), ((1 << 20) + (512 << 10), 1 << 20)]
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
        assert_eq!(plan(&fixed, &DomainDef::default()), vec![]);
    }
}
