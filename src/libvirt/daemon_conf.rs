//! What a private libvirtd is told in its two files, rewritten at every start: `libvirtd.conf`
//! (its own host UUID, its sockets, few workers, a migration target's TLS listener) and
//! `qemu.conf` (QEMU's user, ownership hand-over, namespaces, seccomp, a migration's TLS).
//! Text only, and the daemon's host UUID that `libvirtd.conf` holds: the daemon that writes them
//! is `daemon.rs`.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Settings of the daemon's QEMU driver.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DaemonOptions {
    /// Leave cgroups alone (`cgroup_controllers = [ ]`): in a pod the launcher owns device rules.
    pub pod_cgroups: bool,
    /// QEMU's capability cache shared with the other launchers of this host (see `capcache`);
    /// `None`: this daemon's own cache only (probes QEMU at every first start).
    pub capability_cache: Option<PathBuf>,
    /// Who QEMU (and swtpm) run as; libvirt gives them each image for as long as the VM uses it.
    pub qemu_user: crate::host::qemu_user::QemuUser,
    /// libvirt's own mount namespace for each domain (a /dev with QEMU's devices only). Not in a
    /// container: its /dev is already the few devices the runtime gave, and libvirtd's
    /// `clone(CLONE_NEWNS)` is refused there under podman ("Kernel does not provide mount
    /// namespace: Permission denied"), as KubeVirt turns it off too.
    pub domain_namespace: bool,
    /// Migrating to or from another machine (`run --tls-dir`): QEMU's credentials, and for a
    /// target (`--listen`) libvirt's TLS listener.
    pub migration_tls: Option<Box<DaemonTls>>,
}

/// The daemon's part of a migration over TCP (`crate::migration_tls`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonTls {
    pub installed: crate::migration_tls::InstalledTls,
    /// A target's: libvirtd serves TLS here (the source's libvirtd connects), and the incoming
    /// QEMU listens on its address (`migration_address`).
    pub listen: Option<std::net::SocketAddr>,
}

pub(super) fn libvirtd_conf(dir: &Path, host_uuid: &str, tls: Option<&DaemonTls>) -> String {
    let mut conf = format!(
        r#"# Written by vmlauncher for its private libvirtd; rewritten at every start.
# Its own: libvirt refuses to migrate to a daemon that reports the source's host UUID, and every
# private libvirtd on a machine would otherwise report the machine's.
host_uuid = "{host_uuid}"
unix_sock_dir = "{sock}"
unix_sock_group = "root"
unix_sock_ro_perms = "0700"
unix_sock_rw_perms = "0700"
unix_sock_admin_perms = "0700"
auth_unix_ro = "none"
auth_unix_rw = "none"
log_outputs = "3:stderr"
# One client (the launcher, now and then virsh): a few workers, not libvirt's 5 to 20 (+5 for
# priority calls), each a thread with its stack (and, with glibc's malloc, its arena).
min_workers = 2
max_workers = 8
prio_workers = 2
admin_min_workers = 1
admin_max_workers = 2
"#,
        sock = dir.join("sock").display()
    );
    if let Some((tls, listen)) = tls.and_then(|t| Some((t, t.listen?))) {
        use crate::migration_tls::{LIBVIRT_CA, LIBVIRT_SERVER_CERT, LIBVIRT_SERVER_KEY};
        let file = |name: &str| tls.installed.libvirt_dir.join(name).display().to_string();
        conf.push_str(&format!(
            r#"# A migration target: the source's libvirtd connects over TLS, with a client
# certificate from the same CA (checked: tls_no_verify_certificate = 0); no TCP without TLS.
listen_tls = 1
listen_tcp = 0
listen_addr = "{addr}"
tls_port = "{port}"
key_file = "{key}"
cert_file = "{cert}"
ca_file = "{ca}"
tls_no_verify_certificate = 0
auth_tls = "none"
# Bounded, as a port anyone may reach must be (security review N-4): few clients still in their
# handshake, few in all (the launcher's own connection among them), and a client that stops
# answering keepalives is dropped.
max_anonymous_clients = 16
max_queued_clients = 16
max_clients = 64
keepalive_interval = 5
keepalive_count = 5
"#,
            addr = listen.ip(),
            port = listen.port(),
            key = file(LIBVIRT_SERVER_KEY),
            cert = file(LIBVIRT_SERVER_CERT),
            ca = file(LIBVIRT_CA),
        ));
    }
    conf
}

pub(super) fn qemu_conf_text(options: &DaemonOptions) -> String {
    let cgroups = if options.pod_cgroups {
        "cgroup_controllers = [ ]\n"
    } else {
        ""
    };
    format!(
        r#"# Written by vmlauncher for its private libvirtd; rewritten at every start.
user = "+{uid}"
group = "+{gid}"
dynamic_ownership = {dynamic}
remember_owner = 0
namespaces = [ {namespaces} ]
stdio_handler = "file"
security_driver = "none"
seccomp_sandbox = 1
clear_emulator_capabilities = 1
swtpm_user = "+{uid}"
swtpm_group = "+{gid}"
{cgroups}{tls}"#,
        tls = migration_tls_conf(options.migration_tls.as_deref()),
        uid = options.qemu_user.uid,
        gid = options.qemu_user.gid,
        namespaces = if options.domain_namespace {
            "\"mount\""
        } else {
            ""
        },
        // A root QEMU opens anything: nothing to hand over. libvirt hands each image to QEMU's
        // user at start and back to root at the end, remembering no owner: a remembered owner
        // lives in the file's xattrs as a reference count, which a launcher killed with SIGKILL
        // leaves behind, and the next start refuses the file as "already in use".
        dynamic = u8::from(!options.qemu_user.is_root()),
    )
}

