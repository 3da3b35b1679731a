//! KubeVirt's `api.Domain` as JSON (what `GetDomain` returns and notify sends).
//!
//! KubeVirt's launcher unmarshals libvirt's live XML into `api.DomainSpec` (Go `encoding/xml`)
//! and marshals the whole `api.Domain` with `encoding/json`. Most schema fields carry only `xml`
//! tags, so their JSON keys are the Go field names (`Spec`, `Devices`, `Disks`, `Alias`...);
//! `ObjectMeta` is k8s' `metav1.ObjectMeta` with its lowercase tags, and `TypeMeta` is embedded
//! untagged, so its `kind`/`apiVersion` sit at the top. virt-handler decodes with the same
//! structs, case-sensitively, so every key here is spelled as Go spells it
//! (`tests/data/kubevirt-wire/api-schema.go`; `tests/offline/kubevirt_domain_json.rs` checks it).
//!
//! Only the part of the schema virt-handler reads is translated (see [`domain_json`]); a key
//! left out decodes as Go's zero value, which is what KubeVirt itself sends for a field its
//! domain does not have. Pure: no I/O, bounded input.

use std::path::{Path, PathBuf};

use roxmltree::Node;
use serde_json::{json, Map, Value};

use crate::lifecycle::{DomainState, PowerState};

mod resources;
mod stats;

use resources::{cpu_json, max_memory_json, memory_device_json, memory_json, vcpus_json};
pub use stats::{device_aliases, domain_stats_json, StatValue, MAX_STAT_INDEX};

/// libvirt's live XML of a vmlauncher domain is a few KB; anything near this is not ours.
pub(crate) const MAX_XML_BYTES: usize = 4 << 20;
/// Elements under `<devices>`: a VM has tens; KubeVirt caps hotplug volumes far below this.
pub(crate) const MAX_DEVICES: usize = 1024;
/// XML nodes of the whole document, so that parsing itself is bounded, not only what we read.
const MAX_XML_NODES: u32 = 100_000;

/// KubeVirt's `UserAliasPrefix`: a device alias libvirt holds as `ua-<name>` is the user's
/// (the VMI's volume or interface name) and travels in JSON without the prefix.
const USER_ALIAS_PREFIX: &str = "ua-";

/// What `ObjectMeta`'s `TypeMeta` says in every domain KubeVirt's launcher sends
/// (`api.NewDomainReferenceFromName`).
const KIND: &str = "Domain";
const API_VERSION: &str = "1.2.2";

/// What the launcher knows about the VMI that libvirt's XML does not hold.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DomainMeta {
    /// The VMI's name: `ObjectMeta.name`.
    pub name: String,
    pub namespace: String,
    /// The VMI's `metadata.uid`: `ObjectMeta.uid` and `Spec.Metadata.KubeVirt.UID`.
    pub uid: String,
    /// `Spec.Metadata.KubeVirt.GracePeriod.DeletionGracePeriodSeconds`.
    pub grace_period_seconds: Option<i64>,
    /// RFC 3339; `GracePeriod.DeletionTimestamp`, stamped when a graceful shutdown starts.
    pub grace_deletion_timestamp: Option<String>,
    /// `GracePeriod.MarkedForGracefulShutdown`.
    pub marked_for_graceful_shutdown: Option<bool>,
    /// RFC 3339; `ObjectMeta.deletionTimestamp`: set once the domain is gone, which is how
    /// virt-handler learns the launcher's final word.
    pub deletion_timestamp: Option<String>,
    /// `Spec.Metadata.KubeVirt.Migration`: the migration this launcher takes part in, once
    /// virt-handler asked for one (as source or target).
    pub migration: Option<MigrationMeta>,
    /// Where the launcher pins hot-plugged files (`host::pin`), and the hotplug dir: a disk
    /// whose source is a pin is shown at its volume's path, `<hotplug dir>/<volume>.img`, as
    /// KubeVirt's launcher names it (the pin is the launcher's own business).
    pub pins: Option<(PathBuf, PathBuf)>,
    /// `Status.FSFreezeStatus.Status`: `frozen` or `thawed` once a freeze or thaw was asked
    /// (virt-handler shows `frozen` as the VMI's `fsFreezeStatus`).
    pub fs_freeze_status: Option<String>,
}

