//! The sockets of KubeVirt's migration, where KubeVirt puts them (its
//! `pkg/virt-handler/migration-proxy`). The source's virt-handler serves, in the source pod,
//! `<share>/migrationproxy/<vmi uid>-source.sock` (to the target's libvirt) and
//! `<vmi uid>-49152-source.sock` / `<vmi uid>-49153-source.sock` (to the target's memory stream and
//! disk copy), each a byte proxy over TCP to the target node. The target's virt-handler forwards
//! those to the target pod's `/var/run/libvirt/virtqemud-sock` and to the *same* two paths under
//! its share dir, where the target's QEMU listens: libvirt makes the target listen on the path of
//! a `unix://` migration URI, and the pods' paths are the same.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt};
use std::path::{Path, PathBuf};

use crate::host::NodeOwner;

use crate::launcher::IncomingPlan;

/// KubeVirt's `LibvirtDirectMigrationPort` and `LibvirtBlockMigrationPort`: the names of the
/// memory stream's and the disk copy's sockets.
const DIRECT_MIGRATION_PORT: u16 = 49152;
const BLOCK_MIGRATION_PORT: u16 = 49153;

#[derive(Debug, thiserror::Error)]
pub(crate) enum SocketError {
    #[error("cannot prepare the dir of the incoming migration's sockets")]
    Dir(#[from] crate::host::HostError),
    #[error("cannot show this launcher's libvirt at {link}")]
    Link {
        link: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "--libvirt-socket {link}: something else is there (not a link this launcher makes); \
         virt-handler's migration proxy would not reach this launcher's libvirt"
    )]
    Occupied { link: PathBuf },
}

/// `<share>/migrationproxy`: KubeVirt's dir of migration sockets in both pods.
pub(crate) fn proxy_dir(share: &Path) -> PathBuf {
    share.join("migrationproxy")
}

/// KubeVirt's `SourceUnixFile(share, ConstructProxyKey(uid, port))`.
pub(crate) fn proxy_socket(share: &Path, vmi_uid: &str, port: Option<u16>) -> PathBuf {
    let key = match port {
        Some(port) => format!("{vmi_uid}-{port}"),
        None => vmi_uid.to_string(),
    };
    proxy_dir(share).join(format!("{key}-source.sock"))
}

/// Where the source sends the guest, by KubeVirt's conventions: the target's libvirt, memory
/// stream and disk copy through the proxy sockets in `share`; the target pod's paths are this
/// pod's, so the runtime and hotplug dirs stay as they are.
pub(crate) fn kubevirt_plan(
    share: &Path,
    vmi_uid: &str,
    runtime_dir: PathBuf,
    hotplug_dir: PathBuf,
) -> IncomingPlan {
    let unix = |port| format!("unix://{}", proxy_socket(share, vmi_uid, port).display());
    IncomingPlan {
        libvirt_uri: format!(
            "qemu+unix:///system?socket={}",
            proxy_socket(share, vmi_uid, None).display()
        ),
        migration_uri: unix(Some(DIRECT_MIGRATION_PORT)),
        disks_uri: unix(Some(BLOCK_MIGRATION_PORT)),
        runtime_dir,
        hotplug_dir,
        listen_address: None,
        // KubeVirt's handler carries no pins: the images go to QEMU by their paths.
        pins: Default::default(),
    }
}

/// The target's `<share>/migrationproxy`, made QEMU's: its QEMU creates the listening sockets
/// there (KubeVirt gives the dir to its QEMU user the same way).
pub(crate) fn prepare_proxy_dir(share: &Path, uid: u32, gid: u32) -> Result<PathBuf, SocketError> {
    let dir = proxy_dir(share);
    // Opened as itself and given by its descriptor: never a link's target.
    crate::host::private_dirs::qemu_own_dir(&dir, NodeOwner { uid, gid }, 0o755)?;
    Ok(dir)
}

