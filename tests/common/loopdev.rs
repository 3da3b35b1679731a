//! Loop devices: real block devices for block hotplug, detached on drop.

use std::path::{Path, PathBuf};

use super::{sparse_file, succeeded};

/// A loop device on a file in a temp dir, detached on drop.
pub struct Loop {
    pub dev: PathBuf,
    pub major: u32,
    pub minor: u32,
}

impl Loop {
    pub fn new(dir: &Path, name: &str, mib: u64, read_only: bool) -> Loop {
        let file = dir.join(format!("{name}.raw"));
        sparse_file(&file, mib);
        let mut cmd = std::process::Command::new("losetup");
        cmd.args(["--find", "--show"]);
        if read_only {
            cmd.arg("--read-only");
        }
        let out = succeeded(cmd.arg(&file).output().expect("losetup"), "losetup");
        let dev = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
        let rdev = std::os::unix::fs::MetadataExt::rdev(&std::fs::metadata(&dev).unwrap());
        Loop {
            dev,
            major: libc::major(rdev),
            minor: libc::minor(rdev),
        }
    }

    pub fn number(&self) -> String {
        format!("{}:{}", self.major, self.minor)
    }

    /// Gives the device to a launcher the way a node daemon gives a pod one: a node of it in
    /// the launcher's hotplug dir, as `name`.
    pub fn give_to(&self, hotplug_dir: &Path, name: &str) {
        nix::sys::stat::mknod(
            &hotplug_dir.join(name),
            nix::sys::stat::SFlag::S_IFBLK,
            nix::sys::stat::Mode::from_bits_truncate(0o600),
            nix::sys::stat::makedev(self.major.into(), self.minor.into()),
        )
        .expect("mknod in the hotplug dir");
    }

    pub fn block_device(&self) -> vmlauncher::api::proto::BlockDevice {
        use vmlauncher::api::proto;
        proto::BlockDevice {
            source: Some(proto::block_device::Source::Number(proto::DeviceNumber {
                major: self.major,
                minor: self.minor,
            })),
        }
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup")
            .arg("-d")
            .arg(&self.dev)
            .status();
    }
}
