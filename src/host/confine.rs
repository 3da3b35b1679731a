//! Where a spec's host paths (`hostDisk.path`, `kernelPath`, `initrdPath`) lead once links are
//! followed. The spec's own check (`spec::check_host_path`) reads the text only, and knows no
//! runtime dir: a link in an innocent-looking directory, or this launcher's own dirs wherever
//! they are, pass it. Checked when the launcher takes a spec (at start and on every Sync), before
//! anything is made or started, with the places this launcher uses; and a deployment may name the
//! only roots a host disk may be under (`run --host-disk-root`).

use std::fs;
use std::path::{Path, PathBuf};

use crate::spec::{
    denied_places, FieldError, HostPathError, Place, SpecErrors, VirtualMachineInstance,
};

/// The places no spec path may lead into, resolved, and the roots host disks are confined to.
#[derive(Debug, Clone, Default)]
pub(crate) struct HostPathPolicy {
    /// `(dir, what it is, whether a kernel or an initrd may be there under a host disk root)`:
    /// the host's programs and boot files hold no disk, and a kernel there (one the host
    /// itself boots, say) only where the deployment named its dir with `--host-disk-root`.
    denied: Vec<(PathBuf, Place, bool)>,
    /// Empty: no restriction beyond `denied`.
    host_disk_roots: Vec<PathBuf>,
    /// Who must reach each path: QEMU's user (root reaches everything).
    qemu: crate::host::qemu_user::QemuUser,
    /// libvirtd is not the launcher's own (`--connect`): its places are shared with other VMs.
    shared_libvirt: bool,
}

impl HostPathPolicy {
    /// `launcher_dirs`: this launcher's own places (runtime dir, private dir, hotplug dir, QEMU's
    /// capability cache), wherever the command line put them. `host_disk_roots`: if any, the
    /// only directories a host disk may be under.
    pub(crate) fn new(launcher_dirs: &[PathBuf], host_disk_roots: &[PathBuf]) -> HostPathPolicy {
        let fixed = denied_places(true).map(|(dir, place)| {
            let rootable = place == Place::Programs;
            (PathBuf::from(dir), place, rootable)
        });
        let own = launcher_dirs
            .iter()
            .map(|dir| (dir.clone(), Place::Launcher, false));
        HostPathPolicy {
            // A dir that is not there yet resolves as far as it exists: where it would be made.
            denied: fixed
                .chain(own)
                .filter_map(|(dir, place, disk_only)| Some((resolve(&dir).ok()?, place, disk_only)))
                .collect(),
            host_disk_roots: host_disk_roots
                .iter()
                .map(|r| resolve(r).unwrap_or_else(|_| r.clone()))
                .collect(),
            qemu: Default::default(),
            shared_libvirt: false,
        }
    }

    /// libvirtd is shared with other VMs (`--connect`): what it keeps by a spec-given identity
    /// (a persistent TPM's state, by the domain's UUID) may not be asked for.
    pub(crate) fn on_shared_libvirt(mut self, shared: bool) -> HostPathPolicy {
        self.shared_libvirt = shared;
        self
    }

    /// Also refuses a path QEMU's (unprivileged) user cannot reach: QEMU would fail to open it
    /// after the VM was started, with a message that names neither the field nor the directory.
    pub(crate) fn reached_by(mut self, qemu: &crate::host::qemu_user::QemuUser) -> HostPathPolicy {
        self.qemu = qemu.clone();
        self
    }

