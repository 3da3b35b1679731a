//! KubeVirt's handler ↔ launcher protocol: `vmlauncher virt-launcher` speaks it, so that an
//! unmodified virt-handler drives this launcher as it drives KubeVirt's own. virt-handler calls
//! `kubevirt.cmd.v1.Cmd` on the pod's socket; the launcher reports back on
//! `kubevirt.notify.v1.Notify`. The wire types are generated from KubeVirt's own protos
//! (`proto/kubevirt/`); this module only translates between them and the launcher.

pub mod domain_json;
mod entry;
mod errors;
pub mod flags;
mod front;
mod fsfreeze;
pub(crate) mod guest_agent;
mod migration;
pub(crate) mod notify;
mod resize;
mod server;
pub(crate) mod vmi;

pub use entry::{invoked_as_virt_launcher, virt_launcher, VirtLauncherError, READY_SOCKET};

/// The generated protobuf and gRPC types of KubeVirt's protocol.
#[allow(missing_debug_implementations, clippy::all)]
pub mod proto {
    pub mod cmd {
        tonic::include_proto!("kubevirt.cmd.v1");
    }
    pub mod cmd_info {
        tonic::include_proto!("kubevirt.cmd.info");
    }
    pub mod notify {
        tonic::include_proto!("kubevirt.notify.v1");
    }
    pub mod notify_info {
        tonic::include_proto!("kubevirt.notify.info");
    }
}
