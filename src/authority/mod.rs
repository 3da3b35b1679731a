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
/// The largest frame payload every peer accepts (SETTINGS_MAX_FRAME_SIZE's minimum), and the
/// largest the server accepts: hyper's default, which tonic leaves alone. A HEADERS or
/// CONTINUATION frame over it ends the connection before any of it is buffered (the server would
/// refuse it with FRAME_SIZE_ERROR anyway).
const MAX_FRAME: usize = 16_384;
/// The server's SETTINGS_MAX_HEADER_LIST_SIZE (hyper's default, which tonic leaves alone): names
/// plus values plus 32 per field, as decoded. The server enforces it only after this module has
/// decoded the block, so a block decoding to more ends the connection here, before it is copied:
/// a few bytes that refer to one large table entry many times would otherwise decode to
/// gigabytes.
pub(crate) const MAX_HEADER_LIST: usize = 16_384;
/// Fields in one block: each costs at least 32 of the list size, so a block with more is over
/// [`MAX_HEADER_LIST`] whatever it holds. Counted before decoding, it bounds the work per block
/// (every Huffman-coded string costs `loona-hpack` a table of its own).
const MAX_FIELDS: usize = MAX_HEADER_LIST / 32;
/// A header block's encoded size (HEADERS plus CONTINUATIONs), checked as its frames come in.
/// Four times the list size: Huffman codes take at most 30 bits an octet, so any list within
/// [`MAX_HEADER_LIST`] encodes to less.
const MAX_BLOCK: usize = 4 * MAX_HEADER_LIST;
/// CONTINUATION frames in one block: what h2 itself allows with the server's settings
/// (`calc_max_continuation_frames`), against a flood of empty ones.
const MAX_CONTINUATIONS: usize = 5;
/// The HPACK dynamic table size the server advertises (SETTINGS_HEADER_TABLE_SIZE, h2's default:
/// hyper sends none). A client may not grow its table past it, and the decoder here holds it to
/// that.
const MAX_TABLE: usize = 4_096;
/// What Go clients send, and what replaces an authority that does not parse.
pub(crate) const REPLACEMENT: &[u8] = b"localhost";

#[derive(Debug, thiserror::Error)]
pub(crate) enum AuthorityError {
    #[error("the client's HTTP/2 preface is wrong")]
    Preface,
    #[error("a CONTINUATION frame on stream {stream} without a header block open")]
    StrayContinuation { stream: u32 },
    #[error("a frame of type {frame_type:#x} inside the header block of stream {stream}")]
    Interleaved { frame_type: u8, stream: u32 },
    #[error("a HEADERS frame of {len} bytes is shorter than its padding and priority")]
    ShortHeaders { len: usize },
    #[error("a header frame of {len} bytes, over the {MAX_FRAME} the server accepts")]
    FrameTooLarge { len: usize },
    #[error("a header block over {MAX_BLOCK} bytes")]
    BlockTooLarge,
    #[error("a header block in more than {MAX_CONTINUATIONS} CONTINUATION frames")]
    TooManyContinuations,
    #[error("a header block of more than {MAX_FIELDS} fields")]
    TooManyFields,
    #[error("a header list over the server's {MAX_HEADER_LIST} bytes")]
    HeaderListTooLarge,
    #[error("an HPACK table size update over the {MAX_TABLE} bytes the server allows")]
    TableTooLarge,
    #[error("cannot decode a header block")]
    Hpack(#[source] loona_hpack::decoder::DecoderError),
    #[error("cannot decode a header block: a truncated field representation")]
    TruncatedField,
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
    /// CONTINUATION frames so far.
    continuations: usize,
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
pub(crate) struct Rewriter {
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
            decoder: {
                let mut decoder = loona_hpack::Decoder::new();
                decoder.set_max_allowed_table_size(MAX_TABLE);
                decoder
            },
            encoder: loona_hpack::Encoder::new(),
            rewritten: 0,
        }
    }
}

