#!/usr/bin/env bash
# Builds the launcher's image, localhost/vmlauncher:dev, with podman (idempotent; podman's layer
# cache makes a rebuild with an unchanged Containerfile and binary a no-op).
#
# - The base image is a build argument. With a registry it is debian:bookworm-slim; this machine
#   reaches none, so without VMLAUNCHER_BASE_IMAGE the script makes localhost/debian:bookworm-slim
#   itself with debootstrap from apt's own mirror, and keeps it as a tarball under
#   /var/cache/vmlauncher/images so that the next run (and the next CI run on this machine) loads
#   it in seconds. Nothing depends on the cache being there.
# - The binary is built on the host (the same debug build the tests use, or
#   VMLAUNCHER_PROFILE=release) and copied in; see docs/pod.md ("The image") for the Rust build stage a
#   registry-connected build would use instead.
# - QEMU's capability cache is warmed at build time; with /dev/kvm present the build sees it, so
#   the cache is valid for pods that get /dev/kvm.
set -euo pipefail
cd "$(dirname "$0")/.."
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/deploy/containers.conf}
image=${VMLAUNCHER_IMAGE:-localhost/vmlauncher:dev}
base=${VMLAUNCHER_BASE_IMAGE:-}
profile=${VMLAUNCHER_PROFILE:-debug}
cache=/var/cache/vmlauncher/images

if [ -z "$base" ]; then
  base=localhost/debian:bookworm-slim
  if ! podman image exists "$base"; then
    if [ -s "$cache/debian-bookworm-slim.tar" ]; then
      echo "build-image: loading $base from $cache"
      podman load -q -i "$cache/debian-bookworm-slim.tar" >/dev/null
    else
      mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
      mirror=${mirror:-$(awk '/^deb / {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)}
      mirror=${mirror:-http://deb.debian.org/debian}
      root=$(mktemp -d /var/tmp/vmlauncher-rootfs.XXXXXX)
      trap 'rm -rf "$root"' EXIT
      chmod 0755 "$root"
      echo "build-image: debootstrap bookworm from $mirror (minbase)"
      debootstrap --variant=minbase bookworm "$root" "$mirror" >/dev/null
      rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
      tar -C "$root" -c . | podman import -q - "$base" >/dev/null
      rm -rf "$root"
      trap - EXIT
      mkdir -p "$cache"
      podman save -q -o "$cache/debian-bookworm-slim.tar.tmp" "$base"
      mv "$cache/debian-bookworm-slim.tar.tmp" "$cache/debian-bookworm-slim.tar"
    fi
  fi
fi

if [ "$profile" = release ]; then
  cargo build --release --locked --bin vmlauncher
else
  cargo build --locked --bin vmlauncher
fi
built="${CARGO_TARGET_DIR:-target}/$profile/vmlauncher"
mkdir -p target/image
# cp only when it changed, so the COPY layer (and the cache warm-up after it) stays cached.
cmp -s "$built" target/image/vmlauncher || cp "$built" target/image/vmlauncher

devices=()
[ -c /dev/kvm ] && devices=(--device /dev/kvm)
# The warm-up starts libvirtd in a mount namespace of its own: CAP_SYS_ADMIN for that RUN.
podman build -q --layers --cap-add=SYS_ADMIN --build-arg "BASE_IMAGE=$base" "${devices[@]}" \
  -f Containerfile -t "$image" . >/dev/null
echo "build-image: $image ($(podman image inspect --format '{{.Size}}' "$image" | numfmt --to=iec) )"
