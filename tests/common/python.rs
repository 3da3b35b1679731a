//! The stock Python gRPC client (`tests/python/launcher_client.py`) in the venv
//! `scripts/setup.sh` makes with PyPI's grpcio.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The venv `scripts/setup.sh` makes with the PyPI packages.
pub fn python() -> PathBuf {
    let python = std::env::var_os("VMLAUNCHER_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/vmlauncher/python/bin/python3"));
    assert!(
        python.exists(),
        "no Python venv at {} — run scripts/setup.sh first",
        python.display()
    );
    python
}

/// The client, a daemon-side example as much as a test tool.
pub fn client_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/launcher_client.py")
}

/// Runs the client; its one JSON line, or a panic with its stderr.
pub fn python_client(args: &[&str]) -> serde_json::Value {
    let out = Command::new(python())
        .arg(client_script())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run the Python client");
    let out = super::succeeded(out, format_args!("python client {args:?} failed"));
    serde_json::from_slice(&out.stdout).expect("one JSON line")
}
