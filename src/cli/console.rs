//! `vmlauncher console`: the guest's serial console on this terminal, as `virsh console` and
//! `virtctl console` give it: keys go to the guest as typed (the terminal in raw mode), the
//! guest's bytes come back, and Ctrl-] leaves without touching the VM. QEMU serves one client
//! at a time; the log (`status`'s console line) is there for everyone.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use nix::sys::termios::{self, SetArg, Termios};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::client::{answer, connect};
use super::exit::MainError;
use super::Outcome;
use vmlauncher::api::proto;
use vmlauncher::ended::Ended;

/// Ctrl-]: what `telnet`, `virsh console` and `virtctl console` leave by.
const DETACH: u8 = 0x1d;

pub(crate) async fn console(socket: &Path) -> Outcome {
    let mut client = connect(socket).await?;
    let status = answer(client.get_status(proto::GetStatusRequest {}).await)?;
    let serial = status
        .consoles
        .map(|c| c.serial_socket)
        .filter(|s| !s.is_empty())
        .ok_or(MainError::NoSerialConsole)?;
    let serial = PathBuf::from(serial);
    let stream = tokio::net::UnixStream::connect(&serial)
        .await
        .map_err(|source| MainError::SerialConsole {
            path: serial.clone(),
            source,
        })?;
    let _raw = RawTerminal::enter();
    eprint!(
        "connected to the serial console of {} (Ctrl-] leaves)\r\n",
        status.domain_name
    );
    let (mut from_guest, mut to_guest) = stream.into_split();
    let guest_to_terminal = async {
        let mut out = tokio::io::stdout();
        let mut buf = [0u8; 4096];
        loop {
            match from_guest.read(&mut buf).await {
                Ok(0) | Err(_) => return "the console closed (the VM stopped)",
                Ok(n) => {
                    if out.write_all(&buf[..n]).await.is_err() || out.flush().await.is_err() {
                        return "the terminal closed";
                    }
                }
            }
        }
    };
    let mut keys_typed = read_stdin();
    let terminal_to_guest = async {
        loop {
            match keys_typed.recv().await {
                None => return "end of input",
                Some(typed) => {
                    let (keys, detached) = match typed.iter().position(|&b| b == DETACH) {
                        Some(at) => (&typed[..at], true),
                        None => (&typed[..], false),
                    };
                    if to_guest.write_all(keys).await.is_err() {
                        return "the console closed (the VM stopped)";
                    }
                    if detached {
                        return "detached";
                    }
                }
            }
        }
    };
    let why = tokio::select! {
        why = guest_to_terminal => why,
        why = terminal_to_guest => why,
    };
    eprint!("\r\n{why}\r\n");
    Ok(Ended::Done)
}

/// stdin's bytes as they come, read on a thread of its own: a read that waits for a key cannot
/// be cancelled, and one on tokio's blocking pool would hold the runtime's shutdown until the
/// next key after the console closed. The thread ends with the process.
fn read_stdin() -> tokio::sync::mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = [0u8; 1024];
        loop {
            match std::io::Read::read(&mut stdin, &mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if tx.blocking_send(buf[..n].to_vec()).is_err() {
                        return;
                    }
                }
            }
        }
    });
    rx
}

/// The terminal in raw mode while attached (each key as typed, Ctrl-C to the guest, no local
/// echo: the guest echoes), restored when dropped. Nothing to do when stdin is not a terminal.
struct RawTerminal(Option<Termios>);

impl RawTerminal {
    fn enter() -> RawTerminal {
        let stdin = std::io::stdin();
        let Ok(saved) = termios::tcgetattr(stdin.as_fd()) else {
            return RawTerminal(None);
        };
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        match termios::tcsetattr(stdin.as_fd(), SetArg::TCSANOW, &raw) {
            Ok(()) => RawTerminal(Some(saved)),
            Err(_) => RawTerminal(None),
        }
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            let _ = termios::tcsetattr(std::io::stdin().as_fd(), SetArg::TCSANOW, saved);
        }
    }
}
