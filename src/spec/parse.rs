//! Text to [`VirtualMachineInstance`]: YAML or JSON, a VMI or a VirtualMachine (whose template is
//! the instance), with serde's errors pinned to the field path and KubeVirt's defaulting applied.

use super::model::{
    Disk, ObjectMeta, RunStrategy, VirtualMachine, VirtualMachineInstance, VmiSpec,
};
use super::problem::{FieldError, Problem, Problems, SpecErrors};
use super::unsupported;

fn from_value<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<T, SpecErrors> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let path = if path == "." || path.is_empty() {
            "(document)".to_string()
        } else {
            path
        };
        SpecErrors::one(
            path,
            Problem::Shape {
                message: e.into_inner().to_string(),
            },
        )
    })
}

/// The instance, and whether it came from a VirtualMachine's template.
pub(super) fn parse_manifest(text: &str) -> Result<(VirtualMachineInstance, bool), SpecErrors> {
    // Bounded: size, values after alias expansion, no duplicate keys (see `document`).
    manifest_of(super::document::read(text)?)
}

/// [`parse_manifest`] of a document already read (within the same bounds).
pub(super) fn manifest_of(
    value: serde_json::Value,
) -> Result<(VirtualMachineInstance, bool), SpecErrors> {
    if !value.is_object() {
        return Err(SpecErrors::one("(document)", Problem::NotAnObject));
    }
    match value.get("kind").and_then(|k| k.as_str()) {
        Some("VirtualMachine") => from_vm(from_value(value)?).map(|vmi| (vmi, true)),
        Some("VirtualMachineInstance") | None => Ok((from_value(value)?, false)),
        Some(other) => Err(SpecErrors::one(
            "kind",
            Problem::UnsupportedKind { kind: other.into() },
        )),
    }
    .map(|(mut vmi, from_vm)| {
        default_volume_disks(&mut vmi.spec);
        (vmi, from_vm)
    })
}

/// KubeVirt's defaulting: a volume that no disk names gets a disk of its own, with the default
/// bus (what KubeVirt's mutating webhook does, so manifests that rely on it mean the same here).
fn default_volume_disks(spec: &mut VmiSpec) {
    for volume in &spec.volumes {
        if !spec
            .domain
            .devices
            .disks
            .iter()
            .any(|d| d.name == volume.name)
        {
            spec.domain.devices.disks.push(Disk {
                name: volume.name.clone(),
                ..Disk::default()
            });
        }
    }
}

fn from_vm(vm: VirtualMachine) -> Result<VirtualMachineInstance, SpecErrors> {
    let spec = &vm.spec;
    let mut problems = Problems::default();
    unsupported::check(&mut problems, "spec", spec);
    let mut errors = problems.0;
    let run_strategy = match (spec.run_strategy, spec.running) {
        (Some(_), Some(_)) => {
            errors.push(FieldError::new(
                "spec.running",
                Problem::RunningWithRunStrategy,
            ));
            None
        }
        (Some(s), None) => Some(s),
        (None, Some(true)) => Some(RunStrategy::Always),
        (None, Some(false)) => Some(RunStrategy::Halted),
        (None, None) => None,
    };
    if !errors.is_empty() {
        return Err(SpecErrors(errors));
    }
    let template = vm.spec.template.metadata.unwrap_or_default();
    Ok(VirtualMachineInstance {
        api_version: vm.api_version,
        kind: "VirtualMachineInstance".into(),
        metadata: ObjectMeta {
            // KubeVirt names the instance after its VirtualMachine, whatever the template says.
            name: vm.metadata.name,
            namespace: vm.metadata.namespace.or(template.namespace),
            uid: None,
            labels: template.labels,
            annotations: template.annotations,
            generate_name: None,
            creation_timestamp: None,
            resource_version: None,
            generation: None,
            managed_fields: None,
            finalizers: None,
            owner_references: None,
            self_link: None,
        },
        spec: vm.spec.template.spec,
        status: None,
        run_strategy,
    })
}
