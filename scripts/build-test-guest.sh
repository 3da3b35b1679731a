#!/usr/bin/env bash
# Builds the tiny test guest from Debian packages alone (no image download): the cloud kernel,
# the virtio/scsi/net modules it needs, and a busybox initramfs whose /init reports on the serial
# console, serves HTTP on the network and runs the QEMU guest agent (qemu-ga from Debian's
# qemu-guest-agent package, with the host's copies of the libraries it links); and the same kernel and initramfs on a small bootable
# disk (extlinux), for where a guest must come as a disk image: a KubeVirt containerDisk under
# the real virt-handler (tests/e2e_kubevirt_node.rs). Cached: the output is rebuilt only when the
# kernel package, the agent's package or the guest's scripts change.
# Output: $VMLAUNCHER_GUEST_DIR (default /var/cache/vmlauncher/test-guest)/{vmlinuz,initrd.img,disk.img}
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${VMLAUNCHER_GUEST_DIR:-/var/cache/vmlauncher/test-guest}
kpkg=$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-/{print $2; exit}')
[ -n "$kpkg" ] || { echo "build-test-guest: no linux-image-cloud-amd64 dependency found (apt-get update?)" >&2; exit 1; }
gapkg=$(apt-cache policy qemu-guest-agent | awk '/Candidate:/{print $2}')
case "$gapkg" in ''|'(none)') echo "build-test-guest: no qemu-guest-agent package (apt-get update?)" >&2; exit 1;; esac
stamp="$kpkg qemu-guest-agent=$gapkg $(cat "$here/guest/init" "$here/guest/dhcp" "$here/build-test-guest.sh" | sha256sum | cut -c1-16)"
if [ -f "$out/stamp" ] && [ "$(cat "$out/stamp")" = "$stamp" ]; then
  echo "test guest up to date in $out ($kpkg)"; exit 0
fi
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download -q "$kpkg" 2>/dev/null) || (cd "$work" && apt-get download "$kpkg")
dpkg-deb -x "$work"/linux-image-*.deb "$work/k"
kver=$(ls "$work/k/lib/modules")
moddir="$work/k/lib/modules/$kver"
root="$work/root"
mkdir -p "$root"/{bin,proc,sys,dev,modules,etc}
cp /bin/busybox "$root/bin/busybox"
install -m 0755 "$here/guest/init" "$root/init"
install -m 0755 "$here/guest/dhcp" "$root/bin/vmltest-dhcp"
# The guest agent: the binary unpacked (never installed), and each library the loader resolves
# for it on this host, at the same path (the loader's default directories; no ld.so.cache).
(cd "$work" && apt-get download -q "qemu-guest-agent=$gapkg" 2>/dev/null) ||
  (cd "$work" && apt-get download "qemu-guest-agent=$gapkg")
dpkg-deb -x "$work"/qemu-guest-agent_*.deb "$work/ga"
install -m 0755 "$work/ga/usr/sbin/qemu-ga" "$root/bin/qemu-ga"
for lib in $(ldd "$root/bin/qemu-ga" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'); do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
# What the agent says of the guest's OS (guest-get-osinfo reads it).
printf '%s\n' 'ID=vmltest' 'NAME="vmlauncher test guest"' 'PRETTY_NAME="vmlauncher test guest"' \
  'VERSION_ID=1' > "$root/etc/os-release"
# Order modules so that each comes after what it depends on (the .deb carries no modules.dep).
declare -A seen=()
order=()
add() {
  local name=$1 path dep
  [ -n "${seen[$name]:-}" ] && return 0
  seen[$name]=1
  path=$(find "$moddir" -name "$name.ko" -o -name "${name//_/-}.ko" | head -n1)
  [ -n "$path" ] || return 0   # built in
  for dep in $(modinfo -F depends "$path" | tr ',' ' '); do add "$dep"; done
  cp "$path" "$root/modules/"
  order+=("$(basename "$path")")
}
for m in virtio_pci virtio_scsi sd_mod virtio_blk sr_mod isofs button evdev virtio_net virtio_mem virtio_console; do add "$m"; done
printf '%s\n' "${order[@]}" > "$root/modules.order"
(cd "$root" && find . | LC_ALL=C sort | cpio -o -H newc --quiet --reproducible | gzip -9n) > "$work/initrd.img"
# The bootable disk: one ext4 partition holding extlinux, the kernel and the initramfs (the
# layout of scripts/build-debian-image.sh, 64 MiB; 4 KiB blocks: extlinux cannot load a kernel
# from the 1 KiB blocks mkfs picks for so small a filesystem). Its console is the serial port.
boot="$work/boot-root"; mnt="$work/mnt"
mkdir -p "$boot/boot/extlinux" "$mnt"
cp "$work/k/boot/vmlinuz-$kver" "$boot/boot/vmlinuz"
cp "$work/initrd.img" "$boot/boot/initrd.img"
printf '%s\n' 'DEFAULT vmltest' 'TIMEOUT 0' 'PROMPT 0' 'LABEL vmltest' '  LINUX /boot/vmlinuz' \
  '  INITRD /boot/initrd.img' '  APPEND console=ttyS0 loglevel=1 memhp_default_state=online_movable' \
  > "$boot/boot/extlinux/extlinux.conf"
mkfs.ext4 -q -F -L vmltest -b 4096 -O ^64bit,^metadata_csum -d "$boot" "$work/boot.ext4" 63M >/dev/null
mount -o loop "$work/boot.ext4" "$mnt"
extlinux --install "$mnt/boot/extlinux" >/dev/null 2>&1 || { umount "$mnt"; echo "build-test-guest: extlinux failed" >&2; exit 1; }
umount "$mnt"
truncate -s 64M "$work/disk.img"
printf 'label: dos\nstart=2048, type=83, bootable\n' | sfdisk -q "$work/disk.img" 2>/dev/null
dd if=/usr/lib/EXTLINUX/mbr.bin of="$work/disk.img" bs=440 count=1 conv=notrunc status=none
dd if="$work/boot.ext4" of="$work/disk.img" bs=1M seek=1 conv=notrunc,sparse status=none
mkdir -p "$out"
cp --sparse=always "$work/disk.img" "$out/disk.img.new" && mv "$out/disk.img.new" "$out/disk.img"
cp "$work/k/boot/vmlinuz-$kver" "$out/vmlinuz.new" && mv "$out/vmlinuz.new" "$out/vmlinuz"
cp "$work/initrd.img" "$out/initrd.img.new" && mv "$out/initrd.img.new" "$out/initrd.img"
echo "$stamp" > "$out/stamp"
echo "test guest built in $out ($kpkg, modules: ${order[*]})"
