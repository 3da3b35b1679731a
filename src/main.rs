//! The `vmlauncher` command line (`docs/DESIGN.md` §6). Each verb translates its arguments into
//! one library call and ends how it ran ([`Ended`]) or why it failed ([`MainError`]); `main` says
//! the failure, once, and `cli::exit` alone turns either into the exit code.

use std::future::Future;
use std::pin::Pin;

use clap::Parser;
use vmlauncher::api::proto;
use vmlauncher::convert::{self, ConvertOptions};
use vmlauncher::ended::Ended;
use vmlauncher::lifecycle::RunStrategy;
use vmlauncher::run::{self, RunOptions};

mod cli;

use cli::args::{Cli, Command, LogFormat, RunArgs};
use cli::client::{edit_volumes, events, send_command, status, sync, Verb};
use cli::exit::{ExitCode, MainError};
use cli::spec_edit::{add_volume, remove_volume};
use cli::{out, Outcome};

fn init_logging(format: LogFormat) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    // `VMLAUNCHER_LOG`: a level, or `target=level` directives (`info,h2=warn`). A `Targets`
    // filter, not an `EnvFilter`: the same directives without span and field filters, and
    // without the regex engine those need (a quarter of a MiB of the binary, which every
    // launcher keeps resident).
    let filter: tracing_subscriber::filter::Targets = std::env::var("VMLAUNCHER_LOG")
        .ok()
        .and_then(|directives| directives.parse().ok())
        .unwrap_or_else(|| {
            tracing_subscriber::filter::Targets::new()
                .with_default(tracing::level_filters::LevelFilter::WARN)
        });
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Human => builder.finish().with(filter).init(),
        LogFormat::Json => builder.json().finish().with(filter).init(),
    }
}

/// What this process is: a verb of vmlauncher's own command line, or KubeVirt's virt-launcher
/// (`vmlauncher virt-launcher FLAGS`, or the binary invoked as `virt-launcher`).
#[derive(Debug)]
enum Mode {
    Cli(Cli),
    VirtLauncher(vmlauncher::kubevirt::flags::VirtLauncherFlags),
}

/// Reads the command line; `Err` is a usage error or a help request.
fn mode() -> Result<Mode, MainError> {
    // OS strings: a path that is not UTF-8 is clap's to refuse, naming it, not a panic here.
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let flags = if args
        .first()
        .and_then(|a| a.to_str())
        .is_some_and(vmlauncher::kubevirt::invoked_as_virt_launcher)
    {
        Some(&args[1..])
    } else if args.get(1).and_then(|a| a.to_str()) == Some("virt-launcher") {
        Some(&args[2..])
    } else {
        None
    };
    if let Some(flags) = flags {
        use vmlauncher::kubevirt::flags::{parse, FlagsError};
        let flags = flags
            .iter()
            .map(|a| a.to_str().map(str::to_string))
            .collect::<Option<Vec<String>>>()
            .ok_or(FlagsError::NotUtf8)
            .and_then(parse)
            .map_err(MainError::VirtLauncherFlags)?;
        return Ok(Mode::VirtLauncher(flags));
    }
    // On a thread of its own: clap's derived builder takes ~80 KiB of stack to build the
    // command's definition, and main's stack keeps every page it ever touched for the VM's life,
    // while a thread's is given back when it ends (glibc drops the pages of a finished thread's
    // stack). Where no thread can be made (a pod at its pid limit), on main's.
    std::thread::scope(|scope| {
        // The default stack size, as the runtime's threads have: glibc caches the ended
        // thread's stack and the next thread of that size takes it over (one of another size
        // stayed mapped with 16 KiB resident).
        match std::thread::Builder::new()
            .name("parse-args".into())
            .spawn_scoped(scope, Cli::try_parse)
        {
            Ok(parser) => parser
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            Err(_) => Cli::try_parse(),
        }
    })
    .map(Mode::Cli)
    .map_err(MainError::CommandLine)
}

