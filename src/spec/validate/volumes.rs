//! `spec.volumes`: one supported source each, well-formed, and used by a disk.

use std::collections::BTreeSet;

use super::{bounds, Problems};
use crate::spec::checks::{
    check_dns1123_subdomain, check_host_path, check_volume_name, decode_base64,
};
use crate::spec::model::{
    CloudInitNoCloud, ContainerDisk, HostDisk, PvcSource, VirtualMachineInstance, VolumeSource,
};
use crate::spec::problem::Problem;
use crate::spec::unsupported;

pub(super) fn validate_volumes(vmi: &VirtualMachineInstance, e: &mut Problems) {
    let mut seen = BTreeSet::new();
    for (i, volume) in vmi.spec.volumes.iter().enumerate() {
        let path = format!("spec.volumes[{i}]");
        if let Err(why) = check_volume_name(&volume.name) {
            e.add(format!("{path}.name"), why);
        }
        e.unique(&mut seen, &path, "volume", &volume.name);
        let sources = volume.sources();
        match sources.as_slice() {
            [] => e.add(
                path.clone(),
                Problem::Missing {
                    what: "a volume",
                    needs: "a source",
                    supported: "hostDisk, persistentVolumeClaim, dataVolume, containerDisk, emptyDisk, ephemeral, cloudInitNoCloud",
                },
            ),
            [_] => {}
            more => e.add(
                path.clone(),
                Problem::OneSource {
                    found: more.iter().map(|(f, _)| *f).collect(),
                },
            ),
        }
        for (field, source) in &sources {
            let spath = format!("{path}.{field}");
            match source {
                None => e.add(
                    spath,
                    Problem::Unsupported {
                        why: "only block-device volume sources are",
                    },
                ),
                Some(VolumeSource::HostDisk(hd)) => check_host_disk(hd, &spath, e),
                Some(VolumeSource::PersistentVolumeClaim(pvc)) => check_pvc(pvc, &spath, e),
                Some(VolumeSource::DataVolume(dv)) => {
                    if let Err(why) = check_dns1123_subdomain(&dv.name) {
                        e.add(format!("{spath}.name"), why);
                    }
                }
                Some(VolumeSource::ContainerDisk(cd)) => check_container_disk(cd, &spath, e),
                Some(VolumeSource::EmptyDisk(ed)) => {
                    bounds::check_capacity(format!("{spath}.capacity"), &ed.capacity, e)
                }
                Some(VolumeSource::Ephemeral(eph)) => check_pvc(
                    &eph.persistent_volume_claim,
                    &format!("{spath}.persistentVolumeClaim"),
                    e,
                ),
                Some(VolumeSource::CloudInitNoCloud(ci)) => check_cloud_init(ci, &spath, e),
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
            e.add(
                format!("{path}.name"),
                Problem::UnusedVolume {
                    name: volume.name.clone(),
                },
            );
        }
    }
}

/// A `hostDisk`: an absolute single-line path the launcher may use, and its type (a capacity for
/// `DiskOrCreate`).
fn check_host_disk(hd: &HostDisk, spath: &str, e: &mut Problems) {
    bounds::check_single_line(format!("{spath}.path"), &hd.path, e);
    if !hd.path.starts_with('/') {
        e.add(
            format!("{spath}.path"),
            Problem::NotAbsolute {
                path: hd.path.clone(),
            },
        );
    } else if let Err(why) = check_host_path(&hd.path, true) {
        e.add(format!("{spath}.path"), why);
    }
    match hd.disk_type.as_str() {
        "Disk" => {}
        "DiskOrCreate" => match &hd.capacity {
            None => e.add(
                format!("{spath}.capacity"),
                Problem::RequiredWith {
                    condition: "type DiskOrCreate",
                },
            ),
            Some(q) => bounds::check_capacity(format!("{spath}.capacity"), q, e),
        },
        other => e.add(
            format!("{spath}.type"),
            Problem::HostDiskType {
                value: other.into(),
            },
        ),
    }
}

/// A `containerDisk`: an image named, a known pull policy, no unsupported field.
fn check_container_disk(cd: &ContainerDisk, spath: &str, e: &mut Problems) {
    if cd.image.is_empty() {
        e.add(format!("{spath}.image"), Problem::Required);
    }
    if let Some(policy) = &cd.image_pull_policy {
        e.one_of(
            format!("{spath}.imagePullPolicy"),
            policy,
            &["Always", "IfNotPresent", "Never"],
        );
    }
    unsupported::check(e, spath, cd);
}

/// A `cloudInitNoCloud`: user data in one form (or a secret), network data in at most one, the
/// base64 forms decodable.
fn check_cloud_init(ci: &CloudInitNoCloud, spath: &str, e: &mut Problems) {
    unsupported::check(e, spath, ci);
    if ci.user_data.is_some() && ci.user_data_base64.is_some() {
        e.add(
            spath,
            Problem::BothSet {
                first: "userData",
                second: "userDataBase64",
            },
        );
    }
    if ci.user_data.is_none() && ci.user_data_base64.is_none() && ci.secret_ref.is_none() {
        e.add(
            spath,
            Problem::EitherRequired {
                first: "userData",
                second: "userDataBase64",
            },
        );
    }
    if ci.network_data.is_some() && ci.network_data_base64.is_some() {
        e.add(
            spath,
            Problem::BothSet {
                first: "networkData",
                second: "networkDataBase64",
            },
        );
    }
    for (field, value) in [
        ("userDataBase64", &ci.user_data_base64),
        ("networkDataBase64", &ci.network_data_base64),
    ] {
        if let Some(text) = value {
            if let Err(why) = decode_base64(text) {
                e.add(format!("{spath}.{field}"), why);
            }
        }
    }
}

fn check_pvc(pvc: &PvcSource, path: &str, e: &mut Problems) {
    if let Err(why) = check_dns1123_subdomain(&pvc.claim_name) {
        e.add(format!("{path}.claimName"), why);
    }
}
