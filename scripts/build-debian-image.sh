#!/usr/bin/env bash
# Builds a bootable Debian 12 disk image from Debian packages alone (no image download): debootstrap
# from the mirror apt already uses, the cloud kernel, cloud-init (NoCloud only), openssh-server, the
# QEMU guest agent (started by udev when its virtio-serial port appears), and extlinux as the bootloader on one ext4 partition. The result boots on its own as a
# containerDisk or hostDisk (examples/debian.yaml); cloud-init creates the users and the SSH host keys
# at first boot, so the image holds no secrets and no machine identity.
#
# Cached: rebuilt only when this script or the kernel package apt would install changes.
# Reproducible: the same script and mirror state give the same package set (listed in
# packages.txt next to the image), the same configuration and the same filesystem UUIDs;
# file timestamps are clamped to SOURCE_DATE_EPOCH.
# Output: $VMLAUNCHER_DEBIAN_DIR (default /var/cache/vmlauncher/debian)/{disk.img,packages.txt,stamp}
# disk.img is a sparse raw image of $VMLAUNCHER_DEBIAN_SIZE_MIB (default 3072) MiB.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${VMLAUNCHER_DEBIAN_DIR:-/var/cache/vmlauncher/debian}
size_mib=${VMLAUNCHER_DEBIAN_SIZE_MIB:-3072}
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-1700000000}
# Fixed identities, so that two builds give the same boot configuration.
root_uuid=5e2f6c1a-0d0c-4c6b-9a8e-7d1e5b2c3a40
disk_id=0x766d6c64  # "vmld"

missing=()
for p in debootstrap extlinux fdisk; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi
kpkg=$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-/{print $2; exit}')
[ -n "$kpkg" ] || { echo "build-debian-image: no linux-image-cloud-amd64 dependency found (apt-get update?)" >&2; exit 1; }
stamp="$kpkg $size_mib $(sha256sum < "$here/build-debian-image.sh" | cut -c1-16)"
if [ -f "$out/stamp" ] && [ "$(cat "$out/stamp")" = "$stamp" ] && [ -f "$out/disk.img" ]; then
  echo "debian image up to date in $out/disk.img ($kpkg)"; exit 0
fi
# The mirror apt already uses (no other address is reachable here).
mirror=$(awk '/^URIs:/ && $2 ~ /\/debian\/?$/ {print $2; exit} /^deb / && $3 ~ /\/debian\/?$/ {print $3; exit}' \
  /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null || true)
