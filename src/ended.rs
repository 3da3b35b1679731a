//! How a command that ran to its end ended: what `run`, `virt-launcher` and the client verbs
//! return to the binary, which alone turns it into an exit code (`src/cli/exit.rs`).

use crate::lifecycle::{Phase, PhaseReason};

/// How a command that ran to its end ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// It did what it was asked: a client call answered, a spec valid, a migration target stopped
    /// before any migration came, a capability cache warmed, a VM stopped on SIGTERM.
    Done,
    /// The launcher's VM reached a final phase (or was never started), with the reason it gives.
    VmFinal {
        phase: Phase,
        reason: Option<PhaseReason>,
    },
    /// A Sync was answered and reported a part of it that failed (a volume, a resize, an
    /// interface): printed, and told to scripts through the exit code.
    PartFailed,
}
