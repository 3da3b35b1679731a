//! The credentials of a migration between machines (`run --tls-dir DIR`): one directory the
//! operator provides, with two sets in the layout QEMU reads (libvirt's
//! `migrate_tls_x509_cert_dir`: `ca-cert.pem`, `server-cert.pem`, `server-key.pem`,
//! `client-cert.pem`, `client-key.pem`), each from a CA of its own:
//!
//! - `DIR/*.pem`, the launchers': the target launcher's API (gRPC over TCP, mutual TLS:
//!   `api::tcp`) and the source's libvirtd talking to the target's (`qemu+tls`, libvirt's TLS
//!   listener, which runs as root). Read by root only.
//! - `DIR/qemu/*.pem`, QEMU's: its memory stream and the disks' NBD copy (`VIR_MIGRATE_TLS`).
//!   QEMU's user must read its key, so a guest that escapes into QEMU has it: signed by another
//!   CA, it opens neither a launcher's API nor a libvirtd, on this machine or any other. Only
//!   another QEMU waiting for a migration takes it.
//!
//! Each side presents its certificate and checks the other's against the CA; a target's server
//! certificates (both sets) must name the address the source dials (a DNS name or an IP address
//! in its subjectAltName). The launcher copies the files into its runtime dir: libvirt's client
//! wants them under other names (`pkipath`), and QEMU's user its own readable copy while the
//! operator's stays root's.

use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::host::devnode::NodeOwner;

mod cas;

/// The files of each set of `--tls-dir`, named as QEMU reads them.
pub(crate) const CA_CERT: &str = "ca-cert.pem";
pub(crate) const SERVER_CERT: &str = "server-cert.pem";
pub(crate) const SERVER_KEY: &str = "server-key.pem";
pub(crate) const CLIENT_CERT: &str = "client-cert.pem";
pub(crate) const CLIENT_KEY: &str = "client-key.pem";

/// The names libvirt's client looks for in a `pkipath` (the source libvirtd's connection to the
/// target's), and those the target's libvirtd serves with (`key_file`, `cert_file`, `ca_file`).
pub(crate) const LIBVIRT_CA: &str = "cacert.pem";
pub(crate) const LIBVIRT_CLIENT_CERT: &str = "clientcert.pem";
pub(crate) const LIBVIRT_CLIENT_KEY: &str = "clientkey.pem";
pub(crate) const LIBVIRT_SERVER_CERT: &str = "servercert.pem";
pub(crate) const LIBVIRT_SERVER_KEY: &str = "serverkey.pem";

/// The ports of a target listening on TCP (`run --incoming --listen ADDR:PORT`), in order
/// from PORT: its API, its libvirtd's TLS listener, QEMU's memory stream, the disks' NBD
/// server. Fixed ports, which a firewall between two machines can name.
pub const TARGET_PORTS: u16 = 4;

/// A certificate chain or key is a few KiB; anything near this is not one.
const MAX_FILE: u64 = 64 * 1024;

/// QEMU's set: a subdirectory of `--tls-dir`.
pub(crate) const QEMU_SUBDIR: &str = "qemu";

/// One set of credentials: a CA, and a server and a client certificate with their keys.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub ca_cert: Vec<u8>,
    pub server_cert: Vec<u8>,
    pub server_key: Vec<u8>,
    pub client_cert: Vec<u8>,
    pub client_key: Vec<u8>,
}

/// Keys stay out of logs and `{:?}`.
impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credentials { .. }")
    }
}

