//! The `api.Domain` JSON virt-handler decodes, checked two ways:
//! - golden files (`tests/data/kubevirt-domain/*/live.xml` → `domain.json`): the expected JSON
//!   was written by hand from KubeVirt's schema; `VMLAUNCHER_REGENERATE_DOMAIN_JSON=1` rewrites
//!   it after a deliberate change (then review the diff as a change of the wire);
//! - every golden file against KubeVirt's Go structs (`tests/data/kubevirt-wire/api-schema.go`,
//!   parsed here): each key must be the one Go's `encoding/json` writes for a field of the
//!   struct at that place (the tag's name, else the field's; embedded structs promoted; `-`
//!   skipped), case-exact, since virt-handler's decoder is case-sensitive; and each value of the
//!   JSON kind of the field's type.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use vmlauncher::kubevirt::domain_json::{
    device_aliases, domain_json, domain_stats_json, gone_domain_json, DomainMeta, MigrationMeta,
    StatValue,
};
use vmlauncher::lifecycle::{DomainState, PowerState};

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/kubevirt-domain")
}

fn meta(name: &str, uid: &str) -> DomainMeta {
    DomainMeta {
        name: name.into(),
        namespace: "fixtures".into(),
        uid: uid.into(),
        ..DomainMeta::default()
    }
}

fn power(state: DomainState, reason: &str) -> PowerState {
    PowerState {
        state,
        reason: reason.into(),
    }
}

/// Each golden case: its directory, what the launcher knows, and libvirt's state.
fn cases() -> Vec<(&'static str, DomainMeta, Option<PowerState>)> {
    vec![
        (
            "running-cdrom-and-lun",
            DomainMeta {
                grace_period_seconds: Some(30),
                ..meta("cdrom-and-lun", "6a1d9c84-35a1-4f0e-9b51-0c0a5e4c2d11")
            },
            Some(power(DomainState::Running, "booted")),
        ),
        (
            "running-cpu-and-memory-hotplug",
            meta(
                "cpu-and-memory-hotplug",
                "3f0c8a52-77d4-4b1e-9a60-2f6d1c9e8b40",
            ),
            Some(power(DomainState::Running, "booted")),
        ),
        (
            "paused-guest-agent",
            DomainMeta {
                grace_period_seconds: Some(45),
                grace_deletion_timestamp: Some("2026-11-26T12:00:00Z".into()),
                marked_for_graceful_shutdown: Some(true),
                ..meta(
                    "cloud-init-and-empty-disk",
                    "0b7c2f4e-8d3a-4c61-a0f2-7e5d9b1c3a22",
                )
            },
            Some(power(DomainState::Paused, "ioerror")),
        ),
        (
            "shutoff-masquerade",
            DomainMeta {
                grace_period_seconds: Some(0),
                marked_for_graceful_shutdown: Some(false),
                ..meta(
                    "interface-masquerade-pod",
                    "c3e1a7b9-52d4-4f80-8e6a-19b2d0f4e733",
                )
            },
            Some(power(DomainState::Shutoff, "shutdown")),
        ),
        (
            // The source once the guest left: shut off because it migrated, the migration
            // over, as virt-handler's migration source controller reads it.
            "migrated-source",
            DomainMeta {
                grace_period_seconds: Some(30),
                migration: Some(MigrationMeta {
                    uid: "5e0c4a3b-2d1f-4e6a-9b8c-7d6e5f4a3b2c".into(),
                    start_timestamp: Some("2026-11-26T12:00:00Z".into()),
                    end_timestamp: Some("2026-11-26T12:00:09Z".into()),
                    mode: "PreCopy".into(),
                    ..MigrationMeta::default()
                }),
                ..meta("cdrom-and-lun", "6a1d9c84-35a1-4f0e-9b51-0c0a5e4c2d11")
            },
            Some(power(DomainState::Shutoff, "migrated")),
        ),
        (
            // A target while the guest comes: paused for the migration, not over yet (a null
            // EndTimestamp), an abort asked on the source meanwhile would not show here.
            "incoming-target",
            DomainMeta {
                grace_period_seconds: Some(30),
                migration: Some(MigrationMeta {
                    uid: "5e0c4a3b-2d1f-4e6a-9b8c-7d6e5f4a3b2c".into(),
                    start_timestamp: Some("2026-11-26T12:00:00Z".into()),
                    mode: "PreCopy".into(),
                    ..MigrationMeta::default()
                }),
                ..meta("cdrom-and-lun", "6a1d9c84-35a1-4f0e-9b51-0c0a5e4c2d11")
            },
            Some(power(DomainState::Paused, "migration")),
        ),
    ]
}

