//! glibc's allocator, kept small for a process that lives as long as its VM and allocates little
//! (`Trick::SmallHeap`): one arena, and free memory given back while the launcher is idle.
//!
//! - **One arena** (`M_ARENA_MAX`, by `mallopt`): glibc gives each thread that allocates an
//!   arena of its own (up to 8 per core), each holding freed memory; the launcher's threads rarely
//!   allocate at once.
//! - **Free memory given back while idle** (`give_back_free_memory`): a Sync of many disks
//!   leaves freed memory scattered through the heap, which glibc keeps (it only trims the top),
//!   so the launcher would stay at the size of its largest Sync for the rest of the VM's life.
//!
//! Measured together (`docs/performance.md`, "The tricks, with and without"): launcher RssAnon
//! 5.2 MiB without either, 3.4–3.5 with both, 4.1 with the arena alone. (glibc's per-thread
//! caches turned off as well, by a second exec with `GLIBC_TUNABLES`, added nothing on top of
//! these two: removed.)

use crate::tricks::{enabled, Trick};

/// One arena for all threads. Call first, before any thread exists.
pub fn one_arena() {
    if !enabled(Trick::SmallHeap) {
        return;
    }
    // SAFETY: mallopt only sets a tunable of the allocator; called before any other thread runs.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Free heap memory kept for the next Sync rather than given back.
const FREE_MEMORY_KEPT: usize = 512 << 10;

/// Gives the allocator's free memory back to the kernel when there is much of it. For a quiet
/// moment: not after every change, or the next Sync would fault the pages in again (a trim
/// costs 40–100 µs on the bench machine, and the look at the free lists tens of µs).
pub(crate) fn give_back_free_memory() {
    give_back_beyond(FREE_MEMORY_KEPT);
}

/// Gives all the allocator's free memory back, none kept (`resident::give_back_start_memory`
/// says when).
pub(crate) fn give_back_all_free_memory() {
    give_back_beyond(0);
}

fn give_back_beyond(kept: usize) {
    if !enabled(Trick::SmallHeap) {
        return;
    }
    // SAFETY: mallinfo2 only reads the allocator's counters; malloc_trim only returns its free
    // memory to the kernel.
    unsafe {
        if libc::mallinfo2().fordblks > kept {
            libc::malloc_trim(0);
        }
    }
}
