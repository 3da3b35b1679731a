//! The model to XML, with quick-xml: what vmlauncher asks libvirt to define and attach.

use std::io;

use quick_xml::events::BytesText;
use quick_xml::Writer;

use super::*;

/// The guest target name for an index: `prefix` + a, b, ..., z, aa, ab, ... (Linux's scheme).
pub fn target_name(prefix: &str, index: u32) -> String {
    let mut letters = Vec::new();
    let mut n = index as u64 + 1;
    while n > 0 {
        n -= 1;
        letters.push(b'a' + (n % 26) as u8);
        n /= 26;
    }
    letters.reverse();
    format!("{prefix}{}", String::from_utf8(letters).expect("ascii"))
}

type XmlWriter = Writer<Vec<u8>>;

fn text_element(w: &mut XmlWriter, name: &str, text: &str) -> io::Result<()> {
    w.create_element(name)
        .write_text_content(BytesText::new(text))?;
    Ok(())
}

fn empty(w: &mut XmlWriter, name: &str, attrs: &[(&str, &str)]) -> io::Result<()> {
    w.create_element(name)
        .with_attributes(attrs.iter().copied())
        .write_empty()?;
    Ok(())
}

fn on_off(on: bool) -> &'static str {
    if on {
        "on"
    } else {
        "off"
    }
}

fn yes_no(on: bool) -> &'static str {
    if on {
        "yes"
    } else {
        "no"
    }
}

fn alias(w: &mut XmlWriter, name: &str) -> io::Result<()> {
    let alias = format!("{USER_ALIAS_PREFIX}{name}");
    empty(w, "alias", &[("name", alias.as_str())])
}

/// The disk `type` and the `<source>` attribute that names `source`.
fn source_kind(source: &DiskSource) -> (&'static str, &'static str) {
    match source {
        DiskSource::File(_) => ("file", "file"),
        DiskSource::Block(_) => ("block", "dev"),
    }
}

fn write_disk(w: &mut XmlWriter, disk: &DiskDef) -> io::Result<()> {
    let (disk_type, source_attr) = source_kind(&disk.source);
    // A pinned image goes to QEMU as its pin (`DiskDef::pin`).
    let source = disk.qemu_path().to_string_lossy();
    w.create_element("disk")
        .with_attributes([("type", disk_type), ("device", disk.device.as_str())])
        .write_inner_content(|w| {
            let format = if disk.format.is_empty() {
                "raw"
            } else {
                disk.format
            };
            let iothread = disk.iothread.map(|t| t.to_string());
            let mut driver = vec![("name", "qemu"), ("type", format)];
            if let Some(cache) = &disk.cache {
                driver.push(("cache", cache));
            }
            if let Some(policy) = &disk.error_policy {
                driver.push(("error_policy", policy));
            }
            if let Some(io) = &disk.io {
                driver.push(("io", io));
            }
            if let Some(t) = &iothread {
                driver.push(("iothread", t));
            }
            empty(w, "driver", &driver)?;
            let mut source_attrs = vec![(source_attr, source.as_ref())];
            if let Some(group) = &disk.fd_group {
                source_attrs.push(("fdgroup", group));
            }
            if disk.given_to_qemu || disk.host_file {
                w.create_element("source")
                    .with_attributes(source_attrs)
                    .write_inner_content(|w| {
                        empty(w, "seclabel", &[("model", "dac"), ("relabel", "no")])
                    })?;
            } else {
                empty(w, "source", &source_attrs)?;
            }
            if let Some((backing, format)) =
                disk.backing.as_ref().and_then(|b| Some((b, b.format?)))
            {
                let (backing_type, attr) = source_kind(&backing.source);
                let path = backing.qemu_path().to_string_lossy();
                w.create_element("backingStore")
                    .with_attribute(("type", backing_type))
                    .write_inner_content(|w| {
                        empty(w, "format", &[("type", format)])?;
                        let mut source = vec![(attr, path.as_ref())];
                        if let Some(group) =
                            &disk.backing.as_ref().and_then(|b| b.fd_group.as_deref())
                        {
                            source.push(("fdgroup", group));
                        }
                        w.create_element("source")
                            .with_attributes(source)
                            .write_inner_content(|w| {
                                empty(w, "seclabel", &[("model", "dac"), ("relabel", "no")])
                            })?;
                        empty(w, "backingStore", &[])
                    })?;
            }
            empty(
                w,
                "target",
                &[("dev", disk.target.as_str()), ("bus", disk.bus.as_str())],
            )?;
            if let Some(serial) = &disk.serial {
                text_element(w, "serial", serial)?;
            }
            if let Some(order) = disk.boot_order {
                empty(w, "boot", &[("order", &order.to_string())])?;
            }
            if disk.readonly {
                empty(w, "readonly", &[])?;
            }
            if disk.shareable {
                empty(w, "shareable", &[])?;
            }
            alias(w, &disk.volume)?;
            if let Some(addr) = disk.address {
                let controller = addr.controller.to_string();
                let unit = addr.unit.to_string();
                empty(
                    w,
                    "address",
                    &[
                        ("type", "drive"),
                        ("controller", controller.as_str()),
                        ("bus", "0"),
                        ("target", "0"),
                        ("unit", unit.as_str()),
                    ],
                )?;
            }
            Ok(())
        })?;
    Ok(())
}

