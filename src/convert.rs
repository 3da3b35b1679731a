//! Spec → domain model. A pure, deterministic function: the same spec and options give the same
//! domain, byte for byte once serialised. No I/O: whatever depends on the host (is KVM usable,
//! where the runtime directory is) comes in through [`ConvertOptions`].

use std::path::PathBuf;

use crate::domain::{
    target_name, Bus, CpuTopology, DiskDef, DiskSource, DomainDef, DriveAddress, InstanceMetadata,
    KernelBootDef, VirtType,
};
use crate::spec::{self, VirtualMachineInstance};

/// The machine type when the spec names none.
pub const DEFAULT_MACHINE: &str = "q35";
/// The namespace a VMI without one is taken to be in (Kubernetes' own default).
pub const DEFAULT_NAMESPACE: &str = "default";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConvertOptions {
    pub virt_type: VirtType,
    /// Where the guest's serial console is written.
    pub console_log: PathBuf,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConvertError {
    /// The spec did not pass validation; convert only takes validated specs.
    #[error(transparent)]
    Invalid(#[from] spec::SpecErrors),
}

/// The libvirt domain name for an instance: `<namespace>_<name>`, as KubeVirt names them.
pub fn domain_name(vmi: &VirtualMachineInstance) -> String {
    let ns = vmi
        .metadata
        .namespace
        .as_deref()
        .unwrap_or(DEFAULT_NAMESPACE);
    format!("{ns}_{}", vmi.metadata.name)
}

pub fn convert(
    vmi: &VirtualMachineInstance,
    opts: &ConvertOptions,
) -> Result<DomainDef, ConvertError> {
    spec::validate(vmi)?;
    let domain = &vmi.spec.domain;
    let memory_bytes = spec::guest_memory(vmi)
        .ok()
        .flatten()
        .expect("validated: memory is present and parses");
    let cpu = domain.cpu.as_ref();
    let topology = CpuTopology {
        sockets: cpu.and_then(|c| c.sockets).unwrap_or(1),
        cores: cpu.and_then(|c| c.cores).unwrap_or(1),
        threads: cpu.and_then(|c| c.threads).unwrap_or(1),
    };
    let kernel_boot = domain
        .firmware
        .as_ref()
        .and_then(|f| f.kernel_boot.as_ref())
        .and_then(|kb| {
            let container = kb.container.as_ref()?;
            Some(KernelBootDef {
                kernel: container.kernel_path.clone()?.into(),
                initrd: container.initrd_path.clone().map(PathBuf::from),
                cmdline: kb.kernel_args.clone(),
            })
        });

    // Targets and scsi units follow disk order, per bus, so boot disks are stable.
    let mut scsi_index = 0u32;
    let mut virtio_index = 0u32;
    let disks = domain
        .devices
        .disks
        .iter()
        .map(|disk| {
            let volume = vmi
                .spec
                .volumes
                .iter()
                .find(|v| v.name == disk.name)
                .expect("validated: every disk has a volume");
            let host_disk = volume
                .host_disk
                .as_ref()
                .expect("validated: hostDisk is the only source");
            let (bus, target, address) = match disk.bus() {
                "scsi" => {
                    let unit = scsi_index;
                    scsi_index += 1;
                    (
                        Bus::Scsi,
                        target_name("sd", unit),
                        Some(DriveAddress {
                            controller: 0,
                            unit,
                        }),
                    )
                }
                _ => {
                    let index = virtio_index;
                    virtio_index += 1;
                    (Bus::Virtio, target_name("vd", index), None)
                }
            };
            DiskDef {
                volume: disk.name.clone(),
                source: DiskSource::File(host_disk.path.clone().into()),
                bus,
                target,
                serial: disk.serial.clone(),
                address,
            }
        })
        .collect();

    let uuid = domain
        .firmware
        .as_ref()
        .and_then(|f| f.uuid.clone())
        .or_else(|| vmi.metadata.uid.clone().filter(|u| looks_like_uuid(u)));

    Ok(DomainDef {
        name: domain_name(vmi),
        uuid,
        virt_type: opts.virt_type,
        memory_kib: memory_bytes.div_ceil(1024),
        topology,
        machine: domain
            .machine
            .as_ref()
            .map(|m| m.machine_type.clone())
            .unwrap_or_else(|| DEFAULT_MACHINE.to_string()),
        kernel_boot,
        disks,
        console_log: opts.console_log.clone(),
        instance: InstanceMetadata {
            namespace: vmi
                .metadata
                .namespace
                .clone()
                .unwrap_or_else(|| DEFAULT_NAMESPACE.to_string()),
            name: vmi.metadata.name.clone(),
            uid: vmi.metadata.uid.clone(),
        },
    })
}

fn looks_like_uuid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups
            .iter()
            .all(|g| g.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vmi(text: &str) -> VirtualMachineInstance {
        spec::parse(text).unwrap()
    }

    fn opts() -> ConvertOptions {
        ConvertOptions {
            virt_type: VirtType::Qemu,
            console_log: "/run/vml/console.log".into(),
        }
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
            "<source path=\"/run/vml/console.log\" append=\"on\"/>",
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
        let mut v = vmi(SPEC);
        v.spec.domain.devices.disks[1].serial = Some("x".repeat(40));
        assert!(matches!(
            convert(&v, &opts()),
            Err(ConvertError::Invalid(_))
        ));
    }
}
