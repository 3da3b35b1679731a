//! `/dev/kvm` for a QEMU that runs as a user the host's node does not let in: a node of the
//! same device, QEMU's group's, made in libvirtd's mount namespace only.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt};
use std::path::Path;

use nix::mount::{mount, MsFlags};

use crate::host::qemu_user::QemuUser;

const KVM_DEVICE: &str = "/dev/kvm";

/// A node for `/dev/kvm` that QEMU's group may open, made in libvirtd's mount namespace only
/// (on a tmpfs of its own: the runtime dir may be `nodev`) and bound over `/dev/kvm` there.
/// Same device number, so a device cgroup that allows the host's node allows this one.
pub(super) struct KvmNode {
    dir: CString,
    node: CString,
    device: CString,
    rdev: u64,
    gid: u32,
}

impl KvmNode {
    /// Runs in the forked child, in its new mount namespace: system calls only.
    pub(super) fn cover(&self) -> nix::Result<()> {
        mount(
            Some("tmpfs"),
            self.dir.as_c_str(),
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
            Some("size=4k,mode=0755"),
        )?;
        // Not masked: the node is the group's to open (and the daemon's umask stays its own).
        let umask = nix::sys::stat::umask(nix::sys::stat::Mode::empty());
        let made = nix::sys::stat::mknod(
            self.node.as_c_str(),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o660),
            self.rdev,
        );
        nix::sys::stat::umask(umask);
        made?;
        nix::unistd::chown(
            self.node.as_c_str(),
            None,
            Some(nix::unistd::Gid::from_raw(self.gid)),
        )?;
        mount(
            Some(self.node.as_c_str()),
            self.device.as_c_str(),
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
    }
}

/// `/dev/kvm` as QEMU's user may open it, when the host's may not be (a host without udev's
/// `root:kvm 0660`, or a container given the node as root's alone). Without it libvirt
/// probes QEMU with KVM (the probe keeps CAP_DAC_OVERRIDE), then finds KVM unusable by
/// that user, discards the probe and probes again, forever.
pub(super) fn for_qemu(runtime: &Path, qemu: &QemuUser) -> Option<KvmNode> {
    let meta = fs::metadata(KVM_DEVICE).ok()?;
    if qemu.is_root() || !meta.file_type().is_char_device() || qemu.permits(&meta, 0o6) {
        return None;
    }
    let effective = |cap| caps::has_cap(None, caps::CapSet::Effective, cap).unwrap_or(false);
    // Without it the probe cannot open /dev/kvm either, and finds what QEMU will find.
    if !effective(caps::Capability::CAP_DAC_OVERRIDE) {
        return None;
    }
    if !effective(caps::Capability::CAP_MKNOD) || !effective(caps::Capability::CAP_SYS_ADMIN) {
        tracing::warn!(
            user = %qemu.name,
            "QEMU's user cannot open /dev/kvm and no node of its own can be made here: libvirt may probe QEMU again and again; give /dev/kvm to group kvm, mode 0660, as udev does"
        );
        return None;
    }
    let dir = runtime.join("kvm");
    if let Err(e) = fs::DirBuilder::new().mode(0o700).create(&dir) {
        if e.kind() != io::ErrorKind::AlreadyExists {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot give QEMU's user /dev/kvm");
            return None;
        }
    }
    let cstring = |path: &Path| CString::new(path.as_os_str().as_bytes()).expect("no NUL in paths");
    Some(KvmNode {
        node: cstring(&dir.join("kvm")),
        dir: cstring(&dir),
        device: CString::new(KVM_DEVICE).expect("no NUL"),
        rdev: meta.rdev(),
        gid: qemu.gid,
    })
}
