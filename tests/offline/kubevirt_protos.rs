//! The project's copies of KubeVirt's protos (`proto/kubevirt/**`) are KubeVirt's files,
//! unchanged below the header that says where they come from and under which license. The copies
//! are the wire contract with an unmodified virt-handler: a field number or package edited here
//! would still build and still pass our own tests, and only fail against a real cluster. So each
//! copy is compared, byte for byte below its header, with KubeVirt's own file in
//! `../shared/kubevirt-wire` (or `VMLAUNCHER_KUBEVIRT_WIRE`), and the two sets must match file for
//! file. No guest, no launcher: fast.

use crate::common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Where KubeVirt's wire files are, found by its protos (this test needs no `handler-replay`).
fn kubevirt_wire() -> PathBuf {
    common::kubevirt::kubevirt_wire_with("cmd/v1/cmd.proto")
}

/// Every `.proto` under `root`, by its path relative to `root`.
fn protos(root: &Path) -> BTreeSet<PathBuf> {
    fn walk(root: &Path, dir: &Path, into: &mut BTreeSet<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(root, &path, into);
            } else if path.extension().is_some_and(|e| e == "proto") {
                into.insert(path.strip_prefix(root).unwrap().to_path_buf());
            }
        }
    }
    let mut found = BTreeSet::new();
    walk(root, root, &mut found);
    found
}

/// A copy's header (its leading `//` lines and the one blank line after them) and the rest.
fn split_header(text: &str) -> (&str, &str) {
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        if !line.starts_with("//") {
            break;
        }
        at += line.len();
    }
    let (header, rest) = text.split_at(at);
    let rest = rest
        .strip_prefix('\n')
        .unwrap_or_else(|| panic!("no blank line after the header:\n{header}"));
    (header, rest)
}

#[test]
fn the_project_protos_are_kubevirts_files_unchanged_below_their_header() {
    let wire = kubevirt_wire();
    let ours_root = Path::new(env!("CARGO_MANIFEST_DIR")).join("proto/kubevirt");
    let (ours, theirs) = (protos(&ours_root), protos(&wire));
    // KubeVirt's four: a copy gone, or one of ours KubeVirt does not have, is drift too.
    assert_eq!(
        theirs.len(),
        4,
        "KubeVirt's protos in {}: {theirs:?}",
        wire.display()
    );
    assert_eq!(
        ours,
        theirs,
        "proto/kubevirt and {} hold different files",
        wire.display()
    );
    for file in &ours {
        let copy = std::fs::read_to_string(ours_root.join(file)).unwrap();
        let original = std::fs::read_to_string(wire.join(file)).unwrap();
        let (header, body) = split_header(&copy);
        // The header says where the file comes from and its license: what the Apache-2.0
        // copy has to carry.
        for needed in ["kubevirt/kubevirt", "Apache License, Version 2.0"] {
            assert!(
                header.contains(needed),
                "{}: the header does not say {needed:?}:\n{header}",
                file.display()
            );
        }
        if body != original {
            let line = body
                .lines()
                .zip(original.lines())
                .position(|(a, b)| a != b)
                .unwrap_or_else(|| body.lines().count().min(original.lines().count()));
            panic!(
                "proto/kubevirt/{} differs from KubeVirt's {} below its header, first at the \
                 copy's line {} (after the header):\n  ours:    {:?}\n  KubeVirt: {:?}",
                file.display(),
                wire.join(file).display(),
                line + 1,
                body.lines().nth(line),
                original.lines().nth(line)
            );
        }
    }
}

/// The comparison itself can fail: one changed field number, or an added line, is caught.
#[test]
fn a_drifted_copy_is_told_apart() {
    let original = "syntax = \"proto3\";\n\nmessage A {\n  string b = 1;\n}\n";
    let copy = format!("// from kubevirt/kubevirt\n\n{original}");
    assert_eq!(split_header(&copy).1, original);
    let drifted = copy.replace("= 1;", "= 2;");
    assert_ne!(split_header(&drifted).1, original);
    let added = format!("{copy}message C {{}}\n");
    assert_ne!(split_header(&added).1, original);
}
