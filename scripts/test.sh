#!/usr/bin/env bash
# The whole test suite, from a clean checkout on a fresh Debian 12 machine (root): set-up, format
# and lint checks, then every test — unit, CLI, and end-to-end against a real private libvirtd and
# a real TCG guest, and the pod (podman kube play deploy/pod.yaml: hotplug, network). Nothing is
# skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
# Where the minutes go: each step's end, in seconds from the start.
mark() { echo "test.sh: $1 after $(( $(date +%s) - t0 )) s"; }
scripts/setup.sh
scripts/build-debian-image.sh   # cached; ~70 s the first time (tests/guests/debian.rs boots it)
mark "set-up"
cargo fmt --all -- --check
scripts/module-cycles.py   # no two files of src/ import each other, through any circle
scripts/function-lengths.py   # no function of src/ over 100 lines, no file over 800
mark "format and house checks"
# The build dir is kept per machine, as the test guest and the images are: under
# /var/cache/vmlauncher a later clean clone finds the crates of crates.io already built (their
# artefacts do not depend on where the clone is) and builds only its own, about two minutes of
# the compile on two cores. Nothing depends on it being there: an empty one builds everything.
# Bounded: emptied when it has grown past 8 GiB (a run leaves about 1.5). A CARGO_TARGET_DIR
# given by the caller wins; VMLAUNCHER_BUILD_CACHE=0 builds in the clone's own target/.
if [ -z "${CARGO_TARGET_DIR:-}" ] && [ "${VMLAUNCHER_BUILD_CACHE:-1}" != 0 ]; then
  export CARGO_TARGET_DIR=/var/cache/vmlauncher/cargo-target
  mkdir -p "$CARGO_TARGET_DIR"
  if [ "$(du -sb "$CARGO_TARGET_DIR" | cut -f1)" -gt $((8 << 30)) ]; then
    echo "test.sh: $CARGO_TARGET_DIR is over 8 GiB: emptied"
    rm -rf "$CARGO_TARGET_DIR" && mkdir -p "$CARGO_TARGET_DIR"
  fi
fi
# One compile lints and builds: clippy's driver is the compiler of the workspace's own crates
# (RUSTC_WORKSPACE_WRAPPER, as `cargo clippy` runs it under `cargo check`), so the same lints
# (-D warnings) run on every target while it is built, and the dependencies are compiled once
# instead of checked for clippy and then built again (a third of the compile). Exported: every
# later cargo (build-image.sh's, the test run's) then finds these artefacts fresh, since cargo
# keeps a wrapped build apart from an unwrapped one.
clippy_driver="$(rustc --print sysroot)/bin/clippy-driver"
[ -x "$clippy_driver" ] || { echo "test.sh: no $clippy_driver (rustup component add clippy)" >&2; exit 1; }
export RUSTC_WORKSPACE_WRAPPER="$clippy_driver"
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
# Every test target, and the binary the image copies: `cargo build --bin vmlauncher` in
# build-image.sh then finds it fresh (the same profile, features and flags).
tests_json=$(mktemp)
guests_log=$(mktemp)
trap 'rm -f "$tests_json" "$guests_log"' EXIT
cargo test --all-targets --locked --no-run --message-format=json-render-diagnostics >"$tests_json"
# The fuzz targets (a member, fuzz/), linted and known to build (scripts/fuzz.sh runs them;
# `cargo test` replays their corpus through src/fuzzing.rs).
mark "the test build"
cargo build -p vmlauncher-fuzz --bins --locked
mark "the fuzz build"
# The launcher's image, for the pod tests (tests/pods) and the KubeVirt node's
# (tests/e2e_kubevirt_node.rs): cached, seconds when nothing changed.
scripts/build-image.sh
mark "the image"

# Every target `cargo test --all-targets` runs, in two lanes side by side, since the two longest
# binaries wait more than they compute: the guests tier (tests/guests) runs by its executable in
# the background (cargo holds the build dir's lock while it runs tests); every other target runs
# through cargo in the foreground, one binary after the other, so that no two processes play or
# take down podman pods at once (the KubeVirt node's, which mostly waits on its cluster and
# virt-handler, then the pods tier). Debian boots take turns host-wide (tests/common/debian_turn.rs),
# so the guests tier's Debian test (`debian::`) runs last in the foreground lane, after the node's
# own Debian boot, and not in the background, where it held one of the tier's two test threads
# while it waited its turn (about 230 s of a 748 s lane). Every test runs once: the background
# skips `debian::`, the foreground runs `debian::` alone.
# Neither lane hides the other's failure or output: the guests lane's follows.
lanes=$(python3 - "$tests_json" <<'PY'
import json, sys
exe, others = None, []
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or m["target"]["kind"] != ["test"]:
        continue
    if m["target"]["name"] == "guests":
        exe = m["executable"]
    else:
        others.append(m["target"]["name"])
if exe is None:
    sys.exit("test.sh: no test target guests")
print(exe)
print(" ".join(f"--test {n}" for n in sorted(others)))
PY
)
guests_exe=$(sed -n 1p <<<"$lanes")
other_tests=$(sed -n 2p <<<"$lanes")
started=$(date +%s)
(
  echo "     Running tests/guests/main.rs ($guests_exe)"
  rc=0
  # Each test's time on its line (libtest's --report-time, unstable: RUSTC_BOOTSTRAP lets this
  # binary's harness take the flag; nothing is compiled with it).
  RUSTC_BOOTSTRAP=1 "$guests_exe" -Z unstable-options --report-time --skip debian:: </dev/null || rc=$?
  echo "test.sh: the guests lane ended after $(( $(date +%s) - started )) s, exit $rc"
  exit $rc
) >"$guests_log" 2>&1 &
guests_pid=$!
echo "test.sh: the guests tier runs beside the rest; its output follows theirs"
cargo_rc=0
# shellcheck disable=SC2086 # one word per argument
cargo test --locked --lib --bins --benches --examples $other_tests || cargo_rc=$?
echo "     Running tests/guests/main.rs ($guests_exe), debian:: alone"
RUSTC_BOOTSTRAP=1 "$guests_exe" -Z unstable-options --report-time debian:: </dev/null || cargo_rc=$?
echo "test.sh: the cargo lane ended after $(( $(date +%s) - started )) s, exit $cargo_rc"
guests_rc=0
wait "$guests_pid" || guests_rc=$?
cat "$guests_log"
if [ "$cargo_rc" != 0 ] || [ "$guests_rc" != 0 ]; then
  echo "test.sh: failed: the cargo lane exit $cargo_rc, the guests lane exit $guests_rc" >&2
  exit 1
fi
