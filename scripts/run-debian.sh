#!/usr/bin/env bash
# Boots a real Debian 12 VM (examples/debian.yaml) with its serial console on the terminal: the
# kernel, systemd and cloud-init messages, then a login prompt (user debian, password debian).
# From another terminal: ssh -p 2222 debian@127.0.0.1. Ctrl-C stops it gracefully.
# Sets the machine up and builds the image the first time (scripts/build-debian-image.sh, ~1 min,
# cached in /var/cache/vmlauncher/debian). Extra arguments go to `vmlauncher run`, e.g.
#   scripts/run-debian.sh --publish 2200:22
# Emulation: KVM where it works; TCG on a host whose /dev/kvm is a nested PVM (it cannot boot a
# guest kernel) or absent.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build-debian-image.sh
cargo build --locked
# root's own dir, not /tmp where anyone could plant it first
rt=${VMLAUNCHER_RUNTIME_DIR:-/run/vmlauncher-debian}
image=${VMLAUNCHER_DEBIAN_DIR:-/var/cache/vmlauncher/debian}/disk.img
mkdir -p "$rt/container-disks"
ln -sfn "$image" "$rt/container-disks/disk_0.img"
emulation=auto
if [ ! -e /dev/kvm ] || [ -e /sys/module/kvm_pvm ]; then emulation=tcg; fi
echo "runtime dir: $rt   emulation: $emulation   ssh: ssh -p 2222 debian@127.0.0.1 (password debian)"
exec target/debug/vmlauncher run examples/debian.yaml --runtime-dir "$rt" --emulation "$emulation" \
  --publish 2222:22 --console "$@"
