//! The spec's data: KubeVirt's `VirtualMachineInstance` (kubevirt.io/v1) subset as serde types.
//! Parsing rejects any field KubeVirt does not have; KubeVirt fields outside the subset parse as
//! [`Unsupported`] so that validation can name them. No checks live here (see `validate`).

use std::collections::BTreeMap;

use serde::de::IgnoredAny;
use serde::Deserialize;

mod devices;
mod domain;
mod vm;
mod volumes;

pub(crate) use devices::*;
pub(crate) use domain::*;
pub(crate) use vm::*;
pub(crate) use volumes::*;

/// A KubeVirt field that parses but that vmlauncher does not implement: validation names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Unsupported;

impl<'de> Deserialize<'de> for Unsupported {
    fn deserialize<D: serde::Deserializer<'de>>(de: D) -> Result<Self, D::Error> {
        IgnoredAny::deserialize(de)?;
        Ok(Unsupported)
    }
}

/// A field accepted and deliberately ignored (scheduling, server-set metadata); the README lists
/// every one with its reason.
pub(crate) type Ignored = Option<IgnoredAny>;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VirtualMachineInstance {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: VmiSpec,
    /// Written by controllers, never read: accepted so that `kubectl get -o yaml` output parses.
    pub status: Ignored,
    /// From a `VirtualMachine` manifest's `spec.runStrategy` (or its legacy `running`); `None` for
    /// a bare instance.
    #[serde(skip)]
    pub run_strategy: Option<RunStrategy>,
}

/// KubeVirt's run strategies, applied by the lifecycle.
pub(crate) use crate::lifecycle::RunStrategy;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObjectMeta {
    pub name: String,
    pub namespace: Option<String>,
    pub uid: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// A launcher runs one named VM: a name the server would invent cannot be used.
    pub generate_name: Option<Unsupported>,
    // Set by the API server; they carry no meaning for a launcher.
    pub creation_timestamp: Ignored,
    pub resource_version: Ignored,
    pub generation: Ignored,
    pub managed_fields: Ignored,
    pub finalizers: Ignored,
    pub owner_references: Ignored,
    pub self_link: Ignored,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VmiSpec {
    pub domain: DomainSpec,
    #[serde(default)]
    pub volumes: Vec<Volume>,
    #[serde(default)]
    pub networks: Vec<Network>,
    /// Seconds between the ACPI shutdown request and a forced stop. KubeVirt's default is 30.
    pub termination_grace_period_seconds: Option<u64>,
    /// The guest's host name (cloud-init's `local-hostname`); the VMI name when absent.
    pub hostname: Option<String>,
    /// `amd64` is the only architecture this launcher runs.
    pub architecture: Option<String>,
    // Pod scheduling: decided before a launcher exists, nothing for it to do.
    pub node_selector: Ignored,
    pub affinity: Ignored,
    pub tolerations: Ignored,
    pub topology_spread_constraints: Ignored,
    pub scheduler_name: Ignored,
    pub priority_class_name: Ignored,
    pub eviction_strategy: Ignored,
    pub subdomain: Option<Unsupported>,
    pub dns_policy: Option<Unsupported>,
    pub dns_config: Option<Unsupported>,
    pub liveness_probe: Option<Unsupported>,
    pub readiness_probe: Option<Unsupported>,
    pub access_credentials: Option<Unsupported>,
    pub start_strategy: Option<Unsupported>,
    pub resource_claims: Option<Unsupported>,
    pub preference: Option<Unsupported>,
}
