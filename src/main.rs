//! The `vmlauncher` command line (`docs/DESIGN.md` §6). Each verb translates its arguments into
//! one library call; exit codes come from `vmlauncher::exit::ExitCode`.

use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand, ValueEnum};
use vmlauncher::api::{self, proto};
use vmlauncher::convert::{self, ConvertOptions};
use vmlauncher::exit::ExitCode;
use vmlauncher::lifecycle::RunStrategy;
use vmlauncher::run::{self, Emulation, RunOptions};

#[derive(Debug, Parser)]
#[command(
    name = "vmlauncher",
    version,
    about = "Runs one virtual machine and keeps it in the state its owner asks for"
)]
struct Cli {
    /// Log format on standard error.
    #[arg(long, global = true, value_enum, default_value = "human")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Human,
    Json,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Output {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Boot the VM of SPEC and keep it running until it ends or the launcher is stopped.
    Run {
        spec: PathBuf,
        /// Use this libvirt instead of starting a private libvirtd.
        #[arg(long)]
        connect: Option<String>,
        /// Where the launcher keeps its socket, console log and private libvirtd.
        #[arg(long, default_value = "/var/run/vmlauncher")]
        runtime_dir: PathBuf,
        /// The gRPC socket (default: RUNTIME_DIR/launcher.sock).
        #[arg(long)]
        socket: Option<PathBuf>,
        #[arg(long, value_enum, default_value = "auto")]
        emulation: Emulation,
        /// What happens when the VM stops (KubeVirt's runStrategy). Default: a VirtualMachine
        /// manifest's `spec.runStrategy`; a bare VMI runs Once.
        #[arg(long, value_enum)]
        run_strategy: Option<RunStrategy>,
        /// Seconds between safety-net re-reads of the real state (events do the real work).
        #[arg(long, default_value_t = 30)]
        resync_interval: u64,
        /// Mirror the guest's serial console to standard output.
        #[arg(long)]
        console: bool,
        /// Where hot-plugged volumes live: block nodes the launcher makes, and image files
        /// (default: RUNTIME_DIR/hotplug; /var/run/kubevirt/hotplug-disks in a pod).
        #[arg(long)]
        hotplug_dir: Option<PathBuf>,
        /// Interfaces use QEMU's user-mode network (local) or the pod's tap devices (pod:
        /// `tap0`, `tap1`, ... that the pod's network set-up prepared).
        #[arg(long, value_enum, default_value = "local")]
        network: vmlauncher::convert::NetworkMode,
        /// Seconds to keep reconnecting to a lost libvirt before giving up (phase Unknown, exit
        /// 3); 0 never gives up.
        #[arg(long, default_value_t = 300)]
        reconnect_timeout: u64,
        /// QEMU's capability cache shared by every launcher of the host; "" shares none.
        #[arg(long, default_value = vmlauncher::libvirt::capcache::DEFAULT_DIR)]
        qemu_cache_dir: PathBuf,
    },
    /// Probe QEMU once and fill the shared capability cache (an image build runs this).
    WarmCache {
        #[arg(long, default_value = vmlauncher::libvirt::capcache::DEFAULT_DIR)]
        qemu_cache_dir: PathBuf,
    },
    /// Print the libvirt domain XML for SPEC; touches nothing.
    Convert {
        spec: PathBuf,
        #[arg(long, value_enum, default_value = "auto")]
        emulation: Emulation,
        /// Console log path written into the XML.
        #[arg(long, default_value = "/var/run/vmlauncher/console.log")]
        console_log: PathBuf,
    },
    /// Check SPEC: exit 0, or print every problem with its field path and exit 2.
    Validate { spec: PathBuf },
    /// Send the whole new SPEC to a running launcher; prints the plan and volume statuses.
    Sync {
        spec: PathBuf,
        #[arg(long, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
        #[arg(long)]
        dry_run: bool,
        #[arg(long, value_enum, default_value = "text")]
        output: Output,
    },
    /// Hot-plug a block device as volume NAME (a hot-pluggable claim on the scsi bus): reads the
    /// launcher's current spec, adds the disk and volume, and syncs.
    Addvolume {
        name: String,
        #[arg(long, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
        /// A host path to the block device.
        #[arg(long, conflicts_with_all = ["major", "minor"], required_unless_present = "major")]
        path: Option<PathBuf>,
        /// The device number, when the device is not visible where the launcher runs.
        #[arg(long, requires = "minor")]
        major: Option<u32>,
        #[arg(long, requires = "major")]
        minor: Option<u32>,
        /// The serial the guest sees (default: the volume name).
        #[arg(long)]
        serial: Option<String>,
        /// Also write the disk to the persistent definition.
        #[arg(long)]
        persist: bool,
        #[arg(long, value_enum, default_value = "text")]
        output: Output,
    },
    /// Unplug volume NAME: reads the launcher's current spec, removes the disk and volume, and
    /// syncs.
    Removevolume {
        name: String,
        #[arg(long, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
        #[arg(long, value_enum, default_value = "text")]
        output: Output,
    },
    /// Show a running launcher's status.
    Status {
        #[arg(long, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
        #[arg(long, value_enum, default_value = "text")]
        output: Output,
    },
    /// Follow the launcher's event stream (lifecycle, status and volume changes).
    Events {
        #[arg(long, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
        #[arg(long, value_enum, default_value = "text")]
        output: Output,
    },
    /// Start a stopped VM (run strategy Manual or Halted, or after a stop).
    Start(Target),
    /// Pause the VM.
    Pause(Target),
    /// Resume a paused VM.
    Unpause(Target),
    /// Ask the guest to reboot (ACPI).
    Reboot(Target),
    /// Hard-reset the VM.
    Reset(Target),
    /// Stop the guest gracefully: ACPI, then destroy when the grace period ends.
    Stop {
        #[command(flatten)]
        target: Target,
        /// Seconds to wait for the guest before destroying it (default: the spec's).
        #[arg(long)]
        grace_period: Option<u32>,
    },
    /// Destroy the VM now.
    Kill(Target),
}

const DEFAULT_SOCKET: &str = "/var/run/vmlauncher/launcher.sock";

#[derive(Debug, clap::Args)]
struct Target {
    #[arg(long, default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    #[arg(long, value_enum, default_value = "text")]
    output: Output,
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("VMLAUNCHER_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn main() -> std::process::ExitCode {
    // First, before any thread exists: as PID 1, fork a reaper that stays PID 1.
    vmlauncher::init::become_init_if_pid1();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() {
                ExitCode::Usage
            } else {
                ExitCode::Succeeded
            };
            let _ = e.print();
            return code.into();
        }
    };
    init_logging(cli.log_format);
    if matches!(cli.command, Command::Run { .. }) {
        // Capabilities are per thread: drop them while this is the only thread.
        match vmlauncher::host::caps::drop_unneeded() {
            Ok(dropped) => tracing::info!(?dropped, "dropped capabilities"),
            Err(e) => {
                eprintln!(
                    "vmlauncher: cannot drop capabilities: {}",
                    vmlauncher::error_chain(&e)
                );
                return ExitCode::Internal.into();
            }
        }
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("vmlauncher: cannot start the async runtime: {e}");
            return ExitCode::Internal.into();
        }
    };
    runtime.block_on(dispatch(cli.command)).into()
}

