//! Conversion end to end: a parsed spec in, the domain model (and its XML) out.

use std::net::Ipv4Addr;

use super::network::DEFAULT_INTERFACE;
use super::*;
use crate::domain::{InterfaceBackend, PortForward};

fn vmi(text: &str) -> Validated {
    spec::parse(text).unwrap()
}

fn opts() -> ConvertOptions {
    ConvertOptions::new(VirtType::Qemu, "/run/vml/console.log".into())
}

const SPEC: &str = r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: testvm
  namespace: ns1
  uid: 6a1c2f0e-8a57-4f4e-9d43-0c1e54a1b2c3
spec:
  domain:
    cpu: {cores: 2}
    memory: {guest: 128Mi}
    firmware:
      kernelBoot:
        kernelArgs: console=ttyS0
        container: {kernelPath: /k/vmlinuz, initrdPath: /k/initrd.img}
    devices:
      disks:
      - {name: root, disk: {bus: virtio}}
      - {name: one, disk: {bus: scsi}, serial: SerialOne}
      - {name: two, disk: {bus: scsi}, serial: SerialTwo}
  volumes:
  - {name: root, hostDisk: {path: /d/root.img, type: Disk}}
  - {name: one, hostDisk: {path: /d/one.img, type: Disk}}
  - {name: two, hostDisk: {path: /d/two.img, type: Disk}}
"#;

#[test]
fn converts_the_whole_skeleton_subset() {
    let def = convert(&vmi(SPEC), &opts()).unwrap();
    assert_eq!(def.name, "ns1_testvm");
    assert_eq!(
        def.uuid.as_deref(),
        Some("6a1c2f0e-8a57-4f4e-9d43-0c1e54a1b2c3")
    );
    assert_eq!(def.memory_kib, 128 * 1024);
    assert_eq!(def.topology.vcpus(), 2);
    let targets: Vec<_> = def
        .disks
        .iter()
        .map(|d| (d.target.as_str(), d.address))
        .collect();
    assert_eq!(
        targets,
        [
            ("vda", None),
            (
                "sda",
                Some(DriveAddress {
                    controller: 0,
                    unit: 0
                })
            ),
            (
                "sdb",
                Some(DriveAddress {
                    controller: 0,
                    unit: 1
                })
            ),
        ]
    );
    let xml = def.to_xml();
    for needle in [
        "<domain type=\"qemu\">",
        "<controller type=\"scsi\" index=\"0\" model=\"virtio-scsi\"/>",
        "<serial>SerialOne</serial>",
        "<alias name=\"ua-two\"/>",
        "<address type=\"drive\" controller=\"0\" bus=\"0\" target=\"0\" unit=\"1\"/>",
        "<kernel>/k/vmlinuz</kernel>",
        "<cmdline>console=ttyS0</cmdline>",
        "<serial type=\"unix\">",
        "<source mode=\"bind\" path=\"/run/vml/private/virt-serial0\">\n        <seclabel model=\"dac\" relabel=\"no\"/>",
        "<log file=\"/run/vml/console.log\" append=\"on\"/>",
    ] {
        assert!(xml.contains(needle), "{needle} missing from\n{xml}");
    }
}

#[test]
fn conversion_is_deterministic() {
    let a = convert(&vmi(SPEC), &opts()).unwrap().to_xml();
    let b = convert(&vmi(SPEC), &opts()).unwrap().to_xml();
    assert_eq!(a, b);
}

#[test]
fn emulation_decides_the_domain_type() {
    let mut o = opts();
    o.virt_type = VirtType::Kvm;
    assert!(convert(&vmi(SPEC), &o)
        .unwrap()
        .to_xml()
        .starts_with("<domain type=\"kvm\">"));
}

#[test]
fn a_non_uuid_uid_is_not_used_as_uuid() {
    let text = SPEC.replace("6a1c2f0e-8a57-4f4e-9d43-0c1e54a1b2c3", "not-a-uuid");
    assert_eq!(convert(&vmi(&text), &opts()).unwrap().uuid, None);
}

#[test]
fn invalid_spec_is_refused() {
    // convert takes a Validated; an instance edited in code must pass validation again.
    let mut v = vmi(SPEC).into_inner();
    v.spec.domain.devices.disks[1].serial = Some("x".repeat(40));
    assert!(matches!(Validated::new(v), Err(SpecErrors(_))));
}