/// KubeVirt's `api.MigrationMetadata`: how virt-handler follows a migration, on both sides.
/// `EndTimestamp` set and `Failed` false is a migration that completed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigrationMeta {
    /// The migration's UID (the VMI's `status.migrationState`), which virt-handler matches.
    pub uid: String,
    /// RFC 3339.
    pub start_timestamp: Option<String>,
    /// RFC 3339; set once the migration is over, however it ended.
    pub end_timestamp: Option<String>,
    pub failed: bool,
    pub failure_reason: String,
    /// KubeVirt's `MigrationAbortStatus`: empty, `Aborting`, `Succeeded` or `Failed`.
    pub abort_status: String,
    /// KubeVirt's `MigrationMode`: `PreCopy` (the only one vmlauncher runs).
    pub mode: String,
}

#[derive(Debug, thiserror::Error)]
pub enum DomainJsonError {
    #[error("live domain XML is {len} bytes, over the limit of {max}")]
    TooLarge { len: usize, max: usize },
    #[error("live domain XML has {count} devices, over the limit of {max}")]
    TooManyDevices { count: usize, max: usize },
    #[error("libvirt returned XML that does not parse")]
    Malformed(#[source] roxmltree::Error),
    #[error("live domain XML: the root element is <{0}>, not <domain>")]
    NotADomain(String),
    #[error("live domain XML: <{element}> has {what} {value:?}, not a number")]
    BadNumber {
        element: &'static str,
        what: &'static str,
        value: String,
    },
}

/// KubeVirt's `api.LifeCycle` and `api.StateChangeReason` for a power state, as its launcher's
/// `util.ConvState`/`util.ConvReason` give them; `None` is a domain libvirt does not have
/// (`NoState`/`NonExistent`, as KubeVirt sets on a not-found lookup).
///
/// KubeVirt translates reasons only for shutting-down, shutoff, crashed and paused domains: every
/// other state's reason is `Unknown` (a running domain is `Running`/`Unknown`, not "booted"). A
/// reason its tables lack (libvirt's `daemon`, `api-error`...) is a Go map miss, the empty
/// string; we send the same so that virt-handler sees exactly what it would from KubeVirt.
pub(crate) fn lifecycle(power: Option<&PowerState>) -> (&'static str, &'static str) {
    let Some(power) = power else {
        return ("NoState", "NonExistent");
    };
    let reason = power.reason.as_str();
    let translated = |table: &[(&str, &'static str)]| {
        table
            .iter()
            .find(|(word, _)| *word == reason)
            .map_or("", |(_, r)| *r)
    };
    match power.state {
        DomainState::NoState => ("NoState", "Unknown"),
        DomainState::Running => ("Running", "Unknown"),
        DomainState::Blocked => ("Blocked", "Unknown"),
        DomainState::PmSuspended => ("PMSuspended", "Unknown"),
        DomainState::ShuttingDown => (
            "ShuttingDown",
            translated(&[("unknown", "Unknown"), ("user", "User")]),
        ),
        DomainState::Shutoff => (
            "Shutoff",
            translated(&[
                ("unknown", "Unknown"),
                ("shutdown", "Shutdown"),
                ("destroyed", "Destroyed"),
                ("crashed", "Crashed"),
                ("migrated", "Migrated"),
                ("saved", "Saved"),
                ("failed", "Failed"),
                ("from-snapshot", "FromSnapshot"),
            ]),
        ),
        DomainState::Crashed => (
            "Crashed",
            translated(&[("unknown", "Unknown"), ("panicked", "Panicked")]),
        ),
        DomainState::Paused => (
            "Paused",
            translated(&[
                ("unknown", "Unknown"),
                ("user", "User"),
                ("migration", "Migration"),
                ("save", "Save"),
                ("dump", "Dump"),
                ("ioerror", "IOError"),
                ("watchdog", "Watchdog"),
                ("from-snapshot", "FromSnapshot"),
                ("shutdown", "ShuttingDown"),
                ("snapshot", "Snapshot"),
                ("crashed", "Crashed"),
                ("starting-up", "StartingUp"),
                ("post-copy", "Postcopy"),
                ("postcopy-failed", "PostcopyFailed"),
            ]),
        ),
    }
}

/// KubeVirt's JSON of an `api.Alias` (its `MarshalJSON` writes `userAliasMarshal`): libvirt's
/// `ua-<name>` is the user's `<name>`, any other alias is libvirt's own, kept whole.
pub(crate) fn alias_json(libvirt_alias: &str) -> Value {
    match libvirt_alias.strip_prefix(USER_ALIAS_PREFIX) {
        Some(name) => json!({"Name": name, "UserDefined": true}),
        None => json!({"Name": libvirt_alias, "UserDefined": false}),
    }
}

/// The domain as KubeVirt's launcher sends it: libvirt's live XML read into `Spec`, the VMI's
/// identity from `meta`, and the state from `power` (`None`: libvirt has no such domain).
///
/// `Spec` carries `Type`, `Name`, `UUID`, `Memory`, `CurrentMemory`, `MaxMemory`, `OS`, `VCPU`,
/// `VCPUs`, `CPU` (with `NUMA`), `Features`, `OnReboot`, `Devices` (`Emulator`, `Disks`,
/// `Interfaces`, `Channels`, `Controllers`, the virtio-mem `Memory`) and
/// `Metadata.KubeVirt`. Every disk and interface has an `Alias`, and every interface a `MAC`,
/// because virt-handler dereferences them.
pub fn domain_json(
    live_xml: &str,
    meta: &DomainMeta,
    power: Option<&PowerState>,
) -> Result<Value, DomainJsonError> {
    if live_xml.len() > MAX_XML_BYTES {
        return Err(DomainJsonError::TooLarge {
            len: live_xml.len(),
            max: MAX_XML_BYTES,
        });
    }
    let options = roxmltree::ParsingOptions {
        nodes_limit: MAX_XML_NODES,
        ..roxmltree::ParsingOptions::default()
    };
    let doc = roxmltree::Document::parse_with_options(live_xml, options)
        .map_err(DomainJsonError::Malformed)?;
    let domain = doc.root_element();
    if !domain.has_tag_name("domain") {
        return Err(DomainJsonError::NotADomain(
            domain.tag_name().name().to_string(),
        ));
    }
    let mut spec = read_spec(domain, meta.pins.as_ref())?;
    spec.insert("Metadata".into(), metadata_json(meta, true));
    Ok(envelope(meta, Value::Object(spec), lifecycle(power)))
}

/// The domain once libvirt no longer has it, as KubeVirt's launcher sends it after an undefine:
/// a domain made from the name alone (`util.NewDomainFromName`: no spec but the VMI's UID) in
/// state `NoState`/`NonExistent`; with `meta.deletion_timestamp` set it is the final deletion.
pub fn gone_domain_json(meta: &DomainMeta) -> Value {
    let spec = json!({ "Metadata": metadata_json(meta, false) });
    envelope(meta, spec, lifecycle(None))
}

/// `api.Domain` around a spec: `TypeMeta` (embedded, so promoted), `ObjectMeta`, `Status`.
fn envelope(meta: &DomainMeta, spec: Value, (status, reason): (&str, &str)) -> Value {
    let mut object_meta = Map::new();
    object_meta.insert("name".into(), meta.name.clone().into());
    object_meta.insert("namespace".into(), meta.namespace.clone().into());
    object_meta.insert("uid".into(), meta.uid.clone().into());
    if let Some(ts) = &meta.deletion_timestamp {
        object_meta.insert("deletionTimestamp".into(), ts.clone().into());
    }
    let mut status = json!({"Status": status, "Reason": reason});
    if let Some(fs) = &meta.fs_freeze_status {
        status["FSFreezeStatus"] = json!({ "Status": fs });
    }
    json!({
        "kind": KIND,
        "apiVersion": API_VERSION,
        "ObjectMeta": object_meta,
        "Spec": spec,
        "Status": status,
    })
}

/// `Metadata.KubeVirt`: KubeVirt replaces whatever the XML holds with its launcher's metadata
/// cache, so this comes from `meta` alone. A gone domain carries only the UID, as KubeVirt's.
fn metadata_json(meta: &DomainMeta, full: bool) -> Value {
    let mut kubevirt = Map::new();
    kubevirt.insert("UID".into(), meta.uid.clone().into());
    let has_grace = meta.grace_period_seconds.is_some()
        || meta.grace_deletion_timestamp.is_some()
        || meta.marked_for_graceful_shutdown.is_some();
    if full && has_grace {
        let mut grace = Map::new();
        // Not a pointer in Go: always there, 0 when unset.
        grace.insert(
            "DeletionGracePeriodSeconds".into(),
            meta.grace_period_seconds.unwrap_or(0).into(),
        );
        if let Some(ts) = &meta.grace_deletion_timestamp {
            grace.insert("DeletionTimestamp".into(), ts.clone().into());
        }
        if let Some(marked) = meta.marked_for_graceful_shutdown {
            grace.insert("MarkedForGracefulShutdown".into(), marked.into());
        }
        kubevirt.insert("GracePeriod".into(), Value::Object(grace));
    }
    if let Some(m) = meta.migration.as_ref().filter(|_| full) {
        // No JSON tags and no omitempty for JSON in Go's struct: every field, null when unset.
        kubevirt.insert(
            "Migration".into(),
            json!({
                "UID": m.uid,
                "StartTimestamp": m.start_timestamp,
                "EndTimestamp": m.end_timestamp,
                "Failed": m.failed,
                "FailureReason": m.failure_reason,
                "AbortStatus": m.abort_status,
                "Mode": m.mode,
            }),
        );
    }
    json!({ "KubeVirt": kubevirt })
}

fn child<'a, 'i>(node: Node<'a, 'i>, tag: &str) -> Option<Node<'a, 'i>> {
    node.children().find(|n| n.has_tag_name(tag))
}

fn children<'a, 'i>(node: Node<'a, 'i>, tag: &'a str) -> impl Iterator<Item = Node<'a, 'i>> {
    node.children().filter(move |n| n.has_tag_name(tag))
}

/// An element's text as Go's `,chardata` reads it.
fn text(node: Node<'_, '_>) -> String {
    node.text().unwrap_or("").to_string()
}

/// Puts `key: value` when the XML has it: Go would write the zero value, which decodes alike.
fn put_attr(map: &mut Map<String, Value>, key: &str, node: Node<'_, '_>, attr: &str) {
    if let Some(v) = node.attribute(attr) {
        map.insert(key.into(), v.into());
    }
}

/// Go's `encoding/xml` parses integers with surrounding space trimmed, and fails the whole
/// unmarshal on a bad one; so do we.
fn number(element: &'static str, what: &'static str, raw: &str) -> Result<u64, DomainJsonError> {
    raw.trim()
        .parse::<u64>()
        .map_err(|_| DomainJsonError::BadNumber {
            element,
            what,
            value: raw.to_string(),
        })
}

fn put_number_attr(
    map: &mut Map<String, Value>,
    key: &str,
    node: Node<'_, '_>,
    element: &'static str,
    attr: &'static str,
) -> Result<(), DomainJsonError> {
    if let Some(v) = node.attribute(attr) {
        map.insert(key.into(), number(element, attr, v)?.into());
    }
    Ok(())
}

fn read_spec(
    domain: Node<'_, '_>,
    pins: Option<&(PathBuf, PathBuf)>,
) -> Result<Map<String, Value>, DomainJsonError> {
    let mut spec = Map::new();
    spec.insert("Type".into(), domain.attribute("type").unwrap_or("").into());
    spec.insert(
        "Name".into(),
        child(domain, "name").map(text).unwrap_or_default().into(),
    );
    if let Some(uuid) = child(domain, "uuid") {
        spec.insert("UUID".into(), text(uuid).into());
    }
    // `Memory` is not a pointer in Go, so it is always there.
    let memory = match child(domain, "memory") {
        Some(m) => memory_json(m, "memory")?,
        None => json!({"Value": 0, "Unit": ""}),
    };
    spec.insert("Memory".into(), memory);
    if let Some(m) = child(domain, "currentMemory") {
        spec.insert("CurrentMemory".into(), memory_json(m, "currentMemory")?);
    }
    if let Some(m) = child(domain, "maxMemory") {
        spec.insert("MaxMemory".into(), max_memory_json(m)?);
    }
    spec.insert(
        "OS".into(),
        child(domain, "os")
            .map(os_json)
            .unwrap_or_else(|| json!({})),
    );
    if let Some(vcpu) = child(domain, "vcpu") {
        spec.insert(
            "VCPU".into(),
            json!({
                "Placement": vcpu.attribute("placement").unwrap_or(""),
                "CPUs": number("vcpu", "count", &text(vcpu))?,
            }),
        );
    }
    if let Some(vcpus) = child(domain, "vcpus") {
        spec.insert("VCPUs".into(), vcpus_json(vcpus)?);
    }
    if let Some(cpu) = child(domain, "cpu") {
        spec.insert("CPU".into(), cpu_json(cpu)?);
    }
    if let Some(features) = child(domain, "features") {
        spec.insert("Features".into(), features_json(features));
    }
    if let Some(on_reboot) = child(domain, "on_reboot") {
        spec.insert("OnReboot".into(), text(on_reboot).into());
    }
    let devices = match child(domain, "devices") {
        Some(d) => devices_json(d, pins)?,
        None => devices_json_empty(),
    };
    spec.insert("Devices".into(), devices);
    Ok(spec)
}

fn os_json(os: Node<'_, '_>) -> Value {
    let mut out = Map::new();
    put_attr(&mut out, "Firmware", os, "firmware");
    let mut os_type = Map::new();
    if let Some(t) = child(os, "type") {
        os_type.insert("OS".into(), text(t).into());
        put_attr(&mut os_type, "Arch", t, "arch");
        put_attr(&mut os_type, "Machine", t, "machine");
    }
    out.insert("Type".into(), Value::Object(os_type));
    let boot: Vec<Value> = children(os, "boot")
        .map(|b| json!({"Dev": b.attribute("dev").unwrap_or("")}))
        .collect();
    if !boot.is_empty() {
        out.insert("BootOrder".into(), boot.into());
    }
    if let Some(loader) = child(os, "loader") {
        let mut l = Map::new();
        put_attr(&mut l, "ReadOnly", loader, "readonly");
        put_attr(&mut l, "Secure", loader, "secure");
        put_attr(&mut l, "Type", loader, "type");
        l.insert("Path".into(), text(loader).into());
        out.insert("BootLoader".into(), Value::Object(l));
    }
    if let Some(nvram) = child(os, "nvram") {
        let mut n = Map::new();
        put_attr(&mut n, "Template", nvram, "template");
        put_attr(&mut n, "Format", nvram, "format");
        n.insert("NVRam".into(), text(nvram).into());
        out.insert("NVRam".into(), Value::Object(n));
    }
    if let Some(smbios) = child(os, "smbios") {
        out.insert(
            "SMBios".into(),
            json!({"Mode": smbios.attribute("mode").unwrap_or("")}),
        );
    }
    for (key, tag) in [
        ("Kernel", "kernel"),
        ("Initrd", "initrd"),
        ("KernelArgs", "cmdline"),
    ] {
        if let Some(n) = child(os, tag) {
            out.insert(key.into(), text(n).into());
        }
    }
    Value::Object(out)
}

/// The features virt-handler looks at: with `ACPI` absent it does not attempt a graceful
/// (ACPI) shutdown at all. Flags are Go's empty `FeatureEnabled` struct; the states are
/// `FeatureState`. Hyper-V and KVM sub-features are not translated.
fn features_json(features: Node<'_, '_>) -> Value {
    let mut out = Map::new();
    for (key, tag) in [("ACPI", "acpi"), ("APIC", "apic"), ("SMM", "smm")] {
        if child(features, tag).is_some() {
            out.insert(key.into(), json!({}));
        }
    }
    for (key, tag) in [
        ("PMU", "pmu"),
        ("VMPort", "vmport"),
        ("PVSpinlock", "pvspinlock"),
    ] {
        if let Some(f) = child(features, tag) {
            let mut state = Map::new();
            put_attr(&mut state, "State", f, "state");
            out.insert(key.into(), Value::Object(state));
        }
    }
    Value::Object(out)
}

/// `Devices` of a domain without `<devices>`: the slices virt-handler ranges over, empty.
fn devices_json_empty() -> Value {
    json!({"Disks": [], "Interfaces": [], "Channels": [], "Controllers": []})
}

fn devices_json(
    devices: Node<'_, '_>,
    pins: Option<&(PathBuf, PathBuf)>,
) -> Result<Value, DomainJsonError> {
    let count = devices.children().filter(Node::is_element).count();
    if count > MAX_DEVICES {
        return Err(DomainJsonError::TooManyDevices {
            count,
            max: MAX_DEVICES,
        });
    }
    let mut out = Map::new();
    if let Some(emulator) = child(devices, "emulator") {
        out.insert("Emulator".into(), text(emulator).into());
    }
    let disks = children(devices, "disk")
        .map(|d| disk_json(d, pins))
        .collect::<Result<Vec<_>, _>>()?;
    let interfaces = children(devices, "interface")
        .enumerate()
        .map(|(index, i)| interface_json(index, i))
        .collect::<Result<Vec<_>, _>>()?;
    let channels = children(devices, "channel")
        .map(channel_json)
        .collect::<Result<Vec<_>, _>>()?;
    let controllers: Vec<Value> = children(devices, "controller")
        .map(controller_json)
        .collect();
    out.insert("Disks".into(), disks.into());
    out.insert("Interfaces".into(), interfaces.into());
    out.insert("Channels".into(), channels.into());
    out.insert("Controllers".into(), controllers.into());
    if let Some(memory) = child(devices, "memory") {
        out.insert("Memory".into(), memory_device_json(memory)?);
    }
    Ok(Value::Object(out))
}

/// `api.Address`: every attribute is a string in Go, whatever the address type.
fn address_json(address: Node<'_, '_>) -> Value {
    let mut out = Map::new();
    for (key, attr) in [
        ("Type", "type"),
        ("Domain", "domain"),
        ("Bus", "bus"),
        ("Slot", "slot"),
        ("Function", "function"),
        ("Controller", "controller"),
        ("Target", "target"),
        ("Unit", "unit"),
        ("UUID", "uuid"),
        ("Device", "device"),
        ("CSSID", "cssid"),
        ("SSID", "ssid"),
        ("DevNo", "devno"),
    ] {
        put_attr(&mut out, key, address, attr);
    }
    Value::Object(out)
}

fn put_address(out: &mut Map<String, Value>, node: Node<'_, '_>) {
    if let Some(a) = child(node, "address") {
        out.insert("Address".into(), address_json(a));
    }
}

fn put_boot_order(
    out: &mut Map<String, Value>,
    node: Node<'_, '_>,
    element: &'static str,
) -> Result<(), DomainJsonError> {
    if let Some(boot) = child(node, "boot") {
        let order = number(element, "boot order", boot.attribute("order").unwrap_or(""))?;
        out.insert("BootOrder".into(), json!({ "Order": order }));
    }
    Ok(())
}

fn libvirt_alias<'a>(node: Node<'a, '_>) -> Option<&'a str> {
    child(node, "alias").and_then(|a| a.attribute("name"))
}

fn disk_json(
    disk: Node<'_, '_>,
    pins: Option<&(PathBuf, PathBuf)>,
) -> Result<Value, DomainJsonError> {
    let mut out = Map::new();
    out.insert(
        "Device".into(),
        disk.attribute("device").unwrap_or("").into(),
    );
    out.insert("Type".into(), disk.attribute("type").unwrap_or("").into());
    put_attr(&mut out, "Snapshot", disk, "snapshot");
    put_attr(&mut out, "Model", disk, "model");
    // `Source` and `Target` are not pointers in Go: always there, empty for an empty CD-ROM.
    let mut source = Map::new();
    if let Some(s) = child(disk, "source") {
        for (key, attr) in [
            ("Dev", "dev"),
            ("File", "file"),
            ("StartupPolicy", "startupPolicy"),
            ("Protocol", "protocol"),
            ("Name", "name"),
        ] {
            put_attr(&mut source, key, s, attr);
        }
        let pinned = s.attribute("file").and_then(|file| {
            let (pins, hotplug) = pins?;
            Some(hotplug.join(Path::new(file).strip_prefix(pins).ok()?))
        });
        if let Some(path) = pinned {
            source.insert("File".into(), path.to_string_lossy().into());
        }
    }
    out.insert("Source".into(), Value::Object(source));
    let target = child(disk, "target");
    let target_dev = target.and_then(|t| t.attribute("dev")).unwrap_or("");
    let mut target_json = Map::new();
    target_json.insert(
        "Bus".into(),
        target.and_then(|t| t.attribute("bus")).unwrap_or("").into(),
    );
    target_json.insert("Device".into(), target_dev.into());
    if let Some(t) = target {
        put_attr(&mut target_json, "Tray", t, "tray");
    }
    out.insert("Target".into(), Value::Object(target_json));
    if let Some(serial) = child(disk, "serial") {
        out.insert("Serial".into(), text(serial).into());
    }
    if let Some(driver) = child(disk, "driver") {
        let mut d = Map::new();
        d.insert("Name".into(), driver.attribute("name").unwrap_or("").into());
        d.insert("Type".into(), driver.attribute("type").unwrap_or("").into());
        put_attr(&mut d, "Cache", driver, "cache");
        put_attr(&mut d, "ErrorPolicy", driver, "error_policy");
        put_attr(&mut d, "IO", driver, "io");
        put_attr(&mut d, "Discard", driver, "discard");
        put_attr(&mut d, "IOMMU", driver, "iommu");
        put_number_attr(&mut d, "IOThread", driver, "driver", "iothread")?;
        put_number_attr(&mut d, "Queues", driver, "driver", "queues")?;
        out.insert("Driver".into(), Value::Object(d));
    }
    if child(disk, "readonly").is_some() {
        out.insert("ReadOnly".into(), json!({}));
    }
    if child(disk, "shareable").is_some() {
        out.insert("Shareable".into(), json!({}));
    }
    // virt-handler dereferences a disk's alias: one libvirt lacks is named after the target,
    // which is unique within the domain, as libvirt's own aliases are.
    let alias = libvirt_alias(disk).unwrap_or(target_dev);
    out.insert("Alias".into(), alias_json(alias));
    put_boot_order(&mut out, disk, "disk")?;
    put_address(&mut out, disk);
    Ok(Value::Object(out))
}

fn interface_json(index: usize, interface: Node<'_, '_>) -> Result<Value, DomainJsonError> {
    let mut out = Map::new();
    out.insert(
        "Type".into(),
        interface.attribute("type").unwrap_or("").into(),
    );
    put_attr(
        &mut out,
        "TrustGuestRxFilters",
        interface,
        "trustGuestRxFilters",
    );
    let mut source = Map::new();
    if let Some(s) = child(interface, "source") {
        for (key, attr) in [
            ("Network", "network"),
            ("Device", "dev"),
            ("Bridge", "bridge"),
            ("Mode", "mode"),
        ] {
            put_attr(&mut source, key, s, attr);
        }
    }
    out.insert("Source".into(), Value::Object(source));
    let target_dev = child(interface, "target").and_then(|t| t.attribute("dev"));
    if let Some(t) = child(interface, "target") {
        let mut target = Map::new();
        target.insert("Device".into(), target_dev.unwrap_or("").into());
        put_attr(&mut target, "Managed", t, "managed");
        out.insert("Target".into(), Value::Object(target));
    }
    if let Some(model) = child(interface, "model") {
        out.insert(
            "Model".into(),
            json!({"Type": model.attribute("type").unwrap_or("")}),
        );
    }
    // virt-handler reads the MAC of every interface: never absent, empty when libvirt has none.
    let mac = child(interface, "mac")
        .and_then(|m| m.attribute("address"))
        .unwrap_or("");
    out.insert("MAC".into(), json!({ "MAC": mac }));
    if let Some(mtu) = child(interface, "mtu") {
        out.insert(
            "MTU".into(),
            json!({"Size": mtu.attribute("size").unwrap_or("")}),
        );
    }
    put_boot_order(&mut out, interface, "interface")?;
    if let Some(link) = child(interface, "link") {
        out.insert(
            "LinkState".into(),
            json!({"State": link.attribute("state").unwrap_or("")}),
        );
    }
    // As for disks: an interface without libvirt's alias is named after its tap device, else
    // `net<index>`, libvirt's own scheme for interfaces.
    let alias = libvirt_alias(interface)
        .map(str::to_string)
        .or_else(|| target_dev.map(str::to_string))
        .unwrap_or_else(|| format!("net{index}"));
    out.insert("Alias".into(), alias_json(&alias));
    if let Some(driver) = child(interface, "driver") {
        let mut d = Map::new();
        d.insert("Name".into(), driver.attribute("name").unwrap_or("").into());
        put_number_attr(&mut d, "Queues", driver, "driver", "queues")?;
        put_attr(&mut d, "IOMMU", driver, "iommu");
        out.insert("Driver".into(), Value::Object(d));
    }
    if let Some(rom) = child(interface, "rom") {
        out.insert(
            "Rom".into(),
            json!({"Enabled": rom.attribute("enabled").unwrap_or("")}),
        );
    }
    if let Some(acpi) = child(interface, "acpi") {
        let index = number("acpi", "index", acpi.attribute("index").unwrap_or(""))?;
        out.insert("ACPI".into(), json!({ "Index": index }));
    }
    if let Some(backend) = child(interface, "backend") {
        let mut b = Map::new();
        put_attr(&mut b, "Type", backend, "type");
        put_attr(&mut b, "LogFile", backend, "logFile");
        out.insert("Backend".into(), Value::Object(b));
    }
    let forwards = children(interface, "portForward")
        .map(port_forward_json)
        .collect::<Result<Vec<_>, _>>()?;
    if !forwards.is_empty() {
        out.insert("PortForward".into(), forwards.into());
    }
    put_address(&mut out, interface);
    Ok(Value::Object(out))
}

fn port_forward_json(forward: Node<'_, '_>) -> Result<Value, DomainJsonError> {
    let mut out = Map::new();
    out.insert(
        "Proto".into(),
        forward.attribute("proto").unwrap_or("").into(),
    );
    put_attr(&mut out, "Address", forward, "address");
    put_attr(&mut out, "Dev", forward, "dev");
    let ranges = children(forward, "range")
        .map(|range| {
            let mut r = Map::new();
            let start = number("range", "start", range.attribute("start").unwrap_or(""))?;
            r.insert("Start".into(), start.into());
            put_number_attr(&mut r, "End", range, "range", "end")?;
            put_number_attr(&mut r, "To", range, "range", "to")?;
            put_attr(&mut r, "Exclude", range, "exclude");
            Ok(Value::Object(r))
        })
        .collect::<Result<Vec<_>, DomainJsonError>>()?;
    out.insert("Ranges".into(), ranges.into());
    Ok(Value::Object(out))
}

fn channel_json(channel: Node<'_, '_>) -> Result<Value, DomainJsonError> {
    let mut out = Map::new();
    out.insert(
        "Type".into(),
        channel.attribute("type").unwrap_or("").into(),
    );
    if let Some(source) = child(channel, "source") {
        out.insert(
            "Source".into(),
            json!({
                "Mode": source.attribute("mode").unwrap_or(""),
                "Path": source.attribute("path").unwrap_or(""),
            }),
        );
    }
    // The guest agent's channel: virt-handler reads its `State` ("connected") to know the agent.
    if let Some(target) = child(channel, "target") {
        let mut t = Map::new();
        put_attr(&mut t, "Name", target, "name");
        t.insert("Type".into(), target.attribute("type").unwrap_or("").into());
        put_attr(&mut t, "Address", target, "address");
        put_number_attr(&mut t, "Port", target, "target", "port")?;
        put_attr(&mut t, "State", target, "state");
        out.insert("Target".into(), Value::Object(t));
    }
    Ok(Value::Object(out))
}

fn controller_json(controller: Node<'_, '_>) -> Value {
    let mut out = Map::new();
    out.insert(
        "Type".into(),
        controller.attribute("type").unwrap_or("").into(),
    );
    out.insert(
        "Index".into(),
        controller.attribute("index").unwrap_or("").into(),
    );
    put_attr(&mut out, "Model", controller, "model");
    if let Some(alias) = libvirt_alias(controller) {
        out.insert("Alias".into(), alias_json(alias));
    }
    put_address(&mut out, controller);
    Value::Object(out)
}

#[cfg(test)]
mod tests;
