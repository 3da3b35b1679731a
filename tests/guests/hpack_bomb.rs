//! An HPACK bomb on the API socket: 1 MiB of one header block that fills the client's table with
//! a 4 KiB entry and then refers to it about a million times, 4 GiB once decoded. The launcher
//! must close that connection and nothing else: its peak RSS stays under 256 MiB, it goes on
//! answering, and the guest goes on running. The peak is printed with `--nocapture`. On the
//! shared guest: the bomb is this test's own connection, and the others' go on, as they must.

use crate::common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

use common::shared_guest::shared_guest;
use common::{alive, GUEST_DEADLINE};
use vmlauncher::api;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

fn frame(out: &mut Vec<u8>, frame_type: u8, flags: u8, stream: u32, payload: &[u8]) {
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    out.extend_from_slice(&[frame_type, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// The client's bytes: the preface, an empty SETTINGS, then one header block in 16 KiB
/// HEADERS/CONTINUATION frames: `a: v×4063` with incremental indexing (the whole 4 KiB table),
/// then index 62 (that entry) to 1 MiB.
fn bomb() -> Vec<u8> {
    // The value's length, 4063, as an HPACK integer: 127 + 96 + 30 × 128.
    let mut block = vec![0x40, 0x01, b'a', 0x7f, 0x80 | 96, 30];
    block.extend_from_slice(&[b'v'; 4063]);
    block.resize((1 << 20) - 4069, 0xbe);
    let mut out = PREFACE.to_vec();
    frame(&mut out, 0x4, 0, 0, &[]);
    let frames: Vec<&[u8]> = block.chunks(16_384).collect();
    for (i, chunk) in frames.iter().enumerate() {
        let frame_type = if i == 0 { 0x1 } else { 0x9 };
        let flags = if i + 1 == frames.len() { 0x4 } else { 0 };
        frame(&mut out, frame_type, flags, 1, chunk);
    }
    out
}

/// The launcher's peak resident set (`VmHWM`), in KiB.
fn peak_rss_kib(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_hpack_bomb_closes_its_connection_and_nothing_else() {
    let vm = shared_guest();
    let launcher = vm.launcher_pid();
    let qemu = vm.qemu_pid();

    let mut socket = UnixStream::connect(vm.socket()).unwrap();
    // A deadline for a launcher that never closes the connection, not a wait.
    socket.set_read_timeout(Some(GUEST_DEADLINE)).unwrap();
    let mut writer = socket.try_clone().unwrap();
    // The launcher closes the connection long before it has read it all: the write then fails.
    let sent = std::thread::spawn(move || writer.write_all(&bomb()).is_ok());
    // The server's SETTINGS and whatever else it wrote, then the end of the connection.
    let mut from_server = Vec::new();
    match socket.read_to_end(&mut from_server) {
        Ok(_) => {}
        Err(e) => assert_eq!(
            e.kind(),
            std::io::ErrorKind::ConnectionReset,
            "the connection must end, not time out: {e}"
        ),
    }
    assert!(!sent.join().unwrap(), "the launcher read the whole bomb");

    let peak = peak_rss_kib(launcher);
    println!("the launcher's peak RSS: {peak} KiB");
    assert!(peak < 256 * 1024, "the launcher's RSS peaked at {peak} KiB");
    let mut client = api::connect(&vm.socket()).await.expect("a new connection");
    assert_eq!(common::status(&mut client).await.phase, "Running");
    assert!(alive(qemu), "the guest's QEMU is gone");
    assert!(
        vm.stderr_text().contains("closing an API connection"),
        "no warning in the launcher's log: {}",
        vm.stderr_text()
    );
}
