//! Where each volume source lives on the host (`docs/DESIGN.md` §2), as pure functions of the spec
//! and the host roots: the converter writes these paths into the domain, and `host` makes the
//! files behind them (overlays, empty disks, the cloud-init ISO). No I/O here.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::spec::{CloudInitNoCloud, VirtualMachineInstance, Volume, VolumeSource};

/// The directories volume sources resolve under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPaths {
    /// Filesystem PVCs and DataVolumes: `<volume_root>/vmi-disks/<volume>/disk.img`.
    pub volume_root: PathBuf,
    /// Block PVCs and DataVolumes: the device node `<dev_root>/<volume>`.
    pub dev_root: PathBuf,
    /// containerDisk images, put there by whoever makes the pod: `<dir>/disk_<n>.img`.
    pub container_disk_dir: PathBuf,
    /// What the launcher makes itself: overlays, empty disks, cloud-init ISOs, EFI variables.
    pub private_dir: PathBuf,
    /// Where the consoles are found: `virt-serial0` and `virt-vnc`, the names KubeVirt's
    /// converter gives them (in a pod `/var/run/kubevirt-private/<vmi uid>`, where
    /// virt-handler's console server looks for them). Root's: libvirt makes the serial socket
    /// and hands QEMU its descriptor; `virt-vnc` here is a link into `qemu_dir`. As KubeVirt's
    /// launcher it is `qemu_dir` itself (virt-handler follows no link to `virt-vnc`).
    pub console_dir: PathBuf,
    /// QEMU's own dir, the only one it may write: what QEMU creates itself (the VNC socket, a
    /// migration target's sockets). Nothing root works in by path lives here.
    pub qemu_dir: PathBuf,
    /// Where QEMU copies the guest's serial console (in a pod KubeVirt's
    /// `<console_dir>/virt-serial0-log`, which its `guest-console-log` container follows).
    pub console_log: PathBuf,
    /// OVMF, as Debian's `ovmf` package installs it.
    pub firmware_dir: PathBuf,
    /// Hot-plugged claims (`hotpluggable: true`): `<hotplug_dir>/<volume>` for a block device
    /// (a node the launcher makes), `<hotplug_dir>/<volume>.img` for a file.
    pub hotplug_dir: PathBuf,
    /// Where cloud-init's NoCloud ISO goes: `<dir>/<namespace>/<name>/noCloud.iso`, KubeVirt's
    /// layout (its launcher's `<ephemeral-disk-dir>/cloud-init-data`), where virt-handler reads
    /// the ISO's size for the VMI's volume status. None: `<private_dir>/cloud-init/<volume>.iso`.
    pub cloud_init_dir: Option<PathBuf>,
}

pub(crate) const OVMF_DIR: &str = "/usr/share/OVMF";

/// The VNC socket's name, KubeVirt's.
const VNC_SOCKET: &str = "virt-vnc";

/// The private dir's subdirectories for the images the launcher makes, and EFI variables.
pub(crate) const PRIVATE_SUBDIRS: [&str; 5] = [
    "cloud-init",
    "container-disks",
    "empty-disks",
    "ephemeral-disks",
    "nvram",
];

impl HostPaths {
    /// KubeVirt's pod layout.
    pub(crate) fn pod() -> HostPaths {
        HostPaths {
            volume_root: "/var/run/kubevirt-private".into(),
            dev_root: "/dev".into(),
            container_disk_dir: "/var/run/kubevirt/container-disks".into(),
            private_dir: "/var/run/kubevirt-private/vmlauncher".into(),
            console_dir: "/var/run/kubevirt-private".into(),
            qemu_dir: "/var/run/kubevirt-private/vmlauncher-qemu".into(),
            console_log: "/var/run/kubevirt-private/virt-serial0-log".into(),
            firmware_dir: OVMF_DIR.into(),
            hotplug_dir: "/var/run/kubevirt/hotplug-disks".into(),
            cloud_init_dir: None,
        }
    }

    /// A local run: everything under the launcher's runtime directory.
    pub(crate) fn local(runtime_dir: &Path) -> HostPaths {
        HostPaths {
            volume_root: runtime_dir.to_path_buf(),
            dev_root: runtime_dir.join("dev"),
            container_disk_dir: runtime_dir.join("container-disks"),
            private_dir: runtime_dir.join("private"),
            console_dir: runtime_dir.join("private"),
            qemu_dir: runtime_dir.join("qemu"),
            console_log: runtime_dir.join("console.log"),
            firmware_dir: OVMF_DIR.into(),
            hotplug_dir: runtime_dir.join("hotplug"),
            cloud_init_dir: None,
        }
    }

