//! Every performance trick the launcher plays, listed in one place, and one switch that turns
//! them off.
//!
//! Each trick buys time or memory that `docs/performance.md` measured (with and without it, in one
//! bench run) and costs code that does something less obvious than the plain way. The code that
//! applies one asks `enabled` and knows about no other. `VMLAUNCHER_PLAIN=1` in the
//! environment turns every trick off, to tell a bug of a trick from a bug of the launcher:
//! the launcher then behaves the same, only slower and larger. `VMLAUNCHER_PLAIN=a,b` turns off
//! only the tricks named (their `Trick::name`); that is how the bench measures each one
//! (`cargo bench --bench side_by_side -- --plain ...`). Read once, at the first question: the
//! environment a process started with, as every child it starts inherits it.

use std::sync::OnceLock;

/// The environment variable: `1` turns every trick off, a comma-separated list of names those.
pub const PLAIN: &str = "VMLAUNCHER_PLAIN";

/// A trick kept, with why and the bench row it pays for (`docs/performance.md`, "The tricks, with and without").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Trick {
    /// A Sync's resizes, all accepted, shown in the status as applied instead of read back
    /// from libvirt (`launcher::resize`): the CPU and memory rows, one live-XML read fewer
    /// (`docs/performance.md`, "The storm, resize and memory, continued").
    AppliedResize,
    /// Each private libvirtd held on the launcher's first CPU only while it starts (it reads
    /// the host's CPUID then, for the capability cache), not for its whole life
    /// (`libvirt::start_pin`): with it held, every libvirtd of a node and its part of every
    /// start ran on one core, and a storm of eight starts queued there.
    BriefPin,
    /// QEMU's capabilities probed once per machine and shared between launchers
    /// (`libvirt::capcache`): start → Running, 7.7 s without against 1.2–1.8 s with (loaded
    /// machine; 4.1 against 0.36 s idle).
    CapabilityCache,
    /// libvirtd started lean (`libvirt::lean`): the QEMU driver alone, jemalloc and
    /// `no_ssh_crypto` preloaded through the dynamic loader: libvirtd's RSS, 29.2 → 23.3 MiB.
    LeanLibvirtd,
    /// The live disks, vCPUs, memory and power state kept between libvirt's events instead of
    /// read again by every Sync (`launcher::live_view`, `libvirt::delivered`): a Sync that
    /// changes nothing (1.77 → 0.89 ms when it came); one right after the launcher's own vCPU
    /// add, 9.05 → 0.95–1.67 ms (2026-11-28). And the last spec text a Sync parsed, kept with
    /// its parse (`launcher::kept_parse`).
    LiveStateCache,
    /// A start's independent steps run side by side instead of one after the other
    /// (`launcher::Launcher::start`, `libvirt::daemon`): the kernel and initrd copied while
    /// libvirtd starts, QEMU's capabilities loaded and published while the launcher registers
    /// for events. Off, each waits for the one before, as before issue 46.
    ParallelStart,
    /// The pages the launcher touched only to start (its libraries' constructors, its own
    /// start-up code) given back once it runs (`resident`): launcher RSS with 16 disks,
    /// 24.0 → 13.1 MiB (`docs/performance.md`).
    StartPagesDropped,
    /// glibc's malloc kept small (`allocator`): one arena, and free memory given back while the
    /// launcher is idle: launcher RssAnon, 5.2 → 3.5 MiB (either alone: 4.1).
    SmallHeap,
}

impl Trick {
    pub(crate) const ALL: [Trick; 8] = [
        Trick::AppliedResize,
        Trick::BriefPin,
        Trick::CapabilityCache,
        Trick::LeanLibvirtd,
        Trick::LiveStateCache,
        Trick::ParallelStart,
        Trick::StartPagesDropped,
        Trick::SmallHeap,
    ];

    /// Its name in `VMLAUNCHER_PLAIN`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Trick::AppliedResize => "applied-resize",
            Trick::BriefPin => "brief-pin",
            Trick::CapabilityCache => "capability-cache",
            Trick::LeanLibvirtd => "lean-libvirtd",
            Trick::LiveStateCache => "live-state-cache",
            Trick::ParallelStart => "parallel-start",
            Trick::StartPagesDropped => "start-pages-dropped",
            Trick::SmallHeap => "small-heap",
        }
    }
}

/// Whether `trick` is played in this process.
pub(crate) fn enabled(trick: Trick) -> bool {
    static OFF: OnceLock<Vec<Trick>> = OnceLock::new();
    !OFF.get_or_init(|| off(std::env::var(PLAIN).ok().as_deref()))
        .contains(&trick)
}

/// The tricks `VMLAUNCHER_PLAIN`'s value turns off. Unset, empty or `0`: none; `1`: all; else
/// the names listed (a name it does not know is ignored, with a warning on stderr: logging may
/// not be set up yet).
fn off(value: Option<&str>) -> Vec<Trick> {
    match value.map(str::trim) {
        None | Some("" | "0") => Vec::new(),
        Some("1") => Trick::ALL.to_vec(),
        Some(names) => names
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .filter_map(|name| {
                let trick = Trick::ALL.into_iter().find(|t| t.name() == name);
                if trick.is_none() {
                    eprintln!("{PLAIN}: no trick named {name:?}; ignored");
                }
                trick
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_switch_turns_off_all_or_the_tricks_named() {
        assert_eq!(off(None), []);
        assert_eq!(off(Some("")), []);
        assert_eq!(off(Some("0")), []);
        assert_eq!(off(Some("1")), Trick::ALL);
        assert_eq!(
            off(Some("lean-libvirtd, capability-cache,nonsense")),
            [Trick::LeanLibvirtd, Trick::CapabilityCache]
        );
    }

    #[test]
    fn every_trick_has_a_name_of_its_own() {
        for trick in Trick::ALL {
            let named: Vec<Trick> = Trick::ALL
                .into_iter()
                .filter(|t| t.name() == trick.name())
                .collect();
            assert_eq!(named, [trick]);
        }
    }
}
