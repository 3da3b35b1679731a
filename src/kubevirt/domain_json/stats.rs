//! KubeVirt's `stats.DomainStats` as JSON (what `GetDomainStats` returns), from libvirt's bulk
//! stats (`virConnectGetAllDomainStats`: typed parameters named `cpu.time`, `vcpu.0.state`,
//! `net.1.rx.bytes`...). KubeVirt fills the struct through libvirt-go, which turns each
//! parameter into a field and a `...Set` flag; its fields have no JSON tags, so the keys are the
//! Go names, and since none is `omitempty` Go writes every one: so do we, zero and unset.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

/// The value of one typed parameter of libvirt's bulk stats.
#[derive(Debug, Clone, PartialEq)]
pub enum StatValue {
    Int(i64),
    UInt(u64),
    Float(f64),
    Bool(bool),
    String(String),
}

impl StatValue {
    fn to_json(&self) -> Value {
        match self {
            StatValue::Int(v) => (*v).into(),
            StatValue::UInt(v) => (*v).into(),
            StatValue::Float(v) => json!(v),
            StatValue::Bool(v) => (*v).into(),
            StatValue::String(v) => v.clone().into(),
        }
    }
}

impl From<crate::libvirt::TypedValue> for StatValue {
    fn from(v: crate::libvirt::TypedValue) -> StatValue {
        use crate::libvirt::TypedValue as T;
        match v {
            T::Int(v) => StatValue::Int(v),
            T::UInt(v) => StatValue::UInt(v),
            T::Float(v) => StatValue::Float(v),
            T::Bool(v) => StatValue::Bool(v),
            T::String(v) => StatValue::String(v),
        }
    }
}

/// vCPUs, interfaces and disks are numbered densely from 0; a larger index is not libvirt's and
/// would make us allocate that many entries.
pub const MAX_STAT_INDEX: usize = 4096;

/// libvirt's name after the group's prefix, KubeVirt's field, and whether it is a string.
type Fields = &'static [(&'static str, &'static str, bool)];

const CPU: Fields = &[
    ("time", "Time", false),
    ("user", "User", false),
    ("system", "System", false),
];
const VCPU: Fields = &[
    ("state", "State", false),
    ("time", "Time", false),
    ("wait", "Wait", false),
    ("delay", "Delay", false),
];
const NET: Fields = &[
    ("name", "Name", true),
    ("rx.bytes", "RxBytes", false),
    ("rx.pkts", "RxPkts", false),
    ("rx.errs", "RxErrs", false),
    ("rx.drop", "RxDrop", false),
    ("tx.bytes", "TxBytes", false),
    ("tx.pkts", "TxPkts", false),
    ("tx.errs", "TxErrs", false),
    ("tx.drop", "TxDrop", false),
];
const BLOCK: Fields = &[
    ("name", "Name", true),
    ("backingIndex", "BackingIndex", false),
    ("path", "Path", true),
    ("rd.reqs", "RdReqs", false),
    ("rd.bytes", "RdBytes", false),
    ("rd.times", "RdTimes", false),
    ("wr.reqs", "WrReqs", false),
    ("wr.bytes", "WrBytes", false),
    ("wr.times", "WrTimes", false),
    ("fl.reqs", "FlReqs", false),
    ("fl.times", "FlTimes", false),
    ("errors", "Errors", false),
    ("allocation", "Allocation", false),
    ("capacity", "Capacity", false),
    ("physical", "Physical", false),
];
/// KubeVirt reads memory from `virDomainMemoryStats` and `balloon.current`; the bulk stats'
/// `balloon.*` are the same numbers (KiB). `balloon.current` is both KubeVirt's `Total` and the
/// memory stats' actual balloon.
const MEMORY: Fields = &[
    ("unused", "Unused", false),
    ("disk_caches", "Cached", false),
    ("available", "Available", false),
    ("current", "ActualBalloon", false),
    ("rss", "RSS", false),
    ("swap_in", "SwapIn", false),
    ("swap_out", "SwapOut", false),
    ("major_fault", "MajorFault", false),
    ("minor_fault", "MinorFault", false),
    ("usable", "Usable", false),
    ("current", "Total", false),
];
const DIRTY_RATE: Fields = &[
    ("calc_status", "CalcStatus", false),
    ("calc_start_time", "CalcStartTime", false),
    ("calc_period", "CalcPeriod", false),
    ("megabytes_per_second", "MegabytesPerSecond", false),
];

/// A group's struct with every field unset, as Go writes a fresh one.
fn unset(fields: Fields) -> Map<String, Value> {
    let mut out = Map::new();
    for (_, field, is_string) in fields {
        out.insert(format!("{field}Set"), false.into());
        let zero = if *is_string { json!("") } else { json!(0) };
        out.insert((*field).to_string(), zero);
    }
    out
}

/// Sets every field of `fields` that `name` (the parameter's name after the group's prefix)
/// stands for; false when it stands for none.
fn set(out: &mut Map<String, Value>, fields: Fields, name: &str, value: &StatValue) -> bool {
    let mut found = false;
    for (libvirt, field, _) in fields {
        if *libvirt == name {
            out.insert(format!("{field}Set"), true.into());
            out.insert((*field).to_string(), value.to_json());
            found = true;
        }
    }
    found
}

