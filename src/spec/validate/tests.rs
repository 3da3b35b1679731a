//! Each validation rule by area, with the typed problem it reports at its path: a spec with one
//! thing wrong, and exactly that problem back.

use crate::spec::checks::{MacError, NameError};
use crate::spec::model::{Volume, VolumeSource};
use crate::spec::problem::Problem;
use crate::spec::quantity::QuantityError;
use crate::spec::{parse, FieldError, Validated};

/// A valid instance named `vm` with `domain` lines (indented 4) under `spec.domain` and `spec`
/// lines (indented 2) under `spec`.
fn vmi(domain: &str, spec: &str) -> String {
    crate::testing::minimal_vmi("vm", domain, spec)
}

fn problems(text: &str) -> Vec<FieldError> {
    match parse(text) {
        Ok(_) => vec![],
        Err(e) => e.0,
    }
}

fn one(path: &str, problem: impl Into<Problem>) -> Vec<FieldError> {
    vec![FieldError::new(path, problem)]
}

#[test]
fn the_base_instance_is_valid() {
    assert_eq!(problems(&vmi("", "")), vec![]);
}

#[test]
fn metadata_names_are_labels_and_hooks_are_unsupported() {
    let text = vmi("", "").replace(
        "metadata: {name: vm}",
        "metadata: {name: vm, namespace: Bad, generateName: x-, annotations: {hooks.kubevirt.io/hookSidecars: '[]'}}",
    );
    assert_eq!(
        problems(&text),
        vec![
            FieldError::new(
                "metadata.namespace",
                NameError::NotALabel { name: "Bad".into() }
            ),
            FieldError::new(
                "metadata.generateName",
                Problem::Unsupported {
                    why: "a launcher runs one VM with a fixed name"
                }
            ),
            FieldError::new(
                "metadata.annotations[hooks.kubevirt.io/hookSidecars]",
                Problem::Unsupported {
                    why: "sidecar hooks"
                }
            ),
        ]
    );
}

#[test]
fn the_api_version_must_be_v1() {
    let text = vmi("", "").replace("kubevirt.io/v1", "kubevirt.io/v1alpha3");
    assert_eq!(
        problems(&text),
        one(
            "apiVersion",
            Problem::UnsupportedApiVersion {
                version: "kubevirt.io/v1alpha3".into()
            }
        )
    );
}

#[test]
fn only_amd64_guests() {
    assert_eq!(
        problems(&vmi("", "  architecture: arm64")),
        one(
            "spec.architecture",
            Problem::UnsupportedValue {
                value: "arm64".into(),
                why: "this launcher runs amd64 guests only"
            }
        )
    );
}

#[test]
fn too_little_memory_names_the_bytes() {
    let text = vmi("", "").replace("guest: 64Mi", "guest: 1000");
    assert_eq!(
        problems(&text),
        one(
            "spec.domain.memory.guest",
            Problem::TooLittleMemory { bytes: 1000 }
        )
    );
}

#[test]
fn memory_is_required() {
    let text = vmi("", "").replace("    memory: {guest: 64Mi}\n", "    cpu: {cores: 1}\n");
    assert_eq!(
        problems(&text),
        one("spec.domain.memory.guest", Problem::NoGuestMemory)
    );
}

#[test]
fn hugepages_must_divide_the_memory() {
    let text = vmi("", "").replace(
        "memory: {guest: 64Mi}",
        "memory: {guest: 1025Mi, hugepages: {pageSize: 2Mi}}",
    );
    assert_eq!(
        problems(&text),
        one(
            "spec.domain.memory.hugepages.pageSize",
            Problem::NotPageAligned {
                guest: 1025 << 20,
                page_size: "2Mi".into()
            }
        )
    );
    let odd = vmi("", "").replace(
        "memory: {guest: 64Mi}",
        "memory: {guest: 64Mi, hugepages: {pageSize: 4Ki}}",
    );
    assert_eq!(
        problems(&odd),
        one(
            "spec.domain.memory.hugepages.pageSize",
            Problem::PageSize {
                page_size: "4Ki".into()
            }
        )
    );
}

