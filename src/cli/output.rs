//! What the client verbs print: volumes and status, as text or JSON.

use vmlauncher::api::proto;

use super::outln;

pub(crate) fn volume_phase(v: &proto::VolumeStatus) -> &'static str {
    proto::volume_status::Phase::try_from(v.phase)
        .map(|p| p.as_str_name().trim_start_matches("PHASE_"))
        .unwrap_or("UNKNOWN")
}

pub(crate) fn volume_json(v: &proto::VolumeStatus) -> serde_json::Value {
    let title = |s: &str| {
        let lower = s.to_ascii_lowercase();
        let mut c = lower.chars();
        c.next()
            .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
            .unwrap_or_default()
    };
    serde_json::json!({
        "name": v.name, "target": v.target, "serial": v.serial, "bus": v.bus,
        "phase": title(volume_phase(v)), "reason": v.reason, "message": v.message, "boot": v.boot,
    })
}

pub(crate) fn print_volumes(volumes: &[proto::VolumeStatus]) {
    outln!(
        "{:<20} {:<8} {:<8} {:<10} {:<36} reason",
        "VOLUME",
        "TARGET",
        "BUS",
        "PHASE",
        "SERIAL"
    );
    for v in volumes {
        let why = if v.message.is_empty() {
            v.reason.clone()
        } else {
            format!("{}: {}", v.reason, v.message)
        };
        outln!(
            "{:<20} {:<8} {:<8} {:<10} {:<36} {why}",
            v.name,
            v.target,
            v.bus,
            volume_phase(v),
            v.serial
        );
    }
}

pub(crate) fn status_json(s: &proto::Status) -> serde_json::Value {
    let conditions: Vec<_> = s
        .conditions
        .iter()
        .map(|c| serde_json::json!({"type": c.r#type, "status": c.status, "reason": c.reason, "message": c.message}))
        .collect();
    let volumes: Vec<_> = s.volumes.iter().map(volume_json).collect();
    let interfaces: Vec<_> = s
        .interfaces
        .iter()
        .map(|i| {
            let ports: Vec<_> = i
                .ports
                .iter()
                .map(|p| serde_json::json!({"protocol": p.protocol, "port": p.port, "hostAddress": p.host_address, "hostPort": p.host_port}))
                .collect();
            serde_json::json!({"name": i.name, "mac": i.mac, "ipAddress": i.ip_address, "ports": ports})
        })
        .collect();
    let cpu = s.cpu.as_ref().map(|c| {
        serde_json::json!({"sockets": c.sockets, "cores": c.cores, "threads": c.threads,
            "maxSockets": c.max_sockets, "vcpusOnline": c.vcpus_online})
    });
    let memory = s.memory.as_ref().map(|m| {
        serde_json::json!({"guestAtBoot": m.guest_at_boot, "requested": m.requested,
            "current": m.current, "maxGuest": m.max_guest})
    });
    serde_json::json!({
        "phase": s.phase, "phaseReason": s.phase_reason, "printableStatus": s.printable_status,
        "cpu": cpu, "memory": memory,
        "powerState": s.power_state, "vmState": s.vm_state, "taskState": s.task_state,
        "taskId": s.task_id, "conditions": conditions, "volumes": volumes,
        "interfaces": interfaces,
        "domainName": s.domain_name, "libvirtUri": s.libvirt_uri, "runStrategy": s.run_strategy,
        "restartCount": s.restart_count, "nextRestartInMs": s.next_restart_in_ms,
        "finished": s.finished,
        "migration": s.migration.as_ref().map(migration_json),
        "consoles": s.consoles.as_ref().map(|c| serde_json::json!({
            "serialSocket": c.serial_socket, "serialLog": c.serial_log, "vncSocket": c.vnc_socket,
        })),
    })
}

/// The migration in flight or last ended, on one line.
pub(crate) fn print_migration(m: &proto::MigrationStatus) {
    let mut line = format!(
        "migration:   {} {} {}: {} of {} MiB sent, {} MiB left, {:.1}s",
        m.role,
        m.state,
        if m.peer.is_empty() { "-" } else { &m.peer },
        m.data_processed >> 20,
        m.data_total >> 20,
        m.data_remaining >> 20,
        m.elapsed_ms as f64 / 1000.0
    );
    if m.downtime_ms > 0 {
        line += &format!(", downtime {} ms", m.downtime_ms);
    }
    if !m.message.is_empty() {
        line += &format!(" ({})", m.message);
    }
    outln!("{line}");
}

pub(crate) fn migration_json(m: &proto::MigrationStatus) -> serde_json::Value {
    serde_json::json!({
        "role": m.role, "state": m.state, "peer": m.peer,
        "dataTotal": m.data_total, "dataProcessed": m.data_processed,
        "dataRemaining": m.data_remaining, "elapsedMs": m.elapsed_ms,
        "downtimeMs": m.downtime_ms, "message": m.message,
    })
}

/// The vCPUs and memory, one line each: what is asked, what the guest has, and the room.
pub(crate) fn print_resources(s: &proto::Status) {
    if let Some(c) = &s.cpu {
        let max = match c.max_sockets {
            0 => String::new(),
            max => format!(", max {max} sockets"),
        };
        outln!(
            "cpu:         {} sockets × {} cores × {} threads, {} vCPUs online{max}",
            c.sockets,
            c.cores,
            c.threads,
            c.vcpus_online
        );
    }
    if let Some(m) = &s.memory {
        let mib = |b: u64| format!("{}Mi", b >> 20);
        let max = match m.max_guest {
            0 => String::new(),
            max => format!(", max {}", mib(max)),
        };
        outln!(
            "memory:      asked {}, guest has {} (booted with {}{max})",
            mib(m.requested),
            mib(m.current),
            mib(m.guest_at_boot)
        );
    }
}

/// One line per interface: name, MAC, address (`-` when unknown), published ports.
pub(crate) fn print_interfaces(interfaces: &[proto::InterfaceStatus]) {
    for i in interfaces {
        let ports: Vec<String> = i
            .ports
            .iter()
            .map(|p| {
                format!(
                    "{}:{}->{}/{}",
                    p.host_address, p.host_port, p.port, p.protocol
                )
            })
            .collect();
        outln!(
            "interface:   {} {} {} {}",
            i.name,
            i.mac,
            if i.ip_address.is_empty() {
                "-"
            } else {
                &i.ip_address
            },
            if ports.is_empty() {
                "-".to_string()
            } else {
                ports.join(",")
            }
        );
    }
}
