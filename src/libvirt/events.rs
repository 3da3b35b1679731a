//! libvirt domain events and the connection-close callback, through `virt::sys` (the `virt` crate
//! has no wrapper for event registration). The launcher's other foreign calls are one-liners,
//! among them the state query and `libssh2_init` (through `dlsym`) in `super`, glibc's
//! `mallopt` in `main` and `mallinfo2`/`malloc_trim` in the reconciler, `gnu_get_libc_version` in
//! `daemon`, `pidfd_open` in `process`, and libbpf's program query in `host::cgroup`.
//!
//! libvirt calls the callbacks on the event-loop thread ([`ensure_event_loop`]). Each callback only
//! turns its arguments into a [`HypervisorEvent`] and sends it on an *unbounded* channel: an event is
//! never dropped (KubeVirt's bounded queue of 10 drops them), and the async side decides what to do.

use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::{Arc, OnceLock};

use tokio::sync::mpsc::UnboundedSender;
use virt::connect::Connect;
use virt::sys;

use super::delivered::{self, Change};

/// What libvirt told us, with the domain by name (the launcher filters for its own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HypervisorEvent {
    /// `VIR_DOMAIN_EVENT_*` with its detail code.
    Lifecycle {
        domain: String,
        event: i32,
        detail: i32,
    },
    /// The truth about a detach: QEMU and the guest are done with the device.
    DeviceRemoved { domain: String, alias: String },
    /// A device was added to the running domain (by the launcher, or by anyone else).
    DeviceAdded { domain: String, alias: String },
    /// The guest reset itself (or was reset).
    Reboot { domain: String },
    /// The guest agent's channel opened (`connected`) or closed in the guest, or the domain
    /// started (then it is closed until the guest's agent opens it).
    AgentLifecycle { domain: String, connected: bool },
    /// A virtio-mem device's plugged size changed: the guest took (or gave back) memory.
    MemoryDeviceSizeChange {
        domain: String,
        alias: String,
        size_kib: u64,
    },
    /// A disk I/O error; `action` is libvirt's (`none`, `pause`, `report`).
    IoError {
        domain: String,
        alias: String,
        path: String,
        action: &'static str,
        reason: String,
    },
    /// libvirt lost control of the domain (e.g. its monitor broke).
    ControlError { domain: String },
    /// The private daemon the launcher started (libvirtd) exited.
    DaemonExited { daemon: &'static str },
    /// The connection to libvirt broke (`VIR_CONNECT_CLOSE_REASON_*`).
    ConnectionClosed { reason: i32 },
}

pub(crate) use super::states::{lifecycle_event, lifecycle_names};