#[test]
fn resources_are_quantities_and_extended_ones_unsupported() {
    let text = vmi(
        "    resources: {requests: {cpu: 2x, nvidia.com/gpu: 1}}",
        "",
    );
    assert_eq!(
        problems(&text),
        vec![
            FieldError::new(
                "spec.domain.resources.requests.cpu",
                QuantityError::UnknownUnit {
                    unit: "x".into(),
                    text: "2x".into()
                }
            ),
            FieldError::new(
                "spec.domain.resources.requests.nvidia.com/gpu",
                Problem::Unsupported {
                    why: "extended resources are devices of a cluster"
                }
            ),
        ]
    );
}

#[test]
fn cpu_counts_models_and_features() {
    let text = vmi(
        "    cpu: {cores: 0, model: 'bad model', features: [{name: x2apic}, {name: x2apic, policy: maybe}]}",
        "",
    );
    assert_eq!(
        problems(&text),
        vec![
            FieldError::new("spec.domain.cpu.cores", Problem::AtLeast { min: 1 }),
            FieldError::new(
                "spec.domain.cpu.model",
                Problem::CpuModel {
                    model: "bad model".into()
                }
            ),
            FieldError::new(
                "spec.domain.cpu.features[1].name",
                Problem::DuplicateCpuFeature {
                    name: "x2apic".into()
                }
            ),
            FieldError::new(
                "spec.domain.cpu.features[1].policy",
                Problem::NotOneOf {
                    value: "maybe".into(),
                    allowed: &["force", "require", "optional", "disable", "forbid"]
                }
            ),
        ]
    );
}

#[test]
fn machine_types_are_q35_or_i440fx() {
    assert_eq!(
        problems(&vmi("    machine: {type: virt}", "")),
        one(
            "spec.domain.machine.type",
            Problem::MachineType {
                machine: "virt".into()
            }
        )
    );
    assert_eq!(
        problems(&vmi("    machine: {type: pc-q35-7.2}", "")),
        vec![]
    );
}

#[test]
fn firmware_uuid_serial_and_bootloader() {
    let text = vmi(
        "    firmware: {uuid: nope, serial: '', bootloader: {bios: {}, efi: {}}}",
        "",
    );
    assert_eq!(
        problems(&text),
        vec![
            FieldError::new(
                "spec.domain.firmware.uuid",
                Problem::Uuid {
                    uuid: "nope".into()
                }
            ),
            FieldError::new(
                "spec.domain.firmware.serial",
                Problem::SmbiosSerial { serial: "".into() }
            ),
            FieldError::new(
                "spec.domain.firmware.bootloader",
                Problem::BothSet {
                    first: "bios",
                    second: "efi"
                }
            ),
        ]
    );
}

#[test]
fn secure_boot_needs_q35_and_smm() {
    let text = vmi(
        "    machine: {type: pc}\n    features: {smm: {enabled: false}}\n    firmware: {bootloader: {efi: {secureBoot: true}}}",
        "",
    );
    assert_eq!(
        problems(&text),
        vec![
            FieldError::new(
                "spec.domain.firmware.bootloader.efi.secureBoot",
                Problem::SecureBootNeedsQ35
            ),
            FieldError::new(
                "spec.domain.firmware.bootloader.efi.secureBoot",
                Problem::SecureBootNeedsSmm
            ),
        ]
    );
}

#[test]
fn a_kernel_boot_needs_absolute_host_paths() {
    let base = "spec.domain.firmware.kernelBoot.container";
    assert_eq!(
        problems(&vmi("    firmware: {kernelBoot: {kernelArgs: x}}", "")),
        one(base, Problem::KernelBootNeedsContainer)
    );
    assert_eq!(
        problems(&vmi(
            "    firmware: {kernelBoot: {container: {initrdPath: initrd}}}",
            ""
        )),
        vec![
            FieldError::new(format!("{base}.kernelPath"), Problem::Required),
            FieldError::new(
                format!("{base}.initrdPath"),
                Problem::NotAbsolute {
                    path: "initrd".into()
                }
            ),
        ]
    );
}

