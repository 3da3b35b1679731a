//! `spec.volumes` and their sources.

use serde::Deserialize;

use super::Unsupported;
use crate::spec::Quantity;

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Volume {
    pub name: String,
    pub host_disk: Option<HostDisk>,
    pub persistent_volume_claim: Option<PvcSource>,
    pub data_volume: Option<DataVolumeSource>,
    pub container_disk: Option<ContainerDisk>,
    pub empty_disk: Option<EmptyDisk>,
    pub ephemeral: Option<Ephemeral>,
    pub cloud_init_no_cloud: Option<CloudInitNoCloud>,
    pub cloud_init_config_drive: Option<Unsupported>,
    pub config_map: Option<Unsupported>,
    pub secret: Option<Unsupported>,
    pub service_account: Option<Unsupported>,
    #[serde(default, rename = "downwardAPI")]
    pub downward_api: Option<Unsupported>,
    pub downward_metrics: Option<Unsupported>,
    pub sysprep: Option<Unsupported>,
    pub memory_dump: Option<Unsupported>,
}

/// Which source a volume has, once validated (exactly one).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum VolumeSource<'a> {
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
    pub(crate) fn source(&self) -> Option<VolumeSource<'_>> {
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
    pub capacity: Option<Quantity>,
    /// Marks the disk shareable between VMs.
    pub shared: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PvcSource {
    pub claim_name: String,
    pub read_only: Option<bool>,
    pub hotpluggable: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DataVolumeSource {
    pub name: String,
    pub hotpluggable: Option<bool>,
}

/// The image is not pulled by the launcher: whoever makes the pod puts it at
/// `<container-disk-dir>/disk_<n>.img` (KubeVirt's convention), so `image` and its pull settings
/// only identify it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerDisk {
    pub image: String,
    pub image_pull_policy: Option<String>,
    pub image_pull_secret: Option<String>,
    pub path: Option<Unsupported>,
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
    pub user_data: Option<String>,
    pub user_data_base64: Option<String>,
    pub network_data: Option<String>,
    pub network_data_base64: Option<String>,
    pub secret_ref: Option<Unsupported>,
    pub network_data_secret_ref: Option<Unsupported>,
}
