//! The guests tier: every end-to-end test that starts its own launcher (and so its private
//! libvirtd and a TCG guest) on the host, not in a pod. One binary, so `tests/common` is compiled
//! and the crate linked once, and libtest runs its tests side by side: each test's names (VMI,
//! cgroup, runtime dir, port) are its own (`common::unique`, temp dirs, `common::net::free_port`).
//! Each module was a test binary of its own, `tests/e2e_<module>.rs`; `cargo test --test guests
//! <module>::` runs one. Two took a longer name, since `hotplug::` and `migration::` would also
//! pick the modules whose names end so: `disk_hotplug` (was `e2e_hotplug`) and `local_migration`
//! (was `e2e_migration`).

#[path = "../common/mod.rs"]
mod common;

mod bad_syncs;
mod block_hotplug;
mod connect;
mod debian;
mod disk_hotplug;
mod disk_links;
mod host_files;
mod hpack_bomb;
mod kubevirt;
mod kubevirt_migration;
mod kubevirt_stats;
mod kubevirt_wire;
mod lifecycle;
mod local_migration;
mod migration_tcp;
mod network;
mod nic_hotplug;
mod python_client;
mod qemu_confined;
mod qemu_walls;
mod resize;
mod restart;
mod soak;
mod tpm_cpus;
mod volumes;
