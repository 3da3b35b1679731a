//! The VMI as virt-handler sends it (`VMIRequest.vmi.vmiJson`: Go's `json.Marshal` of the whole
//! `VirtualMachineInstance`, status included) → the spec text a launcher Sync takes.
//!
//! Two things differ from a manifest a person writes. The status is the controller's, and says
//! which hot-plugged volumes are ready: KubeVirt's launcher attaches a hotplug volume only once
//! virt-handler has mounted it into the pod (`status.volumeStatus[].phase`
//! `HotplugVolumeMounted` = `MountedToPod`, or `VolumeReady` = `Ready` once attached), so a volume in any other phase is left
//! out of the spec, with its disk, as if not asked for yet. And Go writes the zero value of every
//! field its struct does not mark `omitempty`: an empty `resources: {}`, a `creationTimestamp:
//! null`; the spec parser takes those as KubeVirt does. And a VMI from virt-handler's informer
//! cache has no `apiVersion` and `kind` at all (client-go drops the type meta of objects it
//! decodes into a typed cache): the cmd protocol carries only VMIs, so a missing one is
//! `kubevirt.io/v1` `VirtualMachineInstance`, as KubeVirt's launcher, which never reads them,
//! takes it. One that is there and says something else is still refused by the spec check.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::spec::{self, SpecErrors};

/// The phases in which virt-handler has put a hotplug volume's source into the pod: KubeVirt's
/// `HotplugVolumeMounted` and `VolumeReady`, by their values.
const MOUNTED: &[&str] = &["MountedToPod", "Ready"];

/// What a Sync from virt-handler asks for.
#[derive(Debug, Clone)]
pub(crate) struct HandlerSync {
    /// The spec without the status and without hotplug volumes not mounted yet: the text the
    /// launcher keeps as its last Sync.
    pub spec_text: String,
    /// The same, parsed and validated (from the document read once, not from the text).
    pub spec: spec::Validated,
    pub name: String,
    pub namespace: String,
    pub uid: String,
    /// Hotplug volumes left out because their source is not in the pod yet, with their phase.
    pub not_mounted: BTreeMap<String, String>,
}

