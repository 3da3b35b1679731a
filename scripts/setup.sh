#!/usr/bin/env bash
# One idempotent set-up for a fresh Debian 12 machine (root): the packages vmlauncher and its tests
# need, the users libvirt expects (the packages' post-install scripts do not run everywhere), and the
# test guest. Safe to run again: it only does what is missing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# qemu-utils is NOT listed: a newer one may be preinstalled, and naming it makes apt refuse the set.
packages=(libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients libvirt-dev qemu-system-x86
          libjemalloc2           # the private libvirtd's allocator (src/libvirt/lean.rs)
          busybox-static cpio kmod libxml2-utils pkg-config genisoimage ovmf
          libelf-dev zlib1g-dev  # libbpf-sys (libcgroups cgroup v2 device programs) links them
          util-linux mount       # unshare and losetup, for the PID-1 and block-device tests
          debootstrap extlinux fdisk  # the Debian image (scripts/build-debian-image.sh); the pod's base image
          openssh-client         # ssh into it (the README, tests/guests/debian.rs)
          swtpm swtpm-tools      # the vTPM libvirt starts for `tpm: {}`
          python3-venv           # the stock Python gRPC client test (PyPI packages in a venv)
          acl                    # setfacl/getfacl: tests of the ACL QEMU passes the runtime dir by
          iputils-ping           # a packet to the guest on a NIC plugged in a pod (tests/pods/pod_nic_hotplug.rs)
          openssl                # test certificates for a migration over TCP (scripts/migration-tls.sh)
          curl xz-utils          # the KubeVirt node (tests/e2e_kubevirt_node.rs): virt-handler's REST
                                 # server; ../shared/kubevirt-cluster/bin/*.xz unpacked once
          podman runc catatonit) # the pod: image build, kube play (runc: see below)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
# What libvirt-daemon's post-install would have made.
getent group kvm >/dev/null || groupadd --system kvm
getent group libvirt-qemu >/dev/null || groupadd --system libvirt-qemu
getent passwd libvirt-qemu >/dev/null || useradd --system -g libvirt-qemu -G kvm -d /var/lib/libvirt -s /usr/sbin/nologin libvirt-qemu
# Mount points the launcher's private libvirtd covers with its own directories.
mkdir -p /var/log/libvirt/qemu /run/libvirt /var/lib/libvirt /var/cache/libvirt /etc/libvirt
# apt-cache needs lists to find the kernel package for the test guest.
apt-cache show linux-image-cloud-amd64 >/dev/null 2>&1 || apt-get update -q
"$here/build-test-guest.sh"
# A stock Python gRPC client for the tests (tests/python): PyPI's packages, pinned, in a venv.
python_venv=/var/cache/vmlauncher/python
python_packages=(grpcio==1.85.1 grpcio-health-checking==1.85.1 grpcio-reflection==1.85.1)
if ! "$python_venv/bin/python3" -c 'import grpc, grpc_health, grpc_reflection' 2>/dev/null; then
  echo "setup: making the Python venv $python_venv (${python_packages[*]})"
  /usr/bin/python3 -m venv "$python_venv"
  "$python_venv/bin/pip" install -q "${python_packages[@]}"
fi
