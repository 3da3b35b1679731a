//! The `vmlauncher` binary as a client runs it.

use std::path::Path;
use std::process::Command;

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_vmlauncher")
}

/// `vmlauncher status --output json` through `socket`, as a client sees it.
pub fn cli_status(socket: &Path) -> serde_json::Value {
    let out = cli_ok(socket, &["status", "--output", "json"]);
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `vmlauncher ARGS --socket SOCKET`, which must succeed: its output.
pub fn cli_ok(socket: &Path, args: &[&str]) -> std::process::Output {
    let out = Command::new(bin())
        .args(args)
        .arg("--socket")
        .arg(socket)
        .output()
        .unwrap();
    succeeded(out, format_args!("vmlauncher {args:?}"))
}

/// The output `out` of the command `what`, which must have succeeded; else a panic that shows
/// what it printed (a tool like `virt-xml-validate` gives its verdict on stdout).
pub fn succeeded(out: std::process::Output, what: impl std::fmt::Display) -> std::process::Output {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `vmlauncher sync` of the spec `text` (written to `dir/sync.yaml`) through `socket`, which must
/// succeed: its JSON reply.
pub fn cli_sync(socket: &Path, dir: &Path, text: &str) -> serde_json::Value {
    let file = dir.join("sync.yaml");
    std::fs::write(&file, text).unwrap();
    let out = cli_ok(
        socket,
        &["sync", file.to_str().unwrap(), "--output", "json"],
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `vmlauncher sync` of the spec `text` (written to `dir/refused.yaml`) through `socket`,
/// whatever it answers: its exit code and stderr.
pub fn cli_sync_refused(socket: &Path, dir: &Path, text: &str) -> (Option<i32>, String) {
    let file = dir.join("refused.yaml");
    std::fs::write(&file, text).unwrap();
    let out = Command::new(bin())
        .args(["sync", file.to_str().unwrap(), "--socket"])
        .arg(socket)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