const MIXED: &str = r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: mixed}
spec:
  domain:
    memory: {guest: 128Mi}
    devices:
      disks:
      - {name: a, disk: {bus: sata}}
      - {name: b, disk: {bus: scsi}}
      - {name: c, cdrom: {}}
      - {name: d, disk: {bus: scsi}}
      - {name: l, lun: {}}
  volumes:
  - {name: a, emptyDisk: {capacity: 1Gi}}
  - {name: b, emptyDisk: {capacity: 1Gi}}
  - {name: c, hostDisk: {path: /c.iso, type: Disk}}
  - {name: d, emptyDisk: {capacity: 1Gi}}
  - {name: l, persistentVolumeClaim: {claimName: lun}}
"#;

#[test]
fn sata_and_scsi_share_sd_names_but_scsi_units_count_scsi_only() {
    let mut o = opts();
    o.block_volumes.insert("l".into());
    let def = convert(&vmi(MIXED), &o).unwrap();
    let got: Vec<_> = def
        .disks
        .iter()
        .map(|d| (d.target.as_str(), d.bus, d.address.map(|a| a.unit)))
        .collect();
    assert_eq!(
        got,
        [
            ("sda", Bus::Sata, None),
            ("sdb", Bus::Scsi, Some(0)),
            ("sdc", Bus::Sata, None),
            ("sdd", Bus::Scsi, Some(1)),
            ("sde", Bus::Scsi, Some(2)),
        ]
    );
    assert!(matches!(def.disks[4].source, DiskSource::Block(_)));
    assert!(def.disks[2].readonly, "a cdrom is read-only by default");
}

#[test]
fn a_lun_on_a_file_is_refused_with_its_path() {
    let Err(errors) = convert(&vmi(MIXED), &opts()) else {
        panic!("a lun on a file converted")
    };
    assert_eq!(errors.0.len(), 1);
    assert_eq!(errors.0[0].path, "spec.domain.devices.disks[4].lun");
    assert!(errors.0[0].message().contains("not a block device"));
}

#[test]
fn machine_aliases_resolve_through_the_options_only() {
    let mut o = opts();
    assert_eq!(convert(&vmi(SPEC), &o).unwrap().machine, "q35");
    o.machines.insert("q35".into(), "pc-q35-7.2".into());
    assert_eq!(convert(&vmi(SPEC), &o).unwrap().machine, "pc-q35-7.2");
    let versioned = SPEC.replace(
        "    cpu: {cores: 2}\n",
        "    cpu: {cores: 2}\n    machine: {type: pc-q35-6.2}\n",
    );
    assert_eq!(convert(&vmi(&versioned), &o).unwrap().machine, "pc-q35-6.2");
}

/// A minimal instance with `domain` lines (indented 4) under `spec.domain`.
fn with_domain(domain: &str) -> Validated {
    vmi(&crate::testing::minimal_vmi("vm", domain, ""))
}

#[test]
fn without_a_topology_the_cpu_resources_give_the_sockets() {
    let def = convert(
        &with_domain("    resources: {limits: {cpu: 2500m}}"),
        &opts(),
    )
    .unwrap();
    assert_eq!(
        def.topology,
        CpuTopology {
            sockets: 3,
            cores: 1,
            threads: 1
        }
    );
    let def = convert(&with_domain("    cpu: {threads: 2}"), &opts()).unwrap();
    assert_eq!(
        def.topology,
        CpuTopology {
            sockets: 1,
            cores: 1,
            threads: 2
        }
    );
}

#[test]
fn cpu_models_and_feature_policies() {
    let mode = |model: &str| {
        convert(
            &with_domain(&format!("    cpu: {{model: {model}}}")),
            &opts(),
        )
        .unwrap()
        .cpu
        .mode
    };
    assert_eq!(mode("host-model"), CpuMode::HostModel);
    assert_eq!(mode("host-passthrough"), CpuMode::HostPassthrough);
    assert_eq!(
        mode("Skylake-Server"),
        CpuMode::Custom("Skylake-Server".into())
    );
    let def = convert(
        &with_domain("    cpu: {features: [{name: vmx}, {name: svm, policy: disable}]}"),
        &opts(),
    )
    .unwrap();
    assert_eq!(def.cpu.mode, CpuMode::Default);
    assert_eq!(
        def.cpu.features,
        [
            ("require".to_string(), "vmx".to_string()),
            ("disable".to_string(), "svm".to_string())
        ]
    );
}

