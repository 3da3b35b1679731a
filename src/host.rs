//! Host-side preparation of volume sources: checks that a disk's source is there and of the right
//! kind, and creates `DiskOrCreate` images. Paths come in as parameters, so the same code runs on
//! real files in a temp dir in unit tests.

use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("{path} does not exist")]
    Missing { path: PathBuf },
    #[error("{path} is neither a regular file nor a block device")]
    NotADisk { path: PathBuf },
    #[error("cannot create {path}")]
    Create {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot inspect {path}")]
    Inspect {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl HostError {
    /// A CamelCase reason for volume status.
    pub fn reason(&self) -> &'static str {
        match self {
            HostError::Missing { .. } => "SourceNotFound",
            HostError::NotADisk { .. } => "NotADisk",
            HostError::Create { .. } => "CreateFailed",
            HostError::Inspect { .. } => "SourceUnreadable",
        }
    }
}

/// Makes sure a host disk image is there: an existing file or block device, or, when `create` gives
/// a capacity, a new sparse file of that size (never truncating an existing one).
pub fn prepare_host_disk(path: &Path, create: Option<u64>) -> Result<(), HostError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn existing_file_is_accepted_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.img");
        fs::write(&path, b"data").unwrap();
        prepare_host_disk(&path, Some(1 << 20)).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"data", "never truncated");
    }

    #[test]
    fn missing_file_is_an_error_unless_created() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/b.img");
        let err = prepare_host_disk(&path, None).unwrap_err();
        assert_eq!(err.reason(), "SourceNotFound");
        assert!(!path.exists());
        prepare_host_disk(&path, Some(3 << 20)).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().len(), 3 << 20);
    }

    #[test]
    fn a_directory_is_not_a_disk() {
        let dir = tempfile::tempdir().unwrap();
        let err = prepare_host_disk(dir.path(), None).unwrap_err();
        assert!(matches!(err, HostError::NotADisk { .. }));
    }
}
