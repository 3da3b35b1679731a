//! The domain's vCPUs and memory as KubeVirt's `api.DomainSpec` has them: what virt-handler
//! reads of a VM with room for CPU and memory hotplug (`VCPUs`, `MaxMemory`, the NUMA cell and
//! the virtio-mem device), beside the topology and sizes every domain has.

use roxmltree::Node;
use serde_json::{json, Map, Value};

use super::{
    address_json, alias_json, child, children, libvirt_alias, number, put_attr, put_number_attr,
    text, DomainJsonError,
};

pub(super) fn memory_json(
    node: Node<'_, '_>,
    element: &'static str,
) -> Result<Value, DomainJsonError> {
    Ok(json!({
        "Value": number(element, "size", &text(node))?,
        "Unit": node.attribute("unit").unwrap_or(""),
    }))
}

/// `api.MaxMemory`: the size and the slots for memory devices.
pub(super) fn max_memory_json(node: Node<'_, '_>) -> Result<Value, DomainJsonError> {
    let mut out = memory_json(node, "maxMemory")?;
    let slots = match node.attribute("slots") {
        Some(v) => number("maxMemory", "slots", v)?,
        None => 0,
    };
    out["Slots"] = slots.into();
    Ok(out)
}

/// `api.VCPUs`: each vCPU of the room, enabled or not, hot-pluggable or not. Go writes every
/// field (`Order` 0 for a vCPU that has none: a disabled one).
pub(super) fn vcpus_json(vcpus: Node<'_, '_>) -> Result<Value, DomainJsonError> {
    let each = children(vcpus, "vcpu")
        .map(|vcpu| {
            let number_or_zero = |attr: &'static str| match vcpu.attribute(attr) {
                Some(v) => number("vcpus", attr, v),
                None => Ok(0),
            };
            Ok(json!({
                "ID": number_or_zero("id")?,
                "Enabled": vcpu.attribute("enabled").unwrap_or(""),
                "Hotpluggable": vcpu.attribute("hotpluggable").unwrap_or(""),
                "Order": number_or_zero("order")?,
            }))
        })
        .collect::<Result<Vec<_>, DomainJsonError>>()?;
    Ok(json!({ "VCPU": each }))
}

pub(super) fn cpu_json(cpu: Node<'_, '_>) -> Result<Value, DomainJsonError> {
    let mut out = Map::new();
    put_attr(&mut out, "Mode", cpu, "mode");
    if let Some(model) = child(cpu, "model") {
        out.insert("Model".into(), text(model).into());
    }
    if let Some(topology) = child(cpu, "topology") {
        let mut t = Map::new();
        // `dies` is not in KubeVirt's CPUTopology: Go drops it, so do we.
        for (key, attr) in [
            ("Sockets", "sockets"),
            ("Cores", "cores"),
            ("Threads", "threads"),
        ] {
            put_number_attr(&mut t, key, topology, "topology", attr)?;
        }
        out.insert("Topology".into(), Value::Object(t));
    }
    if let Some(numa) = child(cpu, "numa") {
        let cells = children(numa, "cell")
            .map(|cell| {
                let mut c = Map::new();
                put_attr(&mut c, "ID", cell, "id");
                put_attr(&mut c, "CPUs", cell, "cpus");
                put_number_attr(&mut c, "Memory", cell, "cell", "memory")?;
                put_attr(&mut c, "Unit", cell, "unit");
                put_attr(&mut c, "MemoryAccess", cell, "memAccess");
                Ok(Value::Object(c))
            })
            .collect::<Result<Vec<_>, DomainJsonError>>()?;
        out.insert("NUMA".into(), json!({ "Cells": cells }));
    }
    Ok(Value::Object(out))
}

/// `api.MemoryDevice`: the virtio-mem device, its `Requested` size what the owner asked for
/// and `Current` what the guest has.
pub(super) fn memory_device_json(memory: Node<'_, '_>) -> Result<Value, DomainJsonError> {
    let mut out = Map::new();
    put_attr(&mut out, "Model", memory, "model");
    if let Some(target) = child(memory, "target") {
        let mut t = Map::new();
        for (key, tag) in [
            ("Size", "size"),
            ("Requested", "requested"),
            ("Current", "current"),
            ("Block", "block"),
        ] {
            if let Some(m) = child(target, tag) {
                t.insert(key.into(), memory_json(m, "memory")?);
            }
        }
        if let Some(node) = child(target, "node") {
            t.insert("Node".into(), text(node).into());
        }
        out.insert("Target".into(), Value::Object(t));
    }
    if let Some(alias) = libvirt_alias(memory) {
        out.insert("Alias".into(), alias_json(alias));
    }
    if let Some(address) = child(memory, "address") {
        out.insert("Address".into(), address_json(address));
    }
    Ok(Value::Object(out))
}
