//! The pages a launcher touched only to start, given back once it has started
//! ([`Trick::StartPagesDropped`]), as the kernel frees its `__init` memory after boot; with
//! them, the heap the start freed (`give_back_start_memory`).
//!
//! A launcher maps its own binary and the 58 shared libraries libvirt's client links (GnuTLS,
//! GLib, ICU, libxml2, curl, libssh, OpenSSL, Kerberos, ...), and starting runs the
//! constructors of all of them, the argument parser, the spec's conversion, the host's and the
//! daemon's set-up: each page touched stays resident, and the kernel maps the neighbours of each
//! page faulted in with it (`fault_around_bytes`, 64 KiB). Of a running launcher's 25.5 MiB RSS,
//! 17.6 MiB were those libraries' pages and 4.9 MiB its own code (`/proc/PID/smaps`, 2026-11-28,
//! `docs/performance.md`); dropped once and faulted back as used, a status call and a Sync
//! later the launcher held 11.7 MiB.
//!
//! Only what can come back unchanged is dropped: private file mappings that are not writable
//! and hold no page of their own (a relocated read-only segment, RELRO, holds copies: skipped).
//! `MADV_DONTNEED` takes such a page out of this process's page tables only; it stays in the
//! page cache, shared with the other launchers and libvirtd, and comes back on its next use
//! with a minor fault (no I/O while the file stays cached).

use crate::tricks::{enabled, Trick};

/// One mapping of `/proc/self/smaps` that may be dropped.
#[derive(Debug, PartialEq, Eq)]
struct Droppable {
    start: usize,
    len: usize,
}

/// Gives back what only the start used, once per process; whether this call was the one. For a
/// quiet moment once a domain exists: the pages only the start touched (`drop_start_pages`),
/// then all the allocator's free memory (`allocator::give_back_all_free_memory`: what the start
/// freed is not what a later Sync needs; keeping 512 KiB of it, as later releases do, kept
/// 120–440 KiB resident in every launcher, `docs/performance.md`). The drop first: reading the
/// mappings allocates, and what it frees is given back too.
pub(crate) fn give_back_start_memory() -> bool {
    static DONE: std::sync::Once = std::sync::Once::new();
    let mut first = false;
    DONE.call_once(|| {
        first = true;
        drop_start_pages();
        crate::allocator::give_back_all_free_memory();
    });
    first
}

/// Drops the pages of every read-only private file mapping that holds no page of its own: the
/// next calls fault back what they use (a few hundred minor faults, once).
fn drop_start_pages() {
    if !enabled(Trick::StartPagesDropped) {
        return;
    }
    // Read a line at a time: the whole text is ~270 KiB for a launcher's 58 libraries, and
    // a buffer that size would be freed heap just when the launcher gives its heap back.
    let Ok(smaps) = std::fs::File::open("/proc/self/smaps") else {
        return;
    };
    let mut dropped = 0;
    for m in droppable(std::io::BufReader::new(smaps)) {
        // SAFETY: a whole mapping of this process that is private, not writable and holds
        // no anonymous page: dropping its pages loses nothing, each is read again from the
        // page cache on its next use.
        if unsafe { libc::madvise(m.start as *mut libc::c_void, m.len, libc::MADV_DONTNEED) } == 0 {
            dropped += m.len;
        }
    }
    tracing::debug!(mapped_kib = dropped >> 10, "start-up pages given back");
}

