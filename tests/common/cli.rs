//! The `vmlauncher` binary as a client runs it.

use std::path::Path;
use std::process::Command;

/// This build's binary, or the one `VMLAUNCHER_BENCH_BIN` names (the side-by-side bench's
/// `--plain VALUE@BINARY`: another build's binary beside this one's, in one run).
pub fn bin() -> String {
    std::env::var("VMLAUNCHER_BENCH_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_vmlauncher").to_owned())
}

/// The lines of `out` (a child's output), read by a thread of its own until the output ends or
/// the receiver goes away.
pub fn lines_of(out: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
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

/// Follows `vmlauncher events --output json` through `socket` until a status (the first event
/// is the whole current one, so nothing before the call is missed) that `done` accepts: that
/// status, as `status --output json` shows it. Panics naming `what` after `within`.
pub fn cli_wait_status(
    socket: &Path,
    what: &str,
    within: std::time::Duration,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = std::time::Instant::now() + within;
    let mut follower = Command::new(bin())
        .args(["events", "--output", "json", "--socket"])
        .arg(socket)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let rx = lines_of(follower.stdout.take().unwrap());
    let mut last = serde_json::Value::Null;
    let found = loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let Ok(line) = rx.recv_timeout(left) else {
            break None;
        };
        let event: serde_json::Value = serde_json::from_str(&line).unwrap();
        let status = match event["type"].as_str() {
            Some(kind @ ("resync" | "status")) => event[kind].clone(),
            _ => continue,
        };
        if done(&status) {
            break Some(status);
        }
        last = status;
    };
    let _ = follower.kill();
    let _ = follower.wait();
    found.unwrap_or_else(|| panic!("{what}: not within {within:?}; last status {last}"))
}