#[test]
fn secure_boot_takes_the_signed_firmware_and_turns_smm_on() {
    let def = convert(
        &with_domain("    firmware: {bootloader: {efi: {secureBoot: true}}}"),
        &opts(),
    )
    .unwrap();
    let FirmwareDef::Efi(efi) = &def.firmware else {
        panic!("not EFI: {:?}", def.firmware)
    };
    assert!(efi.secure);
    assert_eq!(
        efi.code,
        Path::new(volumes::OVMF_DIR).join("OVMF_CODE_4M.secboot.fd")
    );
    assert_eq!(
        efi.vars_template,
        Path::new(volumes::OVMF_DIR).join("OVMF_VARS_4M.ms.fd")
    );
    assert_eq!(def.features.smm, Some(true));
    let bios = convert(
        &with_domain("    firmware: {bootloader: {bios: {useSerial: true}}}"),
        &opts(),
    )
    .unwrap();
    assert_eq!(bios.firmware, FirmwareDef::BiosUseSerial);
    assert_eq!(bios.features.smm, None);
}

#[test]
fn clock_offsets_and_timer_names() {
    let def = convert(
        &with_domain(
            "    clock: {timezone: Europe/Paris, timer: {kvm: {}, hpet: {present: false}}}",
        ),
        &opts(),
    )
    .unwrap();
    assert_eq!(
        def.clock.offset,
        ClockOffset::Timezone("Europe/Paris".into())
    );
    let timers: Vec<(&str, Option<bool>)> = def
        .clock
        .timers
        .iter()
        .map(|t| (t.name, t.present))
        .collect();
    assert_eq!(timers, [("hpet", Some(false)), ("kvmclock", Some(true))]);
    let utc = convert(
        &with_domain("    clock: {utc: {offsetSeconds: 3600}}"),
        &opts(),
    )
    .unwrap();
    assert_eq!(utc.clock.offset, ClockOffset::UtcAdjusted(3600));
}

#[test]
fn iothreads_pool_then_dedicated() {
    let text = "    ioThreadsPolicy: auto\n    devices:\n      disks: [{name: a}, {name: b}, {name: c, dedicatedIOThread: true}, {name: d, disk: {bus: scsi}}]\n  volumes: [{name: a, emptyDisk: {capacity: 1Mi}}, {name: b, emptyDisk: {capacity: 1Mi}}, {name: c, emptyDisk: {capacity: 1Mi}}, {name: d, emptyDisk: {capacity: 1Mi}}]";
    let def = convert(&with_domain(text), &opts()).unwrap();
    let threads: Vec<Option<u32>> = def.disks.iter().map(|d| d.iothread).collect();
    // Two pooled virtio disks and one vCPU: a pool of 2, then the dedicated one, scsi none.
    assert_eq!(threads, [Some(1), Some(2), Some(3), None]);
    assert_eq!(def.iothreads, 3);
}

#[test]
fn the_default_interface_and_pod_taps() {
    let def = convert(&with_domain(""), &opts()).unwrap();
    assert_eq!(def.interfaces.len(), 1);
    assert_eq!(def.interfaces[0].name, DEFAULT_INTERFACE);
    assert_eq!(def.interfaces[0].backend, InterfaceBackend::User);
    let mut pod = opts();
    pod.network = NetworkMode::Pod;
    let text = "    devices: {interfaces: [{name: default, bridge: {}, model: e1000}]}\n  networks: [{name: default, pod: {}}]";
    let def = convert(&with_domain(text), &pod).unwrap();
    assert_eq!(
        def.interfaces[0].backend,
        InterfaceBackend::Tap("tap0".into())
    );
    assert_eq!(def.interfaces[0].model, "e1000");
}

const PORTS: &str = r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: web}
spec:
  domain:
    memory: {guest: 128Mi}
    devices:
      interfaces:
      - name: default
        masquerade: {}
        ports:
        - {name: http, port: 80}
        - {port: 53, protocol: UDP}
  networks:
  - {name: default, pod: {}}
"#;

