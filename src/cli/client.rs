//! The client verbs: each talks to a running launcher over its socket and turns the answer into
//! output and how the verb ended.

use std::path::Path;

use super::exit::MainError;
use vmlauncher::api::{self, proto};
use vmlauncher::ended::Ended;
use vmlauncher::run::{self, SpecFileError};

use super::args::{Output, Target};
use super::output::{
    print_interfaces, print_migration, print_resources, print_volumes, status_json, volume_json,
    volume_phase,
};
use super::spec_edit::{SpecEditError, SpecValue};
use super::{outln, write_stdout, Outcome};

type Client = proto::launcher_client::LauncherClient<tonic::transport::Channel>;

pub(crate) async fn connect(socket: &Path) -> Result<Client, MainError> {
    api::connect(socket).await.map_err(MainError::Connect)
}

/// The launcher's answer to one call, or its refusal.
pub(crate) fn answer<T>(reply: Result<tonic::Response<T>, tonic::Status>) -> Result<T, MainError> {
    reply
        .map(tonic::Response::into_inner)
        .map_err(MainError::Refused)
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Verb {
    Start,
    Pause,
    Unpause,
    Reboot,
    Reset,
    Stop(Option<u32>),
    Kill,
}

pub(crate) async fn send_command(target: &Target, verb: Verb) -> Outcome {
    let mut client = connect(&target.socket).await?;
    let req = proto::CommandRequest {};
    let reply = match verb {
        Verb::Start => client.start(req).await,
        Verb::Pause => client.pause(req).await,
        Verb::Unpause => client.unpause(req).await,
        Verb::Reboot => client.soft_reboot(req).await,
        Verb::Reset => client.reset(req).await,
        Verb::Stop(grace_period_seconds) => {
            client
                .shutdown(proto::ShutdownRequest {
                    grace_period_seconds,
                })
                .await
        }
        Verb::Kill => client.kill(req).await,
    };
    let reply = answer(reply)?;
    let status = reply.status.unwrap_or_default();
    match target.output {
        Output::Json => outln!(
            "{}",
            serde_json::json!({"taskId": reply.task_id, "status": status_json(&status)})
        ),
        Output::Text => outln!(
            "task {} done: phase {} ({}), vm state {}",
            reply.task_id,
            status.phase,
            status.printable_status,
            status.vm_state
        ),
    }
    Ok(Ended::Done)
}

pub(crate) async fn events(socket: &Path, output: Output) -> Outcome {
    use proto::event::Kind;
    let mut client = connect(socket).await?;
    let mut stream = answer(client.watch_events(proto::WatchEventsRequest {}).await)?;
    loop {
        // `None`: the launcher went away, the stream is over.
        let Some(event) = stream.message().await.map_err(MainError::Refused)? else {
            return Ok(Ended::Done);
        };
        let (kind, body, text) = match event.kind {
            Some(Kind::Resync(s)) => (
                "resync",
                status_json(&s),
                format!("{} ({})", s.phase, s.printable_status),
            ),
            Some(Kind::Status(s)) => (
                "status",
                status_json(&s),
                format!(
                    "{} ({}) vm={} task={}",
                    s.phase, s.printable_status, s.vm_state, s.task_state
                ),
            ),
            Some(Kind::Volume(v)) => (
                "volume",
                volume_json(&v),
                format!("{} {}", v.name, volume_phase(&v)),
            ),
            Some(Kind::VolumeRemoved(name)) => {
                ("volumeRemoved", serde_json::json!({"name": name}), name)
            }
            Some(Kind::Hypervisor(h)) => (
                "hypervisor",
                serde_json::json!({"event": h.event, "detail": h.detail}),
                format!("{} {}", h.event, h.detail),
            ),
            Some(Kind::Task(t)) => (
                "task",
                serde_json::json!({"id": t.id, "command": t.command, "outcome": t.outcome, "message": t.message}),
                format!("{} #{} {} {}", t.command, t.id, t.outcome, t.message),
            ),
            None => continue,
        };
        let line = match output {
            Output::Json => {
                serde_json::json!({"seq": event.seq, "type": kind, kind: body}).to_string()
            }
            Output::Text => format!("{:>6} {kind:<13} {text}", event.seq),
        };
        if !write_stdout(format_args!("{line}\n")) {
            return Ok(Ended::Done);
        }
    }
}

/// `addvolume` / `removevolume`: the launcher's current spec, edited, synced back.
pub(crate) async fn edit_volumes(
    socket: &Path,
    output: Output,
    edit: impl FnOnce(&mut SpecValue, &mut proto::SyncRequest) -> Result<(), SpecEditError>,
) -> Outcome {
    let mut client = connect(socket).await?;
    let current = answer(client.get_spec(proto::GetSpecRequest {}).await)?;
    let mut spec: SpecValue =
        serde_yaml_ng::from_str(&current.spec).map_err(MainError::LaunchersSpec)?;
    let mut req = proto::SyncRequest {
        spec: String::new(),
        dry_run: false,
        block_devices: current.block_devices,
        persist: current.persist,
    };
    edit(&mut spec, &mut req).map_err(MainError::Edit)?;
    req.spec = serde_yaml_ng::to_string(&spec).map_err(MainError::EditedSpec)?;
    sync_request(client, req, output).await
}

pub(crate) async fn sync(spec: &Path, socket: &Path, dry_run: bool, output: Output) -> Outcome {
    // The launcher validates; the client only needs text it can send.
    let text = match run::read_spec(spec).map(String::from_utf8) {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => {
            return Err(SpecFileError::NotUtf8 {
                path: spec.into(),
                valid_up_to: e.utf8_error().valid_up_to(),
            }
            .into())
        }
        Err(source) => {
            return Err(SpecFileError::NotSendable {
                path: spec.into(),
                source,
            }
            .into())
        }
    };
    let client = connect(socket).await?;
    // Block volumes the launcher holds keep their device without being named again.
    let req = proto::SyncRequest {
        spec: text,
        dry_run,
        ..Default::default()
    };
    sync_request(client, req, output).await
}

async fn sync_request(mut client: Client, req: proto::SyncRequest, output: Output) -> Outcome {
    let dry_run = req.dry_run;
    let response = answer(client.sync(req).await)?;
    let action = |c: &proto::PlannedChange| {
        proto::planned_change::Action::try_from(c.action)
            .map(|a| {
                a.as_str_name()
                    .trim_start_matches("ACTION_")
                    .to_ascii_lowercase()
            })
            .unwrap_or_default()
    };
    match output {
        Output::Json => {
            let plan: Vec<_> = response
                .plan
                .iter()
                .map(|c| serde_json::json!({"action": action(c), "volume": c.volume, "target": c.target}))
                .collect();
            let volumes: Vec<_> = response.volumes.iter().map(volume_json).collect();
            let interfaces: Vec<_> = response
                .interfaces
                .iter()
                .map(|c| serde_json::json!({"name": c.name, "action": c.action, "error": c.error}))
                .collect();
            let resources: Vec<_> = response
                .resources
                .iter()
                .map(|c| serde_json::json!({"part": c.part, "from": c.from, "to": c.to, "error": c.error, "atRestart": c.at_restart}))
                .collect();
            outln!(
                "{}",
                serde_json::json!({"dryRun": dry_run, "plan": plan, "volumes": volumes, "resources": resources, "interfaces": interfaces})
            );
        }
        Output::Text => {
            if response.plan.is_empty()
                && response.resources.is_empty()
                && response.interfaces.is_empty()
            {
                outln!("nothing to change");
            }
            let would = if dry_run { "would " } else { "" };
            let failed = |error: &str| {
                if error.is_empty() {
                    String::new()
                } else {
                    format!(": failed: {error}")
                }
            };
            for c in &response.interfaces {
                outln!(
                    "{would}{} interface {}{}",
                    c.action,
                    c.name,
                    failed(&c.error)
                );
            }
            for c in &response.resources {
                let (from, to) = match c.part.as_str() {
                    "memory" => (format!("{}Mi", c.from >> 20), format!("{}Mi", c.to >> 20)),
                    _ => (format!("{} vCPUs", c.from), format!("{} vCPUs", c.to)),
                };
                let when = if c.at_restart {
                    " at the next boot (the guest keeps its vCPUs until then)"
                } else {
                    ""
                };
                outln!(
                    "{would}set {} {from} -> {to}{when}{}",
                    c.part,
                    failed(&c.error)
                );
            }
            for c in &response.plan {
                outln!(
                    "{}{} {} ({})",
                    if dry_run { "would " } else { "" },
                    action(c),
                    c.volume,
                    c.target
                );
            }
            print_volumes(&response.volumes);
        }
    }
    let failed = response
        .volumes
        .iter()
        .any(|v| v.phase == proto::volume_status::Phase::Failed as i32)
        || response.resources.iter().any(|c| !c.error.is_empty())
        || response.interfaces.iter().any(|c| !c.error.is_empty());
    Ok(if failed {
        Ended::PartFailed
    } else {
        Ended::Done
    })
}

pub(crate) async fn status(socket: &Path, output: Output) -> Outcome {
    let mut client = connect(socket).await?;
    let s = answer(client.get_status(proto::GetStatusRequest {}).await)?;
    match output {
        Output::Json => outln!("{}", status_json(&s)),
        Output::Text => {
            outln!("domain:      {}", s.domain_name);
            outln!("libvirt:     {}", s.libvirt_uri);
            outln!(
                "phase:       {} ({}) {}",
                s.phase,
                s.printable_status,
                s.phase_reason
            );
            outln!(
                "strategy:    {} (restarts {}, next in {} ms)",
                s.run_strategy,
                s.restart_count,
                s.next_restart_in_ms
            );
            outln!("power state: {}", s.power_state);
            outln!("vm state:    {}", s.vm_state);
            outln!(
                "task:        {}",
                if s.task_state.is_empty() {
                    "-"
                } else {
                    &s.task_state
                }
            );
            for c in &s.conditions {
                outln!(
                    "condition:   {}={} {} {}",
                    c.r#type,
                    c.status,
                    c.reason,
                    c.message
                );
            }
            print_resources(&s);
            if let Some(c) = &s.consoles {
                for (what, path) in [
                    ("serial:     ", &c.serial_socket),
                    ("console log:", &c.serial_log),
                    ("vnc:        ", &c.vnc_socket),
                ] {
                    if !path.is_empty() {
                        outln!("{what} {path}");
                    }
                }
            }
            if let Some(m) = &s.migration {
                print_migration(m);
            }
            print_interfaces(&s.interfaces);
            print_volumes(&s.volumes);
        }
    }
    Ok(Ended::Done)
}
