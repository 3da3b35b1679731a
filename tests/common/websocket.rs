//! A websocket to virt-handler's console server, as virt-api opens it for `virtctl console` and
//! `vnc`: TLS with virt-api's client certificate (`openssl s_client` carries the bytes), the
//! upgrade with KubeVirt's subprotocol `plain.kubevirt.io`, binary frames both ways (RFC 6455,
//! masked from the client). Only what these tests need: no fragmentation, no ping.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub struct WebSocket {
    tls: Child,
    to_server: ChildStdin,
    from_server: mpsc::Receiver<Vec<u8>>,
    /// Bytes read and not yet parsed into a frame.
    pending: Vec<u8>,
}

impl WebSocket {
    /// Opens `path` on `host:port` with the client certificate; panics with the server's answer
    /// when it does not upgrade.
    pub fn open(host_port: &str, path: &str, cert: &Path, key: &Path) -> WebSocket {
        let mut tls = Command::new("openssl")
            .args(["s_client", "-quiet", "-ign_eof", "-connect", host_port])
            .arg("-cert")
            .arg(cert)
            .arg("-key")
            .arg(key)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("openssl s_client");
        let mut to_server = tls.stdin.take().unwrap();
        let mut out = tls.stdout.take().unwrap();
        let (tx, from_server) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = out.read(&mut buf) {
                if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                    return;
                }
            }
        });
        write!(
            to_server,
            "GET {path} HTTP/1.1\r\nHost: {host_port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dm1sYXVuY2hlci10ZXN0cw==\r\nSec-WebSocket-Version: 13\r\n\
             Sec-WebSocket-Protocol: plain.kubevirt.io\r\n\r\n"
        )
        .unwrap();
        to_server.flush().unwrap();
        let mut ws = WebSocket {
            tls,
            to_server,
            from_server,
            pending: Vec::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        let end = loop {
            if let Some(at) = ws.pending.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            assert!(ws.more(deadline), "no answer to the upgrade of {path}");
        };
        let head = String::from_utf8_lossy(&ws.pending[..end]).to_string();
        assert!(head.starts_with("HTTP/1.1 101"), "{path}: {head}");
        ws.pending.drain(..end);
        ws
    }

    fn more(&mut self, deadline: Instant) -> bool {
        match self
            .from_server
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            Ok(bytes) => {
                self.pending.extend(bytes);
                true
            }
            Err(_) => false,
        }
    }

    /// One binary frame, masked as a client must.
    pub fn send(&mut self, payload: &[u8]) {
        assert!(payload.len() < 126, "short frames only");
        let mask = [0x76, 0x6d, 0x6c, 0x21];
        let mut frame = vec![0x82, 0x80 | payload.len() as u8];
        frame.extend(mask);
        frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.to_server.write_all(&frame).unwrap();
        self.to_server.flush().unwrap();
    }

    /// Closes as a client should (a close frame, status 1000), and waits for the server's own.
    pub fn close(mut self) {
        let mask = [0x76, 0x6d, 0x6c, 0x21];
        let status = 1000u16.to_be_bytes();
        let frame = [
            0x88,
            0x82,
            mask[0],
            mask[1],
            mask[2],
            mask[3],
            status[0] ^ mask[0],
            status[1] ^ mask[1],
        ];
        self.to_server.write_all(&frame).unwrap();
        self.to_server.flush().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.recv(deadline).is_some() {}
    }

    /// The next frame's payload, or `None` when none came by `deadline` (or the server closed).
    pub fn recv(&mut self, deadline: Instant) -> Option<Vec<u8>> {
        loop {
            if let Some((header, len)) = frame_size(&self.pending) {
                if self.pending.len() >= header + len {
                    let opcode = self.pending[0] & 0x0f;
                    let payload = self.pending[header..header + len].to_vec();
                    self.pending.drain(..header + len);
                    if opcode == 0x8 {
                        return None;
                    }
                    return Some(payload);
                }
            }
            if !self.more(deadline) {
                return None;
            }
        }
    }

    /// Reads frames until their text, joined, contains `needle`; what was read, or a panic.
    pub fn read_until(&mut self, needle: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        let mut text = String::new();
        while !text.contains(needle) {
            match self.recv(deadline) {
                Some(payload) => text.push_str(&String::from_utf8_lossy(&payload)),
                None => panic!("no {needle:?} within {within:?}; read:\n{text}"),
            }
        }
        text
    }
}

/// The header's length and the payload's, once the header is all there (server frames are not
/// masked).
fn frame_size(bytes: &[u8]) -> Option<(usize, usize)> {
    let short = *bytes.get(1)? & 0x7f;
    match short {
        126 => Some((
            4,
            u16::from_be_bytes(bytes.get(2..4)?.try_into().ok()?) as usize,
        )),
        127 => Some((
            10,
            u64::from_be_bytes(bytes.get(2..10)?.try_into().ok()?) as usize,
        )),
        n => Some((2, n as usize)),
    }
}

impl Drop for WebSocket {
    fn drop(&mut self) {
        let _ = self.tls.kill();
        let _ = self.tls.wait();
    }
}
