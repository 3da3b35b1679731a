//! The command line: verbs, their arguments and their help.

use std::path::PathBuf;

use clap::builder::TypedValueParser as _;
use clap::{Parser, Subcommand, ValueEnum};
use vmlauncher::lifecycle::RunStrategy;
use vmlauncher::run::Emulation;

#[derive(Debug, Parser)]
#[command(
    name = "vmlauncher",
    version,
    about = "Runs one virtual machine and keeps it in the state its owner asks for"
)]
pub(crate) struct Cli {
    /// Log format on standard error.
    #[arg(long, global = true, value_enum, default_value = "human")]
    pub(crate) log_format: LogFormat,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum LogFormat {
    Human,
    Json,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum Output {
    Text,
    Json,
}

/// `run`'s options.
#[derive(Debug, clap::Args)]
pub(crate) struct RunArgs {
    /// The VMI (or VirtualMachine) manifest; with --incoming, optional (the source sends
    /// its own), and when given the source's must be the same.
    #[arg(required_unless_present = "incoming")]
    pub(crate) spec: Option<PathBuf>,
    /// Start with no VM and wait for one to come by live migration from another launcher
    /// (`vmlauncher migrate --to` this launcher's socket).
    #[arg(long, conflicts_with = "connect")]
    pub(crate) incoming: bool,
    /// Use this libvirt instead of starting a private libvirtd.
    #[arg(long)]
    pub(crate) connect: Option<String>,
    /// Where the launcher keeps its socket, console log and private libvirtd.
    #[arg(long, default_value = "/var/run/vmlauncher", value_parser = utf8_path())]
    pub(crate) runtime_dir: PathBuf,
    /// The gRPC socket (default: RUNTIME_DIR/launcher.sock).
    #[arg(long)]
    pub(crate) socket: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "auto")]
    pub(crate) emulation: Emulation,
    /// What happens when the VM stops (KubeVirt's runStrategy). Default: a VirtualMachine
    /// manifest's `spec.runStrategy`; a bare VMI runs Once.
    #[arg(long, value_enum)]
    pub(crate) run_strategy: Option<RunStrategy>,
    /// Seconds between safety-net re-reads of the real state (events do the real work).
    #[arg(long, default_value_t = 30)]
    pub(crate) resync_interval: u64,
    /// Mirror the guest's serial console to standard output.
    #[arg(long)]
    pub(crate) console: bool,
    /// Where hot-plugged volumes live: block nodes the launcher makes, and image files
    /// (default: RUNTIME_DIR/hotplug; /var/run/kubevirt/hotplug-disks in a pod).
    #[arg(long, value_parser = utf8_path())]
    pub(crate) hotplug_dir: Option<PathBuf>,
    /// local: QEMU's user-mode network. pod: masquerade interfaces too (ports published on
    /// the pod's addresses), bridge interfaces the pod's tap devices (`tap0`, `tap1`, ...).
    #[arg(long, value_enum, default_value = "local")]
    pub(crate) network: vmlauncher::convert::NetworkMode,
    /// The host address masquerade interfaces' `ports` are published on (default:
    /// 127.0.0.1 for a local run, 0.0.0.0 in a pod).
    #[arg(long)]
    pub(crate) publish_address: Option<std::net::Ipv4Addr>,
    /// Publish guest port PORT on host port HOSTPORT instead of its own number
    /// (HOSTPORT:PORT, repeatable), e.g. `--publish 2222:22`.
    #[arg(long = "publish", value_name = "HOSTPORT:PORT", value_parser = parse_publish)]
    pub(crate) publish: Vec<(u16, u16)>,
    /// Seconds to keep reconnecting to a lost libvirt before giving up (phase Unknown, exit
    /// 3); 0 never gives up.
    #[arg(long, default_value_t = 300)]
    pub(crate) reconnect_timeout: u64,
    /// The most bytes the console log and QEMU's log each hold before the launcher keeps
    /// the log as NAME.1 and starts it again (with a private libvirtd; at least 4096).
    #[arg(long, default_value_t = vmlauncher::logs::DEFAULT_MAX_SIZE,
          value_parser = clap::value_parser!(u64).range(vmlauncher::logs::MIN_MAX_SIZE..))]
    pub(crate) log_max_size: u64,
    /// QEMU's capability cache shared by every launcher of the host; "" shares none.
    #[arg(long, default_value = vmlauncher::libvirt::capcache::DEFAULT_DIR)]
    pub(crate) qemu_cache_dir: PathBuf,
    /// The only directories a spec's hostDisk may be under, links followed (absolute,
    /// repeatable; default: anywhere but the host's and the launcher's own places).
    #[arg(long = "host-disk-root", value_name = "DIR", value_parser = absolute_path())]
    pub(crate) host_disk_roots: Vec<PathBuf>,
    /// The user QEMU runs as: a name or uid, or `root` (default on a host: an id of its
    /// own from --qemu-ids; in a pod or with --connect: the libvirt-qemu or qemu account).
    #[arg(long, value_name = "USER")]
    pub(crate) qemu_user: Option<String>,
    /// The uids (each with the same gid) from which each launcher on a host takes one for its
    /// QEMU, FIRST-LAST; no account of the host may use them.
    #[arg(long, value_name = "FIRST-LAST",
          default_value_t = vmlauncher::host::qemu_ids::DEFAULT_RANGE)]
    pub(crate) qemu_ids: vmlauncher::host::qemu_ids::QemuIdRange,
    /// A block device a Sync may attach, MAJOR:MINOR (repeatable). Listing any restricts a
    /// host run to those; in a container only listed devices, and those the node daemon
    /// put a node for in the hotplug dir, may be attached.
    #[arg(long = "allow-block-device", value_name = "MAJOR:MINOR")]
    pub(crate) allow_block_devices: Vec<vmlauncher::host::DevNumber>,
    /// Whether the guest reaches the host's loopback through its gateway (10.0.2.2) on
    /// user-mode networking (default: open on a host run; closed with --network pod unless
    /// the VMI's annotation vmlauncher.io/guest-reaches-host-loopback is "true").
    #[arg(long, value_enum)]
    pub(crate) guest_loopback: Option<vmlauncher::host::loopback::GuestLoopback>,
    /// Credentials to migrate between machines over TCP under mutual TLS: ca-cert.pem,
    /// server-cert.pem, server-key.pem, client-cert.pem, client-key.pem (QEMU's names), all
    /// signed by one CA; a target's server certificate names the host sources dial.
    #[arg(long, value_name = "DIR", conflicts_with = "connect", value_parser = utf8_path())]
    pub(crate) tls_dir: Option<PathBuf>,
    /// A migration target reachable from other machines: its API on ADDR:PORT, its
    /// libvirtd on PORT+1, the guest's memory on PORT+2 and its copied disks on PORT+3, all
    /// under TLS (`vmlauncher migrate --to HOST:PORT`).
    #[arg(long, value_name = "ADDR:PORT", requires_all = ["incoming", "tls_dir"],
          value_parser = parse_listen)]
    pub(crate) listen: Option<std::net::SocketAddr>,
}