#[test]
fn hyperv_spinlocks_and_vendor_id() {
    let text = vmi(
        "    features: {hyperv: {spinlocks: {spinlocks: 100}, vendorid: {vendorid: thirteen-chars}}}",
        "",
    );
    assert_eq!(
        problems(&text),
        vec![
            FieldError::new(
                "spec.domain.features.hyperv.spinlocks.spinlocks",
                Problem::AtLeast { min: 4096 }
            ),
            FieldError::new(
                "spec.domain.features.hyperv.vendorid.vendorid",
                Problem::VendorId {
                    id: "thirteen-chars".into()
                }
            ),
        ]
    );
}

#[test]
fn clock_offsets_and_timers() {
    let text = vmi(
        "    clock: {utc: {}, timezone: 'Not A Zone', timer: {kvm: {tickPolicy: delay}, hpet: {track: guest}, rtc: {track: moon}}}",
        "",
    );
    assert_eq!(
        problems(&text),
        vec![
            FieldError::new(
                "spec.domain.clock",
                Problem::BothSet {
                    first: "utc",
                    second: "timezone"
                }
            ),
            FieldError::new(
                "spec.domain.clock.timezone",
                Problem::TimeZone {
                    zone: "Not A Zone".into()
                }
            ),
            FieldError::new("spec.domain.clock.timer.hpet.track", Problem::TrackNotRtc),
            FieldError::new(
                "spec.domain.clock.timer.kvm.tickPolicy",
                Problem::NoTickPolicy { timer: "kvm" }
            ),
            FieldError::new(
                "spec.domain.clock.timer.rtc.track",
                Problem::NotOneOf {
                    value: "moon".into(),
                    allowed: &["guest", "wall"]
                }
            ),
        ]
    );
}

const ONE_DISK_VOLUME: &str = "  volumes: [{name: d, emptyDisk: {capacity: 1Gi}}]";

#[test]
fn a_disk_has_one_kind_and_iothreads_are_for_virtio() {
    let text = vmi(
        "    devices: {disks: [{name: d, disk: {bus: scsi}, cdrom: {}, dedicatedIOThread: true}]}",
        ONE_DISK_VOLUME,
    );
    assert_eq!(
        problems(&text),
        vec![
            FieldError::new(
                "spec.domain.devices.disks[0]",
                Problem::OnlyOneOf {
                    fields: "disk, cdrom, lun"
                }
            ),
            FieldError::new(
                "spec.domain.devices.disks[0].dedicatedIOThread",
                Problem::IoThreadNeedsVirtio
            ),
        ]
    );
}

#[test]
fn a_read_only_sata_disk_is_refused() {
    let text = vmi(
        "    devices: {disks: [{name: d, disk: {bus: sata, readonly: true}}]}",
        ONE_DISK_VOLUME,
    );
    assert_eq!(
        problems(&text),
        one(
            "spec.domain.devices.disks[0].disk.readonly",
            Problem::ReadOnlySata
        )
    );
}

#[test]
fn boot_orders_start_at_one() {
    let text = vmi(
        "    devices: {disks: [{name: d, bootOrder: 0}]}",
        ONE_DISK_VOLUME,
    );
    assert_eq!(
        problems(&text),
        one(
            "spec.domain.devices.disks[0].bootOrder",
            Problem::AtLeast { min: 1 }
        )
    );
}

const POD_NETWORK: &str = "  networks: [{name: default, pod: {}}]";

#[test]
fn an_interface_needs_a_network_and_one_binding() {
    let text = vmi(
        "    devices: {interfaces: [{name: default}, {name: other, masquerade: {}, bridge: {}}]}",
        POD_NETWORK,
    );
    assert_eq!(
        problems(&text),
        vec![
            FieldError::new(
                "spec.domain.devices.interfaces[0]",
                Problem::Missing {
                    what: "an interface",
                    needs: "a binding",
                    supported: "masquerade, bridge"
                }
            ),
            FieldError::new(
                "spec.domain.devices.interfaces[1].name",
                Problem::NoPartner {
                    what: "interface",
                    name: "other".into(),
                    partner: "network"
                }
            ),
            FieldError::new("spec.domain.devices.interfaces[1]", Problem::OneBinding),
        ]
    );
}

