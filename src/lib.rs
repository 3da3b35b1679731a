//! vmlauncher: one process, one virtual machine, kept in the state its owner asks for.
//!
//! Data flows forward, each stage a module that depends on no later stage's behaviour. A stage
//! may use a later module's vocabulary or a small helper of it: the spec keeps
//! `lifecycle::RunStrategy`, `convert` names targets with `domain::target_name`, `libvirt` waits
//! with `host::watch::poll_timeout`.
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
//! This is the project's one module map; the README and `docs/DESIGN.md` point here.
//!
//! | module | owns | must not |
//! |---|---|---|
//! | [`spec`] | KubeVirt's VMI subset: the document read bounded (`document`: size, aliases, depth, duplicate keys), serde types by area (`model/`), `parse`, `quantity`, `checks`, validation by area (`validate/`) into [`spec::Validated`] with typed [`spec::Problem`]s (`problem`), the table of KubeVirt fields not implemented, with why (`unsupported`) | do I/O, know libvirt |
//! | `volumes` | where each volume source lives on the host (pure) | touch the host |
//! | [`convert`] | `Validated` → [`domain::DomainDef`], deterministic (tests in `convert/tests.rs`) | do I/O |
//! | [`domain`] | the domain XML model (`mod.rs`), its writer (`write`, quick-xml), the live-XML reader (`live`, roxmltree), a live domain's vCPUs and memory and the spare root ports of a definition (`resources`), the source's XML made a migration target's (`migratable`) | call libvirt |
//! | `hotplug` | a Sync's plan: diff live vs desired scsi disks, targets, units | act on it |
//! | [`host`] | host side of volume sources: checks (`mod.rs`), the qcow2 images it writes (`qcow2`), cidata ISOs (`cidata`); hot-plugged block volumes' owner (`block`: nodes, rules, records) and which devices a Sync may take (`block_allow`); block nodes (`devnode`), cgroup v1/v2 device rules (`cgroup`), the records file (`records`), capabilities (`caps`), path watches (`watch`), the launcher's own CPUs (`cpus`), a foreign image's header (`image_check`), where a spec's host paths lead (`confine`), QEMU's user (`qemu_user`) and its id of its own on a host (`qemu_ids`), the dirs root works in and QEMU's own (`private_dirs`), QEMU's passage through the operator's dirs (`acl`), the guest kept off the host's loopback (`loopback`), hot-plugged files pinned for QEMU by a bind mount in its namespace (`pin`) | decide when |
//! | [`libvirt`] | the only user of the `virt` crate: the connection and `Connector`, the private daemon (`daemon`, its two configuration files in `daemon_conf`) and how it is started lean (`lean`: the loader, its preloads, `no_ssh_crypto.c`), which program a pid runs (`process`), the shared QEMU capability cache (`capcache`), the event FFI (`events`) and the log of delivered events (`delivered`), libvirt's state/event tables from `virt::sys` (`states`), bulk stats (`stats`), guest ports published through QEMU's monitor (`ports`), devices a killed libvirtd left in QEMU (`orphans`), peer-to-peer live migration and its job statistics (`migrate`) | hold policy |
//! | [`lifecycle`] | the state model's pure rules: phase, pause reason (`mod.rs`); commands, admit, settle, final stop (`tasks`); reconcile, run strategies, reboot window, back-off (`strategy`) | do I/O |
//! | `launcher` | the core that executes them: the `Launcher`, a coordinator of owned parts, and its start (`mod.rs`); the parts, each with its own locks and unit tests: the link to libvirt (`link`), the status publisher and event stream (`status_hub`, with I/O errors at a bounded rate in `io_errors`), the task slot (`task_slot`), the signals between tasks (`signals`), detach bookkeeping (`detaches`), the last accepted Sync (`last_sync`, on disk in `saved`), what it knows without asking libvirt (`live_view`), the images pinned for QEMU, each undone by a guard unless QEMU got it (`pins`); the shared request, status and error types (`types`, `error`) and the coordinator's fields (`coordinator`), which every part and job imports from, never from `mod.rs`; the VM's stage of life (`life`); the jobs: status (`status`), lifecycle tasks and the one request type `Work` (`tasks`), reconciler and reconnect (`reconciler`), disks made ready for QEMU (`disks`), Sync (`sync`) and its attaches a few at a time (`in_flight`), its vCPU and memory part (`resize`) and its interface part (`nics`), live migration, its source's side (`migration_source`) and its target's (`migration_target`), its state machine and marker (`migration_part`), and what they agree on before the guest moves: offer, plan, a target's failures (`migration_plan`); unit tests against libvirt's `test:///default` (`tests.rs`) | implement a parser of its own |
//! | [`api`] | the gRPC server (+ health; reflection built on its first call, `api/reflection.rs`) and client connection; what it serves before a migration target has a VM and the source's call to its target (`api/migration.rs`); the API over TCP under mutual TLS, for a migration between machines (`api/tcp.rs`); the status, events and block devices as messages (`api/to_proto.rs`); maps errors to gRPC codes | hold state |
//! | [`kubevirt`] | `vmlauncher virt-launcher`: KubeVirt's handler ↔ launcher protocol over the launcher: its flags (`flags`), entrypoint (`entry`), cmd server (`server`), what each call does (`front`), the VMI as sent (`vmi`), notify client (`notify`), the `api.Domain` JSON and its stats (`domain_json/`), guest-agent answers (`guest_agent`) | hold VM state of its own |
//! | `authority` | the connection filter that lets C-core and Java clients' `:authority` through (tests against real HPACK encoders in `tests.rs`) | touch anything but header blocks |
//! | [`run`] | the `run` entrypoint: daemon, launcher, socket, signals (`mod.rs`); the host side a launcher needs before it has a VM, shared with `virt-launcher` (`host`); `run --incoming`, a migration target (`incoming`) | — |
//! | [`runtime_dir`], `owned_dir` | the runtime dir: the launcher's own, one launcher at a time (flock); whether a directory is the launcher's own | — |
//! | [`ended`] | how a command that ran to its end ended (`Ended`: done, a final phase, a part of a Sync failed), for the binary to map to an exit code | pick the code |
//! | [`console`], [`init`] | the serial console follower (`run --console`, tests); PID-1 duties | — |
//! | [`allocator`] | glibc malloc kept small for a launcher: one arena, free memory given back while idle | — |
//! | [`tricks`] | the list of performance tricks, each with the bench row it pays for, and `VMLAUNCHER_PLAIN`, which turns them off | — |
//! | [`logs`] | the console and QEMU logs kept under their bound (in place of a virtlogd) | read them |
//! | [`migration_tls`] | the credentials of a migration between machines (`--tls-dir`): read bounded, copied where libvirt and QEMU's user read them | open connections |
//! | `durable` | the launcher's own state files: bounded reads, crash-safe writes | know what is in them |
//! | [`fuzzing`] | the fuzz targets' bodies (`fuzz/`), and the corpus replayed by `cargo test` | — |
//! | `testing` | what the unit tests share (`#[cfg(test)]`) | — |
//!
//! The binary (`src/main.rs`, `src/cli/`) parses arguments (`args`), runs the client verbs
//! (`client`; `migrate`; `console`), prints their output (`output`), edits the spec for
//! `addvolume`/`removevolume` (`spec_edit`), and alone picks the exit code (`exit`: every code,
//! and every mapping to one from how a command ended and why it failed, `MainError`).
//!
//! Beside the crate: `proto/` (the gRPC contract), `tests/` (CLI tests, libvirt judging our XML,
//! KubeVirt's examples, end-to-end tests in a real guest and in a pod; `tests/common/` the harness
//! they share, by concern), `xml-fixtures/` (expected domain XML per spec), `benches/`
//! (`side_by_side`: the launcher beside raw libvirt; `launch`; criterion's `convert` and
//! `live_xml`), `fuzz/` (cargo fuzz targets and corpus), `scripts/` (setup, tests, soak, the test
//! guest and the Debian image), `Containerfile` and `deploy/` (the image and the pod),
//! `examples/` (the test guest's and the Debian VM's specs), `docs/` (design, pod, KubeVirt,
//! performance).
//!
//! See `docs/DESIGN.md` for the state model, the hotplug flow and the decisions behind them.

pub mod allocator;
pub mod api;
pub(crate) mod authority;
pub mod console;
pub mod convert;
pub mod domain;
pub(crate) mod durable;
pub mod ended;
pub mod fuzzing;
pub mod host;
pub mod hotplug;
pub mod init;
pub mod kubevirt;
pub(crate) mod launcher;
/// The launcher's error, inside `run`'s and the API's: the binary maps it to an exit code.
pub use launcher::LauncherError;
pub mod libvirt;
pub mod lifecycle;
pub mod logs;
pub mod migration_tls;
pub(crate) mod owned_dir;
pub(crate) mod resident;
pub mod run;
pub mod runtime_dir;
pub(crate) mod spawn;
pub mod spec;
#[cfg(test)]
mod testing;
pub mod tricks;
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
