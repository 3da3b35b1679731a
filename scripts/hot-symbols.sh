#!/bin/bash
# Writes layout/hot-symbols.txt: the functions of the launcher binary that a running launcher
# executes, which build.rs has the linker place together at the start of the code. The kernel maps
# a binary's code in 64 KiB windows around each page touched (fault-around); spread over the whole
# binary, the 1.7 MB a launcher runs kept all of its 3.4 MB of code resident.
#
# How: the release binary (the one that ships; `cargo bench` builds the same one, see Cargo.toml)
# runs through two workloads: the side-by-side bench (start with a cold and a warm capability
# cache, Syncs that attach and detach one disk and 64, raw libvirt calls on the same daemon and
# domain, health checks) and, below, what a node daemon or an operator adds (the event stream,
# status, dry runs, pause), each launcher run two ways:
# 1. under valgrind's callgrind, which names every function that runs;
# 2. then at full speed, from a file system of its own whose disk does no read-ahead, under
#    `perf record -e page-faults`: each page of code is read only when touched, so each fault
#    names the function that touched it. This finds the paths that run only at full speed (a
#    client that hangs up before the reply is flushed: h2's go-away and hyper's error paths),
#    which callgrind, 50 times slower, never takes. Relinked and rerun until a run adds nothing.
# The names are the linker's, hash included: the hash follows the toolchain and the dependencies'
# versions and features, not our code, so rerun after a toolchain or `cargo update` change, and
# after large changes. Each run keeps the names of the list before it that the build still has;
# delete the list to start over.
#
# Needs: root (a loop device), valgrind, perf (linux-perf), the test guest (scripts/setup.sh).
# Takes about 20 minutes.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
guest=${VMLAUNCHER_GUEST_DIR:-/var/cache/vmlauncher/test-guest}
caps=${VMLAUNCHER_QEMU_CACHE_DIR:-/var/cache/vmlauncher/qemu-capabilities}
out=$repo/layout/hot-symbols.txt
built=$repo/target/release/vmlauncher
fail() { echo "hot-symbols: $*" >&2; exit 1; }
for tool in valgrind perf mkfs.ext4 losetup; do
    command -v $tool > /dev/null || fail "needs $tool"
done
[ "$(id -u)" = 0 ] || fail "needs root (a loop device)"
[ -e "$guest/vmlinuz" ] || fail "no test guest in $guest (scripts/setup.sh)"

work=$(mktemp -d /tmp/hot-symbols.XXXXXX)
mnt=$work/mnt
loop=
profiled=
cleanup() {
    [ -n "$profiled" ] && kill -TERM "$profiled" 2> /dev/null && wait "$profiled" 2> /dev/null
    mountpoint -q "$mnt" && umount "$mnt"
    [ -n "$loop" ] && losetup -d "$loop"
    rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$repo/layout" "$mnt"
touch "$out"

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
}
for n in 0 1 16; do spec $n; done

# workload WRAPPER: the bench, and then the CLI workload, every launcher started as
# `WRAPPER LAUNCHER ARGS...` (tests/common: VMLAUNCHER_TEST_WRAPPER).
workload() {
    local wrapper=$1 rt=$work/rt cli
    VMLAUNCHER_TEST_WRAPPER=$wrapper cargo bench --locked --manifest-path "$repo/Cargo.toml" \
        --bench side_by_side > "$work/bench.log" 2>&1 || { cat "$work/bench.log" >&2; exit 1; }
    rm -rf "$rt"
    $wrapper "$built" run "$work/spec0.yaml" --emulation tcg --runtime-dir "$rt" \
        --qemu-cache-dir "$caps" --resync-interval 2 > "$work/launcher.log" 2>&1 &
    profiled=$!
    cli() { "$built" "$1" --socket "$rt/launcher.sock" "${@:2}"; }
    for ((i = 0; i < 600; i++)); do
        cli status --output json 2> /dev/null | grep -q '"phase": *"Running"' && break
        kill -0 "$profiled" || { cat "$work/launcher.log" >&2; exit 1; }
        sleep 0.5
    done
    timeout 120 "$built" events --socket "$rt/launcher.sock" --output json > /dev/null 2>&1 &
    local events=$!
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
    # The launcher stops its VM and exits; its profile is written as it does.
    kill -TERM "$profiled"
    wait "$profiled" || true
    profiled=
}