#[test]
fn ports_are_published_on_loopback_under_their_own_number_unless_moved() {
    let def = convert(&vmi(PORTS), &opts()).unwrap();
    let fwd = |protocol: &str, host_port, port| PortForward {
        protocol: protocol.into(),
        address: "127.0.0.1".into(),
        host_port,
        port,
    };
    assert_eq!(
        def.interfaces[0].port_forwards,
        vec![fwd("tcp", 80, 80), fwd("udp", 53, 53)]
    );
    let mut o = opts();
    o.publish.address = Ipv4Addr::new(0, 0, 0, 0);
    o.publish.host_ports.insert(80, 8080);
    let def = convert(&vmi(PORTS), &o).unwrap();
    let forwards = &def.interfaces[0].port_forwards;
    assert_eq!((forwards[0].host_port, forwards[0].port), (8080, 80));
    assert_eq!(forwards[0].address, "0.0.0.0");
    assert_eq!((forwards[1].host_port, forwards[1].port), (53, 53));
    let xml = def.to_xml();
    assert!(
        xml.contains("<portForward proto=\"tcp\" address=\"0.0.0.0\">")
            && xml.contains("<range start=\"8080\" to=\"80\"/>"),
        "{xml}"
    );
}

#[test]
fn publish_moves_must_leave_every_host_port_to_one_guest_port() {
    let spec = vmi(&PORTS.replace(
        "        - {port: 53, protocol: UDP}\n",
        "        - {port: 53, protocol: UDP}\n        - {port: 53}\n        - {port: 8080}\n        - {port: 443}\n",
    ));
    // TCP and UDP 53 may share a host port; a swap clashes with nothing.
    assert_eq!(
        moved_ports(&spec, &[(5353, 53), (443, 80), (80, 443)]).unwrap(),
        BTreeMap::from([(53, 5353), (80, 443), (443, 80)])
    );
    assert_eq!(
        moved_ports(&spec, &[(2222, 22)]).unwrap_err(),
        PublishError::NotListed {
            host: 2222,
            guest: 22
        }
    );
    assert_eq!(
        moved_ports(&spec, &[(2222, 80), (3333, 80)]).unwrap_err(),
        PublishError::GuestTwice {
            host: 3333,
            guest: 80,
            first: 2222
        }
    );
    let err = moved_ports(&spec, &[(9000, 80), (9000, 443)]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "--publish 9000:443: host port 9000/tcp already publishes guest port 80"
    );
    // 8080 keeps its own number, so moving 80 there clashes.
    let err = moved_ports(&spec, &[(8080, 80)]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "--publish 8080:80: host port 8080/tcp already publishes guest port 8080 (on its own number)"
    );
    // ... unless 8080 moves away too.
    moved_ports(&spec, &[(8080, 80), (8081, 8080)]).unwrap();
}

#[test]
fn in_a_pod_masquerade_is_user_mode_on_the_pods_addresses_and_bridge_the_tap() {
    let mut o = opts();
    o.network = NetworkMode::Pod;
    o.publish = Publish::default_for(NetworkMode::Pod);
    let def = convert(&vmi(PORTS), &o).unwrap();
    assert_eq!(def.interfaces[0].backend, InterfaceBackend::User);
    assert_eq!(def.interfaces[0].port_forwards[0].address, "0.0.0.0");
    let bridged = PORTS.replace("masquerade: {}", "bridge: {}").replace(
        "        ports:\n        - {name: http, port: 80}\n        - {port: 53, protocol: UDP}\n",
        "",
    );
    let def = convert(&vmi(&bridged), &o).unwrap();
    assert_eq!(
        def.interfaces[0].backend,
        InterfaceBackend::Tap("tap0".into())
    );
    assert!(def.interfaces[0].port_forwards.is_empty());
}

const PINNED: &str = r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: pinned}
spec:
  domain:
    cpu: {cores: 2, dedicatedCpuPlacement: true, isolateEmulatorThread: true}
    memory: {guest: 128Mi}
    devices:
      tpm: {}
"#;

