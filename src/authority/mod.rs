//! Makes every stock gRPC client's `:authority` acceptable to the server's HTTP/2 layer.
//!
//! Over a unix socket, gRPC's C core (Python `grpcio`, C++, Ruby), grpc-java and grpc-swift send
//! the percent-encoded socket path as `:authority` (`%2Frun%2Fvm%2Flauncher.sock`). That is no
//! valid authority, and hyper's `h2` under tonic answers every such request with
//! `RST_STREAM PROTOCOL_ERROR`, with no setting to relax it (hyperium/h2#487, grpc/grpc#38142).
//! On a unix socket the authority carries nothing — the socket already names the peer — so this
//! module sits between the socket and the server and rewrites an authority `http` cannot parse to
//! `localhost`, what Go clients send.
//!
//! It works on the client-to-server byte stream, one connection at a time: the connection preface
//! and every frame but HEADERS/CONTINUATION pass through untouched; a header block (HEADERS plus
//! its CONTINUATIONs) is decoded with the client's HPACK state, the authority replaced if it is
//! invalid, and re-encoded with an HPACK state of our own toward the server (the server's side of
//! the table only ever sees our encoder), as one HEADERS frame followed by CONTINUATIONs of at most
//! 16 KiB, the frame size every HTTP/2 peer accepts. Padding is dropped, priority kept. What the
//! server writes back passes through unchanged.
//!
//! A connection whose first header block carries an authority the server accepts (Go's
//! `localhost`, tonic's `[::1]:50051`) is rewritten no further: that block goes on with the
//! client's own encoding, and the rest of the connection passes through untouched: the server
//! reads the socket itself. Decoding every block cost each call 40 µs (`perf`: `loona-hpack`
//! builds its Huffman table for every Huffman-coded string, and Rust's h2 client sends `:path`
//! as one on every request). A gRPC channel sends its one authority on every call unless a call
//! overrides it (grpc-java's `CallOptions.withAuthority`, C core's per-call host): a connection
//! whose first call sends an accepted authority and a later one the socket path has that later
//! call refused, as without this module. A first block with no `:authority` at all decides for
//! rewriting, which is always correct.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What every HTTP/2 client sends first.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER_LEN: usize = 9;
const TYPE_HEADERS: u8 = 0x1;
const TYPE_CONTINUATION: u8 = 0x9;
const FLAG_END_STREAM: u8 = 0x1;
const FLAG_END_HEADERS: u8 = 0x4;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// The largest frame payload every peer accepts (SETTINGS_MAX_FRAME_SIZE's minimum).
const MAX_FRAME: usize = 16_384;
/// A header block larger than this ends the connection (the server's own limit is 16 KiB).
const MAX_BLOCK: usize = 1 << 20;
/// What Go clients send, and what replaces an authority that does not parse.
pub const REPLACEMENT: &[u8] = b"localhost";

#[derive(Debug, thiserror::Error)]
pub enum AuthorityError {
    #[error("the client's HTTP/2 preface is wrong")]
    Preface,
    #[error("a CONTINUATION frame on stream {stream} without a header block open")]
    StrayContinuation { stream: u32 },
    #[error("a frame of type {frame_type:#x} inside the header block of stream {stream}")]
    Interleaved { frame_type: u8, stream: u32 },
    #[error("a HEADERS frame of {len} bytes is shorter than its padding and priority")]
    ShortHeaders { len: usize },
    #[error("a header block over {MAX_BLOCK} bytes")]
    BlockTooLarge,
    #[error("cannot decode a header block: {0}")]
    Hpack(String),
}

impl From<AuthorityError> for io::Error {
    fn from(e: AuthorityError) -> Self {
        io::Error::new(io::ErrorKind::InvalidData, e)
    }
}

/// An `:authority` the server's HTTP/2 layer accepts as it is.
fn is_valid_authority(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
}

/// A header block being gathered from HEADERS and CONTINUATION frames.
#[derive(Debug)]
struct OpenBlock {
    stream: u32,
    /// END_STREAM, kept for the HEADERS frame we write.
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
}

