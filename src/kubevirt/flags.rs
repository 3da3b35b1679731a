//! `vmlauncher virt-launcher`'s command line: every flag KubeVirt's virt-launcher takes (its
//! `cmd/virt-launcher/virt-launcher.go`, parsed there by pflag), with the same defaults, so that
//! KubeVirt's pod template starts this launcher unchanged. pflag's syntax: `--flag value`,
//! `--flag=value`, a bool as `--flag` or `--flag=false`, the one-letter `-v` as `-v N` or `-v=N`.
//! An unknown flag is a usage error, as it is for pflag. vmlauncher's own `--emulation`,
//! `--runtime-dir`, `--qemu-cache-dir`, `--log-format` and `--libvirt-socket` are taken too.

use std::path::PathBuf;
use std::time::Duration;

use crate::run::Emulation;

/// The flags, parsed. Those whose feature this launcher does not build are in `not_built`, by
/// name, for one log line each.
#[derive(Debug, Clone, PartialEq)]
pub struct VirtLauncherFlags {
    pub qemu_timeout: Duration,
    pub name: String,
    pub uid: String,
    pub namespace: String,
    pub kubevirt_share_dir: PathBuf,
    pub ephemeral_disk_dir: PathBuf,
    pub container_disk_dir: PathBuf,
    pub hotplug_disk_dir: PathBuf,
    pub grace_period_seconds: i64,
    pub allow_emulation: bool,
    pub ovmf_path: PathBuf,
    pub hypervisor: String,
    pub verbosity: u32,
    /// vmlauncher's own: TCG, KVM, or KVM when `/dev/kvm` opens. `--allow-emulation` without
    /// it means `auto`, as KubeVirt falls back to emulation only when allowed.
    pub emulation: Option<Emulation>,
    pub runtime_dir: PathBuf,
    pub qemu_cache_dir: Option<PathBuf>,
    pub log_json: bool,
    /// vmlauncher's own: where a migration target shows virt-handler its libvirt, which
    /// virt-handler's migration proxy reaches at KubeVirt's fixed path in the pod.
    pub libvirt_socket: PathBuf,
    /// vmlauncher's own: KubeVirt's private emptyDir, fixed in its launcher; the consoles go to
    /// `<dir>/<uid>/`, where virt-handler's console server looks for them.
    pub kubevirt_private_dir: PathBuf,
    /// Flags given whose feature is not built here, with their values.
    pub not_built: Vec<(String, String)>,
}

impl Default for VirtLauncherFlags {
    fn default() -> Self {
        VirtLauncherFlags {
            qemu_timeout: Duration::from_secs(180),
            name: String::new(),
            uid: String::new(),
            namespace: String::new(),
            kubevirt_share_dir: "/var/run/kubevirt".into(),
            ephemeral_disk_dir: "/var/run/kubevirt-ephemeral-disks".into(),
            container_disk_dir: "/var/run/kubevirt/container-disks".into(),
            hotplug_disk_dir: "/var/run/kubevirt/hotplug-disks".into(),
            grace_period_seconds: 30,
            allow_emulation: false,
            ovmf_path: "/usr/share/OVMF".into(),
            hypervisor: "kvm".into(),
            verbosity: 2,
            emulation: None,
            runtime_dir: "/var/run/kubevirt-private/vmlauncher".into(),
            qemu_cache_dir: Some("/var/cache/vmlauncher/qemu-capabilities".into()),
            log_json: false,
            libvirt_socket: "/var/run/libvirt/virtqemud-sock".into(),
            kubevirt_private_dir: "/var/run/kubevirt-private".into(),
            not_built: Vec::new(),
        }
    }
}

/// Why the command line was refused (exit 64), or a request for help (exit 0).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlagsError {
    #[error("unknown flag: {0}")]
    Unknown(String),
    #[error("flag needs an argument: {0}")]
    MissingValue(String),
    #[error("invalid argument {value:?} for \"{flag}\" flag: {why}")]
    Invalid {
        flag: String,
        value: String,
        why: &'static str,
    },
    #[error("unexpected argument {0:?}: virt-launcher takes flags only")]
    Positional(String),
    #[error("help requested")]
    Help,
    #[error("an argument is not UTF-8")]
    NotUtf8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Bool,
    Value,
}

