#!/usr/bin/env bash
# The whole test suite, from a clean checkout on a fresh Debian 12 machine (root): set-up, format
# and lint checks, then every test — unit, CLI, and end-to-end against a real private libvirtd and
# a real TCG guest, and the pod (podman kube play deploy/pod.yaml: hotplug, network). Nothing is
# skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build-debian-image.sh   # cached; ~70 s the first time (tests/guests/debian.rs boots it)
cargo fmt --all -- --check
scripts/module-cycles.py   # no two files of src/ import each other, through any circle
# --workspace: the fuzz targets too (a member, fuzz/), so they are known to build (scripts/fuzz.sh
# runs them; `cargo test` replays their corpus through src/fuzzing.rs).
cargo clippy --workspace --all-targets --locked -- -D warnings
# The launcher's image, for the pod tests (tests/pods: tests/pods/pod_manifest.rs hotplug,
# tests/pods/pod_network.rs traffic both ways): cached, seconds when nothing changed.
scripts/build-image.sh
cargo test --all-targets --locked
