//! Host-side preparation of volume sources: checks that a disk's source is there and of the right
//! kind, and makes what the launcher owns: `DiskOrCreate` images, empty qcow2 disks and qcow2
//! overlays (written natively, `qcow2`), cloud-init `cidata` ISOs (with `genisoimage`, `cidata`).
//! Where each file goes is decided by `volumes`; paths come in as parameters, so the same code
//! runs on real files in a temp dir in unit tests.
//!
//! Submodules: `block` (the owner of hot-plugged block volumes' host side), `block_allow`
//! (which block devices a Sync may attach), `devnode` (block
//! nodes in the hotplug dir), `cgroup` (v1/v2 device rules), `records` (what the launcher made,
//! for a restarted launcher), `caps` (capability check and drop), `watch` (inotify on paths),
//! `cpus` (the CPUs this process may run on, which dedicated vCPUs are pinned to), `confine`
//! (where a spec's host paths lead once links are followed), `image_check`
//! (what a foreign image's header may be before QEMU opens it: raw, or self-contained qcow2),
//! `qemu_user` (the unprivileged user QEMU runs as, and what it is given), `loopback` (keeping
//! QEMU's user-mode network off the host's loopback).

pub mod acl;
pub(crate) mod block;
pub(crate) mod block_allow;
pub mod caps;
pub mod cgroup;
mod cidata;
pub(crate) mod confine;
pub mod cpus;
pub(crate) mod devnode;
pub mod fd_limit;
pub(crate) mod host_files;
pub(crate) mod image_check;
pub mod loopback;
pub(crate) mod pin;
pub mod private_dirs;
mod qcow2;
pub mod qemu_ids;
pub mod qemu_user;
pub(crate) mod records;
pub(crate) mod root_dir;
pub(crate) mod tpm_state;
mod walk;
pub mod watch;

