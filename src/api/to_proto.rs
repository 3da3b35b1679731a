//! The launcher's status and events as `vmlauncher.v1` messages, and a Sync's block devices
//! both ways.

use super::proto;
use std::time::Instant;

use crate::launcher::{self, EventKind, MigrationStatus, TaskOutcome, VolumePhase};

pub(super) fn volume_to_proto(v: &launcher::VolumeStatus) -> proto::VolumeStatus {
    use proto::volume_status::Phase;
    proto::VolumeStatus {
        name: v.name.clone(),
        target: v.target.clone(),
        serial: v.serial.clone(),
        bus: v.bus.clone(),
        phase: match v.phase {
            VolumePhase::Pending => Phase::Pending,
            VolumePhase::Attaching => Phase::Attaching,
            VolumePhase::Ready => Phase::Ready,
            VolumePhase::Detaching => Phase::Detaching,
            VolumePhase::Failed => Phase::Failed,
        } as i32,
        reason: v.reason.clone(),
        message: v.message.clone(),
        boot: v.boot,
    }
}

pub(crate) fn status_to_proto(s: &launcher::Status) -> proto::Status {
    let now = Instant::now();
    proto::Status {
        phase: s.phase.as_str().into(),
        printable_status: s.printable_status.as_str().into(),
        power_state: s
            .power_state
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        vm_state: s.vm_state.as_str().into(),
        task_state: s
            .task
            .map(|t| t.command.task().as_str())
            .unwrap_or_default()
            .into(),
        task_id: s.task.map(|t| t.id).unwrap_or_default(),
        conditions: s
            .conditions
            .iter()
            .map(|c| proto::Condition {
                r#type: c.kind.into(),
                status: c.status,
                reason: c.reason.clone(),
                message: c.message.clone(),
            })
            .collect(),
        volumes: s.volumes.iter().map(volume_to_proto).collect(),
        interfaces: s
            .interfaces
            .iter()
            .map(|i| proto::InterfaceStatus {
                name: i.name.clone(),
                mac: i.mac.clone(),
                ip_address: i.ip_address.clone(),
                ports: i
                    .ports
                    .iter()
                    .map(|p| proto::PublishedPort {
                        protocol: p.protocol.clone(),
                        port: p.port.into(),
                        host_address: p.host_address.clone(),
                        host_port: p.host_port.into(),
                    })
                    .collect(),
            })
            .collect(),
        cpu: s.cpu.map(|c| proto::CpuStatus {
            sockets: c.sockets,
            cores: c.cores,
            threads: c.threads,
            max_sockets: c.max_sockets.unwrap_or_default(),
            vcpus_online: c.vcpus_online,
        }),
        memory: s.memory.map(|m| proto::MemoryStatus {
            guest_at_boot: m.guest_at_boot,
            requested: m.requested,
            current: m.current,
            max_guest: m.max_guest.unwrap_or_default(),
        }),
        domain_name: s.domain_name.clone(),
        libvirt_uri: s.libvirt_uri.clone(),
        phase_reason: s.phase_reason.map_or("", |r| r.as_str()).into(),
        run_strategy: s.run_strategy.as_str().into(),
        restart_count: s.restart_count,
        next_restart_in_ms: s
            .next_restart
            .map(|t| t.saturating_duration_since(now).as_millis() as u64)
            .unwrap_or_default(),
        finished: s.finished,
        migration: s.migration.as_ref().map(migration_status_to_proto),
        consoles: Some(consoles_to_proto(&s.consoles)),
    }
}

fn consoles_to_proto(c: &crate::convert::Consoles) -> proto::ConsoleStatus {
    let text =
        |p: Option<&std::path::PathBuf>| p.map(|p| p.display().to_string()).unwrap_or_default();
    let serial = c.serial.as_ref();
    proto::ConsoleStatus {
        serial_socket: text(serial.map(|s| &s.socket)),
        serial_log: text(serial.and_then(|s| s.log.as_ref())),
        vnc_socket: text(c.vnc_socket.as_ref()),
    }
}

pub(super) fn event_to_proto(e: launcher::LauncherEvent) -> proto::Event {
    use proto::event::Kind;
    let kind = match e.kind {
        EventKind::Resync(s) => Kind::Resync(status_to_proto(&s)),
        EventKind::Status(s) => Kind::Status(status_to_proto(&s)),
        EventKind::Volume(v) => Kind::Volume(volume_to_proto(&v)),
        EventKind::VolumeRemoved(name) => Kind::VolumeRemoved(name),
        EventKind::Hypervisor { event, detail } => {
            Kind::Hypervisor(proto::HypervisorEvent { event, detail })
        }
        EventKind::Task {
            id,
            command,
            outcome,
        } => {
            let (outcome, message) = match outcome {
                TaskOutcome::Started => ("Started", String::new()),
                TaskOutcome::Succeeded => ("Succeeded", String::new()),
                TaskOutcome::Failed(m) => ("Failed", m),
            };
            Kind::Task(proto::TaskEvent {
                id,
                command: command.as_str().into(),
                outcome: outcome.into(),
                message,
            })
        }
    };
    proto::Event {
        seq: e.seq,
        kind: Some(kind),
    }
}

/// The block devices of a Sync request; one without a source is refused.
pub(crate) fn block_devices_from_proto(
    devices: std::collections::HashMap<String, proto::BlockDevice>,
) -> Result<std::collections::BTreeMap<String, launcher::BlockSource>, tonic::Status> {
    use proto::block_device::Source;
    devices
        .into_iter()
        .map(|(volume, d)| {
            let source = match d.source {
                Some(Source::Path(p)) => launcher::BlockSource::Path(p.into()),
                Some(Source::Number(n)) => {
                    launcher::BlockSource::Number(crate::host::devnode::DevNumber {
                        major: n.major,
                        minor: n.minor,
                    })
                }
                None => {
                    return Err(tonic::Status::invalid_argument(format!(
                        "block_devices[{volume:?}]: neither path nor number is set"
                    )))
                }
            };
            Ok((volume, source))
        })
        .collect()
}

pub(crate) fn block_devices_to_proto(
    devices: &std::collections::BTreeMap<String, launcher::BlockSource>,
) -> std::collections::HashMap<String, proto::BlockDevice> {
    use proto::block_device::Source;
    devices
        .iter()
        .map(|(volume, source)| {
            let source = match source {
                launcher::BlockSource::Path(p) => Source::Path(p.to_string_lossy().into()),
                launcher::BlockSource::Number(n) => Source::Number(proto::DeviceNumber {
                    major: n.major,
                    minor: n.minor,
                }),
            };
            (
                volume.clone(),
                proto::BlockDevice {
                    source: Some(source),
                },
            )
        })
        .collect()
}

pub(super) fn migration_status_to_proto(m: &MigrationStatus) -> proto::MigrationStatus {
    proto::MigrationStatus {
        role: m.role.as_str().into(),
        state: m.state.as_str().into(),
        peer: m.peer.clone(),
        data_total: m.progress.data_total,
        data_processed: m.progress.data_processed,
        data_remaining: m.progress.data_remaining,
        elapsed_ms: m.elapsed().as_millis() as u64,
        downtime_ms: m.progress.downtime_ms.unwrap_or_default(),
        message: m.message.clone(),
    }
}
