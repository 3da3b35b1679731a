//! The credentials of a migration between machines (`run --tls-dir DIR`): one directory the
//! operator provides, in the layout QEMU reads (libvirt's `migrate_tls_x509_cert_dir`), every
//! certificate signed by one CA both launchers trust. They guard the three channels a migration
//! over TCP opens:
//!
//! - the target launcher's API (gRPC over TCP, mutual TLS: `api::tcp`),
//! - the source's libvirtd talking to the target's (`qemu+tls`, libvirt's own TLS listener),
//! - QEMU's memory stream and the disks' NBD copy (`VIR_MIGRATE_TLS`).
//!
//! Each side presents its certificate and checks the other's against the CA; the target's
//! server certificate must name the address the source dials (a DNS name or an IP address in its
//! subjectAltName). The launcher copies the files into its runtime dir: libvirt's client wants
//! them under other names (`pkipath`), and QEMU, an unprivileged user, must be able to read its
//! copy while the operator's stays root's.

use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::host::devnode::NodeOwner;

/// The files of `--tls-dir`, named as QEMU reads them.
pub const CA_CERT: &str = "ca-cert.pem";
pub const SERVER_CERT: &str = "server-cert.pem";
pub const SERVER_KEY: &str = "server-key.pem";
pub const CLIENT_CERT: &str = "client-cert.pem";
pub const CLIENT_KEY: &str = "client-key.pem";

/// The names libvirt's client looks for in a `pkipath` (the source libvirtd's connection to the
/// target's), and those the target's libvirtd serves with (`key_file`, `cert_file`, `ca_file`).
pub const LIBVIRT_CA: &str = "cacert.pem";
pub const LIBVIRT_CLIENT_CERT: &str = "clientcert.pem";
pub const LIBVIRT_CLIENT_KEY: &str = "clientkey.pem";
pub const LIBVIRT_SERVER_CERT: &str = "servercert.pem";
pub const LIBVIRT_SERVER_KEY: &str = "serverkey.pem";

/// The ports of a target listening on TCP (`run --incoming --listen ADDR:PORT`), in order
/// from PORT: its API, its libvirtd's TLS listener, QEMU's memory stream, the disks' NBD
/// server. Fixed ports, which a firewall between two machines can name.
pub const TARGET_PORTS: u16 = 4;

/// A certificate chain or key is a few KiB; anything near this is not one.
const MAX_FILE: u64 = 64 * 1024;

/// The credentials as read from `--tls-dir`.
#[derive(Clone, PartialEq, Eq)]
pub struct MigrationTls {
    pub ca_cert: Vec<u8>,
    pub server_cert: Vec<u8>,
    pub server_key: Vec<u8>,
    pub client_cert: Vec<u8>,
    pub client_key: Vec<u8>,
}

