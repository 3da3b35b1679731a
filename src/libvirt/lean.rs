//! libvirtd started lean ([`Trick::LeanLibvirtd`]): libvirt's QEMU driver alone, jemalloc as its
//! allocator and `no_ssh_crypto` preloaded through the dynamic loader, each with its fallback to
//! libvirtd as it is where the host cannot do it. libvirtd 31.3 → 23.1 MiB RSS in steps
//! (`docs/DESIGN.md` §7; the bench with and without: `docs/performance.md`). Tied to the distro
//! (the loader's path, glibc ≥ 2.33, sonames): `VMLAUNCHER_PLAIN` starts libvirtd plainly.
//! A daemon an earlier launcher started lean is adopted all the same (`process::runs_program`
//! reads the loader's arguments), whatever the switch says.

use std::fs;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use super::process::{program_in_path, LOADER};
use crate::tricks::{enabled, Trick};

/// The daemon's program (and the name of its config, pid and log files).
pub(super) const LIBVIRTD: &str = "libvirtd";

/// The command that starts the libvirtd whose files are in `dir`, its configuration and pid
/// file arguments left to the caller.
pub(super) fn libvirtd_command(dir: &Path) -> Command {
    command_for(dir, enabled(Trick::LeanLibvirtd))
}

/// [`libvirtd_command`], lean or plain.
fn command_for(dir: &Path, lean: bool) -> Command {
    if !lean {
        return Command::new(LIBVIRTD);
    }
    let mut command = through_loader(&loader_link(dir), &no_ssh_crypto(dir));
    if driver_dir(dir).join(QEMU_DRIVER_MODULE).exists() {
        command.env("LIBVIRT_DRIVER_DIR", driver_dir(dir));
    }
    command
}

/// Puts what [`libvirtd_command`] starts libvirtd with in `dir` (its `bin` and `drivers`
/// subdirectories exist), anew at every start; the path that could not be made on error.
pub(super) fn prepare(dir: &Path) -> Result<(), (PathBuf, io::Error)> {
    if !enabled(Trick::LeanLibvirtd) {
        return Ok(());
    }
    // The QEMU driver alone, in a directory of its own (see `driver_dir`), and
    // the loader under libvirtd's name (see `through_loader`).
    let links = [
        (
            driver_dir(dir).join(QEMU_DRIVER_MODULE),
            installed_library(Path::new(DRIVER_SUBDIR).join(QEMU_DRIVER_MODULE)),
        ),
        (
            loader_link(dir),
            Path::new(LOADER).exists().then(|| PathBuf::from(LOADER)),
        ),
    ];
    for (link, target) in links {
        relink(&link, target.as_deref()).map_err(|e| (link.clone(), e))?;
    }
    // Replaced, never rewritten in place: a daemon this launcher adopts may have it mapped.
    // Only memory depends on it: where it cannot be written, libvirtd starts without it (the
    // loader says so in its log).
    let preload = no_ssh_crypto(dir);
    if fs::read(&preload).ok().as_deref() != Some(NO_SSH_CRYPTO) {
        if let Err(e) = crate::durable::write_atomically(&preload, NO_SSH_CRYPTO) {
            tracing::warn!(path = %preload.display(), error = %e, "cannot write libvirtd's preload");
        }
    }
    Ok(())
}

/// Where [`prepare`] puts the preload that keeps libvirtd from setting up OpenSSL
/// (`no_ssh_crypto.c`).
fn no_ssh_crypto(dir: &Path) -> PathBuf {
    dir.join("bin").join("no_ssh_crypto.so")
}

/// A link to the dynamic loader named like the daemon (`through_loader`).
fn loader_link(dir: &Path) -> PathBuf {
    dir.join("bin").join(LIBVIRTD)
}

/// Where libvirtd looks for its connection drivers (`LIBVIRT_DRIVER_DIR`): a link to the QEMU
/// driver's module alone. A monolithic libvirtd loads every driver module it finds (network,
/// nodedev, storage, secret, nwfilter, interface: each with its state, threads and, for
/// nodedev, a udev scan of the host) and skips any it does not find; the launcher uses only
/// the QEMU driver. Measured with the test guest: libvirtd RSS 31.3 MiB with every driver,
/// 27.8 MiB with this and two glibc malloc arenas. Where the module is not at a known place,
/// the directory stays empty of it and libvirtd is started without the setting (every
/// driver, as before).
fn driver_dir(dir: &Path) -> PathBuf {
    dir.join("drivers")
}