/// What the connection's header blocks go through, decided by its first one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// No header block has come yet.
    Undecided,
    /// The first block had no authority, or one the server's HTTP/2 layer refuses: every block
    /// is decoded, fixed and re-encoded with our own HPACK state (what C core and Java clients
    /// need).
    Rewriting,
    /// The first block's authority was accepted: a gRPC channel sends the same one on every
    /// call, so the rest passes through untouched and the server decodes the client's encoding
    /// itself. (A later call that overrides it with one the server refuses is refused, that
    /// stream alone; see the module's doc.)
    PassThrough,
}

/// Where the byte stream is.
#[derive(Debug)]
enum Position {
    /// Inside the preface: how many bytes of it were seen.
    Preface(usize),
    /// Gathering the 9-byte header of the next frame.
    FrameHeader,
    /// Inside the payload of a frame passed through: bytes left.
    PassThrough(usize),
    /// Inside the payload of a HEADERS or CONTINUATION frame: its type, flags, stream, and the
    /// payload length.
    HeaderPayload {
        frame_type: u8,
        flags: u8,
        stream: u32,
        len: usize,
    },
}

/// The pure state machine: bytes from the client in, bytes for the server out.
pub struct Rewriter {
    /// Whether the connection's header blocks are rewritten, passed through, or not known yet.
    mode: Mode,
    position: Position,
    /// Bytes of the current frame header or header payload gathered so far.
    pending: Vec<u8>,
    open: Option<OpenBlock>,
    decoder: loona_hpack::Decoder<'static>,
    encoder: loona_hpack::Encoder<'static>,
    rewritten: u64,
}

impl std::fmt::Debug for Rewriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rewriter")
            .field("mode", &self.mode)
            .field("position", &self.position)
            .field("open", &self.open)
            .field("rewritten", &self.rewritten)
            .finish()
    }
}

impl Default for Rewriter {
    fn default() -> Self {
        Rewriter {
            mode: Mode::Undecided,
            position: Position::Preface(0),
            pending: Vec::new(),
            open: None,
            decoder: loona_hpack::Decoder::new(),
            encoder: loona_hpack::Encoder::new(),
            rewritten: 0,
        }
    }
}

impl Rewriter {
    /// How many authorities this connection had rewritten.
    pub fn rewritten(&self) -> u64 {
        self.rewritten
    }

    /// Whether the rest of the connection passes through untouched (see [`Mode::PassThrough`]).
    pub fn passes_through(&self) -> bool {
        self.mode == Mode::PassThrough
    }

    /// Consumes `input`, appending what the server should read to `out`.
    pub fn feed(&mut self, mut input: &[u8], out: &mut Vec<u8>) -> Result<(), AuthorityError> {
        while !input.is_empty() {
            if self.mode == Mode::PassThrough {
                out.extend_from_slice(input);
                return Ok(());
            }
            match self.position {
                Position::Preface(seen) => {
                    let take = (PREFACE.len() - seen).min(input.len());
                    if input[..take] != PREFACE[seen..seen + take] {
                        return Err(AuthorityError::Preface);
                    }
                    out.extend_from_slice(&input[..take]);
                    input = &input[take..];
                    self.position = if seen + take == PREFACE.len() {
                        Position::FrameHeader
                    } else {
                        Position::Preface(seen + take)
                    };
                }
                Position::PassThrough(left) => {
                    let take = left.min(input.len());
                    out.extend_from_slice(&input[..take]);
                    input = &input[take..];
                    self.position = if take == left {
                        Position::FrameHeader
                    } else {
                        Position::PassThrough(left - take)
                    };
                }
                Position::FrameHeader => {
                    let take = (FRAME_HEADER_LEN - self.pending.len()).min(input.len());
                    self.pending.extend_from_slice(&input[..take]);
                    input = &input[take..];
                    if self.pending.len() == FRAME_HEADER_LEN {
                        let header: [u8; FRAME_HEADER_LEN] = std::mem::take(&mut self.pending)
                            .try_into()
                            .expect("9 bytes");
                        self.start_frame(header, out)?;
                    }
                }
                Position::HeaderPayload {
                    frame_type,
                    flags,
                    stream,
                    len,
                } => {
                    let take = (len - self.pending.len()).min(input.len());
                    self.pending.extend_from_slice(&input[..take]);
                    input = &input[take..];
                    if self.pending.len() == len {
                        let payload = std::mem::take(&mut self.pending);
                        self.position = Position::FrameHeader;
                        self.header_frame(frame_type, flags, stream, &payload, out)?;
                    }
                }
            }
        }
        Ok(())
    }