#[test]
fn dedicated_vcpus_take_the_launchers_first_cpus_and_the_emulator_the_next() {
    let mut o = opts();
    o.cpus = vec![4, 6, 7, 9];
    let def = convert(&vmi(PINNED), &o).unwrap();
    assert_eq!(
        def.cputune,
        Some(CpuTune {
            vcpu_pins: vec![4, 6],
            emulator_pin: Some(7),
        })
    );
    assert_eq!(def.tpm, Some(TpmDef { persistent: false }));
    let xml = def.to_xml();
    assert!(xml.contains("<vcpupin vcpu=\"1\" cpuset=\"6\"/>"), "{xml}");
    assert!(xml.contains("<emulatorpin cpuset=\"7\"/>"), "{xml}");
    assert!(xml.contains("<tpm model=\"tpm-tis\">"), "{xml}");
}

#[test]
fn too_few_cpus_for_dedicated_placement_is_refused_by_field() {
    let mut o = opts();
    o.cpus = vec![0, 1];
    let Err(errors) = convert(&vmi(PINNED), &o) else {
        panic!("3 dedicated CPUs out of 2")
    };
    assert_eq!(
        errors.to_string(),
        "spec.domain.cpu.dedicatedCpuPlacement: needs 3 CPUs of the launcher's own (2 available: 0,1)"
    );
}

#[test]
fn a_disabled_tpm_is_no_tpm_and_persistent_keeps_state() {
    let off = PINNED.replace("tpm: {}", "tpm: {enabled: false}");
    let mut o = opts();
    o.cpus = vec![0, 1, 2];
    assert_eq!(convert(&vmi(&off), &o).unwrap().tpm, None);
    let kept = PINNED.replace("tpm: {}", "tpm: {persistent: true}");
    let def = convert(&vmi(&kept), &o).unwrap();
    assert!(def.to_xml().contains("persistent_state=\"yes\""));
}

#[test]
fn a_running_guest_keeps_its_boot_memory_and_virtio_mem_takes_the_change() {
    let with_room = |guest: &str| {
        vmi(&SPEC.replace(
            "memory: {guest: 128Mi}",
            &format!("memory: {{guest: {guest}, maxGuest: 2Gi}}"),
        ))
    };
    let mut running = opts();
    running.guest_at_boot = Some(1 << 30);
    let def = convert(&with_room("1536Mi"), &running).unwrap();
    assert_eq!(def.memory_kib, 1 << 20);
    assert_eq!(
        def.virtio_mem,
        Some(VirtioMemDef {
            size_kib: 1 << 20,
            requested_kib: 512 << 10
        })
    );
    // A boot starts from what is asked.
    let def = convert(&with_room("1536Mi"), &opts()).unwrap();
    assert_eq!(def.memory_kib, 1536 << 10);
    assert_eq!(def.virtio_mem.map(|m| m.size_kib), Some(512 << 10));
    // Without room, `guest` is the boot memory, running or not: a change shows as one.
    let def = convert(&vmi(SPEC), &running).unwrap();
    assert_eq!(def.memory_kib, 128 << 10);
    assert_eq!(def.virtio_mem, None);
}

/// A hot-plugged claim's file goes to QEMU as the launcher's pin (`host::pin`) when pins are
/// made, given by the launcher (relabel='no'); a boot claim's by descriptor, never pinned.
#[test]
fn hot_plugged_files_are_pinned_and_boot_claims_passed_by_descriptor() {
    let text = SPEC
        .replace(
            "      - {name: two, disk: {bus: scsi}, serial: SerialTwo}\n",
            "      - {name: two, disk: {bus: scsi}, serial: SerialTwo}\n      - {name: late, disk: {bus: scsi}}\n      - {name: data, disk: {bus: scsi}}\n",
        )
        .replace(
            "  - {name: two, hostDisk: {path: /d/two.img, type: Disk}}\n",
            "  - {name: two, hostDisk: {path: /d/two.img, type: Disk}}\n  - {name: late, persistentVolumeClaim: {claimName: late, hotpluggable: true}}\n  - {name: data, persistentVolumeClaim: {claimName: data}}\n",
        );
    let mut o = opts();
    o.claims_by_fd = true;
    o.pin_dir = Some("/run/vml/pins".into());
    let def = convert(&vmi(&text), &o).unwrap();
    let disk = |name: &str| def.disks.iter().find(|d| d.volume == name).unwrap();
    let late = disk("late");
    assert_eq!(
        late.pin.as_deref(),
        Some(Path::new("/run/vml/pins/late.img"))
    );
    assert!(late.given_to_qemu && late.fd_group.is_none());
    assert_eq!(late.source.path(), Path::new("/run/vml/hotplug/late.img"));
    let xml = def.to_xml();
    assert!(
        xml.contains("<source file=\"/run/vml/pins/late.img\">"),
        "{xml}"
    );
    // A boot claim goes by descriptor, its path beside it; its pin is where a migration target,
    // which cannot take descriptors, gives it.
    let data = disk("data");
    assert!(data.fd_group.is_some());
    // A hot-plugged file has no overlay; a container disk's backing has its pin path too.
    assert!(late.backing.is_none());
    assert_eq!(
        data.pin.as_deref(),
        Some(Path::new("/run/vml/pins/data.img"))
    );
    assert!(
        xml.contains("<source file=\"/run/vml/vmi-disks/data/disk.img\" fdgroup=\"vml-data\""),
        "{xml}"
    );
    // Without pins (claims not passed by descriptor): by path.
    o.pin_dir = None;
    assert!(convert(&vmi(&text), &o)
        .unwrap()
        .disks
        .iter()
        .all(|d| d.pin.is_none()));
}