/// The mappings of `smaps` (the text of `/proc/PID/smaps`) whose pages can be dropped: backed
/// by a file (a path, not a device node), private, neither writable nor holding anonymous pages.
fn droppable(mut smaps: impl std::io::BufRead) -> Vec<Droppable> {
    let mut found = Vec::new();
    let mut current: Option<Droppable> = None;
    // One buffer for every line: the text has thousands.
    let mut line = String::new();
    loop {
        line.clear();
        match smaps.read_line(&mut line) {
            Ok(0) => break,
            Ok(_) => {}
            // What was found so far is whole mappings, each safe to drop.
            Err(e) => {
                tracing::debug!(error = %e, "cannot read all the mappings");
                break;
            }
        }
        let mut fields = line.split_whitespace();
        let Some(first) = fields.next() else {
            continue;
        };
        if let Some(anonymous) = line.strip_prefix("Anonymous:") {
            let none = anonymous.trim().trim_end_matches("kB").trim() == "0";
            if let Some(m) = current.take().filter(|_| none) {
                found.push(m);
            }
            continue;
        }
        if first.ends_with(':') {
            continue;
        }
        // A mapping's header: range, permissions, offset, device, inode, path.
        current = None;
        let (Some(perms), Some(_), Some(_), Some(inode), Some(path)) = (
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
            fields.next(),
        ) else {
            continue;
        };
        let Some((start, end)) = first.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (
            usize::from_str_radix(start, 16),
            usize::from_str_radix(end, 16),
        ) else {
            continue;
        };
        let private_read_only = perms.len() == 4 && perms.ends_with('p') && &perms[1..2] == "-";
        if private_read_only && inode != "0" && path.starts_with('/') && !path.starts_with("/dev/")
        {
            current = Some(Droppable {
                start,
                len: end - start,
            });
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_read_only_private_file_pages_without_copies_of_their_own_are_dropped() {
        let smaps = "\
55d0a0000000-55d0a0200000 r--p 00000000 fe:01 1234 /usr/bin/vmlauncher
Rss:                 768 kB
Anonymous:             0 kB
55d0a0200000-55d0a0800000 r-xp 00200000 fe:01 1234 /usr/bin/vmlauncher
Anonymous:             0 kB
55d0a0800000-55d0a0838000 r--p 00800000 fe:01 1234 /usr/bin/vmlauncher
Anonymous:           224 kB
55d0a0838000-55d0a083d000 rw-p 00838000 fe:01 1234 /usr/bin/vmlauncher
Anonymous:            20 kB
55d0a1000000-55d0a1100000 rw-p 00000000 00:00 0 [heap]
Anonymous:          1024 kB
7f0000000000-7f0000001000 r--s 00000000 fe:01 99 /run/shared.map
Anonymous:             0 kB
7f0000002000-7f0000003000 r--p 00000000 00:05 12 /dev/zero
Anonymous:             0 kB
7f0000004000-7f0000005000 r-xp 00000000 00:00 0 [vdso]
Anonymous:             0 kB
7f0000006000-7f0000008000 r-xp 00000000 fe:01 77 /usr/lib/libc.so.6
VmFlags: rd ex mr mw me sd
Anonymous:             0 kB
";
        assert_eq!(
            droppable(smaps.as_bytes()),
            [
                Droppable {
                    start: 0x55d0a0000000,
                    len: 0x200000
                },
                Droppable {
                    start: 0x55d0a0200000,
                    len: 0x600000
                },
                Droppable {
                    start: 0x7f0000006000,
                    len: 0x2000
                },
            ]
        );
    }

    /// On this process: what is dropped is mapped again, unchanged, on its next use.
    #[test]
    fn a_dropped_mapping_reads_the_same_afterwards() {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let found = droppable(smaps.as_bytes());
        assert!(!found.is_empty(), "{smaps}");
        let m = &found[0];
        // SAFETY: a mapping of this process found readable in its smaps just now.
        let before: Vec<u8> =
            unsafe { std::slice::from_raw_parts(m.start as *const u8, m.len.min(4096)).to_vec() };
        // SAFETY: as in `drop_start_pages`: private, read-only, no page of its own.
        let rc = unsafe { libc::madvise(m.start as *mut libc::c_void, m.len, libc::MADV_DONTNEED) };
        assert_eq!(rc, 0);
        // SAFETY: as above.
        let after = unsafe { std::slice::from_raw_parts(m.start as *const u8, m.len.min(4096)) };
        assert_eq!(before, after);
    }
}
