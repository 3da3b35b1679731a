//! What can be wrong with a spec, as values: [`Problem`] carries what the user wrote and what was
//! expected; [`FieldError`] pins it to a field path. `Display` renders the messages the CLI, the
//! gRPC status and the tests read (`spec.volumes[0].name: "x/y" looks like a path; ...`).

use std::collections::BTreeSet;
use std::fmt;

use super::checks::{Base64Error, HostPathError, MacError, NameError, SerialError};
use super::quantity::QuantityError;

/// One problem with one field. Messages are lowercase, without a trailing period, and quote the
/// value the user wrote.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    // The document as a whole.
    /// YAML or JSON that does not parse (the parser's own words).
    #[error("{message}")]
    Syntax { message: String },
    #[error("not a Kubernetes object (expected apiVersion, kind, metadata, spec)")]
    NotAnObject,
    /// A field serde refused: unknown, or of the wrong type (serde's own words).
    #[error("{message}")]
    Shape { message: String },
    #[error("{kind:?}: unsupported kind (VirtualMachineInstance or VirtualMachine)")]
    UnsupportedKind { kind: String },
    #[error("{version:?} is not supported, use kubevirt.io/v1")]
    UnsupportedApiVersion { version: String },
    #[error("cannot be combined with spec.runStrategy")]
    RunningWithRunStrategy,

    // Any field.
    /// A KubeVirt field (or value) outside the subset, and why.
    #[error("unsupported ({why})")]
    Unsupported { why: &'static str },
    #[error("{value:?}: unsupported ({why})")]
    UnsupportedValue { value: String, why: &'static str },
    #[error("{value:?} is not one of {}", .allowed.join(", "))]
    NotOneOf {
        value: String,
        allowed: &'static [&'static str],
    },
    #[error("is required")]
    Required,
    #[error("is required with {condition}")]
    RequiredWith { condition: &'static str },
    #[error("{first} or {second} is required")]
    EitherRequired {
        first: &'static str,
        second: &'static str,
    },
    #[error("{first} and {second} cannot both be set")]
    BothSet {
        first: &'static str,
        second: &'static str,
    },
    #[error("only one of {fields} may be set")]
    OnlyOneOf { fields: &'static str },
    #[error("must be at least {min}")]
    AtLeast { min: u64 },
    #[error("must be more than 0")]
    Zero,
    /// `300 disks, at most 256`.
    #[error("{count} {what}, at most {max}")]
    TooMany {
        count: usize,
        what: &'static str,
        max: usize,
    },
    /// `200Pi is more than 2Pi`.
    #[error("{value} is more than {max}")]
    TooLarge { value: String, max: &'static str },
    #[error("control character U+{:04X}", u32::from(*.ch))]
    ControlCharacter { ch: char },
    #[error("{path:?} must be an absolute path")]
    NotAbsolute { path: String },
    #[error("duplicate {what} name {name:?}")]
    Duplicate { what: &'static str, name: String },
    /// `disk "a" has no volume of the same name`.
    #[error("{what} {name:?} has no {partner} of the same name")]
    NoPartner {
        what: &'static str,
        name: String,
        partner: &'static str,
    },
    /// `a volume needs a source (supported: ...)`.
    #[error("{what} needs {needs} (supported: {supported})")]
    Missing {
        what: &'static str,
        needs: &'static str,
        supported: &'static str,
    },
    #[error(transparent)]
    Name(#[from] NameError),
    #[error(transparent)]
    Quantity(#[from] QuantityError),
    #[error(transparent)]
    Serial(#[from] SerialError),
    #[error(transparent)]
    Mac(#[from] MacError),
    #[error(transparent)]
    Base64(#[from] Base64Error),
    #[error(transparent)]
    HostPath(#[from] HostPathError),

    // Memory and CPU.
    /// `70000 vCPUs (sockets × cores × threads), at most 288`.
    #[error("{count} vCPUs{from}, at most {max}")]
    TooManyVcpus {
        count: u128,
        from: &'static str,
        max: u64,
    },
    #[error("{bytes} bytes is too little memory for a guest (at least 1Mi)")]
    TooLittleMemory { bytes: u64 },
    #[error("guest memory is required (spec.domain.memory.guest or resources.requests.memory)")]
    NoGuestMemory,
    #[error("guest memory ({guest} bytes) is not a multiple of the page size {page_size}")]
    NotPageAligned { guest: u64, page_size: String },
    /// `guest` (or `sockets`) above its hotplug maximum.
    #[error("{value} is more than {max_field} ({max})")]
    AboveMaximum {
        value: String,
        max_field: &'static str,
        max: String,
    },
    #[error("{bytes} bytes is not a multiple of {alignment} (virtio-mem's block)")]
    NotBlockAligned { bytes: u64, alignment: &'static str },
    /// KubeVirt's floor for memory hotplug: the guest kernel needs room for its own structures.
    #[error("{bytes} bytes at boot is below 1Gi, the least memory hotplug works with")]
    BelowHotplugMinimum { bytes: u64 },
    /// Less guest memory than the running guest booted with.
    #[error("{bytes} bytes is less than the {boot} bytes the guest booted with (a restart can lower it)")]
    BelowBootMemory { bytes: u64, boot: u64 },
    #[error("{page_size:?} is not 2Mi or 1Gi")]
    PageSize { page_size: String },
    #[error("{model:?} is not a CPU model name (host-model, host-passthrough or a libvirt model)")]
    CpuModel { model: String },
    #[error("{name:?} is not a CPU feature name")]
    CpuFeature { name: String },
    #[error("duplicate CPU feature {name:?}")]
    DuplicateCpuFeature { name: String },

    // Machine, firmware, features, clock.
    #[error("{machine:?} is not a supported machine type (q35, pc-q35-*, pc, pc-i440fx-*)")]
    MachineType { machine: String },
    #[error("{uuid:?} is not a UUID")]
    Uuid { uuid: String },
    #[error("{serial:?}: an SMBIOS serial is 1-64 printable ASCII characters")]
    SmbiosSerial { serial: String },
    #[error("secure boot needs a q35 machine")]
    SecureBootNeedsQ35,
    #[error("secure boot needs SMM; spec.domain.features.smm is disabled")]
    SecureBootNeedsSmm,
    #[error("a kernel boot needs a container with kernelPath")]
    KernelBootNeedsContainer,
    #[error("{id:?}: a Hyper-V vendor id is 1-12 ASCII characters")]
    VendorId { id: String },
    #[error("{zone:?} is not a time zone name")]
    TimeZone { zone: String },
    #[error("not available for the {timer} timer")]
    NoTickPolicy { timer: &'static str },
    #[error("only the rtc timer has track")]
    TrackNotRtc,

    // Devices.
    #[error("boot order {order} is already used by {first}")]
    BootOrderTaken { order: u32, first: String },
    #[error("bus {bus:?} is not valid for a {kind} (valid: {})", .allowed.join(", "))]
    BusNotValid {
        bus: String,
        kind: &'static str,
        allowed: &'static [&'static str],
    },
    #[error("a lun shows the device's own serial")]
    LunSerial,
    #[error("io native needs cache none, not {cache:?}")]
    NativeIoNeedsNoCache { cache: String },
    #[error("only virtio disks run on an iothread")]
    IoThreadNeedsVirtio,
    #[error("a read-only disk cannot be on bus sata (use virtio or scsi, or a cdrom)")]
    ReadOnlySata,
    #[error("a lun needs a block device: a hostDisk, persistentVolumeClaim or dataVolume")]
    LunNeedsBlockSource,
    #[error("at most one pod network")]
    SecondPodNetwork,
    #[error("only one binding may be set")]
    OneBinding,
    #[error("masquerade is only for the pod network")]
    MasqueradeNotPod,
    #[error("ports are published only by a masquerade interface")]
    PortsNeedMasquerade,
    #[error("port {port}/{protocol} is listed twice")]
    DuplicatePort { port: i64, protocol: String },
    #[error("needs {what}")]
    Needs { what: &'static str },
    #[error("needs {needed} CPUs of the launcher's own ({available} available: {cpus})")]
    NotEnoughCpus {
        needed: usize,
        available: usize,
        cpus: String,
    },
    #[error("{port} is not a port (1-65535)")]
    NotAPort { port: i64 },

    // Volumes.
    #[error("only one source may be set, found {}", .found.join(", "))]
    OneSource { found: Vec<&'static str> },
    #[error("{value:?} is not a hostDisk type (Disk or DiskOrCreate)")]
    HostDiskType { value: String },
    #[error("volume {name:?} is not used by any disk")]
    UnusedVolume { name: String },
    /// Found by `convert`, which knows what the host found at the volume's path.
    #[error("volume {volume:?} is not a block device on this host ({path}); a lun needs one")]
    NotABlockDevice { volume: String, path: String },
    /// Found by `convert`: `run --connect` takes no claims (`convert::refused`).
    #[error("volume {volume:?} is a claim, which is refused with --connect {uri}: a claim's image is handed to QEMU only as the file the launcher opened and checked (by descriptor or pinned), which it cannot do through a libvirt it does not run; by path, that libvirt would open and relabel whatever link was put there")]
    ClaimUnderConnect { volume: String, uri: String },
}

/// One problem in a spec, with the path of the field it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub path: String,
    pub problem: Problem,
}

impl FieldError {
    pub(crate) fn new(path: impl Into<String>, problem: impl Into<Problem>) -> FieldError {
        FieldError {
            path: path.into(),
            problem: problem.into(),
        }
    }

    /// The problem as the user reads it, without the path.
    #[cfg(test)]
    pub(crate) fn message(&self) -> String {
        self.problem.to_string()
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.problem)
    }
}

/// Every problem found in a spec; `Display` prints one per line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct SpecErrors(pub Vec<FieldError>);

impl fmt::Display for SpecErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl SpecErrors {
    pub(crate) fn one(path: impl Into<String>, problem: impl Into<Problem>) -> Self {
        SpecErrors(vec![FieldError::new(path, problem)])
    }
}

/// Collects field errors with their paths while validation walks the spec.
#[derive(Debug, Default)]
pub(crate) struct Problems(pub(crate) Vec<FieldError>);

impl Problems {
    pub(crate) fn add(&mut self, path: impl Into<String>, problem: impl Into<Problem>) {
        self.0.push(FieldError::new(path, problem));
    }

    /// Reports `<path>.name` as a duplicate if `seen` already has `name`.
    pub(crate) fn unique<'a>(
        &mut self,
        seen: &mut BTreeSet<&'a str>,
        path: &str,
        what: &'static str,
        name: &'a str,
    ) {
        if !seen.insert(name) {
            self.add(
                format!("{path}.name"),
                Problem::Duplicate {
                    what,
                    name: name.into(),
                },
            );
        }
    }

    /// Names each present field as unsupported, with why.
    pub(crate) fn unsupported(&mut self, base: &str, fields: &[(&str, bool, &'static str)]) {
        for (field, present, why) in fields {
            if *present {
                self.add(format!("{base}.{field}"), Problem::Unsupported { why });
            }
        }
    }

    pub(crate) fn one_of(&mut self, path: String, value: &str, allowed: &'static [&'static str]) {
        if !allowed.contains(&value) {
            self.add(
                path,
                Problem::NotOneOf {
                    value: value.to_string(),
                    allowed,
                },
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each problem with the exact words a user has been reading (and tests/ compares): the
    /// expected strings are written out, not produced by the formatting code.
    #[test]
    fn problems_render_the_messages_users_know() {
        let table: Vec<(Problem, &str)> = vec![
            (
                Problem::Unsupported { why: "probes" },
                "unsupported (probes)",
            ),
            (
                Problem::NotOneOf {
                    value: "virtio-net".into(),
                    allowed: &["virtio", "e1000"],
                },
                "\"virtio-net\" is not one of virtio, e1000",
            ),
            (
                Problem::BusNotValid {
                    bus: "ide".into(),
                    kind: "disk",
                    allowed: &["virtio", "scsi", "sata"],
                },
                "bus \"ide\" is not valid for a disk (valid: virtio, scsi, sata)",
            ),
            (
                Problem::Duplicate {
                    what: "disk",
                    name: "b".into(),
                },
                "duplicate disk name \"b\"",
            ),
            (
                Problem::NoPartner {
                    what: "disk",
                    name: "data".into(),
                    partner: "volume",
                },
                "disk \"data\" has no volume of the same name",
            ),
            (
                Problem::OneSource {
                    found: vec!["hostDisk", "emptyDisk"],
                },
                "only one source may be set, found hostDisk, emptyDisk",
            ),
            (
                Problem::BootOrderTaken {
                    order: 1,
                    first: "spec.domain.devices.disks[0].bootOrder".into(),
                },
                "boot order 1 is already used by spec.domain.devices.disks[0].bootOrder",
            ),
            (
                Problem::RequiredWith {
                    condition: "type DiskOrCreate",
                },
                "is required with type DiskOrCreate",
            ),
            (
                Problem::BothSet {
                    first: "utc",
                    second: "timezone",
                },
                "utc and timezone cannot both be set",
            ),
            (
                Problem::NotABlockDevice {
                    volume: "l".into(),
                    path: "/dev/x".into(),
                },
                "volume \"l\" is not a block device on this host (/dev/x); a lun needs one",
            ),
            (
                SerialError::TooLong {
                    len: 37,
                    max: 36,
                    bus: "scsi".into(),
                }
                .into(),
                "37 characters, at most 36 on bus scsi",
            ),
        ];
        for (problem, want) in table {
            assert_eq!(problem.to_string(), want, "{problem:?}");
        }
    }

    #[test]
    fn field_errors_print_path_then_problem_one_per_line() {
        let errors = SpecErrors(vec![
            FieldError::new("spec.a", Problem::Required),
            FieldError::new("spec.b", Problem::Zero),
        ]);
        assert_eq!(
            errors.to_string(),
            "spec.a: is required\nspec.b: must be more than 0"
        );
        assert_eq!(errors.0[1].message(), "must be more than 0");
    }

    #[test]
    fn the_collector_names_only_present_unsupported_fields() {
        let mut p = Problems::default();
        p.unsupported("spec", &[("a", true, "x"), ("b", false, "y")]);
        p.one_of("spec.c".into(), "ok", &["ok"]);
        assert_eq!(
            p.0,
            vec![FieldError::new("spec.a", Problem::Unsupported { why: "x" })]
        );
    }
}
