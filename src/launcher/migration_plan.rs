//! What a migration's two ends agree on before the guest moves: the source's offer (its last
//! accepted Sync and where its files are), the target's plan (its libvirt, the streams' sockets
//! or ports, its dirs and pins), how the source checks the plan against how it dialled the
//! target, and why a target did not do ([`TargetError`]). Pure: the jobs that use them are
//! `migration_source.rs` and `migration_target.rs`.

use super::types::SyncInput;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;

/// What the source hands the target: enough to prepare the same VM.
#[derive(Debug, Clone)]
pub(crate) struct IncomingOffer {
    pub input: SyncInput,
    pub domain_name: String,
    pub source_runtime_dir: PathBuf,
    pub source_hotplug_dir: PathBuf,
}

/// Where the target takes the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IncomingPlan {
    pub libvirt_uri: String,
    pub migration_uri: String,
    pub disks_uri: String,
    pub runtime_dir: PathBuf,
    pub hotplug_dir: PathBuf,
    /// The target's pins (`host::pin`), by volume: where its QEMU is to open each claim and
    /// hot-plugged file, the inode its launcher checked.
    pub pins: std::collections::BTreeMap<String, PathBuf>,
    /// A target on TCP: the one address its QEMU listens on (`None`: every address). libvirt
    /// takes it from the source's call (`VIR_MIGRATE_PARAM_LISTEN_ADDRESS`): its own
    /// `migration_address` may not be a loopback one.
    pub listen_address: Option<String>,
}

/// Why a migration's target did not do, as the source sees it.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// The target could not be reached, or refused the offer (its own words).
    #[error("{target}: {reason}")]
    Unreachable { target: String, reason: String },
    #[error("{target} does not take a migration over TCP (started without --listen?)")]
    NotOverTcp { target: String },
    #[error("{target} listens on {listen:?}, not an IP address")]
    ListenNotAnAddress { target: String, listen: String },
    #[error("the target answered with another kind of migration ({libvirt_uri}, {migration_uri})")]
    NotLocal {
        libvirt_uri: String,
        migration_uri: String,
    },
    #[error("the target takes the guest over TCP: this launcher needs --tls-dir")]
    NoCredentials,
    #[error("a migration names its target")]
    NotNamed,
    #[error("cannot note the migration")]
    Marker(#[source] std::io::Error),
    /// On the target: the source's spec is not the one this launcher was started with.
    #[error("the source's spec is not this launcher's SPEC")]
    OtherSpec,
}

impl IncomingPlan {
    /// A target dialled over TCP at `host:port` (`run --incoming --listen`): its listeners are
    /// where the source dialled it, on the four fixed ports, whatever its answer names. The
    /// answer is another machine's: only its dirs, its pins and the address its QEMU listens
    /// on (an IP address) are taken from it, and it must be one for TCP.
    pub(crate) fn dialled_over_tcp(
        mut self,
        host: &str,
        port: u16,
    ) -> Result<IncomingPlan, TargetError> {
        if !self.migration_uri.starts_with("tcp://") {
            return Err(TargetError::NotOverTcp {
                target: format!("{host}:{port}"),
            });
        }
        if let Some(listen) = &self.listen_address {
            if listen.parse::<std::net::IpAddr>().is_err() {
                return Err(TargetError::ListenNotAnAddress {
                    target: format!("{host}:{port}"),
                    listen: listen.clone(),
                });
            }
        }
        let at = |offset: u16| format!("{host}:{}", u32::from(port) + u32::from(offset));
        self.libvirt_uri = format!("qemu+tls://{}/system", at(1));
        self.migration_uri = format!("tcp://{}", at(2));
        self.disks_uri = format!("tcp://{}", at(3));
        Ok(self)
    }

    /// A target dialled by its unix socket, on this machine: its answer must name unix
    /// sockets only, the local kind of migration.
    pub(crate) fn dialled_locally(self) -> Result<IncomingPlan, TargetError> {
        let local = self.libvirt_uri.starts_with("qemu+unix:///")
            && self.migration_uri.starts_with("unix:///")
            && self.disks_uri.starts_with("unix:///")
            && self.listen_address.is_none();
        if !local {
            return Err(TargetError::NotLocal {
                libvirt_uri: self.libvirt_uri,
                migration_uri: self.migration_uri,
            });
        }
        Ok(self)
    }

