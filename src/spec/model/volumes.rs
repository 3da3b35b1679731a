//! `spec.volumes` and their sources.

use serde::Deserialize;

use super::Unsupported;
use crate::spec::Quantity;

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Volume {
    pub name: String,
    #[serde(default)]
    pub host_disk: Option<HostDisk>,
    #[serde(default)]
    pub persistent_volume_claim: Option<PvcSource>,
    #[serde(default)]
    pub data_volume: Option<DataVolumeSource>,
    #[serde(default)]
    pub container_disk: Option<ContainerDisk>,
    #[serde(default)]
    pub empty_disk: Option<EmptyDisk>,
    #[serde(default)]
    pub ephemeral: Option<Ephemeral>,
    #[serde(default)]
    pub cloud_init_no_cloud: Option<CloudInitNoCloud>,
    #[serde(default)]
    pub cloud_init_config_drive: Option<Unsupported>,
    #[serde(default)]
    pub config_map: Option<Unsupported>,
    #[serde(default)]
    pub secret: Option<Unsupported>,
    #[serde(default)]
    pub service_account: Option<Unsupported>,
    #[serde(default, rename = "downwardAPI")]
    pub downward_api: Option<Unsupported>,
    #[serde(default)]
    pub downward_metrics: Option<Unsupported>,
    #[serde(default)]
    pub sysprep: Option<Unsupported>,
    #[serde(default)]
    pub memory_dump: Option<Unsupported>,
}

/// Which source a volume has, once validated (exactly one).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum VolumeSource<'a> {
    HostDisk(&'a HostDisk),
    PersistentVolumeClaim(&'a PvcSource),
    DataVolume(&'a DataVolumeSource),
    ContainerDisk(&'a ContainerDisk),
    EmptyDisk(&'a EmptyDisk),
    Ephemeral(&'a Ephemeral),
    CloudInitNoCloud(&'a CloudInitNoCloud),
}

impl Volume {
    /// Every source this volume names, supported or not, with its field name.
    pub(crate) fn sources(&self) -> Vec<(&'static str, Option<VolumeSource<'_>>)> {
        let supported = [
            (
                "hostDisk",
                self.host_disk.as_ref().map(VolumeSource::HostDisk),
            ),
            (
                "persistentVolumeClaim",
                self.persistent_volume_claim
                    .as_ref()
                    .map(VolumeSource::PersistentVolumeClaim),
            ),
            (
                "dataVolume",
                self.data_volume.as_ref().map(VolumeSource::DataVolume),
            ),
            (
                "containerDisk",
                self.container_disk
                    .as_ref()
                    .map(VolumeSource::ContainerDisk),
            ),
            (
                "emptyDisk",
                self.empty_disk.as_ref().map(VolumeSource::EmptyDisk),
            ),
            (
                "ephemeral",
                self.ephemeral.as_ref().map(VolumeSource::Ephemeral),
            ),
            (
                "cloudInitNoCloud",
                self.cloud_init_no_cloud
                    .as_ref()
                    .map(VolumeSource::CloudInitNoCloud),
            ),
        ];
        // Real KubeVirt sources that only make sense inside a cluster.
        let unsupported = [
            (
                "cloudInitConfigDrive",
                self.cloud_init_config_drive.is_some(),
            ),
            ("configMap", self.config_map.is_some()),
            ("secret", self.secret.is_some()),
            ("serviceAccount", self.service_account.is_some()),
            ("downwardAPI", self.downward_api.is_some()),
            ("downwardMetrics", self.downward_metrics.is_some()),
            ("sysprep", self.sysprep.is_some()),
            ("memoryDump", self.memory_dump.is_some()),
        ];
        let named = supported
            .into_iter()
            .filter_map(|(field, source)| Some((field, Some(source?))));
        let named_unsupported = unsupported
            .into_iter()
            .filter(|(_, present)| *present)
            .map(|(field, _)| (field, None));
        named.chain(named_unsupported).collect()
    }

    /// The volume's source; `None` only for a volume that failed validation.
    pub fn source(&self) -> Option<VolumeSource<'_>> {
        match self.sources().as_slice() {
            [(_, Some(source))] => Some(*source),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HostDisk {
    pub path: String,
    #[serde(rename = "type")]
    pub disk_type: String,
    #[serde(default)]
    pub capacity: Option<Quantity>,
    /// Marks the disk shareable between VMs.
    #[serde(default)]
    pub shared: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PvcSource {
    pub claim_name: String,
    #[serde(default)]
    pub read_only: Option<bool>,
    #[serde(default)]
    pub hotpluggable: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DataVolumeSource {
    pub name: String,
    #[serde(default)]
    pub hotpluggable: Option<bool>,
}

/// The image is not pulled by the launcher: whoever makes the pod puts it at
/// `<container-disk-dir>/disk_<n>.img` (KubeVirt's convention), so `image` and its pull settings
/// only identify it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerDisk {
    pub image: String,
    #[serde(default)]
    pub image_pull_policy: Option<String>,
    #[serde(default)]
    pub image_pull_secret: Option<String>,
    #[serde(default)]
    pub path: Option<Unsupported>,
    #[serde(default)]
    pub hotpluggable: Option<Unsupported>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EmptyDisk {
    pub capacity: Quantity,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Ephemeral {
    pub persistent_volume_claim: PvcSource,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CloudInitNoCloud {
    #[serde(default)]
    pub user_data: Option<String>,
    #[serde(default)]
    pub user_data_base64: Option<String>,
    #[serde(default)]
    pub network_data: Option<String>,
    #[serde(default)]
    pub network_data_base64: Option<String>,
    #[serde(default)]
    pub secret_ref: Option<Unsupported>,
    #[serde(default)]
    pub network_data_secret_ref: Option<Unsupported>,
}
