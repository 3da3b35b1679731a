//! vmlauncher: one process, one virtual machine, kept in the state its owner asks for.
//!
//! Data flows forward, each stage a module that depends on no later stage's behaviour. A stage
//! may use a later module's vocabulary or a small helper of it: the spec keeps
//! `lifecycle::RunStrategy`, `volumes` the default namespace `convert` gives a domain, `convert`
//! names targets with `domain::target_name`, `libvirt` waits with `host::watch::poll_timeout`.
//!
//! ```text
//!  text ──► spec ──► convert ──► domain ──► libvirt ──► QEMU
//!           parse,   pure:        XML model,   the only     │ events
//!           validate  Validated   live-XML      `virt` user │
//!           (Validated)  → DomainDef   reader               ▼
//!                          │                      launcher (tasks, reconciler, sync)
//!             volumes ─────┘ hotplug (plan) ──► host (files, nodes, cgroups, records)
//!                                               lifecycle (pure rules) ◄─┘
//!  front ends: api (gRPC) · run (the entrypoint) · init (PID 1) · the binary's cli/
//! ```
//!
//! | module | owns | must not |
//! |---|---|---|
//! | [`spec`] | KubeVirt's VMI subset: parse, default, validate into [`spec::Validated`] with typed [`spec::Problem`]s | do I/O, know libvirt |
//! | `volumes` | where each volume source lives on the host (pure) | touch the host |
//! | [`convert`] | `Validated` → [`domain::DomainDef`], deterministic | do I/O |
//! | [`domain`] | the domain XML model, its writer, the live-XML reader | call libvirt |
//! | `hotplug` | a Sync's plan: diff live vs desired scsi disks, targets, units | act on it |
//! | [`host`] | host side: images, cidata ISOs, block nodes, cgroup rules, `host::block::BlockDevices`, capabilities, path watches | decide when |
//! | [`libvirt`] | the connection, the private daemon and its preload, the shared QEMU capability cache, the event FFI and the log of delivered events, libvirt's state/event tables, which program a pid runs | hold policy |
//! | [`lifecycle`] | the state model's pure rules: phase, admit, settle, reconcile, run strategy, restarts | do I/O |
//! | `launcher` | the core that executes them: one VM, tasks, reconciler, Sync, status and events; the last accepted Sync on disk (its own JSON) | parse specs or XML |
//! | [`api`] | the gRPC server and client connection; maps errors to gRPC codes | hold state |
//! | [`kubevirt`] | `vmlauncher virt-launcher`: KubeVirt's handler ↔ launcher protocol (cmd server, notify client, the `api.Domain` JSON) over the launcher | hold VM state of its own |
//! | [`authority`] | the connection filter that lets C-core and Java clients' `:authority` through | touch anything but header blocks |
//! | `run_to_end` | a call that a gRPC client's going away does not cut off | — |
//! | [`run`] | the `run` entrypoint: daemon, launcher, socket, signals | — |
//! | [`runtime_dir`] | the runtime dir: the launcher's own (owner, mode, no symlink), one launcher at a time | — |
//! | [`exit`] | every exit code and every mapping to one | — |
//! | [`console`], [`init`] | the serial console follower; PID-1 duties | — |
//! | [`allocator`] | glibc malloc's settings for a launcher: one arena, no per-thread cache (a second start) | — |
//! | [`logs`] | the console and QEMU logs kept under their bound (in place of a virtlogd) | read them |
//! | `durable` | the launcher's own state files: bounded reads, crash-safe writes | know what is in them |
//! | [`fuzzing`] | the fuzz targets' bodies (`fuzz/`), and the corpus replayed by `cargo test` | — |
//!
//! See `docs/DESIGN.md` for the state model, the hotplug flow and the decisions behind them.

pub mod allocator;
pub mod api;
pub mod authority;
pub mod console;
pub mod convert;
pub mod domain;
pub(crate) mod durable;
pub mod exit;
pub mod fuzzing;
pub mod host;
pub mod hotplug;
pub mod init;
pub mod kubevirt;
pub(crate) mod launcher;
pub mod libvirt;
pub mod lifecycle;
pub mod logs;
pub mod owned_dir;
pub mod run;
pub(crate) mod run_to_end;
pub mod runtime_dir;
pub mod spec;
#[cfg(test)]
mod testing;
pub(crate) mod volumes;

/// An error and its sources on one line: `a: b: c`. Printed once, at the top.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let msg = e.to_string();
        if !text.contains(&msg) {
            text.push_str(": ");
            text.push_str(&msg);
        }
        source = e.source();
    }
    text
}