# merge FILE...: the list, plus the names in FILEs, as far as the built binary has them; fails
# when that changes nothing.
merge() {
    python3 - "$built" "$out" "$@" > "$out.new" << 'EOF'
import subprocess, sys
binary, previous, found = sys.argv[1], sys.argv[2], sys.argv[3:]
nm = subprocess.run(["nm", "--defined-only", binary], capture_output=True, text=True, check=True)
code = {f[2] for f in map(str.split, nm.stdout.splitlines()) if len(f) == 3 and f[1] in "tTwW"}
names = set(open(previous).read().split()) & code
for path in found:
    names |= set(open(path).read().split()) & code
print("\n".join(sorted(names)))
EOF
    echo "hot-symbols: $(grep -c . "$out.new") functions ($(grep -c . "$out") before)" >&2
    # Unchanged: the file is left as it is, so that cargo does not relink for nothing.
    if cmp -s "$out.new" "$out"; then
        rm "$out.new"
        return 1
    fi
    mv "$out.new" "$out"
}

# 1. callgrind: every function that ran in the binary, by its linkage name (`'N` marks a
# recursion depth).
cargo build --release --locked --manifest-path "$repo/Cargo.toml" --bin vmlauncher
workload "valgrind --tool=callgrind --trace-children=yes --trace-children-skip=/usr/*,/bin/*,/sbin/*,*/libvirtd --demangle=no --callgrind-out-file=$work/callgrind.%p"
python3 - "$built" "$work"/callgrind.* > "$work/ran.txt" << 'EOF'
import re, sys
binary, files = sys.argv[1], sys.argv[2:]
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
        elif current == binary:
            print(re.sub(r"'\d+$", "", names["fn"][key]))
EOF
merge "$work/ran.txt" || true

# 2. page faults at full speed, the binary on an ext4 of its own on a loop device whose
# read-ahead is 0 (the machine's own disks keep theirs). Remounted before each run, so that none
# of the binary is cached.
truncate -s 64M "$work/fs.img"
mkfs.ext4 -q "$work/fs.img"
loop=$(losetup --find --show --direct-io=on "$work/fs.img")
echo 0 > "/sys/block/${loop#/dev/}/queue/read_ahead_kb"
cat > "$work/from-loop" << EOF
#!/bin/bash
# Runs the copy on the loop device in place of \$1, as this very process (its caller signals it and
# reads its exit code), with perf attached and enabled before the exec.
set -e
shift
ctl=$work/ctl.\$\$ ack=$work/ack.\$\$
mkfifo "\$ctl" "\$ack"
perf record -q -e page-faults -c 1 -p \$\$ -D -1 --control "fifo:\$ctl,\$ack" \\
    -o "$work/faults.\$\$" 2> /dev/null &
# Opened read-write, so that neither open waits for perf; a perf that never answers fails here.
exec {to_perf}<> "\$ctl" {from_perf}<> "\$ack"
echo enable >&\$to_perf
read -r -t 60 -u \$from_perf reply || { echo "from-loop: perf did not start" >&2; exit 1; }
exec {to_perf}>&- {from_perf}<&- "$mnt/vmlauncher" "\$@"
EOF
chmod +x "$work/from-loop"
for round in 1 2 3; do
    cargo build --release --locked --manifest-path "$repo/Cargo.toml" --bin vmlauncher
    mount "$loop" "$mnt"
    cp "$built" "$mnt/vmlauncher"
    umount "$mnt"
    mount "$loop" "$mnt"
    rm -f "$work"/faults.*
    workload "$work/from-loop"
    # perf writes its file once the process it watched is gone.
    while pgrep -f "perf record .*$work/faults" > /dev/null; do sleep 0.2; done
    umount "$mnt"
    # The functions whose instructions faulted in the launcher's process (its first pid; the
    # children it forks run a few functions before exec, in pages of their own).
    for data in "$work"/faults.*; do
        perf script --no-demangle -i "$data" -F pid,ip,sym,dso 2> /dev/null |
            awk -v dso="($mnt/vmlauncher)" '$NF == dso {
                if (pid == "") pid = $1
                if ($1 == pid) { sub(/\+0x[0-9a-f]+$/, "", $3); print $3 }
            }'
    done > "$work/faulted.txt"
    merge "$work/faulted.txt" || break
done
cargo build --release --locked --manifest-path "$repo/Cargo.toml" --bin vmlauncher
