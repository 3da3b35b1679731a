//! KubeVirt's own example manifests (`tests/data/kubevirt-examples`, Apache-2.0, see SOURCE.md):
//! every one parses without a panic; each either converts into XML that libvirt accepts
//! (`virt-xml-validate` and `defineXML` on a real private libvirtd), or is rejected with errors
//! that name the unsupported fields. The table below is the contract: a manifest moving from one
//! side to the other is a change to review, not an accident.

use crate::common;

use std::path::{Path, PathBuf};

use vmlauncher::convert::{convert, ConvertOptions};
use vmlauncher::domain::VirtType;

/// Each example, and the field paths its rejection must name (empty: it converts).
const EXPECTED: &[(&str, &[&str])] = &[
    ("vmi-alpine-efi.yaml", &[]),
    ("vmi-arm.yaml", &[]),
    (
        "vmi-dra-pgpu.yaml",
        &["spec.resourceClaims", "spec.domain.devices.gpus"],
    ),
    ("vmi-ephemeral.yaml", &[]),
    ("vmi-fedora-isolated.yaml", &[]),
    ("vmi-fedora.yaml", &[]),
    ("vmi-gpu.yaml", &["spec.domain.devices.gpus"]),
    ("vmi-host-disk.yaml", &[]),
    (
        "vmi-kernel-boot.yaml",
        &["spec.domain.firmware.kernelBoot.container.image"],
    ),
    ("vmi-masquerade.yaml", &[]),
    ("vmi-migratable.yaml", &[]),
    ("vmi-multus-multiple-net.yaml", &[]),
    ("vmi-multus-ptp.yaml", &[]),
    ("vmi-nocloud.yaml", &[]),
    ("vmi-preset-small.yaml", &["kind"]),
    ("vmi-pvc.yaml", &[]),
    ("vmi-replicaset-cirros.yaml", &["kind"]),
    ("vmi-sata.yaml", &[]),
    ("vmi-secureboot.yaml", &[]),
    (
        "vmi-sriov.yaml",
        &["spec.domain.devices.interfaces[1].sriov"],
    ),
    ("vmi-usb.yaml", &["spec.domain.devices.hostDevices"]),
    ("vmi-windows.yaml", &[]),
    (
        "vmi-with-sidecar-hook-configmap.yaml",
        &["metadata.annotations[hooks.kubevirt.io/hookSidecars]"],
    ),
    (
        "vmi-with-sidecar-hook.yaml",
        &[
            "metadata.annotations[hooks.kubevirt.io/hookSidecars]",
            "metadata.annotations[smbios.vm.kubevirt.io/baseBoardManufacturer]",
        ],
    ),
];

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/kubevirt-examples")
}

fn options() -> ConvertOptions {
    let mut options = ConvertOptions::new(VirtType::Qemu, "/var/run/vmlauncher/console.log".into());
    // What a pod with two dedicated CPUs would have (vmi-fedora-isolated: 1 vCPU + emulator).
    options.cpus = vec![0, 1];
    options
}

/// The XML of an example, or every error with its path.
fn outcome(file: &str) -> Result<(String, String), Vec<(String, String)>> {
    let text = std::fs::read_to_string(examples_dir().join(file)).unwrap();
    let to_list = |e: vmlauncher::spec::SpecErrors| {
        e.0.into_iter()
            .map(|f| (f.path, f.problem.to_string()))
            .collect::<Vec<_>>()
    };
    let vmi = vmlauncher::spec::parse(&text).map_err(to_list)?;
    let def = convert(&vmi, &options()).map_err(to_list)?;
    Ok((def.name.clone(), def.to_xml()))
}

#[test]
fn the_table_covers_every_example() {
    let mut files: Vec<String> = std::fs::read_dir(examples_dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    files.sort();
    let listed: Vec<&str> = EXPECTED.iter().map(|(f, _)| *f).collect();
    assert_eq!(files, listed);
}

#[test]
fn unsupported_examples_name_what_is_unsupported() {
    for (file, paths) in EXPECTED.iter().filter(|(_, p)| !p.is_empty()) {
        let errors = match outcome(file) {
            Ok(_) => panic!("{file}: converted, but the table says it names {paths:?}"),
            Err(errors) => errors,
        };
        let got: Vec<&str> = errors.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(got, *paths, "{file}: {errors:#?}");
        for (path, message) in &errors {
            assert!(
                message.contains("unsupported"),
                "{file}: {path}: {message:?} does not say unsupported"
            );
        }
    }
}

#[test]
fn supported_examples_are_accepted_by_libvirt() {
    let judge = common::LibvirtJudge::start();
    for (file, _) in EXPECTED.iter().filter(|(_, p)| p.is_empty()) {
        let (name, xml) = outcome(file).unwrap_or_else(|e| panic!("{file}: {e:#?}"));
        judge.accept(file, &name, &xml);
    }
}

/// The CLI's `convert` says the same: XML on stdout, or the unsupported fields and exit 2.
#[test]
fn convert_command_on_every_example() {
    for (file, paths) in EXPECTED {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_vmlauncher"))
            .args(["convert", "--emulation", "tcg"])
            .arg(examples_dir().join(file))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        if paths.is_empty() {
            assert!(out.status.success(), "{file}: {stderr}");
            assert!(out.stdout.starts_with(b"<domain type=\"qemu\">"), "{file}");
        } else {
            assert_eq!(out.status.code(), Some(2), "{file}: {stderr}");
            for path in *paths {
                assert!(stderr.contains(&format!("{path}: ")), "{file}: {stderr}");
            }
        }
    }
}
