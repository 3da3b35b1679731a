//! Test harness: starts the real `vmlauncher` binary against a real private libvirtd and a real
//! (TCG) test guest, and waits on what it prints, its guest's console, or its exit — each with a
//! deadline that fails with a clear message. Never a sleep. One file per concern: the guest
//! (`guest`), the binary as a client (`cli`), the console (`console`), a launched `run`
//! (`launched`), the gRPC API (`grpc`), loop devices (`loopdev`), libvirt (`libvirt`), the pod
//! (`pod`, `net`), an escaped guest's credentials (`as_qemu`), one Debian boot at a time
//! (`debian_turn`), one running guest shared by the tests that only look at it
//! (`shared_guest`), KubeVirt (`kubevirt`, `kubevirt_notify`, and `forward` for its migration
//! proxy), the Python client (`python`).
#![allow(dead_code)]

pub mod as_qemu;
pub mod cli;
pub mod cluster;
pub mod console;
pub mod debian_turn;
pub mod forward;
pub mod grpc;
pub mod guest;
pub mod kubevirt;
pub mod kubevirt_notify;
pub mod launched;
pub mod libvirt;
pub mod loopdev;
pub mod net;
pub mod pod;
pub mod python;
pub mod shared_guest;
pub mod websocket;

/// A name no other test uses while this process runs (`<pid>-<n>`): for what a test makes outside
/// its temp dirs (a cgroup, a pod, a podman volume), since the tests of one binary run side by
/// side.
pub fn unique() -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}

// The test files name the harness as `common::X`, whatever the concern X belongs to. Each test
// crate compiles all of it and uses a part, so a re-export may go unused there.
#[allow(unused_imports)]
pub use self::{
    as_qemu::*, cli::*, console::*, grpc::*, guest::*, launched::*, libvirt::*, loopdev::*,
};
