//! That the two sets of `--tls-dir` come from CAs of their own, judged on the certificates, not
//! on the files' bytes: a CA file with a newline more, or wrapped at another width, is the same
//! CA (security review N-6). Two sets are apart when neither CA is the other (no CA certificate
//! of one set has the key of a CA certificate of the other: the key is what signs, whatever the
//! name on it) and no certificate of one set is signed by the other set's CA (a QEMU
//! certificate issued by the launchers' CA opens their API and libvirtd as well as theirs
//! would; an intermediate CA under the other's root does the same for all it signs).
//!
//! Only the certificates are read here; whether keys go with them is `api::tcp::check_usable`'s.

use std::path::{Path, PathBuf};

use x509_parser::certificate::X509Certificate;
use x509_parser::pem::Pem;

use super::{Credentials, TlsError, CA_CERT, CLIENT_CERT, QEMU_SUBDIR, SERVER_CERT};

/// The PEM blocks of one set's certificate files, each with the file it is in.
struct Blocks {
    dir: PathBuf,
    /// `qemu/` for QEMU's set, empty for the launchers': how the files are named in errors.
    prefix: &'static str,
    blocks: Vec<(&'static str, Pem)>,
}

/// One parsed certificate and where it came from.
struct Cert<'a> {
    file: String,
    is_ca_file: bool,
    x509: X509Certificate<'a>,
}

/// Refuses two sets that share a CA or whose CAs signed each other's certificates.
pub(super) fn check_apart(
    dir: &Path,
    launcher: &Credentials,
    qemu: &Credentials,
) -> Result<(), TlsError> {
    let launcher = Blocks::read(dir, "", launcher)?;
    let qemu = Blocks::read(&dir.join(QEMU_SUBDIR), "qemu/", qemu)?;
    let (launcher, qemu) = (launcher.parse()?, qemu.parse()?);
    for (cas, theirs, whose) in [
        (&launcher, &qemu, "the launchers'"),
        (&qemu, &launcher, "QEMU's"),
    ] {
        for ca in cas.iter().filter(|c| c.is_ca_file) {
            for cert in theirs {
                let how = if cert.x509.public_key().raw == ca.x509.public_key().raw {
                    "has the key of"
                } else if cert
                    .x509
                    .verify_signature(Some(ca.x509.public_key()))
                    .is_ok()
                {
                    "is signed by"
                } else {
                    continue;
                };
                return Err(TlsError::SharedCa {
                    dir: dir.into(),
                    how: format!("{} {how} {whose} CA ({})", cert.file, ca.file),
                });
            }
        }
    }
    Ok(())
}

impl Blocks {
    /// Every CERTIFICATE block of the set's certificate files; a file with none, or a block
    /// that is not base64, is refused.
    fn read(dir: &Path, prefix: &'static str, set: &Credentials) -> Result<Blocks, TlsError> {
        let mut blocks = Vec::new();
        for (file, bytes) in [
            (CA_CERT, &set.ca_cert),
            (SERVER_CERT, &set.server_cert),
            (CLIENT_CERT, &set.client_cert),
        ] {
            let before = blocks.len();
            for pem in Pem::iter_from_buffer(bytes) {
                let pem = pem.map_err(|e| not_a_certificate(dir, file, e))?;
                if pem.label == "CERTIFICATE" {
                    blocks.push((file, pem));
                }
            }
            if blocks.len() == before {
                return Err(TlsError::NotPem {
                    dir: dir.into(),
                    file,
                    what: "CERTIFICATE",
                });
            }
        }
        Ok(Blocks {
            dir: dir.into(),
            prefix,
            blocks,
        })
    }

    /// Each block as an X.509 certificate.
    fn parse(&self) -> Result<Vec<Cert<'_>>, TlsError> {
        self.blocks
            .iter()
            .map(|(file, pem)| {
                let x509 = pem
                    .parse_x509()
                    .map_err(|e| not_a_certificate(&self.dir, file, e))?;
                Ok(Cert {
                    file: format!("{}{file}", self.prefix),
                    is_ca_file: *file == CA_CERT,
                    x509,
                })
            })
            .collect()
    }
}

fn not_a_certificate(
    dir: &Path,
    file: &'static str,
    e: impl std::error::Error + Send + Sync + 'static,
) -> TlsError {
    TlsError::NotACertificate {
        dir: dir.into(),
        file,
        source: Box::new(e),
    }
}