    fn start_frame(
        &mut self,
        header: [u8; FRAME_HEADER_LEN],
        out: &mut Vec<u8>,
    ) -> Result<(), AuthorityError> {
        let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let (frame_type, flags) = (header[3], header[4]);
        let stream = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
        match frame_type {
            TYPE_HEADERS | TYPE_CONTINUATION => {
                self.position = Position::HeaderPayload {
                    frame_type,
                    flags,
                    stream,
                    len,
                };
                if len == 0 {
                    self.position = Position::FrameHeader;
                    self.header_frame(frame_type, flags, stream, &[], out)?;
                }
            }
            _ => {
                if let Some(open) = &self.open {
                    return Err(AuthorityError::Interleaved {
                        frame_type,
                        stream: open.stream,
                    });
                }
                out.extend_from_slice(&header);
                self.position = if len == 0 {
                    Position::FrameHeader
                } else {
                    Position::PassThrough(len)
                };
            }
        }
        Ok(())
    }

    fn header_frame(
        &mut self,
        frame_type: u8,
        flags: u8,
        stream: u32,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), AuthorityError> {
        if frame_type == TYPE_HEADERS {
            if let Some(open) = &self.open {
                return Err(AuthorityError::Interleaved {
                    frame_type,
                    stream: open.stream,
                });
            }
            let short = || AuthorityError::ShortHeaders { len: payload.len() };
            let mut body = payload;
            let mut padding = 0;
            if flags & FLAG_PADDED != 0 {
                let (&pad, rest) = body.split_first().ok_or_else(short)?;
                padding = pad as usize;
                body = rest;
            }
            let mut priority = None;
            if flags & FLAG_PRIORITY != 0 {
                let (fields, rest) = body.split_at_checked(5).ok_or_else(short)?;
                priority = Some(fields.try_into().expect("5 bytes"));
                body = rest;
            }
            let fragment = body
                .get(..body.len().checked_sub(padding).ok_or_else(short)?)
                .ok_or_else(short)?;
            self.open = Some(OpenBlock {
                stream,
                end_stream: flags & FLAG_END_STREAM != 0,
                priority,
                fragment: fragment.to_vec(),
            });
        } else {
            let open = self
                .open
                .as_mut()
                .filter(|o| o.stream == stream)
                .ok_or(AuthorityError::StrayContinuation { stream })?;
            open.fragment.extend_from_slice(payload);
        }
        if self
            .open
            .as_ref()
            .is_some_and(|o| o.fragment.len() > MAX_BLOCK)
        {
            return Err(AuthorityError::BlockTooLarge);
        }
        if flags & FLAG_END_HEADERS != 0 {
            let block = self.open.take().expect("a block is open");
            self.emit(block, out)?;
        }
        Ok(())
    }

    /// Decodes a whole header block, fixes its authority, and writes it as frames. The
    /// connection's first block decides its mode: with an authority the server accepts, it is
    /// written with the client's own encoding, and the rest of the connection passes through.
    fn emit(&mut self, block: OpenBlock, out: &mut Vec<u8>) -> Result<(), AuthorityError> {
        let mut headers = self
            .decoder
            .decode(&block.fragment)
            .map_err(|e| AuthorityError::Hpack(format!("{e:?}")))?;
        if self.mode == Mode::Undecided {
            let authorities = || headers.iter().filter(|(name, _)| name == b":authority");
            let accepted = authorities().next().is_some()
                && authorities().all(|(_, value)| is_valid_authority(value));
            if accepted {
                // The server's HPACK table then follows the client's encoder, as if we were
                // not there.
                self.mode = Mode::PassThrough;
                write_block(out, &block, &block.fragment);
                return Ok(());
            }
            self.mode = Mode::Rewriting;
        }
        for (name, value) in &mut headers {
            if name == b":authority" && !is_valid_authority(value) {
                tracing::debug!(
                    authority = %String::from_utf8_lossy(value),
                    "rewriting an :authority the HTTP/2 layer would refuse"
                );
                *value = REPLACEMENT.to_vec();
                self.rewritten += 1;
            }
        }
        let mut encoded = Vec::with_capacity(block.fragment.len());
        self.encoder
            .encode_into(
                headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice())),
                &mut encoded,
            )
            .expect("writing to a Vec cannot fail");
        write_block(out, &block, &encoded);
        Ok(())
    }
}