    /// Whether the target takes the guest over TCP (between machines), not unix sockets.
    pub(crate) fn over_tcp(&self) -> bool {
        self.migration_uri.starts_with("tcp://")
    }
}

/// Each image of the source's `xml` the target pinned: its path here, and the target's pin. A
/// disk's image is pinned as its volume, its overlay's backing as `<volume>.backing`.
pub(super) fn pinned_sources<'a>(
    xml: &str,
    pins: &'a std::collections::BTreeMap<String, PathBuf>,
) -> Result<Vec<(PathBuf, &'a std::path::Path)>, crate::domain::LiveXmlError> {
    let doc = roxmltree::Document::parse(xml).map_err(crate::domain::LiveXmlError::Malformed)?;
    let file_of = |node: roxmltree::Node| {
        node.children()
            .find(|c| c.has_tag_name("source"))?
            .attribute("file")
            .map(PathBuf::from)
    };
    let mut moves = Vec::new();
    for disk in doc.descendants().filter(|n| n.has_tag_name("disk")) {
        let Some(volume) = disk
            .children()
            .find(|c| c.has_tag_name("alias"))
            .and_then(|a| a.attribute("name"))
            .and_then(|a| a.strip_prefix(crate::domain::USER_ALIAS_PREFIX))
        else {
            continue;
        };
        let backing = disk.children().find(|c| c.has_tag_name("backingStore"));
        let images = [
            (volume.to_owned(), file_of(disk)),
            (
                crate::host::pin::backing_name(volume),
                backing.and_then(file_of),
            ),
        ];
        for (name, here) in images {
            if let (Some(here), Some(there)) = (here, pins.get(&name)) {
                moves.push((here, there.as_path()));
            }
        }
    }
    Ok(moves)
}

/// Asks the target to get ready (the API's client call: the launcher knows no gRPC).
pub(crate) type PrepareTarget = Box<
    dyn FnOnce(
            IncomingOffer,
        ) -> Pin<Box<dyn Future<Output = Result<IncomingPlan, TargetError>> + Send>>
        + Send,
>;

/// The target's plan for a migration into `runtime_dir`: its libvirt, and two sockets in
/// `qemu_dir`, the one dir its QEMU may create files in.
pub(crate) fn incoming_plan(
    libvirt_uri: String,
    runtime_dir: PathBuf,
    qemu_dir: &std::path::Path,
    hotplug_dir: PathBuf,
) -> IncomingPlan {
    let socket = |name: &str| format!("unix://{}", qemu_dir.join(name).display());
    IncomingPlan {
        libvirt_uri,
        migration_uri: socket("migration.sock"),
        disks_uri: socket("migration-disks.sock"),
        runtime_dir,
        hotplug_dir,
        listen_address: None,
        pins: Default::default(),
    }
}

