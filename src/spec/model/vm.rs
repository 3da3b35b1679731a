//! A `VirtualMachine` document (kubevirt.io/v1), as far as a launcher reads it: its template is
//! the instance, its run strategy the lifecycle's.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{Ignored, ObjectMeta, RunStrategy, Unsupported, VmiSpec};

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct VirtualMachine {
    pub(crate) api_version: String,
    #[allow(dead_code)]
    pub(crate) kind: String,
    pub(crate) metadata: ObjectMeta,
    pub(crate) spec: VirtualMachineSpec,
    #[serde(default)]
    #[allow(dead_code)]
    pub(crate) status: Ignored,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct VirtualMachineSpec {
    pub(crate) template: VmiTemplate,
    pub(crate) run_strategy: Option<RunStrategy>,
    pub(crate) running: Option<bool>,
    pub(crate) data_volume_templates: Option<Unsupported>,
    pub(crate) instancetype: Option<Unsupported>,
    pub(crate) preference: Option<Unsupported>,
    pub(crate) update_volumes_strategy: Option<Unsupported>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct VmiTemplate {
    pub(crate) metadata: Option<TemplateMeta>,
    pub(crate) spec: VmiSpec,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct TemplateMeta {
    pub(crate) name: Option<String>,
    pub(crate) namespace: Option<String>,
    #[serde(default)]
    pub(crate) labels: BTreeMap<String, String>,
    #[serde(default)]
    pub(crate) annotations: BTreeMap<String, String>,
    pub(crate) creation_timestamp: Ignored,
}
