#!/usr/bin/env bash
# KubeVirt's virt-handler, unmodified, for tests/e2e_kubevirt_node.rs: the shared cluster's
# handler-up.sh (CLUSTER below; read it first) with the mount propagation of KubeVirt's own
# DaemonSet, which the hot-plug path needs. What differs, and why:
# - The node dir RUN/node is a shared mount on the host, and virt-handler's mount namespace its
#   slave (the DaemonSet mounts /var/lib/kubelet HostToContainer, the share dir Bidirectional):
#   virt-handler bind-mounts a hot-plugged volume's image into the launcher pod's hotplug-disks
#   emptyDir in the node's namespace (virt-chroot, VIRT_IN_CONTAINER: its parent's), then checks
#   the mount in its own. handler-up.sh makes its namespace private, so it never sees it.
# - --kubelet-pods-dir RUN/node/pods: the pods dir by a path that is the same in both namespaces
#   (on a node, /var/lib/kubelet/pods is), where the attachment pod's and the launcher pod's
#   emptyDirs are (virt-handler's /pods is the same dir).
# - /etc/passwd and /etc/group with KubeVirt's qemu user (107), as virt-handler's image has them:
#   it gives the mounted image to `qemu` by name.
# Everything else (the labeller's files, the TLS secrets, /proc/1, virt-chroot in /usr/bin) is
# handler-up.sh's, made the same way.
# usage: handler-up.sh CLUSTER_DIR      (RUN as for cluster-up.sh; cluster-down.sh stops it)
set -euo pipefail
CLUSTER=$(cd "$1" && pwd)
source "$CLUSTER/env.sh"
RUN=${RUN:-$CLUSTER_ROOT/run} NODE=${NODE:-node01}
N=$RUN/node
mkdir -p "$N"/{pods,kubelet/pods,kubelet/device-plugins,share,private,labeller,embed,etc}
mountpoint -q "$N" || mount --bind "$N" "$N"
mount --make-rshared "$N"
L=$N/labeller
if [ ! -s "$L/capabilities.xml" ]; then
  U="qemu:///embed?root=$N/embed"
  virsh -c "$U" domcapabilities --machine q35 --arch x86_64 --virttype qemu > "$L/virsh_domcapabilities.xml"
  virsh -c "$U" hypervisor-cpu-baseline --features "$L/virsh_domcapabilities.xml" --machine q35 --arch x86_64 --virttype qemu > "$L/supported_features.xml"
  virsh -c "$U" capabilities > "$L/capabilities.xml"
fi
for c in servercertificates migrationservercertificates vsockclientcertificates; do
  mkdir -p "$N/etc-virt-handler/$c"
  [ -s "$N/etc-virt-handler/$c/tls.crt" ] || openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=virt-handler" \
    -keyout "$N/etc-virt-handler/$c/tls.key" -out "$N/etc-virt-handler/$c/tls.crt" 2>/dev/null
done
{ grep -v '^qemu:' /etc/passwd; echo 'qemu:x:107:107:qemu user:/:/usr/sbin/nologin'; } > "$N/etc/passwd"
{ grep -v '^qemu:' /etc/group; echo 'qemu:x:107:'; } > "$N/etc/group"
mkdir -p "$N/usr-bin-extra" && cp -f "$BIN/virt-chroot" "$N/usr-bin-extra/virt-chroot"
for d in /pods /var/lib/kubelet /var/run/kubevirt /var/run/kubevirt-private /var/lib/kubevirt-node-labeller /etc/virt-handler; do mkdir -p "$d"; done
if [ -s "$RUN/virt-handler.pid" ] && kill -0 "$(cat "$RUN/virt-handler.pid")" 2>/dev/null; then echo "virt-handler: already running"; exit 0; fi
cat > "$RUN/virt-handler.sh" <<SH
#!/bin/sh
set -e
mount --bind $N/pods /pods
mount --bind $N/kubelet /var/lib/kubelet
mount --bind $N/share /var/run/kubevirt
mount --bind $N/private /var/run/kubevirt-private
mount --bind $N/labeller /var/lib/kubevirt-node-labeller
mount --bind $N/etc-virt-handler /etc/virt-handler
mount --bind $N/etc/passwd /etc/passwd
mount --bind $N/etc/group /etc/group
mount -t overlay overlay -o lowerdir=$N/usr-bin-extra:/usr/bin /usr/bin
mount --bind /proc/\$PPID /proc/1
export NODE_NAME=$NODE PATH=$BIN:\$PATH VIRT_IN_CONTAINER=true
exec $BIN/virt-handler --kubeconfig $RUN/admin.kubeconfig --hostname-override $NODE \\
  --pod-ip-address 127.0.0.1 --listen 127.0.0.1 --kubelet-pods-dir $N/pods --v ${HANDLER_V:-3}
SH
chmod +x "$RUN/virt-handler.sh"
# A slave of the host's mounts: what virt-chroot mounts under RUN/node reaches virt-handler; what
# virt-handler's namespace mounts stays there.
setsid sh -c "unshare --mount --propagation slave '$RUN/virt-handler.sh'" > "$RUN/logs/virt-handler.log" 2>&1 < /dev/null &
echo $! > "$RUN/virt-handler.pid"
for i in $(seq 120); do grep -q '"Starting virt-handler controller\|Starting virt-handler controller\|metrics: max concurrent\|set verbosity' "$RUN/logs/virt-handler.log" 2>/dev/null && break; kill -0 "$(cat "$RUN/virt-handler.pid")" 2>/dev/null || break; sleep 0.5; done
kill -0 "$(cat "$RUN/virt-handler.pid")" 2>/dev/null || { echo "virt-handler exited:"; tail -30 "$RUN/logs/virt-handler.log"; exit 1; }
echo "virt-handler: running (pid $(cat "$RUN/virt-handler.pid")), log $RUN/logs/virt-handler.log"