/// The module of libvirt's QEMU driver, in `DRIVER_SUBDIR` of a library directory.
const QEMU_DRIVER_MODULE: &str = "libvirt_driver_qemu.so";
const DRIVER_SUBDIR: &str = "libvirt/connection-driver";

/// libvirtd through the dynamic loader, with jemalloc as its allocator where
/// jemalloc is installed and with `no_ssh_crypto` preloaded (see `no_ssh_crypto.c`), or as it is
/// where the loader cannot do that.
///
/// libvirtd's start-up (QEMU's capabilities, the CPU map, the domain's XML) allocates a few MiB
/// in small pieces and frees most of them; glibc keeps what is freed below the pieces still live
/// and gives back only the top of a heap. Measured with the test guest and 16 disks: libvirtd's
/// second arena held 4.4 MiB of which 0.55 MiB was in use (`malloc_stats`), RSS 28.3 MiB. With
/// jemalloc (one arena, no thread caches, freed pages given back at once): RSS 24.9 MiB
/// (24.5–24.7 in the bench), anonymous 7.3 → 3.3 MiB. glibc's own knobs (one arena, no
/// fastbins or tcache, trim threshold 0) gave back 1 MiB. libvirtd waits on QEMU and its
/// client; it is not allocation-bound.
///
/// Preloaded by the dynamic loader's `--preload`, not by `LD_PRELOAD`: libvirt passes
/// `LD_PRELOAD` on to every QEMU it starts, and guests keep the allocator QEMU was built for.
/// So libvirtd's `/proc/PID/exe` is the loader; `process::runs_program` knows it by its arguments. The
/// loader is started through `loader_link`, a link to it named `libvirtd`, because a process's name
/// (what ps, top and `pgrep -x` show) is the file name it was started by; [`prepare`] makes the
/// link. The loader takes `--argv0` since glibc 2.33; with an older glibc, libvirtd starts as
/// it is.
fn through_loader(loader_link: &Path, no_ssh_crypto: &Path) -> Command {
    let libvirtd =
        program_in_path(LIBVIRTD).filter(|_| Path::new(LOADER).exists() && glibc_at_least(2, 33));
    let jemalloc = installed_library(JEMALLOC);
    let preload = preload_list(jemalloc.as_deref(), no_ssh_crypto);
    let (Some(libvirtd), Some(preload)) = (libvirtd, preload) else {
        return glibc_libvirtd();
    };
    let mut command = Command::new(loader_link);
    command
        .arg("--preload")
        .arg(preload)
        .args(["--argv0", LIBVIRTD])
        .arg(libvirtd);
    match jemalloc {
        Some(_) => command.env(
            "MALLOC_CONF",
            "narenas:1,tcache:false,dirty_decay_ms:0,muzzy_decay_ms:0",
        ),
        None => on_glibc_malloc(&mut command),
    };
    command
}

/// libvirtd started as it is, on glibc's malloc.
fn glibc_libvirtd() -> Command {
    let mut command = Command::new(LIBVIRTD);
    on_glibc_malloc(&mut command);
    command
}

/// glibc's default of up to 8 arenas per core, one per thread that allocates, keeps freed
/// memory in each: two are plenty for a daemon that serves one launcher.
fn on_glibc_malloc(command: &mut Command) -> &mut Command {
    command.env("MALLOC_ARENA_MAX", "2")
}

/// The loader's `--preload` list: jemalloc where it is installed, and `no_ssh_crypto` unless its
/// path holds a space or a colon (the list's separators); `None` when that leaves nothing. (On a
/// runtime dir mounted `noexec` the loader cannot map `no_ssh_crypto`: it says so in libvirtd's
/// log and goes on without it.)
fn preload_list(jemalloc: Option<&Path>, no_ssh_crypto: &Path) -> Option<std::ffi::OsString> {
    let separable = |path: &Path| {
        !path
            .as_os_str()
            .as_bytes()
            .iter()
            .any(|b| *b == b' ' || *b == b':')
    };
    let objects: Vec<&Path> = jemalloc
        .into_iter()
        .chain(Some(no_ssh_crypto).filter(|p| separable(p)))
        .collect();
    if objects.is_empty() {
        return None;
    }
    Some(std::ffi::OsString::from_vec(
        objects
            .iter()
            .map(|p| p.as_os_str().as_bytes())
            .collect::<Vec<_>>()
            .join(&b':'),
    ))
}