    /// Where QEMU listens for VNC (it makes the socket itself, so in its own dir).
    pub(crate) fn vnc_socket(&self) -> PathBuf {
        self.qemu_dir.join(VNC_SOCKET)
    }

    /// Where the VNC socket is found beside the serial console (a link to
    /// [`Self::vnc_socket`]).
    pub(crate) fn vnc_link(&self) -> PathBuf {
        self.console_dir.join(VNC_SOCKET)
    }

    pub(crate) fn serial_socket(&self) -> PathBuf {
        self.console_dir.join("virt-serial0")
    }

    pub(crate) fn nvram(&self, domain: &str) -> PathBuf {
        self.private_dir
            .join("nvram")
            .join(format!("{domain}_VARS.fd"))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ImageFormat {
    Raw,
    Qcow2,
}

/// Whose bytes an overlay's backing image is, which decides how its format is known:
/// never by sniffing what a guest could have written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backing {
    /// A claim's image is the guest's own disk: always raw, whatever its first bytes say.
    Claim { block: bool },
    /// A container disk's image is the image author's: raw, or a qcow2 that refers to no other
    /// file (checked before use).
    ContainerDisk,
}

impl ImageFormat {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ImageFormat::Raw => "raw",
            ImageFormat::Qcow2 => "qcow2",
        }
    }
}

/// What the launcher must do on the host before the domain can use a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Preparation {
    /// The file or device must exist.
    Exists,
    /// A claim's image or device, in a directory a tenant (or a node daemon) writes: it must
    /// exist and be itself, never a symbolic link.
    Claim,
    /// The file must exist, or is created sparse with this many bytes.
    CreateIfMissing { capacity: u64 },
    /// A qcow2 of this size is created if missing.
    EmptyQcow2 { capacity: u64 },
    /// A fresh qcow2 overlay on `backing` is made on every start (ephemeral by design).
    Overlay { backing: PathBuf, trust: Backing },
    /// A `cidata` ISO with these files is built on every start.
    CloudInit { files: Vec<(String, Vec<u8>)> },
}

/// A volume resolved to its host source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ResolvedVolume {
    pub path: PathBuf,
    pub block: bool,
    pub format: ImageFormat,
    pub preparation: Preparation,
}

impl ResolvedVolume {
    /// An overlay's backing image, with whether it is a block device and whose it is: written
    /// as an explicit `<backingStore>`, so that libvirt takes the chain from the XML and never
    /// from the image, and never relabels it through its path.
    pub(crate) fn backing(&self) -> Option<(&Path, bool, Backing)> {
        match &self.preparation {
            Preparation::Overlay { backing, trust } => {
                let block = matches!(trust, Backing::Claim { block: true });
                Some((backing, block, *trust))
            }
            _ => None,
        }
    }
}

/// The host path of a filesystem or block claim of volume `name`.
fn claim_path(paths: &HostPaths, name: &str, block: bool) -> PathBuf {
    if block {
        paths.dev_root.join(name)
    } else {
        paths
            .volume_root
            .join("vmi-disks")
            .join(name)
            .join("disk.img")
    }
}

/// Resolves a (validated) volume. `block_volumes` names the volumes whose source the host found
/// to be a block device.
pub(crate) fn resolve(
    vmi: &VirtualMachineInstance,
    volume: &Volume,
    paths: &HostPaths,
    block_volumes: &BTreeSet<String>,
) -> Option<ResolvedVolume> {
    Some(resolve_source(
        vmi,
        volume,
        volume.source()?,
        paths,
        block_volumes,
    ))
}

