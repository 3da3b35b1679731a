//! Acting as an escaped guest would: a process with QEMU's credentials, its uid and its gid (a
//! host run's QEMU has an id of its own and no supplementary groups), no capabilities, as the
//! security review did with `setpriv`.

use std::path::Path;
use std::process::Command;

/// `program args...` to run as QEMU's `uid` (and gid `uid`).
pub fn qemu_command(uid: u32) -> Command {
    let mut c = Command::new("setpriv");
    c.args([
        &format!("--reuid={uid}"),
        &format!("--regid={uid}"),
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--",
    ]);
    c
}

/// Whether `args... path` succeeds as QEMU's `uid`.
pub fn as_qemu(uid: u32, args: &[&str], path: &Path) -> bool {
    qemu_command(uid)
        .args(args)
        .arg(path)
        .status()
        .expect("setpriv")
        .success()
}

/// The id a launcher's QEMU runs as, from its runtime dir's record (`host::qemu_ids`).
pub fn qemu_id_of(runtime_dir: &Path) -> u32 {
    std::fs::read_to_string(runtime_dir.join("qemu-id"))
        .expect("a host run records its QEMU id")
        .trim()
        .parse()
        .expect("a uid")
}