async fn dispatch(command: Command) -> ExitCode {
    match command {
        Command::Run {
            spec,
            connect,
            runtime_dir,
            socket,
            emulation,
            run_strategy,
            resync_interval,
            console,
            hotplug_dir,
            network,
            reconnect_timeout,
            qemu_cache_dir,
        } => {
            let spec_text = run::read_spec(&spec).unwrap_or_default();
            let spec = match run::load_spec(&spec) {
                Ok(s) => s,
                Err(code) => return code,
            };
            let strategy = run_strategy
                .or(spec.run_strategy)
                .unwrap_or(RunStrategy::Once);
            run::run(RunOptions {
                spec,
                connect,
                runtime_dir,
                socket,
                emulation,
                strategy,
                resync_interval: std::time::Duration::from_secs(resync_interval.max(1)),
                console,
                spec_text,
                hotplug_dir,
                network,
                reconnect_timeout: (reconnect_timeout > 0)
                    .then(|| std::time::Duration::from_secs(reconnect_timeout)),
                qemu_cache_dir: (!qemu_cache_dir.as_os_str().is_empty()).then_some(qemu_cache_dir),
            })
            .await
        }
        Command::WarmCache { qemu_cache_dir } => run::warm_cache(&qemu_cache_dir).await,
        Command::Convert {
            spec,
            emulation,
            console_log,
        } => {
            let vmi = match run::load_spec(&spec) {
                Ok(s) => s,
                Err(code) => return code,
            };
            let opts = ConvertOptions::new(emulation.resolve(), console_log);
            match convert::convert(&vmi, &opts) {
                Ok(def) => {
                    print!("{}", def.to_xml());
                    ExitCode::Succeeded
                }
                Err(e) => {
                    eprintln!("{}: {e}", spec.display());
                    ExitCode::BadSpec
                }
            }
        }
        Command::Validate { spec } => match run::load_spec(&spec) {
            Ok(_) => ExitCode::Succeeded,
            Err(code) => code,
        },
        Command::Sync {
            spec,
            socket,
            dry_run,
            output,
        } => sync(&spec, &socket, dry_run, output).await,
        Command::Addvolume {
            name,
            socket,
            path,
            major,
            minor,
            serial,
            persist,
            output,
        } => {
            let source = match (path, major, minor) {
                (Some(p), _, _) => proto::block_device::Source::Path(p.to_string_lossy().into()),
                (None, Some(major), Some(minor)) => {
                    proto::block_device::Source::Number(proto::DeviceNumber { major, minor })
                }
                _ => {
                    eprintln!("vmlauncher: addvolume needs --path or --major and --minor");
                    return ExitCode::Usage;
                }
            };
            let serial = serial.unwrap_or_else(|| name.clone());
            edit_volumes(&socket, output, |spec, req| {
                add_volume(spec, &name, &serial)?;
                req.block_devices.insert(
                    name.clone(),
                    proto::BlockDevice {
                        source: Some(source.clone()),
                    },
                );
                if persist {
                    req.persist.push(name.clone());
                }
                Ok(())
            })
            .await
        }
        Command::Removevolume {
            name,
            socket,
            output,
        } => {
            edit_volumes(&socket, output, |spec, req| {
                remove_volume(spec, &name)?;
                req.block_devices.remove(&name);
                req.persist.retain(|p| p != &name);
                Ok(())
            })
            .await
        }
        Command::Status { socket, output } => status(&socket, output).await,
        Command::Events { socket, output } => events(&socket, output).await,
        Command::Start(t) => send_command(&t, Verb::Start).await,
        Command::Pause(t) => send_command(&t, Verb::Pause).await,
        Command::Unpause(t) => send_command(&t, Verb::Unpause).await,
        Command::Reboot(t) => send_command(&t, Verb::Reboot).await,
        Command::Reset(t) => send_command(&t, Verb::Reset).await,
        Command::Stop {
            target,
            grace_period,
        } => send_command(&target, Verb::Stop(grace_period)).await,
        Command::Kill(t) => send_command(&t, Verb::Kill).await,
    }
}