mirror=${mirror:-http://deb.debian.org/debian}

start=$(date +%s)
work=$(mktemp -d /var/tmp/vmlauncher-debian.XXXXXX)
rootfs="$work/rootfs"
mnt="$work/mnt"
cleanup() {
  for m in "$rootfs/dev/pts" "$rootfs/dev" "$rootfs/proc" "$rootfs/sys" "$mnt"; do
    mountpoint -q "$m" 2>/dev/null && umount -l "$m"
  done
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$rootfs" "$mnt"
chmod 0755 "$work" "$rootfs"

echo "build-debian-image: debootstrap bookworm from $mirror"
debootstrap --variant=minbase --include=systemd-sysv,udev,dbus,kmod,iproute2,ca-certificates \
  bookworm "$rootfs" "$mirror" > "$work/debootstrap.log" 2>&1 ||
  { tail -n 30 "$work/debootstrap.log" >&2; exit 1; }

# Services must not start inside the build chroot.
printf '#!/bin/sh\nexit 101\n' > "$rootfs/usr/sbin/policy-rc.d"
chmod 0755 "$rootfs/usr/sbin/policy-rc.d"
# A small initramfs: only what finds the root disk (virtio, scsi, sata) and mounts ext4;
# zstd decompresses fastest, which matters under TCG.
mkdir -p "$rootfs/etc/initramfs-tools/conf.d"
printf 'MODULES=list\nCOMPRESS=zstd\n' > "$rootfs/etc/initramfs-tools/conf.d/vmlauncher.conf"
printf '%s\n' virtio_pci virtio_blk virtio_scsi sd_mod ahci ext4 > "$rootfs/etc/initramfs-tools/modules"
# No hostname from the build machine; cloud-init sets it from meta-data.
echo debian > "$rootfs/etc/hostname"
mount -t proc proc "$rootfs/proc"
mount --bind /dev "$rootfs/dev"
mount --bind /dev/pts "$rootfs/dev/pts"
mount -t sysfs sysfs "$rootfs/sys"
in_root() { chroot "$rootfs" env DEBIAN_FRONTEND=noninteractive LC_ALL=C "$@"; }
echo "build-debian-image: installing the kernel, cloud-init, openssh-server, qemu-guest-agent"
in_root apt-get install -y -q --no-install-recommends \
  linux-image-cloud-amd64 zstd initramfs-tools cloud-init openssh-server sudo qemu-guest-agent \
  isc-dhcp-client ifupdown netbase less > "$work/install.log" 2>&1 ||
  { tail -n 30 "$work/install.log" >&2; exit 1; }
kver=$(ls "$rootfs/lib/modules")

# cloud-init: NoCloud only (no network metadata probing, which costs minutes under TCG).
cat > "$rootfs/etc/cloud/cloud.cfg.d/90-vmlauncher.cfg" <<'EOF'
datasource_list: [ NoCloud, None ]
# Built into glibc: no locale to generate (en_US.UTF-8, cloud-init's default, is not there).
locale: C.UTF-8
EOF
# The serial console is the one the launcher logs: kernel messages and a getty go there.
cat > "$rootfs/etc/fstab" <<EOF
UUID=$root_uuid / ext4 defaults,errors=remount-ro 0 1
EOF
# The interface cloud-init does not configure (no network-config): DHCP on the first NIC.
cat > "$rootfs/etc/network/interfaces" <<'EOF'
source /etc/network/interfaces.d/*
auto lo
iface lo inet loopback
EOF
# No identity baked in: cloud-init makes host keys and machine-id at first boot.
rm -f "$rootfs"/etc/ssh/ssh_host_*
: > "$rootfs/etc/machine-id"
rm -f "$rootfs/var/lib/dbus/machine-id"
in_root dpkg-query -W -f='${Package} ${Version}\n' > "$work/packages.txt"
in_root apt-get clean
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*.log "$rootfs"/var/cache/debconf/*-old \
  "$rootfs/usr/sbin/policy-rc.d"
for m in "$rootfs/dev/pts" "$rootfs/dev" "$rootfs/proc" "$rootfs/sys"; do umount "$m"; done

mkdir -p "$rootfs/boot/extlinux"
cat > "$rootfs/boot/extlinux/extlinux.conf" <<EOF
DEFAULT debian
TIMEOUT 0
PROMPT 0
LABEL debian
  LINUX /boot/vmlinuz-$kver
  INITRD /boot/initrd.img-$kver
  APPEND root=UUID=$root_uuid ro console=tty0 console=ttyS0,115200n8 quiet
EOF
find "$rootfs" -xdev -newermt "@$SOURCE_DATE_EPOCH" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} + 2>/dev/null || true

echo "build-debian-image: writing the filesystem and bootloader"
part_mib=$((size_mib - 1))
# extlinux reads ext4 without the 64bit feature; the fixed UUID and hash seed keep it the same.
mkfs.ext4 -q -F -L debian-root -U "$root_uuid" -E "hash_seed=$root_uuid" -O ^64bit,^metadata_csum \
  -d "$rootfs" "$work/root.ext4" "${part_mib}M" >/dev/null
mount -o loop "$work/root.ext4" "$mnt"
extlinux --install "$mnt/boot/extlinux" >/dev/null 2>&1
umount "$mnt"
rm -f "$work/disk.img"
truncate -s "${size_mib}M" "$work/disk.img"
printf 'label: dos\nlabel-id: %s\nstart=2048, type=83, bootable\n' "$disk_id" | sfdisk -q "$work/disk.img" 2>/dev/null
dd if=/usr/lib/EXTLINUX/mbr.bin of="$work/disk.img" bs=440 count=1 conv=notrunc status=none
dd if="$work/root.ext4" of="$work/disk.img" bs=1M seek=1 conv=notrunc,sparse status=none

mkdir -p "$out"
cp --sparse=always "$work/disk.img" "$out/disk.img.new" && mv "$out/disk.img.new" "$out/disk.img"
cp "$work/packages.txt" "$out/packages.txt"
echo "$stamp" > "$out/stamp"
echo "debian image built in $out/disk.img in $(( $(date +%s) - start )) s" \
  "($kpkg, $(wc -l < "$out/packages.txt") packages, $(du -m "$out/disk.img" | cut -f1) MiB used of $size_mib MiB)"
