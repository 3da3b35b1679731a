//! `SyncVirtualMachineCPUs` and `SyncVirtualMachineMemory`: what virt-handler calls on the
//! target launcher once a VM moved to a bigger pod for a CPU or memory hotplug (its migration
//! target controller, `hotplugCPU` and `hotplugMemory`), with the VMI whose spec asks for the
//! new sockets or guest memory. KubeVirt's launcher sets the vCPUs (`UpdateVCPUs`:
//! `setVcpusFlags(LIVE|CONFIG)`) or virtio-mem's requested size (`UpdateGuestMemory`); here both
//! are the launcher's own Sync of that VMI, so the resize is the same code path as `vmlauncher
//! sync` and a later `SyncVirtualMachine` of the same VMI finds nothing left to do.
//!
//! Only the asked part decides the answer. A vCPU decrease is not tried live (see
//! `launcher::resize`): it waits in the persistent definition and is answered as a failure
//! naming the restart, so virt-handler keeps the VMI's `currentCPUTopology` at what the guest
//! has (KubeVirt's VM controller never sends a decrease: it sets `RestartRequired` instead).

use super::errors::ResizeError;
use super::front::{vm_is_down, Front, FrontError};
use crate::launcher::{ResourceChange, ResourcePart};

/// How KubeVirt's launcher names the part in its errors.
fn what(part: ResourcePart) -> &'static str {
    match part {
        ResourcePart::Cpu => "vCPUs",
        ResourcePart::Memory => "Guest Memory",
    }
}

/// The answer for `part` from the Sync's resizes: success when nothing had to change (the
/// guest has it already, as after an earlier Sync of the same VMI) or the change was made.
fn outcome(part: ResourcePart, changes: &[ResourceChange]) -> Result<(), ResizeError> {
    let Some(change) = changes.iter().find(|c| c.part == part) else {
        return Ok(());
    };
    if let Some(message) = &change.error {
        return Err(ResizeError::Refused {
            what: what(part),
            message: message.clone(),
        });
    }
    if change.at_restart {
        return Err(ResizeError::RestartRequired {
            from: change.from,
            to: change.to,
        });
    }
    Ok(())
}

impl Front {
    /// `SyncVirtualMachineCPUs` (`part` Cpu) or `SyncVirtualMachineMemory` (Memory): the VMI
    /// synced into the running VM. No domain yet, or a VM that is down: refused, as KubeVirt's
    /// launcher fails to find or change the domain; it never starts one.
    pub(crate) async fn sync_resource(
        &self,
        vmi_json: &[u8],
        part: ResourcePart,
    ) -> Result<(), FrontError> {
        let sync = self.handler_vmi(vmi_json)?;
        let launcher = self.launcher().ok_or(FrontError::NoDomain)?.clone();
        if vm_is_down(&launcher) {
            return Err(ResizeError::NotRunning { what: what(part) }.into());
        }
        let done = self.sync_running(&launcher, sync).await?;
        Ok(outcome(part, &done.resources)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(part: ResourcePart, error: Option<&str>, at_restart: bool) -> ResourceChange {
        ResourceChange {
            part,
            from: 2,
            to: 1,
            error: error.map(str::to_string),
            at_restart,
        }
    }

    #[test]
    fn only_the_asked_part_decides() {
        let memory_failed = [change(ResourcePart::Memory, Some("no room"), false)];
        assert!(outcome(ResourcePart::Cpu, &memory_failed).is_ok());
        let err = outcome(ResourcePart::Memory, &memory_failed).unwrap_err();
        assert_eq!(err.to_string(), "failed to update Guest Memory: no room");
        assert!(outcome(ResourcePart::Cpu, &[]).is_ok());
        assert!(outcome(ResourcePart::Cpu, &[change(ResourcePart::Cpu, None, false)]).is_ok());
    }

    #[test]
    fn a_vcpu_decrease_is_answered_as_waiting_for_a_restart() {
        let err = outcome(ResourcePart::Cpu, &[change(ResourcePart::Cpu, None, true)]).unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("requires a restart") && message.contains("keeps 2 vCPUs"),
            "{message}"
        );
    }
}
