//! `addvolume` and `removevolume` edit the launcher's current spec as YAML values (so that
//! what they do not touch stays as the owner wrote it).

/// The spec as YAML values, to edit volumes in.
pub(crate) type SpecValue = serde_yaml_ng::Value;

/// Why an edit cannot be made on the launcher's spec.
#[derive(Debug, thiserror::Error)]
pub enum SpecEditError {
    #[error("the launcher's spec has no mapping at {key}")]
    NoMapping { key: String },
    #[error("{path} is not a list")]
    NotAList { path: String },
    #[error("the spec already has a volume {name:?}")]
    VolumeExists { name: String },
    #[error("the spec has no volume {name:?}")]
    NoVolume { name: String },
}

pub(crate) fn spec_list<'a>(
    spec: &'a mut SpecValue,
    path: &[&str],
) -> Result<&'a mut Vec<SpecValue>, SpecEditError> {
    let mut node = spec;
    for key in path {
        let map = node
            .as_mapping_mut()
            .ok_or_else(|| SpecEditError::NoMapping { key: (*key).into() })?;
        let k = SpecValue::from(*key);
        if !map.contains_key(&k) {
            let empty = if *key == path[path.len() - 1] {
                SpecValue::Sequence(Vec::new())
            } else {
                SpecValue::Mapping(Default::default())
            };
            map.insert(k.clone(), empty);
        }
        node = map.get_mut(&k).expect("just inserted");
    }
    node.as_sequence_mut()
        .ok_or_else(|| SpecEditError::NotAList {
            path: path.join("."),
        })
}

/// The spec of a VirtualMachine keeps the instance under `spec.template`.
pub(crate) fn instance_root(spec: &mut SpecValue) -> &mut SpecValue {
    let is_vm = spec.get("kind").and_then(|k| k.as_str()) == Some("VirtualMachine");
    let has_template = spec.get("spec").and_then(|s| s.get("template")).is_some();
    if is_vm && has_template {
        return spec
            .get_mut("spec")
            .and_then(|s| s.get_mut("template"))
            .expect("checked above");
    }
    spec
}

pub(crate) fn named(name: &str) -> impl Fn(&SpecValue) -> bool + '_ {
    move |v| v.get("name").and_then(|n| n.as_str()) == Some(name)
}

pub(crate) fn add_volume(
    spec: &mut SpecValue,
    name: &str,
    serial: &str,
) -> Result<(), SpecEditError> {
    let root = instance_root(spec);
    let volumes = spec_list(root, &["spec", "volumes"])?;
    if volumes.iter().any(named(name)) {
        return Err(SpecEditError::VolumeExists { name: name.into() });
    }
    // Built as values, never as YAML text: a name or serial is data, whatever it holds (as text,
    // a crafted name could inject YAML of its own).
    let map = |entries: Vec<(&str, SpecValue)>| {
        SpecValue::Mapping(
            entries
                .into_iter()
                .map(|(k, v)| (SpecValue::from(k), v))
                .collect(),
        )
    };
    volumes.push(map(vec![
        ("name", name.into()),
        (
            "persistentVolumeClaim",
            map(vec![
                ("claimName", name.into()),
                ("hotpluggable", true.into()),
            ]),
        ),
    ]));
    let disk = map(vec![
        ("name", name.into()),
        ("disk", map(vec![("bus", "scsi".into())])),
        ("serial", serial.into()),
    ]);
    spec_list(root, &["spec", "domain", "devices", "disks"])?.push(disk);
    Ok(())
}

pub(crate) fn remove_volume(spec: &mut SpecValue, name: &str) -> Result<(), SpecEditError> {
    let root = instance_root(spec);
    let volumes = spec_list(root, &["spec", "volumes"])?;
    let before = volumes.len();
    volumes.retain(|v| !named(name)(v));
    if volumes.len() == before {
        return Err(SpecEditError::NoVolume { name: name.into() });
    }
    spec_list(root, &["spec", "domain", "devices", "disks"])?.retain(|d| !named(name)(d));
    Ok(())
}