pub use devnode::{DevNumber, NodeOwner};

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::volumes::{Backing, Preparation, ResolvedVolume};
use cidata::build_cidata;
use nix::sys::stat::SFlag;
use qcow2::create_qcow2;
use root_dir::RootDir;

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("{path} does not exist")]
    Missing { path: PathBuf },
    #[error("{path} is neither a regular file nor a block device")]
    NotADisk { path: PathBuf },
    #[error("{path} is a symbolic link: a disk image from a claim or a container disk is opened only as itself, never through a link")]
    Link { path: PathBuf },
    #[error("{path} goes through the symbolic link {link}, in a directory others than root may write: a host file is followed only through links root made")]
    UntrustedLink { path: PathBuf, link: String },
    #[error("the directory of {path} is writable by others than root and its owner (mode {mode:04o}, owner uid {owner}): they could put another file in its place")]
    DirWritableByOthers {
        path: PathBuf,
        mode: u32,
        owner: u32,
    },
    #[error("{path} is {size} bytes, more than the {max} a kernel or an initrd may be")]
    TooLarge { path: PathBuf, size: u64, max: u64 },
    #[error("{path} is not a regular file")]
    NotAFile { path: PathBuf },
    #[error("{path} is a file of the kernel's {filesystem} (something was mounted over it), not a disk image")]
    KernelFile {
        path: PathBuf,
        filesystem: &'static str,
    },
    #[error("cannot create {path}")]
    Create {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: {problem}")]
    UnsafeImage {
        path: PathBuf,
        problem: image_check::ImageProblem,
    },
    #[error(transparent)]
    Pin(#[from] pin::PinError),
    #[error("{path} belongs to uid {owner}, not to the launcher: someone else made it, and root does not work in what another user controls")]
    NotOurs { path: PathBuf, owner: u32 },
    #[error("{path} is {mode:04o} {owner}:{group}: QEMU's user {qemu} may not {access} it, and no descriptor reaches QEMU here (an attach to a running VM, a migration target, --connect); the launcher changes no host file's owner: give that user access (a group or an ACL), or name the disk before the VM starts")]
    QemuMayNotOpen {
        path: PathBuf,
        mode: u32,
        owner: u32,
        group: u32,
        qemu: u32,
        access: &'static str,
    },
    #[error("cannot inspect {path}")]
    Inspect {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot run {tool} for {path} (is it installed? scripts/setup.sh installs it)")]
    ToolMissing {
        tool: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{tool} failed for {path}: {stderr}")]
    Tool {
        tool: &'static str,
        path: PathBuf,
        stderr: String,
    },
}

impl HostError {
    /// A CamelCase reason for volume status.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            HostError::Missing { .. } => "SourceNotFound",
            HostError::NotADisk { .. } | HostError::NotAFile { .. } => "NotADisk",
            HostError::TooLarge { .. } => "TooLarge",
            HostError::Create { .. } => "CreateFailed",
            HostError::Inspect { .. } => "SourceUnreadable",
            HostError::QemuMayNotOpen { .. } => "QemuMayNotOpen",
            HostError::UnsafeImage { .. }
            | HostError::Link { .. }
            | HostError::UntrustedLink { .. }
            | HostError::DirWritableByOthers { .. }
            | HostError::NotOurs { .. }
            | HostError::KernelFile { .. } => "UnsafeImage",
            HostError::ToolMissing { .. } | HostError::Tool { .. } => "CreateFailed",
            HostError::Pin(_) => "PinFailed",
        }
    }
}

/// Makes sure a host disk image is there: an existing file or block device, or, when `create` gives
/// a capacity, a new sparse file of that size (never truncating an existing one).
#[cfg(test)]
pub(crate) fn prepare_host_disk(path: &Path, create: Option<u64>) -> Result<(), HostError> {
    match fs::metadata(path) {
        Ok(meta) => {
            let kind = meta.file_type();
            if kind.is_file() || kind.is_block_device() {
                Ok(())
            } else {
                Err(HostError::NotADisk { path: path.into() })
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => match create {
            None => Err(HostError::Missing { path: path.into() }),
            Some(capacity) => {
                let create_err = |source| HostError::Create {
                    path: path.into(),
                    source,
                };
                if let Some(parent) = path.parent() {
                    fs::create_dir_all(parent).map_err(create_err)?;
                }
                let file = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o660)
                    .open(path)
                    .map_err(create_err)?;
                file.set_len(capacity).map_err(create_err)
            }
        },
        Err(source) => Err(HostError::Inspect {
            path: path.into(),
            source,
        }),
    }
}

/// Opens a disk image whose directory someone else writes (a tenant's claim, a container disk,
/// a node daemon's hotplug file) as itself: a symbolic link there would hand the guest, and QEMU
/// running as root, whatever file it names in the launcher's filesystem. The last component is
/// looked at and opened without following a link, without blocking (a FIFO), and what was opened
/// must be a regular file or a block device. `writable`: opened for writing too (the descriptor
/// QEMU is given for a disk that is not read-only).
pub(crate) fn open_image(path: &Path, writable: bool) -> Result<fs::File, HostError> {
    let failed = |source: io::Error| match source.raw_os_error() {
        // What O_NOFOLLOW says when the last component has become a link since it was looked at.
        Some(libc::ELOOP) => HostError::Link { path: path.into() },
        _ if source.kind() == io::ErrorKind::NotFound => HostError::Missing { path: path.into() },
        _ => HostError::Inspect {
            path: path.into(),
            source,
        },
    };
    let is_disk = |kind: fs::FileType| kind.is_file() || kind.is_block_device();
    let seen = fs::symlink_metadata(path).map_err(failed)?.file_type();
    if seen.is_symlink() {
        return Err(HostError::Link { path: path.into() });
    }
    // Refused before it is opened: opening a device may do something by itself.
    if !is_disk(seen) {
        return Err(HostError::NotADisk { path: path.into() });
    }
    let file = fs::OpenOptions::new()
        .read(true)
        .write(writable)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(failed)?;
    let opened = file.metadata().map_err(failed)?;
    if !is_disk(opened.file_type()) {
        return Err(HostError::NotADisk { path: path.into() });
    }
    // A regular file must be on a filesystem that holds data. Where images arrive, a node
    // daemon bind-mounts them (KubeVirt does, for hot-plugged and container disks), so any
    // filesystem of data will do; a kernel interface (a /proc or /sys file bound over the
    // image's name) is no disk. A block node lives on devtmpfs or tmpfs wherever it is.
    if opened.file_type().is_file() {
        let kind = nix::sys::statfs::fstatfs(&file).map_err(|e| failed(e.into()))?;
        if let Some(filesystem) = kernel_filesystem(kind.filesystem_type()) {
            return Err(HostError::KernelFile {
                path: path.into(),
                filesystem,
            });
        }
    }
    Ok(file)
}

/// The name of a filesystem that is an interface of the kernel's, not storage.
// The magic numbers' type differs between C libraries (c_long, c_uint): cast to one.
#[allow(clippy::unnecessary_cast)]
fn kernel_filesystem(kind: nix::sys::statfs::FsType) -> Option<&'static str> {
    const KERNEL: [(i64, &str); 12] = [
        (libc::PROC_SUPER_MAGIC as i64, "procfs"),
        (libc::SYSFS_MAGIC as i64, "sysfs"),
        (libc::DEBUGFS_MAGIC as i64, "debugfs"),
        (libc::TRACEFS_MAGIC as i64, "tracefs"),
        (libc::SECURITYFS_MAGIC as i64, "securityfs"),
        (libc::CGROUP_SUPER_MAGIC as i64, "cgroupfs"),
        (libc::CGROUP2_SUPER_MAGIC as i64, "cgroup2"),
        (libc::BPF_FS_MAGIC as i64, "bpffs"),
        (libc::DEVPTS_SUPER_MAGIC as i64, "devpts"),
        (libc::NSFS_MAGIC as i64, "nsfs"),
        (0x6265_6570, "configfs"),
        (0xde5e_81e4, "efivarfs"),
    ];
    let kind = kind.0 as i64;
    KERNEL
        .iter()
        .find_map(|(magic, name)| (*magic == kind).then_some(*name))
}

/// Hands QEMU the images of `disks` that lie where others write, each opened as itself
/// (`open_image`, or `host_files` for a hostDisk; read-only for a read-only disk), so that what was checked is what QEMU gets:
/// returns the descriptors of those passed by `fdgroup`; gives those marked `given_to_qemu`, and
/// every overlay's backing, to QEMU's user (`owner`) through the descriptor (`fchown`, no path
/// followed), and reads a container disk's backing format from the file it opened. The checked
/// files of disks to pin (`DiskDef::pin`) are returned too, by volume, for the caller to pin.
pub(crate) fn open_for_qemu(
    disks: &mut [crate::domain::DiskDef],
    owner: devnode::NodeOwner,
) -> Result<ForQemu, (String, HostError)> {
    let mut out = ForQemu::default();
    let fds = &mut out.fds;
    for disk in disks.iter_mut() {
        let failed = |e| (disk.volume.clone(), e);
        if disk.fd_group.is_some() || disk.given_to_qemu || disk.host_file {
            let path = disk.source.path();
            let file = if disk.host_file {
                let kind = host_files::Kind::Disk {
                    writable: !disk.readonly,
                    create: None,
                };
                host_files::open_host_file(path, kind)
            } else {
                open_image(path, !disk.readonly)
            }
            .map_err(failed)?;
            match &disk.fd_group {
                Some(group) => fds.push((group.clone(), file)),
                // A hostDisk QEMU opens by its path (no descriptor here): checked, its owner
                // and mode left as they are, which must let QEMU in.
                None if !disk.given_to_qemu => {
                    host_files::qemu_may_open(&file, path, owner, !disk.readonly).map_err(failed)?
                }
                None => {
                    give_to(&file, path, owner).map_err(failed)?;
                    if disk.pin.is_some() {
                        out.to_pin.push((disk.volume.clone(), file));
                    }
                }
            }
        }
        if let Some(backing) = &mut disk.backing {
            let path = backing.source.path();
            let mut file = open_image(path, false).map_err(|e| (disk.volume.clone(), e))?;
            if backing.format.is_none() {
                let (format, _) = image_format(&mut file, path, Backing::ContainerDisk)
                    .map_err(|e| (disk.volume.clone(), e))?;
                backing.format = Some(format);
            }
            match &backing.fd_group {
                Some(group) => fds.push((group.clone(), file)),
                None => {
                    give_to(&file, path, owner).map_err(|e| (disk.volume.clone(), e))?;
                    if backing.pin.is_some() {
                        out.to_pin.push((pin::backing_name(&disk.volume), file));
                    }
                }
            }
        }
    }
    Ok(out)
}

/// The images `open_for_qemu` opened for QEMU.
#[derive(Debug, Default)]
pub(crate) struct ForQemu {
    /// Passed by `fdgroup`: (group, file).
    pub fds: Vec<(String, fs::File)>,
    /// To pin (`host::pin`) where QEMU will open them: (volume, the checked file).
    pub to_pin: Vec<(String, fs::File)>,
}

/// Gives the open `file` to QEMU's user. A read-only filesystem (a container disk's image
/// may be on one) keeps its owner, as libvirt's own relabelling does: QEMU reads it as its
/// mode allows.
fn give_to(file: &fs::File, path: &Path, owner: devnode::NodeOwner) -> Result<(), HostError> {
    match nix::unistd::fchown(
        file,
        Some(nix::unistd::Uid::from_raw(owner.uid)),
        Some(nix::unistd::Gid::from_raw(owner.gid)),
    ) {
        Ok(()) | Err(nix::errno::Errno::EROFS) => Ok(()),
        Err(e) => Err(HostError::Inspect {
            path: path.into(),
            source: e.into(),
        }),
    }
}

/// Does what a resolved volume needs before the domain can use it.
pub(crate) fn prepare_volume(volume: &ResolvedVolume) -> Result<(), HostError> {
    let path = volume.path.as_path();
    match &volume.preparation {
        // A spec's hostDisk: walked as the host's own file, at every start and attach.
        Preparation::Exists => {
            let kind = host_files::Kind::Disk {
                writable: false,
                create: None,
            };
            host_files::open_host_file(path, kind).map(drop)
        }
        Preparation::Claim => open_image(path, false).map(drop),
        Preparation::CreateIfMissing { capacity } => {
            let kind = host_files::Kind::Disk {
                writable: false,
                create: Some(*capacity),
            };
            host_files::open_host_file(path, kind).map(drop)
        }
        Preparation::EmptyQcow2 { capacity } => {
            let (dir, name) = RootDir::of_file(path)?;
            match dir.kind_of(name)? {
                // Kept across restarts of the launcher: an empty disk lives as long as the VMI.
                Some(SFlag::S_IFREG) => Ok(()),
                Some(_) => Err(HostError::NotADisk { path: path.into() }),
                None => create_qcow2(&dir, name, *capacity, None).map(drop),
            }
        }
        Preparation::Overlay { backing, trust } => {
            let (format, size) = backing_info(backing, *trust)?;
            let (dir, name) = RootDir::of_file(path)?;
            // Ephemeral by design: every start begins from the image, as KubeVirt's do.
            create_qcow2(&dir, name, size, Some((backing, format))).map(drop)
        }
        Preparation::CloudInit { files } => {
            let (dir, name) = RootDir::of_file(path)?;
            build_cidata(&dir, name, files).map(drop)
        }
    }
}

/// The volumes among `candidates` whose path is a block device; a link is followed only where
/// the candidate says it may be (a spec's `hostDisk`), and otherwise is no block device (it is
/// refused as a link when the volume is prepared).
pub(crate) fn block_volumes(candidates: &[crate::volumes::BlockCandidate]) -> BTreeSet<String> {
    candidates
        .iter()
        .filter(|c| {
            let meta = if c.follow_link {
                fs::metadata(&c.path)
            } else {
                fs::symlink_metadata(&c.path)
            };
            meta.is_ok_and(|m| m.file_type().is_block_device())
        })
        .map(|c| c.volume.clone())
        .collect()
}

/// The format and virtual size of an overlay's backing image, as `trust` allows knowing them: a
/// claim is raw, always; a container disk's header is read, and refused when it points anywhere.
fn backing_info(path: &Path, trust: Backing) -> Result<(&'static str, u64), HostError> {
    image_format(&mut open_image(path, false)?, path, trust)
}

/// [`backing_info`] of an image already opened (as itself: `open_image`).
fn image_format(
    file: &mut fs::File,
    path: &Path,
    trust: Backing,
) -> Result<(&'static str, u64), HostError> {
    use std::io::{Read, Seek, SeekFrom};
    let inspect = |source| HostError::Inspect {
        path: path.into(),
        source,
    };
    file.seek(SeekFrom::Start(0)).map_err(inspect)?;
    if trust == Backing::ContainerDisk {
        let mut header = Vec::with_capacity(image_check::HEADER_BYTES);
        (&mut *file)
            .take(image_check::HEADER_BYTES as u64)
            .read_to_end(&mut header)
            .map_err(inspect)?;
        let format = image_check::container_disk_format(&header).map_err(|problem| {
            HostError::UnsafeImage {
                path: path.into(),
                problem,
            }
        })?;
        if let image_check::Format::Qcow2 { virtual_size } = format {
            return Ok(("qcow2", virtual_size));
        }
    }
    // A block device's length is where its end is, not its metadata's.
    let size = file.seek(SeekFrom::End(0)).map_err(inspect)?;
    Ok(("raw", size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn existing_file_is_accepted_and_kept() {
        let (_dir, path) = crate::testing::temp_path("a.img");
        fs::write(&path, b"data").unwrap();
        prepare_host_disk(&path, Some(1 << 20)).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"data", "never truncated");
    }

    #[test]
    fn missing_file_is_an_error_unless_created() {
        let (_dir, path) = crate::testing::temp_path("sub/b.img");
        let err = prepare_host_disk(&path, None).unwrap_err();
        assert_eq!(err.reason(), "SourceNotFound");
        assert!(!path.exists());
        prepare_host_disk(&path, Some(3 << 20)).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().len(), 3 << 20);
    }

    fn resolved(path: PathBuf, preparation: Preparation) -> ResolvedVolume {
        ResolvedVolume {
            path,
            block: false,
            format: crate::volumes::ImageFormat::Qcow2,
            preparation,
        }
    }

    #[test]
    fn empty_disk_and_overlay_are_qcow2_of_the_right_size() {
        let (dir, empty) = crate::testing::temp_path("e/empty.qcow2");
        prepare_volume(&resolved(
            empty.clone(),
            Preparation::EmptyQcow2 { capacity: 3 << 20 },
        ))
        .unwrap();
        assert_eq!(
            backing_info(&empty, Backing::ContainerDisk).unwrap(),
            ("qcow2", 3 << 20)
        );
        assert_eq!(fs::metadata(&empty).unwrap().len(), 4 * qcow2::CLUSTER);

        let base = dir.path().join("base.img");
        fs::File::create(&base).unwrap().set_len(5 << 20).unwrap();
        let overlay = dir.path().join("o/overlay.qcow2");
        let volume = resolved(
            overlay.clone(),
            Preparation::Overlay {
                backing: base.clone(),
                trust: Backing::Claim { block: false },
            },
        );
        prepare_volume(&volume).unwrap();
        prepare_volume(&volume).unwrap();
        let bytes = fs::read(&overlay).unwrap();
        assert_eq!(
            u64::from_be_bytes(bytes[24..32].try_into().unwrap()),
            5 << 20
        );
        let name = base.to_string_lossy();
        let offset = u64::from_be_bytes(bytes[8..16].try_into().unwrap()) as usize;
        assert_eq!(&bytes[offset..offset + name.len()], name.as_bytes());
        assert!(
            bytes[..offset].windows(3).any(|w| w == b"raw"),
            "backing format"
        );

        let missing = resolved(
            dir.path().join("x.qcow2"),
            Preparation::Overlay {
                backing: dir.path().join("nope.img"),
                trust: Backing::Claim { block: false },
            },
        );
        assert_eq!(
            prepare_volume(&missing).unwrap_err().reason(),
            "SourceNotFound"
        );
    }

    /// A tenant's claim whose `disk.img` is a link to a file of the launcher's (a program it
    /// runs, its state) would give the guest that file as its disk.
    #[test]
    fn a_claim_image_that_is_a_link_is_refused_and_its_target_untouched() {
        let (dir, target) = crate::testing::temp_path("launcher-owned");
        fs::write(&target, b"#!/bin/sh\n").unwrap();
        let claim = dir.path().join("vmi-disks/pvc/disk.img");
        fs::create_dir_all(claim.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&target, &claim).unwrap();
        let err = prepare_volume(&resolved(claim.clone(), Preparation::Claim)).unwrap_err();
        assert!(
            matches!(&err, HostError::Link { path } if *path == claim),
            "{err}"
        );
        assert_eq!(err.reason(), "UnsafeImage");
        assert!(err.to_string().contains("symbolic link"), "{err}");
        assert_eq!(fs::read(&target).unwrap(), b"#!/bin/sh\n");

        // A link to a directory and a dangling link are links too, not missing files.
        for to in [dir.path().to_path_buf(), dir.path().join("nowhere")] {
            fs::remove_file(&claim).unwrap();
            std::os::unix::fs::symlink(&to, &claim).unwrap();
            let err = prepare_volume(&resolved(claim.clone(), Preparation::Claim)).unwrap_err();
            assert!(matches!(err, HostError::Link { .. }), "{err}");
        }

        // The file itself is taken; a missing one is Missing (a hot-plugged volume waits).
        fs::remove_file(&claim).unwrap();
        fs::File::create(&claim).unwrap().set_len(1 << 20).unwrap();
        prepare_volume(&resolved(claim.clone(), Preparation::Claim)).unwrap();
        fs::remove_file(&claim).unwrap();
        let err = prepare_volume(&resolved(claim, Preparation::Claim)).unwrap_err();
        assert!(matches!(err, HostError::Missing { .. }), "{err}");
    }

    #[test]
    fn a_claim_image_that_is_a_fifo_is_refused_without_blocking() {
        let (_dir, fifo) = crate::testing::temp_path("disk.img");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let err = prepare_volume(&resolved(fifo, Preparation::Claim)).unwrap_err();
        assert!(matches!(err, HostError::NotADisk { .. }), "{err}");
    }

    /// An overlay's backing (an ephemeral volume's claim, a container disk's `disk_N.img`) is
    /// read by the launcher and then by QEMU: a link is refused before either, and no overlay
    /// is made.
    #[test]
    fn a_kernel_file_bound_over_an_image_is_no_disk() {
        // What a bind mount of one over a claim's disk.img would open: procfs and sysfs files
        // are regular files.
        for (file, filesystem) in [
            ("/proc/self/status", "procfs"),
            ("/sys/kernel/mm/transparent_hugepage/enabled", "sysfs"),
        ] {
            let err = open_image(Path::new(file), false).unwrap_err();
            assert_eq!(err.reason(), "UnsafeImage", "{file}");
            assert!(
                matches!(&err, HostError::KernelFile { filesystem: f, .. } if *f == filesystem),
                "{file}: {err}"
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk.img");
        std::fs::write(&image, b"").unwrap();
        assert!(open_image(&image, false).is_ok());
    }

    #[test]
    fn an_overlay_backing_that_is_a_link_is_refused() {
        let (dir, target) = crate::testing::temp_path("secret");
        fs::File::create(&target).unwrap().set_len(1 << 20).unwrap();
        let backing = dir.path().join("disk_0.img");
        std::os::unix::fs::symlink(&target, &backing).unwrap();
        for trust in [Backing::ContainerDisk, Backing::Claim { block: false }] {
            let overlay = dir.path().join("overlay.qcow2");
            let volume = resolved(
                overlay.clone(),
                Preparation::Overlay {
                    backing: backing.clone(),
                    trust,
                },
            );
            let err = prepare_volume(&volume).unwrap_err();
            assert!(matches!(err, HostError::Link { .. }), "{trust:?}: {err}");
            assert!(!overlay.exists(), "{trust:?}");
        }
    }

    #[test]
    fn a_claims_link_to_a_block_device_is_no_block_volume() {
        use crate::volumes::BlockCandidate;
        // A node of its own (loop0's numbers), not one looked for in /dev: not every container
        // has one, and a test that found none passed without testing the rule.
        let (_dir, device) = crate::testing::temp_path("dev");
        crate::testing::block_node(&device, crate::host::DevNumber { major: 7, minor: 0 });
        let link = device.with_file_name("b");
        std::os::unix::fs::symlink(&device, &link).unwrap();
        let candidate = |volume: &str, follow_link| BlockCandidate {
            volume: volume.into(),
            path: link.clone(),
            follow_link,
        };
        let found = block_volumes(&[candidate("claim", false), candidate("host", true)]);
        assert_eq!(found, BTreeSet::from(["host".to_string()]));
    }

    /// A qcow2 header that points at a host file (which QEMU would open for the guest) is
    /// refused in a container disk's image, and is just data in a claim's (the guest wrote it;
    /// the overlay reads it as raw).
    #[test]
    fn an_image_that_points_elsewhere_is_refused_or_read_as_raw() {
        // What the launcher writes on top of a backing is exactly such an image.
        let (dir, _base, pointing) = qcow2::tests::overlay_on_a_raw_base("pointing.qcow2", 1 << 20);

        let container_disk = resolved(
            dir.path().join("cd.qcow2"),
            Preparation::Overlay {
                backing: pointing.clone(),
                trust: Backing::ContainerDisk,
            },
        );
        let err = prepare_volume(&container_disk).unwrap_err();
        assert_eq!(err.reason(), "UnsafeImage");
        assert!(err.to_string().contains("backing file"), "{err}");
        assert!(!dir.path().join("cd.qcow2").exists());

        let claim = resolved(
            dir.path().join("claim-overlay.qcow2"),
            Preparation::Overlay {
                backing: pointing.clone(),
                trust: Backing::Claim { block: false },
            },
        );
        prepare_volume(&claim).unwrap();
        let bytes = fs::read(dir.path().join("claim-overlay.qcow2")).unwrap();
        // The backing format extension (0xe2792aca) says raw: 4 bytes of length, then the name.
        let ext = bytes
            .windows(4)
            .position(|w| w == [0xe2, 0x79, 0x2a, 0xca])
            .unwrap();
        assert_eq!(&bytes[ext + 8..ext + 11], b"raw");
        let size = fs::metadata(&pointing).unwrap().len();
        assert_eq!(u64::from_be_bytes(bytes[24..32].try_into().unwrap()), size);
    }

    #[test]
    fn a_directory_is_not_a_disk() {
        let dir = tempfile::tempdir().unwrap();
        let err = prepare_host_disk(dir.path(), None).unwrap_err();
        assert!(matches!(err, HostError::NotADisk { .. }));
    }
}