#[derive(Debug, Clone, Copy)]
enum Verb {
    Start,
    Pause,
    Unpause,
    Reboot,
    Reset,
    Stop(Option<u32>),
    Kill,
}

async fn send_command(target: &Target, verb: Verb) -> ExitCode {
    let mut client = match api::connect(&target.socket).await {
        Ok(c) => c,
        Err(e) => return request_failed(&e),
    };
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
    let reply = match reply {
        Ok(r) => r.into_inner(),
        Err(status) => return rpc_failed(status),
    };
    let status = reply.status.unwrap_or_default();
    match target.output {
        Output::Json => println!(
            "{}",
            serde_json::json!({"taskId": reply.task_id, "status": status_json(&status)})
        ),
        Output::Text => println!(
            "task {} done: phase {} ({}), vm state {}",
            reply.task_id, status.phase, status.printable_status, status.vm_state
        ),
    }
    ExitCode::Succeeded
}

async fn events(socket: &Path, output: Output) -> ExitCode {
    use proto::event::Kind;
    let mut client = match api::connect(socket).await {
        Ok(c) => c,
        Err(e) => return request_failed(&e),
    };
    let mut stream = match client.watch_events(proto::WatchEventsRequest {}).await {
        Ok(r) => r.into_inner(),
        Err(status) => return rpc_failed(status),
    };
    loop {
        let event = match stream.message().await {
            Ok(Some(e)) => e,
            // The launcher went away: the stream is over.
            Ok(None) => return ExitCode::Succeeded,
            Err(status) => return rpc_failed(status),
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
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
            return ExitCode::Succeeded;
        }
    }
}

fn request_failed(e: &(dyn std::error::Error + 'static)) -> ExitCode {
    eprintln!("vmlauncher: {}", vmlauncher::error_chain(e));
    ExitCode::RequestFailed
}

fn rpc_failed(status: tonic::Status) -> ExitCode {
    eprintln!("vmlauncher: {:?}: {}", status.code(), status.message());
    match status.code() {
        tonic::Code::InvalidArgument => ExitCode::BadSpec,
        tonic::Code::Unavailable => ExitCode::HypervisorUnavailable,
        _ => ExitCode::RequestFailed,
    }
}

fn volume_phase(v: &proto::VolumeStatus) -> &'static str {
    proto::volume_status::Phase::try_from(v.phase)
        .map(|p| p.as_str_name().trim_start_matches("PHASE_"))
        .unwrap_or("UNKNOWN")
}