/// [`incoming_plan`] for a target listening at `listen`
/// (`crate::migration_tls::TARGET_PORTS`).
pub(crate) fn incoming_plan_tcp(
    listen: std::net::SocketAddr,
    runtime_dir: PathBuf,
    hotplug_dir: PathBuf,
) -> IncomingPlan {
    let at = |offset: u16| std::net::SocketAddr::new(listen.ip(), listen.port() + offset);
    IncomingPlan {
        libvirt_uri: format!("qemu+tls://{}/system", at(1)),
        migration_uri: format!("tcp://{}", at(2)),
        disks_uri: format!("tcp://{}", at(3)),
        runtime_dir,
        hotplug_dir,
        // A wildcard too: without one libvirt listens on every address of both families.
        listen_address: Some(listen.ip().to_string()),
        pins: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::migratable;
    use std::path::Path;

    #[test]
    fn a_tcp_target_is_reached_where_it_was_dialled_whatever_it_answers() {
        let plan = incoming_plan_tcp(
            "0.0.0.0:7100".parse().unwrap(),
            "/run/vm2".into(),
            "/run/vm2/hotplug".into(),
        );
        assert!(plan.over_tcp());
        // Where the target's QEMU listens, wildcard or not; but no address to dial.
        assert_eq!(plan.listen_address.as_deref(), Some("0.0.0.0"));
        let reached = plan
            .clone()
            .dialled_over_tcp("node-2.example", 7100)
            .unwrap();
        assert_eq!(reached.libvirt_uri, "qemu+tls://node-2.example:7101/system");
        assert_eq!(reached.migration_uri, "tcp://node-2.example:7102");
        assert_eq!(reached.disks_uri, "tcp://node-2.example:7103");

        // An answer naming other places is not followed.
        let mut lying = plan.clone();
        lying.libvirt_uri = "qemu+ext://x/system?command=/sbin/poweroff".into();
        lying.migration_uri = "tcp://elsewhere:1".into();
        let reached = lying.dialled_over_tcp("[fd00::2]", 7100).unwrap();
        assert_eq!(reached.libvirt_uri, "qemu+tls://[fd00::2]:7101/system");
        assert_eq!(reached.migration_uri, "tcp://[fd00::2]:7102");
        let mut unix = plan.clone();
        unix.migration_uri = "unix:///run/x.sock".into();
        assert!(unix.dialled_over_tcp("node-2", 7100).is_err());
        let mut listen = plan;
        listen.listen_address = Some("x' --evil".into());
        assert!(listen.dialled_over_tcp("node-2", 7100).is_err());

        // A target on unix sockets answers with those only.
        let local = incoming_plan(
            "qemu+unix:///system?socket=/run/vm2/libvirt/sock/libvirt-sock".into(),
            "/run/vm2".into(),
            Path::new("/run/vm2/private"),
            "/run/vm2/hotplug".into(),
        );
        assert!(!local.over_tcp());
        assert_eq!(local.clone().dialled_locally().unwrap(), local);
        let mut remote = local;
        remote.libvirt_uri = "qemu+tls://elsewhere/system".into();
        assert!(remote.dialled_locally().is_err());
    }

    #[test]
    fn what_the_target_pinned_is_named_by_its_pin_and_the_rest_moves_by_directory() {
        let xml = "<domain><devices>\
            <disk type='file' device='disk'><source file='/run/a/pins/hot1.img'/>\
              <target dev='sdb' bus='scsi'/><alias name='ua-hot1'/></disk>\
            <disk type='file' device='disk'><source file='/run/a/pins/hot2.img'/>\
              <target dev='sdc' bus='scsi'/><alias name='ua-hot2'/></disk>\
            <disk type='file' device='disk'><source file='/claims/c/disk.img' fdgroup='vml-c'/>\
              <target dev='sdd' bus='scsi'/><alias name='ua-c'/></disk>\
            <disk type='file' device='disk'><source file='/run/a/private/cd.qcow2'/>\
              <backingStore type='file'><format type='raw'/>\
                <source file='/run/a/container-disks/disk_0.img' fdgroup='vml-cd-backing'/>\
              <backingStore/></backingStore>\
              <target dev='sde' bus='scsi'/><alias name='ua-cd'/></disk>\
            </devices></domain>";
        let pins = [
            ("hot1".to_string(), PathBuf::from("/run/b/pins/hot1.img")),
            ("c".to_string(), PathBuf::from("/run/b/pins/c.img")),
            (
                "cd.backing".to_string(),
                PathBuf::from("/run/b/pins/cd.backing.img"),
            ),
        ]
        .into_iter()
        .collect();
        let pinned = pinned_sources(xml, &pins).unwrap();
        let mut moves: Vec<(&Path, &Path)> = vec![
            (Path::new("/run/a/pins"), Path::new("/hot/b")),
            (Path::new("/run/a"), Path::new("/run/b")),
        ];
        moves.extend(pinned.iter().map(|(here, there)| (here.as_path(), *there)));
        let moved = migratable::for_target(xml, &moves);
        assert!(moved.contains("'/run/b/pins/hot1.img'"), "{moved}");
        assert!(moved.contains("'/run/b/pins/c.img'"), "{moved}");
        // An overlay's backing by its pin there; the overlay itself moves with the runtime dir.
        assert!(moved.contains("'/run/b/pins/cd.backing.img'"), "{moved}");
        assert!(moved.contains("'/run/b/private/cd.qcow2'"), "{moved}");
        // Not pinned there (its launcher could not mount): the volume's path in its hotplug dir.
        assert!(moved.contains("'/hot/b/hot2.img'"), "{moved}");
        assert!(!moved.contains("fdgroup"), "{moved}");
    }
}
