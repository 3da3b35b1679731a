//! The `vmlauncher` command line (`docs/DESIGN.md` §6). Each verb translates its arguments into
//! one library call; exit codes come from `vmlauncher::exit::ExitCode`.

use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand, ValueEnum};
use vmlauncher::api::{self, proto};
use vmlauncher::convert::{self, ConvertOptions};
use vmlauncher::exit::ExitCode;
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
        /// Mirror the guest's serial console to standard output.
        #[arg(long)]
        console: bool,
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
        #[arg(long, default_value = "/var/run/vmlauncher/launcher.sock")]
        socket: PathBuf,
        #[arg(long)]
        dry_run: bool,
        #[arg(long, value_enum, default_value = "text")]
        output: Output,
    },
    /// Show a running launcher's status.
    Status {
        #[arg(long, default_value = "/var/run/vmlauncher/launcher.sock")]
        socket: PathBuf,
        #[arg(long, value_enum, default_value = "text")]
        output: Output,
    },
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("VMLAUNCHER_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn main() -> std::process::ExitCode {
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
            console,
        } => {
            let spec = match run::load_spec(&spec) {
                Ok(s) => s,
                Err(code) => return code,
            };
            run::run(RunOptions {
                spec,
                connect,
                runtime_dir,
                socket,
                emulation,
                console,
            })
            .await
        }
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
        Command::Status { socket, output } => status(&socket, output).await,
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

async fn sync(spec: &Path, socket: &Path, dry_run: bool, output: Output) -> ExitCode {
    let text = match run::read_spec(spec) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("vmlauncher: cannot read {}: {e}", spec.display());
            return ExitCode::BadSpec;
        }
    };
    let mut client = match api::connect(socket).await {
        Ok(c) => c,
        Err(e) => return request_failed(&e),
    };
    let response = match client
        .sync(proto::SyncRequest {
            spec: text,
            dry_run,
        })
        .await
    {
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
        Output::Json => {
            let conditions: Vec<_> = s
                .conditions
                .iter()
                .map(|c| serde_json::json!({"type": c.r#type, "status": c.status, "reason": c.reason, "message": c.message}))
                .collect();
            let volumes: Vec<_> = s.volumes.iter().map(volume_json).collect();
            println!(
                "{}",
                serde_json::json!({
                    "phase": s.phase, "printableStatus": s.printable_status, "powerState": s.power_state,
                    "vmState": s.vm_state, "taskState": s.task_state, "conditions": conditions,
                    "volumes": volumes, "domainName": s.domain_name, "libvirtUri": s.libvirt_uri,
                })
            );
        }
        Output::Text => {
            println!("domain:      {}", s.domain_name);
            println!("libvirt:     {}", s.libvirt_uri);
            println!("phase:       {} ({})", s.phase, s.printable_status);
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