/// Writes `block` with the header block `encoded` as one HEADERS frame (its priority and
/// END_STREAM kept, its padding dropped) followed by CONTINUATIONs of at most 16 KiB. Written
/// straight from `encoded`: a passed-through first block is the client's whole fragment.
fn write_block(out: &mut Vec<u8>, block: &OpenBlock, encoded: &[u8]) {
    let priority = block.priority.as_ref().map_or(&[][..], |p| &p[..]);
    // The HEADERS frame carries the priority fields and as much of the block as fits beside
    // them; an empty block still gets its HEADERS frame.
    let (first, mut rest) = encoded.split_at(encoded.len().min(MAX_FRAME - priority.len()));
    let mut flags = 0;
    if block.end_stream {
        flags |= FLAG_END_STREAM;
    }
    if block.priority.is_some() {
        flags |= FLAG_PRIORITY;
    }
    if rest.is_empty() {
        flags |= FLAG_END_HEADERS;
    }
    write_frame_header(
        out,
        priority.len() + first.len(),
        TYPE_HEADERS,
        flags,
        block.stream,
    );
    out.extend_from_slice(priority);
    out.extend_from_slice(first);
    while !rest.is_empty() {
        let (chunk, after) = rest.split_at(rest.len().min(MAX_FRAME));
        rest = after;
        let flags = if rest.is_empty() { FLAG_END_HEADERS } else { 0 };
        write_frame_header(out, chunk.len(), TYPE_CONTINUATION, flags, block.stream);
        out.extend_from_slice(chunk);
    }
}

fn write_frame_header(out: &mut Vec<u8>, len: usize, frame_type: u8, flags: u8, stream: u32) {
    let len = (len as u32).to_be_bytes();
    out.extend_from_slice(&len[1..]);
    out.push(frame_type);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
}

/// A server-side connection whose incoming bytes go through a [`Rewriter`].
#[derive(Debug)]
pub struct FixAuthority<S> {
    inner: S,
    rewriter: Rewriter,
    /// Rewritten bytes not yet read by the server.
    ready: Vec<u8>,
    ready_from: usize,
    eof: bool,
}

impl<S> FixAuthority<S> {
    pub fn new(inner: S) -> Self {
        FixAuthority {
            inner,
            rewriter: Rewriter::default(),
            ready: Vec::new(),
            ready_from: 0,
            eof: false,
        }
    }

    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for FixAuthority<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.ready_from < this.ready.len() {
                let n = (this.ready.len() - this.ready_from).min(buf.remaining());
                buf.put_slice(&this.ready[this.ready_from..this.ready_from + n]);
                this.ready_from += n;
                if this.ready_from == this.ready.len() {
                    this.ready.clear();
                    this.ready_from = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            if this.rewriter.passes_through() {
                // Nothing left to look at: the server reads the socket into its own buffer,
                // with no copy through ours.
                return Pin::new(&mut this.inner).poll_read(cx, buf);
            }
            let mut raw = [0u8; 16 * 1024];
            let mut raw_buf = ReadBuf::new(&mut raw);
            match Pin::new(&mut this.inner).poll_read(cx, &mut raw_buf) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {
                    let filled = raw_buf.filled();
                    if filled.is_empty() {
                        this.eof = true;
                    } else {
                        this.rewriter.feed(filled, &mut this.ready)?;
                    }
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for FixAuthority<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected
    for FixAuthority<S>
{
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests;