/// Says why a command failed, once: `vmlauncher: <what>: <why>`, except where the message names
/// its own subject (a spec file's problems after the file's path, as a compiler names the file of
/// its diagnostics) or has its own form (clap's; `virt-launcher`'s, with its usage).
fn report(error: &MainError) {
    use vmlauncher::kubevirt::flags::{FlagsError, USAGE};
    use vmlauncher::kubevirt::VirtLauncherError;
    use vmlauncher::run::{RunError, SpecFileError};
    match error {
        MainError::CommandLine(e) => {
            let _ = e.print();
        }
        MainError::VirtLauncherFlags(FlagsError::Help) => print!("{USAGE}"),
        MainError::VirtLauncherFlags(e) => eprintln!("virt-launcher: {e}\n{USAGE}"),
        MainError::Spec(e) if !matches!(e, SpecFileError::Unreadable { .. }) => eprintln!("{e}"),
        MainError::Run(RunError::HostPaths(errors)) => {
            for e in &errors.0 {
                eprintln!("vmlauncher: {e}");
            }
        }
        // A panic has said itself; the others cannot happen while the launcher lives, and were
        // never said.
        MainError::Run(RunError::Panicked(_) | RunError::NoOffers | RunError::StatusClosed)
        | MainError::VirtLauncher(
            VirtLauncherError::Setup(vmlauncher::run::SetupError::Signals)
            | VirtLauncherError::Panicked(_)
            | VirtLauncherError::StatusClosed,
        ) => {}
        _ => eprintln!("vmlauncher: {}", vmlauncher::error_chain(error)),
    }
}

fn main() -> std::process::ExitCode {
    // Before any thread exists (`vmlauncher::allocator` says why and what was measured).
    vmlauncher::allocator::one_arena();
    // Dropped only once the failure is said: its drop waits for the blocking tasks.
    let mut runtime = None;
    let outcome = launch(&mut runtime);
    // Output cut short outranks how the verb ended.
    let outcome = match cli::stdout_failure() {
        Some(failed) => Err(failed),
        None => outcome,
    };
    let code = match &outcome {
        Ok(ended) => ExitCode::from(*ended),
        Err(error) => {
            report(error);
            ExitCode::from(error)
        }
    };
    drop(runtime);
    code.into()
}

/// Everything of `main` but saying a failure: sets up the process and runs the verb on `runtime`.
fn launch(runtime: &mut Option<tokio::runtime::Runtime>) -> Result<Ended, MainError> {
    let mode = mode()?;
    // The launcher proper, which lives as long as the VM; the client verbs are short.
    let (runs_a_vm, log_format) = match &mode {
        Mode::Cli(cli) => (matches!(cli.command, Command::Run { .. }), cli.log_format),
        Mode::VirtLauncher(flags) => (
            true,
            if flags.log_json {
                LogFormat::Json
            } else {
                LogFormat::Human
            },
        ),
    };
    // While no other thread exists too: as PID 1, fork a reaper that stays PID 1.
    vmlauncher::init::become_init_if_pid1();
    init_logging(log_format);
    if runs_a_vm {
        // Capabilities are per thread: drop them while this is the only thread.
        let dropped = vmlauncher::host::caps::drop_unneeded().map_err(MainError::Capabilities)?;
        tracing::info!(?dropped, "dropped capabilities");
        // Before libvirtd starts, which inherits it.
        match vmlauncher::host::fd_limit::raise_to_hard() {
            Ok((soft, _)) => tracing::info!(soft, "descriptor limit"),
            Err(e) => tracing::warn!(error = %e, "cannot raise the descriptor limit"),
        }
    }
    // One VM's worth of work: the API, the reconciler and the event stream are light, and every
    // libvirt call and host step runs off the async worker (`block_in_place`, which a
    // multi-thread runtime needs, or `spawn_blocking`), so one worker thread does; each thread
    // costs stack and a malloc arena (measured: RssAnon 4.8 MiB with the default, a worker per
    // core).
    let runtime = runtime.insert(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(16)
            .enable_all()
            .build()
            .map_err(MainError::AsyncRuntime)?,
    );
    match mode {
        Mode::Cli(cli) => runtime.block_on(boxed_dispatch(cli.command)),
        Mode::VirtLauncher(flags) => Ok(runtime.block_on(boxed_virt_launcher(flags))?),
    }
}

// The verbs' futures are tens of KiB. Held in `launch`'s frame (and copied into `block_on`'s),
// they made main's stack 78 KiB deep before anything ran, and every page of main's stack ever
// touched stays resident for the VM's life (measured: `[stack]` 164 KiB RSS of the launcher's
// 3.1 MiB RssAnon). Built on the heap by a frame of their own, they leave `launch` small.
#[inline(never)]
fn boxed_dispatch(command: Command) -> Pin<Box<dyn Future<Output = Outcome>>> {
    Box::pin(dispatch(command))
}

#[inline(never)]
fn boxed_virt_launcher(
    flags: vmlauncher::kubevirt::flags::VirtLauncherFlags,
) -> Pin<Box<dyn Future<Output = Result<Ended, vmlauncher::kubevirt::VirtLauncherError>>>> {
    Box::pin(vmlauncher::kubevirt::virt_launcher(flags))
}

