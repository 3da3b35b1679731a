//! The instance spec: the subset of KubeVirt's `VirtualMachineInstance` (kubevirt.io/v1) that
//! vmlauncher understands, as serde types, plus validation that reports every problem at once with
//! its field path. A `VirtualMachine` manifest is accepted too: its `spec.template` is the instance,
//! its `spec.runStrategy` is kept for the lifecycle.
//!
//! Parsing rejects any field KubeVirt does not have, naming it, so a manifest is never half
//! understood. KubeVirt fields outside the subset parse (as `Unsupported`) and validation names
//! them as unsupported; a few pure scheduling fields are accepted and ignored, each with its reason
//! in the README. This module does no I/O and knows nothing of libvirt.
//!
//! - `model`: the serde types, by area of the manifest.
//! - `parse`: text → instance (YAML/JSON, VMI/VM, defaulting).
//! - `quantity`: `128Mi` and friends.
//! - `validate`: what serde cannot check, by area; problems are [`Problem`] values.
//! - `unsupported`: the KubeVirt fields outside the subset, with why, in one table.
//! - [`Validated`]: an instance that passed; the only thing `convert` takes.

mod checks;
mod document;
pub(crate) mod model;
mod parse;
mod problem;
mod quantity;
mod unsupported;
mod validate;

use std::ops::Deref;

pub(crate) use checks::{decode_base64, denied_places, looks_like_uuid, HostPathError, Place};
pub(crate) use document::MAX_DOCUMENT_BYTES;
pub(crate) use model::*;
pub use problem::{FieldError, Problem, SpecErrors};
pub(crate) use quantity::Quantity;
pub(crate) use validate::{resource_cpus, HOTPLUG_BLOCK_BYTES, MAX_CAPACITY};

/// The namespace a VMI without one is taken to be in (Kubernetes' own default).
pub(crate) const DEFAULT_NAMESPACE: &str = "default";

#[cfg(test)]
mod tests;

/// An instance that passed validation (`validate/`): built only by [`parse`] (and, in unit tests,
/// `Validated::new`), so code
/// that holds one (`convert`, the launcher) relies on the rules without checking them again.
#[derive(Debug, Clone, PartialEq)]
pub struct Validated {
    vmi: VirtualMachineInstance,
    facts: validate::Facts,
}

impl Validated {
    /// Validates an instance built in code (a spec read from text goes through [`parse`]).
    #[cfg(test)]
    pub(crate) fn new(vmi: VirtualMachineInstance) -> Result<Validated, SpecErrors> {
        let facts = validate::check(&vmi)?;
        Ok(Validated { vmi, facts })
    }

    #[cfg(test)]
    pub(crate) fn into_inner(self) -> VirtualMachineInstance {
        self.vmi
    }

    /// Guest memory in bytes.
    pub(crate) fn guest_memory(&self) -> u64 {
        self.facts.memory_bytes
    }

    /// Each disk with its index, its volume and that volume's source.
    pub(crate) fn disks(&self) -> impl Iterator<Item = (usize, &Disk, &Volume, VolumeSource<'_>)> {
        let disks = &self.vmi.spec.domain.devices.disks;
        let volumes = &self.vmi.spec.volumes;
        // Validation found a volume with a source for every disk; filter_map never drops one.
        self.facts
            .disk_volumes
            .iter()
            .enumerate()
            .filter_map(move |(i, &v)| {
                let volume = &volumes[v];
                Some((i, &disks[i], volume, volume.source()?))
            })
    }
}

impl Deref for Validated {
    type Target = VirtualMachineInstance;
    fn deref(&self) -> &VirtualMachineInstance {
        &self.vmi
    }
}

/// A document of `len` bytes is not too large to read.
pub(crate) fn check_document_size(len: usize) -> Result<(), SpecErrors> {
    Ok(document::check_size(len)?)
}

/// [`parse`] of bytes from outside: at most [`MAX_DOCUMENT_BYTES`] of UTF-8.
pub(crate) fn parse_bytes(bytes: &[u8]) -> Result<Validated, SpecErrors> {
    parse(document::text_of(bytes)?)
}

/// Parses a VMI (or a VirtualMachine's template) from YAML or JSON text and validates it.
pub fn parse(text: &str) -> Result<Validated, SpecErrors> {
    validated(parse::parse_manifest(text)?)
}

/// Reads YAML or JSON text into a document, within the bounds every spec has (size, values,
/// strings, no key twice): for a caller that edits the document before [`from_document`].
pub(crate) fn read_document(text: &str) -> Result<serde_json::Value, SpecErrors> {
    Ok(document::read(text)?)
}

/// [`parse`] of a document already read with [`read_document`]: the text is not parsed again.
pub(crate) fn from_document(document: serde_json::Value) -> Result<Validated, SpecErrors> {
    validated(parse::manifest_of(document)?)
}

fn validated((vmi, from_vm): (VirtualMachineInstance, bool)) -> Result<Validated, SpecErrors> {
    let facts = validate::check(&vmi).map_err(|SpecErrors(errors)| {
        // A VirtualMachine's instance lives under spec.template: say so in every path.
        SpecErrors(
            errors
                .into_iter()
                .map(|e| match e.path.strip_prefix("spec.") {
                    Some(rest) if from_vm => FieldError {
                        path: format!("spec.template.spec.{rest}"),
                        problem: e.problem,
                    },
                    _ => e,
                })
                .collect(),
        )
    })?;
    Ok(Validated { vmi, facts })
}
