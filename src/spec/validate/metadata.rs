//! `metadata`: names, and annotations that would hook into the domain.

use super::{bounds, Problems};
use crate::spec::checks::check_dns1123_label;
use crate::spec::model::ObjectMeta;
use crate::spec::problem::Problem;

/// Annotations that would change the domain through a KubeVirt sidecar hook.
const HOOK_ANNOTATIONS: &[&str] = &["hooks.kubevirt.io/hookSidecars"];
const SMBIOS_ANNOTATION_PREFIX: &str = "smbios.vm.kubevirt.io/";

pub(super) fn validate_metadata(meta: &ObjectMeta, e: &mut Problems) {
    if let Err(why) = check_dns1123_label(&meta.name) {
        e.add("metadata.name", why);
    }
    if let Some(uid) = &meta.uid {
        bounds::check_single_line("metadata.uid".into(), uid, e);
    }
    for (key, value) in &meta.labels {
        bounds::check_single_line(format!("metadata.labels.{key}"), value, e);
    }
    if let Some(ns) = &meta.namespace {
        if let Err(why) = check_dns1123_label(ns) {
            e.add("metadata.namespace", why);
        }
    }
    e.unsupported(
        "metadata",
        &[(
            "generateName",
            meta.generate_name.is_some(),
            "a launcher runs one VM with a fixed name",
        )],
    );
    for key in meta.annotations.keys() {
        if HOOK_ANNOTATIONS.contains(&key.as_str()) || key.starts_with(SMBIOS_ANNOTATION_PREFIX) {
            e.add(
                format!("metadata.annotations[{key}]"),
                Problem::Unsupported {
                    why: "sidecar hooks",
                },
            );
        }
    }
}
