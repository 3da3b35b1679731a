//! The only place that touches the `virt` crate: a connection to one hypervisor (a private
//! libvirtd, or any URI), the domain calls the launcher needs, and the event subscription.
//!
//! Every call here blocks: async callers run them under `block_in_place` (the launcher's `call`)
//! or with `spawn_blocking`, never on an async worker as it is.

pub(crate) mod admin;
pub mod capcache;
pub mod daemon;
mod daemon_conf;
pub(crate) mod delivered;
mod error;
pub mod events;
mod kvm_node;
mod lean;
pub mod migrate;
mod orphans;
mod ports;
pub mod process;
mod start_pin;
mod states;
pub(crate) mod stats;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc::UnboundedSender;
use virt::connect::Connect;
use virt::domain::Domain;
use virt::error::ErrorNumber;
use virt::sys;

use crate::lifecycle::PowerState;
use events::{EventRegistration, HypervisorEvent};
use orphans::{orphan_device, remove_orphan};
use ports::publish_ports;

/// Attempts at an attach whose block node name a killed libvirtd already used in QEMU (one
/// index per attach in flight when it died; libvirt runs one at a time).
const ATTACH_NODE_NAME_RETRIES: u32 = 3;
use error::code_is;
pub(crate) use error::{LibvirtError, MAX_AGENT_ANSWER};
pub(crate) use states::power_state_from_raw;
pub(crate) use stats::{DomainStats, TypedValue};

/// Opens a connection to `uri`, with libvirt's process-wide set-up trimmed first.
pub(crate) fn connect(uri: &str) -> Result<Connect, virt::error::Error> {
    skip_unused_ssh_crypto_setup();
    Connect::open(Some(uri))
}

/// Must run before libvirt's first call, whichever it is (a connection, the event loop's
/// registration, `virGetVersion`), which runs its global set-up: that calls
/// `curl_global_init`, which calls `libssh2_init`, which loads and registers every cipher,
/// digest and engine of OpenSSL. In a launcher that speaks to libvirtd over a unix socket only,
/// that made 1.4 MiB of libcrypto resident, for nothing (measured with a C program that links
/// libvirt and opens one connection: 17.4 MiB RSS, 15.8 with this; libcrypto 2.9 MiB, 1.5).
/// libssh2 does its crypto set-up only in the first `libssh2_init` call; making that call first,
/// with `LIBSSH2_INIT_NO_CRYPTO`, skips it. Should an ssh transport ever be used, OpenSSL sets
/// itself up on first use, as it does since 1.1.0. Looked up at run time: a libvirt built
/// without libssh2 has nothing to skip.
pub(crate) fn skip_unused_ssh_crypto_setup() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        const LIBSSH2_INIT_NO_CRYPTO: libc::c_int = 1;
        // SAFETY: dlsym with RTLD_DEFAULT only looks a name up in the loaded objects.
        let symbol = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"libssh2_init".as_ptr()) };
        if !symbol.is_null() {
            // SAFETY: libssh2's `int libssh2_init(int flags)`; it only counts its callers and
            // records the flags when crypto set-up is skipped.
            unsafe {
                let init: unsafe extern "C" fn(libc::c_int) -> libc::c_int =
                    std::mem::transmute(symbol);
                init(LIBSSH2_INIT_NO_CRYPTO);
            }
        }
    });
}

/// The empty root ports libvirt leaves itself on a q35 machine whose devices it placed on root
/// ports it added: one, for a device plugged later.
const LIBVIRT_SPARE_PORTS: u32 = 1;

/// The PCIe root ports of a definition (`Hypervisor::define_and_start`): how many it keeps empty
/// beyond libvirt's own spare one, and how many its devices take.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RootPorts {
    pub(crate) spare: u32,
    pub(crate) for_devices: u32,
}

