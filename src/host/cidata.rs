//! Cloud-init's NoCloud data source: the `cidata` ISO made from a spec's cloud-init volume (with
//! `genisoimage`).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use super::{make_parent, HostError};

/// Builds the NoCloud ISO: volume label `cidata`, the given files at its root. Written next to
/// its final path and renamed, so a half-written ISO is never attached.
pub(super) fn build_cidata(path: &Path, files: &[(String, Vec<u8>)]) -> Result<(), HostError> {
    make_parent(path)?;
    let create = |source| HostError::Create {
        path: path.into(),
        source,
    };
    let parent = path.parent().unwrap_or(Path::new("/"));
    let staging = tempfile::Builder::new()
        .prefix(".cidata-")
        .tempdir_in(parent)
        .map_err(create)?;
    for (name, content) in files {
        fs::write(staging.path().join(name), content).map_err(create)?;
    }
    let tmp = staging.path().join("cidata.iso");
    let mut cmd = Command::new("genisoimage");
    cmd.args(["-quiet", "-volid", "cidata", "-joliet", "-rock", "-output"])
        .arg(&tmp);
    for (name, _) in files {
        cmd.arg(staging.path().join(name));
    }
    run_tool("genisoimage", path, &mut cmd)?;
    // User data may hold secrets: only the ISO's owner reads it (root; QEMU's user while the VM
    // runs, which libvirt hands it to).
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o600)).map_err(create)?;
    fs::rename(&tmp, path).map_err(create)
}

fn run_tool(tool: &'static str, path: &Path, cmd: &mut Command) -> Result<Vec<u8>, HostError> {
    let out = cmd.output().map_err(|source| HostError::ToolMissing {
        tool,
        path: path.into(),
        source,
    })?;
    if !out.status.success() {
        return Err(HostError::Tool {
            tool,
            path: path.into(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(out.stdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidata_iso_has_the_label_and_files() {
        let (dir, iso) = crate::testing::temp_path("ci/cidata.iso");
        let files = vec![
            ("meta-data".to_string(), b"instance-id: a.b\n".to_vec()),
            ("user-data".to_string(), b"#cloud-config\n".to_vec()),
        ];
        build_cidata(&iso, &files).unwrap();
        let bytes = fs::read(&iso).unwrap();
        // The primary volume descriptor (sector 16) holds the volume label at offset 40.
        assert_eq!(&bytes[16 * 2048 + 1..16 * 2048 + 6], b"CD001");
        assert_eq!(&bytes[16 * 2048 + 40..16 * 2048 + 46], b"cidata");
        assert_eq!(
            fs::read_dir(dir.path().join("ci")).unwrap().count(),
            1,
            "no staging files left"
        );
    }
}
