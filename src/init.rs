//! PID 1 duty. As a container's entrypoint the launcher is PID 1: every orphan (QEMU, once libvirt
//! has daemonised it) becomes its child, and must be reaped or it stays a zombie. Reaping with
//! `waitpid(-1)` inside the launcher would race with the launcher's own waits on the children it
//! spawns (the private daemons, the ISO builder). So, like `tini`, PID 1 forks first: the child is
//! the launcher; PID 1 only forwards termination signals to it, reaps whatever dies, and exits with
//! the launcher's status.

use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};

/// The signals PID 1 passes on to the launcher.
const FORWARDED: [Signal; 4] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
];

/// If this process is PID 1, forks: returns in the child (the launcher proper) and never returns
/// in the parent, which reaps and forwards until the launcher exits. Must run before any thread
/// is started (fork in a multi-threaded process only copies the calling thread).
pub fn become_init_if_pid1() {
    if std::process::id() != 1 {
        return;
    }
    let mut signals = SigSet::empty();
    for s in FORWARDED {
        signals.add(s);
    }
    signals.add(Signal::SIGCHLD);
    // Blocked before the fork so that no signal is lost in between; the child unblocks them.
    if let Err(e) = signals.thread_block() {
        eprintln!("vmlauncher: cannot block signals as PID 1: {e}; orphans will not be reaped");
        return;
    }
    // SAFETY: no other thread exists (main calls this before it starts any, and the argument
    // parser's thread has been joined), so the child is a complete copy of the process.
    match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            let _ = signals.thread_unblock();
        }
        Ok(ForkResult::Parent { child }) => std::process::exit(supervise(child, &signals)),
        Err(e) => {
            let _ = signals.thread_unblock();
            eprintln!("vmlauncher: cannot fork as PID 1: {e}; orphans will not be reaped");
        }
    }
}

/// PID 1's loop: forward termination signals, reap every zombie, exit like the launcher did.
fn supervise(launcher: Pid, signals: &SigSet) -> i32 {
    loop {
        match signals.wait() {
            Ok(Signal::SIGCHLD) => loop {
                match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                    Ok(WaitStatus::Exited(pid, code)) if pid == launcher => return code,
                    Ok(WaitStatus::Signaled(pid, signal, _)) if pid == launcher => {
                        return killed_by(signal)
                    }
                    Ok(WaitStatus::StillAlive) | Err(_) => break,
                    Ok(_) => {}
                }
            },
            Ok(signal) => {
                let _ = kill(launcher, signal);
            }
            Err(_) => {}
        }
    }
}

/// This launcher is its PID namespace's init (PID 1, or the child PID 1 forked above): the
/// entrypoint of a container, which owns the container's mount namespace too.
pub fn is_container_entrypoint() -> bool {
    if std::process::id() == 1 {
        return true;
    }
    let exe = |pid: &str| std::fs::read_link(format!("/proc/{pid}/exe")).ok();
    nix::unistd::getppid().as_raw() == 1 && exe("1").is_some() && exe("1") == exe("self")
}

/// The exit status PID 1 (`init`) gives for a launcher killed by `signal`: 128 + its number, as
/// a shell reports a killed command, so that 137 reads as SIGKILL (e.g. the OOM killer).
pub(crate) fn killed_by(signal: nix::sys::signal::Signal) -> i32 {
    128 + signal as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_killed_launcher_exits_as_a_shell_reports_it() {
        assert_eq!(killed_by(Signal::SIGKILL), 137);
        assert_eq!(killed_by(Signal::SIGTERM), 143);
        assert_eq!(killed_by(Signal::SIGSEGV), 139);
    }
}
