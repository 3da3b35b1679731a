//! The instance spec: the subset of KubeVirt's `VirtualMachineInstance` (kubevirt.io/v1) that
//! vmlauncher understands, as serde types, plus validation that reports every problem at once with
//! its field path.
//!
//! Parsing rejects any field this subset does not know, naming it, so a manifest is never half
//! understood. This module does no I/O and knows nothing of libvirt.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::de::IgnoredAny;
use serde::Deserialize;

/// QEMU 7.2 silently truncates scsi serials past this length (newer QEMU refuses to start).
pub const MAX_SCSI_SERIAL_LEN: usize = 36;
/// Linux reports at most 20 bytes of a virtio-blk serial.
pub const MAX_VIRTIO_SERIAL_LEN: usize = 20;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VirtualMachineInstance {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: VmiSpec,
    /// Written by controllers, never read: accepted so that `kubectl get -o yaml` output parses.
    #[serde(default)]
    pub status: Option<IgnoredAny>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObjectMeta {
    pub name: String,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub uid: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// Set by the API server; carries no meaning for a launcher.
    #[serde(default)]
    pub creation_timestamp: Option<IgnoredAny>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VmiSpec {
    pub domain: DomainSpec,
    #[serde(default)]
    pub volumes: Vec<Volume>,
    /// Seconds between the ACPI shutdown request and a forced stop. KubeVirt's default is 30.
    #[serde(default)]
    pub termination_grace_period_seconds: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DomainSpec {
    #[serde(default)]
    pub cpu: Option<Cpu>,
    #[serde(default)]
    pub memory: Option<Memory>,
    #[serde(default)]
    pub resources: Option<Resources>,
    #[serde(default)]
    pub machine: Option<Machine>,
    #[serde(default)]
    pub firmware: Option<Firmware>,
    #[serde(default)]
    pub devices: Devices,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Cpu {
    #[serde(default)]
    pub cores: Option<u32>,
    #[serde(default)]
    pub sockets: Option<u32>,
    #[serde(default)]
    pub threads: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Memory {
    #[serde(default)]
    pub guest: Option<Quantity>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Resources {
    #[serde(default)]
    pub requests: BTreeMap<String, Quantity>,
    #[serde(default)]
    pub limits: BTreeMap<String, Quantity>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Machine {
    #[serde(rename = "type")]
    pub machine_type: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Firmware {
    #[serde(default)]
    pub uuid: Option<String>,
    #[serde(default)]
    pub kernel_boot: Option<KernelBoot>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KernelBoot {
    #[serde(default)]
    pub container: Option<KernelBootContainer>,
    #[serde(default)]
    pub kernel_args: Option<String>,
}

/// Without an `image`, `kernelPath` and `initrdPath` name files on the host (a local run); with an
/// image, the pod would provide them, which a launcher outside Kubernetes cannot do.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KernelBootContainer {
    #[serde(default)]
    pub image: Option<String>,
    #[serde(default)]
    pub image_pull_policy: Option<String>,
    #[serde(default)]
    pub kernel_path: Option<String>,
    #[serde(default)]
    pub initrd_path: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Devices {
    #[serde(default)]
    pub disks: Vec<Disk>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Disk {
    pub name: String,
    #[serde(default)]
    pub disk: Option<DiskTarget>,
    #[serde(default)]
    pub serial: Option<String>,
}

impl Disk {
    /// The bus as written, KubeVirt's default (`virtio`) when absent.
    pub fn bus(&self) -> &str {
        self.disk
            .as_ref()
            .and_then(|d| d.bus.as_deref())
            .unwrap_or("virtio")
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DiskTarget {
    #[serde(default)]
    pub bus: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Volume {
    pub name: String,
    #[serde(default)]
    pub host_disk: Option<HostDisk>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HostDisk {
    pub path: String,
    #[serde(rename = "type")]
    pub disk_type: String,
    #[serde(default)]
    pub capacity: Option<Quantity>,
    #[serde(default)]
    pub shared: Option<bool>,
}

/// A Kubernetes resource quantity (`128Mi`, `1G`, `1.5Gi`, `1024`), kept as written and read as
/// bytes on demand, so an error can quote what the user wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quantity(pub String);

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: serde::Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        // YAML writes `cpu: 2` as a number and `memory: 1Gi` as a string: accept both.
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Int(u64),
            Float(f64),
        }
        Ok(Quantity(match Raw::deserialize(de)? {
            Raw::Text(s) => s,
            Raw::Int(n) => n.to_string(),
            Raw::Float(f) => f.to_string(),
        }))
    }
}

impl Quantity {
    /// The quantity in bytes (or plain units), rounded up to a whole number.
    pub fn to_bytes(&self) -> Result<u64, String> {
        let text = self.0.trim();
        let split = text
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(text.len());
        let (number, suffix) = text.split_at(split);
        let multiplier: f64 = match suffix {
            "" => 1.0,
            "k" => 1e3,
            "M" => 1e6,
            "G" => 1e9,
            "T" => 1e12,
            "P" => 1e15,
            "E" => 1e18,
            "Ki" => 1024.0,
            "Mi" => 1024.0 * 1024.0,
            "Gi" => 1024.0 * 1024.0 * 1024.0,
            "Ti" => 1024f64.powi(4),
            "Pi" => 1024f64.powi(5),
            "Ei" => 1024f64.powi(6),
            other => return Err(format!("unknown unit {other:?} in quantity {text:?}")),
        };
        let value: f64 = number
            .parse()
            .map_err(|_| format!("{text:?} is not a quantity (e.g. 128Mi, 1Gi, 2G)"))?;
        let bytes = (value * multiplier).ceil();
        if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
            return Err(format!("quantity {text:?} is out of range"));
        }
        Ok(bytes as u64)
    }
}

/// One problem in a spec, with the path of the field it is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub path: String,
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
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
    fn one(path: impl Into<String>, message: impl Into<String>) -> Self {
        SpecErrors(vec![FieldError {
            path: path.into(),
            message: message.into(),
        }])
    }
}

/// Parses a VMI from YAML or JSON text and validates it.
pub fn parse(text: &str) -> Result<VirtualMachineInstance, SpecErrors> {
    let vmi = parse_unvalidated(text)?;
    validate(&vmi)?;
    Ok(vmi)
}

/// Parses without validating: for tools that want to show every validation error themselves.
pub fn parse_unvalidated(text: &str) -> Result<VirtualMachineInstance, SpecErrors> {
    let looks_like_json = text.trim_start().starts_with('{');
    let result = if looks_like_json {
        let mut de = serde_json::Deserializer::from_str(text);
        serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let path = e.path().to_string();
            (path, e.into_inner().to_string())
        })
    } else {
        let de = serde_yaml_ng::Deserializer::from_str(text);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            (path, e.into_inner().to_string())
        })
    };
    result.map_err(|(path, message)| {
        let path = if path == "." || path.is_empty() {
            "(document)".to_string()
        } else {
            path
        };
        // serde_yaml_ng puts its own (shorter) path in front of the message: keep only ours.
        let message = match message.split_once(": ") {
            Some((prefix, rest)) if path.starts_with(prefix) => rest.to_string(),
            _ => message,
        };
        SpecErrors::one(path, message)
    })
}

/// Checks what serde cannot: names, references between disks and volumes, buses, serials,
/// quantities. Returns every problem, not just the first.
pub fn validate(vmi: &VirtualMachineInstance) -> Result<(), SpecErrors> {
    let mut errors = Vec::new();
    let mut err = |path: String, message: String| errors.push(FieldError { path, message });

    if vmi.api_version != "kubevirt.io/v1" {
        err(
            "apiVersion".into(),
            format!("{:?} is not supported, use kubevirt.io/v1", vmi.api_version),
        );
    }
    if vmi.kind != "VirtualMachineInstance" {
        err(
            "kind".into(),
            format!(
                "{:?} is not supported, use VirtualMachineInstance",
                vmi.kind
            ),
        );
    }
    if let Err(why) = check_dns1123_label(&vmi.metadata.name) {
        err("metadata.name".into(), why);
    }
    if let Some(ns) = &vmi.metadata.namespace {
        if let Err(why) = check_dns1123_label(ns) {
            err("metadata.namespace".into(), why);
        }
    }

    let domain = &vmi.spec.domain;
    match guest_memory(vmi) {
        Ok(Some(bytes)) if bytes < 1024 * 1024 => err(
            memory_path(vmi).into(),
            format!("{bytes} bytes is too little memory for a guest (at least 1Mi)"),
        ),
        Ok(Some(_)) => {}
        Ok(None) => err(
            "spec.domain.memory.guest".into(),
            "guest memory is required (spec.domain.memory.guest or resources.requests.memory)"
                .into(),
        ),
        Err(why) => err(memory_path(vmi).into(), why),
    }
    if let Some(cpu) = &domain.cpu {
        for (field, value) in [
            ("cores", cpu.cores),
            ("sockets", cpu.sockets),
            ("threads", cpu.threads),
        ] {
            if value == Some(0) {
                err(
                    format!("spec.domain.cpu.{field}"),
                    "must be at least 1".into(),
                );
            }
        }
    }
    if let Some(kb) = domain
        .firmware
        .as_ref()
        .and_then(|f| f.kernel_boot.as_ref())
    {
        let base = "spec.domain.firmware.kernelBoot.container";
        match &kb.container {
            None => err(
                base.into(),
                "a kernel boot needs a container with kernelPath".into(),
            ),
            Some(c) => {
                if let Some(image) = &c.image {
                    err(
                        format!("{base}.image"),
                        format!("{image:?}: kernel images from a registry are not supported; leave out image and give host paths in kernelPath and initrdPath"),
                    );
                }
                match &c.kernel_path {
                    None => err(format!("{base}.kernelPath"), "is required".into()),
                    Some(p) if !p.starts_with('/') => err(
                        format!("{base}.kernelPath"),
                        format!("{p:?} must be an absolute path"),
                    ),
                    Some(_) => {}
                }
                if let Some(p) = &c.initrd_path {
                    if !p.starts_with('/') {
                        err(
                            format!("{base}.initrdPath"),
                            format!("{p:?} must be an absolute path"),
                        );
                    }
                }
            }
        }
    }

    let volumes: BTreeMap<&str, usize> = vmi
        .spec
        .volumes
        .iter()
        .enumerate()
        .map(|(i, v)| (v.name.as_str(), i))
        .collect();
    let mut seen_volumes = BTreeSet::new();
    for (i, volume) in vmi.spec.volumes.iter().enumerate() {
        let path = format!("spec.volumes[{i}]");
        if let Err(why) = check_volume_name(&volume.name) {
            err(format!("{path}.name"), why);
        }
        if !seen_volumes.insert(volume.name.as_str()) {
            err(
                format!("{path}.name"),
                format!("duplicate volume name {:?}", volume.name),
            );
        }
        match &volume.host_disk {
            None => err(
                path.clone(),
                "a volume needs a source (supported: hostDisk)".into(),
            ),
            Some(hd) => {
                if !hd.path.starts_with('/') {
                    err(
                        format!("{path}.hostDisk.path"),
                        format!("{:?} must be an absolute path", hd.path),
                    );
                }
                match hd.disk_type.as_str() {
                    "Disk" => {}
                    "DiskOrCreate" => match &hd.capacity {
                        None => err(
                            format!("{path}.hostDisk.capacity"),
                            "is required with type DiskOrCreate".into(),
                        ),
                        Some(q) => {
                            if let Err(why) = q.to_bytes() {
                                err(format!("{path}.hostDisk.capacity"), why);
                            }
                        }
                    },
                    other => err(
                        format!("{path}.hostDisk.type"),
                        format!("{other:?} is not a hostDisk type (Disk or DiskOrCreate)"),
                    ),
                }
            }
        }
        if !vmi
            .spec
            .domain
            .devices
            .disks
            .iter()
            .any(|d| d.name == volume.name)
        {
            err(
                format!("{path}.name"),
                format!("volume {:?} is not used by any disk", volume.name),
            );
        }
    }

    let mut seen_disks = BTreeSet::new();
    for (i, disk) in domain.devices.disks.iter().enumerate() {
        let path = format!("spec.domain.devices.disks[{i}]");
        if !seen_disks.insert(disk.name.as_str()) {
            err(
                format!("{path}.name"),
                format!("duplicate disk name {:?}", disk.name),
            );
        }
        if !volumes.contains_key(disk.name.as_str()) {
            err(
                format!("{path}.name"),
                format!("disk {:?} has no volume of the same name", disk.name),
            );
        }
        let bus = disk.bus();
        let max_serial = match bus {
            "scsi" => Some(MAX_SCSI_SERIAL_LEN),
            "virtio" => Some(MAX_VIRTIO_SERIAL_LEN),
            other => {
                err(
                    format!("{path}.disk.bus"),
                    format!("unknown bus {other:?} (supported: virtio, scsi)"),
                );
                None
            }
        };
        if let (Some(serial), Some(max)) = (&disk.serial, max_serial) {
            if let Err(why) = check_serial(serial, bus, max) {
                err(format!("{path}.serial"), why);
            }
        }
    }

    if errors.is_empty() {
        Ok(())
    } else {
        Err(SpecErrors(errors))
    }
}

/// Guest memory in bytes: `memory.guest`, else `resources.requests.memory`, else
/// `resources.limits.memory` (KubeVirt's order).
pub fn guest_memory(vmi: &VirtualMachineInstance) -> Result<Option<u64>, String> {
    let domain = &vmi.spec.domain;
    let from_resources = |m: &BTreeMap<String, Quantity>| m.get("memory").cloned();
    let quantity = domain
        .memory
        .as_ref()
        .and_then(|m| m.guest.clone())
        .or_else(|| {
            domain
                .resources
                .as_ref()
                .and_then(|r| from_resources(&r.requests))
        })
        .or_else(|| {
            domain
                .resources
                .as_ref()
                .and_then(|r| from_resources(&r.limits))
        });
    quantity.map(|q| q.to_bytes()).transpose()
}

fn memory_path(vmi: &VirtualMachineInstance) -> &'static str {
    let domain = &vmi.spec.domain;
    if domain.memory.as_ref().is_some_and(|m| m.guest.is_some()) {
        "spec.domain.memory.guest"
    } else if domain
        .resources
        .as_ref()
        .is_some_and(|r| r.requests.contains_key("memory"))
    {
        "spec.domain.resources.requests.memory"
    } else {
        "spec.domain.resources.limits.memory"
    }
}

/// Kubernetes names: at most 63 of `[a-z0-9-]`, starting and ending alphanumeric.
pub fn check_dns1123_label(name: &str) -> Result<(), String> {
    let ok_chars = name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    let ok_ends = name
        .bytes()
        .next()
        .zip(name.bytes().last())
        .is_some_and(|(a, z)| a.is_ascii_alphanumeric() && z.is_ascii_alphanumeric());
    if name.is_empty() || name.len() > 63 || !ok_chars || !ok_ends {
        return Err(format!(
            "{name:?} is not a DNS-1123 label (1-63 of a-z, 0-9 and '-', alphanumeric at both ends)"
        ));
    }
    Ok(())
}

/// Volume names become libvirt aliases (`ua-<name>`) and file names in the hotplug directory,
/// so they must be DNS-1123 labels: never `/`, `..` or anything path-like.
pub fn check_volume_name(name: &str) -> Result<(), String> {
    if name.contains('/') || name.contains("..") {
        return Err(format!(
            "{name:?} looks like a path; volume names may not contain '/' or '..'"
        ));
    }
    check_dns1123_label(name)
}

/// Serials keep their case; only `[A-Za-z0-9_.+-]` reaches the guest unchanged.
pub fn check_serial(serial: &str, bus: &str, max: usize) -> Result<(), String> {
    if serial.is_empty() {
        return Err("is empty".into());
    }
    if let Some(bad) = serial
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '+' | '-')))
    {
        return Err(format!(
            "{serial:?} contains {bad:?}; serials may only use A-Z a-z 0-9 _ . + -"
        ));
    }
    if serial.len() > max {
        return Err(format!(
            "{} characters, at most {max} on bus {bus}",
            serial.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: testvm
spec:
  domain:
    memory:
      guest: 128Mi
    devices:
      disks:
      - name: data
        disk:
          bus: scsi
        serial: DataDisk-1
  volumes:
  - name: data
    hostDisk:
      path: /var/data/data.img
      type: Disk
"#;

    fn errors_of(text: &str) -> Vec<String> {
        match parse(text) {
            Ok(_) => vec![],
            Err(e) => e.0.iter().map(ToString::to_string).collect(),
        }
    }

    #[test]
    fn parses_minimal_yaml() {
        let vmi = parse(MINIMAL).expect("valid");
        assert_eq!(vmi.metadata.name, "testvm");
        assert_eq!(vmi.spec.domain.devices.disks[0].bus(), "scsi");
        assert_eq!(
            vmi.spec.domain.devices.disks[0].serial.as_deref(),
            Some("DataDisk-1")
        );
        assert_eq!(guest_memory(&vmi), Ok(Some(128 * 1024 * 1024)));
    }

    #[test]
    fn parses_json_the_same_as_yaml() {
        let yaml = parse(MINIMAL).unwrap();
        let value: serde_json::Value = serde_yaml_ng::from_str(MINIMAL).unwrap();
        let json = parse(&serde_json::to_string(&value).unwrap()).unwrap();
        assert_eq!(yaml, json);
    }

    #[test]
    fn unknown_field_is_named_with_its_path() {
        let text = MINIMAL.replace(
            "        serial: DataDisk-1",
            "        serial: DataDisk-1\n        bogus: 1",
        );
        let errors = errors_of(&text);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with("spec.domain.devices.disks[0].bogus: unknown field `bogus`"),
            "{errors:?}"
        );
    }

    #[test]
    fn unknown_field_in_json_is_named_with_its_path() {
        let text = r#"{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineInstance",
            "metadata":{"name":"a"},"spec":{"domain":{"memory":{"guest":"1Gi"},"cpu":{"cores":1,"speed":3}}}}"#;
        let errors = errors_of(text);
        assert!(
            errors[0].starts_with("spec.domain.cpu.speed: unknown field `speed`"),
            "{errors:?}"
        );
    }

    #[test]
    fn reports_every_problem_at_once() {
        let text = r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: Bad_Name
spec:
  domain:
    memory:
      guest: 12Qi
    devices:
      disks:
      - name: a
        disk: {bus: ide}
      - name: b
        disk: {bus: scsi}
        serial: "0123456789012345678901234567890123456789"
      - name: b
        disk: {bus: scsi}
        serial: "has space"
  volumes:
  - name: a
    hostDisk: {path: relative.img, type: Disk}
  - name: b
    hostDisk: {path: /b.img, type: Sometimes}
  - name: ../etc
    hostDisk: {path: /c.img, type: DiskOrCreate}
"#;
        let errors = errors_of(text);
        let expect = [
            "metadata.name: \"Bad_Name\" is not a DNS-1123 label",
            "spec.domain.memory.guest: unknown unit \"Qi\"",
            "spec.volumes[0].hostDisk.path: \"relative.img\" must be an absolute path",
            "spec.volumes[1].hostDisk.type: \"Sometimes\" is not a hostDisk type",
            "spec.volumes[2].name: \"../etc\" looks like a path",
            "spec.volumes[2].hostDisk.capacity: is required with type DiskOrCreate",
            "spec.volumes[2].name: volume \"../etc\" is not used by any disk",
            "spec.domain.devices.disks[0].disk.bus: unknown bus \"ide\"",
            "spec.domain.devices.disks[1].serial: 40 characters, at most 36 on bus scsi",
            "spec.domain.devices.disks[2].name: duplicate disk name \"b\"",
            "spec.domain.devices.disks[2].serial: \"has space\" contains ' '",
        ];
        for e in expect {
            assert!(
                errors.iter().any(|got| got.starts_with(e)),
                "missing {e:?} in {errors:#?}"
            );
        }
        assert_eq!(errors.len(), expect.len(), "{errors:#?}");
    }

    #[test]
    fn disk_without_volume_is_an_error() {
        let text = MINIMAL.replace(
            "  - name: data\n    hostDisk",
            "  - name: other\n    hostDisk",
        );
        let errors = errors_of(&text);
        assert!(errors.iter().any(|e| e
            == "spec.domain.devices.disks[0].name: disk \"data\" has no volume of the same name"));
    }

    #[test]
    fn serial_of_exactly_36_is_accepted_on_scsi() {
        let serial = "A".repeat(36);
        let text = MINIMAL.replace("DataDisk-1", &serial);
        assert_eq!(errors_of(&text), Vec::<String>::new());
        let text = MINIMAL.replace("DataDisk-1", &"A".repeat(37));
        assert_eq!(
            errors_of(&text),
            vec!["spec.domain.devices.disks[0].serial: 37 characters, at most 36 on bus scsi"]
        );
    }

    #[test]
    fn quantities() {
        let q = |s: &str| Quantity(s.into()).to_bytes();
        assert_eq!(q("128Mi"), Ok(128 << 20));
        assert_eq!(q("1G"), Ok(1_000_000_000));
        assert_eq!(q("1.5Gi"), Ok(3 << 29));
        assert_eq!(q("1024"), Ok(1024));
        assert_eq!(q("2k"), Ok(2000));
        assert!(q("Gi").is_err());
        assert!(q("1.2.3Mi").is_err());
        assert!(q("-1Mi").is_err());
    }

    #[test]
    fn memory_falls_back_to_resources() {
        let text = MINIMAL.replace(
            "    memory:\n      guest: 128Mi\n",
            "    resources:\n      requests:\n        memory: 64M\n        cpu: 1\n",
        );
        let vmi = parse(&text).unwrap();
        assert_eq!(guest_memory(&vmi), Ok(Some(64_000_000)));
    }

    #[test]
    fn kernel_boot_from_an_image_is_rejected_by_name() {
        let text = MINIMAL.replace(
            "    memory:\n",
            "    firmware:\n      kernelBoot:\n        container:\n          image: quay.io/k:1\n          kernelPath: /boot/vmlinuz\n    memory:\n",
        );
        let errors = errors_of(&text);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].starts_with("spec.domain.firmware.kernelBoot.container.image: \"quay.io/k:1\": kernel images from a registry are not supported"));
    }

    #[test]
    fn malformed_yaml_is_an_error_not_a_panic() {
        for text in ["", "{", "spec: [", "apiVersion: 3", ":\n  - -"] {
            assert!(parse(text).is_err(), "{text:?}");
        }
    }
}