/// The credentials as read from `--tls-dir`: the launchers' and QEMU's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationTls {
    pub launcher: Credentials,
    pub qemu: Credentials,
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
    #[error("--tls-dir {dir}: {file} is not an X.509 certificate")]
    NotACertificate {
        dir: PathBuf,
        file: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("--tls-dir {dir}: QEMU's credentials (qemu/) must come from a CA of their own, but {how}: QEMU's user reads them, and the launchers' CA would let it into every launcher's API and libvirtd")]
    SharedCa { dir: PathBuf, how: String },
    #[error("--tls-dir {dir}: the {which} certificates and keys are not usable for TLS: {reason}")]
    Unusable {
        dir: PathBuf,
        which: &'static str,
        reason: String,
    },
    #[error("cannot install the migration credentials in {path}")]
    Install {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl MigrationTls {
    /// Reads the launchers' set in `dir` and QEMU's in `dir/qemu`, each file a regular file of
    /// at most 64 KiB holding PEM; QEMU's CA must not be the launchers', nor either sign the
    /// other's certificates (`cas`).
    pub fn read(dir: &Path) -> Result<MigrationTls, TlsError> {
        let launcher = Credentials::read(dir)?;
        let qemu = Credentials::read(&dir.join(QEMU_SUBDIR))?;
        cas::check_apart(dir, &launcher, &qemu)?;
        Ok(MigrationTls { launcher, qemu })
    }
}

impl Credentials {
    /// Reads the five files of `dir`.
    fn read(dir: &Path) -> Result<Credentials, TlsError> {
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
        Ok(Credentials {
            ca_cert: read(CA_CERT, "CERTIFICATE")?,
            server_cert: read(SERVER_CERT, "CERTIFICATE")?,
            server_key: read(SERVER_KEY, "PRIVATE KEY")?,
            client_cert: read(CLIENT_CERT, "CERTIFICATE")?,
            client_key: read(CLIENT_KEY, "PRIVATE KEY")?,
        })
    }
}

impl MigrationTls {
    /// Writes the copies libvirt and QEMU read: `libvirt_dir` (the launchers' set under
    /// libvirt's names: the client's `pkipath` and the server's files; root's, 0700, files 0400)
    /// and `qemu_dir` (QEMU's set; root's with QEMU's group, 0750, files 0440: QEMU's user
    /// reads them and can replace nothing there, nor redirect these writes). Both are under the
    /// runtime dir, root's. Rewritten at every start, like the daemon's configuration.
    pub fn install(
        &self,
        libvirt_dir: &Path,
        qemu_dir: &Path,
        qemu: NodeOwner,
    ) -> Result<InstalledTls, TlsError> {
        let l = &self.launcher;
        let libvirt_files: [(&str, &[u8]); 5] = [
            (LIBVIRT_CA, &l.ca_cert),
            (LIBVIRT_CLIENT_CERT, &l.client_cert),
            (LIBVIRT_CLIENT_KEY, &l.client_key),
            (LIBVIRT_SERVER_CERT, &l.server_cert),
            (LIBVIRT_SERVER_KEY, &l.server_key),
        ];
        write_dir(libvirt_dir, &libvirt_files, None)?;
        let q = &self.qemu;
        let qemu_files: [(&str, &[u8]); 5] = [
            (CA_CERT, &q.ca_cert),
            (CLIENT_CERT, &q.client_cert),
            (CLIENT_KEY, &q.client_key),
            (SERVER_CERT, &q.server_cert),
            (SERVER_KEY, &q.server_key),
        ];
        write_dir(qemu_dir, &qemu_files, Some(qemu.gid))?;
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
    /// QEMU's set, readable by QEMU's group: `migrate_tls_x509_cert_dir`.
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

/// Makes `dir` (root's; 0700, or 0750 with group `group`) holding `files`, each root's 0400
/// (0440 with `group`), replaced whole. `dir`'s parent is root's alone: nothing there is
/// anyone else's to swap, and a `dir` that is not a directory (a link) is refused.
fn write_dir(dir: &Path, files: &[(&str, &[u8])], group: Option<u32>) -> Result<(), TlsError> {
    let install = |path: &Path| {
        let path = path.to_path_buf();
        move |source| TlsError::Install { path, source }
    };
    let (dir_mode, file_mode) = if group.is_some() {
        (0o750, 0o440)
    } else {
        (0o700, 0o400)
    };
    match fs::DirBuilder::new().mode(dir_mode).create(dir) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            if !fs::symlink_metadata(dir).map_err(install(dir))?.is_dir() {
                return Err(install(dir)(io::Error::other("not a directory")));
            }
        }
        made => made.map_err(install(dir))?,
    }
    let own = |path: &Path, mode: u32| -> Result<(), TlsError> {
        std::os::unix::fs::lchown(path, Some(0), Some(group.unwrap_or(0)))
            .map_err(install(path))?;
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(install(path))
    };
    own(dir, dir_mode)?;
    for (name, bytes) in files {
        let path = dir.join(name);
        let aside = dir.join(format!(".{name}.new"));
        let _ = fs::remove_file(&aside);
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o400)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&aside)
            .map_err(install(&aside))?;
        io::Write::write_all(&mut file, bytes).map_err(install(&aside))?;
        drop(file);
        own(&aside, file_mode)?;
        fs::rename(&aside, &path).map_err(install(&path))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    const KEY: &str = "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n";

    /// The files of a `--tls-dir` as the README's script makes it (two CAs of their own), made
    /// once per test binary: `(path under the dir, content)`.
    fn made_by_the_script() -> &'static [(PathBuf, Vec<u8>)] {
        static FILES: std::sync::OnceLock<Vec<(PathBuf, Vec<u8>)>> = std::sync::OnceLock::new();
        FILES.get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/migration-tls.sh");
            let out = std::process::Command::new(script)
                .arg(dir.path())
                .arg("127.0.0.1")
                .output()
                .unwrap();
            assert!(out.status.success(), "{out:?}");
            let mut files = Vec::new();
            for sub in ["", QEMU_SUBDIR] {
                for name in [CA_CERT, SERVER_CERT, SERVER_KEY, CLIENT_CERT, CLIENT_KEY] {
                    let path = Path::new(sub).join(name);
                    files.push((path.clone(), fs::read(dir.path().join(path)).unwrap()));
                }
            }
            files
        })
    }

    fn operator_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join(QEMU_SUBDIR)).unwrap();
        for (path, bytes) in made_by_the_script() {
            fs::write(dir.path().join(path), bytes).unwrap();
        }
        dir
    }

    /// The file at `path` under `dir`.
    fn file(dir: &tempfile::TempDir, path: &str) -> Vec<u8> {
        fs::read(dir.path().join(path)).unwrap()
    }

    #[test]
    fn each_file_is_named_when_it_is_missing_a_link_too_large_or_not_pem() {
        let dir = operator_dir();
        fs::remove_file(dir.path().join(CLIENT_KEY)).unwrap();
        let e = MigrationTls::read(dir.path()).unwrap_err();
        assert!(e.to_string().contains("cannot read client-key.pem"), "{e}");

        let dir = operator_dir();
        fs::remove_file(dir.path().join("qemu").join(CLIENT_KEY)).unwrap();
        let e = MigrationTls::read(dir.path()).unwrap_err();
        assert!(
            e.to_string().contains("qemu: cannot read client-key.pem"),
            "{e}"
        );

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

    /// `pem` with its base64 wrapped at `width` columns (openssl writes 64), and CRLF line ends:
    /// the same certificate, other bytes.
    fn rewrapped(pem: &[u8], width: usize) -> Vec<u8> {
        let text = String::from_utf8(pem.to_vec()).unwrap();
        let body: String = text.lines().filter(|l| !l.starts_with("-----")).collect();
        let mut out = String::from("-----BEGIN CERTIFICATE-----\r\n");
        for chunk in body.as_bytes().chunks(width) {
            out += std::str::from_utf8(chunk).unwrap();
            out += "\r\n";
        }
        out += "-----END CERTIFICATE-----\r\n";
        out.into_bytes()
    }

    /// The review's reproduction (N-6), and what the byte comparison missed besides.
    #[test]
    fn the_launchers_ca_as_qemus_is_refused_however_its_file_is_written() {
        let launchers_ca = file(&operator_dir(), CA_CERT);
        let mut with_a_newline = launchers_ca.clone();
        with_a_newline.push(b'\n');
        let rewrapped = rewrapped(&launchers_ca, 76);
        assert_ne!(rewrapped, launchers_ca);
        for (how, ca) in [
            ("as is", launchers_ca),
            ("with a newline more", with_a_newline),
            ("wrapped at 76 columns", rewrapped),
        ] {
            let dir = operator_dir();
            fs::write(dir.path().join("qemu").join(CA_CERT), &ca).unwrap();
            let e = MigrationTls::read(dir.path()).expect_err(how);
            assert!(
                matches!(&e, TlsError::SharedCa { how, .. }
                    if how == "qemu/ca-cert.pem has the key of the launchers' CA (ca-cert.pem)"),
                "{how}: {e}"
            );
        }
    }

    #[test]
    fn a_certificate_signed_by_the_other_sets_ca_is_refused() {
        // QEMU's client certificate issued by the launchers' CA: it would open their API and
        // libvirtd, though QEMU's own CA file is another CA's.
        let dir = operator_dir();
        for name in [CLIENT_CERT, CLIENT_KEY] {
            fs::write(dir.path().join("qemu").join(name), file(&dir, name)).unwrap();
        }
        let e = MigrationTls::read(dir.path()).unwrap_err();
        let expected = "qemu/client-cert.pem is signed by the launchers' CA (ca-cert.pem)";
        assert!(
            matches!(&e, TlsError::SharedCa { how, .. } if how == expected),
            "{e}"
        );

        // The reverse: the launchers' server certificate issued by QEMU's CA.
        let dir = operator_dir();
        for name in [SERVER_CERT, SERVER_KEY] {
            let qemus = file(&dir, &format!("qemu/{name}"));
            fs::write(dir.path().join(name), qemus).unwrap();
        }
        let e = MigrationTls::read(dir.path()).unwrap_err();
        let expected = "server-cert.pem is signed by QEMU's CA (qemu/ca-cert.pem)";
        assert!(
            matches!(&e, TlsError::SharedCa { how, .. } if how == expected),
            "{e}"
        );
    }

    #[test]
    fn two_cas_of_their_own_are_taken_and_a_certificate_must_parse() {
        let dir = operator_dir();
        let tls = MigrationTls::read(dir.path()).unwrap();
        assert_eq!(tls.qemu.ca_cert, file(&dir, "qemu/ca-cert.pem"));

        let garbage = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        fs::write(dir.path().join("qemu").join(SERVER_CERT), garbage).unwrap();
        let e = MigrationTls::read(dir.path()).unwrap_err();
        assert!(
            matches!(&e, TlsError::NotACertificate { file: SERVER_CERT, dir: d, .. }
                if d.ends_with("qemu")),
            "{e}"
        );
    }

    #[test]
    fn installs_libvirts_names_for_root_and_qemus_readable_by_its_group_alone() {
        let operator = operator_dir();
        let tls = MigrationTls::read(operator.path()).unwrap();
        let run = tempfile::tempdir().unwrap();
        let qemu = NodeOwner {
            uid: 107,
            gid: 4242,
        };
        let (libvirt, qemu_dir) = (run.path().join("tls"), run.path().join("qemu-tls"));
        // Twice: a restarted launcher rewrites them over its predecessor's read-only files.
        tls.install(&libvirt, &qemu_dir, qemu).unwrap();
        let installed = tls.install(&libvirt, &qemu_dir, qemu).unwrap();
        for name in [
            LIBVIRT_CA,
            LIBVIRT_CLIENT_CERT,
            LIBVIRT_CLIENT_KEY,
            LIBVIRT_SERVER_CERT,
            LIBVIRT_SERVER_KEY,
        ] {
            let meta = fs::metadata(installed.libvirt_dir.join(name)).unwrap();
            assert_eq!((meta.uid(), meta.mode() & 0o777), (0, 0o400), "{name}");
        }
        assert_eq!(
            fs::read(installed.libvirt_dir.join(LIBVIRT_CA)).unwrap(),
            file(&operator, CA_CERT)
        );
        for name in [CA_CERT, CLIENT_CERT, CLIENT_KEY, SERVER_CERT, SERVER_KEY] {
            let meta = fs::metadata(installed.qemu_dir.join(name)).unwrap();
            let owner = (meta.uid(), meta.gid(), meta.mode() & 0o777);
            assert_eq!(owner, (0, 4242, 0o440), "{name}");
        }
        // QEMU's set is QEMU's CA's, never the launchers'.
        assert_eq!(
            fs::read(installed.qemu_dir.join(CA_CERT)).unwrap(),
            file(&operator, "qemu/ca-cert.pem")
        );
        let dir = fs::metadata(&installed.qemu_dir).unwrap();
        assert_eq!((dir.uid(), dir.gid(), dir.mode() & 0o777), (0, 4242, 0o750));

        // A link where the directory should be is refused, its target untouched.
        let elsewhere = run.path().join("elsewhere");
        fs::create_dir(&elsewhere).unwrap();
        fs::remove_dir_all(&qemu_dir).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &qemu_dir).unwrap();
        let e = tls.install(&libvirt, &qemu_dir, qemu).unwrap_err();
        assert!(matches!(e, TlsError::Install { .. }), "{e}");
        assert_eq!(fs::read_dir(&elsewhere).unwrap().count(), 0);
    }
}
