//! `spec.networks` and `spec.domain.devices.interfaces`: each interface has a network of its
//! name and one binding; at most one pod network.

use std::collections::{BTreeMap, BTreeSet};

use super::{BootOrders, Problems};
use crate::spec::checks::{check_dns1123_label, check_mac};
use crate::spec::model::{Interface, Network, VirtualMachineInstance};
use crate::spec::problem::Problem;
use crate::spec::unsupported::{self, UnsupportedFields};

const NIC_MODELS: &[&str] = &["virtio", "e1000", "e1000e", "rtl8139", "pcnet", "ne2k_pci"];

pub(super) fn validate_networks(
    vmi: &VirtualMachineInstance,
    boot: &mut BootOrders,
    e: &mut Problems,
) {
    let devices = &vmi.spec.domain.devices;
    let base = "spec.domain.devices";
    let mut networks: BTreeMap<&str, &Network> = BTreeMap::new();
    let mut pod_networks = 0;
    for (i, network) in vmi.spec.networks.iter().enumerate() {
        let path = format!("spec.networks[{i}]");
        if let Err(why) = check_dns1123_label(&network.name) {
            e.add(format!("{path}.name"), why);
        }
        if networks.insert(network.name.as_str(), network).is_some() {
            e.add(
                format!("{path}.name"),
                Problem::Duplicate {
                    what: "network",
                    name: network.name.clone(),
                },
            );
        }
        if validate_network_source(network, path, e) {
            pod_networks += 1;
        }
    }
    if pod_networks > 1 {
        e.add("spec.networks", Problem::SecondPodNetwork);
    }
    let mut seen_ifaces = BTreeSet::new();
    for (i, iface) in devices.interfaces.iter().enumerate() {
        let path = format!("{base}.interfaces[{i}]");
        e.unique(&mut seen_ifaces, &path, "interface", &iface.name);
        if !networks.contains_key(iface.name.as_str()) {
            e.add(
                format!("{path}.name"),
                Problem::NoPartner {
                    what: "interface",
                    name: iface.name.clone(),
                    partner: "network",
                },
            );
        }
        validate_binding(iface, &path, &networks, e);
        if let Some(state) = &iface.state {
            e.one_of(format!("{path}.state"), state, &["up", "down", "absent"]);
        }
        unsupported::check(e, &path, iface);
        validate_ports(iface, &path, e);
        if let Some(model) = &iface.model {
            e.one_of(format!("{path}.model"), model, NIC_MODELS);
        }
        if let Some(mac) = &iface.mac_address {
            if let Err(why) = check_mac(mac) {
                e.add(format!("{path}.macAddress"), why);
            }
        }
        boot.check(e, format!("{path}.bootOrder"), iface.boot_order);
    }
    for (name, _) in networks {
        if !devices.interfaces.iter().any(|i| i.name == name) {
            e.add(
                "spec.networks",
                Problem::NoPartner {
                    what: "network",
                    name: name.into(),
                    partner: "interface",
                },
            );
        }
    }
}

/// Where one network comes from: the pod or Multus, exactly one. True for the pod network.
fn validate_network_source(network: &Network, path: String, e: &mut Problems) -> bool {
    match (&network.pod, &network.multus) {
        (Some(pod), None) => {
            unsupported::check(e, &format!("{path}.pod"), pod);
            return true;
        }
        (None, Some(multus)) => {
            if multus.network_name.is_empty() {
                e.add(format!("{path}.multus.networkName"), Problem::Required);
            }
            if multus.default == Some(true) {
                e.add(
                    format!("{path}.multus.default"),
                    Problem::Unsupported {
                        why: "Multus as the default network; the pod network is",
                    },
                );
            }
        }
        (Some(_), Some(_)) => e.add(
            path,
            Problem::OnlyOneOf {
                fields: "pod, multus",
            },
        ),
        (None, None) => e.add(
            path,
            Problem::Missing {
                what: "a network",
                needs: "a source",
                supported: "pod",
            },
        ),
    }
    false
}

/// One interface's binding: exactly one, and masquerade only to the pod network.
fn validate_binding(
    iface: &Interface,
    path: &str,
    networks: &BTreeMap<&str, &Network>,
    e: &mut Problems,
) {
    let unsupported_bindings = unsupported::Bindings(iface);
    let bindings = [iface.masquerade.is_some(), iface.bridge.is_some()]
        .into_iter()
        .chain(
            unsupported_bindings
                .unsupported_fields()
                .into_iter()
                .map(|(_, set, _)| set),
        )
        .filter(|s| *s)
        .count();
    unsupported::check(e, path, &unsupported_bindings);
    if bindings == 0 {
        e.add(
            path,
            Problem::Missing {
                what: "an interface",
                needs: "a binding",
                supported: "masquerade, bridge",
            },
        );
    } else if bindings > 1 {
        e.add(path, Problem::OneBinding);
    }
    if iface.masquerade.is_some()
        && networks
            .get(iface.name.as_str())
            .is_some_and(|n| n.pod.is_none())
    {
        e.add(format!("{path}.masquerade"), Problem::MasqueradeNotPod);
    }
}

const PORT_PROTOCOLS: &[&str] = &["TCP", "UDP"];

/// `ports` of one interface: masquerade only, each a real port and protocol, none twice.
fn validate_ports(iface: &Interface, path: &str, e: &mut Problems) {
    if !iface.ports.is_empty() && iface.masquerade.is_none() {
        e.add(format!("{path}.ports"), Problem::PortsNeedMasquerade);
    }
    let mut seen = BTreeSet::new();
    for (j, port) in iface.ports.iter().enumerate() {
        let ppath = format!("{path}.ports[{j}]");
        if let Some(protocol) = &port.protocol {
            e.one_of(format!("{ppath}.protocol"), protocol, PORT_PROTOCOLS);
        }
        if !(1..=65535).contains(&port.port) {
            e.add(
                format!("{ppath}.port"),
                Problem::NotAPort { port: port.port },
            );
        } else if !seen.insert((port.protocol_lower(), port.port)) {
            e.add(
                format!("{ppath}.port"),
                Problem::DuplicatePort {
                    port: port.port,
                    protocol: port.protocol_lower(),
                },
            );
        }
    }
}