fn volume_json(v: &proto::VolumeStatus) -> serde_json::Value {
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

fn print_volumes(volumes: &[proto::VolumeStatus]) {
    println!(
        "{:<20} {:<8} {:<8} {:<10} {:<36} reason",
        "VOLUME", "TARGET", "BUS", "PHASE", "SERIAL"
    );
    for v in volumes {
        let why = if v.message.is_empty() {
            v.reason.clone()
        } else {
            format!("{}: {}", v.reason, v.message)
        };
        println!(
            "{:<20} {:<8} {:<8} {:<10} {:<36} {why}",
            v.name,
            v.target,
            v.bus,
            volume_phase(v),
            v.serial
        );
    }
}

/// The spec as YAML values, to edit volumes in.
type SpecValue = serde_yaml_ng::Value;

fn spec_list<'a>(spec: &'a mut SpecValue, path: &[&str]) -> Result<&'a mut Vec<SpecValue>, String> {
    let mut node = spec;
    for key in path {
        let map = node
            .as_mapping_mut()
            .ok_or_else(|| format!("the launcher's spec has no mapping at {key}"))?;
        let k = SpecValue::from(*key);
        if !map.contains_key(&k) {
            let empty = if *key == path[path.len() - 1] {
                SpecValue::Sequence(Vec::new())
            } else {
                SpecValue::Mapping(Default::default())
            };
            map.insert(k.clone(), empty);
        }
        node = map.get_mut(&k).expect("just inserted");
    }
    node.as_sequence_mut()
        .ok_or_else(|| format!("{} is not a list", path.join(".")))
}

/// The spec of a VirtualMachine keeps the instance under `spec.template`.
fn instance_root(spec: &mut SpecValue) -> &mut SpecValue {
    let is_vm = spec.get("kind").and_then(|k| k.as_str()) == Some("VirtualMachine");
    let has_template = spec.get("spec").and_then(|s| s.get("template")).is_some();
    if is_vm && has_template {
        return spec
            .get_mut("spec")
            .and_then(|s| s.get_mut("template"))
            .expect("checked above");
    }
    spec
}

fn named(name: &str) -> impl Fn(&SpecValue) -> bool + '_ {
    move |v| v.get("name").and_then(|n| n.as_str()) == Some(name)
}

fn add_volume(spec: &mut SpecValue, name: &str, serial: &str) -> Result<(), String> {
    let root = instance_root(spec);
    let volumes = spec_list(root, &["spec", "volumes"])?;
    if volumes.iter().any(named(name)) {
        return Err(format!("the spec already has a volume {name:?}"));
    }
    let volume: SpecValue = serde_yaml_ng::from_str(&format!(
        "{{name: {name}, persistentVolumeClaim: {{claimName: {name}, hotpluggable: true}}}}"
    ))
    .map_err(|e| e.to_string())?;
    volumes.push(volume);
    let disk: SpecValue = serde_yaml_ng::from_str(&format!(
        "{{name: {name}, disk: {{bus: scsi}}, serial: {serial:?}}}"
    ))
    .map_err(|e| e.to_string())?;
    spec_list(root, &["spec", "domain", "devices", "disks"])?.push(disk);
    Ok(())
}

fn remove_volume(spec: &mut SpecValue, name: &str) -> Result<(), String> {
    let root = instance_root(spec);
    let volumes = spec_list(root, &["spec", "volumes"])?;
    let before = volumes.len();
    volumes.retain(|v| !named(name)(v));
    if volumes.len() == before {
        return Err(format!("the spec has no volume {name:?}"));
    }
    spec_list(root, &["spec", "domain", "devices", "disks"])?.retain(|d| !named(name)(d));
    Ok(())
}

