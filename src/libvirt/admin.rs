//! libvirt's admin interface, the little of it the launcher needs: which clients a private
//! libvirtd has on its TLS listener, and whether each finished its handshake. A migration target
//! asks before it closes that listener (`Connector::close_tls_listener`): the source's libvirtd,
//! which drives the migration, must have gone first.
//!
//! Asked through `virt-admin` (libvirt-clients), not `libvirt-admin.so`: that library carries
//! its own copy of libvirt's object types, and loaded beside `libvirt.so` in one process both
//! register the same GLib types, and libvirt's calls fail.

use std::path::Path;
use std::process::{Command, Stdio};

/// libvirtd's own server (the other is the admin server).
const SERVER: &str = "libvirtd";
/// What `virt-admin client-info` prints once libvirtd checked the client's certificate, that
/// is after its handshake (`VIR_CLIENT_INFO_X509_DISTINGUISHED_NAME`).
const X509_DNAME: &str = "tls_x509_dname";
/// What libvirt answers `client-info` about a client not through its handshake.
const NO_IDENTITY: &str = "No identity information available for client";

#[derive(Debug, thiserror::Error)]
pub(crate) enum AdminError {
    #[error("cannot run virt-admin (is libvirt-clients installed?)")]
    Spawn(#[source] std::io::Error),
    #[error("virt-admin {command} on {uri} failed: {stderr}")]
    Failed {
        command: &'static str,
        uri: String,
        stderr: String,
    },
}

/// The clients of a libvirtd's TLS listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct TlsClients {
    /// Through their handshake, with a certificate libvirtd checked: a libvirtd driving a
    /// migration, or a person with a launcher's certificate.
    pub authenticated: usize,
    /// Connected, not (yet) through a handshake: anyone who reaches the port.
    pub anonymous: usize,
}

/// The admin URI of the libvirtd whose sockets are in `sock_dir`.
pub(crate) fn admin_uri(sock_dir: &Path) -> String {
    format!(
        "libvirtd:///system?socket={}",
        sock_dir.join("libvirt-admin-sock").display()
    )
}

/// One `virt-admin` command's standard output.
fn virt_admin(uri: &str, command: &'static str, args: &[&str]) -> Result<String, AdminError> {
    let out = Command::new("virt-admin")
        .args(["-q", "-c", uri, command])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(AdminError::Spawn)?;
    if !out.status.success() {
        return Err(AdminError::Failed {
            command,
            uri: uri.into(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Counts the TLS clients of the libvirtd at admin `uri`. A client libvirt cannot describe
/// (it left between the list and the question, or anything else) counts as authenticated: it
/// may be the source's libvirtd, and the next look, which will not list one that left, decides.
pub(crate) fn tls_clients(uri: &str) -> Result<TlsClients, AdminError> {
    let list = virt_admin(uri, "srv-clients-list", &[SERVER])?;
    let mut counted = TlsClients::default();
    for id in tls_client_ids(&list) {
        match virt_admin(uri, "client-info", &[SERVER, id]) {
            Ok(info) if !has_x509_dname(&info) => counted.anonymous += 1,
            // libvirt 9.0 gives a client an identity once it is through its handshake: one
            // without is anyone who reached the port (seen: the silent peers of the test).
            Err(AdminError::Failed { stderr, .. }) if stderr.contains(NO_IDENTITY) => {
                counted.anonymous += 1
            }
            _ => counted.authenticated += 1,
        }
    }
    Ok(counted)
}

/// The ids of the TLS clients in `srv-clients-list`'s table (` Id   Transport   Connected since`).
fn tls_client_ids(table: &str) -> impl Iterator<Item = &str> {
    table.lines().filter_map(|line| {
        let mut columns = line.split_whitespace();
        let id = columns.next()?;
        let tls = columns.next() == Some("tls") && id.bytes().all(|b| b.is_ascii_digit());
        tls.then_some(id)
    })
}

/// `client-info`'s `key : value` lines name the client's certificate.
fn has_x509_dname(info: &str) -> bool {
    info.lines().any(|line| {
        line.split_once(':')
            .is_some_and(|(key, value)| key.trim() == X509_DNAME && !value.trim().is_empty())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_clients_are_read_from_virt_admins_tables() {
        let list = " Id   Transport   Connected since\n-------------------------------------------------\n 1    unix        2026-11-28 01:00:00+0000\n 7    tls         2026-11-28 01:00:01+0000\n 12   tls         2026-11-28 01:00:02+0000\n";
        assert_eq!(tls_client_ids(list).collect::<Vec<_>>(), ["7", "12"]);
        let done = "id             : 7\nconnection_time: 2026-11-28 01:00:01+0000\ntransport      : tls\nreadonly       : no\nsock_addr      : 127.0.0.1:40002\ntls_x509_dname : CN=source,O=vmlauncher\n";
        assert!(has_x509_dname(done));
        let silent = "id             : 12\nconnection_time: 2026-11-28 01:00:02+0000\ntransport      : tls\nreadonly       : no\nsock_addr      : 127.0.0.3:40003\n";
        assert!(!has_x509_dname(silent));
    }
}