fn write_interface(w: &mut XmlWriter, iface: &InterfaceDef) -> io::Result<()> {
    let kind = match iface.backend {
        InterfaceBackend::User => "user",
        InterfaceBackend::Tap(_) => "ethernet",
    };
    w.create_element("interface")
        .with_attribute(("type", kind))
        .write_inner_content(|w| {
            if let Some(mac) = &iface.mac {
                empty(w, "mac", &[("address", mac)])?;
            }
            if let InterfaceBackend::Tap(dev) = &iface.backend {
                empty(w, "target", &[("dev", dev), ("managed", "no")])?;
            }
            empty(w, "model", &[("type", &iface.model)])?;
            if iface.link_down {
                empty(w, "link", &[("state", "down")])?;
            }
            if let Some(order) = iface.boot_order {
                empty(w, "boot", &[("order", &order.to_string())])?;
            }
            for fwd in &iface.port_forwards {
                w.create_element("portForward")
                    .with_attributes([("proto", fwd.protocol.as_str()), ("address", &fwd.address)])
                    .write_inner_content(|w| {
                        empty(
                            w,
                            "range",
                            &[
                                ("start", &fwd.host_port.to_string()),
                                ("to", &fwd.port.to_string()),
                            ],
                        )
                    })?;
            }
            alias(w, &iface.name)
        })?;
    Ok(())
}

impl DomainDef {
    /// The whole domain XML. Deterministic: the same definition gives the same bytes.
    pub fn to_xml(&self) -> String {
        let mut w = Writer::new_with_indent(Vec::new(), b' ', 2);
        self.write(&mut w).expect("writing to a Vec cannot fail");
        let mut xml = String::from_utf8(w.into_inner()).expect("quick-xml writes UTF-8");
        xml.push('\n');
        xml
    }