/// Resolves a volume whose source is known: what `convert` does for a validated spec.
pub(crate) fn resolve_source(
    vmi: &VirtualMachineInstance,
    volume: &Volume,
    source: VolumeSource<'_>,
    paths: &HostPaths,
    block_volumes: &BTreeSet<String>,
) -> ResolvedVolume {
    let block = block_volumes.contains(&volume.name);
    let name = volume.name.as_str();
    match source {
        VolumeSource::HostDisk(hd) => ResolvedVolume {
            path: hd.path.clone().into(),
            block,
            format: ImageFormat::Raw,
            preparation: match (&hd.disk_type[..], &hd.capacity) {
                ("DiskOrCreate", Some(q)) => Preparation::CreateIfMissing {
                    // Validation refused a capacity that does not parse.
                    capacity: q.to_bytes().unwrap_or_default(),
                },
                _ => Preparation::Exists,
            },
        },
        VolumeSource::PersistentVolumeClaim(_) | VolumeSource::DataVolume(_)
            if is_hotpluggable(volume) =>
        {
            ResolvedVolume {
                path: if block {
                    paths.hotplug_dir.join(name)
                } else {
                    paths.hotplug_dir.join(format!("{name}.img"))
                },
                block,
                format: ImageFormat::Raw,
                preparation: Preparation::Claim,
            }
        }
        VolumeSource::PersistentVolumeClaim(_) | VolumeSource::DataVolume(_) => ResolvedVolume {
            path: claim_path(paths, name, block),
            block,
            format: ImageFormat::Raw,
            preparation: Preparation::Claim,
        },
        VolumeSource::ContainerDisk(_) => {
            // KubeVirt numbers container disks by their position among the container disks.
            let n = vmi
                .spec
                .volumes
                .iter()
                .take_while(|v| v.name != volume.name)
                .filter(|v| v.container_disk.is_some())
                .count();
            own_qcow2(
                paths,
                "container-disks",
                name,
                Preparation::Overlay {
                    backing: paths.container_disk_dir.join(format!("disk_{n}.img")),
                    trust: Backing::ContainerDisk,
                },
            )
        }
        VolumeSource::EmptyDisk(ed) => own_qcow2(
            paths,
            "empty-disks",
            name,
            Preparation::EmptyQcow2 {
                capacity: ed.capacity.to_bytes().unwrap_or_default(),
            },
        ),
        VolumeSource::Ephemeral(_) => own_qcow2(
            paths,
            "ephemeral-disks",
            name,
            Preparation::Overlay {
                backing: claim_path(paths, name, block),
                trust: Backing::Claim { block },
            },
        ),
        VolumeSource::CloudInitNoCloud(ci) => cloud_init(vmi, ci, paths, name),
    }
}

/// A cloud-init NoCloud volume: the ISO the launcher makes, and the files in it.
fn cloud_init(
    vmi: &VirtualMachineInstance,
    ci: &CloudInitNoCloud,
    paths: &HostPaths,
    name: &str,
) -> ResolvedVolume {
    let decode = |plain: &Option<String>, b64: &Option<String>| -> Option<Vec<u8>> {
        match (plain, b64) {
            (Some(text), _) => Some(text.clone().into_bytes()),
            (None, Some(b64)) => crate::spec::decode_base64(b64).ok(),
            (None, None) => None,
        }
    };
    let namespace = vmi
        .metadata
        .namespace
        .as_deref()
        .unwrap_or(crate::spec::DEFAULT_NAMESPACE);
    let hostname = vmi.spec.hostname.as_deref().unwrap_or(&vmi.metadata.name);
    // KubeVirt's instance id: stable for the instance, so cloud-init runs once per VMI.
    let meta = format!(
        "instance-id: {}.{namespace}\nlocal-hostname: {hostname}\n",
        vmi.metadata.name
    );
    let mut files = vec![
        ("meta-data".to_string(), meta.into_bytes()),
        (
            "user-data".to_string(),
            decode(&ci.user_data, &ci.user_data_base64).unwrap_or_default(),
        ),
    ];
    if let Some(network) = decode(&ci.network_data, &ci.network_data_base64) {
        files.push(("network-config".to_string(), network));
    }
    // KubeVirt allows one cloud-init volume per VMI, so its ISO's name is fixed there.
    let path = match &paths.cloud_init_dir {
        Some(dir) => dir
            .join(namespace)
            .join(&vmi.metadata.name)
            .join("noCloud.iso"),
        None => paths
            .private_dir
            .join("cloud-init")
            .join(format!("{name}.iso")),
    };
    ResolvedVolume {
        path,
        block: false,
        format: ImageFormat::Raw,
        preparation: Preparation::CloudInit { files },
    }
}