impl Rewriter {
    /// How many authorities this connection had rewritten.
    #[cfg(test)]
    pub(crate) fn rewritten(&self) -> u64 {
        self.rewritten
    }

    /// Whether the rest of the connection passes through untouched (see [`Mode::PassThrough`]).
    pub(crate) fn passes_through(&self) -> bool {
        self.mode == Mode::PassThrough
    }

    /// Consumes `input`, appending what the server should read to `out`.
    #[cfg(test)]
    pub(crate) fn feed(
        &mut self,
        mut input: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), AuthorityError> {
        while !input.is_empty() {
            let (taken, _) = self.feed_some(input, out)?;
            input = &input[taken..];
        }
        Ok(())
    }

    /// Consumes `input` up to the end of the first header block it completes, appending what
    /// the server should read to `out`: how many bytes it took, and whether it decoded a block
    /// (the costly part, see [`FixAuthority`]).
    pub(crate) fn feed_some(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(usize, bool), AuthorityError> {
        let whole = input.len();
        let mut input = input;
        while !input.is_empty() {
            if self.mode == Mode::PassThrough {
                out.extend_from_slice(input);
                return Ok((whole, false));
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
                        if self.start_frame(header, out)? {
                            return Ok((whole - input.len(), true));
                        }
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
                        if self.header_frame(frame_type, flags, stream, &payload, out)? {
                            return Ok((whole - input.len(), true));
                        }
                    }
                }
            }
        }
        Ok((whole, false))
    }

    /// Starts the frame `header` introduces; whether that decoded a header block (an empty
    /// frame that ends one).
    fn start_frame(
        &mut self,
        header: [u8; FRAME_HEADER_LEN],
        out: &mut Vec<u8>,
    ) -> Result<bool, AuthorityError> {
        let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let (frame_type, flags) = (header[3], header[4]);
        let stream = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
        match frame_type {
            TYPE_HEADERS | TYPE_CONTINUATION => {
                // Checked before the payload is gathered: it is buffered whole.
                if len > MAX_FRAME {
                    return Err(AuthorityError::FrameTooLarge { len });
                }
                self.position = Position::HeaderPayload {
                    frame_type,
                    flags,
                    stream,
                    len,
                };
                if len == 0 {
                    self.position = Position::FrameHeader;
                    return self.header_frame(frame_type, flags, stream, &[], out);
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
        Ok(false)
    }

    /// Takes a whole HEADERS or CONTINUATION payload; whether it ended (and so decoded) a block.
    fn header_frame(
        &mut self,
        frame_type: u8,
        flags: u8,
        stream: u32,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<bool, AuthorityError> {
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
                continuations: 0,
            });
        } else {
            let open = self
                .open
                .as_mut()
                .filter(|o| o.stream == stream)
                .ok_or(AuthorityError::StrayContinuation { stream })?;
            open.continuations += 1;
            if open.continuations > MAX_CONTINUATIONS {
                return Err(AuthorityError::TooManyContinuations);
            }
            // Checked before it grows: the block is kept whole until its last frame.
            if open.fragment.len() + payload.len() > MAX_BLOCK {
                return Err(AuthorityError::BlockTooLarge);
            }
            open.fragment.extend_from_slice(payload);
        }
        if flags & FLAG_END_HEADERS == 0 {
            return Ok(false);
        }
        let block = self.open.take().expect("a block is open");
        self.emit(block, out)?;
        Ok(true)
    }

    /// Decodes a whole header block, fixes its authority, and writes it as frames. The
    /// connection's first block decides its mode: with an authority the server accepts, it is
    /// written with the client's own encoding, and the rest of the connection passes through.
    ///
    /// The work is bounded: at most [`MAX_BLOCK`] bytes to walk, at most [`MAX_FIELDS`] fields
    /// (so at most twice as many Huffman-coded strings, each of which costs `loona-hpack` a
    /// table of its own), and at most [`MAX_HEADER_LIST`] bytes kept; the decoder's callback
    /// sees fields from the table by reference, so one repeated many times costs nothing more.
    /// The costliest blocks, 1,024 empty Huffman strings or 64 KiB of Huffman bits, take tens of
    /// milliseconds (about 95 and 60 ms in release on a machine loaded five times over its two
    /// cores); [`FixAuthority`] yields between blocks.
    fn emit(&mut self, block: OpenBlock, out: &mut Vec<u8>) -> Result<(), AuthorityError> {
        if count_fields(&block.fragment)? > MAX_FIELDS {
            return Err(AuthorityError::TooManyFields);
        }
        let mut headers = Vec::new();
        let mut list_size = 0;
        self.decoder
            .decode_with_cb(&block.fragment, |name, value| {
                // The decoder cannot be stopped from the callback; past the limit it only
                // counts, and the block is refused once decoded.
                list_size += name.len() + value.len() + 32;
                if list_size <= MAX_HEADER_LIST {
                    headers.push((name.into_owned(), value.into_owned()));
                }
            })
            .map_err(|e| match e {
                loona_hpack::decoder::DecoderError::InvalidMaxDynamicSize => {
                    AuthorityError::TableTooLarge
                }
                e => AuthorityError::Hpack(e),
            })?;
        if list_size > MAX_HEADER_LIST {
            return Err(AuthorityError::HeaderListTooLarge);
        }
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

/// How many header fields the HPACK block `block` holds, from its representations' lengths
/// alone: nothing is decoded and no table is needed. A truncated representation is an error.
fn count_fields(block: &[u8]) -> Result<usize, AuthorityError> {
    let truncated = || AuthorityError::TruncatedField;
    let mut fields = 0;
    let mut at = 0;
    while let Some(&first) = block.get(at) {
        let rest = &block[at..];
        at += if first & 0x80 != 0 {
            // Indexed field.
            fields += 1;
            hpack_integer(rest, 7).ok_or_else(truncated)?.1
        } else if first & 0xe0 == 0x20 {
            // Dynamic table size update.
            hpack_integer(rest, 5).ok_or_else(truncated)?.1
        } else {
            // Literal, with incremental indexing (6-bit index prefix) or not (4-bit); a name
            // index of 0 means a literal name follows.
            fields += 1;
            let prefix = if first & 0x40 != 0 { 6 } else { 4 };
            let (index, mut len) = hpack_integer(rest, prefix).ok_or_else(truncated)?;
            if index == 0 {
                len += hpack_string_len(&rest[len..]).ok_or_else(truncated)?;
            }
            len + hpack_string_len(&rest[len..]).ok_or_else(truncated)?
        };
        if fields > MAX_FIELDS {
            break;
        }
    }
    Ok(fields)
}

/// An HPACK integer with an `prefix`-bit prefix at the start of `buf` (RFC 7541 §5.1): its value
/// and how many bytes it takes. None if it is cut short or needs more than 28 bits, which no
/// length or index within this module's limits does.
fn hpack_integer(buf: &[u8], prefix: u32) -> Option<(usize, usize)> {
    let mask = (1u8 << prefix) - 1;
    let first = buf.first()? & mask;
    if first < mask {
        return Some((first as usize, 1));
    }
    let mut value = mask as usize;
    for (i, &byte) in buf[1..].iter().enumerate().take(4) {
        value += ((byte & 0x7f) as usize) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((value, i + 2));
        }
    }
    None
}

/// How many bytes the HPACK string literal at the start of `buf` takes, length prefix included;
/// None if `buf` is shorter.
fn hpack_string_len(buf: &[u8]) -> Option<usize> {
    let (len, prefix) = hpack_integer(buf, 7)?;
    let total = prefix.checked_add(len)?;
    (total <= buf.len()).then_some(total)
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

/// The header blocks in what the server reads (the client's preface, then whole frames), as
/// the server's decoder gets them: HEADERS and CONTINUATION fragments joined, priority left out.
/// A frame cut short at the end is left out. For the fuzz target's checks.
pub(crate) fn header_blocks(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut rest = bytes.strip_prefix(PREFACE).unwrap_or_default();
    let mut blocks = Vec::new();
    let mut block = Vec::new();
    while rest.len() >= FRAME_HEADER_LEN {
        let len = u32::from_be_bytes([0, rest[0], rest[1], rest[2]]) as usize;
        let (frame_type, flags) = (rest[3], rest[4]);
        let Some(payload) = rest.get(FRAME_HEADER_LEN..FRAME_HEADER_LEN + len) else {
            break;
        };
        rest = &rest[FRAME_HEADER_LEN + len..];
        if frame_type == TYPE_HEADERS || frame_type == TYPE_CONTINUATION {
            let skip = if frame_type == TYPE_HEADERS && flags & FLAG_PRIORITY != 0 {
                5
            } else {
                0
            };
            block.extend_from_slice(payload.get(skip..).unwrap_or_default());
            if flags & FLAG_END_HEADERS != 0 {
                blocks.push(std::mem::take(&mut block));
            }
        }
    }
    blocks
}

fn write_frame_header(out: &mut Vec<u8>, len: usize, frame_type: u8, flags: u8, stream: u32) {
    let len = (len as u32).to_be_bytes();
    out.extend_from_slice(&len[1..]);
    out.push(frame_type);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
}

/// How much is read from the socket at a time while header blocks are still looked at.
const READ_CHUNK: usize = 16 * 1024;

/// A server-side connection whose incoming bytes go through a [`Rewriter`].
///
/// It runs on the runtime's one worker, beside everything else the launcher does. Decoding a
/// block is bounded (see [`Rewriter::emit`]), but a read can hold many small blocks, so it
/// decodes at most one block per turn of its task and yields before the next: a client that
/// sends costly blocks back to back slows its own connection, not the runtime.
#[derive(Debug)]
pub(crate) struct FixAuthority<S> {
    inner: S,
    rewriter: Rewriter,
    /// Rewritten bytes not yet read by the server.
    ready: Vec<u8>,
    ready_from: usize,
    /// Bytes read from the socket and not yet given to the rewriter.
    raw: Vec<u8>,
    raw_from: usize,
    /// A block was decoded since the task last yielded.
    decoded: bool,
    eof: bool,
}

impl<S> FixAuthority<S> {
    pub(crate) fn new(inner: S) -> Self {
        FixAuthority {
            inner,
            rewriter: Rewriter::default(),
            ready: Vec::new(),
            ready_from: 0,
            raw: Vec::new(),
            raw_from: 0,
            decoded: false,
            eof: false,
        }
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
            if this.raw_from < this.raw.len() {
                if this.decoded && !this.rewriter.passes_through() {
                    // Another block may be next: let the runtime's other tasks run first.
                    this.decoded = false;
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                let (taken, decoded) = this
                    .rewriter
                    .feed_some(&this.raw[this.raw_from..], &mut this.ready)
                    .inspect_err(|e| {
                        tracing::warn!(
                            error = %e,
                            "closing an API connection: the :authority filter refuses what it sent"
                        )
                    })?;
                this.raw_from += taken;
                this.decoded |= decoded;
                continue;
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            if this.rewriter.passes_through() {
                // Nothing left to look at: the server reads the socket itself, into its own
                // buffer, with no copy through ours.
                this.raw = Vec::new();
                return Pin::new(&mut this.inner).poll_read(cx, buf);
            }
            this.raw.resize(READ_CHUNK, 0);
            this.raw_from = 0;
            let mut raw_buf = ReadBuf::new(&mut this.raw);
            let read = Pin::new(&mut this.inner).poll_read(cx, &mut raw_buf);
            let filled = raw_buf.filled().len();
            this.raw.truncate(filled);
            match read {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => this.eof = filled == 0,
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