/// KubeVirt's flags whose feature this launcher does not build: accepted, logged once.
const NOT_BUILT: &[(&str, Kind)] = &[
    ("allow-cross-arch-emulation", Kind::Bool),
    ("run-as-nonroot", Kind::Bool),
    ("image-volume", Kind::Bool),
    ("upgrade-ordinal-ifaces", Kind::Bool),
    ("vgpu-dedicated-hook", Kind::Bool),
    ("vm-stats-collector", Kind::Bool),
    ("firmware-auto-selection", Kind::Bool),
    ("simulate-crash", Kind::Bool),
    ("keep-after-failure", Kind::Bool),
    ("hook-sidecars", Kind::Value),
    ("disk-memory-limit", Kind::Value),
    ("qemu-agent-sys-interval", Kind::Value),
    ("qemu-agent-file-interval", Kind::Value),
    ("qemu-agent-user-interval", Kind::Value),
    ("qemu-agent-version-interval", Kind::Value),
    ("qemu-fsfreeze-status-interval", Kind::Value),
    ("libvirt-log-filters", Kind::Value),
];

/// The flags this launcher acts on, and whether each takes a value.
const BUILT: &[(&str, Kind)] = &[
    ("qemu-timeout", Kind::Value),
    ("name", Kind::Value),
    ("uid", Kind::Value),
    ("namespace", Kind::Value),
    ("kubevirt-share-dir", Kind::Value),
    ("ephemeral-disk-dir", Kind::Value),
    ("container-disk-dir", Kind::Value),
    ("hotplug-disk-dir", Kind::Value),
    ("grace-period-seconds", Kind::Value),
    ("allow-emulation", Kind::Bool),
    ("ovmf-path", Kind::Value),
    ("hypervisor", Kind::Value),
    ("v", Kind::Value),
    ("emulation", Kind::Value),
    ("runtime-dir", Kind::Value),
    ("qemu-cache-dir", Kind::Value),
    ("log-format", Kind::Value),
    ("libvirt-socket", Kind::Value),
    ("kubevirt-private-dir", Kind::Value),
];

/// Printed with a usage error and for `--help`.
pub const USAGE: &str = "\
usage: vmlauncher virt-launcher [FLAGS]   (or the binary invoked as virt-launcher)
KubeVirt's virt-launcher flags, with KubeVirt's defaults:
  --name, --uid, --namespace            the VMI this launcher runs
  --kubevirt-share-dir DIR              /var/run/kubevirt: sockets/launcher-sock, domain-notify-pipe.sock
  --hotplug-disk-dir DIR                /var/run/kubevirt/hotplug-disks
  --container-disk-dir DIR              /var/run/kubevirt/container-disks
  --ephemeral-disk-dir DIR              /var/run/kubevirt-ephemeral-disks
  --grace-period-seconds N              30
  --qemu-timeout DURATION               3m: exit if no Sync created the domain by then
  --allow-emulation                     TCG when KVM is missing
  --ovmf-path DIR, --hypervisor NAME, -v N
  accepted, not built: --hook-sidecars, --disk-memory-limit, --libvirt-log-filters, --run-as-nonroot,
  --keep-after-failure, --qemu-agent-*-interval, --qemu-fsfreeze-status-interval, --image-volume, ...
vmlauncher's own: --emulation auto|kvm|tcg, --runtime-dir DIR, --qemu-cache-dir DIR, --log-format human|json,
  --libvirt-socket PATH (/var/run/libvirt/virtqemud-sock: where a migration target shows its libvirt),
  --kubevirt-private-dir DIR (/var/run/kubevirt-private: the consoles go to DIR/<uid>/virt-serial0, virt-vnc)
";

