#!/usr/bin/env python3
"""Writes the bad-spec corpus: each case is a small, hostile or broken VMI and the one error the
launcher must give for it (exit 2, and this text on stderr). Run again after adding a case."""
import json, os

BASE = """apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: bad
spec:
  domain:
    cpu: {cores: 1}
    memory: {guest: 128Mi}
    devices:
      disks:
      - {name: d, disk: {bus: scsi}}
  volumes:
  - {name: d, hostDisk: {path: /tmp/d.img, type: DiskOrCreate, capacity: 1Mi}}
"""

def sub(old, new, base=BASE):
    assert old in base, old
    return base.replace(old, new, 1)

def deep_yaml(n):
    return BASE + "status:\n  x: " + "[" * n + "]" * n + "\n"

cases = []
def case(name, text, expect):
    cases.append((name, text, expect))

# --- syntax ---
case("syntax-yaml-unclosed-flow.yaml", "apiVersion: kubevirt.io/v1\nkind: [\n", "(document): ")
case("syntax-yaml-tab-indent.yaml", "apiVersion: kubevirt.io/v1\nmetadata:\n\tname: x\n", "(document): ")
case("syntax-yaml-bad-indent.yaml", "metadata:\n  name: a\n name2: b\n", "(document): ")
case("syntax-json-trailing-comma.json", '{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",}', "(document): ")
case("syntax-json-unterminated.json", '{"apiVersion": "kubevirt.io/v1", "kind": "Virtual', "(document): ")
case("syntax-json-garbage-after.json", '{"apiVersion": "kubevirt.io/v1"} trailing', "(document): ")
case("document-empty.yaml", "", "(document): ")
case("document-scalar.yaml", "hello\n", "(document): not a Kubernetes object")
case("document-list.yaml", "- 1\n- 2\n", "(document): not a Kubernetes object")
case("document-two-documents.yaml", BASE + "---\n" + BASE, "(document): ")
case("encoding-not-utf8.yaml", sub("name: bad", "name: b\xffad").encode("latin-1"), "(document): not UTF-8 (invalid byte at offset 75)")
case("encoding-nul-byte.yaml", sub("name: bad", "name: b\x00ad"), "(document): ")
# --- wrong types ---
case("type-cores-string.yaml", sub("cores: 1", "cores: two"), "spec.domain.cpu.cores: invalid type")
case("type-cores-negative.yaml", sub("cores: 1", "cores: -1"), "spec.domain.cpu.cores: invalid value")
case("type-cores-float.yaml", sub("cores: 1", "cores: 1.5"), "spec.domain.cpu.cores: invalid type")
case("type-cores-over-u32.yaml", sub("cores: 1", "cores: 18446744073709551616"), "spec.domain.cpu.cores: ")
case("type-disks-not-list.yaml", sub("      disks:\n      - {name: d, disk: {bus: scsi}}", "      disks: {name: d}"), "spec.domain.devices.disks: invalid type")
case("type-name-list.yaml", sub("name: bad", "name: [a]"), "metadata.name: invalid type")
case("type-volume-string.yaml", sub("  volumes:\n  - {name: d,", "  volumes:\n  - d\n  - {name: d,"), "spec.volumes[0]: invalid type")
case("type-spec-null-domain.yaml", "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata: {name: a}\nspec: {domain: 5}\n", "spec.domain: invalid type")
case("type-json-cores-string.json", json.dumps({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {"name": "a"}, "spec": {"domain": {"cpu": {"cores": "1"}, "memory": {"guest": "128Mi"}, "devices": {}}}}), "spec.domain.cpu.cores: invalid type")
case("type-vm-running-string.yaml", "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata: {name: a}\nspec:\n  running: \"yes\"\n  template:\n    spec:\n      domain: {memory: {guest: 128Mi}, devices: {}}\n", "spec.running: invalid type")
# --- unknown and unsupported ---
case("unknown-kind.yaml", sub("kind: VirtualMachineInstance", "kind: Pod"), "kind: \"Pod\": unsupported kind")
case("unknown-field-typo.yaml", sub("cpu: {cores: 1}", "cpuu: {cores: 1}"), "spec.domain.cpuu: unknown field `cpuu`")
case("unknown-field-top.yaml", BASE + "extra: 1\n", "extra: unknown field `extra`")
case("unsupported-gpus.yaml", sub("      disks:", "      gpus: [{name: g, deviceName: nvidia.com/GP}]\n      disks:"), "spec.domain.devices.gpus: unsupported")
case("unsupported-generate-name.yaml", sub("  name: bad", "  name: bad\n  generateName: bad-"), "metadata.generateName: unsupported")
case("unsupported-hook-annotation.yaml", sub("  name: bad", "  name: bad\n  annotations: {hooks.kubevirt.io/hookSidecars: '[]'}"), "unsupported")
case("unsupported-vm-kind-preset.yaml", sub("kind: VirtualMachineInstance", "kind: VirtualMachineInstancePreset"), "kind: \"VirtualMachineInstancePreset\": unsupported kind")
# --- validation rules ---
case("rule-name-missing.yaml", sub("metadata:\n  name: bad\n", "metadata: {}\n"), "metadata: missing field `name`")
case("rule-name-not-dns1123.yaml", sub("name: bad", "name: Bad_Name"), "metadata.name: ")
case("rule-name-too-long.yaml", sub("name: bad", "name: " + "a" * 300), "metadata.name: ")
case("rule-namespace-bad.yaml", sub("  name: bad", "  name: bad\n  namespace: 'x y'"), "metadata.namespace: ")
case("rule-memory-missing.yaml", sub("    memory: {guest: 128Mi}\n", ""), "spec.domain.memory")
case("rule-memory-bad-quantity.yaml", sub("guest: 128Mi", "guest: 128Mo"), "spec.domain.memory.guest: ")
case("rule-memory-zero.yaml", sub("guest: 128Mi", "guest: '0'"), "spec.domain.memory.guest: ")
case("rule-hugepages-size.yaml", sub("memory: {guest: 128Mi}", "memory: {guest: 128Mi, hugepages: {pageSize: 4Ki}}"), "spec.domain.memory.hugepages.pageSize: \"4Ki\" is not 2Mi or 1Gi")
case("rule-cores-zero.yaml", sub("cores: 1", "cores: 0"), "spec.domain.cpu.cores: must be at least 1")
case("rule-machine-unknown.yaml", sub("    cpu: {cores: 1}", "    cpu: {cores: 1}\n    machine: {type: virt}"), "spec.domain.machine.type: ")
case("rule-firmware-uuid.yaml", sub("    cpu: {cores: 1}", "    cpu: {cores: 1}\n    firmware: {uuid: not-a-uuid}"), "spec.domain.firmware.uuid: \"not-a-uuid\" is not a UUID")
case("rule-disk-bus.yaml", sub("bus: scsi", "bus: floppy"), "spec.domain.devices.disks[0].disk.bus: bus \"floppy\" is not valid for a disk")
case("rule-serial-too-long.yaml", sub("{name: d, disk: {bus: scsi}}", "{name: d, disk: {bus: scsi}, serial: '" + "s" * 37 + "'}"), "spec.domain.devices.disks[0].serial: 37 characters, at most 36 on bus scsi")
case("rule-serial-bad-char.yaml", sub("{name: d, disk: {bus: scsi}}", "{name: d, disk: {bus: scsi}, serial: 'a b'}"), "spec.domain.devices.disks[0].serial: ")
case("rule-disk-two-kinds.yaml", sub("disk: {bus: scsi}}", "disk: {bus: scsi}, cdrom: {bus: sata}}"), "spec.domain.devices.disks[0]: only one of disk, cdrom, lun may be set")
case("rule-disk-without-volume.yaml", sub("      - {name: d, disk: {bus: scsi}}", "      - {name: d, disk: {bus: scsi}}\n      - {name: orphan, disk: {bus: scsi}}"), "spec.domain.devices.disks[1]")
case("rule-disk-duplicate-name.yaml", sub("      - {name: d, disk: {bus: scsi}}", "      - {name: d, disk: {bus: scsi}}\n      - {name: d, disk: {bus: scsi}}"), "spec.domain.devices.disks[1].name: ")
case("rule-io-native-without-cache-none.yaml", sub("{name: d, disk: {bus: scsi}}", "{name: d, disk: {bus: scsi}, io: native, cache: writeback}"), "spec.domain.devices.disks[0].io: ")
case("rule-cache-invalid.yaml", sub("{name: d, disk: {bus: scsi}}", "{name: d, disk: {bus: scsi}, cache: unsafe}"), "spec.domain.devices.disks[0].cache: \"unsafe\" is not one of")
case("rule-boot-order-duplicate.yaml", sub("      - {name: d, disk: {bus: scsi}}", "      - {name: d, disk: {bus: scsi}, bootOrder: 1}\n      - {name: e, disk: {bus: scsi}, bootOrder: 1}") + "  - {name: e, emptyDisk: {capacity: 1Mi}}\n", "spec.domain.devices.disks[1].bootOrder: ")
case("rule-volume-no-source.yaml", sub("  - {name: d, hostDisk: {path: /tmp/d.img, type: DiskOrCreate, capacity: 1Mi}}", "  - {name: d}"), "spec.volumes[0]: ")
case("rule-volume-two-sources.yaml", sub("capacity: 1Mi}}\n", "capacity: 1Mi}, emptyDisk: {capacity: 1Mi}}\n"), "spec.volumes[0]: ")
case("rule-hostdisk-relative.yaml", sub("path: /tmp/d.img", "path: tmp/d.img"), "spec.volumes[0].hostDisk.path: ")
case("rule-emptydisk-zero.yaml", sub("hostDisk: {path: /tmp/d.img, type: DiskOrCreate, capacity: 1Mi}", "emptyDisk: {capacity: '0'}"), "spec.volumes[0].emptyDisk.capacity: must be more than 0")
case("rule-cloudinit-bad-base64.yaml", sub("hostDisk: {path: /tmp/d.img, type: DiskOrCreate, capacity: 1Mi}", "cloudInitNoCloud: {userDataBase64: '***'}"), "spec.volumes[0].cloudInitNoCloud.userDataBase64: ")
case("rule-cloudinit-no-userdata.yaml", sub("hostDisk: {path: /tmp/d.img, type: DiskOrCreate, capacity: 1Mi}", "cloudInitNoCloud: {}"), "spec.volumes[0].cloudInitNoCloud: userData or userDataBase64 is required")
case("rule-mac-invalid.yaml", sub("      disks:", "      interfaces: [{name: default, masquerade: {}, macAddress: 'zz:00:00:00:00:00'}]\n      disks:") + "  networks: [{name: default, pod: {}}]\n", "spec.domain.devices.interfaces[0].macAddress: ")
case("rule-interface-without-network.yaml", sub("      disks:", "      interfaces: [{name: nic0, masquerade: {}}]\n      disks:"), "spec.domain.devices.interfaces[0]")
case("rule-nic-model.yaml", sub("      disks:", "      interfaces: [{name: default, masquerade: {}, model: tulip}]\n      disks:") + "  networks: [{name: default, pod: {}}]\n", "spec.domain.devices.interfaces[0].model: \"tulip\" is not one of")
case("rule-two-pod-networks.yaml", sub("      disks:", "      interfaces: [{name: a, masquerade: {}}, {name: b, masquerade: {}}]\n      disks:") + "  networks: [{name: a, pod: {}}, {name: b, pod: {}}]\n", "spec.networks: at most one pod network")
case("rule-watchdog-no-model.yaml", sub("      disks:", "      watchdog: {name: w}\n      disks:"), "spec.domain.devices.watchdog: a watchdog needs a model")
case("rule-clock-utc-and-timezone.yaml", sub("    cpu: {cores: 1}", "    cpu: {cores: 1}\n    clock: {utc: {}, timezone: Europe/Paris}"), "spec.domain.clock: utc and timezone cannot both be set")
case("rule-kernelboot-no-path.yaml", sub("    cpu: {cores: 1}", "    cpu: {cores: 1}\n    firmware: {kernelBoot: {container: {initrdPath: /x}}}"), "spec.domain.firmware.kernelBoot.container.kernelPath: is required")
case("rule-vm-running-and-strategy.yaml", "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata: {name: a}\nspec:\n  running: true\n  runStrategy: Always\n  template:\n    spec:\n      domain: {memory: {guest: 128Mi}, devices: {}}\n", "spec.running: cannot be combined with spec.runStrategy")
# --- huge numbers and bounds ---
case("bound-cores-70000.yaml", sub("cores: 1", "cores: 70000"), "spec.domain.cpu: 70000 vCPUs (sockets × cores × threads), at most 288")
case("bound-vcpu-product-overflow.yaml", sub("cores: 1", "sockets: 65536, cores: 65536"), "spec.domain.cpu: 4294967296 vCPUs (sockets × cores × threads), at most 288")
case("bound-resources-cpu-huge.yaml", sub("    cpu: {cores: 1}\n", "    resources: {limits: {cpu: '4294967296'}}\n"), "spec.domain.resources.limits.cpu: 4294967296 vCPUs, at most 288")
case("bound-emptydisk-200Pi.yaml", sub("hostDisk: {path: /tmp/d.img, type: DiskOrCreate, capacity: 1Mi}", "emptyDisk: {capacity: 200Pi}"), "spec.volumes[0].emptyDisk.capacity: 200Pi is more than 2Pi")
case("bound-emptydisk-16Ei.yaml", sub("hostDisk: {path: /tmp/d.img, type: DiskOrCreate, capacity: 1Mi}", "emptyDisk: {capacity: 16Ei}"), "spec.volumes[0].emptyDisk.capacity: quantity \"16Ei\" is out of range")
case("bound-emptydisk-negative.yaml", sub("hostDisk: {path: /tmp/d.img, type: DiskOrCreate, capacity: 1Mi}", "emptyDisk: {capacity: -1Gi}"), "spec.volumes[0].emptyDisk.capacity: ")
case("bound-hostdisk-capacity-huge.yaml", sub("capacity: 1Mi", "capacity: 1Ei"), "spec.volumes[0].hostDisk.capacity: 1Ei is more than 2Pi")
case("bound-memory-huge.yaml", sub("guest: 128Mi", "guest: 64Ei"), "spec.domain.memory.guest: ")
case("bound-grace-period-negative.yaml", sub("spec:\n  domain:", "spec:\n  terminationGracePeriodSeconds: -5\n  domain:"), "spec.terminationGracePeriodSeconds: ")
case("bound-too-many-disks.yaml", sub("      disks:\n      - {name: d, disk: {bus: scsi}}\n", "      disks:\n" + "".join("      - {name: d%d, disk: {bus: scsi}}\n" % i for i in range(300))).replace("  volumes:\n  - {name: d, hostDisk: {path: /tmp/d.img, type: DiskOrCreate, capacity: 1Mi}}\n", "  volumes:\n" + "".join("  - {name: d%d, emptyDisk: {capacity: 1Mi}}\n" % i for i in range(300))), "spec.domain.devices.disks: 300 disks, at most 256")
case("bound-too-many-volumes.yaml", BASE + "".join("  - {name: v%d, emptyDisk: {capacity: 1Mi}}\n" % i for i in range(300)), "spec.volumes: 301 volumes, at most 256")
oversized = BASE + "status:\n  junk: '" + "x" * (1 << 20) + "'\n"
case("bound-oversized-document.yaml", oversized, "(document): %d bytes, at most 1048576" % len(oversized))
# --- control characters ---
case("control-uid.yaml", sub("  name: bad", "  name: bad\n  uid: \"ab\\x01cd\""), "metadata.uid: control character U+0001")
case("control-kernel-args.yaml", sub("    cpu: {cores: 1}", "    cpu: {cores: 1}\n    firmware: {kernelBoot: {kernelArgs: \"console=ttyS0\\x07\", container: {kernelPath: /k, initrdPath: /i}}}"), "spec.domain.firmware.kernelBoot.kernelArgs: control character U+0007")
case("control-hostdisk-path.yaml", sub("path: /tmp/d.img", "path: \"/tmp/d\\n.img\""), "spec.volumes[0].hostDisk.path: control character U+000A")
case("control-kernel-path.yaml", sub("    cpu: {cores: 1}", "    cpu: {cores: 1}\n    firmware: {kernelBoot: {container: {kernelPath: \"/k\\x1b[2J\", initrdPath: /i}}}"), "spec.domain.firmware.kernelBoot.container.kernelPath: control character U+001B")
case("control-vendorid.yaml", sub("    cpu: {cores: 1}", "    cpu: {cores: 1}\n    features: {hyperv: {vendorid: {vendorid: \"ab\\x02\"}}}"), "spec.domain.features.hyperv.vendorid.vendorid: control character U+0002")
case("control-label-value.yaml", sub("  name: bad", "  name: bad\n  labels: {app: \"a\\x00b\"}"), "metadata.labels.app: control character U+0000")
# --- host paths the launcher (root) would open or create: a spec must not name them ---
case("hostpath-etc.yaml", sub("path: /tmp/d.img", "path: /etc/cron.d/x"), "spec.volumes[0].hostDisk.path: \"/etc/cron.d/x\" is under /etc")
case("hostpath-dotdot.yaml", sub("path: /tmp/d.img", "path: /tmp/../etc/passwd"), "spec.volumes[0].hostDisk.path: \"/tmp/../etc/passwd\" has a \"..\" component")
case("hostpath-initrd-shadow.yaml", sub("    cpu: {cores: 1}", "    cpu: {cores: 1}\n    firmware: {kernelBoot: {container: {kernelPath: /k, initrdPath: /etc/shadow}}}"), "spec.domain.firmware.kernelBoot.container.initrdPath: \"/etc/shadow\" is under /etc")
# The launcher's own state, the pod's and the node's secrets (the launcher and QEMU act as root).
def hostdisk(path, kind="Disk"):
    return sub("path: /tmp/d.img, type: DiskOrCreate", "path: %s, type: %s" % (path, kind))