/// The preload [`prepare`] writes into the daemon's directory: `no_ssh_crypto.c`, built by
/// `build.rs`.
const NO_SSH_CRYPTO: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/no_ssh_crypto.so"));

/// The running glibc (the launcher's, which is libvirtd's) is `major.minor` or later.
fn glibc_at_least(major: u32, minor: u32) -> bool {
    // SAFETY: gnu_get_libc_version returns a static NUL-terminated string such as "2.36".
    let version = unsafe { std::ffi::CStr::from_ptr(libc::gnu_get_libc_version()) };
    let mut parts = version
        .to_str()
        .unwrap_or("")
        .split('.')
        .map(|n| n.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (major, minor)
}

/// `link` made anew: a symbolic link to `target`, or nothing where there is no target.
fn relink(link: &Path, target: Option<&Path>) -> io::Result<()> {
    crate::durable::remove_if_present(link)?;
    match target {
        Some(target) => std::os::unix::fs::symlink(target, link),
        None => Ok(()),
    }
}

/// jemalloc's library (Debian's `libjemalloc2`).
const JEMALLOC: &str = "libjemalloc.so.2";

/// `relative` in the first of the library directories distributions use that has it.
fn installed_library(relative: impl AsRef<Path>) -> Option<PathBuf> {
    LIBRARY_DIRS
        .iter()
        .map(|dir| Path::new(dir).join(relative.as_ref()))
        .find(|path| path.exists())
}

const LIBRARY_DIRS: [&str; 4] = [
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_is_libvirtd_as_it_is_and_lean_goes_through_the_loader() {
        let dir = tempfile::tempdir().unwrap();
        let plain = command_for(dir.path(), false);
        assert_eq!(plain.get_program(), LIBVIRTD);
        assert_eq!(plain.get_args().count(), 0);
        assert_eq!(plain.get_envs().count(), 0);
        std::fs::create_dir_all(driver_dir(dir.path())).unwrap();
        std::fs::create_dir_all(dir.path().join("bin")).unwrap();
        prepare(dir.path()).unwrap();
        let lean = command_for(dir.path(), true);
        let args: Vec<_> = lean.get_args().collect();
        // This project's hosts have the loader, glibc >= 2.33 and libvirtd in PATH (setup.sh).
        assert_eq!(lean.get_program(), loader_link(dir.path()));
        assert_eq!(args[0], "--preload", "{args:?}");
        assert!(lean.get_envs().any(|(k, _)| k == "LIBVIRT_DRIVER_DIR"));
    }

    #[test]
    fn the_preload_list_joins_what_the_loader_can_separate() {
        let jemalloc = Path::new("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2");
        let cases: [(Option<&Path>, &str, Option<&str>); 5] = [
            (
                Some(jemalloc),
                "/run/vm/libvirt/bin/no_ssh_crypto.so",
                Some("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2:/run/vm/libvirt/bin/no_ssh_crypto.so"),
            ),
            (None, "/run/vm/bin/no_ssh_crypto.so", Some("/run/vm/bin/no_ssh_crypto.so")),
            (
                Some(jemalloc),
                "/run/my vm/bin/no_ssh_crypto.so",
                Some("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"),
            ),
            (None, "/run/a:b/bin/no_ssh_crypto.so", None),
            (None, "/run/my vm/bin/no_ssh_crypto.so", None),
        ];
        for (jemalloc, shim, expected) in cases {
            assert_eq!(
                preload_list(jemalloc, Path::new(shim)),
                expected.map(std::ffi::OsString::from),
                "{jemalloc:?} + {shim}"
            );
        }
    }

    #[test]
    fn the_embedded_preload_is_a_shared_object() {
        assert_eq!(&NO_SSH_CRYPTO[..4], b"\x7fELF");
        // ET_DYN: a shared object the loader can preload.
        assert_eq!(
            u16::from_le_bytes([NO_SSH_CRYPTO[16], NO_SSH_CRYPTO[17]]),
            3
        );
    }
}
