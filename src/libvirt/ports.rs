//! Guest ports published on the host through QEMU's monitor (`hostfwd_add`).

use virt::domain::Domain;
use virt::sys;

use super::{Hypervisor, LibvirtError};

/// Publishes the ports the domain's user-mode interfaces list (`<portForward>`) with QEMU's
/// `hostfwd_add`, right after QEMU started: libvirt 9.0 keeps the element but applies it only
/// for the passt backend, which it does not accept yet. The rules live in QEMU's user-mode
/// stack, so they last as long as QEMU does: through guest reboots, libvirtd restarts and a
/// launcher adopting the domain. libvirt marks the domain tainted (`custom-monitor`) for it.
/// With `only`, the ports of the interface of that alias alone (one just plugged).
pub(super) fn publish_ports(
    dom: &Domain,
    name: &str,
    only: Option<&str>,
) -> Result<(), LibvirtError> {
    let xml = dom
        .xml_desc(0)
        .map_err(Hypervisor::call_err("get XML", name))?;
    let interfaces =
        crate::domain::live_interfaces(&xml).map_err(|source| LibvirtError::LiveXml {
            domain: name.into(),
            source,
        })?;
    let wanted = |i: &&crate::domain::LiveInterface| {
        i.kind == "user" && only.is_none_or(|alias| i.alias.as_deref() == Some(alias))
    };
    for iface in interfaces.iter().filter(wanted) {
        let Some(netdev) = iface.netdev_id() else {
            continue;
        };
        for fwd in &iface.port_forwards {
            let rule = fwd.hostfwd_rule();
            let reply = dom
                .qemu_monitor_command(
                    &format!("hostfwd_add {netdev} {rule}"),
                    sys::VIR_DOMAIN_QEMU_MONITOR_COMMAND_HMP,
                )
                .map_err(Hypervisor::call_err("hostfwd_add", name))?;
            // HMP answers nothing on success and a sentence on failure (a port in use, say).
            let reply = reply.trim();
            if !reply.is_empty() {
                return Err(LibvirtError::Publish {
                    domain: name.into(),
                    rule,
                    message: reply.to_string(),
                });
            }
        }
    }
    Ok(())
}