#[test]
fn a_multus_interface_is_not_masquerade_and_a_state_is_up_down_or_absent() {
    let text = vmi(
        "    devices: {interfaces: [{name: default, masquerade: {}, state: gone}, {name: m, masquerade: {}}, {name: b, bridge: {}, state: absent}]}",
        "  networks: [{name: default, pod: {}}, {name: m, multus: {networkName: x}}, {name: b, multus: {networkName: y}}]",
    );
    assert_eq!(
        problems(&text),
        vec![
            FieldError::new(
                "spec.domain.devices.interfaces[0].state",
                Problem::NotOneOf {
                    value: "gone".into(),
                    allowed: &["up", "down", "absent"]
                }
            ),
            FieldError::new(
                "spec.domain.devices.interfaces[1].masquerade",
                Problem::MasqueradeNotPod
            ),
        ]
    );
}

#[test]
fn networks_need_a_pod_source_and_an_interface() {
    let text = vmi(
        "",
        "  networks: [{name: default, pod: {}}, {name: second, pod: {}}, {name: empty}, {name: m, multus: {networkName: \"\", default: true}}]",
    );
    assert_eq!(
        problems(&text),
        vec![
            FieldError::new(
                "spec.networks[2]",
                Problem::Missing {
                    what: "a network",
                    needs: "a source",
                    supported: "pod"
                }
            ),
            FieldError::new("spec.networks[3].multus.networkName", Problem::Required),
            FieldError::new(
                "spec.networks[3].multus.default",
                Problem::Unsupported {
                    why: "Multus as the default network; the pod network is"
                }
            ),
            FieldError::new("spec.networks", Problem::SecondPodNetwork),
            FieldError::new(
                "spec.networks",
                Problem::NoPartner {
                    what: "network",
                    name: "default".into(),
                    partner: "interface"
                }
            ),
            FieldError::new(
                "spec.networks",
                Problem::NoPartner {
                    what: "network",
                    name: "empty".into(),
                    partner: "interface"
                }
            ),
            FieldError::new(
                "spec.networks",
                Problem::NoPartner {
                    what: "network",
                    name: "m".into(),
                    partner: "interface"
                }
            ),
            FieldError::new(
                "spec.networks",
                Problem::NoPartner {
                    what: "network",
                    name: "second".into(),
                    partner: "interface"
                }
            ),
        ]
    );
}

#[test]
fn a_mac_address_is_unicast() {
    let text = vmi(
        "    devices: {interfaces: [{name: default, masquerade: {}, macAddress: 'zz'}]}",
        POD_NETWORK,
    );
    assert_eq!(
        problems(&text),
        one(
            "spec.domain.devices.interfaces[0].macAddress",
            MacError::Malformed { mac: "zz".into() }
        )
    );
}

#[test]
fn inputs_and_the_watchdog() {
    let text = vmi(
        "    devices: {inputs: [{name: t, type: mouse}, {name: t, type: tablet, bus: ps2}], watchdog: {name: w}}",
        "",
    );
    assert_eq!(
        problems(&text),
        vec![
            FieldError::new(
                "spec.domain.devices.inputs[0].type",
                Problem::NotOneOf {
                    value: "mouse".into(),
                    allowed: &["tablet", "keyboard"]
                }
            ),
            FieldError::new(
                "spec.domain.devices.inputs[1].name",
                Problem::Duplicate {
                    what: "input",
                    name: "t".into()
                }
            ),
            FieldError::new(
                "spec.domain.devices.inputs[1].bus",
                Problem::NotOneOf {
                    value: "ps2".into(),
                    allowed: &["usb", "virtio"]
                }
            ),
            FieldError::new(
                "spec.domain.devices.watchdog",
                Problem::Missing {
                    what: "a watchdog",
                    needs: "a model",
                    supported: "i6300esb"
                }
            ),
        ]
    );
}