    fn write(&self, w: &mut XmlWriter) -> io::Result<()> {
        w.create_element("domain")
            .with_attribute(("type", self.virt_type.as_str()))
            .write_inner_content(|w| {
                text_element(w, "name", &self.name)?;
                if let Some(uuid) = &self.uuid {
                    text_element(w, "uuid", uuid)?;
                }
                w.create_element("metadata").write_inner_content(|w| {
                    let mut attrs = vec![
                        ("xmlns:vmlauncher", METADATA_NAMESPACE),
                        ("namespace", self.instance.namespace.as_str()),
                        ("name", self.instance.name.as_str()),
                    ];
                    if let Some(uid) = &self.instance.uid {
                        attrs.push(("uid", uid.as_str()));
                    }
                    empty(w, "vmlauncher:instance", &attrs)
                })?;
                if let Some(mem) = &self.virtio_mem {
                    // virtio-mem needs no DIMM slots, but libvirt wants the attribute.
                    w.create_element("maxMemory")
                        .with_attributes([("slots", "1"), ("unit", "KiB")])
                        .write_text_content(BytesText::new(
                            &(self.memory_kib + mem.size_kib).to_string(),
                        ))?;
                }
                w.create_element("memory")
                    .with_attribute(("unit", "KiB"))
                    .write_text_content(BytesText::new(&self.memory_kib.to_string()))?;
                if let Some(page) = self.hugepage_kib {
                    w.create_element("memoryBacking").write_inner_content(|w| {
                        w.create_element("hugepages").write_inner_content(|w| {
                            empty(w, "page", &[("size", &page.to_string()), ("unit", "KiB")])
                        })?;
                        Ok(())
                    })?;
                }
                let mut vcpu = w.create_element("vcpu");
                vcpu = vcpu.with_attribute(("placement", "static"));
                let enabled = self.vcpus_enabled.map(|n| n.to_string());
                if let Some(enabled) = &enabled {
                    vcpu = vcpu.with_attribute(("current", enabled.as_str()));
                }
                vcpu.write_text_content(BytesText::new(&self.topology.vcpus().to_string()))?;
                if let Some(enabled) = self.vcpus_enabled {
                    self.write_vcpus(w, enabled)?;
                }
                if self.iothreads > 0 {
                    text_element(w, "iothreads", &self.iothreads.to_string())?;
                }
                if let Some(tune) = &self.cputune {
                    w.create_element("cputune").write_inner_content(|w| {
                        for (vcpu, cpu) in tune.vcpu_pins.iter().enumerate() {
                            empty(
                                w,
                                "vcpupin",
                                &[("vcpu", &vcpu.to_string()), ("cpuset", &cpu.to_string())],
                            )?;
                        }
                        if let Some(cpu) = tune.emulator_pin {
                            empty(w, "emulatorpin", &[("cpuset", &cpu.to_string())])?;
                        }
                        Ok(())
                    })?;
                }
                self.write_cpu(w)?;
                if let Some(serial) = &self.sysinfo_serial {
                    w.create_element("sysinfo")
                        .with_attribute(("type", "smbios"))
                        .write_inner_content(|w| {
                            w.create_element("system").write_inner_content(|w| {
                                w.create_element("entry")
                                    .with_attribute(("name", "serial"))
                                    .write_text_content(BytesText::new(serial))?;
                                Ok(())
                            })?;
                            Ok(())
                        })?;
                }
                self.write_os(w)?;
                self.write_features(w)?;
                self.write_clock(w)?;
                // The launcher decides what happens after a stop (run strategy), not libvirt.
                text_element(w, "on_poweroff", "destroy")?;
                text_element(w, "on_reboot", "restart")?;
                text_element(w, "on_crash", "destroy")?;
                self.write_devices(w)
            })?;
        Ok(())
    }

    fn write_cpu(&self, w: &mut XmlWriter) -> io::Result<()> {
        let mode = match &self.cpu.mode {
            CpuMode::Default => None,
            CpuMode::HostModel => Some("host-model"),
            CpuMode::HostPassthrough => Some("host-passthrough"),
            CpuMode::Custom(_) => Some("custom"),
        };
        let mut cpu = w.create_element("cpu");
        if let Some(mode) = mode {
            cpu = cpu.with_attribute(("mode", mode));
        }
        cpu.write_inner_content(|w| {
            if let CpuMode::Custom(model) = &self.cpu.mode {
                w.create_element("model")
                    .with_attribute(("fallback", "forbid"))
                    .write_text_content(BytesText::new(model))?;
            }
            let (s, c, t) = (
                self.topology.sockets.to_string(),
                self.topology.cores.to_string(),
                self.topology.threads.to_string(),
            );
            empty(
                w,
                "topology",
                &[
                    ("sockets", s.as_str()),
                    ("dies", "1"),
                    ("cores", c.as_str()),
                    ("threads", t.as_str()),
                ],
            )?;
            for (policy, name) in &self.cpu.features {
                empty(w, "feature", &[("policy", policy), ("name", name)])?;
            }
            if self.virtio_mem.is_some() {
                // libvirt's rule for memory devices: the guest has NUMA node 0, which holds
                // every vCPU and the boot memory.
                let cpus = format!("0-{}", self.topology.vcpus() - 1);
                let memory = self.memory_kib.to_string();
                w.create_element("numa").write_inner_content(|w| {
                    empty(
                        w,
                        "cell",
                        &[
                            ("id", "0"),
                            ("cpus", cpus.as_str()),
                            ("memory", memory.as_str()),
                            ("unit", "KiB"),
                        ],
                    )
                })?;
            }
            Ok(())
        })?;
        Ok(())
    }