#[derive(Debug, thiserror::Error)]
pub enum EventError {
    #[error("cannot register libvirt's default event loop")]
    EventLoop(#[source] Arc<EventLoopError>),
    #[error("cannot register for libvirt event {event_id}")]
    Register {
        event_id: i32,
        #[source]
        source: virt::error::Error,
    },
}

/// Why libvirt's event loop did not start: kept once, for every later call to return.
#[derive(Debug, thiserror::Error)]
pub enum EventLoopError {
    #[error(transparent)]
    Register(virt::error::Error),
    #[error("cannot start its thread")]
    Thread(#[source] std::io::Error),
}

/// Registers libvirt's default event loop implementation and runs it on a thread of its own.
/// Must run before the first connection is opened (libvirt's rule); later calls do nothing.
pub fn ensure_event_loop() -> Result<(), EventError> {
    static LOOP: OnceLock<Result<(), Arc<EventLoopError>>> = OnceLock::new();
    LOOP.get_or_init(|| {
        super::skip_unused_ssh_crypto_setup();
        // libvirt prints every error to stderr by default; vmlauncher reports them itself.
        virt::error::clear_error_callback();
        virt::event::event_register_default_impl()
            .map_err(|e| Arc::new(EventLoopError::Register(e)))?;
        std::thread::Builder::new()
            .name("libvirt-events".into())
            .spawn(|| loop {
                if let Err(e) = virt::event::event_run_default_impl() {
                    tracing::error!(error = %e, "libvirt event loop iteration failed");
                }
            })
            .map_err(|e| Arc::new(EventLoopError::Thread(e)))?;
        Ok(())
    })
    .clone()
    .map_err(EventError::EventLoop)
}

/// Callback registrations on one connection; dropping it deregisters them.
#[derive(Debug)]
pub struct EventRegistration {
    conn: Connect,
    callback_ids: Vec<c_int>,
    close_callback: bool,
}

type Sender = UnboundedSender<HypervisorEvent>;
type GenericCallback = unsafe extern "C" fn(sys::virConnectPtr, sys::virDomainPtr, *mut c_void);
type IoErrorCallback = unsafe extern "C" fn(
    sys::virConnectPtr,
    sys::virDomainPtr,
    *const c_char,
    *const c_char,
    c_int,
    *const c_char,
    *mut c_void,
);

/// `virConnectDomainEventDeviceAddedCallback` and `...DeviceRemovedCallback`: device alias.
type DeviceCallback =
    unsafe extern "C" fn(sys::virConnectPtr, sys::virDomainPtr, *const c_char, *mut c_void);
/// `virConnectDomainEventBlockJobCallback`: disk, job type, status.
type BlockJobCallback = unsafe extern "C" fn(
    sys::virConnectPtr,
    sys::virDomainPtr,
    *const c_char,
    c_int,
    c_int,
    *mut c_void,
);
/// `virConnectDomainEventTrayChangeCallback`: device alias, reason.
type TrayChangeCallback =
    unsafe extern "C" fn(sys::virConnectPtr, sys::virDomainPtr, *const c_char, c_int, *mut c_void);
/// `virConnectDomainEventAgentLifecycleCallback`: state, reason.
type AgentLifecycleCallback =
    unsafe extern "C" fn(sys::virConnectPtr, sys::virDomainPtr, c_int, c_int, *mut c_void);
/// `virConnectDomainEventMemoryDeviceSizeChangeCallback`: device alias, new size in KiB.
type MemorySizeCallback = unsafe extern "C" fn(
    sys::virConnectPtr,
    sys::virDomainPtr,
    *const c_char,
    std::os::raw::c_ulonglong,
    *mut c_void,
);
/// `virConnectDomainEventDiskChangeCallback`: old and new source, device alias, reason.
type DiskChangeCallback = unsafe extern "C" fn(
    sys::virConnectPtr,
    sys::virDomainPtr,
    *const c_char,
    *const c_char,
    *const c_char,
    c_int,
    *mut c_void,
);

impl EventRegistration {
    /// Subscribes to lifecycle, reboot, control-error, I/O-error, device-added, device-removed,
    /// guest-agent lifecycle and memory-device-size events of every domain on `conn`, to the connection-close callback, and, only to count
    /// them (see `delivered`), to the events that tell of a disk changed by
    /// someone else: a block job's end (a pivot changes a source), a tray moved, a medium
    /// changed.
    pub fn register(conn: &Connect, tx: Sender) -> Result<Self, EventError> {
        let mut reg = EventRegistration {
            conn: conn.clone(),
            callback_ids: Vec::new(),
            close_callback: false,
        };
        // The two device events share one C signature.
        let device = |id: u32, callback: DeviceCallback| {
            // SAFETY: both device callbacks have the C signature libvirt documents for these ids.
            let generic =
                unsafe { std::mem::transmute::<DeviceCallback, GenericCallback>(callback) };
            (id as i32, Some(generic))
        };
        // SAFETY: each callback below has the exact C signature libvirt documents for its event id
        // (libvirt's own VIR_DOMAIN_EVENT_CALLBACK macro performs the same cast to the generic type).
        let callbacks: [(i32, sys::virConnectDomainEventGenericCallback); 11] = unsafe {
            [
                (
                    sys::VIR_DOMAIN_EVENT_ID_REBOOT as i32,
                    Some(on_reboot as GenericCallback),
                ),
                (
                    sys::VIR_DOMAIN_EVENT_ID_CONTROL_ERROR as i32,
                    Some(on_control_error as GenericCallback),
                ),
                (
                    sys::VIR_DOMAIN_EVENT_ID_IO_ERROR_REASON as i32,
                    Some(std::mem::transmute::<IoErrorCallback, GenericCallback>(
                        on_io_error,
                    )),
                ),
                (
                    sys::VIR_DOMAIN_EVENT_ID_LIFECYCLE as i32,
                    Some(std::mem::transmute::<
                        unsafe extern "C" fn(
                            sys::virConnectPtr,
                            sys::virDomainPtr,
                            c_int,
                            c_int,
                            *mut c_void,
                        ) -> c_int,
                        unsafe extern "C" fn(sys::virConnectPtr, sys::virDomainPtr, *mut c_void),
                    >(on_lifecycle)),
                ),
                device(sys::VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED, on_device::<true>),
                device(sys::VIR_DOMAIN_EVENT_ID_DEVICE_ADDED, on_device::<false>),
                (
                    sys::VIR_DOMAIN_EVENT_ID_BLOCK_JOB_2 as i32,
                    Some(std::mem::transmute::<BlockJobCallback, GenericCallback>(
                        on_block_job,
                    )),
                ),
                (
                    sys::VIR_DOMAIN_EVENT_ID_TRAY_CHANGE as i32,
                    Some(std::mem::transmute::<TrayChangeCallback, GenericCallback>(
                        on_tray_change,
                    )),
                ),
                (
                    sys::VIR_DOMAIN_EVENT_ID_DISK_CHANGE as i32,
                    Some(std::mem::transmute::<DiskChangeCallback, GenericCallback>(
                        on_disk_change,
                    )),
                ),
                (
                    sys::VIR_DOMAIN_EVENT_ID_AGENT_LIFECYCLE as i32,
                    Some(
                        std::mem::transmute::<AgentLifecycleCallback, GenericCallback>(
                            on_agent_lifecycle,
                        ),
                    ),
                ),
                (
                    sys::VIR_DOMAIN_EVENT_ID_MEMORY_DEVICE_SIZE_CHANGE as i32,
                    Some(std::mem::transmute::<MemorySizeCallback, GenericCallback>(
                        on_memory_size_change,
                    )),
                ),
            ]
        };
        reg.register_callbacks(conn, tx, callbacks)?;
        Ok(reg)
    }