#[test]
fn a_volume_has_exactly_one_supported_source() {
    let text = vmi(
        "",
        "  volumes: [{name: none}, {name: two, emptyDisk: {capacity: 1Gi}, containerDisk: {image: x}}, {name: cm, configMap: {name: c}}]",
    );
    assert_eq!(
        problems(&text),
        vec![
            FieldError::new(
                "spec.volumes[0]",
                Problem::Missing {
                    what: "a volume",
                    needs: "a source",
                    supported: "hostDisk, persistentVolumeClaim, dataVolume, containerDisk, emptyDisk, ephemeral, cloudInitNoCloud"
                }
            ),
            FieldError::new(
                "spec.volumes[1]",
                Problem::OneSource {
                    found: vec!["containerDisk", "emptyDisk"]
                }
            ),
            FieldError::new(
                "spec.volumes[2].configMap",
                Problem::Unsupported {
                    why: "only block-device volume sources are"
                }
            ),
        ]
    );
}

#[test]
fn volume_sources_are_checked_by_kind() {
    let text = vmi(
        "",
        "  volumes: [{name: a, emptyDisk: {capacity: '0'}}, {name: b, containerDisk: {image: ''}}, {name: c, persistentVolumeClaim: {claimName: Bad_Claim}}]",
    );
    assert_eq!(
        problems(&text),
        vec![
            FieldError::new("spec.volumes[0].emptyDisk.capacity", Problem::Zero),
            FieldError::new("spec.volumes[1].containerDisk.image", Problem::Required),
            FieldError::new(
                "spec.volumes[2].persistentVolumeClaim.claimName",
                NameError::NotASubdomain {
                    name: "Bad_Claim".into()
                }
            ),
        ]
    );
}

#[test]
fn cloud_init_has_user_data_once() {
    let text = vmi(
        "",
        "  volumes: [{name: a, cloudInitNoCloud: {networkData: x, networkDataBase64: eA==}}, {name: b, cloudInitNoCloud: {userData: x, userDataBase64: eA==}}]",
    );
    assert_eq!(
        problems(&text),
        vec![
            FieldError::new(
                "spec.volumes[0].cloudInitNoCloud",
                Problem::EitherRequired {
                    first: "userData",
                    second: "userDataBase64"
                }
            ),
            FieldError::new(
                "spec.volumes[0].cloudInitNoCloud",
                Problem::BothSet {
                    first: "networkData",
                    second: "networkDataBase64"
                }
            ),
            FieldError::new(
                "spec.volumes[1].cloudInitNoCloud",
                Problem::BothSet {
                    first: "userData",
                    second: "userDataBase64"
                }
            ),
        ]
    );
}

#[test]
fn an_instance_built_in_code_is_validated_too() {
    let mut vmi = parse(&vmi("", ONE_DISK_VOLUME)).unwrap().into_inner();
    vmi.spec.volumes.push(Volume {
        name: "spare".into(),
        empty_disk: vmi.spec.volumes[0].empty_disk.clone(),
        ..Volume::default()
    });
    let err = Validated::new(vmi).unwrap_err();
    assert_eq!(
        err.0,
        one(
            "spec.volumes[1].name",
            Problem::UnusedVolume {
                name: "spare".into()
            }
        )
    );
}

#[test]
fn a_validated_instance_pairs_each_disk_with_its_volume() {
    let text = vmi(
        "    devices: {disks: [{name: b}, {name: a, cdrom: {}}]}",
        "  volumes: [{name: a, emptyDisk: {capacity: 1Gi}}, {name: b, hostDisk: {path: /b, type: Disk}}]",
    );
    let validated = parse(&text).unwrap();
    let pairs: Vec<(usize, &str, &str, bool)> = validated
        .disks()
        .map(|(i, d, v, s)| {
            (
                i,
                d.name.as_str(),
                v.name.as_str(),
                matches!(s, VolumeSource::HostDisk(_)),
            )
        })
        .collect();
    assert_eq!(pairs, [(0, "b", "b", true), (1, "a", "a", false)]);
    assert_eq!(validated.guest_memory(), 64 << 20);
}
