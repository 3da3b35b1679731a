#!/bin/bash
# Writes layout/hot-symbols.txt: the functions of the launcher binary that a running launcher
# executes, which build.rs has the linker place together at the start of the code. The kernel maps
# a binary's code in 64 KiB windows around each page touched; spread over the whole binary, the
# few hundred KiB a launcher runs kept nearly all of its 3.4 MB of code resident.
#
# How: the release binary (the one that ships; `cargo bench` builds the same one, see Cargo.toml)
# runs under valgrind's callgrind through two workloads: the side-by-side bench (start with a cold
# and a warm capability cache, Syncs that attach and detach one disk and 64, raw libvirt calls on
# the same daemon and domain, health checks) and, below, what a node daemon or an operator adds (the
# event stream, status, dry runs, pause). Every function of the binary that callgrind saw run is
# hot. The names are the linker's, hash included: the hash follows the toolchain and the
# dependencies' versions and features, not our code, so rerun after a toolchain or `cargo update`
# change (the script says how many listed names the build has), and after large changes.
#
# Needs: valgrind, the test guest (scripts/setup.sh). Takes about ten minutes.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
guest=${VMLAUNCHER_GUEST_DIR:-/var/cache/vmlauncher/test-guest}
caps=${VMLAUNCHER_QEMU_CACHE_DIR:-/var/cache/vmlauncher/qemu-capabilities}
out=$repo/layout/hot-symbols.txt
mkdir -p "$repo/layout"
command -v valgrind > /dev/null || { echo "hot-symbols: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
[ -e "$guest/vmlinuz" ] || { echo "hot-symbols: no test guest in $guest (scripts/setup.sh)" >&2; exit 1; }

cargo build --release --locked --manifest-path "$repo/Cargo.toml" --bin vmlauncher
work=$(mktemp -d /tmp/hot-symbols.XXXXXX)
launcher=$work/vmlauncher-profiled
# A copy of its own: the clients below run from the build's binary, so the profiled process is
# the launcher alone.
cp "$repo/target/release/vmlauncher" "$launcher"
client="$repo/target/release/vmlauncher"
rt=$work/rt
profiled=
cleanup() {
    [ -n "$profiled" ] && kill -TERM "$profiled" 2> /dev/null && wait "$profiled" 2> /dev/null
    rm -rf "$work"
}
trap cleanup EXIT

# spec N: the test guest with N scsi data disks (hostDisk files, serials HS0..).
spec() {
    local n=$1 disks="" volumes=""
    for ((i = 0; i < n; i++)); do
        [ -e "$work/d$i.img" ] || truncate -s 1M "$work/d$i.img"
        disks+=$'\n'"      - {name: d$i, disk: {bus: scsi}, serial: HS$i}"
        volumes+=$'\n'"  - {name: d$i, hostDisk: {path: $work/d$i.img, type: Disk}}"
    done
    [ "$n" -gt 0 ] || { disks=" []"; volumes=" []"; }
    cat > "$work/spec$n.yaml" << EOF
apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: hot-symbols
spec:
  domain:
    memory: {guest: 256Mi}
    firmware:
      kernelBoot:
        kernelArgs: console=ttyS0 loglevel=1
        container: {kernelPath: $guest/vmlinuz, initrdPath: $guest/initrd.img}
    devices:
      disks:$disks
  volumes:$volumes
EOF
    echo "$work/spec$n.yaml"
}

# The bench, each launcher it starts under callgrind (tests/common: VMLAUNCHER_TEST_WRAPPER).
VMLAUNCHER_TEST_WRAPPER="valgrind --tool=callgrind --demangle=no \
--callgrind-out-file=$work/callgrind.bench.%p" \
    cargo bench --locked --manifest-path "$repo/Cargo.toml" --bench side_by_side \
    > "$work/bench.log" 2>&1 || { cat "$work/bench.log" >&2; exit 1; }

for n in 0 1 16; do spec $n > /dev/null; done
valgrind --tool=callgrind --demangle=no --callgrind-out-file="$work/callgrind.out" \
    "$launcher" run "$work/spec0.yaml" --emulation tcg --runtime-dir "$rt" \
    --qemu-cache-dir "$caps" --resync-interval 2 > "$work/launcher.log" 2>&1 &
profiled=$!
cli() { "$client" "$1" --socket "$rt/launcher.sock" "${@:2}"; }
for ((i = 0; i < 600; i++)); do
    cli status --output json 2> /dev/null | grep -q '"phase": *"Running"' && break
    kill -0 "$profiled" || { cat "$work/launcher.log" >&2; exit 1; }
    sleep 0.5
done
timeout 120 "$client" events --socket "$rt/launcher.sock" --output json > /dev/null 2>&1 &
events=$!
for ((i = 0; i < 5; i++)); do
    cli sync "$work/spec1.yaml" > /dev/null
    cli sync "$work/spec1.yaml" > /dev/null # nothing to change
    cli sync "$work/spec0.yaml" > /dev/null
done
cli sync "$work/spec16.yaml" > /dev/null
cli sync "$work/spec16.yaml" --dry-run > /dev/null
cli sync "$work/spec0.yaml" > /dev/null
cli status > /dev/null
cli status --output json > /dev/null
cli pause > /dev/null
cli unpause > /dev/null
sleep 5 # idle: the periodic resync and the idle-time work run
kill "$events" 2> /dev/null || true
callgrind_control -d "$profiled" > /dev/null
for ((i = 0; i < 100; i++)); do
    ls "$work"/callgrind.out.[0-9]* > /dev/null 2>&1 && break
    sleep 0.1
done

# Every function callgrind saw run in the binary, by its linkage name; `'N` marks recursion depth.
python3 - "$launcher" "$client" "$work"/callgrind.* > "$out.new" << 'EOF'
import re, sys
binaries, files = set(sys.argv[1:3]), sys.argv[3:]
hot = set()
for path in files:
    names = {"ob": {}, "fn": {}}
    current = None
    for line in open(path, errors="replace"):
        m = re.match(r"(c?)(ob|fn)=\((\d+)\)(?: (.*))?$", line.rstrip("\n"))
        if not m:
            continue
        called, kind, key, name = m.groups()
        if name:
            names[kind][key] = name
        if called:
            continue
        if kind == "ob":
            current = names["ob"][key]
        elif current in binaries:
            symbol = re.sub(r"'\d+$", "", names["fn"][key])
            if symbol.startswith(("_ZN", "_R")):
                hot.add(symbol)
for symbol in sorted(hot):
    print(symbol)
EOF
mv "$out.new" "$out"
echo "hot-symbols: $(wc -l < "$out") functions in $out"