async fn dispatch(command: Command) -> Outcome {
    match command {
        Command::Run(args) => run_verb(args).await,
        Command::WarmCache { qemu_cache_dir } => Ok(run::warm_cache(&qemu_cache_dir).await?),
        Command::Convert {
            spec,
            emulation,
            console_log,
        } => convert_verb(&spec, emulation, console_log),
        Command::Validate { spec } => {
            run::load_spec(&spec)?;
            Ok(Ended::Done)
        }
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
                _ => return Err(MainError::NoVolumeSource),
            };
            let serial = serial.unwrap_or_else(|| name.clone());
            addvolume_verb(&socket, output, name, serial, source, persist).await
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
        Command::Console { socket } => cli::console::console(&socket).await,
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
        Command::Migrate {
            socket,
            cancel: true,
            output,
            ..
        } => cli::migrate::cancel(&socket, output).await,
        Command::Migrate {
            socket,
            to,
            timeout,
            bandwidth,
            output,
            tls_dir,
            ..
        } => {
            let Some(to) = to else {
                unreachable!("--to is required without --cancel (clap)");
            };
            cli::migrate::migrate(cli::migrate::MigrateArgs {
                socket: &socket,
                to: &to,
                timeout,
                bandwidth,
                output,
                tls_dir: tls_dir.as_deref(),
            })
            .await
        }
    }
}

/// `run`: the spec file read, its run strategy and published ports decided, then the launcher.
async fn run_verb(args: RunArgs) -> Outcome {
    let (spec, spec_text) = match &args.spec {
        Some(path) => {
            let (spec, text) = run::load_spec(path)?;
            (Some(spec), text)
        }
        None => (None, String::new()),
    };
    let strategy = args
        .run_strategy
        .or(spec.as_ref().and_then(|s| s.run_strategy))
        .unwrap_or(RunStrategy::Once);
    let host_ports = match &spec {
        Some(spec) => {
            vmlauncher::convert::moved_ports(spec, &args.publish).map_err(MainError::Publish)?
        }
        None => Default::default(),
    };
    let ended = run::run(RunOptions {
        spec,
        incoming: args.incoming,
        connect: args.connect,
        runtime_dir: args.runtime_dir,
        socket: args.socket,
        emulation: args.emulation,
        strategy,
        resync_interval: std::time::Duration::from_secs(args.resync_interval.max(1)),
        console: args.console,
        spec_text,
        hotplug_dir: args.hotplug_dir,
        network: args.network,
        publish: vmlauncher::convert::Publish {
            address: args
                .publish_address
                .unwrap_or(vmlauncher::convert::Publish::default_for(args.network).address),
            host_ports,
        },
        reconnect_timeout: (args.reconnect_timeout > 0)
            .then(|| std::time::Duration::from_secs(args.reconnect_timeout)),
        log_max_size: args.log_max_size,
        qemu_cache_dir: (!args.qemu_cache_dir.as_os_str().is_empty())
            .then_some(args.qemu_cache_dir),
        host_disk_roots: args.host_disk_roots,
        qemu_user: args.qemu_user,
        qemu_ids: args.qemu_ids,
        allow_block_devices: args.allow_block_devices,
        guest_loopback: args.guest_loopback,
        tls_dir: args.tls_dir,
        listen: args.listen,
    })
    .await?;
    Ok(ended)
}

/// `convert`: the domain XML of a spec file, on standard output.
fn convert_verb(
    spec: &std::path::Path,
    emulation: vmlauncher::run::Emulation,
    console_log: std::path::PathBuf,
) -> Outcome {
    let (vmi, _) = run::load_spec(spec)?;
    let mut opts = ConvertOptions::new(emulation.resolve(), console_log);
    opts.cpus = vmlauncher::host::cpus::own_cpus().map_err(MainError::OwnCpus)?;
    let def =
        convert::convert(&vmi, &opts).map_err(|errors| run::SpecFileError::NotConvertible {
            path: spec.to_path_buf(),
            errors,
        })?;
    out!("{}", def.to_xml());
    Ok(Ended::Done)
}

/// `addvolume`: the volume added to the launcher's spec and the device to its request.
async fn addvolume_verb(
    socket: &std::path::Path,
    output: cli::args::Output,
    name: String,
    serial: String,
    source: proto::block_device::Source,
    persist: bool,
) -> Outcome {
    edit_volumes(socket, output, |spec, req| {
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