/// An open connection with its event subscription.
#[derive(Debug)]
pub struct Hypervisor {
    uri: String,
    // Dropped before `conn`: deregisters the callbacks while the connection is still open.
    _events: EventRegistration,
    /// The handle of the domain last looked up, by name: every call on it would otherwise cost
    /// a lookup round trip to libvirtd first (one of the launcher's extra calls per attach).
    /// A handle names the domain by UUID, so one made stale by an undefine and define is met by
    /// `NoDomain` and looked up again.
    last_domain: Mutex<Option<(String, Domain)>>,
    conn: Connect,
}

impl Hypervisor {
    /// Opens `uri` and sends every domain event of that connection to `events`.
    pub fn open(uri: &str, events: UnboundedSender<HypervisorEvent>) -> Result<Self, LibvirtError> {
        Self::open_on(uri, None, events)
    }

    /// [`Hypervisor::open`] on `conn`, a connection to `uri` open already, if given.
    pub(crate) fn open_on(
        uri: &str,
        conn: Option<Connect>,
        events: UnboundedSender<HypervisorEvent>,
    ) -> Result<Self, LibvirtError> {
        events::ensure_event_loop()?;
        let conn = match conn {
            Some(conn) => conn,
            None => connect(uri).map_err(|source| LibvirtError::Connect {
                uri: uri.into(),
                source,
            })?,
        };
        // Notice a dead daemon within seconds rather than at the next call (remote URIs only;
        // local drivers refuse keepalive, which is fine).
        let _ = conn.set_keep_alive(5, 3);
        let registration = EventRegistration::register(&conn, events)?;
        Ok(Hypervisor {
            uri: uri.into(),
            _events: registration,
            last_domain: Mutex::new(None),
            conn,
        })
    }

    /// The connection still works (libvirt's keepalive and socket state).
    pub(crate) fn is_alive(&self) -> bool {
        self.conn.is_alive().unwrap_or(false)
    }