    /// `<vcpus>`: the first socket's vCPUs always there, the others hot-pluggable (KubeVirt's
    /// layout), the first `enabled` of them on.
    fn write_vcpus(&self, w: &mut XmlWriter, enabled: u32) -> io::Result<()> {
        let fixed = self.topology.cores * self.topology.threads;
        w.create_element("vcpus").write_inner_content(|w| {
            for id in 0..self.topology.vcpus() {
                empty(
                    w,
                    "vcpu",
                    &[
                        ("id", &id.to_string()),
                        ("enabled", yes_no(id < enabled)),
                        ("hotpluggable", yes_no(id >= fixed)),
                    ],
                )?;
            }
            Ok(())
        })?;
        Ok(())
    }

    fn write_os(&self, w: &mut XmlWriter) -> io::Result<()> {
        w.create_element("os").write_inner_content(|w| {
            w.create_element("type")
                .with_attributes([("arch", "x86_64"), ("machine", self.machine.as_str())])
                .write_text_content(BytesText::new("hvm"))?;
            if let FirmwareDef::Efi(efi) = &self.firmware {
                w.create_element("loader")
                    .with_attributes([
                        ("readonly", "yes"),
                        ("secure", yes_no(efi.secure)),
                        ("type", "pflash"),
                    ])
                    .write_text_content(BytesText::new(&efi.code.to_string_lossy()))?;
                w.create_element("nvram")
                    .with_attribute(("template", efi.vars_template.to_string_lossy().as_ref()))
                    .write_text_content(BytesText::new(&efi.nvram.to_string_lossy()))?;
            }
            if let Some(kb) = &self.kernel_boot {
                text_element(w, "kernel", &kb.kernel.to_string_lossy())?;
                if let Some(initrd) = &kb.initrd {
                    text_element(w, "initrd", &initrd.to_string_lossy())?;
                }
                if let Some(cmdline) = &kb.cmdline {
                    text_element(w, "cmdline", cmdline)?;
                }
            }
            if self.firmware == FirmwareDef::BiosUseSerial {
                empty(w, "bios", &[("useserial", "yes")])?;
            }
            if self.sysinfo_serial.is_some() {
                empty(w, "smbios", &[("mode", "sysinfo")])?;
            }
            Ok(())
        })?;
        Ok(())
    }

    fn write_features(&self, w: &mut XmlWriter) -> io::Result<()> {
        let f = &self.features;
        w.create_element("features").write_inner_content(|w| {
            if f.acpi {
                empty(w, "acpi", &[])?;
            }
            if f.apic {
                match f.apic_eoi {
                    Some(eoi) => empty(w, "apic", &[("eoi", on_off(eoi))])?,
                    None => empty(w, "apic", &[])?,
                }
            }
            if !f.hyperv.is_empty() {
                w.create_element("hyperv")
                    .with_attribute(("mode", "custom"))
                    .write_inner_content(|w| {
                        for h in &f.hyperv {
                            let mut attrs = vec![("state", on_off(h.on))];
                            if let Some((name, value)) = &h.attribute {
                                attrs.push((name, value));
                            }
                            match h.direct {
                                None => empty(w, h.name, &attrs)?,
                                Some(direct) => {
                                    w.create_element(h.name)
                                        .with_attributes(attrs)
                                        .write_inner_content(|w| {
                                            empty(w, "direct", &[("state", on_off(direct))])
                                        })?;
                                }
                            }
                        }
                        Ok(())
                    })?;
            }
            if let Some(hidden) = f.kvm_hidden {
                w.create_element("kvm")
                    .write_inner_content(|w| empty(w, "hidden", &[("state", on_off(hidden))]))?;
            }
            if let Some(on) = f.pvspinlock {
                empty(w, "pvspinlock", &[("state", on_off(on))])?;
            }
            if let Some(on) = f.smm {
                empty(w, "smm", &[("state", on_off(on))])?;
            }
            Ok(())
        })?;
        Ok(())
    }