HD = "spec.volumes[0].hostDisk.path: "
OWN, SECRETS = "the launcher's own state", "where secrets are kept"
case("hostpath-saved-sync.yaml", hostdisk("/var/run/vmlauncher/last-sync.1.json"), HD + '"/var/run/vmlauncher/last-sync.1.json" is under /var/run/vmlauncher, ' + OWN)
case("hostpath-swtpm-state.yaml", hostdisk("/run/vmlauncher/libvirt/lib/swtpm/x/tpm2/tpm2-00.permall"), HD + '"/run/vmlauncher/libvirt/lib/swtpm/x/tpm2/tpm2-00.permall" is under /run/vmlauncher, ' + OWN)
case("hostpath-capability-cache.yaml", hostdisk("/var/cache/vmlauncher/qemu-capabilities/x.xml"), HD + '"/var/cache/vmlauncher/qemu-capabilities/x.xml" is under /var/cache/vmlauncher/qemu-capabilities, ' + OWN)
case("hostpath-hotplug-dir.yaml", hostdisk("/var/run/kubevirt/hotplug-disks/v.img"), HD + '"/var/run/kubevirt/hotplug-disks/v.img" is under /var/run/kubevirt/hotplug-disks, ' + OWN)
case("hostpath-etcd.yaml", hostdisk("/var/lib/etcd/member/snap/db"), HD + '"/var/lib/etcd/member/snap/db" is under /var/lib/etcd, ' + SECRETS)
case("hostpath-kubelet-secret.yaml", hostdisk("/var/lib/kubelet/pods/p/volumes/kubernetes.io~secret/s/token", "DiskOrCreate"), HD + '"/var/lib/kubelet/pods/p/volumes/kubernetes.io~secret/s/token" is under /var/lib/kubelet, ' + SECRETS)
case("hostpath-sa-token.yaml", hostdisk("/var/run/secrets/kubernetes.io/serviceaccount/token"), HD + '"/var/run/secrets/kubernetes.io/serviceaccount/token" is under /var/run/secrets, ' + SECRETS)
case("hostpath-initrd-sa-token.yaml", sub("    cpu: {cores: 1}", "    cpu: {cores: 1}\n    firmware: {kernelBoot: {container: {kernelPath: /k, initrdPath: /run/secrets/kubernetes.io/serviceaccount/token}}}"), 'spec.domain.firmware.kernelBoot.container.initrdPath: "/run/secrets/kubernetes.io/serviceaccount/token" is under /run/secrets, ' + SECRETS)
# --- nesting, aliases, duplicates ---
case("nesting-deep-yaml.yaml", deep_yaml(5000), "(document): ")
case("nesting-deep-json.json", '{"apiVersion": "kubevirt.io/v1", "status": ' + "[" * 5000 + "]" * 5000 + "}", "(document): ")
bomb = "status:\n  a: &a [x, x, x, x, x, x, x, x, x, x]\n"
prev = "a"
for i, n in enumerate("bcdefghij"):
    bomb += "  %s: &%s [%s]\n" % (n, n, ", ".join(["*" + prev] * 10))
    prev = n