/// Why virt-handler's VMI was refused (before anything changes).
#[derive(Debug, thiserror::Error)]
pub(crate) enum VmiError {
    #[error("vmi.vmiJson: {0}")]
    Spec(#[from] SpecErrors),
    #[error("vmi.vmiJson: {field}: {why}")]
    Shape {
        field: &'static str,
        why: &'static str,
    },
}

/// Reads virt-handler's VMI (bounded as every spec is) and makes the Sync's spec text.
pub(crate) fn from_handler(bytes: &[u8]) -> Result<HandlerSync, VmiError> {
    spec::check_document_size(bytes.len())?;
    let text = std::str::from_utf8(bytes).map_err(|_| VmiError::Shape {
        field: "(document)",
        why: "not UTF-8",
    })?;
    // Read once, within every spec's bounds; edited as a document, then typed from it.
    let mut vmi: Value = spec::read_document(text)?;
    let Some(object) = vmi.as_object_mut() else {
        return Err(VmiError::Shape {
            field: "(document)",
            why: "not a JSON object",
        });
    };
    for (key, value) in [
        ("apiVersion", "kubevirt.io/v1"),
        ("kind", "VirtualMachineInstance"),
    ] {
        object
            .entry(key)
            .or_insert_with(|| Value::String(value.to_string()));
    }
    let status = object.remove("status");
    let phases = volume_phases(status.as_ref());
    let meta = object.get("metadata");
    let text_of = |key: &str| {
        meta.and_then(|m| m.get(key))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let (name, namespace, uid) = (text_of("name"), text_of("namespace"), text_of("uid"));
    let not_mounted = drop_unmounted_hotplug(&mut vmi, &phases);
    let spec_text = vmi.to_string();
    let spec = spec::from_document(vmi)?;
    Ok(HandlerSync {
        spec_text,
        spec,
        name,
        namespace,
        uid,
        not_mounted,
    })
}

/// `status.volumeStatus[]`: each volume's phase by name.
fn volume_phases(status: Option<&Value>) -> BTreeMap<String, String> {
    status
        .and_then(|s| s.get("volumeStatus"))
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .filter_map(|v| {
                    Some((
                        v.get("name")?.as_str()?.to_string(),
                        v.get("phase")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string(),
                    ))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A claim marked `hotpluggable` (persistentVolumeClaim or dataVolume).
fn is_hotplug(volume: &Value) -> bool {
    ["persistentVolumeClaim", "dataVolume"]
        .iter()
        .any(|source| {
            volume
                .get(source)
                .and_then(|s| s.get("hotpluggable"))
                .and_then(Value::as_bool)
                == Some(true)
        })
}

/// Removes hotplug volumes whose source virt-handler has not mounted, and their disks.
fn drop_unmounted_hotplug(
    vmi: &mut Value,
    phases: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut dropped = BTreeMap::new();
    let Some(spec) = vmi.get_mut("spec") else {
        return dropped;
    };
    if let Some(volumes) = spec.get_mut("volumes").and_then(Value::as_array_mut) {
        volumes.retain(|v| {
            let Some(name) = v.get("name").and_then(Value::as_str) else {
                return true;
            };
            let phase = phases.get(name).map(String::as_str).unwrap_or("");
            if is_hotplug(v) && !MOUNTED.contains(&phase) {
                dropped.insert(name.to_string(), phase.to_string());
                false
            } else {
                true
            }
        });
    }
    if let Some(disks) = spec
        .pointer_mut("/domain/devices/disks")
        .and_then(Value::as_array_mut)
    {
        disks.retain(|d| {
            d.get("name")
                .and_then(Value::as_str)
                .is_none_or(|n| !dropped.contains_key(n))
        });
    }
    dropped
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vmi(volume_status: &str) -> String {
        format!(
            r#"{{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineInstance",
            "metadata":{{"name":"testvmi","namespace":"ns1","uid":"u-1","creationTimestamp":null}},
            "spec":{{"domain":{{"memory":{{"guest":"64Mi"}},"devices":{{"disks":[
                {{"name":"root","disk":{{"bus":"scsi"}}}},
                {{"name":"hp1","disk":{{"bus":"scsi"}},"serial":"s1"}}]}}}},
              "volumes":[
                {{"name":"root","persistentVolumeClaim":{{"claimName":"root"}}}},
                {{"name":"hp1","persistentVolumeClaim":{{"claimName":"hp1","hotpluggable":true}}}}]}},
            "status":{{"phase":"Running","volumeStatus":[{volume_status}]}}}}"#
        )
    }

    #[test]
    fn a_hotplug_volume_waits_until_virt_handler_mounted_it() {
        // Attached to the node, not yet in the pod.
        let pending =
            from_handler(vmi(r#"{"name":"hp1","phase":"AttachedToNode"}"#).as_bytes()).unwrap();
        assert_eq!(
            pending.not_mounted.get("hp1").map(String::as_str),
            Some("AttachedToNode")
        );
        let spec: Value = serde_json::from_str(&pending.spec_text).unwrap();
        assert_eq!(spec["spec"]["volumes"].as_array().unwrap().len(), 1);
        assert_eq!(
            spec["spec"]["domain"]["devices"]["disks"][0]["name"],
            "root"
        );
        assert_eq!(
            spec["spec"]["domain"]["devices"]["disks"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
        assert!(spec.get("status").is_none());
        // Not in the status at all: not mounted either.
        assert!(from_handler(vmi("").as_bytes())
            .unwrap()
            .not_mounted
            .contains_key("hp1"));

        for phase in ["MountedToPod", "Ready"] {
            let mounted = from_handler(
                vmi(&format!(
                    r#"{{"name":"hp1","phase":"{phase}","hotplugVolume":{{}}}}"#
                ))
                .as_bytes(),
            )
            .unwrap();
            assert!(mounted.not_mounted.is_empty(), "{phase}");
            let spec: Value = serde_json::from_str(&mounted.spec_text).unwrap();
            assert_eq!(spec["spec"]["volumes"][1]["name"], "hp1");
            assert_eq!(
                spec["spec"]["domain"]["devices"]["disks"][1]["serial"],
                "s1"
            );
        }
    }

    #[test]
    fn a_vmi_from_the_informer_cache_has_no_type_meta_and_is_a_vmi() {
        let mut cached: Value = serde_json::from_str(&vmi("")).unwrap();
        let object = cached.as_object_mut().unwrap();
        object.remove("apiVersion");
        object.remove("kind");
        let sync = from_handler(cached.to_string().as_bytes()).unwrap();
        assert_eq!(sync.spec.metadata.name, "testvmi");
        // The text kept as the last Sync means the same.
        assert_eq!(crate::spec::parse(&sync.spec_text).unwrap(), sync.spec);
        let text: Value = serde_json::from_str(&sync.spec_text).unwrap();
        assert_eq!(
            (&text["apiVersion"], &text["kind"]),
            (
                &Value::from("kubevirt.io/v1"),
                &Value::from("VirtualMachineInstance")
            )
        );
    }

    #[test]
    fn a_vmi_that_says_it_is_something_else_is_still_refused() {
        let other = vmi("").replace("\"kind\":\"VirtualMachineInstance\"", "\"kind\":\"Pod\"");
        let e = from_handler(other.as_bytes()).unwrap_err().to_string();
        assert!(e.starts_with("vmi.vmiJson: kind"), "{e}");
    }

    #[test]
    fn names_come_from_the_metadata() {
        let s = from_handler(vmi("").as_bytes()).unwrap();
        assert_eq!(
            (s.name.as_str(), s.namespace.as_str(), s.uid.as_str()),
            ("testvmi", "ns1", "u-1")
        );
    }

    #[test]
    fn malformed_documents_are_refused_naming_the_document() {
        for bad in [&b"{not json"[..], b"[1,2]", b"\xff\xfe"] {
            let e = from_handler(bad).unwrap_err().to_string();
            assert!(e.starts_with("vmi.vmiJson: (document)"), "{e}");
        }
        let huge = vec![b' '; spec::MAX_DOCUMENT_BYTES + 1];
        assert!(matches!(from_handler(&huge), Err(VmiError::Spec(_))));
    }
}
