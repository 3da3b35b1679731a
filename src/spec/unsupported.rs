//! The KubeVirt fields this launcher parses but does not implement, each with why, in one table
//! per part of the manifest. The model declares each field (so that a manifest using it parses);
//! this table is the only other place that names it. Validation calls [`check`] once per part,
//! where it walks that part, so every field present is reported as `<path>.<field>: unsupported
//! (<why>)` in table order among the part's other problems.

use super::model::{
    CdromTarget, CloudInitNoCloud, ContainerDisk, Cpu, Devices, Disk, DiskTarget, DomainSpec, Efi,
    Features, Firmware, Interface, LunTarget, ObjectMeta, PodNetwork, Resources,
    VirtualMachineSpec, VmiSpec,
};
use super::problem::Problems;

/// A part of the manifest with KubeVirt fields outside the subset.
pub(super) trait UnsupportedFields {
    /// Each such field by its manifest name: whether it is present, and why it is unsupported.
    fn unsupported_fields(&self) -> Vec<(String, bool, &'static str)>;
}

impl<T: UnsupportedFields> UnsupportedFields for &T {
    fn unsupported_fields(&self) -> Vec<(String, bool, &'static str)> {
        (*self).unsupported_fields()
    }
}

/// Reports every unsupported field present in `part`, the part of the manifest at `base`.
pub(super) fn check(e: &mut Problems, base: &str, part: &impl UnsupportedFields) {
    let fields = part.unsupported_fields();
    let fields: Vec<_> = fields
        .iter()
        .map(|(name, present, why)| (name.as_str(), *present, *why))
        .collect();
    e.unsupported(base, &fields);
}

/// An interface's bindings this launcher does not provide (it provides masquerade and bridge).
pub(super) struct Bindings<'a>(pub(super) &'a Interface);

impl std::ops::Deref for Bindings<'_> {
    type Target = Interface;
    fn deref(&self) -> &Interface {
        self.0
    }
}

/// `block_size` → `blockSize`: serde's `rename_all = "camelCase"` for a field name.
fn camel_case(field: &str) -> String {
    let mut name = String::with_capacity(field.len());
    let mut upper = false;
    for c in field.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            name.push(c.to_ascii_uppercase());
            upper = false;
        } else {
            name.push(c);
        }
    }
    name
}

/// `Type { field: "why", field as "manifestName": "why", ... }`: the manifest name is the
/// field's camelCase unless the model renames it.
macro_rules! unsupported_fields {
    ($($part:ty { $($field:ident $(as $name:literal)?: $why:literal,)+ })+) => {$(
        impl UnsupportedFields for $part {
            fn unsupported_fields(&self) -> Vec<(String, bool, &'static str)> {
                vec![$((
                    None::<&str>$(.or(Some($name)))?
                        .map(String::from)
                        .unwrap_or_else(|| camel_case(stringify!($field))),
                    self.$field.is_some(),
                    $why,
                ),)+]
            }
        }
    )+};
}

unsupported_fields! {
    ObjectMeta {
        generate_name: "a launcher runs one VM with a fixed name",
    }
    VirtualMachineSpec {
        data_volume_templates: "DataVolumes are imported by CDI in a cluster",
        instancetype: "instance types are expanded by the cluster",
        preference: "preferences are expanded by the cluster",
        update_volumes_strategy: "volume migration",
    }
    VmiSpec {
        subdomain: "cluster DNS",
        dns_policy: "pod DNS",
        dns_config: "pod DNS",
        liveness_probe: "probes",
        readiness_probe: "probes",
        access_credentials: "credential propagation needs the guest agent",
        start_strategy: "paused starts",
        resource_claims: "dynamic resource allocation",
        preference: "preferences are expanded by the cluster",
    }
    DomainSpec {
        io_threads: "supplemental iothread pools",
        chassis: "SMBIOS chassis",
        launch_security: "confidential computing",
    }
    Resources {
        overcommit_guest_overhead: "pod memory accounting",
    }
    Cpu {
        numa: "guest NUMA mapping",
        realtime: "realtime scheduling",
    }
    Firmware {
        acpi: "ACPI tables from volumes",
    }
    Efi {
        persistent: "EFI variables kept across restarts need a persistent volume",
    }
    Features {
        hyperv_passthrough: "host Hyper-V passthrough",
    }
    Devices {
        gpus: "device passthrough",
        host_devices: "device passthrough",
        filesystems: "virtiofs",
        sound: "sound devices",
        client_passthrough: "USB redirection",
        use_virtio_transitional: "virtio 0.9 devices",
        block_multi_queue: "multi-queue block",
        network_interface_multiqueue: "multi-queue network",
        autoattach_vsock as "autoattachVSOCK": "vsock",
        autoattach_input_device: "list the input in spec.domain.devices.inputs",
        log_serial_console: "the launcher always logs the serial console",
        downward_metrics: "downward metrics",
        panic_devices: "panic devices",
        video: "the video model is chosen with the graphics device",
    }
    Disk {
        block_size: "custom block sizes",
        tag: "device tags need the guest agent",
    }
    DiskTarget {
        pci_address: "fixed PCI addresses",
    }
    CdromTarget {
        tray: "an open tray",
    }
    LunTarget {
        reservation: "persistent reservations",
    }
    Interface {
        pci_address: "fixed PCI addresses",
        dhcp_options: "custom DHCP options",
        tag: "device tags need the guest agent",
        acpi_index: "ACPI indexes",
    }
    Bindings<'_> {
        sriov: "SR-IOV needs a VF from the node",
        slirp: "the slirp binding was removed from KubeVirt",
        passt: "the passt binding",
        macvtap: "the macvtap binding",
        binding: "network binding plugins",
    }
    PodNetwork {
        vm_network_cidr as "vmNetworkCIDR": "custom masquerade subnets",
        vm_ipv6_network_cidr as "vmIPv6NetworkCIDR": "custom masquerade subnets",
    }
    ContainerDisk {
        path: "the image file is found by KubeVirt's convention",
        hotpluggable: "hot-plugged container disks",
    }
    CloudInitNoCloud {
        secret_ref: "Secrets live in a cluster",
        network_data_secret_ref: "Secrets live in a cluster",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_names_are_serde_camel_case_or_the_models_rename() {
        let names: Vec<String> = Devices::default()
            .unsupported_fields()
            .into_iter()
            .map(|(name, _, _)| name)
            .collect();
        assert!(names.contains(&"networkInterfaceMultiqueue".to_string()));
        assert!(names.contains(&"autoattachVSOCK".to_string()));
        assert_eq!(camel_case("block_size"), "blockSize");
        assert_eq!(camel_case("tray"), "tray");
    }
}
