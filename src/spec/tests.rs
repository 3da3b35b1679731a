//! Parsing and validation end to end: text in, instance or field errors out.

use super::validate::guest_memory;
use super::*;

const MINIMAL: &str = r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: testvm
spec:
  domain:
    memory:
      guest: 128Mi
    devices:
      disks:
      - name: data
        disk:
          bus: scsi
        serial: DataDisk-1
  volumes:
  - name: data
    hostDisk:
      path: /var/data/data.img
      type: Disk
"#;

/// Each expected message starts one of `errors`, and there is no other error.
fn assert_starts_each(errors: &[String], expect: &[&str]) {
    for e in expect {
        assert!(
            errors.iter().any(|got| got.starts_with(e)),
            "missing {e:?} in {errors:#?}"
        );
    }
    assert_eq!(errors.len(), expect.len(), "{errors:#?}");
}

fn errors_of(text: &str) -> Vec<String> {
    match parse(text) {
        Ok(_) => vec![],
        Err(e) => e.0.iter().map(ToString::to_string).collect(),
    }
}

/// `MINIMAL` with `from` replaced by `to`, parsed; it must be valid.
#[track_caller]
fn minimal_with(from: &str, to: &str) -> Validated {
    parse(&MINIMAL.replace(from, to)).unwrap()
}

#[test]
fn parses_minimal_yaml() {
    let vmi = parse(MINIMAL).expect("valid");
    assert_eq!(vmi.metadata.name, "testvm");
    assert_eq!(vmi.spec.domain.devices.disks[0].bus(), "scsi");
    assert_eq!(
        vmi.spec.domain.devices.disks[0].serial.as_deref(),
        Some("DataDisk-1")
    );
    assert_eq!(guest_memory(&vmi), Ok(Some(128 * 1024 * 1024)));
}

#[test]
fn parses_json_the_same_as_yaml() {
    let yaml = parse(MINIMAL).unwrap();
    let value: serde_json::Value = serde_yaml_ng::from_str(MINIMAL).unwrap();
    let json = parse(&serde_json::to_string(&value).unwrap()).unwrap();
    assert_eq!(yaml, json);
}

#[test]
fn unknown_field_is_named_with_its_path() {
    let text = MINIMAL.replace(
        "        serial: DataDisk-1",
        "        serial: DataDisk-1\n        bogus: 1",
    );
    assert_starts_each(
        &errors_of(&text),
        &["spec.domain.devices.disks[0].bogus: unknown field `bogus`"],
    );
}

#[test]
fn unknown_field_in_json_is_named_with_its_path() {
    let text = r#"{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineInstance",
            "metadata":{"name":"a"},"spec":{"domain":{"memory":{"guest":"1Gi"},"cpu":{"cores":1,"speed":3}}}}"#;
    let errors = errors_of(text);
    assert!(
        errors[0].starts_with("spec.domain.cpu.speed: unknown field `speed`"),
        "{errors:?}"
    );
}

#[test]
fn reports_every_problem_at_once() {
    let text = r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: Bad_Name
spec:
  domain:
    memory:
      guest: 12Qi
    devices:
      disks:
      - name: a
        disk: {bus: ide}
      - name: b
        disk: {bus: scsi}
        serial: "0123456789012345678901234567890123456789"
      - name: b
        disk: {bus: scsi}
        serial: "has space"
  volumes:
  - name: a
    hostDisk: {path: relative.img, type: Disk}
  - name: b
    hostDisk: {path: /b.img, type: Sometimes}
  - name: ../etc
    hostDisk: {path: /c.img, type: DiskOrCreate}
"#;
    let errors = errors_of(text);
    let expect = [
        "metadata.name: \"Bad_Name\" is not a DNS-1123 label",
        "spec.domain.memory.guest: unknown unit \"Qi\"",
        "spec.volumes[0].hostDisk.path: \"relative.img\" must be an absolute path",
        "spec.volumes[1].hostDisk.type: \"Sometimes\" is not a hostDisk type",
        "spec.volumes[2].name: \"../etc\" looks like a path",
        "spec.volumes[2].hostDisk.capacity: is required with type DiskOrCreate",
        "spec.domain.devices.disks[0].disk.bus: bus \"ide\" is not valid for a disk",
        "spec.domain.devices.disks[1].serial: 40 characters, at most 36 on bus scsi",
        "spec.domain.devices.disks[2].name: duplicate disk name \"b\"",
        "spec.domain.devices.disks[2].serial: \"has space\" contains ' '",
    ];
    assert_starts_each(&errors, &expect);
}

