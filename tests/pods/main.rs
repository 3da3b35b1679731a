//! The pods tier: every test that plays a pod with `podman kube play` (the image
//! `scripts/build-image.sh` builds). One binary, so `tests/common` is compiled and the crate
//! linked once, and libtest runs its tests side by side: each played pod, its containers and
//! volumes get names of their own (`common::pod::PlayedPod`). Each module was a test binary of
//! its own, `tests/e2e_<module>.rs`; `cargo test --test pods <module>::` runs one. `pod_manifest`
//! was `e2e_pod` (`pod::` would also pick `kubevirt_pod`).

#[path = "../common/mod.rs"]
mod common;

mod kubevirt_pod;
mod pod_loopback;
mod pod_manifest;
mod pod_network;
mod pod_nic_hotplug;
