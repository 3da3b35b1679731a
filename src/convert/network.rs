//! The spec's interfaces as the domain's, and how they reach a network: user-mode networking
//! on a machine, the pod's taps in a pod, and the ports a local run publishes on the host
//! (`--publish`, checked against what the spec's masquerade interfaces list).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use crate::domain::{InterfaceBackend, InterfaceDef, PortForward};
use crate::spec::VirtualMachineInstance;

/// The interface KubeVirt adds when a spec names neither interfaces nor networks.
pub(crate) const DEFAULT_INTERFACE: &str = "default";

/// How interfaces reach a network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum NetworkMode {
    /// QEMU user-mode networking: a run on a machine, no host configuration.
    #[default]
    Local,
    /// In a pod: a `bridge` interface takes the tap device the pod's network set-up prepared
    /// (`tap0`, `tap1`, ...); a `masquerade` one QEMU's user-mode network, which needs no
    /// privileges in the pod, with its ports published on the pod's addresses.
    Pod,
}

/// Where a masquerade interface's `ports` are published on the host (user-mode networking).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publish {
    /// The host address they listen on: 127.0.0.1 by default, so only this machine reaches the
    /// guest unless asked otherwise.
    pub address: Ipv4Addr,
    /// Ports the command line moved, guest port → host port (`--publish 2222:22`); any other
    /// port is published on its own number.
    pub host_ports: BTreeMap<u16, u16>,
}

impl Default for Publish {
    fn default() -> Self {
        Publish::default_for(NetworkMode::Local)
    }
}

/// Why the command line's `--publish HOSTPORT:PORT` moves cannot all apply. Each would
/// otherwise surface only once QEMU runs (two forwards on one host port fail in `hostfwd_add`)
/// or not at all (a second move of one guest port would silently replace the first).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    #[error("--publish {host}:{guest}: no masquerade interface of the spec lists port {guest}")]
    NotListed { host: u16, guest: u16 },
    #[error("--publish {host}:{guest}: guest port {guest} is already moved to host port {first}")]
    GuestTwice { host: u16, guest: u16, first: u16 },
    #[error(
        "--publish {host}:{guest}: host port {host}/{protocol} already publishes guest port \
         {other}{}",
        if *other_moved { "" } else { " (on its own number)" }
    )]
    HostTwice {
        host: u16,
        guest: u16,
        protocol: String,
        other: u16,
        other_moved: bool,
    },
}

/// The `--publish` moves (`(host port, guest port)`, as given) as [`Publish::host_ports`],
/// checked against what the spec's masquerade interfaces publish: each guest port listed there
/// and moved at most once, and no host port left publishing two guest ports of one protocol
/// (ports not moved keep their own number, so `--publish 8080:80` clashes with a listed 8080).
pub fn moved_ports(
    vmi: &VirtualMachineInstance,
    moves: &[(u16, u16)],
) -> Result<BTreeMap<u16, u16>, PublishError> {
    let listed: Vec<(String, u16)> = vmi
        .spec
        .domain
        .devices
        .interfaces
        .iter()
        .filter(|i| i.masquerade.is_some())
        .flat_map(|i| &i.ports)
        .filter_map(|p| Some((p.protocol_lower(), u16::try_from(p.port).ok()?)))
        .collect();
    let mut moved = BTreeMap::new();
    for &(host, guest) in moves {
        if !listed.iter().any(|(_, port)| *port == guest) {
            return Err(PublishError::NotListed { host, guest });
        }
        if let Some(&first) = moved.get(&guest) {
            return Err(PublishError::GuestTwice { host, guest, first });
        }
        moved.insert(guest, host);
    }
    // (protocol, host port) → the guest port published there.
    let mut taken: BTreeMap<(&str, u16), u16> = BTreeMap::new();
    // Ports on their own number first, so that a clash is reported on the move that caused it.
    let (own, shifted): (Vec<_>, Vec<_>) = listed.iter().partition(|(_, p)| !moved.contains_key(p));
    for (protocol, guest) in own.into_iter().chain(shifted) {
        let host = moved.get(guest).copied().unwrap_or(*guest);
        if let Some(&other) = taken.get(&(protocol.as_str(), host)) {
            return Err(PublishError::HostTwice {
                host,
                guest: *guest,
                protocol: protocol.clone(),
                other,
                other_moved: moved.contains_key(&other),
            });
        }
        taken.insert((protocol, host), *guest);
    }
    Ok(moved)
}

impl Publish {
    /// A local run publishes on 127.0.0.1 (only this machine); a pod on all its addresses
    /// (0.0.0.0 in the pod's own network namespace: the pod IP is how Kubernetes reaches it).
    pub fn default_for(mode: NetworkMode) -> Publish {
        Publish {
            address: match mode {
                NetworkMode::Local => Ipv4Addr::LOCALHOST,
                NetworkMode::Pod => Ipv4Addr::UNSPECIFIED,
            },
            host_ports: BTreeMap::new(),
        }
    }
}

pub(super) fn interfaces(
    vmi: &VirtualMachineInstance,
    mode: NetworkMode,
    publish: &Publish,
) -> Vec<InterfaceDef> {
    let devices = &vmi.spec.domain.devices;
    let mut interfaces: Vec<InterfaceDef> = devices
        .interfaces
        .iter()
        .enumerate()
        // Unplugged, but still listed: the others keep their index (a pod's tap names).
        .filter(|(_, i)| i.state.as_deref() != Some("absent"))
        .map(|(index, i)| {
            let backend = backend(mode, index, i.bridge.is_some());
            // A pod's tap is reached at the pod's address: nothing to publish there.
            let port_forwards = match backend {
                InterfaceBackend::User => i
                    .ports
                    .iter()
                    .filter_map(|p| {
                        let port = u16::try_from(p.port).ok()?;
                        Some(PortForward {
                            protocol: p.protocol_lower(),
                            address: publish.address.to_string(),
                            host_port: publish.host_ports.get(&port).copied().unwrap_or(port),
                            port,
                        })
                    })
                    .collect(),
                InterfaceBackend::Tap(_) => Vec::new(),
            };
            InterfaceDef {
                name: i.name.clone(),
                backend,
                model: i.model.clone().unwrap_or_else(|| "virtio".into()),
                mac: i.mac_address.clone(),
                boot_order: i.boot_order,
                port_forwards,
                link_down: i.state.as_deref() == Some("down"),
            }
        })
        .collect();
    if devices.interfaces.is_empty() && vmi.spec.networks.is_empty() && devices.pod_interface() {
        interfaces.push(InterfaceDef {
            name: DEFAULT_INTERFACE.into(),
            backend: backend(mode, 0, false),
            model: "virtio".into(),
            mac: None,
            boot_order: None,
            port_forwards: Vec::new(),
            link_down: false,
        });
    }
    interfaces
}

fn backend(mode: NetworkMode, index: usize, bridge: bool) -> InterfaceBackend {
    match mode {
        NetworkMode::Pod if bridge => InterfaceBackend::Tap(format!("tap{index}")),
        _ => InterfaceBackend::User,
    }
}