#[test]
fn disk_without_volume_is_an_error() {
    let text = MINIMAL.replace(
        "  - name: data\n    hostDisk",
        "  - name: other\n    hostDisk",
    );
    let errors = errors_of(&text);
    assert!(errors
        .iter()
        .any(|e| e
            == "spec.domain.devices.disks[0].name: disk \"data\" has no volume of the same name"));
}

#[test]
fn serial_of_exactly_36_is_accepted_on_scsi() {
    let serial = "A".repeat(36);
    let text = MINIMAL.replace("DataDisk-1", &serial);
    assert_eq!(errors_of(&text), Vec::<String>::new());
    let text = MINIMAL.replace("DataDisk-1", &"A".repeat(37));
    assert_eq!(
        errors_of(&text),
        vec!["spec.domain.devices.disks[0].serial: 37 characters, at most 36 on bus scsi"]
    );
}

#[test]
fn memory_falls_back_to_resources() {
    let vmi = minimal_with(
        "    memory:\n      guest: 128Mi\n",
        "    resources:\n      requests:\n        memory: 64M\n        cpu: 1\n",
    );
    assert_eq!(guest_memory(&vmi), Ok(Some(64_000_000)));
}

#[test]
fn kernel_boot_from_an_image_is_rejected_by_name() {
    let text = MINIMAL.replace(
        "    memory:\n",
        "    firmware:\n      kernelBoot:\n        container:\n          image: quay.io/k:1\n          kernelPath: /boot/vmlinuz\n    memory:\n",
    );
    assert_starts_each(
        &errors_of(&text),
        &["spec.domain.firmware.kernelBoot.container.image: \"quay.io/k:1\": unsupported (kernel images from a registry"],
    );
}

#[test]
fn malformed_yaml_is_an_error_not_a_panic() {
    for text in ["", "{", "spec: [", "apiVersion: 3", ":\n  - -"] {
        assert!(parse(text).is_err(), "{text:?}");
    }
}

#[test]
fn a_virtual_machine_gives_its_template_and_run_strategy() {
    let text = r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: myvm, namespace: ns}
spec:
  runStrategy: RerunOnFailure
  template:
    metadata:
      labels: {app: x}
    spec:
      domain:
        memory: {guest: 64Mi}
        devices:
          disks:
          - {name: d, disk: {bus: ide}}
      volumes:
      - {name: d, emptyDisk: {capacity: 1Gi}}
"#;
    let errors = errors_of(text);
    assert_eq!(
        errors,
        vec![
            "spec.template.spec.domain.devices.disks[0].disk.bus: bus \"ide\" is not valid for a disk (valid: virtio, scsi, sata)"
        ]
    );
    let vmi = parse(&text.replace("bus: ide", "bus: sata")).unwrap();
    assert_eq!(vmi.metadata.name, "myvm");
    assert_eq!(
        vmi.metadata.labels.get("app").map(String::as_str),
        Some("x")
    );
    assert_eq!(vmi.run_strategy, Some(RunStrategy::RerunOnFailure));
    let both = text.replace(
        "  runStrategy: RerunOnFailure\n",
        "  runStrategy: Always\n  running: true\n",
    );
    assert_eq!(
        errors_of(&both),
        vec!["spec.running: cannot be combined with spec.runStrategy"]
    );
}

#[test]
fn a_volume_without_a_disk_gets_a_default_disk() {
    let vmi = minimal_with(
        "  volumes:\n",
        "  volumes:\n  - name: extra\n    emptyDisk: {capacity: 1Mi}\n",
    );
    let extra = &vmi.spec.domain.devices.disks[1];
    assert_eq!((extra.name.as_str(), extra.bus()), ("extra", "virtio"));
}

#[test]
fn unsupported_fields_are_named_and_typos_are_unknown() {
    let text = MINIMAL.replace(
        "    devices:\n",
        "    devices:\n      gpus: [{name: g, deviceName: x}]\n      sound: {name: s}\n",
    );
    assert_eq!(
        errors_of(&text),
        vec![
            "spec.domain.devices.gpus: unsupported (device passthrough)",
            "spec.domain.devices.sound: unsupported (sound devices)"
        ]
    );
    let typo = MINIMAL.replace("    devices:\n", "    devices:\n      gpu: []\n");
    assert!(errors_of(&typo)[0].starts_with("spec.domain.devices.gpu: unknown field `gpu`"));
    let ignored = MINIMAL.replace(
        "  domain:\n",
        "  nodeSelector: {a: b}\n  tolerations: []\n  domain:\n",
    );
    assert_eq!(errors_of(&ignored), Vec::<String>::new());
}

