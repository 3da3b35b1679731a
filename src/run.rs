//! `vmlauncher run`: the pod entrypoint and the terminal front end. Reaches a hypervisor, creates
//! the VM, serves the API, prints every phase change, and on SIGTERM or Ctrl-C stops the guest
//! gracefully; exits with a code that tells how the VM ended.

use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;

use crate::api;
use crate::convert::ConvertOptions;
use crate::domain::VirtType;
use crate::exit::ExitCode;
use crate::launcher::{Launcher, LauncherError, RuntimeDir, StartKind, DEFAULT_GRACE_PERIOD};
use crate::libvirt::daemon::{DaemonOptions, PrivateDaemon};
use crate::libvirt::{Hypervisor, LibvirtError};
use crate::lifecycle::Phase;
use crate::spec::{self, VirtualMachineInstance};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Emulation {
    /// KVM when /dev/kvm can be opened, else TCG.
    Auto,
    Kvm,
    /// Software emulation (`<domain type='qemu'>`).
    Tcg,
}

impl Emulation {
    pub fn resolve(self) -> VirtType {
        match self {
            Emulation::Kvm => VirtType::Kvm,
            Emulation::Tcg => VirtType::Qemu,
            Emulation::Auto => {
                let kvm = fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open("/dev/kvm");
                if kvm.is_ok() {
                    VirtType::Kvm
                } else {
                    VirtType::Qemu
                }
            }
        }
    }
}

#[derive(Debug, Clone)]
pub struct RunOptions {
    pub spec: VirtualMachineInstance,
    pub connect: Option<String>,
    pub runtime_dir: PathBuf,
    pub socket: Option<PathBuf>,
    pub emulation: Emulation,
    /// Mirror the guest's serial console to standard output.
    pub console: bool,
}

/// Progress lines for people and scripts: `vmlauncher: <what>`.
fn say(what: std::fmt::Arguments<'_>) {
    println!("vmlauncher: {what}");
}

fn classify(e: &LauncherError) -> ExitCode {
    match e {
        LauncherError::InvalidSpec(_) => ExitCode::BadSpec,
        LauncherError::Libvirt(l) if l.is_unavailable() => ExitCode::HypervisorUnavailable,
        LauncherError::HostDisk { .. } | LauncherError::Libvirt(_) => ExitCode::GuestFailed,
        _ => ExitCode::Internal,
    }
}

/// Runs the VM until it ends or the launcher is told to stop.
pub async fn run(opts: RunOptions) -> ExitCode {
    let started = Instant::now();
    let rt = RuntimeDir(opts.runtime_dir.clone());
    if let Err(e) = fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&rt.0)
    {
        eprintln!(
            "vmlauncher: cannot create runtime directory {}: {e}",
            rt.0.display()
        );
        return ExitCode::Internal;
    }

    let (events_tx, events_rx) = mpsc::unbounded_channel();
    let connect = opts.connect.clone();
    let libvirt_dir = rt.libvirt_dir();
    let reached = tokio::task::spawn_blocking(move || -> Result<_, String> {
        let daemon = match &connect {
            Some(_) => None,
            None => Some(
                PrivateDaemon::start(&libvirt_dir, DaemonOptions { pod_cgroups: true })
                    .map_err(|e| crate::error_chain(&e))?,
            ),
        };
        let uri = connect.unwrap_or_else(|| daemon.as_ref().expect("started").uri().to_string());
        let hv =
            Hypervisor::open(&uri, events_tx).map_err(|e: LibvirtError| crate::error_chain(&e))?;
        // Resolved once, here, so the guest keeps the machine ABI it started with.
        let machines = match hv.capabilities_xml() {
            Ok(xml) => crate::domain::canonical_machines(&xml).unwrap_or_default(),
            Err(e) => {
                tracing::warn!(error = %crate::error_chain(&e), "machine types stay as written");
                Default::default()
            }
        };
        Ok((daemon, hv, machines))
    })
    .await;
    let (daemon, hv, machines) = match reached {
        Ok(Ok(pair)) => pair,
        Ok(Err(msg)) => {
            eprintln!("vmlauncher: {msg}");
            return ExitCode::HypervisorUnavailable;
        }
        Err(e) => {
            eprintln!("vmlauncher: {e}");
            return ExitCode::Internal;
        }
    };
    say(format_args!("libvirt {}", hv.uri()));
    let hv = Arc::new(hv);

    let console_log = rt.console_log();
    if opts.console {
        mirror_console(console_log.clone());
    }
    let grace = opts
        .spec
        .spec
        .termination_grace_period_seconds
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_GRACE_PERIOD);
    let paths = crate::volumes::HostPaths::local(&rt.0);
    let convert_options = ConvertOptions {
        virt_type: opts.emulation.resolve(),
        console_log: console_log.clone(),
        machines,
        block_volumes: crate::host::block_volumes(&crate::volumes::block_candidates(
            &opts.spec, &paths,
        )),
        paths,
        network: crate::convert::NetworkMode::Local,
    };
    let (launcher, kind) =
        match Launcher::start(hv.clone(), opts.spec.clone(), convert_options, events_rx).await {
            Ok(started) => started,
            Err(e) => {
                eprintln!(
                    "vmlauncher: cannot start the VM: {}",
                    crate::error_chain(&e)
                );
                return classify(&e);
            }
        };
    say(format_args!(
        "domain {} {}",
        launcher.domain_name(),
        match kind {
            StartKind::Created => "created",
            StartKind::Adopted => "adopted",
        }
    ));
    say(format_args!("console {}", console_log.display()));

    let socket = opts.socket.clone().unwrap_or_else(|| rt.socket());
    let listener = match api::bind(&socket) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("vmlauncher: {}", crate::error_chain(&e));
            let _ = launcher.stop(Duration::ZERO).await;
            let _ = launcher.undefine().await;
            return ExitCode::Internal;
        }
    };
    let (stop_api, api_stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(api::serve(launcher.clone(), listener, async {
        let _ = api_stopped.await;
    }));
    say(format_args!("api unix:{}", socket.display()));

    let code = follow(&launcher, grace, started).await;

    let _ = stop_api.send(());
    let _ = server.await;
    let _ = fs::remove_file(&socket);
    if let Err(e) = launcher.undefine().await {
        tracing::warn!(error = %crate::error_chain(&e), "cannot remove the domain definition");
    }
    drop(launcher);
    drop(hv);
    if let Some(mut daemon) = daemon {
        tokio::task::spawn_blocking(move || daemon.stop())
            .await
            .ok();
    }
    code
}