/// Keys stay out of logs and `{:?}`.
impl std::fmt::Debug for MigrationTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MigrationTls { .. }")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("--tls-dir {dir}: cannot read {file}")]
    Read {
        dir: PathBuf,
        file: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("--tls-dir {dir}: {file} is not a regular file of at most {MAX_FILE} bytes")]
    NotAFile { dir: PathBuf, file: &'static str },
    #[error("--tls-dir {dir}: {file} holds no PEM {what}")]
    NotPem {
        dir: PathBuf,
        file: &'static str,
        what: &'static str,
    },
    #[error("cannot install the migration credentials in {path}")]
    Install {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl MigrationTls {
    /// Reads the five files of `dir`, each a regular file of at most 64 KiB holding PEM.
    pub fn read(dir: &Path) -> Result<MigrationTls, TlsError> {
        let read = |file: &'static str, what: &'static str| -> Result<Vec<u8>, TlsError> {
            let bytes = read_bounded(&dir.join(file)).map_err(|e| match e {
                None => TlsError::NotAFile {
                    dir: dir.into(),
                    file,
                },
                Some(source) => TlsError::Read {
                    dir: dir.into(),
                    file,
                    source,
                },
            })?;
            let text = String::from_utf8_lossy(&bytes);
            let begins = text.contains("-----BEGIN ") && text.contains(what);
            if !begins {
                return Err(TlsError::NotPem {
                    dir: dir.into(),
                    file,
                    what,
                });
            }
            Ok(bytes)
        };
        Ok(MigrationTls {
            ca_cert: read(CA_CERT, "CERTIFICATE")?,
            server_cert: read(SERVER_CERT, "CERTIFICATE")?,
            server_key: read(SERVER_KEY, "PRIVATE KEY")?,
            client_cert: read(CLIENT_CERT, "CERTIFICATE")?,
            client_key: read(CLIENT_KEY, "PRIVATE KEY")?,
        })
    }

    /// Writes the copies libvirt and QEMU read: `libvirt_dir` (root's, 0700: the client's
    /// `pkipath` and the server's files) and `qemu_dir` (QEMU's user's, 0700, its files 0400).
    /// Rewritten at every start, like the daemon's configuration.
    pub fn install(
        &self,
        libvirt_dir: &Path,
        qemu_dir: &Path,
        qemu: NodeOwner,
    ) -> Result<InstalledTls, TlsError> {
        let libvirt_files: [(&str, &[u8]); 5] = [
            (LIBVIRT_CA, &self.ca_cert),
            (LIBVIRT_CLIENT_CERT, &self.client_cert),
            (LIBVIRT_CLIENT_KEY, &self.client_key),
            (LIBVIRT_SERVER_CERT, &self.server_cert),
            (LIBVIRT_SERVER_KEY, &self.server_key),
        ];
        write_dir(libvirt_dir, &libvirt_files, None)?;
        let qemu_files: [(&str, &[u8]); 5] = [
            (CA_CERT, &self.ca_cert),
            (CLIENT_CERT, &self.client_cert),
            (CLIENT_KEY, &self.client_key),
            (SERVER_CERT, &self.server_cert),
            (SERVER_KEY, &self.server_key),
        ];
        write_dir(qemu_dir, &qemu_files, Some(qemu))?;
        Ok(InstalledTls {
            libvirt_dir: libvirt_dir.into(),
            qemu_dir: qemu_dir.into(),
            credentials: self.clone(),
        })
    }
}

/// Where the launcher put its copies ([`MigrationTls::install`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstalledTls {
    /// libvirt's names: the source libvirtd's `pkipath`, the target libvirtd's server files.
    pub libvirt_dir: PathBuf,
    /// QEMU's names, readable by QEMU's user: `migrate_tls_x509_cert_dir`.
    pub qemu_dir: PathBuf,
    /// What the launcher itself presents and checks (its API over TCP, as server or client).
    pub credentials: MigrationTls,
}

/// The file at `path`, without following a link, if it is a regular file of at most
/// [`MAX_FILE`] bytes (`Err(None)` when it is not).
fn read_bounded(path: &Path) -> Result<Vec<u8>, Option<io::Error>> {
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(nix::libc::ELOOP) => None,
            _ => Some(e),
        })?;
    let meta = file.metadata().map_err(Some)?;
    if !meta.is_file() || meta.len() > MAX_FILE {
        return Err(None);
    }
    let mut bytes = Vec::new();
    file.take(MAX_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(Some)?;
    if bytes.len() as u64 > MAX_FILE {
        return Err(None);
    }
    Ok(bytes)
}