    /// Every host path of `vmi`, each problem named with its field.
    pub(crate) fn check(&self, vmi: &VirtualMachineInstance) -> Result<(), SpecErrors> {
        let mut problems = Vec::new();
        for (i, volume) in vmi.spec.volumes.iter().enumerate() {
            if let Some(hd) = &volume.host_disk {
                if let Err(why) = self.check_path(&hd.path, true) {
                    problems.push(FieldError::new(
                        format!("spec.volumes[{i}].hostDisk.path"),
                        why,
                    ));
                }
            }
        }
        let container = vmi
            .spec
            .domain
            .firmware
            .as_ref()
            .and_then(|f| f.kernel_boot.as_ref())
            .and_then(|kb| kb.container.as_ref());
        if let Some(c) = container {
            for (field, path) in [
                ("kernelPath", &c.kernel_path),
                ("initrdPath", &c.initrd_path),
            ] {
                let Some(path) = path else { continue };
                if let Err(why) = self.check_path(path, false) {
                    problems.push(FieldError::new(
                        format!("spec.domain.firmware.kernelBoot.container.{field}"),
                        why,
                    ));
                }
            }
        }
        let persistent_tpm = vmi
            .spec
            .domain
            .devices
            .tpm
            .as_ref()
            .and_then(|t| t.persistent);
        if self.shared_libvirt && persistent_tpm == Some(true) {
            problems.push(FieldError::new(
                "spec.domain.devices.tpm.persistent",
                HostPathError::TpmStateShared,
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(SpecErrors(problems))
        }
    }

    /// One path; `disk` for a host disk (kept out of the host's programs too, and confined to
    /// the roots).
    pub(crate) fn check_path(&self, text: &str, disk: bool) -> Result<(), HostPathError> {
        let resolved = resolve(Path::new(text)).map_err(|link| HostPathError::DanglingLink {
            path: text.into(),
            link: link.display().to_string(),
        })?;
        let shown = resolved.display().to_string();
        let under_a_root = self.host_disk_roots.iter().any(|r| resolved.starts_with(r));
        for (dir, place, rootable) in &self.denied {
            if (*rootable && !disk && under_a_root) || !resolved.starts_with(dir) {
                continue;
            }
            let (dir, place) = (dir.display().to_string(), *place);
            return Err(if shown == text {
                HostPathError::Denied {
                    path: text.into(),
                    dir,
                    place,
                }
            } else {
                HostPathError::LeadsInto {
                    path: text.into(),
                    resolved: shown,
                    dir,
                    place,
                }
            });
        }
        if disk && !self.host_disk_roots.is_empty() && !under_a_root {
            let roots: Vec<String> = self
                .host_disk_roots
                .iter()
                .map(|r| r.display().to_string())
                .collect();
            return Err(HostPathError::OutsideRoots {
                path: text.into(),
                resolved: shown,
                roots: roots.join(", "),
            });
        }
        if let Some(blocked) = self.qemu.blocked_on_the_way(&resolved) {
            return Err(HostPathError::Unreachable {
                path: text.into(),
                user: self.qemu.name.clone(),
                dir: blocked.dir.display().to_string(),
                mode: blocked.mode,
                owner: blocked.owner,
                group: blocked.group,
            });
        }
        Ok(())
    }
}

/// `path` with every link followed: canonical where it exists; a path not there yet (a
/// `DiskOrCreate` image, its directories) is its nearest existing ancestor, canonical, with the
/// rest appended, which is where creating it would put it. A link on the way that leads nowhere
/// is an error (the link): what creating through it would make cannot be known here.
pub(crate) fn resolve(path: &Path) -> Result<PathBuf, PathBuf> {
    let mut rest = Vec::new();
    let mut at = path;
    loop {
        match fs::canonicalize(at) {
            Ok(mut real) => {
                real.extend(rest.iter().rev());
                return Ok(real);
            }
            Err(_) if fs::symlink_metadata(at).is_ok() => return Err(at.to_path_buf()),
            Err(_) => match (at.parent(), at.file_name()) {
                (Some(parent), Some(name)) => {
                    rest.push(name.to_os_string());
                    at = parent;
                }
                _ => return Ok(path.to_path_buf()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(own: &[&Path], roots: &[&Path]) -> HostPathPolicy {
        let own: Vec<PathBuf> = own.iter().map(|p| p.to_path_buf()).collect();
        let roots: Vec<PathBuf> = roots.iter().map(|p| p.to_path_buf()).collect();
        HostPathPolicy::new(&own, &roots)
    }

    #[test]
    fn a_link_into_the_runtime_dir_is_refused_as_where_it_leads() {
        let tmp = tempfile::tempdir().unwrap();
        let runtime = tmp.path().join("runtime");
        let data = tmp.path().join("data");
        fs::create_dir_all(&runtime).unwrap();
        fs::create_dir_all(&data).unwrap();
        fs::write(runtime.join("last-sync.1.json"), b"{}").unwrap();
        std::os::unix::fs::symlink(runtime.join("last-sync.1.json"), data.join("disk.img"))
            .unwrap();
        let p = policy(&[&runtime], &[]);
        let text = data.join("disk.img").display().to_string();
        let err = p.check_path(&text, true).unwrap_err();
        let real_runtime = fs::canonicalize(&runtime).unwrap();
        assert_eq!(
            err,
            HostPathError::LeadsInto {
                path: text,
                resolved: real_runtime.join("last-sync.1.json").display().to_string(),
                dir: real_runtime.display().to_string(),
                place: Place::Launcher,
            }
        );
        assert!(
            err.to_string().contains("the launcher's own state"),
            "{err}"
        );

        // Named directly, and through a linked directory, and not there yet.
        let direct = real_runtime
            .join("hotplug-records.json")
            .display()
            .to_string();
        assert!(matches!(
            p.check_path(&direct, true),
            Err(HostPathError::Denied { .. })
        ));
        std::os::unix::fs::symlink(&runtime, data.join("dir")).unwrap();
        let via_dir = data.join("dir/new/disk.img").display().to_string();
        assert!(matches!(
            p.check_path(&via_dir, true),
            Err(HostPathError::LeadsInto { .. })
        ));
        // Elsewhere is fine, existing or not.
        fs::write(data.join("real.img"), b"").unwrap();
        assert_eq!(
            p.check_path(&data.join("real.img").display().to_string(), true),
            Ok(())
        );
        assert_eq!(
            p.check_path(&data.join("x/y.img").display().to_string(), true),
            Ok(())
        );
    }

    #[test]
    fn a_link_into_secrets_is_refused_for_a_kernel_too() {
        let tmp = tempfile::tempdir().unwrap();
        let link = tmp.path().join("initrd.img");
        // /etc exists on every machine the tests run on; it is denied like the secrets' places.
        std::os::unix::fs::symlink("/etc/hostname", &link).unwrap();
        let err = policy(&[], &[])
            .check_path(&link.display().to_string(), false)
            .unwrap_err();
        assert!(
            matches!(&err, HostPathError::LeadsInto { dir, place: Place::System, .. } if dir == "/etc"),
            "{err}"
        );
    }

    #[test]
    fn a_dangling_link_on_the_way_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(tmp.path().join("nowhere"), tmp.path().join("gone")).unwrap();
        let text = tmp.path().join("gone/disk.img").display().to_string();
        assert_eq!(
            policy(&[], &[]).check_path(&text, true),
            Err(HostPathError::DanglingLink {
                path: text,
                link: tmp.path().join("gone").display().to_string(),
            })
        );
    }

    #[test]
    fn host_disk_roots_confine_disks_but_not_kernels() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("disks");
        fs::create_dir_all(&root).unwrap();
        let p = policy(&[], &[&root]);
        let inside = root.join("a.img").display().to_string();
        let outside = tmp.path().join("b.img").display().to_string();
        assert_eq!(p.check_path(&inside, true), Ok(()));
        let err = p.check_path(&outside, true).unwrap_err();
        assert!(matches!(err, HostPathError::OutsideRoots { .. }), "{err}");
        assert!(
            err.to_string()
                .contains(&fs::canonicalize(&root).unwrap().display().to_string()),
            "{err}"
        );
        assert_eq!(p.check_path(&outside, false), Ok(()));
        // A link inside a root that leads out of it is outside.
        std::os::unix::fs::symlink(&outside, root.join("out.img")).unwrap();
        fs::write(&outside, b"").unwrap();
        let via = root.join("out.img").display().to_string();
        assert!(matches!(
            p.check_path(&via, true),
            Err(HostPathError::OutsideRoots { .. })
        ));
    }

    #[test]
    fn a_kernel_in_the_hosts_programs_only_under_a_host_disk_root() {
        // /usr/lib exists on every machine the tests run on.
        let kernel = "/usr/lib/vmlinuz-test";
        let err = policy(&[], &[]).check_path(kernel, false).unwrap_err();
        assert!(
            matches!(
                &err,
                HostPathError::Denied {
                    place: Place::Programs,
                    ..
                }
            ),
            "{err}"
        );
        let rooted = policy(&[], &[Path::new("/usr/lib")]);
        assert_eq!(rooted.check_path(kernel, false), Ok(()));
        // A disk never, whatever the roots.
        assert!(matches!(
            rooted.check_path("/usr/lib/disk.img", true),
            Err(HostPathError::Denied {
                place: Place::Programs,
                ..
            })
        ));
    }

    #[test]
    fn the_whole_spec_is_checked_with_field_names() {
        let tmp = tempfile::tempdir().unwrap();
        let runtime = tmp.path().join("rt");
        fs::create_dir_all(&runtime).unwrap();
        let inside = runtime.join("x.img").display().to_string();
        let text = crate::testing::minimal_vmi(
            "a",
            &format!(
                "    firmware: {{kernelBoot: {{container: {{kernelPath: /k, initrdPath: {inside}}}}}}}\n    devices: {{disks: [{{name: d}}]}}"
            ),
            &format!("  volumes:\n  - {{name: d, hostDisk: {{path: {inside}, type: Disk}}}}"),
        );
        let vmi = crate::spec::parse(&text).unwrap();
        let errors = policy(&[&runtime], &[]).check(&vmi).unwrap_err();
        let paths: Vec<&str> = errors.0.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "spec.volumes[0].hostDisk.path",
                "spec.domain.firmware.kernelBoot.container.initrdPath"
            ]
        );
    }

    #[test]
    fn a_persistent_tpm_is_refused_on_a_shared_libvirtd_only() {
        let vmi = |tpm: &str| {
            let text =
                crate::testing::minimal_vmi("a", &format!("    devices: {{tpm: {tpm}}}"), "");
            crate::spec::parse(&text).unwrap()
        };
        let own = policy(&[], &[]);
        assert!(own.check(&vmi("{persistent: true}")).is_ok());
        let shared = policy(&[], &[]).on_shared_libvirt(true);
        assert!(shared.check(&vmi("{}")).is_ok());
        let errors = shared.check(&vmi("{persistent: true}")).unwrap_err();
        assert_eq!(
            errors.0,
            [FieldError::new(
                "spec.domain.devices.tpm.persistent",
                HostPathError::TpmStateShared
            )]
        );
    }
}
