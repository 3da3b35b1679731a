//! Cloud-init's NoCloud data source: the `cidata` ISO made from a spec's cloud-init volume (with
//! `genisoimage`).

use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use nix::sys::memfd::{memfd_create, MFdFlags};

use super::root_dir::RootDir;
use super::HostError;

/// Builds the NoCloud ISO `name` in `dir`: volume label `cidata`, the given files at its root.
/// Each file's content goes to `genisoimage` in a memory file (user data may hold secrets: it
/// is written nowhere but the ISO), and the ISO comes from its standard output into a file made
/// aside in `dir` and renamed: a half-written ISO is never attached. Only the ISO's owner reads
/// it (root; QEMU's user while the VM runs, given it by descriptor). Returns the ISO, open.
pub(super) fn build_cidata(
    dir: &RootDir,
    name: &OsStr,
    files: &[(String, Vec<u8>)],
) -> Result<fs::File, HostError> {
    let path = dir.path().join(name);
    let create = |source| HostError::Create {
        path: path.clone(),
        source,
    };
    let mut inputs = Vec::with_capacity(files.len());
    for (file_name, content) in files {
        let memory = memfd_create(file_name.as_str(), MFdFlags::MFD_CLOEXEC)
            .map_err(|e| create(e.into()))?;
        let mut memory = fs::File::from(memory);
        memory.write_all(content).map_err(create)?;
        // As a file written under the default umask is: the guest's cloud-init reads it.
        nix::sys::stat::fchmod(
            memory.as_fd(),
            nix::sys::stat::Mode::from_bits_truncate(0o644),
        )
        .map_err(|e| create(e.into()))?;
        inputs.push(memory);
    }
    let mut cmd = Command::new("genisoimage");
    // `-follow-links`: a `/proc/self/fd/N` is a link; the file is what it leads to.
    cmd.args([
        "-quiet",
        "-follow-links",
        "-volid",
        "cidata",
        "-joliet",
        "-rock",
    ])
    .arg("-graft-points");
    for ((file_name, _), memory) in files.iter().zip(&inputs) {
        cmd.arg(format!(
            "{}=/proc/self/fd/{}",
            graft_escaped(file_name),
            memory.as_raw_fd()
        ));
    }
    let inherited: Vec<RawFd> = inputs.iter().map(AsRawFd::as_raw_fd).collect();
    // SAFETY: between fork and exec only `fcntl`, which is async-signal-safe, on descriptors
    // this process keeps open until the child has run.
    unsafe {
        cmd.pre_exec(move || {
            for fd in &inherited {
                if libc::fcntl(*fd, libc::F_SETFD, 0) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    dir.replace_with(name, 0o600, |iso| {
        cmd.stdin(Stdio::null())
            .stdout(iso.try_clone().map_err(create)?);
        run_tool("genisoimage", &path, &mut cmd).map(drop)
    })
}

/// `name` as a `-graft-points` path in the ISO: `=` and `\` escaped.
fn graft_escaped(name: &str) -> String {
    name.replace('\\', "\\\\").replace('=', "\\=")
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
            (
                "user-data".to_string(),
                b"#cloud-config\nsecret: 1\n".to_vec(),
            ),
        ];
        let opened = RootDir::open(iso.parent().unwrap()).unwrap();
        build_cidata(&opened, OsStr::new("cidata.iso"), &files).unwrap();
        let bytes = fs::read(&iso).unwrap();
        // The primary volume descriptor (sector 16) holds the volume label at offset 40.
        assert_eq!(&bytes[16 * 2048 + 1..16 * 2048 + 6], b"CD001");
        assert_eq!(&bytes[16 * 2048 + 40..16 * 2048 + 46], b"cidata");
        assert_eq!(
            fs::read_dir(dir.path().join("ci")).unwrap().count(),
            1,
            "no staging files left"
        );
        use std::os::unix::fs::MetadataExt;
        assert_eq!(fs::metadata(&iso).unwrap().mode() & 0o7777, 0o600);
        // Each file is in the ISO as a file with its content (its Rock Ridge name and its
        // Joliet one), not as the link to the memory file it was given through.
        let isoinfo = |args: &[&str]| {
            let out = Command::new("isoinfo")
                .arg("-i")
                .arg(&iso)
                .args(args)
                .output()
                .expect("isoinfo (genisoimage's package)");
            assert!(out.status.success(), "{out:?}");
            String::from_utf8(out.stdout).unwrap()
        };
        for (name, content) in &files {
            let inside = format!("/{name}");
            assert_eq!(isoinfo(&["-R", "-x", &inside]).as_bytes(), content);
            assert_eq!(isoinfo(&["-J", "-x", &inside]).as_bytes(), content);
        }
        let listing = isoinfo(&["-R", "-l"]);
        let user_data = listing
            .lines()
            .find(|l| l.ends_with(" user-data "))
            .unwrap_or_else(|| panic!("{listing}"));
        assert!(user_data.starts_with("-r"), "{user_data}");
    }
}
