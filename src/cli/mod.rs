//! The binary's front end, apart from `main`: argument parsing, the client verbs, their output,
//! and the spec editing of `addvolume`/`removevolume`.

pub(crate) mod args;
pub(crate) mod client;
pub(crate) mod console;
pub(crate) mod exit;
pub(crate) mod migrate;
pub(crate) mod output;
pub(crate) mod spec_edit;

use exit::MainError;
use vmlauncher::ended::Ended;

/// How a verb ends: how it ran to its end, or why it failed; `main` says the failure and picks
/// the exit code (`exit`).
pub(crate) type Outcome = Result<Ended, MainError>;

/// `println!` for what a verb prints: a reader that has gone (`vmlauncher status | head -1`)
/// silences the rest of the output, where std's `println!` panics; the verb still ends with its
/// own exit code (a Sync whose volume failed says so under `set -o pipefail`).
macro_rules! outln {
    ($($arg:tt)*) => {{
        $crate::cli::write_stdout(format_args!("{}\n", format_args!($($arg)*)));
    }};
}
pub(crate) use outln;

/// `print!` for what a verb prints (see [`outln`]).
macro_rules! out {
    ($($arg:tt)*) => {{
        $crate::cli::write_stdout(format_args!($($arg)*));
    }};
}
pub(crate) use out;

/// Set once nothing more is written to stdout: its reader has gone, or writing failed.
static STDOUT_GONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// Why writing to stdout failed, other than its reader going: what `main` ends the verb with.
static STDOUT_FAILED: std::sync::Mutex<Option<std::io::Error>> = std::sync::Mutex::new(None);

/// Writes `text` and flushes it; `false` once nothing more is written (so that `events` stops
/// reading its stream for nobody). A failure other than a reader that has gone (a full disk
/// under `> file`) is kept for [`stdout_failure`]: the verb's output is cut there, and it ends as
/// that failure.
pub(crate) fn write_stdout(text: std::fmt::Arguments) -> bool {
    use std::io::Write;
    use std::sync::atomic::Ordering;
    if STDOUT_GONE.load(Ordering::Relaxed) {
        return false;
    }
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_fmt(text).and_then(|()| stdout.flush()) {
        STDOUT_GONE.store(true, Ordering::Relaxed);
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            *STDOUT_FAILED.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
        }
        return false;
    }
    true
}

/// The failure that cut a verb's output short, if one did: it outranks how the verb ended,
/// since what it printed is incomplete.
pub(crate) fn stdout_failure() -> Option<MainError> {
    let failed = STDOUT_FAILED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    failed.map(MainError::Stdout)
}
