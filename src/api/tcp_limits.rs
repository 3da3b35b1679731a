//! The TCP API's listener, bounded: a port anyone on the network may reach must not let one
//! peer, or all of them, take the launcher's descriptors (security review N-4). At most
//! [`PER_PEER`] connections from one address and [`TOTAL`] in all are held; one over either is
//! closed as soon as it is accepted, before its TLS handshake (which has its own deadline,
//! `tcp::HANDSHAKE_TIMEOUT`). An accept that fails for want of descriptors or memory backs off
//! (up to [`MAX_BACKOFF`]) instead of trying again at once: tonic's own loop would spin.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Connections held from one peer address: a migration needs two (the source's preparation,
/// and `vmlauncher migrate` following the target).
pub(crate) const PER_PEER: usize = 8;
/// Connections held in all.
pub(crate) const TOTAL: usize = 64;
/// The longest wait before accepting again after running out of descriptors.
const MAX_BACKOFF: Duration = Duration::from_secs(1);
const FIRST_BACKOFF: Duration = Duration::from_millis(20);

/// Who holds how many connections.
#[derive(Debug, Default)]
struct Counts {
    by_peer: HashMap<IpAddr, usize>,
    total: usize,
}

/// The limits, shared by the accept loop and every connection's [`Slot`].
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    counts: Arc<Mutex<Counts>>,
    per_peer: usize,
    total: usize,
}

impl Limits {
    pub(crate) fn new(per_peer: usize, total: usize) -> Limits {
        Limits {
            counts: Arc::default(),
            per_peer,
            total,
        }
    }

    /// A slot for a connection from `peer`, or `None` when it would be one too many.
    pub(crate) fn admit(&self, peer: IpAddr) -> Option<Slot> {
        let mut c = self.counts.lock().expect("limits lock");
        let held = c.by_peer.get(&peer).copied().unwrap_or(0);
        if held >= self.per_peer || c.total >= self.total {
            return None;
        }
        *c.by_peer.entry(peer).or_insert(0) += 1;
        c.total += 1;
        Some(Slot {
            limits: self.clone(),
            peer,
        })
    }

    /// Connections held now (from `peer`, and in all).
    #[cfg(test)]
    fn held(&self, peer: IpAddr) -> (usize, usize) {
        let c = self.counts.lock().expect("limits lock");
        (c.by_peer.get(&peer).copied().unwrap_or(0), c.total)
    }
}

/// A connection's place within the limits, given back when the connection is dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    limits: Limits,
    peer: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self.limits.counts.lock().expect("limits lock");
        if let Some(n) = c.by_peer.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                c.by_peer.remove(&self.peer);
            }
        }
        c.total -= 1;
    }
}

/// An accepted connection that holds its slot for as long as it lives.
#[derive(Debug)]
pub(crate) struct Bounded {
    stream: TcpStream,
    _slot: Slot,
}

impl AsyncRead for Bounded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Bounded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

impl Connected for Bounded {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

/// Whether an accept failed for want of a resource that comes back (descriptors, memory,
/// buffers): wait, then accept again.
fn is_exhaustion(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// The connections `listener` accepts within `limits`, for tonic's `serve_with_incoming`. The
/// accept loop ends, and the listener is closed, when the stream is dropped.
pub(crate) fn incoming(
    listener: TcpListener,
    limits: Limits,
) -> ReceiverStream<io::Result<Bounded>> {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let mut backoff = FIRST_BACKOFF;
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = tx.closed() => return,
            };
            match accepted {
                Ok((stream, peer)) => {
                    backoff = FIRST_BACKOFF;
                    let Some(slot) = limits.admit(peer.ip()) else {
                        tracing::debug!(%peer, "a connection over the TCP API's limits: closed");
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    let conn = Bounded {
                        stream,
                        _slot: slot,
                    };
                    if tx.send(Ok(conn)).await.is_err() {
                        return;
                    }
                }
                Err(e) if is_exhaustion(&e) => {
                    tracing::warn!(error = %e, ?backoff, "the TCP API cannot accept: waiting");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                // A connection reset before it was accepted, and the like: the next one.
                Err(e) => tracing::debug!(error = %e, "an accept on the TCP API failed"),
            }
        }
    });
    ReceiverStream::new(rx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;
    use tokio_stream::StreamExt;

    #[test]
    fn a_peer_gets_its_share_and_all_peers_the_total() {
        let limits = Limits::new(2, 3);
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let a1 = limits.admit(a).expect("a's first");
        let _a2 = limits.admit(a).expect("a's second");
        assert!(limits.admit(a).is_none(), "a's third is over its share");
        let _b1 = limits.admit(b).expect("b's first");
        assert!(limits.admit(b).is_none(), "b's second is over the total");
        assert_eq!(limits.held(a), (2, 3));
        drop(a1);
        assert_eq!(limits.held(a), (1, 2));
        let _b2 = limits.admit(b).expect("a slot given back is free again");
        assert_eq!(limits.held(b), (2, 3));
    }

    #[tokio::test]
    async fn connections_over_a_peers_share_are_closed_and_the_rest_held() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = Limits::new(3, 64);
        let mut served = incoming(listener, limits.clone());
        let mut clients = Vec::new();
        for _ in 0..10 {
            clients.push(TcpStream::connect(addr).await.unwrap());
        }
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(served.next().await.unwrap().unwrap());
        }
        assert_eq!(limits.held(addr.ip()), (3, 3));
        // The other seven were closed by the server: each reads its end.
        let held_ports: Vec<u16> = held
            .iter()
            .map(|c| c.connect_info().remote_addr().unwrap().port())
            .collect();
        let mut closed = 0;
        for client in &mut clients {
            if held_ports.contains(&client.local_addr().unwrap().port()) {
                continue;
            }
            let mut byte = [0u8; 1];
            let read = tokio::time::timeout(Duration::from_secs(10), client.read(&mut byte));
            assert_eq!(read.await.unwrap().unwrap(), 0, "closed by the server");
            closed += 1;
        }
        assert_eq!(closed, 7);
        // One given back lets a new one in.
        drop(held.pop());
        assert_eq!(limits.held(addr.ip()), (2, 2));
        let _again = TcpStream::connect(addr).await.unwrap();
        let conn = served.next().await.unwrap().unwrap();
        assert_eq!(limits.held(addr.ip()), (3, 3));
        drop(conn);
    }
}