#[test]
fn device_rules() {
    let domain = r#"    devices:
      disks:
      - {name: a, cdrom: {bus: virtio}, bootOrder: 1}
      - {name: b, lun: {}, serial: X}
      - {name: c, bootOrder: 1, io: native, cache: writeback}
      - {name: d, disk: {bus: sata}, serial: "123456789012345678901"}
      interfaces:
      - {name: default, masquerade: {}, macAddress: "01:00:00:00:00:01", model: virtio-net}"#;
    let spec = r#"  networks:
  - {name: default, pod: {}}
  volumes:
  - {name: a, cloudInitNoCloud: {userDataBase64: "!!"}}
  - {name: b, emptyDisk: {capacity: 1Gi}}
  - {name: c, hostDisk: {path: /c, type: Disk}}
  - {name: d, hostDisk: {path: /d, type: Disk}}"#;
    let errors = errors_of(&crate::testing::minimal_vmi("vm", domain, spec));
    let expect = [
        "spec.domain.devices.disks[0].cdrom.bus: bus \"virtio\" is not valid for a cdrom",
        "spec.domain.devices.disks[1].serial: a lun shows the device's own serial",
        "spec.domain.devices.disks[1].lun: a lun needs a block device",
        "spec.domain.devices.disks[2].io: io native needs cache none",
        "spec.domain.devices.disks[2].bootOrder: boot order 1 is already used by spec.domain.devices.disks[0].bootOrder",
        "spec.domain.devices.disks[3].serial: 21 characters, at most 20 on bus sata",
        "spec.domain.devices.interfaces[0].model: \"virtio-net\" is not one of",
        "spec.domain.devices.interfaces[0].macAddress: \"01:00:00:00:00:01\" is a multicast address",
        "spec.volumes[0].cloudInitNoCloud.userDataBase64: not base64",
    ];
    assert_starts_each(&errors, &expect);
}

#[test]
fn ports_are_checked_one_by_one() {
    let text = r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: web}
spec:
  domain:
    devices:
      interfaces:
      - name: default
        masquerade: {}
        ports:
        - {port: 80}
        - {port: 80, protocol: TCP}
        - {port: 80, protocol: UDP}
        - {port: 0}
        - {port: 22, protocol: SCTP}
      - name: second
        bridge: {}
        ports: [{port: 22}]
  networks:
  - {name: default, pod: {}}
  - {name: second, multus: {networkName: x}}
"#;
    let errors = errors_of(text);
    let p = "spec.domain.devices.interfaces";
    for expected in [
        format!("{p}[0].ports[1].port: port 80/tcp is listed twice"),
        format!("{p}[0].ports[3].port: 0 is not a port (1-65535)"),
        format!("{p}[0].ports[4].protocol: \"SCTP\" is not one of TCP, UDP"),
        format!("{p}[1].ports: ports are published only by a masquerade interface"),
    ] {
        assert!(
            errors.contains(&expected),
            "{expected:?} not in {errors:#?}"
        );
    }
    assert!(
        !errors.iter().any(|e| e.contains("ports[2]")),
        "80/udp is another port than 80/tcp: {errors:#?}"
    );
}

#[test]
fn an_isolated_emulator_thread_needs_dedicated_cpus() {
    let text = r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: iso}
spec:
  domain:
    cpu: {isolateEmulatorThread: true}
    memory: {guest: 128Mi}
"#;
    assert_eq!(
        errors_of(text),
        ["spec.domain.cpu.isolateEmulatorThread: needs dedicatedCpuPlacement: true"]
    );
}

#[test]
fn a_virtual_machines_cluster_fields_are_named() {
    let text = "apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {name: vm}
spec:
  instancetype: {name: u1.small}
  dataVolumeTemplates: []
  template:
    spec:
      domain: {memory: {guest: 64Mi}, devices: {}}
";
    assert_eq!(
        errors_of(text),
        vec![
            "spec.dataVolumeTemplates: unsupported (DataVolumes are imported by CDI in a cluster)",
            "spec.instancetype: unsupported (instance types are expanded by the cluster)",
        ]
    );
}

#[test]
fn an_unsupported_binding_is_named_and_counts_as_a_binding() {
    let text = crate::testing::minimal_vmi(
        "vm",
        "    devices:\n      interfaces: [{name: default, masquerade: {}, slirp: {}}]",
        "  networks: [{name: default, pod: {}}]",
    );
    assert_eq!(
        errors_of(&text),
        vec![
            "spec.domain.devices.interfaces[0].slirp: unsupported (the slirp binding was removed from KubeVirt)",
            "spec.domain.devices.interfaces[0]: only one binding may be set",
        ]
    );
}