/// Prints phase changes until the VM ends, stopping it on SIGTERM or SIGINT.
async fn follow(launcher: &Launcher, grace: Duration, started: Instant) -> ExitCode {
    let (Ok(mut sigterm), Ok(mut sigint)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        eprintln!("vmlauncher: cannot install signal handlers");
        return ExitCode::Internal;
    };
    let mut changes = launcher.subscribe();
    let mut last: Option<(Phase, &'static str)> = None;
    let mut stop_requested = false;
    loop {
        let status = changes.borrow_and_update().clone();
        let shown = (status.phase, status.printable_status);
        if last != Some(shown) {
            let detail = match (&status.power_state, status.phase_reason) {
                (_, Some(reason)) if status.phase.is_final() => reason.to_string(),
                (Some(power), _) => power.to_string(),
                (None, _) => String::new(),
            };
            say(format_args!(
                "phase {} ({}; {}) after {:.2}s",
                status.phase,
                status.printable_status,
                detail,
                started.elapsed().as_secs_f64()
            ));
            last = Some(shown);
        }
        if status.phase.is_final() {
            return ExitCode::from_final_phase(status.phase, status.phase_reason);
        }
        tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() {
                    return ExitCode::Internal;
                }
            }
            _ = sigterm.recv(), if !stop_requested => {
                stop_requested = true;
                say(format_args!("SIGTERM: stopping the guest (grace period {}s)", grace.as_secs()));
                stop_in_background(launcher, grace).await;
            }
            _ = sigint.recv(), if !stop_requested => {
                stop_requested = true;
                say(format_args!("interrupted: stopping the guest (grace period {}s)", grace.as_secs()));
                stop_in_background(launcher, grace).await;
            }
        }
    }
}

/// Runs the graceful stop; its progress shows up as status changes in `follow`.
async fn stop_in_background(launcher: &Launcher, grace: Duration) {
    if let Err(e) = launcher.stop(grace).await {
        eprintln!("vmlauncher: stopping failed: {}", crate::error_chain(&e));
    }
}

fn mirror_console(path: PathBuf) {
    std::thread::spawn(move || {
        let Ok(mut console) = crate::console::ConsoleLog::from_end(&path) else {
            return;
        };
        let forever = Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600);
        while let Ok(Some(line)) = console.next_line(forever) {
            println!("[console] {line}");
        }
    });
}

/// Reads a spec file; `-` reads standard input.
pub fn read_spec(path: &std::path::Path) -> Result<String, std::io::Error> {
    if path.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())
    } else {
        fs::read_to_string(path)
    }
}

/// Parses and validates, printing every problem with its field path.
pub fn load_spec(path: &std::path::Path) -> Result<VirtualMachineInstance, ExitCode> {
    let text = read_spec(path).map_err(|e| {
        eprintln!("vmlauncher: cannot read {}: {e}", path.display());
        ExitCode::BadSpec
    })?;
    spec::parse(&text).map_err(|errors| {
        for e in &errors.0 {
            eprintln!("{}: {e}", path.display());
        }
        ExitCode::BadSpec
    })
}