fn gone_meta() -> DomainMeta {
    DomainMeta {
        deletion_timestamp: Some("2026-11-26T12:05:00Z".into()),
        ..meta(
            "interface-masquerade-pod",
            "c3e1a7b9-52d4-4f80-8e6a-19b2d0f4e733",
        )
    }
}

/// Compares `actual` with the golden file at `path`, or rewrites it when regenerating.
fn golden(path: &Path, actual: &Value) {
    if std::env::var_os("VMLAUNCHER_REGENERATE_DOMAIN_JSON").is_some() {
        let text = serde_json::to_string_pretty(actual).unwrap() + "\n";
        std::fs::write(path, text).unwrap();
        return;
    }
    let expected: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert!(
        &expected == actual,
        "{} differs; produced:\n{}",
        path.display(),
        serde_json::to_string_pretty(actual).unwrap()
    );
}

#[test]
fn domains_match_their_golden_json() {
    for (dir, meta, power) in cases() {
        let dir = data().join(dir);
        let xml = std::fs::read_to_string(dir.join("live.xml")).unwrap();
        let actual = domain_json(&xml, &meta, power.as_ref())
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        golden(&dir.join("domain.json"), &actual);
    }
    golden(
        &data().join("gone-deleted.json"),
        &gone_domain_json(&gone_meta()),
    );
}

/// libvirt's bulk stats of the running cdrom-and-lun domain, as virConnectGetAllDomainStats
/// names and types them; a second disk `vdz` the domain does not have, so without an alias.
fn stats_params() -> Vec<(String, StatValue)> {
    use StatValue::{String as S, UInt as U};
    [
        ("state.state", StatValue::Int(1)),
        ("cpu.time", U(9_000_000_000)),
        ("cpu.user", U(6_000_000_000)),
        ("cpu.system", U(2_000_000_000)),
        ("balloon.current", U(262_144)),
        ("balloon.maximum", U(262_144)),
        ("balloon.unused", U(150_000)),
        ("balloon.available", U(240_000)),
        ("balloon.usable", U(200_000)),
        ("balloon.rss", U(180_000)),
        ("vcpu.current", U(1)),
        ("vcpu.maximum", U(2)),
        ("vcpu.0.state", StatValue::Int(1)),
        ("vcpu.0.time", U(8_000_000_000)),
        ("vcpu.0.wait", U(0)),
        ("net.count", U(1)),
        ("net.0.name", S("testnet0".into())),
        ("net.0.rx.bytes", U(4096)),
        ("net.0.rx.pkts", U(32)),
        ("net.0.tx.bytes", U(2048)),
        ("net.0.tx.pkts", U(16)),
        ("block.count", U(2)),
        ("block.0.name", S("sda".into())),
        ("block.0.path", S("/var/lib/images/installer.iso".into())),
        ("block.0.rd.reqs", U(100)),
        ("block.0.rd.bytes", U(409_600)),
        ("block.0.allocation", U(1_048_576)),
        ("block.0.capacity", U(1_048_576)),
        ("block.1.name", S("vdz".into())),
        ("block.1.errors", U(2)),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_string(), value))
    .collect()
}

#[test]
fn stats_match_their_golden_json() {
    let (dir, meta, power) = cases().remove(0);
    let xml = std::fs::read_to_string(data().join(dir).join("live.xml")).unwrap();
    let domain = domain_json(&xml, &meta, power.as_ref()).unwrap();
    let stats = domain_stats_json(
        domain["Spec"]["Name"].as_str().unwrap(),
        domain["Spec"]["UUID"].as_str().unwrap(),
        &stats_params(),
        &device_aliases(&domain),
    );
    golden(&data().join("stats-running-cdrom-and-lun.json"), &stats);
}

