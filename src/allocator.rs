//! glibc's allocator, set for a process that lives as long as its VM and allocates little.
//!
//! Two settings, both measured on a launcher holding the test guest with 16 disks after Syncs of
//! 64 (`malloc_stats`, `/proc/PID/smaps_rollup`):
//! - **One arena** (`M_ARENA_MAX`, by `mallopt`): glibc gives each thread that allocates an
//!   arena of its own (up to 8 per core), each holding freed memory. One arena for all held
//!   0.2–0.4 MiB less than two (the side-by-side bench: RssAnon 4.01–4.14 → 3.77–3.83 MiB), with
//!   no change in its timings (its threads rarely allocate at once).
//! - **No per-thread cache** (`glibc.malloc.tcache_count=0`): each of the launcher's eight
//!   threads keeps up to seven freed chunks of each small size for itself, out of reach of
//!   `malloc_trim`; they added up to a third of the heap (in use 1.05 MB, of which 0.58 MB live
//!   by valgrind's massif; heap resident 1.03 → 0.70 MiB without the cache). A tunable, which
//!   glibc reads only when a process starts: so `run` starts its own program file again, once,
//!   with it ([`with_tuned_malloc`]), and puts the environment back as it found it before
//!   anything else runs, so libvirtd, QEMU and hooks do not inherit it. Without the cache every
//!   free goes to the arena, under its lock, which the launcher's threads seldom contend for at
//!   its rate of allocation. The bench, two runs each way in one sitting: launcher RSS 20.13 /
//!   20.39 → 19.95 / 19.95 MiB, RssAnon 3.62 / 3.71 → 3.39 / 3.35, no-op Sync 0.52 / 0.54 →
//!   0.45 / 0.50 ms, attach ratio 1.081 / 1.118 → 1.088 / 1.132 (unchanged builds spread over
//!   1.075–1.137 the same day).
//! - **Free memory given back while idle** ([`give_back_free_memory`]): a Sync of many disks
//!   leaves freed memory scattered through the heap, which glibc keeps (it only trims the top),
//!   so the launcher would stay at the size of its largest Sync for the rest of the VM's life.
//!
//! Each is a [`Trick`](crate::tricks::Trick): `VMLAUNCHER_PLAIN` turns it off.

use std::ffi::{OsStr, OsString};
use std::os::unix::process::CommandExt;

use crate::tricks::{enabled, Trick};

const TUNABLES: &str = "GLIBC_TUNABLES";
const THREAD_CACHE: &str = "glibc.malloc.tcache_count";
/// Set on the second start to what `GLIBC_TUNABLES` was before it (empty if it was not set:
/// glibc reads an empty one as none).
const BEFORE: &str = "VMLAUNCHER_GLIBC_TUNABLES_BEFORE";

/// One arena for all threads. Call first, before any thread exists.
pub fn one_arena() {
    if !enabled(Trick::OneMallocArena) {
        return;
    }
    // SAFETY: mallopt only sets a tunable of the allocator; called before any other thread runs.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Starts this program again with glibc's per-thread cache off, unless this start is that
/// second one (then restores the environment) or the cache is set already (by whoever started
/// us: their setting stands). Returns if the program cannot be started again (no `/proc`, say):
/// the launcher runs as well, with a few hundred KiB more. Call before any thread exists.
pub fn with_tuned_malloc() {
    if let Some(before) = std::env::var_os(BEFORE) {
        restore(&before);
        return;
    }
    if !enabled(Trick::NoThreadCache) {
        return;
    }
    let current = std::env::var_os(TUNABLES);
    if current
        .as_deref()
        .is_some_and(|t| t.to_string_lossy().contains(THREAD_CACHE))
    {
        return;
    }
    let mut tunables = OsString::new();
    if let Some(t) = current.as_deref().filter(|t| !t.is_empty()) {
        tunables.push(t);
        tunables.push(":");
    }
    tunables.push(THREAD_CACHE);
    tunables.push("=0");
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_else(|| "vmlauncher".into());
    // The path, not `/proc/self/exe` itself: under valgrind (scripts/hot-symbols.sh) that link
    // is valgrind's own program, and only a path read through it names ours.
    let Ok(program) = std::env::current_exe() else {
        return;
    };
    // Returns only on failure; logging is not set up yet, and there is nothing to tell: the
    // launcher runs the same, with the cache.
    let _ = std::process::Command::new(program)
        .arg0(arg0)
        .args(args)
        .env(TUNABLES, tunables)
        .env(BEFORE, current.unwrap_or_default())
        .exec();
}

/// Free heap memory kept for the next Sync rather than given back.
const FREE_MEMORY_KEPT: usize = 512 << 10;

/// Gives the allocator's free memory back to the kernel when there is much of it. For a quiet
/// moment: not after every change, or the next Sync would fault the pages in again (a trim
/// costs 40–100 µs on the bench machine, and the look at the free lists tens of µs).
pub fn give_back_free_memory() {
    if !enabled(Trick::IdleTrim) {
        return;
    }
    // SAFETY: mallinfo2 only reads the allocator's counters; malloc_trim only returns its free
    // memory to the kernel.
    unsafe {
        if libc::mallinfo2().fordblks > FREE_MEMORY_KEPT {
            libc::malloc_trim(0);
        }
    }
}

fn restore(before: &OsStr) {
    // Edition 2021: set_var and remove_var are safe; they are sound here because no other
    // thread exists yet to read the environment.
    if before.is_empty() {
        std::env::remove_var(TUNABLES);
    } else {
        std::env::set_var(TUNABLES, before);
    }
    std::env::remove_var(BEFORE);
}