    fn write_clock(&self, w: &mut XmlWriter) -> io::Result<()> {
        let adjustment;
        let attrs: Vec<(&str, &str)> = match &self.clock.offset {
            ClockOffset::Utc => vec![("offset", "utc")],
            ClockOffset::UtcAdjusted(seconds) => {
                adjustment = seconds.to_string();
                vec![
                    ("offset", "variable"),
                    ("adjustment", adjustment.as_str()),
                    ("basis", "utc"),
                ]
            }
            ClockOffset::Timezone(tz) => vec![("offset", "timezone"), ("timezone", tz.as_str())],
        };
        if self.clock.timers.is_empty() {
            return empty(w, "clock", &attrs);
        }
        w.create_element("clock")
            .with_attributes(attrs)
            .write_inner_content(|w| {
                for t in &self.clock.timers {
                    let mut attrs = vec![("name", t.name)];
                    if let Some(present) = t.present {
                        attrs.push(("present", yes_no(present)));
                    }
                    if let Some(policy) = &t.tickpolicy {
                        attrs.push(("tickpolicy", policy));
                    }
                    if let Some(track) = &t.track {
                        attrs.push(("track", track));
                    }
                    empty(w, "timer", &attrs)?;
                }
                Ok(())
            })?;
        Ok(())
    }

    fn write_devices(&self, w: &mut XmlWriter) -> io::Result<()> {
        w.create_element("devices").write_inner_content(|w| {
            if self.scsi_controller {
                empty(
                    w,
                    "controller",
                    &[("type", "scsi"), ("index", "0"), ("model", "virtio-scsi")],
                )?;
            }
            for disk in &self.disks {
                write_disk(w, disk)?;
            }
            for iface in &self.interfaces {
                write_interface(w, iface)?;
            }
            if let Some(serial) = &self.serial {
                write_serial(w, serial)?;
            }
            for input in &self.inputs {
                w.create_element("input")
                    .with_attributes([("type", input.input_type.as_str()), ("bus", &input.bus)])
                    .write_inner_content(|w| alias(w, &input.name))?;
            }
            if let Some(tpm) = &self.tpm {
                w.create_element("tpm")
                    .with_attribute(("model", "tpm-tis"))
                    .write_inner_content(|w| {
                        empty(
                            w,
                            "backend",
                            &[
                                ("type", "emulator"),
                                ("version", "2.0"),
                                ("persistent_state", yes_no(tpm.persistent)),
                            ],
                        )
                    })?;
            }
            if let Some(mem) = &self.virtio_mem {
                write_virtio_mem(w, mem)?;
            }
            if let Some(socket) = &self.vnc_socket {
                let socket = socket.to_string_lossy();
                w.create_element("graphics")
                    .with_attribute(("type", "vnc"))
                    .write_inner_content(|w| {
                        empty(
                            w,
                            "listen",
                            &[("type", "socket"), ("socket", socket.as_ref())],
                        )
                    })?;
                w.create_element("video").write_inner_content(|w| {
                    empty(
                        w,
                        "model",
                        &[("type", "vga"), ("vram", "16384"), ("heads", "1")],
                    )
                })?;
            }
            if let Some(wd) = &self.watchdog {
                w.create_element("watchdog")
                    .with_attributes([("model", "i6300esb"), ("action", wd.action.as_str())])
                    .write_inner_content(|w| alias(w, &wd.name))?;
            }
            if self.rng {
                w.create_element("rng")
                    .with_attribute(("model", "virtio"))
                    .write_inner_content(|w| {
                        w.create_element("backend")
                            .with_attribute(("model", "random"))
                            .write_text_content(BytesText::new("/dev/urandom"))?;
                        Ok(())
                    })?;
            }
            write_agent_channel(w)?;
            if self.memballoon {
                w.create_element("memballoon")
                    .with_attribute(("model", "virtio"))
                    .write_inner_content(|w| empty(w, "stats", &[("period", "10")]))?;
            } else {
                empty(w, "memballoon", &[("model", "none")])?;
            }
            Ok(())
        })?;
        Ok(())
    }
}