    fn call_err<'a>(
        call: &'static str,
        domain: &'a str,
    ) -> impl FnOnce(virt::error::Error) -> LibvirtError + 'a {
        move |source| {
            if code_is(&source, ErrorNumber::NoDomain) {
                LibvirtError::NoDomain {
                    domain: domain.into(),
                }
            } else {
                LibvirtError::Call {
                    call,
                    domain: domain.into(),
                    source,
                }
            }
        }
    }

    /// Looks `name` up in libvirt (a round trip) and keeps the handle for later calls.
    fn domain(&self, name: &str) -> Result<Domain, LibvirtError> {
        let dom = self
            .conn
            .lookup_domain_by_name(name)
            .map_err(Self::call_err("lookup", name))?;
        *self.last_domain.lock().expect("domain handle lock") = Some((name.into(), dom.clone()));
        Ok(dom)
    }

    /// The kept handle of `name`, if there is one.
    fn cached_domain(&self, name: &str) -> Option<Domain> {
        let cached = self.last_domain.lock().expect("domain handle lock");
        cached
            .as_ref()
            .filter(|(n, _)| n == name)
            .map(|(_, d)| d.clone())
    }

    fn forget_domain(&self) {
        *self.last_domain.lock().expect("domain handle lock") = None;
    }

    /// One libvirt call on domain `name`; its error names the call and the domain. The kept
    /// handle is used when there is one; if libvirt no longer knows it (the domain was undefined,
    /// perhaps defined again with another UUID), the call did nothing and is made once more on a
    /// fresh lookup.
    fn on_domain<T>(
        &self,
        name: &str,
        call: &'static str,
        mut op: impl FnMut(&Domain) -> Result<T, virt::error::Error>,
    ) -> Result<T, LibvirtError> {
        if let Some(dom) = self.cached_domain(name) {
            match op(&dom).map_err(Self::call_err(call, name)) {
                Err(LibvirtError::NoDomain { .. }) => self.forget_domain(),
                done => return done,
            }
        }
        op(&self.domain(name)?).map_err(Self::call_err(call, name))
    }

    /// Whether libvirt has `name` now: always asked, never answered from the kept handle.
    pub(crate) fn exists(&self, name: &str) -> Result<bool, LibvirtError> {
        match self.domain(name) {
            Ok(_) => Ok(true),
            Err(LibvirtError::NoDomain { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Defines the domain persistently and starts it (what KubeVirt does; a persistent domain
    /// keeps its state and reason after it stops, so the launcher can read how it ended).
    /// `fds`: the images the XML names by `fdgroup`, opened by the launcher, given to libvirt
    /// for this start.
    /// `ports.spare`: empty root ports the definition keeps for devices plugged later, beyond
    /// the one libvirt leaves (`DomainDef::spare_pcie_ports`). The XML goes to libvirt with
    /// room for its own devices too (`ports.for_devices`), so that one define places them and
    /// leaves the rest empty; should libvirt fill more than that, the missing ones are added to
    /// its definition and it is made again.
    /// `forwards`: the definition forwards host ports (`hostfwd_add`, which needs the live
    /// XML); without, that read is skipped. Returns the machine of the definition libvirt made:
    /// the versioned one where the XML named an alias.
    pub(crate) fn define_and_start(
        &self,
        name: &str,
        xml: &str,
        ports: RootPorts,
        fds: &[(String, std::fs::File)],
        forwards: bool,
    ) -> Result<Option<String>, LibvirtError> {
        self.forget_domain();
        let xml_err = |source| LibvirtError::LiveXml {
            domain: name.into(),
            source,
        };
        let wanted_free = match ports.spare {
            0 => 0,
            spare => spare + LIBVIRT_SPARE_PORTS,
        };
        let first = match wanted_free {
            0 => std::borrow::Cow::Borrowed(xml),
            free => crate::domain::with_spare_root_ports(xml, ports.for_devices + free)
                .map_err(xml_err)?
                .into(),
        };
        let mut dom = self
            .conn
            .define_domain_xml(&first)
            .map_err(Self::call_err("define", name))?;
        // What libvirt made of it: the addresses it chose, and the versioned machine it wrote
        // for an alias (`q35` → `pc-q35-7.2`).
        let placed = match dom.xml_desc(sys::VIR_DOMAIN_XML_INACTIVE) {
            Ok(placed) => placed,
            Err(e) => {
                let _ = dom.undefine_flags(Nvram::Keep.flags());
                return Err(Self::call_err("get inactive XML", name)(e));
            }
        };
        let machine = crate::domain::definition_machine(&placed);
        let free = match wanted_free {
            0 => 0,
            _ => crate::domain::free_root_ports(&placed).map_err(xml_err)?,
        };
        if free < wanted_free {
            tracing::debug!(
                free,
                wanted_free,
                "libvirt filled more root ports than counted; defining again"
            );
            let spared = crate::domain::with_spare_root_ports(&placed, wanted_free - free)
                .map_err(xml_err)?;
            dom = self
                .conn
                .define_domain_xml(&spared)
                .map_err(Self::call_err("define", name))?;
        }
        if let Err(e) = associate_fds(&dom, fds) {
            let _ = dom.undefine_flags(Nvram::Keep.flags());
            return Err(Self::call_err("associate a disk's descriptor", name)(e));
        }
        // `virDomainCreateWithFlags`, not `virDomainCreate`: the remote driver answers the
        // latter with a second round trip (a lookup by UUID, for the new domain id), which the
        // former's reply carries already.
        if let Err(e) = dom.create_with_flags(0) {
            let _ = dom.undefine_flags(Nvram::Keep.flags());
            return Err(Self::call_err("start", name)(e));
        }
        if forwards {
            if let Err(e) = publish_ports(&dom, name, None) {
                let _ = dom.destroy();
                let _ = dom.undefine_flags(Nvram::Keep.flags());
                return Err(e);
            }
        }
        // The handle of the domain just made: the next calls on it need no lookup.
        *self.last_domain.lock().expect("domain handle lock") = Some((name.into(), dom));
        Ok(machine)
    }

    /// Checks an XML the way a define would, then removes the definition again.
    pub fn define_and_undefine(&self, name: &str, xml: &str) -> Result<(), LibvirtError> {
        self.forget_domain();
        let dom = self
            .conn
            .define_domain_xml(xml)
            .map_err(Self::call_err("define", name))?;
        dom.undefine_flags(Nvram::Keep.flags())
            .map_err(Self::call_err("undefine", name))
    }

    /// State and reason, with libvirt errors reported (the `virt` crate's `state()` hides them).
    pub(crate) fn power_state(&self, name: &str) -> Result<PowerState, LibvirtError> {
        self.on_domain(name, "get state", |dom| {
            let (mut state, mut reason) = (-1, -1);
            // SAFETY: `dom` is a valid domain for the duration of the call; both out-pointers
            // are valid.
            let rc = unsafe { sys::virDomainGetState(dom.as_ptr(), &mut state, &mut reason, 0) };
            if rc < 0 {
                return Err(virt::error::Error::last_error());
            }
            Ok(power_state_from_raw(state, reason))
        })
    }

    /// The host's capabilities XML (`virConnectGetCapabilities`): among others, which versioned
    /// machine each alias such as `q35` stands for.
    pub fn capabilities_xml(&self) -> Result<String, LibvirtError> {
        self.conn
            .capabilities()
            .map_err(Self::call_err("getCapabilities", &self.uri))
    }

    pub(crate) fn live_xml(&self, name: &str) -> Result<String, LibvirtError> {
        self.on_domain(name, "get XML", |d| d.xml_desc(0))
    }

    /// Attaches a disk; `fds` as for [`Self::define_and_start`].
    pub(crate) fn attach(
        &self,
        name: &str,
        disk_xml: &str,
        persist: bool,
        fds: &[(String, std::fs::File)],
    ) -> Result<(), LibvirtError> {
        let mut flags = sys::VIR_DOMAIN_AFFECT_LIVE;
        if persist {
            flags |= sys::VIR_DOMAIN_AFFECT_CONFIG;
        }
        let mut attempt = 1;
        self.on_domain(name, "attach", |dom| loop {
            associate_fds(dom, fds)?;
            match dom.attach_device_flags(disk_xml, flags) {
                Ok(_) => return Ok(()),
                // A libvirtd killed during an attach leaves QEMU holding a block node whose
                // index its successor, reading the last saved status, hands out again. The
                // failed attempt moved libvirt's counter on, so the next one gets a free name.
                Err(e)
                    if attempt < ATTACH_NODE_NAME_RETRIES
                        && e.message().contains("Duplicate nodes with node-name") =>
                {
                    tracing::warn!(domain = name, error = %e, "attach met a block node a killed libvirtd left in QEMU; trying again");
                    attempt += 1;
                }
                // Killed after QEMU's device_add, that libvirtd left the device itself in QEMU,
                // which its successor does not know: its id is this disk's own alias. It is
                // removed (a SCSI disk leaves at once) and the attach made again.
                Err(e)
                    if attempt < ATTACH_NODE_NAME_RETRIES
                        && orphan_device(&e, disk_xml).is_some() =>
                {
                    let id = orphan_device(&e, disk_xml).unwrap_or_default();
                    tracing::warn!(domain = name, %id, "attach met the device a killed libvirtd left in QEMU; removing it and trying again");
                    remove_orphan(dom, &id, disk_xml)?;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        })
    }

    /// Asks for a detach; the device is gone only when libvirt sends DEVICE_REMOVED.
    /// The live detach; a disk that an attach also wrote to the persistent definition (a user
    /// alias there) leaves that definition too, so a later start does not bring it back.
    pub(crate) fn detach(
        &self,
        name: &str,
        disk_xml: &str,
        alias: &str,
    ) -> Result<(), LibvirtError> {
        let inactive = self.on_domain(name, "get inactive XML", |dom| {
            dom.xml_desc(sys::VIR_DOMAIN_XML_INACTIVE)
        })?;
        let persisted = !alias.is_empty() && inactive.contains(&format!("<alias name='{alias}'/>"));
        let mut flags = sys::VIR_DOMAIN_AFFECT_LIVE;
        if persisted {
            flags |= sys::VIR_DOMAIN_AFFECT_CONFIG;
        }
        self.on_domain(name, "detach", |dom| {
            dom.detach_device_flags(disk_xml, flags)
        })
    }

    /// Plugs a network interface into the running guest and its persistent definition, then
    /// publishes its ports (a user-mode one's), as a start does.
    pub(crate) fn attach_interface(
        &self,
        name: &str,
        interface_xml: &str,
        alias: &str,
    ) -> Result<(), LibvirtError> {
        let flags = sys::VIR_DOMAIN_AFFECT_LIVE | sys::VIR_DOMAIN_AFFECT_CONFIG;
        self.on_domain(name, "attach interface", |d| {
            d.attach_device_flags(interface_xml, flags)
        })?;
        let dom = self.domain(name)?;
        publish_ports(&dom, name, Some(alias))
    }

    /// Sets how many vCPUs are enabled, in the running guest and in the persistent definition.
    /// libvirt plugs or unplugs them one by one; an unplug waits for the guest to let go.
    pub(crate) fn set_vcpus(&self, name: &str, count: u32) -> Result<(), LibvirtError> {
        let flags = sys::VIR_DOMAIN_AFFECT_LIVE | sys::VIR_DOMAIN_AFFECT_CONFIG;
        self.on_domain(name, "set vCPUs", |d| d.set_vcpus_flags(count, flags))
    }

    /// Sets how many vCPUs the persistent definition enables, leaving the running guest as it
    /// is: a decrease waits for the next boot (a live unplug does not complete under QEMU 7.2),
    /// and a Sync that asks again what the guest has takes a waiting decrease back.
    pub(crate) fn set_vcpus_at_next_boot(
        &self,
        name: &str,
        count: u32,
    ) -> Result<(), LibvirtError> {
        self.on_domain(name, "set vCPUs of the persistent definition", |d| {
            d.set_vcpus_flags(count, sys::VIR_DOMAIN_AFFECT_CONFIG)
        })
    }

    /// How many vCPUs the running guest has enabled now (one small call, where the live XML
    /// formats the whole domain).
    pub(crate) fn vcpus_now(&self, name: &str) -> Result<u32, LibvirtError> {
        self.on_domain(name, "get vCPUs", |d| {
            d.vcpus_flags(sys::VIR_DOMAIN_AFFECT_LIVE)
        })
    }

    /// How many vCPUs the persistent definition enables (what the next boot gets).
    pub(crate) fn vcpus_at_next_boot(&self, name: &str) -> Result<u32, LibvirtError> {
        self.on_domain(name, "get vCPUs of the persistent definition", |d| {
            d.vcpus_flags(sys::VIR_DOMAIN_AFFECT_CONFIG)
        })
    }

    /// Changes a device of the running guest and of the persistent definition (virtio-mem's
    /// requested size: the only change libvirt takes for it).
    pub(crate) fn update_device(&self, name: &str, device_xml: &str) -> Result<(), LibvirtError> {
        let flags = sys::VIR_DOMAIN_AFFECT_LIVE | sys::VIR_DOMAIN_AFFECT_CONFIG;
        self.on_domain(name, "update device", |d| {
            d.update_device_flags(device_xml, flags)
        })
    }

    /// Presses the ACPI power button.
    pub(crate) fn shutdown_acpi(&self, name: &str) -> Result<(), LibvirtError> {
        self.on_domain(name, "shutdown", |d| {
            d.shutdown_flags(sys::VIR_DOMAIN_SHUTDOWN_ACPI_POWER_BTN)
        })
    }

    pub(crate) fn destroy(&self, name: &str) -> Result<(), LibvirtError> {
        self.on_domain(name, "destroy", Domain::destroy)
    }

    pub(crate) fn suspend(&self, name: &str) -> Result<(), LibvirtError> {
        self.on_domain(name, "suspend", Domain::suspend)
    }

    pub(crate) fn resume(&self, name: &str) -> Result<(), LibvirtError> {
        self.on_domain(name, "resume", Domain::resume)
    }

    /// Asks the guest to reboot through ACPI (libvirt powers it back on when it powers off).
    pub(crate) fn reboot_acpi(&self, name: &str) -> Result<(), LibvirtError> {
        self.on_domain(name, "reboot", |d| {
            d.reboot(sys::VIR_DOMAIN_REBOOT_ACPI_POWER_BTN)
        })
    }

    /// The reset button: immediate, no guest cooperation.
    pub(crate) fn reset(&self, name: &str) -> Result<(), LibvirtError> {
        self.on_domain(name, "reset", Domain::reset)
    }

    /// Removes the persistent definition (the domain must be stopped).
    /// The version of the QEMU that runs `name` (QMP `query-version`), `major.minor.micro`;
    /// `None` when the reply does not say. Asked of the running QEMU because libvirt's
    /// hypervisor version probes QEMU's capabilities the first time it is asked (4.7 s here).
    pub(crate) fn qemu_version(&self, name: &str) -> Result<Option<String>, LibvirtError> {
        let reply = self.on_domain(name, "query-version", |dom| {
            dom.qemu_monitor_command(r#"{"execute":"query-version"}"#, 0)
        })?;
        let reply: serde_json::Value = serde_json::from_str(&reply).unwrap_or_default();
        let qemu = &reply["return"]["qemu"];
        Ok(
            match (
                qemu["major"].as_u64(),
                qemu["minor"].as_u64(),
                qemu["micro"].as_u64(),
            ) {
                (Some(major), Some(minor), Some(micro)) => Some(format!("{major}.{minor}.{micro}")),
                _ => None,
            },
        )
    }

    /// The hypervisor's version, `major.minor.release`.
    pub(crate) fn version(&self) -> Result<String, LibvirtError> {
        version_of(&self.conn)
    }

    /// libvirt's bulk stats of the domain (see [`stats::STATS`] for the groups).
    pub(crate) fn domain_stats(&self, name: &str) -> Result<DomainStats, LibvirtError> {
        self.on_domain(name, "get stats", stats::domain_stats)
    }

    /// One command to the QEMU guest agent (`{"execute":"guest-info"}`), its JSON answer as the
    /// agent gave it, waiting at most `timeout_secs`. An answer over [`MAX_AGENT_ANSWER`] bytes
    /// is refused (an error), so that callers never parse what a guest inflated.
    pub(crate) fn agent_command(
        &self,
        name: &str,
        command: &str,
        timeout_secs: i32,
    ) -> Result<String, LibvirtError> {
        let answer = self.on_domain(name, "guest agent command", |d| {
            d.qemu_agent_command(command, timeout_secs, 0)
        })?;
        if answer.len() > MAX_AGENT_ANSWER {
            return Err(LibvirtError::AgentAnswerTooLarge {
                domain: name.into(),
                len: answer.len(),
            });
        }
        Ok(answer)
    }

    /// Removes the definition. libvirt refuses a plain undefine of a domain whose EFI variables
    /// file exists: the caller says whether the variables go with it.
    pub(crate) fn undefine(&self, name: &str, nvram: Nvram) -> Result<(), LibvirtError> {
        let undefined = self.on_domain(name, "undefine", |d| d.undefine_flags(nvram.flags()));
        self.forget_domain();
        undefined
    }
}

/// What an undefine does with an EFI VM's variables file (`<nvram>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Nvram {
    /// Kept: a restart boots with the variables the guest set (boot entries, Secure Boot's
    /// keys), as KubeVirt's `DeleteVMI` keeps them.
    Keep,
    /// Removed with the definition: the VM's end, when the launcher leaves nothing behind.
    Remove,
}

impl Nvram {
    fn flags(self) -> sys::virDomainUndefineFlagsValues {
        match self {
            Nvram::Keep => sys::VIR_DOMAIN_UNDEFINE_KEEP_NVRAM,
            Nvram::Remove => sys::VIR_DOMAIN_UNDEFINE_NVRAM,
        }
    }
}

/// The hypervisor's version at `uri` (QEMU's: `7.2.0`), on a connection of its own that follows
/// no events: for a question asked before the launcher has its connection.
pub(crate) fn hypervisor_version(uri: &str) -> Result<String, LibvirtError> {
    let conn = connect(uri).map_err(|source| LibvirtError::Connect {
        uri: uri.into(),
        source,
    })?;
    // Dropping the connection closes it.
    version_of(&conn)
}

/// libvirt encodes a version as one number, `major * 1,000,000 + minor * 1,000 + release`.
fn version_of(conn: &Connect) -> Result<String, LibvirtError> {
    let v = conn.hyp_version().map_err(|source| LibvirtError::Call {
        call: "version",
        domain: String::new(),
        source,
    })?;
    Ok(format!(
        "{}.{}.{}",
        v / 1_000_000,
        v / 1_000 % 1_000,
        v % 1_000
    ))
}

/// Where the launcher's hypervisor is.
#[derive(Debug, Clone)]
pub(crate) enum Backend {
    /// Any libvirt, by URI (`--connect`).
    Uri(String),
    /// A private libvirtd with everything under `dir`, started (and restarted) by the launcher.
    Private {
        dir: PathBuf,
        options: daemon::DaemonOptions,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("the launcher is shutting down; its daemons stay stopped")]
    Stopped,
    #[error(transparent)]
    Daemon(#[from] daemon::DaemonError),
    #[error(transparent)]
    Libvirt(#[from] LibvirtError),
}

/// Opens connections to the backend, the first time and after every loss: a private daemon that
/// died is started again (QEMU keeps running meanwhile and the new daemon finds it).
#[derive(Debug)]
pub(crate) struct Connector {
    backend: Backend,
    daemon: Mutex<Option<daemon::PrivateDaemon>>,
    events: UnboundedSender<HypervisorEvent>,
    /// Set by `stop_daemon`: a reconnect still under way must not start the daemons again.
    stopped: std::sync::atomic::AtomicBool,
}

impl Connector {
    pub(crate) fn new(backend: Backend, events: UnboundedSender<HypervisorEvent>) -> Self {
        Connector {
            backend,
            daemon: Mutex::new(None),
            events,
            stopped: std::sync::atomic::AtomicBool::new(false),
        }
    }

    pub(crate) fn uri(&self) -> String {
        match &self.backend {
            Backend::Uri(uri) => uri.clone(),
            Backend::Private { dir, .. } => daemon::PrivateDaemon::uri_for(dir),
        }
    }

    /// Blocking. Makes sure the private daemons run (adopting, starting or restarting them),
    /// then connects; every domain event of the new connection goes to the connector's channel.
    pub(crate) fn connect(&self) -> Result<Hypervisor, ConnectError> {
        self.ensure_daemons()?;
        // The connection that saw a daemon just started answer, if the capability load did not
        // take it (`PrivateDaemon::publish_capabilities`): no second handshake then.
        let answered = (self.daemon.lock().expect("daemon lock").as_mut())
            .and_then(daemon::PrivateDaemon::take_connection);
        Ok(Hypervisor::open_on(
            &self.uri(),
            answered,
            self.events.clone(),
        )?)
    }

    /// Blocking. Starts whichever private daemon is not running; nothing for a `--connect` URI.
    pub(crate) fn ensure_daemons(&self) -> Result<(), ConnectError> {
        let Backend::Private { dir, options } = &self.backend else {
            return Ok(());
        };
        let mut slot = self.daemon.lock().expect("daemon lock");
        if self.stopped.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(ConnectError::Stopped);
        }
        match slot.as_mut() {
            Some(daemon) => daemon.ensure_running()?,
            None => {
                let events = self.events.clone();
                let notify: daemon::ExitNotifier = Arc::new(move |daemon| {
                    let _ = events.send(HypervisorEvent::DaemonExited { daemon });
                });
                *slot = Some(daemon::PrivateDaemon::adopt_or_start(
                    dir,
                    options.clone(),
                    Some(notify),
                )?);
            }
        }
        Ok(())
    }

    /// Whether QEMU runs in the private libvirtd's own mount namespace (libvirt gives it none
    /// of its own: in a container, `DaemonOptions::domain_namespace` off).
    pub(crate) fn qemu_in_daemon_namespace(&self) -> bool {
        matches!(&self.backend, Backend::Private { options, .. } if !options.domain_namespace)
    }

    /// Where the private daemon keeps swtpm's state (its `/var/lib/libvirt/swtpm`); `None`
    /// for a `--connect`ed libvirt, whose state is that daemon's own.
    pub(crate) fn swtpm_dir(&self) -> Option<std::path::PathBuf> {
        match &self.backend {
            Backend::Private { dir, .. } => Some(daemon::PrivateDaemon::swtpm_dir(dir)),
            Backend::Uri(_) => None,
        }
    }

    /// The private daemon's pid, if the launcher runs one.
    pub(crate) fn daemon_pid(&self) -> Option<i32> {
        self.daemon.lock().expect("daemon lock").as_ref()?.pid()
    }

    /// Blocking. The clients of the private libvirtd's TLS listener (a migration target's).
    pub(crate) fn tls_clients(&self) -> Result<admin::TlsClients, admin::AdminError> {
        let dir = match &self.backend {
            Backend::Private { dir, .. } => dir,
            Backend::Uri(_) => return Ok(admin::TlsClients::default()),
        };
        admin::tls_clients(&admin::admin_uri(&dir.join("sock")))
    }

    /// Blocking. Starts the private libvirtd again without its TLS listener (see
    /// [`daemon::PrivateDaemon::close_tls_listener`]); false if it had none. The caller's
    /// connection is closed by it: the caller opens another.
    pub(crate) fn close_tls_listener(&self) -> Result<bool, ConnectError> {
        let mut slot = self.daemon.lock().expect("daemon lock");
        if self.stopped.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(ConnectError::Stopped);
        }
        match slot.as_mut() {
            Some(daemon) => Ok(daemon.close_tls_listener()?),
            None => Ok(false),
        }
    }

    /// Stops the private daemon, if any (at exit).
    pub(crate) fn stop_daemon(&self) {
        self.stopped
            .store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(mut d) = self.daemon.lock().expect("daemon lock").take() {
            d.stop();
        }
    }
}

/// Whether the libvirt this launcher is built with passes disk images as descriptors
/// (`fdgroup`, `virDomainFDAssociate`: libvirt 9.0.0).
pub(crate) fn supports_fd_groups() -> bool {
    // This may be the process's first libvirt call (`run` asks before any connection), and
    // every call runs libvirt's global set-up first.
    skip_unused_ssh_crypto_setup();
    let mut version: std::os::raw::c_ulong = 0;
    // SAFETY: a null type asks for the library's own version; the out-pointer is valid.
    let rc = unsafe { sys::virGetVersion(&mut version, std::ptr::null(), std::ptr::null_mut()) };
    rc == 0 && version >= 9_000_000
}

/// Gives libvirt each `(fdgroup, file)` for `dom`'s next start or attach. libvirt keeps its own
/// copy of the descriptor (it crosses the socket), so the caller's may be closed after.
fn associate_fds(dom: &Domain, fds: &[(String, std::fs::File)]) -> Result<(), virt::error::Error> {
    use std::os::fd::AsRawFd;
    for (group, file) in fds {
        let group = std::ffi::CString::new(group.as_str()).expect("fd group names have no NUL");
        let mut fd = file.as_raw_fd();
        // SAFETY: `dom` is valid for the call; one valid descriptor at `fd`; no flags: libvirt
        // neither relabels nor restores the file, which the launcher opened for QEMU.
        let rc = unsafe { sys::virDomainFDAssociate(dom.as_ptr(), group.as_ptr(), 1, &mut fd, 0) };
        if rc < 0 {
            return Err(virt::error::Error::last_error());
        }
    }
    Ok(())
}
