//! Every `xml-fixtures/*/vmi.yaml` converts to exactly its `domain.xml`, and libvirt accepts that
//! XML: `virt-xml-validate` passes and a real private libvirtd defines it. A fixture libvirt
//! rejects is a bug. `VMLAUNCHER_REGENERATE_FIXTURES=1` rewrites the expected files.
//!
//! A fixture may carry an `options.yaml` for the host facts conversion takes as input:
//! `network: pod` (tap devices instead of user-mode networking) and `blockVolumes: [names]`.

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use vmlauncher::convert::{convert, ConvertOptions, NetworkMode};
use vmlauncher::domain::VirtType;

fn fixtures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("xml-fixtures");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("vmi.yaml").exists())
        .collect();
    dirs.sort();
    assert!(!dirs.is_empty(), "no fixtures in {}", root.display());
    dirs
}

fn converted(dir: &Path) -> (String, String) {
    let text = std::fs::read_to_string(dir.join("vmi.yaml")).unwrap();
    let vmi = vmlauncher::spec::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let opts = options(dir);
    let def = convert(&vmi, &opts).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    (def.name.clone(), def.to_xml())
}

/// What QEMU 7.2's aliases stand for: checked against the real libvirtd below.
fn machines() -> BTreeMap<String, String> {
    [("q35", "pc-q35-7.2"), ("pc", "pc-i440fx-7.2")]
        .into_iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FixtureOptions {
    #[serde(default)]
    network: Option<String>,
    #[serde(default)]
    block_volumes: Vec<String>,
    #[serde(default)]
    claims_by_fd: bool,
}

fn options(dir: &Path) -> ConvertOptions {
    let extra: FixtureOptions = match std::fs::read_to_string(dir.join("options.yaml")) {
        Ok(text) => serde_yaml_ng::from_str(&text).unwrap(),
        Err(_) => FixtureOptions::default(),
    };
    let mut opts = ConvertOptions::new(VirtType::Qemu, "/var/run/vmlauncher/console.log".into());
    opts.machines = machines();
    opts.network = match extra.network.as_deref() {
        Some("pod") => NetworkMode::Pod,
        _ => NetworkMode::Local,
    };
    opts.publish = vmlauncher::convert::Publish::default_for(opts.network);
    opts.block_volumes = extra.block_volumes.into_iter().collect();
    opts.claims_by_fd = extra.claims_by_fd;
    opts
}

#[test]
fn fixtures_convert_exactly() {
    let regenerate = std::env::var_os("VMLAUNCHER_REGENERATE_FIXTURES").is_some();
    for dir in fixtures() {
        let (_, xml) = converted(&dir);
        let expected_path = dir.join("domain.xml");
        if regenerate {
            std::fs::write(&expected_path, &xml).unwrap();
            continue;
        }
        let expected = std::fs::read_to_string(&expected_path).unwrap_or_else(|_| {
            panic!(
                "{} missing: regenerate (see xml-fixtures/README.md)",
                expected_path.display()
            )
        });
        assert_eq!(xml, expected, "{} differs from its fixture", dir.display());
    }
}

#[test]
fn libvirt_accepts_every_fixture() {
    let judge = common::LibvirtJudge::start();
    let caps = judge.hv.capabilities_xml().unwrap();
    let canonical = vmlauncher::domain::canonical_machines(&caps).unwrap();
    for (alias, machine) in machines() {
        assert_eq!(
            canonical.get(&alias),
            Some(&machine),
            "the fixtures' machine for {alias} is not this QEMU's"
        );
    }
    let fixtures = fixtures();
    assert!(fixtures.len() >= 20, "only {} fixtures", fixtures.len());
    for dir in fixtures {
        let (name, xml) = converted(&dir);
        judge.accept(&dir.display().to_string(), &name, &xml);
    }
}