fn write_serial(w: &mut XmlWriter, serial: &SerialDef) -> io::Result<()> {
    let socket = serial.socket.to_string_lossy();
    w.create_element("serial")
        .with_attribute(("type", "unix"))
        .write_inner_content(|w| {
            // libvirt makes the socket (root's, in the root-owned console dir) and hands QEMU
            // its descriptor: with no relabel it never chowns a path in that dir.
            w.create_element("source")
                .with_attributes([("mode", "bind"), ("path", socket.as_ref())])
                .write_inner_content(|w| {
                    empty(w, "seclabel", &[("model", "dac"), ("relabel", "no")])
                })?;
            if let Some(log) = &serial.log {
                let log = log.to_string_lossy();
                empty(w, "log", &[("file", log.as_ref()), ("append", "on")])?;
            }
            empty(w, "target", &[("port", "0")])
        })?;
    Ok(())
}

/// The guest agent's virtio-serial port, in every domain, as KubeVirt's converter adds it
/// (`newGuestAgentChannel`): no `<source>`, so libvirt picks the socket path (and keeps it out of
/// a migration's XML, the target picking its own) and connects to the agent itself. Its live
/// `<target state=...>` is how the launcher and virt-handler learn that an agent is there.
fn write_agent_channel(w: &mut XmlWriter) -> io::Result<()> {
    w.create_element("channel")
        .with_attribute(("type", "unix"))
        .write_inner_content(|w| {
            empty(w, "target", &[("type", "virtio"), ("name", AGENT_CHANNEL)])
        })?;
    Ok(())
}

fn write_virtio_mem(w: &mut XmlWriter, mem: &VirtioMemDef) -> io::Result<()> {
    let kib = |w: &mut XmlWriter, name: &str, value: u64| -> io::Result<()> {
        w.create_element(name)
            .with_attribute(("unit", "KiB"))
            .write_text_content(BytesText::new(&value.to_string()))?;
        Ok(())
    };
    w.create_element("memory")
        .with_attribute(("model", "virtio-mem"))
        .write_inner_content(|w| {
            w.create_element("target").write_inner_content(|w| {
                kib(w, "size", mem.size_kib)?;
                text_element(w, "node", "0")?;
                kib(w, "block", VirtioMemDef::BLOCK_KIB)?;
                kib(w, "requested", mem.requested_kib)
            })?;
            empty(w, "alias", &[("name", VirtioMemDef::ALIAS)])
        })?;
    Ok(())
}

/// One device element alone, as `write` makes it: what libvirt's attach call takes.
fn element_xml(write: impl FnOnce(&mut XmlWriter) -> io::Result<()>) -> String {
    let mut w = Writer::new_with_indent(Vec::new(), b' ', 2);
    write(&mut w).expect("writing to a Vec cannot fail");
    String::from_utf8(w.into_inner()).expect("quick-xml writes UTF-8")
}

impl InterfaceDef {
    /// The `<interface>` element alone, as sent to libvirt's attach call.
    pub(crate) fn to_xml(&self) -> String {
        element_xml(|w| write_interface(w, self))
    }

    pub(crate) fn alias(&self) -> String {
        format!("{USER_ALIAS_PREFIX}{}", self.name)
    }
}

impl DiskDef {
    /// The `<disk>` element alone, as sent to libvirt's attach call.
    pub(crate) fn to_xml(&self) -> String {
        element_xml(|w| write_disk(w, self))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_names_follow_linux() {
        assert_eq!(target_name("sd", 0), "sda");
        assert_eq!(target_name("sd", 25), "sdz");
        assert_eq!(target_name("sd", 26), "sdaa");
        assert_eq!(target_name("sd", 27), "sdab");
        assert_eq!(target_name("vd", 701), "vdzz");
        assert_eq!(target_name("vd", 702), "vdaaa");
    }

    #[test]
    fn disk_xml_has_alias_serial_and_address() {
        let disk = DiskDef {
            volume: "data".into(),
            source: DiskSource::File("/var/data/a&b.img".into()),
            bus: Bus::Scsi,
            target: "sdb".into(),
            serial: Some("MixedCase-1".into()),
            address: Some(DriveAddress {
                controller: 0,
                unit: 1,
            }),
            ..Default::default()
        };
        assert_eq!(
            disk.to_xml(),
            r#"<disk type="file" device="disk">
  <driver name="qemu" type="raw"/>
  <source file="/var/data/a&amp;b.img"/>
  <target dev="sdb" bus="scsi"/>
  <serial>MixedCase-1</serial>
  <alias name="ua-data"/>
  <address type="drive" controller="0" bus="0" target="0" unit="1"/>
</disk>"#
        );
    }
}
