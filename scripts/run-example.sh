#!/usr/bin/env bash
# Sets the machine up (idempotent) and boots the bundled example VM with its console on the
# terminal. Ctrl-C stops it gracefully. Extra arguments go to `vmlauncher run`, e.g.
#   scripts/run-example.sh --emulation kvm
# This machine's /dev/kvm cannot boot a guest kernel, so the default here is TCG.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --locked
# root's own dir, not /tmp where anyone could plant it first
rt=${VMLAUNCHER_RUNTIME_DIR:-/run/vmlauncher-example}
echo "runtime dir: $rt   (in another terminal: target/debug/vmlauncher status --socket $rt/launcher.sock)"
exec target/debug/vmlauncher run examples/testguest-vmi.yaml --runtime-dir "$rt" --emulation tcg --console "$@"
