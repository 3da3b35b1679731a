//! vmlauncher: one process, one virtual machine, kept in the state its owner asks for.
//!
//! Data flows `spec → convert → domain → libvirt`, with `hotplug`, `host` and `lifecycle` beside
//! them; `launcher` is the core the front ends (`api`, `run`, the CLI) call. See `docs/DESIGN.md`.

pub mod api;
pub mod console;
pub mod convert;
pub mod domain;
pub mod exit;
pub mod fuzzing;
pub mod host;
pub mod hotplug;
pub mod init;
pub mod launcher;
pub mod libvirt;
pub mod lifecycle;
pub mod run;
pub mod spec;
pub mod spec_document;
pub mod volumes;

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