/// Parses the arguments after `virt-launcher` (argv without the program and verb).
pub fn parse<I, S>(args: I) -> Result<VirtLauncherFlags, FlagsError>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let mut flags = VirtLauncherFlags::default();
    let mut args = args.into_iter().map(Into::into);
    while let Some(arg) = args.next() {
        if arg == "--help" || arg == "-h" {
            return Err(FlagsError::Help);
        }
        let body = if let Some(long) = arg.strip_prefix("--") {
            long
        } else if let Some(short) = arg.strip_prefix('-').filter(|s| s.starts_with('v')) {
            // The one shorthand: `-v` (KubeVirt's verbosity, a Go flag pflag gives a shorthand).
            short
        } else {
            return Err(FlagsError::Positional(arg));
        };
        let (name, inline) = match body.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (body.to_string(), None),
        };
        let kind = BUILT
            .iter()
            .chain(NOT_BUILT)
            .find(|(n, _)| *n == name)
            .map(|(_, k)| *k)
            .ok_or_else(|| FlagsError::Unknown(arg.clone()))?;
        let value = match (kind, inline) {
            (_, Some(v)) => v,
            (Kind::Bool, None) => "true".into(),
            (Kind::Value, None) => args
                .next()
                .ok_or_else(|| FlagsError::MissingValue(format!("--{name}")))?,
        };
        set(&mut flags, &name, kind, value)?;
    }
    Ok(flags)
}

fn set(
    flags: &mut VirtLauncherFlags,
    name: &str,
    kind: Kind,
    value: String,
) -> Result<(), FlagsError> {
    let invalid = |why| FlagsError::Invalid {
        flag: format!("--{name}"),
        value: value.clone(),
        why,
    };
    if kind == Kind::Bool {
        parse_bool(&value).ok_or_else(|| invalid("not a boolean"))?;
    }
    if NOT_BUILT.iter().any(|(n, _)| *n == name) {
        if name.contains("interval") {
            go_duration(&value).ok_or_else(|| invalid("not a duration"))?;
        }
        flags.not_built.push((name.to_string(), value));
        return Ok(());
    }
    match name {
        "qemu-timeout" => {
            flags.qemu_timeout = go_duration(&value).ok_or_else(|| invalid("not a duration"))?
        }
        "name" => flags.name = value,
        "uid" => {
            // A directory's name (the consoles'), so one path component and nothing else.
            if value.is_empty() || value == "." || value == ".." || value.contains(['/', '\0']) {
                return Err(invalid("not a name: a VMI's uid is one path component"));
            }
            flags.uid = value
        }
        "namespace" => flags.namespace = value,
        "kubevirt-share-dir" => flags.kubevirt_share_dir = value.into(),
        "ephemeral-disk-dir" => flags.ephemeral_disk_dir = value.into(),
        "container-disk-dir" => flags.container_disk_dir = value.into(),
        "hotplug-disk-dir" => flags.hotplug_disk_dir = value.into(),
        "grace-period-seconds" => {
            flags.grace_period_seconds = value.parse().map_err(|_| invalid("not an integer"))?
        }
        "allow-emulation" => flags.allow_emulation = parse_bool(&value).unwrap_or_default(),
        "ovmf-path" => flags.ovmf_path = value.into(),
        "hypervisor" => flags.hypervisor = value,
        "v" => flags.verbosity = value.parse().map_err(|_| invalid("not a level"))?,
        "emulation" => {
            flags.emulation = Some(match value.as_str() {
                "auto" => Emulation::Auto,
                "kvm" => Emulation::Kvm,
                "tcg" => Emulation::Tcg,
                _ => return Err(invalid("one of auto, kvm, tcg")),
            })
        }
        "runtime-dir" => flags.runtime_dir = value.into(),
        "libvirt-socket" => flags.libvirt_socket = value.into(),
        "kubevirt-private-dir" => flags.kubevirt_private_dir = value.into(),
        "qemu-cache-dir" => {
            flags.qemu_cache_dir = (!value.is_empty()).then(|| PathBuf::from(value))
        }
        "log-format" => {
            flags.log_json = match value.as_str() {
                "human" => false,
                "json" => true,
                _ => return Err(invalid("one of human, json")),
            }
        }
        _ => unreachable!("every flag of BUILT is handled"),
    }
    Ok(())
}

impl VirtLauncherFlags {
    /// What the VM runs on: `--emulation` when given; else KVM, or TCG where KVM is missing
    /// only when `--allow-emulation` says so (KubeVirt's rule).
    pub(crate) fn emulation(&self) -> Emulation {
        match (self.emulation, self.allow_emulation) {
            (Some(e), _) => e,
            (None, true) => Emulation::Auto,
            (None, false) => Emulation::Kvm,
        }
    }

    /// `<namespace>_<name>`, KubeVirt's domain name.
    pub(crate) fn domain_name(&self) -> String {
        format!("{}_{}", self.namespace, self.name)
    }
}