/// Makes `link` lead to `socket` (this launcher's libvirtd), as KubeVirt's pod has its
/// `virtqemud-sock`. A relative link: virt-handler reaches it through `/proc/<pid>/root/...`,
/// where an absolute one would resolve in virt-handler's own root. A link already there is
/// replaced (an earlier launcher's in this pod); anything else is left alone, and refused.
pub(crate) fn show_libvirt(link: &Path, socket: &Path) -> Result<(), SocketError> {
    let err = |source| SocketError::Link {
        link: link.to_path_buf(),
        source,
    };
    let (Some(link_dir), Some(socket_dir), Some(socket_name), Some(link_name)) = (
        link.parent(),
        socket.parent(),
        socket.file_name(),
        link.file_name(),
    ) else {
        return Err(err(io::Error::from(io::ErrorKind::InvalidInput)));
    };
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(link_dir)
        .map_err(err)?;
    let from = link_dir.canonicalize().map_err(err)?;
    let to = socket_dir.canonicalize().map_err(err)?.join(socket_name);
    let wanted = crate::host::private_dirs::relative(&from, &to);
    match fs::symlink_metadata(link) {
        Ok(m) if m.file_type().is_symlink() => {
            if fs::read_link(link).map_err(err)? == wanted {
                return Ok(());
            }
        }
        Ok(_) => {
            return Err(SocketError::Occupied {
                link: link.to_path_buf(),
            })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    // Made aside and renamed over: virt-handler never sees the name missing or half made.
    let mut aside = link_name.to_os_string();
    aside.push(".vmlauncher-new");
    let aside = link_dir.join(aside);
    let _ = fs::remove_file(&aside);
    std::os::unix::fs::symlink(&wanted, &aside).map_err(err)?;
    fs::rename(&aside, link).map_err(err)?;
    let leads_to_socket = fs::metadata(link).is_ok_and(|m| m.file_type().is_socket());
    if !leads_to_socket {
        tracing::warn!(link = %link.display(), "the libvirt socket link leads to no socket yet");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_names_kubevirts_proxy_sockets() {
        let plan = kubevirt_plan(
            Path::new("/var/run/kubevirt"),
            "1234-abcd",
            "/var/run/kubevirt-private/vmlauncher".into(),
            "/var/run/kubevirt/hotplug-disks".into(),
        );
        assert_eq!(
            plan.libvirt_uri,
            "qemu+unix:///system?socket=/var/run/kubevirt/migrationproxy/1234-abcd-source.sock"
        );
        assert_eq!(
            plan.migration_uri,
            "unix:///var/run/kubevirt/migrationproxy/1234-abcd-49152-source.sock"
        );
        assert_eq!(
            plan.disks_uri,
            "unix:///var/run/kubevirt/migrationproxy/1234-abcd-49153-source.sock"
        );
        assert_eq!(
            plan.runtime_dir,
            Path::new("/var/run/kubevirt-private/vmlauncher")
        );
    }

    /// A real socket in a temp dir, reached through the link from a path that resolves
    /// elsewhere, and what is refused.
    #[test]
    fn the_link_leads_to_the_socket_and_replaces_only_links() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("rt/libvirt/sock/libvirt-sock");
        fs::create_dir_all(socket.parent().unwrap()).unwrap();
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let link = dir.path().join("run/libvirt/virtqemud-sock");
        show_libvirt(&link, &socket).unwrap();
        assert_eq!(
            fs::read_link(&link).unwrap(),
            Path::new("../../rt/libvirt/sock/libvirt-sock")
        );
        std::os::unix::net::UnixStream::connect(&link).expect("the link reaches the socket");
        // Again: nothing changes. A stale link is replaced.
        show_libvirt(&link, &socket).unwrap();
        fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink("/elsewhere", &link).unwrap();
        show_libvirt(&link, &socket).unwrap();
        std::os::unix::net::UnixStream::connect(&link).unwrap();
        // A file that is not a link is not ours to replace.
        fs::remove_file(&link).unwrap();
        fs::write(&link, b"").unwrap();
        assert!(matches!(
            show_libvirt(&link, &socket),
            Err(SocketError::Occupied { .. })
        ));
        assert_eq!(fs::read(&link).unwrap(), b"");
    }
}