#[test]
fn golden_stats_decode_into_kubevirts_structs() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/kubevirt-wire/stats-types.go");
    let schema = Schema::parse(&std::fs::read_to_string(path).unwrap());
    let golden = data().join("stats-running-cdrom-and-lun.json");
    let json: Value = serde_json::from_str(&std::fs::read_to_string(&golden).unwrap()).unwrap();
    let errors = schema.check("DomainStats", &json);
    assert!(
        errors.is_empty(),
        "{}:\n{}",
        golden.display(),
        errors.join("\n")
    );
    // Go writes every field of these structs: none missing either.
    for (ty, value) in [
        ("DomainStatsCPU", &json["Cpu"]),
        ("DomainStatsMemory", &json["Memory"]),
        ("DomainStatsVcpu", &json["Vcpu"][0]),
        ("DomainStatsNet", &json["Net"][0]),
        ("DomainStatsBlock", &json["Block"][0]),
    ] {
        let written: Vec<&String> = value.as_object().unwrap().keys().collect();
        let expected: Vec<String> = schema.keys(ty).into_keys().collect();
        let mut written: Vec<String> = written.into_iter().cloned().collect();
        written.sort();
        assert_eq!(written, expected, "{ty}");
    }
}

/// The golden files, not the code's output: what is checked is what is on disk.
fn golden_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = cases()
        .iter()
        .map(|(dir, _, _)| data().join(dir).join("domain.json"))
        .collect();
    files.push(data().join("gone-deleted.json"));
    files
}

#[test]
fn golden_json_decodes_into_kubevirts_structs() {
    let schema = Schema::load();
    for path in golden_files() {
        let json: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let errors = schema.check("Domain", &json);
        assert!(
            errors.is_empty(),
            "{}:\n{}",
            path.display(),
            errors.join("\n")
        );
    }
}

/// virt-handler dereferences these without a nil check.
#[test]
fn every_disk_and_interface_has_an_alias_and_every_interface_a_mac() {
    for path in golden_files() {
        let json: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let devices = &json["Spec"]["Devices"];
        for disk in devices["Disks"].as_array().into_iter().flatten() {
            assert!(
                disk["Alias"]["Name"].is_string(),
                "{}: {disk}",
                path.display()
            );
        }
        for nic in devices["Interfaces"].as_array().into_iter().flatten() {
            assert!(
                nic["Alias"]["Name"].is_string(),
                "{}: {nic}",
                path.display()
            );
            assert!(nic["MAC"]["MAC"].is_string(), "{}: {nic}", path.display());
        }
    }
}

// ---- the checker: KubeVirt's Go structs as Go's encoding/json sees them ----

/// The JSON kind of a Go type.
#[derive(Debug, Clone, PartialEq)]
enum GoType {
    String,
    /// Signed or unsigned integers, floats.
    Number {
        unsigned: bool,
    },
    Bool,
    Struct(String),
    /// A type from a package we do not have (`v1.DiskBus`...): KubeVirt's are named strings
    /// and numbers, so any scalar.
    Scalar,
    Slice(Box<GoType>),
    Map(Box<GoType>),
}

#[derive(Debug, Clone)]
struct Field {
    name: String,
    ty: GoType,
    /// The `json` tag's name part: `None` untagged, `Some("")` tagged with options only.
    json_name: Option<String>,
    embedded: bool,
}

struct Schema {
    structs: BTreeMap<String, Vec<Field>>,
}

/// What Domain uses from k8s' metav1 (k8s.io/apimachinery/pkg/apis/meta/v1/types.go), with
/// its real json tags; `metav1.Time` marshals as an RFC 3339 string.
const METAV1: &str = r#"
type TypeMeta struct {
	Kind string `json:"kind,omitempty"`
	APIVersion string `json:"apiVersion,omitempty"`
}
type ObjectMeta struct {
	Name string `json:"name,omitempty"`
	GenerateName string `json:"generateName,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	SelfLink string `json:"selfLink,omitempty"`
	UID types.UID `json:"uid,omitempty"`
	ResourceVersion string `json:"resourceVersion,omitempty"`
	Generation int64 `json:"generation,omitempty"`
	CreationTimestamp metav1.Time `json:"creationTimestamp,omitempty"`
	DeletionTimestamp *metav1.Time `json:"deletionTimestamp,omitempty"`
	DeletionGracePeriodSeconds *int64 `json:"deletionGracePeriodSeconds,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	OwnerReferences []OwnerReference `json:"ownerReferences,omitempty"`
	Finalizers []string `json:"finalizers,omitempty"`
	ManagedFields []ManagedFieldsEntry `json:"managedFields,omitempty"`
}
type ListMeta struct {
	SelfLink string `json:"selfLink,omitempty"`
	ResourceVersion string `json:"resourceVersion,omitempty"`
	Continue string `json:"continue,omitempty"`
	RemainingItemCount *int64 `json:"remainingItemCount,omitempty"`
}
"#;