/// Go's `strconv.ParseBool`.
fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

/// Go's `time.ParseDuration` for what flags use: a sequence of `<number><unit>` (`3m`,
/// `1h30m`, `2.5s`, `300ms`); `0` alone is zero. Bounded to a day's worth of whole units.
fn go_duration(s: &str) -> Option<Duration> {
    if s == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = s;
    let mut total = 0f64;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += number * seconds;
    }
    (total.is_finite() && total <= 1e9).then(|| Duration::from_secs_f64(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pod_template_line_parses_with_kubevirts_defaults() {
        // The arguments KubeVirt's virt-controller writes into the launcher container.
        let f = parse([
            "--qemu-timeout",
            "255s",
            "--name",
            "testvmi",
            "--uid",
            "8f6b0c2e-1f0a-4c9e-9d55-0b7d3c1a2e44",
            "--namespace",
            "default",
            "--kubevirt-share-dir",
            "/var/run/kubevirt",
            "--ephemeral-disk-dir",
            "/var/run/kubevirt-ephemeral-disks",
            "--container-disk-dir",
            "/var/run/kubevirt/container-disks",
            "--grace-period-seconds",
            "45",
            "--hook-sidecars",
            "0",
            "--ovmf-path",
            "/usr/share/OVMF",
            "--disk-memory-limit",
            "2097152000",
            "-v=2",
        ])
        .unwrap();
        assert_eq!(f.qemu_timeout, Duration::from_secs(255));
        assert_eq!(f.domain_name(), "default_testvmi");
        assert_eq!(f.grace_period_seconds, 45);
        assert_eq!(
            f.hotplug_disk_dir,
            PathBuf::from("/var/run/kubevirt/hotplug-disks")
        );
        assert_eq!(f.verbosity, 2);
        assert_eq!(
            f.not_built,
            vec![
                ("hook-sidecars".to_string(), "0".to_string()),
                ("disk-memory-limit".to_string(), "2097152000".to_string())
            ]
        );
    }

    #[test]
    fn pflag_syntax_bools_and_inline_values() {
        let f = parse([
            "--allow-emulation",
            "--name=a",
            "--keep-after-failure=false",
            "-v",
            "4",
        ])
        .unwrap();
        assert!(f.allow_emulation);
        assert_eq!(f.name, "a");
        assert_eq!(f.verbosity, 4);
        assert_eq!(f.emulation(), Emulation::Auto);
        let f = parse(["--allow-emulation=false", "--emulation", "tcg"]).unwrap();
        assert!(!f.allow_emulation);
        assert_eq!(f.emulation(), Emulation::Tcg);
        assert_eq!(
            parse::<[&str; 0], &str>([]).unwrap().emulation(),
            Emulation::Kvm
        );
    }

    #[test]
    fn unknown_missing_and_invalid_are_usage_errors() {
        assert_eq!(
            parse(["--no-such-flag"]),
            Err(FlagsError::Unknown("--no-such-flag".into()))
        );
        assert_eq!(
            parse(["--name"]),
            Err(FlagsError::MissingValue("--name".into()))
        );
        assert!(matches!(
            parse(["--qemu-timeout", "soon"]),
            Err(FlagsError::Invalid { .. })
        ));
        assert!(matches!(
            parse(["--allow-emulation=maybe"]),
            Err(FlagsError::Invalid { .. })
        ));
        for uid in ["", "..", "a/b", "../../etc"] {
            assert!(
                matches!(parse(["--uid", uid]), Err(FlagsError::Invalid { flag, .. }) if flag == "--uid"),
                "{uid:?}"
            );
        }
        assert_eq!(
            parse(["vm.yaml"]),
            Err(FlagsError::Positional("vm.yaml".into()))
        );
        assert_eq!(parse(["--help"]), Err(FlagsError::Help));
    }

    #[test]
    fn go_durations() {
        assert_eq!(go_duration("3m"), Some(Duration::from_secs(180)));
        assert_eq!(go_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(go_duration("300ms"), Some(Duration::from_millis(300)));
        assert_eq!(go_duration("0"), Some(Duration::ZERO));
        assert_eq!(go_duration("5"), None);
        assert_eq!(go_duration(""), None);
        assert_eq!(go_duration("1e400h"), None);
    }
}