/// QEMU's part of a migration over TCP: its streams under TLS, both peers' certificates
/// checked. (Where a target's QEMU listens comes with each migration, not from here:
/// `migration_address` may not be a loopback address.)
fn migration_tls_conf(tls: Option<&DaemonTls>) -> String {
    tls.map(|tls| {
        format!(
            "migrate_tls_x509_cert_dir = \"{}\"\nmigrate_tls_x509_verify = 1\n",
            tls.installed.qemu_dir.display()
        )
    })
    .unwrap_or_default()
}

/// A daemon's host UUID in `dir`: made once, random, kept there so that a restarted daemon is
/// the same host.
/// Fails with the file it could not read or write.
pub(super) fn host_uuid_in(dir: &Path) -> Result<String, (PathBuf, io::Error)> {
    let path = dir.join("host-uuid");
    let error = |source| (path.clone(), source);
    if let Ok(text) = fs::read_to_string(&path) {
        if is_uuid(text.trim()) {
            return Ok(text.trim().to_owned());
        }
    }
    let mut bytes = [0u8; 16];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .map_err(error)?;
    // Version 4, variant 1 (RFC 4122): libvirt accepts any well-formed UUID, but not all zeros
    // or all ones.
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let uuid = format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    );
    crate::durable::write_atomically(&path, uuid.as_bytes()).map_err(error)?;
    Ok(uuid)
}

fn is_uuid(text: &str) -> bool {
    let groups: Vec<&str> = text.split('-').collect();
    groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups
            .iter()
            .all(|g| g.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_runtime_dir_has_its_own_host_uuid_kept_across_starts() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let first = host_uuid_in(a.path()).unwrap();
        assert!(is_uuid(&first), "{first}");
        assert_eq!(host_uuid_in(a.path()).unwrap(), first);
        assert_ne!(host_uuid_in(b.path()).unwrap(), first);
        fs::write(a.path().join("host-uuid"), "not a uuid").unwrap();
        let replaced = host_uuid_in(a.path()).unwrap();
        assert!(is_uuid(&replaced) && replaced != first, "{replaced}");
        let conf = libvirtd_conf(a.path(), &replaced, None);
        assert!(
            conf.contains(&format!("host_uuid = \"{replaced}\"")),
            "{conf}"
        );
    }

    #[test]
    fn a_target_on_tcp_listens_with_tls_only_and_every_tls_launcher_verifies_qemus_peer() {
        let dir = Path::new("/run/vm2/libvirt");
        let installed = crate::migration_tls::InstalledTls {
            libvirt_dir: "/run/vm2/tls".into(),
            qemu_dir: "/run/vm2/qemu-tls".into(),
            credentials: {
                let none = crate::migration_tls::Credentials {
                    ca_cert: vec![],
                    server_cert: vec![],
                    server_key: vec![],
                    client_cert: vec![],
                    client_key: vec![],
                };
                crate::migration_tls::MigrationTls {
                    launcher: none.clone(),
                    qemu: none,
                }
            },
        };
        let target = DaemonTls {
            installed: installed.clone(),
            listen: Some("10.0.0.2:7101".parse().unwrap()),
        };
        let conf = libvirtd_conf(dir, "uuid", Some(&target));
        for line in [
            "listen_tls = 1",
            "listen_tcp = 0",
            "listen_addr = \"10.0.0.2\"",
            "tls_port = \"7101\"",
            "key_file = \"/run/vm2/tls/serverkey.pem\"",
            "ca_file = \"/run/vm2/tls/cacert.pem\"",
            "tls_no_verify_certificate = 0",
            "max_anonymous_clients = 16",
            "max_clients = 64",
            "keepalive_interval = 5",
        ] {
            assert!(conf.lines().any(|l| l == line), "{line}: {conf}");
        }
        // A source listens on nothing but its unix socket.
        let source = DaemonTls {
            installed,
            listen: None,
        };
        assert!(!libvirtd_conf(dir, "uuid", Some(&source)).contains("listen_tls"));
        let qemu = qemu_conf_text(&DaemonOptions {
            migration_tls: Some(Box::new(source)),
            ..Default::default()
        });
        assert!(
            qemu.contains(
                "migrate_tls_x509_cert_dir = \"/run/vm2/qemu-tls\"\nmigrate_tls_x509_verify = 1\n"
            ),
            "{qemu}"
        );
        assert!(!qemu_conf_text(&DaemonOptions::default()).contains("migrate_tls"));
    }
}