// Parsed once per process: `Run`'s many options inline cost nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Boot the VM of SPEC and keep it running until it ends or the launcher is stopped.
    Run(RunArgs),
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
    /// Attach to the guest's serial console (Ctrl-] leaves; the VM goes on).
    Console {
        #[arg(long, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
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
    /// Live-migrate the VM to the launcher listening on --to (one started with
    /// `run --incoming`); exits 0 once the guest runs there. --cancel aborts the one in flight.
    Migrate {
        #[arg(long, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
        /// The target launcher's API socket, or HOST:PORT for one on another machine (started
        /// with `run --incoming --listen`; this launcher needs --tls-dir).
        #[arg(long, required_unless_present = "cancel")]
        to: Option<String>,
        /// Credentials (`run --tls-dir`'s) to read the target's end of a migration over TCP:
        /// without them the guest's pause at switch-over is not shown.
        #[arg(long, value_name = "DIR", conflicts_with = "cancel")]
        tls_dir: Option<PathBuf>,
        /// Seconds before the migration is cancelled (the guest stays here); 0: no limit.
        #[arg(long, default_value_t = 0)]
        timeout: u32,
        /// The most MiB/s the migration may use; 0: no limit.
        #[arg(long, default_value_t = 0)]
        bandwidth: u64,
        #[arg(long, conflicts_with_all = ["to", "timeout", "bandwidth"])]
        cancel: bool,
        #[arg(long, value_enum, default_value = "text")]
        output: Output,
    },
}

pub(crate) const DEFAULT_SOCKET: &str = "/var/run/vmlauncher/launcher.sock";

#[derive(Debug, clap::Args)]
pub(crate) struct Target {
    #[arg(long, default_value = DEFAULT_SOCKET)]
    pub(crate) socket: PathBuf,
    #[arg(long, value_enum, default_value = "text")]
    pub(crate) output: Output,
}

/// A directory whose paths end up as text (libvirt's XML, the hotplug records): a name that is
/// not UTF-8 is a usage error naming the option, not a failure deep inside (the records file
/// could not be written).
fn utf8_path() -> impl clap::builder::TypedValueParser<Value = PathBuf> {
    clap::builder::OsStringValueParser::new().try_map(|os| {
        os.into_string()
            .map(PathBuf::from)
            .map_err(|os| format!("{} is not UTF-8", PathBuf::from(os).display()))
    })
}

/// A UTF-8 absolute path: a relative one would depend on where the launcher was started.
fn absolute_path() -> impl clap::builder::TypedValueParser<Value = PathBuf> {
    utf8_path().try_map(|path: PathBuf| {
        if path.is_absolute() {
            Ok(path)
        } else {
            Err(format!("{} is not an absolute path", path.display()))
        }
    })
}

/// `HOSTPORT:PORT` of `run --publish`.
/// `--listen`: an address and a port with room for the three after it.
fn parse_listen(text: &str) -> Result<std::net::SocketAddr, String> {
    let addr: std::net::SocketAddr = text
        .parse()
        .map_err(|_| format!("{text:?} is not ADDR:PORT (an IP address and a port)"))?;
    if let std::net::SocketAddr::V6(v6) = addr {
        if v6.scope_id() != 0 {
            return Err(format!(
                "{text:?}: a link-local address with a scope is not one a source could dial"
            ));
        }
    }
    let last = u32::from(addr.port()) + u32::from(vmlauncher::migration_tls::TARGET_PORTS) - 1;
    if addr.port() == 0 || last > u32::from(u16::MAX) {
        return Err(format!(
            "port {} leaves no room for the {} ports a target listens on",
            addr.port(),
            vmlauncher::migration_tls::TARGET_PORTS
        ));
    }
    Ok(addr)
}

fn parse_publish(arg: &str) -> Result<(u16, u16), String> {
    let (host, guest) = arg
        .split_once(':')
        .ok_or_else(|| format!("{arg:?}: expected HOSTPORT:PORT, e.g. 2222:22"))?;
    let port = |p: &str| match p.parse::<u16>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{p:?} is not a port (1-65535)")),
    };
    Ok((port(host)?, port(guest)?))
}
