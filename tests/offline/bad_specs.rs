//! The bad-input corpus (`tests/data/bad-specs/`, written by its `generate.py`): every broken,
//! hostile or oversized spec makes `vmlauncher validate` exit 2 with its own error, naming the
//! field — within a memory limit (an address-space rlimit) and a deadline, so an alias bomb or a
//! quadratic path fails the test instead of the machine. The same corpus is sent to `Sync` on a
//! running VM by `tests/guests/bad_syncs.rs`.

use crate::common;

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Far above what a valid spec needs, far below what an alias bomb would take.
const MEMORY_LIMIT: u64 = 1 << 30;
/// Per spec; a valid one validates in well under a second even in a debug build.
const DEADLINE: Duration = Duration::from_secs(30);

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/bad-specs")
}

/// `(file, the text stderr must contain)` from the corpus's EXPECTED table.
fn corpus() -> Vec<(String, String)> {
    let table = std::fs::read_to_string(corpus_dir().join("EXPECTED")).expect("EXPECTED");
    table
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (file, expect) = l.split_once('\t').expect("file<TAB>expected");
            (file.to_string(), expect.to_string())
        })
        .collect()
}

/// Runs `vmlauncher validate FILE` under the memory limit; `(exit code, stderr)`, or a panic at
/// the deadline.
fn validate(file: &Path) -> (Option<i32>, String) {
    let mut command = Command::new(common::bin());
    command
        .arg("validate")
        .arg(file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: between fork and exec the closure only calls setrlimit(2), which is
    // async-signal-safe, and allocates nothing.
    unsafe {
        command.pre_exec(|| {
            nix::sys::resource::setrlimit(
                nix::sys::resource::Resource::RLIMIT_AS,
                MEMORY_LIMIT,
                MEMORY_LIMIT,
            )
            .map_err(std::io::Error::from)
        });
    }
    let mut child = command.spawn().expect("spawn vmlauncher");
    let mut stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        let _ = tx.send(text);
    });
    match rx.recv_timeout(DEADLINE) {
        Ok(text) => (child.wait().unwrap().code(), text),
        Err(_) => {
            let _ = child.kill();
            panic!("{}: no verdict within {DEADLINE:?}", file.display());
        }
    }
}

#[test]
fn the_corpus_is_large_enough_and_every_file_has_an_expectation() {
    let cases = corpus();
    assert!(cases.len() >= 60, "only {} bad specs", cases.len());
    let mut files: Vec<String> = std::fs::read_dir(corpus_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|f| f != "EXPECTED" && f != "generate.py")
        .collect();
    files.sort();
    let mut listed: Vec<String> = cases.into_iter().map(|(f, _)| f).collect();
    listed.sort();
    assert_eq!(files, listed, "corpus files and EXPECTED disagree");
}

#[test]
fn every_bad_spec_is_refused_with_its_own_error() {
    let mut failures = Vec::new();
    for (file, expect) in corpus() {
        let path = corpus_dir().join(&file);
        let (code, stderr) = validate(&path);
        // The CLI prefixes the file name; the expectation is about what follows it.
        let message = stderr.replace(&path.display().to_string(), "FILE");
        if code != Some(2) || !message.contains(&expect) {
            failures.push(format!(
                "{file}: exit {code:?}, want 2 and {expect:?}; stderr:\n{}",
                message.chars().take(600).collect::<String>()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of the corpus not refused as expected:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