/// A qcow2 image the launcher makes for volume `name` under `private_dir/<dir>/`: always a file
/// of its own, even over a block device's claim (an ephemeral volume's backing).
fn own_qcow2(paths: &HostPaths, dir: &str, name: &str, preparation: Preparation) -> ResolvedVolume {
    ResolvedVolume {
        path: paths.private_dir.join(dir).join(format!("{name}.qcow2")),
        block: false,
        format: ImageFormat::Qcow2,
        preparation,
    }
}

impl ResolvedVolume {
    /// An image the launcher makes in its private dir (an empty disk, an overlay, a
    /// cloud-init ISO): given to QEMU as a hot-plugged file is, through the descriptor the
    /// launcher opened (`DiskDef::given_to_qemu`), never by libvirt's chown of a path.
    pub(crate) fn made_by_launcher(&self) -> bool {
        !self.block
            && matches!(
                self.preparation,
                Preparation::EmptyQcow2 { .. }
                    | Preparation::Overlay { .. }
                    | Preparation::CloudInit { .. }
            )
    }
}

/// A claim marked `hotpluggable: true`: it lives in the hotplug dir.
pub(crate) fn is_hotpluggable(volume: &Volume) -> bool {
    match volume.source() {
        Some(VolumeSource::PersistentVolumeClaim(pvc)) => pvc.hotpluggable == Some(true),
        Some(VolumeSource::DataVolume(dv)) => dv.hotpluggable == Some(true),
        _ => false,
    }
}

/// A volume whose source could be a block device, with the path to look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BlockCandidate {
    pub volume: String,
    pub path: PathBuf,
    /// Only a spec's `hostDisk` may be a link (`/dev/disk/by-id/...`): a claim's node is the
    /// tenant's, and is never followed.
    pub follow_link: bool,
}

/// Volumes whose claim could be a block device, with the node path to check: what a caller
/// looks at on the host to fill `ConvertOptions::block_volumes`.
pub(crate) fn block_candidates(
    vmi: &VirtualMachineInstance,
    paths: &HostPaths,
) -> Vec<BlockCandidate> {
    vmi.spec
        .volumes
        .iter()
        .filter_map(|v| {
            let (path, follow_link) = match v.source()? {
                VolumeSource::PersistentVolumeClaim(_)
                | VolumeSource::DataVolume(_)
                | VolumeSource::Ephemeral(_) => (claim_path(paths, &v.name, true), false),
                VolumeSource::HostDisk(hd) => (PathBuf::from(&hd.path), true),
                _ => return None,
            };
            Some(BlockCandidate {
                volume: v.name.clone(),
                path,
                follow_link,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &str = r#"
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: vm, namespace: ns}
spec:
  domain:
    memory: {guest: 64Mi}
    devices:
      disks:
      - name: a
      - name: b
      - name: c
      - name: d
      - name: e
  volumes:
  - {name: a, containerDisk: {image: x}}
  - {name: b, persistentVolumeClaim: {claimName: pvc}}
  - {name: c, containerDisk: {image: y}}
  - {name: d, cloudInitNoCloud: {userDataBase64: aGVsbG8=}}
  - {name: e, emptyDisk: {capacity: 1Gi}}
"#;

    #[test]
    fn follows_kubevirt_conventions() {
        let vmi = crate::spec::parse(SPEC).unwrap();
        let paths = HostPaths::pod();
        let block: BTreeSet<String> = ["b".to_string()].into();
        let r = |i: usize| resolve(&vmi, &vmi.spec.volumes[i], &paths, &block).unwrap();
        assert_eq!(
            r(2).preparation,
            Preparation::Overlay {
                backing: "/var/run/kubevirt/container-disks/disk_1.img".into(),
                trust: Backing::ContainerDisk,
            }
        );
        assert_eq!(r(1).path, PathBuf::from("/dev/b"));
        assert!(r(1).block);
        // A claim's image is the tenant's: prepared as such, never through a link.
        assert_eq!(r(1).preparation, Preparation::Claim);
        let Preparation::CloudInit { files } = r(3).preparation else {
            panic!("cloud-init")
        };
        assert_eq!(files[0].1, b"instance-id: vm.ns\nlocal-hostname: vm\n");
        assert_eq!(files[1], ("user-data".into(), b"hello".to_vec()));
        assert_eq!(
            r(4).preparation,
            Preparation::EmptyQcow2 { capacity: 1 << 30 }
        );
        assert_eq!(
            claim_path(&paths, "b", false),
            PathBuf::from("/var/run/kubevirt-private/vmi-disks/b/disk.img")
        );
    }
}