/// `vcpu.3.time` under prefix `vcpu.`: `(3, "time")`.
fn indexed<'a>(name: &'a str, prefix: &str) -> Option<(usize, &'a str)> {
    let (index, rest) = name.strip_prefix(prefix)?.split_once('.')?;
    let index: usize = index.parse().ok()?;
    (index < MAX_STAT_INDEX).then_some((index, rest))
}

/// The entry `index` of a list of groups, made (with its predecessors) when first seen.
fn entry(
    list: &mut Vec<Map<String, Value>>,
    index: usize,
    fields: Fields,
) -> &mut Map<String, Value> {
    while list.len() <= index {
        list.push(unset(fields));
    }
    &mut list[index]
}

/// The device aliases KubeVirt puts on interface and disk stats, by target device (`tap0`,
/// `vda`), read from a domain's JSON ([`super::domain_json`]); names without the `ua-` prefix,
/// as KubeVirt's `Alias.GetName` gives them.
pub fn device_aliases(domain: &Value) -> BTreeMap<String, String> {
    let devices = &domain["Spec"]["Devices"];
    let mut aliases = BTreeMap::new();
    for list in ["Interfaces", "Disks"] {
        for device in devices[list].as_array().into_iter().flatten() {
            let target = device["Target"]["Device"].as_str().unwrap_or("");
            if let (false, Some(alias)) = (target.is_empty(), device["Alias"]["Name"].as_str()) {
                aliases.insert(target.to_string(), alias.to_string());
            }
        }
    }
    aliases
}

/// `stats.DomainStats` of one domain from its bulk stats `params`, with interface and disk
/// aliases from `aliases` (target device → alias, see [`device_aliases`]). Parameters KubeVirt
/// does not read are ignored; `Cpu` and `DirtyRate` are null when libvirt sent none of theirs,
/// as libvirt-go leaves them nil. `CPUMap` (pinning, not a bulk stat), `Load` (the guest agent)
/// and `MigrateDomainJobInfo` are not the bulk stats' to give: unset.
pub fn domain_stats_json(
    name: &str,
    uuid: &str,
    params: &[(String, StatValue)],
    aliases: &BTreeMap<String, String>,
) -> Value {
    let mut cpu = unset(CPU);
    let mut cpu_seen = false;
    let mut memory = unset(MEMORY);
    let mut dirty_rate = unset(DIRTY_RATE);
    let mut dirty_rate_seen = false;
    let mut vcpus = Vec::new();
    let mut nets = Vec::new();
    let mut blocks = Vec::new();
    // libvirt-go sizes the lists by these counts (vCPUs by the maximum, so offline ones are
    // there, unset), before reading the indexed parameters.
    for (param, value) in params {
        let (list, fields) = match param.as_str() {
            "vcpu.maximum" => (&mut vcpus, VCPU),
            "net.count" => (&mut nets, NET),
            "block.count" => (&mut blocks, BLOCK),
            _ => continue,
        };
        if let StatValue::UInt(n) = value {
            let n = usize::try_from(*n)
                .unwrap_or(usize::MAX)
                .min(MAX_STAT_INDEX);
            if n > 0 {
                entry(list, n - 1, fields);
            }
        }
    }
    for (param, value) in params {
        if let Some(rest) = param.strip_prefix("cpu.") {
            cpu_seen |= set(&mut cpu, CPU, rest, value);
        } else if let Some(rest) = param.strip_prefix("balloon.") {
            set(&mut memory, MEMORY, rest, value);
        } else if let Some(rest) = param.strip_prefix("dirtyrate.") {
            dirty_rate_seen |= set(&mut dirty_rate, DIRTY_RATE, rest, value);
        } else if let Some((i, rest)) = indexed(param, "vcpu.") {
            set(entry(&mut vcpus, i, VCPU), VCPU, rest, value);
        } else if let Some((i, rest)) = indexed(param, "net.") {
            set(entry(&mut nets, i, NET), NET, rest, value);
        } else if let Some((i, rest)) = indexed(param, "block.") {
            set(entry(&mut blocks, i, BLOCK), BLOCK, rest, value);
        }
    }
    // KubeVirt names the device by its alias when the domain has one for that target; only
    // interfaces say whether it did (their `AliasSet`).
    for net in &mut nets {
        let alias = net["Name"].as_str().and_then(|n| aliases.get(n)).cloned();
        net.insert("AliasSet".into(), alias.is_some().into());
        net.insert("Alias".into(), alias.unwrap_or_default().into());
    }
    for block in &mut blocks {
        let alias = block["Name"].as_str().and_then(|n| aliases.get(n)).cloned();
        block.insert("Alias".into(), alias.unwrap_or_default().into());
    }
    json!({
        "Name": name,
        "UUID": uuid,
        "Cpu": if cpu_seen { Value::Object(cpu) } else { Value::Null },
        "Memory": memory,
        "MigrateDomainJobInfo": null,
        "Vcpu": vcpus,
        "Net": nets,
        "Block": blocks,
        "CPUMapSet": false,
        "CPUMap": null,
        "DirtyRate": if dirty_rate_seen { Value::Object(dirty_rate) } else { Value::Null },
        "Load": null,
    })
}
