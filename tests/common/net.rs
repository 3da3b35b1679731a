//! Both ends of a test's HTTP traffic with the test guest: a GET to the guest's server, and a
//! one-request server for the guest to fetch from.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::time::Duration;

/// A port nobody listens on right now, on the host's loopback, and not handed to another test
/// of this process (they run side by side; a port is free only until its test binds it).
pub fn free_port() -> u16 {
    free_ports(1)
}

/// The first of `n` consecutive ports nobody listens on right now, on the host's loopback (a
/// migration target on TCP takes four), none of them handed to another test of this process.
pub fn free_ports(n: u16) -> u16 {
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    loop {
        let first = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if first > u16::MAX - n {
            continue;
        }
        let range = first..first + n;
        let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
        if range.clone().any(|p| handed_out.contains(&p)) {
            continue;
        }
        let held: Vec<_> = range
            .clone()
            .map_while(|p| TcpListener::bind(("127.0.0.1", p)).ok())
            .collect();
        if held.len() == usize::from(n) {
            handed_out.extend(range);
            return first;
        }
    }
}

/// A `--tls-dir` in `dir`, made by the script the README names, for a target dialled at
/// 127.0.0.1.
pub fn migration_credentials(dir: &std::path::Path) -> std::path::PathBuf {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/migration-tls.sh");
    let out = std::process::Command::new(script)
        .arg(dir)
        .arg("127.0.0.1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir.into()
}

/// One HTTP/1.0 GET; the whole answer.
pub fn http_get(to: SocketAddr, path: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(to)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: vmltest\r\n\r\n")?;
    stream.shutdown(Shutdown::Write)?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}

/// What the host server got: from whom, and the request line.
pub struct Request {
    pub peer: SocketAddr,
    pub line: String,
}

/// A one-request HTTP server on `address` (any port) that answers `body` and reports the
/// request it got.
pub fn host_server(address: IpAddr, body: String) -> (u16, mpsc::Receiver<Request>) {
    let listener = TcpListener::bind((address, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let (mut stream, peer) = listener.accept().unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        // Read the headers to their end before answering.
        let mut header = String::new();
        while reader.read_line(&mut header).unwrap_or(0) > 2 {
            header.clear();
        }
        let _ = write!(
            stream,
            "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let line = line.trim_end().to_string();
        let _ = tx.send(Request { peer, line });
    });
    (port, rx)
}