/// encoding/xml's `xml.Name`, which `XMLName` fields hold (no tags: Go names).
const XML: &str = r#"
type Name struct {
	Space string
	Local string
}
"#;

/// The packages whose types the schema uses as structs, each with the Go text of those types.
const SHIMS: [(&str, &str); 2] = [("metav1.", METAV1), ("xml.", XML)];

impl Schema {
    fn load() -> Schema {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/kubevirt-wire/api-schema.go");
        let go = std::fs::read_to_string(path).unwrap();
        Schema::parse(&go)
    }

    fn parse(go: &str) -> Schema {
        let mut named = BTreeMap::new();
        let mut structs = BTreeMap::new();
        // Pass 1: every type name, so that fields can tell struct types from named scalars.
        for (prefix, text) in std::iter::once(("", go)).chain(SHIMS) {
            for line in text.lines() {
                let mut words = line.split_whitespace();
                if words.next() != Some("type") {
                    continue;
                }
                let (Some(name), Some(kind)) = (words.next(), words.next()) else {
                    continue;
                };
                named.insert(format!("{prefix}{name}"), kind.to_string());
            }
        }
        for (prefix, text) in std::iter::once(("", go)).chain(SHIMS) {
            let mut current: Option<(String, Vec<Field>)> = None;
            for line in text.lines() {
                let trimmed = line.trim();
                if let Some((name, fields)) = current.take() {
                    if trimmed == "}" {
                        structs.insert(name, fields);
                    } else {
                        let mut fields = fields;
                        if let Some(f) = parse_field(trimmed, prefix, &named) {
                            fields.push(f);
                        }
                        current = Some((name, fields));
                    }
                    continue;
                }
                let words: Vec<&str> = trimmed.split_whitespace().collect();
                if words.len() >= 3 && words[0] == "type" && words[2].starts_with("struct") {
                    let name = format!("{prefix}{}", words[1]);
                    if trimmed.ends_with("struct{}") || trimmed.ends_with("struct {}") {
                        structs.insert(name, Vec::new());
                    } else {
                        current = Some((name, Vec::new()));
                    }
                }
            }
        }
        // A type with its own MarshalJSON is written as whatever that method marshals:
        // `api.Alias` marshals a `userAliasMarshal` built in its body.
        for (ty, shape) in custom_marshalers(go) {
            let fields = structs[&shape].clone();
            structs.insert(ty, fields);
        }
        Schema { structs }
    }

    /// Every way `value` fails to be the JSON of Go type `ty`, each with its JSON path.
    fn check(&self, ty: &str, value: &Value) -> Vec<String> {
        let mut errors = Vec::new();
        self.walk(&GoType::Struct(ty.into()), value, "$", &mut errors);
        errors
    }

    /// The JSON keys of a struct, each with its field's type: embedded structs without a
    /// tag name lend their keys, tagged ones are one key like any field.
    fn keys(&self, ty: &str) -> BTreeMap<String, GoType> {
        let mut keys = BTreeMap::new();
        for f in self.structs.get(ty).into_iter().flatten() {
            if !f.name.starts_with(|c: char| c.is_ascii_uppercase()) {
                continue; // unexported: encoding/json never writes it
            }
            match (f.json_name.as_deref(), &f.ty) {
                (Some("-"), _) => {}
                (None | Some(""), GoType::Struct(inner)) if f.embedded => {
                    keys.extend(self.keys(inner));
                }
                (Some(n), _) if !n.is_empty() => {
                    keys.insert(n.to_string(), f.ty.clone());
                }
                _ => {
                    keys.insert(f.name.clone(), f.ty.clone());
                }
            }
        }
        keys
    }