case("alias-billion-laughs.yaml", BASE + bomb, "(document): ")
wide = "status:\n  x: &x [" + ", ".join(["~"] * 5000) + "]\n  y: [" + ", ".join(["*x"] * 5000) + "]\n"
case("alias-wide-bomb.yaml", BASE + wide, "the document expands to more than 200000 values (YAML aliases)")
# Aliases of a long string: few values, but every alias is a copy of 600,000 bytes. 2,000 of them
# (606 KB) took 1.19 GB to validate and were accepted; the largest that fits the document bound
# would take about 83 GiB.
STRINGS_OVER = "the document expands to more than 4194304 bytes of strings (YAML aliases)"
def string_bomb(n):
    return BASE + "status:\n  s: &a " + "A" * 600000 + "\n  l: [" + ", ".join(["*a"] * n) + "]\n"
case("alias-string-bomb.yaml", string_bomb(2000), STRINGS_OVER)
largest = (1048576 - len(string_bomb(0)) + 2) // 4
assert len(string_bomb(largest)) <= 1048576 < len(string_bomb(largest + 1))
case("alias-string-bomb-1mib.yaml", string_bomb(largest), STRINGS_OVER)
# The same through a mapping's key: 100 copies of a 64 KiB key.
# A key this long must be explicit (`?`): YAML caps implicit keys at 1,024 characters.
case("alias-key-bomb.yaml", BASE + "status:\n  m: &a\n    ? " + "k" * 65536 + "\n    : 1\n  l: [" + ", ".join(["*a"] * 100) + "]\n", STRINGS_OVER)
case("duplicate-key-yaml.yaml", sub("  name: bad", "  name: bad\n  name: other"), "metadata: duplicate key \"name\"")
case("duplicate-key-json.json", '{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "kind": "Pod", "metadata": {"name": "a"}}', '(document): duplicate key "kind"')

for f in os.listdir("."):
    if f not in ("generate.py",):
        os.remove(f)
with open("EXPECTED", "w") as out:
    out.write("# file<TAB>what stderr must contain (exit code 2); written by generate.py\n")
    for name, text, expect in cases:
        data = text if isinstance(text, bytes) else text.encode()
        with open(name, "wb") as f:
            f.write(data)
        out.write("%s\t%s\n" % (name, expect))
print(len(cases), "cases")
