//! Where the guest's consoles are, from the spec's devices and the host's paths: the one place
//! that decides it, for the domain (QEMU listens there), the status (`vmlauncher console` finds
//! the socket there) and what `vmlauncher run` prints.

use std::path::PathBuf;

use crate::domain::SerialDef;
use crate::spec::Devices;
use crate::volumes::HostPaths;

/// The consoles a spec's VM has; `None` for each the spec turns off.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Consoles {
    /// `autoattachSerialConsole` (KubeVirt's default: on).
    pub serial: Option<SerialDef>,
    /// `autoattachGraphicsDevice` (KubeVirt's default: on): VNC on a unix socket.
    pub vnc_socket: Option<PathBuf>,
}

impl Consoles {
    pub(crate) fn of(devices: &Devices, paths: &HostPaths) -> Consoles {
        Consoles {
            serial: devices.serial_console().then(|| SerialDef {
                socket: paths.serial_socket(),
                // KubeVirt logs the serial console unless the spec (or its cluster) says not to.
                log: (devices.log_serial_console != Some(false)).then(|| paths.console_log.clone()),
            }),
            vnc_socket: devices.graphics().then(|| paths.vnc_socket()),
        }
    }
}