/// Makes `dir` (0700, given to `owner` when there is one) holding exactly `files`, each 0400
/// (0600 while written), replaced whole.
fn write_dir(
    dir: &Path,
    files: &[(&str, &[u8])],
    owner: Option<NodeOwner>,
) -> Result<(), TlsError> {
    let install = |path: &Path| {
        let path = path.to_path_buf();
        move |source| TlsError::Install { path, source }
    };
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(install(dir))?;
    let chown = |path: &Path| -> Result<(), TlsError> {
        if let Some(o) = owner {
            std::os::unix::fs::lchown(path, Some(o.uid), Some(o.gid)).map_err(install(path))?;
        }
        Ok(())
    };
    chown(dir)?;
    for (name, bytes) in files {
        let path = dir.join(name);
        let aside = dir.join(format!(".{name}.new"));
        let _ = fs::remove_file(&aside);
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o400)
            .open(&aside)
            .map_err(install(&aside))?;
        io::Write::write_all(&mut file, bytes).map_err(install(&aside))?;
        drop(file);
        chown(&aside)?;
        fs::rename(&aside, &path).map_err(install(&path))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    const CERT: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
    const KEY: &str = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n";

    fn operator_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in [
            (CA_CERT, CERT),
            (SERVER_CERT, CERT),
            (SERVER_KEY, KEY),
            (CLIENT_CERT, CERT),
            (CLIENT_KEY, KEY),
        ] {
            fs::write(dir.path().join(name), text).unwrap();
        }
        dir
    }

    #[test]
    fn each_file_is_named_when_it_is_missing_a_link_too_large_or_not_pem() {
        let dir = operator_dir();
        fs::remove_file(dir.path().join(CLIENT_KEY)).unwrap();
        let e = MigrationTls::read(dir.path()).unwrap_err();
        assert!(e.to_string().contains("cannot read client-key.pem"), "{e}");

        let dir = operator_dir();
        fs::remove_file(dir.path().join(SERVER_KEY)).unwrap();
        std::os::unix::fs::symlink("/etc/shadow", dir.path().join(SERVER_KEY)).unwrap();
        let e = MigrationTls::read(dir.path()).unwrap_err();
        assert!(
            matches!(
                e,
                TlsError::NotAFile {
                    file: SERVER_KEY,
                    ..
                }
            ),
            "{e}"
        );

        let dir = operator_dir();
        fs::write(dir.path().join(CA_CERT), vec![b'A'; 70_000]).unwrap();
        let e = MigrationTls::read(dir.path()).unwrap_err();
        assert!(matches!(e, TlsError::NotAFile { file: CA_CERT, .. }), "{e}");

        let dir = operator_dir();
        fs::write(dir.path().join(SERVER_CERT), KEY).unwrap();
        let e = MigrationTls::read(dir.path()).unwrap_err();
        assert!(
            e.to_string()
                .contains("server-cert.pem holds no PEM CERTIFICATE"),
            "{e}"
        );
    }

    #[test]
    fn installs_libvirts_names_for_root_and_qemus_for_its_user() {
        let tls = MigrationTls::read(operator_dir().path()).unwrap();
        let run = tempfile::tempdir().unwrap();
        let me = NodeOwner {
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
        };
        let installed = tls
            .install(&run.path().join("tls"), &run.path().join("private/tls"), me)
            .unwrap();
        // Twice: a restarted launcher rewrites them over its predecessor's read-only files.
        let installed = {
            drop(installed);
            tls.install(&run.path().join("tls"), &run.path().join("private/tls"), me)
                .unwrap()
        };
        for name in [
            LIBVIRT_CA,
            LIBVIRT_CLIENT_CERT,
            LIBVIRT_CLIENT_KEY,
            LIBVIRT_SERVER_CERT,
            LIBVIRT_SERVER_KEY,
        ] {
            let meta = fs::metadata(installed.libvirt_dir.join(name)).unwrap();
            assert_eq!(meta.permissions().mode() & 0o777, 0o400, "{name}");
        }
        assert_eq!(
            fs::read(installed.libvirt_dir.join(LIBVIRT_CLIENT_KEY)).unwrap(),
            KEY.as_bytes()
        );
        for name in [CA_CERT, CLIENT_CERT, CLIENT_KEY, SERVER_CERT, SERVER_KEY] {
            let meta = fs::metadata(installed.qemu_dir.join(name)).unwrap();
            assert_eq!((meta.uid(), meta.mode() & 0o777), (me.uid, 0o400), "{name}");
        }
        let dir = fs::metadata(&installed.qemu_dir).unwrap();
        assert_eq!(dir.mode() & 0o777, 0o700);
    }
}