    fn walk(&self, ty: &GoType, value: &Value, path: &str, errors: &mut Vec<String>) {
        // Pointers, slices and maps may be null; a struct value may not, but Go's decoder
        // leaves it zero, so null is never a decode error.
        if value.is_null() {
            return;
        }
        match ty {
            GoType::String if !value.is_string() => {
                errors.push(format!("{path}: {value} is not a string"));
            }
            GoType::Number { unsigned } => match value.as_number() {
                Some(n) if *unsigned && n.as_u64().is_none() => {
                    errors.push(format!("{path}: {n} is not an unsigned integer"));
                }
                None => errors.push(format!("{path}: {value} is not a number")),
                _ => {}
            },
            GoType::Bool if !value.is_boolean() => {
                errors.push(format!("{path}: {value} is not a bool"));
            }
            GoType::Scalar if value.is_object() || value.is_array() => {
                errors.push(format!("{path}: {value} is not a scalar"));
            }
            GoType::Slice(elem) => match value.as_array() {
                Some(items) => {
                    for (i, item) in items.iter().enumerate() {
                        self.walk(elem, item, &format!("{path}[{i}]"), errors);
                    }
                }
                None => errors.push(format!("{path}: {value} is not an array")),
            },
            GoType::Map(elem) => match value.as_object() {
                Some(map) => {
                    for (k, v) in map {
                        self.walk(elem, v, &format!("{path}[{k:?}]"), errors);
                    }
                }
                None => errors.push(format!("{path}: {value} is not an object")),
            },
            GoType::Struct(name) => {
                let Some(object) = value.as_object() else {
                    errors.push(format!("{path}: {value} is not an object ({name})"));
                    return;
                };
                let keys = self.keys(name);
                for (k, v) in object {
                    match keys.get(k) {
                        Some(field_ty) => self.walk(field_ty, v, &format!("{path}.{k}"), errors),
                        None => errors.push(format!(
                            "{path}.{k}: {name} has no field written as {k:?} (it has: {})",
                            keys.keys().cloned().collect::<Vec<_>>().join(", ")
                        )),
                    }
                }
            }
            _ => {}
        }
    }
}

/// One line of a struct body: `Name Type \`tags\``, or an embedded `pkg.Type \`tags\``.
fn parse_field(line: &str, prefix: &str, named: &BTreeMap<String, String>) -> Option<Field> {
    if line.is_empty() || line.starts_with("//") {
        return None;
    }
    let (decl, tags) = match line.split_once('`') {
        Some((d, rest)) => (d.trim(), rest.trim_end_matches('`')),
        None => (line.split("//").next().unwrap().trim(), ""),
    };
    let words: Vec<&str> = decl.split_whitespace().collect();
    let (name, ty, embedded) = match words.as_slice() {
        [ty] => (
            ty.rsplit('.').next().unwrap().trim_start_matches('*'),
            *ty,
            true,
        ),
        [name, ty] => (*name, *ty, false),
        _ => panic!("unexpected struct field line: {line:?}"),
    };
    let json_name = tags.split_whitespace().find_map(|t| {
        let quoted = t.strip_prefix("json:\"")?.strip_suffix('"')?;
        Some(quoted.split(',').next().unwrap().to_string())
    });
    Some(Field {
        name: name.to_string(),
        ty: go_type(ty, prefix, named),
        json_name,
        embedded,
    })
}

fn go_type(ty: &str, prefix: &str, named: &BTreeMap<String, String>) -> GoType {
    if let Some(rest) = ty.strip_prefix('*') {
        return go_type(rest, prefix, named);
    }
    if let Some(rest) = ty.strip_prefix("[]") {
        return GoType::Slice(Box::new(go_type(rest, prefix, named)));
    }
    if let Some(rest) = ty.strip_prefix("map[") {
        let value = rest.split_once(']').unwrap().1;
        return GoType::Map(Box::new(go_type(value, prefix, named)));
    }
    match ty {
        "string" => return GoType::String,
        "bool" => return GoType::Bool,
        "int" | "int8" | "int16" | "int32" | "int64" | "float32" | "float64" => {
            return GoType::Number { unsigned: false }
        }
        "uint" | "uint8" | "uint16" | "uint32" | "uint64" => {
            return GoType::Number { unsigned: true }
        }
        // `types.UID` is a string; `metav1.Time` marshals itself as an RFC 3339 string.
        "types.UID" | "metav1.Time" => return GoType::String,
        _ => {}
    }
    let qualified = if ty.contains('.') {
        ty.to_string()
    } else {
        format!("{prefix}{ty}")
    };
    match named.get(&qualified).map(String::as_str) {
        Some(k) if k.starts_with("struct") => GoType::Struct(qualified),
        Some(underlying) => go_type(underlying, prefix, named),
        None => GoType::Scalar,
    }
}

