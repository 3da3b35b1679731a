//! The binary's front end, apart from `main`: argument parsing, the client verbs, their output,
//! and the spec editing of `addvolume`/`removevolume`.

pub(crate) mod args;
pub(crate) mod client;
pub(crate) mod output;
pub(crate) mod spec_edit;

/// `println!` for what a verb prints: a reader that has gone (`vmlauncher status | head -1`)
/// ends the verb quietly, as it ends `cat` or `grep`, where std's `println!` panics.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cli::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}
pub(crate) use outln;

/// `print!` for what a verb prints (see [`outln`]).
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cli::write_stdout(format_args!($($arg)*))
    };
}
pub(crate) use out;

pub(crate) fn write_stdout(text: std::fmt::Arguments) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_fmt(text).and_then(|()| stdout.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("vmlauncher: cannot write to stdout: {e}");
        std::process::exit(vmlauncher::exit::ExitCode::Internal as i32);
    }
}