/// `addvolume` / `removevolume`: the launcher's current spec, edited, synced back.
async fn edit_volumes(
    socket: &Path,
    output: Output,
    edit: impl FnOnce(&mut SpecValue, &mut proto::SyncRequest) -> Result<(), String>,
) -> ExitCode {
    let mut client = match api::connect(socket).await {
        Ok(c) => c,
        Err(e) => return request_failed(&e),
    };
    let current = match client.get_spec(proto::GetSpecRequest {}).await {
        Ok(r) => r.into_inner(),
        Err(status) => return rpc_failed(status),
    };
    let mut spec: SpecValue = match serde_yaml_ng::from_str(&current.spec) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("vmlauncher: the launcher's spec does not parse: {e}");
            return ExitCode::RequestFailed;
        }
    };
    let mut req = proto::SyncRequest {
        spec: String::new(),
        dry_run: false,
        block_devices: current.block_devices,
        persist: current.persist,
    };
    if let Err(why) = edit(&mut spec, &mut req) {
        eprintln!("vmlauncher: {why}");
        return ExitCode::RequestFailed;
    }
    req.spec = match serde_yaml_ng::to_string(&spec) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("vmlauncher: cannot write the edited spec: {e}");
            return ExitCode::Internal;
        }
    };
    sync_request(client, req, output).await
}

async fn sync(spec: &Path, socket: &Path, dry_run: bool, output: Output) -> ExitCode {
    let text = match run::read_spec(spec) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("vmlauncher: cannot read {}: {e}", spec.display());
            return ExitCode::BadSpec;
        }
    };
    let client = match api::connect(socket).await {
        Ok(c) => c,
        Err(e) => return request_failed(&e),
    };
    // Block volumes the launcher holds keep their device without being named again.
    let req = proto::SyncRequest {
        spec: text,
        dry_run,
        ..Default::default()
    };
    sync_request(client, req, output).await
}

async fn sync_request(
    mut client: proto::launcher_client::LauncherClient<tonic::transport::Channel>,
    req: proto::SyncRequest,
    output: Output,
) -> ExitCode {
    let dry_run = req.dry_run;
    let response = match client.sync(req).await {
        Ok(r) => r.into_inner(),
        Err(status) => return rpc_failed(status),
    };
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
            println!(
                "{}",
                serde_json::json!({"dryRun": dry_run, "plan": plan, "volumes": volumes})
            );
        }
        Output::Text => {
            if response.plan.is_empty() {
                println!("nothing to change");
            }
            for c in &response.plan {
                println!(
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
        .any(|v| v.phase == proto::volume_status::Phase::Failed as i32);
    if failed {
        ExitCode::RequestFailed
    } else {
        ExitCode::Succeeded
    }
}

fn status_json(s: &proto::Status) -> serde_json::Value {
    let conditions: Vec<_> = s
        .conditions
        .iter()
        .map(|c| serde_json::json!({"type": c.r#type, "status": c.status, "reason": c.reason, "message": c.message}))
        .collect();
    let volumes: Vec<_> = s.volumes.iter().map(volume_json).collect();
    serde_json::json!({
        "phase": s.phase, "phaseReason": s.phase_reason, "printableStatus": s.printable_status,
        "powerState": s.power_state, "vmState": s.vm_state, "taskState": s.task_state,
        "taskId": s.task_id, "conditions": conditions, "volumes": volumes,
        "domainName": s.domain_name, "libvirtUri": s.libvirt_uri, "runStrategy": s.run_strategy,
        "restartCount": s.restart_count, "nextRestartInMs": s.next_restart_in_ms,
        "finished": s.finished,
    })
}

async fn status(socket: &Path, output: Output) -> ExitCode {
    let mut client = match api::connect(socket).await {
        Ok(c) => c,
        Err(e) => return request_failed(&e),
    };
    let s = match client.get_status(proto::GetStatusRequest {}).await {
        Ok(r) => r.into_inner(),
        Err(status) => return rpc_failed(status),
    };
    match output {
        Output::Json => println!("{}", status_json(&s)),
        Output::Text => {
            println!("domain:      {}", s.domain_name);
            println!("libvirt:     {}", s.libvirt_uri);
            println!(
                "phase:       {} ({}) {}",
                s.phase, s.printable_status, s.phase_reason
            );
            println!(
                "strategy:    {} (restarts {}, next in {} ms)",
                s.run_strategy, s.restart_count, s.next_restart_in_ms
            );
            println!("power state: {}", s.power_state);
            println!("vm state:    {}", s.vm_state);
            println!(
                "task:        {}",
                if s.task_state.is_empty() {
                    "-"
                } else {
                    &s.task_state
                }
            );
            for c in &s.conditions {
                println!(
                    "condition:   {}={} {} {}",
                    c.r#type, c.status, c.reason, c.message
                );
            }
            print_volumes(&s.volumes);
        }
    }
    ExitCode::Succeeded
}
