//! The binary's front end, apart from `main`: argument parsing, the client verbs, their output,
//! and the spec editing of `addvolume`/`removevolume`.

pub(crate) mod args;
pub(crate) mod client;
pub(crate) mod migrate;
pub(crate) mod output;
pub(crate) mod spec_edit;

use vmlauncher::exit::ExitCode;

/// How a verb ends: `Ok` with the code the verb ran to (which may tell of a failure it printed,
/// such as a Failed volume, or of how a VM ended), or `Err` with the code of a step that failed,
/// its message already on stderr, so that each step can end the verb with `?`. Both are the
/// process's exit code.
pub(crate) type Outcome = Result<ExitCode, ExitCode>;

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

/// Set once stdout's reader has gone: nothing more is written.
static STDOUT_GONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Writes `text` and flushes it; `false` once stdout's reader has gone (so that `events` stops
/// reading its stream for nobody). Any other failure to write (a full disk under `> file`) ends
/// the process with a message and `Internal`.
pub(crate) fn write_stdout(text: std::fmt::Arguments) -> bool {
    use std::io::Write;
    use std::sync::atomic::Ordering;
    if STDOUT_GONE.load(Ordering::Relaxed) {
        return false;
    }
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_fmt(text).and_then(|()| stdout.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            STDOUT_GONE.store(true, Ordering::Relaxed);
            return false;
        }
        eprintln!("vmlauncher: cannot write to stdout: {e}");
        std::process::exit(ExitCode::Internal as i32);
    }
    true
}
