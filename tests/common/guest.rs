//! The test guest (built by `scripts/build-test-guest.sh`): where it is, its VMI, what it prints
//! about its disks, and the disk images a test gives it.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Generous: a TCG guest boots in 5 s on an idle machine, 8–13 s under load.
pub const BOOT_DEADLINE: Duration = Duration::from_secs(180);
pub const GUEST_DEADLINE: Duration = Duration::from_secs(60);

/// The test guest built by `scripts/build-test-guest.sh`.
pub fn guest_dir() -> PathBuf {
    let dir = std::env::var_os("VMLAUNCHER_GUEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/vmlauncher/test-guest"));
    assert!(
        dir.join("vmlinuz").exists() && dir.join("initrd.img").exists(),
        "no test guest in {} — run scripts/setup.sh first",
        dir.display()
    );
    dir
}

/// The test guest's VMI, booted from the guest in `guest`: `domain` (lines indented 4, under
/// `spec.domain`) follows its memory and kernel boot, `rest` (indented 2, under `spec`) follows
/// the domain. The kernel logs at `loglevel=1` only: its messages would otherwise interleave with
/// the guest's report lines on the one serial console.
pub fn guest_vmi_from(
    guest: &Path,
    name: &str,
    kernel_args: &str,
    domain: &str,
    rest: &str,
) -> String {
    let kernel_args = format!("console=ttyS0 loglevel=1 {kernel_args}");
    format!(
        r#"apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 60
  domain:
    memory:
      guest: 256Mi
    firmware:
      kernelBoot:
        kernelArgs: {kernel_args}
        container:
          kernelPath: {kernel}
          initrdPath: {initrd}
{domain}{rest}"#,
        kernel_args = kernel_args.trim_end(),
        kernel = guest.join("vmlinuz").display(),
        initrd = guest.join("initrd.img").display(),
    )
}

/// [`guest_vmi_from`] the test guest built by `scripts/build-test-guest.sh`.
pub fn guest_vmi(name: &str, kernel_args: &str, domain: &str, rest: &str) -> String {
    guest_vmi_from(&guest_dir(), name, kernel_args, domain, rest)
}

/// A VMI for the test guest with the given disks: `(volume, serial, image path)`, all on scsi.
pub fn guest_spec(name: &str, kernel_args: &str, disks: &[(&str, &str, &Path)]) -> String {
    let mut devices = String::from("    devices:\n      disks:");
    let mut volumes = String::from("  volumes:");
    if disks.is_empty() {
        devices += " []";
        volumes += " []";
    }
    devices += "\n";
    volumes += "\n";
    for (volume, serial, path) in disks {
        devices += &format!(
            "      - name: {volume}\n        disk: {{bus: scsi}}\n        serial: {serial}\n"
        );
        volumes += &format!(
            "  - name: {volume}\n    hostDisk: {{path: {}, type: Disk}}\n",
            path.display()
        );
    }
    guest_vmi(name, kernel_args, &devices, &volumes)
}

/// `text`, a VMI with `disks: []` and `volumes: []`, with hot-pluggable claims
/// `(volume, serial)` on scsi.
pub fn with_claims(text: String, claims: &[(&str, &str)]) -> String {
    if claims.is_empty() {
        return text;
    }
    let mut disks = String::new();
    let mut volumes = String::new();
    for (volume, serial) in claims {
        disks += &format!(
            "      - name: {volume}\n        disk: {{bus: scsi}}\n        serial: {serial}\n"
        );
        volumes += &format!(
            "  - name: {volume}\n    persistentVolumeClaim: {{claimName: {volume}, hotpluggable: true}}\n"
        );
    }
    text.replace("      disks: []\n", &format!("      disks:\n{disks}"))
        .replace("  volumes: []\n", &format!("  volumes:\n{volumes}"))
}

/// The serials in the test guest's `VMLTEST-DISKS <dev>:<serial>:<sectors> ...` line, in the
/// guest's order (by device name).
pub fn guest_serials(line: &str) -> Vec<String> {
    line.split_whitespace()
        .skip(1)
        .filter_map(|d| d.split(':').nth(1).map(str::to_string))
        .collect()
}

/// `items` as a set of owned strings, to compare with what the guest or the launcher lists.
pub fn set<S: AsRef<str>>(items: &[S]) -> std::collections::BTreeSet<String> {
    items.iter().map(|s| s.as_ref().to_string()).collect()
}

/// The scsi disks and hot-pluggable claim volumes of `claims` (volume, serial), as lines of a
/// VMI's `devices.disks` and `volumes`.
pub fn hotplug_claims(claims: &[(&str, &str)]) -> (String, String) {
    let (mut disks, mut volumes) = (String::new(), String::new());
    for (volume, serial) in claims {
        disks += &format!("      - {{name: {volume}, disk: {{bus: scsi}}, serial: {serial}}}\n");
        volumes += &format!(
            "  - {{name: {volume}, persistentVolumeClaim: {{claimName: {volume}, hotpluggable: true}}}}\n"
        );
    }
    (disks, volumes)
}

/// A hot-plugged claim's image, `<dir>/<volume>.img` of `bytes`, where the launcher looks for it.
pub fn hotplug_image(dir: &Path, volume: &str, bytes: u64) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::File::create(dir.join(format!("{volume}.img")))
        .unwrap()
        .set_len(bytes)
        .unwrap();
}

/// A temp dir for disk images: QEMU runs as an unprivileged user, which must pass through the
/// dir (tempfile makes them 0700).
pub fn disk_dir(prefix: &str) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .expect("temp dir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// A sparse file of `mib` MiB at `path`: a raw disk image.
pub fn sparse_file(path: impl AsRef<Path>, mib: u64) {
    let file = std::fs::File::create(path).unwrap();
    file.set_len(mib << 20).unwrap();
    // Whoever a VM's QEMU runs as may open it by its path (a Sync's attach: the launcher
    // changes no host file's owner), as an operator who hot-plugs it grants.
    use std::os::unix::fs::PermissionsExt;
    file.set_permissions(std::fs::Permissions::from_mode(0o666))
        .unwrap();
}