/// `func (x T) MarshalJSON() ... { ... v := Shape{...} ... }`: each T with the struct it writes.
fn custom_marshalers(go: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for (start, _) in go.match_indices("func (") {
        let header = &go[start..];
        let Some(close) = header.find(')') else {
            continue;
        };
        let receiver = &header["func (".len()..close];
        if !header[close..].starts_with(") MarshalJSON()") {
            continue;
        }
        let ty = receiver
            .split_whitespace()
            .last()
            .unwrap()
            .trim_start_matches('*');
        let body = &header[..header.find("\n}").unwrap()];
        let literal = body
            .split(":= ")
            .nth(1)
            .and_then(|rest| rest.split('{').next())
            .unwrap_or_else(|| panic!("MarshalJSON of {ty}: no struct literal in its body"));
        found.push((ty.to_string(), literal.trim().to_string()));
    }
    found
}

// ---- the checker can fail ----

#[test]
fn the_checker_finds_keys_go_would_not_decode() {
    let schema = Schema::load();
    let good: Value = serde_json::from_str(
        &std::fs::read_to_string(data().join("running-cdrom-and-lun/domain.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(schema.check("Domain", &good), Vec::<String>::new());

    let broken = |edit: &dyn Fn(&mut Value)| {
        let mut v = good.clone();
        edit(&mut v);
        schema.check("Domain", &v)
    };
    // A lowercase Go name: decoded case-sensitively, it would be lost.
    let errors = broken(&|v| {
        let disks = v["Spec"]["Devices"]["Disks"].take();
        v["Spec"]["Devices"]["disks"] = disks;
    });
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with("$.Spec.Devices.disks: Devices has no field"),
        "{errors:?}"
    );
    // ObjectMeta is k8s', tagged in lowercase: the Go name is wrong there.
    let errors = broken(&|v| v["ObjectMeta"]["Name"] = "x".into());
    assert!(errors[0].starts_with("$.ObjectMeta.Name:"), "{errors:?}");
    // The alias is written by its MarshalJSON, not from its unexported fields.
    let errors = broken(&|v| v["Spec"]["Devices"]["Disks"][0]["Alias"]["name"] = "x".into());
    assert!(
        errors[0].starts_with("$.Spec.Devices.Disks[0].Alias.name:"),
        "{errors:?}"
    );
    // The xml tag's name is not the JSON key.
    let errors = broken(&|v| v["Spec"]["Devices"]["Disks"][0]["Target"]["dev"] = "sda".into());
    assert!(
        errors[0].starts_with("$.Spec.Devices.Disks[0].Target.dev:"),
        "{errors:?}"
    );
    // Kinds: a number where Go has a string, a string where it has a uint.
    let errors = broken(&|v| v["Spec"]["Devices"]["Controllers"][0]["Index"] = 0.into());
    assert!(errors[0].contains("is not a string"), "{errors:?}");
    let errors = broken(&|v| v["Spec"]["Memory"]["Value"] = "262144".into());
    assert!(errors[0].contains("is not a number"), "{errors:?}");
    // Promoted TypeMeta keys are there, its Go name is not.
    let errors = broken(&|v| v["TypeMeta"] = serde_json::json!({}));
    assert!(errors[0].starts_with("$.TypeMeta:"), "{errors:?}");
}

#[test]
fn the_checker_reads_tags_embedding_and_dashes_as_go_does() {
    let schema = Schema::parse(
        "type Inner struct {\n\tA string `json:\"a\"`\n}\n\
         type Outer struct {\n\tInner\n\tB int `json:\",omitempty\"`\n\tC string `json:\"-\"`\n\
         \tD string `xml:\"d,attr\"`\n\tlower string\n}\n",
    );
    let keys: Vec<String> = schema.keys("Outer").into_keys().collect();
    assert_eq!(keys, ["B", "D", "a"]);
}