    /// Hands libvirt each of `callbacks`, with a sender of its own, then the close callback:
    /// each kept to be deregistered on drop.
    fn register_callbacks(
        &mut self,
        conn: &Connect,
        tx: Sender,
        callbacks: [(i32, sys::virConnectDomainEventGenericCallback); 11],
    ) -> Result<(), EventError> {
        for (event_id, callback) in callbacks {
            let register = |opaque| {
                // SAFETY: the connection pointer is valid while `conn` lives.
                unsafe {
                    sys::virConnectDomainEventRegisterAny(
                        conn.as_ptr(),
                        std::ptr::null_mut(),
                        event_id,
                        callback,
                        opaque,
                        Some(free_sender),
                    )
                }
            };
            // SAFETY: libvirt keeps `opaque`, with `free_sender`, exactly when the id is not
            // negative.
            let id = unsafe { hand_over(tx.clone(), event_id, register) }?;
            self.callback_ids.push(id);
        }
        let register = |opaque| {
            // SAFETY: as above.
            unsafe {
                sys::virConnectRegisterCloseCallback(
                    conn.as_ptr(),
                    Some(on_close),
                    opaque,
                    Some(free_sender),
                )
            }
        };
        // SAFETY: as above, when rc is 0. -1: the close callback has no event id of its own.
        unsafe { hand_over(tx, -1, register) }?;
        self.close_callback = true;
        Ok(())
    }
}

impl Drop for EventRegistration {
    fn drop(&mut self) {
        for id in self.callback_ids.drain(..) {
            // SAFETY: `id` came from a successful registration on this still-open connection.
            unsafe { sys::virConnectDomainEventDeregisterAny(self.conn.as_ptr(), id) };
        }
        if self.close_callback {
            // SAFETY: the callback was registered on this connection with this function.
            unsafe { sys::virConnectUnregisterCloseCallback(self.conn.as_ptr(), Some(on_close)) };
        }
    }
}

/// Registers a callback whose opaque pointer is a leaked `Box` of `tx`, which libvirt hands back
/// to [`free_sender`] exactly once, when the callback is removed: `register` is the libvirt call,
/// given that pointer. On failure the `Box` is still ours, and dropped here.
///
/// # Safety
/// `register` returns a negative number only if libvirt did not keep the pointer, and otherwise
/// has registered it with [`free_sender`] as its free function (else the `Box` is freed twice,
/// or never).
unsafe fn hand_over(
    tx: Sender,
    event_id: i32,
    register: impl FnOnce(*mut c_void) -> c_int,
) -> Result<c_int, EventError> {
    let opaque = Box::into_raw(Box::new(tx)) as *mut c_void;
    let id = register(opaque);
    if id < 0 {
        let source = virt::error::Error::last_error();
        // SAFETY: libvirt did not take ownership of `opaque` when registration failed.
        drop(unsafe { Box::from_raw(opaque as *mut Sender) });
        return Err(EventError::Register { event_id, source });
    }
    Ok(id)
}

unsafe extern "C" fn free_sender(opaque: *mut c_void) {
    // SAFETY: every opaque pointer vmlauncher registers is a `Box<Sender>` made by `hand_over`.
    drop(unsafe { Box::from_raw(opaque as *mut Sender) });
}

/// # Safety
/// `opaque` must be a live `Sender` from `register`.
unsafe fn send(opaque: *mut c_void, event: HypervisorEvent) {
    // SAFETY: guaranteed by the caller; libvirt keeps it alive until `free_sender`.
    let tx = unsafe { &*(opaque as *const Sender) };
    delivered::deliver(change_of(&event));
    // A closed receiver means the launcher is shutting down: nothing is left to tell.
    let _ = tx.send(event);
}

/// What `event` may have changed, for the log of delivered events.
fn change_of(event: &HypervisorEvent) -> Change {
    match event {
        // A device event is known by its domain and alias; without them it tells nothing.
        HypervisorEvent::DeviceRemoved { domain, alias }
        | HypervisorEvent::DeviceAdded { domain, alias }
            if domain.is_empty() || alias.is_empty() =>
        {
            Change::Other
        }
        HypervisorEvent::DeviceRemoved { domain, alias } => Change::DeviceRemoved {
            domain: domain.clone(),
            alias: alias.clone(),
        },
        HypervisorEvent::DeviceAdded { domain, alias } => Change::DeviceAdded {
            domain: domain.clone(),
            alias: alias.clone(),
        },
        HypervisorEvent::AgentLifecycle { .. } | HypervisorEvent::MemoryDeviceSizeChange { .. } => {
            Change::Guest
        }
        _ => Change::Other,
    }
}

/// Sends the event that `event` makes of the domain's name, for the events that carry nothing else.
///
/// # Safety
/// As [`send`] and [`domain_name`].
unsafe fn send_for(
    opaque: *mut c_void,
    dom: sys::virDomainPtr,
    event: impl FnOnce(String) -> HypervisorEvent,
) {
    // SAFETY: guaranteed by the caller.
    unsafe { send(opaque, event(domain_name(dom))) }
}

/// # Safety
/// `dom` must be a valid domain pointer for the duration of the call.
unsafe fn domain_name(dom: sys::virDomainPtr) -> String {
    // SAFETY: libvirt returns a pointer owned by `dom`, valid during the callback, or null.
    let name = unsafe { sys::virDomainGetName(dom) };
    if name.is_null() {
        return String::new();
    }
    // SAFETY: non-null, NUL-terminated, owned by `dom`.
    unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned()
}

/// # Safety
/// `s` must be null or a NUL-terminated string valid for the duration of the call.
unsafe fn c_string(s: *const c_char) -> String {
    if s.is_null() {
        return String::new();
    }
    // SAFETY: guaranteed by the caller.
    unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
}

unsafe extern "C" fn on_lifecycle(
    _conn: sys::virConnectPtr,
    dom: sys::virDomainPtr,
    event: c_int,
    detail: c_int,
    opaque: *mut c_void,
) -> c_int {
    // SAFETY: libvirt passes a valid domain and the opaque pointer given at registration.
    unsafe {
        let domain = domain_name(dom);
        send(
            opaque,
            HypervisorEvent::Lifecycle {
                domain,
                event,
                detail,
            },
        );
    }
    0
}

/// The device-added (`REMOVED` false) and device-removed (`REMOVED` true) callbacks: one body,
/// two events.
unsafe extern "C" fn on_device<const REMOVED: bool>(
    _conn: sys::virConnectPtr,
    dom: sys::virDomainPtr,
    alias: *const c_char,
    opaque: *mut c_void,
) {
    // SAFETY: libvirt passes a valid domain, alias string and our opaque pointer.
    unsafe {
        let alias = c_string(alias);
        send_for(opaque, dom, |domain| match REMOVED {
            true => HypervisorEvent::DeviceRemoved { domain, alias },
            false => HypervisorEvent::DeviceAdded { domain, alias },
        });
    }
}

/// A disk may have changed under the launcher (a block job ended, a tray moved, a medium was
/// changed): nothing to handle, only counted, so that the live disks the launcher keeps are read
/// again before the next plan.
fn count_delivered() {
    delivered::deliver(Change::Other);
}

unsafe extern "C" fn on_block_job(
    _conn: sys::virConnectPtr,
    _dom: sys::virDomainPtr,
    _disk: *const c_char,
    _job_type: c_int,
    _status: c_int,
    _opaque: *mut c_void,
) {
    count_delivered();
}

unsafe extern "C" fn on_tray_change(
    _conn: sys::virConnectPtr,
    _dom: sys::virDomainPtr,
    _alias: *const c_char,
    _reason: c_int,
    _opaque: *mut c_void,
) {
    count_delivered();
}

unsafe extern "C" fn on_disk_change(
    _conn: sys::virConnectPtr,
    _dom: sys::virDomainPtr,
    _old_source: *const c_char,
    _new_source: *const c_char,
    _alias: *const c_char,
    _reason: c_int,
    _opaque: *mut c_void,
) {
    count_delivered();
}

unsafe extern "C" fn on_reboot(
    _conn: sys::virConnectPtr,
    dom: sys::virDomainPtr,
    opaque: *mut c_void,
) {
    // SAFETY: libvirt passes a valid domain and our opaque pointer.
    unsafe { send_for(opaque, dom, |domain| HypervisorEvent::Reboot { domain }) };
}

unsafe extern "C" fn on_control_error(
    _conn: sys::virConnectPtr,
    dom: sys::virDomainPtr,
    opaque: *mut c_void,
) {
    // SAFETY: libvirt passes a valid domain and our opaque pointer.
    unsafe {
        send_for(opaque, dom, |domain| HypervisorEvent::ControlError {
            domain,
        })
    };
}

unsafe extern "C" fn on_io_error(
    _conn: sys::virConnectPtr,
    dom: sys::virDomainPtr,
    path: *const c_char,
    alias: *const c_char,
    action: c_int,
    reason: *const c_char,
    opaque: *mut c_void,
) {
    let action = match action as u32 {
        sys::VIR_DOMAIN_EVENT_IO_ERROR_PAUSE => "pause",
        sys::VIR_DOMAIN_EVENT_IO_ERROR_REPORT => "report",
        _ => "none",
    };
    // SAFETY: libvirt passes a valid domain, NUL-terminated strings and our opaque pointer.
    unsafe {
        let event = HypervisorEvent::IoError {
            domain: domain_name(dom),
            alias: c_string(alias),
            path: c_string(path),
            action,
            reason: c_string(reason),
        };
        send(opaque, event);
    }
}

unsafe extern "C" fn on_agent_lifecycle(
    _conn: sys::virConnectPtr,
    dom: sys::virDomainPtr,
    state: c_int,
    _reason: c_int,
    opaque: *mut c_void,
) {
    let connected = state as u32 == sys::VIR_CONNECT_DOMAIN_EVENT_AGENT_LIFECYCLE_STATE_CONNECTED;
    // SAFETY: libvirt passes a valid domain and our opaque pointer.
    unsafe {
        send_for(opaque, dom, |domain| HypervisorEvent::AgentLifecycle {
            domain,
            connected,
        })
    };
}

unsafe extern "C" fn on_memory_size_change(
    _conn: sys::virConnectPtr,
    dom: sys::virDomainPtr,
    alias: *const c_char,
    size: std::os::raw::c_ulonglong,
    opaque: *mut c_void,
) {
    // SAFETY: libvirt passes a valid domain, a NUL-terminated alias and our opaque pointer.
    unsafe {
        let event = HypervisorEvent::MemoryDeviceSizeChange {
            domain: domain_name(dom),
            alias: c_string(alias),
            size_kib: size,
        };
        send(opaque, event);
    }
}

unsafe extern "C" fn on_close(_conn: sys::virConnectPtr, reason: c_int, opaque: *mut c_void) {
    // SAFETY: `opaque` is the Sender given at registration.
    unsafe { send(opaque, HypervisorEvent::ConnectionClosed { reason }) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_knows_a_device_event_only_by_its_domain_and_alias() {
        let removed = |domain: &str, alias: &str| HypervisorEvent::DeviceRemoved {
            domain: domain.into(),
            alias: alias.into(),
        };
        assert_eq!(
            change_of(&removed("vm", "ua-a")),
            Change::DeviceRemoved {
                domain: "vm".into(),
                alias: "ua-a".into()
            }
        );
        let added = HypervisorEvent::DeviceAdded {
            domain: "vm".into(),
            alias: "ua-b".into(),
        };
        assert_eq!(
            change_of(&added),
            Change::DeviceAdded {
                domain: "vm".into(),
                alias: "ua-b".into()
            }
        );
        // libvirt could not name the domain (or the device): it may be this one's.
        assert_eq!(change_of(&removed("", "ua-a")), Change::Other);
        assert_eq!(change_of(&removed("vm", "")), Change::Other);
        let reboot = HypervisorEvent::Reboot {
            domain: "vm".into(),
        };
        assert_eq!(change_of(&reboot), Change::Other);
        // What the guest does inside: no device came or went, the power state is as it was.
        let agent = HypervisorEvent::AgentLifecycle {
            domain: "vm".into(),
            connected: true,
        };
        let plugged = HypervisorEvent::MemoryDeviceSizeChange {
            domain: "vm".into(),
            alias: "ua-virtio-mem".into(),
            size_kib: 131072,
        };
        assert_eq!(change_of(&agent), Change::Guest);
        assert_eq!(change_of(&plugged), Change::Guest);
    }
}
