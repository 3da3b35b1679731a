//! The spec's data: KubeVirt's `VirtualMachineInstance` (kubevirt.io/v1) subset as serde types.
//! Parsing rejects any field KubeVirt does not have; KubeVirt fields outside the subset parse as
//! [`Unsupported`] so that validation can name them. No checks live here (see `validate`).

use std::collections::BTreeMap;

use serde::de::IgnoredAny;
use serde::Deserialize;

mod devices;
mod domain;
mod volumes;

pub use devices::*;
pub use domain::*;
pub use volumes::*;

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
pub type Ignored = Option<IgnoredAny>;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VirtualMachineInstance {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: VmiSpec,
    /// Written by controllers, never read: accepted so that `kubectl get -o yaml` output parses.
    #[serde(default)]
    pub status: Ignored,
    /// From a `VirtualMachine` manifest's `spec.runStrategy` (or its legacy `running`); `None` for
    /// a bare instance.
    #[serde(skip)]
    pub run_strategy: Option<RunStrategy>,
}

/// KubeVirt's run strategies, applied by the lifecycle.
pub use crate::lifecycle::RunStrategy;

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
    /// A launcher runs one named VM: a name the server would invent cannot be used.
    #[serde(default)]
    pub generate_name: Option<Unsupported>,
    // Set by the API server; they carry no meaning for a launcher.
    #[serde(default)]
    pub creation_timestamp: Ignored,
    #[serde(default)]
    pub resource_version: Ignored,
    #[serde(default)]
    pub generation: Ignored,
    #[serde(default)]
    pub managed_fields: Ignored,
    #[serde(default)]
    pub finalizers: Ignored,
    #[serde(default)]
    pub owner_references: Ignored,
    #[serde(default)]
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
    #[serde(default)]
    pub termination_grace_period_seconds: Option<u64>,
    /// The guest's host name (cloud-init's `local-hostname`); the VMI name when absent.
    #[serde(default)]
    pub hostname: Option<String>,
    /// `amd64` is the only architecture this launcher runs.
    #[serde(default)]
    pub architecture: Option<String>,
    // Pod scheduling: decided before a launcher exists, nothing for it to do.
    #[serde(default)]
    pub node_selector: Ignored,
    #[serde(default)]
    pub affinity: Ignored,
    #[serde(default)]
    pub tolerations: Ignored,
    #[serde(default)]
    pub topology_spread_constraints: Ignored,
    #[serde(default)]
    pub scheduler_name: Ignored,
    #[serde(default)]
    pub priority_class_name: Ignored,
    #[serde(default)]
    pub eviction_strategy: Ignored,
    #[serde(default)]
    pub subdomain: Option<Unsupported>,
    #[serde(default)]
    pub dns_policy: Option<Unsupported>,
    #[serde(default)]
    pub dns_config: Option<Unsupported>,
    #[serde(default)]
    pub liveness_probe: Option<Unsupported>,
    #[serde(default)]
    pub readiness_probe: Option<Unsupported>,
    #[serde(default)]
    pub access_credentials: Option<Unsupported>,
    #[serde(default)]
    pub start_strategy: Option<Unsupported>,
    #[serde(default)]
    pub resource_claims: Option<Unsupported>,
    #[serde(default)]
    pub preference: Option<Unsupported>,
}