/// Under `--connect` every claim, at boot or hot-plugged, is refused naming its disk and volume;
/// a hostDisk is not a claim and is taken.
#[test]
fn claims_are_refused_through_a_libvirt_the_launcher_does_not_run() {
    let text = SPEC
        .replace(
            "      - {name: two, disk: {bus: scsi}, serial: SerialTwo}\n",
            "      - {name: two, disk: {bus: scsi}, serial: SerialTwo}\n      - {name: late, disk: {bus: scsi}}\n      - {name: data, disk: {bus: scsi}}\n",
        )
        .replace(
            "  - {name: two, hostDisk: {path: /d/two.img, type: Disk}}\n",
            "  - {name: two, hostDisk: {path: /d/two.img, type: Disk}}\n  - {name: late, persistentVolumeClaim: {claimName: late, hotpluggable: true}}\n  - {name: data, dataVolume: {name: data}}\n",
        );
    let mut o = opts();
    assert!(convert(&vmi(&text), &o).is_ok());
    o.claims_refused_by = Some("qemu:///system".into());
    let errors = convert(&vmi(&text), &o).unwrap_err().0;
    let disks = vmi(&text).spec.domain.devices.disks.clone();
    let at = |name: &str| disks.iter().position(|d| d.name == name).unwrap();
    let refused: Vec<_> = errors
        .iter()
        .map(|e| (e.path.clone(), e.problem.clone()))
        .collect();
    assert_eq!(
        refused,
        ["late", "data"].map(|v| (
            format!("spec.domain.devices.disks[{}]", at(v)),
            Problem::ClaimUnderConnect {
                volume: v.into(),
                uri: "qemu:///system".into()
            }
        ))
    );
}

/// As many root ports as libvirt 9.0 fills with the test guest's devices on q35
/// (`domain::resources`' `PLACED`: the NIC, the scsi controller, the USB controller, virtio-serial
/// for the agent channel, the balloon). In its place an e1000 NIC and a watchdog take none
/// (libvirt 9.0 adds their pcie-to-pci bridge with a root port of its own), and a virtio disk
/// one: as libvirt placed that mix, with five ports left empty of the twelve.
#[test]
fn counts_the_root_ports_its_devices_take() {
    let guest = r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: tracevm}
spec:
  domain:
    memory: {guest: 256Mi}
    firmware:
      kernelBoot:
        container: {kernelPath: /k/vmlinuz, initrdPath: /k/initrd.img}
    devices: {disks: []}
  volumes: []
"#;
    let def = convert(&vmi(guest), &opts()).unwrap();
    assert_eq!(def.root_port_devices(), 5);
    let more = guest
        .replace(
            "devices: {disks: []}",
            "devices:\n      disks: [{name: root, disk: {bus: virtio}}]\n      interfaces: [{name: default, masquerade: {}, model: e1000}]\n      watchdog: {name: w, i6300esb: {action: poweroff}}",
        )
        .replace(
            "volumes: []",
            "volumes: [{name: root, hostDisk: {path: /d/root.img, type: Disk}}]\n  networks: [{name: default, pod: {}}]",
        );
    let def = convert(&vmi(&more), &opts()).unwrap();
    assert_eq!(def.interfaces.len(), 1, "{more}");
    assert_eq!(def.root_port_devices(), 5);
}
